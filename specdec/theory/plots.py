"""PNG plots of the theory: the speedup curve against k and the batch roofline ratio against batch size."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display): every plot of specdec starts here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: str | Path) -> None:
    """Write the figure whole or not at all (specdec.atomic), then free it."""
    from specdec.atomic import savefig_atomic

    try:
        savefig_atomic(fig, path)
    finally:
        pyplot().close(fig)


def _shade_slower(ax, x_max: float, y_max: float) -> None:
    ax.axhspan(0.0, 1.0, color="tab:red", alpha=0.08, label="slower than plain decoding")
    ax.axhline(1.0, color="tab:red", lw=0.8, ls="--")
    ax.set_ylim(0.0, max(1.2, y_max * 1.1))
    ax.set_xlim(left=0, right=x_max)


def plot_plan(plan, path: str | Path) -> None:
    plt = pyplot()
    ks = [row["k"] for row in plan.curve]
    ss = [row["speedup"] for row in plan.curve]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    ax.plot(ks, ss, marker="o", ms=3, label=f"a = {plan.alpha:g}, c = {plan.draft_cost:g}")
    ax.plot([plan.best_k], [plan.best_speedup], "*", ms=14, color="tab:orange",
            label=f"peak: k = {plan.best_k}, {plan.best_speedup:.2f}x")
    _shade_slower(ax, max(ks) + 1, max(ss))
    ax.set_xlabel("draft depth k (tokens drafted per round)")
    ax.set_ylabel("speedup over plain decoding (x)")
    ax.set_title("Speculative decoding: speedup against draft depth")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    save(fig, path)


def plot_batch(model, path: str | Path) -> None:
    plt = pyplot()
    bs = [row["batch"] for row in model.curve]
    rs = [row["ratio"] for row in model.curve]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    ax.plot(bs, rs, label=f"a = {model.alpha:g}, k = {model.k}, c = {model.draft_cost:g}, knee = {model.knee_rows:g}")
    peak = max(range(len(rs)), key=rs.__getitem__)
    ax.plot([bs[peak]], [rs[peak]], "*", ms=14, color="tab:orange", label=f"peak: {rs[peak]:.2f}x at batch {bs[peak]}")
    if model.crossover_batch is not None:
        ax.axvline(model.crossover_batch, color="tab:gray", ls=":",
                   label=f"crossover: batch {model.crossover_batch}")
    _shade_slower(ax, max(bs), max(rs))
    ax.set_xlabel("batch size (sequences decoding together)")
    ax.set_ylabel("throughput with / without speculation (x)")
    ax.set_title("Speculation under load (roofline model)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    save(fig, path)
