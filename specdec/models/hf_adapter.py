"""Fallback for architectures the compact transformer does not cover: transformers' AutoModelForCausalLM
behind the same forward() as specdec.models.transformer.Transformer. Rollback crops its cache. Slower, one
sequence at a time, and exact at fp32."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.errors import SpecdecError
from specdec.kernels.cores import before_pass


@dataclass
class HFCache:
    cache: object  # transformers DynamicCache
    capacity: int
    length: int = 0  # positions holding valid keys/values

    def row(self, r: int) -> HFCache:
        return self


class HFAdapter:
    def __init__(self, path: str | Path, device: str = "cpu", dtype=torch.float32):
        from transformers import AutoConfig, AutoModelForCausalLM

        self.path, self.device = Path(path), device
        self.hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        c = AutoConfig.from_pretrained(path)
        text = c.get_text_config() if hasattr(c, "get_text_config") else c
        self.cfg = _LooseConfig(vocab_size=text.vocab_size,
                                max_position_embeddings=getattr(text, "max_position_embeddings", 2048))
        self.precision = str(dtype).replace("torch.", "")

    @property
    def weight_bytes_per_token(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.hf.parameters())

    def new_cache(self, batch: int, capacity: int, huge_pages: bool = True) -> HFCache:  # huge_pages: unused
        from transformers import DynamicCache

        if batch != 1:
            raise SpecdecError("the transformers fallback decodes one sequence at a time (batch 1)")
        return HFCache(DynamicCache(), capacity)

    @torch.inference_mode()
    def forward(self, tokens, start, cache: HFCache, last_only=None, prefill: bool = False):
        before_pass()  # the thread team, resized when other processes take these cores (kernels/cores.py)
        s = int(start[0])
        if s < cache.length:
            cache.cache.crop(s - cache.length)  # rollback: forget the rejected tail (transformers 5: a negative count)
        elif s > cache.length:
            raise SpecdecError(f"cache holds {cache.length} positions, asked to continue at {s}")
        n = tokens.shape[1]
        pos = torch.arange(s, s + n, device=self.device).unsqueeze(0)
        out = self.hf(input_ids=tokens.to(self.device), past_key_values=cache.cache, position_ids=pos,
                      use_cache=True)
        cache.length = s + n
        logits = out.logits.float()  # [1, n, vocab]
        if last_only is not None:
            return logits[torch.arange(logits.shape[0]), last_only.to(self.device)]
        return logits

    def forward_ragged(self, tokens, slots, pos, cache: HFCache, select=None):
        """The ragged pass of the compact transformer, for its only shape here: one slot's rows."""
        if bool((slots != 0).any()):
            raise SpecdecError("the transformers fallback decodes one sequence at a time (batch 1)")
        logits = self.forward(tokens.view(1, -1), pos[:1], cache)[0]  # [R, vocab]
        return logits if select is None else logits[select.to(self.device)]


@dataclass(frozen=True)
class _LooseConfig:
    vocab_size: int
    max_position_embeddings: int

