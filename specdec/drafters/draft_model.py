"""A small draft model that shares the target's tokenizer: k autoregressive steps per round.

It keeps its own position-addressed KV cache. Per row it tracks how many context tokens have valid keys and
values there; after verification that count becomes the old context plus the accepted drafts it already
fed (all but the last drafted token), so rollback is free here too. It returns its warped distributions q,
so sampling at temperature > 0 stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.drafters.base import Draft
from specdec.errors import SpecdecError
from specdec.sampling.verify import draw_random
from specdec.sampling.warp import SamplingConfig, warp_probs

PREFILL_ABOVE = 16  # feeds longer than this use the model's prefill attention


class DraftModelDrafter:
    name = "draft-model"

    def __init__(self, model, target_vocab: int, seed_offset: int = 7919):
        self.model, self.target_vocab, self.seed_offset = model, target_vocab, seed_offset
        self.cache = None
        self.valid: list[int] = []  # per row: context tokens whose keys/values are in the draft cache
        self._fed: list[int] = []  # per row, after propose: context length + drafted tokens fed

    @staticmethod
    def check_compatible(target_tokenizer, draft_tokenizer) -> None:
        """Once, at load: the two models must share one vocabulary, or the draft's tokens mean nothing."""
        if target_tokenizer.fingerprint() != draft_tokenizer.fingerprint():
            raise SpecdecError("the draft model's tokenizer differs from the target's: a draft model must share "
                               f"the target's vocabulary ({draft_tokenizer.vocab_size} vs "
                               f"{target_tokenizer.vocab_size} tokens, or the same size with other tokens)")

    def begin(self, prompts: Sequence[Sequence[int]], capacity: int, sampling: SamplingConfig) -> None:
        self.sampling = sampling
        self.cache = self.model.new_cache(len(prompts), capacity)
        self.valid = [0] * len(prompts)
        self.gen = torch.Generator(device=getattr(self.model, "device", "cpu"))
        seed = sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, ()).item())
        self.gen.manual_seed(seed + self.seed_offset)

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [B, draft_vocab] -> q [B, target_vocab] (a padded vocabulary is cut or zero-filled)."""
        q = warp_probs(logits, self.sampling)
        v = self.target_vocab
        if q.shape[-1] > v:
            q = q[:, :v] / q[:, :v].sum(dim=-1, keepdim=True)
        elif q.shape[-1] < v:
            q = torch.cat([q, q.new_zeros(q.shape[0], v - q.shape[-1])], dim=-1)
        return q

    def _pick(self, q: torch.Tensor) -> torch.Tensor:
        if self.sampling.greedy:
            return q.argmax(dim=-1)
        _, noise = draw_random(q.shape[0], 0, q.shape[-1], self.gen, q.device)
        return (q / noise).argmax(dim=-1)

    def propose(self, contexts, k: int, active) -> Draft:
        b = len(contexts)
        # finished rows ride along with one junk token at position 0 and then hold nothing valid: writing where
        # their context ends could run past the cache once the context is full
        feed = [list(ctx[self.valid[r]:]) if on else [0] for r, (ctx, on) in enumerate(zip(contexts, active))]
        n = max(len(f) for f in feed)  # every active row feeds >= 1 token
        tokens = torch.zeros(b, n, dtype=torch.long)
        for r, f in enumerate(feed):
            tokens[r, : len(f)] = torch.tensor(f)
        tokens[tokens >= self.model.cfg.vocab_size] = 0  # an id only the target has: any stand-in stays exact
        start = torch.tensor([v if on else 0 for v, on in zip(self.valid, active)])  # [B]
        last = torch.tensor([len(f) - 1 for f in feed])
        logits = self.model.forward(tokens, start, self.cache, last_only=last, prefill=n > PREFILL_ABOVE)
        pos = start + torch.tensor([len(f) for f in feed])  # [B]: where the first drafted token goes
        drafted, probs = [], []
        for i in range(k):
            q = self._probs(logits)  # [B, vocab]
            x = self._pick(q)  # [B]
            drafted.append(x)
            probs.append(q)
            if i < k - 1:
                logits = self.model.forward(x.view(b, 1), pos + i, self.cache)[:, 0]
        self.valid = [len(c) if on else 0 for c, on in zip(contexts, active)]
        self._fed = k - 1
        tokens = torch.stack(drafted, dim=1)  # [B, k]
        inactive = ~torch.tensor(list(active), dtype=torch.bool)
        tokens[inactive] = -1
        q_all = None if self.sampling.greedy else torch.stack(probs, dim=1)  # [B, k, vocab]
        return Draft(tokens=tokens, probs=q_all)

    def accepted(self, num_accepted: Sequence[int]) -> None:
        self.valid = [v + min(a, self._fed) for v, a in zip(self.valid, num_accepted)]
