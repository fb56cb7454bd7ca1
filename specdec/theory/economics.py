"""The economics of speculation: expected tokens per round, speedup, best k, and the batch roofline.

Notation, kept everywhere in specdec:
    a  acceptance rate: the probability that a drafted position survives verification
    k  draft depth: tokens proposed per round
    c  draft cost: the cost of drafting one token, in units of one target forward pass
    verify_cost(n): the cost of one target pass over n token-rows, in units of a 1-row pass (1 by default)

A round yields the accepted prefix plus one target token (recovered or bonus), so
    E[tokens/round] = (1 - a^(k+1)) / (1 - a)        (k + 1 at a = 1)
    speedup(k)      = E / (verify_cost(k + 1) + k * c)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from specdec.errors import SpecdecError
from specdec.theory.cost import PassCurve, check_points

CostFn = Callable[[int], float]


def check_alpha(a: float) -> float:
    if not (isinstance(a, (int, float)) and 0.0 <= a <= 1.0) or math.isnan(a):
        raise SpecdecError(f"acceptance rate must be in [0, 1], got {a}")
    return float(a)


def check_cost(c: float, name: str = "draft cost") -> float:
    if not (c >= 0.0) or math.isinf(c):
        raise SpecdecError(f"{name} must be a finite number >= 0, got {c}")
    return float(c)


MAX_DEPTH = 256  # the deepest draft the models consider: far past any that pays (a ** k vanishes)


def read_k(k, name: str, zero_is_never: bool = False) -> int | None:
    """None for auto; else an integer in 0 (only where allowed) or 1..MAX_DEPTH."""
    if k is None or k == "auto":
        return None
    low = 0 if zero_is_never else 1
    if isinstance(k, bool):
        value = None
    elif isinstance(k, (int, float)):
        value = int(k) if int(k) == k else None
    else:
        try:
            value = int(str(k).strip())
        except ValueError:
            value = None
    if value is None or value < low:
        raise SpecdecError(f"{name} must be an integer >= {low} or 'auto', got {k!r}")
    if value > MAX_DEPTH:
        raise SpecdecError(f"{name} must be at most {MAX_DEPTH} (or 'auto'), got {value}")
    return value


def k_type(auto: bool = True):
    """The argparse type of every --k: auto (where `auto`) or an integer 1..MAX_DEPTH, read by read_k as everywhere
    (an int, or "auto")."""
    def read(text: str) -> int | str:
        if auto and text == "auto":
            return "auto"
        try:
            value = None if text == "auto" else read_k(text, "--k", zero_is_never=False)
        except SpecdecError:
            value = None
        if value is None:  # argparse says "argument --k: " before it
            raise argparse.ArgumentTypeError(f"must be an integer in 1..{MAX_DEPTH}{' or auto' if auto else ''}, "
                                             f"got {text!r}")
        return value

    read.__name__ = "k"
    return read


def add_k_arg(p, help: str, auto: bool = True, **kw) -> None:
    """A --k of drafts per row and round, for commands beside generate's (expect, profile, the theory, the benches'
    servers): one reading (engine/speculation.py's --k and --policy read k here too), auto only where the command
    has a cap to fill in."""
    p.add_argument("--k", type=k_type(auto), metavar="auto|N" if auto else "N", help=help, **kw)


def check_k(k: int, name: str = "k", high: int | None = MAX_DEPTH) -> int:
    """An integer in 1..high (unbounded when high is None)."""
    if int(k) != k or k < 1:
        raise SpecdecError(f"{name} must be an integer >= 1, got {k}")
    if high is not None and k > high:
        raise SpecdecError(f"{name} must be an integer in 1..{high}, got {k}")
    return int(k)


def expected_tokens(a: float, k: int) -> float:
    """E[tokens per round] for acceptance rate a and draft depth k (bonus/correction token included)."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def unit_verify_cost(n: int) -> float:
    """The theory's assumption: verifying n rows costs one pass (memory-bound)."""
    return 1.0


@dataclass(frozen=True)
class CostCurve(PassCurve):
    """A measured verify cost curve: cost of a target pass over n rows relative to a 1-row pass, read by
    theory/cost.py's rule; the planner trusts it only inside its measured range (plan() stops there)."""

    points: tuple[tuple[int, float], ...]  # sorted (n, relative cost), n >= 1

    def __post_init__(self) -> None:
        check_points(self.points, "verify cost curve")

    @classmethod
    def from_mapping(cls, mapping: dict) -> CostCurve:
        try:
            pts = sorted((int(n), float(v)) for n, v in mapping.items())
        except (TypeError, ValueError) as e:
            raise SpecdecError(f"verify cost curve: entries must be n: cost numbers ({e})") from None
        if pts and pts[0][0] == 1 and pts[0][1] != 1.0:  # absolute times: normalise by the 1-row pass
            base = pts[0][1]
            pts = [(n, v / base) for n, v in pts]
        return cls(tuple(pts))

    @classmethod
    def parse(cls, text: str) -> CostCurve:
        """Parse "n:cost,n:cost,..." (for example "1:1,2:1.02,4:1.1,8:1.6")."""
        mapping = {}
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            n, sep, cost = item.partition(":")
            if not sep:
                raise SpecdecError(f"verify cost curve: expected n:cost, got {item!r}")
            try:
                mapping[int(n)] = float(cost)
            except ValueError:
                raise SpecdecError(f"verify cost curve: expected n:cost numbers, got {item!r}") from None
        return cls.from_mapping(mapping)


def speedup(a: float, k: int, c: float, verify_cost: CostFn = unit_verify_cost) -> float:
    """Tokens per unit of target-pass time, relative to plain decoding (1 token per 1-row pass)."""
    return expected_tokens(a, k) / (verify_cost(k + 1) + k * c)


def max_useful_draft_cost(a: float) -> float:
    """c* = -a ln a / (1 - a): above it, speedup falls from k = 0 on (dS/dk at k = 0 is negative)."""
    if a <= 0.0:
        return 0.0
    if a >= 1.0:
        return 1.0  # the limit of -a ln a / (1 - a) as a -> 1
    return -a * math.log(a) / (1.0 - a)


@dataclass
class Plan:
    alpha: float
    draft_cost: float
    curve: list[dict] = field(default_factory=list)  # [{k, expected_tokens, speedup}]
    best_k: int = 1
    best_speedup: float = 0.0
    beats_plain: bool = False
    max_useful_draft_cost: float = 0.0
    max_k: int = 1

    def to_json(self) -> dict:
        return {
            "alpha": self.alpha,
            "draft_cost": self.draft_cost,
            "max_k": self.max_k,
            "best_k": self.best_k,
            "best_speedup": self.best_speedup,
            "beats_plain": self.beats_plain,
            "max_useful_draft_cost": self.max_useful_draft_cost,
            "curve": self.curve,
        }


def plan(a: float, c: float, max_k: int = 32, verify_cost: CostFn = unit_verify_cost) -> Plan:
    """Evaluate k = 1..max_k and pick the best draft depth."""
    a, c, max_k = check_alpha(a), check_cost(c), check_k(max_k, "max k")
    if isinstance(verify_cost, CostCurve):
        if verify_cost.max_rows < 2:
            raise SpecdecError("verify cost curve must cover at least 2 rows (k = 1)")
        max_k = min(max_k, verify_cost.max_rows - 1)  # never extrapolate past what was measured
    curve = [
        {"k": k, "expected_tokens": expected_tokens(a, k), "speedup": speedup(a, k, c, verify_cost)}
        for k in range(1, max_k + 1)
    ]
    best = max(curve, key=lambda row: row["speedup"])
    return Plan(
        alpha=a,
        draft_cost=c,
        curve=curve,
        best_k=best["k"],
        best_speedup=best["speedup"],
        beats_plain=best["speedup"] > 1.0,
        max_useful_draft_cost=max_useful_draft_cost(a),
        max_k=max_k,
    )


# --- The batch roofline ------------------------------------------------------------------------------


def pass_cost(rows: int, knee_rows: float) -> float:
    """Cost of one target pass over `rows` token-rows, in 1-row passes: memory-bound (flat) up to the knee,
    compute-bound (linear) above it. No smoothing: the hard max is the roofline itself."""
    return max(1.0, rows / knee_rows)


def batch_ratio(a: float, k: int, c: float, batch: int, knee_rows: float) -> float:
    """Throughput with speculation relative to without, for `batch` sequences decoding together.

    plain:       batch tokens per pass_cost(batch)
    speculative: batch * E tokens per [pass_cost(batch * (k + 1)) + k * c * pass_cost(batch)]
    """
    plain = pass_cost(batch, knee_rows)
    spec_round = pass_cost(batch * (k + 1), knee_rows) + k * c * plain
    return expected_tokens(a, k) * plain / spec_round


@dataclass
class BatchModel:
    alpha: float
    k: int
    draft_cost: float
    knee_rows: float
    curve: list[dict]  # [{batch, ratio}]
    ratio_at_batch_1: float
    ratio_at_max_batch: float
    crossover_batch: int | None  # smallest batch at which speculation stops paying (ratio < 1)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def batch_model(a: float, k: int, c: float, knee_rows: float, max_batch: int = 256) -> BatchModel:
    a, k, c = check_alpha(a), check_k(k), check_cost(c)
    if not (knee_rows > 0):
        raise SpecdecError(f"knee rows must be > 0, got {knee_rows}")
    max_batch = check_k(max_batch, "max batch", 1 << 16)
    curve = [{"batch": b, "ratio": batch_ratio(a, k, c, b, knee_rows)} for b in range(1, max_batch + 1)]
    crossover = next((row["batch"] for row in curve if row["ratio"] < 1.0), None)
    return BatchModel(
        alpha=a,
        k=k,
        draft_cost=c,
        knee_rows=float(knee_rows),
        curve=curve,
        ratio_at_batch_1=curve[0]["ratio"],
        ratio_at_max_batch=curve[-1]["ratio"],
        crossover_batch=crossover,
    )


def describe_speedup(s: float) -> str:
    return f"{s:.2f}x faster" if s >= 1.0 else f"{s:.2f}x: slower than plain decoding"


__all__: Sequence[str] = [
    "expected_tokens", "speedup", "max_useful_draft_cost", "predict_from_rounds", "plan", "Plan", "CostCurve",
    "pass_cost", "batch_ratio", "batch_model", "BatchModel", "describe_speedup",
]


# --- Measured acceptance: per-position rates and draft lengths ----------------------------------------------
# A drafter such as n-gram lookup is bursty: a long match is either copied whole or rejected early, so one
# acceptance rate a (iid positions) misjudges it. These use a_i = P(position i accepted | positions < i were),
# measured, with the measured draft length of every round.


def position_counts(drafted: Sequence[int], accepted: Sequence[int], depth: int | None = None
                    ) -> tuple[list[int], list[int]]:
    """(reached, kept) per draft position i < depth (default: the deepest draft), from rounds that drafted
    drafted[r] tokens and kept accepted[r] of them: reached[i] counts the rounds that drafted position i and
    accepted every position before it (the draft was judged there), kept[i] those that accepted it too. The one
    count of per-position acceptance in specdec: conditional_acceptance is kept / reached, and the server's live
    page sums these counts over its rounds."""
    depth = max(drafted, default=0) if depth is None else depth
    reached, kept = [0] * depth, [0] * depth
    for d, n in zip(drafted, accepted):
        for i in range(min(d, n + 1, depth)):
            reached[i] += 1
        for i in range(min(n, d, depth)):
            kept[i] += 1
    return reached, kept


def conditional_acceptance(drafted: Sequence[int], accepted: Sequence[int]) -> list[float | None]:
    """a_i for draft positions i = 0..max(drafted)-1: of the rounds that drafted position i and accepted every
    position before it, the share that accepted position i too (position_counts). None where no round reached
    position i."""
    return rates(*position_counts(drafted, accepted))


def rates(reached: Sequence[int], kept: Sequence[int]) -> list[float | None]:
    """kept / reached per position; None where nothing reached it."""
    return [k / r if r else None for r, k in zip(reached, kept)]


def expected_tokens_positional(a_pos: Sequence[float | None], d: int) -> float:
    """E[tokens per round | d drafted] = 1 + sum_{i<d} prod_{j<=i} a_j (a missing or None a_j counts as 0)."""
    total, survive = 1.0, 1.0
    for i in range(d):
        a = a_pos[i] if i < len(a_pos) and a_pos[i] is not None else 0.0
        survive *= a
        total += survive
    return total


def predict_from_positional(a_pos: Sequence[float | None], drafted: Sequence[int], c: float,
                            verify_cost: CostFn = unit_verify_cost) -> float:
    """Predicted speedup of the decode phase for rounds that drafted `drafted[r]` tokens, with per-position
    conditional acceptance a_pos: sum of E[tokens | d] over sum of (verify_cost(d + 1) + d * c)."""
    if not drafted:
        return 1.0
    tokens = sum(expected_tokens_positional(a_pos, d) for d in drafted)
    cost = sum(verify_cost(d + 1) + d * c for d in drafted)
    return tokens / cost


def predict_from_rounds(a: float, drafted: Sequence[int], c: float,
                        verify_cost: CostFn = unit_verify_cost) -> float:
    """The single-rate model of the same rounds: every position accepted with probability a. A round that
    drafted nothing is a plain step (1 token for one 1-row pass)."""
    return predict_from_positional([a] * max(drafted, default=0), drafted, c, verify_cost)


def end_to_end_speedup(decode_speedup: float, tokens: int, prefill_steps: float) -> float:
    """Speedup of a whole request whose first token comes from a prefill costing `prefill_steps` plain decode
    steps (the same with and without speculation) and whose other tokens - 1 come `decode_speedup` times faster."""
    if tokens <= 1 or decode_speedup <= 0:
        return 1.0
    plain = prefill_steps + (tokens - 1)
    return plain / (prefill_steps + (tokens - 1) / decode_speedup)


def first_exceeding(curve: CostFn, max_rows: int, threshold: float = 1.5) -> int | None:
    """The knee by threshold: the first n in 1..max_rows whose pass costs more than `threshold` 1-row passes."""
    return next((n for n in range(1, max_rows + 1) if curve(n) > threshold), None)


def fit_knee(points: Sequence[tuple[int, float]]) -> float | None:
    """The roofline max(1, n / knee) that fits measured (n, relative cost) points best (least squares over
    knee in 1..256, steps of 0.05); None with no point past one row (nothing to fit). The one knee fit: the
    profile, `bench` and the server's live page all read it here."""
    if not any(n > 1 for n, _ in points):
        return None
    knees = np.arange(20, 256 * 20 + 1) / 20  # [5101]
    err = np.zeros_like(knees)
    for n, cost in points:  # in the points' order, as a sum of them would add up: every knee's error, at once
        err += (cost - np.maximum(1.0, n / knees)) ** 2
    return float(knees[int(np.argmin(err))])  # the first of equal errors: the smallest knee


def batch_capacity(budget_bytes: float, weight_bytes: float, kv_bytes_per_token: float, context: int) -> int:
    """Sequences of `context` tokens whose KV caches fit in a memory budget next to the weights."""
    free = budget_bytes - weight_bytes
    per_seq = kv_bytes_per_token * context
    if free <= 0:
        return 0
    return int(free // per_seq) if per_seq > 0 else 0
