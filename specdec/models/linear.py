"""Linear layers for the three precisions, chosen for this CPU (see shared/notes/cpu-kernels.md).

Every reduced-precision path is batch-invariant: a row's output does not depend on which other rows share
the call, nor on how many there are. That is what keeps a verify pass over k+1 tokens bit-identical to k+1
one-token passes, and so speculative greedy output identical to plain greedy output.

  fp32  torch F.linear. Exact, but MKL's fp32 GEMM on this AMD CPU costs ~5x more at 4 rows than at 1.
  fp16  fbgemm fp16-weight linear: memory-bound up to ~5-8 rows, half the bytes of fp32, top-1 agreement
        0.999 with fp32. Bit-invariant for calls of >= 3 rows, so calls are padded to 3 rows.
  int8  fbgemm int8 weights (per output channel) with dynamic activations. Per-tensor activation scales
        are not batch-invariant, so each row is divided by its own max-abs and one constant row of +1/-1
        fixes the tensor's range at [-1, 1]: the quantisation grid is the same whatever the other rows.
        Changes a model this small noticeably (top-1 agreement ~0.8): an option, never the default.
  bf16  plain F.linear on bf16 weights: the path for CUDA (fbgemm kernels are CPU-only).

GgufLinear, the same call on a GGUF's own blocks (gguf-q16, gguf-q8): kernels.gemm_gguf, whose rows are
batch-invariant by construction (each row's activations are quantized in its own blocks of 32). It serves models
whose blocks the fused native kernels do not run (Gemma 3): their glue stays torch.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from specdec.errors import SpecdecError
from specdec.models.config import ACT_BITS, GGUF_PRECISIONS, PRECISIONS

MIN_ROWS = 3  # fbgemm fp16 takes another code path below 3 rows


class Linear:
    """y = x W^T + b for x [rows, in_features]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, precision: str):
        if precision not in PRECISIONS or precision in GGUF_PRECISIONS:
            raise SpecdecError(f"Linear takes {', '.join(p for p in PRECISIONS if p not in GGUF_PRECISIONS)}, "
                               f"not {precision!r}")
        self.precision = precision
        self.out_features, self.in_features = weight.shape
        weight = weight.float().contiguous()
        bias = None if bias is None else bias.float().contiguous()
        if weight.device.type != "cpu" and precision in ("fp16", "int8"):
            raise SpecdecError(f"precision {precision} uses CPU kernels (fbgemm); on {weight.device.type} use bf16")
        if precision == "fp32":
            self.weight, self.bias = weight, bias
        elif precision == "bf16":
            self.weight = weight.to(torch.bfloat16)
            self.bias = None if bias is None else bias.to(torch.bfloat16)
        elif precision == "fp16":
            self.packed = torch.ops.quantized.linear_prepack_fp16(weight, bias)
        else:
            scales = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0  # [out]
            with warnings.catch_warnings():  # the quantized tensor API is deprecated; fbgemm's kernels are not
                warnings.simplefilter("ignore")
                qweight = torch.quantize_per_channel(
                    weight, scales.double(), torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(qweight, None)
            self.bias = bias  # added after rescaling the rows
            self._range_row = torch.zeros(1, self.in_features)
            self._range_row[0, 0], self._range_row[0, -1] = 1.0, -1.0

    @property
    def nbytes(self) -> int:
        per = {"fp32": 4, "fp16": 2, "int8": 1, "bf16": 2}[self.precision]
        return self.out_features * self.in_features * per

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]  # x: [rows, in]
        if self.precision == "fp32":
            return F.linear(x, self.weight, self.bias)
        if self.precision == "bf16":
            return F.linear(x.to(torch.bfloat16), self.weight, self.bias).float()
        if self.precision == "fp16":
            if rows < MIN_ROWS:
                x = torch.cat([x, x.new_zeros(MIN_ROWS - rows, x.shape[1])])
            return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)[:rows]
        scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12)  # [rows, 1]
        xs = torch.cat([x / scale, self._range_row])  # [rows+1, in], range exactly [-1, 1]
        y = torch.ops.quantized.linear_dynamic(xs, self.packed, False)[:rows] * scale
        return y if self.bias is None else y + self.bias


class GgufLinear:
    """y = x W^T for x [rows, in_features], W the matrices `parts` (gguf_weights.QTensor) stacked by rows, as stored
    in the file. `arena` (hugepages.Arena) holds the kernel's planes, on huge pages."""

    def __init__(self, parts: list, precision: str, kernels, arena=None):
        from specdec.kernels import pairs_layout
        from specdec.models.gguf.weights import qmatrix

        if precision not in ACT_BITS:  # the exact path reads no K-quant, so no Gemma 3 file
            raise SpecdecError(f"GgufLinear takes {', '.join(ACT_BITS)}, not {precision!r}")
        self.precision, self.kernels = precision, kernels
        self.out_features, self.in_features = sum(p.rows for p in parts), parts[0].cols
        put, zeros, cache = (arena.put, arena.zeros, arena.planes) if arena is not None else (lambda t: t, None, None)
        self.qm = qmatrix(kernels, parts, True, ACT_BITS[precision], pairs_layout(kernels), put, zeros, cache)

    @property
    def nbytes(self) -> int:
        return self.qm.nbytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.gemm_gguf(x.contiguous(), self.qm)  # [rows, out_features]
