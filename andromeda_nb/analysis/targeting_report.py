"""The tables, figures and findings behind the targeting notebook (``notebooks/04_targeting.ipynb``):
the host byte model of each index layout and the GPU rows of ``data/results/targeting.csv`` and
``targeting_memory.csv`` (``python -m andromeda_nb bench targeting``).

Variant names of the suite: ``match_U<n>_b<threads>`` (the match kernel with ``n`` 64-bit words a
thread, ``threads`` a block), ``_nobounds`` (no launch bounds), ``_prefetch`` (the next category's
first row loaded early), ``match_batch<m>_U<n>`` (``m`` requests a launch set),
``match_grouped_..._G<g>`` (rows loaded ``g`` at a time), ``match_U4_<sweep>_<value>`` (one point of
a sweep: ``pool_prefix``, ``categories``, ``user_values``, ``density``), ``match_U<n>_stage_<kernel>``
(one kernel of a request's launch set timed alone), ``cpu_*`` (the host baseline), ``update_*`` and
``request_*`` (real-time updates).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import plots, results

#: The design goals the findings measure against: ads per second for one request, and the
#: fraction of the read ceiling a bandwidth-bound kernel should reach.
TARGET_ADS_PER_S = 1e12
TARGET_FRACTION = 0.85
#: Update throughput the GPU side should sustain (ad updates a second).
TARGET_UPDATES_PER_S = 1e6
#: Keyword fields the bench writes into ``notes`` (``bits_per_ad=19.7; ...``).
NOTE_FIELDS = ("bits_per_ad", "rows_per_request", "patches_per_request", "list_bytes_per_ad")
UPDATE_VARIANTS = ("update_batch_gpu", "update_batch_host", "update_batch_end_to_end",
                   "update_batch_end_to_end_host_bits_kept", "update_batch_end_to_end_host_bits_dropped")


def default_variant() -> str:
    """The row of the default match kernel shape (``WORDS_PER_THREAD`` words a thread, 256
    threads a block)."""
    from ..match.api import WORDS_PER_THREAD

    return f"match_U{WORDS_PER_THREAD}_b256"


# --------------------------------------------------------------------------------------------------
# count first: the host byte model


def byte_model(n_ads: int, n_profiles: int, read_TBps: float, seed: int = 0):
    """:func:`andromeda_nb.bench.targeting.byte_model` (bytes read per ad by each layout, and the
    index memory scaled to 10^8 ads) with the throughput each layout predicts at
    :data:`TARGET_FRACTION` of ``read_TBps`` (column ``predicted_T_ads_per_s``). Returns
    ``(per-layout table, per-unit memory)``."""
    from ..bench.targeting import byte_model as count

    model, memory = count(n_ads, n_profiles, seed=seed)
    return model.assign(predicted_T_ads_per_s=TARGET_FRACTION * read_TBps / model["bytes_per_ad"]), memory


def model_metrics(model: pd.DataFrame) -> dict[str, float]:
    """The default layout's (first row) bits and bytes read per ad, and the eligible fraction."""
    head = model.iloc[0]
    return {"model_row_bits_per_ad_default": float(head["row_bits_per_ad"]),
            "model_bytes_per_ad_default": float(head["bytes_per_ad"]),
            "model_eligible_fraction": float(head["eligible_fraction"])}


def byte_model_figure(model: pd.DataFrame, n_ads: int, n_profiles: int, read_TBps: float):
    """Bits read per ad by layout, and the throughput each predicts against the 1 T ads/s goal."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    axes[0].barh(model["layout"], model["row_bits_per_ad"], color="C0")
    axes[0].set(xlabel="row bits read per ad (one request)", title="bits read per ad by layout")
    axes[1].barh(model["layout"], model["predicted_T_ads_per_s"], color="C1")
    axes[1].axvline(TARGET_ADS_PER_S / 1e12, color="0.3", ls="--", lw=1)
    axes[1].set(xlabel=f"predicted T ads/s at {TARGET_FRACTION:.0%} of the read ceiling",
                title=f"prediction (goal: {TARGET_ADS_PER_S / 1e12:g} T ads/s)")
    axes[1].set_yticks([])
    for ax in axes:
        ax.invert_yaxis()
    fig.tight_layout()
    plots.source_note(fig, f"host byte model (andromeda_nb.match.api.read_model) on a {n_ads:,}-ad copy of the "
                           f"benchmark world, {n_profiles} requests; read ceiling {read_TBps:.2f} TB/s")
    return fig


# --------------------------------------------------------------------------------------------------
# GPU measurements


def measurements(results_dir) -> results.Measurements | None:
    """The committed targeting rows (:func:`.results.measurements`) with the ``notes`` fields of
    :data:`NOTE_FIELDS` as numeric columns and ``G_ads_per_s``; None without a committed table."""
    try:
        m = results.measurements("targeting", results_dir)
    except FileNotFoundError:
        return None
    parsed = results.text(m.rows, "notes").str.findall(r"(\w+)=([-0-9.eE+]+)")
    rows = m.rows.assign(**{key: [float(dict(p).get(key, "nan")) for p in parsed] for key in NOTE_FIELDS},
                         G_ads_per_s=m.rows["items_per_s"] / 1e9)
    return results.Measurements(m.table, rows, m.path)


def measured_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Every measured row, the columns a reader compares."""
    show = ["variant", "n_ads", "batch", "G_ads_per_s", "bytes_per_item", "bits_per_ad", "achieved_TBps",
            "fraction_of_read_ceiling", "eligible_fraction", "verified"]
    return rows[show]


def _row(rows: pd.DataFrame, variant: str) -> pd.Series | None:
    hit = rows[rows["variant"] == variant]
    return None if hit.empty else results.in_time_order(hit).iloc[-1]


def measured_metrics(rows: pd.DataFrame) -> dict:
    """The default kernel's T ads/s, fraction of the read ceiling and row bits per ad; whether
    every row verified (stage timings are ``n/a``); GPU over the CPU baseline; GPU updates/s."""
    out = {}
    head = _row(rows, default_variant())
    if head is not None:
        out.update(measured_T_ads_per_s=float(head["items_per_s"]) / 1e12,
                   measured_fraction_of_read_ceiling=float(head["fraction_of_read_ceiling"]),
                   measured_bits_per_ad=float(head["bits_per_ad"]))
    out["all_rows_verified"] = bool(rows["verified"].astype(str).str.startswith(("ok", "n/a")).all())
    cpu = rows[rows["variant"].str.startswith("cpu_")]
    if head is not None and len(cpu):
        out["gpu_over_cpu"] = float(head["items_per_s"] / cpu["items_per_s"].iloc[0])
    gpu_updates = _row(rows, "update_batch_gpu")
    if gpu_updates is not None:
        out["updates_per_s_gpu"] = float(gpu_updates["items_per_s"])
    return out


def _sweep_value(variant: pd.Series, sweep: str) -> pd.Series:
    """The value in ``match_U4_<sweep>_<value>`` (the bench writes no column for it)."""
    return variant.str.extract(rf"_{sweep}_([-0-9.]+)$")[0].astype(float)


def sweeps(rows: pd.DataFrame) -> list[tuple[pd.DataFrame, str, bool]]:
    """The four one-request sweeps of the 4-words kernel as ``(points with x, x label, log x)``:
    pool size (prefixes of the benchmark world and the whole of it), categories the ads constrain
    (the benchmark's 20 from the density 0.3 row), values a user holds per multi-valued category,
    and the probability an ad constrains a category."""
    v = rows["variant"]
    pool = rows[v.isin(["match_U4_pool_prefix", "match_U4_b256"])].assign(x=lambda d: d["n_ads"])
    cats = pd.concat([rows[v.str.startswith("match_U4_categories_")],
                      rows[v == "match_U4_density_0.3"]]).assign(x=lambda d: d["categories"])
    values = rows[v.str.startswith("match_U4_user_values_")]
    dens = rows[v.str.startswith("match_U4_density_")]
    return [(pool.sort_values("x"), "pool size (ads)", True),
            (cats.sort_values("x"), "categories the ads constrain", False),
            (values.assign(x=_sweep_value(values["variant"], "user_values")).sort_values("x"),
             "max values a user holds per multi-valued category", False),
            (dens.assign(x=_sweep_value(dens["variant"], "density")).sort_values("x"),
             "probability an ad constrains a category", False)]


def throughput_figure(rows: pd.DataFrame, read_TBps: float, source: str):
    """The four :func:`sweeps`, measured against the read ceiling over each point's bytes per ad."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (d, label, logx) in zip(axes.flat, sweeps(rows)):
        if d.empty:
            plots.no_data(ax, f"no committed rows: {label}")
            continue
        ax.plot(d["x"], d["G_ads_per_s"], "o-", label="measured")
        ax.plot(d["x"], read_TBps * 1e3 / d["bytes_per_item"], "--", color="0.5", label="read ceiling / bytes per ad")
        ax.set(xlabel=label, ylabel="G ads/s (one request)", title=f"4 words/thread, {int(d['n_ads'].max()):,}-ad world")
        if logx:
            ax.set_xscale("log")
        ax.set_ylim(0, None)
    axes[0, 0].legend()
    fig.suptitle("Targeting match throughput (one request; items = pool ads)")
    fig.tight_layout()
    plots.source_note(fig, source)
    return fig


def kernel_shapes(rows: pd.DataFrame) -> pd.DataFrame:
    """The plain match kernels on the whole pool (every shape, batches included) and the CPU
    baseline: what the GPU-against-CPU figure shows."""
    v = rows["variant"]
    main = rows[v.str.match(r"match_(U\d|batch)") & (rows["access"] == "pool")
                & ~v.str.contains("prefix|values|density|categories|folding|cardinality|exclude|stage")]
    return pd.concat([main, rows[v.str.startswith("cpu_")]])


def gpu_vs_cpu_figure(shapes: pd.DataFrame, source: str):
    """G ads/s of every kernel shape and of the CPU baseline on a log axis, against the 1 T ads/s
    goal. Points, not bars: a bar on a log axis has no zero to start from."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.27 * max(1, len(shapes))))
    if shapes.empty:
        plots.no_data(ax, "no committed match rows")
        return fig
    cpu = shapes["variant"].str.startswith("cpu").to_numpy()
    y, g = np.arange(len(shapes)), shapes["G_ads_per_s"].to_numpy()
    for is_cpu, colour, label in ((False, "C0", "GPU kernel"), (True, "C3", "CPU baseline")):
        if (cpu == is_cpu).any():
            ax.plot(g[cpu == is_cpu], y[cpu == is_cpu], "o", color=colour, label=label)
    for yi, gi in zip(y, g):
        ax.text(gi, yi, f"  {gi:,.0f}" if gi >= 10 else f"  {gi:.2g}", va="center", fontsize="x-small")
    goal = TARGET_ADS_PER_S / 1e9
    ax.axvline(goal, color="0.3", ls="--", lw=1, label=f"goal {TARGET_ADS_PER_S / 1e12:g} T ads/s")
    ax.set_yticks(y, shapes["variant"])
    ax.set_xlim(np.nanmin(g) / 2, max(np.nanmax(g), goal) * 3)
    ax.set(xscale="log", xlabel="G ads/s (log)", title="GPU kernels vs the CPU baseline (same plan and rows)")
    ax.invert_yaxis()
    ax.legend(fontsize="small", loc="center")  # the empty decades between the CPU and the GPUs
    fig.tight_layout()
    cpu_name = str(shapes.loc[cpu, "device"].iloc[0]) if cpu.any() else ""
    if cpu_name and cpu_name not in source:
        source += f"; {cpu_name if cpu_name.startswith('CPU') else 'CPU: ' + cpu_name}"
    plots.source_note(fig, source)
    return fig


def updates_figure(rows: pd.DataFrame, source: str):
    """Left: ad updates a second of each update path (log). Right: a request alone against one
    queued behind an update batch (GPU µs)."""
    import matplotlib.pyplot as plt

    up = rows[rows["access"].astype(str).str.contains("updates")].set_index("variant")
    ops = up.loc[[v for v in UPDATE_VARIANTS if v in up.index]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    axes[0].barh(ops.index, ops["items_per_s"] / 1e6, color="C2")
    for y, v in enumerate(ops["items_per_s"] / 1e6):
        axes[0].text(v, y, f" {v:.3g} M/s", va="center", fontsize="small")
    axes[0].axvline(TARGET_UPDATES_PER_S / 1e6, color="0.3", ls="--", lw=1)
    axes[0].set(xscale="log", xlabel="M ad updates/s (log)",
                title=f"update throughput (goal {TARGET_UPDATES_PER_S / 1e6:g} M/s on the GPU)")
    axes[0].invert_yaxis()
    lat = rows[rows["variant"].str.startswith("request_")].set_index("variant").reindex(
        ["request_alone_same_profiles", "request_after_update_batch"])
    axes[1].barh(["request alone", "update batch + request"], lat["seconds_median"] * 1e6, color=["C0", "C2"])
    axes[1].set(xlabel="GPU time (µs)", title="a request behind an update batch")
    fig.tight_layout()
    plots.source_note(fig, source)
    return fig


def layouts_figure(rows: pd.DataFrame, source: str):
    """G ads/s of each index layout on one world, with its row bits and bytes read per ad."""
    import matplotlib.pyplot as plt

    v = rows["variant"]
    lay = rows[(v == "match_U4_density_0.3") | v.str.contains("folding|cardinality")]
    lay = lay.assign(variant=lay["variant"].str.replace("match_U4_density_0.3", "match_U4_default"))
    fig, ax = plt.subplots(figsize=(9, 3.2))
    if lay.empty:
        plots.no_data(ax, "no committed layout rows")
        return fig
    ax.barh(lay["variant"], lay["G_ads_per_s"], color="C4")
    for y, (g, b, B) in enumerate(zip(lay["G_ads_per_s"], lay["bits_per_ad"], lay["bytes_per_item"])):
        ax.text(g, y, f" {b:.1f} row bits/ad, {B:.2f} B/ad read", va="center", fontsize="x-small")
    ax.set(xlabel="G ads/s (one request)", title=f"index layouts ({int(lay['n_ads'].iloc[0]):,}-ad benchmark world)")
    ax.invert_yaxis()
    fig.tight_layout()
    plots.source_note(fig, source)
    return fig


# --------------------------------------------------------------------------------------------------
# memory per category


def memory(results_dir, model_memory: pd.DataFrame, model_n_ads: int) -> tuple[pd.DataFrame, str]:
    """The committed index memory per unit and layout (``targeting_memory.csv``, measured at 10^8
    ads in the GPU run), else the host byte model's, scaled to 10^8 ads; with a line saying which."""
    from pathlib import Path

    path = Path(results_dir) / "targeting_memory.csv"
    if path.is_file():
        return pd.read_csv(path), f"{path.as_posix()} (same GPU run, 10^8 ads)"
    return model_memory, f"host byte model: {model_n_ads:,} ads scaled to 10^8"


def memory_table(mem: pd.DataFrame) -> pd.DataFrame:
    """GB at 10^8 ads per unit (folded group or split category, rows) and layout (columns)."""
    return mem.pivot_table(index="unit", columns="layout", values="bytes", aggfunc="sum", sort=False).div(1e9)


def memory_totals(mem: pd.DataFrame) -> pd.Series:
    """GB of the whole index at 10^8 ads per layout (the default first)."""
    return mem.groupby("layout", sort=False)["bytes"].sum() / 1e9


def memory_figure(mem: pd.DataFrame, source: str):
    """Split categories' GB per layout, and the whole index per layout."""
    import matplotlib.pyplot as plt

    split = memory_table(mem[mem["storage"] == "split"])
    totals = memory_totals(mem)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [2, 1]})
    colors = plots.color_map(list(split.columns) + [t for t in totals.index if t not in split.columns])
    split.plot.bar(ax=axes[0], width=0.8, rot=0, color=[colors[c] for c in split.columns])
    axes[0].set(ylabel="GB at 10^8 ads", xlabel="", title="split categories by layout")
    axes[0].legend(fontsize="small", ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    axes[1].barh(totals.index, totals.values, color=[colors[t] for t in totals.index])  # a layout's colour
    axes[1].set(xlabel="GB at 10^8 ads", title="whole index")
    axes[1].invert_yaxis()
    fig.tight_layout()
    plots.source_note(fig, source)
    return fig


# --------------------------------------------------------------------------------------------------
# findings


def _T(r) -> str:
    return f"{r['items_per_s'] / 1e12:.2f} T"


def _count_first(model: pd.DataFrame, read_TBps: float) -> str:
    head = model.iloc[0]
    need = TARGET_ADS_PER_S * head["bytes_per_ad"] / (read_TBps * 1e12)
    line = (f"**Count first.** The default layout reads {head['row_bits_per_ad']:.1f} row bits "
            f"({head['bytes_per_ad']:.2f} bytes) per ad for one request, so at the read ceiling ({read_TBps:.2f} TB/s) "
            f"{TARGET_ADS_PER_S / 1e12:g} T ads/s needs {need:.0%} of it; the model predicts "
            f"{head['predicted_T_ads_per_s']:.2f} T ads/s at {TARGET_FRACTION:.0%}")
    per_cat = model[model["layout"].str.startswith("one folded row")]
    if len(per_cat):
        r = per_cat.iloc[0]
        line += (f"; one row per category reads {r['row_bits_per_ad']:.1f} bits ({r['bytes_per_ad']:.2f} B) and predicts "
                 f"{r['predicted_T_ads_per_s']:.2f} T ads/s")
    return line + "."


def _measured(rows: pd.DataFrame) -> list[str]:
    out = []
    head = _row(rows, default_variant())
    if head is None:
        return out
    line = (f"**Measured.** One request on the {int(head['n_ads']):,}-ad world takes {head['seconds_median'] * 1e6:.0f} µs "
            f"with the default kernel (`{head['variant']}`): **{_T(head)} ads/s at {head['fraction_of_read_ceiling']:.2f} "
            f"of the read ceiling** (goal: {TARGET_ADS_PER_S / 1e12:g} T at {TARGET_FRACTION:.0%}).")
    batches = rows[rows["variant"].str.match(r"match_batch\d+_U\d+$")].sort_values("batch")
    if len(batches):
        best = batches.loc[batches["items_per_s"].idxmax()]
        line += (f" Batched, the best shape (`{best['variant']}`) reaches {_T(best)} ads/s per request "
                 f"({best['fraction_of_read_ceiling']:.2f}).")
    words = rows[rows["variant"].str.match(r"match_U\d+_b256$")].copy()
    if len(words) > 1:
        words["U"] = words["variant"].str.extract(r"match_U(\d+)_")[0].astype(int)
        words = words.sort_values("U")
        line += (" Throughput against the words each thread keeps in flight: "
                 + ", ".join(f"{u}: {r / 1e12:.2f} T" for u, r in zip(words["U"], words["items_per_s"])) + ".")
    pre = rows[rows["variant"].str.contains("prefetch")]
    if len(pre):
        plain = {int(u): r for u, r in zip(words.get("U", []), words.get("items_per_s", []))}
        parts = []
        for _, r in pre.iterrows():
            u = int(r["variant"].split("_U")[1].split("_")[0])
            if u in plain:
                parts.append(f"{u} words: {r['items_per_s'] / plain[u] - 1:+.0%}")
        if parts:
            line += " Prefetching the next category's first row: " + ", ".join(parts) + " against the plain kernel."
    out.append(line)
    stages = rows[rows["variant"].str.match(r"match_U\d+_stage_")].set_index("variant")
    if len(stages):
        us = (stages["seconds_median"] * 1e6).rename(lambda v: v.split("_stage_")[1])
        parts = [f"{k} {us[k]:.1f} µs" for k in ("prep", "match", "post", "all") if k in us.index]
        out.append("**Where a request's time goes** (each kernel of the launch set timed alone): "
                   + ", ".join(parts) + ".")
    grouped = rows[rows["variant"].str.match(r"match_grouped_U\d+_G\d+_b256$")]
    if len(grouped):
        best = grouped.loc[grouped["items_per_s"].idxmax()]
        out.append(f"**Loading rows in groups**: the best grouped shape (`{best['variant']}`) reaches {_T(best)} ads/s "
                   f"against {_T(head)} for the plain default kernel"
                   + (", so the chain of dependent row loads is not what limits the match."
                      if best["items_per_s"] <= head["items_per_s"] else "."))
    cpu = rows[rows["variant"].str.startswith("cpu_")]
    if len(cpu):
        c = cpu.iloc[0]
        out.append(f"**CPU baseline** (same plan and rows, `{c['variant']}`): {c['items_per_s'] / 1e9:.1f} G ads/s; "
                   f"the default GPU kernel is {head['items_per_s'] / c['items_per_s']:.0f}x faster.")
    return out


def _updates(rows: pd.DataFrame) -> list[str]:
    gpu, host = _row(rows, "update_batch_gpu"), _row(rows, "update_batch_host")
    if gpu is None:
        return []
    line = (f"**Updates**: batches of {int(gpu['batch']):,} creates / changes / retires apply on the GPU at "
            f"{gpu['items_per_s'] / 1e6:.1f} M ops/s ({gpu['seconds_median'] * 1e6:.0f} µs a batch; goal "
            f"{TARGET_UPDATES_PER_S / 1e6:g} M/s)")
    alone, after = _row(rows, "request_alone_same_profiles"), _row(rows, "request_after_update_batch")
    if alone is not None and after is not None:
        line += (f"; a request queued behind a batch waits for it ({after['seconds_median'] * 1e6:.0f} µs against "
                 f"{alone['seconds_median'] * 1e6:.0f} µs alone)")
    if host is not None:
        line += (f". The host step that validates a batch and turns rules into bit flips takes "
                 f"{host['seconds_median'] * 1e3:.0f} ms a batch")
    ends = [r for v in UPDATE_VARIANTS[2:] if (r := _row(rows, v)) is not None]
    if ends:
        line += ("; end to end (`DeviceTargetingIndex.apply`): "
                 + ", ".join(f"{r['items_per_s'] / 1e3:.0f} K ops/s (`{r['variant']}`)" for r in ends))
        sustained = max(r["items_per_s"] for r in ends) >= TARGET_UPDATES_PER_S
        line += ": the index " + ("sustains" if sustained else "does **not** sustain") + \
            f" {TARGET_UPDATES_PER_S / 1e6:g} M updates/s end to end"
    return [line + "."]


def findings(model: pd.DataFrame, rows: pd.DataFrame | None, read_TBps: float, checks: pd.DataFrame) -> str:
    """The notebook's conclusions as Markdown bullets, quoting the byte model, the device checks
    and (when committed) the GPU rows."""
    out = [_count_first(model, read_TBps)]
    if rows is None:
        out.append("No committed GPU measurements: run `python -m andromeda_nb bench targeting` on a GPU host.")
    else:
        out += _measured(rows) + _updates(rows)
    passed = int(checks["ok"].sum())
    out.append(f"{passed} of {len(checks)} device checks equal the oracle, before and after real-time updates, and the "
               "updated index equals one rebuilt from scratch (the property test in "
               "`tests/targeting/test_index_updates.py` checks random update sequences the same way).")
    return "\n".join(f"* {line}" for line in out)
