"""`specdec plan --emit ENGINE`: every emitted key and flag is checked against a table of the engine's documented
names and value ranges written here, independently of the emitter, so a typo in the emitter fails a test."""

from __future__ import annotations

import argparse
import json
import shlex

import pytest

import specdec.cli
from specdec.theory import batch_model, plan
from specdec.theory.economics import CostCurve

ENGINES = ("vllm", "sglang", "llama.cpp", "trtllm")


@pytest.fixture
def run(monkeypatch, capsys):
    """main() with only the theory commands registered (plan needs nothing else)."""
    monkeypatch.setattr(specdec.cli, "COMMAND_MODULES", ("specdec.theory.cli",))

    def go(*argv):
        code = specdec.cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err
    return go


def config_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


def comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("#"))


# --- vLLM: SpeculativeConfig, vllm/config/speculative.py; batch schedule validation in
# vllm/v1/spec_decode/dynamic/utils.py; https://docs.vllm.ai/en/latest/features/speculative_decoding/
VLLM_METHODS = {"ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "eagle", "eagle3", "mtp", "ngram_gpu"}


def check_vllm(text: str) -> dict:
    (line,) = config_lines(text)
    argv = shlex.split(line)
    assert argv[0] == "--speculative-config" and len(argv) == 2
    cfg = json.loads(argv[1])
    allowed = {"method", "num_speculative_tokens", "model", "prompt_lookup_min", "prompt_lookup_max",
               "num_speculative_tokens_per_batch_size"}
    assert set(cfg) <= allowed, set(cfg) - allowed
    assert cfg["method"] in VLLM_METHODS
    k = cfg["num_speculative_tokens"]
    assert isinstance(k, int) and k > 0                                    # Field(gt=0)
    if cfg["method"] == "ngram":
        lo, hi = cfg["prompt_lookup_min"], cfg["prompt_lookup_max"]
        assert isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi   # ge=1, min <= max
        assert "model" not in cfg
    else:
        assert isinstance(cfg["model"], str) and cfg["model"]
    sched = cfg.get("num_speculative_tokens_per_batch_size")
    if sched is not None:                                                   # [bs_lo, bs_hi, K], inclusive
        assert sched[0][0] == 1                                             # first range starts at batch 1
        prev_hi = 0
        for lo, hi, kk in sched:
            assert lo > prev_hi and 1 <= lo <= hi                           # sorted, non-overlapping
            assert 0 <= kk <= k                                             # K <= num_speculative_tokens
            prev_hi = hi
    return cfg


# --- SGLang: python/sglang/srt/server_args.py speculative_* fields;
# https://docs.sglang.io/advanced_features/speculative_decoding.html
SGLANG_ALGORITHMS = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"}


def check_sglang(text: str) -> argparse.Namespace:
    (line,) = config_lines(text)
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--speculative-algorithm", choices=sorted(SGLANG_ALGORITHMS), required=True)
    p.add_argument("--speculative-draft-model-path")
    for flag in ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                 "--speculative-ngram-min-bfs-breadth", "--speculative-ngram-max-bfs-breadth"):
        p.add_argument(flag, type=int)
    ns, unknown = p.parse_known_args(shlex.split(line))
    assert not unknown, unknown
    assert ns.speculative_num_draft_tokens >= 2
    if ns.speculative_algorithm == "NGRAM":
        assert ns.speculative_draft_model_path is None
        assert 1 <= ns.speculative_ngram_min_bfs_breadth <= ns.speculative_ngram_max_bfs_breadth
    else:
        assert ns.speculative_draft_model_path
        assert ns.speculative_num_steps >= 1 and ns.speculative_eagle_topk >= 1
        if ns.speculative_eagle_topk == 1:  # the server resets num_draft_tokens to num_steps + 1 otherwise
            assert ns.speculative_num_draft_tokens == ns.speculative_num_steps + 1
    return ns


# --- llama-server: common/arg.cpp after ggml-org/llama.cpp#22397 and #22964 (--draft-max became
# --spec-draft-n-max); docs/speculative.md
LLAMA_SPEC_TYPES = {"none", "ngram-cache", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod",
                    "draft-simple", "draft-mtp", "draft-eagle3"}


def check_llama_cpp(text: str) -> argparse.Namespace:
    (line,) = config_lines(text)
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--spec-type", required=True)
    p.add_argument("--spec-draft-model", "-md", "--model-draft", dest="draft_model")
    for flag in ("--spec-draft-n-max", "--spec-draft-n-min", "--spec-ngram-simple-size-n",
                 "--spec-ngram-simple-size-m"):
        p.add_argument(flag, type=int)
    ns, unknown = p.parse_known_args(shlex.split(line))
    assert not unknown, unknown
    types = ns.spec_type.split(",")
    assert set(types) <= LLAMA_SPEC_TYPES, types
    if any(t.startswith("draft-") for t in types):
        assert ns.draft_model and ns.spec_draft_n_max >= 1
        assert ns.spec_draft_n_min is None or 0 <= ns.spec_draft_n_min <= ns.spec_draft_n_max
    if "ngram-simple" in types:
        assert 1 <= ns.spec_ngram_simple_size_n <= 1024 and 1 <= ns.spec_ngram_simple_size_m <= 1024
    return ns


# --- TensorRT-LLM: DecodingBaseConfig and subclasses in tensorrt_llm/llmapi/llm_args.py;
# https://nvidia.github.io/TensorRT-LLM/features/speculative-decoding.html
TRT_DECODING_TYPES = {"NGram", "Draft_Target", "Eagle", "Eagle3", "MTP", "Medusa", "SA", "PARD", "DFlash", "AUTO"}


def parse_simple_yaml(text: str) -> dict:
    """A strict reader for the one shape emitted: a top-level key, then two-space-indented `key: scalar` lines
    with JSON-compatible scalars. Anything else fails."""
    lines = config_lines(text)
    assert lines[0] == "speculative_config:", lines[0]
    out = {}
    for line in lines[1:]:
        assert line.startswith("  ") and not line.startswith("   "), line
        key, sep, value = line[2:].partition(": ")
        assert sep and key.isidentifier() and key not in out, line
        out[key] = json.loads(value)
    return {"speculative_config": out}


def check_trtllm(text: str) -> dict:
    doc = parse_simple_yaml(text)
    try:
        import yaml
    except ImportError:
        pass
    else:
        assert yaml.safe_load("\n".join(config_lines(text))) == doc
    spec = doc["speculative_config"]
    allowed = {"decoding_type", "max_draft_len", "speculative_model", "max_matching_ngram_size", "max_concurrency"}
    assert set(spec) <= allowed, set(spec) - allowed
    assert spec["decoding_type"] in TRT_DECODING_TYPES
    assert isinstance(spec["max_draft_len"], int) and spec["max_draft_len"] > 0   # > 0 for NGram/Eagle/Draft
    if spec["decoding_type"] == "NGram":
        assert spec["max_matching_ngram_size"] >= 1                               # PositiveInt
    if spec["decoding_type"] in ("Draft_Target", "Eagle3"):
        assert isinstance(spec["speculative_model"], str) and spec["speculative_model"]
    if "max_concurrency" in spec:
        assert isinstance(spec["max_concurrency"], int) and spec["max_concurrency"] >= 1  # PositiveInt
    return spec


CHECKS = {"vllm": check_vllm, "sglang": check_sglang, "llama.cpp": check_llama_cpp, "trtllm": check_trtllm}
K_OF = {"vllm": lambda c: c["num_speculative_tokens"], "sglang": lambda ns: ns.speculative_num_draft_tokens - 1,
        "llama.cpp": lambda ns: ns.spec_draft_n_max or ns.spec_ngram_simple_size_m,
        "trtllm": lambda s: s["max_draft_len"]}
METHOD_ARGS = {"ngram": [], "draft": ["--draft-model", "models/draft-0.5b"],
               "eagle": ["--draft-model", "heads/EAGLE3-llama-8b"]}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("method", sorted(METHOD_ARGS))
def test_emitted_config_uses_documented_keys(run, engine, method):
    code, out, err = run("plan", "--alpha", "0.8", "--draft-cost", "0.1", "--emit", engine, "--method", method,
                         *METHOD_ARGS[method], "--knee-rows", "16")
    assert code == 0, err
    parsed = CHECKS[engine](out)
    assert K_OF[engine](parsed) == plan(0.8, 0.1).best_k
    assert "E[tokens/round]" in comments(out) and "speedup" in comments(out)


@pytest.mark.parametrize("a", [0.6, 0.8, 0.9])
def test_k_is_plans_best_k(run, a):
    curve = "1:1,2:1.02,4:1.1,8:1.6,16:3"
    code, out, _ = run("plan", "--alpha", str(a), "--draft-cost", "0.05", "--verify-cost", curve,
                       "--emit", "vllm")
    assert code == 0
    best = plan(a, 0.05, verify_cost=CostCurve.parse(curve)).best_k
    assert check_vllm(out)["num_speculative_tokens"] == best


def test_per_position_acceptance_moves_k(run):
    def k_for(*extra):
        code, out, err = run("plan", "--draft-cost", "0.1", "--emit", "trtllm", *extra)
        assert code == 0, err
        return check_trtllm(out)["max_draft_len"]

    flat = k_for("--alpha", "0.6")
    assert k_for("--acceptance", ",".join(["0.6"] * 32)) == flat  # a constant a_i is the geometric model
    assert k_for("--acceptance", "0.6," + ",".join(["0.95"] * 20)) > flat  # bursty: a long match, once made
    assert k_for("--acceptance", "0.6,0.3,0.1,0.05") < flat


def test_draft_without_model_is_a_one_line_error(run):
    code, out, err = run("plan", "--alpha", "0.7", "--emit", "sglang", "--method", "draft")
    assert code == 2 and out == ""
    assert "--draft-model" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv,message", [
    (["--acceptance", "0.5,abc"], "--acceptance"),
    (["--acceptance", "0.5,1.5"], "acceptance rate"),
    (["--alpha", "0.5", "--ngram-min", "5", "--ngram-max", "2"], "ngram"),
    (["--alpha", "0.5", "--draft-model", "m"], "--draft-model"),
    (["--alpha", "0.5", "--knee-rows", "0"], "knee"),
    ([], "--alpha"),
])
def test_bad_emit_input(run, argv, message):
    code, _, err = run("plan", "--emit", "vllm", *argv)
    assert code == 2 and message in err and "Traceback" not in err


def test_emit_only_options_need_emit(run):
    code, _, err = run("plan", "--alpha", "0.5", "--acceptance", "0.5")
    assert code == 2 and "--emit" in err


def test_crossover_from_knee_rows(run):
    x = batch_model(0.8, plan(0.8, 0.1).best_k, 0.1, 8).crossover_batch
    assert x is not None and x > 1
    _, out, _ = run("plan", "--alpha", "0.8", "--draft-cost", "0.1", "--knee-rows", "8", "--emit", "vllm")
    cfg = check_vllm(out)
    assert cfg["num_speculative_tokens_per_batch_size"][0] == [1, x - 1, cfg["num_speculative_tokens"]]
    assert cfg["num_speculative_tokens_per_batch_size"][1][:1] == [x] and f"batch {x}" in comments(out)
    _, out, _ = run("plan", "--alpha", "0.8", "--draft-cost", "0.1", "--knee-rows", "8", "--emit", "trtllm")
    assert check_trtllm(out)["max_concurrency"] == x - 1
    for engine in ("sglang", "llama.cpp"):  # no batch-size switch: said in a comment
        _, out, _ = run("plan", "--alpha", "0.8", "--draft-cost", "0.1", "--knee-rows", "8", "--emit", engine)
        assert f"stops paying at batch {x}" in comments(out) and "no batch-size switch" in comments(out)


def test_crossover_from_profile_knee(run, tmp_path):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"verify_cost": {"1": 1, "2": 1.01, "4": 1.03, "8": 1.1, "16": 2.0},
                                "draft_cost": 0.05, "knee": {"roofline_rows": 8.0, "threshold_rows": 12}}))
    code, out, err = run("plan", "--alpha", "0.8", "--profile", str(prof), "--emit", "vllm", "--json")
    assert code == 0, err
    obj = json.loads(out)
    ch = obj["choice"]
    assert ch["knee_rows"] == 8.0 and ch["draft_cost"] == 0.05
    assert ch["crossover_batch"] == batch_model(0.8, ch["k"], 0.05, 8.0).crossover_batch
    assert obj["config"]["num_speculative_tokens"] == ch["k"]


def test_without_knee_no_schedule(run):
    _, out, _ = run("plan", "--alpha", "0.8", "--draft-cost", "0.1", "--emit", "vllm")
    assert "num_speculative_tokens_per_batch_size" not in check_vllm(out)
    assert "crossover batch: unknown" in comments(out)


def test_no_config_when_nothing_pays(run):
    code, out, _ = run("plan", "--alpha", "0.1", "--draft-cost", "0.5", "--emit", "vllm")
    assert code == 0 and config_lines(out) == [] and "does not pay" in out
    _, out, _ = run("plan", "--alpha", "0.1", "--draft-cost", "0.5", "--emit", "vllm", "--json")
    assert json.loads(out)["config"] is None


def test_eagle3_head_is_named_eagle3(run):
    argv = ["plan", "--alpha", "0.8", "--draft-cost", "0.02", "--method", "eagle", "--draft-model", "x/EAGLE3-8B"]
    assert check_vllm(run(*argv, "--emit", "vllm")[1])["method"] == "eagle3"
    assert check_sglang(run(*argv, "--emit", "sglang")[1]).speculative_algorithm == "EAGLE3"


def test_json_carries_the_numbers(run):
    code, out, _ = run("plan", "--acceptance", "0.9,0.8,0.7", "--draft-cost", "0.1", "--emit", "llama.cpp",
                       "--method", "draft", "--draft-model", "d.gguf", "--json")
    obj = json.loads(out)
    assert code == 0 and obj["engine"] == "llama.cpp" and obj["choice"]["acceptance"] == [0.9, 0.8, 0.7]
    assert obj["config"]["--spec-draft-n-max"] == obj["choice"]["k"] and obj["choice"]["pays"]
    check_llama_cpp("\n".join(obj["command"]))


def test_acceptance_from_a_bench_report(run, tmp_path):
    """a and the per-position a_i come from a bench report (the method that drafted most, or the one named);
    positions never reached (None) end the list."""
    from specdec.bench.records import BenchReport, GroupResult, MethodResult

    def method(alpha, drafted, by_position) -> MethodResult:
        group = GroupResult(prompts=1, tokens=10, seconds=1.0, tokens_per_s=10.0, tokens_per_pass=1.0, drafted=drafted,
                            accepted=round((alpha or 0) * drafted), alpha=alpha, acceptance_by_position=by_position,
                            draft_lengths={}, ttft_s=None, itl_p50_s=None, itl_p99_s=None, burst_share=None,
                            disturbance_max=None)
        return MethodResult(categories={}, overall=group)

    report = BenchReport(config={}, categories=[], methods=[], prediction_source=None, prediction_costs="",
                         results={"plain": method(None, 0, []), "ngram k=3": method(0.5, 90, [0.9, 0.6, None]),
                                  "ngram k=2": method(0.7, 40, [0.8, 0.7])})
    path = tmp_path / "bench.json"
    report.save(path)  # as `bench --json` writes it, and read back typed
    code, out, _ = run("plan", "--emit", "vllm", "--from-bench", str(path), "--json")
    obj = json.loads(out)
    assert code == 0 and obj["measured"]["method"] == "ngram k=3"
    assert obj["choice"]["alpha"] == 0.5 and obj["choice"]["acceptance"] == [0.9, 0.6]
    code, out, _ = run("plan", "--emit", "vllm", "--from-bench", str(path), "--bench-method", "ngram k=2")
    assert code == 0 and "method ngram k=2" in out and "a_i = 0.8, 0.7" in out
    code, _, err = run("plan", "--emit", "vllm", "--from-bench", str(path), "--bench-method", "plain")
    assert code == 2 and "no acceptance rate for method 'plain'" in err
    code, _, err = run("plan", "--emit", "vllm", "--from-bench", str(path), "--alpha", "0.5")
    assert code == 2 and "replaces --alpha" in err
    (tmp_path / "bad.json").write_text("[1]")
    code, _, err = run("plan", "--emit", "vllm", "--from-bench", str(tmp_path / "bad.json"))
    assert code == 2 and "not a `specdec bench --json` report" in err
    code, _, err = run("plan", "--emit", "vllm", "--from-bench", str(tmp_path / "missing.json"))
    assert code == 2 and "cannot read" in err
    broken = json.loads(path.read_text())
    broken["results"]["ngram k=3"]["overall"]["drafted"] = "ninety"  # a wrong field: named, in one line
    (tmp_path / "typed.json").write_text(json.dumps(broken))
    code, _, err = run("plan", "--emit", "vllm", "--from-bench", str(tmp_path / "typed.json"))
    assert code == 2 and "results.ngram k=3.overall.drafted: expected an int" in err and len(err.splitlines()) == 1
