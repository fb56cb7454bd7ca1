"""The engine worker's hand-over of a step's events to the HTTP event loop (serve/worker.py), without a model:
a fake step loop emits the events and a fake event loop counts its wake-ups. Fast."""

from __future__ import annotations

import asyncio
import threading

from specdec.engine.scheduler import Event
from specdec.engine.sequence import GenerationConfig, Sequence
from specdec.serve.metrics import ServerMetrics
from specdec.serve.worker import EngineWorker, post


class _Loop:
    """Runs what is scheduled at once and counts the wake-ups (each call_soon_threadsafe is a write to the loop's
    wake-up socket in asyncio)."""

    def __init__(self):
        self.wakeups = 0

    def call_soon_threadsafe(self, fn, *args):
        self.wakeups += 1
        fn(*args)


class _Steps:
    """A step loop whose steps are given: each a list of (sequence, tokens, finished)."""

    context, on_round = 64, None

    def __init__(self, steps):
        self.steps, self.seqs = list(steps), []
        self.evicted: list[Sequence] = []

    @property
    def idle(self):
        return not self.steps

    @property
    def load(self):
        return len(self.seqs), 0

    def new_sequence(self, prompt, cfg):
        return Sequence(prompt, cfg)

    def check_queue(self, pending=0):
        pass

    def admit(self, seq):
        self.seqs.append(seq)

    def evict(self, seq):
        self.evicted.append(seq)

    def step(self):
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return [Event(s, tokens, ["target"] * len(tokens), done) for s, tokens, done in step]

    def state(self):
        return {"problems": []}

    def audit(self):
        return []

    def holds(self):
        return {id(s) for s in self.seqs}


def _drain(q: asyncio.Queue) -> list:
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return out


def _run(steps, n=3):
    """Submit n requests, run the worker through the steps on a thread, and return (loop, tickets, step loop)."""
    seqs = [Sequence([1, 2], GenerationConfig(max_new_tokens=8)) for _ in range(n)]
    sched = _Steps([[(seqs[i], tok, done) for i, tok, done in step] if isinstance(step, list) else step
                    for step in steps])
    worker, loop = EngineWorker(sched, ServerMetrics(n)), _Loop()
    tickets = [worker.submit(s, loop) for s in seqs]
    runner = threading.Thread(target=worker.run_here)
    runner.start()
    for _ in range(6000):  # the worker sleeps once the steps are done: stop it then (60 s: a hang)
        if sched.idle:
            break
        threading.Event().wait(0.01)
    worker.request_stop()
    runner.join(60)
    assert not runner.is_alive()
    return loop, tickets, sched


def test_a_step_wakes_the_event_loop_once_for_all_its_streams():
    """Three streams' events in one step reach their queues, in order, through one wake-up of the event loop: a
    wake-up a stream cost the engine thread a system call each (and a switch to the HTTP thread)."""
    steps = [[(0, [5], False), (1, [6, 7], False), (2, [8], False)],
             [(0, [9], True), (1, [10], False), (2, [11, 12], True)],
             [(1, [13], True)]]
    loop, tickets, _ = _run(steps)
    assert loop.wakeups == 3  # one a step, not one an event (7)
    got = [[e.tokens for e in _drain(t.events)] for t in tickets]
    assert got == [[[5], [9]], [[6, 7], [10], [13]], [[8], [11, 12]]]


def test_a_failing_step_fails_every_request_with_one_wake_up():
    steps = [[(0, [5], False), (1, [6], False)], RuntimeError("a bug")]
    loop, tickets, sched = _run(steps, n=2)
    assert loop.wakeups == 2
    for t in tickets:
        first, error = _drain(t.events)
        assert first.tokens and isinstance(error, RuntimeError)
    assert set(map(id, sched.evicted)) == {id(t.seq) for t in tickets}


def test_post_keeps_each_loops_items_apart_and_in_order():
    a, b = _Loop(), _Loop()
    seqs = [Sequence([1], GenerationConfig()) for _ in range(3)]
    from specdec.serve.worker import Ticket

    ta, tb, tc = Ticket(seqs[0], a), Ticket(seqs[1], b), Ticket(seqs[2], a)
    post([(ta, "x"), (tb, "y"), (tc, "z"), (ta, "w")])
    assert (a.wakeups, b.wakeups) == (1, 1)
    assert _drain(ta.events) == ["x", "w"] and _drain(tb.events) == ["y"] and _drain(tc.events) == ["z"]
    post([])
    assert (a.wakeups, b.wakeups) == (1, 1)
