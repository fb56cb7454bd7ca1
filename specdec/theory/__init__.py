"""When speculation pays: the closed-form model, the batch roofline, and a round simulator."""

from specdec.theory.economics import (
    BatchModel,
    CostCurve,
    Plan,
    batch_model,
    batch_ratio,
    describe_speedup,
    expected_tokens,
    max_useful_draft_cost,
    pass_cost,
    plan,
    speedup,
)
from specdec.theory.simulate import Simulation, simulate

__all__ = [
    "BatchModel", "CostCurve", "Plan", "Simulation", "batch_model", "batch_ratio", "describe_speedup",
    "expected_tokens", "max_useful_draft_cost", "pass_cost", "plan", "simulate", "speedup",
]
