"""Quality experiments: expert count K (recall against compute) and storage precision, with trained
models, as tidy frames and rows of ``data/results/quality.csv``. The notebooks' tables, figures
and findings built on them: :mod:`.expert_count_report` and :mod:`.precision_report`.

Rows have the quality columns of ``docs/design.md`` (``dataset, model, experts, k_experts, dtype, d,
seed, metric, value, commit, device``) plus ``experiment`` (``expert_count``, ``precision``, ``compute``,
``baselines``, ``preset_settings``: models trained at the preset's settings where ``expert_count`` holds
tuned ones, kept to compare: an untuned run's rows, ``--set ...`` without ``--tune`` written to a folder of
their own, merged under this name; ``tuned_by_checkpoints``: models tuned with ``--tune-lengths
checkpoints``, kept where own-length tuning replaced them; ``retuned_last_click``: a model at the
point the 10,000-user retuning on the last-click split chose, trained beside the tuned rows it did not
replace; ``tuned_last_click``: the synthetic world's models tuned on the validation split of each
user's last training click, kept beside the main table, tuned on each user's last training session
(:meth:`~andromeda_nb.training.data.InteractionData.resolve_split`'s default there), and
``tuned_last_click_precision`` their K = 2 model's precision rows; ``tuned_session``: models tuned
on the session split, trained beside a main table tuned otherwise; ``variant_<name>``: a model at
the preset's settings with settings changed, named in its scorer column, compared with its
``preset_settings`` rows; ``--experiment NAME`` writes a run's rows so, its precision rows as
``NAME_precision``), ``preset`` (the size preset that produced them), ``scorer`` (how
the scores were computed) and ``n_users`` (users evaluated). Metrics:

- ``recall@k``: mean over evaluated users of recall@k of the held-out clicks, retrieving from every
  eligible ad (targeting applied, the user's training clicks excluded); ``recall@k_untargeted``:
  the same from every ad but the training clicks (no targeting); the ``targeting`` column says which
  (``on`` / ``off``; empty for rows that retrieve nothing: compute, training time, score errors);
- ``overlap@100_ranking``: mean ``|top100(model) ∩ top100(ranking)| / 100``;
- precision rows (model ``mixture_k2``, one per dtype): ``recall@100``, ``recall@100_delta_pp``
  (minus fp32, percentage points), ``overlap@100_fp32``, ``score_err_p50/p99/p999/max`` (absolute
  score error against the fp32 table, divided by the user's fp32 score standard deviation over
  eligible ads); the fp16 math rows (``fp16_math``, ``int8_fp16_math``) also against fp32 math on
  their own storage (:data:`FP16_MATH_STORAGE`), the choice ``KernelConfig(math="auto")`` makes for
  a table already stored: ``recall@100_delta_pp_same_storage``, ``overlap@100_same_storage``;
- compute rows (seed empty): ``flops_per_ad`` (the model of ``docs/design.md``: 2d + 2Ed + 2Kd + 4E
  + 2K; the ranking model's per-pair count), ``kernel_flops_per_ad`` (the FLOPs the measured fused kernel
  row counts: the K chosen experts' value dots only),
  ``bytes_per_ad``, ``kernel_ads_per_s`` (from ``data/results/scoring.csv``; NaN where that
  configuration was not measured).

Scores: the full-scale evaluation scores the exported tensors with the formula of ``docs/design.md``
in float32 torch on the table the kernel reads (dequantized storage), ``scorer = "torch_fp32_formula"``; the
fused kernel is tested equal to the float64 oracle, and :func:`kernel_check` runs the kernel itself
(simulator or GPU) on a few users to confirm the same top-K here.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from .metrics import recall_at_k
# the compute-per-ad model and the kernel's measured rates (re-exported: reports use quality.*)
from .quality_compute import SCORING, bytes_per_ad, gated_flops, kernel_throughput  # noqa: F401
# the results file's rows, read and written (re-exported: the notebooks and reports use quality.*)
from .quality_results import (  # noqa: F401
    BASELINE_ORDER, COLUMNS, GENERATOR_MODELS, KEY, MODEL_ORDER, PROJECT_MODELS, RESULTS, ci95, committed, devices,
    check_experiment, load_results, one_preset, paired_difference, paired_experiments, recall_table, relabel,
    summarize, targeting_of, trained_here_source, tuning_effect, write_rows)
# models trained in separate processes: their kept top lists and overlap rows
from .quality_results import DATASETS, mean_overlap, overlap_rows_from_tops, save_top  # noqa: F401

#: the datasets whose training data carry sessions (``InteractionData.seq_start``): the session split's
SESSION_DATASETS = ("multi_interest",)
KS = {"multi_interest": (50, 100, 500), "ml-100k": (10, 50, 100)}
RETRIEVAL_MODELS = ("single_tower", "mixture_k1", "mixture_k2", "mixture_k4", "dense_mixture")
PRECISION_DTYPES = ("fp32", "bf16", "fp16", "fp16_math", "int8", "int8_fp16_math", "int8_dimscale")
#: the fp16 math rows' storage: what they are compared with in fp32 math (``*_same_storage`` metrics)
FP16_MATH_STORAGE = {"fp16_math": "fp16", "int8_fp16_math": "int8"}


@dataclass(frozen=True)
class Preset:
    """Sizes of one run: the synthetic world, training per dataset, seeds, evaluated users."""

    name: str
    world: dict = field(default_factory=dict)          # WorldDesign overrides
    train: dict = field(default_factory=dict)          # TrainConfig overrides per dataset, see cfg()
    train_ml: dict = field(default_factory=dict)
    ranking: dict = field(default_factory=dict)        # extra overrides for the ranking model
    ranking_ml: dict = field(default_factory=dict)
    seeds: tuple = (0, 1, 2)
    eval_users: dict = field(default_factory=lambda: {"multi_interest": 2000, "ml-100k": None})
    # the tuning's validation users: a tuning picks the best of many points, so its noise decides what
    # it picks; 2,000 users (~0.9 point standard error at recall@100 ~0.24) chose points that then
    # did worse on the held-out clicks than the preset's settings, 10,000 cut that error to ~0.4
    tune_users: dict = field(default_factory=lambda: {"multi_interest": 10_000, "ml-100k": None})
    precision_users: dict = field(default_factory=lambda: {"multi_interest": 500, "ml-100k": None})

    def cfg(self, dataset: str, model: str):
        from ..training.train import TrainConfig

        kw = dict(self.train_ml if dataset == "ml-100k" else self.train)
        if model == "ranking":
            kw.update(self.ranking_ml if dataset == "ml-100k" else self.ranking)
        return TrainConfig(**kw)


PRESETS = {
    # seconds on a CPU: for tests and the smoke notebooks (tiny world, a few steps)
    "smoke": Preset("smoke", world=dict(n_users=600, n_ads=800, topics=12),
                    train=dict(steps=6, batch=64, negatives=64, d=16, width=16, hidden=16, warmup=2),
                    train_ml=dict(steps=6, batch=64, negatives=64, d=16, width=16, hidden=16, warmup=2),
                    seeds=(0,), eval_users={"multi_interest": 40, "ml-100k": 40},
                    tune_users={"multi_interest": 40, "ml-100k": 40},
                    precision_users={"multi_interest": 20, "ml-100k": 20}),
    # a minute or two on a CPU: the expert-count notebook's worked example without a GPU (smaller world)
    "demo": Preset("demo", world=dict(n_users=10_000, n_ads=10_000, topics=40),
                   train=dict(steps=400, batch=256, negatives=256),
                   train_ml=dict(steps=400, batch=256, negatives=256),
                   seeds=(0,), eval_users={"multi_interest": 300, "ml-100k": None},
                   tune_users={"multi_interest": 300, "ml-100k": None}),
    # the write-up: the 50,000 x 50,000 world, about 2 epochs of it; MovieLens about 10 epochs
    # (the ranking model: half the batch, twice the steps: the same clicks, a quarter of the pairs)
    # and five seeds (the committed rows' means and 95 % intervals)
    "full": Preset("full", train=dict(steps=1500, batch=1024, negatives=1024),
                   ranking=dict(steps=3000, batch=512, negatives=512),
                   train_ml=dict(steps=1000, batch=512, negatives=512), seeds=(0, 1, 2, 3, 4)),
}


# ---------------------------------------------------------------------------------------------
# data


def load_data(dataset: str, preset: Preset | str = "full", world_seed: int = 0, data_dir="data/ml-100k"):
    """:class:`~andromeda_nb.training.data.InteractionData` of a dataset at a preset's size.

    The synthetic world is generated once per ``world_seed`` (model seeds vary, the world does not).
    """
    from ..training import data as tdata

    preset = PRESETS[preset] if isinstance(preset, str) else preset
    if dataset == "multi_interest":
        from ..datasets import multi_interest as mi

        world = mi.build_world(replace(mi.WorldDesign(), **preset.world), seed=world_seed)
        return tdata.from_multi_interest(world)
    if dataset == "ml-100k":
        from ..datasets import movielens

        ml = movielens.load(movielens.fetch(data_dir))
        split = movielens.split(ml)
        world = movielens.build_world(ml, split, d=16, experts=1, k_experts=1)
        return tdata.from_movielens(world, ml, split)
    raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")


def eval_rows(data, n_users, seed: int = 0) -> np.ndarray:
    """A fixed sample (by ``seed``) of evaluated user rows (all when ``n_users`` is None)."""
    rows = data.eval_rows
    if n_users is None or n_users >= rows.size:
        return rows
    return np.sort(np.random.default_rng(1000 + seed).choice(rows, n_users, replace=False))


# ---------------------------------------------------------------------------------------------
# evaluation


def _topk_rows(scores: np.ndarray, mask: np.ndarray, k: int) -> np.ndarray:
    """Slots of the top-k eligible scores per row (the top-K contract of docs/design.md, as
    :func:`andromeda_nb.reference.topk`): score descending (+-inf included, in float64), ties to
    the lower slot (integer scores such as click counts tie often), never a NaN, pads -1 (fewer
    than k eligible)."""
    scores = np.asarray(scores, np.float64)
    ok = np.asarray(mask, bool) & ~np.isnan(scores)
    out = np.full((scores.shape[0], k), -1, np.int64)
    for i in range(scores.shape[0]):
        cand = np.flatnonzero(ok[i])  # ascending slots
        s = scores[i, cand]
        if cand.size > k > 0:  # keep what can reach the top k (the k-th score and above: ties kept)
            keep = s >= np.partition(s, cand.size - k)[cand.size - k]
            cand, s = cand[keep], s[keep]
        top = cand[np.argsort(-s, kind="stable")][:k]
        out[i, : top.size] = top
    return out


def model_scores(tm, rows, table=None, request_fn=None, math: str = "fp32") -> np.ndarray:
    """Scores ``[len(rows), n_ads]``: a retrieval model's exported tensors on ``table`` (default
    its fp32 export) with the formula of `docs/design.md` in ``math``'s model
    (:func:`~andromeda_nb.training.train.score_exported`), or the ranking model's forward pass."""
    from ..training.train import score_exported

    if not tm.is_retrieval:
        return tm.forward_scores(rows)
    V, G, gamma, beta = tm.request_tensors(rows) if request_fn is None else request_fn(rows)
    table = tm.export_table("fp32") if table is None else table
    return score_exported(V, G, gamma, beta, table, tm.k_experts, device=tm.device, math=math)


def retrieve_top(tm, rows, k: int, table=None, request_fn=None, batch: int = 256, progress=False,
                 untargeted: bool = False):
    """``[len(rows), k]`` top-k ad slots per user over eligible, unseen ads; with ``untargeted``
    also (a second array, from the same scores) over every unseen ad."""
    out, free = [], []
    for s in tqdm(range(0, len(rows), batch), desc=f"eval {tm.name}", disable=not progress, leave=False):
        r = rows[s: s + batch]
        sc = model_scores(tm, r, table, request_fn)
        out.append(_topk_rows(sc, tm.data.eligible(r), k))
        if untargeted:
            free.append(_topk_rows(sc, tm.data.unseen(r), k))
    return (np.concatenate(out), np.concatenate(free)) if untargeted else np.concatenate(out)


def routing_stats(tm, rows, top: np.ndarray) -> dict:
    """How a trained mixture's gate routes the (user, ad) pairs it retrieves: over each row's
    retrieved ads (``top``'s slots, -1 pads skipped), in float64 from the exported tensors,
    ``expert_share_max``: the busiest expert's share of all K-of-E choices (1/E when balanced, 1/K
    when every pair picks the same K experts: a collapsed gate), and ``routing_entropy``: the
    gate softmax's mean entropy over log E (1: uniform, 0: one expert takes all the weight; the
    only one where K = E). Ties between logits choose the lower expert, as the kernels do. Empty
    for one-expert models."""
    if not tm.is_retrieval or tm.experts < 2:
        return {}
    E, K = tm.experts, tm.k_experts
    a = tm.ad_arrays()[0].astype(np.float64)
    top = np.asarray(top)
    if top.ndim != 2 or top.shape[0] != len(rows) or (top.size and top.dtype.kind not in "iu"):
        raise ValueError(f"top must be an integer array [len(rows) = {len(rows)}, k], got {top.dtype} {top.shape}")
    if top.size and (top.min() < -1 or top.max() >= a.shape[0]):
        raise ValueError(f"top holds slots in 0..{a.shape[0] - 1} and -1 pads, got {top.min()}..{top.max()}")
    V, G, gamma, beta = (x.astype(np.float64) for x in tm.request_tensors(rows))
    if not all(np.isfinite(x).all() for x in (G, gamma, beta, a)):
        raise ValueError("the model's exported gate keys, FiLM weights or ad rows hold NaN or inf")
    load, entropy, pairs = np.zeros(E), 0.0, 0
    for i in range(len(rows)):
        slots = top[i][top[i] >= 0]
        h = np.maximum(gamma[i] * a[slots] + beta[i], 0.0)
        logits = h @ G[i].T / np.sqrt(a.shape[1])
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        load += np.bincount(np.argsort(-logits, axis=1, kind="stable")[:, :K].ravel(), minlength=E)
        entropy += float(-(p * np.log(np.maximum(p, 1e-300))).sum())
        pairs += slots.size
    if not pairs:
        return {}
    out = {"routing_entropy": entropy / pairs / np.log(E)}
    if K < E:  # K = E chooses every expert: its share is 1/E by construction
        out["expert_share_max"] = float(load.max() / load.sum())
    return out


def recalls(data, rows, top: np.ndarray, ks) -> dict:
    return {f"recall@{k}": float(np.mean([recall_at_k(t, data.heldout[int(r)], k) for r, t in zip(rows, top)]))
            for k in ks}


def true_model_top(data, rows, k: int, estimated: bool = False) -> np.ndarray:
    """Top-k of the synthetic world's ground-truth click model (the ceiling); ``estimated``: the
    same model with each user's interests estimated from their training clicks
    (:meth:`~andromeda_nb.datasets.multi_interest.MultiInterestWorld.estimated_interests`): what the
    clicks reveal to a model that knows everything else about the world."""
    w = data.world
    out = np.full((len(rows), k), -1, np.int64)
    for i, r in enumerate(rows):
        u = int(data.user_ids[r])
        s = w.true_scores(u, w.estimated_interests(u) if estimated else None)
        mask = data.eligible(np.array([r]))[0]
        out[i] = _topk_rows(s[None, :], mask[None, :], k)[0]
    return out


# ---------------------------------------------------------------------------------------------
# environment columns


def git_commit(root=None) -> str:
    """The commit under test (:func:`andromeda_nb.provenance.commit_id`)."""
    from ..provenance import commit_id

    return commit_id(root)


def device_name(device) -> str:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores)"


#: the scorer of rows trained untuned at changed settings: this, then the settings ("a=1 b=2")
UNTUNED_WITH = "untuned: preset settings with "


def scorer_settings(scorer) -> dict | None:
    """The settings (``{"a": "1"}``) an untuned row's scorer names (:data:`UNTUNED_WITH`); None for
    any other scorer (a tuned row's names scales, not settings)."""
    scorer = str(scorer)
    if not scorer.startswith(UNTUNED_WITH):
        return None
    return dict(item.partition("=")[::2] for item in scorer[len(UNTUNED_WITH):].split())


def _row(dataset, model, experts, k_experts, dtype, d, seed, metric, value, **extra) -> dict:
    r = dict(dataset=dataset, model=model, experts=experts, k_experts=k_experts, dtype=dtype, d=d,
             seed=seed, metric=metric, value=float(value))
    r.update(extra)
    return r


# ---------------------------------------------------------------------------------------------
# experiment 1: expert count


def tune_models(data, preset: Preset | str = "full", models=None, device="auto", progress: bool = True,
                workers: int = 1, runs_file=None, lengths: str = "own", budget_s: float | None = None,
                refine: bool = True, split: str = "auto", grid=None):
    """Each model's learning rate and length tuned on the validation split of the training part
    (:mod:`~andromeda_nb.training.tuning`: the same grid for every model, seed 0; ``grid``: the first
    stage's points, default :data:`~andromeda_nb.training.tuning.GRID`, or a sub-grid of learning
    rates x lengths, :func:`~andromeda_nb.training.tuning.scale_grid`). Returns
    ``({model: (TrainConfig, scorer note)}, rows)``: the rows hold each model's
    ``validation_recall@100`` at its chosen point (seed 0: the tuning seed); pass the dict to
    :func:`run_expert_count`, whose rows then carry the tuned point in their ``scorer`` column (and
    replace untuned rows of the same key when merged). Tune once and train every seed in the same
    run: a re-tune may choose another point. ``workers``: runs trained at once; ``runs_file``: where
    finished runs are kept, so a cut-off tuning resumes; ``lengths``: how a length is trained; ``budget_s``:
    the seconds it may train (:func:`~andromeda_nb.training.tuning.tune_many`); ``refine`` (default): a
    second stage around each model's point, its other settings scaled one at a time
    (:func:`~andromeda_nb.training.tuning.refine_grid`: negatives, temperature, width, and the
    load-balancing weight of a sparse mixture), each point its own run at the first stage's length;
    ``split``: what the validation holds back (``"click"`` or ``"session"``:
    :func:`~andromeda_nb.training.tuning.validation_view`; ``"auto"``: the session where the data have them)."""
    from ..training import tuning
    from ..training.train import MODELS, pick_device

    preset = PRESETS[preset] if isinstance(preset, str) else preset
    grid = tuning.GRID if grid is None else tuning.check_first_stage(grid)
    split = data.resolve_split(split)
    dev = pick_device(device)
    meta = dict(commit=git_commit(), device=device_name(dev), experiment="expert_count", preset=preset.name)
    tuned, rows = {}, []
    bases = {name: preset.cfg(data.name, name) for name in (tuple(MODELS) if models is None else tuple(models))}
    n_users, t0 = preset.tune_users.get(data.name), time.monotonic()
    results = tuning.tune_many(bases, data, n_users, grid=grid, device=dev, progress=progress,
                               workers=workers, runs_file=runs_file, lengths=lengths, budget_s=budget_s,
                               split=split)
    second = {}
    if refine:  # one tune_many a refine grid (the sparse mixtures' has the load-balancing axis)
        groups = {}  # refine grid -> {model: its first-stage configuration}
        for name, base in bases.items():
            second_grid = tuning.refine_grid(name)
            first = tuning.grid_config(base, results[name][0])
            groups.setdefault(repr(second_grid), (second_grid, {}))[1][name] = first
        for second_grid, group in groups.values():
            left = None if budget_s is None else budget_s - (time.monotonic() - t0)
            if left is not None and left <= 0:
                raise tuning.TuningIncomplete(f"tuning stopped at its time budget ({budget_s:g} s) before its "
                                              "second stage: the same call again resumes there")
            for name, (point, trials) in tuning.tune_many(group, data, n_users, grid=second_grid, device=dev,
                                                          progress=progress, workers=workers, runs_file=runs_file,
                                                          budget_s=left, split=split).items():
                second[name] = (point, trials, tuning.grid_config(group[name], point))
    for name, base in bases.items():
        best, trials = results[name]
        value = next(v for p, v in trials if p is best)
        if name in second:
            point, trials2, cfg = second[name]
            tuned[name] = (cfg, tuning.describe(best, grid, lengths=lengths, refined=point, split=split))
            value = next(v for p, v in trials2 if p is point)  # the chosen run's own, not a checkpoint's
        else:
            tuned[name] = (tuning.grid_config(base, best), tuning.describe(best, grid, lengths=lengths, split=split))
        E, K = MODELS[name] if MODELS[name][0] is not None else ("", "")
        rows.append(_row(data.name, name, E, K, "fp32", base.d, 0, "validation_recall@100",
                         value, **{**meta, "scorer": tuned[name][1],
                                   "n_users": tuning.validation_users(data, n_users, split)}))
    return tuned, pd.DataFrame(rows, columns=COLUMNS)


def run_expert_count(data, preset: Preset | str = "full", seeds=None, models=None, device="auto",
                     progress: bool = True, keep_models: bool = False, tuned: dict | None = None, tops_dir=None,
                     on_model=None):
    """Train every model for every seed on ``data`` and evaluate them: at the preset's settings, or
    at ``tuned``'s (:func:`tune_models`) where it names the model. ``tops_dir``: each model's targeted
    top-100 a seed is kept there (:func:`save_top`), so models trained in separate processes still get
    their ``overlap@100_ranking`` rows (:func:`overlap_rows_from_tops`). ``on_model``: called with
    each trained model's own rows (a frame) as soon as they are made, so a caller can keep them
    before the seed's other models finish (:func:`run_all` writes them).

    Returns:
        ``(frame, trained)``: tidy rows (COLUMNS) and ``{(model, seed): TrainedModel}`` (only when
        ``keep_models``; otherwise just the ``mixture_k2`` models, which the precision experiment
        needs).
    """
    from ..training.train import MODELS, pick_device, train_model

    preset = PRESETS[preset] if isinstance(preset, str) else preset
    seeds = preset.seeds if seeds is None else tuple(seeds)
    models = tuple(MODELS) if models is None else tuple(models)
    ks = KS[data.name]
    dev = pick_device(device)
    meta = dict(commit=git_commit(), device=device_name(dev), experiment="expert_count", preset=preset.name,
                scorer="torch_fp32_formula")
    rows_out, trained = [], {}
    kmax = max(max(ks), 100)
    tuned = tuned or {}
    configs = {name: tuned[name][0] if name in tuned else preset.cfg(data.name, name) for name in models}
    scorers = {name: tuned[name][1] for name in models if name in tuned}
    for seed in seeds:
        rows = eval_rows(data, preset.eval_users.get(data.name), seed=0)
        meta["n_users"] = int(rows.size)
        tops = {}
        for name in models:
            tm = train_model(name, data, configs[name], seed=seed, device=dev, progress=progress)
            first = len(rows_out)
            top, free = retrieve_top(tm, rows, kmax, progress=progress, untargeted=True)
            tops[name] = top
            if tops_dir is not None:
                save_top(tops_dir, data.name, name, seed, rows, top)
            E, K = (tm.experts, tm.k_experts) if tm.is_retrieval else ("", "")
            meta["scorer"] = scorers.get(name, "torch_fp32_formula")
            for metric, v in recalls(data, rows, top, ks).items():
                rows_out.append(_row(data.name, name, E, K, "fp32", tm.cfg.d, seed, metric, v, **meta))
            for metric, v in recalls(data, rows, free, ks).items():  # every unseen ad a candidate
                rows_out.append(_row(data.name, name, E, K, "fp32", tm.cfg.d, seed, f"{metric}_untargeted", v,
                                     **meta))
            for metric, v in routing_stats(tm, rows, top[:, :100]).items():  # a collapsed gate shows here
                rows_out.append(_row(data.name, name, E, K, "fp32", tm.cfg.d, seed, metric, v, **meta))
            rows_out.append(_row(data.name, name, E, K, "fp32", tm.cfg.d, seed, "train_seconds", tm.seconds, **meta))
            rows_out.append(_row(data.name, name, E, K, "fp32", tm.cfg.d, seed, "final_loss",
                                 float(np.mean(tm.history[-50:])), **meta))
            if on_model is not None:
                on_model(pd.DataFrame(rows_out[first:], columns=COLUMNS))
            if keep_models or name == "mixture_k2":
                trained[(name, seed)] = tm
        if "ranking" in tops:
            for name, top in tops.items():
                if name == "ranking":
                    continue
                ov = mean_overlap(top, tops["ranking"])
                E, K = MODELS[name]
                rows_out.append(_row(data.name, name, E, K, "fp32", configs[name].d, seed, "overlap@100_ranking",
                                     ov, **{**meta, "scorer": scorers.get(name, "torch_fp32_formula")}))
        if data.name == "multi_interest" and seed == seeds[0]:
            for name, estimated, scorer in (
                    ("true_model", False, "ground_truth"),
                    ("true_model_estimated", True, "ground_truth with interests estimated from training clicks")):
                top = true_model_top(data, rows, kmax, estimated=estimated)
                for metric, v in recalls(data, rows, top, ks).items():
                    rows_out.append(_row(data.name, name, "", "", "", "", "", metric, v, **{**meta, "scorer": scorer}))
    return pd.DataFrame(rows_out, columns=COLUMNS), trained


# ---------------------------------------------------------------------------------------------
# standard baselines


def run_baselines(data, preset: Preset | str = "full", seeds=None, names=None, progress: bool = True,
                  split: str = "auto") -> pd.DataFrame:
    """The standard baselines (:mod:`~andromeda_nb.training.baselines`) on ``data``: each tuned on
    the validation split of the training part (the evaluated users' last training clicks, or their
    last sessions: ``split``, by default the project's models' rule; the scorer names a session
    split), then
    refit on every training click and scored on the held-out clicks of the same users as the
    project's models, with targeting (``recall@k``) and without (``recall@k_untargeted``). Seeded
    baselines (ALS, BPR) run once per seed, the others once (seed 0). Rows: ``experiment =
    "baselines"``, ``model = "baseline_<name>"``, ``scorer`` = library, model and tuned point, plus
    ``validation_recall@100`` of that point."""
    from ..training import baselines as B

    if isinstance(preset, str) and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    preset = PRESETS[preset] if isinstance(preset, str) else preset
    seeds = preset.seeds if seeds is None else tuple(seeds)
    if not seeds:
        raise ValueError("run_baselines needs at least one seed")
    asked = names is not None
    names = B.BASELINES if names is None else (names,) if isinstance(names, str) else tuple(names)
    unknown = [n for n in names if n not in B.BASELINES]
    if unknown or not names:
        raise ValueError(f"unknown baselines {unknown or names}; choose from {B.BASELINES}")
    if asked and "ease" in names and data.n_ads > B.EASE_MAX_ITEMS:
        raise ValueError(f"ease does not apply to {data.name}: {data.n_ads:,} items > {B.EASE_MAX_ITEMS:,} "
                         "(a dense item x item inverse)")
    split = data.resolve_split(split)
    rows = eval_rows(data, preset.eval_users.get(data.name), seed=0)
    ks = KS[data.name]
    meta = dict(commit=git_commit(), device=device_name("cpu"), experiment="baselines", preset=preset.name,
                n_users=int(rows.size))
    out = []
    for name in names:
        if name == "ease" and data.n_ads > B.EASE_MAX_ITEMS:
            if progress:
                print(f"{data.name}: ease skipped ({data.n_ads:,} items > {B.EASE_MAX_ITEMS:,})", flush=True)
            continue
        best, trials = B.tune(name, data, rows, seed=0, split=split)
        val = max(v for _, v in trials)
        scorer = B.describe(name, best, [p for p, _ in trials]) + ("; validated on last sessions" if split == "session"
                                                                   else "")
        d = ""  # the tuned point (factors among it) is in the scorer column: a re-tune replaces these rows
        for seed in (seeds if name in B.SEEDED else (0,)):
            for metric, v in B.evaluate(name, best, data, rows, ks, seed=seed).items():
                out.append(_row(data.name, f"baseline_{name}", "", "", "fp32", d, seed, metric, v, scorer=scorer,
                                **meta))
            out.append(_row(data.name, f"baseline_{name}", "", "", "fp32", d, seed, "validation_recall@100", val,
                            scorer=scorer, **meta))
        if progress:
            print(f"{data.name}: {scorer}: validation recall@100 {val:.3f} ({len(trials)} grid points)", flush=True)
    return pd.DataFrame(out, columns=COLUMNS)


# ---------------------------------------------------------------------------------------------
# compute per ad


def compute_rows(dataset: str, d: int = 64, dtypes=("fp16",), hist_len: int = 50, n_cats: int = 100,
                 ranking_hidden: int = 128, scoring_csv=SCORING, preset: str = "full") -> pd.DataFrame:
    """Compute-per-ad rows for every model configuration (seed empty)."""
    from ..training.train import MODELS

    # every model's rate from one run (the one that measured the most of them): rates of different
    # runs and paths do not compare as a cost
    thr = kernel_throughput(scoring_csv, keys=[(dt.replace("_dimscale", ""), d, E, K) for dt in dtypes
                                                for name, (E, K) in MODELS.items() if name != "ranking"])
    latest = kernel_throughput(scoring_csv)  # each configuration's newest run, for what thr's run lacks
    out = []
    meta = dict(commit=git_commit(), device="", experiment="compute", preset=preset, scorer="analytic")
    for name, (E, K) in MODELS.items():
        for dtype in dtypes:
            if name == "ranking":
                fl = 2 * (2 * hist_len * d + 3 * d + n_cats + (3 * d + 2) * ranking_hidden + ranking_hidden)
                out.append(_row(dataset, name, "", "", "fp32", d, "", "flops_per_ad", fl, **meta))
                out.append(_row(dataset, name, "", "", "fp32", d, "", "bytes_per_ad", 4 * d + 4 + 4 * n_cats, **meta))
                break
            out.append(_row(dataset, name, E, K, dtype, d, "", "flops_per_ad", gated_flops(d, E, K, False), **meta))
            hit = thr[(thr["dtype"] == dtype.replace("_dimscale", "")) & (thr["d"] == d)
                      & (thr["experts"] == E) & (thr["k_experts"] == K)]
            # the FLOPs of the measured kernel configuration (values="chosen": the K chosen experts'
            # value dots only); the model's count when that configuration was not measured
            kfl = float(hit["flops_per_item"].iloc[0]) if len(hit) and np.isfinite(hit["flops_per_item"].iloc[0]) \
                else gated_flops(d, E, K, False)
            out.append(_row(dataset, name, E, K, dtype, d, "", "kernel_flops_per_ad", kfl, **meta))
            out.append(_row(dataset, name, E, K, dtype, d, "", "bytes_per_ad", bytes_per_ad(d, dtype), **meta))
            v = float(hit["items_per_s"].iloc[0]) if len(hit) else float("nan")
            dv = str(hit["device"].iloc[0]) if len(hit) else ""
            run = str(hit["commit"].iloc[0]) if len(hit) else ""  # rates compare within one run only
            out.append(_row(dataset, name, E, K, dtype, d, "", "kernel_ads_per_s", v,
                            **{**meta, "device": dv, "scorer": (f"{scoring_csv}" + (f", run {run}" if run else ""))
                               if len(hit) else _elsewhere(latest, thr, (dtype.replace("_dimscale", ""), d, E, K))}))
    return pd.DataFrame(out, columns=COLUMNS)


def _elsewhere(latest: pd.DataFrame, thr: pd.DataFrame, key: tuple) -> str:
    """The scorer of a compute row whose configuration the chosen run (``thr``'s) did not
    measure: "not measured", and where another run did (``latest``: each configuration's newest
    run, :func:`kernel_throughput`), that run's rate, named (it stays out of the value: rates of
    two runs do not compare as a cost)."""
    newest = latest[[tuple(k) == key for k in latest[["dtype", "d", "experts", "k_experts"]].to_numpy()]]
    runs = sorted(set(thr["commit"].astype(str)))
    if newest.empty:
        return "not measured"
    r = newest.iloc[0]
    return (f"not measured in run {', '.join(runs)}; run {r['commit']} measured {float(r['items_per_s']) / 1e9:.2f} G "
            f"ads/s ({r['device']})" if runs else "not measured")


# ---------------------------------------------------------------------------------------------
# experiment 2: precision


def dimscale(a: np.ndarray) -> np.ndarray:
    """Per-dimension scales ``s_j = max_i |a_ij|`` (1 where a column is zero)."""
    s = np.abs(a).max(axis=0)
    return np.where(s > 0, s, 1.0).astype(np.float32)


def precision_tables(tm):
    """``{dtype: (AdTable, request_fn or None)}`` for :data:`PRECISION_DTYPES`.

    ``int8_dimscale``: per-dimension scales folded into the request's ``gamma`` — store
    ``a' = a / s`` (every column spans [-1, 1]) and send ``gamma' = gamma * s``; then
    ``gamma' * a' = gamma * a`` exactly, so the model of `docs/design.md` and the kernel are unchanged and
    int8's per-row scale no longer has to cover columns of very different ranges.
    """
    from ..model import AdTable

    a, b = tm.ad_arrays()
    out = {dt: (AdTable.from_float(a, b, dtype=dt, ad_ids=tm.data.ad_ids), None) for dt in ("fp32", "bf16", "fp16", "int8")}
    s = dimscale(a)

    def req(rows):
        V, G, gamma, beta = tm.request_tensors(rows)
        return V, G, (gamma * s[None, :]).astype(np.float32), beta

    out["int8_dimscale"] = (AdTable.from_float(a / s[None, :], b, dtype="int8", ad_ids=tm.data.ad_ids), req)
    out["fp16_math"] = out["fp16"]  # the fp16 table in the fp16 math mode (run_precision)
    out["int8_fp16_math"] = out["int8"]  # the int8 table in the fp16 math mode
    return out


def run_precision(tm, rows, preset: str = "full", dtypes=PRECISION_DTYPES, progress: bool = False,
                  trained_as: str | None = None) -> pd.DataFrame:
    """Precision rows of one trained retrieval model (module docstring); ``trained_as``: how it was
    trained where not at the preset's settings (a tuned point's or changed settings' note), added
    to the rows' scorer column."""
    data = tm.data
    meta = dict(commit=git_commit(), device=device_name(tm.device), experiment="precision", preset=preset,
                scorer="torch_fp32_formula" + (f"; model {trained_as}" if trained_as else ""), n_users=int(len(rows)))
    tables = precision_tables(tm)
    elig = data.eligible(rows)
    base = model_scores(tm, rows, tables["fp32"][0])
    base_top = _topk_rows(base, elig, 100)
    base_rec = recalls(data, rows, base_top, (100,))["recall@100"]
    sd = np.array([base[i, elig[i]].std() if elig[i].any() else 1.0 for i in range(len(rows))])
    sd = np.where(sd > 0, sd, 1.0)
    out = []
    done = {}  # dtype -> (top-100 rows, recall@100): the fp16 math rows' storage in fp32 math
    # the storages first (scored even where not asked for, then not written), so each fp16 math row
    # finds its storage's fp32 math
    storages = {FP16_MATH_STORAGE[d] for d in dtypes if d in FP16_MATH_STORAGE}
    for dt in sorted(dict.fromkeys([*dtypes, *sorted(storages)]), key=lambda d: d in FP16_MATH_STORAGE):
        table, req = tables[dt]
        sc = base if dt == "fp32" else model_scores(tm, rows, table, req, math="fp16" if dt.endswith("fp16_math") else "fp32")
        top = _topk_rows(sc, elig, 100)
        rec = recalls(data, rows, top, (100,))["recall@100"]
        done[dt] = top, rec
        if dt not in dtypes:
            continue
        ov = mean_overlap(top, base_top)
        err = (np.abs(sc - base) / sd[:, None])[elig]
        E, K, d = tm.experts, tm.k_experts, tm.cfg.d
        vals = {"recall@100": rec, "recall@100_delta_pp": 100 * (rec - base_rec), "overlap@100_fp32": ov,
                "score_err_p50": np.quantile(err, 0.5), "score_err_p99": np.quantile(err, 0.99),
                "score_err_p999": np.quantile(err, 0.999), "score_err_max": err.max(),
                "bytes_per_ad": bytes_per_ad(d, dt)}
        if dt in FP16_MATH_STORAGE:
            st_top, st_rec = done[FP16_MATH_STORAGE[dt]]
            vals["recall@100_delta_pp_same_storage"] = 100 * (rec - st_rec)
            vals["overlap@100_same_storage"] = mean_overlap(top, st_top)
        for metric, v in vals.items():
            out.append(_row(data.name, tm.name, E, K, dt, d, tm.seed, metric, v, **meta))
    return pd.DataFrame(out, columns=COLUMNS)


def kernel_check(tm, user_ids, k: int = 20, dtype: str = "fp32", max_ads: int | None = None) -> list:
    """Run the fused kernel (``score_topk``, simulator or GPU) on ``user_ids`` and compare its top-k
    with the torch model's own forward pass on the same stored table (ids may differ only among
    near-ties, as :func:`andromeda_nb.checks.compare_topk_float64`). ``max_ads`` limits the eligible
    ads to the first slots (the simulator scores about 1,000 ads/s). Returns one Check per user."""
    from .. import checks
    from ..score.api import DeviceAdTable, KernelConfig, score_topk
    from ..score.table import DeviceRequest

    table = tm.export_table(dtype)
    dt = DeviceAdTable(table)
    out = []
    for uid in user_ids:
        row = tm.data.row_of(uid)
        mask = tm.data.eligible(np.array([row]))[0]
        if max_ads is not None:
            mask[max_ads:] = False
        req = tm.export_request(uid)
        got = score_topk(req, dt, k, eligible=mask)
        math = KernelConfig().with_math(DeviceRequest.of(req), dt).math  # the default's math mode
        ref = model_scores(tm, np.array([row]), table, math=math)[0].astype(np.float64)
        out.append(checks.compare_topk_float64(got.ids, ref, k, table.ad_ids, mask))
    return out


# ---------------------------------------------------------------------------------------------
# everything


def refresh_compute(preset: str = "full", out: str | os.PathLike = "data/results", datasets=DATASETS,
                    scoring_csv=SCORING) -> Path:
    """Rewrite only the compute-per-ad rows of ``<out>/quality.csv`` (e.g. after a new
    ``scoring.csv``); no training."""
    p = PRESETS[preset]
    n_cats = {"multi_interest": p.world.get("topics", 100), "ml-100k": 19}
    frames = [compute_rows(ds, d=p.cfg(ds, "mixture_k2").d, dtypes=("fp32", "bf16", "fp16", "int8"),
                           n_cats=n_cats[ds], ranking_hidden=p.cfg(ds, "ranking").hidden,
                           scoring_csv=scoring_csv, preset=p.name) for ds in datasets]
    return write_rows(pd.concat(frames, ignore_index=True), Path(out) / "quality.csv")


def run_all(preset: str = "full", out: str | os.PathLike = "data/results", datasets=DATASETS, seeds=None,
            device: str = "auto", progress: bool = True, data_dir="data/ml-100k",
            scoring_csv=SCORING, models=None, tune: bool = False, tuned_file=None, workers: int = 1,
            settings: str | None = None, tune_lengths: str = "own", save_tops: bool = False,
            tune_budget_s: float | None = None, refine: bool = True, tune_split: str = "auto",
            tune_grid=None, experiment: str = "expert_count") -> pd.DataFrame:
    """Both experiments on every dataset; writes ``<out>/quality.csv`` after each dataset (with
    ``tune``: every model tuned first, :func:`tune_models`, its choices kept in ``tuned_file`` when
    given, and its finished runs beside it, :func:`~andromeda_nb.training.tuning.runs_file_of`, so a
    cut-off tuning resumes; without ``tune``, a ``tuned_file``'s choices are trained; ``workers``: the tuning's runs
    trained at once; ``tune_lengths``: how the tuning trains a length, ``tune_split``: what its validation
    holds back (:func:`~andromeda_nb.training.tuning.validation_view`; ``"auto"``: the session where the
    data have them), ``tune_budget_s``: the seconds the
    tunings of all datasets together may take, counted from this call's start (seeds are not budgeted;
    the first dataset's first runs start whatever is left, so every call gets somewhere; :func:`tune_models`);
    ``settings``: the preset's TrainConfig fields this run changed, e.g. ``"ad_features=1 weight_decay=1e-4"``,
    named in every trained row's scorer column (untuned: ``"untuned: preset settings with ..."``; tuned:
    the tuned point's note ``"... at ..."``), so rows of changed settings never pass for the preset's;
    ``save_tops``: each model's top-100 a seed kept in ``<out>/tops``, :func:`save_top`; ``refine``: the
    tuning's second stage, ``tune_grid``: its first stage's points, :func:`tune_models`; ``experiment``:
    the trained and validation rows' experiment, e.g. ``tuned_session``, :func:`relabel`).

    This is what ``python -m andromeda_nb.training`` runs.
    """
    from ..training import tuning
    from ..training.train import MODELS

    p = PRESETS[preset]
    path = Path(out) / "quality.csv"
    if tune_lengths not in tuning.LENGTHS:  # refused before any row is written
        raise ValueError(f"tune_lengths must be one of {tuning.LENGTHS}, got {tune_lengths!r}")
    if tune_split not in ("auto", *tuning.SPLITS):  # refused before any row is written
        raise ValueError(f"tune_split must be one of {('auto', *tuning.SPLITS)}, got {tune_split!r}")
    without = [ds for ds in datasets if ds not in SESSION_DATASETS]
    if tune and tune_split == "session" and without:
        raise ValueError(f"tune_split='session' needs sessions, which {', '.join(without)} does not have: leave "
                         "the split 'auto' (the session where the data have them, else the click)")
    if tune_grid is not None:
        tune_grid = tuning.check_first_stage(tune_grid)
    check_experiment(experiment)
    if tuned_file is not None:  # a file that cannot serve refused before anything trains
        tuning.check_tuned_use(tuned_file, datasets, p.name, models, tune)
    if tune_budget_s is not None:  # one budget for every dataset's tuning, from this call's start
        if not tune:
            raise ValueError("tune_budget_s is a tuning's budget: give it with tune=True")
        tuning.check_budget(tune_budget_s, None if tuned_file is None else tuning.runs_file_of(tuned_file))
    t0 = time.monotonic()
    frames = []
    for ds in datasets:
        data = load_data(ds, p, data_dir=data_dir)
        comp = compute_rows(ds, d=p.cfg(ds, "mixture_k2").d, dtypes=("fp32", "bf16", "fp16", "int8"),
                            n_cats=data.ad_cats.shape[1], ranking_hidden=p.cfg(ds, "ranking").hidden,
                            scoring_csv=scoring_csv, preset=p.name)
        write_rows(comp, path)
        frames.append(comp)
        prec_rows = eval_rows(data, p.precision_users.get(ds), seed=0)
        tuned = None
        if tune:
            budget = None if tune_budget_s is None else tune_budget_s - (time.monotonic() - t0)
            if budget is not None and budget <= 0:
                if ds != datasets[0]:
                    raise tuning.TuningIncomplete(f"tuning stopped at its time budget ({tune_budget_s:g} s) before "
                                                  f"{ds}'s tuning began: the same call again resumes there")
                budget = 1e-9  # the first tuning's first runs start whatever is left: every call gets somewhere
            tuned, val = tune_models(data, p, models=models, device=device, progress=progress, workers=workers,
                                     runs_file=None if tuned_file is None else tuning.runs_file_of(tuned_file),
                                     lengths=tune_lengths, budget_s=budget, refine=refine, split=tune_split,
                                     grid=tune_grid)
            if settings:
                tuned = {m: (cfg, f"{note} at {settings}") for m, (cfg, note) in tuned.items()}
                val["scorer"] = val["scorer"] + f" at {settings}"
            val = relabel(val, experiment)
            write_rows(val, path)
            frames.append(val)
            if tuned_file is not None:
                tuning.save_tuned(tuned_file, ds, p.name, tuned)
        elif tuned_file is not None:
            tuned = tuning.load_tuned(tuned_file, ds, p.name, tuple(MODELS) if models is None else tuple(models))
        elif settings:  # untuned, at changed settings: the rows say which
            tuned = {m: (p.cfg(ds, m), UNTUNED_WITH + settings)
                     for m in (tuple(MODELS) if models is None else tuple(models))}
        # written per model: a cut-off run keeps what it did (into an existing table, a seed cut
        # part-way holds its finished models' new rows beside the others' old ones: train into a
        # fresh --out and merge, as the GPU sessions do)
        for seed in (p.seeds if seeds is None else seeds):
            frame, trained = run_expert_count(data, p, seeds=[seed], models=models, device=device, progress=progress,
                                              tuned=tuned, tops_dir=Path(out) / "tops" if save_tops else None,
                                              on_model=lambda rows: write_rows(relabel(rows, experiment), path))
            prec = [run_precision(tm, prec_rows, preset=p.name, trained_as=(tuned or {}).get(name, (None, None))[1])
                    for (name, _), tm in sorted(trained.items()) if name == "mixture_k2"]
            done = relabel(pd.concat([frame, *prec], ignore_index=True), experiment)
            write_rows(done, path)
            frames.append(done)
            if progress:
                print(f"{ds} seed {seed}: wrote {len(done)} rows to {path}", flush=True)
        if progress:
            print(recall_table(load_results(path).query("preset == @p.name"), ds).to_string(), flush=True)
    return pd.concat(frames, ignore_index=True)
