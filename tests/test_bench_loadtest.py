"""`specdec loadtest` against a stub OpenAI-compatible server on 127.0.0.1 (a ThreadingHTTPServer in a daemon
thread): request counts, in-flight concurrency seen by the server, token counting with and without usage,
latency definitions, failures, the command line and its errors."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from specdec.bench.serving.load_types import MAX_ERRORS, LevelResult, LoadConfig, RequestResult
from specdec.bench.serving.loadtest import run, run_level, summarize
from specdec.bench.serving.loadtest_cli import register
from specdec.bench.serving.loadtest_report import markdown, markdown_series, plot_series, to_json
from specdec.client import run_async
from specdec.errors import SpecdecError
from specdec.measure import percentile

MODEL = "stub-model"
PROMPTS = [f"prompt {i}" for i in range(5)]


class Stub:
    """The server's behaviour (changed by tests between requests) and what it saw."""

    def __init__(self) -> None:
        self.tokens = 4  # text chunks per response
        self.delay_s = 0.02  # before the first text chunk (a role-only chat chunk goes out at once)
        self.gap_s = 0.005  # between text chunks
        self.usage = True  # send usage (completion_tokens = 2 * tokens) when the client asks for it
        self.fail_every = 0  # every n-th request answers fail_status
        self.fail_status = 500
        self.api_key: str | None = None  # when set, requests without 'Bearer KEY' get 401
        self.lock = threading.Lock()
        self.reset()

    def reset(self, gather: int = 0) -> None:
        """gather: hold the first requests until this many are in flight at once (60 s at most), so that a test of
        the client's concurrency does not depend on requests of ~35 ms overlapping on a busy machine."""
        self.seen: list[tuple[str, dict, str | None]] = []  # (path, body, Authorization header)
        self.in_flight = self.max_in_flight = 0
        self.gather, self.gathered = gather, threading.Event()

    def enter(self, path: str, body: dict, auth: str | None) -> int:
        with self.lock:
            self.seen.append((path, body, auth))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if self.in_flight >= self.gather:
                self.gathered.set()
            n = len(self.seen)
        if not self.gathered.wait(60):  # only a bound on a hang: a client short of its concurrency
            self.gathered.set()  # ... lets the rest through at once, and fails on max_in_flight
        return n

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1


def make_handler(stub: Stub):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _json(self, status: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _sse(self, obj) -> None:
            self.wfile.write(f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode())
            self.wfile.flush()

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            n = stub.enter(self.path, body, self.headers.get("Authorization"))
            try:
                if stub.api_key and self.headers.get("Authorization") != f"Bearer {stub.api_key}":
                    self._json(401, {"error": {"message": "invalid api key", "type": "auth"}})
                elif stub.fail_every and n % stub.fail_every == 0:
                    self._json(stub.fail_status, {"error": {"message": f"stub failure {n}"}})
                elif self.path not in ("/v1/chat/completions", "/v1/completions"):
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                elif body.get("stream"):
                    self._stream(body)
                else:
                    time.sleep(stub.delay_s + stub.gap_s * (stub.tokens - 1))
                    text = "".join(f"t{i} " for i in range(stub.tokens))
                    choice = {"index": 0, "finish_reason": "length"}
                    choice.update({"message": {"role": "assistant", "content": text}} if "messages" in body
                                  else {"text": text})
                    self._json(200, {"choices": [choice], "usage": {"completion_tokens": 2 * stub.tokens}})
            finally:
                if not getattr(self, "left", False):
                    stub.leave()

        def _stream(self, body: dict) -> None:
            chat = "messages" in body
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            if chat:
                self._sse({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]})
            self.wfile.write(b": keep-alive\n\n")
            time.sleep(stub.delay_s)
            for i in range(stub.tokens):
                if i:
                    time.sleep(stub.gap_s)
                choice = {"index": 0, "delta": {"content": f"t{i} "}} if chat else {"index": 0, "text": f"t{i} "}
                self._sse({"choices": [choice], "usage": None})
            if stub.usage and (body.get("stream_options") or {}).get("include_usage"):
                self._sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2 * stub.tokens}})
            stub.leave()  # before the last event: a client may send its next request as soon as it reads it
            self.left = True
            self._sse("[DONE]")

    return Handler


@pytest.fixture
def stub():
    """A running stub; yields (Stub, base URL) and stops the server afterwards."""
    state = Stub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    server.daemon_threads = True
    server.request_queue_size = 64
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def level(cfg: LoadConfig, c: int) -> LevelResult:
    return run_async(run_level(cfg, PROMPTS, c))


# ---- statistics ------------------------------------------------------------------------------------------------

def test_percentile_matches_numpy_linear():
    rng = random.Random(0)
    for n in (1, 2, 3, 7, 20):
        xs = [rng.uniform(0, 10) for _ in range(n)]
        for q in (0, 1, 25, 50, 90, 99, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), abs=1e-12)
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0], 50) == 1.5
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_by_hand():
    records = [
        RequestResult(ok=True, status=200, e2e_s=1.0, ttft_s=0.2, chunk_s=[0.2, 0.5, 1.0], tokens=5),
        RequestResult(ok=True, status=200, e2e_s=2.0, ttft_s=0.4, chunk_s=[0.4, 0.6], tokens=3),
        RequestResult(ok=True, status=200, e2e_s=0.5, ttft_s=0.5, chunk_s=[], tokens=7),  # non-streamed
    ] + [RequestResult(status=500, error=f"HTTP 500: e{i}", e2e_s=0.1) for i in range(MAX_ERRORS + 2)]
    r = summarize(3, records, wall_s=4.0)
    assert (r.requests, r.failed, r.output_tokens) == (3 + MAX_ERRORS + 2, MAX_ERRORS + 2, 15)
    assert r.throughput_tok_s == pytest.approx(15 / 4.0)
    assert r.errors == [f"HTTP 500: e{i}" for i in range(MAX_ERRORS)]
    assert r.itl_p50_s == pytest.approx(0.3)  # gaps 0.3, 0.5, 0.2
    assert r.itl_p99_s == pytest.approx(float(np.percentile([0.3, 0.5, 0.2], 99)))
    assert r.tpot_mean_s == pytest.approx(((1.0 - 0.2) / 4 + (2.0 - 0.4) / 2) / 2)  # streamed requests only
    assert r.ttft_p50_s == pytest.approx(0.4) and r.e2e_p50_s == pytest.approx(1.0)
    empty = summarize(1, [RequestResult(error="x")], wall_s=1.0)
    assert empty.ttft_p50_s is None and empty.itl_p50_s is None and empty.tpot_mean_s is None


# ---- configuration ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, message", [
    ({"url": "localhost:8000"}, "http:// or https://"),
    ({"concurrency": ()}, "concurrency levels must be integers >= 1"),
    ({"concurrency": (1, 0)}, "concurrency levels must be integers >= 1"),
    ({"requests_per_client": 0}, "--requests-per-client must be >= 1"),
    ({"max_tokens": 0}, "--max-tokens must be >= 1"),
    ({"endpoint": "embeddings"}, "--endpoint must be one of chat, completions"),
    ({"timeout_s": 0.0}, "--timeout must be > 0"),
    ({"temperature": -1.0}, "--temperature must be >= 0"),
])
def test_config_rejects(kw, message):
    with pytest.raises(SpecdecError, match=message.replace("+", r"\+")):
        LoadConfig(**{"url": "http://127.0.0.1:1", "concurrency": (1,), **kw})


def test_api_base():
    base = lambda url: LoadConfig(url=url, concurrency=[1]).api_base
    assert base("http://h:8000") == "http://h:8000/v1"
    assert base("http://h:8000/") == "http://h:8000/v1"
    assert base("https://h/v1") == "https://h/v1"
    assert base("https://h/v1/") == "https://h/v1"
    assert LoadConfig(url="http://h", concurrency=[1, 2]).concurrency == (1, 2)


# ---- levels against the stub -----------------------------------------------------------------------------------

def test_streamed_levels_with_usage(stub):
    state, url = stub
    cfg = LoadConfig(url=url, concurrency=(1, 2, 4), requests_per_client=2, max_tokens=16, seed=7)
    for c in cfg.concurrency:
        state.reset(gather=c)
        r = level(cfg, c)
        assert len(state.seen) == r.requests == c * 2
        assert state.max_in_flight == c
        assert r.failed == 0 and r.errors == []
        assert r.output_tokens == c * 2 * (2 * state.tokens)  # usage.completion_tokens, not the chunk count
        assert r.throughput_tok_s == pytest.approx(r.output_tokens / r.wall_s)
        # the role-only chunk goes out before the delay: TTFT counts from the first chunk with text
        assert state.delay_s <= r.ttft_p50_s <= r.ttft_p99_s
        assert r.ttft_p50_s <= r.e2e_p50_s and r.ttft_p99_s <= r.e2e_p99_s
        assert r.itl_p50_s > 0 and r.itl_p99_s >= r.itl_p50_s
        assert 0 < r.tpot_mean_s < r.e2e_p99_s
        expected = Counter(PROMPTS[i % len(PROMPTS)] for i in range(c * 2))
        assert Counter(body["messages"][0]["content"] for _, body, _ in state.seen) == expected
        for path, body, auth in state.seen:
            assert path == "/v1/chat/completions" and auth is None
            assert body["model"] == MODEL and body["max_tokens"] == 16 and body["seed"] == 7
            assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
            assert body["messages"][0]["role"] == "user" and body["temperature"] == 0.0


def test_streamed_completions_without_usage_count_chunks(stub):
    state, url = stub
    state.usage, state.tokens = False, 5
    r = level(LoadConfig(url=url + "/v1", concurrency=(3,), requests_per_client=1, endpoint="completions",
                         model="named"), 3)
    assert r.requests == 3 and r.failed == 0
    assert r.output_tokens == 3 * 5
    assert r.tpot_mean_s > 0 and r.ttft_p50_s >= state.delay_s
    assert {p for p, _, _ in state.seen} == {"/v1/completions"}
    assert all(b["model"] == "named" and b["prompt"] in PROMPTS and "messages" not in b for _, b, _ in state.seen)


def test_not_streamed(stub):
    state, url = stub
    cfg = LoadConfig(url=url, concurrency=(2,), requests_per_client=2, stream=False)
    state.reset(gather=2)
    r = level(cfg, 2)
    assert r.requests == len(state.seen) == 4 and state.max_in_flight == 2
    assert r.output_tokens == 4 * 2 * state.tokens
    assert r.ttft_p50_s == r.e2e_p50_s and r.ttft_p99_s == r.e2e_p99_s  # TTFT = E2E without streaming
    assert r.itl_p50_s is None and r.tpot_mean_s is None
    assert all(b["stream"] is False and "stream_options" not in b for _, b, _ in state.seen)


def test_failures_are_counted_and_reported(stub):
    state, url = stub
    state.fail_every = 3
    r = level(LoadConfig(url=url, concurrency=(2,), requests_per_client=3, model=MODEL), 2)
    assert r.requests == 6 and r.failed == 2
    assert r.output_tokens == 4 * 2 * state.tokens  # the four that succeeded
    assert sorted(r.errors) == ["HTTP 500: stub failure 3", "HTTP 500: stub failure 6"]
    assert "HTTP 500: stub failure 3" in markdown([r])


def test_every_request_failing_raises_with_the_first_error(stub):
    state, url = stub
    state.api_key = "sekret"
    cfg = LoadConfig(url=url, concurrency=(1, 2), requests_per_client=2, model=MODEL)
    with pytest.raises(SpecdecError, match="all 2 requests failed at concurrency 1 .*HTTP 401: invalid api key"):
        run(cfg, PROMPTS)
    state.reset()
    results = run(replace(cfg, api_key="sekret"), PROMPTS)
    assert [(r.concurrency, r.requests, r.failed) for r in results] == [(1, 2, 0), (2, 4, 0)]
    assert len(state.seen) == 6 and {auth for _, _, auth in state.seen} == {"Bearer sekret"}


def test_unreachable_server_is_one_clear_line():
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(SpecdecError, match=r"cannot reach http://127\.0\.0\.1:\d+/v1/models: ConnectError") as e:
        run(LoadConfig(url=url, concurrency=(1,)), PROMPTS)
    assert "\n" not in str(e.value)
    with pytest.raises(SpecdecError, match="all 3 requests failed at concurrency 1 .*ConnectError") as e:
        run(LoadConfig(url=url, concurrency=(1,), model="m"), PROMPTS)
    assert "\n" not in str(e.value)


def test_run_level_rejects_bad_input(stub):
    _, url = stub
    cfg = LoadConfig(url=url, concurrency=(1,), model=MODEL)
    with pytest.raises(SpecdecError, match="concurrency must be >= 1"):
        run_async(run_level(cfg, PROMPTS, 0))
    with pytest.raises(SpecdecError, match="no prompts"):
        run_async(run_level(cfg, [], 1))


# ---- reports ---------------------------------------------------------------------------------------------------

def fake_level(c: int, tok_s: float, itl: float | None) -> LevelResult:
    return LevelResult(concurrency=c, requests=2 * c, failed=0, wall_s=1.0, output_tokens=int(tok_s),
                       throughput_tok_s=tok_s, ttft_p50_s=0.01 * c, ttft_p99_s=0.02 * c, itl_p50_s=itl,
                       itl_p99_s=itl and 2 * itl, tpot_mean_s=itl, e2e_p50_s=0.5, e2e_p99_s=0.9, errors=[])


def test_markdown_and_plot_series(tmp_path):
    series = {"never": [fake_level(1, 100.0, 0.01), fake_level(4, 300.0, 0.02)],
              "auto": [fake_level(1, 150.0, None), fake_level(4, 320.0, None)]}
    table = markdown_series(series)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "concurrency" not in line]
    assert [row.split(" | ")[0] for row in rows] == ["| never", "| never", "| auto", "| auto"]
    assert "| auto | 1 | 2 | 0 | 150 | 150.0 | 10.0 | 20.0 | - | - | - | 0.50 | 0.90 |" in table
    single = markdown(series["never"])
    assert single.splitlines()[0].startswith("| concurrency |") and "never" not in single
    path = tmp_path / "series.png"
    plot_series(series, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert to_json(series["never"])["levels"][1]["throughput_tok_s"] == 300.0


# ---- command line ----------------------------------------------------------------------------------------------

def cli(argv: list[str]) -> int:
    from specdec.cli import Parser  # its error() raises SpecdecError, as `specdec` does

    parser = Parser(prog="specdec")
    register(parser.add_subparsers(dest="command", parser_class=Parser))
    args = parser.parse_args(["loadtest", *argv])
    return args.func(args)


def write_spec_bench(path) -> None:
    rows = [{"question_id": i, "category": "qa", "turns": [f"first {i}", f"second {i}"]} for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_cli_writes_json_markdown_png(stub, tmp_path, capsys):
    state, url = stub
    prompts = tmp_path / "q.jsonl"
    write_spec_bench(prompts)
    out_json, out_md, out_png = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "r.png"
    assert cli(["--url", url, "--concurrency", "1,2", "--prompts", str(prompts), "--requests-per-client", "2",
                "--max-tokens", "8", "--api-key", "k", "--json", str(out_json), "--markdown", str(out_md),
                "--plot", str(out_png)]) == 0
    assert len(state.seen) == 1 * 2 + 2 * 2
    assert {b["messages"][0]["content"] for _, b, _ in state.seen} == {"first 0", "first 1", "first 2"}
    report = json.loads(out_json.read_text())
    assert [(lv["concurrency"], lv["requests"], lv["failed"]) for lv in report["levels"]] == [(1, 2, 0), (2, 4, 0)]
    assert report["config"]["model"] == MODEL and report["config"]["api_key"] == "(set)"
    assert {"cpu", "cores", "git", "command", "date_utc"} <= set(report["machine"])  # the client's machine
    assert "\"k\"" not in out_json.read_text()
    stdout = capsys.readouterr().out
    assert out_md.read_text() in stdout
    assert sum(line.startswith(("| 1 |", "| 2 |")) for line in out_md.read_text().splitlines()) == 2
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, message", [
    (["--concurrency", "1,x,0"], "--concurrency: expected comma-separated integers, got '1,x,0'"),
    (["--concurrency", "1,0"], "--concurrency: expected integers >= 1"),
    (["--url", "127.0.0.1:8000"], "--url must start with http:// or https://"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1"),
    (["--max-tokens", "many"], "argument --max-tokens: invalid int value"),
    (["--requests-per-client", "0"], "--requests-per-client must be >= 1"),
    (["--endpoint", "embeddings"], "argument --endpoint: invalid choice"),
    (["--prompts", "/nonexistent/q.jsonl"], "prompt file not found"),
    (["--json", "/nonexistent/dir/r.json"], "its folder does not exist"),
    (["--servers", "always"], "give either --url .* or --servers"),
    (["--k", "3"], "--k apply to --servers, not to --url"),
    (["--skip-prefill", "--quick"], "--skip-prefill, --quick apply to --servers"),
])
def test_cli_bad_arguments(tmp_path, argv, message):
    prompts = tmp_path / "q.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    base = {"--url": f"http://127.0.0.1:{closed_port()}", "--prompts": str(prompts), "--model": "m"}
    base.update(dict(zip(argv[::2], argv[1::2])))
    with pytest.raises(SpecdecError, match=message.replace("+", r"\+")) as e:
        cli([x for kv in base.items() for x in kv])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("argv, message", [
    ([], "give either --url .* or --servers"),
    (["--servers", "--model", "m"], "--model apply to --url, not to --servers"),
    (["--servers", "--no-stream", "--seed", "1"], "--no-stream, --seed apply to --url"),
    (["--servers", "never,sometimes"], "--servers must name some of never, always, auto"),
    (["--servers", "--copy-concurrency", "1,x"], "--copy-concurrency: expected comma-separated integers"),
])
def test_cli_servers_mode_refuses_before_starting_anything(tmp_path, argv, message):
    prompts = tmp_path / "q.jsonl"
    write_spec_bench(prompts)
    with pytest.raises(SpecdecError, match=message) as e:
        cli(["--prompts", str(prompts), *argv])
    assert "\n" not in str(e.value)


def test_serve_bench_goals_and_counter_deltas():
    from specdec.bench.serving.serve_bench import counter_deltas
    from specdec.bench.serving.serve_report import PolicyRun, ServeBenchRun, ServeLevel, goal_lines, goals, report

    before = {"specdec:spec_decode_num_draft_tokens_total": 10, "specdec:spec_decode_num_accepted_tokens_total": 5,
              "specdec:generation_tokens_total": 100, "specdec:batch_size_count": 10, "specdec:batch_size_sum": 20}
    after = {"specdec:spec_decode_num_draft_tokens_total": 50, "specdec:spec_decode_num_accepted_tokens_total": 35,
             "specdec:generation_tokens_total": 180, "specdec:batch_size_count": 30, "specdec:batch_size_sum": 80,
             "specdec:spec_decode_num_drafts_total": 8}
    d = counter_deltas(before, after)
    assert d["counters"]["draft_tokens"] == 40 and d["acceptance_rate"] == 30 / 40
    assert d["draft_tokens_per_output_token"] == 40 / 80 and d["mean_batch"] == 60 / 20
    assert d["mean_accepted_per_draft"] == 30 / 8 and d["drafting_share"] == 8 / 60

    def rec(c, tok_s):
        return ServeLevel(**vars(fake_level(c, tok_s, 0.01)), loadavg_1m=1.0)

    tp = {"never": (100, 300), "always": (150, 250), "auto": (149, 295)}  # throughput at c=1 and c=4
    policies = {p: PolicyRun({"mixed": [rec(1, a), rec(4, b)], "copy": [rec(1, a)]}, startup_s=1.0)
                for p, (a, b) in tp.items()}
    checks = goals(policies)
    assert [(g.goal, g.set, g.concurrency, g.passed) for g in checks] == [
        ("a", "mixed", 1, True), ("a", "mixed", 4, True), ("a", "copy", 1, True), ("b", "copy", 1, True)]
    policies["auto"].sets["mixed"][1].throughput_tok_s = 280.0  # more than 3% under never's 300
    assert [g.passed for g in goals(policies)][1] is False
    assert goal_lines(goals(policies))[1].startswith("FAIL (a) mixed c=4: auto 280.0 tok/s")
    result = ServeBenchRun({"k": 5, "max_batch": 16, "max_tokens": 64, "auto_profile": None}, [1.0],
                           {"mixed": ["a", "b"], "copy": ["c"]}, {"mixed": [1, 4], "copy": [1]}, policies,
                           {"read_GBps": 10.0, "read_GBps_best": 11.0, "copy_GBps": 5.0}, loadavg_end=[2.0],
                           goals=goals(policies))
    text = report(result)
    assert "## Prompt set `mixed` (2 prompts)" in text and "| 1 | 1.490 | 0.993 | 1.500 |" in text
    # the JSON it writes reads back to the same result, the goal's "pass" under its JSON name
    data = json.loads(json.dumps(result.to_json()))
    assert data["goals"][0]["pass"] is True and ServeBenchRun.from_json(data) == result
    assert report(ServeBenchRun.from_json(data)) == text


def test_the_chunked_prefill_table_says_when_the_streams_ended_before_the_window():
    """Once the server decoded 4x faster, 200-token background streams ended before the long prompt's first token
    and the section measured nothing without saying so."""
    from specdec.bench.serving.serve_report import PrefillChunkRun, PrefillRun, PrefillTrial, prefill_table

    def pre(through):
        trial = PrefillTrial(1490, 1.0, 1.0, [0.04, 0.04, 0.05], 0.006, through, [1500] * 4)
        run = PrefillChunkRun(64, [trial], 1.0, 1.0, 3, 0.04, 0.05, 0.05, 0.006)
        return PrefillRun(1500, {"64": run})

    assert "| 64 | 1490 | 1000.0 | 4 | 3 |" in prefill_table(pre(4)) and "ended" not in prefill_table(pre(4))
    assert "Some streams ended before" in prefill_table(pre(0))
