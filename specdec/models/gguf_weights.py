"""A GGUF's quantized matrices as they are stored, for the native GGUF kernels (`--precision gguf`, `gguf-q16`,
`gguf-q8`).

The kernels (specdec/kernels/gguf.cpp) read Q4_0, Q4_1 and Q8_0 blocks of 32 weights, split into planes so that a
tile loads each kind of value with one instruction: nibbles (or int8 quants), fp16 scales d, and for 4-bit blocks
fp16 minimums m (w = d q + m). Q4_0 (w = d (q - 8)) becomes m = -8 d, which is exact in fp16. The planes hold the
file's bytes (Q4_0 adds 2 bytes of m a block), and the values are the file's, bit for bit.

Q and K rows are put back in Hugging Face's rotate-half order (llama.cpp interleaves them), as the converted
folder has them, so one model can mix the paths: norms and the token embedding come from the folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specdec.errors import SpecdecError

# bytes per block of 32 weights, as stored in the file
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
QK = 32


@dataclass
class QTensor:
    """One matrix [rows, cols] as stored: `blocks` uint8 [rows, cols / 32 * BLOCK_BYTES[kind]]."""
    kind: str
    blocks: np.ndarray
    rows: int
    cols: int


def gguf_source(model_dir: Path, spec: str | None) -> Path | None:
    """The GGUF file a model came from: the bundled file, a .gguf given directly, or the one a converted folder
    records; None when the model is not from a GGUF (or its file is gone)."""
    from specdec.models import gguf_convert

    if spec in ("default", "", None):
        return gguf_convert.bundled_gguf_path()
    if Path(spec).suffix.lower() == ".gguf" and Path(spec).is_file():
        return Path(spec)
    try:
        source = Path(json.loads((Path(model_dir) / gguf_convert.MARKER).read_text())["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return source if source.is_file() else None


def runnable(path: Path) -> bool:
    """True when every matrix of the file is in a format these kernels read."""
    from specdec.models.gguf_convert import _open

    try:
        return all(t.tensor_type.name in BLOCK_BYTES for t in _open(Path(path)).tensors if len(t.shape) == 2)
    except SpecdecError:
        return False


def read_matrices(path: Path) -> dict[str, QTensor]:
    """Every quantized matrix of a llama GGUF under its Hugging Face name. A matrix in another format (Q4_K, F16,
    ...) is refused with the formats this path reads."""
    from specdec.models.gguf_convert import _hf_name, _metadata, _open

    reader = _open(Path(path))
    meta = _metadata(reader, Path(path))
    arch = meta["general.architecture"]
    n_heads = int(meta[f"{arch}.attention.head_count"])
    n_kv = int(meta.get(f"{arch}.attention.head_count_kv", n_heads))
    out: dict[str, QTensor] = {}
    for t in reader.tensors:
        if len(t.shape) != 2:
            continue  # norms (f32 vectors) come from the converted folder
        kind = t.tensor_type.name
        name = _hf_name(t.name, Path(path))
        if kind not in BLOCK_BYTES:
            raise SpecdecError(f"{path}: tensor {t.name} is {kind}; --precision gguf, gguf-q16 and gguf-q8 read "
                               f"{', '.join(BLOCK_BYTES)} blocks (use --precision fp16 for this file)")
        cols, rows = int(t.shape[0]), int(t.shape[1])  # GGUF lists the contiguous dimension first
        blocks = np.asarray(t.data, dtype=np.uint8).reshape(rows, cols // QK * BLOCK_BYTES[kind])
        if name.endswith("q_proj.weight"):
            blocks = _unpermute_rows(blocks, n_heads)
        elif name.endswith("k_proj.weight"):
            blocks = _unpermute_rows(blocks, n_kv)
        out[name] = QTensor(kind, blocks, rows, cols)
    return out


def _unpermute_rows(blocks: np.ndarray, n_heads: int) -> np.ndarray:
    """gguf_convert._unpermute on whole rows of blocks (a row's blocks move with it)."""
    half = blocks.shape[0] // n_heads // 2
    return blocks.reshape(n_heads, half, 2, -1).swapaxes(1, 2).reshape(blocks.shape)


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
