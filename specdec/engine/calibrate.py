"""Measure what a target pass costs as a function of its token-rows, on this machine, now: the input of the
automatic speculation policy when no `specdec profile` file is given. Takes a few seconds (under one for one
sequence)."""

from __future__ import annotations

import statistics
import sys
import time

import torch

from specdec.engine.policy import Auto, FixedK, LearnedPassCost, Never, PassCost, smooth

AUTO_MAX_K = 8  # the deepest draft `--k auto` considers


def row_grid(max_rows: int) -> list[int]:
    """1..4 one by one, then about 50% apart, up to max_rows (the cost model interpolates between)."""
    grid, n = [], 1
    while n < max_rows:
        grid.append(n)
        n = n + 1 if n < 4 else int(n * 1.5)
    return grid + [max_rows]


def calibrate(model, max_rows: int, slots: int, context: int = 256, reps: int = 3) -> PassCost:
    """Time ragged passes of 1..max_rows token-rows spread over up to `slots` sequences, each `context`
    positions deep (their keys are junk: attention costs the same)."""
    depth = -(-max_rows // slots)  # the most rows one sequence gets
    context = max(0, min(context, model.cfg.max_position_embeddings - depth))
    cache = model.new_cache(slots, context + depth)
    points = []
    for n in row_grid(max_rows):
        per = [n // slots + (i < n % slots) for i in range(min(slots, n))]  # rows per sequence
        slot = torch.tensor([s for s, m in enumerate(per) for _ in range(m)])
        pos = torch.tensor([context + j for m in per for j in range(m)])
        tokens = torch.zeros(n, dtype=torch.long)
        model.forward_ragged(tokens, slot, pos, cache)  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            model.forward_ragged(tokens, slot, pos, cache)
            times.append(time.perf_counter() - t0)
        points.append((n, statistics.median(times)))
    return PassCost(smooth(points))


def parse_k(text: str) -> int | str:
    """`--k`: an integer in 1..MAX_DEPTH, or 'auto' (k per row and round from measured pass costs and live
    acceptance)."""
    from specdec.errors import SpecdecError
    from specdec.theory.economics import MAX_DEPTH

    if text == "auto":
        return "auto"
    try:
        k = int(text)
    except ValueError:
        k = 0
    if k < 1:
        raise SpecdecError(f"--k must be an integer >= 1 or 'auto', got {text!r}")
    if k > MAX_DEPTH:
        raise SpecdecError(f"--k must be at most {MAX_DEPTH} (or 'auto'), got {k}")
    return k


def make_policy(name: str, k: int, model, max_batch: int, profile: str | None, free_drafts: bool,
                quiet: bool = False, learned: bool = False, row_floor: float = 0.0):
    """`never`, `always` (k for every row), or `auto` with at most k drafts a row, its pass costs read from a
    `specdec profile` file, or learned from the passes as they run (`learned`: another engine's, whose kernels we
    cannot time beforehand), or else measured now for up to max_batch sequences of k + 1 rows of `model`;
    `row_floor`: `Auto.row_floor`."""
    if name == "never":
        return Never()
    if name == "always":
        return FixedK(k)
    if profile:
        from specdec.theory.profile import Profile

        cost = PassCost.from_profile(Profile.load(profile))
    elif learned:
        cost = LearnedPassCost()
    else:
        if not quiet:
            print("specdec: measuring pass costs for the auto policy (--profile FILE skips this)", file=sys.stderr)
        cost = calibrate(model, max_batch * (k + 1), max_batch)
    return Auto(cost, max_k=k, explore=not free_drafts, row_floor=row_floor)


def policy_for(k: int | str, model, drafter):
    """What one generation passes as k (generate, demo): the integer, or for `auto` the planner over pass costs
    measured now for one sequence (plain decoding through the same loop when the drafter is `none`)."""
    from specdec.drafters.base import NoDrafter

    if k != "auto":
        return k
    name = "never" if isinstance(drafter, NoDrafter) else "auto"
    return make_policy(name, AUTO_MAX_K, model, 1, None, drafter.free, quiet=True)
