"""Native CPU kernels for the decode pass (AVX2 + FMA + F16C), compiled on first use and cached.

The integer kernel of the GGUF paths (`gguf_q8.inc`) is built twice into the module, for AVX2 and for
AVX512-VNNI, and the module picks the second where the CPU has it (`isa()`, `set_isa()`); where the CPU also has
AMX-INT8, the q16 products of passes of 5 rows or more run on AMX's tiles (`gguf_amx.inc`, `isa()` "amx"). Their
integer sums are exact either way, so the outputs are bit-identical.

`decode_f16.cpp` runs a whole decoder block of a decode, verify or prefill pass in one call, with fp16
weights read once per call whatever the number of rows, and every result computed per row in a fixed order
(batch invariance by construction). `attention.cpp` keeps the KV cache in fp16 and reads a sequence's
keys and values once per pass for all of its rows; where the CPU has AVX-512F its tiles run in 512-bit
registers, with the AVX2 tiles' bits (`set_isa("avx2")` turns them off with the integer kernel's build).
Without a compiler, or on a CPU without AVX2, specdec falls back to the torch path (fbgemm), which is slower
but equally exact.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import time
from pathlib import Path

SOURCES = [Path(__file__).with_name(n) for n in ("decode_f16.cpp", "attention.cpp", "gguf.cpp")]
HEADERS = [Path(__file__).with_name(n) for n in ("common.h", "gguf_q8.inc", "gguf_amx.inc")]
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"]


def _cpu_supports() -> bool:
    import torch

    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


STALE_LOCK_S = 600  # a build takes one to three minutes here; a lock this old outlived the process that took it


def clear_stale_lock(build: Path, now: float | None = None) -> bool:
    """Remove `build`'s lock if it is older than STALE_LOCK_S; True if it did.

    torch's builder holds a lock file while it compiles and waits, without end, while another holds it. A process
    killed mid-build (Ctrl-C on a first run, a test's timeout) leaves the file behind, and every later start then
    hung silently."""
    lock = build / "lock"
    try:
        age = (time.time() if now is None else now) - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < STALE_LOCK_S:
        return False
    print(f"specdec: removing a build lock left {age / 60:.0f} minutes ago by a process that stopped mid-build "
          f"({lock})", file=sys.stderr)
    lock.unlink(missing_ok=True)
    return True


def pairs_layout(kernels) -> bool:
    """Whether `kernels` (a decode_kernels() module) read integer weights fastest stored in pairs of groups: the
    VNNI build does, and AMX's tiles read the same pairs; the AVX2 build reads them group by group (gguf.cpp)."""
    return kernels.isa() != "avx2"


def compile_module(name: str, sources: list[Path], build: Path):
    """The kernels built from `sources` (the SOURCES of some version, its headers beside them) in `build`."""
    from torch.utils.cpp_extension import load

    clear_stale_lock(build)
    return load(name, [str(p) for p in sources], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                build_directory=str(build), verbose=False)


@functools.lru_cache(maxsize=1)
def decode_kernels():
    """The compiled module, or None (with one line on stderr saying why) when it cannot be had."""
    if os.environ.get("SPECDEC_NO_KERNELS"):
        return None
    try:
        if not _cpu_supports():
            raise RuntimeError("this CPU has no AVX2")
        from specdec.models.gguf_convert import cache_root

        digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES + HEADERS)).hexdigest()[:12]
        build = cache_root() / "kernels" / digest  # a changed source never meets a stale build
        build.mkdir(parents=True, exist_ok=True)
        if not any(build.glob("*.so")):
            print("specdec: compiling the decode kernels (once, about a minute)", file=sys.stderr)
        return compile_module("specdec_decode_f16", SOURCES, build)
    except Exception as e:  # no compiler, no ninja, an unsupported CPU: stay correct, get slower
        print(f"specdec: native decode kernels unavailable ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
              "using the torch path", file=sys.stderr)
        return None
