"""A draft head's drafting step on the native kernels: one call runs its whole layer, with its matrices as Q8_0
blocks and activations in 15-bit blocks of 32 (the `gguf-q16` path's arithmetic), and its keys and values in the
target's fp16 cache layout.

In torch, a drafting step of the bundled head reads its 8.8 M weights in fp32 (35 MB) and runs about 60 small
operations: about 3 ms here, most of a `gguf-q16` target pass. Here it reads 9.4 MB in two calls. Its drafts
can differ from the torch head's where two of its logits nearly tie; the output never does (the target verifies
every draft, and at temperature > 0 the rejection sampler is given the distribution this head computes).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from specdec.heads.eagle import EagleHead
from specdec.kernels import pairs_layout
from specdec.models.gguf.weights import QTensor, planes
from specdec.models.kv_cache import CHUNK


def q8_0(w: torch.Tensor) -> QTensor:
    """w [N, K] (K a multiple of 32) as Q8_0 blocks, rounded as llama.cpp's quantizer does (gguf-py's)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    a = w.detach().float().numpy()
    return QTensor("Q8_0", np.ascontiguousarray(quantize(a, GGMLQuantizationType.Q8_0)), *a.shape)


def supported(head: EagleHead) -> bool:
    """Whether the native step computes this head's layer: widths in whole blocks, the residual taken before the
    hidden norm (as the bundled head and EAGLE-3's default have it)."""
    c = head.cfg
    return not c.norm_before_residual and c.hidden % 32 == 0 and c.intermediate % 32 == 0


class KernelHead:
    """The layer of `head` on `kernels` (specdec.kernels.decode_kernels()), for drafting (the same interface as
    drafters/eagle.TorchHead)."""

    def __init__(self, head: EagleHead, kernels):
        self.cfg, self.kernels = head.cfg, kernels
        paired = pairs_layout(kernels)

        def matrix(*ws: torch.Tensor):
            return kernels.QMatrix(*planes([q8_0(torch.cat(ws))], True, 16, paired))

        # fc in fp16: trained from an identity on the last tap, its blocks of 32 mix 1s with small weights that
        # Q8_0 would round away (the drafts' top-1 then changed at 6% of positions; in fp16, at 3% as elsewhere).
        # It runs once per verified position, not per drafting step
        self.fc_w = head.fc.weight.detach().half().contiguous()
        self.qkv = matrix(head.q_proj.weight, head.k_proj.weight, head.v_proj.weight)
        self.o, self.down = matrix(head.o_proj.weight), matrix(head.down_proj.weight)
        self.gate_up = matrix(head.gate_proj.weight, head.up_proj.weight)
        self.lm_head = matrix(head.lm_head.weight)
        self.norms = [t.detach().float().contiguous() for t in
                      (head.input_layernorm, head.hidden_norm, head.post_attention_layernorm, head.norm)]
        self.inv_freq = head.inv_freq.detach().float()  # [d]
        self.k = self.v = self.cos = self.sin = None

    def reserve(self, slots: int, capacity: int) -> None:
        c = self.cfg
        cap = math.ceil(capacity / CHUNK) * CHUNK  # the target's native cache layout (models/transformer.KVCache)
        self.k = torch.zeros(slots, c.kv_heads, cap // CHUNK, c.head_dim, CHUNK, dtype=torch.float16)
        self.v = torch.zeros(slots, c.kv_heads, cap, c.head_dim, dtype=torch.float16)
        ang = torch.arange(cap, dtype=torch.float32)[:, None] * self.inv_freq[None, :]  # [cap, d]
        self.cos, self.sin = ang.cos().contiguous(), ang.sin().contiguous()

    def fc(self, feats: torch.Tensor) -> torch.Tensor:
        """feats [m, taps * hidden] -> [m, hidden]."""
        return self.kernels.gemv_f16(feats.float().contiguous(), self.fc_w, None)

    def feed(self, slots: torch.Tensor, emb: torch.Tensor, g: torch.Tensor, pos: torch.Tensor,
             last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of any slots: emb, g [n, hidden] at positions pos [n] of slots [n] -> (out [n, hidden], logits
        [len(last), draft_vocab] of rows `last`), writing every row's keys and values; each row attends to its
        slot's positions up to its own. Each row is computed alone, in a fixed order (batch invariance)."""
        c = self.cfg
        x = g.float().contiguous().clone()  # [n, hidden]: becomes the layer's output
        e_norm, g_norm, post, final = self.norms
        self.kernels.eagle_block_gguf(x, emb.float().contiguous(), e_norm, slots, pos, g_norm, self.qkv, self.o,
                                      post, self.gate_up, self.down, self.k, self.v, self.cos, self.sin,
                                      c.heads, c.kv_heads, c.eps)
        return x, self.kernels.gemm_gguf(self.kernels.rms_norm(x[last].contiguous(), final, c.eps), self.lm_head)
