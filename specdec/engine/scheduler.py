"""The step loop: requests join and leave a batch of slots over one preallocated KV pool.

`admit` queues a Sequence, `evict` removes one (its client left), and each `step()`:
  1. moves queued sequences into free slots (copying in the longest prefix of the prompt that the prefix
     cache holds, when there is one);
  2. prefills the next chunks of prompts still being prefilled (at most `prefill_chunk` tokens a step, or
     IDLE_CHUNKS times that while nothing decodes and chunking cannot change a prompt's cache; chunk
     boundaries fixed per prompt, so a prompt's prefill never depends on its company), and samples the
     first token of each prompt that completes;
  3. runs one decode round for every running sequence: the drafter drafts and the policy picks each row's k
     (0 allowed; engine/round.py `Round`), ONE ragged target pass scores every row's own drafts, and
     ONE call verifies every row, each with its own sampling settings and random stream (sampling/rounds.py);
     then the rows keep what was accepted, and the drafter and the policy learn from the round;
returning the events: tokens that became final and sequences that finished.

Rollback is free: the pool is addressed by position, and a row's length advances only by what was accepted.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec.drafters.base import Drafter, NoDrafter, pad_rows
from specdec.engine.policy import Never, Policy
from specdec.engine.prefix import PrefixCache
from specdec.engine.round import Choice, Round
from specdec.engine.sequence import GenerationConfig, Sequence, context_room
from specdec.engine.stats import RoundRecord
from specdec.errors import SpecdecError
from specdec.models.target import TargetTraits
from specdec.sampling.rounds import RowRule, draw_rows, sample_plain, verify_rows
from specdec.sampling.verify import VerifyOutput

# Prompt tokens prefilled per step. Measured on the bundled model (2 cores): 64-token chunks take 100-150 ms
# each, a 1,536-token prompt prefills as fast in them as in one pass (3.0 s), and streams already decoding wait
# one chunk between their rounds instead of the whole prompt.
PREFILL_CHUNK = 64
IDLE_CHUNKS = 4  # chunks per prefill pass while nothing decodes (only where chunking cannot change the cache)


class QueueFull(SpecdecError):
    """The waiting queue is at its limit: the caller should answer 503 and let the client retry."""


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int = 8  # slots in the KV pool: sequences decoding at once
    max_queue: int | None = 64  # sequences waiting for a slot (None: no limit)
    context: int | None = None  # positions per slot (default: the model's whole context)
    prefill_chunk: int | None = PREFILL_CHUNK  # prompt tokens prefilled per step (None: each prompt in one go)
    # the KV pool on 2 MB pages: only for a pool sized to its prompts (Engine.generate); a server's pool holds
    # `context` positions a slot, mostly unused, and on 2 MB pages each slot's first request stalls (see KVCache)
    kv_huge_pages: bool = False
    prefix_cache: int = 0  # finished prompts whose keys and values the scheduler keeps for reuse (0: none)

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise SpecdecError(f"max batch must be >= 1, got {self.max_batch}")
        if self.max_queue is not None and self.max_queue < 0:
            raise SpecdecError(f"max queue must be >= 0, got {self.max_queue}")
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise SpecdecError(f"prefill chunk must be >= 1 token, got {self.prefill_chunk}")
        if self.context is not None and self.context < 2:
            raise SpecdecError(f"context must be >= 2 positions, got {self.context}")


@dataclass
class Event:
    seq: Sequence
    tokens: list[int]  # tokens that became final this step (may be empty when the sequence just finished)
    origins: list[str]
    finished: bool


@dataclass(frozen=True)
class RoundReport:
    """One decode round, for metrics: per row (in the same order) tokens drafted and verified, accepted, and
    emitted; and the round's costs."""

    rows: list[Sequence]
    drafted: list[int]  # the drafts each row verified (0: the policy kept it plain)
    accepted: list[int]
    emitted: list[int]
    width: int  # token-rows in the round's target pass: sum(drafted) + rows
    draft_s: float  # drafting and choosing
    verify_s: float  # the target pass, verification and commit


RoundCallback = Callable[[RoundReport], None]  # after each decode round


class Scheduler:
    def __init__(self, model, tokenizer, drafter: Drafter | None = None, policy: Policy | None = None,
                 cfg: SchedulerConfig | None = None, prefix_cache: PrefixCache | None = None):
        self.model, self.tok = model, tokenizer
        self.target = TargetTraits.of(model)
        self.drafter = drafter or NoDrafter()
        # a caller's policy beside no drafter (a library call): plain decoding, as speculation() reads drafter none
        self.policy = Never() if isinstance(self.drafter, NoDrafter) or policy is None else policy
        self.cfg = cfg or SchedulerConfig()
        limit = model.cfg.max_position_embeddings
        self.context = min(self.cfg.context or limit, limit)  # tokens a sequence may hold, prompt included
        served = self.drafter.reserve(self.cfg.max_batch, self.context, huge_pages=self.cfg.kv_huge_pages)
        if served is not None and served < self.context:  # a draft model with a shorter context bounds it
            self.context = served
        self.cache = model.new_cache(self.cfg.max_batch, self.context, huge_pages=self.cfg.kv_huge_pages)
        self.kv_cache = self.target.kv_cache  # the pool's KV cache type, by name (models/kv_cache.py)
        # finished sequences' keys and values, reused by prompts that share them: a caller's own (an Engine keeps
        # one across its runs), else the scheduler's, where the target reuses keys exactly
        if prefix_cache is None and self.cfg.prefix_cache and self.target.exact_kv_reuse:
            prefix_cache = PrefixCache(model, self.cfg.prefix_cache, self.context)
        self.prefix = prefix_cache
        self.slots: list[Sequence | None] = [None] * self.cfg.max_batch
        self.waiting: deque[Sequence] = deque()
        self.eos = set(tokenizer.eos_token_ids) if tokenizer is not None else set()
        self.on_round: RoundCallback | None = None  # metrics
        # a drafter that reads the target's hidden states (a trained head) names the layers to tap
        if self.drafter.taps and not self.target.supports_taps:
            raise SpecdecError(f"the {self.drafter.name} drafter reads the target's hidden states, which this "
                               "model's forward pass does not expose")

    # --- membership --------------------------------------------------------------------------------------

    def new_sequence(self, prompt: list[int], cfg: GenerationConfig, rid: object = None) -> Sequence:
        """A request as this loop runs it: its random stream on the target's device, evidence for every draft
        position the policy may use."""
        return Sequence(prompt, cfg, rid, device=self.target.device, max_k=max(self.policy.max_k, 1))

    def check(self, seq: Sequence) -> None:
        """Refuse what can never run: a prompt with no room for one generated token."""
        context_room(seq.prompt_len, self.context)

    def check_queue(self, pending: int = 0) -> None:
        """The one queue-full rule: QueueFull when the sequences waiting for a slot (queued here, plus `pending`
        that a caller holds for this loop) outnumber the free slots by max_queue or more.

        Between a check and the admission of what it let through (the server's engine thread admits its inbox
        later), that count only shrinks: slots free up, queued sequences take slots or leave. So `admit`, which
        checks again, never refuses what an earlier check accepted, even when that check ran on another thread
        during a step (a step takes a slot before it shrinks the queue)."""
        limit = self.cfg.max_queue
        if limit is not None and len(self.waiting) + pending - len(self._free()) >= limit:
            raise QueueFull(f"the server is at capacity ({limit} requests waiting); retry later")

    def admit(self, seq: Sequence) -> None:
        """Queue a sequence; SpecdecError when it can never run, QueueFull when the queue is at its limit."""
        self.check(seq)
        self.check_queue()
        self.waiting.append(seq)  # seq.t0 stays its arrival: time to first token includes the wait

    def evict(self, seq: Sequence) -> None:
        """Remove a sequence wherever it is (its client left); its slot and KV rows are free at once."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq.slot is not None and self.slots[seq.slot] is seq:
            self._release(seq)
        if seq.finish is None:
            seq.finish = "abort"

    def _free(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s is None]

    def _release(self, seq: Sequence) -> None:
        if self.prefix is not None and seq.length > 0:  # positions [0, length) hold these tokens' keys
            self.prefix.store(seq.tokens[:min(seq.length, len(seq.tokens))], self.cache, seq.slot)
        self.drafter.close(seq.slot)
        self.slots[seq.slot] = None
        seq.slot = None

    @property
    def running(self) -> list[Sequence]:
        return [s for s in self.slots if s is not None]

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def load(self) -> tuple[int, int]:
        """(sequences in slots, sequences queued)"""
        return sum(s is not None for s in self.slots), len(self.waiting)

    @property
    def idle(self) -> bool:
        return not self.waiting and all(s is None for s in self.slots)

    def holds(self) -> set[int]:
        """id() of every sequence in a slot or the queue."""
        return {id(s) for s in self.slots if s is not None} | {id(s) for s in self.waiting}

    # --- a read-only view (counts only: nothing of a prompt) ---------------------------------------------

    def state(self) -> dict:
        """The KV pool's slots, the queue and the prefix cache, as counts. Exact between steps (the engine thread)."""
        busy = sum(s is not None for s in self.slots)
        out = {"slots_total": len(self.slots), "slots_busy": busy, "slots_free": len(self.slots) - busy,
               "queued": len(self.waiting)}
        if self.prefix is not None:
            out.update(self.prefix.state())
        return out

    def audit(self) -> list[str]:
        """Broken bookkeeping, one line each (none when consistent): a slot's sequence that does not know its
        slot or already finished, a queued sequence that holds a slot, a sequence in two places."""
        problems = []
        for i, s in enumerate(self.slots):
            if s is not None and (s.slot != i or s.finish is not None):
                problems.append(f"slot {i} holds a sequence with slot={s.slot}, finish={s.finish}")
        placed = [id(s) for s in self.slots if s is not None] + [id(s) for s in self.waiting]
        if len(placed) != len(set(placed)):
            problems.append("a sequence is in two places (slots or queue)")
        problems += [f"a queued sequence holds slot {s.slot}" for s in self.waiting if s.slot is not None]
        if self.prefix is not None:
            problems += self.prefix.audit()
        return problems

    # --- one step ----------------------------------------------------------------------------------------

    def step(self) -> list[Event]:
        events: list[Event] = []
        for slot in self._free():
            if not self.waiting:
                break
            # the slot is taken before the queue shrinks: a queue check from another thread in between counts
            # one waiting too many, never one too few (see check_queue)
            seq = self.slots[slot] = self.waiting[0]
            self.waiting.popleft()
            seq.slot, seq.length, seq.prefilled = slot, 0, 0
            if self.prefix is not None:  # a stored prefix of the prompt is copied in, not prefilled
                seq.length = seq.prefilled = seq.stats.cached_tokens = self.prefix.load(seq.prompt, self.cache, slot)
            self.drafter.open(slot, seq.prompt, seq.cfg.sampling)
        events += self._prefill()
        events += self._decode()
        for e in events:
            if e.finished and e.seq.slot is not None:
                self._release(e.seq)
        return events

    def _prefill(self) -> list[Event]:
        """Prefill chunks, oldest prompt first, while the step's budget lasts (always at least one chunk)."""
        events, spent = [], 0
        # Where a prompt's keys do not depend on its chunking (the native kernels), and no sequence waits for a
        # decode round, several chunks go in one pass: each pass reads all the weights, so fewer passes are faster.
        idle = not any(s.running for s in self.slots if s is not None)
        span = IDLE_CHUNKS if idle and self.target.exact_kv_reuse else 1
        budget = (self.cfg.prefill_chunk or float("inf")) * span
        for seq in sorted((s for s in self.slots if s is not None and s.prefilled < s.prompt_len),
                          key=lambda s: s.t0):
            size = self.cfg.prefill_chunk or seq.prompt_len
            while seq.prefilled < seq.prompt_len:
                a = seq.prefilled
                b = min(seq.prompt_len, (a // size + span) * size)  # fixed boundaries: multiples of the chunk size
                if spent and spent + b - a > budget:
                    return events
                args = (torch.tensor([seq.tokens[a:b]]), torch.tensor([a]), self.cache.row(seq.slot))
                last = torch.tensor([b - a - 1])
                if self.drafter.taps:
                    tapped = self.model.forward_tapped(*args, self.drafter.taps, last_only=last, prefill=True)
                    out = tapped.logits
                    self.drafter.features(seq.slot, a, tapped.features[0])  # [b - a, taps * hidden]
                else:
                    out = self.model.forward(*args, last_only=last, prefill=True)
                logits = out[0]  # [vocab]
                seq.prefilled = seq.length = b
                spent += b - a
            first = sample_plain(logits, seq.cfg.sampling, seq.generator)
            kept = seq.emit([first], ["prefill"], self.eos, self.tok)
            events.append(Event(seq, kept, ["prefill"] * len(kept), seq.finish is not None))
        return events

    # --- one decode round: draft, choose, score, verify, commit, observe ----------------------------------

    def _decode(self) -> list[Event]:
        rows = [s for s in self.slots if s is not None and s.running]
        for s in rows:  # a row whose context fills its slot cannot take another pass
            if s.length >= self.context:
                s.finish = "length"
        done = [Event(s, [], [], True) for s in rows if s.finish is not None]
        rows = [s for s in rows if s.finish is None]
        if not rows:
            return done
        rnd = Round(self.policy, self.drafter, rows, [s.slot for s in rows], [s.length for s in rows])
        td = time.perf_counter()
        # room: positions length..length+k must exist, and drafting past the token budget is wasted
        choice = rnd.choose([min(self.context - 1 - s.length, s.cfg.max_new_tokens - s.num_generated - 1)
                             for s in rows], all(s.cfg.sampling.greedy for s in rows))
        tv = time.perf_counter()
        logits, feats = self._score(rows, choice.drafts)
        out = self._verify(rows, choice, logits)
        accepted = out.num_accepted.tolist()  # per row
        events = self._commit(rows, choice, out, feats, tv - td, tv)
        verify_s = time.perf_counter() - tv
        rnd.learn(choice, accepted, len(logits), tv - td, verify_s)
        if self.on_round is not None:
            self.on_round(RoundReport(rows, [len(d) for d in choice.drafts], accepted, [len(e.tokens) for e in events],
                                      len(logits), tv - td, verify_s))
        return done + events

    def _score(self, rows: list[Sequence], drafts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ONE ragged target pass over every row's last token and its drafts, at the row's own positions.
        Returns logits [R, vocab] and the tapped features [R, taps * hidden] (None without taps), R = sum(k + 1)."""
        toks, sl, pos = [], [], []
        for s, dr in zip(rows, drafts):
            toks += [s.tokens[-1]] + dr
            sl += [s.slot] * (len(dr) + 1)
            pos += range(s.length, s.length + len(dr) + 1)
        args = (torch.tensor(toks), torch.tensor(sl), torch.tensor(pos), self.cache)
        if self.drafter.taps:
            tapped = self.model.forward_ragged_tapped(*args, self.drafter.taps)
            return tapped.logits, tapped.features
        return self.model.forward_ragged(*args), None

    def _verify(self, rows: list[Sequence], choice: Choice, logits: torch.Tensor) -> VerifyOutput:
        """Every row verified in one call, each by its own sampling settings and random stream."""
        lengths = [len(d) for d in choice.drafts]
        k = max(lengths)
        tokens = pad_rows(choice.drafts, k)  # [rows, k_max]
        probs = None if choice.probs is None else choice.probs[:, :k]  # [rows, k_max, vocab]
        rules = [RowRule(s.cfg.sampling, s.cfg.lossy_typical_acceptance) for s in rows]
        u, noise = draw_rows(rules, lengths, logits.shape[-1], [s.generator for s in rows], logits.device)
        return verify_rows(tokens, probs, logits, rules, u, noise)  # logits [R, vocab], flat as the pass gave them

    def _commit(self, rows: list[Sequence], choice: Choice, out: VerifyOutput, feats: torch.Tensor | None,
                draft_s: float, tv: float) -> list[Event]:
        """Each row keeps its accepted drafts and the target's own token; its length advances by as many. tv: when
        the target pass began (a row's verify time runs to when its tokens are out)."""
        events, off = [], 0
        for i, (s, dr) in enumerate(zip(rows, choice.drafts)):
            n, a = len(dr), int(out.num_accepted[i])
            if feats is not None:  # the target's features where it ran the kept tokens
                self.drafter.features(s.slot, s.length, feats[off:off + a + 1])
            off += n + 1
            emitted = out.tokens[i, : a + 1].tolist()
            kind = "bonus" if a == n else "recovered"
            kept = s.emit(emitted, ["accepted"] * a + [kind], self.eos, self.tok)
            s.length += a + 1
            s.record(n, a)
            t1 = time.perf_counter()
            s.stats.rounds.append(RoundRecord(drafted=dr, accepted=a, token=emitted[-1], kind=kind,
                                              emitted=len(kept), draft_s=draft_s, verify_s=t1 - tv, t=t1 - s.t0))
            events.append(Event(s, kept, (["accepted"] * a + [kind])[: len(kept)], s.finish is not None))
        return events

