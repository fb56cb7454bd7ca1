"""Prompt lookup: copy what followed the most recent earlier occurrence of the context's last n tokens.

No model and no extra memory beyond an index of n-grams. The index is append-only (contexts only grow by
accepted tokens; rejected drafts never enter them), so each round indexes only the tokens added since the
last one: the search cost does not grow with the context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specdec.drafters.base import Draft, pad_rows
from specdec.errors import SpecdecError


@dataclass
class _RowIndex:
    # (n, ngram) -> end index (exclusive) of its most recent occurrence that is not the context's suffix
    last_end: dict[tuple, int] = field(default_factory=dict)
    indexed_to: int = 0  # every n-gram ending at or before this index (exclusive end) is indexed


class NgramDrafter:
    name = "ngram"
    free = True

    def __init__(self, max_n: int = 4, min_n: int = 1):
        if not (1 <= min_n <= max_n):
            raise SpecdecError(f"n-gram sizes need 1 <= min_n <= max_n, got {min_n}..{max_n}")
        self.max_n, self.min_n = max_n, min_n
        self.rows: dict[int, _RowIndex] = {}  # slot -> its sequence's index

    def reserve(self, slots: int, capacity: int) -> int:
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

    def lookup(self, slot: int, ctx: Sequence[int], k: int) -> list[int]:
        row = self.rows[slot]
        self._index(row, ctx)
        for n in range(min(self.max_n, len(ctx)), self.min_n - 1, -1):
            end = row.last_end.get((n, tuple(ctx[-n:])))
            if end is not None:
                return list(ctx[end:end + k])
        return []

    def propose(self, slots, contexts, ks) -> Draft:
        rows = [self.lookup(s, ctx, k) if k > 0 else [] for s, ctx, k in zip(slots, contexts, ks)]
        return Draft(pad_rows(rows, max(ks, default=0)))

    def accepted(self, slots, num_accepted) -> None:
        pass
