"""The tables behind the scoring notebook (``notebooks/02_scoring.ipynb``), from the rows of
``data/results/scoring.csv`` as :func:`andromeda_nb.analysis.results.load` returns them.

Every function returns an empty frame (or None) where the committed table holds no rows for the
configuration asked for, so the notebook runs for any of its parameters and says what is missing
instead of failing. Only verified rows (``ok``) without a ``REGRESSION`` flag count. Points of
different runs are not comparable (one run's ceiling and clocks), so each comparison takes its rows
from one commit where it can, and names it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..score.unfused import fused_bytes_per_ad

#: instructions the H200 can issue a second, counted in lanes: 132 SMs x 4 schedulers x 1.98 GHz x 32
#: (the issue roof of data/results/scoring_diagnostics.md)
H200_LANE_ISSUE_PER_S = 132 * 4 * 1.98e9 * 32
#: SASS instructions per multiply-add of the gated model: 1,211 instructions in the ad loop of the
#: default E = 6, K = 2, d = 64 fp16 kernel (scoring_diagnostics.md) for its 640 multiply-adds
INSTRUCTIONS_PER_MULTIPLY_ADD = 1211 / 640


def gated_multiply_adds(d: int, experts: int, k_experts: int) -> int:
    """Multiply-adds per ad of the gated model (DESIGN.md: 2d encode, E d gate, K d values; the E
    exps apart)."""
    return 2 * d + experts * d + k_experts * d


def issue_bound_points(points: pd.DataFrame, d: int, dtype: str, read_TBps: float) -> pd.DataFrame:
    """Per K, the smallest E of ``points`` from which the gated kernel is issue-bound by the model:
    its instructions per ad (``INSTRUCTIONS_PER_MULTIPLY_ADD`` x :func:`gated_multiply_adds`) exceed
    what the H200 issues in the time the read ceiling moves one ad's bytes
    (``H200_LANE_ISSUE_PER_S`` x bytes per ad / ceiling). A model calibrated on one kernel, not a
    measurement: other configurations issue other instruction mixes."""
    if points.empty or not np.isfinite(read_TBps):
        return points.iloc[0:0]
    budget = H200_LANE_ISSUE_PER_S * fused_bytes_per_ad(d, dtype) / (read_TBps * 1e12)
    need = INSTRUCTIONS_PER_MULTIPLY_ADD * np.array([gated_multiply_adds(d, int(e), int(k))
                                                     for e, k in zip(points["experts"], points["k_experts"])])
    over = points[need > budget].sort_values(["k_experts", "experts"])
    return over.drop_duplicates("k_experts", keep="first")


def usable(rows: pd.DataFrame) -> pd.DataFrame:
    """The verified rows without a regression flag."""
    return rows[rows["ok"] & ~rows["regression_flag"]]


def fusion_speedups(rows: pd.DataFrame, d: int, dtype: str, experts: int, k_experts: int) -> pd.DataFrame:
    """Each unfused baseline row of this d and dtype against the fastest fused gated row (E, K,
    fused top-K by either path) of the same access: the full pool for the pool and all-candidates
    runs, the same eligible fraction for a bitset (the same layout where measured). Columns:
    baseline, access, eligible_fraction, byte ratio (the baseline's bytes per scored ad over the
    fused kernel's), measured speed-up of fused, speed-up / byte ratio (the issue's target: >=
    0.8), fused variant, layouts, commits. Empty where either side has no row."""
    sel = usable(rows)
    sel = sel[(sel["d"] == d) & (sel["dtype"] == dtype)]
    fused = sel[sel["variant"].isin(["gated_fused_topk", "gated_fused_topk_filter"]) & (sel["experts"] == experts)
                & (sel["k_experts"] == k_experts)]
    out = []
    for variant in ("unfused_per_op", "unfused_pre_fusion"):
        for _, r in sel[sel["variant"] == variant].iterrows():
            everything = r["access"] == "pool" or (r["access"] == "candidates" and r["eligible_fraction"] == 1.0)
            access = "pool" if everything else r["access"]  # every ad listed: the full pool's work
            fraction = 1.0 if everything else r["eligible_fraction"]
            ref = fused[(fused["access"] == access) & np.isclose(fused["eligible_fraction"], fraction)]
            if (ref["layout"] == r["layout"]).any():
                ref = ref[ref["layout"] == r["layout"]]
            if ref.empty:
                continue
            best = ref.loc[ref["items_per_s"].idxmax()]
            ratio = r["bytes_per_item"] / fused_bytes_per_ad(d, dtype, access, fraction)
            speedup = best["items_per_s"] / r["items_per_s"]
            out.append({"baseline": variant, "access": r["access"], "eligible_fraction": fraction, "byte ratio": ratio,
                        "measured speed-up of fused": speedup, "speed-up / byte ratio": speedup / ratio,
                        "fused variant": best["variant"], "layouts": f"{best['layout']} / {r['layout']}",
                        "fused commit": best["commit"], "baseline commit": r["commit"]})
    return pd.DataFrame(out, columns=["baseline", "access", "eligible_fraction", "byte ratio",
                                      "measured speed-up of fused", "speed-up / byte ratio", "fused variant",
                                      "layouts", "fused commit", "baseline commit"])


def complexity_sweep(rows: pd.DataFrame, d: int, dtype: str) -> dict | None:
    """The E / K sweep of one run (the commit with the most gated fused block top-K rows at this d
    and dtype, pool, ``tiles``): ``points`` (best row per (E, K)), ``dot`` (the dot product's fused
    block top-K ads/s in that run, NaN if absent), ``filter`` (the latest filter-path rows, gated and
    dot, top-1000), ``issue_bound`` (:func:`issue_bound_points`, at that run's
    read ceiling), ``commit`` and ``config`` (the sweep rows' kernel configuration, from their
    notes). None without rows."""
    ok = usable(rows)
    base = ok[(ok["d"] == d) & (ok["dtype"] == dtype) & (ok["layout"] == "tiles") & (ok["access"] == "pool")]
    g = base[base["variant"] == "gated_fused_topk"]
    if g.empty:
        return None
    commit = g["commit"].value_counts().idxmax()
    g = g[g["commit"] == commit].sort_values("items_per_s").drop_duplicates(["experts", "k_experts"], keep="last")
    g = g.sort_values(["k_experts", "experts"])
    dot = base[(base["variant"] == "dot_fused_topk") & (base["commit"] == commit)]["items_per_s"].max()
    filt = base[base["variant"].isin(["gated_fused_topk_filter", "dot_fused_topk_filter"]) & (base["k"] == 1000)]
    filt = filt.sort_values("timestamp").drop_duplicates("variant", keep="last")
    read = float(base[base["commit"] == commit]["ceiling_read_TBps"].median())
    return {"points": g, "dot": float(dot), "filter": filt, "issue_bound": issue_bound_points(g, d, dtype, read),
            "commit": commit, "config": g["notes"].str.split(";").str[0].mode().iloc[0]}


def by_d_and_dtype(rows: pd.DataFrame, experts: int, k_experts: int) -> pd.DataFrame:
    """Scores written to memory on the pool (``tiles``, CUDA-core kernels: tensor-core rows left
    out): for each model (gated with this E and K, or the dot product), d and dtype, the best row
    of the latest run that measured it. Columns: model,
    d, dtype, G_ads_per_s, fraction_of_read_ceiling, ceiling_G_ads_per_s (the read ceiling over the
    row and bias bytes), commit."""
    ok = usable(rows)
    ok = ok[(ok["layout"] == "tiles") & (ok["access"] == "pool") & ~ok["notes"].str.contains("tensor_cores")]
    gated = ok[(ok["variant"] == "gated_scores_to_memory") & (ok["experts"] == experts) & (ok["k_experts"] == k_experts)]
    sel = pd.concat([gated.assign(model="gated"), ok[ok["variant"] == "dot_scores_to_memory"].assign(model="dot")])
    out = []
    for (model, d, dtype), grp in sel.groupby(["model", "d", "dtype"]):
        latest = grp.sort_values("timestamp")["commit"].iloc[-1]
        best = grp[grp["commit"] == latest].sort_values("items_per_s").iloc[-1]
        out.append({"model": model, "d": int(d), "dtype": dtype, "G_ads_per_s": best["items_per_s"] / 1e9,
                    "fraction_of_read_ceiling": best["fraction_of_read_ceiling"],
                    "ceiling_G_ads_per_s": best["ceiling_read_TBps"] * 1e3 / fused_bytes_per_ad(int(d), dtype),
                    "commit": latest})
    return pd.DataFrame(out, columns=["model", "d", "dtype", "G_ads_per_s", "fraction_of_read_ceiling",
                                      "ceiling_G_ads_per_s", "commit"])


def fusion_cost(rows: pd.DataFrame, d: int, dtype: str, experts: int = 6, k_experts: int = 2
                ) -> tuple[pd.DataFrame, str | None]:
    """Scores to memory against fused top-K (block and filter paths), from the latest run that
    measured both the gated filter path and gated scores to memory at this d, dtype, E and K (or,
    where no run did, the dot product's pair; pool, ``tiles``). Returns (table, commit); an empty table and None without such a run.
    Column ``of_scoring_alone``: ads/s over the same model's scores-to-memory ads/s (the issue's
    target: >= 0.95)."""
    ok = usable(rows)
    gated = ok["variant"].str.startswith("gated") & (ok["experts"] == experts) & (ok["k_experts"] == k_experts)
    fuse = ok[ok["variant"].isin(["gated_scores_to_memory", "gated_fused_topk", "gated_fused_topk_filter",
                                  "dot_scores_to_memory", "dot_fused_topk_filter"])
              & (gated | ok["variant"].str.startswith("dot"))
              & (ok["d"] == d) & (ok["dtype"] == dtype) & (ok["layout"] == "tiles") & (ok["access"] == "pool")]
    has = {m: fuse.groupby("commit")["variant"].agg(
        lambda v, m=m: {f"{m}_fused_topk_filter", f"{m}_scores_to_memory"} <= set(v)) for m in ("gated", "dot")}
    both = has["gated"] if has["gated"].any() else has["dot"]  # the gated pair where any run has it
    columns = ["variant", "k", "G_ads_per_s", "fraction_of_read_ceiling", "of_scoring_alone", "commit"]
    if not both.any():
        return pd.DataFrame(columns=columns), None
    latest = fuse[fuse["commit"].isin(both[both].index)].sort_values("timestamp")["commit"].iloc[-1]
    fuse = fuse[fuse["commit"] == latest]
    alone = fuse[fuse["variant"].str.endswith("scores_to_memory")].groupby("variant")["items_per_s"].max()
    fuse = fuse.assign(model=fuse["variant"].str.split("_").str[0], G_ads_per_s=fuse["items_per_s"] / 1e9,
                       k=fuse["k"].fillna(0).astype(int))
    fuse["of_scoring_alone"] = fuse["items_per_s"] / fuse["model"].map(lambda m: alone.get(f"{m}_scores_to_memory", np.nan))
    fuse = fuse.sort_values("timestamp").drop_duplicates(["variant", "k"], keep="last")
    return fuse[columns], latest


def bitset_savings(rows: pd.DataFrame, commit: str | None, experts: int, k_experts: int, d: int = 64,
                   dtype: str = "fp16") -> pd.DataFrame:
    """The gated filter path (top-1000) with an eligible bitset against the full pool in the same
    run (this d, dtype, E and K): ``of_full_pool_time`` against the pool of the same layout (NaN
    where that run has none) and ``of_fastest_pool_time`` against the run's fastest pool row of
    any layout (the issue's target: <= 0.25 at 10 %), with the eligible ads scored per second;
    run ``commit`` only, or every run that measured both (``commit=None``), newest first. A ratio
    never mixes runs. Empty without such rows."""
    columns = ["commit", "layout", "eligible_fraction", "weights", "eligible_G_ads_per_s", "seconds_median",
               "of_full_pool_time", "of_fastest_pool_time"]
    ok = usable(rows)
    elig = ok[(ok["variant"] == "gated_fused_topk_filter") & (ok["k"] == 1000) & (ok["experts"] == experts)
              & (ok["k_experts"] == k_experts) & (ok["d"] == d) & (ok["dtype"] == dtype)
              & ok["access"].isin(["pool", "bitset"])]
    if commit is not None:
        elig = elig[elig["commit"] == commit]
    pool = elig[elig["access"] == "pool"]
    same = pool.groupby(["commit", "layout"])["seconds_median"].min()
    fastest = pool.groupby("commit")["seconds_median"].min()
    elig = elig[(elig["access"] == "bitset") & elig["commit"].isin(fastest.index)]
    if elig.empty:
        return pd.DataFrame(columns=columns)
    t = elig["seconds_median"].to_numpy()
    elig = elig.assign(of_full_pool_time=t / np.array([same.get(k, np.nan) for k in zip(elig["commit"], elig["layout"])]),
                       of_fastest_pool_time=t / elig["commit"].map(fastest).to_numpy(),
                       eligible_G_ads_per_s=elig["items_per_s"] / 1e9,
                       weights=np.where(elig["notes"].str.contains("weights=param"), "param", "shared"))
    return elig.sort_values("timestamp", ascending=False)[columns]
