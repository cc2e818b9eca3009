"""The tables, figures and findings behind the precision notebook (``notebooks/06_precision.ipynb``):
the trained E = 6, K = 2 mixture's ad table in each storage dtype of
:data:`.quality.PRECISION_DTYPES` against fp32, trained here or read from
``data/results/quality.csv``, labelled with the fused kernel's measured throughput.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import plots, quality

#: The kernel configuration whose measured ads/s labels each dtype (the trained model's E and K;
#: d of the measured kernel).
KERNEL_CONFIG = {"d": 64, "experts": 6, "k_experts": 2}
#: The goal: a dtype keeps recall@100 within this many points of fp32 ...
TARGET_DELTA_PP = 0.5
#: ... and top-100 overlap with fp32 at least this.
TARGET_OVERLAP = 0.98
#: The rule that would make the fp16 math mode the default (docs/design.md, "Storage and math"):
#: recall@100 within this many points of fp32 math ...
DEFAULT_MATH_DELTA_PP = 0.1
#: ... and top-100 overlap at least this, on every dataset.
DEFAULT_MATH_OVERLAP = 0.99
#: Pool size of the memory comparison.
POOL_ADS = 10**8
METRICS = ("recall@100", "recall@100_delta_pp", "overlap@100_fp32", "score_err_p50", "score_err_p99",
           "score_err_p999", "score_err_max", "bytes_per_ad",
           # the fp16 math rows against fp32 math on their own storage (what math="auto" decides)
           "recall@100_delta_pp_same_storage", "overlap@100_same_storage")
ERROR_QUANTILES = {"score_err_p50": "p50", "score_err_p99": "p99", "score_err_p999": "p99.9", "score_err_max": "max"}
KERNEL_DTYPES = ("fp32", "bf16", "fp16", "int8")


def train_here(datasets, preset: str) -> pd.DataFrame:
    """Train the E = 6, K = 2 mixture for every seed of ``preset`` on each dataset and measure
    every dtype (:func:`.quality.run_precision`)."""
    from ..training import train_model

    p = quality.PRESETS[preset]
    frames = []
    for ds in datasets:
        data = quality.load_data(ds, preset)
        rows = quality.eval_rows(data, p.precision_users.get(ds))
        for seed in p.seeds:
            tm = train_model("mixture_k2", data, p.cfg(ds, "mixture_k2"), seed=seed, progress=False)
            frames.append(quality.run_precision(tm, rows, preset=preset))
    return pd.concat(frames, ignore_index=True)


def load(run_experiments: bool, results_csv, run_preset: str, datasets) -> tuple[pd.DataFrame, str]:
    """The precision rows (model ``mixture_k2``, experiment ``precision``) of ``datasets`` and a
    source line: trained here or the committed preset of ``results_csv``."""
    if run_experiments:
        frame, source = train_here(datasets, run_preset), quality.trained_here_source(run_preset)
    else:
        frame, source, pick = quality.committed(results_csv)
        if pick != "full":
            source += " (no full-preset rows: run `python -m andromeda_nb.training --preset full`)"
    keep = (frame["metric"].isin(METRICS) & frame["dataset"].isin(datasets) & (frame["model"] == "mixture_k2")
            & (frame["experiment"] == "precision"))
    return frame[keep], source


def throughput(scoring_csv) -> pd.DataFrame:
    """The fused kernel's best measured ads/s per dtype at :data:`KERNEL_CONFIG` (index: dtype;
    columns ``items_per_s``, ``device``, ``commit``: each dtype's newest run); empty when not measured."""
    thr = quality.kernel_throughput(scoring_csv)
    for key, value in KERNEL_CONFIG.items():
        thr = thr[thr[key] == value]
    return thr.set_index("dtype")[["items_per_s", "device", "commit"]]


def summaries(prec: pd.DataFrame, datasets) -> dict[str, pd.DataFrame]:
    """Per dataset with rows: mean and sd over seeds of every metric (columns ``(mean|std, metric)``),
    one row per dtype in :data:`.quality.PRECISION_DTYPES` order."""
    order = [d for d in quality.PRECISION_DTYPES if d in set(prec["dtype"])]
    out = {}
    for ds in datasets:
        s = prec[prec["dataset"] == ds].groupby(["dtype", "metric"])["value"].agg(["mean", "std"]).unstack("metric")
        if len(s):
            out[ds] = s.reindex([d for d in order if d in s.index])
    return out


def kernel_rate(thr: pd.DataFrame, dtype: str) -> float:
    """Measured ads/s of the kernel that reads ``dtype`` (``int8_dimscale`` is an int8 table)."""
    return float(thr["items_per_s"].get(dtype.replace("_dimscale", ""), np.nan)) if len(thr) else float("nan")


def one_run(thr: pd.DataFrame, *dtypes: str) -> bool:
    """Whether the rates of ``dtypes`` in ``thr`` (:func:`throughput`) come from one run (a commit
    that is not recorded cannot tell: False)."""
    if "commit" not in thr.columns:
        return False
    commits = {str(thr["commit"].get(d, "")) for d in dtypes}
    return len(commits) == 1 and "" not in commits and "nan" not in commits


def _devices(thr: pd.DataFrame, *dtypes: str) -> str:
    """The devices that measured ``dtypes``' rates in ``thr``, each once (``"?"`` where not recorded)."""
    devs = [str(thr["device"].get(d, "") or "?") if "device" in thr.columns else "?" for d in dtypes]
    return ", ".join(dict.fromkeys(devs))


def display_table(s: pd.DataFrame, thr: pd.DataFrame) -> pd.DataFrame:
    """One dataset's summary as the notebook shows it: recall@100 mean ± sd, the loss against
    fp32, top-100 overlap, score error quantiles, bytes per ad and the kernel's ads/s."""
    devices = ", ".join(sorted(set(thr["device"].astype(str)))) or "not measured"
    mean, sd = s["mean"], s["std"]
    return pd.DataFrame({
        "recall@100": mean["recall@100"].map("{:.4f}".format) + " ± " + sd["recall@100"].fillna(0).map("{:.4f}".format),
        "Δ recall@100 (pp)": mean["recall@100_delta_pp"].round(3),
        "top-100 overlap": mean["overlap@100_fp32"].round(4),
        "score err p50": mean["score_err_p50"].map("{:.2e}".format),
        "score err p99": mean["score_err_p99"].map("{:.2e}".format),
        "bytes/ad": mean["bytes_per_ad"].astype(int),
        f"ads/s ({devices})": [kernel_rate(thr, d) for d in s.index],
    })


def metrics(summary: dict[str, pd.DataFrame]) -> dict[str, float]:
    """``<dataset>/<dtype>/recall@100_delta_pp`` and ``.../overlap@100_fp32`` (means over seeds)."""
    return {f"{ds}/{d}/{m}": float(s.loc[d, ("mean", m)]) for ds, s in summary.items() for d in s.index
            for m in ("recall@100_delta_pp", "overlap@100_fp32")}


def figure(summary: dict[str, pd.DataFrame], thr: pd.DataFrame, note: str):
    """Left: recall@100 lost against fp32 per dtype (mean ± sd), each dtype labelled with its bytes
    per ad and the kernel's measured ads/s. Right: score error quantiles against fp32. In both
    panels the colour is the dtype and the marker (and line style) the dataset."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1, 1.25]})
    order = [x for x in quality.PRECISION_DTYPES if any(x in s.index for s in summary.values())]
    colour = {x: plots.PALETTE[i % len(plots.PALETTE)] for i, x in enumerate(order)}
    styles = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-.")]
    for j, (ds, s) in enumerate(summary.items()):
        marker, line = styles[j % len(styles)]
        offset = (j - (len(summary) - 1) / 2) * 0.15
        for d in s.index:
            axes[0].errorbar(order.index(d) + offset, s.loc[d, ("mean", "recall@100_delta_pp")],
                             yerr=np.nan_to_num(s.loc[d, ("std", "recall@100_delta_pp")]), fmt=marker,
                             color=colour[d], capsize=3)
        q = s[[("mean", m) for m in ERROR_QUANTILES]].drop(index="fp32", errors="ignore")
        q.columns = list(ERROR_QUANTILES.values())
        for d, row in q.iterrows():
            axes[1].plot(row.index, row.to_numpy(), marker=marker, ls=line, color=colour[d])
    any_s = next(iter(summary.values()), None)
    labels = []
    for x in order:
        g, b = kernel_rate(thr, x), any_s[("mean", "bytes_per_ad")].get(x, np.nan)
        labels.append(f"{x}\n{b:.0f} B/ad\n" + (f"{g / 1e9:.1f} G/s" if np.isfinite(g) else "n/a"))
    axes[0].set_xticks(range(len(order)), labels, fontsize="small")
    for lim in (-TARGET_DELTA_PP, TARGET_DELTA_PP):
        axes[0].axhline(lim, color="0.5", ls=":", lw=1)
    axes[0].text(len(order) - 0.5, TARGET_DELTA_PP, f"target ±{TARGET_DELTA_PP} pp", ha="right", va="bottom",
                 fontsize="x-small", color="0.4")
    axes[0].set(ylabel="Δ recall@100 vs fp32 (percentage points)", title="quality loss per dtype",
                xlabel="dtype, bytes an ad, fused top-K ads/s measured")
    dataset_keys = [Line2D([], [], color="0.3", marker=styles[j % len(styles)][0], ls=styles[j % len(styles)][1],
                           label=ds) for j, ds in enumerate(summary)]
    axes[0].legend(handles=dataset_keys, fontsize="small", loc="lower left")
    axes[1].set(yscale="log", xlabel="quantile over eligible ads", ylabel="|Δ score| / user's score sd (log)",
                title="score error vs fp32 (equal errors overlap)")
    dtype_keys = [Line2D([], [], color=colour[d], lw=3, label=d) for d in order if d != "fp32"]
    axes[1].legend(handles=dtype_keys + dataset_keys, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    plots.source_note(fig, note)
    return fig


def kernel_checks(preset: str, max_ads: int | None, seed: int = 0) -> pd.DataFrame:
    """A small E = 6, K = 2 model (``preset``) exported in each dtype of :data:`KERNEL_DTYPES` and
    scored by the fused kernel on the active backend, against the torch formula's top-K on the same
    stored table (:func:`.quality.kernel_check`): one row per dtype and user, ``dtype, ok, message``."""
    from ..training import train_model

    data = quality.load_data("multi_interest", preset)
    model = train_model("mixture_k2", data, quality.PRESETS[preset].cfg("multi_interest", "mixture_k2"), seed=seed,
                        progress=False)
    users = data.user_ids[data.eval_rows[:1]]
    return pd.DataFrame([{"dtype": dt, "ok": bool(c.ok), "message": c.message} for dt in KERNEL_DTYPES
                         for c in quality.kernel_check(model, users, k=10, dtype=dt, max_ads=max_ads)])


def _default_math() -> str:
    from ..score.config import KernelConfig

    return KernelConfig().math


def _auto_takes_fp16_on_int8() -> bool:
    from ..score.config import KernelConfig

    return KernelConfig().picks_fp16("gated", 64, 6, "int8")


def int8_default_line(int8: dict, datasets, auto_fp16: bool | None = None) -> str:
    """The same rule for fp16 math on int8 tables, against fp32 math on the int8 table (``int8``:
    ``{dataset: (Δ recall@100 pp, top-100 overlap)}`` of the same-storage metrics), and what the
    default does (``auto_fp16``: whether ``math="auto"`` takes fp16 math on int8 tables; default: as
    :class:`~andromeda_nb.score.KernelConfig` does), so a default the data do not support shows."""
    auto_fp16 = _auto_takes_fp16_on_int8() if auto_fp16 is None else auto_fp16
    head = ("**fp16 math on int8 tables?** The same rule against fp32 math on the int8 table (what "
            "`math=\"auto\"` chooses for a table already stored)")
    default = "`\"auto\"` takes fp16 math on int8 tables" if auto_fp16 else "`\"auto\"` keeps fp32 math on int8 tables"
    if not int8:
        return head + f": not measured (rows without the same-storage metrics); {default}" + (
            ", which these rows do not support." if auto_fp16 else ".")
    ok = set(int8) >= set(datasets) and all(abs(dpp) <= DEFAULT_MATH_DELTA_PP and ov >= DEFAULT_MATH_OVERLAP
                                            for dpp, ov in int8.values())
    missing = [ds for ds in datasets if ds not in int8]
    verdict = "met on every dataset" if ok else ("not yet measured on every dataset" if missing
                                                 else "not met on every dataset")
    return (head + ". " + "; ".join(f"{ds}: {dpp:+.3f} pp, overlap {ov:.4f}" for ds, (dpp, ov) in int8.items())
            + (f"; {', '.join(missing)}: not measured" if missing else "") + f": {verdict}; {default}"
            + ("." if ok == auto_fp16 else ", which these rows do not support." if auto_fp16
               else ", though the data allow fp16 math."))


def findings(summary: dict[str, pd.DataFrame], thr: pd.DataFrame) -> str:
    """The notebook's conclusions as Markdown: bytes and memory per dtype with the measured rates,
    each dataset and lower-precision dtype against the target, and the score error's range."""
    lines = []
    any_s = next(iter(summary.values()), None)
    if any_s is not None and {"fp16", "int8"} <= set(any_s.index):
        b16, b8 = (any_s.loc[d, ("mean", "bytes_per_ad")] for d in ("fp16", "int8"))
        cfg = ", ".join(f"{k} = {v}" for k, v in KERNEL_CONFIG.items())
        pairs = {m: (i8, f16) for m, i8, f16 in (("fp16", "int8_fp16_math", "fp16_math"), ("fp32", "int8", "fp16"))}
        rates = {m: kernel_rate(thr, i8) / kernel_rate(thr, f16) for m, (i8, f16) in pairs.items()}
        rates = {m: (r, one_run(thr, *pairs[m]), _devices(thr, *pairs[m])) for m, r in rates.items() if np.isfinite(r)}
        speed = ("the fused kernel (" + cfg + ") runs int8 at "
                 + ", ".join(f"{r:.2f}x fp16's measured ads/s in {m} math" + (f" ({dev})" if same else f" (two runs: {dev})")
                             for m, (r, same, dev) in rates.items())
                 if rates else "the kernel's int8 and fp16 rates are not both measured")
        lines.append(f"int8 stores {b8:.0f} bytes an ad against fp16's {b16:.0f} (a 10^{int(np.log10(POOL_ADS))}-ad "
                     f"table: {b8 * POOL_ADS / 1e9:.1f} GB against {b16 * POOL_ADS / 1e9:.1f} GB); {speed}.")
    for ds, s in summary.items():
        for d in ("int8", "int8_fp16_math", "int8_dimscale", "fp16", "fp16_math", "bf16"):
            if d not in s.index:
                continue
            dpp, ov = s.loc[d, ("mean", "recall@100_delta_pp")], s.loc[d, ("mean", "overlap@100_fp32")]
            hit = abs(dpp) <= TARGET_DELTA_PP and ov >= TARGET_OVERLAP
            lines.append(f"{ds}, {d}: Δ recall@100 {dpp:+.3f} pp, top-100 overlap {ov:.4f}: "
                         + ("meets the target" if hit else f"**misses** the target (|Δ| <= {TARGET_DELTA_PP} pp and "
                                                           f"overlap >= {TARGET_OVERLAP})"))
    math = {ds: (s.loc["fp16_math", ("mean", "recall@100_delta_pp")], s.loc["fp16_math", ("mean", "overlap@100_fp32")])
            for ds, s in summary.items() if "fp16_math" in s.index}
    if math:
        ok = len(math) == len(summary) and all(abs(dpp) <= DEFAULT_MATH_DELTA_PP and ov >= DEFAULT_MATH_OVERLAP
                                               for dpp, ov in math.values())
        lines.append("**fp16 math as the default?** The rule: on every dataset |Δ recall@100| <= "
                     f"{DEFAULT_MATH_DELTA_PP} pp and top-100 overlap >= {DEFAULT_MATH_OVERLAP} against fp32 math. "
                     + "; ".join(f"{ds}: {dpp:+.3f} pp, overlap {ov:.4f}" for ds, (dpp, ov) in math.items()) + ": "
                     + (("the data allow it" + (f"; the kernels' default is math={_default_math()!r}." if _default_math() != "fp32" else
                                                "; the kernels' default is still fp32 math (not yet switched).")) if ok
                        else "not met, fp32 math stays the default."))
    int8 = {ds: (s.loc["int8_fp16_math", ("mean", "recall@100_delta_pp_same_storage")],
                 s.loc["int8_fp16_math", ("mean", "overlap@100_same_storage")])
            for ds, s in summary.items() if "int8_fp16_math" in s.index
            and ("mean", "overlap@100_same_storage") in s.columns
            and np.isfinite(s.loc["int8_fp16_math", ("mean", "overlap@100_same_storage")])}
    if summary:
        lines.append(int8_default_line(int8, list(summary)))
    half = [s.loc[[d for d in ("fp16", "fp16_math", "bf16") if d in s.index], ("mean", "score_err_max")]
            for s in summary.values()]
    half = pd.concat(half) if half else pd.Series(dtype=float)
    if len(half):
        lines.append(f"16-bit storage and fp16 math: the *maximum* score error is {half.min():.2g} to {half.max():.2g} score standard "
                     "deviations, far above the median: where two experts' gate logits nearly tie, the rounding flips "
                     "which K experts are chosen and the score jumps; those ads rarely reach the top-100.")
    return "\n".join(f"* {line}" for line in lines)
