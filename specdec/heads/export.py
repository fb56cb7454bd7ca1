"""A trained head in the speculators format: the EAGLE-3 folder vLLM loads (`Eagle3LlamaForCausalLM`) and the
PyPI package `speculators` (0.9) parses and builds.

config.json follows speculators' Eagle3SpeculatorConfig: `speculators_model_type` "eagle3", a one-layer Llama
`transformer_layer_config` (vocab_size: the target's), `draft_vocab_size`, `eagle_aux_hidden_state_layer_ids`
(vLLM's meaning, which is ours: the residual stream entering that layer), `norm_before_residual` written
explicitly (vLLM reads a missing key as true, speculators as false), and `speculators_config` with a greedy
proposal method and the verifier. model.safetensors holds the head's tensors under their EAGLE-3 names
(`fc`, `layers.0.*`, `norm`, `lm_head`, `d2t` as int64 offsets: target id = draft id + d2t, `t2d` as a bool
mask over the target's vocabulary); the token embedding is the target's, which the engines take from it.
"""

from __future__ import annotations

import json
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.heads.eagle import EagleHead

SPECULATORS_VERSION = "0.9.0"  # the version whose schema this writes (and tests/test_heads_export.py checks)


def speculators_config(head: EagleHead, verifier: str, k: int = 3, dtype: str = "float16") -> dict:
    c = head.cfg
    if len(c.taps) != 3:
        raise SpecdecError(f"the speculators format fuses three target layers; this head reads {len(c.taps)}")
    layer = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": c.hidden,
        "intermediate_size": c.intermediate, "num_hidden_layers": 1, "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads, "head_dim": c.head_dim, "hidden_act": "silu", "rms_norm_eps": c.eps,
        "max_position_embeddings": c.max_positions, "vocab_size": c.target_vocab, "attention_bias": False,
        "attention_dropout": 0.0, "mlp_bias": False, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta}, "rope_theta": c.rope_theta,
        "dtype": dtype,
    }
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer,
        "draft_vocab_size": c.draft_vocab,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": list(c.taps),
        "norm_before_residual": c.norm_before_residual,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        "dtype": dtype,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
    }


def export_speculators(src: Path, out: Path, verifier: str | None = None) -> Path:
    """Write src (a head from `specdec train-draft`) to out as a speculators folder; returns out."""
    from safetensors.torch import save

    from specdec.atomic import write_bytes_atomic, write_text_atomic

    head = EagleHead.load(src)
    meta = json.loads((src / "head.json").read_text())
    verifier = verifier or meta.get("verifier") or "HuggingFaceTB/SmolLM2-135M-Instruct"
    if out.exists() and any(out.iterdir()):
        raise SpecdecError(f"{out} exists and is not empty: choose a new folder")
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.half() if v.is_floating_point() else v for k, v in head.tensors().items()}  # d2t int64, t2d bool
    write_bytes_atomic(out / "model.safetensors", save(tensors, metadata={"format": "pt"}))
    write_text_atomic(out / "config.json", json.dumps(speculators_config(head, verifier), indent=2) + "\n")
    return out
