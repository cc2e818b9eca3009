"""The live pool's tables and findings (the request-path notebook's last section), from the rows of
``data/results/pool.csv`` (``python -m andromeda_nb.bench pool``).

Variants: ``apply_end_to_end`` (:meth:`~andromeda_nb.pipeline.Pool.apply` of ``batch`` updates,
wall with a final sync; ``items_per_s`` = updates a second), ``apply_device`` (the same batch
sizes' device time), ``retrieve_alone`` / ``retrieve_during_updates`` (one request a call, alone
and while updates arrive at 100 K/s, same run) and ``soak`` (updates interleaved with requests,
checked at checkpoints).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .results import in_time_order, newest_commit

#: the live pool issue's targets (H200): updates a second end to end at batches of 10,000 and
#: 1,000, and request latency during updates against alone (p50, p99)
TARGET_UPDATES_PER_S = {10_000: 1_000_000, 1_000: 300_000}
TARGET_DURING_P50, TARGET_DURING_P99 = 1.2, 1.5


def _newest_run(rows: pd.DataFrame, variants) -> pd.DataFrame:
    """The verified rows of ``variants`` from the newest commit that wrote any of them."""
    r = rows[rows["variant"].isin(variants) & rows["ok"]]
    if r.empty:
        return r
    commit = newest_commit(r)
    return r[r["commit"] == commit]


def apply_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Updates a second against batch size and pool size (the newest run): end to end (wall with a
    final sync) and on the device alone, with the wall p50 / p99 of one batch."""
    r = _newest_run(rows, ["apply_end_to_end", "apply_device"])
    out = []
    for (n, batch), g in r.groupby(["n_ads", "batch"]):
        by = g.set_index("variant")
        e2e = by.loc["apply_end_to_end"] if "apply_end_to_end" in by.index else None
        dev = by.loc["apply_device"] if "apply_device" in by.index else None
        out.append({"n_ads": int(n), "batch": int(batch),
                    "updates_per_s": float(e2e["items_per_s"]) if e2e is not None else np.nan,
                    "device_updates_per_s": float(dev["items_per_s"]) if dev is not None else np.nan,
                    "wall_ms": float(e2e["seconds_median"]) * 1e3 if e2e is not None else np.nan,
                    "p99_ms": float(e2e["seconds_p99"]) * 1e3 if e2e is not None else np.nan,
                    "commit": g["commit"].iloc[0], "device": g["device"].iloc[0]})
    return pd.DataFrame(out, columns=["n_ads", "batch", "updates_per_s", "device_updates_per_s", "wall_ms",
                                      "p99_ms", "commit", "device"])


def apply_figure(table: pd.DataFrame, path: str):
    """Updates a second against batch size (log-log): end to end and the device's share (events
    around the batch's copies and kernels; where the host's staging outlasted the busy kernel ahead
    of them, host time too: an upper bound), a line per pool size, with the targets; ``path``: the
    table the rows come from."""
    import matplotlib.pyplot as plt

    from . import plots

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for n, g in table.groupby("n_ads"):
        g = g.sort_values("batch")
        ax.plot(g["batch"], g["updates_per_s"], marker="o", label=f"end to end, {n:,} slots")
        if g["device_updates_per_s"].notna().any():
            ax.plot(g["batch"], g["device_updates_per_s"], marker="s", ls="--",
                    label=f"device share (at most), {n:,} slots")
    for batch, target in TARGET_UPDATES_PER_S.items():
        ax.scatter([batch], [target], marker="*", s=160, c="k", zorder=5)
    ax.scatter([], [], marker="*", s=160, c="k", label="targets")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("updates a batch")
    ax.set_ylabel("updates a second")
    ax.set_title("Pool.apply: creates, changes and retires with their rows")
    ax.legend(fontsize=8)
    if len(table):
        plots.source_note(fig, f"measured on {table['device'].iloc[0]} (commit {table['commit'].iloc[0]}); {path}")
    fig.tight_layout()
    return fig


def during_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One request's latency alone and while updates stream in (the newest run), with the ratios
    the targets name."""
    r = _newest_run(rows, ["retrieve_alone", "retrieve_during_updates"])
    out = []
    for n, g in r.groupby("n_ads"):
        by = g.set_index("variant")
        if not {"retrieve_alone", "retrieve_during_updates"} <= set(by.index):
            continue
        a, u = by.loc["retrieve_alone"], by.loc["retrieve_during_updates"]
        p50a, p99a, p50u, p99u = (float(x) * 1e3 for x in (a["seconds_median"], a["seconds_p99"],
                                                            u["seconds_median"], u["seconds_p99"]))
        out.append({"n_ads": int(n), "alone_p50_ms": p50a, "alone_p99_ms": p99a, "during_p50_ms": p50u,
                    "during_p99_ms": p99u, "p50_ratio": p50u / p50a, "p99_ratio": p99u / p99a,
                    "updates": str(u["notes"]).split("; latency")[0], "commit": g["commit"].iloc[0]})
    return pd.DataFrame(out)


def soak_line(rows: pd.DataFrame) -> str:
    """The newest soak, passed or not, as one finding; '' when none is committed."""
    soak = rows[rows["variant"] == "soak"]
    if soak.empty:
        return ""
    r = in_time_order(soak).iloc[-1]
    verdict = "nothing lost" if r["ok"] else "**a mismatch**"
    return (f"- Soak ({r['device']}, commit `{r['commit']}`, {int(r['n_ads']):,} ads): {verdict}. "
            f"{r['notes']}. Checks: {r['verified']}")


def headline_metrics(rows: pd.DataFrame) -> dict:
    """The notebook's recorded numbers: end-to-end updates a second per batch size at the largest
    pool of the newest apply run, and the during-updates latency ratios."""
    out = {}
    t = apply_table(rows)
    if len(t):
        t = t[t["n_ads"] == t["n_ads"].max()]
        for _, r in t.iterrows():
            for key, col in (("updates_per_s", "updates_per_s"), ("device_updates_per_s", "device_updates_per_s")):
                if np.isfinite(r[col]):
                    out[f"apply_batch{int(r['batch'])}_{key}"] = float(r[col])
    d = during_table(rows)
    if len(d):
        r = d.iloc[-1]
        out.update(during_p50_ratio=float(r["p50_ratio"]), during_p99_ratio=float(r["p99_ratio"]))
    return out


def findings(rows: pd.DataFrame) -> str:
    """What the newest rows show against the live pool's targets, in numbers."""
    if rows.empty:
        return "No live-pool rows are committed yet: run `python -m andromeda_nb.bench pool` on a GPU."

    def met(ok: bool) -> str:
        return "met" if ok else "**not met**"

    lines = []
    t = apply_table(rows)
    if len(t):
        n = t["n_ads"].max()
        big = t[t["n_ads"] == n].set_index("batch")
        parts = ", ".join(f"{r['updates_per_s'] / 1e3:,.1f} K/s in batches of {b:,}"
                          + (f" (device alone {r['device_updates_per_s'] / 1e6:,.2f} M/s)"
                             if np.isfinite(r["device_updates_per_s"]) else "") for b, r in big.iterrows())
        verdicts = "; ".join(f"target {v / 1e6:g} M/s at {b:,}: "
                             + (met(big.loc[b, "updates_per_s"] >= v) if b in big.index else "not measured")
                             for b, v in TARGET_UPDATES_PER_S.items())
        lines.append(f"- `Pool.apply` end to end ({n:,}-slot pool, commit `{t['commit'].iloc[0]}`): {parts}. {verdicts}. "
                     "The host side (validation, slot allocation, the rules' diff into list entries, the copies "
                     "and launches) is most of it.")
    d = during_table(rows)
    if len(d):
        r = d.iloc[-1]
        lines.append(f"- One request while updates stream in ({int(r['n_ads']):,} ads): p50 {r['during_p50_ms']:.3f} ms "
                     f"against {r['alone_p50_ms']:.3f} alone ({r['p50_ratio']:.2f}x, target {TARGET_DURING_P50}: "
                     f"{met(r['p50_ratio'] <= TARGET_DURING_P50)}), p99 {r['during_p99_ms']:.3f} against "
                     f"{r['alone_p99_ms']:.3f} ({r['p99_ratio']:.2f}x, target {TARGET_DURING_P99}: "
                     f"{met(r['p99_ratio'] <= TARGET_DURING_P99)}); {r['updates']}.")
    soak = soak_line(rows)
    if soak:
        lines.append(soak)
    return "\n".join(lines) if lines else "No verified live-pool rows are committed yet."


def memory_per_ad(pool) -> dict:
    """Device bytes a slot of ``pool`` holds: the table (row words, bias, int8 scale and its fp16
    pairs where made, ad id) and the targeting index (bitset rows, posting lists), each divided by
    the pool's slots."""
    def nbytes(a) -> int:
        return int(getattr(a, "nbytes", 0) or 0) if a is not None else 0

    t, n = pool.table, pool.n_ads
    table = sum(nbytes(a) for a in (t.words, t.bias, t.ad_ids, t.kept_scale_pairs))
    table += nbytes(t.scale) if t.dtype == "int8" else 0
    index = 0
    if pool.index is not None:
        index = nbytes(pool.index.rows) + nbytes(pool.index.pool)
    return {"table": table / n, "index": index / n, "total": (table + index) / n}
