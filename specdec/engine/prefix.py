"""Prefix caching: the keys and values of recently finished sequences, reused by requests that start with the same
tokens (a second question about the same document, the next turn of a chat, a shared system prompt).

A store of `entries` cache rows, each up to `capacity` positions. When a sequence leaves its slot, its valid
positions are copied into the store (into the entry it extends, else a free one, else the least recently used);
when a request takes a slot, the longest stored prefix of its prompt is copied in and only the rest is
prefilled. A copy costs about what reading the positions once does: tens of milliseconds for thousands of
tokens, against seconds to prefill them.

Exactness: reuse is only offered by a model whose keys and values at a position do not depend on how that
position was computed (`exact_kv_reuse`: the native kernels compute prefill, decode and verify rows one way,
whatever the chunking), so a request's output is identical with and without the cache.

Entries are keyed by the KV cache's type as well as their tokens: the store's rows are of the type of the model's
caches when it was made (models/kv_cache.py: f16, q8_0, q4_0), and a cache of another type neither finds entries
here nor leaves any (keys quantized to q8_0 are not an f16 prompt's keys).
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import SpecdecError
from specdec.models.target import TargetTraits


@dataclass
class Entry:
    tokens: list[int]  # the positions this entry holds, as tokens
    used: int  # the store's clock when it was last stored or reused


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    def __init__(self, model, entries: int, capacity: int, huge_pages: bool = False):
        """huge_pages: see KVCache; off, as entries hold prompts far shorter than `capacity` as a rule."""
        if entries < 1:
            raise SpecdecError(f"a prefix cache needs at least 1 entry, got {entries}")
        if not TargetTraits.of(model).exact_kv_reuse:
            raise SpecdecError("prefix caching needs the native kernels (this model's prefill and decode "
                               "compute keys differently, so reuse would change outputs)")
        self.cache = model.new_cache(entries, capacity, huge_pages=huge_pages)
        self.kind = getattr(self.cache, "kind", None)  # the KV cache type every entry holds: half its key
        self.capacity = self.cache.capacity
        self.entries: list[Entry | None] = [None] * entries
        self.clock = 0
        self.lookups = self.hits = self.reused_tokens = 0

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes

    def state(self) -> dict:
        """Counts only (nothing of the stored tokens): entries held, their bound, positions held, their bound."""
        held = [e for e in self.entries if e is not None]
        return {"prefix_entries": len(held), "prefix_entries_max": len(self.entries),
                "prefix_tokens": sum(len(e.tokens) for e in held),
                "prefix_tokens_max": len(self.entries) * self.capacity}

    def audit(self) -> list[str]:
        """Broken bookkeeping, one line each: an entry longer than its row, an empty entry, a clock from the future."""
        problems = []
        for i, e in enumerate(self.entries):
            if e is None:
                continue
            if not 0 < len(e.tokens) <= self.capacity:
                problems.append(f"prefix entry {i} holds {len(e.tokens)} positions (capacity {self.capacity})")
            if e.used > self.clock:
                problems.append(f"prefix entry {i} was used at {e.used}, after the clock ({self.clock})")
        return problems

    def holds(self, cache) -> bool:
        """Whether `cache` is of the KV cache type the entries hold (the other half of an entry's key)."""
        return getattr(cache, "kind", None) == self.kind

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def load(self, prompt: list[int], cache, slot: int) -> int:
        """Copy the longest stored prefix of `prompt` (all but its last token: that one's logits are needed)
        into row `slot` of `cache`. Returns how many positions were copied (0: nothing stored matches, or `cache`
        is of another KV cache type than the entries)."""
        self.lookups += 1
        if not self.holds(cache):
            return 0
        best, n, wanted = None, 0, prompt[:-1]
        for i, e in enumerate(self.entries):
            if e is not None:
                m = common_prefix(e.tokens, wanted)
                if m > n:
                    best, n = i, m
        if best is None:
            return 0
        n = cache.copy_positions(self.cache, best, slot, n)
        self.entries[best].used = self._tick()
        self.hits += 1
        self.reused_tokens += n
        return n

    def store(self, tokens: list[int], cache, slot: int) -> None:
        """Keep the keys and values of `tokens` (the valid positions of row `slot` of `cache`; nothing where `cache`
        is of another KV cache type than the entries)."""
        tokens = tokens[:self.capacity]
        if not tokens or not self.holds(cache):
            return
        target = None
        for i, e in enumerate(self.entries):
            if e is None:
                continue
            m = common_prefix(e.tokens, tokens)
            if m == len(tokens):  # already held (within a longer entry): just refresh it
                e.used = self._tick()
                return
            if m == len(e.tokens):  # this sequence extends the entry: replace it
                target = i
        if target is None:
            free = [i for i, e in enumerate(self.entries) if e is None]
            target = free[0] if free else min(range(len(self.entries)), key=lambda i: self.entries[i].used)
        self.cache.copy_positions(cache, slot, target, len(tokens))
        self.entries[target] = Entry(list(tokens), self._tick())
