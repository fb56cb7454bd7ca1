"""The architecture of a Llama-family model, read from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError

# Weight precisions: "gguf", "gguf-q16" and "gguf-q8" run a GGUF file's own blocks on the native kernels
# (kernels/gguf.cpp): fp32 arithmetic on the exact weights, or integer dot products over activation blocks of 15 or
# 8 bits.
GGUF_PRECISIONS = ("gguf", "gguf-q16", "gguf-q8")
# The integer paths: activation bits per block of 32.
ACT_BITS = {"gguf-q16": 16, "gguf-q8": 8}
PRECISIONS = ("fp32", "fp16", "int8", "bf16") + GGUF_PRECISIONS

# model_type values whose blocks our compact implementation covers (RMSNorm, RoPE, GQA, SwiGLU).
SUPPORTED_TYPES = ("llama", "mistral", "qwen2")


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
    model_type: str = "llama"

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf(cls, cfg: dict) -> ModelConfig:
        mt = cfg.get("model_type", "")
        if mt not in SUPPORTED_TYPES:
            raise SpecdecError(f"model_type {mt!r} is not covered by specdec's compact implementation")
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
        kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        if kind not in ("default", None):
            raise SpecdecError(f"rope scaling {kind!r} is not covered by specdec's compact implementation")
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0) if isinstance(rope, dict) else 10000.0)
        heads = cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", mt == "qwen2")),
            model_type=mt,
        )

    @classmethod
    def from_dir(cls, path: Path) -> ModelConfig:
        try:
            return cls.from_hf(json.loads((Path(path) / "config.json").read_text()))
        except (OSError, json.JSONDecodeError, KeyError) as e:
            raise SpecdecError(f"{path}: unreadable config.json ({e})") from None
