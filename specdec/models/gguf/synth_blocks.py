"""Random GGUF blocks written directly as bytes: valid blocks of each quantization type whose dequantized weights
have mean 0 and a chosen standard deviation, without ever making (or quantizing) a float matrix. Fast enough for
an 8B model: the bulk of every block is raw generator output, and only the scale fields are set by hand.

Why this is valid: in every type below the quants are plain bit fields, so any byte pattern is a legal quant.
Uniform random quants q have a known mean and variance, and the scales are chosen per type so that
w = scale * (q - centre) has mean 0 (a random sign on the block scale, or a minimum of -centre * scale) and
E[w^2] = std^2. Layouts (the ggml ones that gguf-py's `gguf.quants` decodes), bytes per block:

    Q4_0  18: d f16, 16 bytes of 4-bit q          w = d (q - 8)
    Q4_1  20: d, m f16, 16 bytes of q             w = d q + m
    Q5_0  22: d, 4 bytes of 5th bits, 16 bytes    w = d (q - 16)
    Q5_1  24: d, m, 4 bytes of 5th bits, 16 bytes w = d q + m
    Q8_0  34: d, 32 int8 q                        w = d q
    Q4_K 144: d, dmin f16, 12 bytes of eight 6-bit scales and mins, 128 bytes of q    w = d sc q - dmin mn
    Q5_K 176: d, dmin, 12 bytes of scales and mins, 32 bytes of 5th bits, 128 bytes of q
    Q6_K 210: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales, d f16       w = d sc (q - 32)
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType

# Var(q) = (4^bits - 1) / 12 for q uniform over 2^bits values. Types that subtract a whole-number centre
# (q - 8 for 4 bits) are off by half a step, so their E[(q - centre)^2] adds 0.25.
_SECOND_MOMENT = {bits: (4**bits - 1) / 12 for bits in (4, 5, 6, 8)}
K_SCALES = (32, 63)  # Q4_K / Q5_K six-bit sub-block scales, drawn uniformly in this range
Q6_SCALES = (64, 127)  # |int8| Q6_K sub-block scales (llama.cpp's quantizer puts the largest at +-127)


def block_size(qtype: GGMLQuantizationType) -> tuple[int, int]:
    """(weights per block, bytes per block)."""
    return GGML_QUANT_SIZES[qtype]


def row_bytes(qtype: GGMLQuantizationType, cols: int) -> int:
    per_block, nbytes = block_size(qtype)
    assert cols % per_block == 0, f"{qtype.name} needs rows of a multiple of {per_block}, got {cols}"
    return cols // per_block * nbytes


def random_matrix(qtype: GGMLQuantizationType, rows: int, cols: int, std: float,
                  rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, row_bytes(qtype, cols)]: a random matrix of this type, dequantizing to mean 0 and `std`.
    F16 and F32 are drawn as normal floats (returned as their bytes)."""
    if qtype in (T.F16, T.F32):
        w = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std)
        return w.astype(np.float16 if qtype == T.F16 else np.float32).view(np.uint8)
    n = rows * cols // block_size(qtype)[0]
    blocks = _raw(rng, n * block_size(qtype)[1]).reshape(n, -1)  # [blocks, bytes]: every quant field random
    _SET_SCALES[qtype](blocks, std, rng)
    return blocks.reshape(rows, -1)


def _raw(rng: np.random.Generator, nbytes: int) -> np.ndarray:
    """nbytes uniformly random bytes; the bit generator's raw words are ~8x faster than rng.integers."""
    return rng.bit_generator.random_raw(-(-nbytes // 8)).view(np.uint8)[:nbytes]


def _f16(x: np.ndarray | float) -> np.ndarray:
    """float16 values as little-endian byte pairs, [..., 2]."""
    return np.asarray(x, dtype=np.float16).reshape(-1, 1).view(np.uint8)


def _signed(rng: np.random.Generator, n: int, d: float) -> np.ndarray:
    """n copies of d with random signs: w = d (q - centre) then has mean 0 over blocks despite the half-step bias
    of the centre (q - 8 averages -0.5)."""
    return np.where(rng.integers(0, 2, n, dtype=np.uint8) == 1, d, -d)


def _q4_0(b: np.ndarray, std: float, rng: np.random.Generator) -> None:
    b[:, 0:2] = _f16(_signed(rng, len(b), std / np.sqrt(_SECOND_MOMENT[4] + 0.25)))


def _q5_0(b: np.ndarray, std: float, rng: np.random.Generator) -> None:
    b[:, 0:2] = _f16(_signed(rng, len(b), std / np.sqrt(_SECOND_MOMENT[5] + 0.25)))


def _q8_0(b: np.ndarray, std: float, rng: np.random.Generator) -> None:
    b[:, 0:2] = _f16(_signed(rng, len(b), std / np.sqrt(_SECOND_MOMENT[8] + 0.25)))


def _with_min(bits: int):
    """Q4_1 / Q5_1: d > 0 and m = -d (2^bits - 1) / 2, so w = d (q - centre) with the exact centre: mean 0."""
    def set_scales(b: np.ndarray, std: float, rng: np.random.Generator) -> None:
        d = std / np.sqrt(_SECOND_MOMENT[bits])
        b[:, 0:2] = _f16(d)
        b[:, 2:4] = _f16(-d * (2**bits - 1) / 2)
    return set_scales


def _k_quant(bits: int):
    """Q4_K / Q5_K: sub-block scales sc random in K_SCALES, mins equal to them, and dmin = d (2^bits - 1) / 2,
    so each sub-block is d sc (q - centre): mean 0."""
    lo, hi = K_SCALES
    mean_sq = ((lo + hi) / 2) ** 2 + ((hi - lo + 1) ** 2 - 1) / 12  # E[sc^2]

    def set_scales(b: np.ndarray, std: float, rng: np.random.Generator) -> None:
        d = std / np.sqrt(_SECOND_MOMENT[bits] * mean_sq)
        b[:, 0:2] = _f16(d)
        b[:, 2:4] = _f16(d * (2**bits - 1) / 2)
        sc = rng.integers(lo, hi + 1, (len(b), 8), dtype=np.uint8)
        b[:, 4:16] = _pack_scales_mins(sc, sc)
    return set_scales


def _pack_scales_mins(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and eight 6-bit mins [n, 8] -> the 12-byte K-quant field: bytes 0-3 hold scales 0-3,
    bytes 4-7 mins 0-3 (their top two bits: the top bits of scales / mins 4-7), bytes 8-11 the low nibbles of
    scales 4-7 (low half) and mins 4-7 (high half)."""
    out = np.empty((len(sc), 12), np.uint8)
    out[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    return out


def _q6_k(b: np.ndarray, std: float, rng: np.random.Generator) -> None:
    lo, hi = Q6_SCALES
    mean_sq = ((lo + hi) / 2) ** 2 + ((hi - lo + 1) ** 2 - 1) / 12
    d = std / np.sqrt((_SECOND_MOMENT[6] + 0.25) * mean_sq)
    sc = rng.integers(lo, hi + 1, (len(b), 16), dtype=np.int16)
    sc *= np.where(rng.integers(0, 2, sc.shape, dtype=np.uint8) == 1, 1, -1).astype(np.int16)  # signs: mean 0
    b[:, 192:208] = sc.astype(np.int8).view(np.uint8)
    b[:, 208:210] = _f16(d)


_SET_SCALES = {
    T.Q4_0: _q4_0, T.Q4_1: _with_min(4), T.Q5_0: _q5_0, T.Q5_1: _with_min(5), T.Q8_0: _q8_0,
    T.Q4_K: _k_quant(4), T.Q5_K: _k_quant(5), T.Q6_K: _q6_k,
}
TYPES = (*_SET_SCALES, T.F16)  # what random_matrix writes (F32 too, for vectors)
