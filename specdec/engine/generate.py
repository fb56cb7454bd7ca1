"""`Engine.generate`: admit every prompt into the step loop, step until all are done, return the results.

The step loop (specdec.engine.scheduler) is what a server runs too, so the engine tests that generate through
here guard the server's exactness as well.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace

from specdec.drafters.base import Drafter, NoDrafter
from specdec.engine.policy import Auto, FixedK, Never
from specdec.engine.prefix import PrefixCache
from specdec.engine.scheduler import PREFILL_CHUNK, RoundReport, Scheduler, SchedulerConfig
from specdec.engine.sequence import GenerationConfig, Sequence
from specdec.engine.speculation import DEFAULT_K
from specdec.engine.stats import AcceptanceMeter, RequestStats
from specdec.errors import SpecdecError
from specdec.models.target import TargetTraits


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str
    finish_reason: str  # "eos" | "stop" | "length"
    stats: RequestStats
    origins: list[str]  # per generated token: "prefill" | "accepted" | "recovered" | "bonus"


__all__ = ["Engine", "GenerationConfig", "GenerationResult"]

# on_tokens(row, token_ids, origins) is called as tokens become final
TokenCallback = Callable[[int, list[int], list[str]], None]


class Engine:
    def __init__(self, model, tokenizer, device: str = "cpu", prefix_cache: int = 0):
        """prefix_cache: how many finished sequences to keep (keys and values over the model's whole context)
        for later prompts that start the same way; 0 keeps none."""
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.meter = AcceptanceMeter()  # running acceptance rate across requests (benchmarks report it)
        self.prefix = PrefixCache(model, prefix_cache, model.cfg.max_position_embeddings) if prefix_cache else None
        self._sched: Scheduler | None = None  # the last call's step loop and KV pool, kept for the next call

    def check_prompts(self, prompts: Seq[Seq[int]]) -> None:
        """SpecdecError unless every prompt has a token and leaves room for one more in the model's context: what
        `generate` checks, for a caller to check before it spends time (a policy's calibration) on doomed input."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise SpecdecError("every prompt needs at least one token")
        limit, longest = self.model.cfg.max_position_embeddings, max(len(p) for p in prompts)
        if longest + 1 > limit:
            raise SpecdecError(f"prompt of {longest} tokens does not fit the model's context of {limit}")

    def generate(
        self,
        prompts: Seq[Seq[int]],
        cfg: GenerationConfig,
        drafter: Drafter | None = None,
        k: int | FixedK | Auto | Never = DEFAULT_K,
        on_tokens: TokenCallback | None = None,
        prefill_chunk: int | None = PREFILL_CHUNK,
    ) -> list[GenerationResult]:
        """Generate for every prompt at once. Row r samples from its own stream, seeded with seed + r when the
        sampling settings carry a seed. `k`: a policy (engine/calibrate.py: `policy_for` makes the one a command
        would run), or an integer for that many drafts every round (DEFAULT_K, the one default cap, by default)."""
        drafter = drafter or NoDrafter()
        policy = FixedK(k) if isinstance(k, int) else k
        self.check_prompts(prompts)
        limit, longest = self.model.cfg.max_position_embeddings, max(len(p) for p in prompts)
        context = min(limit, longest + cfg.max_new_tokens + policy.max_k + 2)
        sched = self._scheduler(drafter, policy, len(prompts), context, prefill_chunk)
        sched.on_round = self._meter_round
        seqs = []
        for r, p in enumerate(prompts):
            seed = cfg.sampling.seed
            row_cfg = cfg if seed is None or r == 0 else replace(cfg, sampling=replace(cfg.sampling, seed=seed + r))
            seqs.append(Sequence(list(p), row_cfg, rid=r, device=self.device, max_k=max(policy.max_k, 1)))
        for s in seqs:
            sched.admit(s)
        while not sched.idle:
            for e in sched.step():
                if e.tokens and on_tokens is not None:
                    on_tokens(e.seq.rid, e.tokens, e.origins)
                if e.finished:
                    e.seq.stats.total_s = time.perf_counter() - e.seq.t0
        results = []
        for s in seqs:
            s.stats.generated_tokens = s.num_generated
            results.append(GenerationResult(s.output, s.text(self.tokenizer), s.finish, s.stats, s.origins))
        return results

    def _scheduler(self, drafter: Drafter, policy, batch: int, context: int, prefill_chunk: int | None) -> Scheduler:
        """The last call's step loop and KV pool where they serve this call (the same drafter and policy, room for
        the batch and the context, the same prefill chunk): a Generator called again allocates nothing. Else a new
        one, sized for the larger of the two calls (and a new one where the model's KV cache type changed since, with
        a new prefix cache: the old one's entries are of the old type, and would never be found). Rows are
        batch-invariant, so the pool's size changes no value."""
        old, kv = self._sched, TargetTraits.of(self.model).kv_cache
        if old is not None and old.kv_cache != kv:  # the model's type changed
            old = None
        if self.prefix is not None and getattr(self.prefix.kind, "name", kv) != kv:
            self.prefix = PrefixCache(self.model, len(self.prefix.entries), self.model.cfg.max_position_embeddings)
        if old is not None and old.idle and old.drafter is drafter and old.policy is policy and \
                old.cfg.max_batch >= batch and old.context >= context and old.cfg.prefill_chunk == prefill_chunk:
            return old
        if old is not None and old.drafter is drafter and old.policy is policy:
            batch, context = max(batch, old.cfg.max_batch), max(context, old.context)
        self._sched = Scheduler(self.model, self.tokenizer, drafter, policy,
                                SchedulerConfig(max_batch=batch, max_queue=None, context=context,
                                                prefill_chunk=prefill_chunk, kv_huge_pages=True),  # sized to fill
                                prefix_cache=self.prefix)
        return self._sched

    def _meter_round(self, r: RoundReport) -> None:
        """A decode round into the running acceptance rate, row by row."""
        for d, a in zip(r.drafted, r.accepted):
            self.meter.update(d, a)
