"""What the server measures, as one JSON document for the live page (GET /live): the verify-cost curve the
policy decides by, acceptance per draft position (since start and over the last minute), what the policy did in
the last round, latency percentiles, and whether speculation pays here against what the theory predicts.

Totals are read from the Prometheus registry itself (ServerMetrics.value), so the page and /metrics can never
disagree about them; everything else is kept here, fed by the engine thread (`on_round`, `on_first_token`,
`on_gap`) and read by the event loop (`snapshot`) under one lock.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from specdec.engine.scheduler import RoundReport
from specdec.measure import acceptance, percentile
from specdec.serve.metrics import ServerMetrics
from specdec.theory.cost import read_cost
from specdec.theory.economics import batch_ratio, expected_tokens_positional, fit_knee, position_counts, rates

WINDOW_S = 60.0  # "recent": the last minute
MAX_SAMPLES = 20_000  # latency samples and rounds kept for the window, whatever the traffic
COST_SAMPLES = 32  # per row count: the recent passes whose median is the measured curve (a stray slow pass
# from other load moves a median, not a mean, by little)


@dataclass(frozen=True)
class LiveInfo:
    """What the server runs, as the page names it."""

    model: str
    drafter: str
    policy: str
    max_k: int


@dataclass(frozen=True)
class _Round:
    t: float
    ks: tuple[int, ...]  # per row: drafts verified
    accepted: tuple[int, ...]
    emitted: int  # tokens, all rows
    width: int
    draft_s: float
    verify_s: float


def percentiles(xs: list[float]) -> dict:
    """count, p50, p90, p99 of a sample (measure.percentile's, as `bench` reports them); None for each percentile of
    an empty one."""
    return {"count": len(xs), **{f"p{q}": percentile(xs, q) for q in (50, 90, 99)}}


class LiveStats:
    def __init__(self, metrics: ServerMetrics, info: LiveInfo, policy_cost: Callable[[int], float] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.metrics, self.info, self.policy_cost, self.clock = metrics, info, policy_cost, clock
        self.depth = max(info.max_k, 1)
        self.t0 = clock()
        self._lock = threading.Lock()
        self._rounds: deque[_Round] = deque(maxlen=MAX_SAMPLES)
        self._ttft: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)
        self._itl: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)
        self._cost: dict[int, deque[float]] = {}  # rows -> recent pass seconds
        self._judged = [0] * self.depth  # since start, per draft position
        self._hits = [0] * self.depth
        self._last: _Round | None = None

    # --- the engine thread ----------------------------------------------------------------------------------

    def on_round(self, r: RoundReport) -> None:
        rec = _Round(self.clock(), tuple(r.drafted), tuple(r.accepted), sum(r.emitted), r.width, r.draft_s,
                     r.verify_s)
        judged, hits = position_counts(rec.ks, rec.accepted, self.depth)
        with self._lock:
            self._rounds.append(rec)
            self._last = rec
            self._cost.setdefault(r.width, deque(maxlen=COST_SAMPLES)).append(r.verify_s)
            for i in range(self.depth):
                self._judged[i] += judged[i]
                self._hits[i] += hits[i]

    def on_first_token(self, seconds: float) -> None:
        with self._lock:
            self._ttft.append((self.clock(), seconds))

    def on_gap(self, seconds: float) -> None:
        with self._lock:
            self._itl.append((self.clock(), seconds))

    # --- the event loop -------------------------------------------------------------------------------------

    def snapshot(self, running: int, waiting: int) -> dict:
        now = self.clock()
        since = now - WINDOW_S
        with self._lock:
            rounds = [r for r in self._rounds if r.t >= since]
            ttft = [v for t, v in self._ttft if t >= since]
            itl = [v for t, v in self._itl if t >= since]
            cost = {n: statistics.median(v) for n, v in sorted(self._cost.items())}
            samples = {n: len(v) for n, v in self._cost.items()}
            judged, hits, last = list(self._judged), list(self._hits), self._last
        m = self.metrics
        uptime = now - self.t0
        recent_j, recent_h = [0] * self.depth, [0] * self.depth
        for r in rounds:
            j, h = position_counts(r.ks, r.accepted, self.depth)
            recent_j = [x + y for x, y in zip(recent_j, j)]
            recent_h = [x + y for x, y in zip(recent_h, h)]
        rate_pos, recent_pos = rates(judged, hits), rates(recent_j, recent_h)
        drafted, accepted = m.value("specdec:spec_decode_num_draft_tokens_total"), \
            m.value("specdec:spec_decode_num_accepted_tokens_total")
        tpr_n = m.value("specdec:tokens_per_round_count")
        one_row = self._plain_cost(1, cost)
        return {
            "time": time.time(),
            "uptime_s": uptime,
            "window_s": WINDOW_S,
            "server": {"model": self.info.model, "drafter": self.info.drafter, "policy": self.info.policy,
                       "max_k": self.info.max_k},
            "requests": {"running": running, "waiting": waiting,
                         "finished": {reason: m.value("specdec:request_success_total", finish_reason=reason)
                                      for reason in ("stop", "length", "abort")}},
            "tokens": {"prompt": m.value("specdec:prompt_tokens_total"),
                       "generated": m.value("specdec:generation_tokens_total"),
                       "prefix_cache_hits": m.value("specdec:prefix_cache_hits_total")},
            "acceptance": {
                "drafted": drafted, "accepted": accepted, "rate": acceptance(accepted, drafted),
                "drafts": m.value("specdec:spec_decode_num_drafts_total"),
                "plain_rows": m.value("specdec:spec_decode_num_plain_rows_total"),
                "rate_ema": m.acceptance_rate,
                "drift": _finite(m.value("specdec:spec_decode_acceptance_drift")) if drafted else None,
                "per_position": [
                    {"position": i, "accepted": m.value("specdec:spec_decode_num_accepted_tokens_per_pos_total",
                                                        position=str(i)),
                     "judged": judged[i], "rate": rate_pos[i], "recent_judged": recent_j[i],
                     "recent_accepted": recent_h[i], "recent_rate": recent_pos[i]}
                    for i in range(self.depth)],
            },
            "rounds": {"count": m.value("specdec:batch_size_count"),
                       "tokens_per_round": m.value("specdec:tokens_per_round_sum") / tpr_n if tpr_n else None,
                       "last": self._describe_last(last, rate_pos)},
            "cost": {"one_row_s": one_row,
                     "measured": [{"rows": n, "seconds": s, "samples": samples[n]} for n, s in cost.items()],
                     "policy": self._policy_curve(max(cost, default=1)),
                     "knee_rows": fit_knee([(n, s / one_row) for n, s in cost.items()]) if one_row else None},
            "recent": self._recent(rounds, cost, one_row, min(WINDOW_S, uptime), sum(recent_j), sum(recent_h)),
            "latency": {"ttft_s": percentiles(ttft), "itl_s": percentiles(itl)},
        }

    def _policy_curve(self, upto: int) -> list[dict] | None:
        if self.policy_cost is None:
            return None
        return [{"rows": n, "seconds": self.policy_cost(n)} for n in range(1, max(upto, 2) + 1)]

    def _describe_last(self, r: _Round | None, rate_pos: list[float | None]) -> dict | None:
        """The last round: each row's k, rows speculating and plain, and its tokens per second, measured and as
        the per-position acceptance since start expects them."""
        if r is None:
            return None
        seconds = r.draft_s + r.verify_s
        expected = sum(expected_tokens_positional(rate_pos, k) for k in r.ks)
        return {"k": list(r.ks), "speculating": sum(k > 0 for k in r.ks), "plain": sum(k == 0 for k in r.ks),
                "emitted": r.emitted, "width": r.width, "seconds": seconds,
                "measured_tok_s": r.emitted / seconds if seconds > 0 else None,
                "expected_tok_s": expected / seconds if seconds > 0 else None}

    def _recent(self, rounds: list[_Round], cost: dict[int, float], one: float | None, span: float, judged: int,
                hits: int) -> dict:
        """The last minute's decode rounds: tokens per second with speculation, against plain decoding of the same
        batches at the measured cost of a plain pass over as many rows (speculation paying x); and what the
        theory predicts from the measured a, k, c and cost curve (y). one: a one-row pass's seconds (`_plain_cost`,
        so a server that never ran a lone plain row still has it); judged, hits: the window's drafts judged and
        accepted, over every position."""
        out = {"rounds": len(rounds), "throughput_tok_s": None, "measured_tok_s": None, "plain_tok_s": None,
               "paying": None, "a": None, "k_mean": None, "batch_mean": None, "c": None, "knee_rows": None,
               "k_theory": None, "batch_theory": None, "predicted": None}
        if not rounds:
            return out
        emitted = sum(r.emitted for r in rounds)
        busy = sum(r.draft_s + r.verify_s for r in rounds)
        rows = sum(len(r.ks) for r in rounds)
        out.update(throughput_tok_s=emitted / span if span > 0 else None, rounds=len(rounds),
                   measured_tok_s=emitted / busy if busy > 0 else None, batch_mean=rows / len(rounds),
                   k_mean=sum(sum(r.ks) for r in rounds) / rows)
        plain = [self._plain_cost(len(r.ks), cost) for r in rounds]
        if all(p is not None for p in plain) and busy > 0:
            out["plain_tok_s"] = rows / sum(plain)
            out["paying"] = out["measured_tok_s"] / out["plain_tok_s"]
        spec_rounds = [r for r in rounds if any(r.ks)]
        if judged and one:
            a = hits / judged  # the theory's a: a draft survives given every earlier one did
            steps = sum(max(r.ks) for r in spec_rounds)
            c = (sum(r.draft_s for r in spec_rounds) / steps) / one if steps else 0.0
            k = max(1, round(out["k_mean"]))
            knee = fit_knee([(n, s / one) for n, s in cost.items()]) or 1.0
            batch = max(1, round(out["batch_mean"]))
            out.update(a=a, c=c, knee_rows=knee, k_theory=k, batch_theory=batch,
                       predicted=batch_ratio(min(a, 0.999999), k, c, batch, knee))
        return out

    def _plain_cost(self, rows: int, cost: dict[int, float]) -> float | None:
        """Seconds of a plain pass over `rows` rows: measured where the server ran one, else the policy's curve,
        else read off the measured passes (theory/cost.py's rule). None with no pass yet: a batch width the server
        happened not to run never leaves the page without a figure."""
        if rows in cost:
            return cost[rows]
        if self.policy_cost is not None:
            return self.policy_cost(rows)
        return read_cost(tuple(sorted(cost.items())), rows) if cost else None


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
