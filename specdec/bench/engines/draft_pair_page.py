"""The projections of a draft-model pair's run (draft_pair.py) and its Markdown page."""

from __future__ import annotations

import shlex
from pathlib import Path

from specdec.atomic import write_text_atomic
from specdec.bench.engines.model_runs import DraftPairRun, PairProjection
from specdec.bench.tables import num, speedup
from specdec.theory.economics import CostCurve, plan

ALPHAS = (0.6, 0.7, 0.8)  # assumed: random weights accept nothing meaningful
MAX_K = 32  # as `specdec plan`; the measured curve bounds k below it (the planner never extrapolates)
SPREAD = 1.15  # 1-row passes of repeats this far apart: the host's memory bandwidth changed between them


def project(c: float, c_ngram: float, cost: dict[str, float]) -> dict[str, PairProjection]:
    """PROJECTED, by a in ALPHAS: the draft model's and n-gram's best k and speedup on the curve `cost`."""
    curve, out = CostCurve.from_mapping(cost), {}
    for a in ALPHAS:
        d, g = plan(a, c, MAX_K, curve), plan(a, c_ngram, MAX_K, curve)
        out[str(a)] = PairProjection(d.best_k, d.best_speedup, g.best_k, g.best_speedup)
    return out


def break_even(c: float, cost: dict[str, float]) -> float | None:
    """The lowest acceptance rate (to 0.01) at which drafting with cost c beats plain decoding on this curve."""
    curve = CostCurve.from_mapping(cost)
    return next((a / 100 for a in range(1, 100) if plan(a / 100, c, MAX_K, curve).best_speedup > 1.0), None)


def flattest(r: DraftPairRun) -> dict[str, float] | None:
    """Where the fastest 1-row passes of the repeats lie more than SPREAD apart (the host's memory bandwidth changed
    between them): the curve of the repeat with the slowest, from its medians (a repeat whose bandwidth changed midway
    mixes the two in its fastest passes). None where they agree."""
    one = [v.step_s for v in r.verify]
    if max(one) <= SPREAD * min(one):
        return None
    med = max(r.verify, key=lambda v: v.step_s).median_times_s
    return {n: t / med["1"] for n, t in med.items()}


def _ms(s: float) -> str:
    return num(s, 1, 1e3)


def header(r: DraftPairRun, json_path: str) -> list[str]:
    m, cfg = r.machine, r.config
    note = cfg.get("note")
    loads = ", ".join(f"{x[0]:.2f}" for x in r.load_avg)
    busy = r.team_changes or r.load_avg[0][0] > 0.5
    return [
        f"# A draft-model pair: {Path(r.draft).name} drafting for {Path(r.target).name}",
        "",
        f"- CPU: {m['cpu']}; {m['cores']} cores; ISA: {', '.join(m['isa']) or 'none of avx2/avx512/vnni/amx'}",
        f"- read bandwidth (torch sum over 1 GiB, median of 5): {m['bandwidth_gbs']:.1f} GB/s at the start, "
        f"{m['bandwidth_end_gbs']:.1f} GB/s at the end",
        f"- {m['date_utc']}, git {m['git']}; threads {cfg['threads'] or 'auto'}",
        f"- load average (1 min) at the start and after each part: {loads} (the run's own threads count in it after "
        f"the start); the thread team changed size {r.team_changes} time(s) during the run: "
        f"{'other processes were using these cores' if busy else 'the machine was quiet when it started'}",
        f"- command: `{m['command'].replace(shlex.quote(note), 'TEXT')}` (TEXT: the paragraph after the next)"
        if note and shlex.quote(note) in m["command"] else f"- command: `{m['command']}`",
        f"- raw JSON: `{json_path}`",
        "",
    ]


def goals(r: DraftPairRun) -> list[str]:
    p = r.projections.get("0.7")
    measures = ", ".join(f"{x['c']:.3f}" for x in r.c_runs)
    at_07 = (f"draft model {speedup(p.draft_speedup)} (k = {p.draft_k}) beside n-gram {speedup(p.ngram_speedup)} "
             f"(k = {p.ngram_k}), PROJECTED" if p else "-")
    return [
        "## The goals",
        "",
        "| goal | result |",
        "|---|---|",
        f"| c at most 0.2 | c = {r.c:.3f} ({'met' if r.c <= 0.2 else 'NOT met'}; the median of {len(r.c_runs)} "
        f"measures: {measures}) |",
        f"| greedy output identical to plain | {'yes' if r.identical else 'NO'}: {r.plain.tokens} tokens, with k = "
        f"{r.config['k']} and with --k auto |",
        f"| projected speedup at a = 0.7 beside n-gram's | {at_07} |",
        "",
    ]


def cost_section(r: DraftPairRun) -> list[str]:
    load = r.c_at_load
    lines = ["## The draft's cost c", "",
             "c = the draft's one-token pass over the target's, both after the same context, the two models' passes "
             "alternated pass by pass (`draft_cost` in specdec/drafters/draft_model.py: what `generate` and `serve` "
             "measure and print at load, and `profile --drafter draft-model` records).", "",
             "| measure | context | pairs | draft ms | target ms | c | measuring took s |",
             "|---|---|---|---|---|---|---|"]
    for name, x in [("at load (`runtime.build`)", load), *((f"repeat {i + 1}", x) for i, x in enumerate(r.c_runs))]:
        lines.append(f"| {name} | {x['context']} | {x['pairs']} | {_ms(x['draft_s'])} | {_ms(x['target_s'])} "
                     f"| {x['c']:.3f} | {x['seconds']:.1f} |")
    return [*lines, ""]


def verify_section(r: DraftPairRun) -> list[str]:
    rows = sorted(int(n) for n in r.cost)
    head = "| curve | 1-row pass ms | " + " | ".join(str(n) for n in rows[1:]) + " |"
    lines = ["## The target's verify cost: a pass over n rows over a 1-row pass", "",
             f"Context {r.verify[0].context}; each repeat the fastest of {r.verify[0].reps} passes per row count (the "
             "counts alternated rep by rep); the last line, each count's fastest over all repeats, is the curve the "
             "projections use.", "", head, "|---|---|" + "---|" * (len(rows) - 1)]
    for i, v in enumerate(r.verify):
        lines.append(f"| repeat {i + 1} | {_ms(v.step_s)} | " + " | ".join(f"{v.cost[str(n)]:.2f}" for n in rows[1:])
                     + " |")
    lines.append(f"| **best** | {_ms(r.step_s)} | " + " | ".join(f"{r.cost[str(n)]:.2f}" for n in rows[1:]) + " |")
    one = [v.step_s for v in r.verify]
    wide = [v.times_s[str(rows[-1])] for v in r.verify]
    if flattest(r) is not None:
        lines += ["", f"The 1-row pass took {_ms(min(one))}-{_ms(max(one))} ms between repeats, the {rows[-1]}-row "
                  f"pass {_ms(min(wide))}-{_ms(max(wide))} ms: a pass over few rows is bound by memory bandwidth, "
                  "which other work on the host shares, and one over many rows by arithmetic, which it does not. The "
                  "best line takes each count's fastest, the steepest curve: the projections below are on the "
                  "conservative side for speculation; beside them, those on the flattest repeat's curve (its "
                  "medians)."]
    return [*lines, ""]


def projection_section(r: DraftPairRun) -> list[str]:
    even = break_even(r.c, r.cost)
    lines = [
        "## PROJECTED speedups of the decode phase", "",
        "Random weights accept nothing meaningful, so acceptance is assumed, not measured. At each rate a, each "
        "drafter's best k on the measured curve (as `specdec plan` picks it, never past the curve): "
        "E[tokens/round] = (1 - a^(k+1)) / (1 - a), speedup = E / (k c + verify_cost(k+1)), against plain decoding. "
        f"The draft model's c = {r.c:.3f}; n-gram's c = {r.c_ngram:.5f}, its measured lookup "
        f"({num(r.lookup['seconds_per_round'], 1, 1e6)} µs a round of k = {r.lookup['k']}, on a "
        f"{r.lookup['context']}-token context) over the target's 1-row pass.", ""]
    flat = flattest(r)
    other = project(r.c, r.c_ngram, flat) if flat is not None else None
    cell = lambda x, k: f"{speedup(x)} (k = {k})"  # noqa: E731
    lines += ["| a | draft model | n-gram |" + (" on the flattest repeat's medians: draft model | n-gram |" if other
                                                else ""), "|---|---|---|" + ("---|---|" if other else "")]
    for a in ALPHAS:
        p, q = r.projections[str(a)], other[str(a)] if other else None
        lines.append(f"| {a} | {cell(p.draft_speedup, p.draft_k)} | {cell(p.ngram_speedup, p.ngram_k)} |"
                     + (f" {cell(q.draft_speedup, q.draft_k)} | {cell(q.ngram_speedup, q.ngram_k)} |" if q else ""))
    lines += ["", "At the same a, n-gram lookup is always ahead: it drafts for free. The two rates are not the same "
              "in use: lookup drafts only where the text repeats itself (a copy, an edit, code), and a draft model "
              "drafts everywhere, so the draft model earns its place on text that lookup cannot predict. "
              + (f"With this c and curve it beats plain decoding from a = {even:.2f} on." if even is not None else
                 "With this c and curve it never beats plain decoding."), ""]
    return lines


def decode_section(r: DraftPairRun) -> list[str]:
    lines = ["## Greedy output with the draft", "",
             f"{r.plain.tokens} tokens of the first Spec-Bench writing prompt (chat template), eos ignored (random "
             "weights emit it by chance). Random weights agree by chance only, so nearly every draft is rejected: this "
             "checks that the output does not change whatever the acceptance, and shows what a useless draft costs "
             "(with --k auto the planner soon stops drafting). The three runs came one after the other, not "
             "alternated: on a shared machine their rates differ by its load as much as by the runs.", "",
             "| run | decode tok/s | drafted | accepted | tokens / round | tokens identical to plain |",
             "|---|---|---|---|---|---|"]
    for name, d in (("plain", r.plain), (f"draft model, k = {r.config['k']}", r.fixed), ("draft model, --k auto",
                                                                                        r.auto)):
        same = "-" if d is r.plain else ("yes" if d.token_ids == r.plain.token_ids else "NO")
        lines.append(f"| {name} | {num(d.decode_tokens_per_s)} | {d.drafted if d is not r.plain else '-'} | "
                     f"{d.accepted if d is not r.plain else '-'} | {num(d.tokens_per_pass)} | {same} |")
    return [*lines, ""]


def write_page(r: DraftPairRun, path: Path, json_path: str) -> None:
    """The page of run r (read from, or saved to, json_path) at path."""
    gb = lambda n: f"{n / 1e9:.2f} GB"  # noqa: E731
    intro = [
        f"The files are **random-weight** GGUFs from `specdec synth-gguf` with llama.cpp's Q4_K_M type mix "
        f"({Path(r.target).name} {gb(r.target_bytes)}, {Path(r.draft).name} {gb(r.draft_bytes)}): their speed is "
        "real, their output is noise. Both carry the same tokenizer by construction (the bundled one padded to the "
        f"shape's vocabulary); the load checked it id for id: {r.vocabulary} tokens alike. They ran lean on the native "
        f"kernels, the target on {r.target_precision} and the draft on {r.draft_precision}, each with its own KV "
        f"cache; loading both, the tokenizer check and c at load took {r.load_s:.1f} s.", "",
        *([r.config["note"], ""] if r.config.get("note") else [])]
    lines = [*header(r, json_path), *intro, *goals(r), *cost_section(r), *verify_section(r), *projection_section(r),
             *decode_section(r)]
    write_text_atomic(path, "\n".join(lines))
