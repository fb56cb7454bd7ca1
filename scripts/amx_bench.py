"""AMX's tiles against the VNNI build's dot products, side by side in one process.

    .venv/bin/python scripts/amx_bench.py [--model default|FILE.gguf] [--context 512] [--rows 2,4,5,6,8,16,64]
        [--reps 20] [--prefill 432,1000] [--precision gguf-q16|gguf-q8] [--kv-cache f16|q8_0|q4_0]

On the bundled model or --model (--precision, gguf-q16 unless told: weights in pairs of groups, the layout both
builds read; --kv-cache, f16 unless told: q8_0's prefill attention takes the tiles too), alternating
the two builds (`set_isa("vnni")` and `set_isa("amx")`, the order flipped every repetition so that drift falls on
both alike):
1. each product's shape alone (layer 0's qkv, o, gate_up and down, and the 8-bit LM head) at each number of rows,
   every thread as in a pass, with the results checked bit-identical;
2. whole passes of those rows at context 512, logits checked bit-identical;
3. prefills of random prompts of --prefill tokens (time to first token).
Prints each time on AMX over the time on VNNI. AMX runs a product from 5 rows (gguf.cpp's AMX_MIN_ROWS; a K-quant's
from 16, KQ_AMX_MIN_ROWS, and never Q6_K): below that both builds run the same code, and their ratio shows this
machine's noise; gguf-q8's products run on AMX from 16 rows (AMX8_MIN_ROWS). Needs a CPU with AMX-INT8.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from specdec.bench.cli import parse_ints
from specdec.errors import SpecdecError
from specdec.models.loader import load_model


def alternate(kernels, reps: int, run) -> tuple[float, float, object, object]:
    """Median seconds of run() on VNNI and on AMX, alternated, and each build's last result."""
    times: dict[str, list[float]] = {"vnni": [], "amx": []}
    out = {}
    for rep in range(reps):
        for isa in ("vnni", "amx") if rep % 2 == 0 else ("amx", "vnni"):
            kernels.set_isa(isa)
            t0 = time.perf_counter()
            out[isa] = run()
            times[isa].append(time.perf_counter() - t0)
    return statistics.median(times["vnni"]), statistics.median(times["amx"]), out["vnni"], out["amx"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="the bundled model, or a .gguf (a synth-gguf shape, say)")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--rows", default="2,4,5,6,8,16,64")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--prefill", default="432,1000")
    ap.add_argument("--precision", default="gguf-q16", choices=("gguf-q16", "gguf-q8"))
    ap.add_argument("--kv-cache", default="f16", help="the KV cache type both builds run (f16, q8_0, q4_0)")
    args = ap.parse_args()
    try:
        rows, lengths = parse_ints(args.rows, "--rows"), parse_ints(args.prefill, "--prefill")
        if args.reps < 1 or args.context < 1:
            raise SpecdecError(f"--reps and --context must be at least 1, not {args.reps} and {args.context}")
        return measure(rows, lengths, args.reps, args.model, args.context, args.precision, args.kv_cache)
    except SpecdecError as e:
        print(f"amx_bench: {e}", file=sys.stderr)
        return 2


def measure(rows: list[int], lengths: list[int], reps: int, name: str = "default", ctx: int = 512,
            precision: str = "gguf-q16", kv_cache: str = "f16") -> int:
    model = load_model(name, precision, kv_cache=kv_cache).model
    k, cfg = model.kernels, model.cfg
    if k is None or model.lm_head_q is None or not k.cpu_has_amx():
        raise SpecdecError("needs the native kernels on a CPU with AMX-INT8 that this process may use")
    if ctx + max(rows) > cfg.max_position_embeddings or max(lengths) > cfg.max_position_embeddings:
        raise SpecdecError(f"rows and prompts must fit the model's {cfg.max_position_embeddings} positions")
    before = k.set_isa("amx")
    g = torch.Generator().manual_seed(0)
    try:
        print(f"{precision}, KV cache {kv_cache}, {reps} alternated repetitions, {torch.get_num_threads()} threads; "
              "time on AMX / on VNNI")
        mats = dict(zip(("qkv", "o", "gate_up", "down"), model.blocks[0].qmatrices), lm_head=model.lm_head_q)
        print(f"{'product':>24}  " + "  ".join(f"{n:>6}" for n in rows))
        for name, m in mats.items():
            ratios = []
            for n in rows:
                x = torch.randn(n, m.K, generator=g)
                v, a, ov, oa = alternate(k, reps, lambda x=x, m=m: [k.gemm_gguf(x, m) for _ in range(10)][-1])
                if not torch.equal(ov, oa):
                    raise SpecdecError(f"{name} at {n} rows: the builds' products differ")
                ratios.append(a / v)
            print(f"{name + f' [{m.N}, {m.K}]':>24}  " + "  ".join(f"{r:6.3f}" for r in ratios))
        cache = model.new_cache(1, ctx + max(rows) + 1)
        model.forward(torch.randint(0, cfg.vocab_size, (1, ctx), generator=g), torch.zeros(1, dtype=torch.long),
                      cache, last_only=torch.tensor([ctx - 1]), prefill=True)
        start = torch.tensor([ctx])
        line, one = [], None
        for n in rows:
            toks = torch.randint(0, cfg.vocab_size, (1, n), generator=g)
            v, a, ov, oa = alternate(k, reps, lambda toks=toks: model.forward(toks, start, cache))
            if not torch.equal(ov, oa):
                raise SpecdecError(f"a pass of {n} rows: the builds' logits differ")
            one = one or (v, a)  # the first count of rows: the unit of the one-row columns (put 1 first)
            line.append(f"{n}: {v * 1e3:.2f} -> {a * 1e3:.2f} ms ({a / v:.3f}; {v / one[0]:.2f} -> {a / one[1]:.2f} "
                        f"of {rows[0]} rows' pass)")
        print(f"passes at context {ctx}: " + ", ".join(line))
        line = []
        for n in lengths:
            ids = torch.randint(0, cfg.vocab_size, (1, n), generator=g)

            def prefill(ids=ids, n=n):
                return model.forward(ids, torch.zeros(1, dtype=torch.long), model.new_cache(1, n + 1),
                                     last_only=torch.tensor([n - 1]), prefill=True)

            v, a, ov, oa = alternate(k, max(2, reps // 4), prefill)
            if not torch.equal(ov, oa):
                raise SpecdecError(f"a prefill of {n} tokens: the builds' logits differ")
            line.append(f"{n} tokens: {v * 1e3:.0f} -> {a * 1e3:.0f} ms ({a / v:.3f})")
        print("prefill (time to first token): " + ", ".join(line))
    finally:
        k.set_isa(before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
