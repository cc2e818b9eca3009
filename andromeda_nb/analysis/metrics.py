"""Retrieval quality metrics (host side, numpy only).

Conventions shared by every function here:

- A retrieved list is a 1-D integer array of ad ids, best first, as returned by top-K (`docs/design.md`,
  "Top-K"): when fewer than k ads were eligible it is padded with id ``-1``. Negative ids
  are pads and never count as hits. A repeated id counts once.
- A relevant set is any iterable of ad ids (the user's held-out positives); duplicates count once.
- ``k`` is a positive int. When the retrieved list is shorter than ``k`` all of it is used (the
  denominator of recall is still the number of relevant items; for :func:`topk_overlap` it is
  still ``k``).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np


def check_k(k) -> int:
    """``k`` as an int, or ValueError: a cut-off is a positive int (not a bool)."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    return int(k)


def check_ks(ks) -> list[int]:
    """``ks`` as a list of cut-offs (:func:`check_k`), or ValueError: none, or a bad one."""
    ks = [check_k(k) for k in ks]
    if not ks:
        raise ValueError("ks must name at least one cut-off")
    return ks


def _ids(name: str, x) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of ids, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer ids, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _top(name: str, retrieved, k: int) -> np.ndarray:
    top = _ids(name, retrieved)[:k]
    return np.unique(top[top >= 0])


def recall_at_k(retrieved_ids, relevant_ids, k: int) -> float:
    """Recall at k: the fraction of the relevant items found among the first k retrieved.

    ``recall@k = |top_k(retrieved) ∩ relevant| / |relevant|`` (the standard definition, e.g.
    Manning, Raghavan & Schütze, *Introduction to Information Retrieval*, 2008, sec. 8.3, applied
    to a cut-off list). Pads (negative ids) are ignored; duplicates count once.

    Args:
        retrieved_ids: ``[n]`` integer ad ids, best first (pads ``-1``); ``n`` may differ from k.
        relevant_ids: iterable of integer ad ids (the held-out positives).
        k: cut-off, ``k >= 1``.

    Returns:
        A float in ``[0, 1]``.

    Raises:
        ValueError: ``k < 1``, a retrieved array that is not 1-D, or an empty relevant set (recall
            is undefined there; callers skip users without held-out items).
        TypeError: non-integer ids.
    """
    k = check_k(k)
    if not isinstance(relevant_ids, np.ndarray):
        relevant_ids = np.asarray(list(relevant_ids))
    rel = np.unique(_ids("relevant_ids", relevant_ids))
    if rel.size == 0:
        raise ValueError("recall is undefined for an empty relevant set (skip users without held-out items)")
    top = _top("retrieved_ids", retrieved_ids, k)
    return float(np.intersect1d(top, rel, assume_unique=True).size / rel.size)


def mean_recall(
    retrieved: Sequence, relevant: Sequence, ks: Iterable[int] = (10, 50, 100)
) -> dict[int, float]:
    """Mean over users of :func:`recall_at_k`, for each cut-off in ``ks`` (macro average: every
    user weighs the same).

    Args:
        retrieved: one retrieved id array per user (best first, pads ``-1``).
        relevant: one relevant id collection per user, aligned with ``retrieved``.
        ks: cut-offs.

    Returns:
        ``{k: mean recall@k}``.

    Raises:
        ValueError: the two lists differ in length or are empty, or a user has no relevant items
            (filter those users out first), or a bad ``k``.
    """
    retrieved, relevant = list(retrieved), list(relevant)
    if len(retrieved) != len(relevant):
        raise ValueError(f"{len(retrieved)} retrieved lists but {len(relevant)} relevant sets")
    if not retrieved:
        raise ValueError("mean_recall needs at least one user")
    ks = check_ks(ks)
    return {k: float(np.mean([recall_at_k(r, s, k) for r, s in zip(retrieved, relevant)])) for k in ks}


def topk_overlap(a_ids, b_ids, k: int) -> float:
    """Overlap of two top-k lists: ``|set(a[:k]) ∩ set(b[:k])| / k`` (pads ``-1`` ignored).

    1.0 means the same k ids (in any order); use it to compare a kernel's or a lower precision's
    top-k with the oracle's. Lists shorter than k (or padded) can reach at most
    ``(number of real ids) / k``.

    Args:
        a_ids, b_ids: ``[n]`` integer ad ids, best first.
        k: ``k >= 1``.

    Raises:
        ValueError: ``k < 1`` or an input that is not 1-D.
        TypeError: non-integer ids.
    """
    k = check_k(k)
    a = _top("a_ids", a_ids, k)
    b = _top("b_ids", b_ids, k)
    return float(np.intersect1d(a, b, assume_unique=True).size / k)


def summarize(recalls: Mapping[int, float], prefix: str = "recall@") -> dict[str, float]:
    """``{10: 0.1, 50: 0.3}`` -> ``{"recall@10": 0.1, "recall@50": 0.3}`` (for result tables)."""
    return {f"{prefix}{k}": float(v) for k, v in recalls.items()}
