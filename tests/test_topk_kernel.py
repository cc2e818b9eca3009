"""Block top-K against the oracle: hypothesis-generated scores with NaN, +-inf, ties, eligibility."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from andromeda_nb import launch, oracle
from andromeda_nb.kernels.topk import buffer_capacity, merge_kernel, topk_scores_kernel
from andromeda_nb.targeting import bits_from_mask
from andromeda_nb.topk import MAX_K, topk_scores

SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0]


@st.composite
def score_cases(draw):
    n = draw(st.integers(0, 300))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    picked = draw(st.lists(st.floats(width=32, allow_nan=True), min_size=1, max_size=5))
    pool_size = draw(st.sampled_from([0, 3, 50, 10_000]))  # small pools force repeated values
    pool = np.concatenate([np.array(picked + SPECIALS, np.float32),
                           rng.standard_normal(pool_size).astype(np.float32)])
    scores = pool[rng.integers(0, pool.size, n)]
    k = draw(st.one_of(st.integers(1, 8), st.integers(1, 400), st.sampled_from([max(n, 1), n + 1])))
    use_elig = draw(st.booleans())
    eligible = (rng.random(n) < draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))) if use_elig else None
    ids = rng.choice(4 * n + 1, n, replace=False).astype(np.int64) if draw(st.booleans()) else None
    return scores, k, eligible, ids


@given(score_cases())
def test_topk_matches_oracle(case):
    scores, k, eligible, ids = case
    got = topk_scores(scores, k, eligible=eligible, ids=ids)
    want = oracle.topk(scores, k, ids=ids, eligible=eligible)
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.scores, want.scores)
    assert got.count == want.count
    got_ids = got.ids[got.ids >= 0]
    assert len(set(got_ids.tolist())) == got_ids.size  # no duplicates


@pytest.mark.parametrize("order", ["ascending", "descending", "equal"])
def test_adversarial_orders_sizes_around_block_multiples(order):
    block = launch.default_block()
    for n in (block - 1, block, block + 1, 3 * block + 5):
        if order == "ascending":
            scores = np.arange(n, dtype=np.float32)
        elif order == "descending":
            scores = np.arange(n, 0, -1).astype(np.float32)
        else:
            scores = np.full(n, 2.5, np.float32)
        for k in (1, block // 2, n):
            got = topk_scores(scores, k)
            want = oracle.topk(scores, k)
            np.testing.assert_array_equal(got.ids, want.ids)
            np.testing.assert_array_equal(got.scores, want.scores)


def test_bitset_eligibility_padding_bits_refused():
    n = 70
    words = bits_from_mask(np.ones(n, bool))
    words[-1] |= np.uint64(1) << np.uint64(63)  # a padding bit
    with pytest.raises(ValueError, match="padding"):
        topk_scores(np.zeros(n, np.float32), 3, eligible=words)


def test_kernels_write_every_output_element():
    """Poison the outputs, then check every element was written (pads included)."""
    cuda = launch.cuda()
    block, k, n = launch.default_block(), 9, 50
    scores = np.random.default_rng(7).standard_normal(n).astype(np.float32)
    scores[::3] = np.nan
    grid = 3
    cand_s = cuda.to_device(np.full(grid * k, 12345.0, np.float32))
    cand_i = cuda.to_device(np.full(grid * k, 777, np.int32))
    counts = cuda.to_device(np.zeros(1, np.int64))
    cap = buffer_capacity(k, block)
    topk_scores_kernel(cap, block, False, False)[grid, block](
        cuda.to_device(scores), launch.dummy(np.uint64), launch.dummy(np.int64), n, k, cand_s, cand_i, counts)
    cs, ci = cand_s.copy_to_host(), cand_i.copy_to_host()
    assert not (cs == 12345.0).any() and not (ci == 777).any()
    out_s = cuda.to_device(np.full(k + 0, 999.0, np.float32))
    out_slot = cuda.to_device(np.full(k, 555, np.int32))
    out_id = cuda.to_device(np.full(k, 555, np.int64))
    merge_kernel(cap, block, False)[1, block](cand_s, cand_i, grid * k, grid * k, k, launch.dummy(np.int64),
                                              out_s, out_slot, out_id, 1)
    want = oracle.topk(scores, k)
    np.testing.assert_array_equal(out_id.copy_to_host(), want.ids)
    np.testing.assert_array_equal(out_s.copy_to_host(), want.scores)
    assert counts.copy_to_host()[0] == np.sum(~np.isnan(scores))


def test_deterministic_run_to_run():
    scores = np.random.default_rng(3).integers(0, 5, 500).astype(np.float32)
    first = topk_scores(scores, 40)
    for _ in range(2):
        again = topk_scores(scores, 40)
        np.testing.assert_array_equal(again.ids, first.ids)


@pytest.mark.parametrize("k,exc,msg", [(0, ValueError, "1 <= k"), (-3, ValueError, "1 <= k"),
                                       (MAX_K + 1, ValueError, str(MAX_K)), (2.0, TypeError, "int"),
                                       (True, TypeError, "int")])
def test_bad_k_is_refused(k, exc, msg):
    with pytest.raises(exc, match=msg):
        topk_scores(np.zeros(10, np.float32), k)


def test_bad_score_arrays_are_refused():
    with pytest.raises(TypeError, match="float32"):
        topk_scores(np.zeros(10, np.float64), 3)
    with pytest.raises(ValueError, match="1-D"):
        topk_scores(np.zeros((2, 5), np.float32), 3)
    with pytest.raises(ValueError, match="contiguous"):
        topk_scores(np.zeros(20, np.float32)[::2], 3)
    with pytest.raises(ValueError, match="shape"):
        topk_scores(np.zeros(10, np.float32), 3, eligible=np.ones(9, bool))
    with pytest.raises(ValueError, match="shape"):
        topk_scores(np.zeros(10, np.float32), 3, ids=np.arange(11))


def test_merge_tree_with_many_blocks(monkeypatch):
    """Force a multi-level merge tree (fan-in 2) and compare with the oracle."""
    import andromeda_nb.topk as T

    monkeypatch.setattr(T, "MERGE_FANIN", 2)
    monkeypatch.setattr(launch, "SIM_MAX_BLOCKS", 8)
    rng = np.random.default_rng(11)
    scores = rng.integers(0, 50, 900).astype(np.float32)  # many ties
    ids = rng.permutation(5000)[:900].astype(np.int64)
    for k in (1, 5, 33):
        got = topk_scores(scores, k, ids=ids)
        want = oracle.topk(scores, k, ids=ids)
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.scores, want.scores)
