"""The benchmark's statistics and predictions against hand-computed cases."""

from __future__ import annotations

import math

import pytest

from specdec.bench import stats
from specdec.bench.runner import Sample, Turn
from specdec.engine.stats import RoundRecord
from specdec.theory.economics import (
    CostCurve,
    batch_capacity,
    conditional_acceptance,
    end_to_end_speedup,
    expected_tokens_positional,
    first_exceeding,
    fit_knee,
    predict_from_positional,
    predict_from_rounds,
)
from specdec.theory.profile import Profile


def test_percentiles_and_means():
    assert stats.percentile([4, 1, 3, 2], 50) == 2.5
    assert math.isclose(stats.percentile([1, 2, 3, 4], 99), 3.97)  # 3 + 0.97 * (4 - 3)
    assert stats.percentile([7], 99) == 7 and stats.percentile([], 50) is None
    assert stats.mean([1, 2, 6]) == 3 and stats.mean([]) is None


def test_speedup_is_a_ratio_of_means_not_a_mean_of_ratios():
    assert stats.ratio_of_means([20, 30], [10, 30]) == 1.25  # the mean of ratios would be 1.5
    assert stats.ratio_of_means([1], []) is None


def test_bursts_and_inter_token_latencies():
    times = [0.1, 0.2, 0.2, 0.2, 0.3, 0.4, 0.4]
    assert stats.bursts(times) == [1, 3, 1, 2]
    assert stats.burst_share([times]) == 5 / 7
    assert stats.burst_share([times, [1.0, 2.0, 3.0]]) == 5 / 10
    assert [round(g, 6) for g in stats.inter_token_latencies(times)] == [0.1, 0, 0, 0.1, 0.1, 0]
    assert stats.burst_share([]) is None


# rounds as (drafted, accepted): position 0 reached by 4 rounds, kept by 3; position 1 reached by the 2 rounds
# that drafted >= 2 and kept position 0, kept by 1; position 2 reached by 1 round, kept by it.
ROUNDS = [(3, 3), (3, 1), (2, 0), (1, 1), (0, 0)]


def test_conditional_acceptance_by_hand():
    d, a = zip(*ROUNDS)
    assert conditional_acceptance(d, a) == [0.75, 0.5, 1.0]
    assert conditional_acceptance([2], [0]) == [0.0, None]  # position 1 never reached
    assert conditional_acceptance([], []) == []


def test_expected_tokens_positional_by_hand():
    a = [0.75, 0.5, 1.0]
    assert expected_tokens_positional(a, 0) == 1.0
    assert expected_tokens_positional(a, 1) == 1.75
    assert expected_tokens_positional(a, 3) == 1 + 0.75 + 0.375 + 0.375
    assert expected_tokens_positional([0.5, None], 2) == 1.5  # an unreached position counts as 0
    assert expected_tokens_positional([], 4) == 1.0


def test_predict_from_positional_by_hand():
    verify = CostCurve.from_mapping({1: 1.0, 4: 1.3})  # interpolated: 4 rows cost 1.3
    # rounds drafting 3 and 0: tokens 2.5 + 1; cost (1.3 + 3 * 0.1) + 1
    assert math.isclose(predict_from_positional([0.75, 0.5, 1.0], [3, 0], 0.1, verify), 3.5 / 2.6)
    assert predict_from_positional([0.5], [], 0.1) == 1.0


def test_positional_equals_iid_when_positions_are_iid():
    for a in (0.2, 0.6, 0.9):
        assert math.isclose(predict_from_positional([a] * 5, [5, 3, 0, 5], 0.05),
                            predict_from_rounds(a, [5, 3, 0, 5], 0.05))


def test_bursty_acceptance_iid_under_predicts_positional_matches():
    """Half the rounds copy all 5 drafted tokens, half reject the first: a = 0.5 but 3.5 tokens per round."""
    drafted, accepted = [5] * 10, [5, 0] * 5
    measured = sum(n + 1 for n in accepted) / len(accepted)
    a_pos = conditional_acceptance(drafted, accepted)
    assert a_pos == [0.5, 1.0, 1.0, 1.0, 1.0]
    assert predict_from_positional(a_pos, drafted, 0.0) == measured == 3.5
    assert predict_from_rounds(0.5, drafted, 0.0) == pytest.approx(1.96875)  # the iid formula


def test_end_to_end_speedup_counts_the_prefill():
    # 10 decode tokens twice as fast after a prefill of 5 steps: plain 5 + 10, spec 5 + 5
    assert end_to_end_speedup(2.0, 11, 5.0) == 1.5
    assert end_to_end_speedup(2.0, 11, 0.0) == 2.0
    assert end_to_end_speedup(2.0, 1, 5.0) == 1.0


def test_knee_rules():
    curve = CostCurve.from_mapping({n: max(1.0, n / 4) for n in range(1, 17)})
    assert fit_knee(curve.points) == 4.0
    assert first_exceeding(curve, 16, 1.5) == 7  # 7 / 4 = 1.75 > 1.5; 6 / 4 = 1.5 is not
    assert first_exceeding(CostCurve.from_mapping({1: 1, 8: 1.2}), 8) is None


def test_batch_capacity():
    assert batch_capacity(1000, 200, 10, 8) == 10  # 800 bytes free / 80 per sequence
    assert batch_capacity(1000, 1200, 10, 8) == 0


def test_drift_and_auto_gains():
    flagged = stats.drift({"a": 0.45, "b": 0.8, "c": 0.62, "d": None}, 0.6, 0.1)
    assert [(f["category"], round(f["delta"], 2)) for f in flagged] == [("a", -0.15), ("b", 0.2)]
    g = stats.auto_gains({"auto": 1.5, "k2": 1.2, "k5": 1.0, "k8": None}, "auto", {"k2": 2, "k5": 5, "k8": 8}, "k5")
    assert g["best_fixed_k"] == 2 and math.isclose(g["gain_vs_best"], 0.25) and math.isclose(g["gain_vs_default"], 0.5)


# --- summaries of hand-built samples -------------------------------------------------------------------------


def rec(drafted, accepted, emitted, draft_s, verify_s, t=0.0):
    """The engine's round record from (tokens drafted, accepted, emitted, draft s, verify s, t)."""
    return RoundRecord([0] * drafted, accepted, 0, "bonus", emitted, draft_s, verify_s, t)


def turn(tokens, times, rounds=None, ttft=None, seconds=None, prompt=(1, 2, 3)):
    return Turn(list(prompt), list(tokens), "", "length", seconds if seconds is not None else times[-1],
                ttft if ttft is not None else times[0], list(times),
                None if rounds is None else [rec(*r) for r in rounds])


def plain_sample(qid, n, step=0.1, ttft=0.5):
    times = [ttft + i * step for i in range(n)]
    rounds = [(0, 0, 1, 0.0, step * 0.8)] * (n - 1)
    return Sample(qid, "cat", "plain", [turn(range(n), times, rounds)])


def test_summarize_and_predict_by_hand():
    plain = plain_sample("q", 7)  # 7 tokens: prefill at 0.5 s, then 6 steps of 0.1 s -> 1.1 s
    # speculative: the prefill token, then rounds emitting 3 (drafted 3, accepted 2), 1 (drafted 0), 2 (drafted 2,
    # accepted 1)
    spec_rounds = [(3, 2, 3, 0.001, 0.12), (0, 0, 1, 0.0, 0.08), (2, 1, 2, 0.001, 0.11)]
    spec = Sample("q", "cat", "ngram k=3", [turn(range(7), [0.5, 0.65, 0.65, 0.65, 0.75, 0.9, 0.9], spec_rounds)],
                  identical=True)
    s = stats.summarize([spec], {"q": plain})
    assert s.tokens == 7 and math.isclose(s.speedup, (7 / 0.9) / (7 / 1.1))
    # the decode phase alone: 6 tokens after the first, in 0.4 s against the plain run's 0.6 s
    assert math.isclose(s.decode_speedup, (6 / 0.4) / (6 / 0.6))
    assert s.tokens_per_pass == 2.0 and s.alpha == 3 / 5
    assert s.acceptance_by_position == [1.0, 0.5, 0.0]  # pos 0: 2 of 2 rounds; pos 1: 1 of 2; pos 2: 0 of 1
    assert s.draft_lengths == {0: 1, 2: 1, 3: 1}
    assert s.burst_share == 5 / 7 and s.identical_rate == 1.0
    # gaps 0.15, 0, 0, 0.1, 0.15, 0 -> sorted 0, 0, 0, 0.1, 0.15, 0.15: p50 halfway between 0 and 0.1
    assert math.isclose(s.itl_p50_s, 0.05) and math.isclose(s.itl_p99_s, 0.15)

    step, prefill = stats.plain_step(plain)
    assert math.isclose(step, 0.1) and math.isclose(prefill, 5.0)
    unit = (lambda n: 1.0, 0.0)  # verification free, drafting free
    p = stats.predict_sample(spec, plain, s.acceptance_by_position, s.alpha, unit)
    assert p["decode_speedup"] == (2.5 + 1 + 2.5) / 3 == 2.0  # E[tokens | d]: 1+1+0.5+0, 1, 1+1+0.5: as measured
    e2e = end_to_end_speedup(2.0, 7, 5.0)  # 6 decode tokens, prefill of 5 steps
    assert math.isclose(p["tokens_per_s"], plain.tokens_per_s * e2e)


def test_latency_percentiles_in_a_summary_are_the_right_ones():
    """200 distinct gaps of 1 .. 200 ms (shuffled): p50, p90, p99 and the maximum all differ, so a summary that
    reported another percentile, or the maximum, as p99 would fail. Linear interpolation: p99 sits at index
    199 * 0.99 = 197.01 of the sorted gaps, 198 + 0.01 ms; p50 at 99.5, 100.5 ms."""
    gaps = [(7 * i) % 200 + 1 for i in range(200)]  # a permutation of 1 .. 200 (7 is prime to 200)
    assert sorted(gaps) == list(range(1, 201))
    times = [0.5]
    for g in gaps:
        times.append(times[-1] + g / 1000)
    s = stats.summarize([Sample("q", "cat", "plain", [turn(range(201), times)])])
    assert math.isclose(s.itl_p50_s, 0.1005) and math.isclose(s.itl_p99_s, 0.19801)
    assert math.isclose(stats.percentile([g / 1000 for g in gaps], 90), 0.1801)


def test_cost_models():
    plain = plain_sample("q", 11, step=0.1)  # each plain pass 0.08 s of the 0.1 s step: 0.02 s overhead
    profile = Profile.from_json({"verify_cost": {"1": 1.0, "4": 2.0},
                                 "contexts": [{"context": 16, "step_s": 0.08, "verify_cost": {"1": 1.0, "4": 1.6}},
                                              {"context": 1000, "step_s": 0.5, "verify_cost": {"1": 1.0, "4": 3.0}}],
                                 "draft_cost": 0.05})
    (verify, c), h = stats.cost_from_profile(profile, context=20, step_s=0.1)
    assert math.isclose(h, 0.2) and math.isclose(verify(4), 0.8 * 1.6 + 0.2) and math.isclose(c, 0.8 * 0.05)
    (verify, c), h = stats.cost_from_profile(Profile.from_json({"verify_cost": {"1": 1.0, "4": 2.0}}), 20, 0.1)
    assert h == 0.0 and verify(4) == 2.0 and c == 0.0
    spec = Sample("q", "cat", "s", [turn(range(4), [0.5, 0.7, 0.7, 0.7], [(3, 2, 3, 0.01, 0.15)])])
    verify, c = stats.cost_from_rounds(spec, plain)
    assert c == 0.0 and math.isclose(verify(4), (0.16 + 0.02) / 0.1) and math.isclose(verify(1), 1.0)


def test_tokens_per_pass_from_hf_stream_groups():
    t = turn(range(6), [0.2, 0.3, 0.3, 0.3, 0.4, 0.4])  # no rounds: groups after the prefill token are 3, 2
    assert stats.tokens_per_pass([t]) == 2.5


def test_a_server_turn_counts_chunks_and_its_reported_acceptance():
    """From a server: 9 tokens in 4 streamed chunks (the first from the prefill), and the draft tokens the
    server reported; no token ids, so the usage count is the token count."""
    t = Turn([], [], "abcd", "length", 1.0, 0.4, [0.4, 0.6, 0.8, 1.0], completion_tokens=9, drafted=10, accepted=6)
    assert t.chunked and t.tokens == 9
    assert stats.tokens_per_pass([t]) == 8 / 3
    s = stats.summarize([Sample("q", "cat", "endpoint", [t])])
    assert s.tokens == 9 and s.alpha == 0.6 and s.burst_share is None and s.acceptance_by_position == []
    assert math.isclose(s.itl_p50_s, 0.2) and s.ttft_s == 0.4


def test_timing_outliers_flag_prompts_that_ran_slow():
    samples = [plain_sample("a", 5, step=0.1), plain_sample("b", 5, step=0.11), plain_sample("c", 5, step=0.3)]
    t = stats.timing_outliers(samples, factor=1.5)
    assert math.isclose(t["median_step_s"], 0.11) and t["slow_qids"] == ["c"] and t["slow_share"] == 1 / 3


def test_robust_timing_ignores_a_burst_of_load():
    # a plain turn: prefill 0.5 s, then 5 rounds of 0.1 s, but the third took 1.0 s (another process ran)
    ends = [0.6, 0.7, 1.7, 1.8, 1.9]
    rounds = [(0, 0, 1, 0.0, 0.08, t) for t in ends]
    busy = Sample("q", "cat", "plain", [turn(range(6), [0.5] + ends, rounds)])
    assert math.isclose(stats.robust_decode_seconds(busy.turns[0]), 0.5)  # 5 rounds at the median 0.1 s
    assert math.isclose(stats.robust_tokens_per_s(busy), 6 / 1.0)
    assert math.isclose(stats.disturbance(busy), 1.4 / 0.5)
    # speculative: rounds drafting 3 take 0.2 s, rounds drafting 0 take 0.1 s; medians per draft length
    spec_rounds = [(3, 3, 4, 0.0, 0.18, 0.7), (0, 0, 1, 0.0, 0.09, 0.8), (3, 0, 1, 0.0, 0.18, 1.0)]
    spec = Sample("q", "cat", "s", [turn(range(7), [0.5, 0.7, 0.7, 0.7, 0.7, 0.8, 1.0], spec_rounds)])
    assert math.isclose(stats.robust_decode_seconds(spec.turns[0]), 0.5) and math.isclose(stats.disturbance(spec), 1)
    s = stats.summarize([spec], {"q": busy})
    assert s.timing_suspect == ["q"]  # its baseline was disturbed
    assert math.isclose(s.robust_speedup, (7 / 1.0) / (6 / 1.0))
    assert stats.robust_tokens_per_s(Sample("q", "c", "hf", [turn(range(3), [0.1, 0.2, 0.3])])) is None


def test_one_acceptance_rule_everywhere():
    from specdec.measure import acceptance

    assert acceptance(3, 4) == 0.75 and acceptance(0, 5) == 0.0
    assert acceptance(0, 0) is None  # nothing drafted is not a rejection: never 0.0


def test_the_one_moving_average_is_named_by_its_half_life():
    from specdec.measure import Decay

    d = Decay.with_half_life(500)
    assert d.half_life == pytest.approx(500) and d.keep(500) == pytest.approx(0.5)
    assert Decay(0.1).mix(1.0, 2.0) == 0.9 * 1.0 + 0.1 * 2.0  # the running averages' own arithmetic, bit for bit
    assert Decay(0.1).mix(1.0, 2.0, 0.5) == 1.5  # a warm-up's larger weight
    with pytest.raises(ValueError):
        Decay(1.0)
