"""KV caches on 2 MB pages against 4 KB pages, side by side in one process (the same weights, the same kernels).

A slot's keys and values lie in one region a (layer, key or value, kv head) of `capacity` positions each. A new
sequence writes the first positions of every region, so on 2 MB pages it faults (and the kernel zeroes, after
compacting memory for it) one huge page a region or two: hundreds of MB for a few hundred positions. This measures
what that first touch costs a fresh slot, and what each page size costs the passes once the pages are there: one-
and 6-row passes at several contexts, the two caches alternated pass by pass.

    .venv/bin/python scripts/kv_pages_bench.py --contexts 256,2048,8000 --reps 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.bench.engines.real_models import proc_rss  # noqa: E402
from specdec.bench.hardware.profile import measure_bandwidth  # noqa: E402
from specdec.models.kv_cache import KVCache  # noqa: E402
from specdec.provenance import cpu_name, git_revision  # noqa: E402
from specdec.runtime import ModelSpec, build  # noqa: E402


def cache(model, capacity: int, huge: bool) -> KVCache:
    """One slot's blocked fp16 cache: the server's layout, on 2 MB pages (where THP is granted) or 4 KB pages."""
    return model.new_cache(1, capacity, huge_pages=huge)


def rss_mb() -> float:
    return proc_rss(os.getpid())["RssAnon"] / 2**20


def fill(model, c: KVCache, n: int, chunk: int = 256) -> float:
    """Prefill positions [0, n) with token 1..; seconds."""
    t0 = time.perf_counter()
    for a in range(0, n, chunk):
        m = min(chunk, n - a)
        model.forward_ragged(torch.ones(m, dtype=torch.long), torch.zeros(m, dtype=torch.long),
                             torch.arange(a, a + m), c, select=torch.tensor([m - 1]))
    return time.perf_counter() - t0


def one_pass(model, c: KVCache, at: int, rows: int) -> float:
    t0 = time.perf_counter()
    model.forward_ragged(torch.ones(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.long),
                         torch.arange(at, at + rows), c)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="256,2048,8000")
    ap.add_argument("--capacity", type=int, default=8192, help="positions a slot holds (the server's --context)")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    contexts = [int(x) for x in args.contexts.split(",")]
    bw = measure_bandwidth(1 << 30, 5)["read_GBps"]
    target, _ = build(ModelSpec(model="default", drafter="none"))
    model = target.model
    print(f"# KV caches on 2 MB against 4 KB pages: {target.name} ({model.precision}), capacity {args.capacity}")
    rev, when = git_revision(Path(__file__).resolve().parents[1]), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"- CPU: {cpu_name()}; {torch.get_num_threads()} threads; read bandwidth {bw:.1f} GB/s; git {rev}; "
          f"{when}; THP "
          + Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
          + ", defrag " + Path("/sys/kernel/mm/transparent_hugepage/defrag").read_text().strip())
    print(f"- command: `.venv/bin/python scripts/kv_pages_bench.py --contexts {args.contexts} --capacity "
          f"{args.capacity} --reps {args.reps}`\n")
    one_pass(model, cache(model, 256, False), 0, 1)  # warm the kernels
    print("First touch: a fresh slot's first 64-position prefill chunk (what a new request pays), then 3 more "
          "fresh slots of each kind, alternated\n")
    print("| pages | first chunk ms (4 slots) | anonymous memory taken MB a slot |")
    print("|---|---|---|")
    first: dict[bool, list[float]] = {True: [], False: []}
    taken: dict[bool, list[float]] = {True: [], False: []}
    keep = []
    for _ in range(4):
        for huge in (True, False):
            c = cache(model, args.capacity, huge)
            before = rss_mb()
            first[huge].append(fill(model, c, 64, 64) * 1000)
            taken[huge].append(rss_mb() - before)
            keep.append(c)
    for huge in (True, False):
        print(f"| {'2 MB' if huge else '4 KB'} | {', '.join(f'{x:.0f}' for x in first[huge])} | "
              f"{statistics.median(taken[huge]):.0f} |")
    del keep
    print("\nPasses once the pages are there: median ms over the reps, the two caches alternated pass by pass "
          "(4 KB over 2 MB: above 1, 4 KB pages are slower)\n")
    print("| context | rows | 2 MB ms | 4 KB ms | 4 KB / 2 MB |")
    print("|---|---|---|---|---|")
    caches = {huge: cache(model, args.capacity, huge) for huge in (True, False)}
    for c in caches.values():
        fill(model, c, max(contexts))
    for ctx in contexts:
        for rows in (1, 6):
            t: dict[bool, list[float]] = {True: [], False: []}
            for i in range(args.reps):
                for huge in ((True, False) if i % 2 else (False, True)):
                    t[huge].append(one_pass(model, caches[huge], ctx, rows))
            h, s = statistics.median(t[True]) * 1000, statistics.median(t[False]) * 1000
            print(f"| {ctx} | {rows} | {h:.2f} | {s:.2f} | {s / h:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
