"""The engine thread of the server: it owns the step loop and is the only code that touches the model.

Requests arrive from the event loop through `submit` (which refuses at once when the queue is full) and leave
through `cancel` (a client that went away); each step's events go back to the request's own asyncio queue.
The thread sleeps while there is nothing to do.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from dataclasses import dataclass, field

from specdec.engine.scheduler import Event, QueueFull, Scheduler
from specdec.engine.sequence import Sequence
from specdec.errors import SpecdecError
from specdec.serve.metrics import ServerMetrics


@dataclass
class Ticket:
    """One request's line to the engine thread."""

    seq: Sequence
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # Event, or an Exception if the engine failed
    last_t: float | None = None  # when its previous tokens arrived (for inter-token latency)


class EngineWorker:
    def __init__(self, scheduler: Scheduler, metrics: ServerMetrics):
        self.sched, self.metrics = scheduler, metrics
        self._lock = threading.Condition()
        self._inbox: list[Ticket] = []
        self._cancels: list[Sequence] = []
        self._tickets: dict[int, Ticket] = {}  # id(seq) -> ticket
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="specdec-engine", daemon=True)
        scheduler.on_round = lambda rows, drafted, accepted, emitted: metrics.on_round(
            len(rows), drafted, accepted, emitted)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        self._thread.join(timeout)

    # --- from the event loop -----------------------------------------------------------------------------

    def submit(self, seq: Sequence, loop: asyncio.AbstractEventLoop) -> Ticket:
        ticket = Ticket(seq, loop)
        with self._lock:
            limit = self.sched.cfg.max_queue
            free = sum(s is None for s in self.sched.slots)
            waiting = self.sched.num_waiting + len(self._inbox)
            if limit is not None and waiting - free >= limit:
                raise QueueFull(f"the server is at capacity ({limit} requests waiting); retry later")
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
            running = sum(s is not None for s in self.sched.slots)
            return running, self.sched.num_waiting + len(self._inbox)

    # --- the engine thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._stop and not self._inbox and not self._cancels and self.sched.idle:
                    self._lock.wait()
                if self._stop:
                    return
                # under the lock, so that submit() always counts every request not yet in a slot
                for t in self._inbox:
                    try:
                        self.sched.admit(t.seq, check_queue=False)  # submit() decided, with the same limit
                    except SpecdecError as e:  # cannot happen after the app's checks; never kill the thread
                        t.loop.call_soon_threadsafe(t.events.put_nowait, e)
                        continue
                    self._tickets[id(t.seq)] = t
                self._inbox = []
                for seq in self._cancels:
                    self.sched.evict(seq)
                    self._tickets.pop(id(seq), None)
                self._cancels = []
            if self.sched.idle:
                continue
            try:
                events = self.sched.step()
            except Exception as e:  # a bug: fail every request in flight rather than hang them
                traceback.print_exc()
                self._fail_all(e)
                continue
            now = time.perf_counter()
            for e in events:
                self._deliver(e, now)
            self.metrics.set_queue(*self.load)

    def _deliver(self, e: Event, now: float) -> None:
        t = self._tickets.get(id(e.seq))
        if t is None:
            return
        if e.tokens:
            if t.last_t is None:
                self.metrics.on_first_token(now - e.seq.t0)
            else:
                self.metrics.on_tokens([now - t.last_t])
            t.last_t = now
        if e.finished:
            self._tickets.pop(id(e.seq), None)
            e.seq.stats.total_s = now - e.seq.t0
            e.seq.stats.generated_tokens = e.seq.num_generated
        t.loop.call_soon_threadsafe(t.events.put_nowait, e)

    def _fail_all(self, error: Exception) -> None:
        for t in list(self._tickets.values()):
            self.sched.evict(t.seq)
            t.loop.call_soon_threadsafe(t.events.put_nowait, error)
        self._tickets.clear()
