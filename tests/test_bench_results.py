"""The bench's typed results (specdec/bench/results.py): every suite's JSON reads back into its dataclasses with each
field checked, bad files are one line naming the field, and the results recorded in docs/results read, render and
write back unchanged."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from specdec.bench.results import Result
from specdec.errors import SpecdecError

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


@dataclass
class Inner:
    x: float
    tag: str | None = None


@dataclass
class Outer(Result):
    name: str
    inner: Inner
    items: list[Inner]
    by: dict[str, Inner]
    counts: dict[str, int] = field(default_factory=dict)
    ok: bool = field(default=True, metadata={"json": "pass"})
    maybe: Inner | None = None


GOOD = {"name": "a", "inner": {"x": 1}, "items": [{"x": 2.5, "tag": "t"}], "by": {"k": {"x": 3}},
        "counts": {"n": 4}, "pass": False}


def test_a_result_reads_nested_fields_and_writes_them_back():
    r = Outer.from_json(GOOD)
    assert r.inner == Inner(1.0) and isinstance(r.inner.x, float) and r.items[0].tag == "t"
    assert r.by["k"].x == 3.0 and r.counts == {"n": 4} and r.ok is False and r.maybe is None
    out = r.to_json()
    assert out["pass"] is False and "ok" not in out  # the JSON name, not the Python one
    assert Outer.from_json(json.loads(json.dumps(out))) == r


@pytest.mark.parametrize("change, message", [
    (lambda d: d["inner"].update(x="fast"), r"run.json: inner.x: expected a number, got 'fast'"),
    (lambda d: d["items"][0].update(x=True), r"items\[0\].x: expected a number, got True"),
    (lambda d: d["by"]["k"].pop("x"), r"by.k: missing field 'x'"),
    (lambda d: d.update(extra=1), r"run.json: unknown field 'extra' \(a Outer has name, inner"),
    (lambda d: d.update(counts={"n": 1.5}), r"counts.n: expected an int, got 1.5"),
    (lambda d: d.update(items={"x": 1}), r"items: expected a list"),
    (lambda d: d.update(maybe=[1]), r"maybe: expected an object, got \[1\]"),
    (lambda d: d.update(name="x" * 100), None),  # a long string is fine; a long bad value is cut in the message
    (lambda d: d.update(pass_="no"), r"unknown field 'pass_'"),
])
def test_a_bad_file_is_one_line_naming_the_field(tmp_path, change, message):
    data = json.loads(json.dumps(GOOD))
    change(data)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    if message is None:
        assert Outer.load(path).name == "x" * 100
        return
    with pytest.raises(SpecdecError, match=message) as e:
        Outer.load(path)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300


def test_a_file_that_is_not_json_is_one_line(tmp_path):
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(SpecdecError) as e:
        Outer.load(tmp_path / "run.json")
    assert "run.json" in str(e.value) and "\n" not in str(e.value)


def _recorded(pattern: str) -> list[Path]:
    paths = sorted(RESULTS.glob(pattern))
    assert paths, f"no {pattern} in docs/results"
    return paths


@pytest.mark.parametrize("path", _recorded("gguf-kernels*.json"), ids=lambda p: p.name)
def test_recorded_kernel_runs_read_render_and_write_back(path):
    from specdec.bench.hardware.kernels_report import KernelsRun, render

    run = KernelsRun.load(path)
    assert {p.precision for p in run.paths} == {"fp16", "gguf", "gguf-q16", "gguf-q8"}
    assert KernelsRun.from_json(json.loads(json.dumps(run.to_json()))) == run
    text = render(run)
    assert text.startswith(f"# GGUF kernels: one run, {run.date}") and "Against the fp16 path" in text
    assert f"| gguf-q16 | {run.paths[2].weight_bytes_per_token / 1e6:.1f} |" in text


@pytest.mark.parametrize("path", _recorded("long-context*.json"), ids=lambda p: p.name)
def test_recorded_long_context_runs_read_render_and_write_back(path):
    from specdec.bench.hardware.long_context_report import LongContextRun, render

    run = LongContextRun.load(path)
    assert LongContextRun.from_json(json.loads(json.dumps(run.to_json()))) == run
    text = render(run)
    assert text.count("PASS") + text.count("FAIL") >= 4 and f"| {run.passes[0].context} |" in text
    if run.products_gmac_s is None:  # a run from before the products' rate was measured: its clause is left out
        assert "matrix products'" not in text


@pytest.mark.parametrize("path", _recorded("serve-bench*.json"), ids=lambda p: p.name)
def test_recorded_serving_runs_read_render_and_write_back(path):
    from specdec.bench.serving.serve_report import ServeBenchRun, goals, report

    run = ServeBenchRun.load(path)
    assert ServeBenchRun.from_json(json.loads(json.dumps(run.to_json()))) == run
    assert goals(run.policies) == run.goals  # the goals recomputed from the levels are the ones recorded
    assert "## Goals" in report(run)


def test_recorded_map_weights_run_reads_renders_and_writes_back():
    import argparse

    from specdec.bench.engines.map_weights import MapWeightsRun, page

    run = MapWeightsRun.load(RESULTS / "map-weights.json")
    assert MapWeightsRun.from_json(json.loads(json.dumps(run.to_json()))) == run
    text = page(run, argparse.Namespace(new_tokens=64, rounds=2, speed_rounds=6))
    assert "| llama-3.2-1b | memory |" in text and "| llama-3.1-8b | mapped, later load |" in text


def test_recorded_draft_pair_run_reads_renders_and_writes_back(tmp_path):
    """The page in docs/results is the one its JSON renders: the projections recomputed from the recorded c, lookup
    cost and curve are the recorded ones."""
    from specdec.bench.engines.draft_pair_page import project, write_page
    from specdec.bench.engines.model_runs import DraftPairRun

    run = DraftPairRun.load(RESULTS / "draft-pair.json")
    assert DraftPairRun.from_json(json.loads(json.dumps(run.to_json()))) == run
    assert project(run.c, run.c_ngram, run.cost) == run.projections
    write_page(run, tmp_path / "page.md", "docs/results/draft-pair.json")
    assert (tmp_path / "page.md").read_text() == (RESULTS / "draft-pair.md").read_text()


@pytest.mark.parametrize("content, message", [
    ('{"machine": {}, "bandwidth": {}}', "run.json: missing field 'config'"),
    ('{"machine": {}, "config": {}, "bandwidth": {}, "shapes": {"m": {"file": 3}}}', "shapes.m.file: expected a str"),
    ("[1, 2]", "run.json: expected an object, got [1, 2]"),
])
def test_rendering_a_bad_real_models_file_is_one_line_and_writes_no_page(tmp_path, capsys, content, message):
    from specdec.cli import main

    (tmp_path / "run.json").write_text(content)
    assert main(["real-models", "--render", str(tmp_path / "run.json"), "--page", str(tmp_path / "page.md")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "page.md").exists()


def _is_bench_report(path: Path) -> bool:
    data = json.loads(path.read_text())
    return isinstance(data, dict) and {"results", "methods"} <= set(data)


@pytest.mark.parametrize("path", [p for p in _recorded("*.json") if _is_bench_report(p)], ids=lambda p: p.name)
def test_recorded_bench_reports_read_typed_and_write_back(path):
    from specdec.bench.records import BenchReport

    report = BenchReport.load(path)
    assert report.results and all(m.overall.prompts >= 1 for m in report.results.values())
    again = report.to_json()
    assert set(again) >= set(json.loads(path.read_text()))  # nothing the file held is lost
    assert BenchReport.from_json(json.loads(json.dumps(again))) == report
