"""The block top-K path (topk/scan.py, its kernels topk/block.py): per-block lists and their merge
against the oracle, each final step of the merge ("radix", "offer"), every output element written,
several grid-stride rounds, the batched form."""

import numpy as np
import pytest
from hypothesis import given

from andromeda_nb.device import launch
from andromeda_nb.model import TopK
from andromeda_nb.topk import api as T
from andromeda_nb.topk.block import SCAN_ITEMS, buffer_capacity, final_kernel, scan_kernel
from andromeda_nb.topk.config import TopKConfig
from andromeda_nb.topk.scan import TopKWorkspace, launch_topk_batch, scan_lists

from ..helpers import poison_device_arrays
from .helpers import SPECIALS, batch_cases, check_topk, row, score_cases

RADIX, OFFER = TopKConfig(final_merge="radix"), TopKConfig(final_merge="offer")


@pytest.fixture(autouse=True)
def poisoned_device_memory(monkeypatch):
    """Device arrays start as 0xA5 bytes (simulator), so an output element left unwritten shows."""
    if launch.backend.is_simulator():
        poison_device_arrays(monkeypatch)


def test_kernels_write_every_output_element():
    """Poison the scan's and the final kernel's outputs, then check every element was written."""
    cuda = launch.cuda()
    block, k, n, lists = launch.default_block(), 9, 150, 3
    scores = np.random.default_rng(7).standard_normal(n).astype(np.float32)
    scores[::3] = np.nan
    offsets = cuda.to_device(np.array([0, n], np.int64))
    ks = cuda.to_device(np.array([k], np.int64))
    cand_s = cuda.to_device(np.full((1, lists * k), 12345.0, np.float32))
    cand_i = cuda.to_device(np.full((1, lists * k), 777, np.int32))
    counts = cuda.to_device(np.zeros((1, 2), np.int64))
    scan_kernel(buffer_capacity(k, block, SCAN_ITEMS), block, False, False)[(lists, 1), block](
        cuda.to_device(scores), offsets, launch.dummy2d(np.uint64), launch.dummy(np.int64), ks, k,
        cuda.to_device(np.full(1, -np.inf, np.float32)), cand_s, cand_i, counts)
    cs, ci = cand_s.copy_to_host(), cand_i.copy_to_host()
    assert not (cs == 12345.0).any() and not (ci == 777).any()
    assert counts.copy_to_host()[0, 0] == np.sum(~np.isnan(scores))
    kmax = k + 4  # pads beyond k must be written too
    fill = cuda.to_device(np.array([lists * k], np.int64))
    out_s = cuda.to_device(np.full((1, kmax), 999.0, np.float32))
    out_slot = cuda.to_device(np.full((1, kmax), 555, np.int32))
    out_id = cuda.to_device(np.full((1, kmax), 555, np.int64))
    final_kernel(buffer_capacity(kmax, block), block, False)[(1, 1), block](
        cand_s, cand_i, fill, offsets, launch.dummy(np.int64), ks, out_s, out_slot, out_id)
    got_id, got_s = out_id.copy_to_host()[0], out_s.copy_to_host()[0]
    check_topk(TopK(ids=got_id[:k], scores=got_s[:k], count=None), scores, k)
    assert (got_id[k:] == -1).all() and np.isneginf(got_s[k:]).all()


@given(batch_cases())
def test_batched_topk_matches_oracle_per_request(case):
    """launch_topk_batch (scan + merge, a request a grid row) against the oracle per request: ids,
    scores, pads past k, counts."""
    scores, offsets, ks, elig, masks, ids = case
    d_elig = None if elig is None else launch.to_device(elig)
    ws = TopKWorkspace(offsets, ks, scan_lists(offsets, ks))
    launch_topk_batch(launch.to_device(scores), ws, d_elig, launch.to_device(ids))
    out_ids, counts = ws.out_id.copy_to_host(), ws.counts.copy_to_host()
    for r in range(len(ks)):
        lo, hi = offsets[r], offsets[r + 1]
        check_topk(row(ws, r, ks[r], int(counts[r, 0])), scores[lo:hi], int(ks[r]),
                   None if masks is None else masks[r], ids[lo:hi], msg=f"request {r}")
        assert (out_ids[r, ks[r]:] == -1).all()


@pytest.mark.parametrize("n", [4 * 32 * SCAN_ITEMS * 3 + 17, pytest.param(5000, marks=pytest.mark.slow)])
def test_many_rounds_per_block(rng, n):
    """Sizes several grid-stride rounds long in the simulator (4 blocks of 32 threads, 8 items each):
    the scan's next-round prefetch, the last partial round and the threshold carried between
    rounds are all exercised (the hypothesis cases above fit in one round). Unseeded: below
    seed_min_n the default "filter" path finds no seed."""
    pool = np.concatenate([np.array(SPECIALS, np.float32), rng.standard_normal(200).astype(np.float32)])
    scores = pool[rng.integers(0, pool.size, n)]
    eligible = rng.random(n) < 0.7
    assert T.SeedWorkspace.make(n, 1) is None
    for k in (1, 37, 500):
        for elig in (None, eligible):
            check_topk(T.topk_scores(scores, k, eligible=elig), scores, k, elig, msg=f"k={k}")
    ascending = np.arange(n, dtype=np.float32)  # every round raises the threshold
    check_topk(T.topk_scores(ascending, 100), ascending, 100)


@given(score_cases())
def test_offer_final_matches_oracle(case):
    """The other final step of the merge (the block top-K over the compact buffer; the default is
    radix select): the same cases as the default path (ties, NaN, +-inf, -0, k > n)."""
    scores, k, eligible, ids = case
    check_topk(T.topk_scores(scores, k, eligible=eligible, ids=ids, config=OFFER), scores, k, eligible, ids)


@pytest.mark.parametrize("n", [4 * 32 * SCAN_ITEMS * 3 + 17, pytest.param(5000, marks=pytest.mark.slow)])
def test_radix_final_many_candidates_and_ties(rng, n):
    """Many entries reach the merge's final step (small k per list, many lists) and the k-th score
    is shared by many ads: the id passes pick the lowest ids; with custom ids as well."""
    scores = rng.integers(-3, 4, n).astype(np.float32)  # 7 values: heavy ties everywhere
    scores[rng.random(n) < 0.05] = -0.0
    ids = rng.choice(10 * n, n, replace=False).astype(np.int64)
    for k in (1, 37, 500, n):
        k = min(k, T.BLOCK_TOPK_MAX_K)
        for use_ids in (None, ids):
            check_topk(T.topk_scores(scores, k, ids=use_ids, config=RADIX), scores, k, ids=use_ids, msg=f"k={k}")


def test_radix_final_signed_zeros_tie(rng):
    """-0 and +0 are equal scores (ties go to the lower id) even though their bits differ."""
    n = 3000
    scores = rng.choice(np.array([0.0, -0.0, -1.0], np.float32), n)
    scores[rng.choice(n, 100, replace=False)] = 1.0
    for k in (150, 1000):
        check_topk(T.topk_scores(scores, k, config=RADIX), scores, k, msg=f"k={k}")


def test_merge_final_is_checked():
    ws = TopKWorkspace(np.array([0, 10]), np.array([3]), 1)
    with pytest.raises(ValueError, match="final must be"):
        T.launch_merge_lists(ws, final="sort")
