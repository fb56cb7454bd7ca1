"""Which integer path runs a GGUF fastest on this CPU: measured at the file's first load here, remembered in the
cache, read by every later load.

gguf-q16 (activations in blocks of 15 bits: top-1 agreement with the fp32 model >= 0.999) issues two multiply-adds
a weight where gguf-q8 (8-bit activations, llama.cpp's own numerics) issues one. A pass of one row is memory-bound
on either; a verify pass of several rows is not, wherever the CPU has no AMX to multiply tiles: on an AMD Zen 4
with 2 cores, the 1B shape's 6-row pass costs 1.89 one-row passes on gguf-q16 and 1.33 on gguf-q8 (alternated in
one process, 2026-12-05), which decides whether speculation can pay there at all. Both paths keep a verify pass
equal to one-token passes bit for bit, so either keeps speculative output identical to plain output.

The first load of a file without `--precision` loads it on both paths, alternates a 1-row and a ROWS-row pass on
each (`measure`), keeps the faster model and remembers the choice, keyed by the file (path, size, modification
time), the CPU and the kernels' build; it says so in one line, and later loads read the choice (one line too).
A file too large to hold twice in the memory available gets RULE's path without a measurement: gguf-q8, which was
the faster of the two on every CPU measured (docs/results/path-choice.md). `specdec choose-path --model FILE`
measures again, with more repetitions and llama.cpp's agreement beside.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from specdec.atomic import KeyedStore
from specdec.paths import cache_root

STORE = "path-choices.json"
PATHS = ("gguf-q16", "gguf-q8")
ROWS, CONTEXT, REPS = 6, 32, 3  # the verify pass timed beside a 1-row pass (five drafts), at load
RULE = "gguf-q8"
RULE_WHY = ("the faster path on every CPU measured (AMD Zen 4, Zen 5, Intel Xeon with AMX; "
            "docs/results/path-choice.md)")
MEMORY_SHARE = 0.5  # measure at load only while both paths' weights fit in this share of the memory available


@dataclass(frozen=True)
class PathChoice:
    precision: str  # the path chosen
    pass_ms: dict[str, dict[str, float]]  # path -> rows -> the fastest pass of that many rows, ms
    rule: str  # how the choice was made
    agreement: dict[str, float] | None  # path -> top-1 agreement with llama.cpp (None: not measured)
    measured: str  # when (UTC), on which CPU

    def line(self, measured_now: float | None = None) -> str:
        """The one line a load prints."""
        other = next(p for p in PATHS if p != self.precision)
        mine, theirs = self.pass_ms.get(self.precision, {}), self.pass_ms.get(other, {})
        costs = ""
        if set(mine) == set(theirs) and len(mine) > 1:
            widths = sorted(mine, key=int)
            costs = (f": {' + '.join(f'{n}-row' for n in widths)} passes "
                     f"{' + '.join(f'{mine[n]:.1f}' for n in widths)} ms, against "
                     f"{' + '.join(f'{theirs[n]:.1f}' for n in widths)} ms on {other}")
        when = f"measured at this first load in {measured_now:.1f} s and remembered" if measured_now is not None \
            else f"measured {self.measured}"
        return (f"specdec: {self.precision}, the faster path for this file on this CPU{costs} ({when}; --precision "
                "overrides, `specdec choose-path` measures again)")


def store() -> KeyedStore:
    return KeyedStore(cache_root() / STORE, "path choices")


def key(gguf: Path) -> str:
    """The file (resolved path, size, modification time), this CPU and the kernels' build."""
    from specdec.kernels import kernels_dir
    from specdec.provenance import cpu_name, isa

    st = Path(gguf).stat()
    return f"{Path(gguf).resolve()}:{st.st_size}:{st.st_mtime_ns}|{cpu_name()}|{','.join(isa())}|{kernels_dir().name}"


def remembered(gguf: Path) -> PathChoice | None:
    """The choice measured for this file on this CPU and kernel build, or None (never measured, or the file, CPU
    or build changed since; a torn store or a foreign entry counts as none, and is measured again)."""
    entry = store().get(key(gguf))
    try:
        choice = PathChoice(**entry) if isinstance(entry, dict) else None
    except TypeError:
        return None
    if choice is None or choice.precision not in PATHS or not isinstance(choice.pass_ms, dict) or \
            not all(isinstance(v, dict) and all(isinstance(t, (int, float)) for t in v.values())
                    for v in choice.pass_ms.values()):
        return None
    return choice


def remember(gguf: Path, choice: PathChoice) -> Path | None:
    """Add the choice to the store (written whole, atomically): the store's path, or None where only this process
    could keep it."""
    s = store()
    return s.path if s.put(key(gguf), asdict(choice)) else None


def fits_twice(gguf: Path, available_bytes: int | None) -> bool:
    """Whether both paths' weights (about the file's size each) fit in MEMORY_SHARE of the memory available."""
    return available_bytes is None or 2 * Path(gguf).stat().st_size <= MEMORY_SHARE * available_bytes


def measure(models: dict, rows: int = ROWS, context: int = CONTEXT, reps: int = REPS) -> dict[str, dict[int, float]]:
    """path -> rows -> the fastest of `reps` passes, in seconds: a 1-row and a `rows`-row pass after `context`
    cached tokens on each path's model, alternated (the order flipped every rep), so that a burst of other load
    meets both paths; the fastest is kept, as other load only ever adds time."""
    from specdec.models.timing import primed, timed

    widths = [1, rows] if rows > 1 else [1]
    runs = {p: primed(m, context, widths) for p, m in models.items()}
    best = {p: {n: float("inf") for n in widths} for p in models}
    for rep in range(reps):
        for p in models if rep % 2 == 0 else tuple(reversed(list(models))):
            for n in widths:
                best[p][n] = min(best[p][n], timed(runs[p][n]))
    return best


def decide(best: dict[str, dict[int, float]], rule: str, agreement: dict[str, float] | None = None) -> PathChoice:
    """The lower sum of a 1-row and a verify pass (a plain step and a verify step weighing alike)."""
    from specdec.provenance import cpu_name

    chosen = min(best, key=lambda p: sum(best[p].values()))
    return PathChoice(chosen, {p: {str(n): round(1e3 * t, 3) for n, t in v.items()} for p, v in best.items()},
                      rule, agreement, f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {cpu_name()}")
