"""What a long context's cache costs the rest of a pass: short-context decode passes after reading N MB between them,
against passes after computing for as long without reading.

    .venv/bin/python scripts/evict_probe.py [--kv-cache q8_0] [--context 300] [--mb 20,40,80] [--rounds 30]

A one-row pass at a long context reads its KV cache besides the weights. Where the CPU's caches hold part of the
weights from one pass to the next, those bytes also push weights out, so the matrix products that follow read more
of them from memory. This script loads the bundled model (gguf-q8, --kv-cache), prefills --context random tokens,
and times single passes, each after one of:
- nothing (back to back: the baseline);
- reading a buffer of N MB (N from --mb), on the pass's threads;
- as long a time spent on matrix products of two L2-sized matrices, on the same threads, reading nothing new.
Arms alternate within each round, 8 passes an arm a round; a pass's time does not count what came before it.

The third arm is the control that matters: on a machine whose last-level cache is shared with other tenants (a
cloud VM), what the cache holds of the weights also decays with wall time, so a pass after any pause is slower, and
only the difference between reading and computing for as long is what the bytes cost. A long context's extra cache
is its extra positions times the type's bytes a position (`specdec profile --prompt-tokens N` prints them): q8_0's
3,300 positions on the bundled model are 40 MB.
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


def busy(seconds: float, a: torch.Tensor, b: torch.Tensor) -> None:
    """Matrix products of two L2-sized matrices until `seconds` have passed: the pass's threads kept busy, reading
    nothing a pass uses."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        torch.mm(a, b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv-cache", default="q8_0")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--mb", default="20,40,80", help="MB to read between passes, comma-separated")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    if args.context < 1 or args.rounds < 1:
        print("evict_probe: --context and --rounds must be at least 1", file=sys.stderr)
        return 2
    try:
        sizes = parse_ints(args.mb, "--mb")
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
    a, b = torch.randn(192, 192, generator=g), torch.randn(192, 192, generator=g)  # [192, 192] fp32: 144 KB each
    read_s = {}
    for mb in sizes:  # how long each read takes, so the control computes for as long
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            buffers[mb].sum()
            times.append(time.perf_counter() - t0)
        read_s[mb] = statistics.median(times)
    arms = [("none", 0)] + [("read", mb) for mb in sizes] + [("busy", mb) for mb in sizes]
    times = {arm: [] for arm in arms}
    for r in range(args.rounds):
        for arm in arms if r % 2 == 0 else arms[::-1]:
            kind, mb = arm
            for _ in range(8):
                if kind == "read":
                    buffers[mb].sum()
                elif kind == "busy":
                    busy(read_s[mb], a, b)
                t0 = time.perf_counter()
                model.forward(token, at, cache)
                times[arm].append(time.perf_counter() - t0)
    base = statistics.median(times[("none", 0)])
    print(f"{args.kv_cache} cache, {args.context} positions, gguf-q8, {torch.get_num_threads()} threads; medians of "
          f"{8 * args.rounds} passes an arm, arms alternated; back to back: {base * 1e3:.2f} ms a pass")
    for mb in sizes:
        rd, bz = statistics.median(times[("read", mb)]), statistics.median(times[("busy", mb)])
        print(f"  {mb:>4} MB read between passes ({read_s[mb] * 1e3:.2f} ms): {rd / base:.3f}x back to back; "
              f"computing as long instead: {bz / base:.3f}x; the bytes cost {(rd - bz) * 1e3:+.2f} ms a pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
