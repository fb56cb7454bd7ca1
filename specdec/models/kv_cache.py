"""The KV cache, preallocated and addressed by position: a pass over tokens at positions [pos, pos + n) writes
their keys and values there, and every query attends to keys at positions <= its own. Rejecting a draft
therefore costs nothing: the sequence's length does not advance, and stale entries are masked out until the next
round overwrites them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.errors import SpecdecError
from specdec.models.config import ModelConfig
from specdec.models.hugepages import Arena, lazy_zeros

CHUNK = 64  # keys per attention block; cache capacity is a multiple of it


@dataclass(frozen=True)
class KvType:
    """A KV cache type of the native kernels, named as llama.cpp's --cache-type-k/--cache-type-v (the same name for
    keys and values). f16 is exact, the default; q8_0 and q4_0 quantize each 32 values of a key or value head to 8
    or 4 bits with one fp16 scale, as llama.cpp's blocks of those names do, so they change the model slightly (as
    gguf-q8 does), and speculation stays exact with respect to the model so configured."""

    name: str
    bits: int  # bits of a stored value, before its block's scale
    exact: bool  # the cache holds what the passes computed, rounded to fp16 only

    def block_bytes(self, head_dim: int) -> int:
        """Bytes of one head's CHUNK positions (keys or values) in the native cache."""
        if self.name == "f16":
            return CHUNK * head_dim * 2
        return CHUNK * (head_dim * self.bits // 8 + head_dim // 32 * 2)  # the values, then an fp16 scale per 32

    def bytes_per_value(self, head_dim: int) -> float:
        return self.block_bytes(head_dim) / (CHUNK * head_dim)

    def bytes_per_position(self, cfg: ModelConfig) -> int:
        """Keys and values of one position, every layer and KV head."""
        return 2 * cfg.num_layers * cfg.num_kv_heads * self.block_bytes(cfg.head_dim) // CHUNK


KV_TYPES = {t.name: t for t in (KvType("f16", 16, True), KvType("q8_0", 8, False), KvType("q4_0", 4, False))}
DEFAULT_KV = "f16"


def kv_type(name: str | None) -> KvType:
    """The type named `name` (None: the default), or a one-line SpecdecError."""
    if name is None:
        return KV_TYPES[DEFAULT_KV]
    if name not in KV_TYPES:
        raise SpecdecError(f"unknown KV cache type {name!r} (choose from {', '.join(KV_TYPES)}: llama.cpp's "
                           "--cache-type-k/-v names)")
    return KV_TYPES[name]


class KVCache:
    """Keys and values of `batch` sequences (slots), per layer.

    The torch path keeps [batch, kv_heads, capacity, head_dim] in fp32. The native kernels keep fp16 and store
    keys in blocks of CHUNK positions transposed, [batch, kv_heads, capacity / CHUNK, head_dim, CHUNK] (see
    kernels/attention.cpp); `keys` and `values` give those layouts as [batch, kv_heads, capacity, head_dim]. A
    quantized type (`kind`, KvType) keeps keys and values as bytes, [batch, kv_heads, capacity / CHUNK,
    block_bytes] each (laid out in kernels/attention_q.inc), which the kernels alone read.

    huge_pages (the native cache on CPU): on 2 MB pages, for a cache its sequences fill (a run's own, sized to its
    prompts). A server's pool holds --context positions a slot and its sequences mostly use a fraction: on 2 MB
    pages a slot's first sequence maps a huge page in each (layer, key or value, head) region it writes, so on the
    bundled model a fresh slot took 180 MB and its first prefill chunk 56-466 ms, where 4 KB pages took 1 MB and
    34-39 ms; once mapped, 4 KB pages made passes 1-10% slower, most at long contexts (scripts/kv_pages_bench.py,
    docs/results/kv-pages.md). A pool takes 4 KB pages (huge_pages False): memory as sequences fill it, and no
    stall on a slot's first request."""

    def __init__(self, cfg: ModelConfig, batch: int, capacity: int, device="cpu", dtype=torch.float32,
                 blocked: bool = False, huge_pages: bool = True, kind: KvType | None = None):
        self.capacity, self.blocked = math.ceil(capacity / CHUNK) * CHUNK, blocked
        self.kind = kind if kind is not None else KV_TYPES[DEFAULT_KV]
        hk, d = cfg.num_kv_heads, cfg.head_dim
        k_shape = (batch, hk, self.capacity // CHUNK, d, CHUNK) if blocked else (batch, hk, self.capacity, d)
        v_shape = (batch, hk, self.capacity, d)
        if not self.kind.exact:  # the kernels' bytes
            if not blocked:
                raise SpecdecError(f"a {self.kind.name} KV cache needs the native kernels")
            k_shape = v_shape = (batch, hk, self.capacity // CHUNK, self.kind.block_bytes(d))
            dtype = torch.uint8
        if blocked and huge_pages and torch.device(device).type == "cpu":  # the native kernels' cache: read by
            # every pass, so on huge pages (models/hugepages.py)
            arena = Arena()
            self.k = [arena.zeros(k_shape, dtype) for _ in range(cfg.num_layers)]
            self.v = [arena.zeros(v_shape, dtype) for _ in range(cfg.num_layers)]
            return
        if torch.device(device).type == "cpu":  # taking memory as sequences fill it, not all at start
            self.k = [lazy_zeros(k_shape, dtype) for _ in range(cfg.num_layers)]
            self.v = [lazy_zeros(v_shape, dtype) for _ in range(cfg.num_layers)]
            return
        self.k = [torch.zeros(k_shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(v_shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]

    def row(self, r: int) -> KVCache:
        """A view of sequence r alone (writes go to this cache)."""
        view = object.__new__(KVCache)
        view.capacity, view.blocked, view.kind = self.capacity, self.blocked, self.kind
        view.k, view.v = [t[r:r + 1] for t in self.k], [t[r:r + 1] for t in self.v]
        return view

    def keys(self, layer: int) -> torch.Tensor:
        """[batch, kv_heads, capacity, head_dim] (a copy when blocked; f16 and the torch path's fp32 only)."""
        if not self.kind.exact:
            raise SpecdecError(f"a {self.kind.name} cache is read by the native kernels alone")
        k = self.k[layer]
        return k.transpose(-1, -2).reshape(k.shape[0], k.shape[1], self.capacity, k.shape[3]) if self.blocked else k

    def values(self, layer: int) -> torch.Tensor:
        if not self.kind.exact:
            raise SpecdecError(f"a {self.kind.name} cache is read by the native kernels alone")
        return self.v[layer]

    def copy_positions(self, src: KVCache, src_slot: int, dst_slot: int, n: int) -> int:
        """Row dst_slot gets row src_slot of `src` (a cache of the same model) at positions [0, n); blocked, up
        to the end of the last block (positions past a sequence's length are never read before written).
        Returns the positions copied (n, or less where a cache is shorter)."""
        if src.kind != self.kind:
            raise SpecdecError(f"cannot copy a {src.kind.name} cache's positions into a {self.kind.name} one")
        n = max(0, min(n, self.capacity, src.capacity))
        if n == 0 or (src is self and src_slot == dst_slot):
            return n
        blocks = math.ceil(n / CHUNK)
        for k, v, sk, sv in zip(self.k, self.v, src.k, src.v):
            if self.blocked:
                k[dst_slot, :, :blocks] = sk[src_slot, :, :blocks]
                upto = blocks * CHUNK if self.kind.exact else blocks  # fp16 values by position, quantized by block
                v[dst_slot, :, :upto] = sv[src_slot, :, :upto]
            else:
                k[dst_slot, :, :n] = sk[src_slot, :, :n]
                v[dst_slot, :, :n] = sv[src_slot, :, :n]
        return n

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             pos: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Scatter keys/values k, v [B, n, hk, d] into caches [slots, hk, capacity, d] at positions pos [B, n] of
    slots rows [B] (slot b when None)."""
    b, n, hk, d = k.shape
    rows = torch.arange(b, device=k.device) if rows is None else rows
    index = rows.view(b, 1).expand(b, n)  # [B, n]
    k_cache.transpose(1, 2)[index, pos] = k  # cache viewed [slots, capacity, hk, d]
    v_cache.transpose(1, 2)[index, pos] = v


def slot_picker(rows: torch.Tensor) -> slice | torch.Tensor:
    """An index of a cache's slots that selects `rows`: a slice (a view) when they are a contiguous range, else
    the rows themselves (a copy)."""
    lo = int(rows[0])
    if bool((rows == torch.arange(lo, lo + rows.numel(), device=rows.device)).all()):
        return slice(lo, lo + rows.numel())
    return rows
