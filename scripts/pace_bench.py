"""Paced against unpaced streaming, side by side on one server: the same Spec-Bench prompts at 1, 4 and 16
clients, each level run with stream_options.pace "off" and "auto" alternately (reps times each, the order
swapped every rep), under --policy always and auto.

Per mode, pooled over its requests: the inter-chunk gap's p50, p99, p99/p50 and coefficient of variation (every
gap after the first chunk, the first round's wait included); tokens per second over the level's wall time; mean
end-to-end and first-token time per request; text chunks per completion token; and the chunk sizes an observer
of the stream sees: paced, one token a chunk when chunks equal tokens; unpaced, the round sizes the server
counted (specdec:tokens_per_round: a stream's chunk is its round's tokens).

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

from specdec.bench.servers import LocalServer  # noqa: E402
from specdec.bench.serve_bench import prompt_sets  # noqa: E402
from specdec.client import prometheus_series  # noqa: E402

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
                pace: str) -> tuple[list[dict], float]:
    queue = list(prompts[: clients * per_client])
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients + 2)) as client:
        async def worker(c: int) -> list[dict]:
            out = []
            for i in range(per_client):
                out.append(await one(client, url, model, queue[(c * per_client + i) % len(queue)], max_tokens, pace))
            return out

        t0 = time.perf_counter()
        results = await asyncio.gather(*(worker(c) for c in range(clients)))
        return [r for rs in results for r in rs], time.perf_counter() - t0


def summary(records: list[dict], walls: list[float]) -> dict:
    gaps = [b[0] - a[0] for r in records for a, b in zip(r["chunks"], r["chunks"][1:])]
    s = sorted(gaps)
    p50, p99 = s[len(s) // 2], s[min(len(s) - 1, int(0.99 * len(s)))]
    tokens = sum(r["tokens"] for r in records)
    return {"requests": len(records), "tokens": tokens, "gap_p50_ms": p50 * 1e3, "gap_p99_ms": p99 * 1e3,
            "p99_over_p50": p99 / p50 if p50 > 0 else None,
            "gap_cv": statistics.pstdev(gaps) / statistics.mean(gaps) if gaps else None,
            "throughput_tok_s": tokens / sum(walls), "e2e_mean_s": statistics.mean(r["e2e"] for r in records),
            "ttft_mean_s": statistics.mean(r["chunks"][0][0] for r in records if r["chunks"]),
            "chunks_per_token": sum(len(r["chunks"]) for r in records) / tokens,
            "distinct_chunk_bytes": len({b for r in records for _, b in r["chunks"]})}


def round_sizes(before: dict, after: dict) -> dict[int, int]:
    """Rounds by tokens emitted (the unpaced chunk sizes), from the tokens_per_round histogram's delta."""
    cum = {}
    for n in range(1, 18):
        key = f'specdec:tokens_per_round_bucket{{le="{float(n)}"}}'
        cum[n] = after.get(key, 0.0) - before.get(key, 0.0)
    return {n: int(cum[n] - cum.get(n - 1, 0.0)) for n in cum if cum[n] - cum.get(n - 1, 0.0) > 0}


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
    args = ap.parse_args()
    sets = prompt_sets(args.prompts, 2, 2)
    prompts = sets["mixed"] + sets["copy"][1:]
    rows, raw = [], {}
    log_dir = Path("artifacts/pace-bench")
    log_dir.mkdir(parents=True, exist_ok=True)
    levels = [int(x) for x in args.levels.split(",")]
    for policy in args.policies.split(","):
        serve = ["--policy", policy, "--k", str(args.k), "--max-batch", str(max(levels))]
        if args.model:
            serve = ["--model", args.model, *serve]
        server = LocalServer(f"pace-{policy}", serve, log_dir)
        server.start(600)
        try:
            model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
            asyncio.run(level(server.url, model, prompts, 1, 1, 16, "off"))  # warm-up
            for c in levels:
                per_client = args.per_client or max(1, 8 // c)
                got = {"off": ([], [], {}), "auto": ([], [], {})}
                for rep in range(args.reps):
                    for pace in (("off", "auto") if rep % 2 == 0 else ("auto", "off")):
                        before = metrics(server.url)
                        recs, wall = asyncio.run(level(server.url, model, prompts[rep:] + prompts[:rep], c,
                                                       per_client, args.max_tokens, pace))
                        sizes = round_sizes(before, metrics(server.url))
                        got[pace][0].extend(recs)
                        got[pace][1].append(wall)
                        for n, v in sizes.items():
                            got[pace][2][n] = got[pace][2].get(n, 0) + v
                        print(f"{policy} c={c} rep {rep} {pace}: {sum(r['tokens'] for r in recs)} tokens "
                              f"in {wall:.1f} s", flush=True)
                for pace in ("off", "auto"):
                    s = summary(got[pace][0], got[pace][1])
                    rows.append({"policy": policy, "clients": c, "pace": pace, **s,
                                 "round_sizes": dict(sorted(got[pace][2].items()))})
                    raw[f"{policy}/{c}/{pace}"] = got[pace][0]
        finally:
            server.stop()
    write(args, rows, raw)
    return 0


def write(args, rows: list[dict], raw: dict) -> None:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, "args": vars(args)}, indent=1))
    lines = [
        "# Paced streaming against unpaced, side by side (`scripts/pace_bench.py`)", "",
        f"- CPU: {cpu}, {os.cpu_count()} cores; git {rev}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"load average at the end {os.getloadavg()[0]:.2f}",
        f"- the bundled model unless named ({args.model or 'SmolLM2-135M Q4_1'}), chat, greedy, up to "
        f"{args.max_tokens} tokens, k <= {args.k}, max batch {max(int(x) for x in args.levels.split(','))}; "
        f"Spec-Bench prompts; each level run {args.reps} times per mode, off and auto alternated",
        f"- command: `.venv/bin/python scripts/pace_bench.py {' '.join(sys.argv[1:])}`", "",
        "Gaps are between consecutive text chunks of a request (the first round's wait included). Throughput: "
        "completion tokens over the levels' wall time; E2E: mean per request. Chunk sizes: paced, chunks per "
        "token (1.00: every chunk one token); unpaced, the round sizes the server counted (a stream's chunk is "
        "its round's tokens).", "",
        "| policy | clients | pace | requests | gap p50 ms | gap p99 ms | p99/p50 | gap CV | tok/s | "
        "E2E s | TTFT s | chunks/token | tokens per chunk seen |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sizes = ("1 (every chunk one token)" if r["pace"] == "auto" and abs(r["chunks_per_token"] - 1) < 0.02
                 else ", ".join(f"{n}: {v}" for n, v in r["round_sizes"].items()) if r["pace"] == "off" else "-")
        lines.append(f"| {r['policy']} | {r['clients']} | {r['pace']} | {r['requests']} | {r['gap_p50_ms']:.1f} | "
                     f"{r['gap_p99_ms']:.1f} | {r['p99_over_p50']:.2f} | {r['gap_cv']:.2f} | "
                     f"{r['throughput_tok_s']:.1f} | {r['e2e_mean_s']:.2f} | {r['ttft_mean_s']:.3f} | "
                     f"{r['chunks_per_token']:.2f} | {sizes} |")
    lines += ["", "Paced against unpaced, per level (auto / off):", "",
              "| policy | clients | p99/p50 off -> auto | throughput | mean E2E |", "|---|---|---|---|---|"]
    by = {(r["policy"], r["clients"], r["pace"]): r for r in rows}
    for (policy, c, pace), r in by.items():
        if pace != "auto":
            continue
        o = by[(policy, c, "off")]
        lines.append(f"| {policy} | {c} | {o['p99_over_p50']:.2f} -> {r['p99_over_p50']:.2f} | "
                     f"{r['throughput_tok_s'] / o['throughput_tok_s']:.3f}x | {r['e2e_mean_s'] / o['e2e_mean_s']:.3f}x |")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
