"""The tables, figures and findings behind the top-K notebook (``notebooks/03_topk.ipynb``), from
the rows of ``data/results/topk.csv`` (:func:`andromeda_nb.analysis.results.measurements`).

Variant names of the suite: ``block_topk`` (unseeded), ``block_topk_seeded`` (the default filter
path), ``..._scan_path``, ``..._batch_path`` (the batch-of-one route of ``topk_scores``),
``block_topk_onelaunch``, ``block_topk_batched[_seeded]`` (a batch of requests), ``..._eligible``
(an eligible bitset), ``..._stage_<stage>`` (one stage of a call timed alone), ``..._rounds<n>``
(a diagnostic), and the baselines ``torch.topk`` and ``cupy.argpartition``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import plots, results

#: L2 cache of the H200 (50 MB, as the H100 SXM's: NVIDIA's datasheets); scores that fit were
#: read from L2 when timed back to back, as right after scoring.
L2_BYTES = 50e6
#: The fraction of the read ceiling this sandbox aims at for a single request at 10^8 scores.
TARGET_FRACTION_OF_READ_CEILING = 0.80
#: The pool size and k of the headline comparison.
HEADLINE_N, HEADLINE_K = 100_000_000, 1000
STAGE_LABELS = {"seed": "seed (its sample included)", "filter": "filter (filter path)",
                "final": "final (filter path: rank; a batch: sort)",
                "final_radix": "final by radix select (past 8,192 kept)",
                "scan": "scan (scan path)", "merge": "merge, offer final (scan path)",
                "merge_radix": "merge, radix final (scan path)", "all": "whole call (filter path, default)"}
#: the stages that read every score (the others' fraction of the read ceiling is left empty)
READS_ALL_SCORES = ("filter", "scan", "all")
SCALING_METHODS = ("block_topk_seeded", "block_topk_seeded_batch_path", "block_topk_onelaunch", "torch.topk",
                   "cupy.argpartition")
#: One colour a method in every top-K figure (a method not listed is grey).
METHOD_COLORS = plots.color_map(SCALING_METHODS + ("block_topk", "block_topk_seeded_scan_path"))


def is_stage(variant: pd.Series) -> pd.Series:
    """Whether each variant times one stage of a call (its rate is not a top-K's)."""
    return variant.str.contains("_stage_")


def stage_of(variant: pd.Series) -> pd.Series:
    """The stage a ``..._stage_<stage>`` variant times (``seed``, ``filter``, ``final``, ...)."""
    return variant.str.replace(r"^block_topk_(batched_seeded_)?stage_", "", regex=True)


def label_cases(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with ``case`` (n, k, input order or eligible fraction, batch), ``latency_us`` and
    ``G_scores_per_s``."""
    def case(r):
        text = f"n={int(r['n_ads']):,} k={int(r['k'])} {r['access']}"
        if r["access"] == "bitset":
            text += f" {r['eligible_fraction']:.0%}"
        return text + (f" x{int(r['batch'])}" if r["batch"] > 1 else "")

    out = rows.copy()
    out["case"] = out.apply(case, axis=1) if len(out) else pd.Series(dtype=str)
    out["latency_us"] = out["seconds_median"] * 1e6
    out["G_scores_per_s"] = out["items_per_s"] / 1e9
    return out


def shown(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows a figure may show: a timed run that was not exact (``verified`` FAIL) is no top-K."""
    return rows[~rows["verified"].str.startswith("FAIL")]


def throughput_pivot(rows: pd.DataFrame) -> pd.DataFrame:
    """G scores/s per case (rows, ordered by batch, n, k, access) and method (columns): the newest
    run of each, stages and ``_rounds`` diagnostics left out, bitset and batch variants under their
    method's name (the case says bitset / batch)."""
    rows = label_cases(shown(rows))
    newest = results.in_time_order(rows[~is_stage(rows["variant"]) & ~rows["variant"].str.contains("_rounds")])
    method = newest["variant"].str.replace("_eligible", "").str.replace("block_topk_batched", "block_topk")
    pivot = newest.assign(method=method).pivot_table(index="case", columns="method", values="items_per_s",
                                                     aggfunc="last") / 1e9
    keys = ["batch", "n_ads", "k", "access"]
    order = newest.groupby("case")[keys].first().sort_values(keys)
    return pivot.loc[order.index[order.index.isin(pivot.index)]]


def stage_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One call (or one batch) split by stage, each timed alone: ``n_ads, k, batch, stage, label,
    latency_us, fraction_of_read_ceiling, commit``, in pipeline order; the fraction only for the
    stages that read every score (:data:`READS_ALL_SCORES`)."""
    st = label_cases(shown(rows))
    st = st[is_stage(st["variant"])]
    st = st.assign(stage=stage_of(st["variant"]))
    st = st.assign(label=st["stage"].map(STAGE_LABELS).fillna(st["stage"]))
    # a row's fraction counts all n scores read; the other stages read a sample or a small buffer
    st = st.assign(fraction_of_read_ceiling=st["fraction_of_read_ceiling"].where(st["stage"].isin(READS_ALL_SCORES)))
    return st[["n_ads", "k", "batch", "stage", "label", "latency_us", "fraction_of_read_ceiling", "commit"]]


def scaling(rows: pd.DataFrame, methods=SCALING_METHODS) -> pd.DataFrame:
    """The newest verified (or baseline) row of each method, n and k on random input, one request."""
    return label_cases(results.newest(rows, list(methods), access="random", batch=1))


def headline_metrics(rows: pd.DataFrame) -> dict[str, float]:
    """At 10^8 scores, k = 1000, random order: the fastest verified top-K over ``torch.topk``
    (``topk_100M_k1000_over_torch``) and its fraction of the read ceiling. Empty without rows."""
    at = rows[(rows["n_ads"] == HEADLINE_N) & (rows["k"] == HEADLINE_K) & (rows["access"] == "random")]
    best = at[at["ok"] & ~is_stage(at["variant"])]
    torch = at[at["variant"] == "torch.topk"]
    if best.empty or torch.empty:
        return {}
    return {"topk_100M_k1000_over_torch": float(best["items_per_s"].max() / torch["items_per_s"].max()),
            "topk_100M_k1000_fraction_of_read_ceiling": float(best["fraction_of_read_ceiling"].max())}


def correctness_demo(n: int, k: int, seed: int = 0) -> tuple[pd.DataFrame, bool]:
    """``andromeda_nb.topk_scores`` on ``n`` small integer scores with NaN (5 %), infinities and
    many ties, against the float64 oracle: the first rows of the answer and whether ids, scores and
    count all equal the oracle's. Runs on the active backend."""
    from .. import reference, topk_scores

    rng = np.random.default_rng(seed)
    scores = rng.integers(-5, 5, n).astype(np.float32)
    scores[rng.choice(n, n // 20)] = np.nan
    scores[: min(3, n)] = [np.inf, -np.inf, np.inf][: min(3, n)]
    got = topk_scores(scores, k)
    want = reference.topk(scores, k)
    ok = bool(np.array_equal(got.ids, want.ids) and np.array_equal(got.scores, want.scores) and got.count == want.count)
    return pd.DataFrame({"id": got.ids, "score": got.scores, "oracle id": want.ids}).head(8), ok


# --------------------------------------------------------------------------------------------------
# figures


def _where(n: float, batch: float) -> str:
    return "L2-resident" if 4 * n * batch < L2_BYTES else "from HBM"


def throughput_figure(pivot: pd.DataFrame, source: str):
    """A dot a method and case on a log axis (bar lengths on a log axis would mean nothing)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6))
    for m in pivot.columns:
        ax.plot(pivot[m].values, np.arange(len(pivot)), "o", ms=7, alpha=0.85, label=m,
                color=METHOD_COLORS.get(m, "0.5"))
    ax.set_yticks(np.arange(len(pivot)), pivot.index)
    ax.set(xscale="log", xlabel="G scores/s (log)", ylabel="", title="top-K vs torch.topk and cupy, same scores")
    plots.legend_outside(ax)
    plots.source_note(fig, source)
    return fig


def stages_figure(stages: pd.DataFrame, source: str):
    """One panel a shape (n, k, batch), stacked: device time of each stage timed alone."""
    import matplotlib.pyplot as plt

    shapes = sorted(stages.groupby(["n_ads", "k", "batch"]).groups)
    counts = [int(((stages["n_ads"] == n) & (stages["k"] == k) & (stages["batch"] == b)).sum())
              for n, k, b in shapes] or [1]
    fig, axes = plt.subplots(len(counts), 1, figsize=(8, 1.0 * len(counts) + 0.3 * sum(counts)), squeeze=False,
                             gridspec_kw={"height_ratios": counts})
    if not shapes:
        plots.no_data(axes[0, 0], "no committed stage timings")
    for ax, (n, k, b) in zip(axes[:, 0], shapes):
        one = stages[(stages["n_ads"] == n) & (stages["k"] == k) & (stages["batch"] == b)]
        ax.barh(one["label"], one["latency_us"], color="C0")
        for y, v in enumerate(one["latency_us"]):
            ax.text(v, y, f" {v:.0f}", va="center", fontsize="x-small")
        ax.invert_yaxis()  # pipeline order, top to bottom
        what = f"{int(b):,} requests x {int(n):,} scores" if b > 1 else f"n = {int(n):,} scores"
        ax.set(xlabel="device time (µs)", ylabel="", title=f"{what}, k = {int(k)} ({_where(n, b)})")
        ax.set_xlim(0, one["latency_us"].max() * 1.15)
    fig.tight_layout()
    plots.source_note(fig, source)
    return fig


def scaling_figure(scale: pd.DataFrame, read_TBps: float, source: str):
    """Left: G scores/s against k at 10^8 scores. Right: device time against n at k = 1000
    (filled: the scores fit in L2; open: read from HBM). Dotted lines join one method's points,
    which may come from different runs."""
    import matplotlib.pyplot as plt

    color = METHOD_COLORS
    fig, (ax_k, ax_n) = plt.subplots(1, 2, figsize=(12, 4))
    for method, g in scale[scale["n_ads"] == HEADLINE_N].groupby("variant"):
        ax_k.plot(g["k"], g["G_scores_per_s"], "o-" if len(g) > 1 else "o", label=method, color=color.get(method))
    ax_k.axhline(read_TBps * 1e3 / 4, ls=":", color="0.5", label="read ceiling (4 B a score)")
    ax_k.set(xscale="log", yscale="log", xlabel="k", ylabel="G scores/s (log)", title="n = 10^8, random order")
    for method, g in scale[scale["k"] == HEADLINE_K].groupby("variant"):
        ax_n.plot(g["n_ads"], g["latency_us"], ":" if len(g) > 1 else "", color=color.get(method), lw=1)
        l2 = 4 * g["n_ads"] < L2_BYTES
        ax_n.plot(g["n_ads"][l2], g["latency_us"][l2], "o", color=color.get(method), label=method)
        ax_n.plot(g["n_ads"][~l2], g["latency_us"][~l2], "o", mfc="none", color=color.get(method))
    ax_n.set(xscale="log", yscale="log", xlabel="scores n", ylabel="device time per call (µs, log)",
             title=f"k = {HEADLINE_K} (filled: scores in L2; open: from HBM)")
    for ax in (ax_k, ax_n):
        ax.legend(fontsize="small")
    plots.source_note(fig, source)
    return fig


# --------------------------------------------------------------------------------------------------
# findings


def _newest(rows: pd.DataFrame, variant: str, n: float, k: float, access: str = "random", batch: float = 1,
            fraction: float | None = None) -> pd.Series | None:
    sel = rows[(rows["variant"] == variant) & (rows["n_ads"] == n) & (rows["k"] == k) & (rows["access"] == access)
               & (rows["batch"] == batch) & (rows["ok"] | rows["verified"].str.startswith(("baseline", "n/a")))]
    if fraction is not None:
        sel = sel[np.isclose(sel["eligible_fraction"], fraction)]
    return None if sel.empty else results.in_time_order(sel).iloc[-1]


def _rate(r) -> str:
    return f"{r['items_per_s'] / 1e9:.0f} G scores/s"


def _stages_text(rows, n, k, batch=1) -> str:
    st = stage_table(rows)
    st = st[(st["n_ads"] == n) & (st["k"] == k) & (st["batch"] == batch)]
    st = st[st["stage"].isin(["seed", "filter", "final"])]
    if st.empty:
        return ""
    times = ", ".join(f"{s} {t:.0f} µs" for s, t in zip(st["stage"], st["latency_us"]))
    return f"{times} (run {str(st['commit'].iloc[0])[:7]})"


def findings(rows: pd.DataFrame) -> str:
    """The notebook's conclusions as Markdown bullets, every number from the newest committed row
    of each point (``rows``: :attr:`Measurements.rows`); a point without rows is left out."""
    n, k = HEADLINE_N, HEADLINE_K
    out = []
    seeded, torch = _newest(rows, "block_topk_seeded", n, k), _newest(rows, "torch.topk", n, k)
    if seeded is not None and torch is not None:
        others = [r for kk in sorted(rows.loc[rows["variant"] == "block_topk_seeded", "k"].dropna().unique())
                  if kk != k and (r := _newest(rows, "block_topk_seeded", n, kk)) is not None]
        line = (f"At 10^8 scores the *seeded* top-K is {seeded['items_per_s'] / torch['items_per_s']:.1f}x faster than "
                f"`torch.topk`: {_rate(seeded)} against {torch['items_per_s'] / 1e9:.1f} at k = {k} in random order"
                + (" (" + ", ".join(f"{r['items_per_s'] / 1e9:.0f} at k = {int(r['k'])}" for r in others) + ")"
                   if others else "")
                + f", {seeded['fraction_of_read_ceiling']:.2f} of the read ceiling against the "
                f"{TARGET_FRACTION_OF_READ_CEILING:.0%} this sandbox aims for (run {str(seeded['commit'])[:7]}).")
        scan = _newest(rows, "block_topk_seeded_scan_path", n, k)
        if scan is not None:
            line += f" The scan path (per-block lists, then a merge) reads {_rate(scan)}."
        stages = _stages_text(rows, n, k)
        if stages:
            line += f" Stages timed alone: {stages}."
        out.append(line)
    asc = _newest(rows, "block_topk_seeded", n, k, access="ascending")
    if asc is not None:
        out.append(f"**Sorted-ascending input**: {_rate(asc)} ({asc['fraction_of_read_ceiling']:.2f} of the ceiling): "
                   "the seed comes from the sample's top chunk, so more scores pass it than on random input.")
    plain, plain_asc = _newest(rows, "block_topk", n, k), _newest(rows, "block_topk", n, k, access="ascending")
    torch_asc = _newest(rows, "torch.topk", n, k, access="ascending")
    if plain is not None and torch is not None:
        line = (f"**Unseeded**, the block top-K reads {plain['items_per_s'] / 1e9:.1f} G scores/s against "
                f"{torch['items_per_s'] / 1e9:.1f} for `torch.topk` on random input")
        if plain_asc is not None and torch_asc is not None:
            line += (f", {plain_asc['items_per_s'] / 1e9:.1f} against {torch_asc['items_per_s'] / 1e9:.1f} on ascending "
                     "input, where every block's threshold keeps rising and the block sorts its buffer over and over")
        out.append(line + ".")
    elig = [r for f in (0.5, 0.1) if (r := _newest(rows, "block_topk_seeded_eligible", n, k, "bitset", 1, f)) is not None]
    if elig:
        out.append("With an eligible bitset the seeded call reads "
                   + ", ".join(f"{_rate(r)} at {r['eligible_fraction']:.0%} eligible ({r['fraction_of_read_ceiling']:.2f})"
                               for r in elig) + ": the filter tests the eligible bits of every word.")
    small = 500_000
    bp, t_small = _newest(rows, "block_topk_seeded_batch_path", small, k), _newest(rows, "torch.topk", small, k)
    if bp is not None and t_small is not None:
        line = (f"A single request of {small:,} scores (L2-resident, as right after scoring) takes "
                f"**{bp['seconds_median'] * 1e6:.1f} µs** against {t_small['seconds_median'] * 1e6:.0f} µs for `torch.topk`: "
                "`topk_scores` answers it by the batched path on a batch of one")
        single = _newest(rows, "block_topk_seeded", small, k)
        if single is not None:
            line += f"; the single-request path takes {single['seconds_median'] * 1e6:.1f} µs"
        stages = _stages_text(rows, small, k)
        line += f"; its stages: {stages}" if stages else ""
        one = _newest(rows, "block_topk_onelaunch", small, k)
        if one is not None:
            line += f"; the one-launch kernel {one['seconds_median'] * 1e6:.1f} µs"
        out.append(line + ".")
    batch = results.in_time_order(rows[(rows["variant"] == "block_topk_batched_seeded") & rows["ok"]])
    if len(batch):
        b = batch.iloc[-1]
        bn, bk, bb = b["n_ads"], b["k"], b["batch"]
        tb, ub = _newest(rows, "torch.topk", bn, bk, batch=bb), _newest(rows, "block_topk_batched", bn, bk, batch=bb)
        line = (f"**Batched** ({int(bb):,} requests x {int(bn):,} scores, k = {int(bk)}): the seeded path takes "
                f"{b['seconds_median'] * 1e6:.0f} µs, {_rate(b)}, {b['fraction_of_read_ceiling']:.2f} of the read ceiling")
        if tb is not None:
            line += (f", {tb['seconds_median'] / b['seconds_median']:.1f}x `torch.topk(dim=1)` "
                     f"({tb['seconds_median'] * 1e6:.0f} µs)")
        if ub is not None:
            line += f" and {ub['seconds_median'] / b['seconds_median']:.1f}x the unseeded block top-K"
        stages = _stages_text(rows, bn, bk, bb)
        out.append(line + (f"; stages: {stages}" if stages else "") + ".")
    out.append("Fused into scoring, top-K costs almost nothing: notebook 02, \"the cost of fusing top-K\".")
    return "\n".join(f"* {line}" for line in out)
