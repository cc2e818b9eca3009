"""The filter pass and the radix select's staging modes, kernel by kernel: entries neither lost nor
duplicated over several rounds, on aligned and misaligned starts, past the buffer's end; every
staging mode of the radix select against the oracle."""

import numpy as np
import pytest

from andromeda_nb.device import launch
from andromeda_nb import reference
import andromeda_nb.topk.api as T
from andromeda_nb.topk.select import FILTER_LOADS, filter_kernel
from andromeda_nb.topk.block import final_radix_kernel, radix_stage_words
from andromeda_nb.targeting import bits_from_mask


def _run_filter(scores, seed, cap, block, grid, eligible=None, offset=0):
    """One filter launch (topk/select.py) on fresh, poisoned buffers over ``scores``, placed
    ``offset`` floats into a device array (offset 1: 4 bytes past an 8-byte boundary, so the pass
    reads one score before its 8-byte words); host (fill, counts, slots, scores) back."""
    n = scores.size
    base = launch.to_device(np.concatenate([np.full(offset, 77.0, np.float32), scores, np.float32([77.0])]))
    d_scores = base[offset:offset + n]
    head, words = T.word_view(d_scores, n)
    assert head == (offset % 2 if n else 0)
    buf_s = launch.to_device(np.full((1, cap), 123.0, np.float32))
    buf_i = launch.to_device(np.full((1, cap), -5, np.int32))
    fill = launch.to_device(np.zeros(1, np.int64))
    counts = launch.to_device(np.zeros((1, 2), np.int64))
    elig = launch.to_device(bits_from_mask(eligible)[None, :]) if eligible is not None else launch.dummy2d(np.uint64)
    filter_kernel(block, eligible is not None)[(grid, 1), block](
        words, d_scores, head, launch.to_device(np.array([0, n], np.int64)), elig,
        launch.to_device(np.array([seed], np.float32)), buf_s, buf_i, fill, counts)
    return (int(fill.copy_to_host()[0]), counts.copy_to_host()[0].tolist(), buf_i.copy_to_host()[0],
            buf_s.copy_to_host()[0])


@pytest.mark.parametrize("offset,extra", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("use_elig", [False, True])
def test_filter_keeps_each_score_once(rng, offset, extra, use_elig):
    """3 blocks of 32 threads, several grid-stride rounds each, the last one partial; an even and
    an odd count on an 8-byte aligned and a misaligned start (a score before the words, one after
    them). Every eligible non-NaN score at or above the seed lands once, nothing else; ties at
    the seed, NaN, +-inf, -0; counts exact."""
    block, grid = 32, 3
    n = grid * block * FILTER_LOADS * 2 * 4 + 76 + extra
    scores = rng.integers(-20, 20, n).astype(np.float32)
    scores[rng.choice(n, 150, replace=False)] = np.nan
    scores[:4] = [np.inf, -np.inf, 0.0, -0.0]
    scores[-1] = 5.0  # the odd last score is kept
    eligible = rng.random(n) < 0.7 if use_elig else None
    if use_elig:
        eligible[[0, -1]] = True
    seed = np.float32(0.0)  # -0 reaches it too (-0 >= 0)
    valid = ~np.isnan(scores) & (eligible if use_elig else True)
    want = np.flatnonzero(valid & (scores >= seed))
    fill, counts, got_i, got_s = _run_filter(scores, seed, n, block, grid, eligible, offset)
    assert fill == want.size and counts == [valid.sum(), want.size]
    order = np.argsort(got_i[:fill])
    np.testing.assert_array_equal(got_i[:fill][order], want)  # each kept slot once, nothing else
    np.testing.assert_array_equal(got_s[:fill][order], scores[want])
    assert (got_i[fill:] == -5).all() and (got_s[fill:] == 123.0).all()


def test_filter_counts_past_its_buffer(rng):
    """More scores reach the seed than the buffer holds: fill and counts[0, 1] count all of them,
    the buffer's every entry holds a distinct kept score and nothing is written past it."""
    block, grid, cap = 32, 4, 300
    n = 5000 + 3
    scores = rng.standard_normal(n).astype(np.float32)
    seed = np.float32(-0.5)
    want = np.flatnonzero(scores >= seed)
    fill, counts, got_i, got_s = _run_filter(scores, seed, cap, block, grid)
    assert fill == want.size > cap and counts == [n, want.size]
    assert np.unique(got_i).size == cap and np.isin(got_i, want).all()
    np.testing.assert_array_equal(got_s, scores[got_i])


@pytest.mark.parametrize("offset", [0, 1])
def test_filter_empty_and_none_kept(rng, offset):
    """No score at or above the seed, an empty array, and one score (no 8-byte word at all)."""
    scores = rng.standard_normal(1000).astype(np.float32)
    fill, counts, got_i, _ = _run_filter(scores, np.float32(99.0), 64, 32, 2, offset=offset)
    assert fill == 0 and counts == [1000, 0] and (got_i == -5).all()
    fill, counts, _, _ = _run_filter(np.zeros(0, np.float32), np.float32(0.0), 64, 32, 1, offset=offset)
    assert fill == 0 and counts == [0, 0]
    fill, counts, got_i, got_s = _run_filter(np.float32([3.0]), np.float32(0.0), 64, 32, 1, offset=offset)
    assert fill == 1 and counts == [1, 1] and got_i[0] == 0 and got_s[0] == 3.0


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
        want = reference.topk(scores, k, ids=ids if has_ids else None)
        np.testing.assert_array_equal(got_id, want.ids, err_msg=f"k={k}")
        np.testing.assert_array_equal(got_s, want.scores, err_msg=f"k={k}")
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
            want = reference.topk(scores, k, ids=ids if has_ids else None)
            np.testing.assert_array_equal(got_id, want.ids, err_msg=f"k={k} ids={has_ids}")
            np.testing.assert_array_equal(got_s, want.scores)


@pytest.mark.parametrize("block", [64, 300])
def test_radix_final_other_blocks(rng, block):
    """Blocks wider than the 256-bin histogram (the launch default is 1024) or not a power of two;
    a fill past the buffer is clamped to it; pads past the fill."""
    m = 1000
    scores = rng.integers(-30, 30, m).astype(np.float32)
    ids = rng.choice(3 * m, m, replace=False).astype(np.int64)
    for k, kmax in ((1, 1), (100, 128), (m, m + 3)):
        got_s, got_slot, got_id = _run_radix(scores, np.arange(m), k, block, True, ids, None, kmax=kmax,
                                             fill=m + 50)
        want = reference.topk(scores, k, ids=ids)
        np.testing.assert_array_equal(got_id[:k], want.ids)
        np.testing.assert_array_equal(got_s[:k], want.scores)
        assert (got_id[k:] == -1).all() and (got_slot[k:] == -1).all() and np.isneginf(got_s[k:]).all()


def test_radix_stage_words_fit_shared_memory():
    """The answer (8 bytes an entry), staging and histograms stay under 48 KiB at every cap."""
    for cap in (2, 128, 1024, 2048, 4096):
        w = radix_stage_words(cap)
        assert w % 256 == 0 and w >= 2048 and 8 * cap + 4 * w + 2 * 1024 + 64 <= 48 * 1024
    assert radix_stage_words(1024) >= 8192  # the seed's 8,192 samples and a k = 1000 filter's ~4,000


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
def test_final_ranks_candidates_by_counting(monkeypatch, rng, m, k, has_ids):
    """launch_final on a crafted candidate buffer (topk.FilterWorkspace): the rank final (several
    tiles, several blocks, several rounds of each) equals the oracle with ties, -0 / +0, +-inf
    and ids; past RANK_CAP candidates (cap 64 here) the radix select answers instead. Poisoned
    outputs all written; run twice on one workspace."""
    from andromeda_nb.topk import select

    monkeypatch.setattr(select, "RANK_CAP", 64)
    n = 1000
    ids = rng.permutation(5 * n)[:n].astype(np.int64) if has_ids else None
    fws = T.FilterWorkspace(n, k, cap=512)
    for trial in range(2):
        slots = rng.choice(n, m, replace=False).astype(np.int32)
        vals = rng.integers(-3, 3, m).astype(np.float32) * 0.5
        vals[rng.random(m) < 0.1] = -0.0
        vals[rng.random(m) < 0.05] = np.inf
        vals[rng.random(m) < 0.05] = -np.inf
        _load_candidates(fws, vals, slots)
        T.launch_final(k, fws, launch.to_device(ids) if has_ids else None)
        scores = np.full(n, np.nan, np.float32)
        scores[slots] = vals
        want = reference.topk(scores, k, ids=ids)
        np.testing.assert_array_equal(fws.out_id.copy_to_host()[0], want.ids)
        np.testing.assert_array_equal(fws.out_s.copy_to_host()[0], want.scores)
        got_slot = fws.out_slot.copy_to_host()[0]  # slots map to the ids reported
        np.testing.assert_array_equal(np.where(got_slot >= 0, ids[got_slot] if has_ids else got_slot, -1), want.ids)


@pytest.mark.parametrize("has_ids", [False, True])
def test_rank_final_threads_sharing_a_candidate(rng, has_ids):
    """The GPU's shape of the rank final (8 threads a candidate, partial counts summed in shared
    memory; the simulator's launch_final runs 1 a candidate) on ties and ids, several rounds."""
    from andromeda_nb.topk.select import final_rank_kernel

    m, k, n = 90, 40, 500
    ids = rng.permutation(4 * n)[:n].astype(np.int64) if has_ids else None
    fws = T.FilterWorkspace(n, k, cap=128)
    slots = rng.choice(n, m, replace=False).astype(np.int32)
    vals = (rng.integers(-2, 3, m) * 0.5).astype(np.float32)
    vals[:3] = [0.0, -0.0, np.inf]
    _load_candidates(fws, vals, slots)
    d_ids = launch.to_device(ids) if has_ids else launch.dummy(np.int64)
    final_rank_kernel(32, has_ids, 128, 8)[3, 32](fws.buf_s, fws.buf_i, fws.fill, fws.offsets, d_ids, fws.ks,
                                                 fws.out_s, fws.out_slot, fws.out_id)
    scores = np.full(n, np.nan, np.float32)
    scores[slots] = vals
    want = reference.topk(scores, k, ids=ids)
    np.testing.assert_array_equal(fws.out_id.copy_to_host()[0], want.ids)
    np.testing.assert_array_equal(fws.out_s.copy_to_host()[0], want.scores)
