"""Chunked prefill, the last part of the serving benchmark (`specdec loadtest --servers`): does a long prompt
stall the streams already running? A server with policy never and --max-batch 8, once with --prefill-chunk 64
(the default) and once with 0 (whole prompts). Four clients stream long greedy answers; once all stream, one
request with a ~1,500-token prompt arrives. Reported: the four streams' inter-chunk gaps that overlap the window
from sending the long request to its first token (p50, p99, max), and that request's time to first token."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from specdec.bench.serving.serve_report import PrefillChunkRun, PrefillRun, PrefillTrial
from specdec.bench.serving.servers import BenchError, LocalServer, client, say
from specdec.bench.tables import num
from specdec.client import Completion, complete, run_async
from specdec.errors import SpecdecError
from specdec.measure import percentile


def chat_body(model: str, prompt: str, max_tokens: int, stream: bool = True) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0.0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def timed_stream(c: httpx.AsyncClient, url: str, body: dict, timeout_s: float,
                       started: asyncio.Event | None = None) -> Completion:
    """One streamed request; `started` is set at its first text chunk (or its end: a stream without text must
    not hang the wait). A failed request stops the benchmark."""
    r = await complete(c, url, body, timeout_s, on_text=started.set if started is not None else None)
    if started is not None:
        started.set()
    if not r.ok:
        raise BenchError(f"POST {url}: {r.error}")
    return r


def absolute(r: Completion) -> list[float]:
    """The chunks' arrival times on time.perf_counter's clock, comparable between requests."""
    return [r.sent_at + t for t in r.chunk_s]


def prompt_tokens(server: LocalServer, model: str, prompt: str) -> int:
    """usage.prompt_tokens the server reports for one chat message (a 1-token request; it also warms up)."""
    with client(300.0) as c:
        resp = c.post(server.url + "/v1/chat/completions", json=chat_body(model, prompt, 1, stream=False))
    if resp.status_code != 200:
        raise BenchError(f"server '{server.label}': HTTP {resp.status_code}: {resp.text[:300]}")
    return int(resp.json()["usage"]["prompt_tokens"])


def long_prompt(source: str, chars: int, tag: str) -> str:
    """A unique first line (no two requests share a prefix), Spec-Bench text cut to `chars`, an instruction."""
    return f"[{tag}]\n{source[:chars]}\n\nSummarize the text above in a few sentences."


def fit_long_prompt(server: LocalServer, model: str, source: str, target: int) -> tuple[int, int]:
    """The number of source characters whose prompt is about `target` tokens, by the server's count."""
    chars = min(len(source), target * 4)
    tokens = prompt_tokens(server, model, long_prompt(source, chars, "fit 0"))
    for i in range(1, 4):
        if abs(tokens - target) <= 0.02 * target or (chars == len(source) and tokens < target):
            break
        chars = min(len(source), int(chars * target / tokens))
        tokens = prompt_tokens(server, model, long_prompt(source, chars, f"fit {i}"))
    return chars, tokens


async def prefill_trial(server: LocalServer, model: str, long_text: str, background: list[str],
                        args) -> PrefillTrial:
    url = server.url + "/v1/chat/completions"
    limits = httpx.Limits(max_connections=len(background) + 1)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits, trust_env=False) as c:
        started = [asyncio.Event() for _ in background]
        streams = [asyncio.create_task(timed_stream(c, url, chat_body(model, p, args.prefill_stream_tokens),
                                                    args.timeout, ev)) for p, ev in zip(background, started)]
        try:
            await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)), 300)
            await asyncio.sleep(args.prefill_delay)
            long = await timed_stream(c, url, chat_body(model, long_text, 4), args.timeout)
            t_send = long.sent_at
            bg = await asyncio.gather(*streams)
        finally:
            for t in streams:
                t.cancel()
    if not long.chunk_s:
        raise BenchError(f"server '{server.label}': the long request streamed no text")
    t_first = absolute(long)[0]
    window, before = [], []
    for s in bg:
        times = absolute(s)
        for a, b in zip(times, times[1:]):
            if b > t_send and a < t_first:  # the gap overlaps [send, first token]
                window.append(b - a)
            elif b <= t_send:
                before.append(b - a)
    return PrefillTrial(long_prompt_tokens=long.prompt_tokens, long_ttft_s=t_first - t_send, window_s=t_first - t_send,
                        window_gaps_s=window, gaps_before_p50_s=percentile(before, 50),
                        streams_through_window=sum(bool(s.chunk_s) and absolute(s)[-1] >= t_first for s in bg),
                        stream_tokens=[s.tokens for s in bg])


def bench_prefill(texts: list[str], background: list[str], args, log_dir: Path) -> PrefillRun:
    from specdec.engine.scheduler import PREFILL_CHUNK

    source = "\n\n".join(texts)  # Spec-Bench summarization and rag first turns
    out = PrefillRun(args.long_prompt_tokens)
    chars = None
    for chunk in (PREFILL_CHUNK, 0):
        label = f"prefill-chunk-{chunk}"
        server = LocalServer(label, ["--model", "default", "--policy", "never", "--max-batch", "8",
                                     "--prefill-chunk", str(chunk)], log_dir)
        try:
            server.start(args.startup_timeout)
            model = server.model()
            if chars is None:
                chars, tokens = fit_long_prompt(server, model, source, args.long_prompt_tokens)
                out.long_prompt_chars = chars
                say(f"long prompt: {chars} characters, {tokens} tokens by the server's count", "serve-bench")
            else:
                prompt_tokens(server, model, long_prompt(source, chars, "warm-up"))  # the same warm-up
            trials = []
            for rep in range(args.prefill_reps):
                t = run_async(prefill_trial(server, model, long_prompt(source, chars, f"{label} #{rep}"),
                                            background, args))
                trials.append(t)
                gaps = t.window_gaps_s
                say(f"{label} #{rep}: long TTFT {t.long_ttft_s * 1e3:.0f} ms, {len(gaps)} gaps in the window, "
                    f"max {num(max(gaps, default=None), 1, 1e3)} ms, {t.streams_through_window}/{len(background)} "
                    "streams ran through it", "serve-bench")
            gaps = [g for t in trials for g in t.window_gaps_s]
            ttfts = [t.long_ttft_s for t in trials]
            out.runs[str(chunk)] = PrefillChunkRun(
                prefill_chunk=chunk, trials=trials, long_ttft_p50_s=percentile(ttfts, 50), long_ttft_max_s=max(ttfts),
                window_gaps=len(gaps), window_gap_p50_s=percentile(gaps, 50), window_gap_p99_s=percentile(gaps, 99),
                window_gap_max_s=max(gaps, default=None),
                gaps_before_p50_s=percentile([t.gaps_before_p50_s for t in trials
                                              if t.gaps_before_p50_s is not None], 50))
        except BenchError:
            raise
        except (SpecdecError, httpx.HTTPError) as e:
            raise server.failed(e) from None
        finally:
            server.stop()
            out.server_problems.extend(server.problems())
    return out

