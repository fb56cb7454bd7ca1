"""A small draft model that shares the target's tokenizer: k autoregressive steps per round.

It keeps its own position-addressed KV cache, one row per slot. Per slot it tracks how many context tokens
have valid keys and values there; after verification that count becomes the old context plus the accepted
drafts it already fed (all but the last drafted token), so rollback is free here too. Each slot warps with
its own request's sampling settings and draws from its own seeded stream, and the drafter returns its warped
distributions q, so sampling at temperature > 0 stays exact.

At load the two tokenizers must agree id for id (`check_compatible`), and the draft's cost c, its one-token pass
over the target's, is measured once (`draft_cost`): speculation with a draft model pays only while c is small.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.drafters.base import Draft, Drafter
from specdec.errors import SpecdecError
from specdec.models.target import TargetTraits
from specdec.models.timing import Tick, time_pairs
from specdec.sampling.verify import PAD, draw_random
from specdec.sampling.warp import SamplingConfig, warp_rows

PREFILL_ABOVE = 16  # feeds longer than this use the model's prefill attention


class DraftModelDrafter(Drafter):
    name = "draft-model"
    free = False
    confident = False
    taps = ()
    learns = False

    def __init__(self, model, target_vocab: int, seed_offset: int = 7919):
        self.model, self.target_vocab, self.seed_offset = model, target_vocab, seed_offset
        self.device = TargetTraits.of(model).device  # where its random streams live
        self.cache = None
        self.valid: dict[int, int] = {}  # per slot: context tokens whose keys/values are in the draft cache
        self.sampling: dict[int, SamplingConfig] = {}
        self.gen: dict[int, torch.Generator] = {}
        self._fed: dict[int, int] = {}  # per slot, after propose: drafted tokens fed beyond the context
        self.catch_up_s = 0.0  # of the last propose: feeding contexts, not drafting
        self.cost: DraftCost | None = None  # c, where it was measured at load (runtime.build)

    @staticmethod
    def check_compatible(target_tokenizer, draft_tokenizer) -> None:
        """Once, at load: the two models must share one vocabulary, or the draft's tokens mean nothing. The reason
        names the first id whose strings differ, or the sizes where one vocabulary is the other's beginning."""
        if target_tokenizer.fingerprint() == draft_tokenizer.fingerprint():
            return
        target, draft = _pieces(target_tokenizer), _pieces(draft_tokenizer)
        i = next((i for i, (t, d) in enumerate(zip(target, draft)) if t != d), None)
        if i is not None:
            raise SpecdecError(f"the draft's tokenizer differs from the target's at id {i}: {_shown(target[i])} "
                               f"(target) vs {_shown(draft[i])} (draft); a draft model must share the target's "
                               "vocabulary")
        raise SpecdecError(f"the draft's tokenizer differs from the target's: the target has {len(target)} tokens, "
                           f"the draft {len(draft)}, the first {min(len(target), len(draft))} alike; a draft model "
                           "must share the target's vocabulary")

    def reserve(self, slots: int, capacity: int, huge_pages: bool = True) -> int:
        capacity = min(capacity, self.model.cfg.max_position_embeddings)  # its own context may be shorter
        self.cache = self.model.new_cache(slots, capacity, huge_pages=huge_pages)
        return capacity

    def open(self, slot: int, prompt: Sequence[int], sampling: SamplingConfig) -> None:
        self.valid[slot], self._fed[slot], self.sampling[slot] = 0, 0, sampling
        g = torch.Generator(device=self.device)
        seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, ()).item())
        g.manual_seed(seed + self.seed_offset)
        self.gen[slot] = g

    def close(self, slot: int) -> None:
        for d in (self.valid, self._fed, self.sampling, self.gen):
            d.pop(slot, None)

    def _probs(self, logits: torch.Tensor, settings: list[SamplingConfig]) -> torch.Tensor:
        """Draft logits [n, draft_vocab], row i warped with settings[i] -> q [n, target_vocab] (a padded vocabulary
        is cut or zero-filled)."""
        q = warp_rows(logits, settings)
        v = self.target_vocab
        if q.shape[-1] > v:
            q = q[:, :v] / q[:, :v].sum(dim=-1, keepdim=True)
        elif q.shape[-1] < v:
            q = torch.cat([q, q.new_zeros(q.shape[0], v - q.shape[-1])], dim=-1)
        return q

    def _pick(self, q: torch.Tensor, slots: list[int]) -> torch.Tensor:
        """A draft token [n] from each row of q [n, vocab], a sampling row with its slot's own stream."""
        x = q.argmax(dim=-1)  # [n]
        sampled = [i for i, s in enumerate(slots) if not self.sampling[s].greedy]
        if sampled:
            noise = torch.cat([draw_random(1, 0, q.shape[-1], self.gen[slots[i]], q.device)[1] for i in sampled])
            x[sampled] = (q[sampled] / noise).argmax(dim=-1)
        return x

    def _catch_up(self, slots: list[int], feeds: list[list[int]]) -> torch.Tensor:
        """Feed each slot the context tokens its cache lacks; logits [n, vocab] after each slot's last one.
        Long feeds (a new prompt) take the prefill path, one slot at a time; the rest share one pass."""
        out: list[torch.Tensor | None] = [None] * len(slots)
        short = [i for i, f in enumerate(feeds) if len(f) <= PREFILL_ABOVE]
        for i, f in enumerate(feeds):
            if len(f) > PREFILL_ABOVE:
                s = slots[i]
                out[i] = self.model.forward(torch.tensor([f]), torch.tensor([self.valid[s]]), self.cache.row(s),
                                            last_only=torch.tensor([len(f) - 1]), prefill=True)[0]
        if short:
            toks, sl, pos, last = [], [], [], []
            for i in short:
                s, f = slots[i], feeds[i]
                toks += f
                sl += [s] * len(f)
                pos += range(self.valid[s], self.valid[s] + len(f))
                last.append(len(toks) - 1)
            logits = self.model.forward_ragged(torch.tensor(toks), torch.tensor(sl), torch.tensor(pos), self.cache,
                                               torch.tensor(last))  # [len(short), vocab]
            for j, i in enumerate(short):
                out[i] = logits[j]
        return torch.stack(out)  # [n, vocab]

    def propose(self, slots, contexts, ks) -> Draft:
        width = max(ks, default=0)
        tokens = torch.full((len(slots), width), PAD, dtype=torch.long)  # [n, k]
        rows = [i for i, k in enumerate(ks) if k > 0]
        if not rows:
            return Draft(tokens)
        act = [slots[i] for i in rows]
        feeds = [list(contexts[i][self.valid[slots[i]]:]) for i in rows]  # >= 1 token each
        for f in feeds:  # an id only the target has: any stand-in stays exact
            f[:] = [t if t < self.model.cfg.vocab_size else 0 for t in f]
        t0 = time.perf_counter()
        logits = self._catch_up(act, feeds)  # [m, vocab]
        self.catch_up_s = time.perf_counter() - t0  # a new prompt's prefill is not a drafting cost
        pos = [self.valid[s] + len(f) for s, f in zip(act, feeds)]  # where each slot's first draft goes
        sampled = any(not self.sampling[s].greedy for s in act)
        probs = torch.zeros(len(slots), width, self.target_vocab) if sampled else None  # [n, k, vocab]
        live = list(range(len(rows)))  # indices into rows still drafting
        for step in range(width):
            q = self._probs(logits[live], [self.sampling[act[j]] for j in live])  # [m, vocab]
            x = self._pick(q, [act[j] for j in live])  # [m]
            at = torch.tensor([rows[j] for j in live])
            tokens[at, step] = x
            if probs is not None:
                probs[at, step] = q
            picked = dict(zip(live, x.tolist()))
            nxt = [j for j in live if ks[rows[j]] > step + 1]
            if nxt:
                feed = [picked[j] for j in nxt]
                out = self.model.forward_ragged(torch.tensor(feed), torch.tensor([act[j] for j in nxt]),
                                                torch.tensor([pos[j] + step for j in nxt]), self.cache)
                logits = logits.clone()
                logits[nxt] = out
            live = nxt
        for j, s in enumerate(act):
            self.valid[s] = len(contexts[rows[j]])
            self._fed[s] = ks[rows[j]] - 1
        return Draft(tokens=tokens, probs=probs)

    def accepted(self, slots, num_accepted) -> None:
        for s, a in zip(slots, num_accepted):
            if s in self._fed:
                self.valid[s] += min(a, self._fed[s])
                self._fed[s] = 0


def _pieces(tokenizer) -> list[str | None]:
    """The vocabulary in id order (added tokens included; None at an id no token has)."""
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)  # {string: id}
    out: list[str | None] = [None] * (max(vocab.values(), default=-1) + 1)
    for piece, i in vocab.items():
        out[i] = piece
    return out


def _shown(piece: str | None) -> str:
    return "no token" if piece is None else repr(piece)


@dataclass(frozen=True)
class DraftCost:
    """A draft model's cost c: its one-token pass over the target's, both after the same context, the two models'
    passes alternated pass by pass (the order flipped every pair) so that a burst of other load on a shared machine
    meets both; c = the ratio of their medians."""

    c: float
    draft_s: float  # median seconds of the draft's one-token pass
    target_s: float  # ... and of the target's
    context: int  # cached tokens before each pass
    pairs: int
    seconds: float  # the measuring took, both prefills of the context included

    def line(self) -> str:
        return (f"c = {self.c:.3f} (its one-token pass {self.draft_s * 1e3:.1f} ms over the target's "
                f"{self.target_s * 1e3:.1f} ms, medians of {self.pairs} alternated pairs after {self.context} tokens; "
                f"measured in {self.seconds:.1f} s)")


def draft_cost(target, draft, context: int = 32, reps: int = 5, tick: Tick = lambda: None) -> DraftCost:
    """Measure c for `draft` (a model) drafting for `target`, after `context` tokens (fewer where a model holds
    fewer positions): a second or two for a 1B draft of an 8B target, the two prefills included. `specdec profile`
    and every load of a draft model measure it here."""
    started = time.perf_counter()
    room = min(target.cfg.max_position_embeddings, draft.cfg.max_position_embeddings) - 1  # a pass after context
    context = max(1, min(context, room - 1))
    target_s, draft_s = time_pairs(target, draft, context, reps, tick)
    t, d = statistics.median(target_s), statistics.median(draft_s)
    return DraftCost(d / t, d, t, context, reps, time.perf_counter() - started)
