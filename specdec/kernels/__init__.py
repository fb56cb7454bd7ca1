"""Native CPU kernels for the decode pass (AVX2 + FMA + F16C), compiled on first use and cached.

The integer kernel of the GGUF paths (`gguf_q8.inc`, `gguf_kq.inc`) is built twice into the module, for AVX2
(`gguf_avx2.cpp`) and for AVX512-VNNI (`gguf_vnni.cpp`), and the module picks the second where the CPU has it
(`isa()`, `set_isa()`); where the CPU also has AMX-INT8, the q16 products of passes of 5 rows or more run on AMX's
tiles (`gguf_amx.inc`, `isa()` "amx"). Their integer sums are exact either way, so the outputs are bit-identical.
The builds are translation units without torch's API (`gguf_core.h`), compiled beside `module.cpp`, which holds
the torch-facing sources (decode_f16.cpp, attention.cpp, gguf.cpp): about a minute on 2 cores, from two.

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
from pathlib import Path

# Compiled side by side, the longest first (module.cpp holds decode_f16.cpp, attention.cpp and gguf.cpp)
SOURCES = [Path(__file__).with_name(n) for n in ("gguf_vnni.cpp", "module.cpp", "gguf_avx2.cpp")]
HEADERS = [Path(__file__).with_name(n)
           for n in ("decode_f16.cpp", "attention.cpp", "attention_q.inc", "gguf.cpp", "common.h", "gguf_core.h",
                     "gguf_q8.inc", "gguf_kq.inc", "gguf_pack.inc", "gguf_amx.inc", "attention_amx.inc",
                     "amx_tiles.h")]
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"]


def _cpu_supports() -> bool:
    import torch

    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def pairs_layout(kernels) -> bool:
    """Whether `kernels` (a decode_kernels() module) read integer weights fastest stored in pairs of groups: the
    VNNI build does, and AMX's tiles read the same pairs; the AVX2 build reads them group by group (gguf.cpp)."""
    return kernels.isa() != "avx2"


def compile_module(name: str, sources: list[Path], build: Path):
    """The kernels built from `sources` (the SOURCES of some version, its headers beside them), finished in
    `build` (see kernels.build: a build killed midway blocks no later process)."""
    from specdec.kernels.build import build_module

    return build_module(name, sources, build, FLAGS)


def source_digest() -> str:
    """What the built module depends on: the sources, the flags, torch's version (the module links against it)
    and Python's ABI. A changed one never meets a stale build."""
    import torch

    parts = [p.read_bytes() for p in SOURCES + HEADERS]
    parts += [" ".join(FLAGS).encode(), torch.__version__.encode(), sys.implementation.cache_tag.encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:12]


def kernels_dir() -> Path:
    """Where this version's module is built and kept."""
    from specdec.paths import kernels_root

    return kernels_root() / source_digest()


OFF = "SPECDEC_NO_KERNELS"  # set (to anything but empty): the native kernels are off on purpose, nothing is built


def kernels_off() -> bool:
    return bool(os.environ.get(OFF))


def build_kernels():
    """The compiled module, loaded from the cache or built into it now; raises, saying why, when it cannot be had
    (no compiler, no ninja, a CPU without AVX2). Heeds no SPECDEC_NO_KERNELS: the caller decides."""
    if not _cpu_supports():
        raise RuntimeError("this CPU has no AVX2")
    return compile_module("specdec_decode_f16", SOURCES, kernels_dir())


def unavailable(e: Exception) -> str:
    """Why the kernels cannot be had, in a few words: the exception's first line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def decode_kernels():
    """The compiled module, or None when they are off (SPECDEC_NO_KERNELS, read on every call, so that a process
    that turns them off for a while caches nothing) or cannot be had (said once, in one line on stderr)."""
    return None if kernels_off() else _built_once()


@functools.lru_cache(maxsize=1)
def _built_once():
    try:
        return build_kernels()
    except Exception as e:  # no compiler, no ninja, an unsupported CPU: stay correct, get slower
        print(f"specdec: native decode kernels unavailable ({unavailable(e)}); using the torch path "
              "(`specdec kernels` shows the compiler's output)", file=sys.stderr)
        return None
