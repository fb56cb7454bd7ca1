"""A GGUF matrix's blocks decoded into the parts the integer kernels multiply: unsigned quants and exact scales.

Every type here is, for each run of 32 weights along a row (an activation block of the q8/q16 paths), either
    w = d q + m          (Q5_0: m = -16 d; Q5_1; Q4_K and Q5_K: d = d_super sc, m = -(dmin_super mn))
or, for Q6_K, two halves of 16 weights with scales of their own, w = d_super sc_h (q - 32).
q is unsigned (4, 5 or 6 bits), so the kernels' unsigned-by-signed byte products take it as it is. d sc and
dmin mn are exact in fp32 (an fp16 times a 6- or 8-bit integer), so the kernels compute the file's own
weights; `dequantize` rebuilds them in the order gguf-py does, and the tests check it against gguf-py bit for bit.

The K-quant scales stay as stored (fp16 per 256 weights, integers per 32 or 16): per 32 weights that is 2 bytes
beside 16 to 24 bytes of quants, where fp32 scales would cost 8.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QK = 32  # weights per activation block
QK_K = 256  # weights per K-quant super-block
# bytes per block as stored, and weights per block
LAYOUT = {"Q5_0": (22, 32), "Q5_1": (24, 32), "Q4_K": (144, 256), "Q5_K": (176, 256), "Q6_K": (210, 256)}
BITS = {"Q5_0": 5, "Q5_1": 5, "Q4_K": 4, "Q5_K": 5, "Q6_K": 6}


@dataclass
class Decoded:
    """One matrix [N, K] decoded. q uint8 [N, K] in element order (unsigned). scales:
    'block': d, m fp16 [N, K/32];  'k': d, m fp16 [N, K/256] (d and dmin), sc, mn uint8 [N, K/32];
    'q6k': d fp16 [N, K/256], sc int8 [N, K/16] (m, mn None)."""
    kind: str
    bits: int
    scales: str
    q: np.ndarray
    d: np.ndarray
    m: np.ndarray | None
    sc: np.ndarray | None = None
    mn: np.ndarray | None = None


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16)[..., 0]


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 bytes of a Q4_K/Q5_K super-block [..., 12] -> 6-bit scales and minimums [..., 8] (ggml's packing:
    sub-blocks 0-3 in the low 6 bits of bytes 0-3 and 4-7, sub-blocks 4-7 split over bytes 8-11 and the top bits)."""
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=-1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return sc.astype(np.uint8), mn.astype(np.uint8)


def decode(kind: str, blocks: np.ndarray, rows: int, cols: int) -> Decoded:
    """blocks: uint8 [rows, bytes of a row] as stored."""
    size, per = LAYOUT[kind]
    b = blocks.reshape(rows, cols // per, size)  # [N, blocks, bytes]
    n = rows
    if kind in ("Q5_0", "Q5_1"):
        d = _f16(b[..., 0:2])
        m = _f16(b[..., 2:4]) if kind == "Q5_1" else (d * np.float16(-16)).astype(np.float16)  # exact
        at = 4 if kind == "Q5_1" else 2
        qh = np.ascontiguousarray(b[..., at:at + 4]).view("<u4")  # [N, B, 1]: bit j is element j's fifth bit
        qs = b[..., at + 4:at + 20]  # byte j: element j (low nibble) and j + 16 (high)
        low = np.concatenate([qs & 15, qs >> 4], axis=-1)  # [N, B, 32]
        high = (qh >> np.arange(32, dtype=np.uint32)) & 1
        return Decoded(kind, 5, "block", (low | (high.astype(np.uint8) << 4)).reshape(n, cols), d, m)
    if kind in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])  # [N, S]
        sc, mn = _k_scales(b[..., 4:16])  # [N, S, 8]
        qs = b[..., -128:].reshape(n, -1, 4, 32)  # chunk c: sub-block 2c in the low nibbles, 2c + 1 in the high
        q = np.stack([qs & 15, qs >> 4], axis=3).reshape(n, -1, 8, 32)  # [N, S, sub-block, 32]
        if kind == "Q5_K":  # bit s of byte l: the fifth bit of sub-block s's element l
            qh = b[..., 16:48][:, :, None, :] >> np.arange(8, dtype=np.uint8)[:, None]
            q = q | ((qh & 1) << 4)
        return Decoded(kind, BITS[kind], "k", q.reshape(n, cols).astype(np.uint8), d, dmin,
                       sc.reshape(n, -1), mn.reshape(n, -1))
    if kind == "Q6_K":
        ql, qh = b[..., 0:128].reshape(n, -1, 2, 2, 32), b[..., 128:192].reshape(n, -1, 2, 1, 32)
        low = np.stack([ql & 15, ql >> 4], axis=3)  # [N, S, half, nibble, byte run, 32]: runs 2 nibble + run
        high = (qh >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3  # [N, S, half, 4, 32]
        q = low.reshape(n, -1, 2, 4, 32) | (high << 4)
        sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8)  # [N, S, 16]: one a 16 weights
        return Decoded(kind, 6, "q6k", q.reshape(n, cols).astype(np.uint8), _f16(b[..., 208:210]), None,
                       sc.reshape(n, -1))
    raise ValueError(f"no decoder for {kind}")


def dequantize(x: Decoded) -> np.ndarray:
    """fp32 [N, K]: the weights as gguf-py computes them, from the decoded parts (the tests' bridge to gguf-py)."""
    n, k = x.q.shape
    q = x.q.astype(np.float32)
    if x.scales == "block":
        d, m = x.d.astype(np.float32)[..., None], x.m.astype(np.float32)[..., None]
        if x.kind == "Q5_0":  # gguf-py: d (q - 16)
            return (d * (q.reshape(n, -1, QK) - 16)).reshape(n, k)
        return (d * q.reshape(n, -1, QK) + m).reshape(n, k)
    if x.scales == "k":
        d = (x.d.astype(np.float32)[..., None] * x.sc.reshape(n, -1, 8).astype(np.float32)).reshape(n, -1, 1)
        dm = (x.m.astype(np.float32)[..., None] * x.mn.reshape(n, -1, 8).astype(np.float32)).reshape(n, -1, 1)
        return (d * q.reshape(n, -1, QK) - dm).reshape(n, k)
    d = (x.d.astype(np.float32)[..., None] * x.sc.reshape(n, -1, 16).astype(np.float32)).reshape(n, -1, 1)
    return (d * (q.reshape(n, -1, 16) - 32)).reshape(n, k)
