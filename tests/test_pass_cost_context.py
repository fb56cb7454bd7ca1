"""`--k auto` at long context (issue 59): the pass costs are measured after several cached-token counts, and a
row's pass is priced at its own sequence's length. Attention makes a wide verify pass dearer against a one-row pass
as the context grows (the curve's shape changes, not only its level), so the plan shortens k there; without a
context, or without per-context curves, every plan is what it was."""

from __future__ import annotations

import pytest

from specdec.engine.policy import Auto, LearnedPassCost, PassCost, RowView, mean_context
from specdec.engine.round import Round
from specdec.errors import SpecdecError
from specdec.theory.profile import Profile

# seconds of a pass over 1 and 6 rows (linear between, and beyond along the same line): at 512 cached tokens a
# 6-row pass costs 1.3 one-row passes, at 2048 2.5 (attention over four times the keys, for six queries)
AT_512 = ((1, 0.010), (6, 0.013))
AT_2048 = ((1, 0.014), (6, 0.035))
BY_CONTEXT = PassCost(AT_512, contexts=((512, AT_512), (2048, AT_2048)))


def rows(n: int, a: float, context: int = 0, cap: int = 8, evidence: int = 1000) -> list[RowView]:
    return [RowView([evidence] * cap, [round(a * evidence)] * cap, cap, context) for _ in range(n)]


def test_a_pass_cost_interpolates_between_contexts_and_extrapolates_beyond():
    c = BY_CONTEXT
    assert c(6, 512) == pytest.approx(0.013) and c(6, 2048) == pytest.approx(0.035)
    assert c(1, 1280) == pytest.approx(0.012) and c(6, 1280) == pytest.approx(0.024)  # halfway: halfway
    assert c(6, 3584) == pytest.approx(0.057) and c(1, 3584) == pytest.approx(0.018)  # along the line through both
    assert c(3, 1280) == pytest.approx((c(3, 512) + c(3, 2048)) / 2)  # each curve read at n by its own rule first
    assert c(6, 100) == c(6, 512)  # below the first measured context: the first's
    assert c(6) == c(6, None) == pytest.approx(0.013)  # no context: the typical curve's
    # a longer context never costs less than the last measured one, even where timing noise slopes the line down
    noisy = PassCost(AT_512, contexts=((128, ((1, 0.011), (6, 0.016))), (512, AT_512)))
    assert noisy(6, 4096) == noisy(6, 512)


def test_without_curves_by_context_a_context_changes_nothing():
    for c in (PassCost(AT_512), PassCost(AT_512, contexts=((2048, AT_2048),))):  # none, or only one
        assert [c(n, 3000) for n in range(1, 12)] == [c(n) for n in range(1, 12)]
    learned = LearnedPassCost(min_seen=1)
    learned.observe(4, 0.02, context=3000)
    assert learned(4, 3000) == learned(4) == 0.02  # vLLM's steps: accepted and ignored
    with pytest.raises(SpecdecError, match="sorted"):
        PassCost(AT_512, contexts=((2048, AT_2048), (512, AT_512)))
    with pytest.raises(SpecdecError, match="starting at 1 row"):
        PassCost(AT_512, contexts=((512, AT_512), (2048, ((2, 0.01),))))


def test_the_scale_is_learned_against_the_cost_at_the_pass_context():
    c = PassCost(AT_512, contexts=((512, AT_512), (2048, AT_2048)))
    c.observe(6, 0.070, context=2048, weight=1.0)  # twice what the 2048 curve says
    assert c.scale == pytest.approx(2.0) and c(6, 2048) == pytest.approx(0.070) and c(6) == pytest.approx(0.026)
    d = PassCost(AT_512, contexts=((512, AT_512), (2048, AT_2048)))
    d.observe(6, 0.035, weight=1.0)  # no context: against the typical curve, as before
    assert d.scale == pytest.approx(0.035 / 0.013)


def test_auto_drafts_less_where_a_long_context_makes_a_wide_pass_dear():
    auto = Auto(BY_CONTEXT, max_k=8)
    short, long = auto.plan(rows(1, 0.8, 512)), auto.plan(rows(1, 0.8, 2048))
    assert short[0] >= 6 and 1 <= long[0] <= 4 and long[0] < short[0], (short, long)
    assert auto.plan(rows(2, 0.8, 2048)) == auto.plan(rows(1, 0.8, 512) + rows(1, 0.8, 3584))  # the rows' mean
    # without a context, or without curves by context, the plan is today's: the typical curve's
    today = Auto(PassCost(AT_512), max_k=8)
    assert auto.plan(rows(1, 0.8)) == today.plan(rows(1, 0.8, 2048)) == today.plan(rows(1, 0.8)) == short
    assert auto.trim(rows(1, 0.8, 2048), [[0.8] * 8]) == long  # a trim prices at the context too


def test_the_mean_context_skips_rows_whose_context_is_unknown():
    assert mean_context([0, 0]) is None and mean_context([]) is None
    assert mean_context([100, 0, 300]) == 200


def test_a_profile_with_contexts_gives_a_pass_cost_with_them():
    prof = Profile.from_json({
        "step_s": 0.010, "verify_cost": {"1": 1.0, "6": 1.3}, "typical_context": 512,
        "contexts": [{"context": 128, "verify_cost": {"1": 1.0, "6": 1.2}, "step_s": 0.009},
                     {"context": 512, "verify_cost": {"1": 1.0, "6": 1.3}, "step_s": 0.010},
                     {"context": 2048, "verify_cost": {"1": 1.0, "6": 2.5}, "step_s": 0.014},
                     {"context": 4096, "verify_cost": {"1": 1.0, "6": 3.0}}]})  # no step time: not in seconds
    c = PassCost.from_profile(prof)
    assert [ctx for ctx, _ in c.contexts] == [128, 512, 2048]
    at_2048 = c.contexts[2][1]
    assert [n for n, _ in at_2048] == [1, 6] and [t for _, t in at_2048] == pytest.approx([0.014, 0.035])
    assert c(6, 2048) == pytest.approx(0.035) and c(6) == pytest.approx(0.013)
    plain = PassCost.from_profile(Profile.from_json({"step_s": 0.01, "verify_cost": {"1": 1.0, "6": 1.3}}))
    assert plain.contexts == ()


class Recording(Auto):
    """Auto, noting the contexts each round plans and observes at."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.planned: list[list[int]] = []
        self.observed: list[float | None] = []

    def plan(self, rows):
        self.planned.append([r.context for r in rows])
        return super().plan(rows)

    def trim(self, rows, confidence):
        self.planned.append([r.context for r in rows])
        return super().trim(rows, confidence)

    def observe(self, rows, seconds, draft_seconds, max_k, context=None):
        self.observed.append(context)
        super().observe(rows, seconds, draft_seconds, max_k, context)


def test_the_step_loop_plans_each_row_at_its_sequence_length(tiny_model):
    from specdec.drafters.ngram import NgramDrafter
    from specdec.engine.scheduler import Scheduler, SchedulerConfig
    from specdec.engine.sequence import GenerationConfig

    policy = Recording(BY_CONTEXT, max_k=4)
    sched = Scheduler(tiny_model("fp16", vocab=64), None, NgramDrafter(), policy,
                      SchedulerConfig(max_batch=2, max_queue=None, prefill_chunk=None))
    seqs = [sched.new_sequence([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], GenerationConfig(12)),
            sched.new_sequence([20, 21, 22, 20, 21], GenerationConfig(12))]
    for s in seqs:
        sched.admit(s)
    lengths = []
    sched.on_round = lambda r: lengths.append([s.length for s in r.rows])  # after the round's commit
    while not sched.idle:
        sched.step()
    assert policy.planned[0] == [11, 5]  # the prompts, in the cache
    assert all(b >= a for p, q in zip(policy.planned, policy.planned[1:]) for a, b in zip(p, q))
    assert policy.observed == [mean_context(p) for p in policy.planned]
    assert policy.planned[1] == lengths[0]  # the next round starts where this one committed to


def test_a_round_without_contexts_plans_as_before():
    from tests.test_engine_policy import Offers

    policy = Recording(BY_CONTEXT, max_k=4, explore=False)

    class Row:
        tokens, prompt_len, judged, hits = [1, 2], 1, [0] * 4, [0] * 4

    rnd = Round(policy, Offers(free=False), [Row(), Row()], [0, 1])
    rnd.choose([4, 4], greedy=False)
    assert policy.planned == [[0, 0]]


def test_the_vllm_proposer_plans_each_row_at_its_sequence_length():
    from tests.test_vllm_proposer import make, prompt

    p, b = make()
    policy = p.policy
    seen: list[list[int]] = []
    plan, trim = policy.plan, policy.trim
    policy.plan = lambda rows: seen.append([r.context for r in rows]) or plan(rows)
    policy.trim = lambda rows, conf: seen.append([r.context for r in rows]) or trim(rows, conf)
    b.add(prompt(0, 9), budget=40, rid=0)
    b.add(prompt(1, 23), budget=60, rid=1)
    for _ in range(6):
        b.step()
    decoding = sorted(len(r["seq"]) for r in b.rows if r["gained"])
    assert seen and sorted(seen[-1]) == decoding
