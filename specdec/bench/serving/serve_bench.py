"""`specdec loadtest --servers never,always,auto`: the serving benchmark, in one run so that its ratios share one
machine state: this machine's read bandwidth, then `specdec serve` under each policy (same model, n-gram drafter,
k, max batch) driven by loadtest's levels, then the chunked-prefill experiment (specdec.bench.hardware.prefill_bench).

Per policy, one server (127.0.0.1, a free port) serves two prompt sets, greedy and streamed:
  mixed  Spec-Bench first turns, a few each of coding, extraction, writing, translation, summarization and rag,
         at every --concurrency level;
  copy   copy-heavy: summarization and rag items plus the demo's code-edit prompt, at --copy-concurrency.
A level sends max(--requests-per-client, ceil(prompts / concurrency)) requests per client, so every level asks
every prompt of its set at least once (--no-cover: exactly --requests-per-client). Around each level the server's
/metrics is scraped; the deltas say how much the policy speculated there.

Goals, checked per level: (a) auto throughput >= max(never, always) - 3%; (b) on the copy set at concurrency 1,
auto keeps >= 90% of always's speedup over never: auto/never - 1 >= 0.9 * (always/never - 1).

Writes --json (everything, with the machine's provenance), --markdown (the report) and --plot (throughput and
latency against concurrency, mixed set). Progress goes to stderr; the report (tables and PASS/FAIL lines) to
stdout. Exit status 0 when the measurement completed (also when a goal fails; --strict makes a failed goal exit
1), 1 when a server did not start or a level failed (the partial results go to --json's name + .partial.json).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import httpx

from specdec.atomic import write_text_atomic
from specdec.bench.options import check_outputs, parse_ints, show_text, write_outputs
from specdec.bench.serving import loadtest
from specdec.bench.serving.load_types import LoadConfig
from specdec.bench.serving.serve_report import POLICIES, PolicyRun, ServeLevel
from specdec.bench.serving.servers import BenchError, LocalServer
from specdec.bench.serving.servers import say as _say
from specdec.bench.tables import num
from specdec.client import run_async
from specdec.errors import SpecdecError
from specdec.measure import acceptance
from specdec.outputs import json_file

MIXED_CATEGORIES = ("coding", "extraction", "writing", "translation", "summarization", "rag")
COPY_CATEGORIES = ("summarization", "rag")
COUNTERS = {  # per-level deltas scraped from /metrics
    "drafts": "specdec:spec_decode_num_drafts_total",
    "draft_tokens": "specdec:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "specdec:spec_decode_num_accepted_tokens_total",
    "generation_tokens": "specdec:generation_tokens_total",
    "prompt_tokens": "specdec:prompt_tokens_total",
    "rounds": "specdec:batch_size_count",  # decode rounds
    "round_rows": "specdec:batch_size_sum",  # sequences over all rounds
}


def say(msg: str) -> None:
    _say(msg, "serve-bench")


def finite(obj):
    """obj with every NaN or infinity replaced by None (JSON has no NaN; a gauge without data reports one)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


# ---- prompts ---------------------------------------------------------------------------------------------------

def interleave(groups: list[list[str]]) -> list[str]:
    """Round-robin over the groups, so that any prefix of the list mixes categories."""
    out = []
    for i in range(max(map(len, groups), default=0)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def prompt_sets(path: str, per_category: int, copy_per_category: int) -> dict[str, list[str]]:
    from specdec.bench.prompts import load_prompts, select
    from specdec.engine.demo import DEMO_PROMPT

    items = load_prompts(path)

    def firsts(categories, n) -> list[list[str]]:
        chosen = select(items, categories, n)
        return [[p.turns[0] for p in chosen if p.category == c] for c in categories]

    return {"mixed": interleave(firsts(MIXED_CATEGORIES, per_category)),
            "copy": [DEMO_PROMPT] + interleave(firsts(COPY_CATEGORIES, copy_per_category))}


# ---- load levels -----------------------------------------------------------------------------------------------

def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict:
    d = {k: after.get(name, 0.0) - before.get(name, 0.0) for k, name in COUNTERS.items()}
    ratio = lambda a, b: d[a] / d[b] if d[b] > 0 else None
    return {"counters": {k: int(round(v)) for k, v in d.items()},
            "acceptance_rate": acceptance(d["accepted_tokens"], d["draft_tokens"]),
            "draft_tokens_per_output_token": ratio("draft_tokens", "generation_tokens"),  # how much it speculated
            "drafting_share": ratio("drafts", "round_rows"),  # rows of a round that drafted >= 1 token
            "mean_accepted_per_draft": ratio("accepted_tokens", "drafts"),
            "mean_batch": ratio("round_rows", "rounds")}


def run_level(server: LocalServer, model: str, prompts: list[str], c: int, args) -> ServeLevel:
    rpc = args.requests_per_client if args.no_cover else max(args.requests_per_client, math.ceil(len(prompts) / c))
    cfg = LoadConfig(url=server.url, concurrency=(c,), requests_per_client=rpc, max_tokens=args.max_tokens,
                     temperature=0.0, stream=True, model=model, timeout_s=args.timeout)
    before = server.metrics()
    r = run_async(loadtest.run_level(cfg, prompts, c))
    spec = counter_deltas(before, server.metrics())
    return ServeLevel(**asdict(r), requests_per_client=rpc, loadavg_1m=os.getloadavg()[0], **spec)


def warm_up(server: LocalServer, model: str, sets: dict[str, list[str]]) -> None:
    """One short request per prompt set, so that the first level does not pay for first-call costs."""
    for prompts in sets.values():
        cfg = LoadConfig(url=server.url, concurrency=(1,), requests_per_client=1, max_tokens=8, temperature=0.0,
                         model=model, timeout_s=120.0)
        run_async(loadtest.run_level(cfg, prompts[:1], 1))


def bench_policy(policy: str, sets: dict[str, list[str]], levels: dict[str, tuple[int, ...]], args,
                 log_dir: Path) -> PolicyRun:
    profile = ["--profile", args.auto_profile] if policy == "auto" and args.auto_profile else []
    server = LocalServer(policy, ["--model", "default", "--drafter", "ngram", "--policy", policy, "--k", str(args.k),
                                  "--max-batch", str(args.max_batch), *profile], log_dir)
    out = PolicyRun()
    try:
        server.start(args.startup_timeout)
        out.startup_s = server.startup_s
        model = server.model()
        say(f"{policy}: warm-up (one short request per prompt set)")
        warm_up(server, model, sets)
        for name, prompts in sets.items():
            out.sets[name] = []
            for c in levels[name]:
                rec = run_level(server, model, prompts, c, args)
                out.sets[name].append(rec)
                spec, acc = rec.draft_tokens_per_output_token, rec.acceptance_rate
                say(f"{policy} {name} c={c}: {rec.requests - rec.failed}/{rec.requests} ok, "
                    f"{rec.throughput_tok_s:.1f} tok/s, drafted/token {num(spec, 2)}, accepted {num(acc, 2)}")
        final = server.metrics()
        out.final_metrics = {k: v for k, v in final.items() if k.startswith("specdec:spec_decode")}
    except BenchError:
        raise
    except (SpecdecError, httpx.HTTPError) as e:  # every request of a level failed, or the server went away
        raise server.failed(e) from None
    finally:
        server.stop()
        out.server_problems = server.problems()
    return out


# ---- the command -----------------------------------------------------------------------------------------------

def resolve_args(args) -> None:
    """--quick's settings, the levels and the policies, checked before anything starts."""
    if args.quick:
        args.concurrency, args.copy_concurrency = "1,2", "1"
        args.requests_per_client, args.max_tokens, args.per_category, args.copy_per_category = 1, 16, 1, 1
        args.prefill_stream_tokens, args.prefill_reps = 64, 1
    args.levels = {"mixed": tuple(parse_ints(args.concurrency, "--concurrency")),
                   "copy": tuple(parse_ints(args.copy_concurrency, "--copy-concurrency"))}
    args.policy_list = [x.strip() for x in args.servers.split(",") if x.strip()]
    if not args.policy_list or not set(args.policy_list) <= set(POLICIES):
        raise SpecdecError(f"--servers must name some of {', '.join(POLICIES)}, got {args.servers!r}")


def run_serve_bench(args) -> int:
    from specdec.bench.hardware.prefill_bench import bench_prefill
    from specdec.bench.hardware.profile import measure_bandwidth
    from specdec.bench.prompts import load_prompts, select
    from specdec.bench.serving.loadtest_report import plot_series
    from specdec.bench.serving.serve_report import ServeBenchRun, goals, report
    from specdec.provenance import provenance

    resolve_args(args)
    check_outputs(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop the servers
    sets = prompt_sets(args.prompts, args.per_category, args.copy_per_category)
    config = {k: v for k, v in vars(args).items() if k not in ("levels", "policy_list", "func")}
    result = ServeBenchRun(config, list(os.getloadavg()), sets, {k: list(v) for k, v in args.levels.items()},
                           machine=provenance())
    say("measuring read bandwidth (1 GiB, 5 reps)")
    bw = measure_bandwidth(1 << 30, 5)
    result.bandwidth = bw
    result.machine["bandwidth_gbs"] = round(bw["read_GBps"], 2)
    print(f"read bandwidth: {bw['read_GBps']:.2f} GB/s (best {bw['read_GBps_best']:.2f}), copy "
          f"{bw['copy_GBps']:.2f} GB/s", flush=True)
    logs = Path(tempfile.mkdtemp(prefix="serve-bench-logs-"))  # the servers' output; kept when a step fails
    try:
        for policy in args.policy_list:
            result.policies[policy] = bench_policy(policy, sets, args.levels, args, logs)
        if not args.skip_prefill:
            items = load_prompts(args.prompts)
            source = [p.turns[0] for p in select(items, ["summarization", "rag"])]
            background = [p.turns[0] for p in select(items, ["writing"], 4)]
            result.prefill = bench_prefill(source, background, args, logs)
    except BenchError as e:
        partial = None
        if json_file(args):
            partial = Path(json_file(args)).with_suffix(".partial.json")
            write_text_atomic(partial, json.dumps(finite(result.to_json()), indent=1, allow_nan=False))
        print(f"specdec: error: {e}\n(partial results: {partial or 'not kept: no --json'}; server logs: {logs})",
              file=sys.stderr)
        return 1
    shutil.rmtree(logs, ignore_errors=True)
    result.loadavg_end = list(os.getloadavg())
    result.goals = goals(result.policies)
    text = report(result)
    series = {p: list(res.sets["mixed"]) for p, res in result.policies.items()}
    write_outputs(args, text, finite(result.to_json()), lambda path: plot_series(series, path))
    show_text(args, text)
    return 1 if args.strict and not all(g.passed for g in result.goals) else 0
