"""The quality experiments' results file, ``data/results/quality.csv``: its columns, merging rows
into it, reading it back, the tables and intervals the notebooks show from it, and the overlap rows
of models trained in separate processes (the rows are described in :mod:`.quality`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .metrics import topk_overlap

DATASETS = ("multi_interest", "ml-100k")
COLUMNS = ["dataset", "model", "experts", "k_experts", "dtype", "d", "seed", "metric", "value",
           "commit", "device", "experiment", "preset", "scorer", "n_users", "targeting"]
KEY = ["dataset", "model", "experts", "k_experts", "dtype", "d", "seed", "metric", "experiment", "preset"]
RESULTS = Path("data/results/quality.csv")

#: metrics of what a model retrieved (the rest: compute, training, score errors)
_RETRIEVAL_METRIC = ("recall@", "validation_recall@", "overlap@", "routing_", "expert_share")


def targeting_of(metric: str) -> str:
    """A row's ``targeting`` column: ``off`` for a metric retrieved from every unseen ad
    (``..._untargeted``), ``on`` for one retrieved from the eligible ads, ``""`` for a metric of no
    retrieval."""
    metric = str(metric)
    if metric.endswith("_untargeted"):
        return "off"
    return "on" if metric.startswith(_RETRIEVAL_METRIC) else ""


def write_rows(frame: pd.DataFrame, path=RESULTS) -> Path:
    """Merge rows into a results CSV: rows with the same key (:data:`KEY`) are replaced, except that
    a kept row equal to its new one in every column but ``commit`` stays as it was (a rerun that
    reproduces it, such as the compute rows every training run refreshes, does not restamp the
    committed table); the ``targeting`` column is set from each row's metric (:func:`targeting_of`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = frame.reindex(columns=COLUMNS)

    def ints(df):  # "6.0" -> "6" in integer columns, so keys compare equal however they were read
        df = df.copy()
        for c in ("experts", "k_experts", "d", "seed", "n_users"):
            df[c] = [str(int(float(v))) if v not in ("", "nan", "None") else "" for v in df[c].astype(str)]
        return df

    if path.is_file():
        old = ints(pd.read_csv(path, dtype=str, keep_default_na=False).reindex(columns=COLUMNS, fill_value=""))
        new = ints(frame.astype(object).where(frame.notna(), "").astype(str))
        new["targeting"] = [targeting_of(m) for m in new["metric"]]
        same = [c for c in COLUMNS if c != "commit"]
        kept = set(map(tuple, old[same].to_numpy()))
        new = new[[tuple(r) not in kept for r in new[same].to_numpy()]]  # reproduced: the old row stays
        key_new = set(map(tuple, new[KEY].to_numpy()))
        old = old[[tuple(r) not in key_new for r in old[KEY].to_numpy()]]
        merged = pd.concat([old, new], ignore_index=True)
    else:
        merged = ints(frame.astype(object).where(frame.notna(), "").astype(str))
    merged["targeting"] = [targeting_of(m) for m in merged["metric"]]  # derived: whatever a caller or file held
    merged = merged.sort_values(["dataset", "metric", "model", "dtype", "seed"], kind="mergesort")
    tmp = path.with_suffix(".csv.tmp")
    merged.to_csv(tmp, index=False)
    os.replace(tmp, path)
    return path


def join_rows(paths, path) -> Path:
    """Merge the rows of several quality CSVs (e.g. one a seed, trained in parallel processes) into
    ``path`` (:func:`write_rows`): a key held by more than one of them (the true model's rows, the
    compute rows, which every run writes) keeps the last file's row."""
    frames = [pd.read_csv(p, dtype=str, keep_default_na=False) for p in paths]
    if not frames:
        raise ValueError("no quality CSVs to join")
    return write_rows(pd.concat(frames, ignore_index=True).drop_duplicates(KEY, keep="last"), path)


def load_results(path=RESULTS) -> pd.DataFrame:
    """The quality CSV with typed columns (empty frame with COLUMNS when missing)."""
    path = Path(path)
    if not path.is_file():
        return pd.DataFrame(columns=COLUMNS)
    df = pd.read_csv(path)
    df["value"] = pd.to_numeric(df["value"], errors="coerce")
    if "experiment" not in df.columns or df["experiment"].isna().any():
        df = _infer_experiment(df)
    df["targeting"] = [targeting_of(m) for m in df["metric"]]
    return df.reindex(columns=[*COLUMNS, *[c for c in df.columns if c not in COLUMNS]])


_COMPUTE_METRICS = {"flops_per_ad", "kernel_flops_per_ad", "kernel_ads_per_s"}
_PRECISION_METRICS = {"recall@100_delta_pp", "overlap@100_fp32", "score_err_p50", "score_err_p99",
                      "score_err_p999", "score_err_max", "recall@100_delta_pp_same_storage", "overlap@100_same_storage"}


def _infer_experiment(df: pd.DataFrame) -> pd.DataFrame:
    """Fill a missing ``experiment`` column (files written before it existed): compute metrics,
    precision metrics, ``bytes_per_ad`` without a seed = compute; a non-fp32 ``recall@100`` and the
    second of two identical-key fp32 ``recall@100`` rows = precision; the rest = expert_count."""
    df = df.copy()
    exp = df["experiment"] if "experiment" in df.columns else pd.Series(np.nan, index=df.index)
    seed_empty = df["seed"].isna() | (df["seed"].astype(str) == "")
    guess = np.where(df["metric"].isin(_COMPUTE_METRICS) | ((df["metric"] == "bytes_per_ad") & seed_empty), "compute",
                     np.where(df["metric"].isin(_PRECISION_METRICS) | (df["metric"] == "bytes_per_ad"), "precision",
                              "expert_count"))
    guess = pd.Series(guess, index=df.index)
    rec = (df["metric"] == "recall@100") & ~df["model"].isin(GENERATOR_MODELS)
    guess[rec & (df["dtype"].astype(str) != "fp32")] = "precision"
    keys = ["dataset", "model", "dtype", "seed", "metric", "preset"]
    dup = rec & (df["dtype"].astype(str) == "fp32") & df[keys].astype(str).duplicated(keep="first")
    guess[dup] = "precision"
    df["experiment"] = exp.where(exp.notna(), guess)
    return df


def summarize(frame: pd.DataFrame, metrics=None) -> pd.DataFrame:
    """Mean, standard deviation and count over seeds per (dataset, model, dtype, metric)."""
    df = frame if metrics is None else frame[frame["metric"].isin(metrics)]
    g = df.groupby(["dataset", "model", "dtype", "metric"], dropna=False)["value"]
    return g.agg(mean="mean", std="std", seeds="count").reset_index()


MODEL_ORDER = ("single_tower", "mixture_k1", "mixture_k2", "mixture_k4", "dense_mixture", "ranking", "true_model",
               "true_model_estimated")
#: the synthetic world's generator as a model: with each user's own interests, and with them
#: estimated from the training clicks (no training, one row a metric, seed empty)
GENERATOR_MODELS = ("true_model", "true_model_estimated")
#: the project's trained models (MODEL_ORDER without the generator)
PROJECT_MODELS = tuple(m for m in MODEL_ORDER if m not in GENERATOR_MODELS)
#: the standard baselines' rows (:func:`.quality.run_baselines`), in the tables' order
BASELINE_ORDER = ("baseline_most_popular", "baseline_itemknn_cosine", "baseline_itemknn_bm25", "baseline_als",
                  "baseline_bpr", "baseline_ease")


def ci95(std, n):
    """Half-width of the 95 % confidence interval of a mean of ``n`` values with sample standard
    deviation ``std`` (Student's t); NaN below two values."""
    from scipy import stats

    n = np.asarray(n, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        half = stats.t.ppf(0.975, np.maximum(n - 1, 1)) * np.asarray(std, float) / np.sqrt(n)
    return np.where(n >= 2, half, np.nan)


def recall_table(frame: pd.DataFrame, dataset: str, metric: str = "recall@100", baselines: bool = True) -> pd.DataFrame:
    """``model x (mean, std, seeds, ci95)`` of one metric (fp32 tables; ``ci95``: the mean's 95 %
    interval half-width, :func:`ci95`): the project's models in :data:`MODEL_ORDER`, then
    (``baselines``) the standard baselines in :data:`BASELINE_ORDER`."""
    experiments = ("expert_count", "baselines") if baselines else ("expert_count",)
    df = frame[(frame["dataset"] == dataset) & (frame["metric"] == metric) & frame["experiment"].isin(experiments)]
    s = df.groupby("model")["value"].agg(mean="mean", std="std", seeds="count")
    s["ci95"] = ci95(s["std"], s["seeds"])
    return s.reindex([m for m in MODEL_ORDER + BASELINE_ORDER if m in s.index])


def paired_difference(frame: pd.DataFrame, dataset: str, a: str, b: str, metric: str = "recall@100",
                      experiments=("expert_count", "baselines")) -> dict:
    """Model ``a`` minus model ``b`` on the seeds both ran (each seed: the same split and evaluated
    users for both) among the rows of ``experiments``: ``mean`` and ``ci95`` (the 95 % interval
    half-width of the mean paired difference) and ``seeds``."""
    df = frame[(frame["dataset"] == dataset) & (frame["metric"] == metric) & frame["experiment"].isin(experiments)]
    df = df.assign(value=pd.to_numeric(df["value"], errors="coerce"))  # a frame read as strings too
    return _paired(df[df["model"] == a].groupby("seed")["value"].mean(),
                   df[df["model"] == b].groupby("seed")["value"].mean())


def paired_experiments(frame: pd.DataFrame, dataset: str, model: str, a: str, b: str,
                       metric: str = "recall@100") -> dict:
    """``model``'s rows of experiment ``a`` minus its rows of experiment ``b`` (e.g. a changed
    setting against ``preset_settings``) on the seeds both ran: as :func:`paired_difference`, with
    ``a`` and ``b``, each side's mean over those seeds. Rows of one preset only (ValueError
    otherwise: seeds of different worlds do not pair)."""
    df = frame[(frame["dataset"] == dataset) & (frame["metric"] == metric) & (frame["model"] == model)
               & frame["experiment"].isin((a, b))]
    one_preset(df)
    value = pd.to_numeric(df["value"])
    return _paired(value[df["experiment"] == a].groupby(df["seed"]).mean(),
                   value[df["experiment"] == b].groupby(df["seed"]).mean())


#: experiments whose rows other runs write: not a name for a model's trained rows
_RESERVED_EXPERIMENTS = ("precision", "compute", "baselines")


def check_experiment(name: str) -> str:
    """``name`` as the experiment of a run's trained and validation rows (lower case, digits and
    ``_``; not one of the precision, compute or baselines rows'), else ValueError."""
    if not isinstance(name, str) or re.fullmatch(r"[a-z][a-z0-9_]*", name) is None or name in _RESERVED_EXPERIMENTS:
        raise ValueError(f"an experiment name is lower case letters, digits and _, not one of "
                         f"{_RESERVED_EXPERIMENTS}, got {name!r}")
    return name


def relabel(frame: pd.DataFrame, experiment: str) -> pd.DataFrame:
    """``frame`` with a named run's rows set apart from the main table's: its project models'
    ``expert_count`` rows become ``experiment``, its ``precision`` rows (the K = 2 mixture's
    precision measurements) ``<experiment>_precision``; the generator models' rows (every run
    reproduces them) and the ``compute`` rows (the shapes' costs, the same whatever was trained)
    stay. Rows trained at another split or changed settings then sit beside the main table's
    instead of replacing them (:data:`KEY` holds the experiment). ``"expert_count"`` changes
    nothing."""
    experiment = check_experiment(experiment)
    if experiment == "expert_count":
        return frame
    frame = frame.copy()
    own = ~frame["model"].isin(GENERATOR_MODELS)
    for kind, name in (("expert_count", experiment), ("precision", f"{experiment}_precision")):
        frame.loc[own & (frame["experiment"] == kind), "experiment"] = name
    return frame


def one_preset(rows: pd.DataFrame) -> None:
    """Raise ValueError where ``rows`` hold several presets' rows (different worlds and users)."""
    if "preset" in rows and rows["preset"].nunique() > 1:
        raise ValueError(f"rows of several presets ({sorted(rows['preset'].astype(str).unique())}): "
                         "pass one preset's rows")


def _paired(va: pd.Series, vb: pd.Series) -> dict:
    """``va - vb`` (per-seed values) on the seeds both hold: ``mean``, ``ci95`` (:func:`ci95`), ``seeds``,
    and ``a`` and ``b``, the means of ``va`` and ``vb`` over those seeds."""
    d = (va - vb).dropna()
    std = float(d.std()) if d.size > 1 else float("nan")
    return {"mean": float(d.mean()) if d.size else float("nan"), "ci95": float(ci95(std, d.size)), "seeds": int(d.size),
            "a": float(va[d.index].mean()) if d.size else float("nan"),
            "b": float(vb[d.index].mean()) if d.size else float("nan")}


def tuning_effect(frame: pd.DataFrame, dataset: str, metric: str = "recall@100") -> pd.DataFrame:
    """Per model with both kinds of rows: the tuned model (``expert_count``) minus the same model at
    the preset's settings (``preset_settings``), paired on the seeds both ran (the same split and
    users): ``tuned``, ``preset`` (means over those seeds), ``mean`` and ``ci95`` of the difference,
    ``seeds``. Empty where no model has both. Tuned rows are those whose ``scorer`` says so; rows of
    one preset only (ValueError otherwise: seeds of different worlds do not pair)."""
    df = frame[(frame["dataset"] == dataset) & (frame["metric"] == metric)]
    one_preset(df)
    tuned_rows = (df["experiment"] == "expert_count") & df["scorer"].astype(str).str.startswith("tuned")
    out = {}
    for model in [m for m in MODEL_ORDER if m in set(df["model"])]:
        tuned = df[(df["model"] == model) & tuned_rows].groupby("seed")["value"].mean()
        preset = df[(df["model"] == model) & (df["experiment"] == "preset_settings")].groupby("seed")["value"].mean()
        both = (tuned - preset).dropna().index  # the seeds the difference pairs
        if len(both):
            out[model] = dict(tuned=float(tuned[both].mean()), preset=float(preset[both].mean()),
                              **_paired(tuned, preset))
    return pd.DataFrame.from_dict(out, orient="index", columns=["tuned", "preset", "mean", "ci95", "seeds"])


def committed(results_csv=RESULTS) -> tuple[pd.DataFrame, str, str | None]:
    """The committed quality rows of one preset: ``full`` when the file has it, else the first
    preset it holds. Returns ``(rows, source line, preset or None)``; an empty frame when the file
    is missing or empty."""
    frame = load_results(results_csv)
    presets = set(frame["preset"].dropna()) if len(frame) else set()
    pick = "full" if "full" in presets else (sorted(presets)[0] if presets else None)
    if pick is None:
        return frame, f"{results_csv} is empty or missing", None
    return frame[frame["preset"] == pick], f"{results_csv}, preset {pick!r}", pick


def trained_here_source(preset: str) -> str:
    """The source line of rows trained in a notebook at ``preset`` size."""
    return f"trained in this notebook, preset {preset!r}" + (
        " (tiny: a pipeline check, not evidence)" if preset == "smoke" else "")


def devices(frame: pd.DataFrame, metric_prefix: str = "recall") -> list[str]:
    """The devices the rows of metrics starting with ``metric_prefix`` were computed on."""
    return sorted(set(frame.loc[frame["metric"].str.startswith(metric_prefix), "device"].dropna().astype(str)))


def mean_overlap(top: np.ndarray, ref: np.ndarray, k: int = 100) -> float:
    """The mean over users (rows) of :func:`~.metrics.topk_overlap` of two ``[users, >= k]`` top lists."""
    return float(np.mean([topk_overlap(a, b, k) for a, b in zip(top, ref)]))


def save_top(tops_dir, dataset: str, model: str, seed: int, rows: np.ndarray, top: np.ndarray) -> Path:
    """Keep a model's targeted top-100 (``[users, 100]`` ad ids) and its users' rows in
    ``<tops_dir>/<dataset>_<model>_seed<seed>.npz``."""
    path = Path(tops_dir) / f"{dataset}_{model}_seed{seed}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, rows=np.asarray(rows), top=np.asarray(top)[:, :100].astype(np.int32))
    return path


def overlap_rows_from_tops(tops_dirs, frame: pd.DataFrame) -> pd.DataFrame:
    """``overlap@100_ranking`` rows of models trained apart from their seed's ranking model (two
    processes sharing a GPU), from the tops they saved (:func:`save_top`; ``tops_dirs``: one folder or
    several). A model's row copies its ``expert_count`` ``recall@100`` row in ``frame`` (the same dataset,
    model and seed: its commit, device, scorer and users), so the rows say which runs they compare.

    Raises:
        ValueError: two tops of a seed that rank different users, or a top with no ``recall@100`` row.
    """
    files = {}
    for folder in [tops_dirs] if isinstance(tops_dirs, (str, os.PathLike)) else tops_dirs:
        for f in sorted(Path(folder).glob("*_seed*.npz")):
            stem, seed = f.stem.rsplit("_seed", 1)
            ds, model = next((d, stem[len(d) + 1:]) for d in DATASETS if stem.startswith(d + "_"))
            files[(ds, model, int(seed))] = f
    recall = frame[(frame["metric"] == "recall@100") & (frame["experiment"] == "expert_count")]  # not precision rows
    out = []
    for (ds, model, seed), f in sorted(files.items()):
        ref = files.get((ds, "ranking", seed))
        if model == "ranking" or ref is None:
            continue
        a, b = np.load(f), np.load(ref)
        if not np.array_equal(a["rows"], b["rows"]):
            raise ValueError(f"{f.name} and {ref.name} rank different users: their overlap means nothing")
        match = recall[(recall["dataset"] == ds) & (recall["model"] == model)
                       & (pd.to_numeric(recall["seed"], errors="coerce") == seed)]  # "0", "0.0" or 0
        if match.empty:
            raise ValueError(f"{f.name}: no recall@100 row of {model} seed {seed} on {ds} to take its run's columns from")
        row = match.iloc[-1].to_dict()
        row.update(metric="overlap@100_ranking",
                   value=mean_overlap(a["top"], b["top"]))
        out.append(row)
    return pd.DataFrame(out, columns=frame.columns)
