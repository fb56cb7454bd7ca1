"""Paced streaming (specdec.serve.pacing) on a simulated clock: every token leaves alone and in order, the gaps are
steady where the engine's bursts are not, the buffer stays bounded when generation outruns the pace, the first
token is not delayed and the last leaves within one interval of the engine's finish; and the async driver over a
request's event queue, including a client that leaves while tokens are buffered."""

from __future__ import annotations

import asyncio
import random
import statistics
from dataclasses import dataclass

import pytest

from specdec.errors import SpecdecError
from specdec.serve.pacing import BOUND, Pace, Pacer, RatePrior, paced, parse_pace


def rounds(n_tokens: int, seed: int, a: float = 0.6, k: int = 4, round_s: float = 0.05, jitter: float = 0.1):
    """An engine's events for one stream: the prompt's first token at t = 0, then a round every ~round_s seconds
    releasing 1 to k+1 tokens (each draft kept with probability a, given the earlier ones were)."""
    rng = random.Random(seed)
    events, t, tok = [(0.0, [0], n_tokens == 1)], 0.0, 1
    while tok < n_tokens:
        t += round_s * (1 + rng.uniform(-jitter, jitter))
        m = 1
        while m <= k and rng.random() < a:
            m += 1
        m = min(m, n_tokens - tok)
        events.append((t, list(range(tok, tok + m)), tok + m >= n_tokens))
        tok += m
    return events


def play(events, pace: Pace, shared: RatePrior | None = None):
    """Run a Pacer over the events on a simulated clock: [(time, token)] as released, and the deepest buffer."""
    pacer, out, i, now, deepest = Pacer(pace, shared), [], 0, 0.0, 0
    while not pacer.drained:
        due = pacer.due()
        if due is not None and (i == len(events) or due <= events[i][0]):
            now = max(now, due)
            released = pacer.pop(now)
            assert len(released) == 1  # a due token leaves alone
            out.append((now, released[0]))
        else:
            now, tokens, finished = events[i]
            pacer.push(tokens, now, finished)
            i += 1
        deepest = max(deepest, len(pacer.buffer))
    play.pacer = pacer  # the last one, for its tail and lag
    return out, deepest


def unpaced_gaps(events):
    """Inter-token gaps as an unpaced stream delivers them: each round's tokens at once."""
    times = [t for t, tokens, _ in events for _ in tokens]
    return [b - a for a, b in zip(times, times[1:])]


def ratio_p99_p50(gaps):
    s = sorted(gaps)
    return s[min(len(s) - 1, int(0.99 * len(s)))] / max(s[len(s) // 2], 1e-9)


def test_order_first_token_and_last_token():
    for seed in range(5):
        events = rounds(128, seed)
        out, _ = play(events, Pace("auto"))
        assert [tok for _, tok in out] == list(range(128))  # every token once, in order
        assert out[0][0] == 0.0  # the first token is not held: time to first token unchanged
        finish = events[-1][0]
        interval = (finish - events[1][0]) / 127 * 2  # generous: twice the stream's mean time per token
        assert out[-1][0] - finish <= interval  # the last leaves within one interval of the engine's finish
        p = play.pacer
        assert p.tail_s == pytest.approx(out[-1][0] - finish) and p.finished_at == finish
        lags = [t - next(te for te, toks, _ in events if tok in toks) for t, tok in out]
        assert p.mean_lag_s == pytest.approx(sum(lags) / len(lags)) and p.mean_lag_s > 0


def test_gaps_are_steady_where_rounds_are_bursty():
    """Pooled over 20 streams of 256 tokens (a = 0.6, k = 4): the paced gaps' p99/p50 and coefficient of variation
    are small, and the same measures of the unpaced stream are not (so the test can tell the two apart)."""
    paced_gaps, raw = [], []
    shared = RatePrior()
    for seed in range(20):
        events = rounds(256, seed)
        out, _ = play(events, Pace("auto"), shared)
        times = [t for t, _ in out]
        paced_gaps += [b - a for a, b in zip(times[2:], times[3:-8])]  # the pace's own (not the first round's wait)
        raw += unpaced_gaps(events)[2:-8]
    cv = statistics.pstdev(paced_gaps) / statistics.mean(paced_gaps)
    raw_cv = statistics.pstdev(raw) / statistics.mean(raw)
    assert ratio_p99_p50(paced_gaps) <= 2.0 and cv <= 0.35, (ratio_p99_p50(paced_gaps), cv)
    assert raw_cv > 1.0 and ratio_p99_p50(raw) > 100  # bursts: most gaps are 0 inside a round


def test_never_slower_than_generation():
    """A fixed pace far slower than generation (200 ms a token, while the engine makes ~40 a second): the
    buffer stays bounded and the stream ends soon after the engine does."""
    events = rounds(400, 3)
    out, deepest = play(events, Pace("fixed", 0.2))
    per_event = 400 / len(events)
    assert deepest <= (BOUND + 2) * per_event + 6, deepest
    finish = events[-1][0]
    assert out[-1][0] - finish < 0.2  # not 400 x 200 ms
    assert [tok for _, tok in out] == list(range(400))


def test_fixed_pace_when_generation_keeps_up():
    """A 60 ms pace over generation a little faster (a token every 50 ms): the gaps hold at 60 ms while the buffer
    fills, then follow generation once the buffer passes its bound, never slower than it."""
    events = rounds(60, 1, a=0.0, round_s=0.05)
    out, deepest = play(events, Pace("fixed", 0.06))
    gaps = [b[0] - a[0] for a, b in zip(out[1:], out[2:])]
    assert gaps[:20] == pytest.approx([0.06] * 20)
    assert all(g <= 0.06 + 1e-9 for g in gaps) and deepest <= BOUND + 2


def test_parse_pace():
    assert parse_pace("auto") == Pace("auto") and parse_pace("OFF") == Pace("off")
    assert parse_pace("25") == Pace("fixed", 0.025) and parse_pace(12.5) == Pace("fixed", 0.0125)
    for bad in ("0", "-5", "fast", "nan", "inf", "10001", True, None, [], ""):
        with pytest.raises(SpecdecError, match="'off', 'auto' or milliseconds"):
            parse_pace(bad)


@dataclass
class Ev:
    tokens: list[int]
    finished: bool


def test_driver_releases_one_token_at_a_time_and_passes_errors():
    async def main():
        q: asyncio.Queue = asyncio.Queue()
        q.put_nowait(Ev([1], False))
        q.put_nowait(Ev([2, 3, 4], False))
        q.put_nowait(Ev([5, 6], True))
        drained = []
        got = [e async for e in paced(q, Pace("fixed", 0.001), on_drained=drained.append)]
        assert got == [([t], t == 6) for t in range(1, 7)]  # one at a time; the last one carries the finish
        assert len(drained) == 1 and drained[0].drained and drained[0].tail_s >= 0
        q.put_nowait(Ev([1], False))
        q.put_nowait(Ev([], True))  # a finish with no tokens (the engine's last event may be empty)
        assert [e async for e in paced(q, Pace("auto"))] == [([1], False), ([], True)]
        off = asyncio.Queue()
        off.put_nowait(Ev([1, 2], False))
        off.put_nowait(Ev([3], True))
        assert [e async for e in paced(off, Pace("off"))] == [([1, 2], False), ([3], True)]
        err = asyncio.Queue()
        err.put_nowait(Ev([1], False))
        boom = RuntimeError("engine failed")
        err.put_nowait(boom)
        got = [e async for e in paced(err, Pace("auto"))]
        assert got[-1] is boom

    asyncio.run(main())


def test_a_consumer_that_leaves_while_tokens_are_buffered_stops_at_once():
    """The stream's task is cancelled (its client left) while the pacer holds tokens: the cancellation reaches
    the consumer at once, not after the buffer drains (the app frees the slot in its `finally`)."""

    async def main():
        q: asyncio.Queue = asyncio.Queue()
        q.put_nowait(Ev([0], False))
        q.put_nowait(Ev(list(range(1, 40)), False))  # a lot buffered; the engine has not finished
        freed = asyncio.Event()

        async def consume():
            try:
                async for _ in paced(q, Pace("fixed", 1.0)):  # one token a second: the buffer would take ages
                    pass
            finally:
                freed.set()

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        assert not freed.is_set()  # the consumer took the first token and waits on the pace
        task.cancel()
        # "at once" counted in turns of the event loop, not timed: draining the buffer would take 39 s of pace
        for _ in range(20):  # it takes 4 on Python 3.11
            await asyncio.sleep(0)
            if freed.is_set():
                break
        assert freed.is_set() and task.cancelled()

    asyncio.run(main())
