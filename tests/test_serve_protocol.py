"""The OpenAI wire protocol: every validation rule maps to its status and param; valid bodies parse to the right
GenRequest; the response shapes pass the official openai client's own models."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from specdec.serve.protocol import (
    IGNORED,
    REFUSED,
    SHOWN_CHARS,
    SSE_DONE,
    APIError,
    GenRequest,
    chunk,
    full_response,
    models_list,
    new_id,
    parse_request,
    show,
    sse,
    usage,
    usage_chunk,
)

MODELS = ("smol", "other")
CHAT = {"model": "smol", "messages": [{"role": "user", "content": "hi"}]}
COMP = {"model": "smol", "prompt": "Once upon"}


def chat(**kw) -> dict:
    return {**CHAT, **kw}


def comp(**kw) -> dict:
    return {**COMP, **kw}


def without(body: dict, key: str) -> dict:
    return {k: v for k, v in body.items() if k != key}


def parse_error(kind: str, body: object) -> APIError:
    with pytest.raises(APIError) as e:
        parse_request(kind, body, MODELS)
    return e.value


# (kind, body, param the 400 must name)
BAD = [
    ("chat", [CHAT], None),
    ("chat", "hello", None),
    ("chat", None, None),
    ("chat", without(CHAT, "model"), "model"),
    ("chat", chat(model=3), "model"),
    ("chat", chat(model=None), "model"),
    ("chat", chat(model=""), "model"),
    ("chat", without(CHAT, "messages"), "messages"),
    ("chat", chat(messages=[]), "messages"),
    ("chat", chat(messages="hi"), "messages"),
    ("chat", chat(messages={"role": "user", "content": "hi"}), "messages"),
    ("chat", chat(messages=["hi"]), "messages[0]"),
    ("chat", chat(messages=[{"role": "user", "content": "a"}, {"content": "b"}]), "messages[1].role"),
    ("chat", chat(messages=[{"role": "tool", "content": "x"}]), "messages[0].role"),
    ("chat", chat(messages=[{"role": "developer", "content": "x"}]), "messages[0].role"),
    ("chat", chat(messages=[{"role": 1, "content": "x"}]), "messages[0].role"),
    ("chat", chat(messages=[{"role": "user"}]), "messages[0].content"),
    ("chat", chat(messages=[{"role": "user", "content": None}]), "messages[0].content"),
    ("chat", chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    ("chat", chat(messages=[{"role": "user", "content": ["hi"]}]), "messages[0].content[0]"),
    ("chat", chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     "messages[0].content[0].type"),
    ("chat", chat(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]),
     "messages[0].content[0].text"),
    ("chat", chat(messages=[{"role": "user", "content": [{"type": "text"}]}]), "messages[0].content[0].text"),
    ("completion", without(COMP, "prompt"), "prompt"),
    ("completion", comp(prompt=""), "prompt"),
    ("completion", comp(prompt=[]), "prompt"),
    ("completion", comp(prompt=["a", "b"]), "prompt"),
    ("completion", comp(prompt=[""]), "prompt"),
    ("completion", comp(prompt=[1, 2, 3]), "prompt"),
    ("completion", comp(prompt=[[1, 2]]), "prompt"),
    ("completion", comp(prompt=None), "prompt"),
    ("completion", comp(prompt=7), "prompt"),
    ("chat", chat(temperature="0.5"), "temperature"),
    ("chat", chat(temperature=-0.1), "temperature"),
    ("chat", chat(temperature=2.01), "temperature"),
    ("chat", chat(temperature=True), "temperature"),
    ("chat", chat(temperature=math.nan), "temperature"),
    ("chat", chat(temperature=math.inf), "temperature"),
    ("chat", chat(temperature=10**400), "temperature"),
    ("completion", comp(temperature=3), "temperature"),
    ("chat", chat(top_p=0), "top_p"),
    ("chat", chat(top_p=0.0), "top_p"),
    ("chat", chat(top_p=-0.5), "top_p"),
    ("chat", chat(top_p=1.0001), "top_p"),
    ("chat", chat(top_p=math.nan), "top_p"),
    ("chat", chat(top_p="1"), "top_p"),
    ("chat", chat(max_tokens=0), "max_tokens"),
    ("chat", chat(max_tokens=-3), "max_tokens"),
    ("chat", chat(max_tokens=5.0), "max_tokens"),
    ("chat", chat(max_tokens="5"), "max_tokens"),
    ("chat", chat(max_tokens=True), "max_tokens"),
    ("chat", chat(max_completion_tokens=0), "max_completion_tokens"),
    ("chat", chat(max_completion_tokens=True), "max_completion_tokens"),
    ("chat", chat(max_completion_tokens=8, max_tokens=0), "max_tokens"),
    ("completion", comp(max_tokens=0), "max_tokens"),
    ("completion", comp(max_tokens=math.inf), "max_tokens"),
    ("chat", chat(n=2), "n"),
    ("chat", chat(n=0), "n"),
    ("chat", chat(n=True), "n"),
    ("chat", chat(n=1.0), "n"),
    ("completion", comp(n=3), "n"),
    ("chat", chat(seed=1.5), "seed"),
    ("chat", chat(seed="1"), "seed"),
    ("chat", chat(seed=True), "seed"),
    ("chat", chat(seed=2**63), "seed"),
    ("chat", chat(stop=""), "stop"),
    ("chat", chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    ("chat", chat(stop=["a", ""]), "stop"),
    ("chat", chat(stop=[1]), "stop"),
    ("chat", chat(stop=5), "stop"),
    ("chat", chat(stop={"a": 1}), "stop"),
    ("chat", chat(stream="true"), "stream"),
    ("chat", chat(stream=1), "stream"),
    ("chat", chat(stream_options={"include_usage": True}), "stream_options"),
    ("chat", chat(stream=False, stream_options={"include_usage": True}), "stream_options"),
    ("chat", chat(stream=True, stream_options=True), "stream_options"),
    ("chat", chat(stream=True, stream_options={"include_usage": "yes"}), "stream_options.include_usage"),
    ("chat", chat(logprobs=True), "logprobs"),
    ("chat", chat(top_logprobs=2), "top_logprobs"),
    ("completion", comp(logprobs=0), "logprobs"),  # 0 asks for the sampled token's logprob: not "off"
    ("completion", comp(logprobs=5), "logprobs"),
    ("completion", comp(best_of=2), "best_of"),
    ("completion", comp(best_of=0), "best_of"),
    ("completion", comp(best_of="2"), "best_of"),
    ("completion", comp(echo=True), "echo"),
    ("completion", comp(echo="yes"), "echo"),
    # parameters that would change the answer and are not implemented
    ("chat", chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
    ("chat", chat(tools={"type": "function"}), "tools"),
    ("chat", chat(tool_choice="required"), "tool_choice"),
    ("chat", chat(tool_choice={"type": "function", "function": {"name": "f"}}), "tool_choice"),
    ("chat", chat(functions=[{"name": "f"}]), "functions"),
    ("chat", chat(function_call={"name": "f"}), "function_call"),
    ("chat", chat(response_format={"type": "json_object"}), "response_format"),
    ("chat", chat(response_format={"type": "text", "extra": 1}), "response_format"),
    ("chat", chat(response_format="text"), "response_format"),
    ("completion", comp(logit_bias={"1": 5}), "logit_bias"),
    ("completion", comp(logit_bias=[]), "logit_bias"),  # not an object: not "off" either
    ("chat", chat(presence_penalty=0.1), "presence_penalty"),
    ("chat", chat(presence_penalty=False), "presence_penalty"),  # a boolean is not the number 0
    ("chat", chat(frequency_penalty="0"), "frequency_penalty"),
    ("completion", comp(suffix="x"), "suffix"),
    ("chat", chat(store=True), "store"),
    ("chat", chat(store=0), "store"),
    ("chat", chat(modalities=["audio"]), "modalities"),
    ("chat", chat(audio={"voice": "alloy"}), "audio"),
    ("chat", chat(reasoning_effort="low"), "reasoning_effort"),
    ("chat", chat(web_search_options={}), "web_search_options"),
    ("completion", comp(min_p=0.05), "min_p"),
    ("completion", comp(repetition_penalty=1.1), "repetition_penalty"),
    ("completion", comp(min_tokens=3), "min_tokens"),
    ("completion", comp(ignore_eos=True), "ignore_eos"),
    ("completion", comp(use_beam_search=True), "use_beam_search"),
    ("chat", chat(guided_json={"type": "object"}), "guided_json"),
    ("chat", chat(guided_choice=["a", "b"]), "guided_choice"),
    ("completion", comp(grammar="root ::= x"), "grammar"),
    # harmless parameters, wrongly typed
    ("chat", chat(user=1), "user"),
    ("chat", chat(metadata=["a"]), "metadata"),
    ("chat", chat(parallel_tool_calls="yes"), "parallel_tool_calls"),
    ("chat", chat(service_tier=1), "service_tier"),
    # top_k, an extension
    ("chat", chat(top_k=-2), "top_k"),
    ("chat", chat(top_k=1.0), "top_k"),
    ("chat", chat(top_k=True), "top_k"),
    ("chat", chat(top_k="5"), "top_k"),
    ("completion", comp(top_k=2**31), "top_k"),
    ("completion", comp(top_k=10**40), "top_k"),
]


@pytest.mark.parametrize(("kind", "body", "param"), BAD, ids=[f"{i}-{p}" for i, (_, _, p) in enumerate(BAD)])
def test_bad_request_is_400_naming_the_field(kind, body, param):
    e = parse_error(kind, body)
    assert (e.status, e.type, e.param) == (400, "invalid_request_error", param), e
    assert e.body() == {"error": {"message": e.message, "type": "invalid_request_error", "param": param,
                                  "code": None}}
    assert e.message


def test_unsupported_fields_say_so():
    assert "only n=1" in parse_error("chat", chat(n=2)).message
    for body in (chat(logprobs=True), comp(best_of=3), comp(echo=True)):
        assert "not supported" in parse_error("chat" if "messages" in body else "completion", body).message


def test_refusals_name_the_parameter_and_what_is_accepted():
    e = parse_error("chat", chat(response_format={"type": "json_object"}))
    assert "'response_format' is not supported" in e.message and '{"type": "text"}' in e.message
    assert "json_object" in e.message


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_every_refused_parameter_is_accepted_when_off(name):
    for off in (None, *REFUSED[name]):
        parse_request("chat", chat(**{name: off}), MODELS)
        parse_request("completion", comp(**{name: off}), MODELS)


def test_harmless_parameters_are_ignored():
    values = {str: "x", dict: {"k": "v"}, bool: True}
    body = {name: values[kind] for name, kind in IGNORED.items()}
    assert parse_request("chat", chat(**body), MODELS) == parse_request("chat", CHAT, MODELS)


@pytest.mark.parametrize(("k", "expected"), [(None, 0), (0, 0), (-1, 0), (1, 1), (40, 40), (2**31 - 1, 2**31 - 1)])
def test_top_k(k, expected):
    assert parse_request("completion", comp(top_k=k), MODELS).top_k == expected


@pytest.mark.parametrize("body", [chat(max_tokens=-10**4000), chat(temperature=10**4000), chat(n="n" * 10**5),
                                  chat(seed=["y"] * 10**4),
                                  chat(messages=[{"role": "r" * 10**5, "content": "x"}]), chat(model="m" * 10**5)])
def test_an_enormous_value_is_not_echoed_back(body):
    e = parse_error("chat", body)
    assert len(e.message) < 3 * SHOWN_CHARS + 100, e.message


def test_show():
    assert show("abc") == "'abc'" and show(5) == "5" and show(None) == "None"
    assert len(show("x" * 1000)) == SHOWN_CHARS and show("x" * 1000).endswith("...")
    assert show(10**5000) == f"an integer of {(10**5000).bit_length()} bits"


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_unknown_model_is_404_model_not_found(kind):
    e = parse_error(kind, {**(CHAT if kind == "chat" else COMP), "model": "gpt-9"})
    assert (e.status, e.type, e.code, e.param) == (404, "not_found_error", "model_not_found", "model")
    assert "gpt-9" in e.message
    assert e.body()["error"]["code"] == "model_not_found"


def test_model_is_checked_before_the_rest():
    e = parse_error("chat", {"model": "gpt-9", "messages": []})
    assert e.status == 404


def test_unknown_kind_is_a_programming_error():
    with pytest.raises(ValueError):
        parse_request("embeddings", CHAT, MODELS)
    with pytest.raises(ValueError):
        new_id("embeddings")


def test_api_error_default_types():
    assert APIError(401, "no").type == "authentication_error"
    assert APIError(503, "busy").type == "overloaded_error"
    assert APIError(500, "boom").type == "server_error"
    assert APIError(404, "x").type == "not_found_error"
    assert APIError(400, "x", type="custom").type == "custom"
    assert APIError(405, "x").type == APIError(413, "x").type == APIError(415, "x").type == "invalid_request_error"
    assert APIError(502, "x").type == "server_error"
    assert str(APIError(400, "the message")) == "the message"


def test_chat_defaults():
    r = parse_request("chat", CHAT, MODELS)
    assert r == GenRequest(kind="chat", model="smol", messages=({"role": "user", "content": "hi"},), prompt=None,
                           max_tokens=None, temperature=1.0, top_p=1.0, seed=None, stop=(), stream=False,
                           include_usage=False)


def test_completion_defaults():
    r = parse_request("completion", COMP, MODELS)
    assert r == GenRequest(kind="completion", model="smol", messages=None, prompt="Once upon", max_tokens=None,
                           temperature=1.0, top_p=1.0, seed=None, stop=(), stream=False, include_usage=False)


def test_chat_every_field():
    body = {
        "model": "other",
        "messages": [
            {"role": "system", "content": "be brief", "name": "ignored"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": []},
        ],
        "max_tokens": 9,
        "temperature": 0,
        "top_p": 0.5,
        "seed": -7,
        "stop": ["\n\n", "END"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": 1,
        "logprobs": False,
        "user": "someone",  # unknown to us: ignored
        "presence_penalty": 0,
        "some_future_field": {"x": 1},
    }
    r = parse_request("chat", body, MODELS)
    assert r.kind == "chat" and r.model == "other" and r.prompt is None
    assert r.messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"},
                          {"role": "assistant", "content": ""}, {"role": "user", "content": ""})
    assert (r.max_tokens, r.temperature, r.top_p, r.seed) == (9, 0.0, 0.5, -7)
    assert isinstance(r.temperature, float) and isinstance(r.top_p, float)
    assert r.stop == ("\n\n", "END") and r.stream is True and r.include_usage is True


@pytest.mark.parametrize(("body", "expected"), [
    (chat(max_completion_tokens=5), 5),
    (chat(max_tokens=7), 7),
    (chat(max_completion_tokens=5, max_tokens=7), 5),  # the newer name wins
    (chat(max_completion_tokens=None, max_tokens=7), 7),
    (chat(max_tokens=None), None),
])
def test_chat_max_tokens_names(body, expected):
    assert parse_request("chat", body, MODELS).max_tokens == expected


def test_completion_ignores_max_completion_tokens():
    assert parse_request("completion", comp(max_completion_tokens=0), MODELS).max_tokens is None


@pytest.mark.parametrize(("body", "field", "expected"), [
    (comp(prompt=["one string"]), "prompt", "one string"),
    (comp(stop="\n"), "stop", ("\n",)),
    (comp(stop=[]), "stop", ()),
    (comp(stop=["a", "b", "c", "d"]), "stop", ("a", "b", "c", "d")),
    (comp(stop=None), "stop", ()),
    (comp(temperature=2), "temperature", 2.0),
    (comp(temperature=None), "temperature", 1.0),
    (comp(top_p=1), "top_p", 1.0),
    (comp(top_p=1e-9), "top_p", 1e-9),
    (comp(top_p=None), "top_p", 1.0),
    (comp(seed=0), "seed", 0),
    (comp(seed=2**63 - 1), "seed", 2**63 - 1),
    (comp(stream=False, stream_options=None), "stream", False),
    (comp(stream=None), "stream", False),
    (comp(stream=True, stream_options={}), "include_usage", False),
    (comp(stream=True, stream_options={"include_usage": False}), "include_usage", False),
    (comp(stream=True, stream_options={"include_usage": True}), "include_usage", True),
    (comp(best_of=1, echo=False, logprobs=None, n=None), "max_tokens", None),
    (comp(max_tokens=16), "max_tokens", 16),
])
def test_valid_completion_fields(body, field, expected):
    got = getattr(parse_request("completion", body, MODELS), field)
    assert got == expected and type(got) is type(expected)


def test_a_parsed_request_is_frozen():
    r = parse_request("chat", CHAT, MODELS)
    with pytest.raises(AttributeError):
        r.temperature = 0.0


# ---- responses -----------------------------------------------------------------------------------------------

REQ_CHAT = parse_request("chat", CHAT, MODELS)
REQ_COMP = parse_request("completion", COMP, MODELS)
REQ_CHAT_USAGE = parse_request("chat", chat(stream=True, stream_options={"include_usage": True}), MODELS)
REQ_COMP_USAGE = parse_request("completion", comp(stream=True, stream_options={"include_usage": True}), MODELS)
SPEC = {"drafted_tokens": 40, "accepted_tokens": 30, "mean_tokens_per_round": 3.5}


def test_ids():
    a, b = new_id("chat"), new_id("chat")
    assert a.startswith("chatcmpl-") and b.startswith("chatcmpl-") and a != b
    assert new_id("completion").startswith("cmpl-")


def test_usage():
    assert usage(3, 4, None) == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
                                 "prompt_tokens_details": {"cached_tokens": 0}}
    assert usage(3, 4, None, cached_tokens=2)["prompt_tokens_details"] == {"cached_tokens": 2}
    u = usage(3, 4, SPEC)
    assert u["speculative"] == {"drafted_tokens": 40, "accepted_tokens": 30, "acceptance_rate": 0.75,
                                "mean_tokens_per_round": 3.5}
    assert u["total_tokens"] == 7
    none_drafted = usage(1, 1, {"drafted_tokens": 0, "accepted_tokens": 0, "mean_tokens_per_round": 1.0})
    assert none_drafted["speculative"]["acceptance_rate"] is None


def test_full_chat_response_matches_openai():
    d = full_response(REQ_CHAT, "chatcmpl-1", 1700000000, "Hello!", "stop", usage(3, 2, SPEC))
    c = ChatCompletion.model_validate(d)
    assert c.object == "chat.completion" and c.id == "chatcmpl-1" and c.model == "smol" and c.created == 1700000000
    assert len(c.choices) == 1
    ch = c.choices[0]
    assert (ch.index, ch.finish_reason, ch.message.role, ch.message.content) == (0, "stop", "assistant", "Hello!")
    assert ch.logprobs is None
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) == (3, 2, 5)
    assert c.usage.model_extra["speculative"]["acceptance_rate"] == 0.75  # the extension survives the client
    assert "text" not in d["choices"][0]


def test_full_completion_response_matches_openai():
    d = full_response(REQ_COMP, "cmpl-1", 1700000000, " a time", "length", usage(2, 3, None))
    c = Completion.model_validate(d)
    assert c.object == "text_completion" and c.model == "smol"
    assert (c.choices[0].text, c.choices[0].finish_reason, c.choices[0].index) == (" a time", "length", 0)
    assert c.usage.total_tokens == 5
    assert "message" not in d["choices"][0]


def test_finish_reason_is_checked():
    with pytest.raises(ValueError):
        full_response(REQ_CHAT, "x", 0, "", "abort", None)
    with pytest.raises(ValueError):
        full_response(REQ_CHAT, "x", 0, "", None, None)
    with pytest.raises(ValueError):
        chunk(REQ_CHAT, "x", 0, "a", "eos", first=False)


def test_chat_stream_matches_openai():
    pieces = [chunk(REQ_CHAT, "chatcmpl-1", 5, None, None, first=True),
              chunk(REQ_CHAT, "chatcmpl-1", 5, "Hel", None, first=False),
              chunk(REQ_CHAT, "chatcmpl-1", 5, "lo", None, first=False),
              chunk(REQ_CHAT, "chatcmpl-1", 5, None, "stop", first=False)]
    parsed = [ChatCompletionChunk.model_validate(p) for p in pieces]
    assert all(p.object == "chat.completion.chunk" and p.id == "chatcmpl-1" and p.model == "smol" for p in parsed)
    assert parsed[0].choices[0].delta.role == "assistant" and parsed[0].choices[0].delta.content == ""
    assert all(p.choices[0].delta.role is None for p in parsed[1:])
    assert "".join(p.choices[0].delta.content or "" for p in parsed) == "Hello"
    assert [p.choices[0].finish_reason for p in parsed] == [None, None, None, "stop"]
    assert pieces[3]["choices"][0]["delta"] == {}
    assert all("usage" not in p for p in pieces)  # only with include_usage


def test_first_chat_chunk_can_carry_text():
    d = chunk(REQ_CHAT, "c", 5, "Hi", None, first=True)
    assert d["choices"][0]["delta"] == {"role": "assistant", "content": "Hi"}
    d = chunk(REQ_CHAT, "c", 5, "Hi", "length", first=True)
    assert ChatCompletionChunk.model_validate(d).choices[0].finish_reason == "length"


def strict_completion_chunk(d: dict) -> Completion:
    """Validate a text_completion chunk. The client's Completion type says finish_reason is never null, but
    OpenAI streams null until the last chunk, and the client builds stream chunks without validation (see
    test_the_openai_client_reads_our_streams); so a null is swapped for "stop" before validating the rest."""
    d = json.loads(json.dumps(d))
    for c in d["choices"]:
        assert "finish_reason" in c
        c["finish_reason"] = c["finish_reason"] or "stop"
    return Completion.model_validate(d)


def test_completion_stream_matches_openai():
    pieces = [chunk(REQ_COMP, "cmpl-1", 5, " a", None, first=True),
              chunk(REQ_COMP, "cmpl-1", 5, " time", None, first=False),
              chunk(REQ_COMP, "cmpl-1", 5, None, "length", first=False)]
    parsed = [strict_completion_chunk(p) for p in pieces]
    assert "".join(p.choices[0].text for p in parsed) == " a time"
    assert [p["choices"][0]["finish_reason"] for p in pieces] == [None, None, "length"]
    assert all(p.object == "text_completion" and p.id == "cmpl-1" for p in parsed)


@pytest.mark.parametrize(("req", "model"), [(REQ_CHAT_USAGE, ChatCompletionChunk), (REQ_COMP_USAGE, Completion)])
def test_include_usage_stream(req, model):
    c = chunk(req, "id-1", 5, "x", None, first=True)
    assert "usage" in c and c["usage"] is None  # OpenAI sends usage: null on every chunk
    validate = strict_completion_chunk if model is Completion else model.model_validate
    assert validate(c).usage is None
    u = usage_chunk(req, "id-1", 5, usage(4, 6, SPEC))
    assert u["choices"] == []
    parsed = validate(u)
    assert parsed.usage.total_tokens == 10 and parsed.choices == []
    assert parsed.object == ("chat.completion.chunk" if req.kind == "chat" else "text_completion")


def test_sse_framing():
    obj = {"a": "ü\n", "b": None}
    raw = sse(obj)
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n") and raw.count(b"\n") == 2  # one line of JSON
    assert json.loads(raw[len(b"data: "):].decode()) == obj
    assert SSE_DONE == b"data: [DONE]\n\n"
    with pytest.raises(ValueError):
        sse({"x": math.nan})


def client_for(handler):
    """The official client, talking to `handler(request) -> httpx.Response` instead of a network."""
    return openai.OpenAI(api_key="x", base_url="http://test/v1", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(handler)))


def stream_response(events: list[dict]) -> httpx.Response:
    body = b"".join(sse(e) for e in events) + SSE_DONE
    return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


def test_the_openai_client_reads_our_answers():
    def handler(request):
        body = json.loads(request.content)
        kind = "chat" if request.url.path.endswith("/chat/completions") else "completion"
        req = parse_request(kind, body, MODELS)
        return httpx.Response(200, json=full_response(req, new_id(kind), 7, "out", "length", usage(2, 1, SPEC)))

    client = client_for(handler)
    c = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert c.choices[0].message.content == "out" and c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 1 and c.id.startswith("chatcmpl-")
    t = client.completions.create(model="smol", prompt="p", max_tokens=1)
    assert t.choices[0].text == "out" and t.usage.prompt_tokens == 2 and t.id.startswith("cmpl-")


def test_the_openai_client_reads_our_streams():
    def handler(request):
        kind = "chat" if request.url.path.endswith("/chat/completions") else "completion"
        req = parse_request(kind, json.loads(request.content), MODELS)
        rid = new_id(kind)
        events = [chunk(req, rid, 7, "Hel", None, first=True), chunk(req, rid, 7, "lo", None, first=False),
                  chunk(req, rid, 7, None, "stop", first=False)]
        if req.include_usage:
            events.append(usage_chunk(req, rid, 7, usage(3, 2, SPEC)))
        return stream_response(events)

    client = client_for(handler)
    got = list(client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "hi"}],
                                              stream=True, stream_options={"include_usage": True}))
    assert got[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in got if c.choices) == "Hello"
    assert [c.choices[0].finish_reason for c in got if c.choices] == [None, None, "stop"]
    assert got[-1].choices == [] and got[-1].usage.total_tokens == 5
    assert got[-1].usage.model_extra["speculative"]["accepted_tokens"] == 30
    got = list(client.completions.create(model="smol", prompt="p", stream=True))
    assert "".join(c.choices[0].text for c in got) == "Hello" and got[-1].choices[0].finish_reason == "stop"
    assert all(c.usage is None for c in got)


@pytest.mark.parametrize(("body", "error", "param", "code"), [
    (chat(temperature=5), openai.BadRequestError, "temperature", None),
    (chat(model="nope"), openai.NotFoundError, "model", "model_not_found"),
])
def test_the_openai_client_reads_our_errors(body, error, param, code):
    def handler(request):
        try:
            parse_request("chat", json.loads(request.content), MODELS)
        except APIError as e:
            return httpx.Response(e.status, json=e.body())
        raise AssertionError("the request should not parse")

    with pytest.raises(error) as e:
        client_for(handler).chat.completions.create(**body)
    assert (e.value.param, e.value.code) == (param, code)
    assert e.value.type == ("invalid_request_error" if code is None else "not_found_error")


def test_models_list():
    d = models_list(["smol", "other"], 123)
    assert d["object"] == "list"
    ms = [Model.model_validate(m) for m in d["data"]]
    assert [m.id for m in ms] == ["smol", "other"] and all(m.created == 123 for m in ms)
    assert models_list([], 1) == {"object": "list", "data": []}
