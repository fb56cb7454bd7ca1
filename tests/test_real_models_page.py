"""`specdec real-models`' projections (bench/engines/real_models_page.py): the rounds model on a measured
verify-cost curve, from the bundled model's fixed-k and `--k auto` Spec-Bench runs. Fast: no model runs."""

from __future__ import annotations

import pytest

from specdec.bench.engines.model_runs import (
    DecodeRun,
    Experts,
    LlamacppRun,
    Projections,
    RealModelsRun,
    ShapeRun,
    SpecdecRun,
    VerifyCurve,
)
from specdec.bench.engines.real_models import ACCEPTANCE_AUTO, ACCEPTANCE_JSON, ACCEPTANCE_METHOD
from specdec.bench.engines.real_models_page import ngram_rows, projections


def _cost(cost_of_rows) -> dict[str, float]:
    return {str(n): cost_of_rows(n) for n in range(1, 10)}


def _curve(times: dict[str, float]) -> VerifyCurve:
    return VerifyCurve(256, 1, "fastest of reps", times, {n: t / times["1"] for n, t in times.items()}, times["1"],
                       times)


def _specdec(tok_s: float = 10.0, verify: VerifyCurve | None = None, **kw) -> SpecdecRun:
    plain = DecodeRun(8, "length", 0.1, 1.0, tok_s, None, [1] * 8)
    return SpecdecRun("m.gguf", "m", "gguf-q16", 2, 1.0, {}, {}, [1], True, True, 1e9, plain=plain, verify=verify, **kw)


BUNDLED = _specdec(verify=_curve({"1": 0.003}), lookup={"seconds_per_round": 1e-5, "k": 5})


def _shape(sd: SpecdecRun, lc_tok_s: float = 10.0, projections: Projections | None = None) -> ShapeRun:
    lc = LlamacppRun(1.0, {}, {}, DecodeRun(8, "length", 0.1, 1.0, lc_tok_s, None, [1] * 8))
    return ShapeRun("m.gguf", 10**9, sd, lc, 20.0, [0.0], [0.0], projections)


def _report(shapes: dict[str, ShapeRun]) -> RealModelsRun:
    return RealModelsRun({}, {}, {}, shapes=shapes)


def _project(cost_of_rows) -> Projections:
    return projections(_cost(cost_of_rows), 0.05, BUNDLED, ACCEPTANCE_JSON, ACCEPTANCE_METHOD, (0.7,),
                       ACCEPTANCE_AUTO)


def test_the_rounds_model_pays_on_a_flat_curve_and_never_where_a_row_costs_a_pass():
    """A verify pass that costs one pass whatever its rows: every accepted draft is a token for free, so both runs
    project more than 1x. A pass whose cost grows with its rows as n one-row passes: a round of k drafts costs
    k + 1 passes and yields at most k + 1 tokens, so nothing projects above 1x."""
    flat, linear = _project(lambda n: 1.0), _project(lambda n: float(n))
    assert set(flat.ngram) == set(linear.ngram) and "overall" in flat.ngram
    for cat, p in flat.ngram.items():
        assert p.rounds > 1.0 and p.rounds_auto > 1.0, cat
        assert linear.ngram[cat].rounds <= 1.0 + 1e-9 and linear.ngram[cat].rounds_auto <= 1.0 + 1e-9
    assert flat.acceptance_auto == f"{ACCEPTANCE_AUTO[0]} ({ACCEPTANCE_AUTO[1]})"


def test_a_flatter_curve_projects_more():
    steep, gentle = _project(lambda n: 1 + 0.25 * (n - 1)), _project(lambda n: 1 + 0.1 * (n - 1))
    for cat in steep.ngram:
        assert gentle.ngram[cat].rounds_auto > steep.ngram[cat].rounds_auto, cat


@pytest.mark.parametrize("auto", [True, False], ids=["with-auto", "older-report"])
def test_each_cell_shows_the_runs_it_has(auto):
    p = _project(lambda n: 1.0) if auto else projections(_cost(lambda n: 1.0), 0.05, BUNDLED, ACCEPTANCE_JSON,
                                                           ACCEPTANCE_METHOD, (0.7,))
    rows = ngram_rows(_report({"m": _shape(_specdec(), projections=p)}))
    overall = next(r for r in rows if "**overall**" in r)
    o = p.ngram["overall"]
    want = f"{o.rounds:.2f}x" + (f" / {o.rounds_auto:.2f}x" if auto else "") + f" / {o.plan:.2f}x"
    assert want in overall
    assert (o.rounds_auto is not None) == auto


def _depth(layers: int, sd_s: float, lc_s: float) -> ShapeRun:
    """A shape measured at `layers` layers: seconds a token for each engine, passes costing 1 + 0.1 (n - 1)."""
    times = {str(n): sd_s * (1 + 0.1 * (n - 1)) for n in range(1, 4)}
    return _shape(_specdec(1 / sd_s, _curve(times)), 1 / lc_s)


def test_a_shape_at_two_depths_projects_to_its_full_depth():
    """Times a token that grow linearly with the layers are read at the full depth (48 for qwen3-30b-a3b): here
    0.01 s + 0.002 s a layer for specdec and 0.003 s a layer for llama.cpp, measured at 8 and 16 layers."""
    from specdec.bench.engines.real_models_page import depth_rows

    shapes = {"qwen3-30b-a3b/8": _depth(8, 0.026, 0.034), "qwen3-30b-a3b/16": _depth(16, 0.042, 0.058),
              "llama-3.2-1b": _depth(16, 0.05, 0.05)}
    rows = depth_rows(_report(shapes))
    assert len(rows) == 3 and "PROJECTED" in rows[0]
    full_sd, full_lc = 0.01 + 0.002 * 48, 0.01 + 0.003 * 48
    assert f"| {1 / full_sd:.2f} | {1 / full_lc:.2f} | {full_lc / full_sd:.2f}x |" in rows[2]
    assert rows[2].endswith("| - |")  # no n-gram projection: the run computes it (real_models.add_depths)
    assert "(48 layers, from 8, 16)" in rows[2] and "2:1.10 3:1.20" in rows[2]
    assert depth_rows(_report({"qwen3-30b-a3b/8": shapes["qwen3-30b-a3b/8"]})) == []  # one depth: no line
    noisy = {"qwen3-30b-a3b/8": _depth(8, 0.030, 0.034), "qwen3-30b-a3b/16": _depth(16, 0.028, 0.058)}
    assert "not projected" in depth_rows(_report(noisy))[2]  # passes that did not grow with depth


def test_a_mixture_shows_the_experts_its_passes_read():
    from specdec.bench.engines.real_models_page import expert_rows

    moe = _shape(_specdec(experts=Experts(128, 8, {"1": 8.0, "2": 15.5})))
    rows = expert_rows(_report({"qwen3-30b-a3b/8": moe, "llama-3.2-1b": _shape(_specdec())}))
    assert rows[2] == "| qwen3-30b-a3b/8 | 128 / 8 | 8.0 | 15.5 |" and len(rows) == 3
    assert expert_rows(_report({"llama-3.2-1b": _shape(_specdec())})) == []
