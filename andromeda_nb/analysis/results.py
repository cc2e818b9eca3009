"""Read the committed GPU result tables (data/results/<suite>.csv) and draw their standard figures.

Notebooks plot from these tables on machines without a GPU; every figure states the device the
numbers came from (:func:`provenance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

NUMERIC = ("n_ads", "d", "experts", "k_experts", "eligible_fraction", "categories", "k", "batch", "seconds_median",
           "seconds_p20", "seconds_p80", "items_per_s", "bytes_per_item", "flops_per_item", "achieved_TBps",
           "ceiling_read_TBps", "ceiling_copy_TBps", "fraction_of_read_ceiling", "host_seconds_per_call")


#: what the notes of a scoring row measured off the default launch say (bench.scoring.config_note: the
#: tile-order, shared fp16 weight, rows-ahead, ring and scale-pair experiments, an occupancy set by hand); a regular expression. Such
#: rows are history, never a headline or a report's rate
EXPERIMENT = r"tile_order=|f16_weights=|rows_ahead=|ring_stages=|row_scales=|blocks/SM=|loop="


def default_launches(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows measured at the default launch (none of :data:`EXPERIMENT`'s settings in their notes):
    the rows a headline, a report's figure or a rate may come from."""
    return rows[~text(rows, "notes").str.contains(EXPERIMENT)]


def text(rows: pd.DataFrame, col: str) -> pd.Series:
    """Column ``col`` as strings, '' where a row (or the whole frame) has none. A column read from CSV
    with no values at all is float NaN; it is cast to object first, since filling a float column with
    a string is deprecated in pandas."""
    if col not in rows:
        return pd.Series("", index=rows.index, dtype=object)
    return rows[col].astype(object).fillna("").astype(str)


def load(suite: str, results_dir: str | Path = "data/results") -> pd.DataFrame:
    """The suite's table with numeric columns as numbers and a boolean ``ok`` (verified passed).

    Raises:
        FileNotFoundError: no committed table for that suite.
    """
    path = Path(results_dir) / f"{suite}.csv"
    if not path.exists():
        raise FileNotFoundError(f"no results table {path}; run `python -m andromeda_nb.bench {suite}` on a GPU")
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    for col in NUMERIC:
        if col in df:
            df[col] = pd.to_numeric(df[col].replace("", np.nan), errors="coerce")
    df["ok"] = df["verified"].str.startswith("ok")
    # the math mode: rows from before the column (and the rows it does not apply to) are fp32
    df["math"] = df["math"].replace("", "fp32") if "math" in df else "fp32"
    df["regression_flag"] = text(df, "notes").str.contains("REGRESSION")
    return df


@dataclass(frozen=True)
class Measurements:
    """One suite's committed table, split for the notebooks.

    Attributes:
        table: every row (:func:`load`), the ceiling rows included.
        rows: the measured cases (variants not starting with ``ceiling``).
        path: the file read.
    """

    table: pd.DataFrame
    rows: pd.DataFrame
    path: str

    @property
    def source(self) -> str:
        """The provenance line of the measured rows (:func:`provenance`)."""
        return provenance(self.rows, self.path)

    @property
    def read_TBps(self) -> float:
        """The read ceiling measured in the table's runs on one card (:func:`one_device`; median, TB/s)."""
        return ceilings(one_device(self.table))["read"]


def measurements(suite: str, results_dir: str | Path = "data/results") -> Measurements:
    """:func:`load` the suite's table and split off the ceiling rows.

    Raises:
        FileNotFoundError: no committed table for that suite.
    """
    table = load(suite, results_dir)
    rows = table[~table["variant"].str.startswith("ceiling")].copy()
    return Measurements(table, rows, f"{Path(results_dir).as_posix()}/{suite}.csv")


#: the card the issues' targets name: a figure or headline that must show one card's rows shows this
#: one's wherever it has them (a later run on another card stays in the history)
REFERENCE_DEVICE = "H200"


def one_device(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of one card (one device name), so that no figure puts two cards' points under one
    ceiling: of the reference device's names (:data:`REFERENCE_DEVICE`, a word of the name: not
    GH200) the one with the most rows, else the name with the most rows."""
    device = text(df, "device")
    if df.empty:
        return df
    reference = device[device.str.contains(rf"\b{REFERENCE_DEVICE}\b")]
    return df[device == (reference if len(reference) else device).value_counts().idxmax()]


def in_time_order(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` oldest first by ``timestamp``. A run stamps all its rows with one time, so a stable
    sort keeps them in the order they were written: the last row of a case is its newest, whatever
    other rows sit around it."""
    return rows.sort_values("timestamp", kind="stable")


def newest_commit(rows: pd.DataFrame):
    """The commit (run) of the newest of ``rows`` (:func:`in_time_order`)."""
    return in_time_order(rows)["commit"].iloc[-1]


def provenance(df: pd.DataFrame, path: str) -> str:
    """One line for a figure: device(s), commit(s) and the table the numbers come from. Past three
    commits it names the oldest and newest (by timestamp) and how many there are, so the line stays
    shorter than the figure is wide."""
    devices = ", ".join(sorted(set(text(df, "device")) - {""}))
    order = in_time_order(df) if "timestamp" in df else df
    commits = list(dict.fromkeys(c for c in (str(c)[:7] for c in order["commit"]) if c))  # short, oldest first
    named = ", ".join(sorted(commits)) if len(commits) <= 3 else f"{commits[0]} ... {commits[-1]}, {len(commits)} commits"
    return f"measured on {devices} (commit {named}); {path}"


def ceilings(df: pd.DataFrame) -> dict:
    """The read and copy ceilings (TB/s) measured in the table's runs (median over runs)."""
    return {"read": float(df["ceiling_read_TBps"].median()), "copy": float(df["ceiling_copy_TBps"].median())}


def newest(df: pd.DataFrame, variants, keys=("variant", "n_ads", "k"), **fixed) -> pd.DataFrame:
    """The verified rows (and baseline rows, verified by the rows they accompany) of ``variants``
    whose columns equal ``fixed`` (e.g. ``access="random"``), the newest row of each ``keys``
    combination (a later run replaces an earlier one, not the best of several), sorted by ``keys``."""
    variants = [variants] if isinstance(variants, str) else list(variants)
    keys = [keys] if isinstance(keys, str) else list(keys)
    sel = df[df["variant"].isin(variants) & (df["ok"] | df["verified"].str.startswith("baseline"))]
    for col, value in fixed.items():
        sel = sel[sel[col] == value]
    return in_time_order(sel).drop_duplicates(keys, keep="last").sort_values(keys)


def roofline(ax, df: pd.DataFrame, label_col: str = "variant", peak_tflops: float = 67.0):
    """Achieved FLOP/s against arithmetic intensity (FLOPs per byte moved), with the measured read
    ceiling and the fp32 FMA peak (``peak_tflops``, H100/H200 SXM datasheet: 67 TFLOP/s) as roofs.

    One point per row with both ``flops_per_item`` and ``bytes_per_item``.
    """
    from . import plots

    rows = df.dropna(subset=["flops_per_item", "bytes_per_item", "items_per_s"])
    bw = ceilings(df)["read"] * 1e12
    x = np.logspace(-1, 3, 200)
    ax.loglog(x, np.minimum(x * bw, peak_tflops * 1e12) / 1e12, color="0.3", lw=1.2, label="roof (read ceiling, fp32 FMA peak)")
    groups = list(rows.groupby(label_col))
    colors = plots.categorical_colors(len(groups))  # a colour a group, in the style's palette
    for (name, g), color in zip(groups, colors):
        ai = g["flops_per_item"] / g["bytes_per_item"]
        ax.loglog(ai, g["items_per_s"] * g["flops_per_item"] / 1e12, "o", label=name, alpha=0.85, color=color)
    ax.set(xlabel="arithmetic intensity (FLOP / byte moved)", ylabel="achieved TFLOP/s")
    ax.axvline(peak_tflops * 1e12 / bw, color="0.6", ls=":", lw=1)
    return ax
