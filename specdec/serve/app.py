"""The OpenAI-compatible HTTP API over the engine thread (FastAPI).

POST /v1/chat/completions and /v1/completions (streamed as server-sent events, or whole), GET /v1/models,
/health, /metrics (Prometheus) and / (the explainer page). Every error is OpenAI-shaped:
{"error": {"message", "type", "param", "code"}}. A client that disconnects frees its slot at once.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.engine.sequence import ContextExceeded, GenerationConfig, Sequence, context_room, cut_at_stop
from specdec.errors import SpecdecError
from specdec.models.text.chat_templates import no_template_line
from specdec.models.text.tokenizer import IncrementalDecoder, encode_messages, encode_text
from specdec.sampling.warp import SamplingConfig
from specdec.serve import protocol
from specdec.serve.pacing import Pace, RatePrior, paced
from specdec.serve.protocol import APIError, GenRequest
from specdec.serve.worker import EngineWorker, QueueFull, Ticket

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}
DISCONNECT_POLL_S = 0.5  # how often a non-streamed request checks that its client is still there


@dataclass(frozen=True)
class ServeConfig:
    model_name: str = "specdec"
    api_key: str | None = None
    max_body_bytes: int = 4 << 20
    max_tokens_default: int | None = None  # None: up to the context
    aliases: tuple[str, ...] = ()  # other names a request may give the model by
    lossy_typical_acceptance: bool = False  # LOSSY: typical acceptance for every request; header says so
    pace: Pace = Pace("off")  # how streams release tokens (a request's stream_options.pace overrides it)


LIVE_HEADER = "x-specdec-live"  # on GET /: the path of the server's live measurements, relative to the page
ACCEPTANCE_HEADER = "x-specdec-acceptance"  # on every completion response: "exact" or "lossy-typical"
KV_CACHE_HEADER = "x-specdec-kv-cache"  # and the KV cache's type (f16, q8_0, q4_0): the model as configured


@dataclass
class AppState:
    """What every handler reads: the engine thread, the tokenizer, the settings, and the few values fixed at start.
    It lives on the app (app.state.specdec); the handlers below are plain functions over it."""

    worker: EngineWorker
    tokenizer: object
    cfg: ServeConfig
    created: int  # the models' "created" time: the server's start
    static: dict  # the explainer page's files by name
    label: dict  # the acceptance header every completion response carries
    rate: RatePrior  # the streams' production rate, which a new paced stream starts from

    @property
    def context(self) -> int:
        return self.worker.context


def create_app(worker: EngineWorker, tokenizer, cfg: ServeConfig) -> FastAPI:
    from specdec.explain import STATIC_DIR

    app = FastAPI(title="specdec", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.specdec = AppState(
        worker, tokenizer, cfg, int(time.time()), {p.name: p for p in STATIC_DIR.iterdir() if p.is_file()},
        {ACCEPTANCE_HEADER: "lossy-typical" if cfg.lossy_typical_acceptance else "exact",
         KV_CACHE_HEADER: worker.kv_cache}, RatePrior())
    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, server_error)
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    for path, handler in (("/v1/models", models), ("/health", health), ("/live", live), ("/metrics", metrics),
                          ("/", index), ("/{name}", page_file)):
        app.add_api_route(path, handler, methods=["GET"])
    return app


def state(request: Request) -> AppState:
    return request.app.state.specdec


# --- errors: every one in OpenAI's shape -------------------------------------------------------------------


async def api_error(request: Request, e: APIError):
    headers = {"Retry-After": "1"} if e.status == 503 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


async def http_error(request: Request, e: StarletteHTTPException):
    """The router's own errors (no such path, a method not served there), in OpenAI's shape."""
    path = protocol.cut(request.url.path)
    message = str(e.detail)
    if e.status_code == 404:
        message = f"no such path: {path}"
    elif e.status_code == 405:
        allowed = (e.headers or {}).get("Allow", "")
        message = f"method {request.method} is not allowed on {path}; allowed: {allowed}"
    code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
    return JSONResponse(APIError(e.status_code, message, code=code).body(), status_code=e.status_code,
                        headers=e.headers)


async def server_error(request: Request, e: Exception):
    return JSONResponse(APIError(500, f"internal error: {type(e).__name__}").body(), status_code=500)


# --- a request: authorized, read, made a sequence ----------------------------------------------------------


def authorize(request: Request) -> None:
    key = state(request).cfg.api_key
    if key is None:
        return
    auth = request.headers.get("authorization", "")
    scheme, _, given = auth.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
        raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')", code="invalid_api_key")


async def read_json(request: Request) -> object:
    check_json_content_type(request)
    limit = state(request).cfg.max_body_bytes
    too_large = APIError(413, f"request body over {limit} bytes", code="body_too_large")
    if content_length(request) > limit:
        raise too_large
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise too_large
    return parse_json(bytes(body))


def make_sequence(s: AppState, req: GenRequest) -> Sequence:
    where = "messages" if req.kind == "chat" else "prompt"
    if req.kind == "chat" and not getattr(s.tokenizer, "chat_template", None):  # as vLLM: never a guessed join
        raise APIError(400, no_template_line(s.tokenizer, "chat messages cannot be made a prompt",
                                             "restart the server with --chat-template NAME|FILE",
                                             ", or send raw text to /v1/completions"),
                       param="messages", code="no_chat_template")
    try:
        if req.kind == "chat":
            ids = encode_messages(s.tokenizer, [dict(m) for m in req.messages])
        else:
            ids = encode_text(s.tokenizer, req.prompt)
    except SpecdecError as e:
        raise APIError(400, str(e), param=where) from None
    if not ids:
        raise APIError(400, "the prompt encodes to no tokens", param=where)
    try:
        room = context_room(len(ids), s.context, req.max_tokens)
    except ContextExceeded as e:  # the message names the client's own value, cut (it may have 4,000 digits)
        message = str(e) if e.param == "prompt" else (
            f"max_tokens {protocol.show(req.max_tokens)} with a prompt of {len(ids)} tokens exceeds the context of "
            f"{s.context} (at most {e.room})")
        raise APIError(400, message, param=where if e.param == "prompt" else e.param,
                       code="context_length_exceeded") from None
    max_tokens = req.max_tokens or min(room, s.cfg.max_tokens_default or room)
    sampling = SamplingConfig(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, seed=req.seed)
    gen = GenerationConfig(max_tokens, sampling, req.stop, s.cfg.lossy_typical_acceptance)
    return s.worker.new_sequence(ids, gen)


def usage_of(seq: Sequence) -> dict:
    st = seq.stats
    spec = {"drafted_tokens": st.drafted, "accepted_tokens": st.accepted,
            "mean_tokens_per_round": st.mean_tokens_per_round}
    return protocol.usage(seq.prompt_len, seq.num_generated, spec, seq.stats.cached_tokens)


def finished(s: AppState, seq: Sequence) -> None:
    s.worker.metrics.on_finish(FINISH.get(seq.finish, "stop"), seq.prompt_len, seq.num_generated,
                               seq.stats.cached_tokens)


# --- completions: whole or streamed ------------------------------------------------------------------------


async def chat_completions(request: Request):
    return await generate("chat", request)


async def completions(request: Request):
    return await generate("completion", request)


async def generate(kind: str, request: Request):
    s = state(request)
    authorize(request)
    req = protocol.parse_request(kind, await read_json(request), [s.cfg.model_name, *s.cfg.aliases])
    seq = make_sequence(s, req)
    try:
        ticket = s.worker.submit(seq, asyncio.get_running_loop())
    except QueueFull as e:
        raise APIError(503, str(e), code="server_overloaded") from None
    rid = protocol.new_id(kind)
    if req.stream:
        return StreamingResponse(stream(s, req, rid, ticket), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", **s.label})
    out = await whole(s, req, rid, ticket, request)
    return JSONResponse(out, headers=s.label) if isinstance(out, dict) else out


async def whole(s: AppState, req: GenRequest, rid: str, ticket: Ticket, request: Request):
    try:
        while True:
            try:
                e = await asyncio.wait_for(ticket.events.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    s.worker.cancel(ticket.seq)
                    return Response(status_code=499)
                continue
            if isinstance(e, Exception):
                raise APIError(503 if isinstance(e, QueueFull) else 500, str(e))
            if e.finished:
                break
    except asyncio.CancelledError:
        s.worker.cancel(ticket.seq)
        raise
    seq = ticket.seq
    finished(s, seq)
    text = seq.text(_SkipSpecial(s.tokenizer))
    return protocol.full_response(req, rid, s.created, text, FINISH.get(seq.finish, "stop"), usage_of(seq))


async def stream(s: AppState, req: GenRequest, rid: str, ticket: Ticket):
    seq = ticket.seq
    dec = IncrementalDecoder(s.tokenizer, skip_special_tokens=True)
    hold = max((len(x) for x in req.stop), default=1) - 1  # text that may yet become a stop string
    ids: list[int] = []  # the tokens delivered so far (seq.output may already be ahead: the engine runs on)
    text, sent, first, done = "", 0, True, False
    try:
        async for e in paced(ticket.events, req.pace or s.cfg.pace, s.rate,
                             on_drained=lambda p: s.worker.metrics.on_paced(p.tail_s, p.mean_lag_s)):
            if isinstance(e, Exception):
                yield protocol.sse(APIError(503 if isinstance(e, QueueFull) else 500, str(e)).body())
                return
            tokens, done = e
            ids += tokens
            text += dec.step(ids)
            if done:
                text += dec.flush(ids)
                if seq.finish == "stop":
                    text = cut_at_stop(text, req.stop)
            upto = len(text) if done else max(sent, len(text) - hold)
            if upto > sent or first:
                yield protocol.sse(protocol.chunk(req, rid, s.created, text[sent:upto], None, first))
                sent, first = upto, False
        finished(s, seq)
        yield protocol.sse(protocol.chunk(req, rid, s.created, None, FINISH.get(seq.finish, "stop"), False))
        if req.include_usage:
            yield protocol.sse(protocol.usage_chunk(req, rid, s.created, usage_of(seq)))
        yield protocol.SSE_DONE
    finally:
        if not done:  # the client went away (or the engine failed): free the slot now
            s.worker.cancel(seq)


# --- the rest: models, health, live measurements, metrics, the page ---------------------------------------


async def models(request: Request):
    authorize(request)
    return protocol.models_list([state(request).cfg.model_name], state(request).created)


async def health(request: Request):
    worker = state(request).worker
    running, waiting = worker.load  # now; the rest (counts only) as the engine left them after its last step
    return {"status": "ok", "running": running, "waiting": waiting, "kv_cache": worker.kv_cache, **worker.state}


async def live(request: Request):
    """The server's own measurements for the live page (specdec.serve.live); 404 where none are kept."""
    authorize(request)
    worker = state(request).worker
    if worker.live is None:
        raise APIError(404, "this server keeps no live measurements", code="not_found")
    return worker.live.snapshot(*worker.load)


async def metrics(request: Request):
    worker = state(request).worker
    worker.metrics.set_queue(*worker.load)
    body, ctype = worker.metrics.render()
    return Response(body, media_type=ctype)


async def index(request: Request):
    # the page's live view polls /live only where the page came with this header (not from a file or a plain
    # static host, where the request would only log a 404)
    return FileResponse(state(request).static["index.html"], headers={LIVE_HEADER: "live"})


async def page_file(name: str, request: Request):
    static = state(request).static
    if name not in static:
        raise APIError(404, f"no such path: {protocol.cut('/' + name)}", code="not_found")
    return FileResponse(static[name])


JSON_TYPES = ("application/json",)  # and any "+json" type; a request without a content type is read as JSON


def check_json_content_type(request: Request) -> None:
    """A body sent as something other than JSON (text/plain, a form) is a 415: it was not meant for this API, and
    refusing it keeps a web page's plain form from posting to a local server."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype and ctype not in JSON_TYPES and not ctype.endswith("+json"):
        raise APIError(415, f"the body must be JSON, sent with 'Content-Type: application/json' (got "
                       f"{protocol.show(ctype)})", code="unsupported_media_type")


def content_length(request: Request) -> int:
    """The Content-Length header, 0 without one (the HTTP layer has already refused a malformed one)."""
    try:
        return int(request.headers.get("content-length", "0")[:20])
    except ValueError:
        return 0


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise APIError(400, f"the body is not valid JSON: the number {protocol.show(text)} is out of range",
                       code="invalid_json")
    return x


def _no_constant(name: str) -> object:
    raise APIError(400, f"the body is not valid JSON: {name} is not a JSON number", code="invalid_json")


def parse_json(body: bytes) -> object:
    """The decoded body; a 400 "invalid_json" for anything that is not strict JSON text: bad syntax or encoding,
    NaN/Infinity (which Python's json accepts), numbers out of a float's range or over 4,300 digits, lone
    surrogates, nesting past the recursion limit."""
    try:
        obj = json.loads(body, parse_constant=_no_constant, parse_float=_finite_float)
        json.dumps(obj, ensure_ascii=False).encode("utf-8")  # lone surrogates ("\ud800") are not text
        return obj
    except UnicodeEncodeError:  # before ValueError: it is one
        raise APIError(400, "the body holds a string that is not valid Unicode (a lone surrogate)",
                       code="invalid_json") from None
    except ValueError as e:  # a syntax error, bytes that are not UTF-8, an integer of more than 4,300 digits
        raise APIError(400, f"the body is not valid JSON: {protocol.cut(str(e), 200)}",
                       code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "the body is nested too deeply", code="invalid_json") from None


class _SkipSpecial:
    """The tokenizer, decoding without special tokens (what a client should see)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=True)
