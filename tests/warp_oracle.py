"""An independent oracle for warping (temperature, top-k, top-p), written from the definitions with plain
Python floats and loops, sharing no code with specdec.sampling.warp. The distributional tests build their
expected distributions with it, so a bug in `warp_probs` cannot hide in both the engine and its reference.

The definitions (those of transformers' logits warpers, applied in this order):
    temperature T > 0  divide the logits by T; T = 0 is greedy: all mass on the first largest logit.
    top-k              keep every token whose logit is >= the k-th largest logit (ties at the boundary stay).
    top-p              of the distribution after top-k, keep the smallest set of most likely tokens whose mass
                       reaches top_p: walking in order of decreasing probability, a token is kept when the mass
                       before it is < top_p (so the token that crosses top_p is kept). Ties in probability are
                       walked in order of token id (the first of equal tokens is kept first).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def reference_warp(logits: Sequence[float], temperature: float, top_k: int = 0, top_p: float = 1.0) -> list[float]:
    """One distribution over the vocabulary, as Python floats (double precision)."""
    logits = [float(x) for x in logits]
    n = len(logits)
    if temperature == 0:
        best = max(range(n), key=lambda i: (logits[i], -i))  # the first largest
        return [1.0 if i == best else 0.0 for i in range(n)]
    scaled = [x / temperature for x in logits]
    keep = [True] * n
    if 0 < top_k < n:
        kth = sorted(scaled, reverse=True)[top_k - 1]
        keep = [x >= kth for x in scaled]
    top = max(x for x, k in zip(scaled, keep) if k)
    weights = [math.exp(x - top) if k else 0.0 for x, k in zip(scaled, keep)]
    total = sum(weights)
    probs = [w / total for w in weights]
    if top_p < 1.0:
        order = sorted(range(n), key=lambda i: (-probs[i], i))
        before = 0.0
        kept = set()
        for i in order:
            if before >= top_p:
                break
            kept.add(i)
            before += probs[i]
        total = sum(probs[i] for i in kept)
        probs = [probs[i] / total if i in kept else 0.0 for i in range(n)]
    return probs


def reference_warp_rows(logits, sampling) -> torch.Tensor:
    """reference_warp over every row of logits [..., vocab] with a SamplingConfig: float64 [..., vocab]."""
    flat = logits.detach().double().reshape(-1, logits.shape[-1]).tolist()
    rows = [reference_warp(row, sampling.temperature, sampling.top_k, sampling.top_p) for row in flat]
    return torch.tensor(rows, dtype=torch.float64).reshape(logits.shape)
