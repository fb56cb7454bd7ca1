"""A draft-model pair of GGUF files measured on this machine: the draft's cost c, the target's verify-cost curve, the
lookup cost of n-gram drafting, PROJECTED speedups of both at assumed acceptance rates, and greedy output with the
draft against plain greedy output. Both models load as `generate --drafter draft-model --draft-model FILE` loads
them (runtime.build: the tokenizer check, c said at load), on the native kernels.

    python -m specdec.bench.engines.draft_pair --target 8B.gguf --draft 1B.gguf --precision gguf-q8 \\
        --json artifacts/draft-pair/draft-pair.json --page docs/results/draft-pair.md

On a shared machine the measurements alternate: c (draft and target passes alternated pass by pass) is measured
`--repeats` times, between runs of the verify curve (its row counts alternated rep by rep); the page gives each run,
the load average and how often the thread team changed size (another process took a core)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

from specdec.bench.engines.draft_pair_page import project, write_page
from specdec.bench.engines.model_runs import DraftPairRun, VerifyCurve
from specdec.theory.economics import add_k_arg


def measure(args, command: str) -> DraftPairRun:
    from specdec.bench.engines.real_models import spec_bench_prompt
    from specdec.bench.engines.real_models_child import NoEos, decode_run
    from specdec.bench.hardware.profile import demo_context, measure_bandwidth, time_ngram
    from specdec.drafters.draft_model import draft_cost
    from specdec.drafters.ngram import NgramDrafter
    from specdec.engine.calibrate import policy_for
    from specdec.engine.generate import Engine
    from specdec.engine.policy import FixedK
    from specdec.engine.speculation import Speculation
    from specdec.kernels.cores import sharing
    from specdec.models.target import TargetTraits
    from specdec.models.text.tokenizer import encode_prompt
    from specdec.models.timing import time_passes
    from specdec.provenance import provenance
    from specdec.runtime import ModelSpec, build

    say = lambda m: print(f"[draft-pair] {m}", file=sys.stderr, flush=True)  # noqa: E731
    machine, loads = provenance(), [list(os.getloadavg())]
    machine["command"] = command
    team = sharing()
    changes = team.changes
    bw = measure_bandwidth(1 << 30, 5)
    machine["bandwidth_gbs"] = round(bw["read_GBps"], 2)
    say(f"read bandwidth {bw['read_GBps']:.1f} GB/s; loading {args.target} and {args.draft}")
    t0 = time.perf_counter()
    target, drafter = build(ModelSpec(model=args.target, drafter="draft-model", draft_model=args.draft,
                                      precision=args.precision, draft_precision=args.draft_precision))
    load_s = time.perf_counter() - t0
    model, draft = target.model, drafter.model
    loads.append(list(os.getloadavg()))
    rows = list(range(1, args.rows + 1))
    c_runs, curves = [], []
    for i in range(args.repeats):
        c_runs.append(draft_cost(model, draft, args.context, args.pairs))
        say(f"repeat {i + 1}/{args.repeats}: {c_runs[-1].line()}")
        times = time_passes(model, args.context, rows, args.reps)
        fast = {n: min(v) for n, v in times.items()}
        curves.append(VerifyCurve(
            context=args.context, reps=args.reps, rule="fastest of reps", times_s={str(n): fast[n] for n in rows},
            cost={str(n): fast[n] / fast[1] for n in rows}, step_s=fast[1],
            median_times_s={str(n): statistics.median(times[n]) for n in rows}))
        say("verify curve: " + " ".join(f"{n}:{fast[n] / fast[1]:.2f}" for n in rows))
        loads.append(list(os.getloadavg()))
    best = {n: min(v.times_s[str(n)] for v in curves) for n in rows}
    cost = {str(n): best[n] / best[1] for n in rows}
    c = statistics.median(x.c for x in c_runs)
    lookup = time_ngram(NgramDrafter(4, 1), demo_context(target.tokenizer, 2 * args.context), 5)
    c_ngram = lookup["seconds_per_round"] / lookup["k"] / best[1]
    projections = project(c, c_ngram, cost)
    say(f"c = {c:.3f}, n-gram c = {c_ngram:.5f}; decoding {args.new_tokens} tokens plain and with the draft")
    engine = Engine(model, NoEos(target.tokenizer))
    ids = encode_prompt(target.tokenizer, spec_bench_prompt("writing"), chat=True)
    decode_run(engine, ids, 2)  # warm-up
    plain = decode_run(engine, ids, args.new_tokens)
    fixed = decode_run(engine, ids, args.new_tokens, drafter, FixedK(args.k))
    auto = decode_run(engine, ids, args.new_tokens, drafter, policy_for(Speculation(), target, drafter))
    loads.append(list(os.getloadavg()))
    identical = fixed.token_ids == plain.token_ids == auto.token_ids
    say(f"greedy identical: {identical} (plain {plain.decode_tokens_per_s:.2f} tok/s, k={args.k} "
        f"{fixed.decode_tokens_per_s:.2f}, auto {auto.decode_tokens_per_s:.2f}; a = {fixed.alpha})")
    machine["bandwidth_end_gbs"] = round(measure_bandwidth(1 << 30, 5)["read_GBps"], 2)
    return DraftPairRun(
        machine=machine, config={k: v for k, v in vars(args).items() if k != "func"}, target=args.target,
        draft=args.draft, target_bytes=Path(args.target).stat().st_size, draft_bytes=Path(args.draft).stat().st_size,
        target_precision=TargetTraits.of(model).precision, draft_precision=TargetTraits.of(draft).precision,
        vocabulary=target.tokenizer.vocab_size, load_s=load_s, c_at_load=dataclasses.asdict(drafter.cost),
        c_runs=[dataclasses.asdict(x) for x in c_runs], c=c, verify=curves, cost=cost, step_s=best[1],
        lookup=lookup, c_ngram=c_ngram, projections=projections, plain=plain, fixed=fixed, auto=auto,
        identical=identical, load_avg=loads, team_changes=team.changes - changes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="the target's .gguf")
    p.add_argument("--draft", help="the draft model's .gguf (the target's vocabulary)")
    p.add_argument("--precision", default=None, help="the target's path (default: its own choice)")
    p.add_argument("--draft-precision", default=None, help="the draft's path (default: its own choice)")
    p.add_argument("--context", type=int, default=256, help="cached tokens before the timed passes")
    p.add_argument("--rows", type=int, default=12, help="verify curve: passes of 1..rows rows")
    p.add_argument("--reps", type=int, default=5, help="timed passes per row count, per repeat")
    p.add_argument("--pairs", type=int, default=9, help="alternated pairs of passes per measure of c")
    p.add_argument("--repeats", type=int, default=3, help="measures of c, each followed by a verify curve")
    p.add_argument("--new-tokens", type=int, default=64)
    add_k_arg(p, "drafts a round in the fixed-k greedy run", auto=False, default=4)
    p.add_argument("--threads", default=None, help="threads a pass runs on (default: auto)")
    p.add_argument("--json", required=True, help="where the raw results go")
    p.add_argument("--page", default="", help="the Markdown page ('' for none)")
    p.add_argument("--render", action="store_true", help="measure nothing: write --page from --json")
    p.add_argument("--note", default="", help="a paragraph for the page: why this pair, these paths (with --render: "
                                              "replaces the one recorded in --json)")
    args = p.parse_args(argv)
    if not args.render and not (args.target and args.draft):
        p.error("--target and --draft are needed, except with --render")

    from specdec.errors import SpecdecError
    from specdec.kernels.cores import configure

    try:
        if args.render:
            report = DraftPairRun.load(args.json)
            if args.note:
                report.config["note"] = args.note
                report.save(args.json)
        else:
            configure(args.threads)
            given = sys.argv[1:] if argv is None else argv
            report = measure(args, shlex.join(["python", "-m", "specdec.bench.engines.draft_pair", *given]))
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            report.save(args.json)
        if args.page:
            write_page(report, Path(args.page), args.json)
    except SpecdecError as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.json}{' and ' + args.page if args.page else ''}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
