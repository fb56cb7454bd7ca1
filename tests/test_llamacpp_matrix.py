"""specdec against llama.cpp on random-weight GGUFs (specdec/models/gguf/synth.py) of every llama-family architecture
specdec runs natively, in every block type it reads: the logits at 96 positions of the same file and tokens.

Architectures (SHAPES): tiny-llama (llama with tied embeddings, as SmolLM2 and Llama 3.2 1B/3B), tiny-llama-untied
(a separate output.weight), tiny-llama3 (Llama 3 rope scaling: rope_freqs.weight, 24 of its 32 factors 8),
tiny-qwen2 (q, k and v biases), tiny-mistral (arch "llama", as llama.cpp's converter writes Mistral: untied,
4 query heads a KV head) and tiny-gemma3 (Gemma 3's norms, GELU and scale, five sliding layers with a window of 16
positions and a global sixth; gguf-q16 only: the exact path reads no Gemma), tiny-qwen3 (Qwen3: an RMSNorm on
each query and key head, weights random around 1; heads wider than hidden / heads; untied), tiny-gemma2 (Gemma
2: no q/k norms, scores and logits soft-capped at 1.5 and 2.0, small enough to bend them, two of four layers
sliding over 16 positions), tiny-phi3 (Phi-3: fused [q; k; v] and [gate; up], heads of 96, untied),
tiny-phi3-longrope (Phi-3.5's LongRoPE within its original context: short factors up to 2.7 and an attention factor
of 1.08, which llama.cpp applies at the context its oracle asks for), tiny-qwen3moe
and tiny-mixtral (a mixture of 8 experts, 2 a token: Qwen3-MoE's layout, and Mixtral's, a llama file with experts).
Quants: the eight block types uniformly (`llama-quantize --pure`), and the Q4_K_M mix.
Tokens: 96 fixed pseudo-random ids of the bundled vocabulary, fed from position 0.

As in test_llamacpp_oracle.py, specdec is held to llama.cpp on an F32 copy of each file (the same weights, no
8-bit activations on llama.cpp's side) for its semantics, and on the quantized file to llama.cpp's own distance
between its F32 and quantized runs. Random-weight logits are Gaussian over the vocabulary with a std of about 1
(a normalized hidden state times rows of std 1/sqrt(hidden)), not the peaked, |logit| up to 39 scale of a real
model, so the logit bounds are in units of the std of llama.cpp's logits (`sd`). Against the F32 copy: top-1
(ties within oracle.TIE counted) >= 0.99, max |d| <= 0.02 sd and mean |d| <= 0.002 sd: about four times the
largest measured (below), while the slips these files are there to catch move the logits by whole sd
(test_a_slip_fails_the_bounds, llama.cpp on the file as the slip reads it: Llama 3 rope factors ignored, top-1
0.27, max 4.4 sd, mean 0.38 sd; Qwen2 biases dropped, 0.65, 1.2 and 0.12; the untied head read from token_embd,
0.00, 7.2 and 1.13). The top-1 check is meaningful at this scale: the median gap between the two best logits
is 0.17 sd, some 35 times the largest |d|. Against the file: mean |d| within 10%
and max |d| within 25% of llama.cpp's own distance, and top-1 no more than 3 positions of 96 below its own.

Measured over the 60 cells (2 threads; the whole table in docs/results/llamacpp-matrix.md): sd 0.998-1.002;
against the F32 copy top-1 1.000 with ties (0.990, one near-tie of 96, in 5 cells), max |d| 0.0026-0.0047 sd, mean
|d| 0.00029-0.00044 sd, gguf a little closer than gguf-q16; against the file, specdec's distance is llama.cpp's own
to within 0.2% (mean) and 1% (max), its top-1 at most one position below: llama.cpp's own is top-1 0.885-0.979,
max |d| 0.10-0.19 and mean 0.014-0.024 (K-quants the most). About 15 s a cell, 15 minutes in all: marked slow.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from specdec.bench.engines import llamacpp_oracle as oracle
from specdec.models.gguf.synth import write
from tests.conftest import native_kernels

pytestmark = [pytest.mark.slow, pytest.mark.skipif(oracle.missing() is not None, reason=str(oracle.missing()))]

SHAPES = ("tiny-llama", "tiny-llama-untied", "tiny-llama3", "tiny-qwen2", "tiny-mistral", "tiny-gemma3", "tiny-qwen3",
          "tiny-gemma2", "tiny-phi3", "tiny-phi3-longrope", "tiny-qwen3moe", "tiny-mixtral")
QUANTS = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M")
EXACT = ("Q4_0", "Q4_1", "Q8_0")  # the types `--precision gguf` reads; the others run on the integer paths only
ALL = [(s, q, p) for s in SHAPES for q in QUANTS
       for p in ("gguf-q16",) + (("gguf",) if q in EXACT and "gemma" not in s else ())]
# make test: every architecture in Q4_K_M, every type on tiny-llama (18 cells, about 4 minutes); the whole matrix
# (69 cells, about 17 minutes: docs/results/llamacpp-matrix.md) with SPECDEC_FULL_MATRIX=1 (make llamacpp-matrix)
CELLS = ALL if os.environ.get("SPECDEC_FULL_MATRIX") else [c for c in ALL if c[0] == "tiny-llama" or c[1] == "Q4_K_M"]
IDS = np.random.default_rng(404).integers(0, 49152, 96).tolist()
MAX_SD, MEAN_SD = 0.02, 0.002  # bounds against the F32 copy, in sd of llama.cpp's logits
TOP1_SLACK = 3 / len(IDS)  # against the file: positions of top-1 below llama.cpp's own


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    """cell(shape, quant) -> (gguf, llama.cpp's logits [n, vocab] on the file, on its F32 copy), made once each;
    specdec converts into a cache of its own (the kernels are built, or found, in the usual one first)."""
    native_kernels()
    folder = tmp_path_factory.mktemp("matrix")
    made = {}

    def cell(shape, quant):
        if (shape, quant) not in made:
            gguf = write(folder / f"{shape}-{quant}.gguf", shape, quant).path
            f32 = oracle.f32_copy(gguf, folder / f"{shape}-{quant}-f32.gguf")
            made[shape, quant] = gguf, oracle.logits(gguf, IDS), oracle.logits(f32, IDS)
            oracle.close(gguf)
            oracle.close(f32)
            f32.unlink()
        return made[shape, quant]

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_CACHE", str(folder / "cache"))
        yield cell
    oracle.close()


def bounded(d: dict, sd: float) -> bool:
    return d["top1_ties"] >= 0.99 and d["max_abs"] <= MAX_SD * sd and d["mean_abs"] <= MEAN_SD * sd


@pytest.mark.parametrize("shape, quant, precision", CELLS, ids=["-".join(c) for c in CELLS])
def test_logits_match_llamacpp(cells, shape, quant, precision):
    gguf, quantized, f32 = cells(shape, quant)  # [n, vocab] each
    ours, ran = oracle.specdec_logits(gguf, IDS, precision)
    assert ran == precision
    sd = float(f32.std())
    exact, own, quant_d = oracle.distance(ours, f32), oracle.distance(f32, quantized), oracle.distance(ours, quantized)
    print(f"\n{shape:18s} {quant:7s} {precision:9s} sd {sd:.3f} | F32: top1 {exact['top1']:.3f} "
          f"ties {exact['top1_ties']:.3f} max {exact['max_abs']:.4f} mean {exact['mean_abs']:.5f} | file: top1 "
          f"{quant_d['top1']:.3f} max {quant_d['max_abs']:.4f} mean {quant_d['mean_abs']:.5f} | own: top1 "
          f"{own['top1']:.3f} max {own['max_abs']:.4f} mean {own['mean_abs']:.5f}")
    assert bounded(exact, sd), exact
    assert quant_d["mean_abs"] <= 1.1 * own["mean_abs"] and quant_d["max_abs"] <= 1.25 * own["max_abs"], (quant_d, own)
    assert quant_d["top1"] >= own["top1"] - TOP1_SLACK, (quant_d, own)


def token_embd(gguf) -> np.ndarray:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    t = next(t for t in GGUFReader(str(gguf)).tensors if t.name == "token_embd.weight")
    return dequantize(t.data, t.tensor_type).astype(np.float32)  # [vocab, hidden]


SLIPS = {  # what a loader could get wrong in each file: the file as it would then be read
    "tiny-llama3": lambda gguf: lambda name, v: np.ones_like(v) if name == "rope_freqs.weight" else v,
    "tiny-qwen2": lambda gguf: lambda name, v: np.zeros_like(v) if name.endswith(".bias") else v,
    "tiny-llama-untied": lambda gguf: (lambda embd: lambda name, v: embd if name == "output.weight" else v)(
        token_embd(gguf)),
    # Qwen3's q/k norm weights (random around 1 in these files) read as ones: a loader that applied no weight
    "tiny-qwen3": lambda gguf: lambda name, v: np.ones_like(v) if name.endswith(("q_norm.weight", "k_norm.weight"))
    else v,
    # Gemma 2's caps left out of the file: llama.cpp's defaults (50 and 30) then, which leave these scores and
    # logits nearly uncapped: a loader that ignored the file's caps (DROPS)
    "tiny-gemma2": lambda gguf: None,
    # Phi-3's ffn_up is [gate; up]: a loader that took it as [up; gate]
    "tiny-phi3": lambda gguf: lambda name, v: np.concatenate(np.split(v, 2)[::-1]) if name.endswith("ffn_up.weight")
    else v,
    # LongRoPE ignored: short factors of one and no attention factor (DROPS)
    "tiny-phi3-longrope": lambda gguf: lambda name, v: np.ones_like(v) if name.startswith("rope_factors_") else v,
    # a mixture's router rows in reverse: a loader that numbered the experts backwards
    "tiny-qwen3moe": lambda gguf: lambda name, v: v[::-1].copy() if name.endswith("ffn_gate_inp.weight") else v,
    "tiny-mixtral": lambda gguf: lambda name, v: v[::-1].copy() if name.endswith("ffn_gate_inp.weight") else v,
    # Gemma's norms are stored as 1 + w: a loader that forgot so would scale by 1 + (1 + w)
    "tiny-gemma3": lambda gguf: lambda name, v: v + 1 if name.endswith("norm.weight") else v,
}


DROPS = {"tiny-gemma2": ("gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping"),  # metadata left out
         "tiny-phi3-longrope": ("phi3.rope.scaling.attn_factor",)}


@pytest.mark.parametrize("shape", list(SLIPS))
def test_a_slip_fails_the_bounds(cells, tmp_path, shape):
    """The bounds can fail: llama.cpp on the file as a slip would read it (rope factors of 1, no biases, the tied
    head) is far outside them."""
    gguf, _, f32 = cells(shape, "Q8_0")
    wrong = oracle.f32_copy(gguf, tmp_path / "wrong.gguf", change=SLIPS[shape](gguf), drop=DROPS.get(shape, ()))
    d = oracle.distance(oracle.logits(wrong, IDS), f32)
    oracle.close(wrong)
    print(f"\n{shape} slip: top1 {d['top1_ties']:.3f} max {d['max_abs']:.3f} mean {d['mean_abs']:.4f}")
    assert not bounded(d, float(f32.std()))
    assert d["max_abs"] > 20 * MAX_SD * float(f32.std()) and d["mean_abs"] > 20 * MEAN_SD * float(f32.std()), d


def test_longrope_long_factors_match_llamacpp(cells, tmp_path):
    """Loaded for a context past its original one, a LongRoPE file runs its long factors at every position, as
    llama.cpp does in such a context: held to llama.cpp on the F32 copy, in that context, by the matrix's bounds.
    The short factors (the same file loaded for its original context) fall far outside them there."""
    from specdec.models.gguf.synth import SHAPES as SYNTH

    shape = "tiny-phi3-longrope"
    gguf, _, _ = cells(shape, "Q4_K_M")
    context = 2 * SYNTH[shape].longrope
    f32 = oracle.f32_copy(gguf, tmp_path / "f32.gguf")
    theirs = oracle.logits(f32, IDS, context=context)  # [n, vocab]
    oracle.close(f32)
    sd = float(theirs.std())
    ours, _ = oracle.specdec_logits(gguf, IDS, "gguf-q16", context=context)
    short, _ = oracle.specdec_logits(gguf, IDS, "gguf-q16")
    d, slip = oracle.distance(ours, theirs), oracle.distance(short, theirs)
    print(f"\nlong factors: top1 {d['top1_ties']:.3f} max {d['max_abs'] / sd:.4f} sd mean {d['mean_abs'] / sd:.5f} sd"
          f" | short factors there: top1 {slip['top1_ties']:.3f} mean {slip['mean_abs'] / sd:.3f} sd")
    assert bounded(d, sd), d
    assert not bounded(slip, sd) and slip["mean_abs"] > 20 * MEAN_SD * sd, slip
