"""One definition of each latency and rate measurement, shared by the engine's request stats, the local bench,
the endpoint bench and `specdec loadtest`, so that the same word means the same number everywhere.

Times are seconds since the request started. A "chunk" is a group of tokens that arrived at once: one round of
the engine, one streamed SSE event of a server, one group a Hugging Face streamer received together.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def percentile(xs: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), interpolating linearly between order statistics (numpy's default)."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def acceptance(accepted: float, drafted: float) -> float | None:
    """The acceptance rate: accepted / drafted tokens, None when nothing was drafted (never 0.0: no draft is not a
    rejected one). Every place that reports acceptance reads it here."""
    return accepted / drafted if drafted > 0 else None


@dataclass(frozen=True)
class Decay:
    """The one moving average in specdec, named by its half-life: each unit of new evidence (a drafted token, a
    judged draft, a round, a stream's event) takes `weight` of the average, and what came before keeps the rest, so
    that evidence `half_life` units old weighs half. Decayed sums (`keep`) and running averages (`mix`) both follow
    it: the acceptance gauges, the policy's confidence calibration, drafting and pass costs, the stream pacer."""

    weight: float

    def __post_init__(self) -> None:
        if not 0 < self.weight < 1:
            raise ValueError(f"a moving average's weight is in (0, 1), not {self.weight}")

    @classmethod
    def with_half_life(cls, units: float) -> Decay:
        return cls(1 - 0.5 ** (1 / units))

    @property
    def half_life(self) -> float:
        return math.log(0.5) / math.log(1 - self.weight)

    def keep(self, units: float = 1) -> float:
        """The share of a decayed sum that `units` of new evidence leave to what came before."""
        return (1 - self.weight) ** units

    def mix(self, old: float, new: float, weight: float | None = None) -> float:
        """A running average's next value: `new` taking `weight` (the decay's own unless a warm-up gives more)."""
        w = self.weight if weight is None else weight
        return (1 - w) * old + w * new


def ratio_of_means(num: Sequence[float], den: Sequence[float]) -> float | None:
    m, d = mean(num), mean(den)
    return m / d if m is not None and d else None


def inter_token_latencies(times: Sequence[float]) -> list[float]:
    """Gaps between consecutive arrivals of one generation: per token (0 inside a burst), or per streamed chunk
    when only chunk times are known."""
    return [b - a for a, b in zip(times, times[1:])]


def tokens_per_s(tokens: int, seconds: float) -> float:
    """End to end: generated tokens over the time from the request to the last token (prefill included)."""
    return tokens / seconds if seconds > 0 else 0.0


def decode_tokens_per_s(tokens: int, total_s: float, ttft_s: float) -> float | None:
    """The decode phase: tokens after the first over the time after the first (prefill excluded). None when
    there is no decode phase to time."""
    seconds = total_s - ttft_s
    return (tokens - 1) / seconds if tokens > 1 and seconds > 0 else None


def time_per_output_token(tokens: int, total_s: float, ttft_s: float) -> float | None:
    """TPOT: the inverse of the decode rate, (E2E - TTFT) / (tokens - 1)."""
    rate = decode_tokens_per_s(tokens, total_s, ttft_s)
    return 1.0 / rate if rate else None


def tokens_per_pass(emitted: int, passes: int) -> float | None:
    """Generated tokens per target pass after the prefill (or per streamed chunk, where passes are not seen)."""
    return emitted / passes if passes else None
