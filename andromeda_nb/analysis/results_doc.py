"""The measurement history and the README's headline table, generated from data/results/*.csv.

``python -m andromeda_nb.analysis.results_doc`` writes ``docs/results.md`` (every suite's rows,
newest run first, grouped by commit) and rewrites the README's block between
``<!-- headline:start -->`` and ``<!-- headline:end -->``. ``--check`` exits 1 when either is stale
(the tests run it): the numbers a reader sees are always the committed rows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from .results import REFERENCE_DEVICE, default_launches, in_time_order, load, text

SUITES = ("pipeline", "pool", "serving", "scoring", "topk", "targeting")
START, END = "<!-- headline:start -->", "<!-- headline:end -->"

#: (label, suite, filters, how to show it): the README's headline rows, the newest verified row of each
HEADLINE = (
    # the public calls in their default math (math="auto": fp16 math on the fp16 benchmark table and on
    # int8 tables; the int8 table's other rows are docs/results.md's)
    ("one request through `Pool.retrieve`, fp16 table, 10^8 ads, ~1 % eligible", "pipeline",
     dict(variant="retrieve", n_ads=1e8, batch=1, math="fp16", dtype="fp16"), "latency"),
    ("batches of 32 requests through `Pool.retrieve`, fp16 table, 10^8 ads", "pipeline",
     dict(variant="retrieve", n_ads=1e8, batch=32, math="fp16", dtype="fp16"), "throughput"),
    ("`score_topk` over the whole pool, fp16 table, 10^8 ads, top-1000", "pipeline",
     dict(variant="score_topk", n_ads=1e8, math="fp16", dtype="fp16"), "latency"),
    ("`score_topk` over the whole pool, int8 table (a scale a row), 10^8 ads, top-1000", "pipeline",
     dict(variant="score_topk", n_ads=1e8, math="fp16", dtype="int8"), "latency"),
    ("sparse scoring of one request's ~10^6 eligible ads (device)", "pipeline",
     dict(variant="score_sparse", n_ads=1e8, math="fp16", dtype="fp16"), "device"),
    ("batches of 32 requests, fp32 math (`KernelConfig(math=\"fp32\")`)", "pipeline",
     dict(variant="retrieve", n_ads=1e8, batch=32, math="fp32", dtype="fp16"), "throughput"),
    ("`Pool.apply` of 10,000 mixed updates, end to end", "pool",
     dict(variant="apply_end_to_end", batch=10_000), "updates"),
    ("dot product (two-tower), scores to memory", "scoring",
     dict(variant="dot_scores_to_memory", n_ads=1e8, dtype="fp16", d=64, layout="tiles", math="fp32"), "kernel"),
    ("gated E6 K2, scores to memory", "scoring",
     dict(variant="gated_scores_to_memory", n_ads=1e8, dtype="fp16", d=64, experts=6, k_experts=2, layout="tiles",
          math="fp32"), "kernel"),
    ("gated E6 K2, fp16 math on the tensor cores, scores to memory", "scoring",
     dict(variant="gated_scores_to_memory", n_ads=1e8, dtype="fp16", d=64, experts=6, k_experts=2, layout="tiles",
          math="fp16"), "kernel"),
    ("gated E6 K2, fp16 math, fused top-1000 (seeded filter path)", "scoring",
     dict(variant="gated_fused_topk_filter", n_ads=1e8, dtype="fp16", d=64, experts=6, k_experts=2, layout="tiles",
          access="pool", k=1000, math="fp16"), "kernel"),
    ("top-K of 10^8 scores in random order, k = 1000", "topk",
     dict(variant="block_topk_seeded", n_ads=1e8, k=1000, access="random"), "kernel"),
    ("targeting match, one request, 10^8 ads, 20 categories", "targeting",
     dict(variant="match_U8_b256", n_ads=1e8), "kernel"),
)


def _pick(df: pd.DataFrame, filters: dict) -> pd.Series | None:
    rows = default_launches(df[df["ok"]])
    for col, want in filters.items():
        if col == "math":  # rows from before the math column are fp32
            rows = rows[rows[col].isin(["", want])] if col in rows else (rows if want == "fp32" else rows.iloc[0:0])
            continue
        if col not in rows:
            return None
        if isinstance(want, str):
            rows = rows[rows[col] == want]
        else:
            rows = rows[np.isclose(rows[col].astype(float), want, rtol=1e-3)]  # 10^8 + spare slots
    if rows.empty:
        return None
    on_reference = rows[text(rows, "device").str.contains(REFERENCE_DEVICE)]
    return in_time_order(on_reference if len(on_reference) else rows).iloc[-1]


def _num(row, col) -> float:
    v = row.get(col, "")
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _cell(row: pd.Series, how: str) -> str:
    wall, p99, dev = _num(row, "seconds_median"), _num(row, "seconds_p99"), _num(row, "device_seconds")
    frac = _num(row, "fraction_of_read_ceiling")
    if how == "latency":
        return (f"{wall * 1e3:.3f} ms p50, {p99 * 1e3:.3f} ms p99 wall; {dev * 1e3:.3f} ms device "
                f"(wall / device {wall / dev:.2f})")
    if how == "throughput":
        return f"{_num(row, 'requests_per_s'):,.0f} requests/s; {wall * 1e3:.2f} ms a batch, {dev * 1e3:.2f} ms device"
    if how == "updates":
        device = f", {dev * 1e3:.2f} ms device" if np.isfinite(dev) else ""
        return (f"{_num(row, 'items_per_s') / 1e3:,.0f} K updates/s ({int(_num(row, 'n_ads')):,}-slot pool); "
                f"{wall * 1e3:.1f} ms a batch{device}")
    if how == "device":
        return f"{dev * 1e6:.0f} us, {_num(row, 'items_per_s') / 1e9:.2f} G ads/s"
    return f"{_num(row, 'items_per_s') / 1e9:.1f} G items/s, {frac:.2f} of the read ceiling"


def headline(results_dir: str | Path = "data/results") -> str:
    """The README's headline table (markdown): the newest verified row of each headline case."""
    tables = {s: load(s, results_dir) for s in SUITES if (Path(results_dir) / f"{s}.csv").exists()}
    lines = ["| case | measured | device, date |", "| --- | --- | --- |"]
    for label, suite, filters, how in HEADLINE:
        row = _pick(tables[suite], filters) if suite in tables else None
        if row is None:
            lines.append(f"| {label} | not measured | |")
            continue
        lines.append(f"| {label} | {_cell(row, how)} | {row['device']}, {str(row['timestamp'])[:10]} |")
    return "\n".join(lines)


_COLUMNS = ("variant", "n_ads", "batch", "d", "dtype", "experts", "k_experts", "layout", "math", "dequant", "path",
            "launch", "access",
            "eligible_fraction", "k", "seconds_median", "seconds_p99", "device_seconds", "items_per_s",
            "requests_per_s", "n_workers", "transport_bytes_per_request", "fraction_of_read_ceiling", "verified")


def _fmt(v) -> str:
    if isinstance(v, float):
        if np.isnan(v):
            return ""
        return f"{v:.4g}"
    s = str(v)
    return s.replace("|", "/")[:60]


def _notes(rows: pd.DataFrame) -> pd.Series:
    """Each row's notes as text ('' where a row or the frame has none)."""
    return text(rows, "notes")


def _dequant(rows: pd.DataFrame, unsaid: str = "mul") -> pd.Series:
    """How fp16 math dequantized int8 rows, as the notes say (``dequant=fma``: one fused multiply-add
    a pair; ``dequant=mul``: a subtract and a multiply); notes that do not say: ``unsaid`` (the scoring
    suite's ``mul``, the only way before the fused one; '' where a suite did not record it); '' for
    other rows."""
    if not {"dtype", "math"} <= set(rows.columns):
        return pd.Series("", index=rows.index)
    notes = _notes(rows)
    int8_fp16 = (rows["dtype"].astype(str) == "int8") & (rows["math"].astype(str) == "fp16")
    said = notes.str.extract(r"dequant=(fma|mul)", expand=False).fillna(unsaid)
    return pd.Series(np.where(int8_fp16, said, ""), index=rows.index)


#: the launch settings a scoring row's notes name (``block=256 maxreg=128 blocks/SM=3 ...``)
_LAUNCH = r"\b(?:block|maxreg|blocks/SM|weights|f16_weights|rows_ahead|ring_stages|guard|sync_every|tile_order|row_scales|loop)=[^\s;]+"


def _launch(rows: pd.DataFrame) -> pd.Series:
    """The launch settings in each row's notes (the ``launch`` column: rows of one run that differ
    only there), '' where none."""
    return _notes(rows).str.findall(_LAUNCH).str.join(" ").str.rstrip(";,")


def history(results_dir: str | Path = "data/results") -> str:
    """docs/results.md: every suite's rows, newest run first, a table a commit."""
    out = ["# Measurement history", "",
           "Generated from `data/results/*.csv` by `python -m andromeda_nb.analysis.results_doc`; do not edit.",
           "Every row is one measured case of one run (docs/design.md, \"Results tables\"); `verified` says how",
           "the row checked its own output. Columns left out here are in the CSV (notes, p20 / p80, versions).", ""]
    for suite in SUITES:
        path = Path(results_dir) / f"{suite}.csv"
        if not path.exists():
            continue
        df = load(suite, results_dir)
        out += [f"## {suite}", ""]
        runs = (df.assign(_t=df["timestamp"]).groupby("commit", sort=False)["_t"].max()
                .sort_values(ascending=False))
        for commit, when in runs.items():
            rows = df[(df["commit"] == commit) & ~df["variant"].str.startswith("ceiling")]
            if rows.empty:
                continue
            device = rows["device"].iloc[0]
            ceil = df[(df["commit"] == commit) & (df["variant"] == "ceiling_read_cupy_sum")]["achieved_TBps"]
            ceil_txt = f", read ceiling {float(ceil.iloc[0]):.2f} TB/s" if len(ceil) else ""
            out += [f"### {suite} at `{commit}` ({device}, {str(when)[:10]}{ceil_txt})", ""]
            rows = rows.assign(dequant=_dequant(rows, "mul" if suite == "scoring" else ""), launch=_launch(rows))
            cols = [c for c in _COLUMNS if c in rows and rows[c].astype(str).str.len().gt(0).any()]
            out.append("| " + " | ".join(cols) + " |")
            out.append("| " + " | ".join("---" for _ in cols) + " |")
            for _, r in rows.iterrows():
                out.append("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _with_headline(readme: str, table: str) -> str:
    if START not in readme or END not in readme:
        raise ValueError(f"the README has no {START} ... {END} block")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}\n{END}{tail}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m andromeda_nb.analysis.results_doc", description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".", help="the repository root")
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/results.md or the README is stale")
    args = ap.parse_args(argv)
    root = Path(args.root)
    results = root / "data" / "results"
    doc, readme_path = root / "docs" / "results.md", root / "README.md"
    if not (results.is_dir() and readme_path.is_file()):
        ap.error(f"--root {args.root} is not the repository's root (it needs data/results/ and README.md)")
    want_doc = history(results)
    want_readme = _with_headline(readme_path.read_text(), headline(results))
    stale = [str(p) for p, want in ((doc, want_doc), (readme_path, want_readme))
             if not p.exists() or p.read_text() != want]
    if args.check:
        if stale:
            print("stale (run python -m andromeda_nb.analysis.results_doc): " + ", ".join(stale), file=sys.stderr)
            return 1
        return 0
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(want_doc)
    readme_path.write_text(want_readme)
    print(f"from {results}/*.csv: " + ("rewrote " + ", ".join(stale) if stale else
                                      f"{doc} and the README's headline already match"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
