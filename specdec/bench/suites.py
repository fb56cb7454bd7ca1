"""`specdec bench --kernels`, `--long-context` and `--endpoint-check`: measurements of their own, each in one
run so that its ratios share one machine state, written into --out as JSON (with the machine's provenance) and
Markdown. They share `bench`'s --prompts, --categories, --per-category, --max-new-tokens, --k and --concurrency,
with defaults of their own."""

from __future__ import annotations

from specdec.errors import SpecdecError
from specdec.inputs import AT_LEAST_1

# --max-new-tokens, --per-category and --concurrency by what bench runs: the Spec-Bench report (local or --endpoint)
# or one of the suites, each a measurement of its own written into --out
NEW_TOKENS = {None: 256, "kernels": 96, "long_context": 128, "endpoint_check": 64}
PER_CATEGORY = {None: None, "endpoint_check": 2}
CONCURRENCY = {None: "1", "endpoint_check": "1,4"}


def add_suite_args(parser) -> None:
    s = parser.add_argument_group("suites: measurements of their own, each in one run, written into --out (JSON "
                                  "and Markdown, with the machine's provenance)")
    one = s.add_mutually_exclusive_group()
    one.add_argument("--kernels", dest="suite", action="store_const", const="kernels",
                     help="the bundled GGUF's precision paths (fp16, gguf, gguf-q16, gguf-q8): floors, decode and "
                          "n-gram speed, verify cost, TTFT, huge pages, ISA builds, and llama.cpp on the same GGUF")
    one.add_argument("--long-context", dest="suite", action="store_const", const="long_context",
                     help="contexts of 512 to 8k positions: decode and verify cost, TTFT, n-gram on long copy-heavy "
                          "prompts, the prefix cache, llama.cpp beside it")
    one.add_argument("--endpoint-check", dest="suite", action="store_const", const="endpoint_check",
                     help="`specdec serve` under policies never, always and auto: bench --endpoint against the local "
                          "bench and loadtest, on the same prompts")
    s.add_argument("--out", metavar="DIR", default="artifacts", help="where a suite writes (default artifacts)")
    s.add_argument("--quick", action="store_true",
                   help="a smoke test of --kernels (two paths) or --long-context (two contexts), fewer repetitions")
    s.add_argument("--max-batch", type=int, default=8, action=AT_LEAST_1,
                   help="--endpoint-check: the servers' --max-batch")


def resolve_suite_args(args) -> None:
    """Defaults that depend on what bench runs; options that do not apply to it refused."""
    from specdec.engine.calibrate import parse_k

    suite = args.suite
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
            raise SpecdecError("--out, --quick and --max-batch apply to --kernels, --long-context and --endpoint-check")
        return
    flag = "--" + suite.replace("_", "-")
    given = [f for f, v in (("--endpoint", args.endpoint), ("--baseline", args.baseline), ("--compare", args.compare),
                            ("--profile", args.profile), ("--json", args.json), ("--markdown", args.markdown),
                            ("--plot", args.plot), ("--model", args.model != "default" or None)) if v]
    if suite != "endpoint_check" and args.concurrency != "1":
        given.append("--concurrency")
    if given:
        raise SpecdecError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to {flag} (it writes "
                           "into --out)")
    if suite == "endpoint_check":
        args.k = parse_k(args.k)
        if args.k == "auto":
            raise SpecdecError("--endpoint-check runs the servers with a fixed --k")
    if args.quick and suite == "endpoint_check":
        raise SpecdecError("--quick applies to --kernels and --long-context")


def run_suite(args) -> int:
    if args.suite == "kernels":
        from specdec.bench.hardware.kernels_bench import run_kernels_bench

        return run_kernels_bench(args)
    if args.suite == "long_context":
        from specdec.bench.hardware.long_context import run_long_context

        return run_long_context(args)
    from specdec.bench.serving.endpoint_check import run_endpoint_check

    return run_endpoint_check(args)
