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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx

from specdec import measure
from specdec.bench import render
from specdec.errors import SpecdecError
from specdec.inputs import AT_LEAST_1, NON_NEGATIVE, POSITIVE, SEED

ENDPOINTS = {"chat": "/chat/completions", "completions": "/completions"}  # paths under the /v1 base
MAX_ERRORS = 5  # error strings kept per level
CONNECT_TIMEOUT_S = 10.0  # at most; never more than LoadConfig.timeout_s


@dataclass(frozen=True)
class LoadConfig:
    url: str  # server base URL, e.g. http://127.0.0.1:8000; '/v1' is appended unless the URL ends with it
    concurrency: tuple[int, ...]  # the levels, run in this order: clients sending at once
    requests_per_client: int = 3  # sent one after another by each client
    max_tokens: int = 64  # completion tokens asked per request
    temperature: float = 0.0
    stream: bool = True  # SSE streaming; without it TTFT = E2E and there is no ITL or TPOT
    api_key: str | None = None  # sent as 'Authorization: Bearer KEY'
    model: str | None = None  # None: the first id that GET /v1/models lists
    endpoint: str = "chat"  # "chat": /v1/chat/completions, one user message; "completions": /v1/completions
    timeout_s: float = 300.0  # per request, the whole response included
    seed: int | None = None  # sent as 'seed' when set

    def __post_init__(self) -> None:
        object.__setattr__(self, "concurrency", tuple(self.concurrency))
        if not self.url.startswith(("http://", "https://")):
            raise SpecdecError(f"--url must start with http:// or https://, got {self.url!r}")
        if not self.concurrency or not all(isinstance(c, int) and c >= 1 for c in self.concurrency):
            raise SpecdecError(f"concurrency levels must be integers >= 1, got {list(self.concurrency)}")
        if self.requests_per_client < 1:
            raise SpecdecError(f"--requests-per-client must be >= 1, got {self.requests_per_client}")
        if self.max_tokens < 1:
            raise SpecdecError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if not self.temperature >= 0:
            raise SpecdecError(f"--temperature must be >= 0, got {self.temperature}")
        if self.endpoint not in ENDPOINTS:
            raise SpecdecError(f"--endpoint must be one of {', '.join(ENDPOINTS)}, got {self.endpoint!r}")
        if not self.timeout_s > 0:
            raise SpecdecError(f"--timeout must be > 0 seconds, got {self.timeout_s}")

    @property
    def api_base(self) -> str:
        base = self.url.rstrip("/")
        return base if base.endswith("/v1") else base + "/v1"


@dataclass
class RequestResult:
    ok: bool = False
    status: int | None = None  # HTTP status; None when no response came
    error: str | None = None  # one line, for a failed request
    e2e_s: float = 0.0
    ttft_s: float | None = None  # None when no text arrived
    chunk_s: list[float] = field(default_factory=list)  # arrival of each streamed text chunk, s after start
    tokens: int = 0  # completion tokens
    text: str = ""  # the completion, all chunks joined
    finish: str | None = None  # the last finish_reason the server sent
    prompt_tokens: int | None = None  # usage.prompt_tokens, where the server sends usage
    timings: dict | None = None  # llama-server's per-response 'timings' (draft_n, draft_n_accepted), if sent


@dataclass
class LevelResult:
    concurrency: int
    requests: int  # sent
    failed: int
    wall_s: float  # first request sent -> last response done
    output_tokens: int  # completion tokens of the successful requests
    throughput_tok_s: float  # output_tokens / wall_s
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    tpot_mean_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    errors: list[str]  # the first MAX_ERRORS error strings, in order of completion


# ---- statistics ------------------------------------------------------------------------------------------------

def summarize(concurrency: int, records: Sequence[RequestResult], wall_s: float) -> LevelResult:
    ok = [r for r in records if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [g for r in ok for g in measure.inter_token_latencies(r.chunk_s)]
    tpot = [measure.time_per_output_token(r.tokens, r.e2e_s, r.ttft_s) for r in ok if r.chunk_s]
    tpot = [t for t in tpot if t is not None]
    e2e = [r.e2e_s for r in ok]
    tokens = sum(r.tokens for r in ok)
    pct = measure.percentile
    return LevelResult(
        concurrency=concurrency, requests=len(records), failed=len(records) - len(ok), wall_s=wall_s,
        output_tokens=tokens, throughput_tok_s=measure.tokens_per_s(tokens, wall_s),
        ttft_p50_s=pct(ttft, 50), ttft_p99_s=pct(ttft, 99), itl_p50_s=pct(itl, 50), itl_p99_s=pct(itl, 99),
        tpot_mean_s=measure.mean(tpot), e2e_p50_s=pct(e2e, 50), e2e_p99_s=pct(e2e, 99),
        errors=[r.error for r in records if not r.ok and r.error][:MAX_ERRORS])


# ---- one request -----------------------------------------------------------------------------------------------

class RequestFailed(Exception):
    """A request that got an answer, but an error (its message is one line)."""


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _describe(e: BaseException) -> str:
    return _one_line(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)


def http_error(status: int, body: str) -> str:
    """'HTTP 500: message', the message taken from an OpenAI-style error object when there is one."""
    message = body
    try:
        obj = json.loads(body)
        err = obj.get("error", obj.get("detail")) if isinstance(obj, dict) else None
        message = err.get("message", err) if isinstance(err, dict) else err or body
    except ValueError:
        pass
    return f"HTTP {status}: {_one_line(message) or '(empty body)'}"


def _load_json(text: str) -> dict:
    try:
        obj = json.loads(text)
    except ValueError:
        raise RequestFailed(f"not JSON: {_one_line(text, 80)!r}") from None
    if not isinstance(obj, dict):
        raise RequestFailed(f"expected a JSON object, got {_one_line(text, 80)!r}")
    if obj.get("error"):
        err = obj["error"]
        raise RequestFailed(f"server error: {_one_line(err.get('message', err) if isinstance(err, dict) else err)}")
    return obj


def _text_of(obj: dict) -> str:
    """The text a completion object (or a streamed chunk of one) carries, over all choices."""
    out = []
    for choice in obj.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        if isinstance(choice.get("text"), str):  # /v1/completions
            out.append(choice["text"])
        part = choice.get("delta") or choice.get("message")  # chat: streamed delta, or the whole message
        if isinstance(part, dict):
            out += [part[k] for k in ("content", "reasoning_content", "reasoning") if isinstance(part.get(k), str)]
    return "".join(out)


def _usage_tokens(obj: dict, key: str = "completion_tokens") -> int | None:
    usage = obj.get("usage")
    n = usage.get(key) if isinstance(usage, dict) else None
    return n if isinstance(n, int) else None


def _note_extras(obj: dict, rec: RequestResult) -> None:
    """finish_reason, usage.prompt_tokens and llama-server's 'timings' of a response or chunk, where present."""
    for choice in obj.get("choices") or []:
        if isinstance(choice, dict) and choice.get("finish_reason"):
            rec.finish = str(choice["finish_reason"])
    n = _usage_tokens(obj, "prompt_tokens")
    rec.prompt_tokens = n if n is not None else rec.prompt_tokens
    if isinstance(obj.get("timings"), dict):
        rec.timings = obj["timings"]


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


async def _exchange(client: httpx.AsyncClient, url: str, body: dict, t0: float, rec: RequestResult) -> None:
    """Send one request and fill rec (status, chunk times, tokens); raises RequestFailed on an error answer."""
    if not body["stream"]:
        resp = await client.post(url, json=body)
        rec.status = resp.status_code
        if resp.status_code != 200:
            raise RequestFailed(http_error(resp.status_code, resp.text))
        obj = _load_json(resp.text)
        rec.tokens, rec.text = _usage_tokens(obj) or 0, _text_of(obj)
        _note_extras(obj, rec)
        return
    async with client.stream("POST", url, json=body) as resp:
        rec.status = resp.status_code
        if resp.status_code != 200:
            raise RequestFailed(http_error(resp.status_code, (await resp.aread()).decode(errors="replace")))
        usage = None
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):  # blank separators, ': keep-alive' comments, 'event:' lines
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                break
            obj = _load_json(data)
            text = _text_of(obj)
            if text:
                rec.chunk_s.append(time.perf_counter() - t0)
                rec.text += text
            _note_extras(obj, rec)
            n = _usage_tokens(obj)
            usage = n if n is not None else usage
    rec.tokens = usage if usage is not None else len(rec.chunk_s)
    rec.ttft_s = rec.chunk_s[0] if rec.chunk_s else None


async def send(client: httpx.AsyncClient, cfg: LoadConfig, url: str, prompt: str | list[dict]) -> RequestResult:
    """One timed request; failures (HTTP errors, transport errors, timeouts) are recorded, never raised."""
    rec = RequestResult()
    t0 = time.perf_counter()
    try:
        await asyncio.wait_for(_exchange(client, url, request_body(cfg, prompt), t0, rec), cfg.timeout_s)
        rec.ok = True
    except RequestFailed as e:
        rec.error = str(e)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        rec.error = f"timed out after {cfg.timeout_s:g} s"
    except httpx.HTTPError as e:
        rec.error = _describe(e)
    rec.e2e_s = time.perf_counter() - t0
    if rec.ok and not cfg.stream:
        rec.ttft_s = rec.e2e_s
    return rec


# ---- levels ----------------------------------------------------------------------------------------------------

def http_client(cfg: LoadConfig, connections: int) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    timeout = httpx.Timeout(cfg.timeout_s, connect=min(cfg.timeout_s, CONNECT_TIMEOUT_S))
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits, trust_env=False)


async def resolve_model(cfg: LoadConfig) -> str:
    """cfg.model, or the first model id the server lists at GET /v1/models."""
    if cfg.model is not None:
        return cfg.model
    url = cfg.api_base + "/models"
    async with http_client(cfg, 1) as client:
        try:
            resp = await client.get(url)
        except httpx.HTTPError as e:
            raise SpecdecError(f"cannot reach {url}: {_describe(e)}") from None
    if resp.status_code != 200:
        raise SpecdecError(f"GET {url}: {http_error(resp.status_code, resp.text)}")
    try:
        return str(resp.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise SpecdecError(f"GET {url}: no model id in the answer; name one with --model") from None


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


def run_async(coro):
    """asyncio.run, also from a thread that already runs an event loop (a notebook): then in a fresh thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


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


# ---- reports ---------------------------------------------------------------------------------------------------

HEADER = ("concurrency", "requests", "failed", "tokens", "tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)", "ITL p50 (ms)",
          "ITL p99 (ms)", "TPOT mean (ms)", "E2E p50 (s)", "E2E p99 (s)")


def _cells(r: LevelResult) -> list[str]:
    ms = [render.f(v, 1, 1e3) for v in (r.ttft_p50_s, r.ttft_p99_s, r.itl_p50_s, r.itl_p99_s, r.tpot_mean_s)]
    return ([str(r.concurrency), str(r.requests), str(r.failed), str(r.output_tokens), f"{r.throughput_tok_s:.1f}"]
            + ms + [render.f(r.e2e_p50_s), render.f(r.e2e_p99_s)])


def _table(series: dict[str, list[LevelResult]], labelled: bool) -> str:
    head = (["run"] if labelled else []) + list(HEADER)
    rows, errors = [], []
    for label, results in series.items():
        for r in results:
            rows.append(([label] if labelled else []) + _cells(r))
            errors += [f"- {label + ', ' if labelled else ''}concurrency {r.concurrency}: {e}" for e in r.errors]
    text = render.table(head, rows)
    if errors:
        text += "\n\nErrors (the first few per level):\n\n" + "\n".join(errors)
    return text + "\n"


def markdown_series(series: dict[str, list[LevelResult]]) -> str:
    """One table, a row per (run, level), the run's label in the first column."""
    return _table(series, labelled=True)


def markdown(results: list[LevelResult]) -> str:
    return _table({"": results}, labelled=False)


LATENCY_LINES = (("ttft_p50_s", "TTFT p50", "-", "o"), ("ttft_p99_s", "TTFT p99", "--", "o"),
                 ("itl_p50_s", "ITL p50", "-", "s"), ("itl_p99_s", "ITL p99", "--", "s"))  # key, name, style, marker


def plot_series(series: dict[str, list[LevelResult]], path: str | Path) -> None:
    """Two panels against concurrency: output throughput, and TTFT/ITL p50/p99 (ms, log scale). One colour per
    run, one line style per latency."""
    from matplotlib.lines import Line2D

    from specdec.theory.plots import pyplot, save

    plt = pyplot()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=110)
    levels, positive = set(), False
    for i, (label, results) in enumerate(series.items()):
        color = colors[i % len(colors)]
        xs = [r.concurrency for r in results]
        levels.update(xs)
        ax_t.plot(xs, [r.throughput_tok_s for r in results], marker="o", color=color, label=label or None)
        for key, _, style, marker in LATENCY_LINES:
            ys = [getattr(r, key) for r in results]
            ys = [y * 1e3 if y is not None and y > 0 else math.nan for y in ys]  # ms; gaps where none
            positive = positive or any(not math.isnan(y) for y in ys)
            ax_l.plot(xs, ys, ls=style, marker=marker, ms=4, color=color)
    for ax in (ax_t, ax_l):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(levels), [str(c) for c in sorted(levels)])
        ax.set_xlabel("concurrent clients")
        ax.grid(alpha=0.3)
    if positive:
        ax_l.set_yscale("log")
    ax_t.set_ylim(bottom=0)
    ax_t.set_ylabel("output tokens / s")
    ax_t.set_title("Throughput")
    ax_l.set_ylabel("ms")
    ax_l.set_title("Latency: time to first token, inter-chunk latency")
    if any(series):
        ax_t.legend(fontsize=8, loc="best")
    ax_l.legend(handles=[Line2D([], [], color="gray", ls=style, marker=marker, label=name)
                         for _, name, style, marker in LATENCY_LINES], fontsize=8, loc="best")
    fig.tight_layout()
    save(fig, path)


def plot(results: list[LevelResult], path: str | Path) -> None:
    plot_series({"": results}, path)


def to_json(results: list[LevelResult], config: LoadConfig | None = None) -> dict:
    """The levels (and the configuration, API key left out) as plain JSON values."""
    out: dict = {"levels": [asdict(r) for r in results]}
    if config is not None:
        out["config"] = {**asdict(config), "api_key": "(set)" if config.api_key else None}
    return out


# ---- command line ----------------------------------------------------------------------------------------------

def register(sub) -> None:
    p = sub.add_parser("loadtest", help="throughput and latency of an OpenAI-compatible server under load")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000 ('/v1' is added)")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="comma-separated client counts, one level each")
    p.add_argument("--prompts", required=True, metavar="FILE.jsonl",
                   help="Spec-Bench question.jsonl (first turns are sent), or JSONL lines of {\"prompt\": ...}")
    p.add_argument("--requests-per-client", type=int, default=3, metavar="N", action=AT_LEAST_1,
                   help="sent one after another")
    p.add_argument("--max-tokens", type=int, default=64, metavar="N", action=AT_LEAST_1)
    p.add_argument("--temperature", type=float, default=0.0, action=NON_NEGATIVE)
    p.add_argument("--no-stream", action="store_true", help="whole responses (no TTFT apart from E2E, no ITL)")
    p.add_argument("--api-key", metavar="KEY", help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--model", metavar="NAME", help="model name to ask for (default: the first of GET /v1/models)")
    p.add_argument("--endpoint", choices=tuple(ENDPOINTS), default="chat")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS", action=POSITIVE, help="per request")
    p.add_argument("--seed", type=int, default=None, action=SEED, help="sent as the request's 'seed'")
    p.add_argument("--json", metavar="FILE", help="write the levels and the configuration as JSON")
    p.add_argument("--markdown", metavar="FILE", help="write the table as Markdown")
    p.add_argument("--plot", metavar="FILE.png", help="throughput and latency against concurrency")
    p.set_defaults(func=run_cli)


def run_cli(args) -> int:
    from specdec.bench.cli import check_outputs, parse_ints, write_outputs
    from specdec.bench.prompts import load_prompts

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
    print(text)
    write_outputs(args, text, to_json(results, cfg), lambda path: plot(results, path))
    return 0
