"""The native kernels of a git revision against the working tree's, side by side in one process.

    .venv/bin/python scripts/kernel_ab.py [--rev HEAD~1] [--model default|FILE.gguf] [--precision gguf-q16]
                                          [--rows 1,2,4,6,8] [--context 512] [--reps 60]
                                          [--kv-cache f16|q8_0|q4_0] [--prefill N] [--changed]

Builds `specdec/kernels/` as it is at --rev (a module of its own, cached under the specdec cache like the
working tree's build), loads the bundled model (or --model) once on each build, checks that every pass's logits
are bit for bit the same on both, then alternates passes (the order flipped every repetition, so drift falls on
both alike) and prints per number of rows the median time of each and their ratio, and each build's cost of a pass
in one-row passes. Python stays the working tree's: a revision whose kernel refuses a layout the working tree asks
for (8-bit weights in pairs, before they had them) gets its matrices in the layout it had then. --prefill N also
alternates prefills of N random tokens in one pass (time to first token), their last logits compared the same way.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import specdec.kernels as kernels_pkg
import specdec.models.transformer as transformer
from specdec.errors import SpecdecError
from specdec.models.gguf.convert import cache_root
from specdec.models.loader import load_model

ROOT = Path(__file__).resolve().parent.parent


def sources_at(rev: str | None) -> tuple[Path, str, list[str]]:
    """The kernels' sources as they were at `rev` (None: as the working tree has them), written under the specdec
    cache: their folder, a digest of them, and the files a build compiles (since module.cpp, three translation units
    that include the rest; before it, every .cpp file)."""
    if rev is None:
        files = (ROOT / "specdec" / "kernels").iterdir()
        texts = {p.name: p.read_bytes() for p in files if p.suffix in (".cpp", ".h", ".inc")}
        names = sorted(texts)
    else:
        listed = subprocess.run(["git", "ls-tree", "--name-only", rev, "specdec/kernels/"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout.split()
        names = sorted(n for n in (Path(p).name for p in listed) if n.endswith((".cpp", ".h", ".inc")))
        texts = {n: subprocess.run(["git", "show", f"{rev}:specdec/kernels/{n}"], cwd=ROOT, check=True,
                                   capture_output=True).stdout for n in names}
    roots = [p.name for p in kernels_pkg.SOURCES] if "module.cpp" in texts else [n for n in names if n.endswith(".cpp")]
    digest = hashlib.sha256(b"".join(n.encode() + b"\0" + texts[n] for n in names)).hexdigest()[:12]
    src = cache_root() / "kernels-ab" / digest
    src.mkdir(parents=True, exist_ok=True)
    for n, t in texts.items():
        (src / n).write_bytes(t)
    return src, digest, roots


def git_error(e: subprocess.CalledProcessError) -> str:
    """What git said on failing (ls-tree's text or show's bytes)."""
    err = e.stderr if isinstance(e.stderr, str) else (e.stderr or b"").decode(errors="replace")
    return err.strip() or f"git exited with {e.returncode}"


def build_at(rev: str):
    """The kernels module as the sources were at `rev`, compiled as its own layout was (sources_at)."""
    src, digest, roots = sources_at(rev)
    print(f"kernel_ab: building {rev} ({digest}), about a minute the first time", file=sys.stderr)
    return kernels_pkg.compile_module(f"specdec_ab_{digest}", [src / n for n in roots], src)


def load_on(module, precision: str, model: str = "default"):
    """The model (the bundled one by default) on `module`'s kernels; 8-bit matrices unpaired if that build refuses
    them in pairs."""
    qmatrix = transformer.qmatrix
    kernels_pkg.decode_kernels = lambda: module
    try:
        try:
            return load_model(model, precision).model
        except SpecdecError as e:  # the loader's wrapping of the kernel's refusal
            if "stored in pairs" not in str(e):
                raise
            transformer.qmatrix = lambda kernels, parts, inter, act=8, paired=False, put=(lambda t: t): qmatrix(
                kernels, parts, inter, act, paired and parts[0].kind != "Q8_0", put)
            return load_model(model, precision).model
    finally:
        transformer.qmatrix = qmatrix


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD~1")
    ap.add_argument("--model", default="default", help="the bundled model, or a .gguf (a synth-gguf shape, say)")
    ap.add_argument("--precision", default="gguf-q16")
    ap.add_argument("--rows", type=row_counts, default="1,2,4,6,8")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--kv-cache", default="f16", help="the KV cache type both builds run (f16, q8_0, q4_0)")
    ap.add_argument("--prefill", type=int, default=0,
                    help="also time prefills of this many random tokens in one pass, alternated (0: none)")
    ap.add_argument("--changed", action="store_true",
                    help="the working tree changes the arithmetic on purpose: say how far the logits moved, and time "
                         "the builds anyway")
    args = ap.parse_args()
    try:
        return compare(args)
    except SpecdecError as e:
        print(f"kernel_ab: {e}", file=sys.stderr)
        return 2


def row_counts(text: str) -> list[int]:
    try:
        rows = [int(r) for r in text.split(",")]
    except ValueError:
        rows = []
    if not rows or min(rows) < 1:
        raise argparse.ArgumentTypeError(f"rows: positive integers, comma-separated, not {text!r}")
    return rows


def compare(args) -> int:
    rows = args.rows
    if args.reps < 1 or args.context < 1 or args.prefill < 0:
        raise SpecdecError(f"--reps and --context must be at least 1 and --prefill at least 0, not {args.reps}, "
                           f"{args.context} and {args.prefill}")
    here = kernels_pkg.decode_kernels()
    if here is None:
        print("kernel_ab: the native kernels cannot be built here", file=sys.stderr)
        return 2
    try:
        then = build_at(args.rev)
    except subprocess.CalledProcessError as e:
        print(f"kernel_ab: cannot read the kernels at {args.rev}: {git_error(e)}", file=sys.stderr)
        return 2
    if args.kv_cache not in (None, "f16") and not hasattr(then, "kv_types"):
        print(f"kernel_ab: the kernels at {args.rev} keep f16 caches only (--kv-cache {args.kv_cache} came later)",
              file=sys.stderr)
        return 2
    models = {"rev": load_on(then, args.precision, args.model), "tree": load_on(here, args.precision, args.model)}
    vocab, limit = models["tree"].cfg.vocab_size, models["tree"].cfg.max_position_embeddings
    if args.context + max(rows) > limit or args.prefill > limit:
        raise SpecdecError(f"context {args.context} + {max(rows)} rows, or a prefill of {args.prefill}, exceeds the "
                           f"model's {limit} positions")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, args.context), generator=g)
    toks = {n: torch.randint(0, vocab, (1, n), generator=g) for n in rows}
    start = torch.tensor([args.context])
    caches = {}
    for name, m in models.items():
        m.use_kv_cache(args.kv_cache)
        caches[name] = m.new_cache(1, args.context + max(rows) + 1)
        m.forward(prompt, torch.zeros(1, dtype=torch.long), caches[name], last_only=torch.tensor([args.context - 1]),
                  prefill=True)
    for n in rows:
        a, b = (models[k].forward(toks[n], start, caches[k]) for k in ("rev", "tree"))
        if not torch.equal(a, b):
            if not args.changed:
                print(f"kernel_ab: the builds' logits differ at {n} rows (--changed times them anyway)",
                      file=sys.stderr)
                return 1
            same = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
            print(f"kernel_ab: at {n} rows the logits differ by up to {(a - b).abs().max().item():.3g}, "
                  f"same top-1 at {same:.0%} of the rows (--changed)")
    times = {(k, n): [] for k in models for n in rows}
    for rep in range(args.reps):
        for n in rows:
            for k in (("rev", "tree") if rep % 2 == 0 else ("tree", "rev")):
                t0 = time.perf_counter()
                models[k].forward(toks[n], start, caches[k])
                times[(k, n)].append(time.perf_counter() - t0)
    med = {key: statistics.median(v) for key, v in times.items()}
    same = "logits compared above" if args.changed else "logits bit-identical"
    print(f"{args.precision}, context {args.context}, {args.reps} alternated repetitions; {same}")
    print(f"{'rows':>4}  {args.rev + ' ms':>12}  {'tree ms':>9}  tree/rev")
    for n in rows:
        print(f"{n:>4}  {med[('rev', n)] * 1e3:>12.2f}  {med[('tree', n)] * 1e3:>9.2f}  "
              f"{med[('tree', n)] / med[('rev', n)]:.3f}")
    for k in models:
        curve = ", ".join(f"{n}: {med[(k, n)] / med[(k, rows[0])]:.2f}" for n in rows)
        print(f"{args.rev if k == 'rev' else 'tree'} in {rows[0]}-row passes: {curve}")
    return prefills(models, args, torch.randint(0, vocab, (1, args.prefill), generator=g)) if args.prefill else 0


def prefills(models: dict, args, ids: torch.Tensor) -> int:
    """Prefills of ids [1, n] into a new cache on each build, alternated (a quarter of --reps, at least 2): the
    median time of each and their ratio, the logits of the last position compared as the passes' are."""
    n = ids.shape[1]
    times, last = {k: [] for k in models}, {}
    for rep in range(max(2, args.reps // 4)):
        for k in (("rev", "tree") if rep % 2 == 0 else ("tree", "rev")):
            cache = models[k].new_cache(1, n + 1)
            t0 = time.perf_counter()
            last[k] = models[k].forward(ids, torch.zeros(1, dtype=torch.long), cache, last_only=torch.tensor([n - 1]),
                                        prefill=True)
            times[k].append(time.perf_counter() - t0)
            del cache
    if not torch.equal(last["rev"], last["tree"]) and not args.changed:
        print("kernel_ab: the builds' prefill logits differ (--changed times them anyway)", file=sys.stderr)
        return 1
    rev, tree = statistics.median(times["rev"]), statistics.median(times["tree"])
    print(f"prefill of {n} tokens ({len(times['rev'])} alternated): {args.rev} {rev:.3f} s, tree {tree:.3f} s, "
          f"tree/rev {tree / rev:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
