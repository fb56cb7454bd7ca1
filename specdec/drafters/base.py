"""The one interface every drafter implements, from n-gram lookup to a draft model.

A drafter proposes up to k tokens per sequence and hears back how many the target accepted. Sequences are
identified by their row in the batch; `begin` starts new ones. A drafter that proposes fewer than k tokens
for a row pads it with PAD; a deterministic drafter returns probs=None (q is one-hot on its tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.sampling.verify import PAD
from specdec.sampling.warp import SamplingConfig


@dataclass
class Draft:
    tokens: torch.Tensor  # [batch, k] long, PAD-padded on the right
    probs: torch.Tensor | None = None  # [batch, k, vocab] draft distribution q (warped), or None


class Drafter(Protocol):
    name: str

    def begin(self, prompts: Sequence[Sequence[int]], capacity: int, sampling: SamplingConfig) -> None:
        """Start a batch of sequences; row b's context starts as prompts[b] and never grows past `capacity`
        tokens. Drafters that give probabilities warp them with `sampling`, as the target's are."""

    def propose(self, contexts: Sequence[Sequence[int]], k: int, active: Sequence[bool]) -> Draft:
        """Draft up to k tokens continuing each context (inactive rows get nothing)."""

    def accepted(self, num_accepted: Sequence[int]) -> None:
        """Feedback after verification: how many of the proposed tokens each row kept."""


def pad_rows(rows: Sequence[Sequence[int]], k: int) -> torch.Tensor:
    """[batch, k] long: each row's tokens, PAD-padded."""
    out = torch.full((len(rows), k), PAD, dtype=torch.long)
    for b, toks in enumerate(rows):
        if toks:
            out[b, : len(toks)] = torch.tensor(toks[:k], dtype=torch.long)
    return out


class NoDrafter:
    """Plain decoding through the speculative loop: proposes nothing, so every round is one target token."""

    name = "none"

    def begin(self, prompts, capacity, sampling) -> None:
        pass

    def propose(self, contexts, k, active) -> Draft:
        return Draft(tokens=torch.full((len(contexts), 0), PAD, dtype=torch.long))

    def accepted(self, num_accepted) -> None:
        pass
