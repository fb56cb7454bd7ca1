"""Prompt lookup (n-gram drafter): what it proposes, that its index stays incremental, and the acceptance rates
per match length that its confidences come from."""

from __future__ import annotations

import pytest
import torch

from specdec.drafters.ngram import LONGEST, NgramDrafter, bucket
from specdec.drafters.suffix import SuffixDrafter
from specdec.errors import SpecdecError
from specdec.sampling.verify import PAD
from specdec.sampling.warp import SamplingConfig


def lookup(ctx, k=3, max_n=4, min_n=1):
    d = NgramDrafter(max_n, min_n)
    d.open(0, ctx, SamplingConfig())
    return d.lookup(0, ctx, k)


def test_proposes_what_followed_the_most_recent_match():
    #      0  1  2  3  4  5  6  7  8  9 10
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert lookup(ctx, k=3) == [7, 8, 1]  # (1, 2, 3) last occurred at 4..6, not at 0..2


def test_prefers_the_longest_n():
    # the suffix (5, 1): its 2-gram last occurred at 0..1 (followed by 8); the 1-gram (1) more recently at 4
    ctx = [5, 1, 8, 6, 1, 9, 5, 1]
    assert lookup(ctx, k=2) == [8, 6]
    assert lookup(ctx, k=2, max_n=1) == [9, 5]  # with 1-grams only, the most recent (1) wins


def test_min_n_ignores_short_matches():
    ctx = [4, 1, 7, 2, 1]  # only a 1-gram match
    assert lookup(ctx, k=2) == [7, 2]
    assert lookup(ctx, k=2, min_n=2) == []


def test_nothing_without_a_match():
    assert lookup([1, 2, 3, 4, 5]) == []
    assert lookup([7]) == []


def test_proposes_at_most_k_and_what_exists():
    ctx = list(range(12)) + [0, 1, 2]
    for k in (1, 2, 5, 8):
        assert lookup(ctx, k=k) == list(range(3, 3 + k))
    assert lookup([1, 2, 1], k=5) == [2, 1]  # the match is followed by only two tokens
    # a periodic context: the most recent match sits just before the suffix, so less than k is left after it
    assert lookup([1, 2, 3] * 10, k=8) == [1, 2, 3]


@pytest.mark.parametrize("make, last_row", [(NgramDrafter, [1, PAD, PAD, PAD]), (SuffixDrafter, [1, 1, 1, 1])],
                         ids=["ngram", "suffix"])
def test_propose_pads_rows_and_skips_rows_with_k_0(make, last_row):
    """Rows are slots (in any order); a row with k = 0 gets nothing, however good its match; the width is max(ks).
    For both lookup drafters (suffix decoding keeps following a run of 1s that prompt lookup copies once)."""
    d = make()
    assert d.reserve(4, 100) == 100
    assert d.free  # a lookup: proposing costs next to nothing and draws no random numbers
    ctxs = [[1, 2, 3, 1, 2], [4, 5, 6], [1, 1, 1, 1]]
    slots = [5, 2, 7]
    for s, c in zip(slots, ctxs):
        d.open(s, c, SamplingConfig())
    draft = d.propose(slots, ctxs, [3, 3, 0])
    assert draft.probs is None  # deterministic: q is one-hot on the drafted tokens
    assert draft.tokens.dtype == torch.long
    assert draft.tokens.tolist() == [[3, 1, 2], [PAD, PAD, PAD], [PAD, PAD, PAD]]
    # ks per row: each row drafts at most its own k, padded to the widest
    assert d.propose(slots, ctxs, [2, 3, 4]).tokens.tolist() == [[3, 1, PAD, PAD], [PAD] * 4, last_row]
    assert d.propose(slots, ctxs, [0, 0, 0]).tokens.shape == (3, 0)


def test_a_reopened_slot_starts_a_fresh_index():
    """A slot's index belongs to the sequence in it: after close and open, a new sequence sees none of the old
    one's n-grams (and its own are indexed from its start, though the old index had gone further)."""
    d = NgramDrafter(2, 1)
    old = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1]
    d.open(0, old, SamplingConfig())
    assert d.propose([0], [old], [3]).tokens.tolist() == [[2, 3, 4]]
    d.close(0)
    assert 0 not in d.rows  # closing frees the index
    new = [9, 8, 1, 7, 1]
    d.open(0, new, SamplingConfig())
    assert d.propose([0], [new], [3]).tokens.tolist() == [[7, 1, PAD]]  # the old index would say 8, 1, 7


def test_bad_sizes_are_refused():
    for lo, hi in ((0, 3), (3, 2)):
        with pytest.raises(SpecdecError, match=rf"n-gram sizes need 1 <= min_n <= max_n, got {lo}\.\.{hi}"):
            NgramDrafter(hi, lo)


def test_incremental_as_the_context_grows():
    """Growing a context token by token (as rounds accept tokens), each new position is indexed once, and the
    proposals equal a fresh drafter's over the whole context."""
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, 6, (300,), generator=g).tolist()
    grown = NgramDrafter(3, 1)
    grown.open(0, ctx[:1], SamplingConfig())
    for n in range(1, len(ctx) + 1):
        got = grown.lookup(0, ctx[:n], 4)
        if n % 37 == 0:
            fresh = NgramDrafter(3, 1)
            fresh.open(0, ctx[:n], SamplingConfig())
            assert got == fresh.lookup(0, ctx[:n], 4), n


class CountingDict(dict):
    def __init__(self):
        super().__init__()
        self.writes = 0

    def __setitem__(self, key, value):
        self.writes += 1
        super().__setitem__(key, value)


def test_indexing_is_linear_in_the_context():
    """A 20k-token context grown one token at a time: every position is indexed exactly once (one write per
    n-gram size), and each round reads a bounded number of the context's tokens, so the second half reads about
    as many as the first. Counted, not timed: the fast suite asserts no measured time (docs/testing.md)."""
    n_tokens, max_n = 20_000, 4
    g = torch.Generator().manual_seed(1)
    ctx = torch.randint(0, 50, (n_tokens,), generator=g).tolist()
    d = NgramDrafter(max_n, 1)
    d.open(0, ctx[:1], SamplingConfig())
    counter = d.rows[0].last_end = CountingDict()
    reads, most, half = [0], 0, []
    for n in range(1, n_tokens + 1):
        before = reads[0]
        d.propose([0], [_Tail(ctx, n, reads)], [3])
        most = max(most, reads[0] - before)
        if n == n_tokens // 2:
            half.append(reads[0])
    half.append(reads[0] - half[0])
    # positions 1 .. n-1 are indexed (the suffix itself is not), each with min(max_n, end) n-grams
    expected = sum(min(max_n, end) for end in range(1, n_tokens))
    assert counter.writes == expected
    assert d.rows[0].indexed_to == n_tokens - 1
    # a round reads the new position's n-grams, the suffix, a match walk of up to LONGEST tokens each side and
    # the k drafted tokens (28 at most here): a copy or scan of the context would read thousands
    assert most <= 4 * LONGEST, f"one round read {most} tokens of the context"
    assert half[1] < 1.25 * half[0], f"first 10k tokens read {half[0]} tokens, second 10k {half[1]}"


class _Tail:
    """ctx[:n] without copying it, counting the tokens read: the drafter only reads len(), slices and items near
    the end."""

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
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.ctx[i]


def test_match_length_is_measured_past_max_n():
    """The match's length counts every token before the n-gram that also agrees, up to LONGEST."""
    d = NgramDrafter(4, 1)
    #      the span 3..9 (7 tokens) recurs at the end; what came before it differs (0 against 8)
    ctx = [0, 3, 4, 5, 6, 7, 8, 9, 1, 2, 8, 3, 4, 5, 6, 7, 8, 9]
    d.open(0, ctx, SamplingConfig())
    assert d.match(0, ctx, 2) == ([1, 2], 7)
    d.open(2, [5, 1, 7, 1], SamplingConfig())
    assert d.match(2, [5, 1, 7, 1], 2) == ([7, 1], 1)
    long = list(range(40)) + [99] + list(range(40))
    d.open(1, long, SamplingConfig())
    assert d.match(1, long, 1) == ([99], LONGEST)
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 6, 9, 10, 15, 16, 32)] == [0, 1, 2, 3, 3, 4, 4, 5, 5, 6, 6]


def test_every_offer_is_scored_against_what_followed(monkeypatch):
    """The table's counts equal a brute-force scoring of every draft offered (each position up to its first
    wrong token, whether or not it was verified), per match-length bucket and position, and its confidences are
    the rates of the draft's bucket. The context grows by 1 to 3 tokens a round, as rounds accept them."""
    import specdec.drafters.ngram as ngram

    monkeypatch.setattr(ngram, "DECAY", 1.0)  # plain counts
    g = torch.Generator().manual_seed(3)
    text = (torch.randint(0, 5, (60,), generator=g).tolist() + list(range(10, 30))) * 3
    d = NgramDrafter(4, 1)
    d.open(0, text[:1], SamplingConfig())
    judged = [[0] * ngram.DEPTH for _ in ngram.BUCKETS]
    right = [[0] * ngram.DEPTH for _ in ngram.BUCKETS]
    n, step = 1, 0
    while n < len(text) - 6:
        draft = d.propose([0], [text[:n]], [4])
        toks = [t for t in draft.tokens[0].tolist() if t != PAD]
        if toks:
            b = bucket(d.match(0, text[:n], 4)[1])
            assert draft.confidence[0, :len(toks)].tolist() == pytest.approx([d.table.rate(b, j) for j in
                                                                              range(len(toks))])
            for j, t in enumerate(toks):  # brute force: against the text that follows
                judged[b][j] += 1
                right[b][j] += t == text[n + j]
                if t != text[n + j]:
                    break
        n += 1 + step % 3
        step += 1
    d.propose([0], [text], [0])  # scores the last offers (the text holds their every position)
    assert d.table.judged == judged and d.table.right == right
    assert sum(map(sum, judged)) > 100


def test_confidence_separates_short_matches_from_long_ones():
    """A text of random tokens with a long passage repeated: one-token matches copy noise and are rarely right,
    matches of 16 tokens or more copy the passage and are right; the learned rates say so."""
    g = torch.Generator().manual_seed(4)
    passage = list(range(100, 160))
    text = []
    for _ in range(4):
        text += torch.randint(0, 8, (80,), generator=g).tolist() + passage
    d = NgramDrafter(4, 1)
    d.open(0, text[:1], SamplingConfig())
    for n in range(1, len(text) + 1):
        d.propose([0], [text[:n]], [3])
    assert d.table.rate(0, 0) < 0.3
    assert d.table.rate(bucket(LONGEST), 0) > 0.9


def test_a_cascade_passes_on_the_lookups_confidences():
    """In a cascade, a row prompt lookup drafted carries its confidences; a row another member drafted without
    any carries NaN (the planner then goes by the row's record)."""
    from specdec.drafters.cascade import CascadeDrafter

    d = CascadeDrafter([NgramDrafter(), SuffixDrafter()])
    ctxs = [[1, 2, 3, 4, 1, 2], [7, 7, 7, 7]]  # lookup: 3, 4, 1 / only one 7 after the latest (7, 7, 7)
    for s, c in enumerate(ctxs):
        d.open(s, c, SamplingConfig())
    draft = d.propose([0, 1], ctxs, [3, 3])
    assert draft.tokens[0].tolist() == [3, 4, 1] and draft.confidence is not None
    assert draft.confidence[0].tolist() == pytest.approx([0.5, 0.5, 0.5])  # Laplace, before any evidence
    assert draft.tokens[1].tolist() == [7, 7, 7] and torch.isnan(draft.confidence[1]).all()
