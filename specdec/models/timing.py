"""Timing a model's passes: a pass over n rows after a context, primed and ready to time, and the ways of timing
them so that a burst of other load on a shared machine meets every width (or both models) alike. The path choice at
load (models/path_choice.py), the pass-cost profile (engine/calibrate.py) and every benchmark time passes here."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from specdec.errors import SpecdecError

Tick = Callable[[], None]


def primed(model, context: int, rows: Sequence[int]):
    """A pass over n rows after `context` cached tokens, for each n in rows, ready to time: n -> a function that
    runs it (the cache prefilled with random tokens, every pass rewriting the same positions; warmed up)."""
    limit = model.cfg.max_position_embeddings
    if context < 1 or context + max(rows) > limit:
        raise SpecdecError(f"context {context} + {max(rows)} rows does not fit the model's {limit} positions")
    g = torch.Generator().manual_seed(0)
    vocab = model.cfg.vocab_size
    cache = model.new_cache(1, context + max(rows) + 1)
    model.forward(torch.randint(0, vocab, (1, context), generator=g), torch.zeros(1, dtype=torch.long), cache,
                  last_only=torch.tensor([context - 1]), prefill=True)
    start = torch.tensor([context])
    toks = {n: torch.randint(0, vocab, (1, n), generator=g) for n in rows}  # [1, n] each
    run = {n: (lambda t=toks[n]: model.forward(t, start, cache)) for n in rows}
    for n in (rows[0], rows[-1]):  # warm-up
        run[n]()
    return run


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_passes(model, context: int, rows: Sequence[int], reps: int, tick: Tick = lambda: None) -> dict[int, list]:
    """Seconds of target passes over n rows after `context` cached tokens, reps times per n (rep-major,
    alternating direction, so that drift spreads over every n)."""
    run = primed(model, context, rows)
    times: dict[int, list] = {n: [] for n in rows}
    for rep in range(reps):
        for n in (rows if rep % 2 == 0 else list(reversed(rows))):
            times[n].append(timed(run[n]))
            tick()
    return times


def time_pairs(a, b, context: int, reps: int, tick: Tick = lambda: None) -> tuple[list, list]:
    """Seconds of one-row passes of models a and b after `context` cached tokens, alternated pass by pass (the
    order flipped every rep), so that a burst of other load meets both: what a ratio of their costs needs."""
    run_a, run_b = primed(a, context, [1])[1], primed(b, context, [1])[1]
    ta, tb = [], []
    for rep in range(reps):
        for run, out in ((run_a, ta), (run_b, tb)) if rep % 2 == 0 else ((run_b, tb), (run_a, ta)):
            out.append(timed(run))
        tick()
    return ta, tb
