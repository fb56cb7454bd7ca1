"""`specdec bench --endpoint URL --baseline URL`: the Spec-Bench report against servers. Stub servers on
127.0.0.1 (free ports, stopped at the end of each test) play vLLM (Prometheus counters) and llama-server
(per-response timings); a last test runs two real `specdec serve` processes on a tiny model."""

from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from specdec.cli import main
from specdec.client import counted, parse_prometheus, prometheus_series

PROMPTS = [{"question_id": 1, "category": "coding", "turns": ["fix a b", "and c"]},
           {"question_id": 2, "category": "writing", "turns": ["write d e"]},
           {"question_id": 3, "category": "writing", "turns": ["write f"]}]


class StubServer:
    """An OpenAI-compatible chat server whose answers depend only on the last user message. `per_chunk` tokens
    arrive per streamed chunk; each request adds `drafted`/`accepted` to vLLM-style counters at /metrics (split
    over two label sets), or reports them in llama-server's `timings` when `timings` is set."""

    def __init__(self, per_chunk: int, drafted: int = 0, accepted: int = 0, timings: bool = False,
                 tokens: int = 6, gap_s: float = 0.004, suffix: str = ""):
        self.per_chunk, self.drafted, self.accepted, self.timings = per_chunk, drafted, accepted, timings
        self.tokens, self.gap_s, self.suffix = tokens, gap_s, suffix
        self.counts = [0, 0, 0]  # drafted, accepted, drafts
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self):
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, status: int, body: str, kind: str = "application/json") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": "stub"}]}))
                elif self.path == "/metrics" and not stub.timings:
                    d, a, n = stub.counts
                    lines = ["# HELP vllm:spec_decode_num_draft_tokens_total x", "# TYPE x counter"]
                    for name, v in (("draft_tokens", d), ("accepted_tokens", a), ("drafts", n)):
                        lines += [f'vllm:spec_decode_num_{name}_total{{engine="0",model_name="stub"}} {v - v // 2}',
                                  f'vllm:spec_decode_num_{name}_total{{engine="1",model_name="stub"}} {v // 2}']
                    self._send(200, "\n".join(lines) + "\n", "text/plain")
                else:
                    self._send(404, json.dumps({"error": {"message": "no route"}}))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub.lock:
                    stub.bodies.append(body)
                words = body["messages"][-1]["content"].split()
                toks = [f"{w}{stub.suffix} " for w in (words * stub.tokens)[: stub.tokens]]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i in range(0, len(toks), stub.per_chunk):
                    time.sleep(stub.gap_s)
                    delta = {"content": "".join(toks[i:i + stub.per_chunk])}
                    self.wfile.write(f"data: {json.dumps({'choices': [{'index': 0, 'delta': delta}]})}\n\n".encode())
                    self.wfile.flush()
                last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": len(toks)}}
                if stub.timings:
                    last["timings"] = {"draft_n": stub.drafted, "draft_n_accepted": stub.accepted}
                with stub.lock:
                    stub.counts = [stub.counts[0] + stub.drafted, stub.counts[1] + stub.accepted,
                                   stub.counts[2] + (stub.drafted > 0)]
                self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())

        return Handler


@pytest.fixture
def prompts(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return q


@pytest.fixture
def stubs():
    made = []

    def make(**kw) -> StubServer:
        made.append(StubServer(**kw))
        return made[-1]

    yield make
    for s in made:
        s.stop()


def bench(prompts, tmp_path, endpoint, baseline, *extra) -> dict:
    out = tmp_path / "r.json"
    args = ["bench", "--prompts", str(prompts), "--endpoint", endpoint.url, "--max-new-tokens", "6",
            "--json", str(out), "--quiet", *extra]
    if baseline:
        args += ["--baseline", baseline.url]
    assert main(args) == 0
    return json.loads(out.read_text())


def test_prometheus_text_is_summed_over_label_sets():
    text = ('# HELP a x\nvllm:spec_decode_num_draft_tokens_total{engine="0"} 7\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="1"} 3.0\nplain_gauge 0.5\nbroken{x="1"} nan-ish\n')
    m = parse_prometheus(text)
    assert m["vllm:spec_decode_num_draft_tokens_total"] == 10 and m["plain_gauge"] == 0.5 and "broken" not in m
    after = {"vllm:spec_decode_num_draft_tokens_total": 15, "vllm:spec_decode_num_accepted_tokens_total": 4,
             "vllm:spec_decode_num_drafts_total": 2}
    assert counted(m, after) == (5, 4, 2) and counted({}, {"other": 1}) is None
    by_series = prometheus_series(text + 'timed{le="+Inf",q="a b"} 2 1712345678000\n')
    assert by_series == {'vllm:spec_decode_num_draft_tokens_total{engine="0"}': 7.0,
                         'vllm:spec_decode_num_draft_tokens_total{engine="1"}': 3.0, "plain_gauge": 0.5,
                         'timed{le="+Inf",q="a b"}': 2.0}  # a label value with a space; a timestamp after the value
    quoted = 'req{path="/v1/\\"x\\"",code="200"} 4\n'  # escapes in a label value are read and written back alike
    assert prometheus_series(quoted) == {'req{path="/v1/\\"x\\"",code="200"}': 4.0}


@pytest.fixture
def chunk_clock(monkeypatch):
    """The client's clock as a count of its readings: one a request sent, one a text chunk received, one a
    request ended. At concurrency 1 each chunk gap is then one step, and the round cost the report derives from
    the gaps is exact; timed, one stall among the baseline's 4 ms gaps could drive it below 0 (no curve)."""
    from specdec import client

    ticks = itertools.count()
    monkeypatch.setattr(client, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))


def test_endpoint_against_a_baseline_per_category_and_level(prompts, tmp_path, stubs, chunk_clock):
    spec, base = stubs(per_chunk=2, drafted=6, accepted=4), stubs(per_chunk=1)
    r = bench(prompts, tmp_path, spec, base, "--concurrency", "1,2", "--markdown", str(tmp_path / "r.md"),
              "--plot", str(tmp_path / "r.png"))
    assert [m["name"] for m in r["methods"]] == ["endpoint c=1", "baseline c=1", "endpoint c=2", "baseline c=2"]
    assert [m["baseline"] for m in r["methods"]] == ["baseline c=1", None, "baseline c=2", None]
    one, two = r["results"]["endpoint c=1"], r["results"]["endpoint c=2"]
    # at concurrency 1 the counters are read around each request: a per category; 6 tokens in 3 chunks of 2
    assert one["overall"]["alpha"] == pytest.approx(4 / 6) and one["categories"]["coding"]["alpha"] == 4 / 6
    assert one["overall"]["tokens_per_pass"] == pytest.approx(5 / 2) and one["overall"]["tokens"] == 4 * 6
    assert two["overall"]["alpha"] is None  # not per request at concurrency 2: the level's counters instead
    level2 = r["endpoint"]["levels"][1]
    assert level2["endpoint"]["counters"] == {"drafted": 4 * 6, "accepted": 4 * 4, "drafts": 4}
    assert level2["baseline"]["counters"] == {"drafted": 0, "accepted": 0, "drafts": 0}
    assert level2["endpoint"]["load"]["requests"] == 4 and level2["endpoint"]["load"]["concurrency"] == 2
    for res in (one, two):
        assert res["overall"]["identical_rate"] == 1.0 and res["overall"]["speedup"] > 0
        assert set(res["categories"]) == {"coding", "writing"}
    # the second turn is asked after the server's own first answer
    turn2 = [b["messages"] for b in spec.bodies if len(b["messages"]) == 3]
    assert turn2 and turn2[0][1] == {"role": "assistant", "content": "fix a b fix a b "}
    assert all(b["stream"] and b["temperature"] == 0 and b["max_tokens"] == 6 for b in spec.bodies + base.bodies)
    # the round cost at concurrency 1 is a cost curve `specdec plan` reads. Counted in chunk gaps: 4 turns of 2
    # gaps (S = 8, P = 8), 4 drafting rounds (D), the baseline's gaps one step each (T1 = 1): a drafting round
    # costs (S - (P - D) T1) / D = 1 plain step
    assert r["verify_cost"] == {"1": 1.0, "7": 1.0} and r["endpoint"]["round_cost"]["rows"] == 7
    assert main(["plan", "--alpha", "0.6", "--profile", str(tmp_path / "r.json")]) == 0
    md = (tmp_path / "r.md").read_text()
    assert "| endpoint c=2 |" in md and "c=2: throughput" in md and "counters: 24 drafted, 16 accepted" in md
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_llama_server_timings_and_text_that_differs(prompts, tmp_path, stubs, capsys):
    spec = stubs(per_chunk=3, drafted=5, accepted=2, timings=True, suffix="!")
    base = stubs(per_chunk=1, timings=True)
    r = bench(prompts, tmp_path, spec, base, "--categories", "writing")
    res = r["results"]["endpoint c=1"]["overall"]
    assert res["alpha"] == pytest.approx(2 / 5) and r["endpoint"]["levels"][0]["endpoint"]["counters"] is None
    assert res["identical_rate"] == 0.0
    m = res["mismatches"][0]
    assert m["turn"] == 0 and m["position"] == len("write") and (m["token"], m["baseline_token"]) == ("!", " ")
    # no counters at /metrics: no round cost, and `plan --profile` says why instead of only that it is missing
    assert "verify_cost" not in r and "no drafts" in r["endpoint"]["round_cost"]["why"]
    assert main(["plan", "--alpha", "0.6", "--profile", str(tmp_path / "r.json")]) == 2
    assert "the bench could not measure one: the endpoint's /metrics showed no drafts" in capsys.readouterr().err


def test_a_round_cost_that_chunks_cannot_give_says_why_or_is_clamped():
    from specdec.bench.runner import Sample
    from specdec.bench.serving.endpoint import round_cost

    def turns(method: str, times: list[float]) -> Sample:
        return Sample("1", "coding", method, [SimpleNamespace(token_times=times)])  # type: ignore[list-item]

    level = {"concurrency": 1, "baseline": {}, "endpoint": {"counters": {"drafted": 12, "accepted": 6, "drafts": 4}}}
    merged = [turns("endpoint c=1", [0.0, 1.0, 2.0]), turns("baseline c=1", [0.0, 1.0, 2.0])]  # 2 chunks, 4 rounds
    assert "4 drafting rounds in 2 streamed chunks" in round_cost([level], merged)["why"]
    # 5 chunk gaps in 0.5 s, 1 of them plain at 1 s a step: the drafting rounds would cost less than nothing
    noisy = [turns("endpoint c=1", [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]), turns("baseline c=1", [0.0, 1.0, 2.0])]
    cost = round_cost([level], noisy)
    assert cost["verify_cost"] == {"1": 1.0, "4": 1.0} and "less than a plain step" in cost["note"]
    assert "concurrency 1" in round_cost([{**level, "concurrency": 2}], merged)["why"]


def test_endpoint_without_a_baseline_and_bad_input(prompts, tmp_path, stubs, capsys):
    r = bench(prompts, tmp_path, stubs(per_chunk=2), None)
    assert [m["name"] for m in r["methods"]] == ["endpoint c=1"] and r["results"]["endpoint c=1"]["overall"][
        "speedup"] is None
    r = bench(prompts, tmp_path, stubs(per_chunk=1, tokens=0), stubs(per_chunk=1, tokens=0))  # empty answers
    assert r["results"]["endpoint c=1"]["overall"]["tokens"] == 0
    assert main(["bench", "--prompts", str(prompts), "--baseline", "http://127.0.0.1:9"]) == 2
    assert "--baseline needs --endpoint" in capsys.readouterr().err
    assert main(["bench", "--prompts", str(prompts), "--endpoint", "127.0.0.1:9"]) == 2
    assert "must start with http://" in capsys.readouterr().err


@pytest.mark.slow  # two servers in subprocesses
def test_against_two_specdec_servers_on_a_tiny_model(tmp_path, prompts):
    """Speculation on and off in two real `specdec serve` processes: identical text, acceptance from our
    counters, the same number of tokens."""
    from tests.conftest import write_tiny_model, write_word_tokenizer
    from tests.serving import JOIN_TEMPLATE, Server

    words = ["<unk>", "<eos>", *"fix a b and c write d e f".split()]
    folder = tmp_path / "m"
    folder.mkdir()
    write_tiny_model(folder, vocab=len(words), max_pos=128, std=0.3)
    write_word_tokenizer(folder, words)  # no chat template of its own: the servers are given one
    (tmp_path / "join.jinja").write_text(JOIN_TEMPLATE)
    chat = ("--chat-template", str(tmp_path / "join.jinja"))
    spec = Server(folder, "--policy", "always", "--k", "3", "--max-batch", "2", *chat)
    base = Server(folder, "--policy", "never", "--max-batch", "2", *chat)
    try:
        r = bench(prompts, tmp_path, spec, base, "--concurrency", "1,2")
    finally:
        codes = spec.stop(), base.stop()
    assert codes == (0, 0)
    for c in (1, 2):
        res = r["results"][f"endpoint c={c}"]["overall"]
        assert res["identical_rate"] == 1.0 and res["tokens"] == r["results"][f"baseline c={c}"]["overall"]["tokens"]
    counters = r["endpoint"]["levels"][0]["endpoint"]["counters"]
    assert counters["drafted"] > 0 and r["results"]["endpoint c=1"]["overall"]["drafted"] == counters["drafted"]
