"""`specdec loadtest`'s report: a table of the levels (one per run and level for several runs), the throughput
and latency plot against concurrency, and the JSON of the levels and the configuration."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

from specdec.bench import tables
from specdec.bench.serving.load_types import LevelResult, LoadConfig

# ---- reports ---------------------------------------------------------------------------------------------------

HEADER = ("concurrency", "requests", "failed", "tokens", "tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)", "ITL p50 (ms)",
          "ITL p99 (ms)", "TPOT mean (ms)", "E2E p50 (s)", "E2E p99 (s)")


def _cells(r: LevelResult) -> list[str]:
    ms = [tables.num(v, 1, 1e3) for v in (r.ttft_p50_s, r.ttft_p99_s, r.itl_p50_s, r.itl_p99_s, r.tpot_mean_s)]
    return ([str(r.concurrency), str(r.requests), str(r.failed), str(r.output_tokens), f"{r.throughput_tok_s:.1f}"]
            + ms + [tables.num(r.e2e_p50_s), tables.num(r.e2e_p99_s)])


def _table(series: dict[str, list[LevelResult]], labelled: bool) -> str:
    head = (["run"] if labelled else []) + list(HEADER)
    rows, errors = [], []
    for label, results in series.items():
        for r in results:
            rows.append(([label] if labelled else []) + _cells(r))
            errors += [f"- {label + ', ' if labelled else ''}concurrency {r.concurrency}: {e}" for e in r.errors]
    text = tables.table(head, rows)
    if errors:
        text += "\n\nErrors (the first few per level):\n\n" + "\n".join(errors)
    return text + "\n"


def markdown_series(series: dict[str, list[LevelResult]]) -> str:
    """One table, a row per (run, level), the run's label in the first column."""
    return _table(series, labelled=True)


def markdown(results: list[LevelResult]) -> str:
    return _table({"": results}, labelled=False)


LATENCY_LINES = (("ttft_p50_s", "TTFT p50", "-", "o"), ("ttft_p99_s", "TTFT p99", "--", "o"),
                 ("itl_p50_s", "ITL p50", "-", "s"), ("itl_p99_s", "ITL p99", "--", "s"))  # key, name, style, marker


def plot_series(series: dict[str, list[LevelResult]], path: str | Path) -> None:
    """Two panels against concurrency: output throughput, and TTFT/ITL p50/p99 (ms, log scale). One colour per
    run, one line style per latency."""
    from matplotlib.lines import Line2D

    from specdec.theory.plots import pyplot, save

    plt = pyplot()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=110)
    levels, positive = set(), False
    for i, (label, results) in enumerate(series.items()):
        color = colors[i % len(colors)]
        xs = [r.concurrency for r in results]
        levels.update(xs)
        ax_t.plot(xs, [r.throughput_tok_s for r in results], marker="o", color=color, label=label or None)
        for key, _, style, marker in LATENCY_LINES:
            ys = [getattr(r, key) for r in results]
            ys = [y * 1e3 if y is not None and y > 0 else math.nan for y in ys]  # ms; gaps where none
            positive = positive or any(not math.isnan(y) for y in ys)
            ax_l.plot(xs, ys, ls=style, marker=marker, ms=4, color=color)
    for ax in (ax_t, ax_l):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(levels), [str(c) for c in sorted(levels)])
        ax.set_xlabel("concurrent clients")
        ax.grid(alpha=0.3)
    if positive:
        ax_l.set_yscale("log")
    ax_t.set_ylim(bottom=0)
    ax_t.set_ylabel("output tokens / s")
    ax_t.set_title("Throughput")
    ax_l.set_ylabel("ms")
    ax_l.set_title("Latency: time to first token, inter-chunk latency")
    if any(series):
        ax_t.legend(fontsize=8, loc="best")
    ax_l.legend(handles=[Line2D([], [], color="gray", ls=style, marker=marker, label=name)
                         for _, name, style, marker in LATENCY_LINES], fontsize=8, loc="best")
    fig.tight_layout()
    save(fig, path)


def plot(results: list[LevelResult], path: str | Path) -> None:
    plot_series({"": results}, path)


def to_json(results: list[LevelResult], config: LoadConfig | None = None) -> dict:
    """The levels (and the configuration, API key left out) as plain JSON values."""
    out: dict = {"levels": [asdict(r) for r in results]}
    if config is not None:
        out["config"] = {**asdict(config), "api_key": "(set)" if config.api_key else None}
    return out
