"""The seeded batched path (topk/batched.py; its kernels are the seeds', the filter's and the finals'):
end to end against the seed models and the oracle, forced seed_high / overflow outcomes, both
reruns of topk_batch, and topk_scores's batch-of-one route with its workspace cache."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andromeda_nb.device import launch
from andromeda_nb.model import TopK
from andromeda_nb.topk import api as T
from andromeda_nb.topk import single
from andromeda_nb.topk.batched import batch_outcomes, launch_topk_batch_seeded
from andromeda_nb.topk.config import DEFAULT_CONFIG, TopKConfig, TopKTuning
from andromeda_nb.topk.filter import FilterWorkspace
from andromeda_nb.topk.seed_kernels import BATCH_SAMPLE_CHUNK
from andromeda_nb.topk.single import WorkspaceCache

from ..helpers import poison_device_arrays, poison_shared_memory
from .helpers import batch_bitset, bits, check_topk, elig_rows, make_scores, spy
from .models import batch_seed_model, seed_positions, sim_shape


@pytest.fixture(autouse=True)
def poisoned_device_memory(monkeypatch):
    """Device arrays start as 0xA5 bytes (simulator), so an output element left unwritten shows."""
    if launch.backend.is_simulator():
        poison_device_arrays(monkeypatch)


def batch_of_one_from(n: int, **tuning) -> TopKConfig:
    """The auto rule with its batch-of-one route starting at ``n`` scores."""
    return TopKConfig(tuning=TopKTuning(seed_min_n=n, **tuning))


def _batch_inputs(rng, sizes, kinds, use_elig, with_ids):
    parts = [make_scores(rng, n, kind) if isinstance(kind, str) else kind(n) for n, kind in zip(sizes, kinds)]
    scores = np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    masks = [rng.random(n) < 0.7 for n in sizes] if use_elig else None
    ids = rng.permutation(3 * scores.size + 3)[: scores.size].astype(np.int64) if with_ids else None
    return scores, offsets, masks, ids


def _run_seeded(scores, offsets, ks, masks, ids, cap=None, rounds=None):
    fws = FilterWorkspace.batched(offsets, ks, cap=cap)
    B = len(ks)
    fws.out_s.copy_to_device(np.full((B, fws.kmax), 555.0, np.float32))
    fws.out_id.copy_to_device(np.full((B, fws.kmax), -9, np.int64))
    elig = None
    if masks is not None:
        elig = launch.to_device(elig_rows(masks, max(1, -(-int(np.diff(offsets).max()) // 64))))
    res = launch_topk_batch_seeded(launch.to_device(scores), fws, elig, None if ids is None else launch.to_device(ids),
                                   rounds=rounds)
    assert res is fws
    return fws


def _check_seeded(fws, scores, offsets, ks, masks, ids):
    """Seeds, counts and outcomes against the models; every exact request against the oracle.
    Returns the outcomes."""
    blk, per, M = sim_shape()
    seeds, counts = fws.seeds.copy_to_host(), fws.counts.copy_to_host()
    outcomes = batch_outcomes(fws)
    np.testing.assert_array_equal(outcomes, batch_outcomes(fws, counts))
    t = DEFAULT_CONFIG.tuning
    out_s, out_id, out_slot = fws.out_s.copy_to_host(), fws.out_id.copy_to_host(), fws.out_slot.copy_to_host()
    for q in range(len(ks)):
        a, b, k = offsets[q], offsets[q + 1], int(ks[q])
        s, mask = scores[a:b], None if masks is None else masks[q]
        want_seed = batch_seed_model(s, k, mask, M, int(2 * t.seed_margin), t.seed_min_rank, len(ks) == 1)
        assert bits(seeds[q]) == bits(want_seed), (q, seeds[q], want_seed)
        valid = ~np.isnan(s) & (True if mask is None else mask)
        kept = int((valid & (s >= seeds[q])).sum())
        assert counts[q].tolist() == [int(valid.sum()), kept], q
        want_outcome = ("overflow" if kept > fws.cap else "seed_high" if kept < min(k, int(valid.sum()))
                        else "exact")
        assert outcomes[q] == want_outcome, (q, outcomes[q], want_outcome)
        if b - a <= M:  # a whole request's seed lower-bounds its k-th best
            assert outcomes[q] == "exact" or kept > fws.cap, q
        if outcomes[q] != "exact":
            continue
        check_topk(TopK(out_id[q, :k], out_s[q, :k], None), s, k, mask, None if ids is None else ids[a:b],
                   msg=f"request {q}")
        assert (out_id[q, k:] == -1).all() and np.isneginf(out_s[q, k:]).all()
        real = out_id[q, :k] >= 0
        local = out_slot[q, :k][real]
        assert (out_slot[q, :k][~real] == -1).all()
        np.testing.assert_array_equal(local if ids is None else ids[a + local], out_id[q, :k][real])
    return outcomes


@pytest.mark.parametrize("use_elig,with_ids,rounds", [(False, False, None), (True, True, 1), (True, False, None),
                                                       (False, True, 1)])
def test_seeded_batch_end_to_end(rng, use_elig, with_ids, rounds):
    """Random requests, whole and sampled, with NaN / +-inf / -0 / ties, ids and eligible bitsets:
    seeds bit for bit the model's, counts exact, outcomes as the counts say, the exact answers the
    oracle's (whole requests always exact)."""
    blk, per, M = sim_shape()
    sizes = [0, 1, 2, 37, 300, M, M + 1, 2 * M + 501, 6 * M + 5]
    kinds = ["normal", "normal", "ties", "normal", "ties", "normal", "narrow", "normal", "ties"]
    ks = rng.integers(1, 60, len(sizes)).astype(np.int64)
    ks[1] = 3  # k > n
    scores, offsets, masks, ids = _batch_inputs(rng, sizes, kinds, use_elig, with_ids)
    fws = _run_seeded(scores, offsets, ks, masks, ids, rounds=rounds)
    outcomes = _check_seeded(fws, scores, offsets, ks, masks, ids)
    assert (outcomes[[0, 1, 2, 3, 4, 5]] == "exact").all()


def _forced_requests(rng, M):
    """(sizes, ks, makers): a small whole request (exact); top scores exactly on the sampled
    positions (rank 32 < k = 50: seed_high); all equal (every score kept: overflow); sorted
    ascending, 8 M scores (the 8th best sample leaves 120 kept: exact at the default cap,
    overflow at cap 64); a sampled request of finite normal scores."""
    n_big = 4 * M

    def top_in_sample(n):
        s = rng.random(n).astype(np.float32)
        pos = seed_positions(n, M, BATCH_SAMPLE_CHUNK)
        s[pos] = 100.0 + rng.permutation(pos.size).astype(np.float32)  # distinct 24-bit prefixes
        return s

    sizes = [500, n_big, n_big, 2 * n_big, 3 * M + 7]
    ks = np.array([5, 50, 10, 10, 6], np.int64)
    makers = ["normal", top_in_sample, lambda n: np.ones(n, np.float32),
              lambda n: np.arange(n, dtype=np.float32),
              # finite normal scores: with "normal"'s 1 % of +inf the seed is +inf and every +inf is
              # kept, ~n / 100: over the cap of 64 at the GPU's sample size (M = 4,096, n ~ 12,300)
              lambda n: rng.standard_normal(n).astype(np.float32)]
    return sizes, ks, makers


@pytest.mark.parametrize("with_ids", [False, True])
def test_seeded_batch_forced_outcomes(rng, with_ids):
    """batch_outcomes flags exactly the requests that need a rerun: a seed above the k-th score
    (top scores on the sampled positions: ~r < k scores reach it) is seed_high; all-equal scores
    (every one kept, more than the cap) and a sorted request under a tiny cap overflow; the
    others are exact and the oracle's."""
    blk, per, M = sim_shape()
    sizes, ks, makers = _forced_requests(rng, M)
    scores, offsets, masks, ids = _batch_inputs(rng, sizes, makers, False, with_ids)
    fws = _run_seeded(scores, offsets, ks, masks, ids)
    assert fws.cap < sizes[2]  # all-equal keeps more than the cap
    got = _check_seeded(fws, scores, offsets, ks, masks, ids)
    assert got.tolist() == ["exact", "seed_high", "overflow", "exact", "exact"], got
    fws = _run_seeded(scores, offsets, ks, masks, ids, cap=64)
    got = _check_seeded(fws, scores, offsets, ks, masks, ids)
    # request 4 (3,079 normal scores, k = 6, seed rank 8) keeps ~24 on average: more than 64, a
    # correct overflow, on ~3e-5 of draws; _check_seeded holds its outcome to the counts' either way
    assert got[:4].tolist() == ["exact", "seed_high", "overflow", "overflow"], got
    kept_sorted = fws.counts.copy_to_host()[3, 1]
    assert ks[3] <= kept_sorted and kept_sorted > 64


# ----------------------------------------------------------------------------- topk_batch's reruns


def _check_topk_batch(got, scores, offsets, ks, mask, ids):
    for r, k in enumerate(np.asarray(ks).tolist()):
        a, b = offsets[r], offsets[r + 1]
        check_topk(got[r], scores[a:b], k, None if mask is None else mask[a:b], None if ids is None else ids[a:b],
                   msg=f"request {r}")


def _spy(monkeypatch, name, *modules):
    """Calls of ``name`` where ``modules`` look it up, each recorded as its first argument's length."""
    return spy(monkeypatch, name, *modules, record=lambda a, kw: a[0].shape[0] if hasattr(a[0], "shape") else a[0])


def _rerun_batch(rng, M):
    sizes, ks, makers = _forced_requests(rng, M)
    # more requests answered at once; the two non-exact ones (seed_high, overflow) rerun
    sizes = sizes + [0, 64, 2 * M + 3]
    ks = np.concatenate([ks, [4, 70, 9]]).astype(np.int64)
    makers = makers + ["normal", "ties", "normal"]
    return sizes, ks, makers


def _spy_outcomes(monkeypatch):
    """topk_batch's batch_outcomes results, call by call."""
    seen = []
    orig = T.batch_outcomes

    def outcomes(*a, **kw):
        out = orig(*a, **kw)
        seen.append(out)
        return out

    monkeypatch.setattr(T, "batch_outcomes", outcomes)
    return seen


def _rerun_inputs(rng, M, use_elig, with_ids):
    sizes, ks, makers = _rerun_batch(rng, M)
    scores, offsets, _, ids = _batch_inputs(rng, sizes, makers, False, with_ids)
    mask = rng.random(scores.size) < 0.8 if use_elig else None
    if use_elig:  # keep the seed_high request forced: its sampled positions eligible
        mask[offsets[1] + seed_positions(sizes[1], M, BATCH_SAMPLE_CHUNK)] = True
    return sizes, ks, scores, offsets, mask, ids


def _run_rerun_case(rng, monkeypatch, use_elig, with_ids, config):
    """topk_batch on _rerun_inputs with its outcomes, topk_scores calls and block top-K launches
    (whole-batch ones and those inside topk_scores) spied on; the answer checked against the
    oracle. Returns (sizes, outcomes, one, whole)."""
    blk, per, M = sim_shape()
    sizes, ks, scores, offsets, mask, ids = _rerun_inputs(rng, M, use_elig, with_ids)
    outcomes = _spy_outcomes(monkeypatch)
    one = _spy(monkeypatch, "topk_scores", T)
    whole = _spy(monkeypatch, "launch_topk_batch", T, single)
    got = T.topk_batch(scores, offsets, ks, eligible=mask, ids=ids, config=config)
    _check_topk_batch(got, scores, offsets, ks, mask, ids)
    return sizes, outcomes, one, whole


@pytest.mark.parametrize("use_elig,with_ids,limit", [(False, False, None), (True, True, None), (False, True, 2)])
def test_topk_batch_reruns_few_one_by_one(rng, monkeypatch, use_elig, with_ids, limit):
    """Up to rerun_one_by_one non-exact requests (a seed_high and an overflow one, forced; the
    limit as shipped, and set to 2: exactly as many as rerun): each rerun by topk_scores on its own
    slice, no whole-batch rerun; the whole answer the oracle's."""
    config = DEFAULT_CONFIG if limit is None else TopKConfig(tuning=TopKTuning(rerun_one_by_one=limit))
    sizes, outcomes, one, whole = _run_rerun_case(rng, monkeypatch, use_elig, with_ids, config)
    assert len(outcomes) == 1 and outcomes[0][1] == "seed_high" and outcomes[0][2] == "overflow"
    redo = np.flatnonzero(outcomes[0] != "exact")
    assert 2 <= redo.size <= config.tuning.rerun_one_by_one
    assert one == [sizes[r] for r in redo]  # topk_scores on each rerun slice, in order
    assert len(whole) == len(one)  # the one inside each topk_scores call, none for the batch


def test_topk_batch_reruns_one_by_one_from_a_device_bitset(rng, monkeypatch):
    """The eligible set as a device uint64 bitset a request: each rerun request takes its own row
    (its first ceil(n / 64) words) to topk_scores; the answer the oracle's."""
    blk, per, M = sim_shape()
    sizes, ks, scores, offsets, mask, ids = _rerun_inputs(rng, M, True, True)
    one = _spy(monkeypatch, "topk_scores", T)
    got = T.topk_batch(scores, offsets, ks, eligible=launch.to_device(batch_bitset(mask, offsets)), ids=ids)
    _check_topk_batch(got, scores, offsets, ks, mask, ids)
    assert len(one) >= 2  # the forced seed_high and overflow requests


@pytest.mark.parametrize("use_elig,with_ids", [(False, True), pytest.param(True, False, marks=pytest.mark.slow)])
def test_topk_batch_reruns_many_as_one_batch(rng, monkeypatch, use_elig, with_ids):
    """More than rerun_one_by_one non-exact requests (rerun_one_by_one = 1, two forced ones): one
    unseeded block top-K over the whole batch answers them, no one-by-one rerun; the whole answer
    the oracle's."""
    config = TopKConfig(tuning=TopKTuning(rerun_one_by_one=1))
    sizes, outcomes, one, whole = _run_rerun_case(rng, monkeypatch, use_elig, with_ids, config)
    assert len(outcomes) == 1 and (outcomes[0] != "exact").sum() >= 2 > config.tuning.rerun_one_by_one
    assert one == [] and len(whole) == 1


def test_topk_batch_under_poisoned_shared_memory(rng, monkeypatch):
    """Shared arrays start as 0xA5 bytes (simulator): the seed's histograms, the filter's totals
    and stage, the sort's keys must all be written before read; a rerun request included."""
    if not launch.backend.is_simulator():
        pytest.skip("poisons the simulator's shared arrays")
    poison_shared_memory(monkeypatch)
    blk, per, M = sim_shape()
    sizes = [0, 1, 33, 250, M, 4 * M, 2 * M + 9]
    ks = np.array([2, 1, 40, 17, 30, 10, 12], np.int64)
    makers = ["normal", "normal", "ties", "normal", "narrow", lambda n: np.ones(n, np.float32), "normal"]
    scores, offsets, _, ids = _batch_inputs(rng, sizes, makers, False, True)
    mask = rng.random(scores.size) < 0.75
    for kw in ({}, {"eligible": mask, "ids": ids}):
        got = T.topk_batch(scores, offsets, ks, **kw)
        _check_topk_batch(got, scores, offsets, ks, kw.get("eligible"), kw.get("ids"))


# ----------------------------------------------------------------------------- topk_scores's batch of one


def test_topk_scores_answers_a_small_request_as_a_batch_of_one(rng, monkeypatch):
    """path="auto" sends a request of seed_min_n..small_max_n scores through the batched seeded
    path (a batch of one, its seed by the threads' best keys), and reruns it on the single-request
    path when the batch of one says it is not exact (here: the sampled positions hold the best
    scores, so the seed lies above the k-th score)."""
    blk, per, M = sim_shape()
    config = batch_of_one_from(2 * M)
    batch = spy(monkeypatch, "launch_topk_batch_seeded", single, record=lambda a, kw: a[1].batch)
    one = spy(monkeypatch, "launch_topk", single)
    n = 9 * M + 5
    s = make_scores(rng, n, "normal")
    mask = rng.random(n) < 0.7
    for k, eligible in ((30, None), (7, mask)):
        check_topk(T.topk_scores(s, k, eligible=eligible, config=config), s, k, eligible)
    assert batch == [1, 1] and len(one) == 0
    # the best scores at the sampled positions: the rank-th best sample is above the k-th score
    s = rng.random(n).astype(np.float32)
    s[seed_positions(n, M, BATCH_SAMPLE_CHUNK)] += 10.0
    k = 3 * M // 4
    check_topk(T.topk_scores(s, k, config=config), s, k)
    assert batch == [1, 1, 1] and len(one) == 1
    # past small_max_n: the single-request path alone
    check_topk(T.topk_scores(s, 5, config=batch_of_one_from(2 * M, small_max_n=n - 1)), s, 5)
    assert batch == [1, 1, 1] and len(one) == 2


def test_small_workspaces_are_reused_and_bounded(rng):
    """topk_scores reuses a batch-of-one workspace for the same (n, k, config), whatever the
    previous call left in it; a cache keeps at most its capacity (SMALL_WORKSPACES for
    topk_scores's), dropping the least recently used."""
    blk, per, M = sim_shape()
    config = batch_of_one_from(2 * M)
    n = 3 * M + 1
    first = single.small_workspaces.get(n, 9, config)
    for trial in range(3):
        s = make_scores(np.random.default_rng(trial), n, "normal")
        mask = None if trial != 1 else rng.random(n) < 0.5
        check_topk(T.topk_scores(s, 9, eligible=mask, config=config), s, 9, mask)
    assert single.small_workspaces.get(n, 9, config) is first
    assert single.small_workspaces.capacity == single.SMALL_WORKSPACES
    cache = WorkspaceCache(2)
    nine = cache.get(n, 9, config)
    assert cache.get(n, 9, config) is nine
    cache.get(n, 10, config)
    cache.get(n, 11, config)  # evicts the least recently used: (n, 9)
    assert set(cache.keys()) == {(n, 10, config), (n, 11, config)}
    assert cache.get(n, 9, config) is not nine
    assert cache.get(n, 9, DEFAULT_CONFIG) is not cache.get(n, 9, config)  # another config, another one


@st.composite
def small_request_cases(draw):
    """A request in the batch-of-one route's range (seed_min_n twice the sample):
    scores of one of make_scores's kinds, k from 1 to past n, an optional mask and ids."""
    _, _, M = sim_shape()
    n = draw(st.integers(2 * M, 3 * M + 100))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["normal", "ties", "narrow", "negative", "posinf", "all_nan"]))
    k = draw(st.one_of(st.integers(1, 40), st.sampled_from([n, n + 3, 600])))
    mask = rng.random(n) < draw(st.sampled_from([0.0, 0.05, 0.5])) if draw(st.booleans()) else None
    ids = rng.choice(4 * n, n, replace=False).astype(np.int64) if draw(st.booleans()) else None
    return make_scores(rng, n, kind), k, mask, ids


@settings(max_examples=6)
@given(small_request_cases())
def test_batch_of_one_route_matches_oracle(case):
    """topk_scores through the batched path on a batch of one (or its rerun), against the oracle."""
    scores, k, mask, ids = case
    _, _, M = sim_shape()
    check_topk(T.topk_scores(scores, k, eligible=mask, ids=ids, config=batch_of_one_from(2 * M)), scores, k, mask, ids)
