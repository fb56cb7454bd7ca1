"""The Gemma 3 and Gemma 2 parts of GGUF -> Hugging Face conversion (gguf_convert does the rest; gguf_arch
chooses this module for gemma3 and gemma2 files): tensor names, norm weights, config.json and the SentencePiece
tokenizer; and the file's matrices as stored, under the same names, for gguf-q16 and gguf-q8 (read_matrices).

What llama.cpp's converter (convert_hf_to_gguf.py, Gemma3Model) does to a Gemma3ForCausalLM, undone here:
  - names: `blk.N.attn_norm` is input_layernorm, `post_attention_norm` post_attention_layernorm, `ffn_norm`
    pre_feedforward_layernorm (in a llama file it is post_attention_layernorm), `post_ffw_norm`
    post_feedforward_layernorm, `attn_q_norm` / `attn_k_norm` self_attn.q_norm / k_norm
  - every `*norm.weight` is stored as w + 1 (Gemma3RMSNorm scales by 1 + w, llama.cpp's RMSNorm by its weight):
    1 is subtracted back. Q and K are not permuted (Gemma's RoPE is NEOX style in llama.cpp): copied as they are
  - Gemma 3 4B, 12B and 27B scale their global layers' RoPE linearly (`rope.scaling.type` linear, factor 8): the
    folder's rope_parameters say so for the full layers; the sliding ones are never scaled (llama.cpp's rule)
  - what the file does not say, llama.cpp's loader assumes (llama-model.cpp, LLM_ARCH_GEMMA3): every 6th layer
    is global and the others slide (unless `attention.sliding_window_pattern` says otherwise), sliding layers use
    RoPE base 10000 (unless `rope.freq_base_swa`), and scores are scaled by head_dim^-1/2, except the 62-layer
    27B's hidden / heads (query_pre_attn_scalar; `attention.scale` when present)

Cost of dequantizing (Gemma 3 270M Q4_K_M: Q8_0 embeddings, Q4_K/Q5_0/Q6_K/Q8_0 blocks elsewhere, 253 MB): the
folder holds fp32 (1.07 GB), and a decode pass at fp16 reads 536 MB of weights (335 MB of them the tied
262144 x 640 LM head), where llama.cpp reads the GGUF's own 247 MB of tensors (178 MB of them the Q8_0 head):
2.2x the bytes per token (4.3x at fp32, 1.1x at int8). gguf-q16 reads the file's own blocks: 251 MB.

Gemma 2 (llama.cpp's Gemma2Model, LLM_ARCH_GEMMA2) is the same file without the q/k norms, and with
`attn_logit_softcapping` (scores s become cap * tanh(s / cap) before the softmax) and `final_logit_softcapping` (the
logits likewise); its even layers slide, every layer turns RoPE at `rope.freq_base` (10000), and the 27B (46
layers) scales scores by (hidden / heads)^-1/2. Its vocabulary is Gemma's SentencePiece, read as Gemma 3's.

The tokenizer is SentencePiece's, rebuilt by gguf_spm (Gemma's files say add_space_prefix false).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from specdec.errors import SpecdecError
from specdec.models.gguf.file import decimal, open_gguf

ARCH = "gemma3"
GEMMA2 = "gemma2"  # read here too: Gemma 3's layout without q/k norms, with soft-capped scores and logits
ARCHES = (ARCH, GEMMA2)
MODEL_TYPES = {ARCH: "gemma3_text", GEMMA2: "gemma2"}  # config.json's model_type of a converted folder
SLIDING, FULL = "sliding_attention", "full_attention"
NORM_SHIFT = 1.0  # llama.cpp stores Gemma's norm weights w as w + NORM_SHIFT
DEFAULT_PATTERN = 6  # without metadata, llama.cpp makes every 6th layer global
DEFAULT_LOCAL_THETA = 10_000.0
GEMMA2_PATTERN = 2  # Gemma 2: layers 0, 2, 4, ... slide
GEMMA2_27B_LAYERS, GEMMA3_27B_LAYERS = 46, 62  # the 27Bs, whose scores llama.cpp scales by (hidden / heads)^-1/2
QK_NORMS = ("self_attn.q_norm", "self_attn.k_norm")  # Gemma 3's, not Gemma 2's

_LAYER_NAMES = {  # llama.cpp per-block tensor -> Hugging Face module under model.layers.N
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.weight")



def check_metadata(meta: dict[str, Any], src: Path) -> None:
    """Refuse what the compact Gemma does not cover: soft-capping in a Gemma 3 file (llama.cpp would ignore it),
    rope scaling other than Gemma 3's linear kind."""
    arch = meta.get("general.architecture", ARCH)
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        value = meta.get(f"{arch}.{key}")
        if arch == ARCH and value not in (None, "none"):
            raise SpecdecError(f"{src}: Gemma 3 with {ARCH}.{key} = {value!r} is not supported")
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none") and (arch != ARCH or scaling != "linear"):  # 4B-27B scale their global layers
        raise SpecdecError(f"{src}: {arch} with rope.scaling.type = {scaling!r} is not supported (specdec runs Gemma "
                           "3's linear scaling)")


def linear_factor(meta: dict[str, Any]) -> float:
    """The global layers' linear RoPE scaling factor, as llama.cpp reads it: `rope.scaling.factor` (or the older
    `rope.scale_linear`), applied unless `rope.scaling.type` says "none" (linear is its default); 1 without one."""
    arch = meta.get("general.architecture", ARCH)
    factor = meta.get(f"{arch}.rope.scaling.factor") or meta.get(f"{arch}.rope.scale_linear") or 1.0
    if meta.get(f"{arch}.rope.scaling.type", "linear") == "none":
        return 1.0
    return decimal(factor)


def hf_name(name: str, src: Path) -> str:
    """The Hugging Face name of a GGUF tensor."""
    m = _BLOCK.fullmatch(name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.weight"
    if name.endswith(".weight") and name[:-len(".weight")] in _TOP_NAMES:
        return f"{_TOP_NAMES[name[:-len('.weight')]]}.weight"
    raise SpecdecError(f"{src}: tensor {name!r} has no Hugging Face Gemma equivalent")


def hf_tensor(name: str, weight: np.ndarray, src: Path) -> tuple[str, np.ndarray]:
    """The Hugging Face name and value of a dequantized GGUF tensor."""
    hf = hf_name(name, src)
    if hf.endswith("norm.weight"):
        weight = weight - np.float32(NORM_SHIFT)
    return hf, weight


def read_matrices(path: Path) -> dict:
    """Every matrix of a Gemma 3 GGUF as stored (gguf_weights.QTensor), under the names the converted folder gives
    it. Unlike a llama file's, Q and K rows are in Hugging Face's order already (see above): nothing is permuted."""
    from specdec.models.gguf.weights import KINDS, QTensor, row_bytes

    out = {}
    for t in open_gguf(Path(path)).tensors:
        if len(t.shape) != 2:
            continue  # norms (f32 vectors) come from the converted folder
        kind = t.tensor_type.name
        if kind not in KINDS:
            raise SpecdecError(f"{path}: tensor {t.name} is {kind}; --precision gguf-q16 and gguf-q8 read "
                               f"{', '.join(KINDS)} blocks (use --precision fp16 for this file)")
        cols, rows = int(t.shape[0]), int(t.shape[1])  # GGUF lists the contiguous dimension first
        out[hf_name(t.name, Path(path))] = QTensor(kind, t.data.reshape(rows, row_bytes(kind, cols)), rows, cols)
    return out


def runnable(path: Path) -> bool:
    """gguf_weights.runnable(path): every matrix in a format gguf-q16 and gguf-q8 read."""
    from specdec.models.gguf.weights import KINDS

    try:
        return all(t.tensor_type.name in KINDS for t in open_gguf(Path(path)).tensors if len(t.shape) == 2)
    except SpecdecError:
        return False


def config(meta: dict[str, Any], src: Path, shapes: dict[str, tuple[int, ...]],
           rope: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """Gemma3TextConfig (Gemma2Config) fields (transformers 5's rope_parameters, and the 4.x rope_theta /
    rope_local_base_freq); `shapes`: every tensor's shape by Hugging Face name; `rope` (rope_freqs and such
    vectors) never applies to Gemma."""
    arch = meta.get("general.architecture", ARCH)
    gemma2 = arch == GEMMA2

    def need(key: str) -> Any:
        if f"{arch}.{key}" not in meta:
            raise SpecdecError(f"{src}: GGUF metadata lacks {arch}.{key!r}")
        return meta[f"{arch}.{key}"]

    layers, hidden, heads = int(need("block_count")), int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    if int(meta.get(f"{arch}.attention.value_length", head_dim)) != head_dim:
        raise SpecdecError(f"{src}: key and value head sizes differ; not a Gemma layout")
    if int(meta.get(f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise SpecdecError(f"{src}: partial rotary embeddings are not supported")
    # llama.cpp: Gemma 2 alternates (even layers slide), Gemma 3 makes every 6th layer global
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern", GEMMA2_PATTERN if gemma2 else DEFAULT_PATTERN)
    if isinstance(pattern, list):  # one flag per layer, true where the layer slides
        if len(pattern) != layers:
            raise SpecdecError(f"{src}: sliding_window_pattern has {len(pattern)} entries for {layers} layers")
        types = [SLIDING if flag else FULL for flag in pattern]
    else:  # a period: the last layer of each group of `pattern` is global
        types = [SLIDING if (i + 1) % int(pattern) else FULL for i in range(layers)]
    scale = meta.get(f"{arch}.attention.scale")
    big = GEMMA2_27B_LAYERS if gemma2 else GEMMA3_27B_LAYERS  # llama.cpp scales the 27Bs by hidden / heads
    if scale:
        query_scalar = decimal(float(scale) ** -2)
    else:
        query_scalar = hidden // heads if layers == big else head_dim
    theta = decimal(meta.get(f"{arch}.rope.freq_base", 10_000.0 if gemma2 else 1_000_000.0))
    # Gemma 2's sliding layers turn as its global ones do
    local_theta = theta if gemma2 else decimal(meta.get(f"{arch}.rope.freq_base_swa", DEFAULT_LOCAL_THETA))
    full_rope = {"rope_type": "default", "rope_theta": theta}
    factor = 1.0 if gemma2 else linear_factor(meta)
    if factor != 1.0:  # llama.cpp scales the global layers only
        full_rope = {"rope_type": "linear", "factor": factor, "rope_theta": theta}
    _check_tensors(shapes, layers, src, qk_norm=not gemma2)
    caps = {key: (decimal(meta[f"{arch}.{key}"]) if gemma2 and meta.get(f"{arch}.{key}") else None)
            for key in ("final_logit_softcapping", "attn_logit_softcapping")}
    ids = {k: meta.get(f"tokenizer.ggml.{k}") for k in ("bos_token_id", "eos_token_id", "padding_token_id")}
    return {
        "architectures": ["Gemma2ForCausalLM" if gemma2 else "Gemma3ForCausalLM"],
        "model_type": MODEL_TYPES[arch],
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": decimal(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "query_pre_attn_scalar": query_scalar,
        "sliding_window": int(need("attention.sliding_window")),
        "layer_types": types,
        "rope_theta": theta,
        "rope_local_base_freq": local_theta,
        "rope_parameters": full_rope if gemma2 else {FULL: full_rope,
                                                     SLIDING: {"rope_type": "default", "rope_theta": local_theta}},
        "max_position_embeddings": int(need("context_length")),
        "vocab_size": int(shapes["model.embed_tokens.weight"][0]),
        "tie_word_embeddings": "lm_head.weight" not in shapes,
        "attention_bias": False,
        **caps,
        "bos_token_id": ids["bos_token_id"],
        "eos_token_id": ids["eos_token_id"],
        "pad_token_id": ids["padding_token_id"],
        "torch_dtype": "float32",
    }


def _check_tensors(shapes: dict[str, tuple[int, ...]], layers: int, src: Path, qk_norm: bool = True) -> None:
    """Every tensor the model reads is present, so a broken file fails here and not at load."""
    modules = [m for m in _LAYER_NAMES.values() if qk_norm or m not in QK_NORMS]
    wanted = ["model.embed_tokens.weight", "model.norm.weight"] + [
        f"model.layers.{i}.{module}.weight" for i in range(layers) for module in modules]
    missing = [name for name in wanted if name not in shapes]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise SpecdecError(f"{src}: not a complete Gemma model; missing {', '.join(missing[:3])}{more}")
