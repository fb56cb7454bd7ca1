"""Paced against unpaced streaming, side by side on one server: the same Spec-Bench prompts at 1, 4 and 16
clients under --policy always and auto. Per level, every prompt is sent with stream_options.pace "off" and
"auto" back to back (pairs: both modes under the same load at the same moments), then the level is run whole in
each mode, alternated (runs: what pacing costs the server's throughput).

Per mode: the inter-chunk gap's p50, p99, p99/p50 and coefficient of variation; end-to-end and first-token
times; text chunks per completion token; and the chunk sizes an observer of the stream sees: paced, one token a
chunk when chunks equal tokens; unpaced, the round sizes the server counted (specdec:tokens_per_round).

    .venv/bin/python scripts/pace_bench.py --out docs/results/pace-bench.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.bench.serving.serve_bench import prompt_sets  # noqa: E402
from specdec.bench.serving.servers import LocalServer  # noqa: E402
from specdec.client import prometheus_series  # noqa: E402
from specdec.engine.scheduler import PREFILL_CHUNK  # noqa: E402

SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared/data/spec_bench/question.jsonl"


async def one(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int, pace: str) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True, "pace": pace}}
    t0 = time.perf_counter()
    chunks, tokens = [], 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
            for ch in obj.get("choices", []):
                text = (ch.get("delta") or {}).get("content")
                if text:
                    chunks.append((time.perf_counter() - t0, len(text.encode())))
    return {"e2e": time.perf_counter() - t0, "chunks": chunks, "tokens": tokens}


async def level(url: str, model: str, prompts: list[str], clients: int, per_client: int, max_tokens: int,
                pace_of) -> tuple[list[dict], float]:
    """`clients` clients, each sending its requests one after another; pace_of(client, i) names request i's
    pace, or a pair ("off", "auto") sent back to back with the same prompt."""
    queue = list(prompts[: clients * per_client])
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients + 2)) as client:
        async def worker(c: int) -> list[dict]:
            out = []
            for i in range(per_client):
                prompt = queue[(c * per_client + i) % len(queue)]
                for pace in pace_of(c, i):
                    r = await one(client, url, model, prompt, max_tokens, pace)
                    out.append({**r, "pace": pace, "pair": (c, i)})
            return out

        t0 = time.perf_counter()
        results = await asyncio.gather(*(worker(c) for c in range(clients)))
        return [r for rs in results for r in rs], time.perf_counter() - t0


def gap_stats(gaps: list[float]) -> tuple[float, float, float | None, float | None]:
    s = sorted(gaps)
    p50, p99 = s[len(s) // 2], s[min(len(s) - 1, int(0.99 * len(s)))]
    return p50, p99, p99 / p50 if p50 > 0 else None, statistics.pstdev(gaps) / statistics.mean(gaps)


def summary(records: list[dict]) -> dict:
    """Gaps (all, and after each request's first: the wait for the first round left out), first-token and
    end-to-end times, and chunks per token, over one mode's requests."""
    gaps = [b[0] - a[0] for r in records for a, b in zip(r["chunks"], r["chunks"][1:])]
    later = [b[0] - a[0] for r in records for a, b in zip(r["chunks"][1:], r["chunks"][2:])]
    p50, p99, ratio, cv = gap_stats(gaps)
    _, _, ratio_later, cv_later = gap_stats(later)
    tokens = sum(r["tokens"] for r in records)
    return {"requests": len(records), "tokens": tokens, "gap_p50_ms": p50 * 1e3, "gap_p99_ms": p99 * 1e3,
            "p99_over_p50": ratio, "gap_cv": cv, "later_p99_over_p50": ratio_later, "later_gap_cv": cv_later,
            "e2e_mean_s": statistics.mean(r["e2e"] for r in records),
            "ttft_mean_s": statistics.mean(r["chunks"][0][0] for r in records if r["chunks"]),
            "chunks_per_token": sum(len(r["chunks"]) for r in records) / tokens}


def _ms(x: float | None) -> float | None:
    return None if x is None else 1e3 * x


def pair_ratios(records: list[dict]) -> list[float]:
    """auto / off end-to-end time of each prompt sent both ways back to back."""
    by = {}
    for r in records:
        by.setdefault(r["pair"], {})[r["pace"]] = r["e2e"]
    return [p["auto"] / p["off"] for p in by.values() if "auto" in p and "off" in p]


def round_sizes(before: dict, after: dict) -> dict[int, int]:
    """Rounds by tokens emitted (the unpaced chunk sizes), from the tokens_per_round histogram's delta."""
    cum = {}
    for n in range(1, 18):
        key = f'specdec:tokens_per_round_bucket{{le="{float(n)}"}}'
        cum[n] = after.get(key, 0.0) - before.get(key, 0.0)
    return {n: int(cum[n] - cum.get(n - 1, 0.0)) for n in cum if cum[n] - cum.get(n - 1, 0.0) > 0}


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hist_mean(before: dict, after: dict, name: str) -> float | None:
    n = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    return (after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)) / n if n else None


def metrics(url: str) -> dict:
    return prometheus_series(httpx.get(url + "/metrics", timeout=30).text)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="default: the bundled model")
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--policies", default="always,auto")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--per-client", type=int, default=0, help="requests per client (default: 8 // clients, >= 1)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default="docs/results/pace-bench.md")
    ap.add_argument("--prompts", default=str(SPEC_BENCH), help="Spec-Bench question.jsonl")
    ap.add_argument("--prefill-chunk", type=int, default=None,
                    help="the server's --prefill-chunk (default: its own): what a newcomer's prefill costs the "
                         "streams already running")
    args = ap.parse_args()
    from specdec.bench.hardware.profile import measure_bandwidth

    args.bandwidth = measure_bandwidth(1 << 30, 5)  # before the server starts: the machine's, not the server's share
    sets = prompt_sets(args.prompts, 2, 2)
    prompts = sets["mixed"] + sets["copy"][1:]
    rows: list[dict] = []
    raw: dict = {}
    log_dir = Path("artifacts/pace-bench")
    log_dir.mkdir(parents=True, exist_ok=True)
    levels = [int(x) for x in args.levels.split(",")]
    for policy in args.policies.split(","):
        serve = ["--policy", policy, "--k", str(args.k), "--max-batch", str(max(levels))]
        if args.prefill_chunk is not None:
            serve += ["--prefill-chunk", str(args.prefill_chunk)]
        if args.model:
            serve = ["--model", args.model, *serve]
        server = LocalServer(f"pace-{policy}", serve, log_dir)
        server.start(600)
        try:
            model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
            asyncio.run(level(server.url, model, prompts, 1, 1, 16, lambda ci, i: ("off",)))  # warm-up
            for c in levels:
                per_client = args.per_client or max(1, 8 // c)
                # pairs: each prompt sent unpaced and paced back to back (the order alternating), so that both
                # modes meet the same load at the same time: gaps, first-token and end-to-end times
                before = metrics(server.url)
                recs, _ = asyncio.run(level(server.url, model, prompts, c, per_client, args.max_tokens,
                                            lambda ci, i: ("off", "auto") if (ci + i) % 2 == 0 else ("auto", "off")))
                after = metrics(server.url)
                sizes = round_sizes(before, after)
                ratios = pair_ratios(recs)
                # whole runs of one mode, alternated: what pacing costs the server's throughput, if anything
                walls = {"off": [], "auto": []}
                tokens = {"off": [], "auto": []}
                cpu = {"off": 0.0, "auto": 0.0}
                for rep in range(args.reps):
                    for pace in (("off", "auto") if rep % 2 == 0 else ("auto", "off")):
                        c0 = cpu_seconds(server.proc.pid)
                        got, wall = asyncio.run(level(server.url, model, prompts, c, per_client, args.max_tokens,
                                                      lambda ci, i, p=pace: (p,)))
                        cpu[pace] += cpu_seconds(server.proc.pid) - c0
                        walls[pace].append(wall)
                        tokens[pace].append(sum(r["tokens"] for r in got))
                rates = {p: [t / w for t, w in zip(tokens[p], walls[p])] for p in walls}
                tput = [a / o for a, o in zip(rates["auto"], rates["off"])]
                print(f"{policy} c={c}: pairs {len(ratios)}, E2E auto/off median {statistics.median(ratios):.3f}; "
                      f"throughput auto/off {', '.join(f'{x:.3f}' for x in tput)}", flush=True)
                for pace in ("off", "auto"):
                    rows.append({"policy": policy, "clients": c, "pace": pace,
                                 **summary([r for r in recs if r["pace"] == pace]),
                                 "throughput_tok_s": statistics.mean(rates[pace]),
                                 "e2e_pair_ratios": ratios, "throughput_ratios": tput,
                                 "cpu_ms_per_token": 1e3 * cpu[pace] / sum(tokens[pace]),
                                 "pace_tail_ms": _ms(hist_mean(before, after, "specdec:stream_pace_tail_seconds")),
                                 "pace_lag_ms": _ms(hist_mean(before, after, "specdec:stream_pace_lag_seconds")),
                                 "round_sizes": dict(sorted(sizes.items()))})
                    raw[f"{policy}/{c}/{pace}"] = [r for r in recs if r["pace"] == pace]
        finally:
            server.stop()
    write(args, rows, raw)
    return 0


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def write(args, rows: list[dict], raw: dict) -> None:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, "args": vars(args), "git": rev, "cpu": cpu},
                                                   indent=1))
    lines = [
        "# Paced streaming against unpaced, side by side (`scripts/pace_bench.py`)", "",
        f"- CPU: {cpu}, {os.cpu_count()} cores; git {rev}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"load average at the end {os.getloadavg()[0]:.2f}; read bandwidth "
        f"{args.bandwidth['read_GBps']:.1f} GB/s (torch sum over 1 GiB, median of 5, before the server started)",
        f"- the bundled model unless named ({args.model or 'SmolLM2-135M Q4_1'}), chat, greedy, up to "
        f"{args.max_tokens} tokens (most answers end sooner, at the end-of-sequence token), k <= {args.k}, max "
        f"batch {max(int(x) for x in args.levels.split(','))}; prompts prefilled "
        f"{args.prefill_chunk or PREFILL_CHUNK} tokens a step between decode rounds (--prefill-chunk); Spec-Bench "
        "prompts",
        f"- command: `.venv/bin/python scripts/pace_bench.py {' '.join(sys.argv[1:])}`", "",
        "Each level runs twice over. **Pairs**: every prompt is sent unpaced and paced back to back (the order "
        "alternating), so both modes meet the same load at the same moments; the gaps, first-token and end-to-end "
        "times below come from these. **Runs**: the level run whole in one mode, off and auto alternated "
        f"{args.reps} times each; throughput (completion tokens over wall time) comes from these.", "",
        "Gaps are between consecutive text chunks of a request: all of them, and after the first (the wait for the "
        "first round left out). Chunk sizes: paced, chunks per token (1.00: every chunk one token); unpaced, the "
        "round sizes the server counted during the pairs (a stream's chunk is its round's tokens).", "",
        "| policy | clients | pace | requests | gap p50 ms | gap p99 ms | p99/p50 | CV | p99/p50 after the first "
        "| CV after the first | tok/s (runs) | E2E s | TTFT s | chunks/token | tokens per chunk seen |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sizes = ("1 (every chunk one token)" if r["pace"] == "auto" and abs(r["chunks_per_token"] - 1) < 0.02
                 else ", ".join(f"{n}: {v}" for n, v in r["round_sizes"].items()) if r["pace"] == "off" else "-")
        lines.append(f"| {r['policy']} | {r['clients']} | {r['pace']} | {r['requests']} | {r['gap_p50_ms']:.1f} | "
                     f"{r['gap_p99_ms']:.1f} | {r['p99_over_p50']:.2f} | {r['gap_cv']:.2f} | "
                     f"{r['later_p99_over_p50']:.2f} | {r['later_gap_cv']:.2f} | {r['throughput_tok_s']:.1f} | "
                     f"{r['e2e_mean_s']:.2f} | {r['ttft_mean_s']:.3f} | {r['chunks_per_token']:.2f} | {sizes} |")
    lines += ["", "Paced against unpaced (auto / off): end-to-end time per prompt sent both ways (median and range "
              "over the pairs); what pacing added to a paced stream's end, measured by the server (its "
              "specdec:stream_pace_tail_seconds: from the engine's last token to the stream's last chunk), and how "
              "long a token waited in the buffer (stream_pace_lag_seconds, mean of streams' means); throughput per "
              "pair of alternated runs; the server's CPU time (user + system, all threads) per generated token in "
              "the runs.", "",
              "| policy | clients | p99/p50 off -> auto | E2E auto/off median (min-max, pairs) | pacing tail ms | "
              "buffer wait ms | throughput auto/off per run pair | CPU ms/token off -> auto |",
              "|---|---|---|---|---|---|---|---|"]
    by = {(r["policy"], r["clients"], r["pace"]): r for r in rows}
    for (policy, c, pace), r in by.items():
        if pace != "auto":
            continue
        o, e2e = by[(policy, c, "off")], r["e2e_pair_ratios"]
        lines.append(f"| {policy} | {c} | {o['p99_over_p50']:.2f} -> {r['p99_over_p50']:.2f} | "
                     f"{statistics.median(e2e):.3f} ({min(e2e):.3f}-{max(e2e):.3f}, {len(e2e)}) | "
                     f"{_num(r['pace_tail_ms'])} | {_num(r['pace_lag_ms'])} | "
                     f"{', '.join(f'{x:.3f}' for x in r['throughput_ratios'])} | "
                     f"{o['cpu_ms_per_token']:.2f} -> {r['cpu_ms_per_token']:.2f} |")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
