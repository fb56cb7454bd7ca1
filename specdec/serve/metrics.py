"""Prometheus metrics of a server, named like vLLM's (prefix "specdec:" for "vllm:") so dashboards carry over.

Each ServerMetrics owns its CollectorRegistry: several servers (or tests) in one process never collide, and the
process-wide default registry is left alone.

Vocabulary as in specdec.engine.stats: per round, each running sequence drafts k tokens, the target accepts a
prefix of them, and the round emits the accepted tokens plus the target's own (fewer when a stop cuts it).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specdec.engine.stats import DecayedRate

RATE_HALF_LIFE = 500.0  # drafted tokens: the acceptance-rate gauge forgets half its weight over this many
DRIFT_HALF_LIFE = 100.0  # drafted tokens: the "recent" side of the drift gauge

# seconds; fine at the low end, where a small model's prefill and per-token gaps live
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 10.0)
TOKENS_PER_ROUND_BUCKETS = tuple(range(1, 18))
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class ServerMetrics:
    """The server's Prometheus metrics, fed by a few calls (on_round, on_first_token, ...); render() exposes them."""

    def __init__(self, max_k: int):
        if max_k < 1:
            raise ValueError(f"max_k must be >= 1, got {max_k}")
        self.max_k = max_k
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()  # guards the moving averages and totals below
        self._rate = DecayedRate(RATE_HALF_LIFE)
        self._recent = DecayedRate(DRIFT_HALF_LIFE)
        self._drafted = 0  # since start: the long-run rate of the drift gauge
        self._accepted = 0
        r = self.registry

        # prometheus_client appends "_total" to a counter's name: these are exposed as "..._total"
        self.num_drafts = Counter("specdec:spec_decode_num_drafts",
                                  "Rounds in which a sequence drafted at least one token.", registry=r)
        self.num_plain_rows = Counter("specdec:spec_decode_num_plain_rows",
                                      "Rounds in which a sequence verified no draft: the policy chose k = 0 for it, "
                                      "or there was nothing to draft.", registry=r)
        self.num_draft_tokens = Counter("specdec:spec_decode_num_draft_tokens", "Draft tokens proposed.",
                                        registry=r)
        self.num_accepted_tokens = Counter("specdec:spec_decode_num_accepted_tokens",
                                           "Draft tokens accepted by the target.", registry=r)
        self.num_accepted_tokens_per_pos = Counter(
            "specdec:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each draft position (0-based).", ["position"], registry=r)
        for i in range(max_k):  # present (at 0) from the start, so rate() works on every position
            self.num_accepted_tokens_per_pos.labels(position=str(i))

        self.acceptance_rate_gauge = Gauge(
            "specdec:spec_decode_acceptance_rate",
            f"Acceptance rate, moving average over drafted tokens (half-life {RATE_HALF_LIFE:g}); NaN before data.",
            registry=r)
        self.acceptance_rate_gauge.set(math.nan)
        self.acceptance_drift = Gauge(
            "specdec:spec_decode_acceptance_drift",
            f"Recent acceptance rate (half-life {DRIFT_HALF_LIFE:g} drafted tokens) minus the rate since start.",
            registry=r)
        self.num_requests_running = Gauge("specdec:num_requests_running", "Requests being decoded.", registry=r)
        self.num_requests_waiting = Gauge("specdec:num_requests_waiting", "Requests queued.", registry=r)
        self.threads = Gauge("specdec:threads", "Threads a pass runs on now: fewer while other processes use this "
                                                "server's CPUs.", registry=r)
        self.cpu_others = Gauge("specdec:cpu_used_by_others", "CPUs' worth of this server's CPUs that other "
                                                              "processes used over the last look.", registry=r)

        self.time_to_first_token = Histogram("specdec:time_to_first_token_seconds",
                                             "Time from arrival to the first generated token.",
                                             buckets=TTFT_BUCKETS, registry=r)
        self.inter_token_latency = Histogram(
            "specdec:inter_token_latency_seconds",
            "Gap between a request's consecutive rounds that emitted tokens (one per round).", buckets=ITL_BUCKETS,
            registry=r)
        self.tokens_per_round = Histogram("specdec:tokens_per_round",
                                          "Tokens a sequence emitted per target pass (accepted + 1, unless cut).",
                                          buckets=TOKENS_PER_ROUND_BUCKETS, registry=r)
        self.batch_size = Histogram("specdec:batch_size", "Sequences in a round.", buckets=BATCH_SIZE_BUCKETS,
                                    registry=r)

        self.pace_tail = Histogram("specdec:stream_pace_tail_seconds",
                                   "Paced streams: from the engine's last token to the stream's last chunk (what "
                                   "pacing adds to end-to-end time).", buckets=ITL_BUCKETS, registry=r)
        self.pace_lag = Histogram("specdec:stream_pace_lag_seconds",
                                  "Paced streams: how long a token waited in the pacing buffer, the stream's mean "
                                  "(how far the text trails generation).", buckets=ITL_BUCKETS, registry=r)

        self.request_success = Counter("specdec:request_success", "Finished requests, by finish reason.",
                                       ["finish_reason"], registry=r)
        for reason in ("stop", "length"):
            self.request_success.labels(finish_reason=reason)
        self.prompt_tokens = Counter("specdec:prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.generation_tokens = Counter("specdec:generation_tokens", "Generated tokens of finished requests.",
                                         registry=r)
        self.prefix_cache_hits = Counter("specdec:prefix_cache_hits",
                                         "Prompt tokens of finished requests served by the prefix cache.", registry=r)

    def on_round(self, batch_size: int, drafted: Sequence[int], accepted: Sequence[int],
                 emitted: Sequence[int]) -> None:
        """One decode round; the lists have one entry per running sequence: tokens drafted, accepted, emitted."""
        if not len(drafted) == len(accepted) == len(emitted):
            raise ValueError(f"drafted, accepted, emitted differ in length: {len(drafted)}, {len(accepted)}, "
                             f"{len(emitted)}")
        for d, a, e in zip(drafted, accepted, emitted):
            if not (0 <= a <= d <= self.max_k and e >= 0):
                raise ValueError(f"need 0 <= accepted <= drafted <= max_k={self.max_k} and emitted >= 0; "
                                 f"got drafted={d}, accepted={a}, emitted={e}")
        self.batch_size.observe(batch_size)
        for d, a, e in zip(drafted, accepted, emitted):
            if d > 0:
                self.num_drafts.inc()
            else:
                self.num_plain_rows.inc()
            for i in range(a):
                self.num_accepted_tokens_per_pos.labels(position=str(i)).inc()
            self.tokens_per_round.observe(e)
        n_drafted, n_accepted = sum(drafted), sum(accepted)
        self.num_draft_tokens.inc(n_drafted)
        self.num_accepted_tokens.inc(n_accepted)
        if n_drafted == 0:
            return
        with self._lock:
            self._rate.update(n_accepted, n_drafted)
            self._recent.update(n_accepted, n_drafted)
            self._drafted += n_drafted
            self._accepted += n_accepted
            self.acceptance_rate_gauge.set(self._rate.value)
            self.acceptance_drift.set(self._recent.value - self._accepted / self._drafted)

    def on_first_token(self, seconds: float) -> None:
        self.time_to_first_token.observe(seconds)

    def on_tokens(self, gaps: Sequence[float]) -> None:
        """Gaps in seconds between a request's consecutive rounds that emitted tokens: one gap per round, however
        many tokens it emitted (as vLLM counts per engine step). What a client sees of a paced stream is per token."""
        for g in gaps:
            self.inter_token_latency.observe(g)

    def on_paced(self, tail_s: float, mean_lag_s: float) -> None:
        """A paced stream that released its last token."""
        self.pace_tail.observe(tail_s)
        self.pace_lag.observe(mean_lag_s)

    def on_finish(self, finish_reason: str, prompt_tokens: int, completion_tokens: int,
                  cached_tokens: int = 0) -> None:
        self.request_success.labels(finish_reason=finish_reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.prefix_cache_hits.inc(cached_tokens)
        self.generation_tokens.inc(completion_tokens)

    def set_queue(self, running: int, waiting: int) -> None:
        self.num_requests_running.set(running)
        self.num_requests_waiting.set(waiting)

    def set_threads(self, threads: int, others: float) -> None:
        self.threads.set(threads)
        self.cpu_others.set(others)

    def on_abort(self) -> None:
        """A request whose client left before it finished (counted as vLLM does, finish reason "abort")."""
        self.request_success.labels(finish_reason="abort").inc()

    def value(self, name: str, **labels: str) -> float:
        """One exported sample's value as /metrics shows it (0 for a series not yet present)."""
        v = self.registry.get_sample_value(name, labels or None)
        return 0.0 if v is None else v

    @property
    def acceptance_rate(self) -> float | None:
        """The moving-average acceptance rate the gauge shows; None before anything was drafted."""
        with self._lock:
            return self._rate.value

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type, for GET /metrics.

        Without prometheus_client's "<name>_created" series (start timestamps, exposed as extra gauge families):
        vLLM's dashboards do not use them, and switching them off globally would reach other registries."""
        return generate_latest(_WithoutCreated(self.registry)), CONTENT_TYPE_LATEST


class _WithoutCreated:
    """A collector that passes on a registry's families minus their "_created" samples."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def collect(self):
        for family in self.registry.collect():  # fresh Metric objects on every collect(): safe to edit
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family
