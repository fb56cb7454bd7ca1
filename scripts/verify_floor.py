"""A verify pass against its own arithmetic: how cheap an R-row pass could be if no byte waited on memory.

    .venv/bin/python scripts/verify_floor.py [--model default|FILE.gguf] [--precision gguf-q16] [--rows 6]
        [--context 512] [--reps 40]

In one process, alternating, on the bundled model (or --model) at a context of --context positions:
- `1-row` and `R-row`: passes of the whole model, their weights streamed from memory as in decoding;
- `1-row hot` and `R-row hot`: each decoder block run on its own rows many times over, so its weights and its
  cache stay in cache, times the number of blocks, plus the final norm and the LM head's product, also repeated.
  This is the pass's work with every load served by the caches: the same kernels, threads and serial steps, none of the
  memory's waiting. A pass can overlap its memory traffic with its arithmetic, not do less arithmetic, so the hot
  figure bounds from below what this implementation's R-row pass can cost on this machine (lower still than it
  could reach: the forward's own Python steps around the kernels are left out).

Prints the medians and each in one-row passes. When the hot floor alone exceeds a target ratio (1.3 one-row passes
in issue 10), no scheduling of memory traffic reaches the target: only less arithmetic does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from specdec.errors import SpecdecError
from specdec.models.loader import load_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help="the bundled model, or a .gguf (a synth-gguf shape, say)")
    ap.add_argument("--precision", default="gguf-q16")
    ap.add_argument("--rows", type=int, default=6)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    try:
        return measure(args)
    except SpecdecError as e:
        print(f"verify_floor: {e}", file=sys.stderr)
        return 2


def measure(args) -> int:
    if args.rows < 1 or args.reps < 1 or args.context < 1:
        raise SpecdecError(f"--rows, --reps and --context must be at least 1, not {args.rows}, {args.reps}, "
                           f"{args.context}")
    model = load_model(args.model, args.precision).model
    k, cfg = model.kernels, model.cfg
    if k is None or model.lm_head_q is None:
        raise SpecdecError(f"needs the native kernels on a GGUF path (gguf, gguf-q16, gguf-q8), not "
                           f"{args.precision}{'' if k is not None else ' without kernels'}")
    R, ctx = args.rows, args.context
    if ctx + R > cfg.max_position_embeddings:
        raise SpecdecError(f"context {ctx} + {R} rows exceeds the model's {cfg.max_position_embeddings} positions")
    g = torch.Generator().manual_seed(0)
    cache = model.new_cache(1, ctx + R + 1)
    model.forward(torch.randint(0, cfg.vocab_size, (1, ctx), generator=g), torch.zeros(1, dtype=torch.long), cache,
                  last_only=torch.tensor([ctx - 1]), prefill=True)
    start = torch.tensor([ctx])
    toks = {n: torch.randint(0, cfg.vocab_size, (1, n), generator=g) for n in (1, R)}
    inner = 20  # repetitions of one block (or of the head) per measurement: all but the first run from cache

    def hot(n: int) -> float:
        slots, pos = torch.zeros(n, dtype=torch.long), torch.arange(ctx, ctx + n)
        x0 = model.embed[toks[n][0]].float().contiguous()  # [n, hidden]: the rows' embeddings, as a block's input
        total = 0.0
        for layer, blk in enumerate(model.blocks):
            args_ = (slots, pos, *blk.native, cache.k[layer], cache.v[layer], model.cos, model.sin,
                     cfg.num_heads, cfg.num_kv_heads, cfg.rms_norm_eps)
            xs = [x0.clone() for _ in range(inner + 1)]
            k.decode_block_gguf(xs[inner], *args_)  # brings the block's weights and cache in
            t0 = time.perf_counter()
            for x in xs[:inner]:
                k.decode_block_gguf(x, *args_)
            total += (time.perf_counter() - t0) / inner
        k.gemm_gguf(k.rms_norm(x0, model.norm, cfg.rms_norm_eps), model.lm_head_q)
        t0 = time.perf_counter()
        for _ in range(inner):
            k.gemm_gguf(k.rms_norm(x0, model.norm, cfg.rms_norm_eps), model.lm_head_q)
        return total + (time.perf_counter() - t0) / inner

    def cold(n: int) -> float:
        t0 = time.perf_counter()
        model.forward(toks[n], start, cache)
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {"1-row": [], f"{R}-row": [], "1-row hot": [], f"{R}-row hot": []}
    for _ in range(args.reps):
        times["1-row"].append(cold(1))
        times[f"{R}-row"].append(cold(R))
        times["1-row hot"].append(hot(1))
        times[f"{R}-row hot"].append(hot(R))
    med = {name: statistics.median(v) for name, v in times.items()}
    print(f"{args.precision}, context {ctx}, {args.reps} alternated repetitions, {torch.get_num_threads()} threads")
    for name, t in med.items():
        print(f"{name:>12}  {t * 1e3:7.2f} ms  {t / med['1-row']:.2f} one-row passes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
