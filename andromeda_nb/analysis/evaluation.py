"""Run real users' requests through the device pipeline, check every answer against the oracle and
measure recall of held-out interactions (used by the quickstart notebook)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from .. import checks, reference
from ..match.api import DeviceTargetingIndex
from . import plots
from .metrics import recall_at_k
from ..pipeline.retrieve import retrieve
from ..score.api import DeviceAdTable, KernelConfig, score_ads
from ..score.table import DeviceRequest
from ..targeting import TargetingIndex


@dataclass
class DeviceWorld:
    """A world's ad table and targeting index on the device."""

    table: DeviceAdTable
    index: DeviceTargetingIndex

    @classmethod
    def from_world(cls, world, layout: str = "tiles") -> "DeviceWorld":
        """Copy ``world.table`` (an AdTable) and the index built from ``world.rules`` to the device."""
        return cls(DeviceAdTable(world.table, layout), DeviceTargetingIndex(TargetingIndex(world.rules)))


def run_users(world, users, k: int = 100, ks=(10, 50, 100), layout: str = "tiles",
              check: bool = True, progress: bool = True) -> pd.DataFrame:
    """Retrieve the top-k for each user on the device (targeting -> fused gated scoring -> block
    top-K, the user's training items excluded) and check each answer.

    Checks per user (`docs/design.md`, "Checking against the reference"): ``exact`` — the answer equals the
    oracle's top-k run on the kernel's own fp32 scores of the eligible ads (same ids, order, scores,
    count); ``near_f64`` — against float64 oracle scores of the model the kernel computes (its math
    mode), ids differ only among near-ties of the k-th score or of the gate; ``eligible_ok`` — the eligible count equals the oracle's match.

    Args:
        world: a :class:`~andromeda_nb.datasets.movielens.MovieLensWorld` (or anything with
            ``table, rules, request(u), profile(u), seen_slots(u), heldout(u), eligible(u, exclude_seen)``).
        users: user ids to run.
        k: top-k size; ``ks`` the recall cut-offs (each <= k).

    Returns:
        One row per user: ``user, n_eligible, recall@<k>..., exact, near_f64, eligible_ok,
        host_seconds`` (host wall time of the device call; in the simulator a correctness run, never a
        speed figure).
    """
    if max(ks) > k:
        raise ValueError(f"recall cut-offs {list(ks)} must not exceed k={k}")
    dev = DeviceWorld.from_world(world, layout)
    rows = []
    for user in tqdm(list(users), desc="users", disable=not progress):
        req = world.request(user)
        t0 = time.perf_counter()
        out = retrieve(req, dev.table, dev.index, world.profile(user), k, exclude_slots=world.seen_slots(user))
        host = time.perf_counter() - t0
        relevant = world.heldout(user)
        row = {"user": user, "n_eligible": out.n_eligible, "host_seconds": host}
        for cut in ks:
            row[f"recall@{cut}"] = recall_at_k(out.ids, relevant, cut)
        if check:
            mask = world.eligible(user, exclude_seen=True)
            kernel_scores = score_ads(req, dev.table).copy_to_host()
            row["exact"] = checks.compare_topk_exact(out.ids, out.scores, out.n_scored, kernel_scores, k,
                                                     world.table.ad_ids, mask).ok
            # the float64 oracle of the model the kernel computed (the default math="auto": fp16
            # math on an fp16 table); an ad whose K-th and (K+1)-th logits nearly tie may swap sets
            math = KernelConfig().with_math(DeviceRequest.of(req), dev.table).math
            row["near_f64"] = checks.compare_topk_float64(out.ids, reference.score(req, world.table, math=math), k,
                                                          world.table.ad_ids, mask,
                                                          checks.near_tie_ads(req, world.table, math)).ok
            row["eligible_ok"] = out.n_eligible == int(mask.sum())
        rows.append(row)
    return pd.DataFrame(rows)


def oracle_recall(world, users, ks=(10, 50, 100), targeting: bool = True) -> pd.DataFrame:
    """Float64 oracle recall per user (same pipeline semantics, no kernels): ``user, recall@<k>...``."""
    rows = []
    for user in users:
        if targeting:
            mask = world.eligible(user, exclude_seen=True)
        else:
            mask = np.ones(world.table.n_ads, bool)
            mask[world.seen_slots(user)] = False
        top = reference.retrieve(world.request(user), world.table, max(ks), eligible=mask)
        rows.append({"user": user, **{f"recall@{c}": recall_at_k(top.ids, world.heldout(user), c) for c in ks}})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------
# the quickstart notebook's tables, figure and findings

#: The per-user checks of :func:`run_users`, all of which must hold.
CHECKS = ("exact", "near_f64", "eligible_ok")
#: Columns of :func:`recall_comparison`, in order.
RECALL_SOURCES = ("device", "oracle_same_users", "oracle_all_users")


def sample_users(world, n_users: int | None, seed: int = 0) -> np.ndarray:
    """``n_users`` of ``world.users`` drawn without replacement by ``seed``, sorted (every user
    when ``n_users`` is None or at least their number).

    Raises:
        ValueError: ``n_users < 1``.
    """
    if n_users is None or n_users >= world.users.size:
        return np.asarray(world.users)
    if n_users < 1:
        raise ValueError(f"n_users must be >= 1 or None, got {n_users}")
    return np.sort(np.random.default_rng(seed).choice(world.users, n_users, replace=False))


def answer_checks(runs: pd.DataFrame) -> pd.Series:
    """Per check of :data:`CHECKS`, whether it held for every user of :func:`run_users`' table."""
    return runs[list(CHECKS)].all()


def recall_comparison(world, runs: pd.DataFrame, ks) -> pd.DataFrame:
    """Mean recall@k (rows ``recall@<k>``) of the device answers, of the float64 oracle on the same
    users, and of the oracle on every user of ``world`` (columns :data:`RECALL_SOURCES`): the device
    and the oracle agree up to near-ties; all users show how representative the sample is."""
    cols = [f"recall@{c}" for c in ks]
    oracle = oracle_recall(world, world.users, ks=ks).set_index("user")[cols]
    return pd.DataFrame({"device": runs[cols].mean(), "oracle_same_users": oracle.loc[runs["user"]].mean(),
                         "oracle_all_users": oracle.mean()})[list(RECALL_SOURCES)]


def recall_metrics(table: pd.DataFrame) -> dict[str, float]:
    """``recall@<k>_device``, ``recall@<k>_oracle_same_users`` and ``recall@<k>_oracle_all_users``
    from :func:`recall_comparison`."""
    return {f"{metric}_{source}": float(table.loc[metric, source]) for metric in table.index for source in table.columns}


def run_note(experts: int, k_experts: int, dtype: str, backend: str, model: str = "svd") -> str:
    """The source note of the quickstart figure: the model (``"svd"``: the placeholder fit; else
    the trained model's name and how it was trained), the backend, and on the simulator that the run
    checks correctness and is no speed figure."""
    sim = " (simulator: correctness run, not a speed figure)" if backend == "cudasim" else ""
    what = "placeholder SVD model" if model == "svd" else f"trained {model}"
    return f"MovieLens-100K, E={experts}, K={k_experts}, {dtype}; backend {backend}{sim}; {what}"


def quickstart_figure(table: pd.DataFrame, runs: pd.DataFrame, n_ads: int, note: str):
    """Left: :func:`recall_comparison` as bars. Right: the eligible fraction of the pool per request."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = {"device": f"device pipeline ({len(runs)} users)", "oracle_same_users": "float64 oracle, same users",
              "oracle_all_users": "float64 oracle, all users"}
    table.rename(columns=labels).plot.bar(ax=axes[0], rot=0)
    axes[0].set(title="recall@k of held-out interactions", ylabel="recall (fraction of held-out items)", xlabel="")
    axes[1].hist(runs["n_eligible"] / n_ads, bins=20)
    axes[1].yaxis.set_major_locator(plt.MaxNLocator(integer=True))
    axes[1].set(title="eligible ads per request", xlabel=f"fraction of the {n_ads:,} ads eligible", ylabel="requests")
    plots.source_note(fig, note)
    return fig


def quickstart_findings(runs: pd.DataFrame, table: pd.DataFrame, ceiling: pd.Series, model: str = "svd",
                        trained: str = "") -> str:
    """The quickstart's conclusions as Markdown bullets, quoting ``runs`` (:func:`run_users`),
    ``table`` (:func:`recall_comparison`) and ``ceiling`` (per user, the held-out fraction that
    passes targeting); ``model`` the served model (``"svd"``: the placeholder) and ``trained`` how
    it was trained."""
    ok = answer_checks(runs)
    k = table.index[-1]
    device, same, every = (table.loc[k, c] for c in RECALL_SOURCES)
    return "\n".join([
        f"* {len(runs)} request{'s' if len(runs) != 1 else ''} ran through targeting, fused scoring and top-K on the device; "
        + ("every answer equals the oracle's (exact on the kernel's scores, near-ties only against float64, "
           "the same eligible count)." if ok.all() else f"**checks failed**: {', '.join(ok.index[~ok])}."),
        f"* {k}: {device:.3f} on the device against {same:.3f} for the float64 oracle on the same users and "
        f"{every:.3f} on every user. "
        + ("These belong to the **placeholder** model (an untrained gate over SVD-derived experts): a pipeline "
           "check, not the quality claim; notebooks 05 and 06 train real models." if model == "svd" else
           f"These belong to the trained `{model}` ({trained}"
           + ("; the smoke preset's few steps check the pipeline, they train no useful model" if "smoke" in trained
              else "") + "); notebook 05 compares the models at full size, tuned, over five seeds, beside tuned "
           "baselines."),
        f"* Targeting caps recall: on average {ceiling.mean():.0%} of a user's held-out movies are eligible at all "
        f"(median {ceiling.median():.0%}).",
    ])
