"""Retrieval metrics against hand-computed cases."""

import math

import numpy as np
import pytest

from andromeda_nb.analysis.metrics import mean_recall, recall_at_k, summarize, topk_overlap


def test_recall_hand_cases():
    retrieved = np.array([5, 3, 9, 1, -1, -1])
    relevant = [3, 1, 7, 8]
    assert recall_at_k(retrieved, relevant, 1) == 0.0          # 5 not relevant
    assert recall_at_k(retrieved, relevant, 2) == 0.25         # {3}
    assert recall_at_k(retrieved, relevant, 4) == 0.5          # {3, 1}
    assert recall_at_k(retrieved, relevant, 6) == 0.5          # pads never hit
    assert recall_at_k(retrieved, relevant, 100) == 0.5        # k beyond the list: all of it
    assert recall_at_k(retrieved, set(relevant), 4) == 0.5     # any iterable
    assert recall_at_k(retrieved, np.array(relevant), 4) == 0.5


def test_recall_duplicates_and_pads():
    # a repeated retrieved id counts once; a repeated relevant id counts once; -1 is never relevant
    assert recall_at_k(np.array([2, 2, 2]), [2, 2, 4], 3) == 0.5
    assert recall_at_k(np.array([-1, -1]), [1], 2) == 0.0
    assert recall_at_k(np.array([-1, 4]), [-1, 4], 2) == 0.5  # a -1 "relevant" id can never be found
    assert recall_at_k(np.array([], dtype=np.int64), [1, 2], 5) == 0.0


def test_recall_errors():
    with pytest.raises(ValueError, match="empty relevant"):
        recall_at_k(np.array([1, 2]), [], 2)
    for bad_k in (0, -3, 1.5, True):
        with pytest.raises(ValueError, match="k must be"):
            recall_at_k(np.array([1]), [1], bad_k)
    with pytest.raises(ValueError, match="1-D"):
        recall_at_k(np.array([[1, 2]]), [1], 1)
    with pytest.raises(TypeError):
        recall_at_k(np.array([1.0, 2.0]), [1], 1)


def test_mean_recall():
    got = mean_recall(
        [np.array([1, 2, 3]), np.array([9, -1, -1])],
        [[1, 3, 5, 7], [9]],
        ks=(1, 3),
    )
    # user 0: @1 -> 1/4, @3 -> 2/4; user 1: @1 -> 1, @3 -> 1
    assert got == {1: pytest.approx((0.25 + 1.0) / 2), 3: pytest.approx((0.5 + 1.0) / 2)}
    assert summarize(got) == {"recall@1": got[1], "recall@3": got[3]}
    with pytest.raises(ValueError, match="retrieved lists"):
        mean_recall([np.array([1])], [[1], [2]], ks=(1,))
    with pytest.raises(ValueError, match="at least one user"):
        mean_recall([], [], ks=(1,))
    with pytest.raises(ValueError, match="at least one cut-off"):
        mean_recall([np.array([1])], [[1]], ks=())
    with pytest.raises(ValueError, match="empty relevant"):
        mean_recall([np.array([1])], [[]], ks=(1,))


def test_topk_overlap():
    a = np.array([1, 2, 3, 4])
    b = np.array([4, 3, 9, 8])
    assert topk_overlap(a, b, 1) == 0.0
    assert topk_overlap(a, b, 2) == 0.0
    assert topk_overlap(a, b, 4) == 0.5
    assert topk_overlap(a, a, 4) == 1.0
    assert topk_overlap(a, a[::-1], 4) == 1.0  # order does not matter
    # pads ignored; k beyond the lists keeps the denominator k
    assert topk_overlap(np.array([1, -1, -1]), np.array([1, -1, -1]), 3) == pytest.approx(1 / 3)
    assert topk_overlap(a, a, 8) == 0.5
    assert math.isclose(topk_overlap(np.array([], np.int64), a, 2), 0.0)
    with pytest.raises(ValueError):
        topk_overlap(a, b, 0)
