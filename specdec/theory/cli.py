"""`specdec plan`, `specdec batch-model`, `specdec simulate`."""

from __future__ import annotations

import json
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.theory.economics import (
    CostCurve,
    batch_model,
    check_k,
    describe_speedup,
    plan,
    unit_verify_cost,
)
from specdec.theory.simulate import simulate


def register(sub) -> None:
    p = sub.add_parser("plan", help="best draft depth k for an acceptance rate and draft cost")
    p.add_argument("--alpha", type=float, required=True, help="acceptance rate a in [0, 1]")
    p.add_argument("--draft-cost", type=float, default=None,
                   help="cost of one drafted token in target passes (default: from --profile, else 0)")
    p.add_argument("--max-k", type=int, default=32)
    _cost_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--plot", metavar="FILE.png", help="write the speedup curve as a PNG")
    p.set_defaults(func=run_plan)

    b = sub.add_parser("batch-model", help="throughput with speculation relative to without, against batch")
    b.add_argument("--alpha", type=float, required=True)
    b.add_argument("--k", type=int, required=True)
    b.add_argument("--draft-cost", type=float, required=True)
    b.add_argument("--knee-rows", type=float, required=True,
                   help="token-rows per pass below which the target pass is memory-bound")
    b.add_argument("--max-batch", type=int, default=256)
    b.add_argument("--json", action="store_true")
    b.add_argument("--plot", metavar="FILE.png")
    b.set_defaults(func=run_batch)

    s = sub.add_parser("simulate", help="simulate verification rounds at one acceptance rate")
    s.add_argument("--alpha", type=float, required=True)
    s.add_argument("--k", type=int, required=True)
    s.add_argument("--draft-cost", type=float, default=0.0)
    s.add_argument("--rounds", type=int, default=100_000)
    s.add_argument("--seed", type=int, default=0)
    _cost_args(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=run_simulate)


def _cost_args(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--verify-cost", metavar="N:COST,...|FILE.json",
                   help="measured cost of a target pass over N rows, relative to 1 row")
    g.add_argument("--profile", metavar="FILE.json", help="a profile written by `specdec profile`")


def load_profile(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise SpecdecError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or "verify_cost" not in data:
        raise SpecdecError(f"{path}: not a specdec profile (no 'verify_cost' curve)")
    return data


def cost_curve_from_args(args) -> tuple[CostCurve | None, float | None]:
    """(verify cost curve, draft cost from the profile) from --verify-cost / --profile."""
    if getattr(args, "profile", None):
        prof = load_profile(args.profile)
        return CostCurve.from_mapping(prof["verify_cost"]), prof.get("draft_cost")
    spec = getattr(args, "verify_cost", None)
    if not spec:
        return None, None
    if spec.endswith(".json") or Path(spec).is_file():
        with open(spec) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise SpecdecError(f"{spec}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if isinstance(data, dict) and "verify_cost" in data:
            data = data["verify_cost"]
        if not isinstance(data, dict):
            raise SpecdecError(f"{spec}: expected an object of n: cost")
        return CostCurve.from_mapping(data), None
    return CostCurve.parse(spec), None


def run_plan(args) -> int:
    curve, profile_c = cost_curve_from_args(args)
    c = args.draft_cost if args.draft_cost is not None else (profile_c or 0.0)
    result = plan(args.alpha, c, max_k=args.max_k, verify_cost=curve or unit_verify_cost)
    if args.plot:
        from specdec.theory.plots import plot_plan

        plot_plan(result, args.plot)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
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
    return 0


def run_batch(args) -> int:
    model = batch_model(args.alpha, args.k, args.draft_cost, args.knee_rows, args.max_batch)
    if args.plot:
        from specdec.theory.plots import plot_batch

        plot_batch(model, args.plot)
    if args.json:
        print(json.dumps(model.to_json(), indent=2))
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
    curve, _ = cost_curve_from_args(args)
    check_k(args.rounds, "rounds")
    sim = simulate(args.alpha, args.k, args.draft_cost, args.rounds, args.seed,
                   verify_cost=curve or unit_verify_cost)
    if args.json:
        print(json.dumps(sim.to_json(), indent=2))
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
