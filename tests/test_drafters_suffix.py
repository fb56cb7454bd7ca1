"""Suffix decoding: what it proposes from the sequence itself and from finished sequences, how long its drafts
are, that its shared index stays within its bound (and evicts exactly), that it equals a slow reference, and
that its per-round cost does not grow with the context."""

from __future__ import annotations

import random

import pytest

from specdec.drafters import suffix
from specdec.drafters.suffix import SuffixDrafter, _SharedIndex
from specdec.errors import SpecdecError
from specdec.sampling.verify import PAD
from specdec.sampling.warp import SamplingConfig


def propose(d: SuffixDrafter, ctx, k: int, slot: int = 0) -> list[int]:
    """One row's draft, PAD stripped; opens the slot with ctx as its prompt when it is not open."""
    if slot not in d.rows:
        d.open(slot, ctx, SamplingConfig())
    return [t for t in d.propose([slot], [ctx], [k]).tokens[0].tolist() if t != PAD]


def serve(d: SuffixDrafter, prompt, output, slot: int = 0, every: int = 3) -> None:
    """A request as the engine runs it: one context list, grown in place, proposed on every few tokens, then
    the slot closes (after tokens the drafter never saw in a propose)."""
    ctx = list(prompt)
    d.open(slot, prompt, SamplingConfig())
    for i, t in enumerate(output):
        if i % every == 0:
            d.propose([slot], [ctx], [4])
        ctx.append(t)
    d.close(slot)


def distinct(n: int, seed: int) -> list[int]:
    return random.Random(seed).sample(range(1000, 100_000), n)


# ---- what it proposes ----------------------------------------------------------------------------------------

def test_continues_a_repeated_pattern_in_the_sequence():
    d = SuffixDrafter()
    assert d.free and d.name == "suffix"
    ctx = [5, 6, 7, 8, 9] * 3 + [5, 6]
    assert propose(d, ctx, 6) == [7, 8, 9, 5, 6, 7]  # the walk goes on past what the sequence has shown
    assert propose(d, ctx, 2, slot=1) == [7, 8]
    assert propose(d, [1, 2, 3, 4, 5], 4, slot=2) == []  # nothing repeats
    assert propose(d, [7], 4, slot=3) == []


def test_learns_from_a_closed_sequence():
    """A second request that repeats the first one's output drafts it at full length from its first token: from
    the first request's prompt and output, including the tokens after its last propose (the engine's context
    list grows in place, and close reads it)."""
    prompt, output = distinct(30, 0), distinct(40, 1)
    d = SuffixDrafter()
    assert propose(d, prompt + output[:1], 8) == []  # nothing learned yet, nothing repeats
    d.close(0)  # that request held the prompt and one token
    serve(d, prompt, output)
    assert propose(d, prompt + output[:1], 8) == output[1:9]
    assert propose(d, prompt + output[:37], 8, slot=1) == output[37:]  # past the first request's last propose
    # another prompt that ends as the first did: the first draft already follows the first request's output
    other = distinct(20, 2) + prompt[-4:]
    assert propose(d, other, 8, slot=2) == output[:8]


def test_prefers_the_most_frequent_continuation_and_then_the_most_recent():
    # (1, 2, 3) was followed by 9 twice and by 7 once (most recently); nothing longer matches
    ctx = [10, 1, 2, 3, 9, 11, 1, 2, 3, 9, 12, 1, 2, 3, 7, 13, 1, 2, 3]
    assert propose(SuffixDrafter(), ctx, 1) == [9]
    assert propose(SuffixDrafter(), [10, 1, 2, 3, 9, 11, 1, 2, 3, 7, 13, 1, 2, 3], 1) == [7]  # a tie: the latest


def test_prefers_the_longest_matching_suffix():
    # (1, 2, 3) was followed by 9 twice, but (4, 1, 2, 3), the longer suffix, by 7
    ctx = [10, 1, 2, 3, 9, 11, 1, 2, 3, 9, 4, 1, 2, 3, 7, 12, 4, 1, 2, 3]
    assert propose(SuffixDrafter(), ctx, 1) == [7]
    assert propose(SuffixDrafter(max_depth=3), ctx, 1) == [9]  # max_depth 3 cannot tell them apart


@pytest.mark.parametrize("min_prob, drafted", [(0.0, [2, 3, 4, 6]), (0.3, [2, 3, 4, 6]), (0.34, [2, 3]),
                                               (0.6, [2, 3]), (0.7, [2]), (1.0, [2])])
def test_stops_when_the_draft_probability_falls_below_min_prob(min_prob, drafted):
    """With one token of context the index is a bigram table. After 1 came 2 (3 of 3 times), after 2 came 3
    (2 of 3), after 3 came 4 and 5 (once each, 4 the latest), after 4 came 6 (1 of 1): the draft after [1] is
    2, 3, 4, 6 with probabilities 1, 2/3, 1/3, 1/3; it ends where the next would fall below min_prob."""
    d = SuffixDrafter(max_depth=1, min_prob=min_prob)
    for i, seq in enumerate([[1, 2, 3, 5], [1, 2, 3, 4, 6], [1, 2, 8]]):
        d.open(i, seq)
        d.close(i)
    assert propose(d, [1], 8) == drafted


def test_the_sequence_itself_outweighs_other_sequences_at_the_same_depth():
    """(5, 6) was followed by 7 in three finished sequences and by 8 once in this one: mixed 2 : 1, 8 has
    probability 2/3; at 1 : 1 it is 1/2 (a tie, which the sequence's own favourite wins). A longer match
    elsewhere beats the sequence's own shorter one."""
    ctx = [5, 6, 8, 0, 5, 6]
    for weight, min_prob, drafted in ((2.0, 0.6, [8]), (2.0, 0.7, []), (1.0, 0.5, [8]), (1.0, 0.6, []),
                                      (0.25, 0.7, [7])):
        d = SuffixDrafter(max_depth=2, min_prob=min_prob, local_weight=weight)
        for i in range(3):
            d.open(i, [i + 20, 5, 6, 7])
            d.close(i)
        assert propose(d, ctx, 1) == drafted, weight
    d = SuffixDrafter(max_depth=3)
    d.open(0, [4, 5, 6, 7])
    d.close(0)
    assert propose(d, [5, 6, 8, 0, 4, 5, 6], 1) == [7]


def test_a_reopened_slot_starts_a_fresh_index_but_the_shared_one_remembers():
    d = SuffixDrafter()
    old = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1]
    assert propose(d, old, 3) == [2, 3, 4]
    d.close(0)
    assert 0 not in d.rows
    d.open(0, [9, 8, 1])
    assert d.rows[0].index.size() == 1 and d.rows[0].tokens == [9, 8, 1]  # nothing of the old sequence
    assert propose(d, [9, 8, 1], 3) == [2, 3, 4]  # ... but the shared index has it (after 1 came 2)
    d.close(0)
    assert d.shared.held == len(old) + 3


def test_bad_arguments_are_refused():
    for kwargs, message in [
        (dict(max_depth=0), "max_depth must be a whole number >= 1, got 0"),
        (dict(max_depth=2.5), "max_depth must be a whole number >= 1, got 2.5"),
        (dict(min_prob=-0.1), r"min_prob must lie in \[0, 1\], got -0.1"),
        (dict(min_prob=1.5), r"min_prob must lie in \[0, 1\], got 1.5"),
        (dict(min_prob=float("nan")), r"min_prob must lie in \[0, 1\], got nan"),
        (dict(max_tokens=-1), "max_tokens must be a whole number >= 0, got -1"),
        (dict(local_weight=0.0), "local_weight must be positive, got 0.0"),
    ]:
        with pytest.raises(SpecdecError, match=message):
            SuffixDrafter(**kwargs)


# ---- the shared index's bound ----------------------------------------------------------------------------------

def test_memory_bound_evicts_the_oldest_whole_sequences():
    d = SuffixDrafter(max_tokens=100)
    seqs = [distinct(40, s) for s in range(3)]
    for i, seq in enumerate(seqs):
        d.open(i, seq)
        d.close(i)
    assert d.shared.held == 80 and list(d.shared.seqs.values()) == seqs[1:]  # the first went, whole
    assert propose(d, seqs[0][:5], 4, slot=9) == []
    assert propose(d, seqs[1][:5], 4, slot=10) == seqs[1][5:9]
    assert propose(d, seqs[2][:5], 4, slot=11) == seqs[2][5:9]

    # many more sequences, repetitive ones included: tokens and nodes stay bounded
    rng = random.Random(3)
    for i in range(200):
        seq = [rng.randrange(4) for _ in range(rng.randrange(2, 60))] * rng.choice([1, 3])
        d.open(0, seq)
        d.close(0)
        assert d.shared.held <= 100
        assert d.shared.size() <= 2 * d.shared.held + 1, i  # about two nodes a token, whatever the text
    while d.shared.seqs:  # evicting everything leaves only the root: nothing leaks
        d.shared.evict_oldest()
    assert d.shared.held == 0 and d.shared.size() == 1

    long = distinct(150, 4)  # longer than the bound: its last max_tokens tokens are kept
    d.open(0, long)
    d.close(0)
    assert list(d.shared.seqs.values()) == [long[-100:]]
    none = SuffixDrafter(max_tokens=0)  # learns nothing across sequences
    serve(none, [1, 2, 3], [4, 5, 6])
    assert none.shared.held == 0 and propose(none, [9, 1, 2], 3) == []


def dump(index) -> list:
    """Every node as (suffix read backwards, occurrences, counts of the next tokens), sorted: what the index
    knows, whatever its history."""
    out, stack = [], [(index.root, ())]
    while stack:
        node, path = stack.pop()
        if node.kids is None:  # a leaf: its edge and its one next token come from its occurrence
            path += index.back(index.seqs[node.seq], node.pos)[len(path):]
            out.append((path, 1, [(index.seqs[node.seq][node.pos], 1)]))
            continue
        out.append((path, node.total, sorted(node.counts.items())))
        stack += [(kid, path + (kid.label if kid.kids is not None else ())) for kid in node.kids.values()]
    return sorted(out)


@pytest.mark.parametrize("vocab, max_depth", [(2, 3), (3, 5), (50, 4)])
def test_eviction_leaves_the_index_a_fresh_one_would_build(vocab, max_depth):
    rng = random.Random(vocab)
    index = _SharedIndex(max_depth, 300)
    for _ in range(60):
        index.add_sequence([rng.randrange(vocab) for _ in range(rng.randrange(2, 50))])
        fresh = _SharedIndex(max_depth, 300)
        for seq in index.seqs.values():
            fresh.add_sequence(list(seq))
        assert dump(index) == dump(fresh)
        assert index.size() == fresh.size()


# ---- against a slow reference ------------------------------------------------------------------------------

def reference_draft(own: list[int], shared: list[list[int]], k: int, max_depth: int, min_prob: float,
                    local_weight: float) -> list[int]:
    """The greedy walk over plain lists: scan every sequence for the longest suffix of the context."""

    def longest(seqs, tail):
        """(depth, counts, last occurrence of each next token) of the longest suffix the sequences hold."""
        for d in range(min(max_depth, len(tail)), 0, -1):
            counts, last = {}, {}
            for s, toks in enumerate(seqs):
                for j in range(d, len(toks)):
                    if toks[j - d:j] == tail[-d:]:
                        counts[toks[j]] = counts.get(toks[j], 0) + 1
                        last[toks[j]] = (s, j)
            if counts:
                return d, counts, last
        return 0, {}, {}

    tail, out, p = list(own), [], 1.0
    while len(out) < k:
        found = [(*longest([own], tail), local_weight), (*longest(shared, tail), 1.0)]
        depth = max(f[0] for f in found)
        if depth == 0:
            break
        parts = [(c, w) for d, c, _, w in found if d == depth]
        favourites = [max(c, key=lambda t: (c[t], last[t])) for d, c, last, _ in found if d == depth]
        weight = sum(w for _, w in parts)
        mixes = [sum(w * (c.get(t, 0) / sum(c.values())) for c, w in parts) / weight for t in favourites]
        tok, q = favourites[mixes.index(max(mixes))], max(mixes)  # ties: the sequence's own favourite
        p *= q
        if p < min_prob:
            break
        out.append(tok)
        tail.append(tok)
    return out


@pytest.mark.parametrize("vocab, max_depth, min_prob, local_weight", [(3, 4, 0.1, 2.0), (5, 6, 0.05, 1.0),
                                                                      (8, 3, 0.0, 0.5)])
def test_equals_a_slow_reference(vocab, max_depth, min_prob, local_weight):
    """Several requests, one after another and side by side, contexts grown a few tokens a round: every draft
    equals the reference's over the plain sequences."""
    rng = random.Random(vocab)
    d = SuffixDrafter(max_depth, min_prob, 10_000, local_weight)
    finished = []
    for _ in range(4):
        seqs = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 10))] for _ in range(2)]
        for slot, seq in enumerate(seqs):
            d.open(slot, seq)
        for _ in range(12):
            for slot, seq in enumerate(seqs):
                k = rng.randrange(0, 7)
                got = d.propose([slot], [seq], [k]).tokens[0].tolist()
                want = reference_draft(seq, finished, k, max_depth, min_prob, local_weight)
                assert got == want + [PAD] * (k - len(want)), (seq, finished)
                seq += [rng.randrange(vocab) for _ in range(rng.randrange(1, 4))]
        for slot, seq in enumerate(seqs):
            d.close(slot)
            finished.append(seq)


# ---- cost per round ----------------------------------------------------------------------------------------

class _Tail:
    """ctx[:n] without copying it, counting the tokens read."""

    def __init__(self, ctx, n, reads):
        self.ctx, self.n, self.reads = ctx, n, reads

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(self.n)
            self.reads[0] += len(range(start, stop, step))
            return self.ctx[start:stop:step]
        self.reads[0] += 1
        return self.ctx[i if i >= 0 else i + self.n]


def test_a_long_context_is_read_and_indexed_once(monkeypatch):
    """A 20k-token context grown one token a round: each token is read once and indexed once, and each round
    matches at most twice per drafted token (and once more where the walk stops), however long the context."""
    n_tokens, k = 20_000, 3
    rng = random.Random(1)
    ctx = [rng.randrange(50) for _ in range(n_tokens)]
    calls = {"add": 0, "match": 0}
    add, match = suffix._SuffixIndex.add, suffix._SuffixIndex.match

    def counted_add(self, sid, j):
        calls["add"] += 1
        add(self, sid, j)

    def counted_match(self, back):
        calls["match"] += 1
        assert len(back) <= self.max_depth
        return match(self, back)

    monkeypatch.setattr(suffix._SuffixIndex, "add", counted_add)
    monkeypatch.setattr(suffix._SuffixIndex, "match", counted_match)
    d = SuffixDrafter()
    d.open(0, ctx[:1])
    reads, drafted = [0], 0
    for n in range(1, n_tokens + 1):
        before = calls["match"]
        row = d.propose([0], [_Tail(ctx, n, reads)], [k]).tokens[0]
        got = int((row != PAD).sum())
        drafted += got
        assert calls["match"] - before <= 2 * (got + 1)
    assert reads[0] == n_tokens - 1  # the prompt came with open; every later token read once
    assert calls["add"] == n_tokens - 1  # occurrences j = 1 .. n-1, each once
    assert drafted > 0
