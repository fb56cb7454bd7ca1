"""A `specdec profile` file (bench/hardware/profile.py measures it): the target's pass-cost curve over row counts, its
one-row step, the draft cost, the knee, and per-context curves. `Profile` is its typed, checked form: everything
that reads one (the planner, the engine's auto policy, the bench's predictions, the server) takes a Profile, and
`save` writes one back with whatever else the file held (the bench's raw timings and provenance).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from specdec.atomic import write_text_atomic
from specdec.errors import SpecdecError
from specdec.inputs import number, read_json

Curve = dict[int, float]  # rows n -> the cost of a pass over n rows, relative to one row's


@dataclass(frozen=True)
class ContextCurve:
    """The curve measured after `context` cached tokens, and its one-row pass in seconds (None: not measured)."""
    context: float
    verify_cost: Curve
    step_s: float | None = None


@dataclass(frozen=True)
class Profile:
    verify_cost: Curve  # at the typical context
    step_s: float | None = None  # one row's pass there, seconds
    draft_cost: float | None = None  # a drafted token, in target passes
    contexts: tuple[ContextCurve, ...] = ()
    knee_rows: float | None = None  # rows where passes stop being memory-bound: the roofline's, else the threshold's
    model: str | None = None
    precision: str | None = None
    typical_context: float | None = None
    raw: dict = field(default_factory=dict, compare=False, repr=False)  # the file as read, for save

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        """A `specdec profile` file, its shape checked: what plan, bench and serve read from it is there and
        numeric; anything else is one line naming the file and the field."""
        return cls.from_json(read_json(str(path)), str(path))

    @classmethod
    def from_json(cls, data, where: str = "profile") -> Profile:
        if not isinstance(data, dict) or "verify_cost" not in data:
            ep = data.get("endpoint") if isinstance(data, dict) else None
            rc = ep.get("round_cost") if isinstance(ep, dict) else None
            why = rc.get("why") if isinstance(rc, dict) else None
            raise SpecdecError(f"{where}: not a specdec profile (no 'verify_cost' curve)"
                               + (f"; the bench could not measure one: {why}" if why else ""))
        knee = data.get("knee") or {}
        if not isinstance(knee, dict):
            raise SpecdecError(f"{where}: knee must be an object, got {type(knee).__name__}")
        for key in ("roofline_rows", "threshold_rows"):
            number(knee.get(key), f"{where}: knee.{key}", 0, low_open=True, optional=True)
        contexts = data.get("contexts") or []
        if not isinstance(contexts, list) or not all(isinstance(e, dict) for e in contexts):
            raise SpecdecError(f"{where}: contexts must be a list of objects")
        curves = tuple(ContextCurve(number(e.get("context"), f"{where}: contexts[{i}].context", 0),
                                    curve(e.get("verify_cost"), f"{where}: contexts[{i}].verify_cost"),
                                    number(e.get("step_s"), f"{where}: contexts[{i}].step_s", 0, low_open=True,
                                           optional=True))
                       for i, e in enumerate(contexts))
        text = (lambda key: data[key] if isinstance(data.get(key), str) else None)
        return cls(curve(data["verify_cost"], f"{where}: verify_cost"),
                   number(data.get("step_s"), f"{where}: step_s", 0, low_open=True, optional=True),
                   number(data.get("draft_cost"), f"{where}: draft_cost", 0, optional=True), curves,
                   knee.get("roofline_rows") or knee.get("threshold_rows"), text("model"), text("precision"),
                   number(data.get("typical_context"), f"{where}: typical_context", 0, optional=True), data)

    def to_json(self) -> dict:
        """The file's contents: what was read, with the typed fields as they are now."""
        out = {**self.raw, "verify_cost": _json_curve(self.verify_cost), "step_s": self.step_s,
               "draft_cost": self.draft_cost, "model": self.model, "precision": self.precision,
               "typical_context": self.typical_context}
        read = self.raw.get("contexts") or []
        out["contexts"] = [{**(read[i] if i < len(read) else {}), "context": c.context,
                            "verify_cost": _json_curve(c.verify_cost), "step_s": c.step_s}
                           for i, c in enumerate(self.contexts)]
        return out

    def save(self, path: str | Path) -> None:
        write_text_atomic(path, json.dumps(self.to_json(), indent=1))

    def nearest(self, context: float) -> ContextCurve | None:
        """The per-context curve measured nearest `context` tokens (None for a profile without them)."""
        return min(self.contexts, key=lambda e: abs(e.context - context)) if self.contexts else None


def _json_curve(c: Curve) -> dict[str, float]:
    return {str(n): v for n, v in sorted(c.items())}


def curve(data, where: str) -> Curve:
    """A verify cost curve read from JSON (check_curve), as rows -> cost."""
    check_curve(data, where)
    return {int(n): float(v) for n, v in data.items()}


def check_curve(curve, where: str) -> None:
    """A verify cost curve as JSON: an object of row counts n >= 1 to positive costs."""
    if not isinstance(curve, dict) or not curve:
        raise SpecdecError(f"{where} must be a non-empty object of n: cost, got {json.dumps(curve)[:40]}")
    for n, cost in curve.items():
        if not str(n).isdigit() or int(n) < 1:
            raise SpecdecError(f"{where}: row count {n!r} is not an integer >= 1")
        number(cost, f"{where}[{n}]", 0, low_open=True)
