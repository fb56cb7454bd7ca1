"""Hostile input on `specdec serve` (issue 35, item 4): every entry point answers with an OpenAI-style 4xx body
({"error": {"message", "type", "param", "code"}}): never a 5xx, a hang or a traceback, and nothing is lost: after
each hostile request the same good greedy request still gets the same text.

A table of hostile kinds (malformed and wrongly typed JSON, NaN and enormous numbers, wrong content types, deep
nesting, lone surrogates, unknown roles, n > 1, stop lists, prompts past the context, unsupported OpenAI
parameters, path traversal on the page's files, methods not served), then a Hypothesis fuzz over request
bodies, bounded in examples and time. tests/test_serve_server.py holds the first 14 kinds; none is repeated here."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.serve.protocol import IGNORED, REFUSED
from tests.serving import CONTEXT, KEY, PROMPTS, Server, model_name, write_served_model

# a server in a subprocess per test or module: the `servers` part of the slow suites (make test-all)
pytestmark = pytest.mark.slow

M = "MODEL"  # replaced by the served model's name
GOOD = {"model": M, "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0}
CHAT = {"model": M, "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 4, "temperature": 0}
COMP = {"model": M, "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0}
VOCAB = 32  # tests.serving.WORDS
TIMEOUT_S = 15


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(write_served_model(tmp_path_factory.mktemp("hostile-model")), "--k", "3", "--policy", "always",
               "--max-batch", "4", "--api-key", KEY, "--max-body-bytes", "65536", "--prefill-chunk", "4")
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def name(server) -> str:
    return model_name(server)


@pytest.fixture(scope="module")
def expected(server, name) -> str:
    """The good greedy request's text, recorded once before anything hostile."""
    return good_text(server, name)


def good_text(server: Server, name: str) -> str:
    r = send(server, "POST", "/v1/completions", named(GOOD, name))
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def named(body, name: str):
    """body with every "MODEL" (as a value, or inside raw bytes) replaced by the served model's name."""
    if isinstance(body, bytes):
        return body.replace(M.encode(), name.encode())
    if isinstance(body, dict):
        return {k: named(v, name) for k, v in body.items()}
    return name if body == M else body


def send(server: Server, method: str, path: str, body=None, ctype: str | None = "application/json",
         headers: dict | None = None) -> httpx.Response:
    """One request with the API key; a dict body is sent as JSON (NaN and Infinity as Python writes them)."""
    h = {"authorization": f"Bearer {KEY}", **({"content-type": ctype} if ctype else {}), **(headers or {})}
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    return httpx.request(method, server.url + path, content=data, headers=h, timeout=TIMEOUT_S)


def raw_http(server: Server, target: bytes, method: bytes = b"GET") -> tuple[int, bytes]:
    """A request line sent as is (httpx would normalise "/../" and refuse NUL): the status and the body."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S) as sock:
        sock.sendall(method + b" " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def assert_openai_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"] and "Traceback" not in err["message"]
    assert len(err["message"]) < 400, err["message"]  # a clear line, not the client's megabytes echoed back
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error"), err
    assert err["param"] == param, err
    return err


def nest(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def chat(**kw) -> dict:
    return {**CHAT, **kw}


def comp(**kw) -> dict:
    return {**COMP, **kw}


def msg(role: object = "user", content: object = "w1") -> dict:
    return chat(messages=[{"role": role, "content": content}])


C, P = "/v1/chat/completions", "/v1/completions"
BIG = 10**40

# (id, path, body (dict: JSON; bytes: sent as is), status, param). Each id is one kind of hostile input.
CASES = [
    # the body is not a JSON object
    ("empty-body", P, b"", 400, None),
    ("whitespace-body", C, b" \r\n\t ", 400, None),
    ("body-json-array", C, b"[]", 400, None),
    ("body-json-number", P, b"42", 400, None),
    ("body-json-null", P, b"null", 400, None),
    ("body-json-string", C, b'"w1 w2"', 400, None),
    ("body-truncated", P, b'{"model": "MODEL", "prompt": "w1"', 400, None),
    ("body-trailing-garbage", P, b'{"model": "MODEL", "prompt": "w1"} x', 400, None),
    ("body-not-utf8", P, b'{"model": "MODEL", "prompt": "w1 \xff\xfe"}', 400, None),
    ("body-single-quotes", P, b"{'model': 'MODEL', 'prompt': 'w1'}", 400, None),
    # numbers JSON has no spelling for, and enormous ones
    ("nan", P, b'{"model": "MODEL", "prompt": "w1", "temperature": NaN}', 400, None),
    ("infinity", P, b'{"model": "MODEL", "prompt": "w1", "max_tokens": Infinity}', 400, None),
    ("minus-infinity", C, b'{"model": "MODEL", "messages": [], "top_p": -Infinity}', 400, None),
    ("nan-in-an-ignored-field", P, b'{"model": "MODEL", "prompt": "w1", "metadata": {"x": NaN}}', 400, None),
    ("float-overflow-1e400", P, b'{"model": "MODEL", "prompt": "w1", "temperature": 1e400}', 400, None),
    ("integer-of-5000-digits", P, b'{"model": "MODEL", "prompt": "w1", "seed": ' + b"9" * 5000 + b"}", 400, None),
    ("max_tokens-1e308", P, comp(max_tokens=1e308), 400, "max_tokens"),
    ("max_tokens-4000-digits", P, comp(max_tokens=10**4000), 400, "max_tokens"),
    ("max_tokens-10^40", C, chat(max_tokens=BIG), 400, "max_tokens"),
    ("max_completion_tokens-10^40", C, chat(max_completion_tokens=BIG), 400, "max_tokens"),
    ("temperature-1e308", P, comp(temperature=1e308), 400, "temperature"),
    ("temperature-10^40", C, chat(temperature=BIG), 400, "temperature"),
    ("top_p-10^40", P, comp(top_p=BIG), 400, "top_p"),
    ("seed-10^40", P, comp(seed=BIG), 400, "seed"),
    ("seed-1e308", C, chat(seed=1e308), 400, "seed"),
    ("top_k-10^40", P, comp(top_k=BIG), 400, "top_k"),
    ("top_k-negative", P, comp(top_k=-2), 400, "top_k"),
    # wrong types
    ("max_tokens-true", P, comp(max_tokens=True), 400, "max_tokens"),
    ("max_tokens-string", C, chat(max_tokens="4"), 400, "max_tokens"),
    ("max_tokens-list", P, comp(max_tokens=[4]), 400, "max_tokens"),
    ("temperature-string", P, comp(temperature="0"), 400, "temperature"),
    ("temperature-object", C, chat(temperature={"value": 0}), 400, "temperature"),
    ("top_k-true", C, chat(top_k=True), 400, "top_k"),
    ("seed-string", P, comp(seed="7"), 400, "seed"),
    ("stream-string", P, comp(stream="true"), 400, "stream"),
    ("stream_options-without-stream", C, chat(stream_options={"include_usage": True}), 400, "stream_options"),
    ("model-list", C, chat(model=[M]), 400, "model"),
    ("model-number", P, comp(model=7), 400, "model"),
    ("model-huge-name", P, comp(model="m" * 60000), 404, "model"),
    ("messages-object", C, chat(messages={"role": "user", "content": "w1"}), 400, "messages"),
    ("messages-string", C, chat(messages="w1 w2"), 400, "messages"),
    ("message-a-list", C, chat(messages=[["user", "w1"]]), 400, "messages[0]"),
    ("content-number", C, msg(content=3), 400, "messages[0].content"),
    ("content-object", C, msg(content={"type": "text", "text": "w1"}), 400, "messages[0].content"),
    ("content-image-part", C, msg(content=[{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]),
     400, "messages[0].content[0].type"),
    ("role-unknown", C, msg(role="wizard"), 400, "messages[0].role"),
    ("role-tool", C, msg(role="tool"), 400, "messages[0].role"),
    ("role-missing", C, chat(messages=[{"content": "w1"}]), 400, "messages[0].role"),
    ("lone-surrogate-in-chat", C, b'{"model": "MODEL", "messages": [{"role": "user", "content": "\\udc00"}]}',
     400, None),
    ("lone-surrogate-in-a-key", P, b'{"model": "MODEL", "prompt": "w1", "\\ud83d": 1}', 400, None),
    ("nested-20000-deep-in-a-field", P, b'{"model": "MODEL", "prompt": "w1", "metadata": ' + nest(20000) + b"}",
     400, None),
    ("nested-8000-objects", C, b'{"a":' * 8000 + b"1" + b"}" * 8000, 400, None),
    # n, stop, prompts
    ("n-2-completions", P, comp(n=2), 400, "n"),
    ("n-0", C, chat(n=0), 400, "n"),
    ("n-string", P, comp(n="1"), 400, "n"),
    ("stop-5-entries", P, comp(stop=["w1", "w2", "w3", "w4", "w5"]), 400, "stop"),
    ("stop-1000-entries", C, chat(stop=["w1"] * 1000), 400, "stop"),
    ("stop-empty-entry", P, comp(stop=["w1", ""]), 400, "stop"),
    ("stop-number-entry", C, chat(stop=[7]), 400, "stop"),
    ("stop-nested-list", P, comp(stop=[["w1"]]), 400, "stop"),
    ("prompt-token-ids", P, comp(prompt=[1, 2, 3]), 400, "prompt"),
    ("prompt-negative-token-id", P, comp(prompt=[[-1]]), 400, "prompt"),
    ("prompt-token-id-past-vocab", P, comp(prompt=[VOCAB + 10**6]), 400, "prompt"),
    ("prompt-two-strings", P, comp(prompt=["w1", "w2"]), 400, "prompt"),
    ("prompt-of-no-tokens", P, comp(prompt=" "), 400, "prompt"),
    ("prompt-exactly-the-context", P, comp(prompt=" ".join(["w3"] * CONTEXT)), 400, "prompt"),
    ("chat-past-context-in-many-messages", C,
     chat(messages=[{"role": "user", "content": "w1 w2"}] * CONTEXT), 400, "messages"),
    ("max_tokens-one-past-room", P, comp(prompt="w1 w2", max_tokens=CONTEXT - 1), 400, "max_tokens"),
    # OpenAI parameters that would change the answer and that the server does not implement
    ("tools", C, chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), 400, "tools"),
    ("tool_choice-required", C, chat(tool_choice="required"), 400, "tool_choice"),
    ("tool_choice-a-function", C, chat(tool_choice={"type": "function", "function": {"name": "f"}}), 400,
     "tool_choice"),
    ("functions", C, chat(functions=[{"name": "f", "parameters": {}}]), 400, "functions"),
    ("function_call", C, chat(function_call={"name": "f"}), 400, "function_call"),
    ("response_format-json_object", C, chat(response_format={"type": "json_object"}), 400, "response_format"),
    ("response_format-json_schema", P, comp(response_format={"type": "json_schema", "json_schema": {}}), 400,
     "response_format"),
    ("response_format-string", C, chat(response_format="json"), 400, "response_format"),
    ("logit_bias", P, comp(logit_bias={"5": 100}), 400, "logit_bias"),
    ("logit_bias-list", C, chat(logit_bias=[[5, 100]]), 400, "logit_bias"),
    ("logprobs", C, chat(logprobs=True), 400, "logprobs"),
    ("top_logprobs", C, chat(top_logprobs=3), 400, "top_logprobs"),
    ("presence_penalty", C, chat(presence_penalty=0.5), 400, "presence_penalty"),
    ("frequency_penalty", P, comp(frequency_penalty=-1), 400, "frequency_penalty"),
    ("frequency_penalty-true", P, comp(frequency_penalty=True), 400, "frequency_penalty"),
    ("best_of-2", P, comp(best_of=2), 400, "best_of"),
    ("echo", P, comp(echo=True), 400, "echo"),
    ("suffix", P, comp(suffix=" w9"), 400, "suffix"),
    ("store-true", C, chat(store=True), 400, "store"),
    ("modalities-audio", C, chat(modalities=["text", "audio"]), 400, "modalities"),
    ("audio", C, chat(audio={"voice": "alloy", "format": "wav"}), 400, "audio"),
    ("reasoning_effort", C, chat(reasoning_effort="high"), 400, "reasoning_effort"),
    ("min_p-extension", P, comp(min_p=0.1), 400, "min_p"),
    ("repetition_penalty-extension", P, comp(repetition_penalty=1.3), 400, "repetition_penalty"),
    ("guided_json-extension", C, chat(guided_json={"type": "object"}), 400, "guided_json"),
    ("ignore_eos-extension", P, comp(ignore_eos=True), 400, "ignore_eos"),
    # harmless parameters, wrongly typed
    ("user-number", C, chat(user=5), 400, "user"),
    ("metadata-string", P, comp(metadata="x"), 400, "metadata"),
    ("parallel_tool_calls-string", C, chat(parallel_tool_calls="yes"), 400, "parallel_tool_calls"),
]


@pytest.mark.parametrize("path, body, status, param", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_request_gets_an_openai_error_and_nothing_is_lost(server, name, expected, path, body, status,
                                                                    param):
    assert_openai_error(send(server, "POST", path, named(body, name)), status, param)
    assert good_text(server, name) == expected


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                   "application/xml", "text/json"])
def test_a_body_that_is_not_sent_as_json_is_415(server, name, expected, ctype):
    """Decided: a body whose Content-Type says it is not JSON is refused with 415 (a plain browser form cannot
    post to the server); a request without a Content-Type is read as JSON."""
    r = send(server, "POST", P, named(GOOD, name), ctype=ctype)
    err = assert_openai_error(r, 415)
    assert "application/json" in err["message"] and err["code"] == "unsupported_media_type"
    assert good_text(server, name) == expected


def test_a_chunked_body_over_the_limit_is_413(server, name, expected):
    """No Content-Length to refuse it by: the body is counted as it arrives."""
    chunks = (b"x" * 8192 for _ in range(16))  # 128 KiB against a 64 KiB limit
    r = httpx.post(server.url + P, content=chunks, timeout=TIMEOUT_S,
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert_openai_error(r, 413)
    assert good_text(server, name) == expected


@pytest.mark.parametrize("ctype", [None, "application/json; charset=utf-8", "Application/JSON",
                                   "application/vnd.api+json"])
def test_json_content_types_and_none_are_read_as_json(server, name, expected, ctype):
    r = send(server, "POST", P, named(GOOD, name), ctype=ctype)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected


HARMLESS = {"user": "someone", "metadata": {"k": "v"}, "store": False, "parallel_tool_calls": True,
            "service_tier": "auto", "tools": [], "tool_choice": "none", "functions": [], "response_format":
            {"type": "text"}, "logit_bias": {}, "presence_penalty": 0, "frequency_penalty": 0.0, "n": 1,
            "best_of": 1, "echo": False, "logprobs": False, "suffix": "", "top_k": 0, "min_p": 0,
            "repetition_penalty": 1.0, "prediction": {"type": "content", "content": "w1"}, "some_future_field": [1]}


def test_harmless_parameters_are_accepted_and_change_nothing(server, name, expected):
    r = send(server, "POST", P, named({**GOOD, **HARMLESS}, name))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == expected
    for k in (-1, 0, VOCAB, 2**31 - 1):  # top_k off, or past the vocabulary: greedy is greedy
        r = send(server, "POST", P, named({**GOOD, "top_k": k}, name))
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected, (k, r.text)


def test_top_k_1_is_greedy_at_any_temperature(server, name, expected):
    r = send(server, "POST", P, named({**GOOD, "top_k": 1, "temperature": 1.5, "seed": 3}, name))
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected


def test_every_refused_and_ignored_parameter_is_in_the_docs():
    doc = (Path(__file__).parents[1] / "docs" / "serving-api.md").read_text()
    for param in [*REFUSED, *IGNORED, "top_k", "seed", "stop", "stream_options", "max_completion_tokens"]:
        assert f"`{param}`" in doc, param


# ---- the page's files ------------------------------------------------------------------------------------------

TRAVERSALS = [b"/..%2f..%2f..%2fetc%2fpasswd", b"/..%2f..%2fetc/passwd", b"/%2e%2e/%2e%2e/etc/passwd",
              b"/%2e%2e%2f%2e%2e%2fetc%2fpasswd", b"/%252e%252e%252fetc%252fpasswd", b"/..%252f..%252fetc%252fpasswd",
              b"/../../etc/passwd", b"/..", b"/%2e%2e", b"/.", b"//etc/passwd", b"/%2fetc%2fpasswd",
              b"/etc/passwd", b"/%5c..%5c..%5cetc%5cpasswd", b"/..%5capp.js", b"/app.js%00", b"/app.js%00.html",
              b"/%00", b"/static/../app.js", b"/style.css/..%2f__init__.py", b"/..%2f__init__.py",
              b"/%c0%ae%c0%ae/%c0%ae%c0%ae/etc/passwd", b"/%ff%fe", b"/" + b"a" * 5000,
              b"http://127.0.0.1/../../etc/passwd"]


@pytest.mark.parametrize("target", TRAVERSALS, ids=[t.decode()[:40] for t in TRAVERSALS])
def test_paths_never_leave_the_static_folder(server, target):
    status, body = raw_http(server, target)
    for _ in range(3):  # a trailing slash may be redirected to the same name without it: follow that
        if status not in (307, 308):
            break
        status, body = raw_http(server, target.rstrip(b"/"))
    assert status == 404, (status, body[:200])
    err = json.loads(body)["error"]
    assert err["type"] == "not_found_error" and err["message"].startswith("no such path")
    assert b"root:" not in body and b"import" not in body


@pytest.mark.parametrize("target", [b"/app.js\x00", b"/a b c", b"/\xff\xfe", b"/..\\..\\etc\\passwd"])
def test_raw_bytes_in_a_path_are_refused(server, target):
    """Bytes no URL may hold: the HTTP layer (or the router) refuses them; nothing is served, nothing fails."""
    status, body = raw_http(server, target)
    assert 400 <= status < 500 and b"root:" not in body, (status, body[:200])


def test_the_page_files_are_still_served(server):
    assert httpx.get(server.url + "/app.js", timeout=TIMEOUT_S).status_code == 200
    assert raw_http(server, b"/index.html")[0] == 200


# ---- methods ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method, path, allowed", [
    *[(m, p, "POST") for m in ("PUT", "DELETE", "PATCH") for p in (P, C)],
    ("GET", P, "POST"), ("GET", C, "POST"), ("POST", "/v1/models", "GET"), ("DELETE", "/v1/models", "GET"),
    ("POST", "/health", "GET"), ("PUT", "/metrics", "GET"), ("POST", "/", "GET"), ("OPTIONS", P, "POST"),
])
def test_a_method_not_served_is_405(server, name, expected, method, path, allowed):
    r = send(server, method, path, named(GOOD, name))
    err = assert_openai_error(r, 405)
    assert err["code"] == "method_not_allowed" and method in err["message"] and allowed in err["message"]
    assert r.headers["allow"] == allowed
    assert good_text(server, name) == expected


@pytest.mark.parametrize("path", [P, C, "/v1/models", "/health", "/", "/app.js", "/nothing"])
def test_head_never_fails(server, path):
    r = httpx.head(server.url + path, headers={"authorization": f"Bearer {KEY}"}, timeout=TIMEOUT_S)
    assert r.status_code in (200, 404, 405), r.status_code


# ---- fuzz ------------------------------------------------------------------------------------------------------

KNOWN_FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                "top_k", "seed", "stop", "stream", "stream_options", "n", "logprobs", "best_of", "echo",
                *REFUSED, *IGNORED]
MAX_FUZZ_TOKENS = 4

scalars = (st.none() | st.booleans() | st.integers() | st.integers(-(10**30), 10**30)
           | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0, 1, -1, 0.5, 2, 2**63, 128, ""])
           | st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
           | st.sampled_from(["w1", "w2 w3", "user", "assistant", "system", "text", "MODEL", "\x00", "\ud800"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.sampled_from(["role", "content", "type", "text", "include_usage",
                                                              "name"]) | st.text(max_size=6), inner, max_size=4),
                           max_leaves=12)


@st.composite
def bodies(draw) -> bytes:
    """A request body: mostly a valid one with a few fields set to random values, added or removed; sometimes any
    JSON value, sometimes any bytes."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=64))
    if kind == 1:
        return json.dumps(draw(json_values)).encode()
    body = dict(draw(st.sampled_from([CHAT, COMP, {**CHAT, **COMP}])))
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(KNOWN_FIELDS) | st.text(max_size=8))
        if draw(st.integers(0, 4)) == 0:
            body.pop(field, None)
        else:
            body[field] = draw(json_values)
    return json.dumps(bounded(body)).encode()


def bounded(body: dict) -> dict:
    """A body that may generate does so for a few tokens at most (the fuzz is about parsing, not decoding)."""
    for key in ("max_tokens", "max_completion_tokens"):
        x = body.get(key)
        if type(x) is int and x > MAX_FUZZ_TOKENS:
            body[key] = MAX_FUZZ_TOKENS
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_FUZZ_TOKENS
    return body


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(body=bodies())
def test_fuzzed_bodies_never_get_a_5xx_or_hang(server, name, expected, body):
    body = named(body, name)
    for path in (P, C):
        t0 = time.monotonic()
        r = send(server, "POST", path, body)
        assert r.status_code < 500, (path, body[:300], r.text[:300])
        assert time.monotonic() - t0 < TIMEOUT_S
        if r.status_code >= 400:
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text


def test_after_all_of_it_the_server_answers_as_before(server, name, expected):
    assert good_text(server, name) == expected
    deadline = time.monotonic() + 10
    while (h := server.health())["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (h["status"], h["running"], h["waiting"]) == ("ok", 0, 0), h
    server.log.flush()
    assert "Traceback" not in Path(server.log.name).read_text()  # no request ever failed inside the server
