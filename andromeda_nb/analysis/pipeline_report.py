"""The tables, figures and findings behind the request-path notebook (``notebooks/07_request_path.ipynb``),
from the rows of ``data/results/pipeline.csv`` (``python -m andromeda_nb.bench pipeline``).

Variants: ``retrieve`` (:meth:`~andromeda_nb.pipeline.Pool.retrieve` of ``batch`` requests),
``score_sparse`` (the device steps of one request after the match), ``match_eligible``,
``score_topk`` (the whole pool), ``retrieve_open_loop`` (requests at a set rate), the launch
overheads ``launch_numba_dispatch`` / ``launch_bound`` (the live pool's rows: :mod:`.pool_report`).
Wall times are the public call's, warm;
``device_seconds`` is the summed device time of the same calls' own work.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from . import plots
from .results import default_launches, in_time_order, one_device, text

#: the request-path issue's targets (H200, 10^8-ad benchmark world, k = 1000)
TARGET_P50_S = 0.4e-3
TARGET_WALL_OVER_DEVICE = 1.3
TARGET_REQUESTS_PER_S_AT_32 = 5000
TARGET_SPARSE_DEVICE_S = 55e-6
TARGET_SCORE_TOPK_RATE = 0.85
STEP_ORDER = ("weights", "match", "reset", "gather", "sample", "seed", "filter", "final0", "final1", "answers")


def _with_ms(rows: pd.DataFrame) -> pd.DataFrame:
    out = rows.copy()
    out["math"] = text(out, "math").replace("", "fp32")  # older rows: fp32
    out["dtype"] = text(out, "dtype").replace("", "fp16")  # the benchmark table
    for col, src in (("wall_ms", "seconds_median"), ("p99_ms", "seconds_p99"), ("device_ms", "device_seconds")):
        out[col] = pd.to_numeric(out[src], errors="coerce") * 1e3 if src in out else np.nan
    out["requests_per_s"] = pd.to_numeric(out["requests_per_s"], errors="coerce") if "requests_per_s" in out else np.nan
    out["wall_over_device"] = out["wall_ms"] / out["device_ms"]
    return out


def newest(rows: pd.DataFrame) -> pd.DataFrame:
    """The newest verified row of each (variant, pool size, batch, math, table dtype) on one card
    (:func:`.results.one_device`: the findings compare the cases with each other and with the H200's
    targets), with ``wall_ms``, ``p99_ms``, ``device_ms`` and ``wall_over_device``; rows measured off the
    default launch (:func:`.results.default_launches`: ``f16_weights=shared``) are history, not the
    case's figure."""
    ok = _measured(rows[rows["variant"] != "retrieve_open_loop"])
    return in_time_order(ok).groupby(["variant", "n_ads", "batch", "math", "dtype"], dropna=False).tail(1)


def _measured(rows: pd.DataFrame) -> pd.DataFrame:
    """The verified rows of the default launches on one card, with :func:`_with_ms`'s columns."""
    return _with_ms(one_device(default_launches(rows[rows["ok"]])))


def _run_name(r) -> str:
    """A row's run as the findings name it: its commit and day."""
    return f"run {str(r['commit'])[:7]}, {str(r['timestamp'])[:10]}"


def sweep_run(rows: pd.DataFrame, variant: str = "retrieve") -> pd.DataFrame:
    """The newest run holding the most rows of ``variant`` (a whole sweep, not a short check)."""
    r = rows[rows["variant"] == variant]
    if r.empty:
        return rows.iloc[0:0]
    counts = r.groupby("commit").agg(n=("variant", "size"), t=("timestamp", "max"))
    commit = counts.sort_values(["n", "t"]).index[-1]
    return _with_ms(rows[rows["commit"] == commit])


def batch_table(rows: pd.DataFrame) -> pd.DataFrame:
    """``retrieve`` against batch size and pool size (the newest whole sweep)."""
    t = sweep_run(rows)
    t = t[(t["variant"] == "retrieve") & (t["math"] == "fp32") & (t["dtype"] == "fp16")].sort_values(["n_ads", "batch"])
    return t[["n_ads", "batch", "wall_ms", "p99_ms", "device_ms", "wall_over_device", "requests_per_s",
              "eligible_fraction", "commit"]].reset_index(drop=True)


#: a p99 this many times its p50 is a stall among the timed calls, not the case's spread
STALL_P99_OVER_P50 = 10


def batch_stalls(table: pd.DataFrame) -> str:
    """The sweep's points (:func:`batch_table`) whose p99 is over :data:`STALL_P99_OVER_P50` times
    their p50, each named: at least one warm call stalled (a compile, a collection or a host pause
    inside the timed loop), so that p99 is not the batch's steady spread. '' where none."""
    bad = table[table["p99_ms"] > STALL_P99_OVER_P50 * table["wall_ms"]]
    if bad.empty:
        return ""
    return ("Stalls in the sweep: " + "; ".join(
        f"{r['n_ads']:.0e} ads, batch {int(r['batch'])}: p99 {r['p99_ms']:,.1f} ms against p50 {r['wall_ms']:.3f} ms "
        f"(run {r['commit']})".replace("e+0", "e") for _, r in bad.iterrows())
        + ". At least one of the timed calls stalled (a compile, a collection or a host pause in the loop): that "
          "p99 is not the batch's steady spread; its p50 and device time stand.")


def steps(rows: pd.DataFrame, math: str | None = None) -> pd.DataFrame:
    """Where a one-request call's device time goes (microseconds a step, from the retrieve rows'
    notes) and the host's share (wall minus device), per pool size (the newest row of each, fp16
    table, in ``math``: default the default path's, :data:`DEFAULT_PATH_MATH`). ``attrs`` name the
    math and each row's run (``runs``: pool size -> commit)."""
    math = math or DEFAULT_PATH_MATH
    t = newest(rows)
    t = t[(t["variant"] == "retrieve") & (t["batch"] == 1) & (t["math"] == math) & (t["dtype"] == "fp16")]
    out = [dict(_step_times(r), **{"host (wall - device)": max(0.0, (r["wall_ms"] - r["device_ms"]) * 1e3),
                                   "n_ads": int(r["n_ads"])}) for _, r in t.iterrows()]
    table = pd.DataFrame(out).set_index("n_ads").sort_index() if out else pd.DataFrame()
    table.attrs.update(math=math, runs={int(r["n_ads"]): str(r["commit"]) for _, r in t.iterrows()})
    return table


def _step_times(r) -> dict:
    """A retrieve row's device steps (microseconds, from its notes; 0 for a step it does not list)."""
    found = dict(re.findall(r"(\w+) ([0-9.]+)", str(r["notes"]).split(";")[0].split(":", 1)[-1]))
    return {s: float(found.get(s, 0.0)) for s in STEP_ORDER}


def load_curve(rows: pd.DataFrame) -> pd.DataFrame:
    """Open-loop latency (p50, p99, ms) against the offered rate, and the rate served (newest run)."""
    t = sweep_run(rows, "retrieve_open_loop")
    t = t[t["variant"] == "retrieve_open_loop"].copy()
    t["offered"] = pd.to_numeric(t["requests_per_s"], errors="coerce")
    t["served"] = t["notes"].str.extract(r"served ([0-9,]+)")[0].str.replace(",", "").astype(float)
    t["p50_ms"] = t["seconds_median"] * 1e3
    t["p99_ms"] = pd.to_numeric(t["seconds_p99"], errors="coerce") * 1e3
    return t[["offered", "served", "p50_ms", "p99_ms"]].sort_values("offered").reset_index(drop=True)


def batch_figure(table: pd.DataFrame, source: str):
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (n, g) in enumerate(table.groupby("n_ads")):
        label, color = f"{n:.0e} ads".replace("e+0", "e"), f"C{i}"
        a.plot(g["batch"], g["requests_per_s"], "o-", color=color, label=label)
        b.plot(g["batch"], g["wall_ms"] / g["batch"], "o-", color=color, label=f"{label}: wall")
        b.plot(g["batch"], g["device_ms"] / g["batch"], "s--", color=color, label=f"{label}: device")
    a.axhline(TARGET_REQUESTS_PER_S_AT_32, color="grey", lw=0.8, ls=":", label="target (10^8 ads, batch 32)")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("requests a call (batch)")
        ax.legend(fontsize="small")
    b.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    from matplotlib.ticker import LogLocator

    b.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    b.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    b.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    a.set_ylabel("requests / s")
    b.set_ylabel("ms a request")
    a.set_title("throughput (fp32 math)")
    b.set_title("time a request: wall against device")
    fig.tight_layout()
    sweep = f"; this sweep: commit {table['commit'].iloc[0]}" if len(table) else ""
    plots.source_note(fig, source + sweep)
    return fig


def steps_figure(table: pd.DataFrame, source: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 2.8))
    if table.empty:
        plots.no_data(ax, "no one-request retrieve rows")
        return fig
    left = np.zeros(len(table))
    labels = [f"{n:.0e} ads".replace("e+0", "e") for n in table.index]
    colors = plots.categorical_colors(len(table.columns))
    for col, color in zip(table.columns, colors):
        color = "0.75" if col.startswith("host") else color
        ax.barh(labels, table[col], left=left, label=col, color=color)
        left += table[col].to_numpy()
    ax.set_xlabel("microseconds of one request's call")
    plots.legend_outside(ax, fontsize="small")
    runs = sorted(set(table.attrs.get("runs", {}).values()))
    ax.set_title(f"where one request's time goes ({table.attrs.get('math', '?')} math; device steps, then the "
                 f"host's share){'; run ' + ', '.join(runs) if runs else ''}", fontsize="medium")
    fig.tight_layout()
    plots.source_note(fig, source)
    return fig


def load_figure(curve: pd.DataFrame, source: str):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(6, 3.6))
    if curve.empty:
        plots.no_data(ax, "no open-loop rows")
        return fig
    ax.plot(curve["offered"], curve["p50_ms"], "o-", label="p50")
    ax.plot(curve["offered"], curve["p99_ms"], "s--", label="p99")
    ax.set_xlabel("offered load (requests / s)")
    ax.set_ylabel("latency, arrival to answer (ms)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("latency against offered load (10^8 ads)")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    fig.tight_layout()
    plots.source_note(fig, source)
    return fig


#: the math of the default path on the benchmark world (KernelConfig(math="auto") on its fp16 table)
DEFAULT_PATH_MATH = "fp16"


def _row(t: pd.DataFrame, variant: str, n: float, batch: float = 1, math: str = DEFAULT_PATH_MATH, dtype: str = "fp16"):
    r = t[(t["variant"] == variant) & np.isclose(t["n_ads"], n) & np.isclose(t["batch"], batch) & (t["math"] == math)
          & (t["dtype"] == dtype)]
    return None if r.empty else r.iloc[-1]


def _filter_share(t: pd.DataFrame, sparse) -> float:
    """The filter pass's share of the sparse scoring steps, from the one-request ``retrieve`` row
    of the run and math of the ``score_sparse`` row ``sparse`` (the same launches), NaN without."""
    r = t[(t["variant"] == "retrieve") & np.isclose(t["n_ads"], sparse["n_ads"]) & np.isclose(t["batch"], 1)
          & (t["math"] == sparse["math"]) & (t["dtype"] == sparse["dtype"]) & (t["commit"] == sparse["commit"])]
    if r.empty:
        return float("nan")
    st = _step_times(r.iloc[-1])
    total = sum(st[s] for s in ("reset", "gather", "sample", "seed", "filter", "final0", "final1"))
    return st["filter"] / total if total else float("nan")


def demo_pool(n_ads: int, k: int, seed: int = 0):
    """A small benchmark world (its rules, fp16 d64 rows) in a :class:`~andromeda_nb.pipeline.Pool`:
    ``(pool, rules)``."""
    from ..datasets import synthetic
    from ..model import AdTable
    from ..pipeline import Pool
    from ..targeting import TargetingIndex

    rng = np.random.default_rng(seed)
    rules = synthetic.generate_rules(synthetic.benchmark_schema(), n_ads, seed=seed)
    table = AdTable.from_float(rng.standard_normal((n_ads, 64)), rng.standard_normal(n_ads), dtype="fp16",
                               ad_ids=rules.ad_ids)
    return Pool(table, TargetingIndex(rules), max_batch=4, max_k=k), rules


def correctness_demo(n_ads: int, k: int, seed: int = 0) -> tuple[pd.DataFrame, bool]:
    """:func:`demo_pool` serving a batch of three requests against the reference: the host rules'
    match and the top-k of the kernel's own scores (exact ids, order and scores). Returns a table a
    request and whether all matched."""
    from .. import reference
    from ..datasets import synthetic
    from ..model import Request
    from ..score import score_ads
    from ..targeting import make_profile

    pool, rules = demo_pool(n_ads, k, seed)
    schema = rules.schema
    rng = np.random.default_rng(seed + 7)
    reqs = [Request.random(64, 6, 2, rng) for _ in range(3)]
    profiles = synthetic.generate_profiles(schema, 3, seed=seed + 1, max_values=synthetic.MAX_USER_VALUES)
    # a broad profile too (no values: only unconstrained categories pass), so one request holds many ads
    profiles[2] = {}
    outs = pool.retrieve(reqs, profiles, k=k)
    rows = []
    for b, (req, prof, out) in enumerate(zip(reqs, profiles, outs)):
        elig = reference.match(rules, make_profile(schema, prof))
        want = reference.topk(score_ads(req, pool.table).copy_to_host(), k, ids=pool.table.host_ad_ids, eligible=elig)
        same = bool(np.array_equal(out.ids, want.ids) and np.array_equal(out.scores, want.scores)
                    and out.n_eligible == elig.sum())
        rows.append({"request": b, "eligible": out.n_eligible, "returned": int((out.ids >= 0).sum()),
                     "best score": float(out.scores[0]) if out.n_eligible else float("nan"),
                     "equals the reference": same})
    table_out = pd.DataFrame(rows)
    return table_out, bool(table_out["equals the reference"].all())


def headline_metrics(rows: pd.DataFrame) -> dict:
    """The newest verified measurement of each headline case."""
    t = newest(rows)
    out = {}
    one, b32 = _row(t, "retrieve", 1e8), _row(t, "retrieve", 1e8, 32)
    sparse, whole = _row(t, "score_sparse", 1e8), _row(t, "score_topk", 1e8)
    if one is not None:
        out.update(retrieve_1e8_p50_ms=one["wall_ms"], retrieve_1e8_p99_ms=one["p99_ms"],
                   retrieve_1e8_device_ms=one["device_ms"], retrieve_1e8_wall_over_device=one["wall_over_device"])
    if b32 is not None:
        out["retrieve_1e8_batch32_requests_per_s"] = b32["requests_per_s"]
    if sparse is not None:
        out["score_sparse_1e8_device_us"] = sparse["device_ms"] * 1e3
    if whole is not None:
        out["score_topk_1e8_device_over_wall"] = whole["device_ms"] / whole["wall_ms"]
    out["all_rows_verified"] = bool(t[t["variant"].isin(["retrieve", "score_topk", "score_sparse"])]["ok"].all())
    return out


def _run_pairs(rows: pd.DataFrame, i8) -> list[float]:
    """fp16 wall / int8 wall of each pair of calls the run of the int8 row ``i8`` timed for its
    case (variant, pool size, batch, math; default launches, verified): the k-th fp16 row with the
    k-th int8 row in the order written (a run's phases each time both tables)."""
    ok = _measured(rows)
    case = ok[(ok["commit"] == i8["commit"]) & (ok["variant"] == i8["variant"]) & np.isclose(ok["n_ads"], i8["n_ads"])
              & np.isclose(ok["batch"], i8["batch"]) & (ok["math"] == i8["math"])]
    f16, i8s = (case[case["dtype"] == dt]["wall_ms"].tolist() for dt in ("fp16", "int8"))
    return [a / b for a, b in zip(f16, i8s)]


def launches_line(rows: pd.DataFrame) -> str:
    """The newest run that timed ``Pool.retrieve`` with its steps in one CUDA graph (``retrieve``)
    and launched one by one (``retrieve_bound_launches``) on the same 10^8-ad pool and requests, as
    one finding per batch size; '' when no run holds both."""
    rows = _with_ms(rows)
    pair = rows[rows["variant"].isin(["retrieve", "retrieve_bound_launches"]) & rows["ok"]
                & np.isclose(rows["n_ads"].astype(float), 1e8) & (rows["math"] == DEFAULT_PATH_MATH)
                & (rows["dtype"] == "fp16")]
    both = [c for c, g in pair.groupby("commit") if set(g["variant"]) == {"retrieve", "retrieve_bound_launches"}]
    if not both:
        return ""
    run = in_time_order(pair[pair["commit"].isin(both)])
    run = run[run["commit"] == run["commit"].iloc[-1]]
    parts = []
    for batch, g in run.groupby("batch"):
        by = g.set_index("variant")
        if {"retrieve", "retrieve_bound_launches"} <= set(by.index):
            graph, bound = (float(by.loc[v, "seconds_median"]) * 1e3 for v in ("retrieve", "retrieve_bound_launches"))
            dev = float(by.loc["retrieve", "device_ms"])
            part = f"batch {int(batch)}: {graph:.3f} ms with the graph, {bound:.3f} ms launched one by one"
            if graph > bound:  # no launch cost left to remove: the device work already covers it
                part += (f" (the graph {100 * (graph / bound - 1):.1f} % slower: behind {dev:.3f} ms of device work "
                         "the launches' host time is already hidden, so the graph has nothing to save; one run)")
            parts.append(part)
    r = run.iloc[-1]
    return (f"- Everything after the match as one CUDA graph (`Pool(launches=\"auto\")`) against the same launches "
            f"one by one ({r['device']}, commit `{r['commit']}`, p50 wall): " + "; ".join(parts) + ".")


def findings(rows: pd.DataFrame) -> str:
    """What the newest run shows against the request path's targets, in numbers."""
    m = headline_metrics(rows)
    if "retrieve_1e8_p50_ms" not in m:
        return "No 10^8-ad `retrieve` rows are committed yet: run `python -m andromeda_nb.bench pipeline` on a GPU."
    t = newest(rows)
    one = _row(t, "retrieve", 1e8)

    def met(ok: bool) -> str:
        return "met" if ok else "**not met**"

    def run(variant, batch=1):  # each line's own run: the newest row of each case may come from another
        return f" ({_run_name(_row(t, variant, 1e8, batch))})"

    lines = [f"The newest verified row of each case ({one['device']}, each line's run named), 10^8-ad "
             f"benchmark world, gated E6 K2 fp16 d64, k = 1000, the default path ({DEFAULT_PATH_MATH} math).", ""]
    p50, ratio = m["retrieve_1e8_p50_ms"], m["retrieve_1e8_wall_over_device"]
    lines.append(f"- One request: p50 {p50:.3f} ms wall (target {TARGET_P50_S * 1e3:.1f} ms: "
                 f"{met(p50 <= TARGET_P50_S * 1e3)}), {ratio:.2f} x its {m['retrieve_1e8_device_ms']:.3f} ms of "
                 f"device time (target {TARGET_WALL_OVER_DEVICE}: {met(ratio <= TARGET_WALL_OVER_DEVICE)})"
                 f"{run('retrieve')}.")
    if "retrieve_1e8_batch32_requests_per_s" in m:
        rps = m["retrieve_1e8_batch32_requests_per_s"]
        lines.append(f"- Batches of 32: {rps:,.0f} requests/s (target {TARGET_REQUESTS_PER_S_AT_32:,}: "
                     f"{met(rps >= TARGET_REQUESTS_PER_S_AT_32)}){run('retrieve', 32)}.")
    if "score_sparse_1e8_device_us" in m:
        us, share = m["score_sparse_1e8_device_us"], _filter_share(t, _row(t, "score_sparse", 1e8))
        lines.append(f"- Sparse scoring of one request (~1 % of 10^8): {us:.0f} us of device time (target "
                     f"{TARGET_SPARSE_DEVICE_S * 1e6:.0f} us: {met(us <= TARGET_SPARSE_DEVICE_S * 1e6)})"
                     + (f"; the filter pass over the gathered rows takes {share:.0%} of it" if share == share else "")
                     + f"{run('score_sparse')}.")
    if "score_topk_1e8_device_over_wall" in m:
        f = m["score_topk_1e8_device_over_wall"]
        lines.append(f"- `score_topk` over the whole pool: the public call runs at {f:.2f} of its kernels' rate "
                     f"(target {TARGET_SCORE_TOPK_RATE}: {met(f >= TARGET_SCORE_TOPK_RATE)}; its device time over its "
                     f"wall time{run('score_topk')}).")
    int8 = int8_line(t, rows)
    if int8:
        lines.append(int8)
    graph = launches_line(rows)
    if graph:
        lines.append(graph)
    return "\n".join(lines)


def int8_line(t: pd.DataFrame, rows: pd.DataFrame | None = None) -> str:
    """The public calls on an int8 table (fp16 math) beside the fp16 table's, from :func:`newest`'s
    rows at 10^8 ads, each side's run named (the int8 / fp16 speed ratio only where one run timed
    both; given all ``rows``, the range over every pair that run timed, :func:`_run_pairs`); ''
    where no int8 row is committed."""
    parts = []
    for variant, batch, label in (("retrieve", 1, "one request"), ("retrieve", 32, "batches of 32"),
                                  ("score_topk", 1, "`score_topk`")):
        i8, f16 = _row(t, variant, 1e8, batch, dtype="int8"), _row(t, variant, 1e8, batch)
        if i8 is None:
            continue
        than = ""
        if f16 is not None:
            same = str(f16["commit"]) == str(i8["commit"])
            ratios = _run_pairs(rows, i8) if same and rows is not None else []
            spread = (f" ({min(ratios):.2f}-{max(ratios):.2f}x over the run's {len(ratios)} pairs)"
                      if len(ratios) > 1 else "")
            than = (f" (fp16 table{' in the same run' if same else ', ' + _run_name(f16)}: {f16['wall_ms']:.3f} ms, "
                    f"{f16['device_ms']:.3f} ms" + (f"; int8 / fp16 {f16['wall_ms'] / i8['wall_ms']:.2f}x by wall{spread}"
                                                    if same else "") + ")")
        rps = f" ({float(i8['requests_per_s']):,.0f} requests/s)" if batch > 1 else ""
        parts.append(f"{label} {i8['wall_ms']:.3f} ms p50 wall{rps}, {i8['device_ms']:.3f} ms device ({_run_name(i8)}){than}")
    return ("- On an int8 table (fp16 math), 10^8 ads: " + "; ".join(parts) + ".") if parts else ""
