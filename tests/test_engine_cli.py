"""`specdec generate` from the command line: bad input gives exit status 2 and one clear line on stderr (never a
traceback), and --json / --trace report a generation faithfully."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import specdec.models.loader as loader
from specdec.cli import main
from tests.conftest import one_error_line, write_tiny_model, write_word_tokenizer

WORDS = ["<unk>", "<eos>", *[f"w{i}" for i in range(30)]]


@pytest.fixture(scope="module")
def tiny_cli_model(tmp_path_factory) -> Path:
    """A loadable tiny model folder with 64 positions and a word-level tokenizer ("w0 w1 ...")."""
    folder = tmp_path_factory.mktemp("tiny-cli")
    write_tiny_model(folder, vocab=len(WORDS), max_pos=64)
    write_word_tokenizer(folder, WORDS)
    return folder


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["generate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_clear_error(code: int, err: str, *fragments: str) -> None:
    one_error_line(code, err, *fragments)


def test_tiny_model_folder_works(capsys, tiny_cli_model):
    """The folder the error cases below build on does load and generate."""
    code, out, err = run_cli(capsys, "--model", str(tiny_cli_model), "--prompt", "w1 w2 w3", "--no-chat",
                             "--max-new-tokens", "6", "--json")
    assert code == 0, err
    assert len(json.loads(out)["token_ids"]) == 6


@pytest.mark.parametrize("args, fragments", [
    (["--k", "0"], ["k must be an integer >= 1 or 'auto'"]),
    (["--k", "-3"], ["k must be an integer >= 1 or 'auto'"]),
    (["--temperature", "-0.5"], ["temperature must be >= 0"]),
    (["--top-p", "0"], ["top-p must be in (0, 1]"]),
    (["--top-p", "1.5"], ["top-p must be in (0, 1]"]),
    (["--max-new-tokens", "0"], ["max new tokens"]),
    (["--drafter", "draft-model"], ["needs --draft-model"]),
    (["--k", "many"], ["k must be an integer >= 1 or 'auto'", "'many'"]),
    (["--drafter", "bogus"], ["unknown drafter 'bogus'"]),
    (["--drafter", "ngram,none"], ["distinct drafters, without none"]),
    (["--drafter", "ngram,ngram"], ["distinct drafters, without none"]),
    (["--drafter", "eagle"], ["needs --draft-head DIR"]),
    (["--drafter", "ngram,eagle", "--draft-head", "/nonexistent"], ["not a draft head"]),
], ids=["k=0", "k<0", "temperature<0", "top-p=0", "top-p=1.5", "no-tokens", "no-draft-path", "k-not-int",
        "unknown-drafter", "cascade-with-none", "cascade-repeats", "eagle-no-head", "eagle-bad-head"])
def test_bad_settings(capsys, tiny_cli_model, args, fragments):
    code, _, err = run_cli(capsys, "--model", str(tiny_cli_model), "--prompt", "w1", *args)
    assert_clear_error(code, err, *fragments)


def test_missing_model_path(capsys, tmp_path):
    code, _, err = run_cli(capsys, "--model", str(tmp_path / "nowhere"), "--prompt", "hi")
    assert_clear_error(code, err, "model not found")


def test_missing_prompt_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "--prompt-file", str(tmp_path / "nope.txt"))
    assert_clear_error(code, err, "nope.txt")


@pytest.mark.parametrize("damage", ["config-not-json", "config-missing-field", "weights-garbage",
                                    "weights-truncated", "weights-missing", "tokenizer-garbage"])
def test_broken_model_folder(capsys, tmp_path, tiny_cli_model, damage):
    folder = tmp_path / "model"
    folder.mkdir()
    for f in tiny_cli_model.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    weights = folder / "model.safetensors"
    if damage == "config-not-json":
        (folder / "config.json").write_text("{not json")
    elif damage == "config-missing-field":
        cfg = json.loads((folder / "config.json").read_text())
        del cfg["hidden_size"]
        (folder / "config.json").write_text(json.dumps(cfg))
    elif damage == "weights-garbage":
        weights.write_bytes(b"\x00" * 64 + b"garbage" * 50)
    elif damage == "weights-truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "weights-missing":
        weights.unlink()
    else:
        (folder / "tokenizer.json").write_text('{"version": "1.0", "model": 7}')
    code, _, err = run_cli(capsys, "--model", str(folder), "--prompt", "w1", "--no-chat")
    assert_clear_error(code, err, str(folder))


@pytest.mark.parametrize("content", [os.urandom(4096), b"GGUF\x03\x00\x00\x00" + b"\xff" * 40],
                         ids=["random", "bad-header"])
def test_garbage_gguf(capsys, tmp_path, monkeypatch, content):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))  # where a conversion would be cached
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    code, _, err = run_cli(capsys, "--model", str(path), "--prompt", "hi")
    assert_clear_error(code, err, "model.gguf")


def test_prompt_longer_than_the_context(capsys, tiny_cli_model):
    code, _, err = run_cli(capsys, "--model", str(tiny_cli_model), "--no-chat", "--prompt", " ".join(["w3"] * 70))
    assert_clear_error(code, err, "70 tokens", "context of 64")


@pytest.mark.parametrize("stdin", ["none", "closed"])
def test_no_prompt_and_stdin_closed(capsys, monkeypatch, stdin):
    """Python makes sys.stdin None when file descriptor 0 is closed (`specdec generate <&-`); a closed file
    object is the other way to meet a closed stdin."""
    import io

    closed = io.StringIO("text")
    closed.close()
    monkeypatch.setattr(sys, "stdin", None if stdin == "none" else closed)
    code, _, err = run_cli(capsys)
    assert_clear_error(code, err, "no prompt")


def test_usage_errors_name_the_program_once_and_the_subcommand(capsys):
    """argparse's refusals are one line that names the subcommand, not "specdec: error: specdec generate: ..." """
    code, _, err = run_cli(capsys, "--temperature", "abc")
    assert_clear_error(code, err, "generate: argument --temperature: invalid float value: 'abc'")
    assert err.count("specdec") == 1
    assert main(["no-such-command"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: argument COMMAND: invalid choice") and "generate" in err


def test_specdec_alone_lists_the_commands(capsys):
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: specdec") and all(c in err for c in ("generate", "serve", "bench"))


def test_empty_prompt_on_stdin(capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("  \n"))
    code, _, err = run_cli(capsys)
    assert_clear_error(code, err, "the prompt is empty: stdin (give --prompt TEXT or --prompt-file FILE")


# ---- the bundled model -----------------------------------------------------------------------------------------

@pytest.fixture
def reuse_bundled(bundled, monkeypatch):
    """Let the CLI's loader hand out the session's already loaded bundled model for 'default' (loading it
    takes seconds); any other model is loaded for real."""
    real = loader.load_model

    def load(spec="default", precision="fp16", device="cpu", map_weights=False, context=None, kv_cache=None):
        if spec in ("default", "", None) and device == "cpu" and not map_weights and context is None and \
                kv_cache in (None, "f16"):
            return bundled(precision)
        return real(spec, precision, device, map_weights, context, kv_cache)

    monkeypatch.setattr(loader, "load_model", load)


@pytest.mark.slow
def test_draft_model_with_another_tokenizer(capsys, tmp_path, bundled_path, reuse_bundled):
    """A copy of the bundled model (weights and config linked) whose tokenizer.json has two tokens swapped."""
    copy = tmp_path / "draft"
    copy.mkdir()
    for f in bundled_path.iterdir():
        if f.name != "tokenizer.json":
            (copy / f.name).symlink_to(f)
    tok = json.loads((bundled_path / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    a, b = (next(t for t, i in vocab.items() if i == n) for n in (1000, 1001))
    vocab[a], vocab[b] = 1001, 1000
    (copy / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    code, _, err = run_cli(capsys, "--prompt", "hi", "--precision", "fp32", "--drafter", "draft-model",
                           "--draft-model", str(copy))
    assert_clear_error(code, err, "tokenizer differs")


@pytest.mark.slow
def test_prompt_longer_than_the_bundled_context(capsys, tmp_path, bundled, reuse_bundled):
    limit = bundled("fp16").model.cfg.max_position_embeddings
    assert limit == 8192
    prompt = tmp_path / "long.txt"
    prompt.write_text(" apple" * (limit + 10))
    code, _, err = run_cli(capsys, "--prompt-file", str(prompt), "--no-chat")
    assert_clear_error(code, err, "does not fit", str(limit))


@pytest.mark.slow
def test_json_and_trace(capsys, tmp_path, reuse_bundled):
    trace_path = tmp_path / "trace.json"
    code, out, err = run_cli(capsys, "--prompt", "Repeat exactly: red green blue, red green blue, red green blue.",
                             "--max-new-tokens", "16", "--k", "4", "--json", "--trace", str(trace_path))
    assert code == 0, err
    report = json.loads(out)
    for key in ("text", "token_ids", "alpha", "mean_tokens_per_round", "rounds", "tokens_per_s", "ttft_s",
                "survival_by_position"):
        assert key in report, key
    ids = report["token_ids"]
    assert 0 < len(ids) <= 16 and isinstance(report["text"], str) and report["text"]
    assert report["finish_reason"] in ("length", "eos")

    trace = json.loads(trace_path.read_text())
    assert trace["format"] == "specdec-trace" and trace["version"] == 1 and trace["k"] == 4
    assert trace["first_token"] == ids[0]
    assert trace["summary"]["rounds"] == len(trace["rounds"]) == report["rounds"]
    assert trace["summary"]["tokens"] == len(ids)
    replay = [trace["first_token"]]
    for r in trace["rounds"]:
        assert set(r) >= {"drafted", "accepted", "token", "kind"}
        assert 0 <= r["accepted"] <= len(r["drafted"]) <= 4
        assert r["kind"] == ("bonus" if r["accepted"] == len(r["drafted"]) else "recovered")
        assert len(r["drafted_text"]) == len(r["drafted"])
        replay += (r["drafted"][: r["accepted"]] + [r["token"]])[: r["emitted"]]
    assert replay == ids
    drafted = sum(len(r["drafted"]) for r in trace["rounds"])
    accepted = sum(r["accepted"] for r in trace["rounds"])
    assert report["alpha"] == pytest.approx(accepted / drafted)


def test_k_auto_is_the_default_and_keeps_the_output(capsys, tmp_path, tiny_cli_model):
    """Without --k, generate plans each round's k (up to the default cap) from this model's pass costs; the output is
    plain greedy decoding's, and the JSON says the policy was auto. An explicit k is a fixed k; --policy auto with
    --k N plans up to N."""
    common = ["--model", str(tiny_cli_model), "--prompt", "w1 w2 w3 w4 w1 w2 w3 w4 w1 w2", "--no-chat",
              "--max-new-tokens", "20", "--json"]
    code, plain, err = run_cli(capsys, *common, "--drafter", "none")
    assert code == 0, err
    for extra, policy, k in (([], "auto", 8), (["--k", "auto"], "auto", 8), (["--k", "3"], "fixed", 3),
                             (["--k", "3", "--policy", "auto"], "auto", 3), (["--policy", "never"], "never", 0)):
        code, out, err = run_cli(capsys, *common, *extra, "--trace", str(tmp_path / "trace.json"))
        assert code == 0, err
        report = json.loads(out)
        assert (report["policy"], report["k"]) == (policy, k)
        assert report["token_ids"] == json.loads(plain)["token_ids"]
        trace = json.loads((tmp_path / "trace.json").read_text())  # the explainer page needs an integer depth
        assert trace["k"] == k and trace["k_policy"] == policy
        assert all(len(r["drafted"]) <= trace["k"] for r in trace["rounds"])


@pytest.mark.slow
@pytest.mark.parametrize("k", [None, "3"], ids=["auto", "k=3"])
def test_demo_runs_and_says_the_outputs_are_identical(capsys, reuse_bundled, k):
    """`make demo`, the README's main command, on the bundled model (shortened)."""
    code = main(["demo", "--max-new-tokens", "24", "--no-color", *(["--k", k] if k else [])])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "outputs identical: yes, token for token" in out
    assert ("auto chose these draft lengths" in out) == (k is None)
    assert "k = auto" in out if k is None else "k = 3," in out


@pytest.mark.parametrize("spread", [0.0, 0.5], ids=["steady", "busy"])
def test_demo_alternates_its_runs_and_says_when_the_machine_was_busy(capsys, tiny_cli_model, monkeypatch, spread):
    """A first demo on a busy machine once printed 63x: each method now runs twice, alternated, the faster run of
    each is shown, and runs of one method far apart in speed get a line saying the figures are unsteady."""
    from specdec.engine import demo

    spreads = []
    monkeypatch.setattr(demo, "run_spread", lambda runs: spreads.append(len(runs)) or spread)
    monkeypatch.setattr(demo, "DEMO_PROMPT", "a b c a b c a b")  # the tiny model's context is 64 positions
    code = main(["demo", "--model", str(tiny_cli_model), "--max-new-tokens", "8", "--no-color"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert spreads == [demo.RUNS, demo.RUNS] and "the faster of 2 alternated runs" in out
    assert ("the machine was busy: runs of the same method differed by 50%" in out) == (spread > demo.NOISY)
    assert "outputs identical: yes" in out


def test_run_spread():
    from types import SimpleNamespace

    from specdec.engine.demo import run_spread

    runs = [SimpleNamespace(stats=SimpleNamespace(tokens_per_s=v)) for v in (300.0, 240.0)]
    assert run_spread(runs) == pytest.approx(0.2) and run_spread(runs[:1]) == 0.0


def test_demo_bad_k(capsys, tiny_cli_model):
    code = main(["demo", "--model", str(tiny_cli_model), "--k", "0"])
    _, err = capsys.readouterr()
    assert_clear_error(code, err, "k must be an integer >= 1 or 'auto'")


@pytest.mark.parametrize("drafter", ["eagle", "ngram,eagle", "suffix"])
def test_generate_with_a_head_or_a_cascade_equals_plain(capsys, tmp_path, tiny_cli_model, drafter):
    """Through the command line: a head from its folder (here an untrained one), alone and in a cascade."""
    import torch

    from specdec.heads.eagle import HeadConfig, default_taps
    from specdec.models.text.tokenizer import Tokenizer
    from specdec.models.transformer import Transformer
    from specdec.train.distill import init_head

    model = Transformer.from_dir(tiny_cli_model)
    torch.manual_seed(0)
    head = init_head(HeadConfig.for_target(model.cfg, 16, default_taps(model.cfg.num_layers)), model,
                     torch.arange(16))
    head.save(tmp_path / "head", meta={"tokenizer_fingerprint": Tokenizer.from_dir(tiny_cli_model).fingerprint()})
    common = ["--model", str(tiny_cli_model), "--prompt", "w1 w2 w3 w1 w2", "--no-chat", "--max-new-tokens", "12",
              "--json"]
    code, out, err = run_cli(capsys, *common, "--drafter", "none")
    assert code == 0, err
    code, spec, err = run_cli(capsys, *common, "--drafter", drafter, "--draft-head", str(tmp_path / "head"))
    assert code == 0, err
    assert json.loads(spec)["token_ids"] == json.loads(out)["token_ids"]
