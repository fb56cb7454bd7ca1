"""What `--map-weights` buys and costs, side by side in one run: each shape loaded by specdec with its planes in
memory (the default), mapped on a first load (no cache file: pack, write, map) and mapped on a later load (the file
is there), alternated, beside llama.cpp's load of the same file. Load time, resident memory (anonymous and file
pages) after the load and after decoding, plain greedy decode speed, and whether the tokens are identical.

    python -m specdec.bench.engines.map_weights --shapes llama-3.2-1b,llama-3.1-8b --page docs/results/map-weights.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from specdec.atomic import write_text_atomic
from specdec.bench.engines.model_runs import Rss, SpecdecRun
from specdec.bench.engines.real_models import child, ensure_file, llamacpp, team_size, warm
from specdec.bench.results import Result
from specdec.bench.tables import num, table
from specdec.provenance import provenance

MODES = ("memory", "mapped, first load", "mapped, later load")


@dataclass
class LlamacppLoad:
    load_s: float
    rss: Rss  # after the load


@dataclass
class ShapeMaps:
    """One shape: specdec's three modes, each in processes of their own, and both placements alternated in one."""

    file_bytes: int
    llamacpp: LlamacppLoad
    runs: dict[str, list[SpecdecRun]]  # mode (MODES) -> one run a round
    alternated: dict[str, list[float]]  # "memory", "mapped" -> decode tok/s, round by round


@dataclass
class MapWeightsRun(Result):
    """map-weights.json."""

    provenance: dict
    results: dict[str, ShapeMaps]  # by shape


def measure(path: Path, args, out: Path) -> ShapeMaps:
    """One shape: llama.cpp once, then specdec's three modes alternated args.rounds times."""
    from specdec.models.gguf.plane_cache import cache_path

    warm(path)
    ref = llamacpp(path, [1, 2, 3], 2, None, team_size(args))
    runs: dict[str, list[SpecdecRun]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES:
            extra = ["--new-tokens", str(args.new_tokens), "--ttft-tokens", "0", "--rows", "1", "--reps", "1"]
            if mode != "memory":
                extra.append("--map-weights")
            if mode == "mapped, first load":
                precision = runs["memory"][-1].precision
                cache_path(path, precision).unlink(missing_ok=True)
            warm(path)
            runs[mode].append(child(str(path), out / f"{path.stem}-{r}-{MODES.index(mode)}.json", args, *extra))
    return ShapeMaps(path.stat().st_size, LlamacppLoad(ref.load_s, ref.rss_after_load), runs, alternate(path, args))


def alternate(path: Path, args) -> dict[str, list[float]]:
    """Decode speed of the two placements in one process, run after run (the order flipped each round), so that both
    see the same machine: mode -> tok/s per round."""
    from specdec.bench.engines.real_models_child import NoEos, decode_run
    from specdec.engine.generate import Engine
    from specdec.kernels.cores import configure
    from specdec.models.loader import load_model
    from specdec.models.text.tokenizer import encode_prompt

    configure(team_size(args))
    loaded = {"memory": load_model(str(path)), "mapped": load_model(str(path), map_weights=True)}
    engines = {m: Engine(x.model, NoEos(x.tokenizer)) for m, x in loaded.items()}
    ids = encode_prompt(loaded["memory"].tokenizer, "Summarize the following text in three sentences.", chat=True)
    for e in engines.values():
        decode_run(e, ids, 2)  # first-call costs
    out: dict[str, list[float]] = {m: [] for m in engines}
    for r in range(args.speed_rounds):
        for m in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
            out[m].append(decode_run(engines[m], ids, args.new_tokens).decode_tokens_per_s)
    print(f"[{path.name}] alternated: " + "; ".join(f"{m} {' '.join(f'{v:.1f}' for v in vs)}"
                                                     for m, vs in out.items()), file=sys.stderr, flush=True)
    return out


def row(shape: str, mode: str, m: ShapeMaps) -> list[str]:
    runs, gb = m.runs[mode], m.file_bytes
    med = (lambda f: statistics.median(f(r) for r in runs))
    base = m.runs["memory"]
    speed = med(lambda r: r.plain.decode_tokens_per_s)
    same = all(r.plain.token_ids == b.plain.token_ids for r, b in zip(runs, base))
    ratio = [r.plain.decode_tokens_per_s / b.plain.decode_tokens_per_s for r, b in zip(runs, base)]
    return [shape, mode, num(med(lambda r: r.load_s), 1), num(m.llamacpp.load_s, 1),
            num(med(lambda r: (r.rss_after_load["RssAnon"] - r.rss_before_load["RssAnon"]) / gb), 2),
            num(med(lambda r: r.rss_after_load["RssAnon"] / gb), 2),
            num(med(lambda r: r.rss_end["RssAnon"]) / 1e9, 2), num(med(lambda r: r.rss_end["RssFile"]) / 1e9, 2),
            num(speed, 1), " ".join(f"{x:.2f}" for x in ratio), "yes" if same else "NO"]


def speed_row(shape: str, m: ShapeMaps) -> list[str]:
    a = m.alternated
    ratios = [x / y for x, y in zip(a["mapped"], a["memory"])]
    return [shape, num(statistics.median(a["memory"]), 1), num(statistics.median(a["mapped"]), 1),
            num(statistics.median(ratios), 2), " ".join(f"{r:.2f}" for r in ratios)]


def page(run: MapWeightsRun, args) -> str:
    results, prov = run.results, run.provenance
    rows = [row(shape, mode, m) for shape, m in results.items() for mode in MODES]
    lcp = [[shape, num(m.llamacpp.rss["RssAnon"] / 1e9, 2), num(m.llamacpp.rss["RssFile"] / 1e9, 2),
            num(m.file_bytes / 1e9, 2)] for shape, m in results.items()]
    return "\n".join([
        "# --map-weights: the planes in memory or mapped from the cache", "",
        f"{prov['cpu']}, {prov['cores']} cores ({prov['isa']}), read bandwidth {num(prov['bandwidth_gbs'], 1)} GB/s, "
        f"{prov['date_utc']}, git {prov['git']}, load average at start "
        f"{', '.join(f'{x:.1f}' for x in prov['load_avg'])}. "
        f"Command: `{prov['command']}`.", "",
        f"Random-weight Q4_K_M files from `synth-gguf`; {args.new_tokens} tokens of plain greedy decoding; each mode "
        f"run {args.rounds} times, alternated (medians; the speed ratio to the in-memory run of the same round is "
        "listed per round). Every file was read once just before each load, so no load reads the disk.", "",
        table(["shape", "specdec", "load s", "llama.cpp load s", "model's anon / file", "process anon / file",
               "anon GB after decoding", "file pages GB after decoding", "decode tok/s",
               "speed / in memory (each its own process)", "tokens identical"], rows), "",
        "\"model's anon\": RssAnon after the load less RssAnon before it (`import torch` and the tokenizer are in "
        "the process's figure, not the model's). The first mapped load packs the planes, writes them to the cache "
        "and maps them; its load time includes the write.", "",
        f"Decode speed with both placements loaded in one process, {args.speed_rounds} runs of each alternated (the "
        "order flipped each round), so both see the same machine: the comparison to read for speed.", "",
        table(["shape", "in memory tok/s (median)", "mapped tok/s (median)", "mapped / in memory (median)",
               "per round"], [speed_row(shape, m) for shape, m in results.items()]), "",
        "llama.cpp (node-llama-cpp's worker) after its load, for scale:", "",
        table(["shape", "anon GB", "file pages GB", "file GB"], lcp), ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="llama-3.2-1b,llama-3.1-8b")
    p.add_argument("--files-dir", default="artifacts/real-models")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="loads of each mode, each in a process of its own")
    p.add_argument("--speed-rounds", type=int, default=6, help="decoding runs of each mode alternated in one process")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--out", default="artifacts/map-weights")
    p.add_argument("--page", default="docs/results/map-weights.md")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = MapWeightsRun(provenance(bandwidth=True), {})
    for shape in args.shapes.split(","):
        run.results[shape] = measure(ensure_file(shape, Path(args.files_dir)), args, out)
    run.save(out / "map-weights.json")
    if args.page:
        write_text_atomic(args.page, page(run, args))
        print(f"wrote {args.page}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
