"""`specdec loadtest`'s command line: --url measures one server (specdec.bench.serving.loadtest runs the levels,
specdec.bench.serving.loadtest_report writes the table, plot and JSON); --servers runs the serving benchmark
(specdec.bench.serving.serve_bench). This module sits on top and imports them; none of them imports it back."""

from __future__ import annotations

import sys
from dataclasses import replace

from specdec.bench.options import check_outputs, parse_ints, show_text, write_outputs
from specdec.bench.serving.load_types import ENDPOINTS, LoadConfig
from specdec.client import run_async
from specdec.errors import SpecdecError
from specdec.inputs import AT_LEAST_1, NON_NEGATIVE, POSITIVE, SEED
from specdec.outputs import add_json_arg
from specdec.theory.economics import add_k_arg

# The options of --url and their defaults (refused with --servers).
URL_ONLY = {"no_stream": False, "api_key": None, "model": None, "endpoint": "chat", "seed": None, "temperature": 0.0}
# The options of `loadtest --servers` and their defaults (refused with --url).
SERVE_DEFAULTS = {"copy_concurrency": "1,4", "no_cover": False, "k": 5, "max_batch": 16, "per_category": 2,
                  "copy_per_category": 3, "auto_profile": None, "startup_timeout": 180.0, "long_prompt_tokens": 1500,
                  "prefill_stream_tokens": 1500, "prefill_delay": 1.5, "prefill_reps": 3, "skip_prefill": False,
                  "quick": False, "strict": False}
REQUESTS_PER_CLIENT = 2  # the default with --servers
REQUEST_TIMEOUT_S = 600.0  # the default with --servers


def register(sub) -> None:
    d = SERVE_DEFAULTS
    p = sub.add_parser("loadtest", help="throughput and latency of an OpenAI-compatible server under load, or of "
                                        "`specdec serve` under each policy (--servers)")
    p.add_argument("--url", help="server base URL, e.g. http://127.0.0.1:8000 ('/v1' is added)")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="comma-separated client counts, one level each")
    p.add_argument("--prompts", required=True, metavar="FILE.jsonl",
                   help="Spec-Bench question.jsonl (first turns are sent), or JSONL lines of {\"prompt\": ...}")
    p.add_argument("--requests-per-client", type=int, default=None, metavar="N", action=AT_LEAST_1,
                   help=f"sent one after another (default 3; {REQUESTS_PER_CLIENT} with --servers)")
    p.add_argument("--max-tokens", type=int, default=64, metavar="N", action=AT_LEAST_1)
    p.add_argument("--temperature", type=float, default=0.0, action=NON_NEGATIVE)
    p.add_argument("--no-stream", action="store_true", help="whole responses (no TTFT apart from E2E, no ITL)")
    p.add_argument("--api-key", metavar="KEY", help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--model", metavar="NAME", help="model name to ask for (default: the first of GET /v1/models)")
    p.add_argument("--endpoint", choices=tuple(ENDPOINTS), default="chat")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", action=POSITIVE,
                   help=f"per request (default 300; {REQUEST_TIMEOUT_S:g} with --servers)")
    p.add_argument("--seed", type=int, default=None, action=SEED, help="sent as the request's 'seed'")
    add_json_arg(p, "the levels, the configuration and the machine")
    p.add_argument("--markdown", metavar="FILE", help="write the table as Markdown")
    p.add_argument("--plot", metavar="FILE.png", help="throughput and latency against concurrency")
    s = p.add_argument_group("the serving benchmark (`specdec serve` per policy on 127.0.0.1, then chunked prefill)")
    s.add_argument("--servers", nargs="?", const="never,always,auto", metavar="POLICIES",
                   help="start a server per policy instead of --url (default never,always,auto)")
    s.add_argument("--copy-concurrency", default=d["copy_concurrency"], help="levels for the copy-heavy set")
    s.add_argument("--no-cover", action="store_true",
                   help="send exactly --requests-per-client per client (default: enough to ask every prompt)")
    add_k_arg(s, "the servers' --k", auto=False, default=d["k"])
    s.add_argument("--max-batch", type=int, default=d["max_batch"], action=AT_LEAST_1, help="the servers' --max-batch")
    s.add_argument("--per-category", type=int, default=d["per_category"], action=AT_LEAST_1,
                   help="mixed set: items per category")
    s.add_argument("--copy-per-category", type=int, default=d["copy_per_category"], action=AT_LEAST_1,
                   help="copy set: summarization and rag items each")
    s.add_argument("--auto-profile", metavar="FILE",
                   help="`specdec profile` JSON for the auto server's pass costs (default: it calibrates at start-up, "
                        "under whatever load the machine has then)")
    s.add_argument("--startup-timeout", type=float, default=d["startup_timeout"], action=POSITIVE,
                   help="seconds to wait for GET /health")
    s.add_argument("--long-prompt-tokens", type=int, default=d["long_prompt_tokens"], action=AT_LEAST_1)
    s.add_argument("--prefill-stream-tokens", type=int, default=d["prefill_stream_tokens"], action=AT_LEAST_1,
                   help="greedy tokens each of the four background streams asks for: enough to outlast the delay and "
                        "the long prompt's prefill (the report says when some did not)")
    s.add_argument("--prefill-delay", type=float, default=d["prefill_delay"], action=NON_NEGATIVE,
                   help="seconds after all four stream")
    s.add_argument("--prefill-reps", type=int, default=d["prefill_reps"], action=AT_LEAST_1)
    s.add_argument("--skip-prefill", action="store_true")
    s.add_argument("--quick", action="store_true",
                   help="smoke test: concurrency 1,2 (copy 1), 1 request per client, 16 tokens, one small prefill "
                        "trial")
    s.add_argument("--strict", action="store_true", help="exit 1 when a goal fails")
    p.set_defaults(func=run_cli)


def check_mode(args) -> None:
    """--url or --servers, and only the options that apply to the one given."""
    if (args.url is None) == (args.servers is None):
        raise SpecdecError("give either --url (a server to measure) or --servers (start `specdec serve` per policy)")
    flag = lambda dest: "--" + dest.replace("_", "-")
    if args.servers is not None:
        given = [flag(k) for k, v in URL_ONLY.items() if getattr(args, k) != v]
        if given:
            raise SpecdecError(f"{', '.join(given)} apply to --url, not to --servers")
        args.requests_per_client = args.requests_per_client or REQUESTS_PER_CLIENT
        args.timeout = args.timeout or REQUEST_TIMEOUT_S
    else:
        given = [flag(k) for k, v in SERVE_DEFAULTS.items() if getattr(args, k) != v]
        if given:
            raise SpecdecError(f"{', '.join(given)} apply to --servers, not to --url")
        args.requests_per_client = args.requests_per_client or 3
        args.timeout = args.timeout or 300.0


def run_cli(args) -> int:
    from specdec.bench.prompts import load_prompts
    from specdec.bench.serving.loadtest import resolve_model, run
    from specdec.bench.serving.loadtest_report import markdown, plot, to_json
    from specdec.provenance import provenance

    check_mode(args)
    if args.servers is not None:
        from specdec.bench.serving.serve_bench import run_serve_bench

        return run_serve_bench(args)
    concurrency = tuple(parse_ints(args.concurrency, "--concurrency"))
    check_outputs(args)
    prompts = [p.turns[0] for p in load_prompts(args.prompts)]
    cfg = LoadConfig(url=args.url, concurrency=concurrency, requests_per_client=args.requests_per_client,
                     max_tokens=args.max_tokens, temperature=args.temperature, stream=not args.no_stream,
                     api_key=args.api_key, model=args.model, endpoint=args.endpoint, timeout_s=args.timeout,
                     seed=args.seed)
    cfg = replace(cfg, model=run_async(resolve_model(cfg)))
    say = lambda r: print(f"concurrency {r.concurrency}: {r.requests - r.failed}/{r.requests} ok, "
                          f"{r.throughput_tok_s:.1f} tok/s", file=sys.stderr)
    results = run(cfg, prompts, progress=say)
    text = markdown(results)
    show_text(args, text)
    obj = {"machine": provenance(), **to_json(results, cfg)}  # the client's machine: the server may be elsewhere
    write_outputs(args, text, obj, lambda path: plot(results, path))
    return 0
