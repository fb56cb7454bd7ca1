"""Prompt lookup: copy what followed the most recent earlier occurrence of the context's last n tokens.

No model and no extra memory beyond an index of n-grams. The index is append-only (contexts only grow by
accepted tokens; rejected drafts never enter them), so each round indexes only the tokens added since the
last one: the search cost does not grow with the context.

How far the context's tail matches the text before the copied span (its match length) says how likely the copy
is right: on the bundled model's greedy Spec-Bench answers, a draft's first token was the target's next one 23% of
the time after a one-token match and 98% of the time after a match of 16 tokens or more. So each draft comes with
a confidence per token: the acceptance rate measured, in this process, for drafts whose match was as long, at that
draft position, given the earlier positions were right. Every draft offered is scored against the tokens the
target goes on to emit (verified or not: for a one-hot q, the next token equals the draft token with probability
p(x), its acceptance probability, at any temperature), so the rates cost no verification and follow the traffic.
The auto policy keeps the part of each draft that pays (engine/policy.py); drafts themselves never change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specdec.drafters.base import Draft, Drafter, pad_rows
from specdec.errors import SpecdecError

BUCKETS = (1, 2, 3, 4, 6, 10, 16)  # match lengths: bucket b holds lengths from BUCKETS[b] to the next bound - 1
LONGEST = 32  # a match is measured up to this many tokens
DEPTH = 16  # draft positions with their own rate (deeper ones share the last)
DECAY = 0.999  # per judged draft token: about the last thousand count


def bucket(length: int) -> int:
    """The index in BUCKETS of a match of `length` tokens (>= 1)."""
    b = 0
    while b + 1 < len(BUCKETS) and length >= BUCKETS[b + 1]:
        b += 1
    return b


@dataclass
class _Offer:
    at: int  # the context length it was drafted after
    tokens: list[int]
    bucket: int
    next: int = 0  # draft positions scored so far (all right)


@dataclass
class _RowIndex:
    # (n, ngram) -> end index (exclusive) of its most recent occurrence that is not the context's suffix
    last_end: dict[tuple, int] = field(default_factory=dict)
    indexed_to: int = 0  # every n-gram ending at or before this index (exclusive end) is indexed
    offers: list[_Offer] = field(default_factory=list)  # drafts not yet scored to their end


class AcceptanceTable:
    """Decayed counts of draft tokens judged and right, per match-length bucket and draft position."""

    def __init__(self):
        self.judged = [[0.0] * DEPTH for _ in BUCKETS]
        self.right = [[0.0] * DEPTH for _ in BUCKETS]

    def add(self, b: int, j: int, right: bool) -> None:
        j = min(j, DEPTH - 1)
        self.judged[b][j] = self.judged[b][j] * DECAY + 1.0
        self.right[b][j] = self.right[b][j] * DECAY + right

    def rate(self, b: int, j: int) -> float:
        """P(draft token j right | tokens before it right) after a match in bucket b: Laplace before evidence."""
        j = min(j, DEPTH - 1)
        return (self.right[b][j] + 1.0) / (self.judged[b][j] + 2.0)


class NgramDrafter(Drafter):
    name = "ngram"
    free = True
    taps = ()
    catch_up_s = 0.0

    def __init__(self, max_n: int = 4, min_n: int = 1, rated: bool = True):
        """rated: return each draft's confidences (False: none, and the planner goes by each row's record)."""
        if not (1 <= min_n <= max_n):
            raise SpecdecError(f"n-gram sizes need 1 <= min_n <= max_n, got {min_n}..{max_n}")
        self.max_n, self.min_n, self.rated = max_n, min_n, rated
        self.confident = rated  # each draft comes with its measured rates per match length
        self.learns = rated  # ... measured across every request of this process
        self.rows: dict[int, _RowIndex] = {}  # slot -> its sequence's index
        self.table = AcceptanceTable()  # shared by every sequence of this process

    def reserve(self, slots: int, capacity: int, huge_pages: bool = True) -> int:
        return capacity

    def open(self, slot: int, prompt: Sequence[int] = (), sampling=None) -> None:
        self.rows[slot] = _RowIndex()

    def close(self, slot: int) -> None:
        self.rows.pop(slot, None)

    def _index(self, row: _RowIndex, ctx: Sequence[int]) -> None:
        """Index every n-gram whose end lies in (indexed_to, len(ctx) - 1]: all but the current suffix."""
        stop = len(ctx) - 1
        for end in range(max(row.indexed_to + 1, 1), stop + 1):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                row.last_end[(n, tuple(ctx[end - n:end]))] = end
        row.indexed_to = max(row.indexed_to, stop)

    def _score(self, row: _RowIndex, ctx: Sequence[int]) -> None:
        """Score earlier offers against the tokens emitted since: each position up to its first wrong token."""
        live = []
        for o in row.offers:
            while o.next < len(o.tokens) and o.at + o.next < len(ctx):
                right = ctx[o.at + o.next] == o.tokens[o.next]
                self.table.add(o.bucket, o.next, right)
                o.next = o.next + 1 if right else len(o.tokens)
            if o.next < len(o.tokens):
                live.append(o)
        row.offers = live

    def match(self, slot: int, ctx: Sequence[int], k: int) -> tuple[list[int], int]:
        """Up to k tokens that followed the latest occurrence of the longest n-gram suffix, and the length of the
        match there (up to LONGEST; 0 without a match)."""
        row = self.rows[slot]
        self._index(row, ctx)
        for n in range(min(self.max_n, len(ctx)), self.min_n - 1, -1):
            end = row.last_end.get((n, tuple(ctx[-n:])))
            if end is not None:
                length = n
                while length < LONGEST and end - length > 0 and ctx[end - length - 1] == ctx[-length - 1]:
                    length += 1
                return list(ctx[end:end + k]), length
        return [], 0

    def lookup(self, slot: int, ctx: Sequence[int], k: int) -> list[int]:
        return self.match(slot, ctx, k)[0]

    def propose(self, slots, contexts, ks) -> Draft:
        width = max(ks, default=0)
        rows, conf = [], torch.full((len(slots), width), math.nan)  # [n, k]
        for i, (s, ctx, k) in enumerate(zip(slots, contexts, ks)):
            row = self.rows[s]
            self._score(row, ctx)
            toks, length = self.match(s, ctx, k) if k > 0 else ([], 0)
            rows.append(toks)
            if toks:
                b = bucket(length)
                row.offers = row.offers[-DEPTH:] + [_Offer(len(ctx), toks, b)]  # resolved as tokens arrive
                conf[i, :len(toks)] = torch.tensor([self.table.rate(b, j) for j in range(len(toks))])
        return Draft(pad_rows(rows, width), confidence=conf if self.rated else None)

    def accepted(self, slots, num_accepted) -> None:
        pass
