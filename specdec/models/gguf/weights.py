"""A GGUF's quantized matrices as they are stored, for the native GGUF kernels (`--precision gguf`, `gguf-q16`,
`gguf-q8`).

Q5_0, Q5_1 and the K-quants (Q4_K, Q5_K, Q6_K) run on the integer paths (gguf-q16, gguf-q8) through
gguf_blocks.py's decoding and kernels/gguf_kq.inc; the exact path reads Q4_0, Q4_1 and Q8_0.

The kernels (specdec/kernels/gguf.cpp) read Q4_0, Q4_1 and Q8_0 blocks of 32 weights, split into planes so that a
tile loads each kind of value with one instruction: nibbles (or int8 quants), fp16 scales d, and for 4-bit blocks
fp16 minimums m (w = d q + m). Q4_0 (w = d (q - 8)) becomes m = -8 d, which is exact in fp16. The planes hold the
file's bytes (Q4_0 adds 2 bytes of m a block), and the values are the file's, bit for bit.

A file's matrices are read by its architecture's module (gguf_llama, gguf_gemma3: gguf_arch chooses), which puts Q
and K rows back in Hugging Face's rotate-half order where llama.cpp interleaved them, as the converted folder has
them, so one model can mix the paths: norms and the token embedding come from the folder.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specdec.errors import SpecdecError
from specdec.models.gguf import blocks as gguf_blocks
from specdec.models.gguf.file import open_gguf
from specdec.models.gguf.plane_cache import signature

# bytes per block of 32 weights, as stored in the file: the types every gguf precision reads
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
QK = 32
# the types the integer paths (gguf-q16, gguf-q8) also read: (bytes, weights) a block
INTEGER_ONLY = gguf_blocks.LAYOUT
KINDS = tuple(BLOCK_BYTES) + tuple(INTEGER_ONLY)


def row_bytes(kind: str, cols: int) -> int:
    if kind in BLOCK_BYTES:
        return cols // QK * BLOCK_BYTES[kind]
    size, per = INTEGER_ONLY[kind]
    return cols // per * size


@dataclass
class QTensor:
    """One matrix [rows, cols] as stored: `blocks` uint8 [rows, cols / 32 * BLOCK_BYTES[kind]]."""
    kind: str
    blocks: np.ndarray
    rows: int
    cols: int


def is_matrix(name: str, shape) -> bool:
    """Whether a GGUF tensor is one the kernels multiply by: a matrix, or a mixture's experts ([E, rows, cols]);
    not a vector, nor a router (ffn_gate_inp: F32 in every file, multiplied in fp32)."""
    return len(shape) >= 2 and not name.endswith("ffn_gate_inp.weight")


def runnable(path: Path, integer: bool = True) -> bool:
    """True when every matrix of the file is in a format these kernels read (`integer`: on gguf-q16 and gguf-q8)."""
    kinds = KINDS if integer else tuple(BLOCK_BYTES)
    try:
        return all(t.tensor_type.name in kinds for t in open_gguf(Path(path)).tensors if is_matrix(t.name, t.shape))
    except SpecdecError:
        return False


def fallback_note(path: Path) -> str | None:
    """The line a GGUF gets when its matrices cannot run on the kernels and it falls back to fp16: which types, what
    the kernels read, and what the fallback costs in bytes a token (None when every matrix is readable)."""
    reader = open_gguf(Path(path))
    mats = [t for t in reader.tensors if is_matrix(t.name, t.shape)]
    odd = sorted({t.tensor_type.name for t in mats} - set(KINDS))
    if not odd:
        return None
    stored = sum(int(t.n_bytes) for t in mats) / 1e9
    fp16 = sum(2 * int(t.n_elements) for t in mats) / 1e9
    return (f"specdec: {Path(path).name} holds {', '.join(odd)} matrices, which the native kernels do not read (they "
            f"read {', '.join(KINDS)}); running it dequantized in fp16: {fp16:.2f} GB of weights a token against "
            f"{stored:.2f} GB as stored")


def release_pages(tensors) -> None:
    """Let the OS take back the file pages the QTensors' blocks were read from (MADV_DONTNEED on their mappings): once
    the kernels hold their planes, keeping them would count the model twice in this process's memory. A later read
    (an embedding row) faults its pages back in from the file."""
    import mmap

    seen = set()
    for t in tensors:
        base = t.blocks
        while base is not None and not isinstance(base, np.memmap):
            base = base.base
        m = getattr(base, "_mmap", None)
        if m is not None and id(m) not in seen and hasattr(m, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            seen.add(id(m))
            try:
                m.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):  # a closed map, or a platform without it: only memory is at stake
                pass


class RowLookup:
    """A quantized [rows, cols] matrix whose rows are dequantized (as gguf-py does) when looked up: the token
    embedding of a lean folder (gguf_convert), where a full fp32 copy would cost 4 bytes a weight (2 GB at 8B)."""

    def __init__(self, t: QTensor):
        self.t = t
        self.shape = torch.Size((t.rows, t.cols))

    def __getitem__(self, index) -> torch.Tensor:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize as gguf_dequantize

        rows = torch.as_tensor(index, dtype=torch.int64)
        picked = self.t.blocks[rows.reshape(-1).numpy()]  # [n, row bytes]
        out = gguf_dequantize(picked, GGMLQuantizationType[self.t.kind]).reshape(-1, self.t.cols)
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(*rows.shape, self.t.cols)

    def float(self) -> RowLookup:
        return self

    def to(self, device) -> RowLookup:
        return self


def planes(parts: list[QTensor], interleave: bool, act_bits: int = 8, paired: bool = False) -> tuple:
    """The kernel's planes (kernels/gguf.cpp, QMatrix) of the matrices `parts` stacked by rows (a fused [q; k; v]
    or [gate; up]): (bits, N, K, q, d, m, rows, act_bits, paired).

    interleave=False (the exact path): row by row, q uint8 [N, K/32, 16] (the file's nibbles) or int8 [N, K/32, 32],
    d and m fp16 [N, K/32]. interleave=True (the integer paths, activation blocks of `act_bits` = 8 or 16): rows in
    groups of 8, padded with zero rows to a multiple of 8. 4-bit: q uint8 [G, K/32, 4, 32] (chunk c: register c in
    the low nibbles, c + 4 in the high ones), d and m fp16 [G, K/32, 8]; with `paired` (what the AVX512-VNNI build
    reads fastest: it takes two groups at a time), groups side by side in pairs, a zero group padding an odd count:
    q [G/2, K/32, 4, 2, 32], d and m [G/2, K/32, 2, 8]. 8-bit: q int8 [G, K/32, 8, 32], d fp16 [G, K/32, 8]; in
    pairs q [G/2, K/32, 8, 2, 32], d [G/2, K/32, 2, 8]."""
    bits = {8 if p.kind == "Q8_0" else 4 for p in parts}
    if len(bits) != 1 or len({p.cols for p in parts}) != 1:
        raise SpecdecError("a fused matrix mixes 4-bit and 8-bit blocks; use --precision fp16 for this file")
    bits = bits.pop()
    fields = [_fields(p) for p in parts]
    q = np.concatenate([f[0] for f in fields])  # [N, blocks, 16 or 32], as stored
    d = np.concatenate([f[1] for f in fields])  # [N, blocks]
    m = np.concatenate([f[2] for f in fields]) if bits == 4 else None
    n, k = q.shape[0], parts[0].cols
    if not interleave:
        return bits, n, k, *(_tensor(a) for a in (q, d, m)), True, act_bits, False
    if bits == 4:  # the stored byte j holds elements j (low nibble) and j + 16 (high)
        q = np.concatenate([q & 0x0F, q >> 4], axis=-1)  # [N, blocks, 32] in element order
    pad = -n % 8
    groups, blocks = (n + pad) // 8, k // QK

    def interleave(a: np.ndarray) -> np.ndarray:  # [N, blocks, ...] -> [groups, blocks, 8, ...] (row j last-but-one)
        a = np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)])
        return np.ascontiguousarray(a.reshape(groups, 8, blocks, *a.shape[2:]).swapaxes(1, 2))

    r = interleave(q.reshape(n, blocks, 8, 4))  # [G, blocks, j, k, t]
    r = np.ascontiguousarray(r.swapaxes(2, 3)).reshape(groups, blocks, 8, 32)  # register k: bytes [4 j + t]
    d, m = interleave(d), None if m is None else interleave(m)  # [G, blocks, 8]
    if bits == 4:
        r = (r[:, :, :4] | (r[:, :, 4:] << 4)).astype(np.uint8)  # [G, blocks, 4, 32]
    if paired:
        r, d = _pairs(r), _pairs(d)  # [G/2, blocks, 4 or 8, 2, 32], [G/2, blocks, 2, 8]
        m = None if m is None else _pairs(m)
    return bits, n, k, _tensor(r), _tensor(d), _tensor(m), False, act_bits, paired


def qmatrix(kernels, parts: list[QTensor], interleave: bool, act_bits: int = 8, paired: bool = False,
            put=lambda t: t, zeros=None, cache=None):
    """A kernels.QMatrix of `parts` stacked by rows, each tensor passed through `put` (an arena's, say). Parts of one
    kind (or Q4_0/Q4_1 together) make one matrix; mixed kinds (a Q4_K_M file's [q; k; v] with v in Q6_K) a stacked
    matrix whose parts each run on their own kernel. `zeros(shape, dtype)` (an arena's): where the native packer
    writes K-quant planes directly, so that loading writes them once, not into new memory and then into `put`'s.
    `cache` (plane_cache.PlaneCache, --map-weights): each matrix's planes come from its file, or are recorded for it."""
    kinds = {p.kind for p in parts}
    if not interleave and not kinds <= set(BLOCK_BYTES):
        odd = ", ".join(sorted(kinds - set(BLOCK_BYTES)))
        raise SpecdecError(f"--precision gguf (exact) reads {', '.join(BLOCK_BYTES)} blocks, not {odd}; run this file "
                           "on gguf-q16 or gguf-q8 (without --precision: the faster of the two here)")
    family = (lambda kind: "Q4" if kind in ("Q4_0", "Q4_1") else kind)  # kinds one matrix holds together
    if len({family(k) for k in kinds}) > 1:  # runs of one family, each a matrix of its own
        runs: list[list[QTensor]] = []
        for p in parts:
            if runs and family(runs[-1][-1].kind) == family(p.kind):
                runs[-1].append(p)
            else:
                runs.append([p])
        return kernels.QMatrix([qmatrix(kernels, run, interleave, act_bits, paired, put, zeros, cache)
                                for run in runs])
    sig = signature(parts, interleave, act_bits, paired)
    if cache is not None and (args := cache.recall(sig)) is not None:
        return kernels.QMatrix(*args)  # the file's planes, mapped
    if zeros is not None and not kinds <= set(BLOCK_BYTES) and hasattr(kernels, "kq_pack"):
        args = kq_planes(parts, act_bits, paired, kernels, zeros)  # written in place
    else:
        args = planes(parts, interleave, act_bits, paired) if kinds <= set(BLOCK_BYTES) else \
            kq_planes(parts, act_bits, paired, kernels)
        args = tuple(put(a) if isinstance(a, torch.Tensor) else a for a in args)
    if cache is not None:
        cache.remember(sig, args)
    return kernels.QMatrix(*args)


def kq_plane_sizes(kind: str, n: int, k: int, paired: bool) -> list[tuple[int, torch.dtype] | tuple[None, None]]:
    """(values, dtype) of each plane kq_pack writes, (q, d, m, hb, sc); (None, None) where the kind has none."""
    groups = -(-n // 8)
    stored = groups + groups % 2 if paired else groups
    blocks, k_quant = k // 32, kind in ("Q4_K", "Q5_K", "Q6_K")
    scales = k // 256 if k_quant else blocks  # a row's
    planes = {"Q4_K": 0, "Q6_K": 2}.get(kind, 1)  # high-bit planes: Q5_0, Q5_1, Q5_K one
    sizes = [(stored * blocks * 128, torch.uint8), (stored * scales * 8, torch.float16),
             (stored * scales * 8, torch.float16) if kind != "Q6_K" else (None, None),
             (stored * blocks * 32 * planes, torch.uint8) if planes else (None, None),
             (stored * blocks * 16, torch.uint8) if k_quant else (None, None)]
    return sizes


def kq_planes(parts: list[QTensor], act_bits: int, paired: bool = False, kernels=None, zeros=None) -> tuple:
    """gguf_kq.inc's planes of same-kind matrices stacked by rows: (bits, N, K, q, d, m, rows, act_bits, paired, hb,
    sc, scales), rows in groups of 8 (zero rows pad the last); `paired`: groups in pairs, as the VNNI build reads them
    fastest. See gguf_kq.inc for each plane's layout. This numpy version is the definition; with `kernels` the same
    planes come from kernels.kq_pack in one pass over the file's bytes (the tests check they are equal)."""
    kind = parts[0].kind
    if kernels is not None and hasattr(kernels, "kq_pack"):
        n, k = sum(p.rows for p in parts), parts[0].cols
        with warnings.catch_warnings():  # the file's pages are read-only; kq_pack only reads them
            warnings.simplefilter("ignore", UserWarning)
            raw = [torch.from_numpy(np.ascontiguousarray(p.blocks)) for p in parts]  # the file's pages, not copies
        out = [] if zeros is None else [None if size is None else zeros((size,), dtype)
                                        for size, dtype in kq_plane_sizes(kind, n, k, paired)]
        q, d, m, hb, sc = kernels.kq_pack(kind, raw, n, k, paired, out)
        bits, scales = gguf_blocks.BITS[kind], {"Q4_K": 1, "Q5_K": 1, "Q6_K": 2}.get(kind, 0)
        return bits, n, k, q, d, m, False, act_bits, paired, hb, sc, scales
    x = [gguf_blocks.decode(p.kind, p.blocks, p.rows, p.cols) for p in parts]
    first = x[0]
    cat = (lambda f: None if getattr(first, f) is None else np.concatenate([getattr(e, f) for e in x]))
    q = cat("q")  # [N, K] unsigned quants in element order
    n, k = q.shape
    pad, blocks = -n % 8, k // QK
    groups = (n + pad) // 8

    def grouped(a: np.ndarray) -> np.ndarray:  # [N, X, ...] -> [G, X, 8, ...]: a group's 8 rows side by side
        a = np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)])
        return np.ascontiguousarray(np.moveaxis(a.reshape(groups, 8, *a.shape[1:]), 1, 2))

    r = grouped(q.reshape(n, blocks, 8, 4))  # [G, B, j, c, t]
    r = np.ascontiguousarray(r.swapaxes(2, 3)).reshape(groups, blocks, 8, 32)  # register c: byte 4 j + t
    low = r & 15
    nibbles = (low[:, :, :4] | (low[:, :, 4:] << 4)).astype(np.uint8)  # [G, B, 4, 32]
    high = r >> 4
    hb = None
    if first.bits == 5:  # byte i bit c: register c's fifth bit
        hb = np.bitwise_or.reduce(high << np.arange(8, dtype=np.uint8)[:, None], axis=2).astype(np.uint8)
    elif first.bits == 6:  # plane p, bits 2 j and 2 j + 1: register 4 p + j's bits 4 and 5
        h = high.reshape(groups, blocks, 2, 4, 32) << (2 * np.arange(4, dtype=np.uint8))[:, None]
        hb = np.bitwise_or.reduce(h, axis=3).astype(np.uint8)
    d, m = grouped(cat("d")), None if first.m is None else grouped(cat("m"))  # [G, B or S, 8]
    sc, scales = None, {"block": 0, "k": 1, "q6k": 2}[first.scales]
    if scales == 1:
        sc = np.stack([grouped(cat("sc")), grouped(cat("mn"))], axis=2)  # [G, B, 2, 8]
    elif scales == 2:
        sc = np.ascontiguousarray(grouped(cat("sc").reshape(n, blocks, 2)).swapaxes(2, 3)).view(np.uint8)
    t = (lambda a: _tensor(None if a is None else _pairs(a) if paired else a))
    return first.bits, n, k, t(nibbles), t(d), t(m), False, act_bits, paired, t(hb), t(sc), scales


def _pairs(a: np.ndarray) -> np.ndarray:
    """[G, blocks, ..., last] -> [G/2, blocks, ..., 2, last]: the two groups of a pair side by side in each block,
    just above the last axis (a zero group pads an odd G)."""
    if a.shape[0] % 2:
        a = np.concatenate([a, np.zeros((1, *a.shape[1:]), a.dtype)])
    a = a.reshape(a.shape[0] // 2, 2, *a.shape[1:])  # [G/2, 2, blocks, ..., last]
    return np.ascontiguousarray(np.moveaxis(a, 1, -2))


def _fields(p: QTensor) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A matrix's blocks split: quants as stored (uint8 [N, blocks, 16] nibbles or int8 [N, blocks, 32]), d and
    m fp16 [N, blocks] (m None for Q8_0; -8 d for Q4_0, exact)."""
    b = p.blocks.reshape(p.rows, p.cols // QK, BLOCK_BYTES[p.kind])  # [N, blocks, bytes]
    d = np.ascontiguousarray(b[:, :, :2]).view(np.float16)[..., 0]
    if p.kind == "Q8_0":
        return np.ascontiguousarray(b[:, :, 2:]).view(np.int8), d, None
    if p.kind == "Q4_1":
        return b[:, :, 4:], d, np.ascontiguousarray(b[:, :, 2:4]).view(np.float16)[..., 0]
    return b[:, :, 2:], d, (d * np.float16(-8)).astype(np.float16)


def _tensor(a: np.ndarray | None) -> torch.Tensor | None:
    return None if a is None else torch.from_numpy(np.ascontiguousarray(a))


def dequantize(parts: list[QTensor]) -> torch.Tensor:
    """fp32 [N, K] of the matrices stacked by rows, as gguf-py computes them: the reference in tests."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    return torch.cat([torch.from_numpy(gguf_dequantize(p.blocks, GGMLQuantizationType[p.kind]).reshape(p.rows, p.cols))
                      for p in parts])
