"""`specdec kernels`: build this CPU's native kernels now (as `make setup` does), so that no later start, server or
first request pays for the compile, and say which build runs and where it is kept."""

from __future__ import annotations

import sys
import time


def register(sub) -> None:
    k = sub.add_parser("kernels", help="build the native CPU kernels now (once per version) and say which run")
    k.set_defaults(func=run_kernels)


def run_kernels(args) -> int:
    from specdec.kernels import decode_kernels, kernels_dir

    t0 = time.monotonic()
    kernels = decode_kernels()
    if kernels is None:  # decode_kernels said why on stderr
        print("specdec: the torch path will run (slower, equally exact)", file=sys.stderr)
        return 0
    print(f"specdec: kernels ready ({kernels.isa()} build, {time.monotonic() - t0:.1f} s) in {kernels_dir()}",
          file=sys.stderr)
    return 0
