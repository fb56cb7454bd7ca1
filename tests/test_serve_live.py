"""The live page's JSON (specdec.serve.live) from rounds fed by hand on a fake clock: totals equal the Prometheus
registry's, per-position acceptance is conditional (judged only where every earlier draft was accepted), the
last minute forgets older rounds, and "paying" / "predicted" follow their definitions."""

from __future__ import annotations

import pytest

from specdec.engine.scheduler import RoundReport
from specdec.serve.live import LiveInfo, LiveStats, fit_knee, percentiles
from specdec.serve.metrics import ServerMetrics
from specdec.theory.economics import batch_ratio


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def feed(live: LiveStats, m: ServerMetrics, drafted, accepted, emitted, draft_s=0.001, verify_s=0.01):
    r = RoundReport([None] * len(drafted), list(drafted), list(accepted), list(emitted),
                    sum(drafted) + len(drafted), draft_s, verify_s)
    m.on_round(len(drafted), r.drafted, r.accepted, r.emitted)
    live.on_round(r)


def make(cost=None, max_k=4):
    m, clock = ServerMetrics(max_k=max_k), Clock()
    return m, LiveStats(m, LiveInfo("tiny", "ngram", "auto", max_k), cost, clock=clock), clock


def test_totals_equal_the_registry_and_positions_are_conditional():
    m, live, _ = make(max_k=3)
    feed(live, m, [3, 2, 0], [1, 2, 0], [2, 3, 1])
    feed(live, m, [3], [3], [4])
    m.on_finish("stop", 8, 10)
    s = live.snapshot(2, 1)
    assert s["requests"] == {"running": 2, "waiting": 1, "finished": {"stop": 1, "length": 0, "abort": 0}}
    assert s["tokens"]["generated"] == 10 == m.value("specdec:generation_tokens_total")
    a = s["acceptance"]
    assert (a["drafted"], a["accepted"], a["drafts"], a["plain_rows"]) == (8, 6, 3, 1)
    assert a["rate"] == pytest.approx(6 / 8)
    pos = a["per_position"]
    # position 0: judged by the three drafting rows, accepted by 3; position 1: judged where position 0 was
    # accepted (3 rows), accepted by 2; position 2: rows with k > 2 that accepted 0 and 1 (only the k=3, a=3 one)
    assert [p["judged"] for p in pos] == [3, 3, 1] and [p["accepted"] for p in pos] == [3, 2, 1]
    assert [p["rate"] for p in pos] == pytest.approx([1.0, 2 / 3, 1.0])
    assert s["rounds"]["count"] == 2 and s["rounds"]["tokens_per_round"] == pytest.approx(10 / 4)
    last = s["rounds"]["last"]
    assert last["k"] == [3] and (last["speculating"], last["plain"], last["emitted"]) == (1, 0, 4)


def test_the_last_minute_forgets_and_paying_is_measured_over_plain():
    m, live, clock = make()
    feed(live, m, [0], [0], [1], draft_s=0.0, verify_s=0.010)  # a plain one-row pass: 10 ms
    feed(live, m, [0, 0], [0, 0], [1, 1], draft_s=0.0, verify_s=0.012)  # plain, two rows: 12 ms
    clock.t += 120  # both leave the window
    feed(live, m, [4], [4], [5], draft_s=0.002, verify_s=0.018)  # 5 tokens in 20 ms, width 5
    s = live.snapshot(1, 0)
    r = s["recent"]
    assert r["rounds"] == 1 and r["batch_mean"] == 1 and r["k_mean"] == 4
    assert r["measured_tok_s"] == pytest.approx(5 / 0.020)
    assert r["plain_tok_s"] == pytest.approx(1 / 0.010)  # one row, at the measured one-row cost
    assert r["paying"] == pytest.approx((5 / 0.020) / (1 / 0.010))
    assert r["a"] == 1.0 and r["c"] == pytest.approx(0.002 / 4 / 0.010)
    assert r["predicted"] == pytest.approx(batch_ratio(0.999999, 4, r["c"], 1, r["knee_rows"]))
    assert s["acceptance"]["per_position"][0]["recent_judged"] == 1  # only the round inside the window
    assert [c["rows"] for c in s["cost"]["measured"]] == [1, 2, 5]


def test_a_batch_width_never_run_plain_is_read_off_the_measured_passes():
    """Without a policy curve, a plain pass's cost at a width the server never ran comes from the measured ones:
    by theory/cost.py's rule: linear between neighbours and past the widest (the last two's line), the
    narrowest's below it (so paying is never null once a pass was measured)."""
    m, live, clock = make()
    feed(live, m, [0], [0], [1], draft_s=0.0, verify_s=0.010)  # one row: 10 ms
    feed(live, m, [0, 0, 0], [0, 0, 0], [1, 1, 1], draft_s=0.0, verify_s=0.014)  # three rows: 14 ms
    cost = {1: 0.010, 3: 0.014}
    assert live._plain_cost(2, cost) == pytest.approx(0.012)
    assert live._plain_cost(6, cost) == pytest.approx(0.020)
    assert live._plain_cost(1, {3: 0.014}) == 0.014 and live._plain_cost(2, {}) is None
    feed(live, m, [2, 2], [1, 2], [2, 3], draft_s=0.001, verify_s=0.020)  # two speculating rows: never run plain
    r = live.snapshot(1, 0)["recent"]
    assert r["plain_tok_s"] is not None and r["paying"] is not None


def test_the_theory_needs_no_lone_plain_row():
    """A server whose every round drafted (policy always) never runs a one-row plain pass; the prediction then
    takes the narrowest measured pass as one row's cost instead of going blank (a CI run on a busy machine hit
    this: its rounds happened never to leave one row undrafted)."""
    m, live, _ = make()
    feed(live, m, [3], [2], [3], draft_s=0.001, verify_s=0.012)  # width 4
    feed(live, m, [3, 3], [3, 1], [4, 2], draft_s=0.001, verify_s=0.016)  # width 8
    s = live.snapshot(0, 0)
    r = s["recent"]
    assert s["cost"]["one_row_s"] == 0.012 and r["c"] == pytest.approx(0.002 / 6 / 0.012)
    assert r["predicted"] == pytest.approx(batch_ratio(r["a"], 3, r["c"], 2, r["knee_rows"]))


def test_before_any_traffic_every_measure_is_null_not_an_error():
    m, live, _ = make(cost=lambda n: 0.01 * max(1, n / 4))
    s = live.snapshot(0, 0)
    assert s["acceptance"]["rate"] is None and s["rounds"]["last"] is None and s["recent"]["paying"] is None
    assert s["latency"]["ttft_s"] == {"count": 0, "p50": None, "p90": None, "p99": None}
    assert s["cost"]["policy"][0] == {"rows": 1, "seconds": 0.01}


def test_percentiles_and_knee():
    p = percentiles([float(i) for i in range(1, 101)])  # linear between order statistics, as bench's
    assert p["count"] == 100 and (p["p50"], p["p90"], p["p99"]) == pytest.approx((50.5, 90.1, 99.01))
    assert fit_knee([(1, 1.0), (2, 1.0), (4, 1.0), (8, 2.0), (16, 4.0)]) == pytest.approx(4.0)
    assert fit_knee([(1, 1.0)]) is None
