"""One definition of each latency and rate measurement, shared by the engine's request stats, the local bench,
the endpoint bench and `specdec loadtest`, so that the same word means the same number everywhere.

Times are seconds since the request started. A "chunk" is a group of tokens that arrived at once: one round of
the engine, one streamed SSE event of a server, one group a Hugging Face streamer received together.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


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
