"""Paced streaming: a stream's tokens leave one at a time at a steady pace, not in the bursts rounds make.

A speculative round releases 1 to k+1 tokens at once, so an unpaced stream arrives in bursts: uneven to read, and
the burst sizes (visible as record lengths even through TLS) tell an observer how many drafts each round kept,
which leaks what is being generated. A Pacer buffers what the engine emits and releases one token per interval:

- the interval follows the rate the stream has been producing tokens at (seconds between the engine's events over
  tokens per event, each an exponential moving average), or a fixed interval (`--pace MS`);
- the buffer is held near TARGET events' worth of tokens: the pace slows a little (at most by GAIN) while the
  buffer holds less and quickens while it holds more, so it is never slower than generation: past BOUND events'
  worth the interval shrinks in proportion, and the buffer cannot grow without bound;
- the first token leaves at once (time to first token unchanged); the next waits until START events' worth is
  buffered (or the engine has finished), so the pace does not start on an empty buffer; once the engine has
  finished, what is left leaves within one interval (the last token is never held back longer).

The Pacer is pure (times are passed in), so its steadiness is tested on a simulated clock; `paced` drives it
from a request's event queue.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from specdec.errors import SpecdecError
from specdec.measure import Decay

PACE_MODES = ("off", "auto")
MAX_PACE_MS = 10_000.0
# the seconds between events and the tokens per event: a moving average (measure.Decay), half-life 34 events
EVENT_DECAY = Decay(0.02)
TARGET = 12.0  # events' worth of tokens the buffer is held near
GAIN = 0.5  # the interval stretches by up to this share while the buffer holds less than TARGET
EASE = 0.05  # ... and shrinks by up to this share as it fills from TARGET to BOUND
START = 1.0  # events' worth of tokens buffered after the first token before the pace starts
BOUND = 24.0  # past this many events' worth of tokens buffered, the interval shrinks in proportion


@dataclass(frozen=True)
class Pace:
    """How a stream is paced: off, auto (the stream's own rate) or a fixed interval."""

    mode: str = "auto"  # "off" | "auto" | "fixed"
    interval_s: float | None = None  # fixed only

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def __str__(self) -> str:
        return f"{self.interval_s * 1000:g} ms" if self.mode == "fixed" else self.mode


def parse_pace(value: object, where: str = "--pace") -> Pace:
    """'off', 'auto', or milliseconds between tokens (a number in (0, 10000]); SpecdecError otherwise."""
    if isinstance(value, str) and value.strip().lower() in PACE_MODES:
        return Pace(value.strip().lower())
    try:
        ms = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        ms = math.nan
    if not (0 < ms <= MAX_PACE_MS):
        raise SpecdecError(f"{where} must be 'off', 'auto' or milliseconds between tokens in (0, "
                           f"{MAX_PACE_MS:g}], got {value!r}")
    return Pace("fixed", ms / 1000)


class RatePrior:
    """The server's streams' rate so far (the same EMAs over every stream's events), which a new stream starts
    from: a stream's own first events are few, and a pace started from them would wander."""

    def __init__(self):
        self.gap_s: float | None = None
        self.per_event: float | None = None

    def update(self, dt: float, n: float) -> None:
        self.gap_s = dt if self.gap_s is None else EVENT_DECAY.mix(self.gap_s, dt)
        self.per_event = n if self.per_event is None else EVENT_DECAY.mix(self.per_event, n)

    def value(self) -> tuple[float, float] | None:
        return None if self.gap_s is None else (self.gap_s, self.per_event)


class Pacer:
    """One stream's buffer. push() what the engine emitted, then release what due() says is due with pop()."""

    def __init__(self, pace: Pace, shared: RatePrior | None = None):
        """shared: the server's streams' rate, which a new stream starts from (worth 1 / EVENT_DECAY.weight of its own
        events) and which its events update."""
        if not pace.on:
            raise ValueError("an off pace needs no pacer")
        self.pace = pace
        self.buffer: deque[int] = deque()
        self._arrived: deque[float] = deque()  # when each buffered token came from the engine
        self.finished = False
        self.finished_at: float | None = None  # when the engine's last event came
        self.lag_s = 0.0  # summed over released tokens: release time minus arrival (how far the text trails)
        # EMAs: seconds between the engine's events for this stream, and tokens per event
        self.shared = shared
        prior = shared.value() if shared is not None else None
        self.gap_s, self.per_event = prior if prior is not None else (None, None)
        self._last_event: float | None = None
        self._released = 0
        self._events = 0 if prior is None else round(1 / EVENT_DECAY.weight)  # events averaged (after the first)
        self._last_release: float | None = None
        self._final_interval: float | None = None  # once finished: what is left leaves within one interval

    def push(self, tokens: list[int], now: float, finished: bool = False) -> None:
        if tokens:
            if self._last_event is not None:  # the first event (the prompt's first token) starts the clock
                self._events += 1
                w = max(EVENT_DECAY.weight, 1.0 / self._events)  # a plain mean until it has enough events
                dt, n = now - self._last_event, float(len(tokens))
                self.gap_s = dt if self.gap_s is None else EVENT_DECAY.mix(self.gap_s, dt, w)
                self.per_event = n if self.per_event is None else EVENT_DECAY.mix(self.per_event, n, w)
                if self.shared is not None:
                    self.shared.update(dt, n)
            self._last_event = now
            self.buffer.extend(tokens)
            self._arrived.extend([now] * len(tokens))
        if finished and not self.finished:
            self.finished, self.finished_at = True, now
            if self.buffer:
                self._final_interval = self.interval() / len(self.buffer)

    @property
    def drained(self) -> bool:
        """The engine has finished and every token has left."""
        return self.finished and not self.buffer

    def produced(self) -> float:
        """Seconds per token the stream has been producing at (0 before its rate is known)."""
        if self.gap_s is None or not self.per_event:
            return 0.0  # no rate yet: the first tokens go as they come
        return self.gap_s / self.per_event

    def interval(self) -> float:
        """Seconds between releases: the fixed pace, or the rate the stream is producing at."""
        return self.pace.interval_s if self.pace.mode == "fixed" else self.produced()

    def _spacing(self) -> float:
        """This release's interval. auto: the production interval, stretched while the buffer holds less than
        TARGET events' worth and shrunk while it holds more. Either mode, past BOUND events' worth buffered: the
        production interval shrunk in proportion, so that the buffer stays bounded."""
        event = max(1.0, self.per_event or 1.0)
        fill = len(self.buffer) / event  # events' worth
        if fill > BOUND:
            return min(self.interval(), self.produced()) * BOUND / fill
        if self.pace.mode == "fixed":
            return self.interval()
        if fill < TARGET:
            return self.produced() * (1.0 + GAIN * (TARGET - fill) / TARGET)
        return self.produced() * (1.0 - EASE * min(1.0, (fill - TARGET) / (BOUND - TARGET)))

    def due(self) -> float | None:
        """When the next token may leave (None: nothing buffered)."""
        if not self.buffer:
            return None
        if self._last_release is None:
            return -math.inf  # the first token: at once
        if self._released == 1 and not self.finished and len(self.buffer) < START * max(1.0, self.per_event or 1.0):
            return None  # after the first token, a few events' worth is buffered before the pace starts
        if self._final_interval is not None:
            return self._last_release + min(self._final_interval, self._spacing())
        return self._last_release + self._spacing()

    def pop(self, now: float) -> list[int]:
        """The token due by `now` (at most one), or nothing."""
        due = self.due()
        if due is None or due > now:
            return []
        # a release that was late (the buffer ran dry) restarts the spacing from now, not from when it was due
        self._last_release = now
        self._released += 1
        self.lag_s += now - self._arrived.popleft()
        return [self.buffer.popleft()]

    @property
    def tail_s(self) -> float:
        """Once drained: how long after the engine's last event the last token left (what pacing added to the
        stream's end-to-end time)."""
        if self.finished_at is None or self._last_release is None:
            return 0.0
        return max(0.0, self._last_release - self.finished_at)

    @property
    def mean_lag_s(self) -> float:
        """Mean over released tokens of how long each waited in the buffer."""
        return self.lag_s / self._released if self._released else 0.0


async def paced(events: asyncio.Queue, pace: Pace, shared: RatePrior | None = None,
                clock: Callable[[], float] = time.perf_counter,
                on_drained: Callable[[Pacer], None] | None = None) -> AsyncIterator[tuple[list[int], bool] | Exception]:
    """A request's events as (tokens, finished), one token at a time at the pace (as the engine sent them when
    off); an Exception from the engine is passed on and ends the stream. on_drained(pacer): once a paced stream
    has released its last token (its tail_s and mean_lag_s are final)."""
    if not pace.on:
        while True:
            e = await events.get()
            if isinstance(e, Exception):
                yield e
                return
            yield e.tokens, e.finished
            if e.finished:
                return
    pacer = Pacer(pace, shared)
    while True:
        due = pacer.due()
        now = clock()
        if due is not None and due <= now:
            tokens = pacer.pop(now)
            if pacer.drained and on_drained is not None:
                on_drained(pacer)
            yield tokens, pacer.drained  # the last token carries the finish (a stop string is cut with it)
            if pacer.drained:
                return
            continue
        if pacer.drained:  # the engine finished with nothing left to release
            if on_drained is not None:
                on_drained(pacer)
            yield [], True
            return
        try:
            e = await (asyncio.wait_for(events.get(), due - now) if due is not None else events.get())
        except asyncio.TimeoutError:
            continue
        if isinstance(e, Exception):
            yield e
            return
        pacer.push(e.tokens, clock(), e.finished)
