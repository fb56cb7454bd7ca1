"""Attention alone, one kernels build against another, side by side in one process.

    .venv/bin/python scripts/attention_ab.py [--rev HEAD~1] [--kv-cache q8_0] [--context 3300] [--rows 1]
                                                [--layers 30] [--cache-in memory|l2] [--amx] [--rounds 16] [--reps 20]

Compiles the attention (specdec/kernels/attention.cpp and what it includes) of --rev and of the working tree, each
with scripts/attention_ab.cpp, which writes a synthetic cache (the bundled model's shape by default: 3 KV heads
and 9 query heads of 64 dims, --layers layers, --context positions of normal values) and times passes of --rows rows
after it. `--cache-in l2` reads layer 0's cache for every layer, so it stays in the cores' caches: the arithmetic
alone. Checks that both builds write the same output bit for bit, then alternates them (the order flipped every
round) and prints each one's median and the ratio. `--amx` lets both use AMX's tiles where the CPU and the build
have them. What a layer's attention costs beside the rest of a pass: scripts/kernel_ab.py.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from specdec.kernels import FLAGS
from specdec.kernels.build import build_module

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from kernel_ab import git_error, sources_at  # noqa: E402  (a sibling script)

KINDS = {"f16": 0, "q8_0": 1, "q4_0": 2}


def build(name: str, src: Path, digest: str):
    """attention_ab.cpp compiled against the attention in `src` (a module per version of both)."""
    bench = hashlib.sha256((HERE / "attention_ab.cpp").read_bytes()).hexdigest()[:8]
    print(f"attention_ab: building {name} ({digest}), about half a minute the first time", file=sys.stderr)
    return build_module(f"attention_ab_{digest}_{bench}", [HERE / "attention_ab.cpp"], src / "attention-ab",
                        FLAGS + [f"-I{src}"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD~1")
    ap.add_argument("--kv-cache", default="q8_0", choices=sorted(KINDS))
    ap.add_argument("--context", type=int, default=3300)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--cache-in", choices=("memory", "l2"), default="memory")
    ap.add_argument("--amx", action="store_true")
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if min(args.context, args.rows, args.layers, args.rounds, args.reps, args.kv_heads) < 1 or \
            args.heads % args.kv_heads or args.head_dim % 32 or not 32 <= args.head_dim <= 256:
        print("attention_ab: counts must be at least 1, --heads a multiple of --kv-heads, --head-dim a multiple of 32 "
              "up to 256 (the kernels' largest head)", file=sys.stderr)
        return 2
    try:
        rev_src, rev_digest, _ = sources_at(args.rev)
    except subprocess.CalledProcessError as e:
        print(f"attention_ab: cannot read the kernels at {args.rev}: {git_error(e)}", file=sys.stderr)
        return 2
    tree_src, tree_digest, _ = sources_at(None)
    mods = {}
    for name, (src, digest) in {args.rev: (rev_src, rev_digest), "working tree": (tree_src, tree_digest)}.items():
        try:
            mods[name] = build(name, src, digest)
        except Exception as e:  # a compiler's error, printed by torch above
            print(f"attention_ab: cannot build the attention of {name} for this script: {e}".splitlines()[0],
                  file=sys.stderr)
            return 2
    hq, d = args.heads, args.head_dim
    cap = -(-(args.context + args.rows) // 64) * 64
    one_layer = args.cache_in == "l2"
    ids = {}
    for name, m in mods.items():
        if not m.use_amx(args.amx):
            print(f"attention_ab: {name} cannot use AMX's tiles here", file=sys.stderr)
            return 2
        try:
            ids[name] = m.make_cache(args.layers, args.kv_heads, cap, d, KINDS[args.kv_cache], args.context + args.rows)
        except (RuntimeError, MemoryError) as e:  # a cache past this machine's memory, say
            print(f"attention_ab: cannot make the cache: {str(e).splitlines()[0]}", file=sys.stderr)
            return 2
    outs = {}
    for name, m in mods.items():
        outs[name] = torch.zeros(args.rows * hq * d)
        m.run(ids[name], hq, args.context, args.rows, 1, one_layer, outs[name])
    a, b = outs.values()
    if not torch.equal(a, b):
        print(f"attention_ab: the builds' outputs differ (largest difference {(a - b).abs().max().item():.3g}); "
              "timing them anyway", file=sys.stderr)
    times = {name: [] for name in mods}
    names = list(mods)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(mods[name].run(ids[name], hq, args.context, args.rows, args.reps, one_layer,
                                              outs[name]))
    base = statistics.median(times[args.rev])
    print(f"attention alone: {args.kv_cache}, {args.rows} row(s) at {args.context} positions, {args.layers} layers of "
          f"{args.kv_heads} KV heads / {hq} heads of {d} dims, cache in {args.cache_in}, "
          f"{torch.get_num_threads()} threads, AMX {'on' if args.amx else 'off'}; medians of {args.rounds} rounds of "
          f"{args.reps} passes, alternated; outputs {'identical' if torch.equal(a, b) else 'DIFFER'}")
    for name in names:
        med = statistics.median(times[name])
        print(f"  {name:>14}: {med * 1e3:.3f} ms a pass ({med / args.layers * 1e6:.1f} us a layer), "
              f"{med / base:.3f}x {args.rev}'s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
