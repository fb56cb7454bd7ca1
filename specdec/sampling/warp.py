"""Turning logits into the distribution a sampler draws from: temperature, top-k, top-p.

The engine applies the same warping to p (target) and q (draft); the distribution speculative decoding
preserves is then the warped target's, exactly as plain sampling with the same settings would draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.errors import SpecdecError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0) or math.isinf(self.temperature):
            raise SpecdecError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise SpecdecError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SpecdecError(f"top-k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def warp_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """logits [..., vocab] -> probabilities [..., vocab] (float32). Greedy gives one-hot argmax."""
    logits = logits.float()
    if cfg.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / cfg.temperature  # shifted first: a tiny T stays finite
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = logits.topk(cfg.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token that crosses it is kept)
        drop_sorted = (sorted_p.cumsum(dim=-1) - sorted_p) >= cfg.top_p
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


WARP_FLOATS = 1 << 16  # logits warped per call at most (256 KB): the passes over the vocabulary stay in cache


def warp_rows(logits: torch.Tensor, settings: list[SamplingConfig]) -> torch.Tensor:
    """logits [n, vocab], row i warped with settings[i] -> probabilities [n, vocab] (float32). Rows warped alike
    (the seed is not a warp) go through warp_probs together, as many at a time as fit in WARP_FLOATS: one row at a
    time over a large vocabulary, thousands over a small one. Each row's result is warp_probs of that row."""
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(settings):
        groups.setdefault((s.temperature, s.top_k, s.top_p), []).append(i)
    step = max(1, WARP_FLOATS // max(1, logits.shape[-1]))
    for rows in groups.values():
        cfg = settings[rows[0]]
        for a in range(0, len(rows), step):
            idx = torch.tensor(rows[a:a + step], device=logits.device)
            out[idx] = warp_probs(logits[idx], cfg)
    return out
