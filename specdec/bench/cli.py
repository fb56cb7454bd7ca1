"""`specdec profile` and `specdec bench`."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace

from specdec.bench.options import check_outputs, parse_ints, show_text, write_outputs
from specdec.errors import SpecdecError
from specdec.inputs import AT_LEAST_1, NON_NEGATIVE, POSITIVE, ranged
from specdec.outputs import add_json_arg, check_json_file, json_file, json_on_stdout
from specdec.theory.economics import add_k_arg

AUTO_FIXED_KS = (2, 4, 6, 8)  # with --policy auto, these fixed k run too, on the same prompts


def register(sub) -> None:
    from specdec.engine.cli import add_chat_template_arg, add_model_args
    from specdec.engine.speculation import DEFAULT_K, add_speculation_args

    p = sub.add_parser("profile", help="measure verify cost curve, draft cost, knee, memory and bandwidth")
    add_model_args(p)
    add_json_arg(p, "the profile (for `specdec plan/bench --profile FILE`)")
    p.add_argument("--reps", type=int, default=5, action=AT_LEAST_1,
                   help="timed runs per measurement (medians are reported)")
    p.add_argument("--contexts", default="128,512,1024", help="context lengths to time passes at")
    p.add_argument("--max-rows", type=int, default=32, action=ranged(2),
                   help="largest pass, in token-rows, of the verify curve")
    add_k_arg(p, f"draft depth at which the drafter is timed (default {DEFAULT_K}, the default cap)", auto=False,
              default=DEFAULT_K)
    p.add_argument("--memory-budget-gb", type=float, default=None, action=POSITIVE,
                   help="memory for weights + KV (default: RAM)")
    p.add_argument("--batch-context", type=int, default=None, action=AT_LEAST_1,
                   help="tokens per sequence for the batch capacity (default: the middle of --contexts)")
    p.add_argument("--bandwidth-gib", type=float, default=1.0, action=POSITIVE,
                   help="tensor size for the bandwidth test")
    p.add_argument("--prompt-tokens", type=int, default=None, action=AT_LEAST_1, metavar="N",
                   help="also time a prefill of N tokens against its floor: the products at their rate and attention "
                        "at the rate the KV cache type allows (the time to first token's goal)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_profile)

    b = sub.add_parser("bench", help="plain vs speculative decoding on Spec-Bench (or JSONL) prompts")
    b.add_argument("--prompts", metavar="FILE.jsonl",
                   help="Spec-Bench question.jsonl, or JSONL lines of {\"prompt\": ...} (required)")
    b.add_argument("--categories", help="comma-separated categories (default: all in the file)")
    b.add_argument("--per-category", type=int, default=None, metavar="N", action=AT_LEAST_1,
                   help="first N prompts of each category (default: all)")
    b.add_argument("--max-new-tokens", type=int, default=None, action=AT_LEAST_1,
                   help="tokens generated per prompt (default 256)")
    add_model_args(b)
    add_chat_template_arg(b)
    add_speculation_args(b)
    b.add_argument("--profile", metavar="FILE.json",
                   help="a `specdec profile` output, for the predicted speedup and --policy auto (default: this "
                        "model's pass costs, measured once here and cached)")
    add_json_arg(b, "everything, per prompt too,")
    b.add_argument("--markdown", metavar="FILE", help="write the tables as Markdown")
    b.add_argument("--plot", metavar="FILE.png", help="speedup per category, with the predictions")
    b.add_argument("--compare", choices=("hf", "llama.cpp"),
                   help="also run Hugging Face transformers generate, or llama.cpp (node-llama-cpp, from "
                        "$NODE_LLAMA_DIR) on the same GGUF file, plain and with its prompt lookup")
    b.add_argument("--llamacpp-k", type=int, default=None, metavar="K", action=AT_LEAST_1,
                   help="tokens llama.cpp's prompt lookup drafts (default: the bench's k, 5 with --k auto)")
    e = b.add_argument_group("against a server (any OpenAI-compatible one: vLLM, SGLang, llama-server, ours)")
    e.add_argument("--endpoint", metavar="URL", help="bench this server instead of a local model")
    e.add_argument("--baseline", metavar="URL", help="the same model with speculation off: speedups against it")
    e.add_argument("--concurrency", default=None,
                   help="comma-separated client counts, one level each (default 1)")
    e.add_argument("--endpoint-model", metavar="NAME", help="model to ask for (default: the first of /v1/models)")
    e.add_argument("--api-key", metavar="KEY", help="sent to both servers as 'Authorization: Bearer KEY'")
    e.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS", action=POSITIVE, help="per request")
    b.add_argument("--drift-margin", type=float, default=0.10, action=NON_NEGATIVE,
                   help="flag categories whose acceptance rate differs from the overall one by more (absolute)")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    from specdec.bench.suites import add_suite_args, add_suite_commands

    add_suite_args(b)
    add_suite_commands(b)
    b.set_defaults(func=run_bench, suite=None)


def run_profile(args) -> int:
    from specdec.bench.hardware.profile import profile
    from specdec.bench.render import kv_note, render_profile
    from specdec.runtime import ModelSpec, build

    contexts = parse_ints(args.contexts, "--contexts")
    check_json_file(args)
    target, drafter = build(ModelSpec.from_args(args))
    budget = args.memory_budget_gb * 2**30 if args.memory_budget_gb else None
    prof = profile(target, drafter, contexts, args.max_rows, args.reps, args.k, int(args.bandwidth_gib * 2**30),
                   budget, args.batch_context, progress=not args.quiet, prompt_tokens=args.prompt_tokens)
    from specdec.engine.costs import keep
    from specdec.theory.profile import Profile

    kept = keep(target, prof, args.max_rows)[1]
    if json_on_stdout(args):
        print(json.dumps(Profile.from_json(prof, "the measured profile").to_json(), indent=1))
        return 0
    print(render_profile(prof))
    if kept:
        print(f"kept as {target.name}'s pass costs on this CPU ({target.model.precision}{kv_note(prof)}): generate, "
              "serve, bench and expect plan with them from now on")
    if json_file(args):
        Profile.from_json(prof, "the measured profile").save(json_file(args))  # what every reader will check
        print(f"wrote {json_file(args)}: `specdec plan --profile {json_file(args)} --alpha A` picks k with these "
              "costs")
    return 0


def run_bench(args) -> int:
    from specdec.bench.suites import resolve_suite_args, run_suite

    resolve_suite_args(args)
    if args.suite:
        return run_suite(args)
    if args.endpoint or args.baseline:
        return run_endpoint_bench(args)
    import torch

    from specdec.bench.prompts import load_prompts, parse_categories, select
    from specdec.bench.report import build_report
    from specdec.bench.runner import engine_method, logit_gap_fn, mark_identity
    from specdec.bench.runner import run_bench as run_all
    from specdec.drafters.base import NoDrafter
    from specdec.engine.calibrate import make_policy
    from specdec.engine.cli import build_with_chat_template
    from specdec.engine.generate import Engine
    from specdec.engine.policy import PassCost
    from specdec.engine.speculation import DEFAULT_K, from_args
    from specdec.theory.profile import Profile

    how = from_args(args)
    if how.policy == "never":
        raise SpecdecError("bench compares plain decoding with speculation: --policy never (or --drafter none) "
                           "leaves nothing to compare")
    check_outputs(args)
    prompts = select(load_prompts(args.prompts), parse_categories(args.categories), args.per_category)
    if args.llamacpp_k is not None and args.compare != "llama.cpp":
        raise SpecdecError("--llamacpp-k needs --compare llama.cpp")
    if args.compare == "llama.cpp":  # before loading anything: the GGUF and the install are checked first
        from specdec.bench.engines.llamacpp_compare import gguf_path, worker_command

        llamacpp_cmd = worker_command(gguf_path(args.model), torch.get_num_threads())
    if args.profile:
        Profile.load(args.profile)  # checked before the model loads
    target, drafter = build_with_chat_template(args, "each prompt goes to the model as raw text (turns joined)")
    prof, source = planning_profile(target, drafter, how, args) if args.profile or how.policy == "auto" else (None,
                                                                                                              None)
    kv = check_profile_fits(prof, target, args.compare)

    engine = lambda: Engine(target.model, target.tokenizer, args.device)  # one meter per method
    methods = [engine_method("plain", engine(), NoDrafter(), 1)]
    default_k = DEFAULT_K if how.policy == "auto" else how.k
    if how.policy == "auto":
        cost = PassCost.from_profile(prof)
        policy = make_policy(how, cost, drafter.free, draft_step_s=(prof.draft_cost or 0.0) * cost(1))
        methods.append(engine_method(f"{drafter.name} k=auto", engine(), drafter, policy, "plain", "auto"))
    for kk in sorted(set(AUTO_FIXED_KS) | {default_k}) if how.policy == "auto" else [how.k]:
        methods.append(engine_method(f"{drafter.name} k={kk}", engine(), drafter, kk, "plain", kk))
    if args.compare == "hf":
        from specdec.bench.engines.hf_compare import hf_methods
        from specdec.models.loader import resolve_model_dir

        draft_path = resolve_model_dir(args.draft_model) if args.drafter == "draft-model" else None
        methods += hf_methods(target.path, target.tokenizer, default_k, args.ngram_max, draft_path)
    llamacpp = None
    if args.compare == "llama.cpp":
        from specdec.bench.engines.llamacpp_compare import LlamaCppWorker, llamacpp_methods

        worker = LlamaCppWorker(llamacpp_cmd, timeout_s=args.timeout)  # stopped at exit
        extra, llamacpp = llamacpp_methods(worker, target.tokenizer, args.llamacpp_k or default_k, args.ngram_min,
                                           args.ngram_max)
        methods += extra

    samples = run_all(prompts, methods, target.tokenizer, args.max_new_tokens, progress=not args.quiet)
    mark_identity(samples, methods, logit_gap_fn(target.model))
    config = {"model": target.name, "model_path": str(target.path), "backend": target.backend,
              "precision": target.model.precision, "kv_cache": kv, "device": args.device, "drafter": drafter.name,
              "k": "auto" if how.policy == "auto" else how.k, "policy": how.policy, "default_k": default_k,
              "max_new_tokens": args.max_new_tokens, "prompts": len(prompts),
              "prompt_file": args.prompts, "categories": args.categories, "per_category": args.per_category,
              "compare": args.compare, "threads": torch.get_num_threads(), "torch": torch.__version__,
              "greedy": True, "batch": 1, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if llamacpp:
        config["llamacpp"] = llamacpp
    write_report(build_report(samples, methods, config, prof, source, args.drift_margin), args)
    return 0


def check_profile_fits(prof, target, compare: str | None) -> str:
    """Warn where the profile bench plans with was measured for another model, path or KV cache type, and note that
    a compared engine runs its own default cache; the target's KV cache type."""
    from specdec.models.target import TargetTraits

    kv = TargetTraits.of(target.model).kv_cache
    measured = (prof.model, prof.precision, prof.raw.get("kv_cache", "f16")) if prof else None
    if measured and measured != (target.name, target.model.precision, kv):
        print(f"specdec: warning: the profile was measured for {prof.model} ({prof.precision}, KV cache "
              f"{measured[2]}), not {target.name} ({target.model.precision}, KV cache {kv})", file=sys.stderr)
    if compare and kv != "f16":
        print(f"specdec: note: --compare {compare} runs that engine's default KV cache, not {kv}", file=sys.stderr)
    return kv


def planning_profile(target, drafter, how, args):
    """(the profile bench plans and predicts with, where it comes from): --profile's file, else this model's cached
    pass costs (measured now, once, where none are) with the drafter's cost measured now."""
    from specdec.bench.hardware.profile import planning_cost
    from specdec.engine.costs import target_profile

    if args.profile:
        return target_profile(target, file=args.profile), f"file {args.profile}"
    prof = target_profile(target, how.k + 1)
    c = planning_cost(target, drafter, prof, how.k)
    return replace(prof, draft_cost=c), "this model's cached pass costs, and the drafter's cost"


def write_report(report, args, title: str | None = None) -> None:
    """The report's Markdown to stdout (and --markdown), its JSON to --json, its plot to --plot; each file is
    written whole or not at all (specdec.atomic). An endpoint report has its own Markdown layout."""
    from specdec.bench.render import markdown, plot
    from specdec.bench.serving.endpoint_report import markdown as endpoint_markdown

    text = endpoint_markdown(report) if report.endpoint else markdown(report)
    show_text(args, text)
    write_outputs(args, text, report.to_json(), lambda path: plot(report, path, title))


def run_endpoint_bench(args) -> int:
    from specdec.bench.prompts import load_prompts, parse_categories, select
    from specdec.bench.report import build_report
    from specdec.bench.runner import mark_identity
    from specdec.bench.serving.endpoint import round_cost, run_endpoints
    from specdec.bench.serving.load_types import LoadConfig

    if not args.endpoint:
        raise SpecdecError("--baseline needs --endpoint (the server with speculation on)")
    if args.compare or args.profile or args.chat_template:
        raise SpecdecError("--compare, --profile and --chat-template apply to a local model, not to --endpoint (a "
                           "server applies its own template)")
    check_outputs(args)
    levels = tuple(parse_ints(args.concurrency, "--concurrency"))
    prompts = select(load_prompts(args.prompts), parse_categories(args.categories), args.per_category)
    cfg = LoadConfig(url=args.endpoint, concurrency=levels, max_tokens=args.max_new_tokens, api_key=args.api_key,
                     model=args.endpoint_model, timeout_s=args.timeout)
    base = replace(cfg, url=args.baseline) if args.baseline else None
    say = None if args.quiet else lambda c, i, n: print(f"\rconcurrency {c}: block {i}/{n}", end="",
                                                         file=sys.stderr, flush=True)
    run = run_endpoints(cfg, base, prompts, say)
    mark_identity(run["samples"], run["methods"])
    if say:
        print(file=sys.stderr)
    config = {"endpoint": args.endpoint, "baseline": args.baseline, "concurrency": list(levels),
              "max_new_tokens": args.max_new_tokens, "prompts": len(prompts), "prompt_file": args.prompts,
              "categories": args.categories, "per_category": args.per_category, "greedy": True,
              "model": run["servers"]["endpoint"]["model"], "drafter": "the server's", "precision": "the server's",
              "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    info = {"servers": run["servers"], "levels": run["levels"]}
    info["round_cost"] = round_cost(run["levels"], run["samples"])
    if "verify_cost" in info["round_cost"]:
        info["verify_cost"] = info["round_cost"]["verify_cost"]
    report = build_report(run["samples"], run["methods"], config, None, None, args.drift_margin, endpoint=info)
    write_report(report, args, f"specdec bench --endpoint {args.endpoint}: speedup per category and level")
    return 0

