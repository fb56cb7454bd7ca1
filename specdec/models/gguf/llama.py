"""The llama, qwen2 and qwen3 parts of GGUF -> Hugging Face conversion (gguf_convert does the rest): tensor names, the
row order of Q and K, config.json, and the file's matrices as stored, under the same names, for the gguf precisions
(read_matrices). Their byte-level BPE tokenizer is rebuilt by gguf_tokenizer.

Names: `blk.N.attn_q.weight` is `model.layers.N.self_attn.q_proj.weight` and so on (`hf_name`). Rows of Q and K:
llama.cpp's converter reorders each head's rows of a llama file from Hugging Face's rotate-half layout (first half,
second half) to interleaved pairs (x0, y0, x1, y1, ...); `unpermute` undoes it. Qwen2 files convert as llama does,
with q/k/v biases and no reordering of Q and K (llama.cpp reorders only llama's); Qwen3 files as Qwen2's, without
the biases and with an RMSNorm on each query and key head (`attn_q_norm`, `attn_k_norm`, stored as they are);
Phi-3 files keep Hugging Face's fused matrices ([q; k; v] as `attn_qkv`, [gate; up] as `ffn_up`), unpermuted.
Llama 3's rope scaling, stored by llama.cpp as a `rope_freqs` tensor (a divisor per rotary frequency), goes to
config.json as `specdec_rope_freq_factors`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from specdec.errors import SpecdecError
from specdec.models.config import FREQ_FACTORS
from specdec.models.gguf.file import decimal, need_int, open_gguf, read_metadata
from specdec.models.gguf.weights import KINDS, QTensor, row_bytes

ARCHES = ("llama", "qwen2", "qwen3", "qwen3moe", "phi3")  # general.architecture values read here (see gguf_arch)
PERMUTED = "llama"  # the architecture whose Q and K rows llama.cpp interleaves
_LAYER_NAMES = {  # llama.cpp per-block tensor -> Hugging Face module under model.layers.N
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",  # Qwen3's
    "attn_qkv": "self_attn.qkv_proj",  # Phi-3's [q; k; v] in one matrix
    # a mixture of experts (Qwen3-MoE, Mixtral): the router, and each projection of every expert [experts, rows, cols]
    "ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.gate_proj", "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
ROUTER = "mlp.gate.weight"  # a 2-D float tensor the folder keeps (not a matrix the kernels read)
_PHI3_NAMES = {"ffn_up": "mlp.gate_up_proj"}  # Phi-3's ffn_up is [gate; up] in one matrix
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                  "qwen3moe": "Qwen3MoeForCausalLM", "phi3": "Phi3ForCausalLM", "mixtral": "MixtralForCausalLM"}
_MODEL_TYPES = {"qwen3moe": "qwen3_moe"}  # Hugging Face's model_type where it is not the GGUF architecture's name
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def check_metadata(meta: dict[str, Any], src: Path) -> None:
    """Refuse rope scaling other than Llama 3's (a rope_freqs tensor)."""
    arch = meta["general.architecture"]
    if meta.get(f"{arch}.rope.scaling.type", "none") not in ("none", None):
        raise SpecdecError(f"{src}: rope scaling {meta[f'{arch}.rope.scaling.type']!r} is not supported (Llama 3's "
                           "rope_freqs tensor is)")


def hf_name(name: str, src: Path, arch: str = "llama") -> str:
    """The Hugging Face name of a GGUF tensor in a file of this architecture."""
    m = _BLOCK.fullmatch(name)
    names = {**_LAYER_NAMES, **_PHI3_NAMES} if arch == "phi3" else _LAYER_NAMES
    if m and m.group(2) in names:
        return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"
    stem, _, kind = name.rpartition(".")
    if stem in _TOP_NAMES and kind in ("weight", "bias"):
        return f"{_TOP_NAMES[stem]}.{kind}"
    raise SpecdecError(f"{src}: tensor {name!r} has no Hugging Face Llama equivalent")


def hf_tensor(name: str, weight: np.ndarray, src: Path, meta: dict[str, Any]) -> tuple[str, np.ndarray]:
    """The Hugging Face name and value of a dequantized GGUF tensor (weight: [out_features, in_features] for a
    matrix): a llama file's Q and K rows back in rotate-half order."""
    hf = hf_name(name, src, meta["general.architecture"])
    if meta["general.architecture"] == PERMUTED and hf.endswith(("q_proj.weight", "k_proj.weight")):
        heads = need_int(meta, src, "attention.head_count")
        if hf.endswith("k_proj.weight"):
            heads = int(meta.get(f"{PERMUTED}.attention.head_count_kv", heads))
        weight = unpermute(weight, heads)
    return hf, weight


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order. w: [n_heads * head_dim, in]; within each head llama.cpp stores the rotary
    pairs interleaved, row 2i = x_i and row 2i+1 = y_i, where Hugging Face stores all x_i first, then all y_i.
    Rows of quantized blocks ([rows, row bytes]) move the same way: a row's blocks move with it."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)  # [h, half, 2] -> [h, 2, half]


def config(meta: dict[str, Any], src: Path, shapes: dict[str, tuple[int, ...]],
           rope: dict[str, list[float]]) -> dict[str, Any]:
    """LlamaConfig (Qwen2Config, Qwen3Config, Phi3Config) fields, written with both the 4.x `rope_theta` and the
    5.x `rope_parameters` spellings; `shapes`: every tensor's shape by Hugging Face name; `rope`: the file's rope
    vectors by name (rope_freqs: Llama 3's scaling; rope_factors_short and _long: LongRoPE's)."""
    arch = meta["general.architecture"]
    hidden = need_int(meta, src, "embedding_length")
    n_heads = need_int(meta, src, "attention.head_count")
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // n_heads))
    if int(meta.get(f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise SpecdecError(f"{src}: partial rotary embeddings are not supported")
    rope_theta = decimal(meta.get(f"{arch}.rope.freq_base", 10000.0))
    ids = {k: meta.get(f"tokenizer.ggml.{k}") for k in ("bos_token_id", "eos_token_id", "padding_token_id")}
    experts = int(meta.get(f"{arch}.expert_count", 0))
    kind = "mixtral" if arch == "llama" and experts else arch  # Mixtral is a llama file with experts
    config = {
        "architectures": [_ARCHITECTURES[kind]],
        "model_type": _MODEL_TYPES.get(kind, kind),
        "hidden_size": hidden,
        "intermediate_size": need_int(meta, src, "feed_forward_length"),
        "num_hidden_layers": need_int(meta, src, "block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", n_heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": decimal(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "max_position_embeddings": need_int(meta, src, "context_length"),
        "vocab_size": int(shapes["model.embed_tokens.weight"][0]),
        "tie_word_embeddings": "lm_head.weight" not in shapes,
        "attention_bias": arch == "qwen2",
        "mlp_bias": False,
        "bos_token_id": ids["bos_token_id"],
        "eos_token_id": ids["eos_token_id"],
        "pad_token_id": ids["padding_token_id"],
        "torch_dtype": "float32",
    }
    if experts:  # Qwen3MoeConfig's and MixtralConfig's fields; llama.cpp renormalizes the chosen experts' weights
        used = need_int(meta, src, "expert_used_count")
        if kind == "mixtral":
            config.update(num_local_experts=experts, num_experts_per_tok=used)
        else:
            config.update(num_experts=experts, num_experts_per_tok=used, norm_topk_prob=True, decoder_sparse_step=1,
                          moe_intermediate_size=need_int(meta, src, "expert_feed_forward_length"), mlp_only_layers=[])
    if arch == "phi3":  # Phi3Config's own fields: the window its layers slide over (transformers applies it)
        config["sliding_window"] = meta.get("phi3.attention.sliding_window")
        config["original_max_position_embeddings"] = config["max_position_embeddings"]
        config["partial_rotary_factor"] = 1.0
        if rope.keys() & {"rope_factors_short", "rope_factors_long"}:
            config.update(longrope(meta, src, rope, head_dim, rope_theta))
    factors = rope.get("rope_freqs")
    if factors is not None:
        if len(factors) != head_dim // 2:
            raise SpecdecError(f"{src}: rope_freqs has {len(factors)} values; head size {head_dim} needs "
                               f"{head_dim // 2}")
        config[FREQ_FACTORS] = factors
    return config


def longrope(meta: dict[str, Any], src: Path, rope: dict[str, list[float]], head_dim: int,
             theta: float) -> dict[str, Any]:
    """Phi3Config's LongRoPE fields from a file's rope_factors_short and rope_factors_long (a divisor per rotary
    frequency each), its original context and its attention factor (cos and sin scaled by it), as llama.cpp's
    converter writes them from Hugging Face's rope_scaling."""
    orig = meta.get("phi3.rope.scaling.original_context_length")
    if not {"rope_factors_short", "rope_factors_long"} <= rope.keys() or not isinstance(orig, int) or orig < 1:
        raise SpecdecError(f"{src}: LongRoPE needs rope_factors_short, rope_factors_long and "
                           "phi3.rope.scaling.original_context_length; this file lacks one of them")
    for name in ("rope_factors_short", "rope_factors_long"):
        if len(rope[name]) != head_dim // 2:
            raise SpecdecError(f"{src}: {name} has {len(rope[name])} values; head size {head_dim} needs "
                               f"{head_dim // 2}")
    params = {"rope_type": "longrope", "rope_theta": theta, "short_factor": rope["rope_factors_short"],
              "long_factor": rope["rope_factors_long"], "original_max_position_embeddings": orig,
              "attention_factor": float(meta.get("phi3.rope.scaling.attn_factor", 1.0))}
    return {"original_max_position_embeddings": orig, "rope_parameters": params,
            "rope_scaling": {**params, "type": "longrope"}}


def build_tokenizer(meta: dict[str, Any]):
    """(tokenizers.Tokenizer, tokenizer_config dict): a byte-level BPE vocabulary (gguf_tokenizer: Llama 3, Qwen,
    SmolLM), or a SentencePiece one (gguf_spm: Phi-3, Llama 2)."""
    from specdec.models.gguf import spm as gguf_spm
    from specdec.models.gguf import tokenizer as gguf_tokenizer

    return (gguf_spm if meta.get("tokenizer.ggml.model") == "llama" else gguf_tokenizer).build_tokenizer(meta)


def read_matrices(path: Path) -> dict[str, QTensor]:
    """Every quantized matrix of a llama, qwen2 or qwen3 GGUF under its Hugging Face name. A matrix in another format
    (F16, Q2_K, ...) is refused with the formats these paths read."""
    reader = open_gguf(Path(path))
    meta = read_metadata(reader, Path(path))
    arch = meta.get("general.architecture")
    if arch not in ARCHES:
        raise SpecdecError(f"{path}: architecture {arch!r} is not one of {', '.join(ARCHES)}")
    check_metadata(meta, Path(path))
    n_heads = int(meta[f"{arch}.attention.head_count"])
    n_kv = int(meta.get(f"{arch}.attention.head_count_kv", n_heads))
    out: dict[str, QTensor] = {}
    for t in reader.tensors:
        name = hf_name(t.name, Path(path), arch) if len(t.shape) >= 2 else ""
        if len(t.shape) < 2 or name.endswith(ROUTER):
            continue  # norms (f32 vectors) and routers come from the converted folder
        kind = t.tensor_type.name
        if len(t.shape) == 3:  # experts [E, rows, cols]: one matrix each, named model.layers.N.mlp.experts.E.*
            if kind not in KINDS:
                raise SpecdecError(f"{path}: tensor {t.name} is {kind}; --precision gguf-q16 and gguf-q8 read "
                                   f"{', '.join(KINDS)} blocks (use --precision fp16 for this file)")
            cols, rows, count = (int(n) for n in t.shape)
            blocks = np.asarray(t.data, dtype=np.uint8).reshape(count, rows, row_bytes(kind, cols))
            stem, _, leaf = name.rpartition(".experts.")
            for e in range(count):
                out[f"{stem}.experts.{e}.{leaf}"] = QTensor(kind, blocks[e], rows, cols)
            continue
        if kind not in KINDS:
            raise SpecdecError(f"{path}: tensor {t.name} is {kind}; --precision gguf-q16 and gguf-q8 read "
                               f"{', '.join(KINDS)} blocks (use --precision fp16 for this file)")
        cols, rows = int(t.shape[0]), int(t.shape[1])  # GGUF lists the contiguous dimension first
        blocks = np.asarray(t.data, dtype=np.uint8).reshape(rows, row_bytes(kind, cols))
        if arch == PERMUTED and name.endswith("q_proj.weight"):  # llama.cpp reorders llama's Q and K only
            blocks = unpermute(blocks, n_heads)
        elif arch == PERMUTED and name.endswith("k_proj.weight"):
            blocks = unpermute(blocks, n_kv)
        out[name] = QTensor(kind, blocks, rows, cols)
    return out
