"""Attention's AVX-512 tiles against its AVX2 ones, side by side in one process (bit-identical outputs checked).

    .venv/bin/python scripts/attention_bench.py [--precision fp16] [--contexts 512,2048] [--pairs 60]

On the fp16 path `set_isa` changes only attention's build (its weights' kernel has one build), so the ratio is
attention's alone; on gguf-q16 it switches the integer kernel too. Per context: the median time of a 1-row and a
6-row pass on each build, and the median over alternated pairs of the AVX-512 pass's time over the AVX2 pass's.
Needs a CPU with AVX512-VNNI (set_isa's "vnni" build).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from specdec.models.loader import load_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--contexts", default="512,2048")
    ap.add_argument("--pairs", type=int, default=60)
    args = ap.parse_args()
    model = load_model("default", args.precision).model
    k = model.kernels
    if k is None or not k.cpu_has_vnni():
        print("attention_bench: needs the native kernels on a CPU with AVX512-VNNI", file=sys.stderr)
        return 2
    g = torch.Generator().manual_seed(0)
    vocab = model.cfg.vocab_size
    rows = (1, 6)
    for ctx in (int(c) for c in args.contexts.split(",")):
        cache = model.new_cache(1, ctx + max(rows) + 1)
        model.forward(torch.randint(0, vocab, (1, ctx), generator=g), torch.zeros(1, dtype=torch.long), cache,
                      last_only=torch.tensor([ctx - 1]), prefill=True)
        start = torch.tensor([ctx])
        toks = {n: torch.randint(0, vocab, (1, n), generator=g) for n in rows}
        before = k.set_isa("auto")
        try:
            logits, times = {}, {}
            for isa in ("avx2", "vnni"):
                k.set_isa(isa)
                logits[isa] = [model.forward(toks[n], start, cache).clone() for n in rows]
            for pair in range(args.pairs):
                for isa in (("avx2", "vnni") if pair % 2 else ("vnni", "avx2")):
                    k.set_isa(isa)
                    for n in rows:
                        t0 = time.perf_counter()
                        model.forward(toks[n], start, cache)
                        times.setdefault((isa, n), []).append(time.perf_counter() - t0)
        finally:
            k.set_isa(before)
        same = all(torch.equal(a, b) for a, b in zip(logits["avx2"], logits["vnni"]))
        for n in rows:
            a, w = times[("avx2", n)], times[("vnni", n)]
            ratio = statistics.median(x / y for x, y in zip(w, a))
            print(f"{args.precision} context {ctx}, {n} row(s): AVX2 {statistics.median(a) * 1e3:.2f} ms, AVX-512 "
                  f"{statistics.median(w) * 1e3:.2f} ms, AVX-512 / AVX2 per pair {ratio:.3f}; identical {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
