"""A drafter for the engine tests that drafts from a known continuation, declaring every capability of the
Drafter protocol as the package's drafters do (conftest.py's ScriptedDrafter predates the declarations)."""

from __future__ import annotations

from specdec.drafters.base import Draft, Drafter, pad_rows


class ScriptedDrafter(Drafter):
    """Drafts from a known continuation: for row r, the next k tokens of `futures[r]` (prompt + the plain
    output), of which only the first `correct(round)` are right and the rest are junk (token + 1 mod vocab).
    Records every proposal, and calls `on_propose(contexts)` first (the engine's state between rounds)."""

    name = "scripted"
    free = False
    confident = False
    taps = ()
    learns = False
    catch_up_s = 0.0

    def __init__(self, futures, vocab: int, correct=lambda i: 10**9, on_propose=None):
        self.futures, self.vocab, self.correct, self.on_propose = futures, vocab, correct, on_propose
        self.rounds = 0
        self.proposed: list[list[list[int]]] = []  # per round, per row
        self.heard: list[list[int]] = []  # per round, the accepted counts
        self.row_of: dict[int, int] = {}  # slot -> the row of futures it continues

    def reserve(self, slots, capacity, huge_pages=True) -> int:
        return capacity

    def open(self, slot, prompt, sampling) -> None:
        self.row_of[slot] = next(r for r, f in enumerate(self.futures) if list(f[:len(prompt)]) == list(prompt)
                                 and r not in self.row_of.values())

    def close(self, slot) -> None:
        pass

    def propose(self, slots, contexts, ks) -> Draft:
        if self.on_propose:
            self.on_propose(contexts)
        j = self.correct(self.rounds)
        self.rounds += 1
        rows = []
        for slot, ctx, k in zip(slots, contexts, ks):
            future = self.futures[self.row_of[slot]]
            true = list(future[len(ctx):len(ctx) + k])
            rows.append([t if i < j else (t + 1) % self.vocab for i, t in enumerate(true)])
        self.proposed.append(rows)
        return Draft(pad_rows(rows, max(ks, default=0)))

    def accepted(self, slots, num_accepted) -> None:
        self.heard.append(list(num_accepted))
