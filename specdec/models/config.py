"""The architecture of a Llama-family model, read from a Hugging Face config.json."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.inputs import number

# Weight precisions: "gguf", "gguf-q16" and "gguf-q8" run a GGUF file's own blocks on the native kernels
# (kernels/gguf.cpp): fp32 arithmetic on the exact weights, or integer dot products over activation blocks of 15 or
# 8 bits.
GGUF_PRECISIONS = ("gguf", "gguf-q16", "gguf-q8")
# The integer paths: activation bits per block of 32.
ACT_BITS = {"gguf-q16": 16, "gguf-q8": 8}
PRECISIONS = ("fp32", "fp16", "int8", "bf16") + GGUF_PRECISIONS

# model_type values whose blocks our compact implementation covers (RMSNorm, RoPE, GQA, SwiGLU; Qwen3 adds an
# RMSNorm on each query and key head before RoPE; Phi-3 fuses [q; k; v] and [gate; up] into one matrix each;
# Qwen3-MoE and Mixtral route each token to a few experts in place of the MLP).
SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "qwen3_moe", "mixtral")

# config.json sizes every architecture here reads: required, and optional (null or absent: derived or defaulted)
SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "max_position_embeddings")


def read_config(path: Path) -> dict:
    """A model folder's config.json, which must hold a JSON object."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise SpecdecError(f"{path}: unreadable config.json ({e})") from None
    if not isinstance(cfg, dict):
        raise SpecdecError(f"{path}: config.json holds a {type(cfg).__name__}, not an object")
    return cfg


def check_sizes(cfg: dict) -> None:
    """The architecture's sizes in a config.json: positive integers, with key/value heads that divide the query
    heads (a model built from others would fail only at its first pass)."""
    for key in SIZES + OPTIONAL_SIZES:
        value = cfg.get(key)
        if value is None and key in OPTIONAL_SIZES:
            continue
        if key not in cfg:
            raise SpecdecError(f"config.json has no {key}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecdecError(f"config.json: {key} must be an integer >= 1, got {json.dumps(value)[:40]}")
    for key in ("rms_norm_eps", "rope_theta"):
        number(cfg.get(key), f"config.json: {key}", 0, low_open=True, optional=True)
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    if heads % kv:
        raise SpecdecError(f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")


FREQ_FACTORS = "specdec_rope_freq_factors"  # config.json key a converted GGUF's rope_freqs tensor goes to


def longrope_scaling(cfg: dict, rope: dict, head_dim: int) -> tuple[list[float], list[float], int, int, float]:
    """(short factors, long factors, original context, trained context, attention factor) of Phi-3's LongRoPE.
    Within the original context the short factors apply; past it the long ones, at every position. The two
    references switch at different moments: llama.cpp when its context is set past the original (every sequence
    then runs the long factors), transformers when a sequence grows past it (recomputing every cached position's
    angles, which a cache of keys cannot follow exactly). specdec switches as llama.cpp does, by the context it is
    loaded for (ModelConfig.with_context)."""
    orig = rope.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
    trained = int(cfg.get("max_position_embeddings") or 0)
    short, long = rope.get("short_factor"), rope.get("long_factor")
    if not isinstance(orig, int) or orig < 1 or not all(
            isinstance(f, list) and len(f) == head_dim // 2 and all(isinstance(x, (int, float)) and x > 0 for x in f)
            for f in (short, long)):
        raise SpecdecError(f"config.json: longrope rope scaling needs original_max_position_embeddings and "
                           f"{head_dim // 2} positive short_factor and long_factor values")
    factor = rope.get("attention_factor")
    if factor is None:  # transformers' default for longrope: from the ratio of the contexts
        scale = trained / orig
        factor = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0
    return short, long, min(orig, trained or orig), trained, float(factor)


def llama3_factors(theta: float, head_dim: int, rope: dict) -> list[float]:
    """Llama 3's rope scaling as a divisor per rotary frequency: 1 for wavelengths under the original context /
    high_freq_factor, `factor` above original / low_freq_factor, and a smooth blend between (what transformers'
    llama3 rope and llama.cpp's rope_freqs tensor both compute)."""
    try:
        factor, low, high = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
        old = float(rope["original_max_position_embeddings"])
    except (KeyError, TypeError, ValueError):
        raise SpecdecError("config.json: llama3 rope scaling needs factor, low_freq_factor, high_freq_factor and "
                           "original_max_position_embeddings") from None
    if not (factor > 0 and high > low > 0 and old > 0):
        raise SpecdecError("config.json: llama3 rope scaling needs factor > 0 and "
                           "high_freq_factor > low_freq_factor > 0")
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has biases on q, k, v
    qk_norm: bool = False  # Qwen3: an RMSNorm (weights [head_dim]) on each query and key head, before RoPE
    fused: bool = False  # Phi-3: the checkpoint holds qkv_proj and gate_up_proj, not their parts
    sliding_window: int | None = None  # Phi-3: a query sees this many keys, its own included (None: all)
    # a mixture of experts (Qwen3-MoE, Mixtral): num_experts per layer, each token routed to experts_per_token of
    # them (softmax over the router's logits, the top k; their weights renormalized when norm_topk), each an MLP of
    # intermediate size expert_size
    num_experts: int = 0
    experts_per_token: int = 0
    expert_size: int = 0
    norm_topk: bool = True
    model_type: str = "llama"
    # Llama 3's rope scaling: each rotary frequency divided by its factor (head_dim / 2 of them), as llama.cpp's
    # rope_freqs tensor holds them; None: unscaled. LongRoPE (Phi-3 128k, Phi-3.5): its short factors
    rope_freq_factors: tuple[float, ...] | None = None
    rope_attn_factor: float = 1.0  # cos and sin scaled by it (LongRoPE's attention factor)
    # LongRoPE: the context the file was trained to, and its long factors (max_position_embeddings is the
    # original context, where rope_freq_factors, the short ones, apply, until with_context asks for more); None: no
    # LongRoPE
    long_context: int | None = None
    rope_long_factors: tuple[float, ...] | None = None
    original_context: int | None = None  # LongRoPE: where the short factors end

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of every tensor a checkpoint of this architecture holds, by Hugging Face name (lm_head.weight
        may be left out: the embeddings serve)."""
        h, ff = self.hidden_size, self.intermediate_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        shapes = {"model.embed_tokens.weight": (self.vocab_size, h), "model.norm.weight": (h,),
                  "lm_head.weight": (self.vocab_size, h)}
        for i in range(self.num_layers):
            pre = f"model.layers.{i}."
            shapes.update({pre + "input_layernorm.weight": (h,), pre + "post_attention_layernorm.weight": (h,),
                           pre + "self_attn.o_proj.weight": (h, q)})
            if self.num_experts:  # the router, and every expert's projections in one tensor each
                e, f = self.num_experts, self.expert_size
                shapes.update({pre + "self_attn.q_proj.weight": (q, h), pre + "self_attn.k_proj.weight": (kv, h),
                               pre + "self_attn.v_proj.weight": (kv, h), pre + "mlp.gate.weight": (e, h),
                               pre + "mlp.experts.gate_proj.weight": (e, f, h),
                               pre + "mlp.experts.up_proj.weight": (e, f, h),
                               pre + "mlp.experts.down_proj.weight": (e, h, f)})
            elif self.fused:
                shapes.update({pre + "self_attn.qkv_proj.weight": (q + 2 * kv, h),
                               pre + "mlp.gate_up_proj.weight": (2 * ff, h)})
            else:
                shapes.update({pre + "self_attn.q_proj.weight": (q, h), pre + "self_attn.k_proj.weight": (kv, h),
                               pre + "self_attn.v_proj.weight": (kv, h), pre + "mlp.gate_proj.weight": (ff, h),
                               pre + "mlp.up_proj.weight": (ff, h)})
            if not self.num_experts:
                shapes[pre + "mlp.down_proj.weight"] = (h, ff)
            if self.attention_bias:
                shapes.update({pre + "self_attn.q_proj.bias": (q,), pre + "self_attn.k_proj.bias": (kv,),
                               pre + "self_attn.v_proj.bias": (kv,)})
            if self.qk_norm:
                shapes.update({pre + "self_attn.q_norm.weight": (self.head_dim,),
                               pre + "self_attn.k_norm.weight": (self.head_dim,)})
        return shapes

    @classmethod
    def from_hf(cls, cfg: dict) -> ModelConfig:
        mt = cfg.get("model_type", "")
        if mt not in SUPPORTED_TYPES:
            raise SpecdecError(f"model_type {mt!r} is not covered by specdec's compact implementation")
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
        kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        longrope = mt == "phi3" and kind in ("longrope", "su")
        if kind not in ("default", "llama3", None) and not longrope:
            raise SpecdecError(f"rope scaling {kind!r} is not covered by specdec's compact implementation "
                               "(default, llama3, and Phi-3's longrope are)")
        check_sizes(cfg)
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0) if isinstance(rope, dict) else 10000.0)
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        # Phi-3's window, as transformers applies it; a Mistral folder's is not (llama.cpp reads Mistral as llama)
        window = cfg.get("sliding_window") if mt == "phi3" else None
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise SpecdecError(f"config.json: sliding_window must be an integer >= 1, got {json.dumps(window)[:40]}")
        if mt == "phi3" and float(cfg.get("partial_rotary_factor") or 1.0) != 1.0:
            raise SpecdecError("Phi with partial rotary embeddings (partial_rotary_factor < 1: Phi-4-mini) is not "
                               "covered by specdec's compact implementation")
        factors = cfg.get(FREQ_FACTORS)  # a GGUF's rope_freqs, as converted
        if factors is None and kind == "llama3":
            factors = llama3_factors(float(theta), head_dim, rope)
        positions, long, long_factors = cfg.get("max_position_embeddings", 2048), None, None
        attn_factor = 1.0
        if longrope:
            factors, long_factors, positions, long, attn_factor = longrope_scaling(cfg, rope, head_dim)
        if factors is not None and (not isinstance(factors, list) or len(factors) != head_dim // 2
                                    or not all(isinstance(f, (int, float)) and f > 0 for f in factors)):
            raise SpecdecError(f"config.json: {FREQ_FACTORS} must be {head_dim // 2} positive numbers")
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta),
            max_position_embeddings=positions,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", mt == "qwen2")),
            qk_norm=mt in ("qwen3", "qwen3_moe"),
            fused=mt == "phi3",
            sliding_window=window,
            **_experts(cfg, mt),
            model_type=mt,
            rope_freq_factors=None if factors is None else tuple(float(f) for f in factors),
            rope_attn_factor=attn_factor,
            long_context=long,
            rope_long_factors=None if long_factors is None else tuple(float(f) for f in long_factors),
            original_context=positions if longrope else None,
        )

    def with_context(self, context: int | None) -> ModelConfig:
        """This model run for sequences of up to `context` positions (None: its default; more than the model
        holds: all it holds, as the scheduler caps a server's --context). LongRoPE also changes with it: past its
        original context every position runs the long factors, as llama.cpp does once its context is set past the
        original, up to the context it was trained to."""
        if context is None:
            return self
        context = min(context, self.long_context or self.max_position_embeddings)
        if self.long_context is None or context <= self.original_context:
            return replace(self, max_position_embeddings=context)
        return replace(self, max_position_embeddings=context, rope_freq_factors=self.rope_long_factors)

    @property
    def long_factors(self) -> bool:
        """LongRoPE running its long factors (a context past the original)."""
        return self.long_context is not None and self.max_position_embeddings > self.original_context

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    @classmethod
    def from_dir(cls, path: Path) -> ModelConfig:
        cfg = read_config(path)
        try:
            return cls.from_hf(cfg)
        except SpecdecError as e:
            raise SpecdecError(f"{path}: {e}") from None


def _experts(cfg: dict, mt: str) -> dict:
    """ModelConfig's expert fields from a Qwen3MoeConfig's or MixtralConfig's config.json ({} for a dense model)."""
    if mt not in ("qwen3_moe", "mixtral"):
        return {}
    keys = ("num_experts", "num_experts_per_tok", "moe_intermediate_size") if mt == "qwen3_moe" else (
        "num_local_experts", "num_experts_per_tok", "intermediate_size")
    count, used, size = (cfg.get(key) for key in keys)
    for key, value in zip(keys, (count, used, size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecdecError(f"config.json: {key} must be an integer >= 1, got {json.dumps(value)[:40]}")
    if used > count:
        raise SpecdecError(f"config.json: num_experts_per_tok {used} is more than the {count} experts")
    if mt == "qwen3_moe" and (cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1):
        raise SpecdecError("Qwen3-MoE with dense layers among the sparse ones (mlp_only_layers, decoder_sparse_step) "
                           "is not covered by specdec's compact implementation")
    norm = True if mt == "mixtral" else bool(cfg.get("norm_topk_prob", False))
    return dict(num_experts=count, experts_per_token=used, expert_size=size, norm_topk=norm)
