"""The decode loop: prefill, then rounds of draft -> verify in one target pass -> accept -> stream.

A static batch of sequences decodes together, each row with its own accepted length, in one target pass per
round. Rollback is free: the target's KV cache is addressed by position, and a row's length advances only
by what was accepted (see specdec.models.transformer).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specdec.drafters.base import Drafter, NoDrafter
from specdec.engine.policy import AutoK, FixedK
from specdec.engine.stats import AcceptanceMeter, RequestStats, RoundRecord
from specdec.errors import SpecdecError
from specdec.sampling.lossy import verify_typical_lossy
from specdec.sampling.verify import PAD, VerifyOutput, draw_random, rejection_sample, verify_greedy
from specdec.sampling.warp import SamplingConfig, warp_probs


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: tuple[str, ...] = ()  # stop strings: generation ends when the text contains one (it is cut off)
    lossy_typical_acceptance: bool = False  # LOSSY: Medusa-style typical acceptance; output is not the target's

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise SpecdecError(f"max new tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str
    finish_reason: str  # "eos" | "stop" | "length"
    stats: RequestStats
    origins: list[str]  # per generated token: "prefill" | "accepted" | "recovered" | "bonus"


# on_tokens(row, token_ids, origins) is called as tokens become final
TokenCallback = Callable[[int, list[int], list[str]], None]


class Engine:
    def __init__(self, model, tokenizer, device: str = "cpu"):
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.meter = AcceptanceMeter()  # running acceptance rate across requests

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        cfg: GenerationConfig,
        drafter: Drafter | None = None,
        k: int | FixedK | AutoK = 5,
        on_tokens: TokenCallback | None = None,
    ) -> list[GenerationResult]:
        drafter = drafter or NoDrafter()
        policy = FixedK(k) if isinstance(k, int) else k
        if isinstance(drafter, NoDrafter):
            policy = FixedK(1)  # unused: nothing is drafted
        return _Run(self, prompts, cfg, drafter, policy, on_tokens).run()


def verify_round(
    tokens: torch.Tensor,  # [B, k] long, PAD-padded drafts
    draft_probs: torch.Tensor | None,  # [B, k, vocab] the drafter's warped q, or None (q one-hot)
    logits: torch.Tensor,  # [B, k+1, vocab] the target's logits over the last token and the drafts
    sampling: SamplingConfig,
    generator: torch.Generator,
    lossy_typical: bool = False,
) -> VerifyOutput:
    """One round's verification, as the engine runs it: greedy, exact rejection sampling against the warped
    target, or (opt-in, LOSSY) typical acceptance."""
    b, k = tokens.shape
    if lossy_typical:
        _, noise = draw_random(b, 0, logits.shape[-1], generator, logits.device)
        return verify_typical_lossy(tokens, warp_probs(logits, sampling) if not sampling.greedy else
                                    torch.softmax(logits.float(), -1), noise)
    if sampling.greedy:
        return verify_greedy(tokens, logits)
    u, noise = draw_random(b, k, logits.shape[-1], generator, logits.device)
    return rejection_sample(tokens, draft_probs, warp_probs(logits, sampling), u, noise)


class _Run:
    """One call to Engine.generate: the state of a static batch."""

    def __init__(self, engine: Engine, prompts, cfg: GenerationConfig, drafter, policy, on_tokens):
        self.engine, self.cfg, self.drafter, self.policy, self.on_tokens = engine, cfg, drafter, policy, on_tokens
        self.model, self.tok = engine.model, engine.tokenizer
        self.prompts = [list(p) for p in prompts]
        if not self.prompts or any(len(p) == 0 for p in self.prompts):
            raise SpecdecError("every prompt needs at least one token")
        limit = self.model.cfg.max_position_embeddings
        longest = max(len(p) for p in self.prompts)
        if longest + 1 > limit:
            raise SpecdecError(f"prompt of {longest} tokens does not fit the model's context of {limit}")
        self.capacity = min(limit, longest + cfg.max_new_tokens + policy.max_k + 2)
        s = cfg.sampling
        self.gen = torch.Generator(device=engine.device)
        self.gen.manual_seed(s.seed if s.seed is not None else int(torch.randint(0, 2**62, ()).item()))
        b = len(self.prompts)
        self.out: list[list[int]] = [[] for _ in range(b)]
        self.origins: list[list[str]] = [[] for _ in range(b)]
        self.finish: list[str | None] = [None] * b
        self.stats = [RequestStats(prompt_tokens=len(p)) for p in self.prompts]

    # --- the loop ----------------------------------------------------------------------------------------

    def run(self) -> list[GenerationResult]:
        t0 = time.perf_counter()
        b = len(self.prompts)
        self.drafter.begin(self.prompts, self.capacity, self.cfg.sampling)
        cache = self.model.new_cache(b, self.capacity)
        lengths = torch.tensor([len(p) for p in self.prompts])  # [B]: positions with valid KV
        padded = torch.zeros(b, int(lengths.max()), dtype=torch.long)
        for r, p in enumerate(self.prompts):
            padded[r, : len(p)] = torch.tensor(p)
        logits = self.model.forward(padded, torch.zeros(b, dtype=torch.long), cache,
                                    last_only=lengths - 1, prefill=True)  # [B, vocab]
        first = self._sample_plain(logits)  # [B]
        now = time.perf_counter() - t0
        for r in range(b):
            self.stats[r].ttft_s = now
            self._emit(r, [int(first[r])], ["prefill"], now)

        while True:
            for r in range(b):  # a row whose context fills the cache cannot take another pass
                if self.finish[r] is None and int(lengths[r]) >= self.capacity:
                    self.finish[r] = "length"
            if all(self.finish):
                break
            active = [f is None for f in self.finish]
            live = torch.tensor(active)  # [B]
            contexts = [p + o for p, o in zip(self.prompts, self.out)]
            k = max(self.policy.choose(s.drafted, s.accepted) for s, on in zip(self.stats, active) if on)
            if isinstance(self.drafter, NoDrafter):
                k = 0
            k = max(0, min(k, self.capacity - 1 - int(lengths[live].max())))  # never write past the cache
            # finished rows ride along (static batch); keep their junk writes inside the cache too
            start = torch.where(live, lengths, lengths.clamp(max=self.capacity - 1 - k))  # [B]
            td = time.perf_counter()
            draft = self.drafter.propose(contexts, k, active) if k > 0 else None
            tokens = draft.tokens if draft is not None else torch.empty(b, 0, dtype=torch.long)  # [B, k]
            width = int((tokens >= 0).sum(dim=1).max()) if tokens.numel() else 0
            if width < tokens.shape[1]:  # verify only as many positions as some row drafted (n-gram misses)
                tokens = tokens[:, :width]  # [B, k']
                if draft.probs is not None:
                    draft.probs = draft.probs[:, :width]
            tv = time.perf_counter()
            last = torch.tensor([c[-1] for c in contexts]).view(b, 1)  # [B, 1]
            step_in = torch.cat([last, tokens.clamp(min=0)], dim=1)  # [B, k'+1]; PAD slots are junk, never read
            logits = self.model.forward(step_in, start, cache)  # [B, k'+1, vocab]
            out = verify_round(tokens, draft.probs if draft is not None else None, logits, self.cfg.sampling,
                               self.gen, self.cfg.lossy_typical_acceptance)
            t1 = time.perf_counter()
            num_acc = out.num_accepted.tolist()
            self.drafter.accepted(num_acc)
            now = t1 - t0
            for r in range(b):
                if not active[r]:
                    continue
                n = num_acc[r]
                drafted = [t for t in tokens[r].tolist() if t != PAD]
                emitted = out.tokens[r, : n + 1].tolist()
                kind = "bonus" if n == len(drafted) else "recovered"
                used = self._emit(r, emitted, ["accepted"] * n + [kind], now)
                self.stats[r].rounds.append(RoundRecord(
                    drafted=drafted, accepted=n, token=emitted[-1], kind=kind, emitted=used,
                    draft_s=tv - td, verify_s=t1 - tv, t=now))
                self.engine.meter.update(len(drafted), n)
            # the last token and the accepted drafts are now cached; finished rows stay where they are
            lengths = lengths + torch.where(live, out.num_accepted + 1, 0)

        total = time.perf_counter() - t0
        results = []
        for r in range(b):
            self.stats[r].total_s = total
            self.stats[r].generated_tokens = len(self.out[r])
            results.append(GenerationResult(self.out[r], self._text(r), self.finish[r], self.stats[r],
                                            self.origins[r]))
        return results

    # --- pieces ------------------------------------------------------------------------------------------

    def _sample_plain(self, logits: torch.Tensor) -> torch.Tensor:
        """One token per row from the (warped) target distribution. logits [B, vocab] -> [B]."""
        s = self.cfg.sampling
        if s.greedy:
            return logits.argmax(dim=-1)
        probs = warp_probs(logits, s)
        _, noise = draw_random(logits.shape[0], 0, logits.shape[-1], self.gen, logits.device)
        return (probs / noise).argmax(dim=-1)

    def _emit(self, r: int, token_ids: list[int], origins: list[str], now: float) -> int:
        """Append a row's new tokens, applying EOS, stop strings and the token budget. Returns how many stayed."""
        out, cfg = self.out[r], self.cfg
        eos = self.tok.eos_token_ids if self.tok else set()
        kept = []
        for t in token_ids:
            if t in eos:
                self.finish[r] = "eos"
                break
            kept.append(t)
            if len(out) + len(kept) >= cfg.max_new_tokens:
                self.finish[r] = "length"
                break
        if cfg.stop and self.tok and kept:
            kept = self._cut_at_stop(r, kept)
        out.extend(kept)
        self.origins[r].extend(origins[: len(kept)])
        self.stats[r].token_times.extend([now] * len(kept))
        if kept and self.on_tokens:
            self.on_tokens(r, kept, origins[: len(kept)])
        return len(kept)

    def _text(self, r: int) -> str:
        if not self.tok:
            return ""
        text = self.tok.decode(self.out[r])
        if self.finish[r] == "stop":
            text = text[: min(text.find(s) for s in self.cfg.stop if s in text)]
        return text

    def _cut_at_stop(self, r: int, kept: list[int]) -> list[int]:
        """Keep tokens up to the one that completes a stop string; the text is cut at the stop string."""
        base = self.out[r]
        for i in range(1, len(kept) + 1):
            text = self.tok.decode(base + kept[:i])
            if any(s in text for s in self.cfg.stop):
                self.finish[r] = "stop"
                return kept[:i]
        return kept
