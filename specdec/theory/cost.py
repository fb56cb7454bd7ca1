"""The cost of one target pass over n token-rows, read off measured passes: the one pass-cost curve in specdec.

The economics (theory/economics.py CostCurve, relative to a 1-row pass), the engine's policy (engine/policy.py
PassCost, in seconds, scaled by what passes take now), the bench's predictions (bench/stats.py) and the server's
live page (serve/live.py, from the passes it ran) all read a cost at n rows through `PassCurve`, with one rule:

- at a measured width, its cost;
- between two measured widths, the straight line between them;
- below the narrowest, the narrowest's cost (a narrower pass is never dearer: memory-bound passes cost alike);
- beyond the widest, the line through the two widest, never below the widest's cost (the slope a pass has
  reached goes on: past the memory-bound knee, each extra row costs about what the last ones did); with one
  measured width only, in proportion to the rows.

Callers that must not extrapolate (the planner: plan() and `plan --emit` stop at the widest measured width) stop
there themselves. The one deliberate exception is engine/policy.py LearnedPassCost, which prices widths it has
not measured optimistically so that the policy tries them (see its docstring); theory/economics.py pass_cost is
the roofline model of the theory, not a reading of measurements.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from specdec.errors import SpecdecError


def read_cost(points: tuple[tuple[int, float], ...], n: int) -> float:
    """The cost at n rows of sorted measured (rows, cost) points, by the rule above."""
    xs = [p[0] for p in points]
    i = bisect.bisect_left(xs, n)
    if i < len(xs) and xs[i] == n:
        return points[i][1]
    if i == 0:
        return points[0][1]
    if i == len(xs):
        if len(xs) == 1:
            return points[0][1] * n / xs[0]
        (n0, c0), (n1, c1) = points[-2], points[-1]
        return max(c1 + (c1 - c0) * (n - n1) / (n1 - n0), c1)
    (n0, c0), (n1, c1) = points[i - 1], points[i]
    return c0 + (c1 - c0) * (n - n0) / (n1 - n0)


@dataclass(frozen=True)
class PassCurve:
    """Measured (rows, cost) points, sorted by rows, each width once; the cost in any unit (seconds, or 1-row
    passes). Called with n: the cost of a pass over n rows (the module's rule)."""

    points: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        check_points(self.points, "pass cost curve")

    @property
    def max_rows(self) -> int:
        return self.points[-1][0]

    def __call__(self, n: int) -> float:
        return read_cost(self.points, n)


def check_points(points: tuple[tuple[int, float], ...], what: str) -> None:
    if not points:
        raise SpecdecError(f"{what} is empty")
    for n, cost in points:
        if n < 1 or not (cost > 0) or math.isinf(cost):
            raise SpecdecError(f"{what}: bad point {n}:{cost} (need n >= 1 and cost > 0)")
    if any(a[0] >= b[0] for a, b in zip(points, points[1:])):
        raise SpecdecError(f"{what}: widths must be sorted, each once")
