"""A user's own GGUF, first load and later loads, with no flags (issue 62's goals), side by side in one run.

In a fresh cache (the built kernels copied in, so that no compile is timed): `specdec generate` on FILE with no flags
twice (the first load measures the path and the pass costs; the second must measure nothing), then the default
against both explicit paths, alternated, the best decode rate of each kept; then `specdec choose-path --no-remember`
with more repetitions for the verify pass of the chosen path. Prints Markdown with the CPU, bandwidth, date and
revision; --out writes it too.

    .venv/bin/python scripts/first_load_bench.py --model /tmp/llama-3.2-1b-q4_k_m.gguf --out docs/results/x.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec.paths import cache_root  # noqa: E402
from specdec.provenance import provenance  # noqa: E402

PROMPT = ("Rewrite the following in the past tense, keeping every other word: The team meets every morning, reviews "
          "the numbers, and decides what to ship. Then everyone writes code until lunch.")


def specdec(cache: Path, *argv: str) -> tuple[float, str, str]:
    env = {**os.environ, "SPECDEC_CACHE": str(cache)}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "specdec.cli", *argv], env=env, capture_output=True, text=True,
                       cwd=ROOT)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"specdec {' '.join(argv)} failed:\n{p.stderr}")
    return wall, p.stdout, p.stderr


def decode_rate(out: str) -> float:
    r = json.loads(out)
    after_first = r["total_s"] - r["ttft_s"]
    return (r["generated_tokens"] - 1) / after_first if after_first > 0 and r["generated_tokens"] > 1 else 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    prov = provenance(bandwidth=True)
    cache = Path(tempfile.mkdtemp(prefix="specdec-first-load-"))
    shutil.copytree(cache_root() / "kernels", cache / "kernels")
    gen = ["generate", "--model", args.model, "--prompt", PROMPT, "--max-new-tokens", str(args.tokens), "--json"]
    first_wall, _, first_err = specdec(cache, *gen)
    second_wall, _, second_err = specdec(cache, *gen)
    choice_s = re.search(r"measured at this first load in ([0-9.]+) s", first_err)
    chosen = re.search(r"specdec: (gguf-q\d+), the faster path", first_err).group(1)
    remeasured = [w for w in ("measured at this first load", "measuring this model's pass costs") if w in second_err]
    rates: dict[str, list[float]] = {"default": [], "gguf-q8": [], "gguf-q16": []}
    for rep in range(args.reps):
        for label in (rates if rep % 2 == 0 else list(reversed(list(rates)))):
            extra = [] if label == "default" else ["--precision", label]
            rates[label].append(decode_rate(specdec(cache, *gen, *extra)[1]))
    _, path_out, _ = specdec(cache, "choose-path", "--model", args.model, "--reps", "8", "--no-remember")
    best = {k: max(v) for k, v in rates.items()}
    faster = max(("gguf-q8", "gguf-q16"), key=best.get)
    lines = [
        f"# A GGUF's first load with no flags: {Path(args.model).name}",
        "",
        f"- CPU: {prov['cpu']}, {prov['cores']} cores; ISA {', '.join(prov['isa'])}",
        f"- read bandwidth: {prov['bandwidth_gbs']} GB/s (provenance's quick probe); load average at the start "
        f"{', '.join(f'{x:.2f}' for x in prov['load_avg'])}",
        f"- {prov['date_utc']}; git {prov['git']}",
        f"- command: `python scripts/first_load_bench.py --model {Path(args.model).name} --tokens {args.tokens} "
        f"--reps {args.reps}`; a fresh `SPECDEC_CACHE` with the built kernels copied in",
        "",
        "## First and second load",
        "",
        f"- first `specdec generate` (no flags): {first_wall:.1f} s wall; the path choice took "
        f"{choice_s.group(1) if choice_s else '?'} s of it and chose **{chosen}**; "
        f"pass costs measured: {'yes' if 'measuring this model' in first_err else 'no'}",
        f"- second: {second_wall:.1f} s wall; measured again: {', '.join(remeasured) if remeasured else 'nothing'}",
        "",
        "## Decode rate, the default against each explicit path (alternated, best of each)",
        "",
        "| run | decode tok/s (each rep) | best | against the faster explicit path |",
        "|---|---|---|---|",
    ]
    for label, v in rates.items():
        lines.append(f"| {label} | {', '.join(f'{x:.2f}' for x in v)} | {best[label]:.2f} | "
                     f"{best[label] / best[faster]:.3f} |")
    lines += ["", "## `specdec choose-path --reps 8 --no-remember`", "", "```", path_out.strip(), "```", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
