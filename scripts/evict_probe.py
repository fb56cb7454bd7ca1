"""What a long context's cache costs the rest of a pass: short-context decode passes with N MB read between them.

    .venv/bin/python scripts/evict_probe.py [--kv-cache q8_0] [--context 300] [--mb 20,40,80] [--rounds 30]

A one-row pass at a long context reads its KV cache besides the weights. Where the CPU's caches hold part of the
weights from one pass to the next, those bytes also push weights out, so the matrix products that follow read more
of them from memory. This script loads the bundled model (gguf-q8, --kv-cache), prefills --context random tokens,
and times single passes, each after reading a buffer of N MB (N from --mb, and 0: none, the baseline), the sizes
alternated within each round, 8 passes a size a round. The pass's time does not count the buffer's read. A long
context's extra cache is its extra positions times the type's bytes a position (`specdec profile --prompt-tokens N`
prints them): q8_0's 3,300 positions on the bundled model are 40 MB.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from specdec.bench.options import parse_ints
from specdec.errors import SpecdecError
from specdec.models.loader import load_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv-cache", default="q8_0")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--mb", default="20,40,80", help="MB to read between passes, comma-separated (0 is always run)")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    if args.context < 1 or args.rounds < 1:
        print("evict_probe: --context and --rounds must be at least 1", file=sys.stderr)
        return 2
    try:
        sizes = [0] + parse_ints(args.mb, "--mb")
        model = load_model("default", "gguf-q8").model
        model.use_kv_cache(args.kv_cache)
        if args.context + 1 > model.cfg.max_position_embeddings:
            raise SpecdecError(f"--context {args.context} exceeds the model's {model.cfg.max_position_embeddings}")
    except SpecdecError as e:
        print(f"evict_probe: {e}", file=sys.stderr)
        return 2
    g = torch.Generator().manual_seed(0)
    cache = model.new_cache(1, args.context + 2)
    prompt = torch.randint(0, model.cfg.vocab_size, (1, args.context), generator=g)
    model.forward(prompt, torch.zeros(1, dtype=torch.long), cache, last_only=torch.tensor([args.context - 1]),
                  prefill=True)
    token, at = torch.randint(0, model.cfg.vocab_size, (1, 1), generator=g), torch.tensor([args.context])
    try:
        buffers = {mb: torch.ones(mb << 18) for mb in sizes}  # [mb MB] fp32
    except (RuntimeError, MemoryError) as e:  # a size past this machine's memory
        print(f"evict_probe: cannot allocate the buffers: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    times: dict[int, list[float]] = {mb: [] for mb in sizes}
    for r in range(args.rounds):
        for mb in sizes if r % 2 == 0 else sizes[::-1]:
            for _ in range(8):
                if mb:
                    buffers[mb].sum()
                t0 = time.perf_counter()
                model.forward(token, at, cache)
                times[mb].append(time.perf_counter() - t0)
    base = statistics.median(times[0])
    print(f"{args.kv_cache} cache, {args.context} positions, gguf-q8, {torch.get_num_threads()} threads; medians of "
          f"{8 * args.rounds} passes a size, sizes alternated")
    for mb in sizes:
        med = statistics.median(times[mb])
        print(f"  {mb:>4} MB read between passes: {med * 1e3:.2f} ms a pass, {med / base:.3f}x none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
