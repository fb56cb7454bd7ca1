"""`specdec choose-path --model FILE`: time gguf-q16 and gguf-q8 on a GGUF's own matrices here again, say what each
costs in agreement with llama.cpp, and remember the faster as the file's default on this CPU (models/gguf/
path_choice.py). A file's first load does the same, with fewer repetitions and without llama.cpp; this command is
for measuring again (a quieter machine, more repetitions) and for the agreement.

Both paths are loaded once and their passes alternated (a 1-row pass and a verify pass of --rows rows after
--context cached tokens, --reps times each, the fastest kept: other load only ever adds time). The rule: the lower
sum of the two, a plain step and a verify step weighing alike. Agreement: top-1 of each path's logits against
llama.cpp's on the same file and tokens (where llama.cpp is installed: `make llamacpp`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.inputs import AT_LEAST_1

TEXT = ("Speculative decoding drafts a few tokens cheaply and lets the target model check them all in one pass. "
        "The output is exactly what the target would have written alone; only the time it takes changes.")


def register(sub) -> None:
    p = sub.add_parser("choose-path", help="time gguf-q16 and gguf-q8 on a GGUF here and remember the faster")
    p.add_argument("--model", required=True, help="a .gguf file")
    p.add_argument("--rows", type=int, default=6, action=AT_LEAST_1,
                   help="the verify pass timed beside a 1-row pass (default 6: five drafts)")
    p.add_argument("--context", type=int, default=256, action=AT_LEAST_1, help="cached tokens before the passes")
    p.add_argument("--reps", type=int, default=6, action=AT_LEAST_1)
    p.add_argument("--remember", action=argparse.BooleanOptionalAction, default=True,
                   help="make the faster path this file's default here (--no-remember: only report)")
    p.set_defaults(func=run)


def run(args) -> int:
    from specdec.models.gguf import path_choice
    from specdec.models.gguf.weights import runnable
    from specdec.models.loader import load_model

    path = Path(args.model).expanduser()
    if path.suffix.lower() != ".gguf" or not path.is_file():
        raise SpecdecError(f"{args.model}: choose-path takes a .gguf file")
    if not runnable(path):
        raise SpecdecError(f"{path}: some matrix is in a type the integer paths do not read: there is no choice")
    models = {p: load_model(str(path), p).model for p in path_choice.PATHS}
    best = path_choice.measure(models, args.rows, args.context, args.reps)
    del models
    rule = f"the lower sum of a 1-row and a {args.rows}-row pass, fastest of {args.reps} alternated"
    choice = path_choice.decide(best, rule, llamacpp_agreement(path))
    wide = max(best[choice.precision])
    print(f"{'path':<9} {'1 row ms':>9} {f'{wide} rows ms':>10} {'ratio':>6}  top-1 vs llama.cpp")
    for p in path_choice.PATHS:
        one, many = best[p][1], best[p][wide]
        top1 = f"{choice.agreement[p]:.3f}" if choice.agreement else "not measured (make llamacpp)"
        print(f"{p:<9} {1e3 * one:9.2f} {1e3 * many:10.2f} {many / one:6.2f}  {top1}")
    print(f"faster here: {choice.precision} ({choice.rule})")
    if args.remember:
        store = path_choice.remember(path, choice)
        if store is not None:
            print(f"remembered in {store}: {choice.precision} is this file's default on this CPU (--precision "
                  "overrides)")
    return 0


def llamacpp_agreement(path: Path) -> dict[str, float] | None:
    """Top-1 agreement of each path's logits with llama.cpp's on the file, over TEXT's tokens (None without
    llama.cpp)."""
    from specdec.bench.engines import llamacpp_oracle as oracle
    from specdec.models.gguf.path_choice import PATHS
    from specdec.models.loader import load_model

    if oracle.missing() is not None:
        print(f"specdec: no llama.cpp here, agreement not measured ({oracle.missing().split(';')[0]})", file=sys.stderr)
        return None
    ids = load_model(str(path), PATHS[0]).tokenizer.encode(TEXT)
    try:
        theirs = oracle.logits(path, ids)
        return {p: oracle.distance(oracle.specdec_logits(path, ids, p)[0], theirs)["top1"] for p in PATHS}
    finally:
        oracle.close(path)
