"""How many threads a pass runs on: the CPUs this process may use, less those other processes are using.

The native kernels and torch split a pass between the threads of one OpenMP team, which meet at barriers many
times a pass. A team larger than the cores it actually gets is the worst case there is: a thread that reaches a
barrier spins while the thread it waits for is not running. Two servers with full teams on one 2-core machine each
ran at 4-5% of one alone (issue 48). So the team is sized twice:

- at start (`Budget`), from what the process may use: its affinity mask (taskset, a cpuset) and its cgroup CPU
  quota (a container's `--cpus`, systemd's CPUQuota), or `--threads N` / SPECDEC_THREADS;
- while it runs (`Sharing.before_pass`, at most every `interval_s`: /proc/stat counts in 10 ms ticks, so a window
  of 0.25 s on 2 CPUs reads others' use to about 0.1 CPU), from how much of those CPUs other processes
  used since the last look: /proc/stat's busy time on the allowed CPUs less this process's own CPU time. The team
  loses a thread when others took more than half a CPU of what it needs, and takes it back once they leave the
  larger team all but a quarter of a CPU. With a team of one a pass has no barrier to wait at: two servers
  loaded at once on 2 cores each kept 60-76% of one alone's speed, three 42-55% (docs/results/sharing.md).

A fixed `--threads N` is taken as asked and never changes. The team size changes no result: every kernel computes
each row in the same order whatever the number of threads (kernels/common.h).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError

ENV = "SPECDEC_THREADS"
SHRINK_MARGIN = 0.5  # a CPU's worth others must take from the team's CPUs before it loses a thread
GROW_MARGIN = 0.25  # the most of a CPU others may use of the larger team's CPUs for it to take one back


def cpu_list(cpus) -> str:
    """0-3,6,8-9: a set of CPU numbers as taskset and /proc write them."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _v2_quota(folder: Path) -> float | None:
    text = _read(folder / "cpu.max")  # "max 100000" or "150000 100000": microseconds per period
    if not text:
        return None
    quota, _, period = text.partition(" ")
    return None if quota == "max" or not period else int(quota) / int(period)


def _v1_quota(folder: Path) -> float | None:
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    if quota is None or period is None or int(quota) <= 0:
        return None
    return int(quota) / int(period)


def cgroup_quota(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup, in CPUs (the smallest along its path up to the root), or None when
    none is set or none can be read. cgroup v2 (`cpu.max`) and v1 (`cpu.cfs_quota_us` over `cpu.cfs_period_us`,
    the `cpu` controller's hierarchy) alike. In a container the cgroup's own folder is often mounted as the root:
    a path that does not exist under `root` is read from `root` itself."""
    text = _read(proc_cgroup)
    if not text:
        return None
    found: list[float] = []
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            base, read = root, _v2_quota
        elif "cpu" in controllers.split(","):
            base = next((root / d for d in ("cpu", "cpu,cpuacct", "cpuacct,cpu") if (root / d).is_dir()), None)
            read = _v1_quota
            if base is None:
                continue
        else:
            continue
        folder = base / path.lstrip("/")
        if not folder.is_dir():
            folder = base
        while True:
            q = read(folder)
            if q is not None:
                found.append(q)
            if folder == base or folder.parent == folder:
                break
            folder = folder.parent
    return min(found) if found else None


def _requested(threads: int | str | None) -> int | None:
    """--threads or SPECDEC_THREADS as a number of threads, None for auto."""
    src = "--threads"
    if threads is None:
        threads, src = os.environ.get(ENV), ENV
    if threads is None or str(threads).strip().lower() in ("", "auto"):
        return None
    try:
        n = int(str(threads).strip())
    except ValueError:
        n = 0
    if n < 1:
        raise SpecdecError(f"{src} takes a positive whole number of threads or 'auto', got {threads!r}")
    return n


@dataclass(frozen=True)
class Budget:
    """The CPUs this process may use, and the team it starts with."""
    cpus: tuple[int, ...]  # its affinity mask
    quota: float | None  # its cgroup CPU quota in CPUs, None: no limit
    requested: int | None = None  # --threads / SPECDEC_THREADS; None: decided here

    @classmethod
    def read(cls, threads: int | str | None = None) -> Budget:
        """This process's budget; `threads`: --threads (a number or 'auto'), else SPECDEC_THREADS, else auto."""
        requested = _requested(threads)
        return cls(tuple(sorted(os.sched_getaffinity(0))), cgroup_quota(), requested)

    @property
    def usable(self) -> float:
        """CPUs' worth of time the process may use at once."""
        return min(len(self.cpus), self.quota) if self.quota is not None else float(len(self.cpus))

    @property
    def threads(self) -> int:
        """The team at start: as asked, else one thread per whole CPU the mask and the quota allow (a quota of 1.5
        gets one: a second thread would spend the periods the quota throttles waiting at barriers)."""
        if self.requested is not None:
            return self.requested
        return max(1, min(len(self.cpus), math.floor(self.usable + 1e-6)))

    @property
    def adaptive(self) -> bool:
        return self.requested is None

    def describe(self) -> str:
        """threads: 2 (affinity 0-1, quota 2.0 CPUs): the line every command prints at start."""
        quota = "none" if self.quota is None else f"{self.quota:.1f} CPUs"
        why = "set by --threads/SPECDEC_THREADS; " if self.requested is not None else ""
        tail = ", fewer while other processes use these CPUs" if self.adaptive and self.threads > 1 else ""
        return f"threads: {self.threads} ({why}affinity {cpu_list(self.cpus)}, quota {quota}){tail}"


def read_cpu_busy(cpus: tuple[int, ...], stat: Path = Path("/proc/stat")) -> float | None:
    """Seconds the CPUs `cpus` have spent busy since boot (user, nice, system, irq, softirq and steal: steal is a
    hypervisor running someone else on them), or None when /proc/stat cannot be read."""
    text = _read(stat)
    if text is None:
        return None
    wanted, ticks = {f"cpu{c}" for c in cpus}, 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name in wanted:
            f = [int(v) for v in rest.split()]
            ticks += f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


class Sharing:
    """The team a pass runs on, rechecked against other processes' use of this process's CPUs.

    `before_pass()` is called by every forward pass, on the thread that runs it (OpenMP's team size is that
    thread's setting); between checks it costs one clock read."""

    def __init__(self, budget: Budget, interval_s: float = 0.25, set_threads: Callable[[int], None] | None = None,
                 busy: Callable[[], float | None] | None = None, own: Callable[[], float] = time.process_time,
                 clock: Callable[[], float] = time.monotonic):
        self.budget, self.interval_s = budget, interval_s
        self._set = set_threads or _torch_set_threads
        self._busy = busy or (lambda: read_cpu_busy(budget.cpus))
        self._own, self._clock = own, clock
        self.threads = budget.threads
        self.others = 0.0  # CPUs' worth other processes used of ours over the last window
        self.changes = 0  # how often the team changed size
        self.announce = False  # print the `threads:` line at the first pass (configure's announce)
        self._set(self.threads)
        self._mark = self._sample()

    def _sample(self) -> tuple[float, float | None, float]:
        return self._clock(), self._busy(), self._own()

    def before_pass(self) -> int:
        """The team for the next pass (set for this thread)."""
        if self.announce:
            self.announce = False
            print(f"specdec: {self.budget.describe()}", file=sys.stderr, flush=True)
        if not self.budget.adaptive:
            return self.threads
        now = self._clock()
        elapsed = now - self._mark[0]
        if elapsed < self.interval_s:
            return self.threads
        mark, self._mark = self._mark, self._sample()
        if elapsed > 10 * self.interval_s or mark[1] is None or self._mark[1] is None:
            return self.threads  # after an idle spell the window says little about now: start a fresh one
        used = (self._mark[1] - mark[1]) - (self._mark[2] - mark[2])
        self.others = max(0.0, used / elapsed)
        free = len(self.budget.cpus) - self.others
        want = self.threads
        if self.threads > 1 and free < self.threads - SHRINK_MARGIN:
            want = max(1, math.floor(free + SHRINK_MARGIN))
        elif self.threads < self.budget.threads and free >= self.threads + 1 - GROW_MARGIN:
            want = self.threads + 1
        if want != self.threads:
            self.threads, self.changes = want, self.changes + 1
            self._set(want)
        return self.threads


def _torch_set_threads(n: int) -> None:
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


_sharing: Sharing | None = None


def configure(threads: int | str | None = None, announce: bool = False) -> Sharing:
    """Size this process's team (`threads`: --threads, a number or 'auto'; None: SPECDEC_THREADS, else auto) and
    start sharing. `announce`: print the `threads:` line on stderr when the first pass starts (a command that stops
    at bad input first still says only its one error line). Bad input raises SpecdecError."""
    global _sharing
    _sharing = Sharing(Budget.read(threads))
    _sharing.announce = announce
    return _sharing


def sharing() -> Sharing:
    """The process's Sharing: configure()'s, or one made on first use from SPECDEC_THREADS."""
    return _sharing if _sharing is not None else configure()


def before_pass() -> int:
    """Called by every forward pass: the team it runs on (see Sharing.before_pass)."""
    return sharing().before_pass()
