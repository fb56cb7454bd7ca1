"""The one interface every drafter implements, from n-gram lookup to a draft model.

A drafter serves a pool of slots, one sequence per slot. `open` starts a sequence in a slot and `close` ends
it; each round `propose` drafts up to ks[i] tokens for slots[i] (rows with fewer, or with k = 0, are
PAD-padded) and `accepted` reports how many of them the target kept.

What the step loop needs to know about a drafter it reads from declared capabilities, never by probing: every
drafter in specdec.drafters subclasses `Drafter` and sets each of them itself (tests/test_drafter_contract.py
checks), and a drafter from elsewhere inherits the defaults by subclassing.

  free        proposing costs next to nothing and draws no random numbers (prompt lookup, suffix decoding): the
              step loop asks it for all the room a row has and shadow-scores the drafts it does not verify. A
              model drafter is not free: each drafted token costs a forward step.
  confident   `propose` returns `Draft.confidence`, its own estimate that each token is accepted: at temperature 0
              it is then asked for as many tokens as the row has room for, and the planner keeps the prefix that
              pays. A free drafter may return confidences too (prompt lookup does, at any temperature).
  taps        the target layers whose hidden states it reads (a trained head, drafters/eagle.py); () for none. The
              step loop then passes it the target's features at every position the target ran and kept, prompt
              included, through `features(slot, start, feats)`.
  learns      what it drafts improves with the traffic it has seen (rates measured across requests, an index of
              finished sequences): a fresh process drafts worse than a warm one.
  catch_up_s  seconds of the last `propose` spent feeding contexts (a new prompt's prefill), not drafting: the
              planner leaves it out of the drafting cost.

A deterministic drafter returns probs=None: q is one-hot on its tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.sampling.verify import PAD
from specdec.sampling.warp import SamplingConfig

CAPABILITIES = ("name", "free", "confident", "taps", "learns", "catch_up_s")  # what every drafter declares


@dataclass
class Draft:
    tokens: torch.Tensor  # [batch, k] long, PAD-padded on the right
    probs: torch.Tensor | None = None  # [batch, k, vocab] draft distribution q (warped), or None
    # [batch, k] the drafter's own estimate that token j is accepted given that the ones before it were (NaN where
    # it has none), or None: the auto policy then cuts each row's draft where it stops paying (engine/policy.py)
    confidence: torch.Tensor | None = None


class Drafter(Protocol):
    name: str = "drafter"
    free: bool = False
    confident: bool = False
    taps: tuple[int, ...] = ()
    learns: bool = False
    catch_up_s: float = 0.0

    def reserve(self, slots: int, capacity: int, huge_pages: bool = True) -> int:
        """Room for `slots` sequences at once, each never longer than `capacity` tokens. Returns the length it
        can serve (less when, say, a draft model's own context is shorter). huge_pages: whether a KV cache it
        keeps goes on 2 MB pages (models/kv_cache.py KVCache says when)."""
        ...

    def open(self, slot: int, prompt: Sequence[int], sampling: SamplingConfig) -> None:
        """Start a sequence in `slot`. Drafters that give probabilities warp them with `sampling`, as the
        target's are, and draw from their own stream seeded from it."""
        ...

    def close(self, slot: int) -> None:
        """The sequence in `slot` is done (finished, or its client left)."""
        ...

    def propose(self, slots: Sequence[int], contexts: Sequence[Sequence[int]], ks: Sequence[int]) -> Draft:
        """Draft up to ks[i] tokens continuing contexts[i], the whole context of the sequence in slots[i].
        Returns tokens [len(slots), max(ks)]."""
        ...

    def accepted(self, slots: Sequence[int], num_accepted: Sequence[int]) -> None:
        """Feedback after verification: how many of the proposed tokens each slot kept."""
        ...

    def features(self, slot: int, start: int, feats: torch.Tensor) -> None:
        """The target's features [m, len(taps) * hidden] at positions start .. start + m - 1 of the slot's
        sequence. Called only for a drafter with taps; nothing to do for the others."""


def pad_rows(rows: Sequence[Sequence[int]], k: int) -> torch.Tensor:
    """[batch, k] long: each row's tokens, PAD-padded."""
    out = torch.full((len(rows), k), PAD, dtype=torch.long)
    for b, toks in enumerate(rows):
        if toks:
            out[b, : len(toks)] = torch.tensor(toks[:k], dtype=torch.long)
    return out


class NoDrafter(Drafter):
    """Plain decoding through the speculative loop: proposes nothing, so every round is one target token."""

    name = "none"
    free = True
    confident = False
    taps = ()
    learns = False
    catch_up_s = 0.0

    def reserve(self, slots, capacity, huge_pages=True) -> int:
        return capacity

    def open(self, slot, prompt, sampling) -> None:
        pass

    def close(self, slot) -> None:
        pass

    def propose(self, slots, contexts, ks) -> Draft:
        return Draft(tokens=torch.full((len(contexts), 0), PAD, dtype=torch.long))

    def accepted(self, slots, num_accepted) -> None:
        pass
