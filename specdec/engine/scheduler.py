"""The step loop: requests join and leave a batch of slots over one preallocated KV pool.

`admit` queues a Sequence, `evict` removes one (its client left), and each `step()`:
  1. moves queued sequences into free slots (copying in the longest prefix of the prompt that the prefix
     cache holds, when there is one);
  2. prefills the next chunks of prompts still being prefilled (at most `prefill_chunk` tokens a step, or
     IDLE_CHUNKS times that while nothing decodes and chunking cannot change a prompt's cache; chunk
     boundaries fixed per prompt, so a prompt's prefill never depends on its company), and samples the
     first token of each prompt that completes;
  3. runs one decode round for every running sequence: the policy picks each row's k (0 allowed), the
     drafter drafts, ONE ragged target pass scores every row's own drafts, and each row is verified with its
     own sampling settings and random stream;
returning the events: tokens that became final and sequences that finished.

Rollback is free: the pool is addressed by position, and a row's length advances only by what was accepted.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass

import torch

from specdec.drafters.base import Drafter, NoDrafter
from specdec.engine.policy import Never, RowView
from specdec.engine.prefix import PrefixCache
from specdec.engine.sequence import Sequence
from specdec.engine.stats import AcceptanceMeter, RoundRecord
from specdec.errors import SpecdecError
from specdec.sampling.lossy import verify_typical_lossy
from specdec.sampling.verify import PAD, VerifyOutput, argmax_rows, draw_random, rejection_sample, verify_greedy
from specdec.sampling.warp import SamplingConfig, warp_probs

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


def verify_round(
    tokens: torch.Tensor,  # [B, k] long, PAD-padded drafts
    draft_probs: torch.Tensor | None,  # [B, k, vocab] the drafter's warped q, or None (q one-hot)
    logits: torch.Tensor,  # [B, k+1, vocab] the target's logits over the last token and the drafts
    sampling: SamplingConfig,
    generator: torch.Generator,
    lossy_typical: bool = False,
) -> VerifyOutput:
    """One round's verification: greedy, exact rejection sampling against the warped target, or (opt-in,
    LOSSY) typical acceptance."""
    b, k = tokens.shape
    if lossy_typical:
        _, noise = draw_random(b, 0, logits.shape[-1], generator, logits.device)
        return verify_typical_lossy(tokens, warp_probs(logits, sampling) if not sampling.greedy else
                                    torch.softmax(logits.float(), -1), noise)
    if sampling.greedy:
        return verify_greedy(tokens, logits)
    u, noise = draw_random(b, k, logits.shape[-1], generator, logits.device)
    return rejection_sample(tokens, draft_probs, warp_probs(logits, sampling), u, noise)


def sample_plain(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> int:
    """One token from the (warped) target distribution. logits [vocab]."""
    if sampling.greedy:
        return argmax_rows(logits)
    probs = warp_probs(logits.view(1, -1), sampling)  # [1, vocab]
    _, noise = draw_random(1, 0, logits.shape[-1], generator, logits.device)
    return int((probs / noise).argmax(dim=-1))


class Scheduler:
    def __init__(self, model, tokenizer, drafter: Drafter | None = None, policy=None,
                 cfg: SchedulerConfig | None = None, meter: AcceptanceMeter | None = None,
                 prefix_cache: PrefixCache | None = None):
        self.model, self.tok = model, tokenizer
        self.drafter = drafter or NoDrafter()
        self.policy = Never() if isinstance(self.drafter, NoDrafter) or policy is None else policy
        # drafts cut to what pays after drafting, from the drafter's confidence (the auto policy)
        self._trims = getattr(self.drafter, "confident", False) and hasattr(self.policy, "trim")
        self.cfg = cfg or SchedulerConfig()
        self.meter = meter or AcceptanceMeter()
        limit = model.cfg.max_position_embeddings
        self.context = min(self.cfg.context or limit, limit)  # tokens a sequence may hold, prompt included
        served = self.drafter.reserve(self.cfg.max_batch, self.context)
        if served is not None and served < self.context:  # a draft model with a shorter context bounds it
            self.context = served
        self.cache = model.new_cache(self.cfg.max_batch, self.context)
        self.prefix = prefix_cache  # finished sequences' keys and values, reused by prompts that share them
        self.slots: list[Sequence | None] = [None] * self.cfg.max_batch
        self.waiting: deque[Sequence] = deque()
        self.eos = set(tokenizer.eos_token_ids) if tokenizer is not None else set()
        self.device = getattr(model, "device", "cpu")
        self.on_round = None  # optional callback(seqs, drafted, accepted, emitted): metrics
        # a drafter that reads the target's hidden states (a trained head) names the layers to tap
        taps = tuple(getattr(self.drafter, "taps", ()))
        if taps and not getattr(model, "supports_taps", False):
            raise SpecdecError(f"the {self.drafter.name} drafter reads the target's hidden states, which this "
                               "model's forward pass does not expose")
        self._taps = {"taps": taps} if taps else {}

    # --- membership --------------------------------------------------------------------------------------

    def check(self, seq: Sequence) -> None:
        """Refuse what can never run: a prompt with no room for one generated token."""
        if seq.prompt_len + 1 > self.context:
            raise SpecdecError(f"prompt of {seq.prompt_len} tokens does not fit the context of {self.context}")

    def admit(self, seq: Sequence, check_queue: bool = True) -> None:
        """Queue a sequence; QueueFull when the queue is at its limit (unless the caller already decided)."""
        self.check(seq)
        if check_queue and self.cfg.max_queue is not None and len(self.waiting) >= self.cfg.max_queue \
                and not self._free():
            raise QueueFull(f"the queue is full ({self.cfg.max_queue} requests waiting)")
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
    def idle(self) -> bool:
        return not self.waiting and all(s is None for s in self.slots)

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
            seq = self.waiting.popleft()
            seq.slot, seq.length, seq.prefilled = slot, 0, 0
            if self.prefix is not None:  # a stored prefix of the prompt is copied in, not prefilled
                seq.length = seq.prefilled = seq.stats.cached_tokens = self.prefix.load(seq.prompt, self.cache, slot)
            self.slots[slot] = seq
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
        span = IDLE_CHUNKS if idle and getattr(self.model, "exact_kv_reuse", False) else 1
        budget = (self.cfg.prefill_chunk or float("inf")) * span
        for seq in sorted((s for s in self.slots if s is not None and s.prefilled < s.prompt_len),
                          key=lambda s: s.t0):
            size = self.cfg.prefill_chunk or seq.prompt_len
            while seq.prefilled < seq.prompt_len:
                a = seq.prefilled
                b = min(seq.prompt_len, (a // size + span) * size)  # fixed boundaries: multiples of the chunk size
                if spent and spent + b - a > budget:
                    return events
                out = self.model.forward(torch.tensor([seq.tokens[a:b]]), torch.tensor([a]),
                                         self.cache.row(seq.slot), last_only=torch.tensor([b - a - 1]),
                                         prefill=True, **self._taps)
                if self._taps:
                    out, feats = out
                    self.drafter.features(seq.slot, a, feats[0])  # [b - a, taps * hidden]
                logits = out[0]  # [vocab]
                seq.prefilled = seq.length = b
                spent += b - a
            first = sample_plain(logits, seq.cfg.sampling, seq.generator)
            kept = seq.emit([first], ["prefill"], self.eos, self.tok)
            events.append(Event(seq, kept, ["prefill"] * len(kept), seq.finish is not None))
        return events

    def _decode(self) -> list[Event]:
        rows = [s for s in self.slots if s is not None and s.running]
        if not rows:
            return []
        for s in rows:  # a row whose context fills its slot cannot take another pass
            if s.length >= self.context:
                s.finish = "length"
        done = [Event(s, [], [], True) for s in rows if s.finish is not None]
        rows = [s for s in rows if s.finish is None]
        if not rows:
            return done
        # room: positions length..length+k must exist, and drafting past the token budget is wasted
        caps = [max(0, min(self.policy.max_k, self.context - 1 - s.length,
                           s.cfg.max_new_tokens - s.num_generated - 1)) for s in rows]
        slots = [s.slot for s in rows]
        contexts = [s.tokens for s in rows]
        depth = len(rows[0].judged)
        judged0 = [sum(s.judged[j] for s in rows) for j in range(depth)]  # evidence before this round
        hits0 = [sum(s.hits[j] for s in rows) for j in range(depth)]
        td = time.perf_counter()
        drafts: list[list[int]] = [[] for _ in rows]
        confidence: list[list[float]] | None = None  # per row, the kept drafts' confidences (trimmed rounds)
        steps = None  # drafting steps run, where more were drafted than kept
        probs = None
        trims = self._trims and any(caps) and all(s.cfg.sampling.greedy for s in rows)
        if (self.drafter.free and self.policy.max_k > 0) or trims:
            # drafts first, then the plan. A free drafter's cost nothing, and the ones not verified are
            # shadow-scored. A confident drafter's come with how sure it is of each token (it stops itself where
            # unsure), and the planner keeps the prefix of each draft that pays at the measured pass costs.
            # (Sampled rows' drafts come without confidences: they are planned before drafting, below.)
            d = self.drafter.propose(slots, contexts, caps)
            offered = [[t for t in row if t != PAD] for row in d.tokens.tolist()]
            views = [RowView(s.judged, s.hits, len(o)) for s, o in zip(rows, offered)]
            if self.drafter.free:
                # a lookup's confidences (its measured rate for matches as long) stand for the row's estimates
                # at any temperature: its q is one-hot, so they estimate acceptance there too
                if d.confidence is not None and hasattr(self.policy, "trim"):
                    ks = self.policy.trim(views, d.confidence.tolist())
                else:
                    ks = self.policy.plan(views)
                for s, o, k in zip(rows, offered, ks):
                    if k < len(o):
                        s.set_shadow(o, verified=k)
            else:
                steps = max(len(o) for o in offered)
                conf = d.confidence.tolist() if d.confidence is not None else [[math.nan] * steps for _ in rows]
                ks = self.policy.trim(views, conf)
                confidence = [c[:k] for c, k in zip(conf, ks)]
            drafts = [o[:k] for o, k in zip(offered, ks)]
            probs = d.probs  # [n, max k, vocab] or None
        else:
            ks = self.policy.plan([RowView(s.judged, s.hits, c) for s, c in zip(rows, caps)])
            if any(ks):
                d = self.drafter.propose(slots, contexts, ks)
                drafts = [[t for t in row if t != PAD][:k] for row, k in zip(d.tokens.tolist(), ks)]
                probs = d.probs  # [n, max k, vocab] or None
        tv = time.perf_counter()
        toks, sl, pos = [], [], []
        for s, dr in zip(rows, drafts):
            toks += [s.tokens[-1]] + dr
            sl += [s.slot] * (len(dr) + 1)
            pos += range(s.length, s.length + len(dr) + 1)
        logits = self.model.forward_ragged(torch.tensor(toks), torch.tensor(sl), torch.tensor(pos), self.cache,
                                           **self._taps)
        logits, feats = logits if self._taps else (logits, None)  # [R, vocab], [R, taps * hidden]
        events, off, accepted = list(done), 0, []
        for i, (s, dr) in enumerate(zip(rows, drafts)):
            n = len(dr)
            q = None if probs is None or s.cfg.sampling.greedy else probs[i:i + 1, :n]  # [1, n, vocab]
            out = verify_round(torch.tensor([dr], dtype=torch.long).view(1, n), q,
                               logits[off:off + n + 1].unsqueeze(0), s.cfg.sampling, s.generator,
                               s.cfg.lossy_typical_acceptance)
            off += n + 1
            a = int(out.num_accepted[0])
            accepted.append(a)
            if confidence is not None:  # the positions the target judged: a accepted, then one rejected
                self.policy.learn_confidence(confidence[i][: a + 1], a)
            if feats is not None:  # the target's features where it ran the kept tokens
                self.drafter.features(s.slot, s.length, feats[off - n - 1:off - n + a])
            emitted = out.tokens[0, : a + 1].tolist()
            kind = "bonus" if a == n else "recovered"
            kept = s.emit(emitted, ["accepted"] * a + [kind], self.eos, self.tok)
            s.length += a + 1
            s.record(n, a)
            t1 = time.perf_counter()
            s.stats.rounds.append(RoundRecord(drafted=dr, accepted=a, token=emitted[-1], kind=kind,
                                              emitted=len(kept), draft_s=tv - td, verify_s=t1 - tv,
                                              t=t1 - s.t0))
            self.meter.update(n, a)
            events.append(Event(s, kept, (["accepted"] * a + [kind])[: len(kept)], s.finish is not None))
        t1 = time.perf_counter()
        drafted = [len(d) for d in drafts]
        spec = [i for i, n in enumerate(drafted) if n]
        if spec:
            self.drafter.accepted([slots[i] for i in spec], [accepted[i] for i in spec])
        self.policy.observe(len(toks), t1 - tv, tv - td - getattr(self.drafter, "catch_up_s", 0.0),
                            max(drafted) if steps is None else steps)
        learn = getattr(self.policy, "learn", None)
        if learn is not None:  # the round's evidence, verified and shadow-scored, into the running prior
            learn([sum(s.judged[j] for s in rows) - b for j, b in enumerate(judged0)],
                  [sum(s.hits[j] for s in rows) - b for j, b in enumerate(hits0)])
        if self.on_round is not None:
            self.on_round(rows, drafted, accepted, [len(e.tokens) for e in events[len(done):]])
        return events
