"""The runner's order and multi-turn handling with fake methods, the report's tables and plot, and the whole
`specdec profile` / `specdec bench` path on a tiny random-weight Llama with a word-level tokenizer."""

from __future__ import annotations

import json

import pytest

from specdec.bench.prompts import Prompt
from specdec.bench.records import OVERALL
from specdec.bench.render import leaderboard, markdown, plot
from specdec.bench.report import build_report
from specdec.bench.runner import Method, Turn, encode_turns, mark_identity, run_bench
from specdec.cli import main
from specdec.engine.stats import RoundRecord
from specdec.theory.profile import Profile


class WordTokenizer:
    """Each character is a token; no chat template, so turns are joined by blank lines."""

    chat_template = None
    eos_token_ids: set = set()

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def fake_method(name, calls, baseline=None, answer="ok", rounds=((2, 2, 3, 0.0, 0.01),), times=(0.1, 0.2, 0.2, 0.2)):
    def generate(ids, max_new):
        calls.append((name, WordTokenizer().decode(ids), max_new))
        toks = [ord(c) for c in (answer * 4)[: len(times)]]
        return Turn(list(ids), toks, WordTokenizer().decode(toks), "length", times[-1], times[0], list(times),
                    [RoundRecord([0] * d, a, 0, "bonus", e, ds, vs, 0.0) for d, a, e, ds, vs in rounds])

    return Method(name, generate, "specdec", baseline, None if baseline is None else 3)


def test_rotation_warmup_and_own_answers():
    calls = []
    methods = [fake_method("plain", calls), fake_method("spec", calls, "plain", answer="xy")]
    prompts = [Prompt("1", "a", ("hi", "more")), Prompt("2", "b", ("yo",))]
    samples = run_bench(prompts, methods, WordTokenizer(), 16, warmup_tokens=4, progress=False)
    assert calls[:2] == [("plain", "hi", 4), ("spec", "hi", 4)]  # one warm-up each, short
    order = [(c[0], c[1]) for c in calls[2:]]
    assert order == [("plain", "hi"), ("plain", "hi\n\nokok\n\nmore"),  # turn 2 follows the method's own answer
                     ("spec", "hi"), ("spec", "hi\n\nxyxy\n\nmore"),
                     ("spec", "yo"), ("plain", "yo")]  # prompt 2: the order rotates
    assert [(s.qid, s.method, len(s.turns)) for s in samples] == [
        ("1", "plain", 2), ("1", "spec", 2), ("2", "spec", 1), ("2", "plain", 1)]


def test_encode_turns_with_a_chat_template():
    class Chat(WordTokenizer):
        chat_template = "x"

        def apply_chat_template(self, messages, add_generation_prompt=True):
            return "|".join(f"{m['role'][0]}:{m['content']}" for m in messages) + "|a:"

    assert Chat().decode(encode_turns(Chat(), ["q1", "q2"], ["r1"])) == "u:q1|a:r1|u:q2|a:"


def test_identity_mismatch_position_and_logit_gap():
    calls = []
    methods = [fake_method("plain", calls, answer="abcd"), fake_method("spec", calls, "plain", answer="abXd")]
    samples = run_bench([Prompt("1", "a", ("p",))], methods, WordTokenizer(), 8, warmup_tokens=0, progress=False)
    seen = []
    mark_identity(samples, methods, lambda ids: seen.append(ids) or (0.25, 7, 9))
    spec = samples[1]
    assert spec.identical is False
    assert spec.mismatch == {"turn": 0, "position": 2, "token": ord("X"), "baseline_token": ord("c"),
                             "logit_gap": 0.25, "top1": 7, "top2": 9}
    assert seen == [[ord("p"), ord("a"), ord("b")]]  # the baseline's prefix up to the difference
    assert samples[0].identical is None


def _report(profile=None, spec_answer="ok"):
    calls = []
    methods = [fake_method("plain", calls, rounds=[(0, 0, 1, 0.0, 0.09)] * 3, times=(0.1, 0.2, 0.3, 0.4)),
               fake_method("ngram k=3", calls, "plain", answer=spec_answer)]
    prompts = [Prompt("1", "writing", ("a",)), Prompt("2", "coding", ("b",)), Prompt("3", "coding", ("c",))]
    samples = run_bench(prompts, methods, WordTokenizer(), 4, warmup_tokens=0, progress=False)
    mark_identity(samples, methods, lambda ids: (0.5, 1, 2))
    config = {"model": "m", "precision": "fp32", "drafter": "ngram", "max_new_tokens": 4, "prompts": 3,
              "prompt_file": "f", "default_k": 3}
    return build_report(samples, methods, config, profile, "test" if profile else None, 0.1)


def test_report_tables_and_plot(tmp_path):
    report = _report()
    res = report.results["ngram k=3"]
    assert report.categories == ["writing", "coding"]
    # plain: 4 tokens in 0.4 s; spec: 4 tokens in 0.2 s
    assert res.overall.speedup == pytest.approx(2.0) and res.categories["coding"].prompts == 2
    assert res.overall.tokens_per_pass == 3.0 and res.overall.identical_rate == 1.0
    assert report.prediction_source == "rounds" and list(res.overall.predictions) == ["rounds"]
    assert report.prediction(res.overall).speedup is not None
    lines = leaderboard(report).splitlines()
    assert lines[0] == "| Method | writing | coding | Overall | Mean accepted tokens |"
    assert lines[1].count("---") == 5 and len(lines) == 3
    assert lines[2].startswith("| ngram k=3 | 2.00x | 2.00x | 2.00x | 3.00 |")
    md = markdown(report)
    assert "## Details" in md and "acceptance drift, ngram k=3" in md
    assert report.timing["plain"]["slow_qids"] == []
    assert "timing, plain: decode step median 100.0 ms; 0 of 3 prompts" in md
    assert "- prediction error, ngram k=3: conditional a_i: overall " in md
    detail_rows = [x for x in md.splitlines() if x.startswith("| ngram k=3 |") or x.startswith("| plain |")]
    assert len(detail_rows) == 1 + 3 + 3  # leaderboard row + (2 categories + overall) per method in details
    png = tmp_path / "s.png"
    plot(report, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    j = json.loads(json.dumps(report.to_json()))  # everything serialises
    assert j["results"]["ngram k=3"][OVERALL]["predictions"]["rounds"]["speedup"] == pytest.approx(
        report.prediction(res.overall).speedup)


def test_report_lists_outputs_that_differ():
    report = _report(spec_answer="oX")
    assert report.results["ngram k=3"].overall.identical_rate == 0.0
    md = markdown(report)
    assert (f"- output differs, ngram k=3: question 1, turn 1, token 1: {ord('X')!r} instead of {ord('k')!r}, "
            "target logit gap top1 - top2 = 0.5000") in md


def test_report_with_profile_predicts_from_it():
    prof = Profile.from_json({"verify_cost": {"1": 1.0, "4": 1.0}, "draft_cost": 0.0})
    report = _report(prof)
    p = report.prediction(report.results["ngram k=3"].overall)
    assert report.prediction_source == "profile" and p.speedup is not None and p.error is not None


# --- end to end on a tiny model ------------------------------------------------------------------------------


def test_profile_then_bench_on_a_tiny_model(tiny, tmp_path, capsys, one_thread):
    prof = tmp_path / "profile.json"
    assert main(["profile", "--model", str(tiny), "--precision", "fp32", "--contexts", "16,32", "--max-rows", "13",
                 "--reps", "1", "--bandwidth-gib", "0.01", "--json", str(prof), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "verify cost T(n)/T(1)" in out and "knee:" in out and "physical floor" in out
    p = json.loads(prof.read_text())
    assert p["verify_cost"]["1"] == 1.0 and len(p["verify_cost"]) == 13 and p["typical_context"] == 32
    assert p["draft"]["kind"] == "ngram" and p["draft_cost"] > 0
    assert p["memory"]["sequences_without_drafter"] >= p["memory"]["sequences_with_drafter"] > 0
    assert main(["plan", "--alpha", "0.7", "--profile", str(prof), "--json"]) == 0  # the plan command reads it
    assert json.loads(capsys.readouterr().out)["max_k"] == 12

    out_json, md, png = tmp_path / "b.json", tmp_path / "b.md", tmp_path / "b.png"
    assert main(["bench", "--prompts", str(tiny / "q.jsonl"), "--model", str(tiny), "--precision", "fp32",
                 "--max-new-tokens", "12", "--k", "auto", "--profile", str(prof), "--compare", "hf",
                 "--json", str(out_json), "--markdown", str(md), "--plot", str(png), "--quiet"]) == 0
    r = json.loads(out_json.read_text())
    names = [m["name"] for m in r["methods"]]
    assert names == ["plain", "ngram k=auto", "ngram k=2", "ngram k=4", "ngram k=6", "ngram k=8",  # the cap: 8
                     "hf plain", "hf prompt-lookup k=8"]
    assert r["categories"] == ["copy", "other"] and len(r["samples"]) == 3 * len(names)
    auto = r["results"]["ngram k=auto"][OVERALL]
    assert auto["speedup"] > 0 and auto["predictions"]["profile"]["speedup"] > 0 and auto["identical_rate"] is not None
    assert set(r["auto_k"][OVERALL]) >= {"auto", "best_fixed_k", "gain_vs_best", "gain_vs_default"}
    assert "ngram k=8 / hf plain" in r["hf"][OVERALL] and "ngram k=auto" in r["meters"]
    # drift is reported for every method that drafted in the measured runs; auto drafts nothing where the profile,
    # measured on a busy machine (parallel test workers), says that no draft pays. The meter counts the warm-up
    # generation too, so it can have drafted where the measured runs did not: drift follows the measured runs.
    assert len(r["meters"]["ngram k=auto"]["trace"]) == 3 and "ngram k=2" in r["drift"]
    assert ("ngram k=auto" in r["drift"]) == (auto["drafted"] > 0)
    assert r["meters"]["ngram k=auto"]["drafted"] >= auto["drafted"]
    assert "## Speedup (Spec-Bench layout)" in md.read_text() and png.stat().st_size > 1000
    two_turns = next(s for s in r["samples"] if s["qid"] == "1" and s["method"] == "plain")
    assert len(two_turns["turns"]) == 2 and two_turns["turns"][1]["prompt_tokens"] > 26  # turn 2 sees turn 1


@pytest.mark.slow
def test_bench_smoke_on_the_bundled_model(tmp_path, capsys):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"prompt": "Repeat exactly: the cat sat on the mat. the cat sat on the mat."}) + "\n")
    assert main(["bench", "--prompts", str(q), "--max-new-tokens", "8", "--json", str(tmp_path / "r.json"),
                 "--quiet"]) == 0
    r = json.loads((tmp_path / "r.json").read_text())  # no --k: auto, with fixed k up to the default cap beside
    assert [m["name"] for m in r["methods"]] == ["plain", "ngram k=auto", "ngram k=2", "ngram k=4", "ngram k=6",
                                                 "ngram k=8"]
    assert all(r["results"][m][OVERALL]["identical_rate"] == 1.0 for m in ("ngram k=auto", "ngram k=8"))


def counted_passes(monkeypatch):
    """Make the profile's timer count work instead of seconds: a pass "takes" its token-rows times its model's
    layers. The cost ratios the profile computes are then exact, whatever else runs on the machine; timed, the
    tiny model's c (a ratio of two sub-millisecond passes) read 7.31 with another test worker running."""
    from specdec.models import timing
    from specdec.models.transformer import Transformer

    work, forward = [0], Transformer.forward

    def counted(self, tokens, *args, **kwargs):
        work[0] += tokens.shape[0] * tokens.shape[1] * self.cfg.num_layers  # tokens: [B, n]
        return forward(self, tokens, *args, **kwargs)

    def timed(fn) -> float:
        before = work[0]
        fn()
        return float(work[0] - before)

    monkeypatch.setattr(Transformer, "forward", counted)
    monkeypatch.setattr(timing, "timed", timed)


def test_draft_model_profile_and_bench_on_a_tiny_model(tiny, tmp_path, capsys, one_thread, monkeypatch):
    """The tiny model as its own draft model: c is 1 (its one-row pass over the target's, on counted work), the
    draft's weights and cache take batch capacity."""
    model = ["--model", str(tiny), "--precision", "fp32", "--drafter", "draft-model", "--draft-model", str(tiny)]
    prof = tmp_path / "profile.json"
    with monkeypatch.context() as m:
        counted_passes(m)
        assert main(["profile", *model, "--contexts", "16", "--max-rows", "4", "--reps", "5", "--bandwidth-gib",
                     "0.01", "--memory-budget-gb", "0.001", "--batch-context", "64", "--json", str(prof),
                     "--quiet"]) == 0
    p = json.loads(prof.read_text())
    assert p["draft"]["kind"] == "draft-model" and p["draft_cost"] == 1.0
    assert p["verify_cost"] == {"1": 1.0, "2": 2.0, "3": 3.0, "4": 4.0}  # T(n)/T(1) of passes over n rows
    mem = p["memory"]
    assert mem["draft"]["kv_bytes_per_token"] == mem["target"]["kv_bytes_per_token"]
    assert mem["sequences_lost"] > 0 and mem["budget_bytes"] == 2**30 / 1000 and mem["context"] == 64
    assert "draft weights" in capsys.readouterr().out
    out_json = tmp_path / "b.json"
    assert main(["bench", "--prompts", str(tiny / "q.jsonl"), *model, "--categories", "other", "--max-new-tokens",
                 "6", "--k", "3", "--compare", "hf", "--json", str(out_json), "--quiet"]) == 0
    r = json.loads(out_json.read_text())
    assert [m["name"] for m in r["methods"]] == ["plain", "draft-model k=3", "hf plain", "hf prompt-lookup k=3",
                                                 "hf assisted k=3"]
    spec = r["results"]["draft-model k=3"][OVERALL]
    assert spec["alpha"] == 1.0 and spec["identical_rate"] == 1.0  # its own draft: every token accepted


def test_profile_json_alone_prints_the_profile_in_place_of_the_text(tiny, capsys, one_thread):
    assert main(["profile", "--model", str(tiny), "--precision", "fp32", "--contexts", "16", "--max-rows", "3",
                 "--reps", "1", "--bandwidth-gib", "0.01", "--json", "--quiet"]) == 0
    p = json.loads(capsys.readouterr().out)  # stdout holds the JSON alone
    assert p["verify_cost"]["1"] == 1.0 and len(p["verify_cost"]) == 3
