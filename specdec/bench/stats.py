"""The statistics of a benchmark: pure functions over samples (see runner.Sample), checked by hand in tests.

Speedup is a ratio of means: mean tokens/s of a method over the prompts of a group, divided by the mean
tokens/s of its baseline on the same prompts. Times include the prefill, as a user sees them. The measurements
themselves (percentiles, latencies, rates) are defined once, in specdec.measure.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from specdec.bench.records import GroupResult
from specdec.measure import acceptance, inter_token_latencies, mean, percentile, ratio_of_means  # noqa: F401 (re-exported)
from specdec.measure import tokens_per_pass as passes_rate
from specdec.theory.economics import (
    CostCurve,
    conditional_acceptance,
    end_to_end_speedup,
    predict_from_positional,
    predict_from_rounds,
)
from specdec.theory.profile import Profile

DISTURBED = 1.5  # a run whose decode time exceeds its robust estimate by this factor is flagged


def bursts(times: Sequence[float]) -> list[int]:
    """Sizes of the groups of tokens that arrived together (equal times), in order."""
    sizes: list[int] = []
    for i, t in enumerate(times):
        if i and t == times[i - 1]:
            sizes[-1] += 1
        else:
            sizes.append(1)
    return sizes


def burst_share(times_per_turn: Sequence[Sequence[float]]) -> float | None:
    """Share of tokens that arrived together with at least one other (more than one token in a round)."""
    sizes = [n for times in times_per_turn for n in bursts(times)]
    total = sum(sizes)
    return sum(n for n in sizes if n > 1) / total if total else None


def tokens_per_pass(turns) -> float | None:
    """Generated tokens per target pass after the prefill, bonus included (1.00 for plain decoding). From the
    engine's rounds; from a server's streamed chunks (one per pass, where the server sends each pass's tokens
    at once); for Hugging Face from the groups of tokens its streamer received together."""
    emitted, passes = 0, 0
    for t in turns:
        if t.rounds is not None:
            emitted += sum(r.emitted for r in t.rounds)
            passes += len(t.rounds)
        elif t.chunked:
            emitted += max(t.tokens - 1, 0)  # the first chunk comes from the prefill
            passes += max(len(t.token_times) - 1, 0)
        else:
            groups = bursts(t.token_times)[1:]  # the first token comes from the prefill
            emitted += sum(groups)
            passes += len(groups)
    return passes_rate(emitted, passes)


def all_rounds(samples) -> list:
    return [r for s in samples for t in s.turns for r in (t.rounds or [])]


def plain_step(sample) -> tuple[float, float]:
    """(seconds per decode step, prefill cost in decode steps) of a plain-decoding sample."""
    decode_s = sum(t.seconds - t.ttft_s for t in sample.turns)
    steps = sum(len(t.rounds) if t.rounds is not None else max(t.tokens - 1, 0) for t in sample.turns)
    step = decode_s / steps if steps and decode_s > 0 else 0.0
    prefill = sum(t.ttft_s for t in sample.turns)
    return step, (prefill / step if step else 0.0)


def _acceptance(samples) -> tuple[list[int], list[int]]:
    """(drafted, accepted) per round from the engine's rounds; per turn where a server reported totals."""
    drafted, accepted = [], []
    for t in (t for s in samples for t in s.turns):
        if t.rounds is not None:
            drafted += [len(r.drafted) for r in t.rounds]
            accepted += [r.accepted for r in t.rounds]
        elif t.drafted is not None:
            drafted.append(t.drafted)
            accepted.append(t.accepted or 0)
    return drafted, accepted


def summarize(samples, baselines: dict | None = None) -> GroupResult:
    """Metrics of one method over a group of prompts; `baselines` maps qid -> the baseline's sample."""
    rounds = all_rounds(samples)
    drafted, accepted = _acceptance(samples)
    per_round = [len(r.drafted) for r in rounds]
    times = [t.token_times for s in samples for t in s.turns]
    itl = [g for ts in times for g in inter_token_latencies(ts)]
    tps = [s.tokens_per_s for s in samples]
    out = GroupResult(
        prompts=len(samples),
        tokens=sum(s.tokens for s in samples),
        seconds=sum(s.seconds for s in samples),
        tokens_per_s=mean(tps),
        tokens_per_pass=tokens_per_pass([t for s in samples for t in s.turns]),
        drafted=sum(drafted),
        accepted=sum(accepted),
        alpha=acceptance(sum(accepted), sum(drafted)),
        acceptance_by_position=conditional_acceptance(per_round, [r.accepted for r in rounds]),
        draft_lengths={d: per_round.count(d) for d in sorted(set(per_round))},
        ttft_s=mean([t.ttft_s for s in samples for t in s.turns if t.ttft_s is not None]),
        itl_p50_s=percentile(itl, 50),
        itl_p99_s=percentile(itl, 99),
        burst_share=None if any(t.chunked for s in samples for t in s.turns) else burst_share(times),
        disturbance_max=max((d for d in map(disturbance, samples) if d is not None), default=None),
    )
    if baselines:
        base = [baselines[s.qid] for s in samples]
        out.baseline_tokens_per_s = mean([b.tokens_per_s for b in base])
        out.speedup = ratio_of_means(tps, [b.tokens_per_s for b in base])
        dec, dec_base = [s.decode_tokens_per_s for s in samples], [b.decode_tokens_per_s for b in base]
        if None not in dec + dec_base:  # the decode phase alone: prefill is the same work for both
            out.decode_speedup = ratio_of_means(dec, dec_base)
        same = [s.identical for s in samples if s.identical is not None]
        out.identical_rate = sum(same) / len(same) if same else None
        out.mismatches = [{"qid": s.qid, **s.mismatch} for s in samples if s.mismatch]
        robust = [robust_tokens_per_s(s) for s in samples]
        robust_base = [robust_tokens_per_s(b) for b in base]
        if None not in robust + robust_base:
            out.robust_speedup = ratio_of_means(robust, robust_base)
        out.timing_suspect = [s.qid for s in samples if max(disturbance(s) or 1.0, disturbance(
            baselines[s.qid]) or 1.0) > DISTURBED]
    return out


# --- prediction --------------------------------------------------------------------------------------------

CostModel = tuple[Callable[[int], float], float]  # (cost of a pass over n rows, c): both in plain decode steps


def cost_from_profile(profile: Profile, context: float, step_s: float) -> tuple[CostModel, float]:
    """Costs in plain decode steps from a profile's verify curve (nearest context) and draft cost c.

    A decode step in the engine is the target pass plus a fixed per-round overhead (Python, sampling): with
    h = 1 - T(1) / step that overhead's share, a round with n rows costs (1 - h) * T(n)/T(1) + h steps and a
    drafted token (1 - h) * c. Returns ((verify, c), h); h = 0 when the profile has no absolute T(1)."""
    entry = profile.nearest(context)
    curve = CostCurve.from_mapping(entry.verify_cost if entry else profile.verify_cost)
    t1 = entry.step_s if entry else None
    h = min(max(1.0 - t1 / step_s, 0.0), 1.0) if t1 and step_s else 0.0
    c = profile.draft_cost or 0.0
    return ((lambda n: (1 - h) * curve(n) + h), (1 - h) * c), h


def cost_from_rounds(sample, baseline) -> CostModel:
    """Costs in plain decode steps measured in this run: a round that drafted d tokens costs the median of its
    draft + verify time plus the per-round overhead the plain run shows beyond its own passes (c is folded in)."""
    step, _ = plain_step(baseline)
    plain_rounds = all_rounds([baseline])
    if not plain_rounds or step <= 0:  # a baseline of one token: nothing to measure a step by
        return (lambda n: 1.0), 0.0
    plain_pass = statistics.median(r.draft_s + r.verify_s for r in plain_rounds)
    overhead = max(step - plain_pass, 0.0)
    by_d: dict[int, list[float]] = {}
    for r in all_rounds([sample]):
        by_d.setdefault(len(r.drafted), []).append(r.draft_s + r.verify_s)
    med = {d: statistics.median(v) for d, v in by_d.items()}
    return (lambda n: (med.get(n - 1, plain_pass) + overhead) / step), 0.0


def predict_sample(sample, baseline, a_pos, alpha: float | None, cost: CostModel) -> dict:
    """Predicted tokens/s of a speculative sample, from its rounds' draft lengths, the acceptance statistics
    (conditional per-position a_pos, and the iid a for comparison), the costs, and its baseline's timings."""
    verify, c = cost
    drafted = [len(r.drafted) for r in all_rounds([sample])]
    step, prefill_steps = plain_step(baseline)
    decode_tokens = sum(max(t.tokens - 1, 0) for t in sample.turns)
    pos = predict_from_positional(a_pos, drafted, c, verify)
    iid = predict_from_rounds(alpha or 0.0, drafted, c, verify)
    e2e = lambda s: end_to_end_speedup(s, decode_tokens + 1, prefill_steps)
    return {
        "decode_speedup": pos,
        "decode_speedup_iid": iid,
        "tokens_per_s": baseline.tokens_per_s * e2e(pos),
        "tokens_per_s_iid": baseline.tokens_per_s * e2e(iid),
        "prefill_steps": prefill_steps,
        "step_s": step,
    }


# --- comparisons -------------------------------------------------------------------------------------------


def drift(alpha_by_category: dict[str, float | None], overall: float | None, margin: float) -> list[dict]:
    """Categories whose acceptance rate differs from the overall one by more than `margin` (absolute)."""
    if overall is None:
        return []
    return [{"category": cat, "alpha": a, "delta": a - overall}
            for cat, a in alpha_by_category.items() if a is not None and abs(a - overall) > margin]


def auto_gains(speedups: dict[str, float | None], auto: str, fixed: dict[str, int], default: str) -> dict:
    """Auto k against the best fixed k and the default k, for one group. speedups: method -> speedup;
    fixed: method -> its k."""
    known = {m: speedups[m] for m in fixed if speedups.get(m) is not None}
    s_auto = speedups.get(auto)
    if not known or s_auto is None:
        return {}
    best = max(known, key=known.get)
    out = {"auto": s_auto, "best_fixed_k": fixed[best], "best_fixed": known[best],
           "gain_vs_best": s_auto / known[best] - 1.0}
    if speedups.get(default):
        out.update(default_k=fixed[default], default=speedups[default],
                   gain_vs_default=s_auto / speedups[default] - 1.0)
    return out


def robust_decode_seconds(turn) -> float | None:
    """The turn's decode time with each round's duration (time since the previous round's tokens) replaced by
    the median duration of the turn's rounds of the same draft length: insensitive to bursts of load from
    other processes on a shared machine. None without rounds (Hugging Face)."""
    if turn.rounds is None:
        return None
    prev, gaps = turn.ttft_s, []
    for r in turn.rounds:
        gaps.append((len(r.drafted), r.t - prev))
        prev = r.t
    by_d: dict[int, list[float]] = {}
    for d, g in gaps:
        by_d.setdefault(d, []).append(g)
    med = {d: statistics.median(v) for d, v in by_d.items()}
    return sum(med[d] for d, _ in gaps)


def robust_tokens_per_s(sample) -> float | None:
    decode = [robust_decode_seconds(t) for t in sample.turns]
    if any(d is None for d in decode):
        return None
    seconds = sum(t.ttft_s for t in sample.turns) + sum(decode)
    return sample.tokens / seconds if seconds > 0 else None


def disturbance(sample) -> float | None:
    """Measured decode time over its robust estimate: near 1 on a quiet machine, well above when something
    else took the CPU for a while during the run."""
    decode = [robust_decode_seconds(t) for t in sample.turns]
    if any(d is None for d in decode) or sum(decode) <= 0:
        return None
    return sum(t.seconds - t.ttft_s for t in sample.turns) / sum(decode)


def timing_outliers(plain_samples, factor: float = 1.5) -> dict:
    """Prompts whose plain decode step ran more than `factor` times the median one: on a shared machine,
    a sign that something else was running (their speedups are suspect)."""
    steps = {s.qid: plain_step(s)[0] for s in plain_samples}
    steps = {q: v for q, v in steps.items() if v > 0}
    if not steps:
        return {}
    med = statistics.median(steps.values())
    slow = [q for q, v in steps.items() if v > factor * med]
    return {"median_step_s": med, "factor": factor, "prompts": len(steps), "slow_qids": slow,
            "slow_share": len(slow) / len(steps)}
