"""A `specdec profile` file (bench/hardware/profile.py writes it): the target's pass-cost curve over row counts, its
one-row step, the draft cost, the knee, and per-context curves. Read here, its shape checked, by everything that uses
it: the planner, the engine's auto policy, the bench's predictions and the server."""

from __future__ import annotations

import json

from specdec.errors import SpecdecError
from specdec.inputs import number, read_json


def load_profile(path: str) -> dict:
    """A `specdec profile` file, its shape checked: what plan, bench and serve read from it is there and numeric."""
    data = read_json(path)
    if not isinstance(data, dict) or "verify_cost" not in data:
        ep = data.get("endpoint") if isinstance(data, dict) else None
        rc = ep.get("round_cost") if isinstance(ep, dict) else None
        why = rc.get("why") if isinstance(rc, dict) else None
        raise SpecdecError(f"{path}: not a specdec profile (no 'verify_cost' curve)"
                           + (f"; the bench could not measure one: {why}" if why else ""))
    check_curve(data["verify_cost"], f"{path}: verify_cost")
    number(data.get("draft_cost"), f"{path}: draft_cost", 0, optional=True)
    number(data.get("step_s"), f"{path}: step_s", 0, low_open=True, optional=True)
    knee = data.get("knee") or {}
    if not isinstance(knee, dict):
        raise SpecdecError(f"{path}: knee must be an object, got {type(knee).__name__}")
    for key in ("roofline_rows", "threshold_rows"):
        number(knee.get(key), f"{path}: knee.{key}", 0, low_open=True, optional=True)
    contexts = data.get("contexts") or []
    if not isinstance(contexts, list) or not all(isinstance(e, dict) for e in contexts):
        raise SpecdecError(f"{path}: contexts must be a list of objects")
    for i, entry in enumerate(contexts):
        number(entry.get("context"), f"{path}: contexts[{i}].context", 0)
        number(entry.get("step_s"), f"{path}: contexts[{i}].step_s", 0, low_open=True, optional=True)
        check_curve(entry.get("verify_cost"), f"{path}: contexts[{i}].verify_cost")
    return data


def check_curve(curve, where: str) -> None:
    """A verify cost curve as JSON: an object of row counts n >= 1 to positive costs."""
    if not isinstance(curve, dict) or not curve:
        raise SpecdecError(f"{where} must be a non-empty object of n: cost, got {json.dumps(curve)[:40]}")
    for n, cost in curve.items():
        if not str(n).isdigit() or int(n) < 1:
            raise SpecdecError(f"{where}: row count {n!r} is not an integer >= 1")
        number(cost, f"{where}[{n}]", 0, low_open=True)
