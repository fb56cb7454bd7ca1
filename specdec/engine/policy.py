"""How many tokens to draft each round: a fixed k, or k chosen per request from the running acceptance
estimate and the measured cost curve, through the same planner as `specdec plan`."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.theory.economics import CostCurve, check_k, plan, unit_verify_cost


@dataclass
class FixedK:
    k: int

    def __post_init__(self) -> None:
        check_k(self.k)

    def choose(self, drafted: int, accepted: int) -> int:
        return self.k

    @property
    def max_k(self) -> int:
        return self.k


@dataclass
class AutoK:
    """k = argmax_k speedup(a_hat, k, c) with a_hat the posterior mean of a Beta(prior_accepted, prior_rejected)
    prior updated by this request's drafted/accepted counts."""

    draft_cost: float = 0.0
    curve: CostCurve | None = None
    max_k: int = 12
    prior_accepted: float = 3.0  # a prior mean of 0.5 worth 6 drafted tokens
    prior_rejected: float = 3.0

    def alpha_hat(self, drafted: int, accepted: int) -> float:
        return (accepted + self.prior_accepted) / (drafted + self.prior_accepted + self.prior_rejected)

    def choose(self, drafted: int, accepted: int) -> int:
        a = self.alpha_hat(drafted, accepted)
        return plan(a, self.draft_cost, self.max_k, self.curve or unit_verify_cost).best_k
