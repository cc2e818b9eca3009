"""The tables and findings behind the scoring notebook (``notebooks/02_scoring.ipynb``), from the
rows of ``data/results/scoring.csv`` as :func:`andromeda_nb.analysis.results.load` returns them, and
the counted byte models of :mod:`andromeda_nb.score.unfused`. Figures: :mod:`.scoring_figures`.

Every function returns an empty frame (or None) where the committed table holds no rows for the
configuration asked for, so the notebook runs for any of its parameters and says what is missing
instead of failing. Only verified rows (``ok``) without a ``REGRESSION`` flag count. Points of
different runs are not comparable (one run's ceiling and clocks), so each comparison takes its rows
from one commit where it can, and names it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import results
from ..score.unfused import (fused_bytes_per_ad, network_bytes_per_request, per_op_bytes_per_ad,
                             pre_fusion_bytes_per_ad)

#: instructions the H200 can issue a second, counted in lanes: 132 SMs x 4 schedulers x 1.98 GHz x 32
#: (the issue roof of data/results/scoring_diagnostics.md)
H200_LANE_ISSUE_PER_S = 132 * 4 * 1.98e9 * 32
#: SASS instructions per multiply-add of the gated model: 1,211 instructions in the ad loop of the
#: default E = 6, K = 2, d = 64 fp16 kernel (scoring_diagnostics.md) for its 640 multiply-adds
INSTRUCTIONS_PER_MULTIPLY_ADD = 1211 / 640
#: The goals the findings are measured against (design targets, not results): gated over dot
#: product device time writing scores; fused top-K's rate over scoring alone; device time at 10 %
#: eligible over the full pool's; int8 over fp16 ads/s of the dot product.
TARGETS = {"gated_over_dot_time": 1.10, "fused_topk_of_scoring_alone": 0.95, "bitset_0.1_of_pool_time": 0.25,
           "int8_over_fp16": 1.8, "gated_int8_over_fp16": 1.6}
#: Candidate counts of the network comparison: 10^4 ads passing targeting up to the whole 10^8 pool.
NETWORK_CANDIDATES = (10**4, 10**5, 10**6, 10**7, 10**8)


def gated_multiply_adds(d: int, experts: int, k_experts: int) -> int:
    """Multiply-adds per ad of the gated model (`docs/design.md`: 2d encode, E d gate, K d values; the E
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


def usable(rows: pd.DataFrame, math: str = "fp32") -> pd.DataFrame:
    """The verified rows of one math mode (default fp32: every product and sum) without a
    regression flag."""
    return rows[rows["ok"] & ~rows["regression_flag"] & (rows["math"] == math)]


#: (E, K, d) of the math-mode comparison (the issue's targets: gated / dot time per shape)
MATH_SHAPES = ((6, 2, 64), (8, 4, 64), (6, 2, 128))
MATH_TARGETS = {(6, 2, 64): 1.10, (8, 4, 64): 1.20, (6, 2, 128): 1.10}


def math_modes(rows: pd.DataFrame, dtype: str = "fp16") -> pd.DataFrame:
    """The latest run that measured gated rows in fp16 math and the dot product (else the latest
    with gated fp16 rows alone): for each (E, K, d) of
    :data:`MATH_SHAPES` and each of scores to memory and the fused top-1000 (filter path), pool,
    ``tiles``, the dot product's and the gated model's G ads/s in fp32 and fp16 math, and
    gated / dot device time in each math (the dot product of the same d and run). Empty without
    such a run."""
    ok = rows[rows["ok"] & ~rows["regression_flag"] & (rows["dtype"] == dtype) & (rows["layout"] == "tiles")
              & (rows["access"] == "pool")]
    ok = results.one_device(results.default_launches(ok))  # the targets' card
    f16 = ok[ok["variant"].str.startswith("gated") & (ok["math"] == "fp16")]
    columns = ["experts", "k_experts", "d", "output", "dot_G", "fp32_G", "fp16_G", "fp32_over_dot", "fp16_over_dot",
               "target", "commit", "device"]
    if f16.empty:
        return pd.DataFrame(columns=columns)
    with_dot = f16[f16["commit"].isin(ok.loc[ok["variant"].str.startswith("dot"), "commit"])]
    f16 = with_dot if len(with_dot) else f16  # a run with the ratio's baseline, where one has it
    run = ok[ok["commit"] == results.newest_commit(f16)]
    out = []
    for E, K, d in MATH_SHAPES:
        for output, suffix, k in (("scores to memory", "scores_to_memory", None), ("top-1000", "fused_topk_filter", 1000)):
            sel = run[(run["d"] == d) & ((run["k"] == k) if k else run["k"].isna())]
            dot = sel[sel["variant"] == f"dot_{suffix}"]["items_per_s"].max()
            gated = sel[(sel["variant"] == f"gated_{suffix}") & (sel["experts"] == E) & (sel["k_experts"] == K)]
            g = {m: gated[gated["math"] == m]["items_per_s"].max() for m in ("fp32", "fp16")}
            if np.isnan(g["fp16"]):
                continue
            out.append({"experts": E, "k_experts": K, "d": d, "output": output, "dot_G": dot / 1e9,
                        "fp32_G": g["fp32"] / 1e9, "fp16_G": g["fp16"] / 1e9, "fp32_over_dot": dot / g["fp32"],
                        "fp16_over_dot": dot / g["fp16"], "target": MATH_TARGETS[(E, K, d)],
                        "commit": run["commit"].iloc[0], "device": run["device"].iloc[0]})
    return pd.DataFrame(out, columns=columns)


def _math_lines(rows, dtype) -> list[str]:
    t = math_modes(rows, dtype)
    if t.empty:
        return ["**fp16 math** (`KernelConfig(math=\"fp16\")`): no committed run measured it."]
    mem = t[t["output"] == "scores to memory"]
    def ratio(x, digits):  # a ratio the run measured, or says it did not
        return f"{x:.{digits}f}" if np.isfinite(x) else "not measured in that run"

    parts = [f"E = {r.experts}, K = {r.k_experts}, d = {r.d}: {r.fp16_G:.1f} G ads/s, gated / dot "
             f"{ratio(r.fp16_over_dot, 3)} (fp32 math {ratio(r.fp32_over_dot, 2)}; target {r.target:.2f}, "
             + ("met" if r.fp16_over_dot <= r.target else "missed" if np.isfinite(r.fp16_over_dot) else "not measured")
             + ")" for r in mem.itertuples()]
    top = t[t["output"] == "top-1000"]
    line = ("**fp16 math** (`KernelConfig(math=\"fp16\")`: h, G and V in fp16, the gate and value dots on the "
            "tensor cores, fp32 accumulation; run " + _short(t["commit"].iloc[0]) + f", {t['device'].iloc[0]}), "
            "scores to memory: "
            + "; ".join(parts) + ".")
    if len(top):
        line += (" Fused top-1000: " + "; ".join(f"E{r.experts} K{r.k_experts} d{r.d} gated / dot "
                                              f"{ratio(r.fp16_over_dot, 2)}" for r in top.itertuples()) + ".")
    return [line + " It is the default wherever it applies (`math=\"auto\"`): the precision notebook measured "
                   "its quality loss within the rule of docs/design.md."]


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
    """The E / K sweep of one run on one card (:func:`.results.one_device`; the commit with the most
    gated fused block top-K rows at this d and dtype, pool, ``tiles``): ``points`` (best row per (E, K)), ``dot`` (the dot product's fused
    block top-K ads/s in that run, NaN if absent), ``filter`` (the latest filter-path rows, gated and
    dot, top-1000), ``issue_bound`` (:func:`issue_bound_points`, at that run's
    read ceiling), ``commit`` and ``config`` (the sweep rows' kernel configuration, from their
    notes). None without rows."""
    ok = results.one_device(usable(rows))  # one card: its run, stars and ceiling
    base = ok[(ok["d"] == d) & (ok["dtype"] == dtype) & (ok["layout"] == "tiles") & (ok["access"] == "pool")]
    g = base[base["variant"] == "gated_fused_topk"]
    if g.empty:
        return None
    commit = g["commit"].value_counts().idxmax()
    g = g[g["commit"] == commit].sort_values("items_per_s").drop_duplicates(["experts", "k_experts"], keep="last")
    g = g.sort_values(["k_experts", "experts"])
    dot = base[(base["variant"] == "dot_fused_topk") & (base["commit"] == commit)]["items_per_s"].max()
    filt = base[base["variant"].isin(["gated_fused_topk_filter", "dot_fused_topk_filter"]) & (base["k"] == 1000)]
    filt = results.in_time_order(filt).drop_duplicates("variant", keep="last")
    read = float(base[base["commit"] == commit]["ceiling_read_TBps"].median())
    return {"points": g, "dot": float(dot), "filter": filt, "issue_bound": issue_bound_points(g, d, dtype, read),
            "commit": commit, "read_TBps": read, "config": g["notes"].str.split(";").str[0].mode().iloc[0]}


def by_d_and_dtype(rows: pd.DataFrame, experts: int, k_experts: int) -> pd.DataFrame:
    """Scores written to memory on the pool (``tiles``, CUDA-core kernels: tensor-core rows left
    out): for each model (gated with this E and K, or the dot product), d and dtype, the best row
    of the latest run that measured it, on one card (:func:`.results.one_device`). Columns: model,
    d, dtype, G_ads_per_s, fraction_of_read_ceiling, ceiling_G_ads_per_s (the read ceiling over the
    row and bias bytes), bytes_per_item (the row's, the score write included), commit, device, timestamp."""
    sel = _scores_to_memory(rows, experts, k_experts)
    out = []
    for (model, d, dtype), grp in sel.groupby(["model", "d", "dtype"]):
        latest = results.newest_commit(grp)
        best = grp[grp["commit"] == latest].sort_values("items_per_s").iloc[-1]
        out.append({"model": model, "d": int(d), "dtype": dtype, "G_ads_per_s": best["items_per_s"] / 1e9,
                    "fraction_of_read_ceiling": best["fraction_of_read_ceiling"],
                    "ceiling_G_ads_per_s": best["ceiling_read_TBps"] * 1e3 / fused_bytes_per_ad(int(d), dtype),
                    "bytes_per_item": best["bytes_per_item"], "commit": latest, "device": best["device"],
                    "timestamp": best["timestamp"]})
    return pd.DataFrame(out, columns=["model", "d", "dtype", "G_ads_per_s", "fraction_of_read_ceiling",
                                      "ceiling_G_ads_per_s", "bytes_per_item", "commit", "device", "timestamp"])


def fusion_cost(rows: pd.DataFrame, d: int, dtype: str, experts: int = 6, k_experts: int = 2, math: str = "fp32"
                ) -> tuple[pd.DataFrame, str | None]:
    """Scores to memory against fused top-K (block and filter paths), from the latest run that
    measured both the gated filter path and gated scores to memory at this d, dtype, E and K (or,
    where no run did, the dot product's pair; pool, ``tiles``) in ``math`` (default launches).
    Returns (table, commit); an empty table and None without such a run. Column
    ``of_scoring_alone``: ads/s over the same model's scores-to-memory ads/s (the issue's target:
    >= 0.95)."""
    ok = results.one_device(results.default_launches(usable(rows, math)))  # the targets' card
    gated = ok["variant"].str.startswith("gated") & (ok["experts"] == experts) & (ok["k_experts"] == k_experts)
    fuse = ok[ok["variant"].isin(["gated_scores_to_memory", "gated_fused_topk", "gated_fused_topk_filter",
                                  "dot_scores_to_memory", "dot_fused_topk_filter"])
              & (gated | ok["variant"].str.startswith("dot"))
              & (ok["d"] == d) & (ok["dtype"] == dtype) & (ok["layout"] == "tiles") & (ok["access"] == "pool")]
    has = {m: fuse.groupby("commit")["variant"].agg(
        lambda v, m=m: {f"{m}_fused_topk_filter", f"{m}_scores_to_memory"} <= set(v)) for m in ("gated", "dot")}
    both = has["gated"] if has["gated"].any() else has["dot"]  # the gated pair where any run has it
    columns = ["variant", "k", "G_ads_per_s", "fraction_of_read_ceiling", "of_scoring_alone", "commit", "device"]
    if not both.any():
        return pd.DataFrame(columns=columns), None
    latest = results.newest_commit(fuse[fuse["commit"].isin(both[both].index)])
    fuse = fuse[fuse["commit"] == latest]
    alone = fuse[fuse["variant"].str.endswith("scores_to_memory")].groupby("variant")["items_per_s"].max()
    fuse = fuse.assign(model=fuse["variant"].str.split("_").str[0], G_ads_per_s=fuse["items_per_s"] / 1e9,
                       k=fuse["k"].fillna(0).astype(int))
    fuse["of_scoring_alone"] = fuse["items_per_s"] / fuse["model"].map(lambda m: alone.get(f"{m}_scores_to_memory", np.nan))
    fuse = results.in_time_order(fuse).drop_duplicates(["variant", "k"], keep="last")
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


# --------------------------------------------------------------------------------------------------
# counted, not measured


def byte_budget(d: int, dtype: str, experts: int, k_experts: int) -> pd.DataFrame:
    """Bytes moved per ad (reads + writes) by each design, split by step: rows are the fused kernel,
    the pre-fusion pipeline (gather, score, top-K; whole pool) and the per-op pipeline (one kernel
    a model step), columns the steps (:mod:`andromeda_nb.score.unfused`), zeros where a design has
    no such step."""
    return pd.DataFrame({
        "fused (one kernel, scores never stored)": {"row + bias": fused_bytes_per_ad(d, dtype)},
        "pre-fusion pipeline (gather, score, top-K)": pre_fusion_bytes_per_ad(d, dtype, "pool"),
        "per-op (one kernel per model step)": per_op_bytes_per_ad(d, experts, k_experts, dtype),
    }).fillna(0.0).T


def network_bytes(d: int, dtype: str, k: int = 1000, candidates=NETWORK_CANDIDATES) -> pd.DataFrame:
    """Bytes one request ships between retrieval and scoring for each candidate count (rows,
    labelled ``10^n``): candidate ids, ids with their rows, and the fused design's top-k answer
    (:func:`andromeda_nb.score.unfused.network_bytes_per_request`); column ``ids_over_answer``."""
    net = pd.DataFrame({n: network_bytes_per_request(int(n), k, d, dtype) for n in candidates}).T
    net.index = [f"10^{int(round(np.log10(n)))}" for n in net.index]
    net.index.name = "candidates"
    return net.assign(ids_over_answer=net["candidate ids"] / net["final top-K (fused)"])


# --------------------------------------------------------------------------------------------------
# headline metrics (recorded by the notebook)


def speedup_metrics(speedups: pd.DataFrame) -> dict[str, float]:
    """``fused_over_<baseline>_<access>``: the measured speed-up of fused over each baseline row
    of :func:`fusion_speedups`."""
    return {f"fused_over_{r['baseline']}_{r['access']}": float(r["measured speed-up of fused"])
            for _, r in speedups.iterrows()}


def fusion_cost_metrics(fuse: pd.DataFrame) -> dict[str, float]:
    """From :func:`fusion_cost`'s table: ``<model>_fused_filter_k<k>_over_scoring_alone`` for each
    filter-path row, and ``gated_over_dot_time_scores_to_memory`` where the run wrote both models'
    scores to memory."""
    out = {f"{r['variant'].split('_')[0]}_fused_filter_k{r['k']}_over_scoring_alone": float(r["of_scoring_alone"])
           for _, r in fuse[fuse["variant"].str.endswith("filter")].iterrows()}
    alone = fuse[fuse["variant"].str.endswith("scores_to_memory")].set_index("variant")["G_ads_per_s"]
    if {"gated_scores_to_memory", "dot_scores_to_memory"} <= set(alone.index):
        out["gated_over_dot_time_scores_to_memory"] = float(alone["dot_scores_to_memory"] / alone["gated_scores_to_memory"])
    return out


#: the peers' variants (the scoring suite's ``peers`` phase), in the figure's order
PEERS = ("triton_gated_scores_to_memory", "torch_compile_gated", "torch_eager_gated")


def peers(rows: pd.DataFrame, d: int, dtype: str, experts: int, k_experts: int) -> tuple[pd.DataFrame, str | None]:
    """The latest run with a verified Triton peer at this d, dtype, E and K: per contender (the
    fused kernel's gated scores to memory in fp16 and fp32 math, each layout; the dot product; the
    Triton peer at the best point of its tuning grid; torch.compile; eager PyTorch) its best verified
    row's G ads/s, fraction of the read ceiling, time over the dot product's (the run's fastest dot
    scores to memory) and notes. Rows that failed their check are left out (the CSV keeps them).
    Returns (table, commit), or an empty table and None without such a run."""
    cols = ["contender", "variant", "layout", "math", "G_ads_per_s", "fraction_of_read_ceiling", "time_over_dot",
            "notes", "device", "commit"]
    ok = rows[rows["ok"] & ~rows["regression_flag"] & (rows["d"] == d) & (rows["dtype"] == dtype)
              & (rows["access"] == "pool")]
    tri = ok[(ok["variant"] == PEERS[0]) & (ok["experts"] == experts) & (ok["k_experts"] == k_experts)]
    if tri.empty:
        return pd.DataFrame(columns=cols), None
    commit = results.newest_commit(tri)
    run = ok[ok["commit"] == commit]
    dot = run[run["variant"] == "dot_scores_to_memory"]["items_per_s"].max()
    gated = run[(run["experts"] == experts) & (run["k_experts"] == k_experts)]
    picks = [(f"fused kernel, {m} math, {lay}", gated[(gated["variant"] == "gated_scores_to_memory")
                                                      & (gated["math"] == m) & (gated["layout"] == lay)])
             for m in ("fp16", "fp32") for lay in ("tiles", "rows")]
    picks += [("Triton (best of its grid)", gated[gated["variant"] == PEERS[0]]),
              ("torch.compile", gated[gated["variant"] == PEERS[1]]), ("eager PyTorch", gated[gated["variant"] == PEERS[2]]),
              ("dot product (fused kernel)", run[run["variant"] == "dot_scores_to_memory"])]
    out = []
    for name, grp in picks:
        if grp.empty:
            continue
        best = grp.sort_values("items_per_s").iloc[-1]
        out.append({"contender": name, "variant": best["variant"], "layout": best["layout"], "math": best["math"],
                    "G_ads_per_s": best["items_per_s"] / 1e9,
                    "fraction_of_read_ceiling": best["fraction_of_read_ceiling"],
                    "time_over_dot": dot / best["items_per_s"], "notes": str(best["notes"]).split(";")[0],
                    "device": best["device"], "commit": best["commit"]})
    return pd.DataFrame(out, columns=cols), commit


def peers_metrics(table: pd.DataFrame) -> dict[str, float]:
    """From :func:`peers`: ``fused_fp16_over_triton`` (the fused kernel's best fp16-math ads/s over
    the Triton peer's), ``gated_fp16_over_dot_time`` and ``triton_fraction_of_read_ceiling``."""
    if table.empty:
        return {}
    by = table.set_index("contender")
    fused = table[table["contender"].str.startswith("fused kernel, fp16")]
    out = {}
    if not fused.empty:
        out["gated_fp16_over_dot_time"] = float(fused["time_over_dot"].min())
    if "Triton (best of its grid)" in by.index:
        tri = by.loc["Triton (best of its grid)"]
        out["triton_fraction_of_read_ceiling"] = float(tri["fraction_of_read_ceiling"])
        if not fused.empty:
            out["fused_fp16_over_triton"] = float(fused["G_ads_per_s"].max() / tri["G_ads_per_s"])
    return out


def peers_summary(table: pd.DataFrame, run: str | None) -> str:
    """The peers' comparison in a few sentences quoting :func:`peers`'s table (markdown)."""
    if run is None:
        return "No committed run measured the peers for this configuration (`bench scoring --phases peers`)."
    m = peers_metrics(table)
    by = table.set_index("contender")
    parts = [f"In run `{run}`:"]
    if "fused_fp16_over_triton" in m:
        tri = by.loc["Triton (best of its grid)"]
        parts.append(f"the fused kernel in fp16 math scores {m['fused_fp16_over_triton']:.2f}x as many ads a second "
                     f"as the best Triton configuration ({tri['notes']}: {tri['fraction_of_read_ceiling']:.2f} of the "
                     "read ceiling);")
    if "gated_fp16_over_dot_time" in m:
        parts.append(f"the gated model takes {m['gated_fp16_over_dot_time']:.2f}x the dot product's time in fp16 math")
        fp32 = table[table["contender"].str.startswith("fused kernel, fp32")]
        parts.append(f"and {fp32['time_over_dot'].min():.2f}x in fp32 math." if not fp32.empty else ".")
    missing = [c for c in ("torch.compile", "eager PyTorch") if c not in by.index]
    if missing:
        parts.append(f"No verified row of {' or '.join(missing)} in that run (a failed check leaves a row out; "
                     "the CSV keeps it).")
    return " ".join(parts)


#: the frontier's limit: a model is "free" while it takes at most this times the dot product's time
FRONTIER_LIMIT = 1.10
#: the frontier phase's grid (bench/scoring.py's ``frontier`` phase measures it)
FRONTIER_D = (32, 64, 128)
FRONTIER_EK = ((1, 1), (2, 1), (4, 2), (6, 2), (8, 2), (8, 4))


def frontier(rows: pd.DataFrame, dtype: str = "fp16") -> tuple[pd.DataFrame, str | None]:
    """How large the gated model may grow (the scoring suite's ``frontier`` phase): in the run with
    the most gated scores-to-memory rows on the pool (``tiles``) across shapes and math modes, per
    row its math, d, E, K, FLOPs per ad (:func:`gated_multiply_adds` x 2), G ads/s and time over
    the dot product of the same d and run, and whether it stays within :data:`FRONTIER_LIMIT`.
    Returns (table, commit), or an empty table and None without such a run."""
    cols = FRONTIER_COLUMNS
    ok = _frontier_rows(rows, dtype)
    gated = ok[ok["variant"] == "gated_scores_to_memory"]
    if gated.empty:
        return pd.DataFrame(columns=cols), None
    shapes = gated.groupby("commit").apply(lambda g: len(g.drop_duplicates(["math", "d", "experts", "k_experts"])),
                                           include_groups=False)
    commit = shapes.sort_values(kind="stable").index[-1]
    if shapes[commit] < 2:
        return pd.DataFrame(columns=cols), None
    table = _frontier_points(ok[ok["commit"] == commit]).sort_values(["math", "d", "flops_per_ad"], ignore_index=True)
    return table, commit


FRONTIER_COLUMNS = ["math", "d", "experts", "k_experts", "flops_per_ad", "G_ads_per_s", "time_over_dot", "free",
                    "device", "commit"]


def _frontier_rows(rows: pd.DataFrame, dtype: str) -> pd.DataFrame:
    """The verified, unflagged rows of ``dtype`` tables on the pool (``tiles``): the frontier's."""
    return rows[rows["ok"] & ~rows["regression_flag"] & (rows["dtype"] == dtype) & (rows["layout"] == "tiles")
                & (rows["access"] == "pool")]


def _frontier_points(run: pd.DataFrame) -> pd.DataFrame:
    """One run's rows as frontier points: each gated shape's fastest scores-to-memory row against
    the run's dot product of the same d (shapes without one left out), :data:`FRONTIER_COLUMNS`."""
    dots = run[run["variant"] == "dot_scores_to_memory"].groupby("d")["items_per_s"].max()
    best = (run[run["variant"] == "gated_scores_to_memory"].sort_values("items_per_s")
            .drop_duplicates(["math", "d", "experts", "k_experts"], keep="last"))
    out = []
    for r in best.itertuples():
        if r.d not in dots.index:
            continue
        d, E, K = int(r.d), int(r.experts), int(r.k_experts)
        over = float(dots[r.d] / r.items_per_s)
        out.append({"math": r.math, "d": d, "experts": E, "k_experts": K,
                    "flops_per_ad": 2 * gated_multiply_adds(d, E, K), "G_ads_per_s": r.items_per_s / 1e9,
                    "time_over_dot": over, "free": over <= FRONTIER_LIMIT, "device": r.device, "commit": r.commit})
    return pd.DataFrame(out, columns=FRONTIER_COLUMNS)


def frontier_metrics(table: pd.DataFrame) -> dict[str, float]:
    """``frontier_<math>_d<d>_largest_free_flops``: per math mode and d of :func:`frontier`, the
    most FLOPs per ad of a model within the limit (0 where none is)."""
    out = {}
    for (math, d), g in table.groupby(["math", "d"]):
        free = g[g["free"]]
        out[f"frontier_{math}_d{d}_largest_free_flops"] = float(free["flops_per_ad"].max()) if len(free) else 0.0
    return out


def frontier_since(rows: pd.DataFrame, run: str | None, dtype: str = "fp16") -> pd.DataFrame:
    """Gated shapes measured after the frontier's run ``run`` on its card (newer runs, default
    launches, the same filters as :func:`frontier`), each against the dot product of the same d in its own run:
    the newest measurement of each (math, d, E, K), with :func:`frontier`'s columns. Empty where
    none is newer."""
    if run is None:
        return pd.DataFrame(columns=FRONTIER_COLUMNS)
    ok = results.default_launches(_frontier_rows(rows, dtype))
    ok = ok[ok["device"] == ok.loc[ok["commit"] == run, "device"].iloc[0]]  # the frontier run's card
    after = results.in_time_order(ok[ok["timestamp"] > ok.loc[ok["commit"] == run, "timestamp"].max()])
    points = [_frontier_points(g) for _, g in after.groupby("commit", sort=False)]  # oldest run first
    if not any(len(p) for p in points):
        return pd.DataFrame(columns=FRONTIER_COLUMNS)
    newest = pd.concat(points, ignore_index=True).drop_duplicates(["math", "d", "experts", "k_experts"], keep="last")
    return newest.sort_values(["math", "d", "flops_per_ad"], ignore_index=True)


def frontier_summary(table: pd.DataFrame, run: str | None, rows: pd.DataFrame | None = None,
                     dtype: str = "fp16") -> str:
    """The frontier in sentences quoting :func:`frontier`'s table (markdown); given the ``rows``,
    the shapes newer runs measured since on ``dtype`` tables (:func:`frontier_since`) follow, each
    against the frontier run's figure for it."""
    if run is None:
        return ("No committed run measured the frontier (`python -m andromeda_nb.bench scoring --phases frontier` "
                "on a GPU).")
    shapes = len(table.drop_duplicates(["math", "d", "experts", "k_experts"]))
    full = 2 * len(FRONTIER_D) * len(FRONTIER_EK)
    stand_in = ("" if shapes >= full else
                f" ({shapes} of the frontier's {full} shapes were measured in this run, which was cut short or "
                "was not the frontier phase; `python -m andromeda_nb.bench scoring --phases frontier` measures "
                "them all)")
    parts = []
    for (math, d), g in table.groupby(["math", "d"], sort=True):
        free = g[g["free"]]
        if free.empty:
            parts.append(f"{math} math, d = {d}: no measured shape is free (the cheapest takes "
                         f"{g['time_over_dot'].min():.3f}x the dot product's time)")
        else:
            top = free.sort_values("flops_per_ad").iloc[-1]
            parts.append(f"{math} math, d = {d}: up to E = {top.experts}, K = {top.k_experts} "
                         f"({top.flops_per_ad:,.0f} FLOPs an ad, {top.time_over_dot:.3f}x)")
    text = (f"In run `{_short(run)}`{stand_in} (a model is free while it takes at most {FRONTIER_LIMIT:.2f}x the "
            "dot product's time): " + "; ".join(parts) + ".")
    since = frontier_since(rows, run, dtype) if rows is not None else None
    if since is None or since.empty:
        return text
    then = table.set_index(["math", "d", "experts", "k_experts"])["time_over_dot"]
    news = []
    for r in since.itertuples():
        was = then.get((r.math, r.d, r.experts, r.k_experts))
        news.append(f"{r.math} math, d = {r.d}, E = {r.experts}, K = {r.k_experts}: {r.time_over_dot:.3f}x "
                    f"({'free' if r.free else 'not free'}; run `{_short(r.commit)}`"
                    + (f"; {was:.3f}x in the frontier's run" if was is not None else "; not in the frontier's run")
                    + ")")
    return (text + " **Newer runs measured these shapes since, with the kernels of their day** (the panel still "
            "shows the frontier's run): " + "; ".join(news) + ".")


def bitset_metrics(savings: pd.DataFrame) -> dict[str, float]:
    """``bitset_<fraction>_best_of_fastest_pool_time``: per eligible fraction of
    :func:`bitset_savings`, the best run's device time over its fastest full pool."""
    return {f"bitset_{f:g}_best_of_fastest_pool_time": float(g["of_fastest_pool_time"].min())
            for f, g in savings.groupby("eligible_fraction")}


# --------------------------------------------------------------------------------------------------
# findings: the notebook's conclusions, quoting the committed rows


def _short(commit) -> str:
    return str(commit)[:7]


def tensor_core_rows(rows: pd.DataFrame, d: int, dtype: str, experts: int, k_experts: int) -> pd.DataFrame:
    """Gated scores to memory on the pool (``tiles``): the best tensor-core row of the latest run
    that measured one, and the best CUDA-core row of that run. Columns: kernel (``tensor cores`` /
    ``CUDA cores``), G_ads_per_s, fraction_of_read_ceiling, commit. Empty without a tensor-core row."""
    ok = usable(rows)
    sel = ok[(ok["variant"] == "gated_scores_to_memory") & (ok["d"] == d) & (ok["dtype"] == dtype)
             & (ok["experts"] == experts) & (ok["k_experts"] == k_experts) & (ok["layout"] == "tiles")
             & (ok["access"] == "pool")]
    tc = sel["notes"].str.contains("tensor_cores")
    columns = ["kernel", "G_ads_per_s", "fraction_of_read_ceiling", "commit"]
    if not tc.any():
        return pd.DataFrame(columns=columns)
    run = results.newest_commit(sel[tc])
    out = []
    for kernel, part in (("tensor cores", sel[tc]), ("CUDA cores", sel[~tc])):
        part = part[part["commit"] == run]
        if len(part):
            best = part.loc[part["items_per_s"].idxmax()]
            out.append({"kernel": kernel, "G_ads_per_s": best["items_per_s"] / 1e9,
                        "fraction_of_read_ceiling": best["fraction_of_read_ceiling"], "commit": run})
    return pd.DataFrame(out, columns=columns)


def issue_model(d: int, dtype: str, experts: int, k_experts: int, read_TBps: float) -> dict[str, float]:
    """The issue model of :func:`issue_bound_points` for one configuration: ``instructions`` per
    ad it needs and ``budget``, the instructions the H200 issues while the read ceiling moves one
    ad's bytes."""
    need = INSTRUCTIONS_PER_MULTIPLY_ADD * gated_multiply_adds(d, experts, k_experts)
    return {"instructions": float(need),
            "budget": float(H200_LANE_ISSUE_PER_S * fused_bytes_per_ad(d, dtype) / (read_TBps * 1e12))}


def _fusion_lines(rows, d, dtype, experts, k_experts) -> list[str]:
    sp = fusion_speedups(rows, d, dtype, experts, k_experts)
    if sp.empty:
        return [f"**Fusion**: no committed unfused baseline at d = {d}, {dtype}, E = {experts}, K = {k_experts}."]
    parts = [f"{r['measured speed-up of fused']:.1f}x faster than the "
             f"{r['baseline'].replace('unfused_', '').replace('_', '-')} pipeline ({r['access']}), which moves "
             f"{r['byte ratio']:.1f}x the bytes (fused: run {_short(r['fused commit'])}, baseline: run "
             f"{_short(r['baseline commit'])})" for _, r in sp.iterrows()]
    more = (sp["speed-up / byte ratio"] > 1).all()
    return ["**Fusion pays" + (", more than the bytes alone predict" if more else "") + "** (fp32 math, the "
            "baselines' only mode): the fused path runs " + "; ".join(parts) + "."]


def _scores_to_memory(rows: pd.DataFrame, experts: int, k_experts: int) -> pd.DataFrame:
    """Gated (E, K) and dot-product scores to memory in fp32 math on the pool (``tiles``, CUDA
    cores, one card), with a ``model`` column ("gated" or "dot")."""
    ok = results.one_device(usable(rows))
    ok = ok[(ok["layout"] == "tiles") & (ok["access"] == "pool") & ~ok["notes"].str.contains("tensor_cores")]
    gated = ok[(ok["variant"] == "gated_scores_to_memory") & (ok["experts"] == experts) & (ok["k_experts"] == k_experts)]
    return pd.concat([gated.assign(model="gated"), ok[ok["variant"] == "dot_scores_to_memory"].assign(model="dot")])


def gate_cost_run(rows: pd.DataFrame, d: int, dtype: str, experts: int, k_experts: int) -> pd.DataFrame:
    """Gated (E, K) and dot-product scores to memory in fp32 math (pool, ``tiles``, CUDA cores) from
    the newest run that measured both at this d and dtype: :func:`by_d_and_dtype`'s columns, one row a
    model, indexed by model. Empty without such a run."""
    sel = _scores_to_memory(rows, experts, k_experts)
    sel = sel[(sel["d"] == d) & (sel["dtype"] == dtype)]
    both = set(sel.loc[sel["model"] == "gated", "commit"]) & set(sel.loc[sel["model"] == "dot", "commit"])
    if not both:
        return pd.DataFrame()
    run = results.newest_commit(sel[sel["commit"].isin(both)])
    return by_d_and_dtype(sel[sel["commit"] == run], experts, k_experts).set_index("model")


def _gated_vs_dot_lines(rows, d, dtype, experts, k_experts, read_TBps) -> list[str]:
    pts = gate_cost_run(rows, d, dtype, experts, k_experts)
    if pts.empty:
        return [f"**Gate cost**: no committed run wrote gated and dot-product scores at d = {d}, {dtype}, fp32 math."]
    g, t = pts.loc["gated"], pts.loc["dot"]
    ratio = t["G_ads_per_s"] / g["G_ads_per_s"]
    model = issue_model(d, dtype, experts, k_experts, read_TBps)
    bound = model["instructions"] > model["budget"]
    return [f"**The gate's cost in fp32 math** (scores to memory, pool; run {_short(g['commit'])}, "
            f"{str(g['timestamp'])[:10]}, {g['device']}): gated E = {experts}, K = {k_experts} reaches "
            f"{g['G_ads_per_s']:.1f} G ads/s, {g['fraction_of_read_ceiling']:.2f} of the read ceiling, the dot product "
            f"{t['G_ads_per_s']:.1f} G ({t['fraction_of_read_ceiling']:.2f}): gated / dot device time {ratio:.2f} "
            f"(target {TARGETS['gated_over_dot_time']:.2f}; fp16 math, the default: below). The "
            f"issue model counts {model['instructions']:.0f} instructions an ad of fp32 math against "
            f"{model['budget']:.0f} issued while the read ceiling moves one ad's bytes: "
            + ("instruction-issue bound, not bandwidth bound" if bound else "within the issue budget")
            + " (SASS counts and profiles: `data/results/scoring_diagnostics.md`)."]


def _tensor_core_lines(rows, d, dtype, experts, k_experts) -> list[str]:
    tc = tensor_core_rows(rows, d, dtype, experts, k_experts).set_index("kernel")
    if "tensor cores" not in tc.index:
        return []
    t = tc.loc["tensor cores"]
    line = (f"**TF32 tensor cores in fp32 math** (`KernelConfig(math=\"fp32\", tensor_cores=True)`, 3xTF32 "
            f"`mma.sync` to keep fp32 accuracy; off by default, not the default fp16 math's fp16 `mma.sync`): "
            f"{t['G_ads_per_s']:.1f} G ads/s "
            f"({t['fraction_of_read_ceiling']:.2f} of the ceiling, run {_short(t['commit'])})")
    if "CUDA cores" in tc.index:
        c = tc.loc["CUDA cores"]
        line += f" against {c['G_ads_per_s']:.1f} G for the CUDA-core kernel of the same run"
        line += ": " + ("they do not help as built." if t["G_ads_per_s"] <= c["G_ads_per_s"] else "faster.")
    return [line]


def _fusion_cost_lines(rows, d, dtype, experts, k_experts) -> list[str]:
    lines = []
    for math in ("fp32", "fp16"):
        fuse, run = fusion_cost(rows, d, dtype, experts, k_experts, math)
        if run is None:
            if math == "fp32":
                lines.append(f"**Fused top-K**: no committed run measured a filter path beside scores to memory "
                             f"(d = {d}, {dtype}, fp32 math).")
            continue
        alone = fuse[fuse["variant"].str.endswith("scores_to_memory")].set_index("variant")["G_ads_per_s"]
        parts = []
        for _, r in fuse[~fuse["variant"].str.endswith("scores_to_memory")].iterrows():
            model, path = r["variant"].split("_")[0], "filter path" if r["variant"].endswith("filter") else "block top-K"
            parts.append(f"{model} {path} at k = {r['k']}: {r['G_ads_per_s']:.1f} G ads/s, {r['of_scoring_alone']:.2f} "
                         f"of its scores-to-memory rate ({alone.get(f'{model}_scores_to_memory', np.nan):.1f} G)")
        filt = fuse[fuse["variant"].str.endswith("filter")]["of_scoring_alone"]
        verdict = ("costs nothing measurable" if len(filt) and filt.min() >= TARGETS["fused_topk_of_scoring_alone"]
                   else f"costs more than the target allows (>= {TARGETS['fused_topk_of_scoring_alone']:.2f})")
        lines.append(f"**Fused top-K {verdict}** on the filter path ({math} math, run {_short(run)}, "
                     f"{fuse['device'].iloc[0]}): "
                     + "; ".join(parts) + ".")
    return lines


def _int8_lines(rows, experts, k_experts) -> list[str]:
    pts = by_d_and_dtype(rows, experts, k_experts)
    dot = pts[pts["model"] == "dot"].set_index(["d", "dtype"])
    parts = []
    for d in sorted({d for d, _ in dot.index}):
        if (d, "int8") in dot.index and (d, "fp16") in dot.index:
            i8, f16 = dot.loc[(d, "int8")], dot.loc[(d, "fp16")]
            runs = (f"run {_short(i8['commit'])}" if i8["commit"] == f16["commit"] else
                    f"int8 run {_short(i8['commit'])}, fp16 run {_short(f16['commit'])}")
            parts.append(f"{i8['G_ads_per_s'] / f16['G_ads_per_s']:.2f}x at d = {d} ({i8['G_ads_per_s']:.1f} against "
                         f"{f16['G_ads_per_s']:.1f} G ads/s, {i8['fraction_of_read_ceiling']:.2f} of the ceiling; byte "
                         f"ratio {f16['bytes_per_item'] / i8['bytes_per_item']:.2f}; {runs})")
    if not parts:
        return []
    return [f"**int8 dot products over fp16**, scores to memory (target {TARGETS['int8_over_fp16']:.1f}x): "
            + "; ".join(parts) + "."]


def gated_int8_over_fp16(rows: pd.DataFrame, experts: int, k_experts: int, d: int = 64,
                         every_run: bool = False) -> pd.DataFrame:
    """The gated model's int8 rows against its fp16 rows, both in fp16 math (the default), in the
    newest run that measured both (pool, ``tiles``, default launches; ``every_run``: in each such
    run, oldest first): for scores to memory and the fused top-1000, each dtype's best G ads/s and
    fraction of the read ceiling, and int8 / fp16. Empty without such a run."""
    ok = results.one_device(usable(rows, "fp16"))
    ok = results.default_launches(ok[(ok["layout"] == "tiles") & (ok["access"] == "pool") & (ok["d"] == d)
                                     & (ok["experts"] == experts) & (ok["k_experts"] == k_experts)
                                     & ok["variant"].str.startswith("gated")])
    columns = ["output", "int8_G", "fp16_G", "int8_fraction", "fp16_fraction", "ratio", "commit", "device"]
    both = [c for c, g in ok.groupby("commit") if {"int8", "fp16"} <= set(g["dtype"])]
    if not both:
        return pd.DataFrame(columns=columns)
    runs = results.in_time_order(ok[ok["commit"].isin(both)])
    if every_run:
        order = list(dict.fromkeys(runs["commit"]))
        parts = [_gated_int8_run(runs[runs["commit"] == c], columns) for c in order]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
    return _gated_int8_run(runs[runs["commit"] == results.newest_commit(runs)], columns)


def _gated_int8_run(run: pd.DataFrame, columns: list) -> pd.DataFrame:
    out = []
    for output, variant, k in (("scores to memory", "gated_scores_to_memory", None),
                               ("fused top-1000", "gated_fused_topk_filter", 1000)):
        sel = run[(run["variant"] == variant) & ((run["k"] == k) if k else run["k"].isna())]
        best = {t: sel[sel["dtype"] == t].sort_values("items_per_s").tail(1) for t in ("int8", "fp16")}
        if any(b.empty for b in best.values()):
            continue
        i8, f16 = (best[t].iloc[0] for t in ("int8", "fp16"))
        out.append({"output": output, "int8_G": i8["items_per_s"] / 1e9, "fp16_G": f16["items_per_s"] / 1e9,
                    "int8_fraction": i8["fraction_of_read_ceiling"], "fp16_fraction": f16["fraction_of_read_ceiling"],
                    "ratio": i8["items_per_s"] / f16["items_per_s"], "commit": i8["commit"], "device": i8["device"]})
    return pd.DataFrame(out, columns=columns)


def _gated_int8_lines(rows, experts, k_experts) -> list[str]:
    t = gated_int8_over_fp16(rows, experts, k_experts)
    if t.empty:
        return []
    target = TARGETS["gated_int8_over_fp16"]
    every = gated_int8_over_fp16(rows, experts, k_experts, every_run=True)
    earlier = every[every["commit"] != t["commit"].iloc[0]]

    def others(output):  # the run before, for its spread: one run is one sample
        r = earlier[earlier["output"] == output]
        return f"; {r['ratio'].iloc[-1]:.2f}x in the run before it, {_short(r['commit'].iloc[-1])}" if len(r) else ""

    parts = [f"{r.output} {r.ratio:.2f}x ({r.int8_G:.1f} against {r.fp16_G:.1f} G ads/s, {r.int8_fraction:.2f} and "
             f"{r.fp16_fraction:.2f} of the read ceiling{others(r.output)}): " + ("met" if r.ratio >= target else "missed")
             for r in t.itertuples()]
    return [f"**The gated model on int8 rows over fp16 rows**, both in fp16 math (run {_short(t['commit'].iloc[0])}, "
            f"{t['device'].iloc[0]}; target {target:.1f}x): " + "; ".join(parts)
            + " (what limits each: `data/results/scoring_diagnostics.md`; the public call `score_topk` on both: "
            "the request-path notebook)."]


def _bitset_lines(rows, d, dtype, experts, k_experts) -> list[str]:
    elig = bitset_savings(rows, None, experts, k_experts, d, dtype)
    ten = elig[np.isclose(elig["eligible_fraction"], 0.1)]
    if ten.empty:
        return []
    low = ten.loc[ten["of_fastest_pool_time"].idxmin()]
    target = TARGETS["bitset_0.1_of_pool_time"]

    def run_of(commit):
        return ", ".join(f"{v:.2f} on `{lay}`" for lay, v in
                         ten[ten["commit"] == commit].set_index("layout")["of_fastest_pool_time"].items())

    newest = ten["commit"].iloc[0]  # bitset_savings: newest first
    return [f"**An eligible bitset** at 10 % eligible (fp32 math), device time over the same run's fastest full pool: the "
            f"lowest measured is {low['of_fastest_pool_time']:.2f} on `{low['layout']}` (run {_short(low['commit'])}, "
            f"{low['eligible_G_ads_per_s']:.1f} G eligible ads/s; that run: {run_of(low['commit'])})"
            + (f", the newest run ({_short(newest)}): {run_of(newest)}" if newest != low["commit"] else "")
            + f"; target {target:.2f}: " + ("met." if low["of_fastest_pool_time"] <= target else "not met.")]


def findings(rows: pd.DataFrame, d: int, dtype: str, experts: int, k_experts: int, read_TBps: float) -> str:
    """The notebook's conclusions as Markdown bullets, every number computed from ``rows`` (the
    committed measurements) for this configuration: fusion against the unfused baselines, the
    gate's cost and the issue model, tensor cores, fused top-K against scores to memory, int8
    against fp16 (the dot product's and the gated model's), the eligible bitset, and how many rows carry a ``REGRESSION`` flag (left out of
    every figure). A point without rows is said to be missing."""
    lines = (_fusion_lines(rows, d, dtype, experts, k_experts)
             + _gated_vs_dot_lines(rows, d, dtype, experts, k_experts, read_TBps)
             + _tensor_core_lines(rows, d, dtype, experts, k_experts)
             + _math_lines(rows, dtype)
             + _fusion_cost_lines(rows, d, dtype, experts, k_experts)
             + _int8_lines(rows, experts, k_experts)
             + _gated_int8_lines(rows, experts, k_experts)
             + _bitset_lines(rows, d, dtype, experts, k_experts))
    flagged = int(rows["regression_flag"].sum())
    if flagged:
        lines.append(f"{flagged} rows flagged `REGRESSION` in their notes are left out of every table and figure.")
    return "\n".join(f"* {line}" for line in lines)
