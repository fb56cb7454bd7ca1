"""Which integer path runs a GGUF fastest on this CPU, as `specdec choose-path` measured it, remembered in the cache.

gguf-q16 (activations in blocks of 15 bits: top-1 agreement with the fp32 model >= 0.999) issues two multiply-adds
a weight where gguf-q8 (8-bit activations, llama.cpp's own numerics) issues one. A pass of one row is memory-bound
on either; a verify pass of several rows is not, wherever the CPU has no AMX to multiply tiles: on an AMD Zen 4
with 2 cores, the 1B shape's 6-row pass costs 1.89 one-row passes on gguf-q16 and 1.33 on gguf-q8 (alternated in
one process, 2026-12-05), which decides whether speculation can pay there at all. Both paths keep a verify pass
equal to one-token passes bit for bit, so either keeps speculative output identical to plain output.

`specdec choose-path --model FILE` measures both on the file's own matrices and remembers the faster here, keyed by
the file (path, size, modification time), the CPU and the kernels' build; the loader's default for that file is
then the remembered path, said in one line on stderr. Without a remembered choice the default stays gguf-q16.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from specdec.atomic import write_text_atomic
from specdec.paths import cache_root

STORE = "path-choices.json"
PATHS = ("gguf-q16", "gguf-q8")


@dataclass(frozen=True)
class PathChoice:
    precision: str  # the path chosen
    pass_ms: dict[str, dict[str, float]]  # path -> rows -> the fastest pass of that many rows, ms
    rule: str  # how the choice was made
    agreement: dict[str, float] | None  # path -> top-1 agreement with llama.cpp (None: not measured)
    measured: str  # when (UTC), on which CPU


def key(gguf: Path) -> str:
    """The file (resolved path, size, modification time), this CPU and the kernels' build."""
    from specdec.kernels import kernels_dir
    from specdec.provenance import cpu_name, isa

    st = Path(gguf).stat()
    return f"{Path(gguf).resolve()}:{st.st_size}:{st.st_mtime_ns}|{cpu_name()}|{','.join(isa())}|{kernels_dir().name}"


def _store() -> dict:
    try:
        data = json.loads((cache_root() / STORE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remembered(gguf: Path) -> PathChoice | None:
    """The choice measured for this file on this CPU and kernel build, or None (never measured, or the file, CPU
    or build changed since; an unreadable store counts as none)."""
    entry = _store().get(key(gguf))
    try:
        choice = PathChoice(**entry) if isinstance(entry, dict) else None
    except TypeError:
        return None
    return choice if choice is not None and choice.precision in PATHS else None


def remember(gguf: Path, choice: PathChoice) -> Path:
    """Add the choice to the store (written whole, atomically); returns the store's path."""
    data = _store()
    data[key(gguf)] = asdict(choice)
    path = cache_root() / STORE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(data, indent=1))
    return path
