"""One speculative round, decided and learned in one place. The step loop (engine/scheduler.py) and the vLLM
proposer (integrations/vllm.py) both run their rounds through `Round`; neither keeps a copy of this logic.

A round over a batch of rows:

    choose   each row's drafts (0 allowed), by one of the strategies below       Round.choose (this file)
    score    one target pass over every row's last token and its drafts          scheduler._score; vLLM's own step
    verify   the rejection sampler, each row by its own sampling settings        sampling/verify.py
    commit   each row keeps its accepted drafts and the target's own token       scheduler._commit; vllm.Rows
    observe  the drafter, the policy's prior, confidence and pass costs learn    Round.learn (this file)

How a round chooses depends on its drafter, never on flags the caller combines:
- `PlanFirst`: the policy plans each row's k from the row's evidence, and the drafter drafts only that much (a draft
  model: every drafted token costs a step of it).
- `Lookup`: a free drafter (prompt lookup, suffix decoding) offers all the room, since its drafts cost nothing. The
  policy keeps the prefix of each that pays, by the lookup's own measured rates where it has them; the rest is
  shadow-scored against what the target emits (sequence.Evidence), which estimates acceptance without a pass.
- `Trimmed`: a confident drafter (a trained head) at temperature 0 offers all the room with its confidence in each
  token, and the policy keeps the prefix that pays at the measured pass costs. Sampled rows' drafts come without
  confidences, so they are planned first.
The policy itself (how many tokens pay) is engine/policy.py; the rows' evidence is engine/sequence.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.drafters.base import Drafter
from specdec.engine.policy import Policy, RowView, mean_context
from specdec.engine.sequence import Evidence
from specdec.sampling.verify import PAD


@dataclass
class Choice:
    """A round's drafts: per row the tokens to verify (none allowed), the drafter's q for them, and the drafting
    steps the round ran (what the policy's drafting cost is counted per). A planned round's choice."""

    drafts: list[list[int]]
    probs: torch.Tensor | None  # [rows, >= max k, vocab] q, or None (q one-hot)
    steps: int


@dataclass
class LookupChoice(Choice):
    """A free drafter's: all it offered per row; drafts[r] is the verified prefix, the rest is shadow-scored."""

    offered: list[list[int]]


@dataclass
class TrimmedChoice(Choice):
    """A confident drafter's: per row the kept drafts' confidences, which verification calibrates."""

    confidence: list[list[float]]


class PlanFirst:
    """Plan each row's k, then draft only that."""

    @staticmethod
    def choose(policy: Policy, drafter: Drafter, slots, contexts, rows: Sequence[RowView]) -> Choice:
        ks = policy.plan(rows)
        if not any(ks):
            return Choice([[] for _ in rows], None, 0)
        d = drafter.propose(slots, contexts, ks)
        drafts = [[t for t in row if t != PAD][:k] for row, k in zip(d.tokens.tolist(), ks)]
        return Choice(drafts, d.probs, max(len(x) for x in drafts))


def offers(drafter: Drafter, slots, contexts, rows: Sequence[RowView]):
    """All the room each row has, drafted: (the draft, each row's tokens without padding, the rows capped at what
    they were offered)."""
    d = drafter.propose(slots, contexts, [r.cap for r in rows])
    offered = [[t for t in row if t != PAD] for row in d.tokens.tolist()]
    return d, offered, [RowView(r.judged, r.hits, len(o), r.context) for r, o in zip(rows, offered)]


class Lookup:
    """A free drafter offers all the room; the policy keeps what pays, by the lookup's rates where it has them."""

    @staticmethod
    def choose(policy: Policy, drafter: Drafter, slots, contexts, rows: Sequence[RowView]) -> LookupChoice:
        d, offered, views = offers(drafter, slots, contexts, rows)
        # a lookup's confidences (its measured rate for matches as long) stand for the row's estimates at any
        # temperature: its q is one-hot, so they estimate acceptance there too
        if d.confidence is not None and policy.trims:
            ks = policy.trim(views, d.confidence.tolist())
        else:
            ks = policy.plan(views)
        drafts = [o[:k] for o, k in zip(offered, ks)]
        return LookupChoice(drafts, d.probs, max(len(x) for x in drafts), offered)


class Trimmed:
    """A confident drafter offers all the room with its confidence per token; the policy keeps what pays."""

    @staticmethod
    def choose(policy: Policy, drafter: Drafter, slots, contexts, rows: Sequence[RowView]) -> TrimmedChoice:
        d, offered, views = offers(drafter, slots, contexts, rows)
        steps = max(len(o) for o in offered)
        conf = d.confidence.tolist() if d.confidence is not None else [[math.nan] * steps for _ in rows]
        ks = policy.trim(views, conf)
        return TrimmedChoice([o[:k] for o, k in zip(offered, ks)], d.probs, steps,
                             [c[:k] for c, k in zip(conf, ks)])


def strategy(policy: Policy, drafter: Drafter, rows: Sequence[RowView], greedy: bool):
    """The way this round chooses (above); `greedy`: every row samples at temperature 0."""
    trims = policy.trims and drafter.confident and any(r.cap for r in rows) and greedy
    if not (drafter.free and policy.max_k > 0) and not trims:
        return PlanFirst
    return Lookup if drafter.free else Trimmed


def choose(policy: Policy, drafter: Drafter, slots: Sequence[int], contexts: Sequence[Sequence[int]],
           rows: Sequence[RowView], greedy: bool) -> Choice:
    """The round's per-row choice; rows[i].cap is the most row i may draft (cache room, token budget)."""
    return strategy(policy, drafter, rows, greedy).choose(policy, drafter, slots, contexts, rows)


def evidence_totals(rows: Sequence[Evidence]) -> tuple[list[int], list[int]]:
    """Per draft position, the drafts the rows have judged and accepted so far."""
    depth = len(rows[0].judged) if rows else 0
    return ([sum(r.judged[j] for r in rows) for j in range(depth)],
            [sum(r.hits[j] for r in rows) for j in range(depth)])


class Round:
    """One round over `rows` (sequence.Evidence: a step-loop Sequence, a row of vLLM's batch) in `slots`, each row
    after contexts[i] cached tokens (its sequence length: what the round's pass attends over; 0 or None: unknown,
    planned at the typical context). It notes what the rows had judged when it opened, so that `learn` takes this
    round's share of their evidence: what the target verified and what it shadow-scored. Open it before the round's
    tokens are committed."""

    def __init__(self, policy: Policy, drafter: Drafter, rows: Sequence[Evidence], slots: Sequence[int],
                 contexts: Sequence[int] | None = None):
        self.policy, self.drafter, self.rows, self.slots = policy, drafter, rows, list(slots)
        self.contexts = list(contexts) if contexts is not None else [0] * len(rows)
        self.before = evidence_totals(rows)

    def choose(self, room: Sequence[int], greedy: bool) -> Choice:
        """Each row's drafts; room[i]: the most tokens row i may take beyond its next one (cache, budget). A free
        drafter's drafts beyond those verified are handed to the row to shadow-score."""
        rows = [RowView(r.judged, r.hits, max(0, min(self.policy.max_k, n)), c)
                for r, n, c in zip(self.rows, room, self.contexts)]
        c = choose(self.policy, self.drafter, self.slots, [r.tokens for r in self.rows], rows, greedy)
        if isinstance(c, LookupChoice):
            for r, o, d in zip(self.rows, c.offered, c.drafts):
                if len(d) < len(o):
                    r.set_shadow(o, verified=len(d))
        return c

    def learn(self, choice: Choice, accepted: Sequence[int], width: int, draft_s: float, verify_s: float) -> None:
        """What the drafter and the policy learn from the round: the target accepted the first accepted[i] of
        choice.drafts[i]; its pass over `width` token-rows at the rows' contexts took verify_s (0: not a measure of
        the cost), drafting draft_s; and the evidence the rows gained since the round opened."""
        policy, drafter = self.policy, self.drafter
        spec = [i for i, d in enumerate(choice.drafts) if d]
        if spec:
            drafter.accepted([self.slots[i] for i in spec], [accepted[i] for i in spec])
        if isinstance(choice, TrimmedChoice):  # the positions the target judged: a accepted, then one rejected
            for c, a in zip(choice.confidence, accepted):
                policy.learn_confidence(c[: a + 1], a)
        policy.observe(width, verify_s, draft_s - drafter.catch_up_s, choice.steps, mean_context(self.contexts))
        judged, hits = evidence_totals(self.rows)  # verified and shadow-scored, into the running prior
        policy.learn([j - b for j, b in zip(judged, self.before[0])], [h - b for h, b in zip(hits, self.before[1])])
