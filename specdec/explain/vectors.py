"""Test vectors for the explainer page, generated from the Python theory (specdec.theory.economics).

The page reimplements a few formulas in JavaScript (static/theory.js). `static/vectors.json` pins what the
Python module says at a grid of settings; a Python test checks the file is current and a browser test
checks the JavaScript against it, so the page and the CLI cannot drift apart.

    python -m specdec.explain.vectors          # rewrite specdec/explain/static/vectors.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specdec.theory.economics import batch_model, expected_tokens, max_useful_draft_cost, plan, speedup

VECTORS_PATH = Path(__file__).with_name("static") / "vectors.json"

MAX_K = 20  # the page's draft-depth slider runs 1..20, and so does its search for the best k
MAX_BATCH = 256
ALPHAS = (0.0, 0.1, 0.25, 0.5, 0.6, 0.75, 0.8, 0.9, 0.95, 0.99, 1.0)
KS = (1, 2, 3, 4, 5, 8, 10, 13, 20)
COSTS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0)
# (a, k, c, knee rows): the page's default, a crossover at batch 1, one that never crosses, and a few between.
BATCH_SETTINGS = (
    (0.8, 4, 0.1, 64.0),
    (0.9, 10, 0.1, 64.0),
    (0.6, 3, 0.1, 32.0),
    (0.95, 8, 0.02, 128.0),
    (0.5, 2, 0.3, 64.0),
    (0.3, 4, 0.5, 64.0),
    (0.7, 3, 0.05, 4096.0),
)


def generate() -> dict:
    """Every number the page's JavaScript must reproduce, as plain JSON data."""
    points = [
        {"a": a, "k": k, "c": c, "expected_tokens": expected_tokens(a, k), "speedup": speedup(a, k, c)}
        for a in ALPHAS for k in KS for c in COSTS
    ]
    plans = []
    for a in ALPHAS:
        for c in COSTS:
            p = plan(a, c, max_k=MAX_K)
            plans.append({"a": a, "c": c, "best_k": p.best_k, "best_speedup": p.best_speedup,
                          "beats_plain": p.beats_plain, "max_useful_draft_cost": max_useful_draft_cost(a)})
    batch = []
    for a, k, c, knee in BATCH_SETTINGS:
        m = batch_model(a, k, c, knee, max_batch=MAX_BATCH)
        batch.append({"a": a, "k": k, "c": c, "knee_rows": knee, "max_batch": MAX_BATCH,
                      "ratio_at_batch_1": m.ratio_at_batch_1, "ratio_at_max_batch": m.ratio_at_max_batch,
                      "crossover_batch": m.crossover_batch, "ratios": [row["ratio"] for row in m.curve]})
    return {"generator": "python -m specdec.explain.vectors", "max_k": MAX_K,
            "points": points, "plans": plans, "batch": batch}


def dumps(vectors: dict) -> str:
    """JSON with one vector per line: small diffs when the theory changes, still plain JSON."""
    parts = []
    for key, value in vectors.items():
        if isinstance(value, list):
            items = ",\n    ".join(json.dumps(v) for v in value)
            parts.append(f"  {json.dumps(key)}: [\n    {items}\n  ]")
        else:
            parts.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def write(path: Path = VECTORS_PATH) -> Path:
    path.write_text(dumps(generate()))
    return path


if __name__ == "__main__":
    out = write(Path(sys.argv[1]) if len(sys.argv) > 1 else VECTORS_PATH)
    print(out)
