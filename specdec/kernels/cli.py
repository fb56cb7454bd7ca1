"""`specdec kernels`: build this CPU's native kernels now (as `make setup` does), so that no later start, server or
first request pays for the compile, and say which build runs and where it is kept.

It exits 1 when they cannot be built (no compiler, no ninja, a CPU without AVX2), with one line saying why and
where the compiler's whole output went, so that a set-up script or CI stops there rather than running on the
slower torch path unawares. With SPECDEC_NO_KERNELS set, the kernels are off on purpose: it builds nothing, says
so, and exits 0."""

from __future__ import annotations

import sys
import time


def register(sub) -> None:
    k = sub.add_parser("kernels", help="build the native CPU kernels now (once per version) and say which run; "
                                       "exits 1 when they cannot be built")
    k.set_defaults(func=run_kernels)


def run_kernels(args) -> int:
    from specdec.kernels import OFF, build_kernels, kernels_dir, kernels_off, unavailable

    if kernels_off():
        print(f"specdec: {OFF} is set: the native kernels are off, nothing was built; the torch path will run "
              "(slower, equally exact)", file=sys.stderr)
        return 0
    t0 = time.monotonic()
    try:
        kernels = build_kernels()
    except Exception as e:  # whatever stopped the build, the command says so and fails
        log = kernels_dir().with_suffix(".log")
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(f"{type(e).__name__}: {e}\n")
            where = f"; the whole output is in {log}"
        except OSError:
            where = ""
        print(f"specdec: error: the native kernels could not be built ({unavailable(e)}){where}", file=sys.stderr)
        return 1
    print(f"specdec: kernels ready ({kernels.isa()} build, {time.monotonic() - t0:.1f} s) in {kernels_dir()}",
          file=sys.stderr)
    return 0
