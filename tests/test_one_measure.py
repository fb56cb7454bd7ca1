"""One set of rounds, read by every part that reports on them: the server's live page and metrics, the engine's
meter and request statistics, `bench`'s summary, the policy's evidence and the vLLM proposer. Each measure is
defined once (acceptance, per-position acceptance, percentiles, the knee), so each must give the same figure."""

from __future__ import annotations

import pytest

from specdec.bench.runner import Sample, Turn
from specdec.bench.stats import summarize
from specdec.engine.scheduler import RoundReport
from specdec.engine.sequence import Evidence
from specdec.engine.stats import AcceptanceMeter, RoundRecord
from specdec.measure import acceptance, percentile
from specdec.serve.live import LiveInfo, LiveStats
from specdec.serve.metrics import ServerMetrics
from specdec.theory.economics import conditional_acceptance, fit_knee
from tests.test_vllm_proposer import make as make_proposer
from tests.test_vllm_proposer import prompt

DEPTH = 6


def vllm_rounds() -> tuple[list[tuple[list[int], list[int]]], object]:
    """The vLLM proposer on its simulated batch: per step, each decoding row's drafts verified and accepted (as the
    batch verified them), and the proposer."""
    p, b = make_proposer(policy="fixed", k=DEPTH)
    rounds, rid = [], 0
    for step in range(40):
        if step % 4 == 0 and rid < 6:
            b.add(prompt(rid, 6 + 7 * (rid % 3)), budget=40 + 6 + 7 * (rid % 3), rid=rid)
            rid += 1
        drafts = {req["rid"]: len(req["draft"]) for req in b.rows if not req["prefilling"]}
        b.step()
        done = {req["rid"]: req for req in b.finished}  # a request that finished in this step: still reported
        rows = [req for req in b.rows if req["rid"] in drafts] + [done[r] for r in drafts if r in done]
        ks = [drafts[req["rid"]] for req in rows]
        got = [len(req["gained"]) - 1 for req in rows]  # the target's own token follows the accepted drafts
        if ks:
            rounds.append((ks, got))
    return rounds, p


@pytest.fixture(scope="module")
def rounds():
    return vllm_rounds()


def test_every_part_reports_the_same_acceptance(rounds):
    steps, proposer = rounds
    drafted = sum(sum(ks) for ks, _ in steps)
    accepted = sum(sum(got) for _, got in steps)
    assert 0 < accepted < drafted  # the batch kept some drafts and rejected others
    want = acceptance(accepted, drafted)

    metrics = ServerMetrics(max_k=DEPTH)
    live = LiveStats(metrics, LiveInfo("tiny", "ngram", "fixed", DEPTH))
    meter = AcceptanceMeter()
    turns = []
    for ks, got in steps:
        live.on_round(RoundReport([None] * len(ks), ks, got, [a + 1 for a in got], sum(ks) + len(ks), 0.001, 0.01))
        metrics.on_round(len(ks), ks, got, [a + 1 for a in got])
        for k, a in zip(ks, got):
            meter.update(k, a)
        turns.append(Turn([1], [2] * (sum(got) + len(got)), "", "length", 1.0, 0.1, [0.1] * (sum(got) + len(got)),
                          rounds=[RoundRecord([7] * k, a, 0, "bonus", a + 1, 0.0, 0.0, 0.0) for k, a in zip(ks, got)]))
    bench = summarize([Sample("1", "copy", "ngram", turns)])
    page = live.snapshot(0, 0)["acceptance"]
    assert page["rate"] == pytest.approx(want) and page["drafted"] == drafted and page["accepted"] == accepted
    assert meter.alpha == pytest.approx(want) and bench.alpha == pytest.approx(want)
    assert proposer.summary()["acceptance"] == pytest.approx(want)  # drafts it handed vLLM that vLLM verified


def test_every_part_reports_the_same_acceptance_by_position(rounds):
    steps, _ = rounds
    ks = [k for row_ks, _ in steps for k in row_ks]
    got = [a for _, row_got in steps for a in row_got]
    want = conditional_acceptance(ks, got)

    metrics = ServerMetrics(max_k=DEPTH)
    live = LiveStats(metrics, LiveInfo("tiny", "ngram", "fixed", DEPTH))
    evidence = Evidence(DEPTH)  # what the policy learns: each round's judged and accepted positions
    for row_ks, row_got in steps:
        live.on_round(RoundReport([None] * len(row_ks), row_ks, row_got, [a + 1 for a in row_got],
                                  sum(row_ks) + len(row_ks), 0.001, 0.01))
        for k, a in zip(row_ks, row_got):
            evidence.record(k, a)
    page = [p["rate"] for p in live.snapshot(0, 0)["acceptance"]["per_position"]]
    policy = [h / j if j else None for h, j in zip(evidence.hits, evidence.judged)]
    for i, a in enumerate(want):
        assert page[i] == pytest.approx(a) and policy[i] == pytest.approx(a), f"position {i}"


def test_percentiles_and_the_knee_are_the_same_everywhere():
    from specdec.serve.live import percentiles

    xs = [0.01 * (i % 17) + 0.003 * i for i in range(200)]
    live = percentiles(xs)
    assert (live["p50"], live["p90"], live["p99"]) == (percentile(xs, 50), percentile(xs, 90), percentile(xs, 99))
    from specdec.serve import live as live_module

    assert live_module.fit_knee is fit_knee  # the live page fits its knee with the theory's one fit
