"""The explainer page: its test vectors are current, and `specdec explain --out` writes the page."""

from __future__ import annotations

import json
import math

from specdec.cli import main
from specdec.explain import STATIC_DIR
from specdec.explain.vectors import VECTORS_PATH, dumps, generate
from specdec.theory import batch_model, plan

PAGE_FILES = ("index.html", "app.js", "style.css", "vectors.json", "theory.js")


def same(x, y) -> bool:
    """Equal JSON data; floats to 1e-12 relative, so a platform's last-bit libm difference is not drift."""
    if isinstance(x, float) or isinstance(y, float):
        return isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isclose(x, y, rel_tol=1e-12)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(same(x[key], y[key]) for key in x)
    if isinstance(x, list):
        return isinstance(y, list) and len(x) == len(y) and all(same(u, v) for u, v in zip(x, y))
    return type(x) is type(y) and x == y


def test_vectors_json_is_up_to_date():
    checked_in = json.loads(VECTORS_PATH.read_text())
    assert same(checked_in, generate()), "stale vectors.json: run `python -m specdec.explain.vectors`"


def test_vectors_dump_is_plain_json():
    v = generate()
    assert json.loads(dumps(v)) == v


def test_vectors_cover_the_reference_figures():
    """The page's headline numbers are among the vectors: the three reference curves and the batch example."""
    plans = {(p["a"], p["c"]): p for p in generate()["plans"]}
    for a, best_k, best in [(0.9, 10, 3.43), (0.8, 6, 2.47), (0.6, 3, 1.67)]:
        assert plans[(a, 0.1)]["best_k"] == best_k == plan(a, 0.1, max_k=20).best_k
        assert round(plans[(a, 0.1)]["best_speedup"], 2) == best
    b = next(b for b in generate()["batch"] if (b["a"], b["k"], b["c"], b["knee_rows"]) == (0.8, 4, 0.1, 64.0))
    ratios = (round(b["ratio_at_batch_1"], 2), round(b["ratio_at_max_batch"], 2))
    assert (*ratios, b["crossover_batch"]) == (2.40, 0.62, 38)
    assert b["crossover_batch"] == batch_model(0.8, 4, 0.1, 64.0).crossover_batch
    crossovers = {b["crossover_batch"] for b in generate()["batch"]}
    assert 1 in crossovers and None in crossovers  # both edges of the batch panel are exercised


def test_explain_out_writes_the_page(tmp_path, capsys):
    out = tmp_path / "page"
    assert main(["explain", "--out", str(out)]) == 0
    for name in PAGE_FILES:
        assert (out / name).read_bytes() == (STATIC_DIR / name).read_bytes()
    assert capsys.readouterr().out.strip() == str((out / "index.html").resolve())


def test_page_fetches_nothing_from_the_network():
    for f in STATIC_DIR.iterdir():
        text = f.read_text()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text, f.name


def test_explain_out_under_a_regular_file_is_a_user_error(tmp_path, capsys):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    assert main(["explain", "--out", str(blocker / "page")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error:") and err.count("\n") == 1
    assert main(["explain", "--out", str(blocker)]) == 2


def test_explain_bad_port_is_a_user_error(capsys):
    assert main(["explain", "--serve", "--port", "70000"]) == 2
    assert "port" in capsys.readouterr().err
