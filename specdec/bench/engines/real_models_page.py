"""The projections of `specdec real-models` (the planner on each model's measured verify-cost curve) and its
Markdown page."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from specdec.atomic import write_text_atomic
from specdec.bench.engines.model_runs import (
    DepthProjection,
    DraftProjection,
    NgramProjection,
    Projections,
    RealModelsRun,
    ShapeRun,
    SpecdecRun,
)
from specdec.bench.tables import num
from specdec.theory.economics import CostCurve, plan, predict_from_positional

MAX_K = 8  # the curve is measured up to 9 rows: the planner never extrapolates


def _rounds(r: dict, c: float, curve: CostCurve) -> float:
    """The rounds model: a run's measured draft lengths and per-position acceptance on this curve."""
    drafted = [int(d) for d, n in r["draft_lengths"].items() for _ in range(n)]
    return predict_from_positional(r["acceptance_by_position"], drafted, c, curve)


def projections(cost: dict[str, float], step_s: float, bundled: SpecdecRun, acceptance_path: str, method: str,
                alphas, auto: tuple[str, str] | None = None) -> Projections:
    """PROJECTED decode-phase speedups on this model's curve. n-gram: per Spec-Bench category, (a) the rounds
    model (the bundled model's measured draft lengths and per-position acceptance, as `bench` predicts) on the
    fixed-k run `method`, (b) the same on `auto` (a report and method: the run with `--k auto`, the engine's
    default, whose drafts are as long as the lookup's confidence made them on the bundled model's curve) and
    (c) the planner (one rate a, the best k). Draft model: the planner at each assumed a, with c = the bundled
    model's 1-row pass over this model's, both at the same context."""
    curve = CostCurve.from_mapping(cost)  # a model's verify curve: rows -> T(n) / T(1), and T(1) = step_s
    c_ngram = bundled.lookup["seconds_per_round"] / bundled.lookup["k"] / step_s
    c_draft = bundled.verify.step_s / step_s
    res = json.loads(Path(acceptance_path).read_text())["results"][method]
    res_auto = json.loads(Path(auto[0]).read_text())["results"][auto[1]] if auto else None
    ngram = {}
    for cat, r in [*res["categories"].items(), ("overall", res["overall"])]:
        p = plan(r["alpha"], c_ngram, MAX_K, curve)
        ngram[cat] = NgramProjection(alpha=r["alpha"], rounds=_rounds(r, c_ngram, curve), plan_k=p.best_k,
                                     plan=p.best_speedup)
        if res_auto is not None:
            ngram[cat].rounds_auto = _rounds(res_auto["overall"] if cat == "overall" else
                                             res_auto["categories"][cat], c_ngram, curve)
    draft = {str(a): DraftProjection((p := plan(a, c_draft, MAX_K, curve)).best_k, p.best_speedup) for a in alphas}
    return Projections(c_ngram=c_ngram, c_draft=c_draft, acceptance=f"{acceptance_path} ({method})", ngram=ngram,
                       draft=draft, acceptance_auto=f"{auto[0]} ({auto[1]})" if auto else None)


def gb(n: float) -> str:
    return num(n, 2, 1e-9)


def rate(x: float | None, floor: float) -> str:
    return "-" if not x else f"{x:.2f} ({100 * x / floor:.0f}%)"


def mem(r: dict[str, int]) -> str:
    return f"{gb(r['RssAnon'])} / {gb(r['RssFile'])}"


def decode_rows(report: RealModelsRun) -> list[str]:
    rows = ["| model | file GB | floor tok/s | specdec tok/s (% floor) | llama.cpp tok/s (% floor) | specdec / "
            "llama.cpp | 1/median ITL specdec / llama.cpp | tokens specdec / llama.cpp | load avg |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, e in report.models().items():
        s, lp, f = e.specdec.plain, e.llamacpp.plain, e.floor_tokens_per_s
        ratio = s.decode_tokens_per_s / lp.decode_tokens_per_s if lp.decode_tokens_per_s else None
        path = e.specdec.precision
        name = name if path in (None, "gguf-q16") else f"{name} ({path})"  # a path choose-path remembered
        rows.append(f"| {name} | {gb(e.file_bytes)} | {f:.2f} | {rate(s.decode_tokens_per_s, f)} | "
                    f"{rate(lp.decode_tokens_per_s, f)} | {f'{ratio:.2f}x' if ratio else '-'} | "
                    f"{num(s.itl_tokens_per_s)} / {num(lp.itl_tokens_per_s)} | "
                    f"{s.tokens} ({s.finish}) / {lp.tokens} ({lp.finish}) | "
                    f"{e.load_before[0]:.1f} -> {e.load_after[0]:.1f} |")
    return rows


def cost_rows(report: RealModelsRun) -> list[str]:
    n = max(len(e.specdec.verify.cost) for e in report.shapes.values())
    rows = ["| model | 1-row pass ms | " + " | ".join(f"{i}" for i in range(2, n + 1)) + " |",
            "|---|---|" + "---|" * (n - 1)]
    for name, e in report.shapes.items():
        v = e.specdec.verify
        rows.append(f"| {name} | {1e3 * v.step_s:.1f} | " + " | ".join(f"{v.cost[str(i)]:.2f}" for i in range(2, n + 1))
                    + " |")
    return rows


def resource_rows(report: RealModelsRun) -> list[str]:
    rows = ["| model | TTFT specdec s | TTFT llama.cpp s | load specdec s | load llama.cpp s "
            "| RSS specdec anon / file GB | RSS llama.cpp anon / file GB |", "|---|---|---|---|---|---|---|"]
    for name, e in report.models().items():
        s, lc = e.specdec, e.llamacpp
        t_s = f"{s.ttft.ttft_s:.2f}" if s.ttft else "-"
        t_l = f"{lc.ttft.ttft_s:.2f}" if lc.ttft else "-"
        rows.append(f"| {name} | {t_s} | {t_l} | {s.load_s:.1f} | {lc.load_s:.1f} | {mem(s.rss_after_load)} "
                    f"| {mem(lc.rss_after_load)} |")
    return rows


def ngram_rows(report: RealModelsRun) -> list[str]:
    names = list(report.shapes)
    rows = ["| category | a (bundled) | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    first = report.shapes[names[0]].projections.ngram
    for cat in first:
        cells = []
        for n in names:
            p = report.shapes[n].projections.ngram[cat]
            auto = f" / {p.rounds_auto:.2f}x" if p.rounds_auto is not None else ""  # runs before 2026-12-04 lack it
            cells.append(f"{p.rounds:.2f}x{auto} / {p.plan:.2f}x (k={p.plan_k})")
        label = f"**{cat}**" if cat == "overall" else cat
        rows.append(f"| {label} | {first[cat].alpha:.2f} | " + " | ".join(cells) + " |")
    return rows


def draft_rows(report: RealModelsRun) -> list[str]:
    names = list(report.shapes)
    alphas = list(report.shapes[names[0]].projections.draft)
    rows = ["| model | c (135M pass / target pass) | " + " | ".join(f"a = {a}" for a in alphas) + " |",
            "|---|---|" + "---|" * len(alphas)]
    for n in names:
        p = report.shapes[n].projections
        rows.append(f"| {n} | {p.c_draft:.3f} | " + " | ".join(
            f"{p.draft[a].speedup:.2f}x (k={p.draft[a].k})" for a in alphas) + " |")
    return rows


def gemma_rows(g: ShapeRun) -> list[str]:
    f = g.floor_tokens_per_s
    rows = ["| method | decode tok/s (% floor) | tokens (finish) | a | tokens / pass | same tokens as specdec plain |",
            "|---|---|---|---|---|---|"]
    ref = g.specdec.plain.token_ids
    for name, r in (("specdec plain", g.specdec.plain), ("specdec n-gram (k auto)", g.specdec.ngram),
                    ("llama.cpp plain", g.llamacpp.plain)):
        if not r:
            continue
        n = min(len(ref), len(r.token_ids))
        same = next((i for i in range(n) if ref[i] != r.token_ids[i]), n)
        a = f"{r.alpha:.2f}" if r.alpha is not None else "-"
        tpp = f"{r.tokens_per_pass:.2f}" if r.tokens_per_pass else "-"
        rows.append(f"| {name} | {rate(r.decode_tokens_per_s, f)} | {r.tokens} ({r.finish}) | {a} | {tpp} | "
                    f"first {same} of {len(r.token_ids)} |")
    return rows


def expert_rows(report: RealModelsRun) -> list[str]:
    """Mixtures of experts: the distinct experts a verify pass of n rows read per layer (the native layer's count)."""
    moe = {n: e.specdec.experts for n, e in report.shapes.items() if e.specdec.experts}
    if not moe:
        return []
    n = max(len(x.touched) for x in moe.values())
    rows = ["| model | experts a layer / a token | " + " | ".join(f"{i} rows" for i in range(1, n + 1)) + " |",
            "|---|---|" + "---|" * n]
    for name, x in moe.items():
        rows.append(f"| {name} | {x.per_layer} / {x.per_token} | "
                    + " | ".join(f"{x.touched.get(str(i), 0):.1f}" for i in range(1, n + 1)) + " |")
    return rows


def linear_at(x0: float, values: dict[int, float]) -> float:
    """The least-squares line through (x, y) in `values`, read at x0."""
    xs, ys = list(values), list(values.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my + b * (x0 - mx)


def depths(shapes: dict[str, ShapeRun]) -> dict[str, DepthProjection]:
    """Shapes measured at two or more depths ("NAME/L": the first L layers), projected to their full depth: each
    engine's time a token and each n-row pass's time fitted as a + b L (least squares), read at the full L."""
    from specdec.models.gguf.synth import SHAPES

    groups: dict[str, dict[int, ShapeRun]] = {}
    for name, e in shapes.items():
        base, _, layers = name.partition("/")
        if layers.isdigit():
            groups.setdefault(base, {})[int(layers)] = e
    out = {}
    for base, by_depth in groups.items():
        if len(by_depth) < 2 or base not in SHAPES:
            continue
        at_full = functools.partial(linear_at, SHAPES[base].layers)
        sd = at_full({d: 1 / e.specdec.plain.decode_tokens_per_s for d, e in by_depth.items()})
        lc = at_full({d: 1 / e.llamacpp.plain.decode_tokens_per_s for d, e in by_depth.items()})
        times = {n: at_full({d: e.specdec.verify.times_s[n] for d, e in by_depth.items()})
                 for n in next(iter(by_depth.values())).specdec.verify.times_s}
        one = {d: e.specdec.verify.times_s["1"] for d, e in by_depth.items()}
        grows = all(one[a] < one[b] for a, b in zip(sorted(one), sorted(one)[1:]))  # else the fit is noise
        out[base] = DepthProjection(layers=SHAPES[base].layers, from_depths=sorted(by_depth),
                                    specdec_tokens_per_s=1 / sd, llamacpp_tokens_per_s=1 / lc, times_s=times,
                                    step_s=times["1"], cost={n: t / times["1"] for n, t in times.items()},
                                    passes_grow=grows)
    return out


def depth_rows(report: RealModelsRun) -> list[str]:
    """The page's lines for depths(): measured at run time (report.depths, with n-gram projections on the
    projected curve), or from the shapes."""
    found = report.depths or depths(report.shapes)
    rows = []
    for base, d in found.items():
        curve = " ".join(f"{n}:{c:.2f}" for n, c in d.cost.items() if n != "1")
        if not d.passes_grow:
            curve = "not projected: a 1-row pass did not take longer at more layers (noise)"
        ngram = d.projections.ngram.get("overall") if d.passes_grow and d.projections else None
        rows.append(f"| {base} ({d.layers} layers, from {', '.join(map(str, d.from_depths))}) | "
                    f"{d.specdec_tokens_per_s:.2f} | {d.llamacpp_tokens_per_s:.2f} | "
                    f"{d.specdec_tokens_per_s / d.llamacpp_tokens_per_s:.2f}x | {curve} | "
                    + (f"{ngram.rounds:.2f}x / {ngram.plan:.2f}x (k={ngram.plan_k})" if ngram else "-")
                    + " |")
    if not rows:
        return []
    return ["| model (PROJECTED to full depth) | specdec tok/s | llama.cpp tok/s | specdec / llama.cpp | "
            "verify cost, n rows over 1 | n-gram, overall: rounds / planner |", "|---|---|---|---|---|---|", *rows]


def load_at_start(m: dict) -> list[float]:
    """The load averages when the run began: provenance's load_avg (older runs' JSON: load_start)."""
    return m["load_start"] if "load_start" in m else m["load_avg"]


def contention(report: RealModelsRun) -> list[str]:
    """A warning when the load average exceeded the core count during the run."""
    m = report.machine
    peak = max([load_at_start(m)[0], m["load_end"][0], *(e.load_after[0] for e in report.models().values())])
    if peak <= m["cores"]:
        return []
    return [f"- **CONTENDED: the 1-minute load average reached {peak:.1f} on {m['cores']} cores** (other workers' "
            "jobs). A team of 2 threads waits at every barrier for a thread the scheduler has taken away, so the "
            "absolute rates, the bandwidth and the verify curves below are far from this machine's unloaded ones "
            "(a curve below 1 or out of order is noise), and so are the projections built on those curves. The "
            "ratios between engines, measured one after the other, are only indicative. Rerun on an idle machine."]


def write_page(report: RealModelsRun, path: Path) -> None:
    m, bw = report.machine, report.bandwidth
    cfg = report.config
    names = list(report.shapes)
    proj = report.shapes[names[0]].projections if names else None
    load = " / ".join(f"{x:.2f}" for x in load_at_start(m))
    lines = [
        "# Real model shapes (K-quant GGUFs) and Gemma 3 270M: specdec beside llama.cpp",
        "",
        f"- CPU: {m['cpu']}; {m['cores']} cores; ISA: {', '.join(m['isa']) or 'none of avx2/avx512/vnni/amx'}",
        f"- read bandwidth (torch sum over 1 GiB, median of 5): {bw['read_GBps']:.1f} GB/s at the start"
        + (f"; measured again before each model: {', '.join(f'{x:.1f}' for x in report.bandwidth_runs[1:])} "
           f"GB/s; each model's floor uses the best so far (other load only lowers it)"
           if len(report.bandwidth_runs) > 1 else "; the floors use it"),
        f"- {m['date_utc']}, git {m['git']}; threads {cfg['threads']} (both engines); greedy",
        f"- load average (1/5/15 min) at the start: {load}; at the end: {m['load_end'][0]:.2f} (the machine is shared "
        "with other workers: a load above the core count means the timings below were taken on a contended machine)",
        f"- command: `{m['command']}`",
        *contention(report),
        f"- raw JSON: `{cfg['out']}/real-models.json` (and one file per model beside it)",
        "",
        "The shapes are **random-weight** GGUFs from `specdec synth-gguf` with llama.cpp's Q4_K_M type mix: their "
        "speed is real, their output is noise. specdec runs them lean on the GGUF's blocks (gguf-q16, or the path "
        "`specdec choose-path` remembered for the file, named beside it); both engines get the same prompt token "
        "ids (the first Spec-Bench writing prompt). specdec ignores the eos token (random "
        "weights emit it by chance); llama.cpp's worker cannot, so its token count is shown. Rates are decode rates: "
        "tokens after the first over the time after the first; 1/median ITL (inter-token latency) is less "
        "sensitive to bursts of other load. The floor is file bytes / read bandwidth (every "
        "weight byte read once per token; a mixture of experts: the bytes a token reads).",
        "",
    ]
    if names:
        lines += ["## Plain decoding", "", *decode_rows(report), "",
                  f"## Verify cost: a pass of n rows over a 1-row pass (specdec, fastest of {cfg.get('reps')} reps, "
                  "context "
                  f"{report.shapes[names[0]].specdec.verify.context})", "", *cost_rows(report), "",
                  *(["## Mixtures of experts: the experts a pass reads", "",
                     "Distinct experts a verify pass read per layer, by rows in the pass (random tokens after the "
                     "context; random weights route evenly, as real text may not). The floor of a mixture counts the "
                     "bytes a token reads (its k experts, not all).", "", *expert_rows(report), ""]
                    if expert_rows(report) else []),
                  *(["## Shapes measured at a few depths, PROJECTED to their full depth", "",
                     "A model too large for this machine's memory, measured with its first L layers at two or more "
                     "depths; each engine's time a token, and each verify pass's time, fitted linearly in L and read "
                     "at the full depth. A projection, not a measurement of the full model; its n-gram column is the "
                     "projection above (the bundled model's Spec-Bench acceptance) on that projected curve.", "",
                     *depth_rows(report), ""] if depth_rows(report) else []),
                  f"## Time to first token ({cfg['ttft_tokens']}-token prompt), load time, resident memory after load",
                  "", *resource_rows(report), "",
                  "RSS from /proc/PID/status: RssAnon (heap) and RssFile (mapped file pages). Each engine loads the "
                  "file just after it was read once (from the page cache, not the disk: real_models.warm).", "",
                  "## PROJECTED speedups of the decode phase (not measured on these models)", "",
                  f"n-gram acceptance: measured by the bundled SmolLM2-135M on Spec-Bench, read from "
                  f"`{proj.acceptance}` (65 prompts, 5 per category, 128 tokens). Random weights make acceptance "
                  "on these files meaningless, so these are projections: a real model of this shape accepts "
                  "differently. Each cell: the rounds model (the bundled run's draft lengths and per-position "
                  "acceptance, on this model's measured curve) / "
                  + ("the same on the bundled model's `--k auto` run, the engine's default "
                     f"(`{proj.acceptance_auto}`; its drafts were cut to the lookup's confidence on the 135M "
                     "curve, so they are no longer than this curve would allow) / " if proj.acceptance_auto
                     else "")
                  + "the planner (`specdec plan`: one rate a, best k up "
                  "to 8). Lookup cost c per drafted token: the bundled run's lookup time over this model's pass.", "",
                  *ngram_rows(report), "",
                  "Draft model: cost per pass = the bundled 135M model's 1-row pass measured here (same context), "
                  "over the target's. Acceptance is an ASSUMPTION (no draft model for these targets was measured; "
                  "the only draft-model result in docs/results is an int8 copy of the target itself, a = 0.79-0.83 "
                  "at temperature 0.7-1.0, docs/results/drafters.md: an upper bound). Planner's best k <= 8.", "",
                  *draft_rows(report), ""]
    if report.gemma:
        g = report.gemma
        lines += ["## Gemma 3 270M Q4_K_M (real weights), specdec's default path", "",
                  f"`{g.file}` ({gb(g.file_bytes)} GB, floor {g.floor_tokens_per_s:.1f} tok/s), the first "
                  f"Spec-Bench summarization prompt ({len(g.specdec.prompt_ids)} tokens, "
                  + ("through the chat template" if g.specdec.chat_template else "raw: no chat template")
                  + f"), up to {cfg['gemma_new_tokens']} "
                  f"tokens, stopping at eos (both engines). specdec precision: {g.specdec.precision}.", "",
                  *gemma_rows(g), ""]
    write_text_atomic(path, "\n".join(lines))
