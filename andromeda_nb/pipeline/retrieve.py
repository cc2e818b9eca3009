"""``retrieve``: one request (or a batch) through targeting match, fused scoring and block top-K.

Everything stays on the device; only each request's k ad ids, k scores and the eligible count
are copied back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..match.api import DeviceTargetingIndex, match_eligible
from ..model import Request
from ..score.api import DeviceAdTable, score_topk
from ..targeting import table_slots
from ..topk.api import check_k


@dataclass(frozen=True)
class Retrieved:
    """One request's answer: ``ids [k]`` int64 ad ids (pads -1), ``scores [k]`` float32 (pads -inf),
    best first; ``n_eligible`` ads passed targeting; ``n_scored`` of them got a non-NaN score."""

    ids: np.ndarray
    scores: np.ndarray
    n_eligible: int
    n_scored: int


def retrieve(requests: Request | Sequence[Request], table: DeviceAdTable,
             index: DeviceTargetingIndex | None, profiles: Mapping | Sequence[Mapping] | None,
             k: int, exclude_slots=None) -> Retrieved | list[Retrieved]:
    """Targeting -> fused gather-gate-score -> top-K, on the device.

    Args:
        requests: one :class:`~andromeda_nb.model.Request` or a sequence (a batch).
        table: the device ad table; its slots must be the index's slots.
        index: the device targeting index, or None to score the whole pool.
        profiles: one profile ``{category: values}`` per request (a single mapping for a single
            request); ignored when ``index`` is None.
        k: ``1 <= k <= topk.MAX_K`` (4096; :func:`~andromeda_nb.score.api.score_topk`).
        exclude_slots: per request, optional slots to drop after matching (e.g. ads already seen).

    Returns:
        :class:`Retrieved` for a single request, a list for a batch.

    Raises:
        TypeError / ValueError / RuleError: mismatched pool sizes or batch lengths, bad k, bad
            profile (all before any launch for that request).
    """
    k = check_k(k)
    single = isinstance(requests, Request)
    reqs = [requests] if single else list(requests)
    if index is not None:
        if index.n_ads != table.n_ads:
            raise ValueError(f"index has {index.n_ads} ads but the table has {table.n_ads}")
        if table.host_ad_ids is not None and not np.array_equal(index.index.ad_ids, table.host_ad_ids):
            raise ValueError("index and table disagree on the ad id of some slot")
        profs = [profiles] if single else list(profiles)
        if len(profs) != len(reqs):
            raise ValueError(f"{len(reqs)} requests but {len(profs)} profiles")
    excl = [exclude_slots] if single else (list(exclude_slots) if exclude_slots is not None else [None] * len(reqs))
    if len(excl) != len(reqs):
        raise ValueError(f"{len(reqs)} requests but {len(excl)} exclude lists")
    out = []
    for i, req in enumerate(reqs):
        if index is None:
            mask = None
            if excl[i] is not None and len(excl[i]):
                mask = np.ones(table.n_ads, dtype=bool)
                mask[table_slots(excl[i], table.n_ads)] = False
            top = score_topk(req, table, k, eligible=mask)
            n_elig = table.n_ads if mask is None else int(mask.sum())
        else:
            elig = match_eligible(index, profs[i], exclude_slots=excl[i])
            top = score_topk(req, table, k, eligible=elig.words)
            n_elig = elig.count
        out.append(Retrieved(ids=top.ids, scores=top.scores, n_eligible=n_elig, n_scored=top.count))
    return out[0] if single else out
