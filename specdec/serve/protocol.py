"""The OpenAI-compatible wire protocol, without a web framework: a JSON body in, a GenRequest or an APIError out;
plain values in, response dicts (and server-sent-event bytes) out.

Validation follows OpenAI's API: a bad field is a 400 whose `param` names it, an unknown model a 404 with code
"model_not_found". Fields this server does not know are ignored, as OpenAI-compatible servers do; the known
parameters that would change the answer and that it does not implement (tools, response_format, logit_bias,
penalties, logprobs, n > 1, ...) are refused with a 400 naming them unless they hold their "off" value; harmless
ones (user, metadata, ...) are type-checked and ignored. docs/serving-api.md lists all three.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from specdec.errors import SpecdecError
from specdec.measure import acceptance
from specdec.serve.pacing import Pace, parse_pace

KINDS = ("chat", "completion")
ROLES = ("system", "user", "assistant")
FINISH_REASONS = ("stop", "length")
MAX_STOP = 4  # OpenAI's limit on stop sequences
SEED_RANGE = (-(2**63), 2**63 - 1)  # what torch.manual_seed and friends accept without overflow
TOP_K_MAX = 2**31 - 1  # past the vocabulary top-k is off anyway; bounded so no kernel sees an overflowing int
SHOWN_CHARS = 80  # a bad value is quoted in the message up to this many characters

_DEFAULT_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class APIError(Exception):
    """An error for the client, in OpenAI's shape (see body()). type defaults from the status (any other 4xx:
    invalid_request_error; 5xx: server_error)."""

    def __init__(self, status: int, message: str, type: str | None = None, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _DEFAULT_TYPE.get(status) or (
            "invalid_request_error" if 400 <= status < 500 else "server_error")
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __repr__(self) -> str:
        return f"APIError({self.status}, {self.message!r}, type={self.type!r}, param={self.param!r})"


@dataclass(frozen=True)
class GenRequest:
    kind: str  # "chat" | "completion"
    model: str
    messages: tuple[dict, ...] | None  # chat: each {"role": str, "content": str}, text parts already joined
    prompt: str | None  # completion
    max_tokens: int | None  # None: the server's default (chat: max_completion_tokens wins over max_tokens)
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a final chunk carries the usage
    pace: Pace | None = None  # stream_options.pace (an extension): off, auto or ms a token; None: the server's
    top_k: int = 0  # an extension (vLLM's, llama.cpp's): 0 means off


# ---- parsing -----------------------------------------------------------------------------------------------------

def _bad(message: str, param: str | None) -> APIError:
    return APIError(400, message, param=param)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def cut(text: str, limit: int = SHOWN_CHARS) -> str:
    """text for an error message, cut to `limit` characters (a client may send megabytes)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def show(x: object) -> str:
    """A client's value for an error message: its repr, cut (an integer of 4,000 digits is shown by its size)."""
    if _is_int(x) and x.bit_length() > 256:
        return f"an integer of {x.bit_length()} bits"
    return cut(repr(x))


def _number(body: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    x = body.get(name)
    if x is None:
        return default
    if not _is_number(x) or (isinstance(x, float) and not math.isfinite(x)):  # a huge int is finite, and fails below
        raise _bad(f"'{name}' must be a finite number, got {show(x)}", name)
    if (x <= lo if lo_open else x < lo) or x > hi:
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise _bad(f"'{name}' must be in {interval}, got {show(x)}", name)
    return float(x)


def _max_tokens(body: dict, names: Sequence[str]) -> int | None:
    """The first of `names` that is set; every one that is set must be an int >= 1."""
    found = None
    for name in names:
        x = body.get(name)
        if x is None:
            continue
        if not _is_int(x) or x < 1:
            raise _bad(f"'{name}' must be an integer >= 1, got {show(x)}", name)
        if found is None:
            found = x
    return found


def _content(content: object, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"'{param}' must be a string or a list of text parts", param)
    texts = []
    for j, part in enumerate(content):
        p = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise _bad(f"'{p}' must be an object", p)
        if part.get("type") != "text":
            raise _bad(f"'{p}.type' must be 'text' (only text content is supported), got {show(part.get('type'))}",
                       f"{p}.type")
        if not isinstance(part.get("text"), str):
            raise _bad(f"'{p}.text' must be a string", f"{p}.text")
        texts.append(part["text"])
    return "\n".join(texts)


def _messages(body: dict) -> tuple[dict, ...]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("'messages' must be a non-empty list of messages", "messages")
    out = []
    for i, m in enumerate(msgs):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(f"'{p}' must be an object", p)
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise _bad(f"'{p}.role' must be one of {', '.join(ROLES)}; got {show(role)}", f"{p}.role")
        out.append({"role": role, "content": _content(m.get("content"), f"{p}.content")})
    return tuple(out)


def _prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _bad("'prompt' must be a string, or a list holding exactly one string", "prompt")
    if not prompt:
        raise _bad("'prompt' must not be empty", "prompt")
    return prompt


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    seqs = [stop] if isinstance(stop, str) else stop
    if not isinstance(seqs, list) or len(seqs) > MAX_STOP or not all(isinstance(s, str) and s for s in seqs):
        raise _bad(f"'stop' must be a non-empty string or a list of at most {MAX_STOP} non-empty strings", "stop")
    return tuple(seqs)


def _is_off(x: object, *offs: object) -> bool:
    """x is None or one of `offs`, compared without letting a boolean pass for a number (True == 1 in Python)."""
    return x is None or any((type(x) is type(o) or _is_number(x) and _is_number(o)) and x == o for o in offs)


# Parameters that would change the answer and that this server does not implement: a 400 naming the parameter
# unless it holds one of its "off" values (what a client library sends by default).
REFUSED: dict[str, tuple[object, ...]] = {
    "tools": ([],),
    "tool_choice": ("none", "auto"),
    "functions": ([],),
    "function_call": ("none", "auto"),
    "response_format": ({"type": "text"},),
    "logit_bias": ({},),
    "top_logprobs": (),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "suffix": ("",),
    "modalities": (["text"],),
    "audio": (),
    "reasoning_effort": (),
    "web_search_options": (),
    "store": (False,),  # True asks OpenAI to keep the completion for later retrieval; this server keeps nothing
    # extensions of other OpenAI-compatible servers (vLLM, llama.cpp, TGI)
    "min_p": (0,),
    "repetition_penalty": (1,),
    "min_tokens": (0,),
    "ignore_eos": (False,),
    "use_beam_search": (False,),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "grammar": (),
    "json_schema": (),
}

# Harmless parameters: type-checked, then ignored (None is always accepted).
IGNORED: dict[str, type] = {
    "user": str,
    "metadata": dict,
    "parallel_tool_calls": bool,
    "service_tier": str,
    "prediction": dict,  # predicted outputs only make OpenAI faster; the answer is the same
    "prompt_cache_key": str,
    "safety_identifier": str,
}


def _refused(body: dict) -> None:
    for name, offs in REFUSED.items():
        if not _is_off(body.get(name), *offs):
            accepted = " or ".join(["null", *(json.dumps(o) for o in offs)])
            raise _bad(f"'{name}' is not supported by this server (accepted: {accepted}); got {show(body[name])}",
                       name)


def _ignored(body: dict) -> None:
    for name, kind in IGNORED.items():
        x = body.get(name)
        if x is not None and not isinstance(x, kind):
            raise _bad(f"'{name}' must be {_JSON_NAMES[kind]}, got {show(x)}", name)


_JSON_NAMES = {str: "a string", dict: "an object", bool: "a boolean"}


def _unsupported(body: dict) -> None:
    n = body.get("n")
    if n is not None and not (_is_int(n) and n == 1):
        raise _bad(f"only n=1 is supported, got n={show(n)}", "n")
    if body.get("logprobs") is not None and body.get("logprobs") is not False:  # 0 is a request for logprobs too
        raise _bad("'logprobs' is not supported", "logprobs")
    best_of = body.get("best_of")
    if best_of is not None:
        if not _is_int(best_of) or best_of < 1:
            raise _bad(f"'best_of' must be an integer >= 1, got {show(best_of)}", "best_of")
        if best_of > 1:
            raise _bad("'best_of' > 1 is not supported", "best_of")
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise _bad("'echo' must be a boolean", "echo")
    if echo:
        raise _bad("'echo' is not supported", "echo")
    _refused(body)
    _ignored(body)


def _top_k(body: dict) -> int:
    """top_k: 0 (or -1, vLLM's spelling) is off."""
    k = body.get("top_k")
    if k is None:
        return 0
    if not _is_int(k) or not -1 <= k <= TOP_K_MAX:
        raise _bad(f"'top_k' must be an integer in [-1, {TOP_K_MAX}] (0 or -1: off), got {show(k)}", "top_k")
    return max(k, 0)


def parse_request(kind: str, body: object, served_models: Sequence[str]) -> GenRequest:
    """Validate a decoded JSON body of /v1/chat/completions (kind "chat") or /v1/completions ("completion").

    Raises APIError: 400 naming the offending field in `param`, or 404 "model_not_found"."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None)

    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a string", "model")
    if model not in served_models:
        raise APIError(404, f"The model `{cut(model)}` does not exist. Served: {', '.join(served_models)}",
                       type="not_found_error", param="model", code="model_not_found")

    messages = _messages(body) if kind == "chat" else None
    prompt = _prompt(body) if kind == "completion" else None
    _unsupported(body)

    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream")
    stream = bool(stream)
    options = body.get("stream_options")
    include_usage, pace = False, None
    if options is not None:
        if not stream:
            raise _bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
        if not isinstance(options, dict):
            raise _bad("'stream_options' must be an object", "stream_options")
        include_usage = options.get("include_usage")
        if include_usage is not None and not isinstance(include_usage, bool):
            raise _bad("'stream_options.include_usage' must be a boolean", "stream_options.include_usage")
        include_usage = bool(include_usage)
        pace = options.get("pace")
        if pace is not None:
            try:
                pace = parse_pace(pace, "'stream_options.pace'")
            except SpecdecError as e:
                raise _bad(str(e), "stream_options.pace") from None

    seed = body.get("seed")
    if seed is not None and not (_is_int(seed) and SEED_RANGE[0] <= seed <= SEED_RANGE[1]):
        raise _bad(f"'seed' must be a 64-bit signed integer, got {show(seed)}", "seed")

    return GenRequest(
        kind=kind,
        model=model,
        messages=messages,
        prompt=prompt,
        max_tokens=_max_tokens(body, ("max_completion_tokens", "max_tokens") if kind == "chat" else ("max_tokens",)),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        seed=seed,
        stop=_stop(body),
        stream=stream,
        include_usage=include_usage,
        pace=pace,
        top_k=_top_k(body),
    )


# ---- responses ---------------------------------------------------------------------------------------------------

def new_id(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


def usage(prompt_tokens: int, completion_tokens: int, speculative: dict | None = None,
          cached_tokens: int = 0) -> dict:
    """OpenAI's usage object (prompt_tokens_details.cached_tokens: prompt tokens served by the prefix cache);
    with `speculative` ({"drafted_tokens", "accepted_tokens", "mean_tokens_per_round"}), an extension object of
    the same name that adds acceptance_rate = accepted / drafted (None if none drafted)."""
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens,
           "prompt_tokens_details": {"cached_tokens": cached_tokens}}
    if speculative is not None:
        drafted, accepted = speculative["drafted_tokens"], speculative["accepted_tokens"]
        out["speculative"] = {
            "drafted_tokens": drafted,
            "accepted_tokens": accepted,
            "acceptance_rate": acceptance(accepted, drafted),
            "mean_tokens_per_round": speculative["mean_tokens_per_round"],
        }
    return out


def _check_finish(finish_reason: str | None, allow_none: bool) -> None:
    if not (finish_reason in FINISH_REASONS or (allow_none and finish_reason is None)):
        raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {finish_reason!r}")


def full_response(req: GenRequest, rid: str, created: int, text: str, finish_reason: str,
                  usage: dict | None) -> dict:
    """A non-streamed answer: OpenAI's chat.completion or text_completion object."""
    _check_finish(finish_reason, allow_none=False)
    if req.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": req.model, "choices": [choice], "usage": usage}


def chunk(req: GenRequest, rid: str, created: int, delta_text: str | None, finish_reason: str | None,
          first: bool) -> dict:
    """One streamed piece: chat.completion.chunk (the first one's delta carries the role) or text_completion.

    With include_usage, every chunk has "usage": null, as OpenAI sends it; usage_chunk() carries the numbers."""
    _check_finish(finish_reason, allow_none=True)
    if req.kind == "chat":
        delta: dict = {"role": "assistant", "content": delta_text or ""} if first else {}
        if delta_text is not None:
            delta["content"] = delta_text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    out = {"id": rid, "object": obj, "created": created, "model": req.model, "choices": [choice]}
    if req.include_usage:
        out["usage"] = None
    return out


def usage_chunk(req: GenRequest, rid: str, created: int, usage: dict) -> dict:
    """The last chunk before [DONE] when stream_options.include_usage is set: no choices, the usage."""
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": req.model, "choices": [], "usage": usage}


SSE_DONE = b"data: [DONE]\n\n"


def sse(obj: dict) -> bytes:
    """One server-sent event. NaN/inf are refused (they are not JSON)."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, allow_nan=False).encode() + b"\n\n"


def models_list(names: Sequence[str], created: int) -> dict:
    """GET /v1/models."""
    return {"object": "list",
            "data": [{"id": n, "object": "model", "created": created, "owned_by": "specdec"} for n in names]}
