"""`specdec plan`, `specdec batch-model`, `specdec simulate`."""

from __future__ import annotations

from pathlib import Path

from specdec.atomic import check_plot_path
from specdec.errors import SpecdecError
from specdec.inputs import SEED, read_json
from specdec.outputs import add_json_arg, check_json_file, emit_json, json_on_stdout
from specdec.theory.economics import (
    CostCurve,
    add_k_arg,
    batch_model,
    describe_speedup,
    plan,
    unit_verify_cost,
)
from specdec.theory.emit import EMITTERS, METHODS, choose, parse_acceptance, render
from specdec.theory.profile import Profile, check_curve
from specdec.theory.simulate import simulate


def register(sub) -> None:
    p = sub.add_parser("plan", help="best draft depth k for an acceptance rate and draft cost")
    p.add_argument("--alpha", type=float, default=None,
                   help="acceptance rate a in [0, 1] (required unless --emit is given with --acceptance)")
    p.add_argument("--draft-cost", type=float, default=None,
                   help="cost of one drafted token in target passes (default: from --profile, else 0)")
    p.add_argument("--max-k", type=int, default=32)
    _cost_args(p)
    add_json_arg(p, "the plan (or the --emit configuration)")
    p.add_argument("--plot", metavar="FILE.png", help="write the speedup curve as a PNG")
    e = p.add_argument_group("engine configuration (--emit)")
    e.add_argument("--emit", choices=sorted(EMITTERS), help="print the speculative configuration for this engine")
    e.add_argument("--acceptance", metavar="A1,A2,...",
                   help="per-position conditional acceptance a_i = P(accept i | all before accepted)")
    e.add_argument("--method", choices=METHODS, default=None, help="the drafter to configure (default: ngram)")
    e.add_argument("--draft-model", metavar="PATH", help="draft model or EAGLE head (method draft / eagle)")
    e.add_argument("--ngram-min", type=int, default=None, help="smallest n-gram to match (default: 1)")
    e.add_argument("--ngram-max", type=int, default=None, help="largest n-gram to match (default: 4)")
    e.add_argument("--from-bench", metavar="FILE.json",
                   help="take a and a_i from a `specdec bench` report (local or --endpoint) instead of --alpha")
    e.add_argument("--bench-method", metavar="NAME", help="which method of that report (default: the one that "
                                                           "drafted the most)")
    e.add_argument("--knee-rows", type=float, default=None,
                   help="token-rows per pass below which the target pass is memory-bound (default: the profile's)")
    p.set_defaults(func=run_plan, read_bench=None)

    b = sub.add_parser("batch-model", help="throughput with speculation relative to without, against batch")
    b.add_argument("--alpha", type=float, required=True)
    add_k_arg(b, "drafts per row and round", auto=False, required=True)
    b.add_argument("--draft-cost", type=float, required=True)
    b.add_argument("--knee-rows", type=float, required=True,
                   help="token-rows per pass below which the target pass is memory-bound")
    b.add_argument("--max-batch", type=int, default=256)
    add_json_arg(b, "the curve")
    b.add_argument("--plot", metavar="FILE.png")
    b.set_defaults(func=run_batch)

    s = sub.add_parser("simulate", help="simulate verification rounds at one acceptance rate")
    s.add_argument("--alpha", type=float, required=True)
    add_k_arg(s, "drafts per round", auto=False, required=True)
    s.add_argument("--draft-cost", type=float, default=0.0)
    s.add_argument("--rounds", type=int, default=100_000)
    s.add_argument("--seed", type=int, default=0, action=SEED)
    _cost_args(s)
    add_json_arg(s, "the simulation")
    s.set_defaults(func=run_simulate)


def _cost_args(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--verify-cost", metavar="N:COST,...|FILE.json",
                   help="measured cost of a target pass over N rows, relative to 1 row")
    g.add_argument("--profile", metavar="FILE.json", help="a profile written by `specdec profile`")


def cost_curve_from_args(args) -> tuple[CostCurve | None, float | None]:
    """(verify cost curve, draft cost from the profile) from --verify-cost / --profile."""
    if getattr(args, "profile", None):
        prof = Profile.load(args.profile)
        return CostCurve.from_mapping(prof.verify_cost), prof.draft_cost
    spec = getattr(args, "verify_cost", None)
    if not spec:
        return None, None
    if spec.endswith(".json") or Path(spec).is_file():
        data = read_json(spec)
        if isinstance(data, dict) and "verify_cost" in data:
            data = data["verify_cost"]
        check_curve(data, f"{spec}: verify_cost")
        return CostCurve.from_mapping(data), None
    return CostCurve.parse(spec), None


EMIT_ONLY = ("acceptance", "method", "draft_model", "ngram_min", "ngram_max", "knee_rows", "from_bench",
             "bench_method")


def run_plan_emit(args, curve: CostCurve | None, c: float) -> int:
    if args.plot:
        raise SpecdecError("--plot does not combine with --emit")
    knee = args.knee_rows
    if knee is None and args.profile:
        knee = Profile.load(args.profile).knee_rows
    acceptance, measured = parse_acceptance(args.acceptance) if args.acceptance else (), None
    if args.from_bench:
        if args.alpha is not None or args.acceptance:
            raise SpecdecError("--from-bench replaces --alpha and --acceptance: give one of them")
        # bench/records.py's typed reading of the report, handed in by the command line (specdec/cli.py): the
        # report's types live in bench, above this layer
        name, args.alpha, acceptance = args.read_bench(args.from_bench, args.bench_method)
        measured = {"report": args.from_bench, "method": name}
    choice = choose(args.method or "ngram", c, alpha=args.alpha, acceptance=acceptance,
                    verify_cost=curve or unit_verify_cost, max_k=args.max_k, draft_model=args.draft_model,
                    ngram_min=1 if args.ngram_min is None else args.ngram_min,
                    ngram_max=4 if args.ngram_max is None else args.ngram_max, knee_rows=knee)
    text, obj = render(args.emit, choice)
    if measured:
        obj["measured"] = measured
        text = f"# a and a_i measured by {measured['report']}, method {measured['method']}\n" + text
    emit_json(args, obj, indent=2)
    if not json_on_stdout(args):
        print(text)
    return 0


def run_plan(args) -> int:
    check_json_file(args)
    if not args.emit:
        given = [f"--{name.replace('_', '-')}" for name in EMIT_ONLY if getattr(args, name) is not None]
        if given:
            raise SpecdecError(f"{', '.join(given)}: only used with --emit ENGINE")
        if args.alpha is None:
            raise SpecdecError("plan: the following arguments are required: --alpha")
        check_plot_path(args.plot)
    curve, profile_c = cost_curve_from_args(args)
    c = args.draft_cost if args.draft_cost is not None else (profile_c or 0.0)
    if args.emit:
        return run_plan_emit(args, curve, c)
    result = plan(args.alpha, c, max_k=args.max_k, verify_cost=curve or unit_verify_cost)
    if args.plot:
        from specdec.theory.plots import plot_plan

        plot_plan(result, args.plot)
    emit_json(args, result.to_json(), indent=2)
    if json_on_stdout(args):
        return 0
    print(f"acceptance rate a = {result.alpha:g}, draft cost c = {result.draft_cost:g} target passes per token"
          + (", measured verify cost curve" if curve else ""))
    print(f"{'k':>3}  {'E[tokens/round]':>15}  {'speedup':>8}")
    for row in result.curve:
        mark = "  <- best" if row["k"] == result.best_k else ""
        slow = "  slower than plain decoding" if row["speedup"] < 1.0 else ""
        print(f"{row['k']:>3}  {row['expected_tokens']:>15.3f}  {row['speedup']:>7.2f}x{mark}{slow}")
    print(f"best k = {result.best_k}: {describe_speedup(result.best_speedup)}")
    if not result.beats_plain:
        print("no draft depth beats plain decoding at this acceptance rate and draft cost: turn speculation off")
    print(f"largest draft cost that can pay at a = {result.alpha:g}: c* = {result.max_useful_draft_cost:.3f}")
    if not curve:
        print("these assume a verify pass of k + 1 rows costs one plain pass, as it does only while decoding is "
              "memory-bound; a measured curve (--profile from `specdec profile`, or --verify-cost) gives this "
              "machine's best k")
    return 0


def run_batch(args) -> int:
    check_plot_path(args.plot)
    check_json_file(args)
    model = batch_model(args.alpha, args.k, args.draft_cost, args.knee_rows, args.max_batch)
    if args.plot:
        from specdec.theory.plots import plot_batch

        plot_batch(model, args.plot)
    emit_json(args, model.to_json(), indent=2)
    if json_on_stdout(args):
        return 0
    print(f"a = {model.alpha:g}, k = {model.k}, c = {model.draft_cost:g}, knee = {model.knee_rows:g} rows")
    print(f"{'batch':>5}  {'spec/plain':>10}")
    shown = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, args.max_batch} | (
        {model.crossover_batch} if model.crossover_batch else set()))
    for row in model.curve:
        if row["batch"] in shown:
            note = "  slower than plain decoding" if row["ratio"] < 1.0 else ""
            print(f"{row['batch']:>5}  {row['ratio']:>9.2f}x{note}")
    print(f"batch 1: {model.ratio_at_batch_1:.2f}x; batch {args.max_batch}: {model.ratio_at_max_batch:.2f}x")
    if model.crossover_batch is None:
        print(f"speculation pays at every batch size up to {args.max_batch}")
    else:
        print(f"speculation stops paying at batch {model.crossover_batch}")
    return 0


def run_simulate(args) -> int:
    check_json_file(args)
    curve, _ = cost_curve_from_args(args)
    sim = simulate(args.alpha, args.k, args.draft_cost, args.rounds, args.seed,
                   verify_cost=curve or unit_verify_cost)
    emit_json(args, sim.to_json(), indent=2)
    if json_on_stdout(args):
        return 0
    rel = (sim.tokens_per_round / sim.expected_tokens_per_round - 1.0) * 100
    print(f"{sim.rounds} rounds at a = {sim.alpha:g}, k = {sim.k}, c = {sim.draft_cost:g}")
    print(f"tokens per round: measured {sim.tokens_per_round:.4f}, formula {sim.expected_tokens_per_round:.4f} "
          f"({rel:+.2f}%)")
    print(f"speedup: measured {sim.speedup:.3f}x, predicted {sim.predicted_speedup:.3f}x"
          + ("  (slower than plain decoding)" if sim.speedup < 1 else ""))
    print("round yield histogram:")
    top = max(sim.yield_histogram.values()) or 1
    for n, cnt in sim.yield_histogram.items():
        print(f"{n:>4} tokens  {cnt:>8}  {'#' * round(40 * cnt / top)}")
    return 0
