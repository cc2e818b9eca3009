"""The filter pass (topk/filter.py, topk/filter_kernels.py), kernel by kernel: every eligible score at
or above the seed kept exactly once, over several rounds, on aligned and misaligned starts, past the
buffer's end (counted, not written), past the shared stage; one request and a batch."""

import numpy as np
import pytest

from andromeda_nb.device import launch
from andromeda_nb.targeting import bits_from_mask
from andromeda_nb.topk.config import TopKConfig, TopKTuning
from andromeda_nb.topk.filter import FilterWorkspace, launch_filter, word_view
from andromeda_nb.topk.filter_kernels import FILTER_LOADS, filter_kernel

from ..helpers import poison_device_arrays
from .helpers import bits, elig_rows


@pytest.fixture(autouse=True)
def poisoned_device_memory(monkeypatch):
    """Device arrays start as 0xA5 bytes (simulator), so an output element left unwritten shows."""
    if launch.backend.is_simulator():
        poison_device_arrays(monkeypatch)


# ----------------------------------------------------------------------------- one request

def _run_filter(scores, seed, cap, block, grid, eligible=None, offset=0):
    """One filter launch (filter_kernels.filter_kernel) on fresh, poisoned buffers over ``scores``, placed
    ``offset`` floats into a device array (offset 1: 4 bytes past an 8-byte boundary, so the pass
    reads one score before its 8-byte words); host (fill, counts, slots, scores) back."""
    n = scores.size
    base = launch.to_device(np.concatenate([np.full(offset, 77.0, np.float32), scores, np.float32([77.0])]))
    d_scores = base[offset:offset + n]
    head, words = word_view(d_scores, n)
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


# ----------------------------------------------------------------------------- a batch


FILTER_SIZES = [0, 1, 2, 3, 517, 1, 2, 3, 1200, 0, 64, 65, 130, 777, 3, 2]


def _filter_case(rng, sizes, use_elig):
    n = sum(sizes)
    scores = rng.integers(-20, 21, n).astype(np.float32)
    u = rng.random(n)
    scores[u < 0.06] = np.nan
    scores[(u >= 0.06) & (u < 0.08)] = np.inf
    scores[(u >= 0.08) & (u < 0.10)] = -np.inf
    scores[(u >= 0.10) & (u < 0.13)] = -0.0
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    masks = [rng.random(sz) < 0.7 for sz in sizes] if use_elig else None
    return scores, offsets, masks


def _seeds_for(rng, scores, offsets, choices):
    """A seed a request: -inf, +inf, 0.0 (-0 reaches it), a score of the slice (ties at the seed),
    or the q-quantile of its finite scores."""
    out = []
    for q, c in enumerate(choices):
        s = scores[offsets[q]:offsets[q + 1]]
        fin = s[np.isfinite(s)]
        if c == "value" and fin.size:
            out.append(fin[rng.integers(fin.size)])
        elif isinstance(c, float) and c < 1.0 and fin.size:
            out.append(np.quantile(fin, c, method="lower"))
        elif c == "+inf":
            out.append(np.inf)
        elif c == "zero":
            out.append(0.0)
        else:
            out.append(-np.inf)
    return np.array(out, np.float32)


def _run_batched_filter(scores, offsets, ks, seeds, cap, masks=None, offset=0, rounds=None, block=None, config=None):
    """launch_filter on a fresh FilterWorkspace.batched with poisoned buffers and zeroed counters;
    the scores placed ``offset`` floats into a device array. Returns host (fill, counts, buf_i,
    buf_s, fws)."""
    total = scores.size
    base = launch.to_device(np.concatenate([np.full(offset, 77.0, np.float32), scores, np.float32([77.0])]))
    d_scores = base[offset:offset + total]
    if total:
        assert launch.address(d_scores) % 8 == 4 * (offset % 2)
    fws = FilterWorkspace.batched(offsets, ks, cap=cap)
    B = len(ks)
    fws.buf_s.copy_to_device(np.full((B, fws.cap), 123.0, np.float32))
    fws.buf_i.copy_to_device(np.full((B, fws.cap), -5, np.int32))
    fws.fill.copy_to_device(np.zeros(B, np.int64))
    fws.counts.copy_to_device(np.zeros((B, 2), np.int64))
    elig = None
    if masks is not None:
        words = max(1, -(-int(np.diff(offsets).max()) // 64)) + 1  # one spare word of zeros
        elig = launch.to_device(elig_rows(masks, words))
    launch_filter(d_scores, fws, launch.to_device(np.asarray(seeds, np.float32)), elig, block, rounds, config=config)
    return (fws.fill.copy_to_host(), fws.counts.copy_to_host(), fws.buf_i.copy_to_host(),
            fws.buf_s.copy_to_host(), fws)


def _check_filter(scores, offsets, seeds, masks, fill, counts, buf_i, buf_s, cap):
    over = 0
    for q in range(len(offsets) - 1):
        s = scores[offsets[q]:offsets[q + 1]]
        valid = ~np.isnan(s) & (True if masks is None else masks[q])
        want = np.flatnonzero(valid & (s >= seeds[q]))
        assert counts[q].tolist() == [int(valid.sum()), want.size], q
        assert fill[q] == want.size, q
        m = min(want.size, cap)
        got = buf_i[q, :m]
        assert np.unique(got).size == m, q  # each slot at most once
        if want.size <= cap:
            np.testing.assert_array_equal(np.sort(got), want)  # each kept slot exactly once
        else:
            over += 1
            assert np.isin(got, want).all(), q  # only cap of them written, all kept ones
        np.testing.assert_array_equal(bits(buf_s[q, :m]), bits(s[got]))  # -0 stays -0
        assert (buf_i[q, m:] == -5).all() and (buf_s[q, m:] == 123.0).all(), q  # untouched past fill
    return over


ROUNDS_1 = TopKConfig(tuning=TopKTuning(batch_filter_rounds=1))


@pytest.mark.parametrize("rounds", [1, None])
@pytest.mark.parametrize("use_elig", [False, True])
@pytest.mark.parametrize("offset", [0, 1])
def test_batched_filter_keeps_each_score_once(rng, offset, use_elig, rounds):
    """Request boundaries at odd and even offsets (slices starting and ending mid-word), slices of
    0..3 scores, a device slice 4 bytes past 8-byte alignment; one block a request (default rounds)
    or several (one round a block: the grid-stride split; given as the argument without a bitset,
    as ``batch_filter_rounds`` with one: the same launch); seeds -inf / +inf / 0 / a score of the
    slice / quantiles; two requests keep more than the cap (fill counts all, cap written)."""
    scores, offsets, masks = _filter_case(rng, FILTER_SIZES, use_elig)
    assert len(set(offsets % 2)) == 2  # odd and even boundaries
    choices = ["-inf", "value", "zero", "+inf", "-inf", "-inf", "value", 0.3, "-inf", "value", 0.5, "value",
               "zero", 0.75, "+inf", "value"]
    seeds = _seeds_for(rng, scores, offsets, choices)
    cap = 300
    ks = np.full(len(FILTER_SIZES), 5, np.int64)
    config = None
    if rounds == 1 and use_elig:
        rounds, config = None, ROUNDS_1
    fill, counts, buf_i, buf_s, fws = _run_batched_filter(scores, offsets, ks, seeds, cap, masks, offset, rounds,
                                                          config=config)
    assert fws.cap == cap and fws.batch == len(FILTER_SIZES)
    over = _check_filter(scores, offsets, seeds, masks, fill, counts, buf_i, buf_s, cap)
    assert over >= 1  # the 1200-score request at -inf at least


@pytest.mark.parametrize("use_elig", [False, True])
@pytest.mark.parametrize("offset", [0, 1])
def test_batched_filter_past_the_shared_stage(rng, offset, use_elig):
    """Blocks keeping more than filter_stage scores (a stage of 5 here): the first ones staged in
    shared memory (one global atomic a block), the rest straight to the buffer by global atomics;
    nothing lost or duplicated, with and without the cap overflowing."""
    stage = 5
    config = TopKConfig(tuning=TopKTuning(filter_stage=stage))
    sizes = [3, 400, 0, 1, 257, 130, 2, 96]
    scores, offsets, masks = _filter_case(rng, sizes, use_elig)
    seeds = _seeds_for(rng, scores, offsets, ["-inf", "-inf", "-inf", "-inf", 0.2, "value", "-inf", 0.5])
    for cap, rounds in ((450, 1), (450, None), (150, None)):
        ks = np.full(len(sizes), 3, np.int64)
        fill, counts, buf_i, buf_s, _ = _run_batched_filter(scores, offsets, ks, seeds, cap, masks, offset, rounds,
                                                            config=config)
        over = _check_filter(scores, offsets, seeds, masks, fill, counts, buf_i, buf_s, cap)
        assert fill.max() > 4 * stage  # the fallback ran
        assert over == int((fill > cap).sum()) and (over == 0 if cap == 450 else over >= 1)

