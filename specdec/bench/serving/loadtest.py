"""`specdec loadtest`: throughput and latency of any OpenAI-compatible server (vLLM, llama-server, ours) under
concurrent clients.

A level of concurrency C runs C clients at once; each sends `requests_per_client` requests one after another, so
C requests are in flight until clients start to finish. Client c's request j asks prompt (c * requests_per_client
+ j) mod len(prompts). Per level, in seconds:
  TTFT        request start -> first chunk that carries text (non-streamed: the whole response, TTFT = E2E).
  ITL         gap between consecutive text chunks of one streamed response. A chunk may carry several tokens (a
              speculative server can send an accepted run at once): this is the latency between chunks.
  TPOT        (E2E - TTFT) / (tokens - 1) for each streamed request with >= 2 tokens; the level reports the mean.
  E2E         request start -> end of the response.
  throughput  completion tokens of the successful requests / wall time of the level (tokens per second).
Tokens are `usage.completion_tokens` of the response (streaming asks for it with stream_options.include_usage);
a stream without usage counts its text chunks instead, a non-streamed response without usage counts 0.
Percentiles interpolate linearly between order statistics (numpy's default), None where there is no data.
Proxy settings from the environment are ignored (trust_env=False): the server is measured directly.

This module runs the levels. The data it fills is in specdec.bench.serving.load_types, the tables and plot in
specdec.bench.serving.loadtest_report, the command line (which calls both) in specdec.bench.serving.loadtest_cli.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import httpx

from specdec.bench.serving.load_types import ENDPOINTS, MAX_ERRORS, LevelResult, LoadConfig, RequestResult
from specdec.client import RequestFailed, Unreachable, async_client, complete, first_model, run_async
from specdec.errors import SpecdecError
from specdec.measure import inter_token_latencies, mean, percentile, time_per_output_token, tokens_per_s

# ---- statistics ------------------------------------------------------------------------------------------------

def summarize(concurrency: int, records: Sequence[RequestResult], wall_s: float) -> LevelResult:
    ok = [r for r in records if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [g for r in ok for g in inter_token_latencies(r.chunk_s)]
    tpot = [time_per_output_token(r.tokens, r.e2e_s, r.ttft_s) for r in ok if r.chunk_s]
    tpot = [t for t in tpot if t is not None]
    e2e = [r.e2e_s for r in ok]
    tokens = sum(r.tokens for r in ok)
    pct = percentile
    return LevelResult(
        concurrency=concurrency, requests=len(records), failed=len(records) - len(ok), wall_s=wall_s,
        output_tokens=tokens, throughput_tok_s=tokens_per_s(tokens, wall_s),
        ttft_p50_s=pct(ttft, 50), ttft_p99_s=pct(ttft, 99), itl_p50_s=pct(itl, 50), itl_p99_s=pct(itl, 99),
        tpot_mean_s=mean(tpot), e2e_p50_s=pct(e2e, 50), e2e_p99_s=pct(e2e, 99),
        errors=[r.error for r in records if not r.ok and r.error][:MAX_ERRORS])


# ---- one request ----------------------------------------------------------------------------------------------

def request_body(cfg: LoadConfig, prompt: str | list[dict]) -> dict:
    """The request for one prompt: a string (one user message, or the raw prompt of /v1/completions) or, for
    chat, the whole conversation as a list of messages."""
    body: dict = {"model": cfg.model, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
                  "stream": cfg.stream}
    if cfg.endpoint == "chat":
        body["messages"] = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list):
        raise SpecdecError("a conversation needs the chat endpoint")
    else:
        body["prompt"] = prompt
    if cfg.stream:
        body["stream_options"] = {"include_usage": True}
    if cfg.seed is not None:
        body["seed"] = cfg.seed
    return body


async def send(client: httpx.AsyncClient, cfg: LoadConfig, url: str, prompt: str | list[dict]) -> RequestResult:
    """One timed request; failures (HTTP errors, transport errors, timeouts) are recorded, never raised."""
    return await complete(client, url, request_body(cfg, prompt), cfg.timeout_s)


# ---- levels ----------------------------------------------------------------------------------------------------

def http_client(cfg: LoadConfig, connections: int) -> httpx.AsyncClient:
    return async_client(cfg.api_key, cfg.timeout_s, connections)


async def resolve_model(cfg: LoadConfig) -> str:
    """cfg.model, or the first model id the server lists at GET /v1/models."""
    if cfg.model is not None:
        return cfg.model
    url = cfg.api_base + "/models"
    async with http_client(cfg, 1) as client:
        try:
            model = await first_model(client, cfg.api_base)
        except Unreachable as e:
            raise SpecdecError(f"cannot reach {url}: {e}") from None
        except RequestFailed as e:
            raise SpecdecError(f"GET {url}: {e}") from None
    if model is None:
        raise SpecdecError(f"GET {url}: no model id in the answer; name one with --model")
    return model


async def run_level(cfg: LoadConfig, prompts: list[str], concurrency: int) -> LevelResult:
    """`concurrency` clients at once, each sending cfg.requests_per_client requests in turn. Raises SpecdecError
    when every request failed."""
    if concurrency < 1:
        raise SpecdecError(f"concurrency must be >= 1, got {concurrency}")
    if not prompts:
        raise SpecdecError("no prompts to send")
    cfg = replace(cfg, model=await resolve_model(cfg))
    url = cfg.api_base + ENDPOINTS[cfg.endpoint]
    n = cfg.requests_per_client
    records: list[RequestResult] = []  # in order of completion

    async def client_task(c: int) -> None:
        for j in range(n):
            records.append(await send(client, cfg, url, prompts[(c * n + j) % len(prompts)]))

    async with http_client(cfg, concurrency) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(client_task(c) for c in range(concurrency)))
        wall_s = time.perf_counter() - t0
    result = summarize(concurrency, records, wall_s)
    if result.failed == result.requests:
        raise SpecdecError(f"all {result.requests} requests failed at concurrency {concurrency} ({url}): "
                           f"{result.errors[0] if result.errors else 'no error message'}")
    return result


def run(cfg: LoadConfig, prompts: list[str],
        progress: Callable[[LevelResult], None] | None = None) -> list[LevelResult]:
    """Every level of cfg.concurrency, in order (the model is resolved once, before the first)."""
    cfg = replace(cfg, model=run_async(resolve_model(cfg)))
    results = []
    for c in cfg.concurrency:
        results.append(run_async(run_level(cfg, prompts, c)))
        if progress:
            progress(results[-1])
    return results
