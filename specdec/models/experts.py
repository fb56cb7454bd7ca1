"""A mixture of experts in place of a block's MLP (Qwen3-MoE, Mixtral), for models.transformer's Block.

Routing, as llama.cpp and transformers route: the router's logits (fp32, [experts, hidden] times the normed row),
a softmax over all experts, the k most probable; their probabilities weigh the experts' outputs, renormalized to sum
to 1 when the config says so (norm_topk: Mixtral always, Qwen3-MoE as its config says, which llama.cpp assumes).
Each expert is a SwiGLU MLP of cfg.expert_size. A pass reads each expert its rows use once, whatever the number of
rows, and a row adds its experts' outputs in ascending expert order: a row's result does not depend on the others.

Two paths: `Experts` (torch, for the fp32/fp16/int8/bf16 precisions and the reference) and `native_experts` (the
kernels' MoeLayer on the GGUF's own blocks, run inside the block's native call).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.models.config import ModelConfig
from specdec.models.linear import Linear


class Experts:
    """The torch path: h [N, hidden] -> [N, hidden]."""

    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor], mlp: str, precision: str):
        self.router = w[mlp + "gate.weight"].float().contiguous()  # [E, hidden]
        gate, up, down = (w[f"{mlp}experts.{n}_proj.weight"] for n in ("gate", "up", "down"))  # [E, F, H] / [E, H, F]
        self.gate_up = [Linear(torch.cat([gate[e], up[e]]), None, precision) for e in range(cfg.num_experts)]
        self.down = [Linear(down[e], None, precision) for e in range(cfg.num_experts)]
        self.k, self.norm = cfg.experts_per_token, cfg.norm_topk

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(experts [N, k], weights [N, k]) of each row. The logits row by row: one product's shape whatever N, so
        a row's choice does not depend on the others."""
        logits = torch.stack([self.router @ row for row in h.float()])  # [N, E]
        p = torch.softmax(logits, dim=-1)
        weights, chosen = p.topk(self.k, dim=-1)  # [N, k]
        if self.norm:
            weights = weights / weights.sum(-1, keepdim=True)
        return chosen, weights

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        chosen, weights = self.route(h)
        out = torch.zeros_like(h)
        for e in torch.unique(chosen).tolist():  # ascending
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            gate, up = self.gate_up[e](h[rows]).chunk(2, dim=-1)
            out[rows] += weights[rows, slot, None] * self.down[e](F.silu(gate) * up)
        return out

    @property
    def linears(self) -> list[Linear]:
        return self.gate_up + self.down


def native_experts(cfg: ModelConfig, w: dict[str, torch.Tensor], mlp: str, quantized: dict, make) -> tuple:
    """(the kernels' MoeLayer, every expert's matrices) for one block; `make(parts)` builds a kernel matrix from
    GGUF matrices (transformer.qmatrix with the precision's settings)."""
    from specdec.kernels import decode_kernels

    gate_up = [make([quantized[f"{mlp}experts.{e}.{n}_proj.weight"] for n in ("gate", "up")])
               for e in range(cfg.num_experts)]
    down = [make([quantized[f"{mlp}experts.{e}.down_proj.weight"]]) for e in range(cfg.num_experts)]
    router = w[mlp + "gate.weight"].float().contiguous()  # [E, hidden]
    layer = decode_kernels().MoeLayer(router, gate_up, down, cfg.experts_per_token, cfg.norm_topk)
    return layer, gate_up + down
