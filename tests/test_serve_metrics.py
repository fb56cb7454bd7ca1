"""Server metrics: the exposed names are exactly vLLM-style ones, the values follow the rounds fed in, the
acceptance gauges track changes at their half-lives, and two instances never share state."""

from __future__ import annotations

import math

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec.serve.metrics import ServerMetrics

RATE_HALF_LIFE = 500  # drafted tokens, as specified (not imported: a changed constant must fail here)
DRIFT_HALF_LIFE = 100

EXPECTED = {
    "specdec:spec_decode_num_drafts_total": "counter",
    "specdec:spec_decode_num_plain_rows_total": "counter",
    "specdec:stream_pace_tail_seconds": "histogram",
    "specdec:stream_pace_lag_seconds": "histogram",
    "specdec:spec_decode_num_draft_tokens_total": "counter",
    "specdec:spec_decode_num_accepted_tokens_total": "counter",
    "specdec:spec_decode_num_accepted_tokens_per_pos_total": "counter",
    "specdec:spec_decode_acceptance_rate": "gauge",
    "specdec:spec_decode_acceptance_drift": "gauge",
    "specdec:num_requests_running": "gauge",
    "specdec:num_requests_waiting": "gauge",
    "specdec:threads": "gauge",
    "specdec:cpu_used_by_others": "gauge",
    "specdec:time_to_first_token_seconds": "histogram",
    "specdec:inter_token_latency_seconds": "histogram",
    "specdec:tokens_per_round": "histogram",
    "specdec:batch_size": "histogram",
    "specdec:request_success_total": "counter",
    "specdec:prompt_tokens_total": "counter",
    "specdec:generation_tokens_total": "counter",
    "specdec:prefix_cache_hits_total": "counter",
}


def samples(m: ServerMetrics) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} from the rendered text."""
    body, _ = m.render()
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(m: ServerMetrics, name: str, **labels) -> float:
    return samples(m)[(name, tuple(sorted((k, str(v)) for k, v in labels.items())))]


def feed(m: ServerMetrics, tokens: int, rate: float, k: int = 5) -> None:
    """`tokens` drafted tokens in rounds of k (one sequence), accepting a share `rate` of them, spread evenly."""
    acc = 0.0
    for _ in range(tokens // k):
        acc += rate * k
        a = min(k, int(acc + 1e-9))
        acc -= a
        m.on_round(1, [k], [a], [a + 1])


def test_exposed_names_are_exactly_the_vllm_style_ones():
    m = ServerMetrics(max_k=4)
    body, ctype = m.render()
    assert ctype.startswith("text/plain")
    text = body.decode()
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
    assert types == EXPECTED
    sample_names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    allowed = {n for n, k in EXPECTED.items() if k != "histogram"}
    allowed |= {n + s for n, k in EXPECTED.items() if k == "histogram" for s in ("_bucket", "_count", "_sum")}
    assert sample_names == allowed  # no "_created" series, nothing else


def test_initial_values():
    m = ServerMetrics(max_k=3)
    assert m.acceptance_rate is None
    assert math.isnan(value(m, "specdec:spec_decode_acceptance_rate"))
    assert value(m, "specdec:spec_decode_acceptance_drift") == 0.0
    for i in range(3):  # every position is there from the start, at 0
        assert value(m, "specdec:spec_decode_num_accepted_tokens_per_pos_total", position=i) == 0.0
    assert ("specdec:spec_decode_num_accepted_tokens_per_pos_total", (("position", "3"),)) not in samples(m)
    assert value(m, "specdec:request_success_total", finish_reason="stop") == 0.0
    assert value(m, "specdec:request_success_total", finish_reason="length") == 0.0


def test_counters_and_histograms_after_rounds():
    m = ServerMetrics(max_k=4)
    m.on_round(3, drafted=[4, 4, 0], accepted=[4, 1, 0], emitted=[5, 2, 1])
    m.on_round(2, drafted=[3, 2], accepted=[0, 2], emitted=[1, 3])
    s = samples(m)
    assert s[("specdec:spec_decode_num_drafts_total", ())] == 4  # the sequence that drafted nothing is no draft
    assert s[("specdec:spec_decode_num_plain_rows_total", ())] == 1  # ... but a plain row
    assert s[("specdec:spec_decode_num_draft_tokens_total", ())] == 13
    assert s[("specdec:spec_decode_num_accepted_tokens_total", ())] == 7
    per_pos = [s[("specdec:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(i)),))]
               for i in range(4)]
    assert per_pos == [3, 2, 1, 1]
    # tokens_per_round saw 5, 2, 1, 1, 3
    assert s[("specdec:tokens_per_round_count", ())] == 5 and s[("specdec:tokens_per_round_sum", ())] == 12
    cum = {le: s[("specdec:tokens_per_round_bucket", (("le", le),))] for le in ("1.0", "2.0", "3.0", "4.0", "5.0")}
    assert cum == {"1.0": 2, "2.0": 3, "3.0": 4, "4.0": 4, "5.0": 5}
    assert s[("specdec:tokens_per_round_bucket", (("le", "17.0"),))] == 5
    # batch_size saw 3, 2
    assert s[("specdec:batch_size_count", ())] == 2 and s[("specdec:batch_size_sum", ())] == 5
    assert s[("specdec:batch_size_bucket", (("le", "2.0"),))] == 1
    assert s[("specdec:batch_size_bucket", (("le", "4.0"),))] == 2
    assert {dict(lbl)["le"] for (n, lbl) in s if n == "specdec:batch_size_bucket"} == {
        "1.0", "2.0", "4.0", "8.0", "16.0", "32.0", "64.0", "+Inf"}

    # the gauges, from per-token weights: a token counts 0.5 ** (drafted tokens since it / half-life)
    def ema(h):
        w = 0.5 ** (5 / h)  # the first round's 8 tokens are 5 drafted tokens old
        return (5 * w + 2) / (8 * w + 5)

    assert m.acceptance_rate == pytest.approx(ema(RATE_HALF_LIFE), rel=1e-12)
    assert s[("specdec:spec_decode_acceptance_rate", ())] == pytest.approx(ema(RATE_HALF_LIFE), rel=1e-12)
    assert s[("specdec:spec_decode_acceptance_drift", ())] == pytest.approx(ema(DRIFT_HALF_LIFE) - 7 / 13,
                                                                           abs=1e-12)


def test_batch_size_is_the_argument():
    m = ServerMetrics(max_k=4)
    m.on_round(40, [1, 1], [1, 0], [2, 1])
    assert value(m, "specdec:batch_size_sum") == 40
    assert value(m, "specdec:batch_size_bucket", le="32.0") == 0
    assert value(m, "specdec:batch_size_bucket", le="64.0") == 1


def test_a_round_without_drafts_leaves_the_rates_alone():
    m = ServerMetrics(max_k=4)
    m.on_round(1, [4], [3], [4])
    before = m.acceptance_rate
    m.on_round(2, [0, 0], [0, 0], [1, 1])
    assert m.acceptance_rate == before == 0.75
    assert value(m, "specdec:spec_decode_num_drafts_total") == 1
    assert value(m, "specdec:batch_size_count") == 2


def test_rate_and_drift_follow_a_change_at_their_half_lives():
    m = ServerMetrics(max_k=5)
    feed(m, 20000, 1.0)
    assert m.acceptance_rate == 1.0
    assert value(m, "specdec:spec_decode_acceptance_drift") == 0.0
    feed(m, int(DRIFT_HALF_LIFE), 0.0)  # one drift half-life of total rejection
    long_run = 20000 / (20000 + DRIFT_HALF_LIFE)
    assert value(m, "specdec:spec_decode_acceptance_drift") == pytest.approx(0.5 - long_run, abs=0.01)
    feed(m, int(RATE_HALF_LIFE - DRIFT_HALF_LIFE), 0.0)  # one rate half-life in all
    assert m.acceptance_rate == pytest.approx(0.5, abs=0.01)
    assert value(m, "specdec:spec_decode_acceptance_rate") == m.acceptance_rate


def test_drift_is_zero_when_steady_and_signed_when_acceptance_changes():
    m = ServerMetrics(max_k=5)
    feed(m, 3000, 0.6)
    assert value(m, "specdec:spec_decode_acceptance_drift") == pytest.approx(0.0, abs=1e-3)
    assert m.acceptance_rate == pytest.approx(0.6, abs=1e-3)
    feed(m, 200, 0.2)
    drop = value(m, "specdec:spec_decode_acceptance_drift")
    assert drop < -0.25  # recent ~0.2 + 0.4 * 0.25 = 0.3, long-run ~0.575
    rate_after_drop = m.acceptance_rate
    assert 0.3 < rate_after_drop < 0.6  # the slower average has moved, but less
    feed(m, 400, 1.0)
    assert value(m, "specdec:spec_decode_acceptance_drift") > 0.3
    assert m.acceptance_rate > rate_after_drop


def test_requests_latencies_and_queue():
    m = ServerMetrics(max_k=2)
    m.on_first_token(0.03)
    m.on_first_token(0.3)
    m.on_tokens([0.0, 0.0, 0.02])
    m.on_tokens([])
    m.on_finish("stop", 10, 4)
    m.on_finish("length", 5, 16, cached_tokens=4)
    m.on_finish("stop", 1, 1)
    m.on_finish("abort", 2, 0)
    m.set_queue(running=3, waiting=7)
    s = samples(m)
    assert s[("specdec:prefix_cache_hits_total", ())] == 4
    assert s[("specdec:time_to_first_token_seconds_count", ())] == 2
    assert s[("specdec:time_to_first_token_seconds_sum", ())] == pytest.approx(0.33)
    assert s[("specdec:time_to_first_token_seconds_bucket", (("le", "0.04"),))] == 1
    assert s[("specdec:inter_token_latency_seconds_count", ())] == 3
    assert s[("specdec:inter_token_latency_seconds_bucket", (("le", "0.0005"),))] == 2
    assert s[("specdec:request_success_total", (("finish_reason", "stop"),))] == 2
    assert s[("specdec:request_success_total", (("finish_reason", "length"),))] == 1
    assert s[("specdec:request_success_total", (("finish_reason", "abort"),))] == 1
    assert s[("specdec:prompt_tokens_total", ())] == 18
    assert s[("specdec:generation_tokens_total", ())] == 21
    assert (s[("specdec:num_requests_running", ())], s[("specdec:num_requests_waiting", ())]) == (3, 7)
    m.set_threads(1, 0.9)
    s = samples(m)
    assert (s[("specdec:threads", ())], s[("specdec:cpu_used_by_others", ())]) == (1, 0.9)
    m.set_queue(0, 0)
    assert value(m, "specdec:num_requests_running") == 0


@pytest.mark.parametrize(("drafted", "accepted", "emitted"), [
    ([3], [4], [5]),  # accepted more than drafted
    ([5], [1], [2]),  # drafted beyond max_k
    ([2], [-1], [1]),
    ([2], [1], [-1]),
    ([2, 2], [1], [2, 2]),  # lengths differ
    ([2], [1], [2, 1]),
])
def test_bad_rounds_raise_and_count_nothing(drafted, accepted, emitted):
    m = ServerMetrics(max_k=4)
    m.on_round(1, [2], [1], [2])
    before = samples(m)
    with pytest.raises(ValueError):
        m.on_round(len(drafted), drafted, accepted, emitted)
    assert samples(m) == before


def test_max_k_must_be_positive():
    with pytest.raises(ValueError):
        ServerMetrics(max_k=0)


def test_two_instances_do_not_collide():
    a, b = ServerMetrics(max_k=4), ServerMetrics(max_k=2)  # the same names twice: no "Duplicated timeseries"
    a.on_round(1, [4], [4], [5])
    a.on_finish("stop", 3, 5)
    b.on_round(1, [2], [0], [1])
    assert value(a, "specdec:spec_decode_num_accepted_tokens_total") == 4
    assert value(b, "specdec:spec_decode_num_accepted_tokens_total") == 0
    assert (a.acceptance_rate, b.acceptance_rate) == (1.0, 0.0)
    assert value(b, "specdec:request_success_total", finish_reason="stop") == 0
    assert ("specdec:spec_decode_num_accepted_tokens_per_pos_total", (("position", "3"),)) in samples(a)
    assert ("specdec:spec_decode_num_accepted_tokens_per_pos_total", (("position", "3"),)) not in samples(b)
    default = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "specdec:" not in default  # the process-wide registry is left alone
