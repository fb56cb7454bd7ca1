"""Acceptance floors: a slowdown is a failing test, not a silent regression.

Speculation that drafts worse, drops the bonus token or looks up the wrong n-gram keeps the output exact, so only
acceptance and tokens per round can show it. Here they are known in advance: a target that copies (its greedy
next token after t is a fixed function of t, so its text cycles), prompts with a long repeated span, and the
n-gram drafter, whose rounds must accept and yield exactly the counts worked out by hand below. The draft model
drafting for itself is in test_drafters_draft_model; the bundled model's floors are in test_engine_greedy.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specdec.drafters.base import Draft
from specdec.drafters.ngram import LONGEST, NgramDrafter, bucket
from specdec.engine.generate import Engine, GenerationConfig
from specdec.engine.policy import Auto, PassCost

PERIOD = 12  # the target's text cycles 0, 1, ..., 11, 0, 1, ...
OUTSIDE = 12  # a token the cycle never produces
VOCAB = 16


class NoCache:
    """The stateless target's cache: holds nothing, and so does each of its rows."""

    def row(self, r: int) -> NoCache:
        return self


class CyclingTarget:
    """A stand-in target model: logits 10 on (t + 1) mod PERIOD after token t (OUTSIDE is followed by 7), 0
    elsewhere. Stateless, so its cache is nothing."""

    def __init__(self):
        self.cfg = SimpleNamespace(max_position_embeddings=512, vocab_size=VOCAB)
        self.next = torch.tensor([(t + 1) % PERIOD for t in range(PERIOD)] + [7] * (VOCAB - PERIOD))
        # per pass: ("prefill", prompt tokens) for a prefill chunk, ("decode", token-rows per slot) for a round
        self.passes: list[tuple[str, object]] = []

    def new_cache(self, batch: int, capacity: int, huge_pages: bool = True) -> NoCache:
        return NoCache()

    def _logits(self, tokens):
        logits = torch.zeros(*tokens.shape, VOCAB)  # [..., vocab]
        logits.scatter_(-1, self.next[tokens].unsqueeze(-1), 10.0)
        return logits

    def forward(self, tokens, start, cache, last_only=None, prefill=False):
        """The engine calls this for prefill chunks, one prompt at a time: tokens [1, n]."""
        assert prefill and tokens.shape[0] == 1, tokens.shape
        self.passes.append(("prefill", tokens.shape[1]))
        logits = self._logits(tokens)  # [B, n, vocab]
        if last_only is not None:
            return logits[torch.arange(tokens.shape[0]), last_only]  # [B, vocab]
        return logits

    def forward_ragged(self, tokens, slots, pos, cache, select=None):
        """A decode round: token-row r (tokens, slots, pos [R]) belongs to slot slots[r]."""
        _, counts = torch.unique_consecutive(slots, return_counts=True)
        self.passes.append(("decode", tuple(counts.tolist())))
        logits = self._logits(tokens)  # [R, vocab]
        return logits if select is None else logits[select]


def cycle(start: int, n: int) -> list[int]:
    return [(start + i) % PERIOD for i in range(n)]


def rounds_of(res) -> list[tuple[int, int, int]]:
    """(drafted, accepted, emitted) per round."""
    return [(len(r.drafted), r.accepted, r.emitted) for r in res.stats.rounds]


@pytest.mark.parametrize("k", [1, 3, 5, 11, 12, 16])
def test_a_clean_copy_accepts_every_draft_and_adds_the_bonus(k):
    """Prompt: the cycle twice, then 0, 1, 2. The context's last four tokens last occurred one period earlier,
    followed by a whole period: every round drafts min(k, 12) tokens, all right, and yields them plus the
    bonus token."""
    prompt = cycle(0, 2 * PERIOD + 3)
    drafted = min(k, PERIOD)
    budget = 1 + 5 * (drafted + 1)  # the prefill's token, then five whole rounds
    res = Engine(CyclingTarget(), None).generate([prompt], GenerationConfig(budget), NgramDrafter(4, 1), k)[0]
    assert res.token_ids == cycle(3, budget)
    assert rounds_of(res) == [(drafted, drafted, drafted + 1)] * 5
    assert all(r.kind == "bonus" for r in res.stats.rounds)
    assert res.stats.alpha == 1.0 and res.stats.mean_tokens_per_round == drafted + 1
    assert res.origins == ["prefill"] + (["accepted"] * drafted + ["bonus"]) * 5


def test_a_corrupted_copy_is_accepted_at_the_rate_worked_out_by_hand():
    """Prompt: the cycle with 6 replaced by OUTSIDE, then 0, 1, 2; k = 5. The target continues 3, 4, 5, 6, ...
    - prefill: 3. Round 1: (0, 1, 2, 3) last occurred at the start: drafts 4, 5, OUTSIDE, 7, 8; 4 and 5 are
      accepted, 6 is recovered: (5 drafted, 2 accepted, 3 tokens).
    - round 2: the context ends 5, 6 and the prompt has no 6: nothing to draft, the target adds 7: (0, 0, 1).
    - round 3: (7) last occurred in the prompt, followed by 8, 9, 10, 11, 0: all right, plus 1: (5, 5, 6).
    - from then on the context holds a clean period: (5, 5, 6) every round.
    So 41 tokens take 8 target passes, and a = 32 / 35."""
    prompt = [0, 1, 2, 3, 4, 5, OUTSIDE, 7, 8, 9, 10, 11, 0, 1, 2]
    target = CyclingTarget()
    res = Engine(target, None).generate([prompt], GenerationConfig(41), NgramDrafter(4, 1), 5)[0]
    assert res.token_ids == cycle(3, 41)
    assert rounds_of(res) == [(5, 2, 3), (0, 0, 1)] + [(5, 5, 6)] * 6
    assert [r.kind for r in res.stats.rounds[:3]] == ["recovered", "bonus", "bonus"]
    assert res.stats.drafted == 35 and res.stats.accepted == 32
    assert res.stats.mean_tokens_per_round == 40 / 8
    # one prefill, then one pass per round over the last token and what was drafted
    assert target.passes == [("prefill", len(prompt)), ("decode", (6,)), ("decode", (1,))] + [("decode", (6,))] * 6


def test_a_batch_of_copies_keeps_each_rows_counts():
    """The clean and the corrupted copy in one batch, with a third row that never matches: each row's rounds are
    what it gets alone (n-gram indices are per slot, and one ragged pass takes every row's own drafts: a row with
    none adds one token-row, and neither pads nor truncates the others)."""
    clean = cycle(0, 2 * PERIOD + 3)
    corrupted = [0, 1, 2, 3, 4, 5, OUTSIDE, 7, 8, 9, 10, 11, 0, 1, 2]
    target = CyclingTarget()
    results = Engine(target, None).generate([clean, corrupted, [OUTSIDE]], GenerationConfig(41),
                                            NgramDrafter(4, 1), 5)
    # the clean copy: six whole rounds take it to 37 tokens; the budget of 41 then leaves room for 4, so the
    # seventh round drafts 3, not 5 (the engine never drafts past the budget; it used to draft 5 and drop 2)
    assert rounds_of(results[0]) == [(5, 5, 6)] * 6 + [(3, 3, 4)]
    assert rounds_of(results[1]) == [(5, 2, 3), (0, 0, 1)] + [(5, 5, 6)] * 6
    # the three prompts prefilled, then the first round: 5 drafts + 1 for each copy, the last token alone for the
    # third row
    assert target.passes[:4] == [("prefill", len(clean)), ("prefill", len(corrupted)), ("prefill", 1),
                                 ("decode", (6, 6, 1))]
    # OUTSIDE, then 7 (prefill), 8, ..., 6, 7: no token repeats until the 12th round adds 7 again; from the 13th
    # round on, every draft is right
    lone = rounds_of(results[2])
    assert lone[:PERIOD] == [(0, 0, 1)] * PERIOD and lone[PERIOD] == (5, 5, 6)
    assert all(a == d for d, a, _ in lone)


def _rated(short: float, long: float) -> NgramDrafter:
    """A drafter whose table has seen 200 first tokens after one-token matches right at rate `short`, and 200
    draft tokens at every position after the longest matches right at rate `long`."""
    d = NgramDrafter(4, 1)
    for i in range(200):
        d.table.add(0, 0, i < 200 * short)
        for j in range(8):
            d.table.add(bucket(LONGEST), j, i < 200 * long)
    return d


class Unrated(NgramDrafter):
    """The same lookup with its confidences dropped: the planner falls back on the row's own record."""

    def propose(self, slots, contexts, ks):
        return Draft(super().propose(slots, contexts, ks).tokens)


def test_auto_verifies_the_drafts_its_lookup_rates_say_pay():
    """With each extra token-row costing 0.3 passes, a draft token pays where it is right more than about 30% of
    the time. After a one-token match (the prefill's 6 was once followed by 9 in the prompt; the target follows it
    with 7) the lookup's rate of 5% keeps the first round from verifying anything; after a long one (a clean
    cycle) its rate of 99% has every round verify the whole draft. Without the rates, the row's prior (a = 0.5)
    verifies the wrong draft: the test sees the difference."""
    cost = PassCost(((1, 1.0), (2, 1.3), (9, 3.4)))
    short = Engine(CyclingTarget(), None).generate([[6, 9, 5]], GenerationConfig(3), _rated(0.05, 0.99),
                                                   Auto(cost, max_k=8, explore=False))[0]
    assert rounds_of(short)[0] == (0, 0, 1)
    unrated = Engine(CyclingTarget(), None).generate([[6, 9, 5]], GenerationConfig(3), Unrated(4, 1),
                                                     Auto(cost, max_k=8, explore=False))[0]
    assert rounds_of(unrated)[0][0] > 0
    prompt = cycle(0, 3 * PERIOD + 3)
    clean = Engine(CyclingTarget(), None).generate([prompt], GenerationConfig(1 + 3 * 9), _rated(0.05, 0.99),
                                                   Auto(cost, max_k=8, explore=False))[0]
    assert rounds_of(clean) == [(8, 8, 9)] * 3
    assert short.token_ids == [6, 7, 8] and clean.token_ids == cycle(3, 28)
