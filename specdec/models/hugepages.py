"""Weights and KV caches on 2 MB pages, for the native kernels' streaming reads.

A decode pass reads every weight once, in long runs, and the KV cache of every layer. On 4 KB pages each run
crosses a page every 4 KB: the CPU's prefetchers stop at page boundaries and a virtual machine pays a nested
page walk for each TLB miss. On the bundled model (gguf-q16, 2 threads, context 472 to 512), a one-row pass ran
1.04x to 1.11x faster on 2 MB pages than on 4 KB pages with one model's passes back to back, as in decoding, and
1.14x to 1.18x when two copies alternate pass by pass (every pass from cold caches), measured side by side in one
process each time; `make gguf-bench` measures it again, with the memory the kernel granted (THP is best effort).

`Arena` packs tensors into 2 MB-aligned chunks and asks Linux to back them with transparent huge pages
(madvise MADV_HUGEPAGE, which works where /sys/kernel/mm/transparent_hugepage/enabled says `madvise` or
`always`). Where that is refused (another OS, THP off) the tensors are ordinary memory: placement changes
speed, never a result. SPECDEC_HUGEPAGES=0 turns it off, to measure what it buys.
"""

from __future__ import annotations

import mmap
import os

import torch

PAGE = 2 << 20  # bytes in a huge page
ALIGN = 64  # every tensor starts on a cache line


def enabled() -> bool:
    return os.environ.get("SPECDEC_HUGEPAGES", "1") != "0" and hasattr(mmap, "MADV_HUGEPAGE")


class Arena:
    """Copies tensors into chunks of at least `chunk` bytes, each 2 MB-aligned and advised as huge pages.

    Views of a chunk keep it alive, so the arena itself can be dropped once filled."""

    def __init__(self, chunk: int = 32 << 20, planes=None):
        self.chunk = chunk
        self.planes = planes  # plane_cache.PlaneCache (--map-weights): matrices' planes from its file, not here
        self.buf: torch.Tensor | None = None  # [bytes] uint8, the chunk being filled
        self.pos = self.end = 0
        self.advised = enabled()  # False: tensors are allocated as torch would

    def _grow(self, nbytes: int) -> None:
        # a mapping of its own, not the C heap's: freed memory that the heap hands out again may already sit on
        # 4 KB pages, and a fresh mapping faults its huge pages in on first touch
        size = max(self.chunk, -(-nbytes // PAGE) * PAGE)
        # private and anonymous (a shared mapping would be shmem, whose huge pages are configured apart); unmapped
        # when the last tensor viewing it is freed
        region = mmap.mmap(-1, size + PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.buf = torch.frombuffer(region, dtype=torch.uint8)  # [size + PAGE]: room to align
        start = -self.buf.data_ptr() % PAGE
        try:
            region.madvise(mmap.MADV_HUGEPAGE, start, size)
        except OSError:
            self.advised = False  # refused (THP off): ordinary pages from here on
        self.pos, self.end = start, start + size

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of `shape` in the arena."""
        if not self.advised:
            return torch.empty(shape, dtype=dtype)
        nbytes = max(1, torch.Size(shape).numel()) * dtype.itemsize
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
        """A tensor of zeros. In the arena it is not written: a fresh anonymous mapping reads as zeros and is
        backed by memory only where it is first written, so a KV pool sized for the model's whole context costs
        memory as its sequences grow, not at start (the arena never hands out memory twice)."""
        return self.empty(shape, dtype) if self.advised else lazy_zeros(shape, dtype)


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros in a fresh anonymous mapping of their own (on ordinary pages): backed by memory only where written,
    where torch.zeros writes, and so takes, every byte at once. Unmapped when the last view is freed."""
    n = torch.Size(shape).numel()
    region = mmap.mmap(-1, max(1, n * dtype.itemsize), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(region, dtype=torch.uint8).view(dtype)[:n].view(shape)
