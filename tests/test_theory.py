"""The economics: reference figures, the c* threshold, the batch roofline, the simulator, and the CLI's
handling of bad input (one line on stderr, exit 2)."""

from __future__ import annotations

import json
import math

import pytest

from specdec.cli import main
from specdec.theory import batch_model, expected_tokens, max_useful_draft_cost, plan, simulate, speedup
from specdec.theory.economics import CostCurve
from tests.conftest import one_error_line


@pytest.mark.parametrize("a,best_k,best", [(0.9, 10, 3.43), (0.8, 6, 2.47), (0.6, 3, 1.67)])
def test_reference_figures(a, best_k, best):
    p = plan(a, 0.1)
    assert p.best_k == best_k
    assert round(p.best_speedup, 2) == best
    assert p.beats_plain


def test_deep_drafts_at_low_acceptance_lose():
    assert round(speedup(0.6, 16, 0.1), 2) == 0.96


def test_expected_tokens_edges():
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 4) == 1.0
    assert math.isclose(expected_tokens(0.999999, 4), 5.0, rel_tol=1e-5)


@pytest.mark.parametrize("a", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_c_star_is_where_the_first_draft_stops_paying(a):
    """dS/dk at k = 0 changes sign at c*."""
    c_star = max_useful_draft_cost(a)
    assert math.isclose(c_star, -a * math.log(a) / (1 - a))
    # speedup() itself, at a fractional depth just above 0, rises from plain decoding's 1.0 iff c < c*
    h = 1e-6
    assert speedup(a, 0, c_star) == 1.0
    assert speedup(a, h, c_star * 0.99) > 1.0
    assert speedup(a, h, c_star * 1.01) < 1.0


def test_batch_model_reference():
    m = batch_model(0.8, 4, 0.1, knee_rows=64, max_batch=256)
    assert round(m.ratio_at_batch_1, 2) == 2.40
    assert round(m.ratio_at_max_batch, 2) == 0.62
    assert 36 <= m.crossover_batch <= 46


def test_cost_curve_caps_k_and_interpolates():
    curve = CostCurve.parse("1:2.0,2:2.2,4:3.0")  # absolute times, normalised by the 1-row pass
    assert curve(1) == 1.0 and math.isclose(curve(3), 1.3)
    p = plan(0.8, 0.0, max_k=32, verify_cost=curve)
    assert p.max_k == 3 and len(p.curve) == 3


def test_simulator_matches_formula_within_1_percent():
    sim = simulate(0.8, 4, 0.1, rounds=200_000, seed=1)
    assert abs(sim.tokens_per_round / sim.expected_tokens_per_round - 1) < 0.01
    assert sum(sim.yield_histogram.values()) == 200_000
    assert set(sim.yield_histogram) == {1, 2, 3, 4, 5}


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_cli_json_and_table(capsys, tmp_path):
    code, out, _ = _run(capsys, "plan", "--alpha", "0.8", "--draft-cost", "0.1", "--json")
    data = json.loads(out)
    assert code == 0 and data["best_k"] == 6 and round(data["best_speedup"], 2) == 2.47
    assert {"best_k", "best_speedup", "beats_plain", "max_useful_draft_cost", "curve"} <= set(data)
    png = tmp_path / "plan.png"
    code, out, _ = _run(capsys, "plan", "--alpha", "0.6", "--draft-cost", "0.1", "--plot", str(png))
    assert code == 0 and "<- best" in out and "slower than plain decoding" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_says_when_nothing_pays(capsys):
    code, out, _ = _run(capsys, "plan", "--alpha", "0.1", "--draft-cost", "0.5")
    assert code == 0 and "no draft depth beats plain decoding" in out


def test_plan_with_profile_and_cost_file(capsys, tmp_path):
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"verify_cost": {"1": 1.0, "2": 1.05, "4": 1.2, "8": 2.0}, "draft_cost": 0.01}))
    code, out, _ = _run(capsys, "plan", "--alpha", "0.8", "--profile", str(prof), "--json")
    data = json.loads(out)
    assert code == 0 and data["max_k"] == 7 and data["draft_cost"] == 0.01
    code, out, _ = _run(capsys, "plan", "--alpha", "0.8", "--draft-cost", "0", "--verify-cost", str(prof), "--json")
    assert code == 0 and json.loads(out)["max_k"] == 7


def test_batch_model_cli(capsys, tmp_path):
    png = tmp_path / "b.png"
    code, out, _ = _run(capsys, "batch-model", "--alpha", "0.8", "--k", "4", "--draft-cost", "0.1",
                        "--knee-rows", "64", "--json", "--plot", str(png))
    data = json.loads(out)
    assert code == 0 and round(data["ratio_at_batch_1"], 2) == 2.40 and round(data["ratio_at_max_batch"], 2) == 0.62
    assert 36 <= data["crossover_batch"] <= 46 and len(data["curve"]) == 256
    assert png.stat().st_size > 1000


def test_simulate_cli(capsys):
    code, out, _ = _run(capsys, "simulate", "--alpha", "0.7", "--k", "5", "--draft-cost", "0.05",
                        "--rounds", "200000", "--seed", "3", "--json")
    data = json.loads(out)
    assert code == 0
    assert abs(data["tokens_per_round"] / data["expected_tokens_per_round"] - 1) < 0.01
    assert {"speedup", "predicted_speedup", "yield_histogram"} <= set(data)


@pytest.mark.parametrize("argv,needle", [
    (["plan", "--alpha", "1.5", "--draft-cost", "0.1"], "acceptance rate"),
    (["plan", "--alpha", "-0.1", "--draft-cost", "0.1"], "acceptance rate"),
    (["plan", "--alpha", "nan", "--draft-cost", "0.1"], "acceptance rate"),
    (["plan", "--alpha", "0.5", "--draft-cost", "-1"], "draft cost"),
    (["plan", "--alpha", "0.5", "--max-k", "0"], "max k"),
    (["plan", "--alpha", "0.5", "--verify-cost", "1:1,2"], "n:cost"),
    (["plan", "--alpha", "0.5", "--verify-cost", "1:1,2:-3"], "bad point"),
    (["plan", "--alpha", "0.5", "--profile", "/no/such/file.json"], "No such file"),
    (["plan", "--alpha", "abc"], "invalid float"),
    (["batch-model", "--alpha", "0.8", "--k", "0", "--draft-cost", "0.1", "--knee-rows", "64"], "--k: must be"),
    (["batch-model", "--alpha", "0.8", "--k", "4", "--draft-cost", "0.1", "--knee-rows", "0"], "knee"),
    (["simulate", "--alpha", "0.8", "--k", "4", "--rounds", "0"], "rounds"),
    (["simulate", "--alpha", "2", "--k", "4"], "acceptance rate"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_malformed_profile_file(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = _run(capsys, "plan", "--alpha", "0.5", "--profile", str(bad))
    assert code == 2 and "not valid JSON" in err
    bad.write_text("[1, 2]")
    code, _, err = _run(capsys, "plan", "--alpha", "0.5", "--profile", str(bad))
    assert code == 2 and "not a specdec profile" in err


def test_a_profile_reads_typed_and_saves_what_it_read(tmp_path):
    """Profile.load checks and types what the readers use; save writes it back with every other field the bench
    wrote (its raw timings, its provenance), so a profile read and saved reads the same."""
    from specdec.errors import SpecdecError
    from specdec.theory.profile import Profile

    data = {"verify_cost": {"4": 1.5, "1": 1.0}, "step_s": 0.02, "draft_cost": 0.01, "model": "m",
            "precision": "gguf-q16", "typical_context": 512, "knee": {"roofline_rows": 6.5, "threshold_rows": 5},
            "contexts": [{"context": 128, "step_s": 0.018, "verify_cost": {"1": 1.0, "2": 1.1},
                          "times_s": {"1": 0.018}}, {"context": 512, "verify_cost": {"1": 1.0, "2": 1.2}}],
            "provenance": {"cpu": "x"}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    p = Profile.load(path)
    assert p.verify_cost == {1: 1.0, 4: 1.5} and p.step_s == 0.02 and p.knee_rows == 6.5
    assert [c.context for c in p.contexts] == [128, 512] and p.contexts[1].step_s is None
    assert p.nearest(400).context == 512 and p.nearest(0).verify_cost == {1: 1.0, 2: 1.1}
    p.save(tmp_path / "again.json")
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["provenance"] == {"cpu": "x"} and again["contexts"][0]["times_s"] == {"1": 0.018}
    assert Profile.load(tmp_path / "again.json") == p
    with pytest.raises(SpecdecError, match=r"contexts\[1\].verify_cost"):
        Profile.from_json({**data, "contexts": [data["contexts"][0], {"context": 5, "verify_cost": {"0": 1}}]})


def test_kept_at_read_rate_adds_the_extra_cache_at_the_read_rate():
    from specdec.theory.floor import kept_at_read_rate, kept_ceiling

    # a 2.5 ms short pass, 39 MB more cache at 26 GB/s (1.5 ms): 2.5 / 4.0
    assert kept_at_read_rate(2.5e-3, 39e6, 26e9) == pytest.approx(0.625)
    assert kept_at_read_rate(2.5e-3, 0, 26e9) == 1.0  # no extra cache: nothing lost
    # a short pass at its bytes' time (100 MB at 25 GB/s) keeps what the bytes' ratio says
    assert kept_at_read_rate(100e6 / 25e9, 40e6, 25e9) == pytest.approx(kept_ceiling(100e6, 10e3, 0, 4000))
    # one that beats it (its weights from a cache) keeps less, one slower than it more
    at_floor = kept_ceiling(100e6, 10e3, 0, 4000)
    assert kept_at_read_rate(2e-3, 40e6, 25e9) < at_floor < kept_at_read_rate(6e-3, 40e6, 25e9)
    for bad in ((0, 1e6, 25e9), (1e-3, -1, 25e9), (1e-3, 1e6, 0)):
        with pytest.raises(ValueError):
            kept_at_read_rate(*bad)


def test_kept_ceiling_is_the_ratio_of_bytes_read():
    from specdec.theory.floor import kept_ceiling

    # 100 MB of weights; 10 kB a position: 1 MB at 100 positions, 40 MB at 4,000
    assert kept_ceiling(100e6, 10e3, 100, 4000) == pytest.approx(101 / 140)
    assert kept_ceiling(100e6, 0, 100, 4000) == 1.0  # no cache to read: nothing lost
    assert kept_ceiling(100e6, 10e3, 4000, 4000) == 1.0
    # a cache of half the bytes a position keeps more
    assert kept_ceiling(100e6, 5e3, 100, 4000) > kept_ceiling(100e6, 10e3, 100, 4000)
    for bad in ((0, 10e3, 100, 4000), (100e6, -1, 100, 4000), (100e6, 10e3, 4000, 100), (100e6, 10e3, -1, 100)):
        with pytest.raises(ValueError):
            kept_ceiling(*bad)


# ---- the floor of a pass (theory/floor.py) ---------------------------------------------------------------------

def test_pass_floor_memory_binds_then_arithmetic():
    from specdec.theory.floor import PassWork, Rates, pass_floor

    work = PassWork(weight_bytes=100e6, kv_bytes=20e6, product_macs=100e6, attention_macs=10e6, elementwise=2e6)
    rates = Rates(bandwidth=40e9, product_rate=400e9, fma_rate=120e9)
    one = pass_floor(1, work, rates)
    assert one.memory_s == pytest.approx(3e-3) and one.products_s == pytest.approx(0.25e-3)
    assert one.per_row_s == pytest.approx(0.1e-3) and one.seconds == pytest.approx(3.1e-3) and one.binds == "memory"
    # 12 rows multiply for exactly the 3 ms the reads take; 13 multiply for longer, and the arithmetic binds
    assert pass_floor(12, work, rates).seconds == pytest.approx(3e-3 + 1.2e-3)
    thirteen = pass_floor(13, work, rates)
    assert thirteen.binds == "arithmetic" and thirteen.seconds == pytest.approx(3.25e-3 + 1.3e-3)
    with pytest.raises(ValueError):
        pass_floor(0, work, rates)


def test_attention_runs_at_its_cache_types_rate_and_a_prompt_counts_it():
    from specdec.theory.floor import PassWork, Rates, pass_floor, prompt_floor

    work = PassWork(weight_bytes=100e6, kv_bytes=20e6, product_macs=100e6, attention_macs=10e6, elementwise=2e6)
    f16 = Rates(bandwidth=40e9, product_rate=400e9, fma_rate=120e9)
    q8 = Rates(bandwidth=40e9, product_rate=400e9, fma_rate=120e9, attention_rate=400e9)  # int8 dot products
    assert pass_floor(1, work, f16).per_row_s == pytest.approx(12e6 / 120e9)
    assert pass_floor(1, work, q8).per_row_s == pytest.approx(10e6 / 400e9 + 2e6 / 120e9)
    # 1,000 tokens of 100 M multiply-adds, 20 M of them the LM head (counted once), and 3 G of attention in all
    p = prompt_floor(1000, 100e6, 20e6, 3e9, q8)
    assert p.products_s == pytest.approx((1000 * 80e6 + 20e6) / 400e9) and p.attention_s == pytest.approx(3e9 / 400e9)
    assert p.seconds == pytest.approx(p.products_s + p.attention_s)
    assert prompt_floor(1000, 100e6, 20e6, 3e9, f16).attention_s == pytest.approx(3e9 / 120e9)
    with pytest.raises(ValueError):
        prompt_floor(0, 100e6, 20e6, 0, f16)


def test_attention_work_grows_with_the_context_up_to_a_window(bundled):
    import dataclasses

    model = bundled("gguf-q8").model
    c = model.cfg
    att, kv = model.attention_work(100)
    assert att == 100 * 2 * c.num_layers * c.num_heads * c.head_dim
    assert kv == 100 * model.kv_bytes_per_token()  # the cache of 100 positions, read once
    assert model.attention_work(200) == (2 * att, 2 * kv)
    windowed = dataclasses.replace(c, sliding_window=64)
    model.cfg, saved = windowed, c
    try:
        assert model.attention_work(1000) == model.attention_work(64)
    finally:
        model.cfg = saved


def test_profile_prints_each_widths_floor(capsys, tmp_path):
    prof = tmp_path / "p.json"
    assert main(["profile", "--model", "default", "--precision", "gguf-q8", "--contexts", "64", "--max-rows", "3",
                 "--reps", "1", "--bandwidth-gib", "0.05", "--json", str(prof), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "floor for n rows" in out and "floor - max(weight + KV bytes" in out
    p = json.loads(prof.read_text())
    assert p["bandwidth"]["stream_GBps"] > 0 and p["floor"]["bandwidth_GBps"] == p["bandwidth"]["stream_GBps"]
    e = p["contexts"][0]
    floors = [e["floor_s"][n] for n in ("1", "2", "3")]
    assert 0 < floors[0] < floors[1] < floors[2]  # each row adds its unshared work
    assert all(e["over_floor"][n] == pytest.approx(e["times_s"][n] / e["floor_s"][n]) for n in ("1", "2", "3"))


def test_profile_prints_a_prompts_floor_at_its_cache_types_rate(capsys, tmp_path):
    prof = tmp_path / "p.json"
    assert main(["profile", "--model", "default", "--precision", "gguf-q8", "--kv-cache", "q8_0", "--contexts", "64",
                 "--max-rows", "2", "--reps", "1", "--bandwidth-gib", "0.05", "--prompt-tokens", "200",
                 "--json", str(prof), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "prompt of 200 tokens: prefill" in out and "int8 dot products (q8_0 cache)" in out
    pr = json.loads(prof.read_text())["prompt"]
    assert pr["kv_cache"] == "q8_0" and pr["floor_s"] == pytest.approx(pr["products_s"] + pr["attention_s"])
    assert pr["over_floor"] == pytest.approx(pr["prefill_s"] / pr["floor_s"]) and pr["prefill_s"] > 0
    # attention over the prompt: every position over the positions up to it, 2 x heads x head_dim a key (SmolLM2:
    # 30 layers, 9 heads of 64)
    assert pr["attention_macs"] == 30 * 9 * 64 * 2 * 200 * 201 // 2
    # what decoding after it keeps at most: q8_0 stores 34 bytes a 32 values, keys and values of 3 KV heads of 64 dims
    # in 30 layers
    assert pr["kv_bytes_per_position"] == 30 * 2 * 3 * 2 * 34
    w = pr["weight_bytes"]
    assert pr["kept_ceiling"] == pytest.approx(w / (w + 200 * pr["kv_bytes_per_position"])) and pr["kept_ceiling"] < 1
    assert f"at the memory floor, decoding after it keeps at most {pr['kept_ceiling']:.0%} of its speed" in out


def test_profile_refuses_a_prompt_past_the_context_before_it_measures(capsys, monkeypatch):
    from specdec.bench.hardware import profile as prof

    def measured(*a, **k):
        raise AssertionError("measured before the refusal")

    monkeypatch.setattr(prof, "measure_target", measured)
    code = main(["profile", "--model", "default", "--precision", "gguf-q8", "--prompt-tokens", "9000000"])
    one_error_line(code, capsys.readouterr().err, "--prompt-tokens must be in 1..")


# ---- --json: one meaning in every command (specdec/outputs.py) -------------------------------------------------

@pytest.mark.parametrize("command", [
    ["plan", "--alpha", "0.8", "--draft-cost", "0.1"],
    ["batch-model", "--alpha", "0.8", "--k", "4", "--draft-cost", "0.1", "--knee-rows", "64"],
    ["simulate", "--alpha", "0.8", "--k", "4", "--rounds", "2000"],
])
def test_json_alone_prints_it_and_json_file_writes_it_beside_the_text(capsys, tmp_path, command):
    code, out, _ = _run(capsys, *command, "--json")
    assert code == 0 and isinstance(json.loads(out), dict)  # stdout is the JSON, nothing else
    assert _run(capsys, *command, "--json", "-")[1] == out  # `-` is stdout too
    target = tmp_path / "out.json"
    code, text, _ = _run(capsys, *command, "--json", str(target))
    assert code == 0 and json.loads(target.read_text()) == json.loads(out)
    with pytest.raises(json.JSONDecodeError):  # the text, as without --json
        json.loads(text)
    code, _, err = _run(capsys, *command, "--json", str(tmp_path / "missing" / "out.json"))
    assert code != 0 and "its folder does not exist" in err and not (tmp_path / "missing").exists()


def test_audit_names_its_level_significance_and_still_reads_alpha(capsys):
    from specdec.cli import UsageError, build_parser

    base = ["audit", "--endpoint", "http://127.0.0.1:1", "--reference", "http://127.0.0.1:2"]
    args = build_parser().parse_args([*base, "--significance", "0.01"])
    assert args.significance == 0.01 and capsys.readouterr().err == ""
    args = build_parser().parse_args([*base, "--alpha", "0.02"])
    err = capsys.readouterr().err
    assert args.significance == 0.02 and "--alpha is now --significance" in err and len(err.splitlines()) == 1
    with pytest.raises(UsageError, match=r"must be in \(0, 1\)"):
        build_parser().parse_args([*base, "--alpha", "1.5"])  # still ranged
    assert build_parser().parse_args(base).significance == 0.05
