"""Compiling native modules into the cache so that no process, however it dies, can leave the cache blocked.

The cache holds one folder per version of the sources (`kernels/<digest>/`), and in it the finished module
(`<name>.so`) and nothing else. A process that finds the module loads it and never compiles. One that does not:

1. takes an `flock` on `kernels/<digest>.lock`: the operating system releases it when its holder dies, so a build
   killed by SIGKILL, a test's timeout or Ctrl-C blocks nobody. A process that must wait says once on stderr
   whose build it waits for and for how long it has run (the holder writes its PID and start time in the file);
2. compiles in a folder of its own (`kernels/.<digest>-build-XXXX/`), so a half-written build is never where a
   reader looks; folders left by killed builds are removed by the next builder, who holds the lock;
3. renames the module into place (atomic on one file system), so a reader sees all of it or nothing.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BUILD_PREFIX = "-build-"  # a builder's private folder: kernels/.<digest>-build-XXXX


@dataclass(frozen=True)
class Holder:
    """The process building a module, as written in the lock file by that process."""

    pid: int
    started: float  # time.time() when it took the lock

    def describe(self, now: float | None = None) -> str:
        age = (time.time() if now is None else now) - self.started
        return f"the kernel build in PID {self.pid}, started {age:.0f} s ago"


def lock_path(build: Path) -> Path:
    return build.with_name(build.name + ".lock")


def read_holder(build: Path) -> Holder | None:
    """Who is building `build` now, or None when nobody holds its lock (a file left by a dead holder says nothing:
    only a lock that is held counts)."""
    path = lock_path(build)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: the holder's line tells who
            return _parse_holder(os.pread(fd, 200, 0))
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _parse_holder(text: bytes) -> Holder:
    try:
        pid, started = text.decode().split()[:2]
        return Holder(int(pid), float(started))
    except (ValueError, UnicodeDecodeError):  # the holder has not written its line yet
        return Holder(-1, time.time())


class BuildLock:
    """`with BuildLock(build, say):` holds `build`'s lock, waiting (and saying so once, through `say`) while
    another live process holds it."""

    def __init__(self, build: Path, say: Callable[[str], None]):
        self.path, self.say = lock_path(build), say

    def __enter__(self) -> BuildLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the compiler (PEP 446)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.say(f"specdec: waiting for {_parse_holder(os.pread(self.fd, 200, 0)).describe()}")
            fcntl.flock(self.fd, fcntl.LOCK_EX)  # returns as soon as the holder finishes or dies
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()} {time.time():.3f}\n".encode(), 0)
        return self

    def __exit__(self, *exc) -> None:
        os.ftruncate(self.fd, 0)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def load_built(name: str, so: Path):
    """The extension module `name` from its finished file (torch first: the module links against it)."""
    import torch  # noqa: F401

    spec = importlib.util.spec_from_file_location(name, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_finished(name: str, so: Path, say: Callable[[str], None]):
    """The module from its finished file, or None when there is none or it will not load (a disk that failed, a
    file edited by hand): that file is removed, to be built again."""
    if not so.is_file():
        return None
    try:
        return load_built(name, so)
    except (ImportError, OSError) as e:
        say(f"specdec: the cached kernels in {so} would not load ({str(e).splitlines()[0][:160]}); building again")
        so.unlink(missing_ok=True)
        return None


def build_module(name: str, sources: list[Path], build: Path, flags: list[str],
                 say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)):
    """The module `name` compiled from `sources` with `flags`, finished in `build/<name>.so`: loaded from there
    when it is, else built once (see the module's docstring) and then loaded."""
    so = build / f"{name}.so"
    if (module := load_finished(name, so, say)) is not None:
        return module
    with BuildLock(build, say):
        if (module := load_finished(name, so, say)) is not None:  # built by another while this one waited
            return module
        for stale in build.parent.glob(f".{build.name}{BUILD_PREFIX}*"):  # left by builds that were killed
            shutil.rmtree(stale, ignore_errors=True)
        private = Path(tempfile.mkdtemp(prefix=f".{build.name}{BUILD_PREFIX}", dir=build.parent))
        try:
            from torch.utils.cpp_extension import load

            say("specdec: compiling the native kernels for this CPU (once, a minute or two)")
            t0 = time.monotonic()
            module = load(name, [str(p) for p in sources], extra_cflags=flags, extra_ldflags=["-fopenmp"],
                          build_directory=str(private), verbose=False)
            build.mkdir(parents=True, exist_ok=True)
            os.replace(private / f"{name}.so", so)
            say(f"specdec: kernels compiled in {time.monotonic() - t0:.0f} s ({so})")
            return module
        finally:
            shutil.rmtree(private, ignore_errors=True)
