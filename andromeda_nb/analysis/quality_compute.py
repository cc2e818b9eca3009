"""Compute per ad for the quality experiments' rows (:func:`~.quality.compute_rows`): the gated
model's FLOPs and bytes per ad, and the fused kernel's measured ads/s from the scoring results."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .results import default_launches, text

SCORING = Path("data/results/scoring.csv")


def gated_flops(d: int, E: int, K: int, all_values: bool) -> int:
    """FLOPs per ad (a multiply-add counts 2): encode 2d, gate 2Ed, values 2Kd (2Ed in the kernel,
    which computes every expert's value), softmax ~4E, combine 2K (as bench_suites.gated_flops)."""
    return 2 * d + 2 * E * d + 2 * (E if all_values else K) * d + 4 * E + 2 * K


def bytes_per_ad(d: int, dtype: str) -> int:
    """Row + fp32 bias (+ fp32 scale for int8): what the kernel reads per ad."""
    size = {"fp32": 4, "fp16": 2, "fp16_math": 2, "bf16": 2, "int8": 1, "int8_fp16_math": 1, "int8_dimscale": 1}[dtype]
    return d * size + 4 + (4 if dtype.startswith("int8") else 0)


def kernel_throughput(scoring_csv=SCORING, keys=None) -> pd.DataFrame:
    """The fused kernel's ads/s per (dtype, d, experts, k_experts) over the whole pool (``access ==
    pool``, fused top-K), from the newest run that measured that key (its fastest verified row there:
    the block or the filter path), with the device and commit of that run; the fp16 math mode's rows
    as dtype ``fp16_math`` (fp16 tables) or ``int8_fp16_math``; empty when the file is missing.
    Rates of two keys compare only where their ``commit`` is the same (one run). With ``keys`` (an
    iterable of such tuples) every rate comes from one run instead: the run that measured the most
    of them (the newest of a tie), with the keys it measured."""
    path = Path(scoring_csv)
    cols = ["dtype", "d", "experts", "k_experts", "items_per_s", "flops_per_item", "device", "commit"]
    if not path.is_file():
        return pd.DataFrame(columns=cols)
    df = pd.read_csv(path, dtype={"commit": str, "timestamp": str})  # a commit of digits stays text
    need = {"variant", "dtype", "d", "experts", "k_experts", "access", "items_per_s"}
    if not need <= set(df.columns):
        return pd.DataFrame(columns=cols)
    # fp32 math rows by storage dtype; the fp16 math mode's rows as "fp16_math" (fp16 tables) and
    # "int8_fp16_math"
    math = text(df, "math").replace("", "fp32")
    plain = df[df["variant"].isin(["gated_fused_topk", "gated_fused_topk_filter", "tower_fused_topk"]) & (math == "fp32")]
    half = df[df["variant"].isin(["gated_fused_topk", "gated_fused_topk_filter"]) & (math == "fp16")]
    df = pd.concat([plain, half.assign(dtype=half["dtype"].map({"fp16": "fp16_math", "int8": "int8_fp16_math"}))])
    df = default_launches(df[df["access"] == "pool"])
    if "verified" in df.columns:
        df = df[df["verified"].astype(str).str.startswith("ok")]
    if "device" not in df.columns:
        df = df.assign(device="")
    if "flops_per_item" not in df.columns:
        df = df.assign(flops_per_item=np.nan)
    df = df.dropna(subset=["d", "experts", "k_experts"])
    # a row (or a table) that does not say is a run of its own kind
    df = df.assign(commit=text(df, "commit"), timestamp=text(df, "timestamp"))
    df = df.astype({"d": int, "experts": int, "k_experts": int})
    key = ["dtype", "d", "experts", "k_experts"]
    # a run is a commit; its time, the newest row it wrote
    run_time = df.groupby("commit")["timestamp"].transform("max")
    if keys is not None:  # the one run that measured the most of ``keys`` (the newest of a tie)
        keys = set(map(tuple, keys))
        wanted = df[[tuple(k) in keys for k in df[key].to_numpy()]]
        if len(wanted):
            n = wanted.drop_duplicates(["commit", *key]).groupby("commit").size()
            t = df.groupby("commit")["timestamp"].max().reindex(n.index)
            run = pd.DataFrame({"n": n, "t": t}).sort_values(["n", "t"]).index[-1]
            one = df[df["commit"] == run].sort_values("items_per_s").groupby(key, as_index=False).last()
            return one[cols]
        return pd.DataFrame(columns=cols)
    newest = run_time == df.assign(_t=run_time).groupby(key)["_t"].transform("max")
    best = df[newest].sort_values("items_per_s").groupby(key, as_index=False).last()
    return best[cols]
