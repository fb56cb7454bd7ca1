"""The torch path's layer math: RMSNorm, rotary embeddings (RopeTable, rotate), and attention.

Decode passes (one token, or a verify pass over k+1) use an attention formulation whose result for a query row is
bit-identical whatever the other rows, their number or the cache's filled length: keys are read in fixed chunks of
CHUNK positions, every matrix product has a fixed width, and query groups are padded to at least
MIN_QUERY_POSITIONS positions and split at MAX_QUERY_ROWS rows (MKL picks another kernel above ~32 rows).
Prefill uses torch's fused attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.models.kv_cache import CHUNK

MIN_QUERY_POSITIONS = 3
MAX_QUERY_ROWS = 30  # query rows (heads per group x positions) per matrix product
ROPE_BLOCK = 2048  # positions per block of the RoPE tables, which grow a block at a time as caches need them


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the rotate-half convention. x [B, n, heads, d]; cos/sin [B, n, 1, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class RopeTable:
    """cos and sin [positions, head_dim] of one RoPE base (rotate-half layout: each angle twice), built ROPE_BLOCK
    positions at a time, up to what the caches made so far can hold (new_cache). Blocks are appended, never
    recomputed, so a position's angles stay the ones every earlier pass used and cached keys stay exact. A whole
    table of 131,072 positions at a head_dim of 256 is 256 MB (cos and sin); for 4k-token caches it is 8 MB.
    `scale` multiplies both (LongRoPE's attention factor, as llama.cpp and transformers apply it)."""

    def __init__(self, inv_freq: torch.Tensor, limit: int, device: torch.device, scale: float = 1.0):
        self.inv_freq, self.limit, self.device = inv_freq, limit, device  # [d/2]; the model's positions
        self.scale = scale
        self.cos = self.sin = torch.empty(0, 2 * inv_freq.numel(), device=device)

    def cover(self, positions: int) -> bool:
        """Extend the tables to hold `positions` (at most the limit), in whole blocks; True when they grew (they are
        new tensors then)."""
        want, have = min(self.limit, -(-positions // ROPE_BLOCK) * ROPE_BLOCK), self.cos.shape[0]
        if want <= have:
            return False
        cos, sin = [self.cos], [self.sin]
        for a in range(have, want, ROPE_BLOCK):
            angles = torch.arange(a, min(want, a + ROPE_BLOCK)).float()[:, None] * self.inv_freq[None, :]
            angles = torch.cat([angles, angles], dim=-1).to(self.device)  # [block, d]
            cos.append(angles.cos() * self.scale if self.scale != 1.0 else angles.cos())
            sin.append(angles.sin() * self.scale if self.scale != 1.0 else angles.sin())
        self.cos, self.sin = torch.cat(cos), torch.cat(sin)
        return True


def visible(keypos: torch.Tensor, pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Which keys a query sees: key position <= query position, and within `window` of it when given (the
    sliding-window layers of Gemma 3)."""
    seen = keypos <= pos
    return seen if window is None else seen & (keypos > pos - window)


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """Gemma 2's soft capping: cap * tanh(x / cap), of attention scores and of the logits; cap 0: x itself."""
    return x if not cap else torch.tanh(x / cap) * cap


def attend_prefill(q, k_cache, v_cache, pos, scale: float | None = None, window: int | None = None,
                   cap: float = 0.0) -> torch.Tensor:
    """q [B, n, hq, d] at positions pos [B, n]; returns [B, n, hq, d]. Fused attention, masked by position.
    scale: of the scores (default head_dim^-1/2); window: see visible(); cap: see softcap() (spelled out: the
    fused kernel has no cap)."""
    end = int(pos.max()) + 1
    keypos = torch.arange(end, device=q.device).view(1, 1, 1, end)
    mask = visible(keypos, pos.view(pos.shape[0], 1, -1, 1), window)  # [B, 1, n, end]
    k, v = k_cache[:, :, :end], v_cache[:, :, :end]  # [B, hk, end, d]
    if cap:
        group = q.shape[2] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [B, hq, end, d]
        s = torch.matmul(q.transpose(1, 2), k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
        s = softcap(s, cap).masked_fill(~mask, float("-inf"))  # [B, hq, n, end]
        return torch.matmul(torch.softmax(s, dim=-1), v).transpose(1, 2)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2)


def attend_decode(q, k_cache, v_cache, pos, group: int, scale: float | None = None,
                  window: int | None = None, cap: float = 0.0) -> torch.Tensor:
    """Batch-invariant attention for a few query positions. q [B, n, hq, d]; returns [B, n, hq, d]."""
    b, n, hq, d = q.shape
    per_call = max(1, MAX_QUERY_ROWS // group)  # positions per matrix product
    outs = []
    for s in range(0, n, per_call):
        outs.append(_attend_group(q[:, s:s + per_call], k_cache, v_cache, pos[:, s:s + per_call], group, scale,
                                  window, cap))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def _attend_group(q, k_cache, v_cache, pos, group: int, scale: float | None, window: int | None,
                  cap: float = 0.0) -> torch.Tensor:
    b, m, hq, d = q.shape
    real = m
    if m < MIN_QUERY_POSITIONS:  # pad with copies of the last query so every product has the same shape
        extra = MIN_QUERY_POSITIONS - m
        q = torch.cat([q, q[:, -1:].expand(b, extra, hq, d)], dim=1)
        pos = torch.cat([pos, pos[:, -1:].expand(b, extra)], dim=1)
        m = MIN_QUERY_POSITIONS
    hk = hq // group
    n_chunks = int(pos.max()) // CHUNK + 1
    length = n_chunks * CHUNK
    kc = k_cache[:, :, :length].view(b, hk, n_chunks, CHUNK, d)  # [B, hk, C#, C, d]
    vc = v_cache[:, :, :length].view(b, hk, n_chunks, CHUNK, d)
    qg = q.view(b, m, hk, group, d).permute(0, 2, 3, 1, 4).reshape(b, hk, 1, group * m, d)  # [B, hk, 1, g*m, d]
    s = torch.matmul(qg, kc.transpose(-1, -2)) * (d ** -0.5 if scale is None else scale)  # [B, hk, C#, g*m, C]
    s = softcap(s, cap).view(b, hk, n_chunks, group, m, CHUNK)
    keypos = torch.arange(length, device=q.device).view(1, 1, n_chunks, 1, 1, CHUNK)
    s = s.masked_fill(~visible(keypos, pos.view(b, 1, 1, 1, m, 1), window), float("-inf"))
    e = torch.exp(s - s.amax(dim=(2, 5), keepdim=True))  # [B, hk, C#, g, m, C]
    den = e.sum(dim=-1).sum(dim=2)  # [B, hk, g, m]
    num = torch.matmul(e.view(b, hk, n_chunks, group * m, CHUNK), vc).sum(dim=2)  # [B, hk, g*m, d]
    out = num.view(b, hk, group, m, d) / den.unsqueeze(-1)  # [B, hk, g, m, d]
    return out.permute(0, 3, 1, 2, 4).reshape(b, m, hq, d)[:, :real]
