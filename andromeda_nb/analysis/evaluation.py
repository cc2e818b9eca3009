"""Run real users' requests through the device pipeline, check every answer against the oracle and
measure recall of held-out interactions (used by the quickstart notebook)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from tqdm import tqdm

from .. import checks, reference
from ..match.api import DeviceTargetingIndex
from .metrics import recall_at_k
from ..pipeline.retrieve import retrieve
from ..score.api import DeviceAdTable, score_ads
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

    Checks per user (DESIGN.md, "Checking against the oracle"): ``exact`` — the answer equals the
    oracle's top-k run on the kernel's own fp32 scores of the eligible ads (same ids, order, scores,
    count); ``near_f64`` — against float64 oracle scores, ids differ only among near-ties of the
    k-th score; ``eligible_ok`` — the eligible count equals the oracle's match.

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
            row["near_f64"] = checks.compare_topk_float64(out.ids, reference.score(req, world.table), k,
                                                          world.table.ad_ids, mask).ok
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
