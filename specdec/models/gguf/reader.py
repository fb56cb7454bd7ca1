"""A GGUF file's metadata and tensor table, read fast: the same fields and tensors as gguf-py's GGUFReader.

gguf-py parses every value through numpy views of a memmap, a dozen numpy objects per string: about 5 s for the
bundled model's 49k-token vocabulary and 10 s or more for a 128k-262k one, paid each time a file is opened (the
loader, the converter, `synth-gguf`, the llama.cpp oracle's F32 copies). Here the header is walked with `struct`
over a memoryview of the file's np.memmap, arrays of numbers are read as one numpy array each, and strings stay
bytes until they are asked for. The tensors' data are read-only views of the same memmap (nothing is copied), in
gguf-py's layout: F32/F16/integer tensors shaped by their dimensions, outermost first; block-quantized ones as
bytes, [rows..., row bytes].

Little-endian files only (what llama.cpp writes on every platform it supports); gguf-py stays the reference that
tests/test_gguf_reader.py compares this reader with, field by field and tensor by tensor.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import quant_shape_to_byte_shape

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

_SCALARS = {  # value type: (struct format, numpy dtype)
    GGUFValueType.UINT8: ("<B", np.uint8), GGUFValueType.INT8: ("<b", np.int8),
    GGUFValueType.UINT16: ("<H", np.uint16), GGUFValueType.INT16: ("<h", np.int16),
    GGUFValueType.UINT32: ("<I", np.uint32), GGUFValueType.INT32: ("<i", np.int32),
    GGUFValueType.FLOAT32: ("<f", np.float32), GGUFValueType.UINT64: ("<Q", np.uint64),
    GGUFValueType.INT64: ("<q", np.int64), GGUFValueType.FLOAT64: ("<d", np.float64),
    GGUFValueType.BOOL: ("<?", np.bool_),
}
_PLAIN = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
          GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
          GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32, GGMLQuantizationType.I64: np.int64}


@dataclass
class Field:
    """One metadata value. types: [its type], or for an array [ARRAY, the element type] (gguf-py's convention:
    an empty array is [ARRAY])."""

    name: str
    types: list[GGUFValueType]
    raw: Any  # bytes (a string), a Python scalar, a numpy array (numbers), or a list of raw elements

    def contents(self) -> Any:
        """The value as Python: str, int, float, bool, or a list of them (UTF-8 is checked here)."""
        return _python(self.raw)


def _python(raw: Any) -> Any:
    if isinstance(raw, bytes):
        return raw.decode("utf-8")
    if isinstance(raw, np.ndarray):
        return raw.tolist()
    if isinstance(raw, list):
        return [_python(x) for x in raw]
    return raw


@dataclass
class Tensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # [n_dims] uint64, the contiguous dimension first (as the file lists them)
    n_elements: int
    n_bytes: int
    data_offset: int  # in the file
    data: np.memmap = field(repr=False)  # read-only view of the file (see the module's docstring)


class _Cursor:
    def __init__(self, buf: memoryview):
        self.buf, self.at = buf, 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buf, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> bytes:
        n = self.take("<Q")
        if self.at + n > len(self.buf):
            raise ValueError(f"a string of {n} bytes runs past the end of the file")
        s = bytes(self.buf[self.at:self.at + n])
        self.at += n
        return s

    def value(self, kind: GGUFValueType) -> tuple[Any, list[GGUFValueType]]:
        if kind == GGUFValueType.STRING:
            return self.string(), [kind]
        if kind in _SCALARS:
            v = self.take(_SCALARS[kind][0])
            return (bool(v) if kind == GGUFValueType.BOOL else v), [kind]
        if kind != GGUFValueType.ARRAY:
            raise ValueError(f"unknown value type {kind}")
        sub, n = GGUFValueType(self.take("<I")), self.take("<Q")
        if sub in _SCALARS:  # numbers: one numpy array
            dtype = np.dtype(_SCALARS[sub][1]).newbyteorder("<")
            if self.at + n * dtype.itemsize > len(self.buf):
                raise ValueError(f"an array of {n} values runs past the end of the file")
            arr = np.frombuffer(self.buf, dtype, n, self.at).astype(dtype.newbyteorder("="))
            self.at += n * dtype.itemsize
            return arr, [kind] + ([sub] if n else [])
        items, types = [], [kind]
        for i in range(n):
            v, t = self.value(sub)
            items.append(v)
            if i == 0:
                types += t
        return items, types


class GgufReader:
    """fields: name -> Field, in the file's order (after gguf-py's GGUF.version, GGUF.tensor_count and
    GGUF.kv_count); tensors: in the file's order. Raises ValueError on a malformed or truncated file."""

    def __init__(self, path: str | Path):
        self._data = np.memmap(path, mode="r")  # tensors are views of it (gguf_weights.release_pages reads that)
        c = _Cursor(memoryview(self._data))
        if bytes(c.buf[:4]) != MAGIC:
            raise ValueError("GGUF magic invalid")
        c.at = 4
        version = c.take("<I")
        if version & 0xFFFF == 0:
            raise ValueError("a big-endian GGUF file; specdec reads little-endian ones")
        if version not in VERSIONS:
            raise ValueError(f"GGUF version {version}; this reader handles {VERSIONS}")
        n_tensors, n_kv = c.take("<Q"), c.take("<Q")
        self.fields: dict[str, Field] = {
            "GGUF.version": Field("GGUF.version", [GGUFValueType.UINT32], version),
            "GGUF.tensor_count": Field("GGUF.tensor_count", [GGUFValueType.UINT64], n_tensors),
            "GGUF.kv_count": Field("GGUF.kv_count", [GGUFValueType.UINT64], n_kv)}
        for _ in range(n_kv):
            name = c.string().decode("utf-8")
            if name in self.fields:
                raise ValueError(f"duplicate metadata key {name}")
            raw, types = c.value(GGUFValueType(c.take("<I")))
            self.fields[name] = Field(name, types, raw)
        infos = []
        for _ in range(n_tensors):
            name = c.string().decode("utf-8")
            n_dims = c.take("<I")
            dims = np.array([c.take("<Q") for _ in range(n_dims)], dtype=np.uint64)
            infos.append((name, dims, GGMLQuantizationType(c.take("<I")), c.take("<Q")))
        align = self.fields.get("general.alignment")
        self.alignment = DEFAULT_ALIGNMENT if align is None else align.raw
        if align is not None and (align.types != [GGUFValueType.UINT32] or self.alignment <= 0
                                  or self.alignment & (self.alignment - 1)):
            raise ValueError("general.alignment must be a power of two (uint32)")
        self.data_offset = -(-c.at // self.alignment) * self.alignment
        self.tensors = [self._tensor(*info) for info in infos]
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise ValueError("duplicate tensor names")

    def _tensor(self, name: str, dims: np.ndarray, kind: GGMLQuantizationType, offset: int) -> Tensor:
        n = int(np.prod(dims))
        block, size = GGML_QUANT_SIZES[kind]
        n_bytes, at = n * size // block, self.data_offset + offset
        if at + n_bytes > len(self._data):
            raise ValueError(f"tensor {name} runs past the end of the file")
        shape = tuple(int(d) for d in reversed(dims))
        data = self._data[at:at + n_bytes]
        if kind in _PLAIN:
            data = data.view(_PLAIN[kind]).reshape(shape)
        else:
            data = data.reshape(quant_shape_to_byte_shape(shape, kind))
        return Tensor(name, kind, dims, n, n_bytes, at, data)
