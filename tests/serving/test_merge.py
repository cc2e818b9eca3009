"""The exact merge of per-shard answers against the reference's top-k over the whole pool."""

import numpy as np
import pytest

from andromeda_nb import reference
from andromeda_nb.pipeline import Retrieved
from andromeda_nb.serving import merge_topk


def shard_answer(scores, ids, eligible, k):
    top = reference.topk(scores, k, ids=ids, eligible=eligible)
    ok = eligible & ~np.isnan(scores)
    return Retrieved(ids=top.ids, scores=top.scores.astype(np.float32), n_eligible=int(eligible.sum()),
                     n_scored=int(ok.sum()))


@pytest.mark.parametrize("n_shards", [1, 2, 5])
def test_merge_equals_the_whole_pools_top_k(rng, n_shards):
    for _ in range(20):
        n = int(rng.integers(1, 300))
        k = int(rng.integers(1, 80))
        # few distinct values: ties within and across shards; genuine -inf and NaN scores too
        scores = rng.integers(-4, 5, n).astype(np.float32)
        scores[rng.random(n) < 0.05] = -np.inf
        scores[rng.random(n) < 0.05] = np.nan
        ids = rng.permutation(10 * n)[:n].astype(np.int64)
        eligible = rng.random(n) < rng.choice([0.05, 0.5, 1.0])
        shard = rng.integers(0, n_shards, n)  # some shards may own nothing
        parts = [shard_answer(scores[shard == s], ids[shard == s], eligible[shard == s], k) for s in range(n_shards)]
        got = merge_topk(parts, k)
        want = reference.topk(scores, k, ids=ids, eligible=eligible)
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.scores, want.scores.astype(np.float32))
        assert got.n_eligible == eligible.sum() and got.n_scored == (eligible & ~np.isnan(scores)).sum()


def test_bad_or_partial_answers_are_refused():
    one = Retrieved(ids=np.array([5, 3, -1]), scores=np.array([2.0, 1.0, -np.inf], np.float32), n_eligible=2,
                    n_scored=2)
    for k in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="k must"):
            merge_topk([one], k)
    with pytest.raises(ValueError, match="at least one"):
        merge_topk([], 3)
    short = Retrieved(ids=np.array([7]), scores=np.array([9.0], np.float32), n_eligible=4, n_scored=4)
    with pytest.raises(ValueError, match="partial"):
        merge_topk([one, short], 3)
    with pytest.raises(ValueError, match="two shards"):
        merge_topk([one, Retrieved(ids=np.array([3]), scores=np.array([0.5], np.float32), n_eligible=1,
                                   n_scored=1)], 3)
    for bad in (Retrieved(ids=np.array([1, 2]), scores=np.array([np.nan, 1.0], np.float32), n_eligible=2, n_scored=2),
                Retrieved(ids=np.array([1, -2]), scores=np.array([1.0, -np.inf], np.float32), n_eligible=1,
                          n_scored=1),
                Retrieved(ids=np.array([1, -1]), scores=np.array([1.0, 0.0], np.float32), n_eligible=1, n_scored=1),
                Retrieved(ids=np.array([[1]]), scores=np.array([[1.0]], np.float32), n_eligible=1, n_scored=1),
                Retrieved(ids=np.array([1.0]), scores=np.array([1.0], np.float32), n_eligible=1, n_scored=1),
                Retrieved(ids=np.array([2 ** 63], np.uint64), scores=np.array([1.0], np.float32), n_eligible=1,
                          n_scored=1),
                Retrieved(ids=np.array([1]), scores=np.array([1.0], np.float32), n_eligible=1, n_scored=-5),
                Retrieved(ids=np.array([1]), scores=np.array([1.0], np.float32), n_eligible=1, n_scored=2),
                Retrieved(ids=np.array([1, 2]), scores=np.array([1.0, 0.5], np.float32), n_eligible=1, n_scored=2),
                Retrieved(ids=np.array([8, 8]), scores=np.array([1.0, 1.0], np.float32), n_eligible=2, n_scored=2)):
        with pytest.raises(ValueError, match="shard 1"):
            merge_topk([one, bad], 3)
    # more scored than eligible is refused as such (not only where it also makes the answer partial)
    with pytest.raises(ValueError, match="shard 1: counts must hold 0 <= n_scored <= n_eligible"):
        merge_topk([one, Retrieved(ids=np.array([1, 2]), scores=np.array([1.0, 0.5], np.float32), n_eligible=1,
                                   n_scored=2)], 3)
    # a genuine -inf ad ranks ahead of every pad
    low = Retrieved(ids=np.array([9, -1]), scores=np.array([-np.inf, -np.inf], np.float32), n_eligible=1, n_scored=1)
    got = merge_topk([one, low], 4)
    assert got.ids.tolist() == [5, 3, 9, -1]
    # ranked as returned, float32: scores only float64 tells apart tie, and the lower id leads
    wide = Retrieved(ids=np.array([5]), scores=np.array([1.00000001]), n_eligible=1, n_scored=1)
    narrow = Retrieved(ids=np.array([3]), scores=np.array([1.0], np.float32), n_eligible=1, n_scored=1)
    assert merge_topk([wide, narrow], 2).ids.tolist() == [3, 5]
