"""The speculation policy: `auto` picks each row's k by expected tokens per second from a pass-cost curve and
per-row acceptance. The serving rule of thumb (shorten k as load rises, stop speculating above some batch) must
come out of the optimisation, and a row whose drafts keep being accepted keeps drafting when others stop. Every
policy implements the whole protocol, and the round's choice asks the drafter for what each path needs."""

from __future__ import annotations

import pytest
import torch

from specdec.drafters.base import Draft, Drafter, pad_rows
from specdec.engine.generate import GenerationConfig
from specdec.engine.policy import Auto, FixedK, Never, PassCost, Policy, RowView
from specdec.engine.round import Choice, LookupChoice, TrimmedChoice
from specdec.engine.round import choose as choose_drafts
from specdec.engine.sequence import Sequence
from specdec.errors import SpecdecError
from specdec.theory.profile import Profile

# the bundled model on this 2-core CPU (plain decoding: 67 tok/s at batch 1, 208 at 4, 282 at 8, 284 at 16): a row
# costs ~0.1 of a one-row pass up to 4 rows, ~0.15 up to 8, ~0.23 beyond
CPU = PassCost(((1, 0.015), (2, 0.016), (4, 0.019), (8, 0.028), (16, 0.056), (64, 0.224)))


def rows(n: int, a: float, depth: int = 8, evidence: int = 1000, cap: int = 8) -> list[RowView]:
    """n rows whose drafts were judged `evidence` times per position and accepted at conditional rate a."""
    return [RowView([evidence] * depth, [round(a * evidence)] * depth, cap) for _ in range(n)]


def test_pass_cost_interpolates_and_extrapolates():
    c = PassCost(((1, 1.0), (3, 2.0), (5, 2.0)))
    assert c(1) == 1.0 and c(2) == 1.5 and c(4) == 2.0 and c(7) == 2.0
    d = PassCost(((1, 1.0), (2, 2.0)))
    assert d(4) == 4.0  # beyond the last point: the last slope
    d.observe(2, 4.0, weight=1.0)
    assert d(2) == 4.0 and d.scale == 2.0
    with pytest.raises(SpecdecError):
        PassCost(((2, 1.0),))


def test_from_profile():
    c = PassCost.from_profile(Profile.from_json({"step_s": 0.02, "verify_cost": {"1": 1.0, "4": 1.5}}))
    assert c(1) == pytest.approx(0.02) and c(4) == pytest.approx(0.03)
    with pytest.raises(SpecdecError, match="step_s"):
        PassCost.from_profile(Profile.from_json({"verify_cost": {"1": 1.0, "4": 1.5}}))


def test_fixed_and_never():
    assert FixedK(5).plan(rows(3, 0.5, cap=3)) == [3, 3, 3]
    assert Never().plan(rows(3, 0.9)) == [0, 0, 0]


def test_a_free_pass_drafts_deep_and_a_linear_one_not_at_all():
    flat = PassCost(((1, 0.01), (100, 0.01)))
    assert Auto(flat, max_k=6).plan(rows(4, 0.3)) == [6] * 4  # extra rows cost nothing: every draft pays
    linear = PassCost(((1, 0.01), (2, 0.02)))  # each row costs a full pass
    assert Auto(linear, max_k=6).plan(rows(4, 0.9)) == [0] * 4  # a draft never earns a whole pass


def test_k_shortens_as_the_batch_grows_and_speculation_stops():
    """Nothing about batch size is coded in the policy: the cost curve alone shortens k and then stops it."""
    auto = Auto(CPU, max_k=8)
    mean_k = {b: sum(auto.plan(rows(b, 0.7))) / b for b in (1, 2, 4, 8, 16)}
    print("mean k by batch at a = 0.7:", mean_k)
    ks = list(mean_k.values())
    assert ks[0] >= 3 and all(x >= y for x, y in zip(ks, ks[1:])) and ks[-1] == 0


def test_a_row_that_keeps_being_accepted_keeps_drafting_when_others_stop():
    auto = Auto(CPU, max_k=8)
    plan = auto.plan(rows(3, 0.3) + rows(1, 0.97))
    assert plan[:3] == [0] * 3 and plan[3] >= 3, plan


def expected_tokens(est: list[float], k: int) -> float:
    out, p = 1.0, 1.0
    for a in est[:k]:
        p *= a
        out += p
    return out


def test_a_row_floor_keeps_every_row_near_its_plain_speed():
    """With row_floor f, no row's expected speed in the step (its expected tokens over the step's cost) falls below
    f times its speed in a plain step of the same batch; with 0, the batch's throughput alone decides."""
    assert Auto(CPU, max_k=8).plan(rows(3, 0.3) + rows(1, 0.97))[3] >= 3  # the neighbours wait for its 4+ drafts
    # one more row costs 1.118 times a 4-row pass, two more 1.237: within 1 / 0.85 = 1.176 only the first
    assert Auto(CPU, max_k=8, row_floor=0.85).plan(rows(3, 0.3) + rows(1, 0.97)) == [0, 0, 0, 1]
    assert Auto(CPU, max_k=8, row_floor=0.97).plan(rows(3, 0.3) + rows(1, 0.97)) == [0, 0, 0, 0]
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        batch = int(torch.randint(1, 9, (1,), generator=g))
        accept = torch.rand(batch, generator=g).tolist()
        view = [r for a in accept for r in rows(1, a)]
        floor = [0.0, 0.5, 0.9, 0.97, 1.0][trial % 5]
        auto = Auto(CPU, max_k=8, row_floor=floor)
        plan = auto.plan(view)
        step, plain = CPU(batch + sum(plan)), CPU(batch)
        for k, r in zip(plan, view):
            assert expected_tokens(auto.estimates(r), k) / step >= floor / plain - 1e-12, (floor, accept, plan)
        if batch == 1:  # alone, a row's floor is its own speed, which every draft it is given already beats
            assert plan == Auto(CPU, max_k=8).plan(view)


def test_the_prior_is_optimistic_until_evidence_comes():
    """A new row is tried; evidence of rejections then switches it off."""
    auto = Auto(CPU, max_k=4)
    fresh = RowView([0] * 4, [0] * 4, 4)
    assert auto.plan([fresh] * 4)[0] > 0
    rejected = RowView([50, 0, 0, 0], [0, 0, 0, 0], 4)
    assert auto.plan([rejected] * 4) == [0] * 4


def test_without_exploration_a_fresh_row_waits_for_evidence():
    """For a free drafter (shadow-scored drafts) the plan uses the posterior mean: at batch 6 on this CPU a row at
    the prior's 0.5 does not pay (an exploring plan tries some), and only evidence of acceptance makes it draft."""
    fresh = RowView([0] * 4, [0] * 4, 4)
    assert any(Auto(CPU, max_k=4).plan([fresh] * 6))
    assert Auto(CPU, max_k=4, explore=False).plan([fresh] * 6) == [0] * 6
    copying = RowView([40] * 4, [39] * 4, 4)
    assert Auto(CPU, max_k=4, explore=False).plan([fresh] * 5 + [copying])[5] > 0


def test_learn_moves_the_prior():
    auto = Auto(CPU, max_k=2)
    assert auto.prior(0) == 0.5
    auto.learn([10, 2], [2, 1])
    assert auto.prior(0) == pytest.approx(3 / 12) and auto.prior(1) == pytest.approx(2 / 4)


def test_shadow_drafts_are_scored_against_what_the_target_emits():
    s = Sequence([1, 2, 3], GenerationConfig(50), max_k=4)
    s.emit([9], ["prefill"], set(), None)
    s.set_shadow([4, 5, 6])  # drafts continuing [1, 2, 3, 9], not verified
    s.emit([4], ["bonus"], set(), None)  # matches draft 0: wait for more
    assert s.judged == [0, 0, 0, 0]
    s.emit([5, 7], ["accepted", "recovered"], set(), None)  # draft 1 matches, draft 2 does not
    assert s.judged == [1, 1, 1, 0] and s.hits == [1, 1, 0, 0] and s.shadow is None
    s.set_shadow([8])
    s.emit([8], ["bonus"], set(), None)
    assert s.judged == [2, 1, 1, 0] and s.hits == [2, 1, 0, 0]


def test_verified_rounds_record_per_position_evidence():
    s = Sequence([1], GenerationConfig(50), max_k=3)
    s.record(3, 1)  # positions 0 and 1 judged, 0 accepted
    s.record(2, 2)  # both accepted (the bonus is not a draft)
    assert s.judged == [2, 2, 0] and s.hits == [2, 1, 0]


def test_drafts_verified_this_round_are_not_shadow_scored_again():
    """Four drafts offered, two verified (both accepted, then a bonus that differs from draft 3): positions 0-1
    are recorded once, by the verification; the shadow adds position 2 only."""
    s = Sequence([1, 2, 3], GenerationConfig(50), max_k=4)
    s.emit([9], ["prefill"], set(), None)
    s.set_shadow([4, 5, 6, 7], verified=2)
    s.emit([4, 5, 8], ["accepted", "accepted", "bonus"], set(), None)
    s.record(2, 2)
    assert s.judged == [1, 1, 1, 0] and s.hits == [1, 1, 0, 0]
    s.set_shadow([4, 5], verified=1)  # the verified draft is rejected: the shadow's context never happened
    s.emit([3], ["recovered"], set(), None)
    s.record(1, 0)
    assert s.judged == [2, 1, 1, 0] and s.hits == [1, 1, 0, 0]


def test_the_drafting_cost_decays_while_nothing_is_drafted():
    """One slow drafting round must not switch speculation off for good."""
    auto = Auto(PassCost(((1, 0.10), (8, 0.105), (48, 0.2))), max_k=5, draft_step_s=0.01)
    fresh = [RowView([0] * 5, [0] * 5, 5)] * 4
    assert auto.plan(fresh) == [3, 3, 3, 3] or all(k > 0 for k in auto.plan(fresh))
    auto.observe(8, 0.105, 3.0, 1)
    assert auto.plan(fresh) == [0, 0, 0, 0]
    for _ in range(1000):
        auto.observe(4, 0.10, 0.0, 0)
    assert all(k > 0 for k in auto.plan(fresh))


def test_the_calibrated_curve_smooths_upward_noise():
    from specdec.engine.policy import smooth

    noisy = [(1, 1.0), (2, 1.11), (3, 1.32), (4, 1.35), (6, 1.59), (9, 2.51), (13, 2.4)]
    expect = [(1, 1.0), (2, 1.11), (3, 1.23), (4, 1.35), (6, 1.59), (9, 1.59 + 0.81 * 3 / 7), (13, 2.4)]
    got = smooth(noisy)
    assert [n for n, _ in got] == [n for n, _ in expect]
    assert [t for _, t in got] == pytest.approx([t for _, t in expect])
    assert smooth([(1, 1.0), (2, 0.9)]) == ((1, 1.0), (2, 1.0))  # never cheaper with more rows


# a pass over 2 rows costs 1.15 one-row passes, 3 rows 1.32, 4 rows 1.58 (gguf-q16 on this CPU)
Q16 = PassCost(((1, 1.0), (2, 1.15), (3, 1.32), (4, 1.58)))
NAN = float("nan")


def test_a_confident_draft_is_kept_as_far_as_it_pays():
    """trim: the drafter's own confidence in each token decides how much of its draft is verified; the row's
    history (a = 0.9 here) does not, where a confidence is given."""
    auto = Auto(Q16, max_k=8)
    for conf, k in (([0.95, 0.9, 0.9], 3), ([0.9, 0.1, 0.9], 1), ([0.1, 0.9, 0.9], 0), ([0.5, 0.5, 0.05], 2)):
        assert auto.trim(rows(1, 0.9, cap=3), [conf]) == [k], conf
    assert auto.trim(rows(1, 0.9, cap=3), [[NAN, NAN, NAN]]) == [3]  # no confidence: the row's evidence rules
    assert auto.trim(rows(1, 0.05, cap=3), [[NAN, NAN, NAN]]) == [0]


def test_confidence_is_calibrated_by_what_verification_accepts():
    """A drafter that says 0.5 but is right only one time in ten is believed less and less."""
    auto = Auto(Q16, max_k=8)
    assert auto.trim(rows(1, 0.5, cap=1), [[0.5]]) == [1]
    for i in range(1000):  # one round in ten accepts its draft
        auto.learn_confidence([0.5], int(i % 10 == 0))
    assert auto.calibration == pytest.approx(0.2, abs=0.02)
    assert auto.trim(rows(1, 0.5, cap=1), [[0.5]]) == [0]


# ---- the whole protocol, and the round's per-row choice -----------------------------------------------------

def test_every_policy_implements_the_whole_protocol():
    names = [n for n in vars(Policy) if not n.startswith("_")] + list(Policy.__annotations__)
    assert {"max_k", "trims", "plan", "trim", "observe", "learn", "learn_confidence"} <= set(names)
    for policy in (FixedK(3), Never(), Auto(CPU, max_k=4)):
        for name in names:
            assert hasattr(policy, name), (policy, name)
    assert [p.trims for p in (FixedK(3), Never(), Auto(CPU, max_k=4))] == [False, False, True]


class Offers(Drafter):
    """Offers `k` copies of token 7 for every row (as many as asked), with confidence `conf` per token or none;
    records what it was asked for."""

    name, taps, learns, catch_up_s = "offers", (), False, 0.0

    def __init__(self, free: bool, conf: float | None = None):  # conf: exact in float32 (0.75)
        self.free, self.confident, self.conf, self.asked = free, conf is not None, conf, []

    def propose(self, slots, contexts, ks):
        self.asked.append(list(ks))
        width = max(ks, default=0)
        conf = None if self.conf is None else torch.full((len(ks), width), self.conf)
        return Draft(pad_rows([[7] * k for k in ks], width), confidence=conf)


def test_a_planned_drafter_is_asked_for_what_the_plan_wants():
    d = Offers(free=False)
    c = choose_drafts(FixedK(3), d, [0, 1], [[1], [1]], [RowView([0] * 3, [0] * 3, 2), RowView([0] * 3, [0] * 3, 0)],
                      greedy=True)
    assert d.asked == [[2, 0]] and c.drafts == [[7, 7], []] and c.steps == 2 and type(c) is Choice  # planned
    d = Offers(free=False)
    assert choose_drafts(Never(), d, [0], [[1]], [RowView([0], [0], 1)], True).drafts == [[]] and d.asked == []


def test_a_free_drafter_offers_all_the_room_and_the_rest_is_shadowed():
    d = Offers(free=True)
    auto = Auto(CPU, max_k=4, explore=False)
    poor, good = RowView([50] * 4, [1] * 4, 4), RowView([50] * 4, [49] * 4, 4)
    c = choose_drafts(auto, d, [0, 1], [[1], [1]], [poor, good], greedy=False)
    assert d.asked == [[4, 4]] and isinstance(c, LookupChoice) and c.offered == [[7] * 4, [7] * 4]
    assert c.drafts[0] == [] and len(c.drafts[1]) > 0 and c.steps == len(c.drafts[1])


def test_a_confident_drafter_is_trimmed_at_temperature_0_and_planned_when_sampling():
    rows = [RowView([0] * 4, [0] * 4, 4)] * 2
    d = Offers(free=False, conf=0.75)
    c = choose_drafts(Auto(Q16, max_k=4), d, [0, 1], [[1], [1]], rows, greedy=True)
    assert d.asked == [[4, 4]] and c.steps == 4 and isinstance(c, TrimmedChoice)
    assert c.confidence == [[0.75] * len(x) for x in c.drafts]
    assert any(c.drafts)
    d = Offers(free=False, conf=0.75)
    c = choose_drafts(Auto(Q16, max_k=4), d, [0, 1], [[1], [1]], rows, greedy=False)
    assert type(c) is Choice and d.asked in ([], [[len(x) for x in c.drafts]])  # sampled: planned first
