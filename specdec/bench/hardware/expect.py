"""`specdec expect --model FILE`: what to expect from speculation for this model on this CPU, before running it.

One table: the path the model runs on here (chosen at its first load, models/gguf/path_choice.py), what its passes
cost (engine/costs.py: cached after the first measurement, so that a second `expect` takes seconds), and the
speedup of the decode phase the theory gives for each drafter at each acceptance band, with each drafter's cost c
measured now: E[tokens/round] = (1 - a^(k+1)) / (1 - a) over the cost of a round, k + 1 rows verified plus k
drafted tokens, at the best k up to the cap (theory/economics.py `plan`).
"""

from __future__ import annotations

import sys
from argparse import Namespace
from dataclasses import replace

from specdec.errors import SpecdecError
from specdec.theory.economics import add_k_arg

BANDS = (0.5, 0.6, 0.7, 0.8, 0.9)
CONTEXT, STEPS = 128, 16  # the plain generation that measures the engine's work per step
DRAFTERS = ("ngram", "suffix")  # model-free, always; draft-model with --draft-model; eagle where a head is shipped


def register(sub) -> None:
    from specdec.engine.cli import add_model_args

    p = sub.add_parser("expect", help="what speculation should give for a model here: its path, its pass costs, "
                                      "and the speedup by drafter and acceptance")
    add_model_args(p, drafter_default=None)
    add_k_arg(p, "the most drafts a round considers (auto: the default cap)", default="auto")
    p.add_argument("--alphas", default=",".join(map(str, BANDS)), metavar="A1,A2,...",
                   help="the acceptance rates to show (default: %(default)s)")
    p.set_defaults(func=run)


def run(args) -> int:
    from specdec.engine.costs import STORE, cached, target_profile
    from specdec.engine.speculation import speculation
    from specdec.models.target import TargetTraits
    from specdec.runtime import ModelSpec, build

    cap = speculation(args.k, "auto").k
    alphas = parse_alphas(args.alphas)
    names = [args.drafter] if args.drafter else list(DRAFTERS) + (["draft-model"] if args.draft_model else [])
    if args.draft_model and args.drafter not in (None, "draft-model"):
        raise SpecdecError("--draft-model is for --drafter draft-model (or no --drafter: every drafter)")
    spec = (ModelSpec.from_args(Namespace(**{**vars(args), "drafter": args.drafter or "ngram"})))
    target, _ = build(ModelSpec(spec.model, "none", precision=spec.precision, device=spec.device,
                                context=spec.context, kv_cache=spec.kv_cache))
    was_cached = cached(target, cap + 1) is not None
    prof = target_profile(target, cap + 1)
    rows = sorted(prof.verify_cost)
    team = prof.raw.get("team", prof.raw.get("threads", "?"))
    kv = TargetTraits.of(target.model).kv_cache
    print(f"{target.name} on {prof.raw.get('machine', {}).get('cpu', '?')}, {team} threads, path "
          f"{target.model.precision}" + (f", KV cache {kv}" if kv != "f16" else ""))
    measured = prof.raw.get("machine", {}).get("date_utc", "?")
    print(f"a one-row pass: {prof.step_s * 1e3:.2f} ms ({1 / prof.step_s:.1f} tok/s plain, after "
          f"{prof.typical_context:.0f} cached tokens); pass costs "
          + (f"cached from {measured} ({STORE})" if was_cached else "measured now, and cached"))
    print("a verify pass of n rows, in one-row passes: "
          + "  ".join(f"{n}: {prof.verify_cost[n]:.2f}" for n in rows if 2 <= n <= cap + 1))
    cost = round_costs(target, prof)
    h = cost[1]
    print(f"a plain decode step through the engine: {h:.0%} more than the pass alone (sampling, bookkeeping), "
          "counted in each round below")
    cap = min(cap, max(rows) - 1)
    table = [expectation(target, spec, name, prof, cost, cap, alphas) for name in names]
    table += [row for row in [eagle_row(target, spec, prof, cost, cap, alphas)] if row and not args.drafter]
    print(f"\nexpected speedup of the decode phase (theory: the best k <= {cap} at each acceptance a, on the costs "
          "above; c: a drafted token's cost in one-row passes):")
    head = ["drafter", "c"] + [f"a = {a:g}" for a in alphas]
    lines = [head] + [[r[0], f"{r[1]:.3f}"] + [f"{s:.2f}x (k={k})" for s, k in r[2]] for r in table]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)))
    print("\nAcceptance a depends on the text: prompt lookup accepts most where answers copy the prompt (edits, "
          "extraction, summaries), little on open writing. `specdec bench` measures a and the end-to-end speed on "
          "your prompts. "
          "Under load, `serve --policy auto` drafts less as the batch grows: wider passes cost compute.")
    return 0


def parse_alphas(text: str) -> list[float]:
    try:
        alphas = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        alphas = []
    if not alphas or not all(0.0 <= a < 1.0 for a in alphas):
        raise SpecdecError(f"--alphas must be comma-separated rates in [0, 1), got {text!r}")
    return alphas


def round_costs(target, prof, context: int = CONTEXT, tokens: int = STEPS):
    """(a verify pass of n rows in plain decode steps, the share h of a plain step that is not the pass): a plain
    generation of `tokens` tokens after `context` through the engine, against the profile's one-row pass there
    (bench/stats.py `cost_from_profile`, as the bench predicts)."""
    from specdec.bench.stats import cost_from_profile
    from specdec.drafters.base import NoDrafter
    from specdec.engine.generate import Engine
    from specdec.engine.policy import Never
    from specdec.engine.sequence import GenerationConfig

    words = target.tokenizer.encode(" the quick brown fox jumps over the lazy dog and runs away")
    ids = (words * (context // len(words) + 1))[:context]
    engine = Engine(target.model, target.tokenizer)
    engine.generate([ids[:8]], GenerationConfig(2), NoDrafter(), Never())  # warm-up
    runs = [engine.generate([ids], GenerationConfig(tokens), NoDrafter(), Never())[0] for _ in range(2)]
    rate = max(r.stats.decode_tokens_per_s or 0.0 for r in runs)
    (verify, _), h = cost_from_profile(prof, context, 1.0 / rate if rate > 0 else 0.0)
    return verify, h


def expectation(target, spec, name: str, prof, cost, cap: int, alphas: list[float]):
    """(drafter label, c, [(speedup, k) per a]) with the drafter's c measured now. `cost`: round_costs's (a verify
    pass of n rows in plain decode steps, h); a drafted token costs (1 - h) c plain steps."""
    from specdec.bench.hardware.profile import planning_cost
    from specdec.runtime import drafter_for
    from specdec.theory.economics import plan

    drafter = drafter_for(replace(spec, drafter=name), target)
    c = planning_cost(target, drafter, prof, cap)
    label = name if name != "draft-model" else f"draft-model {spec.draft_model}"
    verify, h = cost
    out = []
    for a in alphas:
        p = plan(a, (1 - h) * c, cap, verify)  # in plain decode steps
        out.append((p.best_speedup, p.best_k) if p.best_speedup > 1.0 else (1.0, 0))
    return label, c, out


def eagle_row(target, spec, prof, cost, cap: int, alphas: list[float]):
    """The shipped EAGLE-3 head's row, where one fits this target (the bundled model's); None elsewhere."""
    try:
        return expectation(target, spec, "eagle", prof, cost, cap, alphas)
    except SpecdecError as e:
        if spec.draft_head:  # asked for by name: say why it is missing
            print(f"specdec: no EAGLE head row: {e}", file=sys.stderr)
        return None
