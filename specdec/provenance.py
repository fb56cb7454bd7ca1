"""Where a result came from: the machine, the code revision and the command, stamped into every JSON that
reports a measurement.

A figure without its CPU, bandwidth and revision cannot be compared with another or reproduced, so every
writer of results (`bench --json`, `profile --json`, `real-models`, the load tests) puts `provenance()` at the
top level of what it writes. This module sits at the bottom layer: it imports nothing from specdec,
and it never raises for a missing tool (no lscpu, no git, not a checkout): it writes "?" instead.
"""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_tile")
GENERIC_NAMES = ("AMD EPYC", "AMD EPYC Processor", "Intel Xeon Processor", "Common KVM processor",
                 "QEMU Virtual CPU")  # what some hypervisors report: the family and model say which CPU it is
PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the checkout holding specdec/, when there is one
BANDWIDTH_BYTES = 256 << 20  # large enough to leave every cache, small enough for well under a second


def provenance(bandwidth: bool = False) -> dict:
    """The machine, revision and command of this run, as JSON-ready values. bandwidth=True adds a quick
    read-bandwidth probe (about half a second); otherwise bandwidth_gbs is None (a caller that measured it
    better, as `profile` does, puts its own figure there)."""
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "isa": isa(),
            "bandwidth_gbs": read_bandwidth_gbs() if bandwidth else None,
            "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "git": git_revision(PACKAGE_ROOT), "command": command_line(), "load_avg": list(os.getloadavg())}


def run_quiet(cmd: list[str], cwd: Path | None = None) -> str | None:
    """stdout of cmd, or None when it cannot run or fails."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=cwd,
                           env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    first = text.split("\n\n", 1)[0]
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first.splitlines()) if v}


def cpu_name() -> str:
    """lscpu's model name; with the family and model numbers when the name is a hypervisor's generic one."""
    lscpu = dict(line.split(":", 1) for line in (run_quiet(["lscpu"]) or "").splitlines() if ":" in line)
    info = cpuinfo()
    name = (lscpu.get("Model name") or info.get("model name") or "?").strip()
    if name in GENERIC_NAMES or name == "?":
        family, model = info.get("cpu family"), info.get("model")
        if family and model:
            name += f" (family {family}, model {model})"
    return name


def isa() -> list[str]:
    """The instruction-set extensions the kernels choose between, as present on this CPU."""
    flags = set(cpuinfo().get("flags", "").split())
    return [f for f in ISA_FLAGS if f in flags]


def git_revision(root: Path) -> str:
    """Short revision of the checkout at root, "-dirty" when tracked files under specdec/ differ from it; "?"
    when root is not a git checkout (an installed package) or git is missing."""
    rev = run_quiet(["git", "rev-parse", "--short", "HEAD"], cwd=root)
    if not rev:
        return "?"
    changed = run_quiet(["git", "status", "--porcelain", "--untracked-files=no", "--", "specdec"], cwd=root)
    return rev + ("-dirty" if changed else "")


def command_line() -> str:
    """The command as typed: `specdec ...` for the console script (not the virtual environment's full path)."""
    if not sys.argv:
        return "?"
    if Path(sys.argv[0]).name == "specdec":
        return shlex.join(["specdec", *sys.argv[1:]])
    return shlex.join(sys.argv)


def read_bandwidth_gbs(nbytes: int = BANDWIDTH_BYTES, reps: int = 5) -> float:
    """Read bandwidth, GB/s: the median time of a numpy sum over nbytes (first touched untimed: page faults).
    A quick figure for the record; `specdec profile` measures it over 1 GiB with torch."""
    import numpy as np

    x = np.ones(nbytes // 4, dtype=np.float32)  # [n]
    x.sum()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t0)
    return round(x.nbytes / statistics.median(times) / 1e9, 2)
