"""The drafters side by side on held-out Spec-Bench prompts, in one run: plain decoding, prompt lookup, suffix
decoding, the trained EAGLE-3 head, and cascades. Greedy, batch 1, every method rotated per prompt.

Held out: the first items of each category, which `specdec train-draft` never trains on (train/data.HOLDOUT).
Prints, per category and overall: end-to-end and decode-phase speedup over plain, acceptance a, tokens per
target pass, identical output; and the head's cost per drafting step against a target pass (its c).

    python scripts/draft_bench.py --per-category 5 --max-new-tokens 128 --json docs/results/drafters.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time

import torch

from specdec.atomic import write_text_atomic
from specdec.bench.hardware.profile import measure_bandwidth
from specdec.bench.prompts import load_prompts, select
from specdec.bench.render import markdown
from specdec.bench.report import build_report
from specdec.bench.runner import engine_method, mark_identity, run_bench
from specdec.drafters.base import NoDrafter
from specdec.engine.calibrate import planned_cost
from specdec.engine.generate import Engine
from specdec.engine.policy import Auto
from specdec.engine.speculation import DEFAULT_K, speculation
from specdec.runtime import ModelSpec, build
from specdec.train.data import HOLDOUT


def head_cost(target, drafter, reps: int = 30) -> dict:
    """Milliseconds of one drafting step of the head and of one one-row target pass, at a 256-token context."""
    from specdec.bench.hardware.profile import time_head

    head = next(m for m in getattr(drafter, "members", [drafter]) if m.name == "eagle")
    model = target.model
    ctx = list(range(1000, 1256))
    cache = model.new_cache(1, 512)
    model.forward(torch.tensor([ctx]), torch.tensor([0]), cache.row(0), last_only=torch.tensor([255]), prefill=True)
    one = []
    for _ in range(reps):
        t = time.perf_counter()
        model.forward_ragged(torch.tensor([5]), torch.tensor([0]), torch.tensor([256]), cache)
        one.append(time.perf_counter() - t)
    t_pass, t_step = sorted(one)[reps // 2], time_head(head, ctx, 5, reps)
    return {"target_pass_ms": t_pass * 1e3, "head_step_ms": t_step * 1e3, "c": t_step / t_pass}


def sampled_method(temperature: float):
    """engine_method, sampling at `temperature` with a fixed seed per method."""
    from specdec.bench.runner import Method, turn_from_result
    from specdec.engine.generate import GenerationConfig
    from specdec.sampling.warp import SamplingConfig

    def make(name, engine, drafter, k, baseline=None, k_label=None):
        def generate(ids, max_new_tokens):
            cfg = GenerationConfig(max_new_tokens, SamplingConfig(temperature, seed=1234))
            return turn_from_result(ids, engine.generate([ids], cfg, drafter, k)[0])

        return Method(name, generate, "specdec", baseline, k_label, engine.meter if baseline else None)

    return make


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--per-category", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--drafters", default="ngram,suffix,eagle,ngram+eagle,suffix+eagle",
                    help="comma-separated; a cascade joins its members with +; a trailing ! drafts all k tokens "
                         "whatever the head's confidence; a trailing ~ drops prompt lookup's confidences (the "
                         "planner then goes by each row's record); @DIR after a name that uses the head picks "
                         "the head (e.g. eagle,eagle@runs/new: the bundled head against a new one, in one run)")
    ap.add_argument("--k", default="5", help="an integer, or auto (the planner over pass costs measured now)")
    ap.add_argument("--head-k", default=None, help="k for methods that end in the head (default --k)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample instead of greedy (outputs then differ from plain by design: the tests check the "
                         "distribution); adds the draft-model drafter (an int8 copy of the target) for comparison")
    ap.add_argument("--precision", default=None, help="the target's path (default: the bundled model's default)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args()
    if args.per_category > HOLDOUT:
        print(f"--per-category must be <= {HOLDOUT}: later items may be training prompts", file=sys.stderr)
        return 2
    prompts = select(load_prompts(args.prompts), None, args.per_category)
    bw = measure_bandwidth(2**30, 7)
    target, _ = build(ModelSpec(drafter="none", precision=args.precision))
    method = engine_method if not args.temperature else sampled_method(args.temperature)
    methods = [method("plain", Engine(target.model, target.tokenizer), NoDrafter(), 1)]
    costs = pass_cost = None
    names = args.drafters.split(",") + (["draft-model"] if args.temperature else [])
    for label in names:
        name, _, head = label.partition("@")
        spec = ModelSpec(drafter=name.rstrip("!~").replace("+", ","), draft_model="default", draft_precision="int8",
                         precision=args.precision, draft_head=head or None)
        _, drafter = build(spec)
        for m in getattr(drafter, "members", [drafter]):
            if name.endswith("!") and hasattr(m, "min_confidence"):  # the head drafts all k, however unsure
                m.min_confidence = 0.0
            if name.endswith("~") and hasattr(m, "rated"):
                m.rated = False
        how = speculation(args.head_k if args.head_k and name.rstrip("!~").endswith("eagle") else args.k)
        k = "auto" if how.policy == "auto" else how.k
        if "eagle" in name and costs is None:
            costs = head_cost(target, drafter)
        if k == "auto" and pass_cost is None:  # measured once: every method plans over the same costs
            pass_cost = planned_cost(target, how)
        # its own planner per method: each learns its acceptance
        policy = Auto(copy.deepcopy(pass_cost), max_k=DEFAULT_K, explore=not drafter.free) if k == "auto" else k
        methods.append(method(f"{label} k={k}", Engine(target.model, target.tokenizer), drafter, policy, "plain", k))
    samples = run_bench(prompts, methods, target.tokenizer, args.max_new_tokens)
    if not args.temperature:
        mark_identity(samples, methods)
    config = {"model": target.name, "precision": target.model.precision, "max_new_tokens": args.max_new_tokens,
              "prompts": len(prompts), "per_category": args.per_category, "threads": torch.get_num_threads(),
              "greedy": not args.temperature, "temperature": args.temperature, "batch": 1,
              "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "drafter": "several", "head_cost": costs,
              "bandwidth_GBps": bw, "prompt_file": args.prompts}
    report = build_report(samples, methods, config, None, None)
    if args.json:
        write_text_atomic(args.json, json.dumps(report.to_json(), indent=1, default=str))
    text = markdown(report)
    print(text)
    if costs:
        print(f"head: one drafting step {costs['head_step_ms']:.2f} ms, one target pass {costs['target_pass_ms']:.2f} "
              f"ms: c = {costs['c']:.3f}")
    if args.markdown:
        write_text_atomic(args.markdown, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
