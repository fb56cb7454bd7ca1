"""A GGUF's packed planes kept on disk and mapped (`--map-weights`), as llama.cpp maps its file.

The native kernels read a GGUF's matrices repacked into planes (gguf/weights.py), which by default live in this
process's own memory, on huge pages. With `--map-weights` the first load packs them once and writes them to one file
in the cache ($SPECDEC_CACHE/planes/); every load maps that file. The planes are then file pages, not the process's:
two processes serving one model share one copy, the OS can drop them under memory pressure and read them back, and a
load reads no matrix. The trade: the file takes the planes' size on disk, a first load writes it, and the planes sit
on 4 KB pages (this kernel gives file mappings no huge pages), which cost no measurable decode speed at 1B and 8B on
an AMD Zen 4 (docs/results/map-weights.md); it stays opt-in for the disk it takes.

The file is keyed by the GGUF (its path, size, modification time and first megabyte), the precision, the kernels'
build and layout, and is written whole or not at all (atomic.atomic_file). One file per GGUF and precision: a
changed GGUF or kernel build replaces it, and writing one removes those whose GGUF is gone. Its header lists, in
load order, each matrix's parts (kind and shape) and its planes (offset, dtype, shape); a load that asks for a
different matrix at any step finds the file stale.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

from specdec.atomic import atomic_file
from specdec.errors import SpecdecError
from specdec.paths import cache_root

MAGIC = b"specdec-planes-1"  # 16 bytes; then the header's length (8 bytes, little-endian), the header, the planes
ALIGN = 64  # every plane starts on a cache line


class StaleCache(Exception):
    """The file's matrices are not the ones this load asks for: it is rebuilt."""


def cache_path(gguf: Path, precision: str) -> Path:
    real = os.path.realpath(gguf)
    tag = hashlib.sha256(f"{real}\0{precision}".encode()).hexdigest()[:12]
    return cache_root() / "planes" / f"{Path(real).stem}-{precision}-{tag}.planes"


def file_key(gguf: Path, precision: str, kernels) -> dict:
    """What the planes depend on: the file (identified by path, size, mtime and its first megabyte, which holds the
    header and tensor list of any GGUF we read), the precision and the kernels' build and layout."""
    from specdec.kernels import pairs_layout, source_digest

    st = os.stat(gguf)
    with open(gguf, "rb") as f:
        head = hashlib.sha256(f.read(1 << 20)).hexdigest()
    return {"file": os.path.realpath(gguf), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "head": head,
            "precision": precision, "kernels": source_digest(), "isa": kernels.isa(),
            "paired": pairs_layout(kernels)}


def signature(parts, interleave: bool, act_bits: int, paired: bool) -> list:
    """What one matrix is, as the cache checks it: its parts' kinds and shapes and the layout asked for."""
    return [[p.kind, p.rows, p.cols] for p in parts] + [interleave, act_bits, paired]


def read_header(path: Path) -> dict:
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise StaleCache("not a planes file")
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def prune(folder: Path) -> list[Path]:
    """Remove the planes files whose GGUF is gone (a file per GGUF and precision is replaced when its GGUF changes,
    but one whose GGUF was deleted would hold its disk forever), and torn ones; the removed paths."""
    gone = []
    for path in folder.glob("*.planes"):
        try:
            orphan = not os.path.exists(read_header(path)["key"]["file"])
        except (OSError, ValueError, KeyError, TypeError, struct.error, StaleCache):
            orphan = True
        if orphan:
            with contextlib.suppress(OSError):  # another process's removal, or a read-only cache
                path.unlink()
                gone.append(path)
    return gone


class PlaneCache:
    """One load's view of the file: `recall` hands out the stored planes of each matrix in load order (a hit), or
    `remember` records them as they are packed (a miss; `save` writes the file)."""

    def __init__(self, path: Path, key: dict):
        self.path, self.key = path, key
        self.records: list[dict] = []  # a hit: the header's matrices; a miss: what this load packed
        self.tensors: list[torch.Tensor] = []  # a miss: the planes to write, in record order
        self.base: torch.Tensor | None = None  # a hit: [bytes] uint8, the mapped file
        self.data = 0  # a hit: where the planes start in it
        self.step = 0

    @classmethod
    def open(cls, gguf: Path, precision: str, kernels) -> PlaneCache:
        """The cache of this GGUF at this precision: a hit when its file exists and its key matches."""
        cache = cls(cache_path(gguf, precision), file_key(gguf, precision, kernels))
        try:
            cache._map()
        except (OSError, ValueError, KeyError, TypeError, struct.error, StaleCache):  # absent, torn, foreign
            cache.base, cache.records = None, []
        return cache

    @property
    def hit(self) -> bool:
        return self.base is not None

    def _map(self) -> None:
        header = read_header(self.path)
        if header["key"] != self.key or os.path.getsize(self.path) != header["size"]:
            raise StaleCache("another file, build or size")
        with warnings.catch_warnings():  # a read-only, shared mapping: the kernels only read their planes
            warnings.simplefilter("ignore", UserWarning)
            self.base = torch.from_numpy(np.memmap(self.path, mode="r"))  # [file bytes] uint8
        self.records, self.data = header["matrices"], header["data"]

    def recall(self, sig: list) -> tuple | None:
        """A hit: the next matrix's QMatrix arguments, its planes views of the mapped file (None on a miss)."""
        if not self.hit:
            return None
        if self.step >= len(self.records) or self.records[self.step]["sig"] != sig:
            raise StaleCache(f"matrix {self.step} differs from the file's")
        rec = self.records[self.step]
        self.step += 1
        return tuple(self._view(a) if isinstance(a, dict) else a for a in rec["args"])

    def _view(self, a: dict) -> torch.Tensor:
        dtype = getattr(torch, a["dtype"])
        n = int(np.prod(a["shape"], dtype=np.int64)) * dtype.itemsize
        at = self.data + a["offset"]
        return self.base[at:at + n].view(dtype).view(a["shape"])

    def check_complete(self) -> None:
        """A hit must have handed out every matrix the file holds."""
        if self.hit and self.step != len(self.records):
            raise StaleCache(f"the file holds {len(self.records)} matrices, the model {self.step}")

    def remember(self, sig: list, args: tuple) -> tuple:
        """A miss: record a matrix's QMatrix arguments (tensors by reference, written by save)."""
        if not self.hit:
            out = []
            for a in args:
                if isinstance(a, torch.Tensor):
                    out.append({"tensor": len(self.tensors), "dtype": str(a.dtype).removeprefix("torch."),
                                "shape": list(a.shape)})
                    self.tensors.append(a)
                else:
                    out.append(a)
            self.records.append({"sig": sig, "args": out})
        return args

    def save(self) -> int:
        """Write what a miss recorded (atomically); returns the file's size in bytes."""
        offset, placed = 0, []
        for t in self.tensors:
            offset = -(-offset // ALIGN) * ALIGN
            placed.append(offset)
            offset += t.numel() * t.element_size()
        matrices = [{"sig": r["sig"], "args": [{"offset": placed[a["tensor"]], "dtype": a["dtype"],
                                                "shape": a["shape"]} if isinstance(a, dict) else a
                                               for a in r["args"]]} for r in self.records]
        # the header gives the planes' offsets from the data's start, a page boundary after it
        fields = {"key": self.key, "matrices": matrices, "data": 0, "size": 0}
        data = -(-(len(MAGIC) + 8 + len(json.dumps(fields)) + 64) // 4096) * 4096  # 64: room for two numbers' digits
        header = json.dumps({**fields, "data": data, "size": data + offset}).encode()
        header += b" " * (data - len(MAGIC) - 8 - len(header))
        size = data + offset
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SpecdecError(f"cannot write {self.path}: {e.strerror or e}") from None
        with atomic_file(self.path) as f:
            f.write(MAGIC + struct.pack("<Q", len(header)) + header)
            at = 0
            for t, off in zip(self.tensors, placed):
                f.write(b"\0" * (off - at))
                f.write(memoryview(t.contiguous().view(torch.uint8).reshape(-1).numpy()))
                at = off + t.numel() * t.element_size()
        prune(self.path.parent)
        return size


def mapped(build, gguf: Path | None, precision: str, device: str):
    """`build(cache)` (a model whose matrices go through `cache`) with its planes mapped from the cache file: on a
    miss the model is built once packing in memory, the file written, and built again from it. Where the file cannot
    be written (a full disk, no permission) the first model is kept, its planes in memory, and one line says why."""
    from specdec.kernels import decode_kernels
    from specdec.models.config import GGUF_PRECISIONS

    if gguf is None or precision not in GGUF_PRECISIONS:
        raise SpecdecError(f"--map-weights maps a GGUF's packed planes: it needs a .gguf model at one of "
                           f"{', '.join(GGUF_PRECISIONS)} (this load: {precision})")
    kernels = decode_kernels() if torch.device(device).type == "cpu" else None
    if kernels is None:
        raise SpecdecError("--map-weights maps the native CPU kernels' planes, which this load does not use")
    cache = PlaneCache.open(gguf, precision, kernels)
    if cache.hit:
        try:
            model = build(cache)
            cache.check_complete()
            return model
        except StaleCache:
            cache = PlaneCache(cache.path, cache.key)  # rebuilt below
    model = build(cache)
    try:
        size = cache.save()
    except SpecdecError as e:
        print(f"specdec: --map-weights: {e}; the planes stay in this process's memory", file=sys.stderr)
        return model
    print(f"specdec: packed {Path(gguf).name}'s planes once into {cache.path} ({size / 1e9:.2f} GB); this load "
          "and later ones map them (--map-weights)", file=sys.stderr)
    del model, cache
    again = PlaneCache.open(gguf, precision, kernels)
    try:
        if not again.hit:
            raise StaleCache("not read back")
        model = build(again)
        again.check_complete()
    except StaleCache as e:
        raise SpecdecError(f"--map-weights: {again.path} was written but does not read back ({e})") from None
    return model
