"""How far to speculate, each round, for each row: `always` (a fixed k), `never` (k = 0), or `auto`. The round
that asks the drafter and the policy in the order they need is engine/round.py.

`auto` chooses every row's k (0 allowed) to maximise the batch's expected tokens per second:

    sum_r E_r(k_r) / (pass_seconds(sum_r (k_r + 1)) + draft_seconds(k))

with E_r(k) = 1 + sum_{j<=k} prod_{i<=j} a_r,i from the row's own per-position acceptance estimates (a Beta
posterior whose prior is the server's running per-position rate), or from the drafter's own confidence in
each drafted token where it gives one (`trim`: a trained head's probabilities, prompt lookup's measured rate for
matches as long), and pass_seconds the measured cost of a target pass over that many token-rows, at the rows' mean
context where the curves were measured at several (`PassCost`: a wide pass gets dearer against a narrow one as
the context grows, so the plan follows each sequence's length). Nothing about
batch size is hard-coded: while a pass is memory-bound extra rows cost almost nothing and every row drafts; once
compute binds, each extra row costs a share of a pass and only rows whose drafts are accepted often enough keep
drafting.

Every policy implements the whole `Policy` protocol (no-op methods where it has nothing to learn), so the step
loop never asks what a policy can do.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specdec.errors import SpecdecError
from specdec.measure import Decay
from specdec.theory.cost import read_cost
from specdec.theory.economics import check_k
from specdec.theory.profile import Profile

POLICIES = ("auto", "always", "never")

# The policy's moving averages (measure.Decay), by half-life:
CONFIDENCE_DECAY = Decay(0.002)  # the drafter's confidence calibration: half-life 346 judged drafts
DRAFT_STEP_DECAY = Decay(0.1)  # seconds per drafting step: half-life 6.6 drafting rounds
IDLE_DRAFT_DECAY = Decay(0.01)  # ... shrinking while nothing is drafted, so drafting is tried again: 69 rounds
SCALE_DECAY = Decay(0.1)  # a measured curve's scale, as passes really take: half-life 6.6 passes
LEARNED_DECAY = Decay(0.2)  # a learned width's step time, after its first min_seen steps: half-life 3.1 steps


@dataclass(frozen=True)
class RowView:
    """What the planner knows about one running row."""

    judged: Sequence[int]  # per draft position: drafts judged there
    hits: Sequence[int]  # ... and accepted
    cap: int  # the most tokens this row may draft now (cache room, budget, drafts available)
    context: int = 0  # the row's sequence length: tokens in its cache (0: unknown)


class Policy(Protocol):
    """How many drafts each row verifies. `trims`: the policy can cut drafts already drafted by the drafter's
    confidence in them (`trim`); without it, drafts are planned (`plan`) and confidences go unread."""

    max_k: int  # the most drafts a row verifies in a round
    trims: bool
    cost: Callable[..., float] | None  # seconds of a pass over n rows (at a context), where the policy prices them


    def plan(self, rows: Sequence[RowView]) -> list[int]:
        """Each row's k before drafting, up to its cap."""
        ...

    def trim(self, rows: Sequence[RowView], confidence: Sequence[Sequence[float]]) -> list[int]:
        """Each row's k after drafting rows[i].cap tokens that came with confidence[i][j] (NaN: none)."""
        ...

    def observe(self, rows: int, seconds: float, draft_seconds: float, max_k: int,
                context: float | None = None) -> None:
        """A round's costs: its target pass over `rows` token-rows after `context` cached tokens (a row's mean;
        None: unknown), and `max_k` drafting steps."""
        ...

    def learn(self, judged: Sequence[int], hits: Sequence[int]) -> None:
        """A round's evidence per draft position, verified and shadow-scored: judged, and accepted."""
        ...

    def learn_confidence(self, confidence: Sequence[float], accepted: int) -> None:
        """One row's round, from drafts it trimmed by confidence: those the target judged, the first `accepted`
        of them accepted."""
        ...


@dataclass
class FixedK:
    """`always`: k drafts for every row (fewer when the cache or the budget is nearly full)."""

    k: int
    trims = False
    cost = None  # a fixed k prices nothing

    def __post_init__(self) -> None:
        check_k(self.k)

    @property
    def max_k(self) -> int:
        return self.k

    def plan(self, rows: Sequence[RowView]) -> list[int]:
        return [min(self.k, r.cap) for r in rows]

    def trim(self, rows: Sequence[RowView], confidence: Sequence[Sequence[float]]) -> list[int]:
        return self.plan(rows)  # confidences do not move a fixed k

    def observe(self, rows: int, seconds: float, draft_seconds: float, max_k: int,
                context: float | None = None) -> None:
        pass

    def learn(self, judged: Sequence[int], hits: Sequence[int]) -> None:
        pass

    def learn_confidence(self, confidence: Sequence[float], accepted: int) -> None:
        pass


@dataclass
class Never:
    """`never`: plain decoding through the same loop."""

    max_k: int = 0
    trims = False
    cost = None

    def plan(self, rows: Sequence[RowView]) -> list[int]:
        return [0] * len(rows)

    def trim(self, rows: Sequence[RowView], confidence: Sequence[Sequence[float]]) -> list[int]:
        return [0] * len(rows)

    def observe(self, rows: int, seconds: float, draft_seconds: float, max_k: int,
                context: float | None = None) -> None:
        pass

    def learn(self, judged: Sequence[int], hits: Sequence[int]) -> None:
        pass

    def learn_confidence(self, confidence: Sequence[float], accepted: int) -> None:
        pass


Points = tuple[tuple[int, float], ...]  # sorted (rows, seconds)


@dataclass
class PassCost:
    """Seconds of one target pass over n token-rows: measured points read by theory/cost.py's rule (linear
    between them and beyond the last two). `scale` follows what passes really take.

    `contexts`, where a profile measured curves after several cached-token counts: attention's share of a pass
    grows with the context, and faster for a wide pass than a narrow one, so the curve's shape changes with it (a
    6-row pass is dearer against a 1-row pass at 2k tokens than at 512), not only its level. A cost asked at a
    context reads each measured curve at n rows (the same rule) and goes linearly in context between the two
    measured contexts around it; beyond the last two, along the line through them (attention's cost is linear in
    the context), never below the last; below the first, the first's. Without a context, or with fewer than two
    curves, the cost is `points`' (the typical context's curve)."""

    points: Points
    scale: float = 1.0
    contexts: tuple[tuple[float, Points], ...] = ()  # sorted (cached tokens, its curve), each context once

    def __post_init__(self) -> None:
        for pts in (self.points, *(c for _, c in self.contexts)):
            if not pts or pts[0][0] != 1 or any(s <= 0 for _, s in pts):
                raise SpecdecError("a pass cost curve needs positive times starting at 1 row")
        if any(a[0] >= b[0] for a, b in zip(self.contexts, self.contexts[1:])):
            raise SpecdecError("pass cost curves by context must be sorted, each context once")

    @classmethod
    def from_profile(cls, prof: Profile) -> PassCost:
        """From a `specdec profile`: its verify curve (relative) times its one-row step; and each per-context
        curve that has its own one-row step, likewise."""
        if prof.step_s is None:
            raise SpecdecError("the profile has no one-row step time (step_s): no pass costs in seconds")
        by_context = {c.context: tuple(sorted((n, v * c.step_s) for n, v in c.verify_cost.items()))
                      for c in prof.contexts if c.step_s is not None}
        return cls(tuple(sorted((n, v * prof.step_s) for n, v in prof.verify_cost.items())),
                   contexts=tuple(sorted(by_context.items())))

    def __call__(self, n: int, context: float | None = None) -> float:
        return self._base(n, context) * self.scale

    def _base(self, n: int, context: float | None) -> float:
        """The measured cost at n rows (and `context` cached tokens), before `scale`."""
        curves = self.contexts
        if context is None or len(curves) < 2:
            return read_cost(self.points, n)
        if context <= curves[0][0]:
            return read_cost(curves[0][1], n)
        i = min(bisect.bisect_left([c for c, _ in curves], context), len(curves) - 1)
        (c0, p0), (c1, p1) = curves[i - 1], curves[i]
        t0, t1 = read_cost(p0, n), read_cost(p1, n)
        t = t0 + (t1 - t0) * (context - c0) / (c1 - c0)
        return max(t, t1) if context > c1 else t

    def observe(self, n: int, seconds: float, context: float | None = None, weight: float | None = None) -> None:
        """A pass over n rows after `context` cached tokens (None: unknown) took `seconds`: `scale` moves towards
        its ratio to the measured cost there."""
        predicted = self(n, context) / self.scale
        if seconds > 0 and predicted > 0:
            self.scale = SCALE_DECAY.mix(self.scale, seconds / predicted, weight)


def smooth(points: list[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """Each inner point no higher than the line through its neighbours, then non-decreasing. Timing noise is
    mostly upward (a pass interrupted), and one high point must not make a deeper draft look dearer than it is."""
    pts = sorted(points)
    low = [pts[0]] + [(n, min(t, a[1] + (b[1] - a[1]) * (n - a[0]) / (b[0] - a[0])))
                      for a, (n, t), b in zip(pts, pts[1:], pts[2:])] + pts[-1:] if len(pts) > 2 else pts
    out, top = [], 0.0
    for n, t in low:
        top = max(top, t)
        out.append((n, top))
    return tuple(out)


class LearnedPassCost:
    """Seconds of a step over n token-rows, learned from the steps an engine runs, with no curve measured
    beforehand (vLLM's steps, integrations/vllm.py: it is vLLM's kernels that run them, not ours).

    Each width keeps its own average: the mean of its first `min_seen` steps, then a running average (`weight`). The
    curve goes through the widths seen `min_seen` times or more (made non-decreasing: `smooth`). Elsewhere it is
    optimistic, so that the policy tries what it does not know and its steps then price it: a width not measured
    costs what the nearest narrower measured one does (beyond the widest too), and below the narrowest, in
    proportion to the width. (Interpolating would be a guess that keeps the policy away: on vLLM-CPU a step of 9
    rows cost 2.5-3 times one of 5, and the 6 to 8 between went untried.) A width not stepped through in the last
    `forget` steps drops out and is learned afresh when the policy goes there again: a price measured once, in a
    busy moment, does not keep the policy away for good. A context is accepted and not read: the steps it learns
    from are vLLM's, at whatever contexts its rows had."""

    def __init__(self, min_seen: int = 3, decay: Decay = LEARNED_DECAY, forget: int = 2000):
        self.min_seen, self.decay, self.forget = min_seen, decay, forget
        self.seen: dict[int, tuple[float, int, int]] = {}  # width -> (average seconds, steps, the last step's number)
        self.steps = 0
        self._curve: tuple[tuple[int, float], ...] | None = None

    def observe(self, n: int, seconds: float, context: float | None = None) -> None:
        if n < 1 or not seconds > 0:
            return
        self.steps += 1
        avg, count, _ = self.seen.get(n, (0.0, 0, 0))
        warm = 1 / (count + 1) if count < self.min_seen else None  # a plain mean of the first min_seen
        self.seen[n] = (self.decay.mix(avg, seconds, warm), count + 1, self.steps)
        if self.steps % 100 == 0:  # forget widths not measured lately
            self.seen = {w: v for w, v in self.seen.items() if self.steps - v[2] <= self.forget}
        self._curve = None

    def seed(self, points: Sequence[tuple[int, float]]) -> None:
        """Start from (width, seconds) points learned before (engine/costs.py keeps them between runs): each
        trusted as if seen min_seen times, and learned on from there."""
        for n, seconds in points:
            self.seen[n] = (seconds, self.min_seen, self.steps)
        self._curve = None

    def curve(self) -> tuple[tuple[int, float], ...]:
        """The measured points the cost goes through (none before any width was seen min_seen times)."""
        if self._curve is None:
            pts = [(n, avg) for n, (avg, count, _) in self.seen.items() if count >= self.min_seen]
            self._curve = smooth(pts) if pts else ()
        return self._curve

    def __call__(self, n: int, context: float | None = None) -> float:
        pts = self.curve()
        if not pts:
            return 1.0  # nothing known: every width alike, so the first steps try drafting
        if n <= pts[0][0]:
            return pts[0][1] * n / pts[0][0]
        return pts[bisect.bisect_right([p[0] for p in pts], n) - 1][1]  # the nearest measured width at or below n


def mean_context(contexts: Iterable[int]) -> float | None:
    """The mean of the rows' contexts that are known (0: unknown; None: none is): what a pass over them is priced
    at, and observed at."""
    known = [c for c in contexts if c > 0]
    return sum(known) / len(known) if known else None


def check_row_floor(x: float, name: str = "row floor") -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= x <= 1.0:
        raise SpecdecError(f"{name} must be a number in [0, 1], got {x!r}")
    return float(x)


@dataclass
class Auto:
    """`auto`: per-row k by expected tokens per second. `prior` is the running per-position acceptance
    (updated by `learn`); `strength` how many drafts the prior is worth against a row's own evidence."""

    cost: PassCost | LearnedPassCost
    max_k: int = 8
    strength: float = 4.0
    draft_step_s: float = 0.0  # seconds per drafting step (a draft model's; ~0 for prompt lookup)
    # optimism while a row's evidence is thin, so that its drafts get tried; not needed for a free drafter,
    # whose unverified drafts are shadow-scored at no cost
    explore: bool = True
    # each row's expected speed in a step at least this fraction of its speed in the same step without drafts:
    # 0 lets the batch's throughput alone decide (a row that does not draft then waits for its neighbours' wider
    # step); 0.97 keeps every request within 3% of its speed without speculation, at the cost of drafting less
    row_floor: float = 0.0
    prior_judged: list[float] = field(default_factory=list)
    prior_hits: list[float] = field(default_factory=list)
    conf_sum: float = 0.0  # decayed sums over verified drafts that came with a confidence: the confidences,
    conf_hits: float = 0.0  # ... and the accepted ones
    trims = True

    def __post_init__(self) -> None:
        check_k(self.max_k, "max k")
        check_row_floor(self.row_floor)
        self.prior_judged = [0.0] * self.max_k
        self.prior_hits = [0.0] * self.max_k

    def prior(self, i: int) -> float:
        j = self.prior_judged[i]
        return (self.prior_hits[i] + 1.0) / (j + 2.0)  # Laplace: 0.5 before any evidence

    def estimates(self, row: RowView) -> list[float]:
        """Conditional acceptance per position: the posterior mean, plus one standard deviation when exploring
        (large while evidence is thin), so that a row whose drafts were never tried still gets tried."""
        out = []
        for i in range(min(self.max_k, row.cap)):
            n = row.judged[i] if i < len(row.judged) else 0
            h = row.hits[i] if i < len(row.hits) else 0
            w = self.strength
            mean = (h + w * self.prior(i)) / (n + w)
            sd = math.sqrt(mean * (1 - mean) / (n + w + 1)) if self.explore else 0.0
            out.append(min(1.0, mean + sd))
        return out

    def plan(self, rows: Sequence[RowView]) -> list[int]:
        """Each row's k before drafting, from its acceptance estimates."""
        return self._best([self.estimates(r) for r in rows], self.draft_step_s, mean_context(r.context for r in rows))

    def trim(self, rows: Sequence[RowView], confidence: Sequence[Sequence[float]]) -> list[int]:
        """Each row's k after drafting, from drafts of rows[i].cap tokens that came with the drafter's own
        confidence[i][j] that token j is accepted given the earlier ones were (NaN: none; the row's estimate
        stands in), scaled by how well such confidences have matched verification so far. The drafting is
        spent already, so only the pass's cost counts."""
        gains = []
        for r, conf in zip(rows, confidence):
            est = self.estimates(r)
            gains.append([min(1.0, c * self.calibration) if c == c else e for c, e in zip(conf, est)])
        return self._best(gains, 0.0, mean_context(r.context for r in rows))

    @property
    def calibration(self) -> float:
        """Accepted drafts per unit of the confidence they came with (1 before any evidence)."""
        return (self.conf_hits + 4.0) / (self.conf_sum + 4.0)

    def learn_confidence(self, confidence: Sequence[float], accepted: int) -> None:
        """One row's round: the confidences of the drafts the target judged, in order (NaN: none given), of which
        the first `accepted` were accepted."""
        given = [(c, j < accepted) for j, c in enumerate(confidence) if c == c]
        decay = CONFIDENCE_DECAY.keep(len(given))
        self.conf_sum = self.conf_sum * decay + sum(c for c, _ in given)
        self.conf_hits = self.conf_hits * decay + sum(hit for _, hit in given)

    def _best(self, gains: list[list[float]], draft_step_s: float, context: float | None = None) -> list[int]:
        """Greedy by marginal expected tokens; keeps the best prefix of the additions (the cost curve has
        steps, so the first addition that loses does not end the search) among those that keep every row above
        `row_floor` times its speed without drafts: its expected tokens over the step's seconds, against one token
        over a plain step's. Every width is priced at `context` cached tokens (the rows' mean, `mean_context`;
        None: the typical context's curve): the curves are of one sequence's passes, and what a batch of rows
        at different contexts costs beyond that, the cost's learned `scale` takes up, observed at the same mean."""
        ks = [0] * len(gains)
        nxt = [g[0] if g else 0.0 for g in gains]  # the expected tokens the next draft of each row adds
        rows = [1.0] * len(gains)  # each row's expected tokens
        tokens, width = float(len(gains)), len(gains)
        plain = self.cost(width, context)
        best, best_ks = tokens / plain, list(ks)
        while True:
            r = max(range(len(gains)), key=lambda i: nxt[i], default=None)
            if r is None or nxt[r] <= 0.0:
                break
            tokens += nxt[r]
            rows[r] += nxt[r]
            ks[r] += 1
            width += 1
            nxt[r] = nxt[r] * gains[r][ks[r]] if ks[r] < len(gains[r]) else 0.0
            step = self.cost(width, context) + draft_step_s * max(ks)
            if tokens / step > best and self.row_floor * step <= plain * min(rows):
                best, best_ks = tokens / step, list(ks)
        return best_ks

    def learn(self, judged: Sequence[int], hits: Sequence[int]) -> None:
        """Fold one round's verified counts per position into the running prior."""
        for i in range(min(len(judged), self.max_k)):
            self.prior_judged[i] += judged[i]
            self.prior_hits[i] += hits[i]

    def observe(self, rows: int, seconds: float, draft_seconds: float, max_k: int,
                context: float | None = None) -> None:
        """A round took `seconds` for its target pass over `rows` token-rows after `context` cached tokens (the
        rows' mean, as `plan` prices it; None: unknown) and `draft_seconds` for `max_k` drafting steps. While
        nothing is drafted the drafting cost decays, so that drafting is tried again."""
        self.cost.observe(rows, seconds, context)
        if max_k > 0:
            self.draft_step_s = DRAFT_STEP_DECAY.mix(self.draft_step_s, draft_seconds / max_k)
        else:
            self.draft_step_s *= IDLE_DRAFT_DECAY.keep()
