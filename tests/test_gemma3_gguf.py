"""Gemma 3 on its GGUF's own blocks (gguf-q16, gguf-q8): every block is the native kernels' (products on the file's
blocks, Gemma's norms, GELU, scale and sliding window in C++), checked against Gemma3's fp32 torch path. The
matrices come back under the converted folder's names and values; a verify pass equals one-token passes bit for
bit; speculative greedy output is plain greedy output; the loader picks gguf-q16 for a runnable Gemma 3 GGUF,
silently; and on the real 270M, top-1 agreement with the fp32 model over Spec-Bench prompts has a floor.

The tiny file is test_gemma3's 2-layer writer with every matrix in a type gguf-q16 reads: Q5_0, Q8_0 (v, the tied
head), Q4_K (o) and Q6_K (down), so [q; k; v] is a stacked matrix of two kinds, as in the real Q4_K_M."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import specdec.models.gguf.convert as gc
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.generate import Engine, GenerationConfig
from specdec.errors import SpecdecError
from specdec.models.gemma3 import Gemma3
from specdec.models.gguf import gemma3 as gguf_gemma3
from specdec.models.gguf.file import open_gguf
from specdec.models.gguf.weights import dequantize
from specdec.models.linear import GgufLinear, Linear
from specdec.models.loader import load_model
from tests.conftest import divergence_message, greedy_reference
from tests.test_engine_model import mismatch_report, ours_prefill_then_decode, verify_vs_one_token
from tests.test_gemma3 import real, verify_equals_one_token_passes, write_gemma_gguf

VOCAB = 265 + 20  # test_gemma3's tiny tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """(the tiny runnable GGUF, its converted folder)."""
    path = tmp_path_factory.mktemp("gemma-q16") / "tiny-gemma3-q16.gguf"
    write_gemma_gguf(path, integer=True)
    return path, gc.convert_gguf(path, tmp_path_factory.mktemp("conv") / "tiny-q16", progress=False)


_models: dict = {}


def tiny_model(tiny, precision: str) -> Gemma3:
    if precision not in _models:
        path, folder = tiny
        _models[precision] = Gemma3.from_dir(folder, precision, gguf=path if precision.startswith("gguf") else None)
    return _models[precision]


def test_matrices_are_the_files_blocks_under_the_folders_names(tiny):
    """read_matrices (its own reader of the tensor table) gives gguf-py's blocks, as stored, and each dequantizes to
    the converted folder's tensor of that name: the names are right and nothing was permuted."""
    from safetensors.numpy import load_file

    path, folder = tiny
    got = gguf_gemma3.read_matrices(path)
    folder_w = load_file(str(folder / "model.safetensors"))
    assert set(got) == {name for name, w in folder_w.items() if w.ndim == 2}
    for t in open_gguf(path).tensors:
        if len(t.shape) == 2:
            name = gguf_gemma3.hf_name(t.name, path)
            assert got[name].kind == t.tensor_type.name
            assert np.array_equal(got[name].blocks, np.asarray(t.data).reshape(got[name].rows, -1)), name
            assert torch.equal(dequantize([got[name]]), torch.from_numpy(folder_w[name])), name
    assert gguf_gemma3.runnable(path)


def test_unreadable_files(tiny, tmp_path):
    """A matrix in F16 makes the file not runnable (and read_matrices says which); a truncated file is a
    SpecdecError, never a crash."""
    f16 = tmp_path / "f16.gguf"
    write_gemma_gguf(f16)  # ffn_up in F16, attn_k in F32
    assert not gguf_gemma3.runnable(f16)
    with pytest.raises(SpecdecError, match="is F32; --precision gguf-q16 and gguf-q8 read"):
        gguf_gemma3.read_matrices(f16)
    data = tiny[0].read_bytes()
    for cut in (6, 2000, len(data) - 100):
        short = tmp_path / f"cut{cut}.gguf"
        short.write_bytes(data[:cut])
        assert not gguf_gemma3.runnable(short)
        with pytest.raises(SpecdecError, match="malformed or truncated GGUF file"):
            gguf_gemma3.read_matrices(short)


def test_gguf_precisions_run_the_native_blocks(tiny, kernels):  # noqa: F811
    """gguf-q16 runs every block in one native call (with Gemma's parts and each layer's RoPE table); the torch
    precisions keep the torch path."""
    model = tiny_model(tiny, "gguf-q16")
    assert model.kernels is not None and model._native_stack() is not None and model.exact_kv_reuse
    assert model.lm_head_q is model.lm_head.qm
    for blk in model.blocks:
        cos, sin = blk.native[7][6:8]
        assert cos is model.rope[blk.sliding][0] and sin is model.rope[blk.sliding][1]
        assert blk.native[7][5] == (blk.window or 0)
    assert {blk.sliding for blk in model.blocks} == {True, False}  # both kinds of layer are covered
    assert tiny_model(tiny, "fp32").kernels is None
    assert all(isinstance(lin, GgufLinear) for b in model.blocks for lin in b.linears)
    assert isinstance(model.lm_head, GgufLinear) and model.lm_head.out_features == VOCAB
    assert model.blocks[0].qkv.qm.stacked == 2  # [q; k] in Q5_0, v in Q8_0
    fp16 = tiny_model(tiny, "fp16")
    assert model.weight_bytes_per_token < fp16.weight_bytes_per_token / 2


@pytest.mark.parametrize("precision", ["gguf-q16", "gguf-q8"])
def test_logits_close_to_fp32(tiny, kernels, precision):  # noqa: F811
    """Prefill and decode passes against the fp32 torch path on the same (dequantized) weights: gguf-q16's 15-bit
    activation blocks are nearly exact, and the native blocks keep keys and values in fp16 (2.7e-4 of the logits'
    range here, under the fp16 torch path's 3.7e-4; a window or scale ignored is 0.04-0.5); gguf-q8's 8-bit ones
    change the logits more (reported)."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (20, 9)]
    tails = [torch.randint(0, VOCAB, (7,), generator=g).tolist() for _ in prompts]
    got = ours_prefill_then_decode(tiny_model(tiny, precision), prompts, tails)
    ref = ours_prefill_then_decode(tiny_model(tiny, "fp32"), prompts, tails)
    error = max((a - b).abs().max().item() for a, b in zip(got, ref))
    scale = max(b.abs().max().item() for b in ref)
    agreement = min((a.argmax(-1) == b.argmax(-1)).float().mean().item() for a, b in zip(got, ref))
    print(f"{precision}: max |logit error| {error:.3g} (logits up to {scale:.3g}), argmax agreement {agreement:.3f}")
    assert error < (5e-4 if precision == "gguf-q16" else 2e-2) * scale and agreement >= 0.9


@pytest.mark.parametrize("precision", ["gguf-q16", "gguf-q8"])
def test_verify_pass_equals_one_token_passes_bit_for_bit(tiny, kernels, precision):  # noqa: F811
    """As test_gemma3 checks fp16: prompts inside one window (8), across windows, across the 64-position chunk."""
    model = tiny_model(tiny, precision)
    verify_equals_one_token_passes(model)


def test_window_past_a_key_partition(tiny, kernels):  # noqa: F811
    """Native attention reads keys in partitions of 256 positions; past the first, a sliding layer's query (window
    8) skips whole partitions and blocks. Prefill of 300 positions and decoding after it stay close to fp32, and a
    verify pass whose rows straddle position 256 equals one-token passes."""
    model, fp32 = tiny_model(tiny, "gguf-q16"), tiny_model(tiny, "fp32")
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (1, 307), generator=g)

    def logits(m):  # [307, vocab]: prefill of 300, then 7 one-token passes
        cache = m.new_cache(1, 320)
        out = [m.forward(ids[:, :300], torch.tensor([0]), cache, prefill=True)[0]]
        out += [m.forward(ids[:, i:i + 1], torch.tensor([i]), cache)[0] for i in range(300, 307)]
        return torch.cat(out)

    got, ref = logits(model), logits(fp32)
    assert (got - ref).abs().max() < 5e-4 * ref.abs().max() and bool((got.argmax(-1) == ref.argmax(-1)).all())
    prompts = [ids[0, :250].tolist(), ids[0, :252].tolist()]
    drafts = [torch.randint(0, VOCAB, (9,), generator=g).tolist() for _ in prompts]
    verify, single = verify_vs_one_token(model, prompts, drafts, capacity=320)
    assert torch.equal(verify, single), mismatch_report(verify, single)


@pytest.mark.parametrize("k", [2, 5])
def test_speculative_greedy_equals_plain_greedy(tiny, kernels, k):  # noqa: F811
    model = tiny_model(tiny, "gguf-q16")
    drafted = accepted = 0
    for prompt in ([2, 10, 11, 12, 13, 10, 11, 12, 13, 10], [2, 20, 21, 22, 20, 21], [2], [2] + [5, 6] * 12):
        expected = greedy_reference(model, prompt, 40)
        res = Engine(model, None).generate([prompt], GenerationConfig(40), NgramDrafter(4, 1), k)[0]
        assert res.token_ids == expected, divergence_message(model, prompt, expected, res.token_ids)
        drafted, accepted = drafted + res.stats.drafted, accepted + res.stats.accepted
    assert 0 < accepted <= drafted, (accepted, drafted)


def test_loader_picks_an_integer_path_in_one_line_and_lean(tiny, kernels, tmp_path, monkeypatch, capsys):  # noqa: F811
    """A runnable Gemma 3 GGUF loads on the integer path measured faster at its first load, from a lean folder
    (norms only: the matrices and the embedding rows come from the file), and once converted and measured says only
    which path in one line; its logits are the full folder's bit for bit. --precision fp16 stays the torch path on a
    full folder; a file with an F16 matrix defaults to fp16."""
    from specdec.models.gemma3 import ScaledRows
    from specdec.models.gguf.convert import is_lean

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    path = str(tiny[0])
    load_model(path)  # converts and measures (and says so)
    capsys.readouterr()
    loaded = load_model(path)
    model = loaded.model
    assert model.precision in ("gguf-q16", "gguf-q8") and isinstance(model.lm_head, GgufLinear)
    err = capsys.readouterr().err
    assert err.startswith(f"specdec: {model.precision}, the faster path") and err.count("\n") == 1
    assert is_lean(loaded.path) and isinstance(model.embed, ScaledRows)
    full = tiny_model(tiny, model.precision)  # the same file's full folder
    ids = torch.tensor([[2, 7, 300 % VOCAB, 11, 5, 9]])
    assert torch.equal(model.embed[ids], full.embed[ids])
    logits = [m.forward(ids, torch.tensor([0]), m.new_cache(1, 16), prefill=True) for m in (model, full)]
    assert torch.equal(*logits)
    fp16 = load_model(path, "fp16")
    assert isinstance(fp16.model.lm_head, Linear) and not is_lean(fp16.path)
    f16 = tmp_path / "f16.gguf"
    write_gemma_gguf(f16)
    assert load_model(str(f16)).model.precision == "fp16"
    config = json.loads((loaded.path / "config.json").read_text())
    assert config["model_type"] == "gemma3_text"


# ---- the real Gemma 3 270M (Q4_K_M) ------------------------------------------------------------------------------

QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"
# top-1 agreement floor over QUALITY_PROMPTS Spec-Bench prompts of up to QUALITY_TOKENS tokens (see the test)
QUALITY_PROMPTS, QUALITY_TOKENS, QUALITY_FLOOR = 24, 128, 0.998


def spec_bench_prompts(n: int) -> list[str]:
    """The first turns of n Spec-Bench questions, round-robin over the categories (scripts/quality.py's choice)."""
    by_cat: dict[str, list[str]] = {}
    for line in QUESTIONS.read_text().splitlines():
        row = json.loads(line)
        by_cat.setdefault(row["category"], []).append(row["turns"][0])
    rounds = zip(*(by_cat[c] for c in sorted(by_cat)))  # one of each category a round
    return [text for one_round in rounds for text in one_round][:n]


@pytest.fixture(scope="module")
def real_q16(real_gguf, real_dir):  # noqa: F811
    return load_model(str(real_gguf), "gguf-q16")


@real
@pytest.mark.slow
def test_real_default_is_the_measured_integer_path(real_gguf, real_dir, kernels):  # noqa: F811
    from specdec.models.gguf.path_choice import PATHS, remembered

    loaded = load_model(str(real_gguf))
    assert loaded.model.precision in PATHS and remembered(real_gguf).precision == loaded.model.precision


@real
@pytest.mark.slow
def test_real_top1_agrees_with_fp32(real_dir, real_q16):  # noqa: F811
    """Teacher-forced next-token predictions over the first turns of Spec-Bench prompts (round-robin over the
    categories, <bos> + raw text, up to 128 tokens: 1,350 positions), gguf-q16 against the fp32 torch path on the
    same file. Measured 0.9993 here (one disagreement, where fp32's top two logits are 0.0002 apart), and 0.9998
    over 48 prompts of up to 256 tokens (4,237 positions, the same single near-tie). The floor, 0.998, allows two
    more near-ties, so a change of summation order in the kernels does not fail it; anything wrong falls far below
    it (gguf-q8, a smaller change than any bug, measures 0.967 on these positions)."""
    from specdec.models.text.tokenizer import encode_prompt

    if not QUESTIONS.is_file():
        pytest.skip(f"{QUESTIONS} is not here")
    fp32 = load_model(str(real_dir), "fp32").model
    tok = real_q16.tokenizer
    agree = total = 0
    for text in spec_bench_prompts(QUALITY_PROMPTS):
        ids = torch.tensor([encode_prompt(tok, text, chat=True)[:QUALITY_TOKENS]])
        ref = fp32.forward(ids, torch.tensor([0]), fp32.new_cache(1, QUALITY_TOKENS), prefill=True)[0]
        got = real_q16.model.forward(ids, torch.tensor([0]), real_q16.model.new_cache(1, QUALITY_TOKENS),
                                     prefill=True)[0]
        agree += int((got.argmax(-1) == ref.argmax(-1)).sum())
        total += ids.shape[1]
    print(f"Gemma 3 270M gguf-q16: top-1 agreement with fp32 {agree / total:.4f} over {total} positions")
    assert agree / total >= QUALITY_FLOOR


@real
@pytest.mark.slow
def test_real_verify_pass_equals_one_token_passes(real_q16):
    g = torch.Generator().manual_seed(3)
    prompts = [[2] + torch.randint(3, 262144, (n,), generator=g).tolist() for n in (70, 12)]
    drafts = [torch.randint(3, 262144, (5,), generator=g).tolist() for _ in prompts]
    verify, single = verify_vs_one_token(real_q16.model, prompts, drafts)
    assert torch.equal(verify, single), mismatch_report(verify, single)


@real
@pytest.mark.slow
def test_real_speculative_equals_plain(real_q16):
    from tests.test_gemma3 import PROMPT

    ids = real_q16.tokenizer.encode(PROMPT, add_special_tokens=True)
    expected = greedy_reference(real_q16.model, ids, 24)
    res = Engine(real_q16.model, real_q16.tokenizer).generate([ids], GenerationConfig(24), NgramDrafter(), 4)[0]
    assert res.token_ids == expected
    assert res.stats.accepted > 0  # the prompt's pattern is drafted, so the identity covers accepted drafts
    assert real_q16.tokenizer.decode(res.token_ids).startswith(" Rome")
