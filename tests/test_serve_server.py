"""`specdec serve` end to end, driven by the official `openai` client: a tiny model served from a subprocess
bound to 127.0.0.1 on a free port, stopped by its process id. Request loops are bounded in count and time.

Checks the OpenAI shapes, greedy identity under concurrent load (every output equals the same request sent
alone), bad input (4xx with OpenAI-style bodies, and the server keeps serving), a full queue (503), clients
that disconnect mid-stream (their slots come back), SIGTERM (in-flight requests finish, then it exits),
and the prefix cache."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.serving import (
    CONTEXT,
    KEY,
    PROMPTS,
    Server,
    first_data,
    model_name,
    post,
    rss_bytes,
    write_served_model,
)

# a server in a subprocess per test or module: the `servers` part of the slow suites (make test-all)
pytestmark = pytest.mark.slow

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_served_model(tmp_path_factory.mktemp("serve-model"))


@pytest.fixture(scope="module")
def server(model_dir):
    s = Server(model_dir, "--k", "3", "--policy", "always", "--max-batch", "4", "--api-key", KEY,
               "--max-body-bytes", "65536", "--prefill-chunk", "4")
    yield s
    assert s.stop() == 0, s.output()


# ---- shapes -----------------------------------------------------------------------------------------------------

def test_chat_and_completions_with_and_without_streaming(server):
    c, name = server.client(), model_name(server)
    chat = c.chat.completions.create(model=name, messages=[{"role": "user", "content": PROMPTS[0]}],
                                     max_tokens=12, temperature=0)
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason in ("stop", "length")
    u = chat.usage
    assert u.prompt_tokens == 8 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    spec = u.model_extra["speculative"]
    assert spec["drafted_tokens"] >= spec["accepted_tokens"] >= 0 and spec["mean_tokens_per_round"] > 0
    comp = c.completions.create(model=name, prompt=PROMPTS[0], max_tokens=12, temperature=0)
    assert comp.choices[0].text == chat.choices[0].message.content  # the join template: the same prompt

    pieces, finish, usage = [], None, None
    for ch in c.chat.completions.create(model=name, messages=[{"role": "user", "content": PROMPTS[0]}],
                                        max_tokens=12, temperature=0, stream=True,
                                        stream_options={"include_usage": True}):
        if ch.usage is not None:
            usage = ch.usage
        for choice in ch.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == chat.choices[0].message.content and finish == chat.choices[0].finish_reason
    assert usage.completion_tokens == u.completion_tokens

    text = "".join(ch.choices[0].text for ch in c.completions.create(
        model=name, prompt=PROMPTS[0], max_tokens=12, temperature=0, stream=True))
    assert text == comp.choices[0].text


def test_a_shared_prefix_is_served_from_the_prefix_cache(server):
    """A second question on the same text reuses the first's keys and values (usage says how many prompt tokens
    were cached), and answers as it does when asked first (the cache does not change outputs)."""
    c, name = server.client(), model_name(server)
    doc = " ".join(f"w{(i * 7) % 30}" for i in range(40))
    ask = [doc + " w1 w2", doc + " w3"]
    first = [c.completions.create(model=name, prompt=p, max_tokens=8, temperature=0) for p in ask]
    assert first[1].usage.prompt_tokens_details.cached_tokens >= 40  # the document, as the first request left it
    again = c.completions.create(model=name, prompt=ask[1], max_tokens=8, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1  # all but the last
    assert again.choices[0].text == first[1].choices[0].text
    hits = [ln for ln in httpx.get(f"{server.url}/metrics").text.splitlines()
            if ln.startswith("specdec:prefix_cache_hits_total")]
    assert hits and float(hits[0].split()[-1]) >= 80


def test_paced_streams_carry_the_same_text_one_token_a_chunk(server):
    """stream_options.pace: auto, a fixed pace, off and none (the server's default: off) stream the same text as
    the whole response; paced, every chunk holds one token (the word tokenizer makes each token some text)."""
    name = model_name(server)
    for prompt in PROMPTS[:3]:
        body = {"model": name, "prompt": prompt, "max_tokens": 16, "temperature": 0}
        whole = post(server, "/v1/completions", body).json()
        for pace in ("auto", 2, "off", None):
            options = {"include_usage": True} | ({} if pace is None else {"pace": pace})
            r = post(server, "/v1/completions", {**body, "stream": True, "stream_options": options})
            assert r.status_code == 200, r.text
            chunks = [json.loads(ln[5:]) for ln in r.text.splitlines()
                      if ln.startswith("data:") and ln != "data: [DONE]"]
            pieces = [c["choices"][0]["text"] for c in chunks if c["choices"] and c["choices"][0]["text"]]
            assert "".join(pieces) == whole["choices"][0]["text"], (pace, pieces)
            if pace not in ("off", None):
                assert len(pieces) == chunks[-1]["usage"]["completion_tokens"], (pace, pieces)
    for bad in ("fast", 0, -3, True, {"ms": 5}):
        r = post(server, "/v1/completions", {"model": name, "prompt": "w1", "stream": True,
                                             "stream_options": {"pace": bad}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options.pace", (bad, r.text)


def test_max_tokens_and_stop(server):
    c, name = server.client(), model_name(server)
    answers = {p: c.completions.create(model=name, prompt=p, max_tokens=10, temperature=0) for p in PROMPTS}
    prompt, full = next((p, a) for p, a in answers.items() if a.choices[0].finish_reason == "length")
    assert full.usage.completion_tokens == 10
    for a in answers.values():  # the others ended at the end-of-sequence token
        assert a.choices[0].finish_reason == "stop" or a.usage.completion_tokens == 10
    words = full.choices[0].text.split()
    stop = words[3]
    cut = c.completions.create(model=name, prompt=prompt, max_tokens=10, temperature=0, stop=[stop])
    expect = full.choices[0].text[: full.choices[0].text.find(stop)]
    assert cut.choices[0].text == expect and cut.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=name, prompt=prompt, max_tokens=10, temperature=0, stop=[stop], stream=True))
    assert streamed == expect  # the stop string never leaks into the stream


def test_a_tiny_temperature_is_as_good_as_greedy(server):
    c, name = server.client(), model_name(server)
    greedy = c.completions.create(model=name, prompt=PROMPTS[0], max_tokens=12, temperature=0).choices[0].text
    assert c.completions.create(model=name, prompt=PROMPTS[0], max_tokens=12, temperature=1e-30,
                                seed=1).choices[0].text == greedy


def test_seeded_sampling_is_reproducible_and_varies_with_the_seed(server):
    c, name = server.client(), model_name(server)
    ask = lambda seed: c.completions.create(model=name, prompt=PROMPTS[1], max_tokens=16, temperature=1.0,
                                            seed=seed).choices[0].text
    assert ask(5) == ask(5)
    assert len({ask(s) for s in range(6)}) > 1


# ---- load: greedy identity --------------------------------------------------------------------------------------

def test_concurrent_load_loses_nothing_and_matches_requests_sent_alone(server):
    """16 clients x 3 requests (SPECDEC_LOAD=64x10 for the bigger run), mixed streaming and not, over 4 slots:
    every greedy output equals the same request sent alone, nothing is lost and nothing fails."""
    clients, per = (int(x) for x in os.environ.get("SPECDEC_LOAD", "16x3").split("x"))
    c, name = server.client(), model_name(server)
    alone = {p: c.completions.create(model=name, prompt=p, max_tokens=24, temperature=0).choices[0].text
             for p in PROMPTS}

    def client(i: int) -> list[tuple[str, str]]:
        out = []
        for j in range(per):
            p = PROMPTS[(i * per + j) % len(PROMPTS)]
            if (i + j) % 2:
                text = "".join(ch.choices[0].text for ch in c.completions.create(
                    model=name, prompt=p, max_tokens=24, temperature=0, stream=True))
            else:
                text = c.completions.create(model=name, prompt=p, max_tokens=24, temperature=0).choices[0].text
            out.append((p, text))
        return out

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = [r for f in [pool.submit(client, i) for i in range(clients)] for r in f.result(timeout=600)]
    assert len(results) == clients * per
    for p, text in results:
        assert text == alone[p], f"{p!r}: {text!r} != alone {alone[p]!r}"
    assert server.health()["running"] == 0


# ---- bad input --------------------------------------------------------------------------------------------------

LONG = " ".join(["w3"] * (CONTEXT + 5))


@pytest.mark.parametrize("path, body, status, param", [
    ("/v1/chat/completions", b"{not json", 400, None),
    ("/v1/chat/completions", {"model": "M"}, 400, "messages"),
    ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "w1"}]}, 404, "model"),
    ("/v1/chat/completions", {"model": "M", "messages": [{"role": "user", "content": "w1"}], "temperature": -1},
     400, "temperature"),
    ("/v1/chat/completions", {"model": "M", "messages": [{"role": "user", "content": "w1"}], "top_p": 0}, 400,
     "top_p"),
    ("/v1/chat/completions", {"model": "M", "messages": [{"role": "user", "content": "w1"}], "top_p": 1.5}, 400,
     "top_p"),
    ("/v1/chat/completions", {"model": "M", "messages": [{"role": "user", "content": "w1"}], "max_tokens": 0},
     400, "max_tokens"),
    ("/v1/chat/completions", {"model": "M", "messages": [{"role": "user", "content": "w1"}],
                              "max_tokens": CONTEXT}, 400, "max_tokens"),
    ("/v1/chat/completions", {"model": "M", "messages": [{"role": "user", "content": LONG}]}, 400, "messages"),
    ("/v1/completions", {"model": "M", "prompt": LONG}, 400, "prompt"),
    ("/v1/chat/completions", {"model": "M", "messages": [{"role": "user", "content": "w1"}], "n": 2}, 400, "n"),
    ("/v1/completions", {"model": "M", "prompt": "w1 " * 30000}, 413, None),
    ("/v1/completions", b'{"model": "M", "prompt": "w1 \\ud800"}', 400, None),
    ("/v1/completions", b"[" * 50000, 400, None),
], ids=["malformed-json", "no-messages", "unknown-model", "temperature", "top_p-0", "top_p-1.5", "max_tokens-0",
        "max_tokens-past-context", "prompt-past-context", "completion-past-context", "n", "too-large",
        "lone-surrogate", "nested-too-deep"])
def test_bad_input_gets_an_openai_error_and_the_server_keeps_serving(server, path, body, status, param):
    name = model_name(server)
    if isinstance(body, dict) and body.get("model") == "M":
        body = {**body, "model": name}
    r = post(server, path, body, raw=body if isinstance(body, bytes) else None)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param, err
    ok = post(server, "/v1/completions", {"model": name, "prompt": "w1 w2", "max_tokens": 2})
    assert ok.status_code == 200


@pytest.mark.parametrize("key", [None, "wrong"])
def test_a_wrong_or_missing_api_key_is_401(server, key):
    r = post(server, "/v1/completions", {"model": model_name(server), "prompt": "w1", "max_tokens": 2}, key=key)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        server.client(key).models.list()


def test_health_metrics_and_the_explainer_page(server):
    assert server.health()["status"] == "ok"
    metrics = httpx.get(server.url + "/metrics", timeout=5).text
    for name in ("specdec:spec_decode_num_drafts_total", "specdec:spec_decode_num_draft_tokens_total",
                 "specdec:spec_decode_num_accepted_tokens_total", "specdec:spec_decode_acceptance_rate",
                 "specdec:num_requests_running", "specdec:num_requests_waiting",
                 "specdec:time_to_first_token_seconds_bucket", "specdec:inter_token_latency_seconds_bucket",
                 "specdec:tokens_per_round_bucket", "specdec:batch_size_bucket",
                 'specdec:spec_decode_num_accepted_tokens_per_pos_total{position="0"}'):
        assert name in metrics, name
    drafted = next(float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith("specdec:spec_decode_num_draft_tokens_total"))
    assert drafted > 0  # earlier tests in this module speculated (policy always)
    page = httpx.get(server.url + "/", timeout=5)
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert httpx.get(server.url + "/app.js", timeout=5).status_code == 200
    assert httpx.get(server.url + "/nothing-here", timeout=5).json()["error"]["type"] == "not_found_error"


# ---- faults -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def long_model_dir(tmp_path_factory) -> Path:
    """The same tiny model with 2,048 positions, and an end-of-sequence token it cannot produce (an id past its
    vocabulary): a request that holds its slot for a while."""
    return write_served_model(tmp_path_factory.mktemp("serve-model-long"), context=2048, endless=True)


def test_a_full_queue_gets_503_not_a_hang(long_model_dir):
    s = Server(long_model_dir, "--max-batch", "1", "--max-queue", "0", "--policy", "never")
    try:
        name = model_name(s)
        body = {"model": name, "prompt": PROMPTS[1], "max_tokens": 2000, "temperature": 0, "stream": True}
        with httpx.Client(timeout=30) as h, h.stream("POST", s.url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()  # kept: dropping the iterator would close the stream
            first_data(lines)  # the first chunk arrived: it holds the only slot
            assert s.health()["running"] == 1
            busy = post(s, "/v1/completions", {"model": name, "prompt": "w1", "max_tokens": 2}, key=None)
            assert busy.status_code == 503, busy.text
            assert busy.json()["error"]["type"] == "overloaded_error"
            with pytest.raises(openai.InternalServerError):  # what the client sees: a 5xx it may retry
                s.client(None).completions.create(model=name, prompt="w1", max_tokens=2)
        deadline = time.monotonic() + 20  # the stream was dropped: the slot comes back
        while s.health()["running"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert s.client(None).completions.create(model=name, prompt="w1", max_tokens=2).usage.completion_tokens
    finally:
        s.stop()


def test_one_queue_rule_for_the_worker_and_the_step_loop(tiny_model):
    """In process, no HTTP: the worker refuses a request when the requests not yet in a slot (its inbox counting
    as waiting) outnumber the free slots by max_queue; the step loop's own admit refuses by the same rule, and
    admitting what the worker accepted never trips it."""
    import asyncio

    from specdec.engine.scheduler import Scheduler, SchedulerConfig
    from specdec.engine.sequence import GenerationConfig
    from specdec.serve.metrics import ServerMetrics
    from specdec.serve.worker import EngineWorker, QueueFull

    model, cfg = tiny_model("fp16", vocab=32), SchedulerConfig(max_batch=2, max_queue=3)
    sched = Scheduler(model, None, cfg=cfg)
    worker = EngineWorker(sched, ServerMetrics(1))  # not started: its inbox holds what is submitted
    loop = asyncio.new_event_loop()
    try:
        for _ in range(5):  # 2 free slots + 3 waiting
            worker.submit(worker.new_sequence([1, 2], GenerationConfig(4)), loop)
        with pytest.raises(QueueFull, match="at capacity"):
            worker.submit(worker.new_sequence([1, 2], GenerationConfig(4)), loop)
        assert worker.load == (0, 5)
        worker._take_inbox()  # what the engine thread does first: all five admitted, none refused
        worker._publish()
        assert worker.load == (0, 5) and worker.state["requests_open"] == 5 and worker.state["problems"] == []
        sched.step()  # two take the slots
        assert worker.load == (2, 3)
        with pytest.raises(QueueFull):
            worker.submit(worker.new_sequence([1, 2], GenerationConfig(4)), loop)
        with pytest.raises(QueueFull):
            sched.admit(sched.new_sequence([1, 2], GenerationConfig(4)))
    finally:
        loop.close()


def test_clients_that_disconnect_mid_stream_free_their_slots(long_model_dir):
    """Each request would run 2,000 tokens; its client hangs up after the first chunk. With 2 slots, ignored
    disconnects would leave many seconds of queued work; freed slots leave none, and memory stays flat."""
    n = int(os.environ.get("SPECDEC_DISCONNECTS", "20"))
    s = Server(long_model_dir, "--max-batch", "2", "--policy", "always", "--k", "3")
    try:
        name = model_name(s)
        body = {"model": name, "prompt": PROMPTS[1], "max_tokens": 2000, "temperature": 0, "stream": True}
        t0 = time.monotonic()
        full = s.client(None).completions.create(**{**body, "stream": False})
        one = time.monotonic() - t0  # what one request costs when nobody hangs up
        assert full.usage.completion_tokens == 2000
        rss = rss_bytes(s.proc.pid)
        for _ in range(n):
            with httpx.Client(timeout=30) as h, h.stream("POST", s.url + "/v1/completions", json=body) as r:
                assert r.status_code == 200
                first_data(r.iter_lines())  # the first chunk arrived; hang up
        deadline = time.monotonic() + min(3.0, one)
        while s.health()["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        h = s.health()
        assert {k: h[k] for k in ("status", "running", "waiting")} == {"status": "ok", "running": 0, "waiting": 0}, \
            f"one request takes {one:.2f} s"
        assert rss_bytes(s.proc.pid) - rss < 64 << 20
        assert s.client(None).completions.create(model=name, prompt="w1", max_tokens=2).usage.completion_tokens
    finally:
        s.stop()


def test_sigterm_finishes_requests_in_flight_then_exits(model_dir):
    s = Server(model_dir, "--max-batch", "2", "--policy", "never")
    name = model_name(s)
    body = {"model": name, "prompt": PROMPTS[1], "max_tokens": 60, "temperature": 1.0, "stream": True,
            "stream_options": {"include_usage": True}}
    chunks = []
    try:
        with httpx.Client(timeout=60) as h, h.stream("POST", s.url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            chunks.append(first_data(lines))
            s.proc.send_signal(signal.SIGTERM)
            chunks += [line for line in lines if line.startswith("data:")]
        assert chunks[-1] == "data: [DONE]"
        usage = json.loads(chunks[-2][5:])["usage"]
        finish = [json.loads(c[5:])["choices"][0]["finish_reason"] for c in chunks[:-2]]
        assert finish[-1] in ("stop", "length") and usage["completion_tokens"] >= 1
        assert s.proc.wait(30) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(s.url + "/health", timeout=2)
    finally:
        s.stop()


def test_a_draft_model_server_under_auto_gives_the_same_greedy_text(server, model_dir):
    """The other drafter and the other policy: a draft model (here the target itself, so drafts are accepted)
    under `auto` answers exactly as the n-gram server under `always`."""
    name = model_name(server)
    expected = [server.client().completions.create(model=name, prompt=p, max_tokens=16, temperature=0)
                .choices[0].text for p in PROMPTS[:3]]
    s = Server(model_dir, "--drafter", "draft-model", "--draft-model", str(model_dir), "--policy", "auto",
               "--max-batch", "2", "--k", "3")
    try:
        got = [s.client(None).completions.create(model=name, prompt=p, max_tokens=16, temperature=0)
               for p in PROMPTS[:3]]
        assert [g.choices[0].text for g in got] == expected
        assert sum(g.usage.model_extra["speculative"]["accepted_tokens"] for g in got) > 0
    finally:
        s.stop()
