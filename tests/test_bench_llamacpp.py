"""`specdec bench --compare llama.cpp`: the Python side against a fake worker (a small Python script that speaks
the worker's JSON-lines protocol), so that it runs without node or node-llama-cpp: the protocol, the timings in a
Turn, the report (speedups over our plain, identity shown as information), every way the worker can fail. One
test runs the real worker (llamacpp_worker.mjs) on the bundled GGUF where node and node-llama-cpp are installed."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from specdec.bench.engines import llamacpp_compare as lc
from specdec.bench.engines.llamacpp_compare import LlamaCppWorker, llamacpp_method, llamacpp_methods, turn_from_reply
from specdec.bench.prompts import Prompt
from specdec.bench.records import OVERALL
from specdec.bench.render import leaderboard, markdown
from specdec.bench.report import build_report
from specdec.bench.runner import mark_identity, run_bench
from specdec.cli import main
from specdec.errors import SpecdecError
from tests.test_bench_runner import WordTokenizer, fake_method

# FAKE_MODE: ok | no_ready | crash | die (at request FAKE_AT) | bad_json | hang | wrong_id | error
# FAKE_ANSWER: answer with these characters' codes (WordTokenizer); else cycle through the prompt's tokens.
# Plain: a token every 50 ms from 50 ms on. Lookup: the same, but tokens 2-3, 4-5, ... arrive in pairs.
FAKE = r'''
import json, os, sys, time
mode, log, answer = os.environ.get("FAKE_MODE", "ok"), os.environ.get("FAKE_LOG"), os.environ.get("FAKE_ANSWER")
if mode == "no_ready":
    print(json.dumps({"ready": False, "error": "cannot load x.gguf"}), flush=True)
    sys.exit(1)
if mode == "crash":
    sys.stderr.write("fake worker: crashed while loading\n")
    sys.exit(3)
threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1
print(json.dumps({"ready": True, "model": "fake", "type": "fake Q4_1", "threads": threads,
                  "node_llama_cpp": "3.22.1", "llama_cpp": "test", "gguf": "x.gguf"}), flush=True)
n = 0
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "quit":
        break
    n += 1
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(req) + "\n")
    if mode == "die" and n == int(os.environ.get("FAKE_AT", "1")):
        sys.stderr.write("fake worker: out of memory\n")
        sys.exit(7)
    if mode == "bad_json":
        print("this is not json", flush=True)
        continue
    if mode == "hang":
        time.sleep(60)
    if mode == "error":
        print(json.dumps({"id": req["id"], "ok": False, "error": "1000 tokens do not fit"}), flush=True)
        continue
    m, ids = req["max_tokens"], req["tokens"]
    toks = [ord(c) for c in (answer * m)[:m]] if answer else [ids[i % len(ids)] for i in range(m)]
    lookup = req["lookup"]
    times = [0.05 + 0.05 * ((i + 1) // 2 if lookup else i) for i in range(m)]
    print(json.dumps({"id": 999 if mode == "wrong_id" else req["id"], "ok": True, "prompt_tokens": len(ids),
                      "tokens": toks, "text": "", "finish": "length", "ttft_s": times[0], "seconds": times[-1],
                      "token_times": times, "drafted": m if lookup else None,
                      "accepted": m // 2 if lookup else None}), flush=True)
'''


@pytest.fixture
def fake(tmp_path):
    """fake(mode, **env) -> a started LlamaCppWorker running the fake script; all are stopped afterwards."""
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE)
    started = []

    def start(mode="ok", timeout_s=60.0, **env):  # 60 s: only a bound on a hang
        env = {"FAKE_MODE": mode, **{f"FAKE_{k.upper()}": str(v) for k, v in env.items()}}
        w = LlamaCppWorker([sys.executable, str(script), "--threads", "2"], env=env, timeout_s=timeout_s)
        started.append(w)
        return w

    yield start
    for w in started:
        w.close()


# --- protocol and timings ----------------------------------------------------------------------------------------


def test_methods_send_our_token_ids_and_read_timings_into_turns(fake, tmp_path):
    log = tmp_path / "requests.jsonl"
    worker = fake(log=log)
    assert worker.info["threads"] == 2 and worker.info["node_llama_cpp"] == "3.22.1"
    methods, info = llamacpp_methods(worker, WordTokenizer(), 4, 1, 3)
    assert [(m.name, m.family, m.baseline, m.k) for m in methods] == [
        ("llama.cpp plain", "llama.cpp", "plain", None), ("llama.cpp lookup k=4", "llama.cpp", "plain", 4)]
    assert info["k"] == 4 and info["ngram_min"] == 1 and info["ngram_max"] == 3 and info["type"] == "fake Q4_1"

    plain = methods[0].generate([104, 105], 4)
    assert plain.prompt_ids == [104, 105] and plain.token_ids == [104, 105, 104, 105]
    assert plain.text == "hihi"  # decoded by our tokenizer
    assert plain.finish == "length" and plain.tokens == 4 and not plain.chunked
    assert plain.ttft_s == pytest.approx(0.05) and plain.seconds == pytest.approx(0.2)
    assert plain.token_times == pytest.approx([0.05, 0.1, 0.15, 0.2])
    assert plain.drafted is None and plain.accepted is None and plain.rounds is None

    look = methods[1].generate([104, 105], 5)
    assert look.token_times == pytest.approx([0.05, 0.1, 0.1, 0.15, 0.15]) and look.seconds == pytest.approx(0.15)
    assert (look.drafted, look.accepted) == (5, 2)

    sent = [json.loads(x) for x in log.read_text().splitlines()]
    assert sent == [{"id": 1, "tokens": [104, 105], "max_tokens": 4, "lookup": False},
                    {"id": 2, "tokens": [104, 105], "max_tokens": 5, "lookup": True, "k": 4, "ngram_min": 1,
                     "ngram_max": 3}]
    assert worker.close() == 0 and worker.close() == 0  # asked to quit, it exits 0; closing again is harmless


def _bench(fake, tmp_path, answer):
    """Our plain (10 tok/s, a token per 100 ms) and a speculative method, with llama.cpp's two (fake) methods."""
    log = tmp_path / "requests.jsonl"
    worker = fake(log=log, answer=answer)
    calls = []
    ours = [fake_method("plain", calls, rounds=[(0, 0, 1, 0.0, 0.09)] * 3, times=(0.1, 0.2, 0.3, 0.4)),
            fake_method("ngram k=3", calls, "plain")]
    extra, info = llamacpp_methods(worker, WordTokenizer(), 3, 1, 4)
    methods = ours + extra
    prompts = [Prompt("1", "writing", ("a", "more")), Prompt("2", "coding", ("b",))]
    samples = run_bench(prompts, methods, WordTokenizer(), 4, warmup_tokens=0, progress=False)
    mark_identity(samples, methods, lambda ids: (0.5, 1, 2))
    config = {"model": "m", "precision": "fp16", "drafter": "ngram", "max_new_tokens": 4, "prompts": 2,
              "prompt_file": "f", "default_k": 3, "llamacpp": info}
    sent = [json.loads(x) for x in log.read_text().splitlines()]
    return build_report(samples, methods, config, None, None, 0.1), sent


def test_report_has_llamacpp_speedups_over_our_plain_and_identity_as_information(fake, tmp_path):
    report, sent = _bench(fake, tmp_path, "oX")
    # a multi-turn prompt: turn 2 follows llama.cpp's own answer, encoded by our tokenizer
    assert [WordTokenizer().decode(r["tokens"]) for r in sent if r["lookup"] is False] == ["a", "a\n\noXoX\n\nmore",
                                                                                          "b"]
    lp, ll = report.results["llama.cpp plain"].overall, report.results["llama.cpp lookup k=3"].overall
    # ours: 4 tokens in 0.4 s per turn; llama.cpp plain: in 0.2 s; lookup: in 0.15 s, tokens 2-3 in one pass
    assert lp.speedup == pytest.approx(2.0) and ll.speedup == pytest.approx(0.4 / 0.15)
    assert lp.decode_speedup == pytest.approx(2.0) and lp.ttft_s == pytest.approx(0.05)
    assert lp.tokens_per_pass == pytest.approx(1.0) and ll.tokens_per_pass == pytest.approx(1.5)
    assert ll.alpha == pytest.approx(0.5)  # accepted / drafted, as the worker counted them
    assert lp.identical_rate == 0.0  # "oXoX" is not our "okok": recorded...
    lines = leaderboard(report).splitlines()
    assert lines[3] == "| llama.cpp plain | 2.00x | 2.00x | 2.00x | 1.00 |"
    assert lines[4] == "| llama.cpp lookup k=3 | 2.67x | 2.67x | 2.67x | 1.50 |"

    lc_ = report.llamacpp
    assert list(lc_["methods"]) == ["plain", "ngram k=3", "llama.cpp plain", "llama.cpp lookup k=3"]
    row = lc_["methods"]["llama.cpp plain"]
    assert row["tokens_per_s"] == pytest.approx(20.0) and row["decode_tokens_per_s"] == pytest.approx(20.0)
    assert row["speedup"] == pytest.approx(2.0) and lc_["methods"]["plain"]["speedup"] == pytest.approx(1.0)
    assert lc_["lookup_over_llamacpp_plain"]["llama.cpp lookup k=3"][OVERALL] == pytest.approx(0.2 / 0.15)
    assert lc_["plain_identical_to_ours"] == 0.0
    assert lc_["lookup_identical_to_llamacpp_plain"] == {"llama.cpp lookup k=3": 1.0}

    md = markdown(report)  # ...but not reported as a failure of ours
    assert "output differs, llama.cpp" not in md and "output differs" not in md
    detail = next(x for x in md.splitlines() if x.startswith("| llama.cpp plain | overall |"))
    assert detail.endswith("| (0%) |")
    assert "## Against llama.cpp (node-llama-cpp 3.22.1, llama.cpp test" in md
    assert "Identity is not a check here" in md and "equals our plain's on 0% of prompts" in md
    assert "| llama.cpp lookup k=3 | 26.7 | 30.0 | 50 | 2.67x | 3.00x |" in md  # decode: 3 tokens in 0.1 s
    json.dumps(report.to_json())  # everything serialises


def test_ours_still_reports_its_own_differences(fake, tmp_path):
    report, _ = _bench(fake, tmp_path, "ok")  # llama.cpp equal to ours here; ours' own check is unchanged
    assert report.llamacpp["plain_identical_to_ours"] == 1.0
    assert report.results["ngram k=3"].overall.identical_rate == 1.0
    assert "| llama.cpp plain | overall |" in markdown(report)


# --- failures -------------------------------------------------------------------------------------------------


def test_worker_exiting_mid_run_is_a_clear_error_and_leaves_no_process(fake):
    worker = fake("die", at=2)
    method = llamacpp_method("llama.cpp plain", worker, WordTokenizer(), "plain")
    method.generate([104], 2)
    with pytest.raises(SpecdecError, match=r"exited while answering request 2 \(exit status 7; stopped\).*"
                                           r"out of memory"):
        method.generate([104], 2)
    assert worker.proc.poll() == 7
    with pytest.raises(SpecdecError, match="is not running"):
        method.generate([104], 2)


@pytest.mark.parametrize("mode, message", [
    ("bad_json", "sent a line that is not a JSON object while answering request 1: 'this is not json'"),
    ("wrong_id", "answered request 999 when 1 was asked"),
])
def test_a_worker_out_of_protocol_is_stopped(fake, mode, message):
    worker = fake(mode)
    with pytest.raises(SpecdecError, match=message):
        worker.request(tokens=[1], max_tokens=1, lookup=False)
    assert worker.proc.poll() is not None


def test_a_stalled_worker_times_out_and_is_killed(fake):
    worker = fake("hang", timeout_s=0.5)
    with pytest.raises(SpecdecError, match=r"no answer within 0.5 s while answering request 1"):
        worker.request(tokens=[1], max_tokens=1, lookup=False)
    assert worker.proc.poll() is not None


def test_an_error_the_worker_reports_keeps_it_running(fake):
    worker = fake("error")
    with pytest.raises(SpecdecError, match="request 1 failed: 1000 tokens do not fit"):
        worker.request(tokens=[1], max_tokens=1, lookup=False)
    assert worker.proc.poll() is None


@pytest.mark.parametrize("mode, message", [
    ("no_ready", "could not start: cannot load x.gguf"),
    ("crash", r"exited while loading the model \(exit status 3; stopped\).*crashed while loading"),
])
def test_a_worker_that_cannot_start(fake, mode, message):
    with pytest.raises(SpecdecError, match=message):
        fake(mode)


def test_malformed_answers():
    ok = {"tokens": [1, 2], "token_times": [0.1, 0.2], "seconds": 0.2, "ttft_s": 0.1, "finish": "eos",
          "prompt_tokens": 1}
    assert turn_from_reply([5], ok, WordTokenizer()).finish == "eos"
    for bad in ({k: v for k, v in ok.items() if k != "seconds"}, {**ok, "token_times": [0.1]},
                {**ok, "finish": "stop"}, {**ok, "tokens": ["x", 2]}):
        with pytest.raises(SpecdecError, match="malformed answer"):
            turn_from_reply([5], bad, WordTokenizer())
    with pytest.raises(SpecdecError, match="prefilled 1 tokens where 2 were sent"):
        turn_from_reply([5, 6], ok, WordTokenizer())


def test_missing_node_or_node_llama_cpp_says_how_to_install(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    monkeypatch.setattr(lc.shutil, "which", lambda name: None)
    with pytest.raises(SpecdecError, match=r"needs Node.js .* npm install --no-audit --no-fund node-llama-cpp@3.22.1"):
        lc.worker_command(gguf, 2)
    node = tmp_path / "node"
    node.write_text("")
    with pytest.raises(SpecdecError, match=f"needs node-llama-cpp in {tmp_path} .*install it with: mkdir -p"):
        lc.worker_command(gguf, 2, node=str(node), directory=tmp_path)
    pkg = tmp_path / "node_modules" / "node-llama-cpp" / "package.json"
    pkg.parent.mkdir(parents=True)
    pkg.write_text("{}")
    assert lc.worker_command(gguf, 3, node=str(node), directory=tmp_path) == [
        str(node), str(lc.WORKER), "--model", str(gguf), "--threads", "3"]


def test_the_gguf_llama_cpp_runs(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_text("")
    assert lc.gguf_path(str(gguf)) == gguf
    for model in (str(tmp_path), str(tmp_path / "missing.gguf")):
        with pytest.raises(SpecdecError, match="--model must be 'default' or a .gguf file"):
            lc.gguf_path(model)


def test_cli_refuses_before_loading_anything(tmp_path, capsys, monkeypatch):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"prompt": "hi"}) + "\n")
    bench = ["bench", "--prompts", str(q), "--compare", "llama.cpp", "--quiet"]
    assert main(bench + ["--model", str(tmp_path)]) == 2  # a folder: not a GGUF (and not loaded: it has no model)
    assert "--model must be 'default' or a .gguf file" in capsys.readouterr().err
    gguf = tmp_path / "m.gguf"
    gguf.write_text("")
    monkeypatch.setenv("NODE_LLAMA_DIR", str(tmp_path))
    assert main(bench + ["--model", str(gguf)]) == 2
    assert "install it with:" in capsys.readouterr().err
    assert main(["bench", "--prompts", str(q), "--llamacpp-k", "3", "--quiet"]) == 2
    assert "--llamacpp-k needs --compare llama.cpp" in capsys.readouterr().err


def test_cli_bench_with_a_fake_worker(tiny, tmp_path, capsys, monkeypatch, one_thread):  # noqa: F811
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE)
    monkeypatch.setattr(lc, "gguf_path", lambda model: tmp_path / "m.gguf")
    monkeypatch.setattr(lc, "worker_command", lambda gguf, threads: [sys.executable, str(script), "--threads",
                                                                     str(threads)])
    out = tmp_path / "b.json"
    assert main(["bench", "--prompts", str(tiny / "q.jsonl"), "--model", str(tiny), "--precision", "fp32",
                 "--max-new-tokens", "4", "--k", "2", "--compare", "llama.cpp", "--llamacpp-k", "3",
                 "--json", str(out), "--quiet"]) == 0
    r = json.loads(out.read_text())
    assert [m["name"] for m in r["methods"]] == ["plain", "ngram k=2", "llama.cpp plain", "llama.cpp lookup k=3"]
    assert r["config"]["llamacpp"]["k"] == 3 and r["config"]["llamacpp"]["ngram_max"] == 4
    assert r["results"]["llama.cpp plain"][OVERALL]["speedup"] > 0
    assert "## Against llama.cpp" in capsys.readouterr().out


# --- the real worker -----------------------------------------------------------------------------------------


def _real_worker_missing() -> str | None:
    if not shutil.which("node"):
        return "node is not on PATH"
    if not (lc.llama_dir() / "node_modules" / "node-llama-cpp").is_dir():
        return f"node-llama-cpp is not installed in {lc.llama_dir()} ($NODE_LLAMA_DIR)"
    try:
        lc.gguf_path("default")
    except SpecdecError as e:
        return str(e)
    return None


@pytest.mark.slow
@pytest.mark.skipif(_real_worker_missing() is not None, reason=str(_real_worker_missing()))
def test_the_real_worker_on_the_bundled_gguf():
    from specdec.bench.runner import encode_turns
    from specdec.models.gguf.convert import bundled_model_dir
    from specdec.models.text.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(bundled_model_dir())
    worker = LlamaCppWorker(lc.worker_command(lc.gguf_path("default"), 2), timeout_s=120)
    try:
        assert worker.info["node_llama_cpp"] == lc.VERSION and "Q4_1" in worker.info["type"]
        methods, _ = llamacpp_methods(worker, tok, 3, 1, 4)
        text = "Repeat exactly: the cat sat on the mat. the cat sat on the mat."
        ids = encode_turns(tok, [text], [])
        # the worker's own chat template (from the GGUF) gives the same prompt as ours
        assert worker.request(messages=[{"role": "user", "content": text}], max_tokens=1,
                              lookup=False)["prompt_tokens"] == len(ids)
        for method in methods:
            first, again = method.generate(ids, 12), method.generate(ids, 12)
            assert first.token_ids == again.token_ids and 1 <= first.tokens <= 12  # greedy: deterministic
            assert first.prompt_ids == ids and first.text == tok.decode(first.token_ids)
            assert 0 < first.ttft_s <= first.seconds and first.token_times == sorted(first.token_times)
            assert first.token_times[0] == pytest.approx(first.ttft_s)
            if method.k:
                assert 0 <= first.accepted <= first.drafted
        long = methods[0].generate(encode_turns(tok, ["Count from one to fifty in words."], []), 40)
        assert long.finish in ("eos", "length") and long.tokens <= 40
        # one user message timed as the long-context and kernel suites do (once scripts/llamacpp_run.mjs)
        for lookup in (False, True):
            r = lc.timed_chat(worker, "Count from one to fifty in words.", 24, lookup)
            assert r.prompt_tokens == len(encode_turns(tok, ["Count from one to fifty in words."], []))
            assert 2 <= r.new_tokens <= 24 and r.lookup is lookup and r.chat is True
            assert 0 < r.ttft_s <= r.wall_s and r.decode_tok_s > 0
            assert r.decode_tok_s == pytest.approx((r.new_tokens - 1) / (r.wall_s - r.ttft_s))
            assert (r.drafted is None) is not lookup
            assert lc.ChatTiming.from_json(r.to_json()) == r
    finally:
        assert worker.close() == 0
    assert worker.proc.poll() == 0
