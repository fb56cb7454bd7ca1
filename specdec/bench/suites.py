"""`specdec bench kernels`, `bench long-context` and `bench endpoint-check`: measurements of their own, each in one
run so that its ratios share one machine state, written into --out as JSON (with the machine's provenance) and
Markdown. Each is a subcommand of `bench` with only the options it reads (`specdec bench kernels --help`); plain
`specdec bench` is the Spec-Bench report, local or against --endpoint.

The old spellings `bench --kernels`, `--long-context` and `--endpoint-check` still work for this release, with a
note; they share `bench`'s options, so resolve_suite_args refuses those a suite does not read."""

from __future__ import annotations

import argparse
import sys

from specdec.errors import SpecdecError
from specdec.inputs import AT_LEAST_1
from specdec.theory.economics import add_k_arg

# --max-new-tokens, --per-category and --concurrency by what bench runs: the Spec-Bench report (local or --endpoint)
# or one of the suites, each a measurement of its own written into --out
NEW_TOKENS = {None: 256, "kernels": 96, "long_context": 128, "endpoint_check": 64}
PER_CATEGORY = {None: None, "endpoint_check": 2}
CONCURRENCY = {None: "1", "endpoint_check": "1,4"}
HELP = {
    "kernels": "the bundled GGUF's precision paths (fp16, gguf, gguf-q16, gguf-q8): floors, decode and n-gram speed, "
               "verify cost, TTFT, huge pages, ISA builds, and llama.cpp on the same GGUF",
    "long_context": "contexts of 512 to 8k positions: decode and verify cost, TTFT, n-gram on long copy-heavy "
                    "prompts, the prefix cache, llama.cpp beside it",
    "endpoint_check": "`specdec serve` under policies never, always and auto: bench --endpoint against the local "
                      "bench and loadtest, on the same prompts",
}
QUICK = "a smoke test: two paths (kernels) or two contexts (long-context), fewer repetitions"


def command(suite: str) -> str:
    return suite.replace("_", "-")


def add_suite_commands(bench) -> None:
    """The suites as subcommands of `bench`. Their options default to argparse.SUPPRESS, so that what is not
    given keeps bench's own default (the suite's, set by resolve_suite_args)."""
    modes = bench.add_subparsers(dest="suite_command", metavar="SUITE", title="suites (each `specdec bench SUITE "
                                 "--help` lists its options); without one, bench runs the Spec-Bench report")
    for suite in HELP:
        p = modes.add_parser(command(suite), help=HELP[suite], description=HELP[suite] + ".",
                             argument_default=argparse.SUPPRESS)
        if suite != "kernels":
            p.add_argument("--prompts", metavar="FILE.jsonl", required=True,
                           help="Spec-Bench question.jsonl, or JSONL lines of {\"prompt\": ...}")
        p.add_argument("--out", metavar="DIR", help="where it writes its JSON and Markdown (default artifacts)")
        p.add_argument("--max-new-tokens", type=int, action=AT_LEAST_1,
                       help=f"tokens generated per run (default {NEW_TOKENS[suite]})")
        if suite == "endpoint_check":
            p.add_argument("--categories", help="comma-separated categories (default: all in the file)")
            p.add_argument("--per-category", type=int, metavar="N", action=AT_LEAST_1,
                           help=f"first N prompts of each category (default {PER_CATEGORY[suite]})")
            add_k_arg(p, "the servers' --k (default: the default cap, 8; auto runs with it, fixed drafts it every "
                         "round)")
            p.add_argument("--concurrency", help=f"comma-separated client counts (default {CONCURRENCY[suite]})")
            p.add_argument("--max-batch", type=int, action=AT_LEAST_1, help="the servers' --max-batch (default 8)")
        else:
            p.add_argument("--quick", action="store_true", help=QUICK)
        if suite == "long_context":
            from specdec.engine.cli import add_kv_cache_arg

            add_kv_cache_arg(p, default=argparse.SUPPRESS)
        p.set_defaults(suite_command=suite)


def add_suite_args(parser) -> None:
    """The old spellings (`bench --kernels`) and the options they share with bench."""
    s = parser.add_argument_group("suites, old spelling (works for this release; use `specdec bench SUITE`)")
    one = s.add_mutually_exclusive_group()
    for suite in HELP:
        one.add_argument("--" + command(suite), dest="suite_flag", action="store_const", const=suite,
                         help=f"`specdec bench {command(suite)}`")
    s.add_argument("--out", metavar="DIR", default="artifacts", help="where a suite writes (default artifacts)")
    s.add_argument("--quick", action="store_true", help=QUICK)
    s.add_argument("--max-batch", type=int, default=8, action=AT_LEAST_1,
                   help="endpoint-check: the servers' --max-batch")


def which_suite(args) -> str | None:
    """The suite bench runs (None: the Spec-Bench report), from the subcommand or the old flag."""
    sub, flag = args.suite_command, args.suite_flag
    if sub and flag and sub != flag:
        raise SpecdecError(f"bench {command(sub)} and --{command(flag)} name two suites: give one")
    if flag and not sub:
        print(f"specdec: note: `bench --{command(flag)}` is now `specdec bench {command(flag)}`; the flag works "
              "for this release", file=sys.stderr)
    return sub or flag


def resolve_suite_args(args) -> None:
    """args.suite, and the defaults that depend on it; options that do not apply to it refused."""
    from specdec.engine.speculation import speculation

    suite = args.suite = which_suite(args)
    if args.max_new_tokens is None:
        args.max_new_tokens = NEW_TOKENS[suite]
    if args.per_category is None:
        args.per_category = PER_CATEGORY.get(suite)
    if args.concurrency is None:
        args.concurrency = CONCURRENCY.get(suite, "1")
    if args.prompts is None and suite != "kernels":
        raise SpecdecError("bench: the following arguments are required: --prompts (Spec-Bench's question.jsonl, "
                           'or JSONL lines of {"prompt": ...})')
    if suite is None:
        if args.quick or args.out != "artifacts" or args.max_batch != 8:
            raise SpecdecError("--out, --quick and --max-batch apply to the suites (`specdec bench kernels`, "
                               "`long-context`, `endpoint-check`)")
        return
    given = [f for f, v in (("--endpoint", args.endpoint), ("--baseline", args.baseline), ("--compare", args.compare),
                            ("--profile", args.profile), ("--json", args.json), ("--markdown", args.markdown),
                            ("--plot", args.plot), ("--model", args.model != "default" or None),
                            ("--chat-template", getattr(args, "chat_template", None)),
                            ("--kv-cache", suite != "long_context" and getattr(args, "kv_cache", None))) if v]
    if suite != "endpoint_check" and args.concurrency != "1":
        given.append("--concurrency")
    if given:
        raise SpecdecError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to `bench "
                           f"{command(suite)}` (it writes into --out)")
    if suite == "endpoint_check":
        args.k = speculation(args.k).k  # auto: the default cap
    if args.quick and suite == "endpoint_check":
        raise SpecdecError("--quick applies to `bench kernels` and `bench long-context`")


def run_suite(args) -> int:
    if args.suite == "kernels":
        from specdec.bench.hardware.kernels_bench import run_kernels_bench

        return run_kernels_bench(args)
    if args.suite == "long_context":
        from specdec.bench.hardware.long_context import run_long_context

        return run_long_context(args)
    from specdec.bench.serving.endpoint_check import run_endpoint_check

    return run_endpoint_check(args)
