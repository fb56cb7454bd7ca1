"""`specdec synth-gguf`: write a random-weight GGUF with a real model's shapes and llama.cpp's quantization mix
(specdec/models/gguf/synth.py), and say how big it is, what types it holds and how long it took."""

from __future__ import annotations

import sys

from specdec.inputs import SEED


def register(sub) -> None:
    from specdec.models.gguf.synth import QUANTS, SHAPES

    p = sub.add_parser("synth-gguf", help="write a random-weight GGUF with a real model's shapes and quant mix")
    p.add_argument("--shape", required=True, type=_shape_arg,
                   help=f"the model whose shapes to copy: {', '.join(SHAPES)}; NAME/L: its first L layers only")
    p.add_argument("--quant", required=True, type=str.upper, choices=QUANTS,
                   help="Q4_K_M: llama.cpp's per-tensor mix; the others: every matrix in that type (as --pure)")
    p.add_argument("--out", required=True, help="the .gguf file to write (replaced whole when complete)")
    p.add_argument("--seed", type=int, default=0, action=SEED, help="the same seed writes the same bytes")
    p.set_defaults(func=run_synth)


def _shape_arg(text: str) -> str:
    import argparse

    from specdec.errors import SpecdecError
    from specdec.models.gguf.synth import _shape

    try:
        _shape(text)
    except SpecdecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def run_synth(args) -> int:
    from specdec.models.gguf.synth import write

    done = write(args.out, args.shape, args.quant, args.seed, progress=sys.stderr.isatty())
    print(f"wrote {done.path}: {done.size / 1e6:,.1f} MB ({args.shape}, {args.quant}, seed {args.seed}) "
          f"in {done.seconds:.1f} s")
    for qtype, (tensors, nbytes) in done.mix.items():
        print(f"  {qtype:<5} {tensors:4d} tensors {nbytes / 1e6:10,.1f} MB")
    return 0
