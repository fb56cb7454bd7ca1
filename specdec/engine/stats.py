"""What a generation measured: one record per round per sequence, then totals per request.

Vocabulary as in specdec.sampling.verify: a round drafts tokens, the target accepts a prefix and adds one
token, recovered (after a rejection) or bonus (after full acceptance, or in a round that drafted nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.measure import Decay, acceptance
from specdec.measure import decode_tokens_per_s as decode_rate
from specdec.measure import inter_token_latencies as gaps
from specdec.measure import tokens_per_s as rate


@dataclass
class RoundRecord:
    drafted: list[int]  # tokens proposed for this sequence this round
    accepted: int  # how many of them the target kept
    token: int  # the target's own token: recovered or bonus
    kind: str  # "recovered" | "bonus"
    emitted: int  # tokens this round added to the output (fewer than accepted + 1 when a stop cut it)
    draft_s: float  # time spent drafting (whole batch)
    verify_s: float  # time in the target pass and the verification (whole batch)
    t: float  # seconds since the request started, when this round's tokens became available


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache
    generated_tokens: int = 0
    ttft_s: float = 0.0  # time to the first generated token (prefill)
    total_s: float = 0.0
    rounds: list[RoundRecord] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # when each generated token became available

    @property
    def drafted(self) -> int:
        return sum(len(r.drafted) for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)

    @property
    def alpha(self) -> float | None:
        """Acceptance rate: accepted / drafted tokens (None when nothing was drafted)."""
        return acceptance(self.accepted, self.drafted)

    @property
    def mean_tokens_per_round(self) -> float:
        """Generated tokens per target decode pass, bonus included (1.00 for plain decoding)."""
        n = sum(r.emitted for r in self.rounds)
        return n / len(self.rounds) if self.rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        return rate(self.generated_tokens, self.total_s)

    def survival_by_position(self) -> list[float]:
        """For each draft position i: of the rounds that drafted a token there, the share that accepted it (the
        draft survived to i + 1 tokens). Not the conditional per-position acceptance a_i of the theory
        (theory/economics.py conditional_acceptance), which counts only rounds that accepted every earlier one."""
        depth = max((len(r.drafted) for r in self.rounds), default=0)
        out = []
        for i in range(depth):
            drafted = [r for r in self.rounds if len(r.drafted) > i]
            out.append(sum(r.accepted > i for r in drafted) / len(drafted))
        return out

    def inter_token_latencies(self) -> list[float]:
        """Gaps between consecutive generated tokens (0 for tokens that arrive in the same round)."""
        return gaps(self.token_times)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first per second after the first: the decode phase, prefill excluded (0 without one)."""
        return decode_rate(self.generated_tokens, self.total_s, self.ttft_s) or 0.0

    @property
    def draft_s(self) -> float:
        return sum(r.draft_s for r in self.rounds)

    @property
    def verify_s(self) -> float:
        return sum(r.verify_s for r in self.rounds)

    def summary(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "rounds": len(self.rounds),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "alpha": self.alpha,
            "mean_tokens_per_round": self.mean_tokens_per_round,
            "survival_by_position": self.survival_by_position(),
            "tokens_per_s": self.tokens_per_s,
            "ttft_s": self.ttft_s,
            "total_s": self.total_s,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
        }


class DecayedRate:
    """Acceptance rate as an exponential moving average over drafted tokens (each one a 0/1 observation): the one
    moving average of acceptance in specdec (AcceptanceMeter's, and the server's exported gauge and drift).

    Kept as decayed sums of accepted and drafted tokens, so there is no start-up bias toward an initial value:
    evidence `half_life` drafted tokens old weighs half. Tokens of one round count as simultaneous."""

    def __init__(self, half_life: float):
        self.decay = Decay.with_half_life(half_life)
        self.accepted = 0.0
        self.drafted = 0.0

    def update(self, accepted: int, drafted: int) -> None:
        decay = self.decay.keep(drafted)
        self.accepted = self.accepted * decay + accepted
        self.drafted = self.drafted * decay + drafted

    @property
    def value(self) -> float | None:
        return acceptance(self.accepted, self.drafted)


class AcceptanceMeter:
    """An engine's running acceptance across its requests (benchmarks report it): totals and a DecayedRate."""

    def __init__(self, halflife_tokens: float = 500.0):
        self.drafted = 0
        self.accepted = 0
        self._rate = DecayedRate(halflife_tokens)

    def update(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.drafted += drafted
        self.accepted += accepted
        self._rate.update(accepted, drafted)

    @property
    def ema(self) -> float | None:
        return self._rate.value

    @property
    def alpha(self) -> float | None:
        return acceptance(self.accepted, self.drafted)
