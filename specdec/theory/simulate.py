"""The round simulator: acceptance abstracted into one rate a, rounds drawn at random."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specdec.theory.economics import (
    CostFn,
    check_alpha,
    check_cost,
    check_k,
    expected_tokens,
    speedup,
    unit_verify_cost,
)


@dataclass
class Simulation:
    alpha: float
    k: int
    draft_cost: float
    rounds: int
    tokens_per_round: float
    expected_tokens_per_round: float
    speedup: float
    predicted_speedup: float
    yield_histogram: dict[int, int]  # round yield (1..k+1) -> number of rounds

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["yield_histogram"] = {str(n): c for n, c in self.yield_histogram.items()}
        return d


def round_yields(a: float, k: int, rounds: int, rng: np.random.Generator) -> np.ndarray:
    """Tokens yielded by each of `rounds` rounds: the accepted prefix plus one target token. Drawn in blocks of
    about 4M draws (the same numbers as one draw of [rounds, k]), so memory stays small however many rounds."""
    block = max(1, (1 << 22) // k)
    out = np.empty(rounds, dtype=np.int64)
    for start in range(0, rounds, block):
        n = min(block, rounds - start)
        survives = rng.random((n, k)) < a  # [n, k]
        out[start:start + n] = np.cumprod(survives, axis=1).sum(axis=1) + 1  # the surviving prefix, plus one
    return out


def simulate(a: float, k: int, c: float, rounds: int, seed: int = 0,
             verify_cost: CostFn = unit_verify_cost) -> Simulation:
    a, k, c = check_alpha(a), check_k(k), check_cost(c)
    rounds = check_k(rounds, "rounds", 10**8)
    yields = round_yields(a, k, rounds, np.random.default_rng(seed))
    counts = np.bincount(yields, minlength=k + 2)[1:]
    measured = float(yields.mean())
    round_cost = verify_cost(k + 1) + k * c
    return Simulation(
        alpha=a, k=k, draft_cost=c, rounds=rounds,
        tokens_per_round=measured,
        expected_tokens_per_round=expected_tokens(a, k),
        speedup=measured / round_cost,
        predicted_speedup=speedup(a, k, c, verify_cost),
        yield_histogram={n + 1: int(cnt) for n, cnt in enumerate(counts)},
    )
