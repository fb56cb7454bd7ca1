"""A trained EAGLE-3 head as a drafter: it reads the target's hidden states at the positions it has verified.

The scheduler passes the target's features (`taps`) for every position the target has run, through
`features(slot, start, feats)`; the head keeps their fc projection per slot. To draft after a context of n tokens
it first feeds the head positions it has not fed yet (p < n, each with token p and the target's features at
p - 1), then drafts k tokens, each step feeding the token it just drafted with its own previous output. Its
keys and values are addressed by position, as the target's are: after verification the context positions are
valid and the drafted ones are overwritten by the next catch-up, so rollback is free. Positions whose features
never arrived (a prompt prefix copied from the prefix cache) read zeros: the drafts get worse, never wrong.

Drafting gives the head's warped distribution over its vocabulary, scattered into the target's, so sampling at
temperature > 0 stays exact through the rejection sampler.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.drafters.base import Draft, Drafter
from specdec.errors import SpecdecError
from specdec.heads.eagle import EagleHead
from specdec.sampling.verify import PAD, draw_random
from specdec.sampling.warp import SamplingConfig, warp_rows


class TorchHead:
    """The head's layer in torch, its keys and values fp32 [slots, positions, kv_heads, d] (heads/quantized.py
    has the native one, with the same interface)."""

    ROW_KEYS = 1 << 22  # keys and values gathered per chunk of rows (rows x positions x kv_heads x d floats)

    def __init__(self, head: EagleHead):
        self.head, self.cfg = head, head.cfg
        self.k = self.v = None

    def reserve(self, slots: int, capacity: int) -> None:
        c = self.cfg
        self.k = torch.zeros(slots, capacity, c.kv_heads, c.head_dim)  # [slots, positions, kv_heads, d]
        self.v = torch.zeros_like(self.k)

    def fc(self, feats: torch.Tensor) -> torch.Tensor:
        return self.head.fc(feats.float())

    def feed(self, slots: torch.Tensor, emb: torch.Tensor, g: torch.Tensor, pos: torch.Tensor,
             last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of any slots: emb, g [n, hidden] at positions pos [n] of slots [n] -> (out [n, hidden], logits
        [len(last), draft_vocab] of rows `last`), writing every row's keys and values first; each row attends to
        its slot's positions up to its own."""
        h, c = self.head, self.cfg
        q, k, v, res = h.qkv(emb, g, pos)  # q [n, heads, d], k, v [n, kv_heads, d]
        self.k[slots, pos], self.v[slots, pos] = k, v
        span = int(pos.max()) + 1
        att = torch.empty(q.shape[0], c.heads * c.head_dim)  # [n, heads * d]
        step = max(1, self.ROW_KEYS // (span * c.kv_heads * c.head_dim))
        for a in range(0, q.shape[0], step):  # each row gathers its slot's keys: chunks bound the memory
            r = slice(a, a + step)
            mask = torch.arange(span)[None, :] <= pos[r, None]  # [rows, span]
            att[r] = h.attend_rows(q[r], self.k[slots[r], :span], self.v[slots[r], :span], mask)
        out = h.mlp(att, res)
        return out, h.logits(out[last])


class EagleDrafter(Drafter):
    name = "eagle"
    free = False
    confident = True  # at temperature 0 (NaN otherwise): Draft.confidence is the head's top-1 probability
    learns = False
    catch_up_s = 0.0  # feeding the head the context's new positions is part of drafting here

    def __init__(self, head: EagleHead, embed: torch.Tensor, min_confidence: float = 0.0, seed_offset: int = 104729,
                 kernels=None):
        """embed [target_vocab, hidden]: the target's token embedding (the head shares it). min_confidence: at
        temperature 0, drafting stops before the product of the drafted tokens' head probabilities (the head's
        own estimate that the whole draft is accepted) falls below it, first token included, so a row drafts
        fewer tokens, or none, where the head is unsure. Each token's probability is returned as its confidence
        (at temperature 0), from which the auto policy keeps the part of a draft that pays. kernels: the native
        CPU kernels (specdec.kernels.decode_kernels()) to run the head's layer on, or None for torch."""
        if not 0.0 <= min_confidence < 1.0:
            raise SpecdecError(f"min_confidence must be in [0, 1), got {min_confidence}")
        self.min_confidence = min_confidence
        c = head.cfg
        if embed.shape != (c.target_vocab, c.hidden):
            raise SpecdecError(f"this draft head was trained for a target with {c.target_vocab} tokens of width "
                               f"{c.hidden}; the target has {embed.shape[0]} of width {embed.shape[1]}")
        self.head, self.embed, self.seed_offset = head.eval(), embed.float(), seed_offset
        self.layer = TorchHead(self.head)  # runs the layer: in torch, or natively where the kernels are at hand
        if kernels is not None:
            from specdec.heads.quantized import KernelHead, supported

            if supported(self.head):
                self.layer = KernelHead(self.head, kernels)
        self.taps = tuple(c.taps)  # the target layers whose features the scheduler passes to `features`
        self.ids = head.target_ids()  # [draft_vocab] target id of each draft id
        self.g = None
        self.valid: dict[int, int] = {}  # per slot: head positions fed with the target's features
        # per slot: (start, the target's features from start) not yet through fc: projected when the head is next
        # asked, all at once (a round where a cascade's other member drafts, or none, then costs nothing here)
        self.pending: dict[int, list[tuple[int, torch.Tensor]]] = {}
        self.sampling: dict[int, SamplingConfig] = {}
        self.gen: dict[int, torch.Generator] = {}

    def reserve(self, slots: int, capacity: int, huge_pages: bool = True) -> int:  # its caches: torch's
        c = self.head.cfg
        capacity = min(capacity, c.max_positions)
        self.layer.reserve(slots, capacity)
        self.g = torch.zeros(slots, capacity, c.hidden)  # [slots, positions, hidden]: fc(target features at p)
        return capacity

    def open(self, slot: int, prompt: Sequence[int], sampling: SamplingConfig) -> None:
        self.valid[slot], self.sampling[slot], self.pending[slot] = 0, sampling, []
        self.g[slot].zero_()
        g = torch.Generator()
        g.manual_seed((sampling.seed if sampling.seed is not None else int(torch.randint(0, 2**62, ()).item()))
                      + self.seed_offset)
        self.gen[slot] = g

    def close(self, slot: int) -> None:
        for d in (self.valid, self.sampling, self.gen, self.pending):
            d.pop(slot, None)

    @torch.inference_mode()
    def features(self, slot: int, start: int, feats: torch.Tensor) -> None:
        """The target's features [m, taps * hidden] at positions start .. start + m - 1 of the slot's sequence."""
        end = min(start + feats.shape[0], self.g.shape[1])
        if end > start:
            self.pending.setdefault(slot, []).append((start, feats[: end - start]))
        self.valid[slot] = min(self.valid.get(slot, 0), start + 1)  # positions after start read new features

    def _project(self, slot: int) -> None:
        """g at the positions whose features arrived since the head last drafted for `slot`: one fc product."""
        todo = self.pending.get(slot)
        if not todo:
            return
        g = self.layer.fc(torch.cat([f for _, f in todo]))  # [sum m, hidden]
        off = 0
        for start, f in todo:  # in arrival order: a position sent twice keeps the later features
            self.g[slot, start:start + f.shape[0]] = g[off:off + f.shape[0]]
            off += f.shape[0]
        todo.clear()

    def _pick(self, logits: torch.Tensor, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                   torch.Tensor]:
        """Draft tokens for rows `slots` from draft logits [n, draft_vocab]: (target ids [n]; q over the target
        vocabulary [n, target_vocab] where a row samples, else None; the head's top-1 probability [n], the
        confidence of a greedy row). A sampling row draws its noise from its own generator."""
        x = self.ids[logits.argmax(-1)]  # [n]: greedy
        top = logits.float().softmax(-1).amax(-1)  # [n]
        sampled = [i for i, s in enumerate(slots) if not self.sampling[s].greedy]
        if not sampled:
            return x, None, top
        q = warp_rows(logits[sampled], [self.sampling[slots[i]] for i in sampled])  # [m, draft_vocab]
        noise = torch.cat([draw_random(1, 0, q.shape[-1], self.gen[slots[i]], q.device)[1] for i in sampled])
        x[sampled] = self.ids[(q / noise).argmax(-1)]
        full = torch.zeros(len(slots), self.head.cfg.target_vocab)  # [n, target_vocab]
        full[torch.tensor(sampled)[:, None], self.ids[None, :]] = q
        return x, full, top

    @torch.inference_mode()
    def propose(self, slots, contexts, ks) -> Draft:
        width, c = max(ks, default=0), self.head.cfg
        tokens = torch.full((len(slots), width), PAD, dtype=torch.long)  # [n, k]
        sampled = any(k > 0 and not self.sampling[s].greedy for s, k in zip(slots, ks))
        probs = torch.zeros(len(slots), width, c.target_vocab) if sampled else None  # [n, k, vocab]
        conf = torch.full((len(slots), width), float("nan"))  # [n, k]
        rows = [i for i, (ctx, k) in enumerate(zip(contexts, ks)) if k > 0 and len(ctx) + k <= self.g.shape[1]]
        if not rows:
            return Draft(tokens, probs, conf)
        # catch-up: every row's positions not yet fed (p with token p and fc(features at p - 1)), in one pass
        at, pos, ids, gs, last = [], [], [], [], []
        for i in rows:
            s, ctx = slots[i], contexts[i]
            n = len(ctx)
            a = min(self.valid[s], n - 1)
            self._project(s)
            g = self.g[s, max(a - 1, 0):n - 1]  # [n - a, hidden]: fc(features at p - 1) for p = a .. n - 1
            if a == 0:  # position 0 has no position before it
                g = torch.cat([torch.zeros(1, c.hidden), g])
            at += [s] * (n - a)
            pos += range(a, n)
            ids += ctx[a:n]
            gs.append(g)
            last.append(len(pos) - 1)
            self.valid[s] = n
        out, logits = self.layer.feed(torch.tensor(at), self.embed[torch.tensor(ids)], torch.cat(gs),
                                      torch.tensor(pos), torch.tensor(last))
        out = out[last]  # [r, hidden]: each row's last position
        sure = [1.0] * len(rows)  # at temperature 0: the head's probability that the row's draft so far is right
        live = list(range(len(rows)))  # indices into rows still drafting
        for j in range(width):
            x, q, top = self._pick(logits, [slots[rows[r]] for r in live])
            go = []  # (position in live, row index) of rows that draft token j + 1
            for t, r in enumerate(live):
                i = rows[r]
                if self.sampling[slots[i]].greedy:
                    sure[r] *= float(top[t])
                    if sure[r] < self.min_confidence:
                        continue  # this token and the rest are not drafted
                    conf[i, j] = float(top[t])
                tokens[i, j] = x[t]
                if probs is not None and q is not None and not self.sampling[slots[i]].greedy:
                    probs[i, j] = q[t]
                if j + 1 < ks[i]:
                    go.append((t, r))
            if not go:
                break
            pick = torch.tensor([t for t, _ in go])
            live = [r for _, r in go]
            out, logits = self.layer.feed(torch.tensor([slots[rows[r]] for r in live]), self.embed[x[pick]],
                                          out[pick], torch.tensor([len(contexts[rows[r]]) + j for r in live]),
                                          torch.arange(len(live)))
        return Draft(tokens, probs, conf)

    def accepted(self, slots, num_accepted) -> None:
        pass  # the accepted drafts' features arrive through `features`; their head positions are fed then
