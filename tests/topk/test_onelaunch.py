"""The one-launch top-K of one request (topk/onelaunch.py, topk/onelaunch_kernels.py): its seed
against an independent numpy model, its answer against the oracle on the contract's edges (its
last-block sort with and without warp barriers), its outcomes (seed above the k-th score, buffer
overflow), every output element written, the workspace reusable call after call. topk_scores,
which does not take this path, answers the same arrays exactly."""

import numpy as np
import pytest

import andromeda_nb.topk.api as T
from andromeda_nb.device import launch
from andromeda_nb.targeting import bits_from_mask
from andromeda_nb.topk.config import DEFAULT_CONFIG, TopKConfig
from andromeda_nb.topk.onelaunch import ONELAUNCH_MAX_N, OneLaunchWorkspace, launch_onelaunch, onelaunch_shape
from andromeda_nb.topk.onelaunch_kernels import ONELAUNCH_CAP, ONELAUNCH_RUN

from ..helpers import poison_shared_memory
from .helpers import check_topk, f32_keys, make_scores, row


def sample_positions(n: int, M: int) -> np.ndarray:
    """Sample j of M: run j // RUN (RUN contiguous scores) centred in its stratum of n // (M / RUN)
    (onelaunch_kernels.onelaunch_topk_kernel's docstring)."""
    runs = M // ONELAUNCH_RUN
    step = n // runs
    starts = np.arange(runs, dtype=np.int64) * step + (step - ONELAUNCH_RUN) // 2
    return (starts[:, None] + np.arange(ONELAUNCH_RUN, dtype=np.int64)[None, :]).ravel()


def kept_bounds(s: np.ndarray, mask, r: int, blk: int, M: int) -> tuple[int, int]:
    """How many eligible non-NaN scores may reach the kernel's seed. Thread t holds samples
    ``j * blk + t``; the seed lower-bounds the r-th best of the threads' best real sample keys
    (so every score at or above that key is kept), and it stops refining once at most r + r // 4
    threads' best reach it (so it lies above the (r + r // 4 + 1)-th best of them: nothing below
    that is kept). -0 and +0 compare equal in the filter: the upper bound counts by value."""
    pos = sample_positions(s.size, M)
    real = ~np.isnan(s[pos]) & (s[pos] != -np.inf)
    if mask is not None:
        real &= mask[pos]
    keys = np.where(real, f32_keys(np.where(real, s[pos], 0)), -1).reshape(M // blk, blk)
    best_key = keys.max(axis=0)  # a thread's best real sample key, -1 without one
    best_val = np.where(best_key >= 0, s[pos].reshape(M // blk, blk)[keys.argmax(axis=0), np.arange(blk)], np.nan)
    order = np.argsort(-best_key, kind="stable")
    best_key, best_val = best_key[order], best_val[order]
    n_real = int((best_key >= 0).sum())
    ok = ~np.isnan(s) if mask is None else (~np.isnan(s) & mask)
    if r == 0 or n_real < r:
        return int(ok.sum()), int(ok.sum())
    at_least = int((f32_keys(s[ok]) >= best_key[r - 1]).sum())
    loose = r + r // 4
    at_most = int((s[ok] >= best_val[loose]).sum()) if n_real > loose else int(ok.sum())
    return at_least, at_most


def run(s, k, mask=None, olw=None, config=None):
    n = s.size
    olw = olw or OneLaunchWorkspace.make(n, k)
    assert olw is not None
    elig = None if mask is None else launch.to_device(bits_from_mask(mask))
    for a in (olw.out_s, olw.out_slot, olw.out_id):  # poisoned: every element must be written
        a.copy_to_device(np.full(a.shape, 7, a.dtype))
    launch_onelaunch(launch.to_device(s), n, k, olw, elig, config=config)
    c = olw.counts.copy_to_host()[0]
    return olw, c, T.seeded_outcome(olw, k, c)


def shape():
    blk, samples, per = onelaunch_shape()
    return blk, samples, per, blk * samples


@pytest.mark.parametrize("kind", ["normal", "narrow", "negative", "posinf"])
@pytest.mark.parametrize("extra", [0, 1, 31, 257])
def test_answer_matches_oracle(rng, kind, extra, monkeypatch):
    poison_shared_memory(monkeypatch)
    config = TopKConfig(onelaunch_warp_sync=extra % 2 == 1)  # the sort with warp barriers, half the cases
    blk, samples, per, M = shape()
    n = 2 * M + 3 * blk * per + extra  # not a multiple of a block's scores, of 32 or of a run
    s = make_scores(rng, n, kind)
    k = int(rng.integers(1, 40))
    olw, c, outcome = run(s, k, config=config)
    assert c[0] == int((~np.isnan(s)).sum())
    lo, hi = kept_bounds(s, None, olw.r, blk, M)
    assert lo <= c[1] <= hi
    if outcome == "exact":
        check_topk(row(olw), s, k)
        slots = olw.out_slot.copy_to_host()[0]
        ids = olw.out_id.copy_to_host()[0]
        np.testing.assert_array_equal(slots, np.where(ids >= 0, ids, -1))
    check_topk(T.topk_scores(s, k), s, k)  # the public call answers the same array


def test_eligible_mask_and_few_eligible(rng):
    blk, samples, per, M = shape()
    n = 2 * M + 77
    s = make_scores(rng, n, "normal")
    for frac in (0.5, 0.05, 0.0):
        mask = rng.random(n) < frac
        k = 12
        olw, c, outcome = run(s, k, mask)
        assert c[0] == int((mask & ~np.isnan(s)).sum())
        assert outcome == "exact"  # few eligible: fewer than r real samples, the seed is -inf
        check_topk(row(olw, count=int(c[0])), s, k, mask)
        check_topk(T.topk_scores(s, k, eligible=mask), s, k, mask)


def test_workspace_is_reusable_and_deterministic(rng):
    blk, samples, per, M = shape()
    n = 3 * M + 5
    olw = OneLaunchWorkspace.make(n, 9)
    answers = []
    for rep in range(3):
        s = make_scores(np.random.default_rng(rep % 2), n, "normal")
        _, c, outcome = run(s, 9, olw=olw)
        assert outcome == "exact"
        np.testing.assert_array_equal(olw.acc.copy_to_host(), 0)  # the last block zeroed them
        assert olw.ticket.copy_to_host()[0] == 0
        answers.append(olw.out_id.copy_to_host()[0].copy())
        check_topk(row(olw, count=int(c[0])), s, 9)
    np.testing.assert_array_equal(answers[0], answers[2])


def test_seed_above_kth_score_is_reported_and_rerun(rng):
    """The sampled positions hold the best scores: the sample's r-th best lies above the k-th score
    of the array whenever k > r."""
    blk, samples, per, M = shape()
    n = 8 * M + 100
    s = rng.random(n).astype(np.float32)
    s[sample_positions(n, M)] += 10.0
    k = 40  # r = ceil(2.5 k M / n) ~ k / 3: about 1.25 r < k scores reach the seed
    olw = OneLaunchWorkspace.make(n, k)
    assert olw is not None and olw.r < k
    _, c, outcome = run(s, k, olw=olw)
    assert outcome == "seed_high" and c[1] < k
    check_topk(T.topk_scores(s, k), s, k)


def test_overflow_is_reported_and_rerun():
    """All-equal scores: every score reaches any seed, more than the sort holds."""
    blk, samples, per, M = shape()
    n = max(2 * M, ONELAUNCH_CAP + 3 * per * blk // 2 + 1)
    s = np.full(n, 0.5, np.float32)
    _, c, outcome = run(s, 5)
    assert outcome == "overflow" and c[1] == n
    got = T.topk_scores(s, 5)
    np.testing.assert_array_equal(got.ids, np.arange(5))  # ties to the lower id
    check_topk(got, s, 5)


def test_k_1(rng):
    """k = 1: at least the seed's rank r >= 1 scores reach it, so the one launch answers."""
    blk, samples, per, M = shape()
    n = 2 * M + 5
    s = make_scores(rng, n, "normal")
    olw, c, outcome = run(s, 1)
    assert outcome == "exact" and c[1] >= olw.r
    check_topk(row(olw, count=int(c[0])), s, 1)


def test_zero_and_negative_zero_tie_and_keep_their_sign(rng):
    blk, samples, per, M = shape()
    n = 2 * M + 9
    s = (-1.0 - rng.random(n)).astype(np.float32)  # distinct: the seed cuts below the zeros
    s[[5, 400 % n, n - 2]] = [0.0, -0.0, 0.0]
    s[[7, 11]] = [-0.0, 0.0]
    olw, c, outcome = run(s, 6)
    assert outcome == "exact"
    check_topk(row(olw, count=int(c[0])), s, 6)


def test_where_the_path_applies():
    blk, samples, per, M = shape()
    t = DEFAULT_CONFIG.tuning
    assert OneLaunchWorkspace.make(2 * M - 1, 5) is None  # smaller than twice its sample
    assert OneLaunchWorkspace.make(ONELAUNCH_MAX_N + 1, 5) is None
    assert OneLaunchWorkspace.make(4 * M, 0) is None
    big_k = int(ONELAUNCH_CAP * 5 // 8 / t.seed_margin) + 1  # aims at more candidates than fit
    assert OneLaunchWorkspace.make(ONELAUNCH_MAX_N, big_k) is None
    assert OneLaunchWorkspace.make(4 * M, 4 * M) is None  # k = n: far more candidates than the sort holds
    w = OneLaunchWorkspace.make(4 * M, 3)
    assert w.r == max(t.seed_min_rank, int(np.ceil(t.seed_margin * 3 * M / (4 * M)))) and w.cap == ONELAUNCH_CAP


def test_without_a_seed_every_eligible_score_is_kept(rng):
    """r = 0 (no seed): every eligible score is a candidate; the block's counters are zeroed before
    any thread stages one (no seed barrier comes first)."""
    blk, samples, per, M = shape()
    n = 2 * M + 37
    for trial in range(4):
        s = make_scores(rng, n, "normal")
        k = 20
        olw = OneLaunchWorkspace.make(n, k)
        olw.r = 0
        _, c, outcome = run(s, k, olw=olw)
        assert c.tolist() == [int((~np.isnan(s)).sum())] * 2
        if outcome == "exact":
            check_topk(row(olw, count=int(c[0])), s, k)


def test_launch_refuses_a_workspace_of_another_shape(rng):
    blk, samples, per, M = shape()
    n = 3 * M
    olw = OneLaunchWorkspace.make(n, 20)
    d = launch.to_device(rng.standard_normal(n).astype(np.float32))
    for bad_n, bad_k in ((n - 1, 20), (n, 21), (n, 0)):
        with pytest.raises(ValueError, match="one-launch workspace"):
            launch_onelaunch(d, bad_n, bad_k, olw)
