"""The scoring notebook's figures (``notebooks/02_scoring.ipynb``), drawn from the tables of
:mod:`.scoring_report`. Each function returns the figure with its source note set; the notebook
saves it (:func:`andromeda_nb.analysis.plots.save_figure`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..score.unfused import fused_bytes_per_ad
from . import plots, results
from .scoring_report import usable

#: One colour a storage dtype across the scoring figures.
DTYPE_COLORS = {dt: f"C{i}" for i, dt in enumerate(["fp32", "bf16", "fp16", "int8"])}
COUNTED = "counted, not measured: andromeda_nb/score/unfused.py"


def byte_budget(budget: pd.DataFrame, d: int, dtype: str, experts: int, k_experts: int):
    """Stacked bars of :func:`.scoring_report.byte_budget`: bytes per ad of each design by step."""
    ax = budget.plot.barh(stacked=True, figsize=(10, 3.6), color=plots.categorical_colors(budget.shape[1]))
    ax.set(xlabel="bytes moved per ad (reads + writes, B)", ylabel="",
           title=f"byte budget, d={d} {dtype}, E={experts}, K={k_experts}")
    plots.legend_outside(ax, fontsize="small")
    plots.source_note(ax.figure, COUNTED)
    return ax.figure


def network_bytes(net: pd.DataFrame, d: int, dtype: str, k: int = 1000):
    """Bars of :func:`.scoring_report.network_bytes` (MB a request, log scale)."""
    ax = (net.drop(columns="ids_over_answer") / 1e6).plot.bar(logy=True, figsize=(8, 3.6), rot=0)
    ax.set(ylabel="MB per request (log)", xlabel="candidates passing targeting",
           title=f"network bytes per request, k={k}, d={d} {dtype}")
    plots.source_note(ax.figure, COUNTED)
    return ax.figure


def _sweep_panel(ax, sweep: dict | None, d: int, dtype: str) -> None:
    if sweep is None:
        plots.no_data(ax, f"no committed E / K sweep for d={d} {dtype}")
        return
    g, dot, run = sweep["points"], sweep["dot"], sweep["commit"][:7]
    for K, gk in g.groupby("k_experts"):
        ax.plot(gk["experts"], gk["items_per_s"] / 1e9, "o-", label=f"gated, K={int(K)} (block top-1000, {run})")
    if np.isfinite(dot):
        ax.axhline(dot / 1e9, ls="--", color="0.3", label=f"dot product, block top-1000 ({run})")
    ceiling = sweep["read_TBps"] * 1e3 / fused_bytes_per_ad(d, dtype)  # the sweep run's own
    ax.axhline(ceiling, ls=":", color="0.5", label="read ceiling (row + bias bytes)")
    ib = sweep["issue_bound"]
    ax.plot(ib["experts"], ib["items_per_s"] / 1e9, "x", ms=11, mew=2, color="k",
            label="issue-bound from here (model: instructions > issue budget at the read ceiling)")
    for _, r in sweep["filter"].iterrows():
        x = r["experts"] if r["variant"].startswith("gated") else 0.5
        ax.plot(x, r["items_per_s"] / 1e9, "*", ms=12, color="C3" if x > 1 else "0.2",
                label=f"{r['variant'].split('_')[0]}, filter path, latest run ({r['commit'][:7]})")
    ax.set(title=f"d={d} {dtype}, 100M ads; lines: run {run}")
    ax.text(0.02, 0.03, f"lines' kernel: {sweep['config']}", transform=ax.transAxes, fontsize="small", color="0.3")
    ax.set(xlabel="experts E (dot product star at 0.5)", ylabel="G ads/s (fused with top-1000)")
    ax.set_ylim(bottom=0)
    # below the panel: inside, nine entries cover the ceiling line and the dot product's star
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(0.0, -0.17), ncol=2, borderaxespad=0)


def _by_d_panel(ax, points: pd.DataFrame, d: int, experts: int, k_experts: int) -> None:
    if points.empty:
        plots.no_data(ax, f"no committed scores-to-memory rows for E={experts} K={k_experts} or the dot product")
        return
    for (model, dt), grp in points.groupby(["model", "dtype"]):
        grp = grp.sort_values("d")
        color = DTYPE_COLORS.get(dt, "0.4")
        ax.plot(grp["d"], grp["G_ads_per_s"], "o-" if model == "gated" else "s--", color=color,
                label=f"{model}, {dt}", ms=7 if model == "gated" else 5)
        ax.plot(grp["d"], grp["ceiling_G_ads_per_s"], "_", ms=14, mew=2, color=color)
    ax.set_xscale("log", base=2)
    ax.minorticks_off()
    ds = sorted(points["d"].unique()) or [d]
    ax.set(xticks=ds, xticklabels=[str(x) for x in ds], xlabel="embedding dimension d", ylim=(0, None),
           ylabel="G ads/s (scores to memory)", title=f"gated E={experts} K={k_experts}, dot: against d")
    ax.text(0.02, 0.03, "CUDA-core kernels, latest run of each point;\nbars: that point's read ceiling",
            transform=ax.transAxes, fontsize="small", color="0.3")
    ax.legend(fontsize="small")


def complexity(sweep: dict | None, points: pd.DataFrame, source_path: str, d: int, dtype: str,
               experts: int, k_experts: int):
    """Left: the E / K sweep of :func:`.scoring_report.complexity_sweep` against the dot product
    and its run's read ceiling, with the issue model's marks and
    the latest filter-path rows. Right: scores to memory against d per dtype
    (:func:`.scoring_report.by_d_and_dtype`). The source note names the plotted rows' cards and runs."""
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5.4))
    fig.subplots_adjust(bottom=0.33, top=0.93, wspace=0.22)  # room for the left panel's legend below it
    _sweep_panel(ax, sweep, d, dtype)
    _by_d_panel(ax2, points, d, experts, k_experts)
    plotted = pd.concat([points] + ([sweep["points"], sweep["filter"]] if sweep is not None else []))
    plots.source_note(fig, results.provenance(plotted, source_path))
    return fig


def fusion_cost(fuse: pd.DataFrame, run: str | None, source_path: str, d: int, dtype: str):
    """Bars of :func:`.scoring_report.fusion_cost`: ads/s of scores to memory, the block top-K and
    the filter path, each annotated with its rate over its model's scores to memory."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    if run is None:
        plots.no_data(ax, f"no committed run measured a filter path and scores to memory for d={d} {dtype}")
        return fig
    fuse = fuse.sort_values(["variant", "k"], key=lambda c: c.map(str) if c.name == "variant" else c)
    labels = [f"{v.split('_')[0]}: " + ("scores to memory" if v.endswith("memory") else
              f"{'filter path' if v.endswith('filter') else 'block top-K'}, k={k}")
              for v, k in zip(fuse["variant"], fuse["k"])]
    ax.barh(labels, fuse["G_ads_per_s"], color=["C1" if v.startswith("dot") else "C0" for v in fuse["variant"]])
    for y, (rate, of) in enumerate(zip(fuse["G_ads_per_s"], fuse["of_scoring_alone"])):
        ax.annotate(f"{of:.2f} x its model's scores to memory", (rate, y), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize="small")
    ax.set(xlabel="G ads/s", xlim=(0, 1.45 * fuse["G_ads_per_s"].max()),
           title=f"the cost of fusing top-K into scoring, d={d} {dtype}, one run")
    plots.source_note(fig, results.provenance(fuse, source_path))
    return fig


def peers(table: pd.DataFrame, run: str | None, source_path: str, d: int, dtype: str):
    """Bars of :func:`.scoring_report.peers`: ads/s of each contender, annotated with its fraction
    of the read ceiling and its time over the dot product's."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    if run is None:
        plots.no_data(ax, f"no committed run measured the peers at d={d} {dtype}")
        return fig
    t = table.iloc[::-1]
    colors = ["C0" if c.startswith("fused kernel") else "C1" if c.startswith("dot") else "C2" for c in t["contender"]]
    ax.barh(t["contender"], t["G_ads_per_s"], color=colors)
    for y, (rate, frac, over) in enumerate(zip(t["G_ads_per_s"], t["fraction_of_read_ceiling"], t["time_over_dot"])):
        ax.annotate(f"{frac:.2f} of the read ceiling, {over:.2f} x the dot product's time", (rate, y), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize="small")
    ax.set(xlabel="G ads/s, every score to memory", xlim=(0, 2.1 * t["G_ads_per_s"].max()),
           title=f"the gated model against its peers, d={d} {dtype}, one run")
    plots.source_note(fig, results.provenance(table, source_path))
    return fig


def frontier(table: pd.DataFrame, run: str | None, source_path: str):
    """:func:`.scoring_report.frontier`: gated / dot time against the model's FLOPs per ad, a
    marker per (E, K), a line per math mode and d, the limit dashed."""
    import matplotlib.pyplot as plt

    from .scoring_report import FRONTIER_LIMIT

    fig, ax = plt.subplots(figsize=(8, 4.2))
    if run is None:
        plots.no_data(ax, "no committed run measured the frontier (bench scoring --phases frontier)")
        return fig
    styles = {"fp16": "-", "fp32": ":"}
    for i, ((math, d), g) in enumerate(table.groupby(["math", "d"], sort=True)):
        g = g.sort_values("flops_per_ad")
        color = f"C{sorted(table['d'].unique()).index(d)}"
        ax.plot(g["flops_per_ad"], g["time_over_dot"], styles.get(math, "--"), marker="o", color=color,
                label=f"{math} math, d = {d}")
        for r in g.itertuples():
            ax.annotate(f"E{r.experts}K{r.k_experts}", (r.flops_per_ad, r.time_over_dot), xytext=(3, 3),
                        textcoords="offset points", fontsize="x-small")
    ax.axhline(FRONTIER_LIMIT, color="0.4", ls="--", lw=1)
    ax.text(0.99, FRONTIER_LIMIT, f"free up to {FRONTIER_LIMIT:.2f} x the dot product ", transform=ax.get_yaxis_transform(),
            ha="right", va="top", fontsize="small", color="0.3")
    ax.set_ylim(bottom=min(0.95, float(table["time_over_dot"].min()) - 0.05))
    ax.set(xscale="log", xlabel="model FLOPs per ad (gated: encode + gate + K value dots)",
           ylabel="time over the dot product's (same d, run)", title="How large may the model grow? (scores to memory)")
    ax.legend(fontsize="small")
    plots.source_note(fig, results.provenance(table, source_path))
    return fig


def roofline(rows: pd.DataFrame, source_path: str):
    """:func:`.results.roofline` of every verified scoring variant without a regression flag, on one
    card (:func:`.results.one_device`: one read ceiling is the roof)."""
    import matplotlib.pyplot as plt

    shown = results.one_device(usable(rows))
    fig, ax = plt.subplots(figsize=(8, 5))
    results.roofline(ax, shown)
    ax.set(title="roofline: every verified scoring variant", xlim=(0.1, 100))
    plots.legend_outside(ax, fontsize="small")  # inside, it covers points and the ridge
    plots.source_note(fig, results.provenance(shown, source_path))
    return fig
