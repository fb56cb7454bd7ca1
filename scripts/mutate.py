"""Mutation check: plant each curated bug of tests/mutants.jsonl in a copy of the project, run the tests that should
catch it, and report every mutant caught or missed.

    python scripts/mutate.py            # every mutant (make mutate)
    python scripts/mutate.py --fast     # the CI subset, on the fast suite's tests only (make mutate-fast)
    python scripts/mutate.py --only drop-bonus residual-is-p --json artifacts/mutants.json

The working tree is never touched: the project's files (git's tracked and untracked, not ignored) are copied to a
temporary folder, the tests run there against the copy's own `specdec` (PYTHONPATH), and each mutant's edits are
applied and then undone, in one copy a worker (--jobs: mutants run side by side). A "caught" means something only
where the unmutated copy passes the same test: the full run checks every selected test on the unmutated copy
first; --fast (CI, right after `make test` passed the same tests on the same tree) checks afterwards only the tests
that caught a mutant, each a few seconds, instead of the whole baseline. A mutant that `needs` a CPU feature this
machine lacks is reported n/a and not counted. Exit status: 0 when every runnable mutant was caught, 1 when one was
missed, 2 on a stale mutant (its text is not in the file exactly once) or a failing baseline or catching test.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "tests" / "mutants.jsonl"


@dataclass
class Edit:
    file: str
    old: str
    new: str


@dataclass
class Mutant:
    id: str
    area: str
    why: str
    tests: list[str]
    fast: bool
    needs: str = ""  # a CPU feature its tests need ("avx512_vnni"); on a machine without it the mutant is not run
    edits: list[Edit] = field(default_factory=list)


def load_mutants(path: Path = MUTANTS) -> list[Mutant]:
    mutants: dict[str, Mutant] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            row = json.loads(line)
            edit = Edit(row["file"], row["old"], row["new"])
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise SystemExit(f"{path.name}:{n}: not a mutant line ({type(e).__name__}: {e})") from None
        if row["id"] not in mutants:
            missing = [key for key in ("area", "why", "tests", "fast") if key not in row]
            if missing:
                raise SystemExit(f"{path.name}:{n}: the first line of mutant {row['id']!r} lacks {missing}")
            mutants[row["id"]] = Mutant(row["id"], row["area"], row["why"], shlex.split(row["tests"]),
                                        bool(row["fast"]), row.get("needs", ""))
        mutants[row["id"]].edits.append(edit)
    return list(mutants.values())


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def check_applicable(mutants: list[Mutant], root: Path) -> list[str]:
    """Problems with mutants whose text is not in their file exactly once (the code moved on: update the line)."""
    problems = []
    for m in mutants:
        for e in m.edits:
            text = (root / e.file).read_text() if (root / e.file).is_file() else None
            count = text.count(e.old) if text is not None else 0
            if count != 1:
                where = "no such file" if text is None else f"found {count} times"
                problems.append(f"{m.id}: {e.file}: {where}: {e.old!r}")
    return problems


def copy_project(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def environment(copy: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTEST_ADDOPTS", None)
    return env


def run_tests(copy: Path, tests: list[str], timeout: float, marker: str) -> tuple[str, str, float]:
    """(outcome, detail, seconds): outcome "passed", "failed", "timeout" or "error" (pytest could not run)."""
    markers = [] if "-m" in tests else ["-m", marker]  # a mutant's own marker expression replaces it
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *markers, *tests]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=copy, env=environment(copy), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", f"no result within {timeout:.0f} s", time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    failed = re.search(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", out, re.M)
    if proc.returncode == 0:
        return "passed", "", seconds
    if proc.returncode == 1 and failed:
        return "failed", failed.group(1), seconds
    tail = " | ".join(out.strip().splitlines()[-3:])
    return "error", f"pytest exit {proc.returncode}: {tail[:300]}", seconds


def apply(copy: Path, m: Mutant) -> dict[str, str]:
    originals = {}
    for e in m.edits:
        path = copy / e.file
        originals.setdefault(e.file, path.read_text())
        path.write_text(path.read_text().replace(e.old, e.new, 1))
    return originals


def restore(copy: Path, originals: dict[str, str]) -> None:
    for name, text in originals.items():
        (copy / name).write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true",
                    help="only the mutants marked fast (the CI subset), caught by tests of the fast suite alone")
    ap.add_argument("--only", nargs="+", metavar="ID", help="only these mutants")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--jobs", type=int, default=min(os.cpu_count() or 1, 8),
                    help="mutants run side by side, each in its own copy (default: the cores, at most 8)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per test run (default 600)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)

    mutants = load_mutants()
    if args.only:
        unknown = set(args.only) - {m.id for m in mutants}
        if unknown:
            print(f"mutate: no mutant named {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m.id in args.only]
    elif args.fast:
        mutants = [m for m in mutants if m.fast]
    if args.list:
        for m in mutants:
            print(f"{m.id:30} {m.area:15} {'fast' if m.fast else '    '}  {m.why}")
        return 0
    problems = check_applicable(mutants, ROOT)
    if problems:
        print("mutate: stale mutants (update tests/mutants.jsonl):\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2

    # the fast subset must be caught by the fast suite (make test): CI's minutes go to mutants, not to 10^5 rounds
    marker = "not browser and not slow" if args.fast else "not browser"
    jobs = max(1, min(args.jobs, len(mutants)))
    with tempfile.TemporaryDirectory(prefix="specdec-mutate-") as tmp:
        copies = [Path(tmp) / f"copy{j}" for j in range(jobs)]  # one a worker: mutants run side by side
        for copy in copies:
            copy.mkdir()
            copy_project(copy)
        probe = subprocess.run([sys.executable, "-c", "import specdec; print(specdec.__file__)"], cwd=copies[0],
                               env=environment(copies[0]), capture_output=True, text=True)
        if not probe.stdout.strip().startswith(str(copies[0])):
            print(f"mutate: the copy does not import its own specdec ({probe.stdout.strip() or probe.stderr})",
                  file=sys.stderr)
            return 2
        tests = sorted({t for m in mutants for t in m.tests if t.startswith("tests/")})
        spread = ["-n", str(jobs), "--dist", "loadfile"] if jobs > 1 else []  # pytest-xdist, as make test
        if not args.fast:
            print(f"baseline: {len(tests)} test files on the unmutated copy ...", flush=True)
            outcome, detail, seconds = run_tests(copies[0], spread + tests, args.timeout, marker)
            if outcome != "passed":
                print(f"mutate: the unmutated copy does not pass ({outcome}: {detail})", file=sys.stderr)
                return 2
            print(f"baseline passed in {seconds:.0f} s ({jobs} workers)\n", flush=True)

        flags = cpu_flags()
        free: queue.Queue[Path] = queue.Queue()
        for copy in copies:
            free.put(copy)

        def check(m: Mutant) -> dict:
            if m.needs and m.needs not in flags:  # its code never runs here: neither caught nor missed
                row = {"id": m.id, "area": m.area, "why": m.why, "verdict": "n/a",
                       "by": f"this CPU has no {m.needs}", "seconds": 0.0}
            else:
                copy = free.get()
                originals = apply(copy, m)
                try:
                    outcome, detail, seconds = run_tests(copy, m.tests, args.timeout, marker)
                finally:
                    restore(copy, originals)
                    free.put(copy)
                verdict = {"failed": "caught", "timeout": "caught", "passed": "MISSED", "error": "ERROR"}[outcome]
                row = {"id": m.id, "area": m.area, "why": m.why, "verdict": verdict, "by": detail,
                       "seconds": round(seconds, 1)}
            print(f"{row['verdict']:7} {m.id:30} {row['seconds']:6.1f} s  {row['by'] or m.why}", flush=True)
            return row

        with ThreadPoolExecutor(jobs) as pool:  # each run is a subprocess: threads only wait
            results = list(pool.map(check, mutants))  # in the file's order; printed as each ends

        catchers = sorted({r["by"] for r in results if r["verdict"] == "caught" and r["by"].startswith("tests/")})
        if args.fast and catchers:  # what a caught mutant failed must pass without it
            outcome, detail, seconds = run_tests(copies[0], spread + catchers, args.timeout, marker)
            if outcome != "passed":
                print(f"mutate: a test that caught a mutant fails on the unmutated copy too ({outcome}: {detail})",
                      file=sys.stderr)
                return 2
            print(f"\nthe {len(catchers)} tests that caught them pass on the unmutated copy ({seconds:.0f} s)")

    caught = sum(r["verdict"] == "caught" for r in results)
    runnable = sum(r["verdict"] != "n/a" for r in results)
    skipped = f" ({len(results) - runnable} not runnable on this CPU)" if runnable < len(results) else ""
    print(f"\n{caught} of {runnable} mutants caught{skipped}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        from specdec.atomic import write_text_atomic  # written whole or not at all

        write_text_atomic(args.json, json.dumps(results, indent=2) + "\n")
    return 0 if caught == runnable else 1


if __name__ == "__main__":
    sys.exit(main())
