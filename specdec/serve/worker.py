"""The engine side of the server: the step loop, the only code that touches the model. `specdec serve` runs it
on its main thread, where the model was loaded, with HTTP on a thread of its own (serve/cli.py says why); "the
engine thread" below is whichever thread runs it.

Requests arrive from the event loop through `submit` (which refuses at once when the queue is full) and leave
through `cancel` (a client that went away); each step's events go back to the request's own asyncio queue.
The thread sleeps while there is nothing to do.

The HTTP layer talks to this worker only (`context`, `kv_cache`, `new_sequence`, `submit`, `cancel`, `load`,
`state`, `metrics`), and the worker to the step loop only through `StepLoop`.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from specdec.engine.scheduler import Event, QueueFull, RoundCallback, RoundReport
from specdec.engine.sequence import GenerationConfig, Sequence
from specdec.errors import SpecdecError
from specdec.kernels.cores import sharing
from specdec.serve.live import LiveStats
from specdec.serve.metrics import ServerMetrics

__all__ = ["EngineWorker", "QueueFull", "StepLoop", "Ticket"]


class StepLoop(Protocol):
    """What the worker needs of the step loop (specdec.engine.scheduler.Scheduler)."""

    context: int  # tokens a sequence may hold, prompt included
    kv_cache: str  # the KV pool's type (models/kv_cache.py: f16, q8_0, q4_0)
    on_round: RoundCallback | None

    @property
    def idle(self) -> bool: ...

    @property
    def load(self) -> tuple[int, int]:
        """(sequences in slots, sequences queued)"""
        ...

    def new_sequence(self, prompt: list[int], cfg: GenerationConfig) -> Sequence: ...

    def check_queue(self, pending: int = 0) -> None:
        """QueueFull when the queue, with `pending` sequences more, is at its limit: the one rule."""
        ...

    def admit(self, seq: Sequence) -> None: ...

    def evict(self, seq: Sequence) -> None: ...

    def step(self) -> list[Event]: ...

    def state(self) -> dict: ...

    def audit(self) -> list[str]: ...

    def holds(self) -> set[int]:
        """id() of every sequence in a slot or the queue."""
        ...


@dataclass
class Ticket:
    """One request's line to the engine thread."""

    seq: Sequence
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # Event, or an Exception if the engine failed
    last_t: float | None = None  # when its previous tokens arrived (for inter-token latency)


def post(items: Iterable[tuple[Ticket, Event | Exception]]) -> None:
    """Hand each item to its ticket's queue: one wake-up of each event loop for all of a step's items, in order.
    call_soon_threadsafe writes to the loop's wake-up socket on every call: one call a request made a step cost
    the engine thread one system call (and on a busy machine, a switch to the HTTP thread) per stream a step."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Event | Exception]]] = {}
    for t, item in items:
        by_loop.setdefault(t.loop, []).append((t.events, item))
    for loop, batch in by_loop.items():
        loop.call_soon_threadsafe(_put_all, batch)


def _put_all(batch: list[tuple[asyncio.Queue, Event | Exception]]) -> None:
    for queue, item in batch:
        queue.put_nowait(item)


class EngineWorker:
    def __init__(self, scheduler: StepLoop, metrics: ServerMetrics, live: LiveStats | None = None):
        self._sched, self.metrics, self.live = scheduler, metrics, live
        self._lock = threading.Condition()
        self._inbox: list[Ticket] = []
        self._cancels: list[Sequence] = []
        self._tickets: dict[int, Ticket] = {}  # id(seq) -> ticket
        self._stop = False
        self._cancelled = 0  # requests whose client left before they finished
        self._state: dict = {}
        self._thread = threading.Thread(target=self._run, name="specdec-engine", daemon=True)
        scheduler.on_round = self._on_round
        self._publish()

    def start(self) -> None:
        """The step loop on a thread of its own (tests; `specdec serve` runs it on its main thread: run_here)."""
        self._thread.start()

    def run_here(self) -> None:
        """The step loop on the calling thread, until request_stop(). Passes are fastest on the thread that
        loaded the model (serve/cli.py serve_on_this_thread says why)."""
        self._run()

    def request_stop(self) -> None:
        """The step loop returns after the step it is in."""
        with self._lock:
            self._stop = True
            self._lock.notify()

    def stop(self, timeout: float = 10.0) -> None:
        self.request_stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- from the event loop -----------------------------------------------------------------------------

    @property
    def context(self) -> int:
        """Tokens a request may hold, prompt included."""
        return self._sched.context

    @property
    def kv_cache(self) -> str:
        """The KV cache type the model's keys and values are kept in (fixed at start)."""
        return self._sched.kv_cache

    def new_sequence(self, prompt: list[int], cfg: GenerationConfig) -> Sequence:
        """A request, ready to submit. (The step loop sets where its random stream lives; it reads no state
        the engine thread changes.)"""
        return self._sched.new_sequence(prompt, cfg)

    def submit(self, seq: Sequence, loop: asyncio.AbstractEventLoop) -> Ticket:
        """Hand a request to the engine thread; QueueFull at once when the queue is at its limit, requests in the
        inbox not yet taken counting as waiting."""
        ticket = Ticket(seq, loop)
        with self._lock:
            self._sched.check_queue(pending=len(self._inbox))
            self._inbox.append(ticket)
            self._lock.notify()
        return ticket

    def cancel(self, seq: Sequence) -> None:
        with self._lock:
            self._cancels.append(seq)
            self._lock.notify()

    @property
    def load(self) -> tuple[int, int]:
        """(running, waiting)"""
        with self._lock:
            running, waiting = self._sched.load
            return running, waiting + len(self._inbox)

    @property
    def state(self) -> dict:
        """The engine's bookkeeping as the engine thread last left it between steps (counts only, see _publish)."""
        state = self._state
        return {**state, "problems": list(state["problems"])}

    # --- the engine thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._stop and not self._inbox and not self._cancels and self._sched.idle:
                    self._lock.wait()
                if self._stop:
                    return
                # under the lock, so that submit() always counts every request not yet in a slot
                self._take_inbox()
                self._take_cancels()
            if self._sched.idle:
                self._publish()
                continue
            try:
                events = self._sched.step()
            except Exception as e:  # a bug: fail every request in flight rather than hang them
                traceback.print_exc()
                self._fail_all(e)
                self._publish()
                continue
            now = time.perf_counter()
            post(t for e in events if (t := self._deliver(e, now)) is not None)
            self._publish()
            self.metrics.set_queue(*self.load)

    def _take_inbox(self) -> None:
        for t in self._inbox:
            try:
                # the queue rule passes again: what submit() counted (waiting minus free slots) has only shrunk
                self._sched.admit(t.seq)
            except SpecdecError as e:  # cannot happen after the app's checks and submit(); never kill the thread
                t.loop.call_soon_threadsafe(t.events.put_nowait, e)
                continue
            self._tickets[id(t.seq)] = t
        self._inbox = []

    def _take_cancels(self) -> None:
        for seq in self._cancels:
            if self._tickets.pop(id(seq), None) is not None and seq.finish is None:
                self._cancelled += 1
                self.metrics.on_abort()
            self._sched.evict(seq)
        self._cancels = []

    def _publish(self) -> None:
        """The view behind `state`, taken on the engine thread between steps, where it is
        exact: every slot, queued sequence and open request accounted for, and `problems` lists what is not."""
        state = self._sched.state()
        live = self._sched.holds()
        problems = self._sched.audit()
        stray = sum(key not in live for key in self._tickets)
        if stray:
            problems.append(f"{stray} open request(s) with no sequence in a slot or the queue")
        share = sharing()
        self.metrics.set_threads(share.threads, share.others)
        state.update(requests_open=len(self._tickets), requests_cancelled=self._cancelled, problems=problems,
                     threads=share.threads)
        self._state = state

    def _on_round(self, r: RoundReport) -> None:
        self.metrics.on_round(len(r.rows), r.drafted, r.accepted, r.emitted)
        if self.live is not None:
            self.live.on_round(r)

    def _deliver(self, e: Event, now: float) -> tuple[Ticket, Event] | None:
        """Account for a step's event; the (ticket, event) to hand to its request's queue, if it still has one."""
        t = self._tickets.get(id(e.seq))
        if t is None:
            return None
        if e.tokens:
            if t.last_t is None:
                self.metrics.on_first_token(now - e.seq.t0)
                if self.live is not None:
                    self.live.on_first_token(now - e.seq.t0)
            else:
                self.metrics.on_tokens([now - t.last_t])
                if self.live is not None:
                    self.live.on_gap(now - t.last_t)
            t.last_t = now
        if e.finished:
            self._tickets.pop(id(e.seq), None)
            e.seq.stats.total_s = now - e.seq.t0
            e.seq.stats.generated_tokens = e.seq.num_generated
        return t, e

    def _fail_all(self, error: Exception) -> None:
        for t in self._tickets.values():
            self._sched.evict(t.seq)
        post((t, error) for t in self._tickets.values())
        self._tickets.clear()
