"""`specdec bench endpoint-check`: does `bench --endpoint` measure what the local bench and `specdec loadtest`
measure? One run, so the ratios share one machine state: this machine's read bandwidth; the local bench (plain vs
n-gram k); then `specdec serve` under the policies never, always and auto (same model, drafter, k, max batch), with
`bench --endpoint` (always and auto, each against never) and `loadtest` against each server, on the same prompts.

Prompts: the first turn of the first N Spec-Bench items of each category (one JSONL, used by all three tools;
loadtest sends first turns only). Compared:
  - concurrency 1: the local bench's n-gram speedup, decode speedup, acceptance a and identical-output rate
    against bench --endpoint's for policy always (same k), whose a comes from the server's counters;
  - every level: output throughput of bench --endpoint's level against loadtest's, per policy, and the
    throughput ratio of always and auto over never by both tools.
Writes OUT/endpoint-bench.{md,json} (the JSON with the machine's provenance) plus each tool's own JSON. Nothing
connects anywhere but 127.0.0.1.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specdec.atomic import write_text_atomic
from specdec.bench.hardware.profile import measure_bandwidth
from specdec.bench.options import parse_ints
from specdec.bench.prompts import load_prompts, parse_categories, select
from specdec.bench.serving.servers import BenchError, LocalServer
from specdec.bench.serving.servers import say as _say
from specdec.bench.tables import num, ratio, table
from specdec.measure import acceptance
from specdec.provenance import provenance


def say(msg: str) -> None:
    _say(msg, "endpoint-check")


def cli(*args: str) -> None:
    """One `specdec` command in a process of its own, as a user runs it; its report on stdout is not shown."""
    cmd = [sys.executable, "-m", "specdec.cli", *args]
    say(" ".join(cmd[3:]))
    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
        raise BenchError(f"`specdec {' '.join(args)}` failed (its error is above)")


def first_turns(spec_bench: str, out: Path, per_category: int, categories: str | None = None) -> int:
    items = select(load_prompts(spec_bench), parse_categories(categories), per_category)
    out.write_text("".join(json.dumps({"question_id": p.qid, "category": p.category, "turns": [p.turns[0]]}) + "\n"
                           for p in items))
    return len(items)


POLICIES = ("never", "always", "auto")


def run_servers(args, common: list[str], prompts: Path, n: int, tmp: Path, out_dir: Path, levels: list[int]):
    """A server per policy; `bench --endpoint` against each speculating one (never as its baseline), then loadtest
    at each level against every one. Returns ({policy: its bench JSON path}, {(policy, level): loadtest level})."""
    serve = ["--drafter", "ngram", "--k", str(args.k), "--max-batch", str(args.max_batch)]
    servers = {p: LocalServer(p, [*serve, "--policy", p], tmp) for p in POLICIES}
    loads, endpoint = {}, {}
    try:
        for s in servers.values():
            s.start(300)
        for p in ("always", "auto"):
            endpoint[p] = out_dir / f"endpoint-bench-{p}.json"
            cli("bench", *common, "--endpoint", servers[p].url, "--baseline", servers["never"].url,
                "--concurrency", args.concurrency, "--json", str(endpoint[p]))
        for p, s in servers.items():
            for c in levels:
                out = tmp / f"load-{p}-{c}.json"
                cli("loadtest", "--url", s.url, "--prompts", str(prompts), "--concurrency", str(c),
                    "--requests-per-client", str(math.ceil(n / c)), "--max-tokens", str(args.max_new_tokens),
                    "--json", str(out))
                loads[(p, c)] = json.loads(out.read_text())["levels"][0]
    finally:
        for s in servers.values():
            s.stop()
    return endpoint, loads


def run_endpoint_check(args) -> int:
    """args: prompts (Spec-Bench), categories (None: all), per_category, max_new_tokens, concurrency (a string),
    k (an int), max_batch, out (a folder)."""
    levels = parse_ints(args.concurrency, "--concurrency")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="endpoint-bench-"))
    prompts = tmp / "first-turns.jsonl"
    n = first_turns(args.prompts, prompts, args.per_category, args.categories)
    t0 = time.time()
    bw = measure_bandwidth(1 << 30, 7)
    say(f"read bandwidth {bw['read_GBps']:.1f} GB/s; {n} prompts")
    common = ["--prompts", str(prompts), "--max-new-tokens", str(args.max_new_tokens), "--quiet"]
    local = out_dir / "endpoint-bench-local.json"
    cli("bench", *common, "--k", str(args.k), "--json", str(local))

    endpoint, loads = run_servers(args, common, prompts, n, tmp, out_dir, levels)

    loc = json.loads(local.read_text())
    ep = {p: json.loads(f.read_text()) for p, f in endpoint.items()}
    spec_name = next(m["name"] for m in loc["methods"] if m["baseline"])
    lo = loc["results"][spec_name]["overall"]
    e1 = ep["always"]["results"]["endpoint c=1"]["overall"]
    c1 = ep["always"]["endpoint"]["levels"][0]["endpoint"]["counters"]
    rows1 = [["local bench (engine, batch 1)", num(lo["speedup"], 2, suffix="x"),
              num(lo["decode_speedup"], 2, suffix="x"), num(lo["alpha"], 3), num(lo["tokens_per_pass"]),
              num(lo["identical_rate"] * 100, 0, suffix="%")],
             ["bench --endpoint, policy always, c=1", num(e1["speedup"], 2, suffix="x"),
              num(e1["decode_speedup"], 2, suffix="x"),
              num(acceptance(c1["accepted"], c1["drafted"]) if c1 else None, 3), num(e1["tokens_per_pass"]),
              num(e1["identical_rate"] * 100, 0, suffix="%")]]
    rows2 = []
    machine = provenance()
    machine["bandwidth_gbs"] = round(bw["read_GBps"], 2)
    summary = {"machine": machine, "bandwidth_GBps": bw["read_GBps"], "prompts": n,
               "max_new_tokens": args.max_new_tokens, "k": args.k,
               "levels": {}}
    for c in levels:
        tput = {}
        for p in POLICIES:
            src = ep["auto" if p == "auto" else "always"]["endpoint"]["levels"][levels.index(c)]
            bench_t = src["endpoint" if p != "never" else "baseline"]["load"]["throughput_tok_s"]
            load_t = loads[(p, c)]["throughput_tok_s"]
            tput[p] = (bench_t, load_t)
            rows2.append([str(c), p, num(bench_t, 1), num(load_t, 1), num(ratio(bench_t, load_t), 2)])
        for p in ("always", "auto"):
            rows2.append([str(c), f"{p} / never", num(ratio(tput[p][0], tput["never"][0]), 2, suffix="x"),
                          num(ratio(tput[p][1], tput["never"][1]), 2, suffix="x"), ""])
        summary["levels"][c] = {p: {"bench_endpoint_tok_s": b, "loadtest_tok_s": t} for p, (b, t) in tput.items()}
    summary["concurrency_1"] = {"local": rows1[0][1:], "endpoint_always": rows1[1][1:]}

    md = "\n".join([
        f"# bench --endpoint against the local bench and loadtest ({time.strftime('%Y-%m-%d')})", "",
        f"This machine: read bandwidth {bw['read_GBps']:.1f} GB/s. {n} Spec-Bench first turns ({args.per_category} "
        f"per category), {args.max_new_tokens} new tokens, greedy, n-gram drafter k = {args.k}, servers with max "
        f"batch {args.max_batch}. One run, {(time.time() - t0) / 60:.0f} minutes.", "",
        "## Concurrency 1: speculation's gain, measured in the engine and through the server", "",
        table(["measured by", "speedup", "decode speedup", "a", "tokens/pass (chunk)", "identical"], rows1), "",
        "## Output throughput per level (tokens/s): bench --endpoint's level against loadtest's", "",
        table(["concurrency", "policy", "bench --endpoint", "loadtest", "bench / loadtest"], rows2), ""])
    write_text_atomic(out_dir / "endpoint-bench.md", md)
    write_text_atomic(out_dir / "endpoint-bench.json", json.dumps(summary, indent=1))
    print(md)
    return 0
