"""The policy a command runs with, from how it was asked to speculate (engine/speculation.py) and what passes cost
here (engine/costs.py: the cached curve, or a `specdec profile` file, or learned from another engine's steps)."""

from __future__ import annotations

from specdec.engine.costs import target_profile
from specdec.engine.policy import Auto, FixedK, LearnedPassCost, Never, PassCost
from specdec.engine.speculation import Speculation


def make_policy(spec: Speculation, cost: PassCost | LearnedPassCost | None, free_drafts: bool,
                row_floor: float = 0.0, draft_step_s: float = 0.0):
    """`never`, `fixed` (k for every row), or `auto` with at most k drafts a row, priced by `cost` (None only for
    the first two). `free_drafts`: the drafter's unverified drafts are scored at no cost, so `auto` need not explore;
    `row_floor`: Auto.row_floor."""
    if spec.policy == "never":
        return Never()
    if spec.policy == "fixed":
        return FixedK(spec.k)
    return Auto(cost, max_k=spec.k, explore=not free_drafts, row_floor=row_floor, draft_step_s=draft_step_s)


def planned_cost(loaded, spec: Speculation, sequences: int = 1, profile: str | None = None,
                 quiet: bool = False) -> PassCost | None:
    """The pass costs `auto` plans with, for up to `sequences` rows of k + 1 tokens each (None for the other
    policies): `profile`'s curve where given, else this model's cached one (measured now, once, where none is)."""
    if spec.policy != "auto":
        return None
    return PassCost.from_profile(target_profile(loaded, sequences * (spec.k + 1), profile, quiet))


def policy_for(spec: Speculation, loaded, drafter):
    """The policy of one generation (generate, demo, the Python API). The drafter `none` has already made `spec`
    never (engine/speculation.py, the one place that says so)."""
    return make_policy(spec, planned_cost(loaded, spec), drafter.free, draft_step_s=measured_draft_step(drafter))


def measured_draft_step(drafter) -> float:
    """Seconds a drafting step costs where it was measured at load (a draft model's pass: runtime.build), so that
    `auto` prices a draft model's drafts from the first round; 0 elsewhere (prompt lookup costs next to nothing, and
    `auto` learns what drafting costs as rounds run either way)."""
    from specdec.drafters.draft_model import DraftModelDrafter

    members = getattr(drafter, "members", [drafter])  # a cascade costs at most its dearest member
    return max((m.cost.draft_s for m in members if isinstance(m, DraftModelDrafter) and m.cost is not None),
               default=0.0)
