"""`specdec bench --endpoint URL [--baseline URL]`: the Spec-Bench report against any OpenAI-compatible server.

Requests go through specdec.client, as `specdec loadtest`'s do (streaming, the server's own chat template), at
each level of concurrency C: C clients take the prompts from one queue, each asking a prompt's turns one after
another (turn t after the server's own answers). With a baseline (the same model with speculation off) the two
servers take turns: at C = 1 prompt by prompt, rotating which goes first, as the local bench does; at C > 1 the
whole list one server after the other, the order alternating per level. Each method "endpoint c=C" is measured against
"baseline c=C" on the same prompts, so the speedup per category and per level is the batch-crossover curve of
that deployment.

Acceptance is read where the server exposes it: the counters at /metrics before and after (ours
`specdec:spec_decode_*`, vLLM's `vllm:spec_decode_*`; at C = 1 around every request, so per category too),
SGLang's `sglang:spec_accept_rate` gauge after the run, llama-server's per-response `timings.draft_n` and
`draft_n_accepted`. Tokens per pass are seen as tokens per streamed chunk (a server sends a pass's tokens at
once); the output is compared as text.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, replace

import httpx

from specdec.bench.prompts import Prompt
from specdec.bench.runner import Method, Sample, Turn
from specdec.bench.serving import loadtest
from specdec.bench.serving.load_types import ENDPOINTS, LoadConfig, RequestResult
from specdec.client import counted, parse_prometheus, run_async
from specdec.client import scrape as scrape_text
from specdec.errors import SpecdecError

GAUGES = ("sglang:spec_accept_rate", "sglang:spec_accept_length")


async def scrape(client: httpx.AsyncClient, cfg: LoadConfig) -> dict[str, float]:
    """The server's /metrics (at the root, beside /v1); {} where it has none."""
    text = await scrape_text(client, cfg.api_base.removesuffix("/v1"))
    return parse_prometheus(text) if text is not None else {}


def _turn(rec: RequestResult, acceptance: tuple[int, int, int] | None) -> Turn:
    drafted = accepted = None
    if rec.timings and "draft_n" in rec.timings:  # llama-server, per response
        drafted, accepted = int(rec.timings["draft_n"]), int(rec.timings.get("draft_n_accepted", 0))
    elif acceptance is not None:
        drafted, accepted = acceptance[0], acceptance[1]
    ttft = rec.ttft_s if rec.ttft_s is not None else rec.e2e_s  # an empty answer: its end is its first token
    return Turn([], [], rec.text, rec.finish or "stop", rec.e2e_s, ttft, list(rec.chunk_s),
                completion_tokens=rec.tokens, prompt_tokens=rec.prompt_tokens, drafted=drafted, accepted=accepted)


async def _run_prompt(client, cfg: LoadConfig, prompt: Prompt, per_request_counters: bool, records: list):
    """All turns of one prompt; None when a request failed (its error is in records)."""
    url = cfg.api_base + ENDPOINTS["chat"]
    messages, turns = [], []
    for user in prompt.turns:
        messages.append({"role": "user", "content": user})
        before = await scrape(client, cfg) if per_request_counters else None
        rec = await loadtest.send(client, cfg, url, list(messages))
        records.append(rec)
        if not rec.ok:
            return None
        acceptance = counted(before, await scrape(client, cfg)) if per_request_counters else None
        turns.append(_turn(rec, acceptance))
        messages.append({"role": "assistant", "content": rec.text})
    return turns


async def run_block(cfg: LoadConfig, prompts: list[Prompt], concurrency: int, name: str) -> dict:
    """The prompts through one server with `concurrency` clients: samples, request records, wall time and the
    counters' difference over the block."""
    queue = list(reversed(prompts))
    samples, records = [], []

    async def worker() -> None:
        while queue:
            p = queue.pop()
            turns = await _run_prompt(client, cfg, p, concurrency == 1, records)
            if turns is not None:
                samples.append(Sample(p.qid, p.category, name, turns))

    async with loadtest.http_client(cfg, concurrency + 1) as client:
        before = await scrape(client, cfg)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
        after = await scrape(client, cfg)
    return {"samples": samples, "records": records, "wall_s": wall, "counters": counted(before, after),
            "gauges": {g: after[g] for g in GAUGES if g in after}}


def run_endpoints(cfg: LoadConfig, baseline: LoadConfig | None, prompts: list[Prompt], progress=None) -> dict:
    """Every level of cfg.concurrency through the endpoint (and the baseline): samples, methods, and per level
    and server the loadtest summary, counters and gauges."""
    servers = {"endpoint": cfg} | ({"baseline": baseline} if baseline else {})
    servers = {k: replace(c, model=run_async(loadtest.resolve_model(c))) for k, c in servers.items()}
    samples, methods, levels = [], [], []
    for i, c in enumerate(cfg.concurrency):
        names = {k: f"{k} c={c}" for k in servers}
        blocks = [[p] for p in prompts] if c == 1 else [prompts]
        acc = {k: {"samples": [], "records": [], "wall_s": 0.0, "counters": [0, 0, 0], "seen": False, "gauges": {}}
               for k in servers}
        for j, block in enumerate(blocks):
            order = list(servers)
            if (j if c == 1 else i) % 2:
                order.reverse()
            for k in order:
                r = run_async(run_block(servers[k], block, c, names[k]))
                a = acc[k]
                a["samples"] += r["samples"]
                a["records"] += r["records"]
                a["wall_s"] += r["wall_s"]
                a["gauges"] = r["gauges"] or a["gauges"]
                if r["counters"] is not None:
                    a["seen"] = True
                    a["counters"] = [x + y for x, y in zip(a["counters"], r["counters"])]
            if progress:
                progress(c, j + 1, len(blocks))
        done = set.intersection(*({s.qid for s in a["samples"]} for a in acc.values()))
        level = {"concurrency": c}
        for k, a in acc.items():
            samples += [s for s in a["samples"] if s.qid in done]
            summary = loadtest.summarize(c, a["records"], a["wall_s"])
            if summary.failed == summary.requests:
                raise SpecdecError(f"{k} ({servers[k].url}): all {summary.requests} requests failed at concurrency "
                                   f"{c}: {summary.errors[0] if summary.errors else 'no error message'}")
            d, acc_n, n = a["counters"]
            level[k] = {"load": asdict(summary), "gauges": a["gauges"],
                        "counters": {"drafted": d, "accepted": acc_n, "drafts": n} if a["seen"] else None}
        levels.append(level)
        methods.append(Method(names["endpoint"], None, "endpoint", names.get("baseline"), None))
        if baseline:
            methods.append(Method(names["baseline"], None, "endpoint"))
    return {"samples": samples, "methods": methods, "levels": levels,
            "servers": {k: {"url": s.url, "model": s.model} for k, s in servers.items()}}


def round_cost(levels: list[dict], samples: list[Sample]) -> dict:
    """One point of the deployment's cost curve, measured at C = 1, where every streamed chunk is one pass:
    the speculative run's P chunk gaps, D of them rounds that drafted (the server's counters), took S seconds;
    the others cost a plain step T1 (the baseline's mean chunk gap). A drafting round (drafting and a verify
    pass over n = drafted/D + 1 rows) then costs T = (S - (P - D) T1) / D, that is T/T1 passes. Readable by
    `specdec plan --profile` as {"verify_cost": {1: 1, n: T/T1}}; the draft cost is inside it, so plan with
    --draft-cost 0. Where it cannot be measured: {"why": the reason}."""
    level = next((lv for lv in levels if lv["concurrency"] == 1 and "baseline" in lv), None)
    if level is None:
        return {"why": "it is measured at concurrency 1 against a --baseline, and this run had no such level"}
    counters = level["endpoint"]["counters"]
    if not counters or not counters["drafts"]:
        return {"why": "the endpoint's /metrics showed no drafts"}

    def gaps(name: str) -> tuple[float, int]:
        turns = [t for s in samples if s.method == name for t in s.turns if len(t.token_times) > 1]
        return sum(t.token_times[-1] - t.token_times[0] for t in turns), sum(len(t.token_times) - 1 for t in turns)

    (spec_s, passes), (plain_s, plain_passes) = gaps("endpoint c=1"), gaps("baseline c=1")
    drafts = counters["drafts"]
    if not plain_passes or not passes:
        return {"why": "no answer streamed more than one chunk"}
    if drafts > passes:  # a busy server merges steps' tokens into one chunk
        return {"why": f"the endpoint counted {drafts} drafting rounds in {passes} streamed chunks: chunks are not "
                       "passes here (a busy machine?)"}
    step = plain_s / plain_passes
    round_s = (spec_s - (passes - drafts) * step) / drafts
    note = None
    if round_s < step:  # a pass over more rows costs at least a one-row pass: less is the timings' noise
        note = (f"measured {max(round_s, 0.0) * 1e3:.1f} ms, less than a plain step: the timings are noisy (a busy "
                "machine?), and the round is taken to cost one plain step")
        round_s = step
    rows = round(counters["drafted"] / drafts) + 1
    return {"rows": rows, "round_s": round_s, "plain_step_s": step, "cost": round_s / step, "passes": passes,
            "drafting_rounds": drafts, "verify_cost": {"1": 1.0, str(rows): round_s / step}, "note": note}
