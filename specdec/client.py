"""The client side of an OpenAI-compatible server, written once for every tool that measures one (`specdec
loadtest`, `bench --endpoint`, `audit`, the serving benchmark): one timed completion request, streamed (SSE) or
whole, with the arrival time of each text chunk; the first model a server lists; its Prometheus /metrics.

It sits below specdec.bench and specdec.audit and imports nothing of them (nor of specdec.serve): a client needs
only the wire format. Proxy settings from the environment are ignored (trust_env=False): a server is measured
directly. Failures are one line each (RequestFailed, or the `error` of a Completion), never a traceback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

CONNECT_TIMEOUT_S = 10.0  # at most; never more than the request's own timeout


class RequestFailed(Exception):
    """A request that got an error (an HTTP status, an error object, no answer); the message is one line."""


class Unreachable(RequestFailed):
    """No answer at all: the connection failed or timed out."""


class TimedOut(Unreachable):
    """No answer within the client's timeout."""


def one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def describe(e: BaseException) -> str:
    """'ConnectError: [Errno 111] Connection refused', on one line."""
    return one_line(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)


def http_error(status: int, body: str) -> str:
    """'HTTP 500: message', the message taken from an OpenAI-style error object when there is one."""
    message = body
    try:
        obj = json.loads(body)
        err = obj.get("error", obj.get("detail")) if isinstance(obj, dict) else None
        message = err.get("message", err) if isinstance(err, dict) else err or body
    except ValueError:
        pass
    return f"HTTP {status}: {one_line(message) or '(empty body)'}"


def async_client(api_key: str | None, timeout_s: float, connections: int) -> httpx.AsyncClient:
    """A client for one server: 'Authorization: Bearer KEY' when a key is given, `connections` at once."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S))
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits, trust_env=False)


async def request(client: httpx.AsyncClient, method: str, url: str, **kw) -> httpx.Response:
    """One request that must answer 200; Unreachable (no answer; TimedOut: not in time) or RequestFailed ('HTTP
    4xx: message')."""
    try:
        resp = await client.request(method, url, **kw)
    except httpx.TimeoutException:
        raise TimedOut("no answer in time") from None
    except httpx.HTTPError as e:
        raise Unreachable(describe(e)) from None
    if resp.status_code != 200:
        raise RequestFailed(http_error(resp.status_code, resp.text))
    return resp


async def first_model(client: httpx.AsyncClient, api_base: str) -> str | None:
    """The first model id GET {api_base}/models lists; None when it lists none (errors as in request())."""
    resp = await request(client, "GET", api_base + "/models")
    try:
        return str(resp.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def run_async(coro):
    """asyncio.run, also from a thread that already runs an event loop (a notebook): then in a fresh thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


# ---- one completion ------------------------------------------------------------------------------------------

@dataclass
class Completion:
    """One completion request as the client saw it. Times are seconds after it was sent (sent_at, on
    time.perf_counter's clock, places them against other requests')."""

    ok: bool = False
    status: int | None = None  # HTTP status; None when no response came
    error: str | None = None  # one line, for a failed request
    e2e_s: float = 0.0
    ttft_s: float | None = None  # None when no text arrived; a whole (not streamed) response: its e2e_s
    chunk_s: list[float] = field(default_factory=list)  # arrival of each streamed text chunk
    tokens: int = 0  # usage.completion_tokens; a stream without usage: its text chunks; a whole response: 0
    text: str = ""  # the completion, all chunks joined
    finish: str | None = None  # the last finish_reason the server sent
    prompt_tokens: int | None = None  # usage.prompt_tokens, where the server sends usage
    timings: dict | None = None  # llama-server's per-response 'timings' (draft_n, draft_n_accepted), if sent
    sent_at: float = 0.0  # time.perf_counter() when the request was sent


def load_json(text: str) -> dict:
    """A response body or an SSE event's data as a JSON object; RequestFailed for anything else or an error."""
    try:
        obj = json.loads(text)
    except ValueError:
        raise RequestFailed(f"not JSON: {one_line(text, 80)!r}") from None
    if not isinstance(obj, dict):
        raise RequestFailed(f"expected a JSON object, got {one_line(text, 80)!r}")
    if obj.get("error"):
        err = obj["error"]
        raise RequestFailed(f"server error: {one_line(err.get('message', err) if isinstance(err, dict) else err)}")
    return obj


def text_of(obj: dict) -> str:
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


def usage_tokens(obj: dict, key: str = "completion_tokens") -> int | None:
    usage = obj.get("usage")
    n = usage.get(key) if isinstance(usage, dict) else None
    return n if isinstance(n, int) else None


def _note_extras(obj: dict, rec: Completion) -> None:
    """finish_reason, usage.prompt_tokens and llama-server's 'timings' of a response or chunk, where present."""
    for choice in obj.get("choices") or []:
        if isinstance(choice, dict) and choice.get("finish_reason"):
            rec.finish = str(choice["finish_reason"])
    n = usage_tokens(obj, "prompt_tokens")
    rec.prompt_tokens = n if n is not None else rec.prompt_tokens
    if isinstance(obj.get("timings"), dict):
        rec.timings = obj["timings"]


async def _exchange(client: httpx.AsyncClient, url: str, body: dict, rec: Completion,
                    on_text: Callable[[], None] | None) -> None:
    """Send one request and fill rec (status, chunk times, tokens); raises RequestFailed on an error answer."""
    if not body.get("stream"):
        resp = await client.post(url, json=body)
        rec.status = resp.status_code
        if resp.status_code != 200:
            raise RequestFailed(http_error(resp.status_code, resp.text))
        obj = load_json(resp.text)
        rec.tokens, rec.text = usage_tokens(obj) or 0, text_of(obj)
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
            obj = load_json(data)
            text = text_of(obj)
            if text:
                rec.chunk_s.append(time.perf_counter() - rec.sent_at)
                rec.text += text
                if on_text:
                    on_text()
            _note_extras(obj, rec)
            n = usage_tokens(obj)
            usage = n if n is not None else usage
    rec.tokens = usage if usage is not None else len(rec.chunk_s)
    rec.ttft_s = rec.chunk_s[0] if rec.chunk_s else None


async def complete(client: httpx.AsyncClient, url: str, body: dict, timeout_s: float,
                   on_text: Callable[[], None] | None = None) -> Completion:
    """POST one completion request (body["stream"] says whether it streams) and time it; failures (HTTP errors,
    error objects, transport errors, timeouts) are recorded in the result, never raised. on_text() is called
    as each streamed text chunk arrives."""
    rec = Completion(sent_at=time.perf_counter())
    try:
        await asyncio.wait_for(_exchange(client, url, body, rec, on_text), timeout_s)
        rec.ok = True
    except RequestFailed as e:
        rec.error = str(e)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        rec.error = f"timed out after {timeout_s:g} s"
    except httpx.HTTPError as e:
        rec.error = describe(e)
    rec.e2e_s = time.perf_counter() - rec.sent_at
    if rec.ok and not body.get("stream"):
        rec.ttft_s = rec.e2e_s
    return rec


# ---- Prometheus /metrics -------------------------------------------------------------------------------------

def prometheus_series(text: str) -> dict[str, float]:
    """Sample values of the Prometheus text format by series, 'name{labels}' (labels in their written order), read by
    prometheus_client's own parser. Each sample line is parsed on its own, so that one malformed line (a server's
    bug, a value that is not a number) loses that line, not the scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            samples = [s for family in text_string_to_metric_families(line + "\n") for s in family.samples]
        except ValueError:
            continue
        for sample in samples:
            out[series_name(sample.name, sample.labels)] = sample.value
    return out


def series_name(name: str, labels: dict[str, str]) -> str:
    """'name{label="value",...}' as the text format writes it ('name' without labels)."""
    if not labels:
        return name
    escape = lambda v: v.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")
    return name + "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels.items()) + "}"


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample values of the Prometheus text format, summed over label sets, by metric name."""
    out: dict[str, float] = {}
    for series, value in prometheus_series(text).items():
        name = series.split("{", 1)[0]
        out[name] = out.get(name, 0.0) + value
    return out


async def scrape(client: httpx.AsyncClient, root: str) -> str | None:
    """The text of GET {root}/metrics (at the server's root, beside /v1); None where it has none."""
    try:
        resp = await client.get(root.rstrip("/") + "/metrics")
    except httpx.HTTPError:
        return None
    return resp.text if resp.status_code == 200 else None


# (drafted, accepted, drafts) counters, by server family; labelled series are summed
COUNTERS = {
    "specdec": ("specdec:spec_decode_num_draft_tokens_total", "specdec:spec_decode_num_accepted_tokens_total",
                "specdec:spec_decode_num_drafts_total"),
    "vllm": ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
             "vllm:spec_decode_num_drafts_total"),
}


def counted(before: dict, after: dict) -> tuple[int, int, int] | None:
    """(drafted, accepted, drafts) between two scrapes, from the first server family whose counters exist."""
    for names in COUNTERS.values():
        if names[0] in after:
            d, a, n = (int(round(after.get(k, 0.0) - before.get(k, 0.0))) for k in names)
            return d, a, n
    return None
