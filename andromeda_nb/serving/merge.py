"""The exact merge of per-shard answers.

A sharded pool splits its slots among shards (workers, GPUs), each a
:class:`~andromeda_nb.pipeline.Pool` answering a request over its own slots. Each shard's top-k is
exact over its slots, so the whole pool's top-k is the top-k of their union, in the order of
docs/design.md's contract: score descending, ties to the lower ad id, pads (id -1, score -inf)
last. A genuine ad scored -inf still ranks ahead of every pad.

Exact only if every shard returned at least ``min(k, its n_scored)`` ads and no ad answered from
two shards; both are checked, so a partial answer is refused rather than presented as whole.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..pipeline.pool import Retrieved


def merge_topk(parts: Sequence[Retrieved], k: int) -> Retrieved:
    """The top-``k`` of the union of the shards' answers ``parts`` (one request), with their
    eligible and scored counts summed.

    Raises:
        ValueError: ``k`` not a positive int, no parts, a part that is not a one-request answer
            (1-D ids and scores of one length, int and float, no NaN, pads as id -1 with score
            -inf), a part with fewer than ``min(k, n_scored)`` ads, or an ad id in two parts.
    """
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if not len(parts):
        raise ValueError("merge_topk needs at least one shard's answer")
    ids, scores = [], []
    for i, p in enumerate(parts):
        a, s = np.asarray(p.ids), np.asarray(p.scores)
        if a.ndim != 1 or s.shape != a.shape or a.dtype.kind not in "iu" or s.dtype.kind != "f":
            raise ValueError(f"shard {i}: ids and scores must be 1-D int and float arrays of one length, "
                             f"got {a.dtype} {a.shape} and {s.dtype} {s.shape}")
        if np.isnan(s).any():
            raise ValueError(f"shard {i}: a NaN score (an answer never holds one)")
        if a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:
            raise ValueError(f"shard {i}: ad ids must fit int64")
        n_scored, n_eligible = int(p.n_scored), int(p.n_eligible)
        if not 0 <= n_scored <= n_eligible:
            raise ValueError(f"shard {i}: counts must hold 0 <= n_scored <= n_eligible, got {n_scored} and "
                             f"{n_eligible}")
        a = a.astype(np.int64)
        pad = a < 0
        if (a[pad] != -1).any() or (s[pad] != -np.inf).any():
            raise ValueError(f"shard {i}: pads must be id -1 with score -inf")
        if int((~pad).sum()) < min(k, n_scored):
            raise ValueError(f"shard {i}: {int((~pad).sum())} ads for k = {k} with {n_scored} scored: a partial "
                             "answer (the merge would not be exact)")
        if np.unique(a[~pad]).size != int((~pad).sum()):
            raise ValueError(f"shard {i}: an ad id appears twice in its answer")
        ids.append(a[~pad])
        # ranked as returned (float32): a score that only a wider type tells apart ties, to the lower id
        scores.append(s[~pad].astype(np.float32))
    ids, scores = np.concatenate(ids), np.concatenate(scores)
    if np.unique(ids).size != ids.size:
        raise ValueError("an ad id answered from two shards (shards own disjoint ads)")
    order = np.lexsort((ids, -scores))[:k]  # score descending, then the lower ad id
    out_ids = np.full(k, -1, np.int64)
    out_scores = np.full(k, -np.inf, np.float32)
    out_ids[:order.size], out_scores[:order.size] = ids[order], scores[order]
    return Retrieved(ids=out_ids, scores=out_scores, n_eligible=sum(int(p.n_eligible) for p in parts),
                     n_scored=sum(int(p.n_scored) for p in parts))
