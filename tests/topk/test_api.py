"""topk/api.py: topk_scores and topk_batch against the oracle on every path (k = 1 to k = n, NaN,
+-inf, -0, ties, eligible sets, ids), and their input checks, all before any launch."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from andromeda_nb.device import launch
from andromeda_nb.targeting import bits_from_mask
from andromeda_nb.topk import api as T
from andromeda_nb.topk.config import TopKConfig
from andromeda_nb.topk.seed import SeedWorkspace

from ..helpers import poison_device_arrays
from .helpers import batch_bitset, batch_cases, check_topk, pooled_scores, score_cases, small_seed


@pytest.fixture(autouse=True)
def poisoned_device_memory(monkeypatch):
    """Device arrays start as 0xA5 bytes (simulator), so an output element left unwritten shows."""
    if launch.backend.is_simulator():
        poison_device_arrays(monkeypatch)


# ----------------------------------------------------------------------------- topk_scores

@given(score_cases())
def test_topk_matches_oracle(case):
    scores, k, eligible, ids = case
    got = T.topk_scores(scores, k, eligible=eligible, ids=ids)
    check_topk(got, scores, k, eligible, ids)
    got_ids = got.ids[got.ids >= 0]
    assert len(set(got_ids.tolist())) == got_ids.size  # no duplicates


#: seeded under small_seed (at least 1,024 scores), a multiple of neither the 32-thread block nor the
#: 64-bit word
PATH_N = 1100


@pytest.mark.parametrize("path", ["batched", "filter", "scan", "unseeded"])
def test_every_path_from_k_1_to_k_n(rng, path):
    """Each path of topk_scores at k = 1, a middle k (with an eligible mask and ids) and k = n, on
    scores with NaN, +-inf, -0 and ties: exactly the oracle's. At k = 1 the single-request seed
    applies, at k = n it does not (the seeded paths run unseeded; the batched seed keeps every
    score)."""
    n, cfg = PATH_N, small_seed(path)
    scores = pooled_scores(rng, n, 300)
    mask = rng.random(n) < 0.7
    ids = rng.choice(3 * n, n, replace=False).astype(np.int64)
    for k, kw in ((1, {}), (37, dict(eligible=mask, ids=ids)), (n, {})):
        got = T.topk_scores(scores, k, config=cfg, **kw)
        check_topk(got, scores, k, kw.get("eligible"), kw.get("ids"), msg=f"{path} k={k}")
    assert SeedWorkspace.make(n, 1, config=cfg) is not None and SeedWorkspace.make(n, n, config=cfg) is None


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
            check_topk(T.topk_scores(scores, k), scores, k, msg=f"n={n}")


def test_deterministic_run_to_run():
    scores = np.random.default_rng(3).integers(0, 5, 500).astype(np.float32)
    first = T.topk_scores(scores, 40)
    for _ in range(2):
        again = T.topk_scores(scores, 40)
        np.testing.assert_array_equal(again.ids, first.ids)


# ----------------------------------------------------------------------------- topk_batch

@pytest.mark.slow  # ~20 s of simulated hypothesis cases: the slow tier (make test-slow)
@given(batch_cases(), st.booleans(), st.sampled_from(["mask", "device mask", "bitset", "device bitset"]))
def test_topk_batch_matches_oracle_per_request(case, with_ids, form):
    """The validated batched form: per request the contract of topk_scores, empty slices padded;
    the eligible set as a bool mask or a bitset a request, on the host or the device."""
    scores, offsets, ks, _, masks, ids = case
    mask = None if masks is None else np.concatenate(masks) if masks else np.zeros(0, bool)
    eligible = mask
    if mask is not None and form.endswith("bitset"):
        eligible = batch_bitset(mask, offsets, extra_words=1)  # wider rows than needed are fine
    if mask is not None and form.startswith("device"):
        eligible = launch.to_device(eligible)
    got = T.topk_batch(scores, offsets, ks, eligible=eligible, ids=ids if with_ids else None)
    for r in range(len(ks)):
        lo, hi = offsets[r], offsets[r + 1]
        check_topk(got[r], scores[lo:hi], int(ks[r]), None if masks is None else masks[r],
                   ids[lo:hi] if with_ids else None, msg=f"request {r}")


@pytest.mark.parametrize("path", ["batched", "unseeded"])
def test_topk_batch_paths_from_k_1_to_k_n(rng, path):
    """topk_batch's two paths (the seeded batch; the block top-K over the whole batch), requests at
    k = 1 and k = n, sizes off the block and the word, with ids and an eligible mask."""
    sizes, ks = [1, 1, 63, 65, 130, 130, 0], [1, 4, 63, 1, 130, 7, 2]
    scores = pooled_scores(rng, sum(sizes), 40)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    mask = rng.random(scores.size) < 0.8
    ids = rng.permutation(4 * scores.size)[: scores.size].astype(np.int64)
    for kw in ({}, {"eligible": mask, "ids": ids}):
        got = T.topk_batch(scores, offsets, ks, config=TopKConfig(path=path), **kw)
        for r, k in enumerate(ks):
            lo, hi = offsets[r], offsets[r + 1]
            check_topk(got[r], scores[lo:hi], k, None if "eligible" not in kw else mask[lo:hi],
                       None if "ids" not in kw else ids[lo:hi], msg=f"{path} request {r}")


def test_topk_batch_mixes_k_above_the_block_limit(rng):
    """Requests above BLOCK_TOPK_MAX_K go one by one through topk_scores; the others stay batched,
    with positions (or ids) of their own slices."""
    sizes = [300, 2500, 0, 90]
    ks = [7, T.BLOCK_TOPK_MAX_K + 5, 3, 200]
    scores = rng.integers(-20, 20, sum(sizes)).astype(np.float32)
    scores[::17] = np.nan
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    mask = rng.random(scores.size) < 0.7
    ids = rng.permutation(5 * scores.size)[: scores.size].astype(np.int64)
    for kw in ({}, {"eligible": mask}, {"ids": ids}, {"eligible": mask, "ids": ids}):
        got = T.topk_batch(scores, offsets, ks, **kw)
        for r, k in enumerate(ks):
            lo, hi = offsets[r], offsets[r + 1]
            check_topk(got[r], scores[lo:hi], k, None if "eligible" not in kw else mask[lo:hi],
                       None if "ids" not in kw else ids[lo:hi], msg=f"request {r}")


@pytest.mark.parametrize("block", [np.uint32(32), np.int8(32), np.int16(33)])
def test_numpy_integer_blocks_are_plain_ints(rng, block):
    """A numpy integer block is taken as its value (an int8 or uint32 would wrap in the launch
    arithmetic: a hang or an overflow after the first launch)."""
    scores = rng.standard_normal(700).astype(np.float32)
    got = T.topk_batch(scores, [0, 300, 700], [5, 7], block=block)
    for r, (lo, hi, k) in enumerate(((0, 300, 5), (300, 700, 7))):
        check_topk(got[r], scores[lo:hi], k)
    check_topk(T.topk_scores(scores, 9, block=block), scores, 9)


# ----------------------------------------------------------------------------- input checks

@pytest.mark.parametrize("k,exc,msg", [(0, ValueError, "1 <= k"), (-3, ValueError, "1 <= k"),
                                       (T.MAX_K + 1, ValueError, str(T.MAX_K)), (2.0, TypeError, "int"),
                                       (True, TypeError, "int")])
def test_bad_k_is_refused(k, exc, msg):
    with pytest.raises(exc, match=msg):
        T.topk_scores(np.zeros(10, np.float32), k)


def test_bad_score_arrays_are_refused():
    topk_scores = T.topk_scores
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
    with pytest.raises(TypeError, match="byte order"):
        topk_scores(np.zeros(10, ">f4"), 3)


def test_bitset_eligibility_padding_bits_refused():
    n = 70
    words = bits_from_mask(np.ones(n, bool))
    words[-1] |= np.uint64(1) << np.uint64(63)  # a padding bit
    with pytest.raises(ValueError, match="padding"):
        T.topk_scores(np.zeros(n, np.float32), 3, eligible=words)


@pytest.mark.parametrize("ids", [np.array([1, 1, 2, 3]), np.zeros(4, np.int64), np.array([7, 3, 9, 3])])
def test_repeated_ids_are_refused(ids):
    """Ties are broken by id: a repeated id made the radix select drop a higher score, differently
    run to run (found by an adversarial review); it is now refused before any launch."""
    with pytest.raises(ValueError, match="unique"):
        T.topk_scores(np.array([3.0, 3.0, 0.0, 5.0], np.float32), 2, ids=ids.astype(np.int64))


@pytest.mark.parametrize("block", [0, -32, 2048, 64.0, True])
def test_bad_block_is_refused(block):
    with pytest.raises(ValueError, match="block"):
        T.topk_scores(np.zeros(10, np.float32), 3, block=block)


def test_block_too_large_for_the_block_topk_is_refused_up_front():
    """A block whose block top-K buffer (next_pow2(k + 8 * block) entries of 8 bytes) passes 48 KiB
    is refused before any launch, naming the largest block that fits; k above the block top-K's
    limit does not run it, so any block is fine there."""
    s = np.ones(20000, np.float32)
    with pytest.raises(ValueError, match=r"block <= 499"):
        T.topk_batch(s, [0, 10000, 20000], [100, 10], block=512)
    with pytest.raises(ValueError, match=r"block <= 256"):
        T.topk_scores(s, 2048, block=257)
    T.check_block_topk_block(499, [100])  # next_pow2(100 + 8 * 499) = 4096 fits
    with pytest.raises(ValueError, match="block <= 499"):
        T.check_block_topk_block(500, [100])
    T.check_block_topk_block(1024, [T.BLOCK_TOPK_MAX_K + 1])


def test_k_beyond_the_block_topk_limit_is_refused_where_the_block_topk_runs():
    """The batched form and fused scoring's block path keep the block top-K's limit, with a message
    naming it (fused scoring's default filter path, and so retrieve, take k up to MAX_K:
    tests/score/test_score_filter.py, tests/pipeline/test_pipeline.py)."""
    k = T.BLOCK_TOPK_MAX_K + 1
    with pytest.raises(ValueError, match=str(T.BLOCK_TOPK_MAX_K)):
        T.TopKWorkspace(np.array([0, 5000]), np.array([k]), 1)
    from andromeda_nb.pipeline.retrieve import retrieve
    from andromeda_nb.score.api import score_topk

    with pytest.raises(ValueError, match=str(T.BLOCK_TOPK_MAX_K)):  # k is checked before anything else
        score_topk(None, None, k, path="block")
    with pytest.raises(ValueError, match=str(T.MAX_K)):  # retrieve goes through score_topk: up to MAX_K
        retrieve(None, None, None, None, T.MAX_K + 1)
    assert T.topk_scores(np.zeros(0, np.float32), k).count == 0  # and an empty array pads


def test_topk_batch_refuses_bad_input():
    s = np.zeros(10, np.float32)
    for offsets, ks, exc, msg in (
            ([0, 5, 9], [1, 1], ValueError, "offsets"), ([1, 10], [1], ValueError, "offsets"),
            ([0, 6, 5, 10], [1, 1, 1], ValueError, "offsets"), ([0], [], ValueError, "offsets"),
            ([0.0, 10.0], [1], ValueError, "offsets"), ([0, 10], [1, 2], ValueError, "ks"),
            ([0, 10], [0], ValueError, "k=0"), ([0, 10], [T.MAX_K + 1], ValueError, "4096"),
            ([0, 10], [True], ValueError, "ks")):
        with pytest.raises(exc, match=msg):
            T.topk_batch(s, offsets, ks)
    with pytest.raises(TypeError, match="float32"):
        T.topk_batch(s.astype(np.float64), [0, 10], [1])
    with pytest.raises(ValueError, match="unique within each request"):
        T.topk_batch(s, [0, 5, 10], [1, 1], ids=np.array([0, 1, 2, 3, 0, 5, 6, 7, 8, 9]))
    # the same id in two different requests is fine (ties are broken within a request)
    T.topk_batch(s, [0, 5, 10], [1, 1], ids=np.array([0, 1, 2, 3, 4, 0, 1, 2, 3, 4]))
    with pytest.raises(ValueError, match="non-negative"):
        T.topk_batch(s, [0, 10], [1], ids=np.arange(10) - 1)
    with pytest.raises(ValueError, match="shape"):
        T.topk_batch(s, [0, 10], [1], eligible=np.ones(9, bool))
    with pytest.raises(TypeError, match="bool mask"):
        T.topk_batch(s, [0, 10], [1], eligible=np.ones(10, np.float32))
    with pytest.raises(TypeError, match="bool mask"):
        T.topk_batch(s, [0, 10], [1], eligible=[True] * 10)
    with pytest.raises(ValueError, match=r"\[2, >= 1\]"):  # a row a request
        T.topk_batch(s, [0, 5, 10], [1, 1], eligible=np.zeros((1, 1), np.uint64))
    for r, bits in ((1, [[0b11111], [0b100000]]), (0, [[1 << 5], [0]]), (1, [[0, 0], [0, 1]])):
        with pytest.raises(ValueError, match=f"row {r} has bits set past"):  # padding bits, in or past a word
            T.topk_batch(s, [0, 5, 10], [1, 1], eligible=np.array(bits, np.uint64))
    got = T.topk_batch(s + np.arange(10, dtype=np.float32), [0, 5, 10], [1, 1],
                       eligible=np.array([[0b00110], [0b10001]], np.uint64))
    assert [g.ids.tolist() for g in got] == [[2], [4]] and [g.count for g in got] == [2, 2]
    with pytest.raises(ValueError, match="block"):
        T.topk_batch(s, [0, 10], [1], block=0)


@pytest.mark.parametrize("dtype", [np.uint64, np.uint32, np.uint16, np.uint8, np.int8])
def test_topk_batch_refuses_decreasing_offsets_of_any_integer_type(dtype):
    """A difference of unsigned (or overflowing narrow) offsets wraps around: the check compares
    neighbours instead, so overlapping or negative-length requests never reach a kernel."""
    s = np.arange(10, dtype=np.float32)
    for offsets in ([0, 6, 5, 10], [0, 10, 3, 10]):
        with pytest.raises(ValueError, match="never decrease"):
            T.topk_batch(s, np.array(offsets, dtype), [2, 2, 2])
    with pytest.raises(ValueError, match="never decrease"):
        T.topk_batch(s, np.array([0, 6, 5, 10], dtype), [2, 2, 2], eligible=np.ones(10, bool))
    got = T.topk_batch(s, np.array([0, 4, 10], dtype), [2, 3])  # a valid one of the same dtype
    np.testing.assert_array_equal(got[0].ids, [3, 2])
    np.testing.assert_array_equal(got[1].ids, [5, 4, 3])
