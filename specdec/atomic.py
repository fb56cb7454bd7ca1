"""Results files written whole or not at all: each is written to a temporary file in its own folder and renamed
into place, so a full disk, a missing permission or an interrupt leaves the previous file as it was (and no
truncated one); the failure is one SpecdecError line naming the file."""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specdec.errors import SpecdecError


def check_writable(path: str | os.PathLike | None) -> None:
    """Refuse, before any work, an output path that cannot be a file: a folder, or one in a missing folder."""
    if not path:
        return
    p = Path(path).expanduser()
    if p.is_dir():
        raise SpecdecError(f"cannot write {path}: it is a folder")
    if not p.resolve().parent.is_dir():
        raise SpecdecError(f"cannot write {path}: its folder does not exist")


def check_plot_path(path: str | os.PathLike | None) -> None:
    """check_writable, and a suffix matplotlib writes (none: PNG)."""
    check_writable(path)
    if not path:
        return
    from matplotlib.backend_bases import FigureCanvasBase

    fmt = Path(path).suffix.lstrip(".").lower()
    if fmt and fmt not in FigureCanvasBase.get_supported_filetypes():
        raise SpecdecError(f"cannot write a plot as {path}: choose a .png, .pdf or .svg file")


def _temporary(path: Path) -> tuple[Path, int]:
    """A new file next to `path` (same file system, so the rename is atomic), created with the umask's mode."""
    while True:
        tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue


@contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator:
    """A binary file object whose contents replace `path` when the block ends without an error. A symbolic link
    is followed (the file it names is replaced); a device or pipe (/dev/stdout, a FIFO) is written in place."""
    given = Path(os.path.abspath(Path(path).expanduser()))
    real = Path(os.path.realpath(given))
    with _reported(path):
        if given.parts[1:2] in (("dev",), ("proc",)) or (real.exists() and not real.is_file()):
            with open(given, "ab") as f:  # append: a redirected stdout keeps what came before
                yield f
            return
        tmp, fd = _temporary(real)
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, real)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


@contextmanager
def _reported(path) -> Iterator[None]:
    """An OSError in the block as one line naming the file."""
    try:
        yield
    except OSError as e:
        raise SpecdecError(f"cannot write {path}: {e.strerror or e}") from None


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    with atomic_file(path) as f:
        f.write(data)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def savefig_atomic(fig, path: str | os.PathLike, **kwargs) -> None:
    """matplotlib's fig.savefig(path), atomically; the format is the path's suffix (PNG without one)."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    with atomic_file(path) as f:
        fig.savefig(f, format=fmt, **kwargs)


class KeyedStore:
    """A JSON object in one file whose entries are keyed by what they were measured for (a model file, the CPU, the
    kernels' build, ...): read whole, where a missing, torn or foreign file reads as empty (what it held is measured
    again), and written whole. Where the file cannot be written, entries live on in this process's memory and the
    first failure says so in one line: measuring again next time is the only cost."""

    def __init__(self, path: Path, what: str):
        self.path, self.what = Path(path), what  # what: the entries, for the one line ("path choices")
        self.memory: dict = {}  # entries that could not be written
        self.warned = False

    def read(self) -> dict:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        return {**(data if isinstance(data, dict) else {}), **self.memory}

    def get(self, key: str):
        return self.read().get(key)

    def put(self, key: str, entry) -> bool:
        """Add `entry` under `key`, written whole; False when only this process's memory holds it now."""
        data = self.read()
        data[key] = entry
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path, json.dumps(data, indent=1))
            return True
        except (OSError, SpecdecError) as e:
            self.memory[key] = entry
            if not self.warned:
                self.warned = True
                why = str(e).removeprefix(f"cannot write {self.path}: ") if isinstance(e, SpecdecError) else \
                    (e.strerror or str(e))
                print(f"specdec: cannot write {self.path} ({why}): {self.what} measured now are kept in memory only, "
                      "and measured again by the next process", file=sys.stderr, flush=True)
            return False
