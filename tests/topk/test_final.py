"""The final step (topk/final.py, topk/final_kernels.py), kernel by kernel on crafted candidate
buffers: the radix select in each staging mode, the rank final (over its cap the radix select
answers), the sort final (warp barriers or not; requests past its cap left alone), against the
oracle with ties, -0 / +0, +-inf and ids; every output element written."""

import numpy as np
import pytest

from andromeda_nb.device import launch
from andromeda_nb import reference
from andromeda_nb.model import TopK
from andromeda_nb.topk.config import TopKConfig, TopKTuning
from andromeda_nb.topk.filter import FilterWorkspace
from andromeda_nb.topk.final import launch_final
from andromeda_nb.topk.final_kernels import (SORT_CAP, final_radix_kernel, final_rank_kernel, final_sort_kernel,
                                             radix_stage_words)

from ..helpers import poison_device_arrays
from .helpers import bits, check_topk, row


@pytest.fixture(autouse=True)
def poisoned_device_memory(monkeypatch):
    """Device arrays start as 0xA5 bytes (simulator), so an output element left unwritten shows."""
    if launch.backend.is_simulator():
        poison_device_arrays(monkeypatch)


# ----------------------------------------------------------------------------- the radix select

@pytest.mark.parametrize("has_ids", [False, True])
def test_radix_final_kernel_on_a_crafted_buffer(rng, has_ids):
    """The final step alone, on a buffer of m >> k entries in random order: ties at the k-th
    score (including -0 against +0, equal scores whose bits differ) go to the lowest ids."""
    cuda = launch.cuda()
    block, m = launch.default_block(), 700
    scores = rng.choice(np.array([2.0, 0.0, -0.0, -1.0, np.inf, -np.inf], np.float32), m, p=[.05, .3, .3, .2, .05, .1])
    ids = rng.choice(5 * m, m, replace=False).astype(np.int64)
    order = rng.permutation(m)
    for k in (1, 20, 60, 333, m, m + 5):
        kmax = k
        out = [cuda.to_device(np.full((1, kmax), fill, dt))
               for fill, dt in ((9.0, np.float32), (7, np.int32), (7, np.int64))]
        final_radix_kernel(max(2, 1 << (kmax - 1).bit_length()), block, has_ids)[(1, 1), block](
            cuda.to_device(scores[order][None, :]), cuda.to_device(order.astype(np.int32)[None, :]),
            cuda.to_device(np.array([m], np.int64)), cuda.to_device(np.array([0, m], np.int64)),
            cuda.to_device(ids) if has_ids else launch.dummy(np.int64), cuda.to_device(np.array([k], np.int64)), *out)
        got = TopK(ids=out[2].copy_to_host()[0], scores=out[0].copy_to_host()[0], count=None)
        check_topk(got, scores, k, ids=ids if has_ids else None, msg=f"k={k}")


def _run_radix(scores, slots, k, block, has_ids, ids, stage_words, kmax=None, fill=None):
    cuda = launch.cuda()
    m = scores.size
    kmax = kmax or k
    out = [cuda.to_device(np.full((1, kmax), v, dt)) for v, dt in ((9.0, np.float32), (7, np.int32), (7, np.int64))]
    final_radix_kernel(max(2, 1 << (kmax - 1).bit_length()), block, has_ids, stage_words)[(1, 1), block](
        cuda.to_device(scores[None, :]), cuda.to_device(slots.astype(np.int32)[None, :]),
        cuda.to_device(np.array([m if fill is None else fill], np.int64)), cuda.to_device(np.array([0, m], np.int64)),
        cuda.to_device(ids) if has_ids else launch.dummy(np.int64), cuda.to_device(np.array([k], np.int64)), *out)
    return [o.copy_to_host()[0] for o in out]


# stage_words: None (the default: all keys staged), 64 (read from the buffer, compacted into
# (key, index) pairs once the entries at or above the chosen bin fit 32), 2 (never staged)
@pytest.mark.parametrize("stage_words", [None, 64, 2])
@pytest.mark.parametrize("has_ids", [False, True])
def test_radix_final_staging_modes(rng, stage_words, has_ids):
    """Ties at the k-th score (-0 against +0 too), +-inf, k below, at and above the fill."""
    m = 600
    scores = rng.choice(np.array([2.0, 0.0, -0.0, -1.0, np.inf, -np.inf], np.float32), m,
                        p=[.03, .3, .3, .2, .02, .15])
    scores[rng.choice(m, 40, replace=False)] = rng.standard_normal(40).astype(np.float32)
    ids = rng.choice(5 * m, m, replace=False).astype(np.int64)
    order = rng.permutation(m)
    for k in (1, 9, 25, 200, m, m + 5):
        got_s, got_slot, got_id = _run_radix(scores[order], order, k, 32, has_ids, ids, stage_words)
        check_topk(TopK(got_id, got_s, None), scores, k, ids=ids if has_ids else None, msg=f"k={k}")
        real = got_slot >= 0
        np.testing.assert_array_equal((ids[got_slot[real]] if has_ids else got_slot[real]), got_id[real])


@pytest.mark.parametrize("stage_words", [None, 2])
def test_radix_final_stops_when_a_bin_holds_exactly_the_rest(rng, stage_words):
    """The k best sit alone in their top-byte bin (the select stops after one pass: winners are
    every key at or above that bin, compared under its mask), and then with one more such score
    than k, whose lowest ids must win."""
    m = 500
    scores = rng.uniform(1.0, 1.5, m).astype(np.float32)
    top = rng.choice(m, 12, replace=False)
    scores[top] = np.float32(3e30) + rng.integers(0, 3, 12).astype(np.float32) * np.float32(1e24)
    ids = rng.choice(4 * m, m, replace=False).astype(np.int64)
    for k in (12, 11, 5, 13):
        for has_ids in (False, True):
            got_s, _, got_id = _run_radix(scores, np.arange(m), k, 32, has_ids, ids, stage_words)
            check_topk(TopK(got_id, got_s, None), scores, k, ids=ids if has_ids else None, msg=f"k={k} ids={has_ids}")


@pytest.mark.parametrize("block", [64, pytest.param(300, marks=pytest.mark.slow)])
def test_radix_final_other_blocks(rng, block):
    """Blocks wider than the 256-bin histogram (the launch default is 1024) or not a power of two;
    a fill past the buffer is clamped to it; pads past the fill."""
    m = 1000
    scores = rng.integers(-30, 30, m).astype(np.float32)
    ids = rng.choice(3 * m, m, replace=False).astype(np.int64)
    for k, kmax in ((1, 1), (100, 128), (m, m + 3)):
        got_s, got_slot, got_id = _run_radix(scores, np.arange(m), k, block, True, ids, None, kmax=kmax,
                                             fill=m + 50)
        check_topk(TopK(got_id[:k], got_s[:k], None), scores, k, ids=ids, msg=f"k={k}")
        assert (got_id[k:] == -1).all() and (got_slot[k:] == -1).all() and np.isneginf(got_s[k:]).all()


def test_radix_stage_words_fit_shared_memory():
    """The answer (8 bytes an entry), staging and histograms stay under 48 KiB at every cap."""
    for cap in (2, 128, 1024, 2048, 4096):
        w = radix_stage_words(cap)
        assert w % 256 == 0 and w >= 2048 and 8 * cap + 4 * w + 2 * 1024 + 64 <= 48 * 1024
    assert radix_stage_words(1024) >= 8192  # the seed's 8,192 samples and a k = 1000 filter's ~4,000


# ----------------------------------------------------------------------------- the rank final


def _load_candidates(fws, vals, slots):
    """Fill a FilterWorkspace's candidate buffer with (vals, slots), poison the rest of it and the
    outputs."""
    cap, m = fws.buf_s.shape[1], vals.size
    buf_s = np.full((1, cap), 123.0, np.float32)
    buf_i = np.full((1, cap), -5, np.int32)
    buf_s[0, :m], buf_i[0, :m] = vals, slots
    fws.buf_s.copy_to_device(buf_s)
    fws.buf_i.copy_to_device(buf_i)
    fws.fill.copy_to_device(np.array([m], np.int64))
    for out, v in ((fws.out_s, 9.0), (fws.out_slot, 7), (fws.out_id, 7)):
        out.copy_to_device(np.full(out.shape, v, out.dtype))


@pytest.mark.parametrize("m,k", [(0, 5), (1, 5), (37, 10), (37, 37), (300, 64), (300, 400), (70, 20)])
@pytest.mark.parametrize("has_ids", [False, True])
def test_final_ranks_candidates_by_counting(rng, m, k, has_ids):
    """launch_final on a crafted candidate buffer (a FilterWorkspace): the rank final (several
    tiles, several blocks, several rounds of each) equals the oracle with ties, -0 / +0, +-inf
    and ids; past rank_cap candidates (64 here) the radix select answers instead. Poisoned
    outputs all written; run twice on one workspace."""
    config = TopKConfig(tuning=TopKTuning(rank_cap=64))
    n = 1000
    ids = rng.permutation(5 * n)[:n].astype(np.int64) if has_ids else None
    fws = FilterWorkspace(n, k, cap=512)
    for trial in range(2):
        slots = rng.choice(n, m, replace=False).astype(np.int32)
        vals = rng.integers(-3, 3, m).astype(np.float32) * 0.5
        vals[rng.random(m) < 0.1] = -0.0
        vals[rng.random(m) < 0.05] = np.inf
        vals[rng.random(m) < 0.05] = -np.inf
        _load_candidates(fws, vals, slots)
        launch_final(k, fws, launch.to_device(ids) if has_ids else None, config=config)
        scores = np.full(n, np.nan, np.float32)
        scores[slots] = vals
        want = reference.topk(scores, k, ids=ids)
        check_topk(row(fws), scores, k, ids=ids, msg=f"trial {trial}")
        got_slot = fws.out_slot.copy_to_host()[0]  # slots map to the ids reported
        np.testing.assert_array_equal(np.where(got_slot >= 0, ids[got_slot] if has_ids else got_slot, -1), want.ids)


@pytest.mark.parametrize("has_ids", [False, True])
def test_rank_final_threads_sharing_a_candidate(rng, has_ids):
    """The GPU's shape of the rank final (8 threads a candidate, partial counts summed in shared
    memory; the simulator's launch_final runs 1 a candidate) on ties and ids, several rounds."""
    m, k, n = 90, 40, 500
    ids = rng.permutation(4 * n)[:n].astype(np.int64) if has_ids else None
    fws = FilterWorkspace(n, k, cap=128)
    slots = rng.choice(n, m, replace=False).astype(np.int32)
    vals = (rng.integers(-2, 3, m) * 0.5).astype(np.float32)
    vals[:3] = [0.0, -0.0, np.inf]
    _load_candidates(fws, vals, slots)
    d_ids = launch.to_device(ids) if has_ids else launch.dummy(np.int64)
    final_rank_kernel(32, has_ids, 128, 8)[3, 32](fws.buf_s, fws.buf_i, fws.fill, fws.offsets, d_ids, fws.ks,
                                                 fws.out_s, fws.out_slot, fws.out_id)
    scores = np.full(n, np.nan, np.float32)
    scores[slots] = vals
    check_topk(row(fws), scores, k, ids=ids)


# ----------------------------------------------------------------------------- the sort final


def _expected_final(scores, offsets, q, slots, k, kmax, ids):
    """The contract's top-k of request q's candidate slots: (scores, slots, ids) rows of kmax."""
    start = offsets[q]
    cand_s = scores[start + slots]
    cand_id = slots.astype(np.int64) if ids is None else ids[start + slots]
    want = reference.topk(cand_s, k, ids=cand_id)
    got_n = min(k, slots.size)
    exp_s = np.full(kmax, -np.inf, np.float32)
    exp_slot = np.full(kmax, -1, np.int32)
    exp_id = np.full(kmax, -1, np.int64)
    exp_s[:k] = want.scores
    exp_id[:k] = want.ids
    for j in range(got_n):
        exp_slot[j] = slots[np.flatnonzero(cand_id == want.ids[j])[0]]
    return exp_s, exp_slot, exp_id


def _sort_case(rng):
    """Candidate buffers of crafted requests: (sizes, ks, buffer slot lists, fills)."""
    sizes = [5, 40, 60, 30, 50, 70, 2, 45]
    ks = np.array([3, 1, 16, 20, 24, 12, 4, 30], np.int64)
    total = sum(sizes)
    pool = np.array([0.0, -0.0, 1.5, -1.5, np.inf, -np.inf, 2.0, 2.0, 3.25], np.float32)
    scores = pool[rng.integers(0, pool.size, total)]  # a small pool: many ties
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    cap = 24
    # m a request: 0, 1, 16 (a power of two), 13 (not, k > m), 24 (the cap, not a power of two),
    # 24 of a fill of 40 (more than the buffer holds: its first 24 entries), 2, 17
    ms = [0, 1, 16, 13, 24, 24, 2, 17]
    fills = np.array([0, 1, 16, 13, 24, 40, 2, 17], np.int64)
    slot_lists = [rng.choice(sizes[q], ms[q], replace=False).astype(np.int32) for q in range(len(sizes))]
    # the 16-candidate request: signed zeros and infinities among tied scores
    s2 = scores[offsets[2]:offsets[3]]
    sl = slot_lists[2]
    s2[sl[:4]] = -0.0
    s2[sl[4:8]] = 0.0
    s2[sl[8]] = np.inf
    s2[sl[9]] = -np.inf
    s2[sl[10:13]] = 2.0
    s2[sl[13:16]] = 5.0
    return scores, offsets, ks, slot_lists, fills, cap


@pytest.mark.parametrize("warp_sync", [False, True])
@pytest.mark.parametrize("with_ids", [False, True])
def test_final_sort_kernel_on_crafted_buffers(rng, with_ids, warp_sync):
    """launch_final(..., d_scores=...) on a batched workspace: each request's candidates sorted by
    score descending (-0 tied with +0, ties to the lower id or slot), the original -0 bits read
    back, +-inf in place, m = 0, 1, k > m, m a power of two and not, fill past the buffer; every
    output entry written (poisoned first), pads (-inf, -1, -1)."""
    config = TopKConfig(sort_warp_sync=warp_sync)
    scores, offsets, ks, slot_lists, fills, cap = _sort_case(rng)
    B, kmax = len(ks), int(ks.max())
    ids = rng.permutation(10 * scores.size)[: scores.size].astype(np.int64) if with_ids else None
    fws = FilterWorkspace.batched(offsets, ks, cap=cap)
    assert fws.cap == cap <= SORT_CAP and fws.batch > 1  # launch_final takes the sort final
    buf_i = np.full((B, cap), 999, np.int32)  # past m: junk the kernel must not read
    buf_s = np.full((B, cap), np.nan, np.float32)
    for q, sl in enumerate(slot_lists):
        buf_i[q, : sl.size] = sl
        buf_s[q, : sl.size] = scores[offsets[q] + sl]
    fws.buf_i.copy_to_device(buf_i)
    fws.buf_s.copy_to_device(buf_s)
    fws.fill.copy_to_device(fills)
    fws.out_s.copy_to_device(np.full((B, kmax), 555.0, np.float32))
    fws.out_slot.copy_to_device(np.full((B, kmax), -7, np.int32))
    fws.out_id.copy_to_device(np.full((B, kmax), -9, np.int64))
    d_ids = None if ids is None else launch.to_device(ids)
    # a rank-final kernel would need ids / no scores: the sort final is the one given d_scores
    launch_final(kmax, fws, d_ids, d_scores=launch.to_device(scores), config=config)
    out_s, out_slot, out_id = fws.out_s.copy_to_host(), fws.out_slot.copy_to_host(), fws.out_id.copy_to_host()
    for q in range(B):
        exp_s, exp_slot, exp_id = _expected_final(scores, offsets, q, slot_lists[q], int(ks[q]), kmax, ids)
        np.testing.assert_array_equal(out_id[q], exp_id, err_msg=f"request {q}")
        np.testing.assert_array_equal(out_slot[q], exp_slot, err_msg=f"request {q}")
        np.testing.assert_array_equal(bits(out_s[q]), bits(exp_s), err_msg=f"request {q}")  # -0 bits too
    # the signed zeros of request 2 come back with their own signs
    zs = out_s[2][out_s[2] == 0]
    assert zs.size == 8 and np.signbit(zs).sum() == 4
    np.testing.assert_array_equal(np.signbit(zs), np.signbit(scores[offsets[2] + out_slot[2][out_s[2] == 0]]))


@pytest.mark.parametrize("with_ids", [False, True])
def test_final_sort_kernel_skips_requests_past_its_cap(rng, with_ids):
    """A sort-final kernel of cap 8 over a buffer 16 wide: requests of more than 8 candidates are
    left alone (outputs untouched: the caller reruns them), the others answered exactly."""
    blk = launch.default_block()
    sizes = [20, 20, 20, 20, 20]
    fills = np.array([5, 8, 9, 16, 40], np.int64)
    ks = np.array([3, 8, 2, 5, 6], np.int64)
    B, kmax, width = len(sizes), int(ks.max()), 16
    scores = rng.integers(-2, 3, sum(sizes)).astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    ids = rng.permutation(5 * scores.size)[: scores.size].astype(np.int64) if with_ids else None
    slot_lists = [rng.choice(20, min(f, width), replace=False).astype(np.int32) for f in fills]
    buf_i = np.zeros((B, width), np.int32)
    buf_s = np.zeros((B, width), np.float32)
    for q, sl in enumerate(slot_lists):
        buf_i[q, : sl.size] = sl
        buf_s[q, : sl.size] = scores[offsets[q] + sl]
    out_s = launch.to_device(np.full((B, kmax), 555.0, np.float32))
    out_slot = launch.to_device(np.full((B, kmax), -7, np.int32))
    out_id = launch.to_device(np.full((B, kmax), -9, np.int64))
    final_sort_kernel(blk, with_ids, 8)[(1, B), blk](
        launch.to_device(scores), launch.to_device(buf_s), launch.to_device(buf_i), launch.to_device(fills),
        launch.to_device(offsets), launch.to_device(ids) if with_ids else launch.dummy(np.int64),
        launch.to_device(ks), out_s, out_slot, out_id)
    got_s, got_slot, got_id = out_s.copy_to_host(), out_slot.copy_to_host(), out_id.copy_to_host()
    for q in range(B):
        if min(fills[q], width) > 8:
            assert (got_s[q] == 555.0).all() and (got_slot[q] == -7).all() and (got_id[q] == -9).all()
            continue
        exp_s, exp_slot, exp_id = _expected_final(scores, offsets, q, slot_lists[q], int(ks[q]), kmax, ids)
        np.testing.assert_array_equal(got_id[q], exp_id)
        np.testing.assert_array_equal(got_slot[q], exp_slot)
        np.testing.assert_array_equal(bits(got_s[q]), bits(exp_s))


def test_sort_steps_between_warp_barriers_stay_inside_each_warp():
    """The index map of _sort_funcs.sort_desc: pair p of a step (thread p % block) touches entries
    i = ((p & ~(stride - 1)) << 1) | (p & (stride - 1)) and i + stride. Where a step of stride <= 32
    is followed by another of stride <= 32 (a warp barrier between them with warp_sync), every entry
    belongs to the same warp in both steps, for every block size and sort size."""

    def owner(P, stride, block):
        p = np.arange(P // 2)
        low = stride - 1
        i = ((p & ~low) << 1) | (p & low)
        own = np.empty(P, np.int64)
        own[i] = (p % block) // 32
        own[i + stride] = (p % block) // 32
        return own

    for block in (32, 128, 1024):
        for P in (2, 8, 64, 128, 512, 4096):
            steps = [(size, size >> j) for size in (1 << e for e in range(1, P.bit_length())) for j in
                     range(1, size.bit_length())]
            warp_local = [(a, b) for a, b in zip(steps, steps[1:]) if a[1] <= 32 and b[1] <= 32]
            assert warp_local or P <= 2
            for (_, s1), (_, s2) in warp_local:
                np.testing.assert_array_equal(owner(P, s1, block), owner(P, s2, block))


@pytest.mark.parametrize("final", ["auto", "rank", "radix"])
def test_batch_finals_agree_with_the_oracle(rng, final):
    """A batch's buffers answered by each final (``TopKConfig.final``; "auto" takes the radix
    select from RADIX_FINAL_MIN_BATCH requests on): per request the oracle's top-k with ties and
    ids, including an empty buffer and one holding fewer than k."""
    from andromeda_nb.topk.config import RADIX_FINAL_MIN_BATCH

    B, n, k, cap = max(RADIX_FINAL_MIN_BATCH, 3), 400, 20, 128
    ids = rng.permutation(4 * n)[:n].astype(np.int64)
    fws = FilterWorkspace.batched(np.arange(B + 1) * n, np.full(B, k), cap=cap)
    buf_s, buf_i = np.full((B, cap), 77.0, np.float32), np.zeros((B, cap), np.int32)
    fills = rng.integers(k, cap, B)
    fills[0], fills[1] = 0, k // 2
    table = np.full((B, n), np.nan, np.float32)
    for b, m in enumerate(fills):
        slots = rng.choice(n, m, replace=False).astype(np.int32)
        vals = (rng.integers(-4, 4, m) * 0.5).astype(np.float32)
        buf_s[b, :m], buf_i[b, :m], table[b, slots] = vals, slots, vals
    for a, v in ((fws.buf_s, buf_s), (fws.buf_i, buf_i), (fws.fill, fills.astype(np.int64))):
        a.copy_to_device(v)
    all_ids = np.concatenate([ids] * B)  # the final reads ids[offsets[b] + slot]
    launch_final(k, fws, launch.to_device(all_ids), config=TopKConfig(final=final))
    for b in range(B):
        check_topk(row(fws, b), table[b], k, ids=ids, msg=f"request {b}")
