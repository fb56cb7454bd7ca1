"""Reading a GGUF file, whatever its architecture: the (cached) reader (gguf_reader), its metadata as Python values,
and a tensor dequantized (gguf-py's dequantize). The architecture-specific parts are in gguf_llama and
gguf_gemma3, chosen by gguf_arch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from specdec.errors import SpecdecError


def open_gguf(src: Path):
    """A GgufReader for `src`, with unreadable or malformed files reported as SpecdecError. The last file opened is
    kept: loading a model reads the same file several times (architecture, types, conversion, matrices)."""
    try:
        st = src.stat()
        key = (str(src.resolve()), st.st_size, st.st_mtime_ns)
    except OSError:
        key = None
    if key is not None and _last_reader[0] == key:
        return _last_reader[1]
    reader = _read(src)
    _last_reader[:] = [key, reader]
    return reader


_last_reader: list = [None, None]  # (path, size, mtime), reader


def _read(src: Path):
    from specdec.models.gguf.reader import GgufReader

    if not src.exists():
        raise SpecdecError(f"{src}: no such file")
    if not src.is_file():
        raise SpecdecError(f"{src}: not a file")
    try:
        with open(src, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise SpecdecError(f"{src}: cannot read ({e.strerror})") from None
    if magic != b"GGUF":
        raise SpecdecError(f"{src}: not a GGUF file (it does not start with the GGUF magic bytes)")
    try:
        return GgufReader(src)
    except Exception as e:  # the reader fails in many ways (struct, numpy, value errors) on truncated files
        raise SpecdecError(f"{src}: malformed or truncated GGUF file ({type(e).__name__}: {e})") from None


def read_metadata(reader, src: Path) -> dict[str, Any]:
    """Every metadata field as a Python value (strings, numbers, lists), unchecked (gguf_arch.metadata checks)."""
    meta = {}
    for key, field in reader.fields.items():
        try:
            meta[key] = field.contents()
        except Exception as e:
            raise SpecdecError(f"{src}: cannot decode GGUF metadata field {key!r} ({e})") from None
    return meta


def architecture(src: Path) -> str | None:
    """A GGUF's general.architecture (None when it has none)."""
    field = open_gguf(Path(src)).fields.get("general.architecture")
    return None if field is None else str(field.contents())


def decimal(x: float) -> float:
    """A float32 metadata value as the decimal it was written from (9.999999747e-06 -> 1e-05)."""
    return float(f"{float(x):.7g}")


def dequantize(t, src: Path) -> np.ndarray:
    """A gguf-py tensor `t` as float values (numpy layout: [out_features, in_features] for matrices)."""
    from gguf.quants import dequantize

    try:
        return dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        raise SpecdecError(f"{src}: tensor {t.name}: quantization {t.tensor_type.name} is not supported") from None


def need_int(meta: dict[str, Any], src: Path, key: str) -> int:
    """The integer metadata field `<architecture>.<key>`, refused when the file lacks it."""
    full = f"{meta['general.architecture']}.{key}"
    if full not in meta:
        raise SpecdecError(f"{src}: GGUF metadata lacks {full!r}")
    return int(meta[full])
