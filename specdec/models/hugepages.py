"""Weights and KV caches on 2 MB pages, for the native kernels' streaming reads.

A decode pass reads every weight once, in long runs, and the KV cache of every layer. On 4 KB pages each run
crosses a page every 4 KB: the CPU's prefetchers stop at page boundaries and a virtual machine pays a nested
page walk for each TLB miss. Measured on the bundled model (gguf-q16, 2 threads, ctx 432), the decoder's
products took 15% less time on 2 MB pages (`scripts/gguf_bench.py` reports the pass with and without them).

`Arena` packs tensors into 2 MB-aligned chunks and asks Linux to back them with transparent huge pages
(madvise MADV_HUGEPAGE, which works where /sys/kernel/mm/transparent_hugepage/enabled says `madvise` or
`always`). Where that is refused (another OS, THP off) the tensors are ordinary memory: placement changes
speed, never a result. SPECDEC_HUGEPAGES=0 turns it off, to measure what it buys.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

import torch

PAGE = 2 << 20  # bytes in a huge page
ALIGN = 64  # every tensor starts on a cache line
MADV_HUGEPAGE = 14  # Linux's value (asm-generic/mman-common.h)


def enabled() -> bool:
    return os.environ.get("SPECDEC_HUGEPAGES", "1") != "0" and sys.platform.startswith("linux")


@functools.lru_cache(maxsize=1)
def _madvise():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.madvise
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
        return fn
    except (OSError, AttributeError):
        return None


class Arena:
    """Copies tensors into chunks of at least `chunk` bytes, each 2 MB-aligned and advised as huge pages.

    Views of a chunk keep it alive, so the arena itself can be dropped once filled."""

    def __init__(self, chunk: int = 32 << 20):
        self.chunk = chunk
        self.buf: torch.Tensor | None = None  # [bytes] uint8, the chunk being filled
        self.pos = self.end = 0
        self.advised = enabled() and _madvise() is not None  # False: tensors are allocated as torch would

    def _grow(self, nbytes: int) -> None:
        size = max(self.chunk, -(-nbytes // PAGE) * PAGE)
        self.buf = torch.empty(size + PAGE, dtype=torch.uint8)  # [size + PAGE]: room to align
        start = -self.buf.data_ptr() % PAGE
        if _madvise()(self.buf.data_ptr() + start, size, MADV_HUGEPAGE) != 0:
            self.advised = False  # refused (THP off): ordinary pages from here on
        self.pos, self.end = start, start + size

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of `shape` in the arena."""
        if not self.advised:
            return torch.empty(shape, dtype=dtype)
        nbytes = max(1, torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        pos = -(-self.pos // ALIGN) * ALIGN
        if self.buf is None or pos + nbytes > self.end:
            self._grow(nbytes)
            pos = self.pos
        self.pos = pos + nbytes
        return self.buf[pos:pos + nbytes].view(dtype)[: torch.Size(shape).numel()].view(shape)

    def put(self, t: torch.Tensor | None) -> torch.Tensor | None:
        """A copy of t (contiguous) in the arena; None stays None."""
        if t is None or t.device.type != "cpu":
            return t
        out = self.empty(tuple(t.shape), t.dtype)
        out.copy_(t)
        return out

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return self.empty(shape, dtype).zero_()
