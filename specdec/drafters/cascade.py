"""A cascade of drafters (`--drafter ngram,eagle`): each row takes the first drafter's draft that is long enough,
falling back along the list; the last drafter always answers.

The cheap drafters come first (prompt lookup and suffix decoding copy text at no cost and, where they match, are
right more often than a model), a trained head last. Every member sees every sequence open and close, and the
ones that read the target's hidden states get them for every position, so a head that sat out some rounds
catches up when it is asked again. A row drafted by a deterministic member gets a one-hot q, and a row's
confidence is its member's (NaN from a member that gives none; none at all when no member gave any).

Its capabilities are its members': free when all are, confident, learning or tapping the target when any is, and
its catch-up time the sum of the members' that drafted in the last round.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.drafters.base import Draft, Drafter
from specdec.errors import SpecdecError
from specdec.sampling.verify import PAD


class CascadeDrafter(Drafter):
    def __init__(self, members: Sequence, min_tokens: int = 2):
        """min_tokens: a member's draft is taken when it has at least this many tokens (or all the row's k)."""
        if len(members) < 2:
            raise SpecdecError("a cascade needs at least two drafters")
        if min_tokens < 1:
            raise SpecdecError(f"a cascade's min_tokens must be >= 1, got {min_tokens}")
        self.members, self.min_tokens = list(members), min_tokens
        self.name = ",".join(m.name for m in self.members)
        self.free = all(m.free for m in self.members)
        self.confident = any(m.confident for m in self.members)
        self.taps = next((tuple(m.taps) for m in self.members if m.taps), ())
        self.learns = any(m.learns for m in self.members)
        self.catch_up_s = 0.0
        self.used: dict[int, object] = {}  # slot -> the member whose draft it took last round
        self.counts = {m.name: 0 for m in self.members}  # rows drafted by each member

    def reserve(self, slots: int, capacity: int, huge_pages: bool = True) -> int:
        return min(m.reserve(slots, capacity, huge_pages=huge_pages) or capacity for m in self.members)

    def open(self, slot, prompt, sampling) -> None:
        for m in self.members:
            m.open(slot, prompt, sampling)

    def close(self, slot) -> None:
        for m in self.members:
            m.close(slot)
        self.used.pop(slot, None)

    def features(self, slot: int, start: int, feats: torch.Tensor) -> None:
        for m in self.members:
            if m.taps:
                m.features(slot, start, feats)

    def propose(self, slots, contexts, ks) -> Draft:
        width = max(ks, default=0)
        tokens = torch.full((len(slots), width), PAD, dtype=torch.long)  # [n, k]
        probs = None  # [n, k, vocab] once a member gives probabilities
        conf = torch.full((len(slots), width), float("nan"))  # [n, k]: NaN where the member gave none
        given: set[int] = set()  # rows whose q came from a member
        rated = self.confident  # whether any row's member gave confidences
        todo = [i for i, k in enumerate(ks) if k > 0]
        self.catch_up_s = 0.0
        for j, m in enumerate(self.members):
            if not todo:
                break
            last = j == len(self.members) - 1
            d = m.propose([slots[i] for i in todo], [contexts[i] for i in todo], [ks[i] for i in todo])
            self.catch_up_s += m.catch_up_s
            rest = []
            for r, i in enumerate(todo):
                row = [t for t in d.tokens[r].tolist() if t != PAD]
                if not last and len(row) < min(self.min_tokens, ks[i]):
                    rest.append(i)
                    continue
                tokens[i, :len(row)] = torch.tensor(row, dtype=torch.long)
                self.used[slots[i]] = m
                self.counts[m.name] += 1
                if d.confidence is not None:
                    conf[i, :len(row)] = d.confidence[r, :len(row)]
                    rated = True
                if d.probs is not None:
                    if probs is None:
                        probs = torch.zeros(len(slots), width, d.probs.shape[-1])
                    probs[i, :len(row)] = d.probs[r, :len(row)]
                    given.add(i)
            todo = rest
        if probs is not None:  # rows a deterministic member drafted: q one-hot on their tokens
            for i in range(len(slots)):
                real = tokens[i] != PAD
                if i not in given and real.any():
                    probs[i, real] = torch.nn.functional.one_hot(tokens[i, real], probs.shape[-1]).float()
        return Draft(tokens, probs, conf if rated else None)

    def accepted(self, slots, num_accepted) -> None:
        by: dict[int, tuple[list, list]] = {}
        for s, a in zip(slots, num_accepted):
            m = self.used.get(s)
            if m is not None:
                by.setdefault(id(m), (m, [], []))
                by[id(m)][1].append(s)
                by[id(m)][2].append(a)
        for m, ss, aa in by.values():
            m.accepted(ss, aa)
