"""One request's paths (topk/single.py: launch_topk, seeded_outcome, the reruns of topk_one) on the
seeded "filter" and "scan" paths: against the oracle on hypothesis cases, with the seed forced above
the k-th score (the unseeded rerun) and the buffer forced to overflow (the seeded scan rerun),
eligible sets, tiny blocks, workspace reuse, and k above the block top-K's limit."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from andromeda_nb.device import launch
from andromeda_nb import reference
from andromeda_nb.targeting import bits_from_mask
from andromeda_nb.topk import api as T
from andromeda_nb.topk import single
from andromeda_nb.topk.filter import FilterWorkspace
from andromeda_nb.topk.seed import SeedWorkspace, launch_seed
from andromeda_nb.topk.single import launch_topk, seeded_exact, seeded_outcome

from ..helpers import poison_device_arrays, poison_shared_memory
from .helpers import SPECIALS, check_topk, row, small_seed, spy
from .models import draw_seeded_exact


@pytest.fixture(autouse=True)
def poisoned_device_memory(monkeypatch):
    """Device arrays start as 0xA5 bytes (simulator), so an output element left unwritten shows."""
    if launch.backend.is_simulator():
        poison_device_arrays(monkeypatch)


@st.composite
def seeded_cases(draw):
    """Arrays past the (shrunk) seeding threshold, on the single-request seeded "filter" path: the
    same value pools as the other cases (NaN, +-inf, -0, repeats), masks and ids, and a config."""
    n = draw(st.integers(1024, 3000))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    pool_size = draw(st.sampled_from([0, 3, 50, 10_000]))
    pool = np.concatenate([np.array(SPECIALS, np.float32), rng.standard_normal(pool_size).astype(np.float32)])
    scores = pool[rng.integers(0, pool.size, n)]
    if draw(st.booleans()):  # sorted ascending: the adversarial order
        scores = np.sort(scores)
    k = draw(st.one_of(st.integers(1, 60), st.integers(61, 400), st.sampled_from([n, n + 1])))
    use_elig = draw(st.booleans())
    eligible = (rng.random(n) < draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))) if use_elig else None
    ids = rng.choice(4 * n + 1, n, replace=False).astype(np.int64) if draw(st.booleans()) else None
    # a seed aimed below its usual margin (often above the k-th score: the unseeded rerun) and a
    # filter buffer of k entries (often overflowing: the seeded scan rerun)
    tuning = dict(seed_margin=draw(st.sampled_from([2.5, 2.5, 0.25])))
    if draw(st.booleans()):
        tuning.update(filter_min_cap=1, filter_cap_per_k=1)
    return scores, k, eligible, ids, small_seed("filter", **tuning)


@pytest.mark.slow  # ~20 s of simulated hypothesis cases: the slow tier (make test-slow)
@given(seeded_cases())
def test_seeded_topk_matches_oracle(case):
    """The single-request seeded path (sample, seed, filter, final; a rerun where the seed was high
    or the buffer overflowed) on hypothesis cases, outputs poisoned: exactly the oracle's."""
    scores, k, eligible, ids, config = case
    check_topk(T.topk_scores(scores, k, eligible=eligible, ids=ids, config=config), scores, k, eligible, ids)


@pytest.mark.parametrize("path", ["filter", "scan"])
@pytest.mark.parametrize("layout", ["random", "top_in_sample", "nan_in_sample"])
def test_seeded_scan_is_exact_and_falls_back(layout, path):
    """A seed from the sample; with the best scores in the sampled chunks it lands above the k-th
    score (fewer than k reach it: the unseeded rerun answers); NaN in the sample never seeds."""
    config = small_seed(path)
    rng = np.random.default_rng(5)
    n, k = 2048, 20
    scores = rng.standard_normal(n).astype(np.float32)
    if layout == "top_in_sample":
        # the highest scores sit exactly in the sampled chunks: the seed lands above the k-th score
        for j in range(8):
            off = (2 * j + 1) * n // 16 - 16
            scores[off: off + 32] += 100.0
    if layout == "nan_in_sample":  # NaN is sampled as -inf: never a seed, never selected
        for j in range(8):
            off = (2 * j + 1) * n // 16 - 16
            scores[off: off + 24] = np.nan
    sws = SeedWorkspace.make(n, k, config=config)
    assert sws is not None
    seed = launch_seed(launch.to_device(scores), n, sws).copy_to_host()[0]
    assert np.isfinite(seed)
    assert ((scores >= seed).sum() < k) == (layout == "top_in_sample")  # the rerun is reached there alone
    got = T.topk_scores(scores, k, config=config)
    check_topk(got, scores, k)
    assert got.count == n - np.isnan(scores).sum()


@pytest.mark.parametrize("block", [1, 2, 3])
def test_seeded_filter_path_with_tiny_blocks(monkeypatch, rng, block):
    """The filter launch takes the caller's block (1..1024): its per-block totals are set whatever
    the block size (a block of 1 or 2 threads once left some unset: wrong counts, a missed
    seed_high rerun, real scores returned as pads). Shared memory is poisoned, so a total left
    unset shows."""
    if not launch.backend.is_simulator():
        pytest.skip("poisons the simulator's shared arrays")
    poison_shared_memory(monkeypatch)
    config = small_seed()
    n, k = 2048 + 1, 20
    scores = draw_seeded_exact(
        lambda: np.where(rng.random(n) < 0.3, np.nan, rng.standard_normal(n)).astype(np.float32), n, k, config)
    res, sws = launch_topk(launch.to_device(scores), n, k, seeded=True, block=block, config=config)
    assert isinstance(res, FilterWorkspace) and seeded_outcome(res, k) == "exact"
    want = reference.topk(scores, k)
    seed = sws.seed().copy_to_host()[0]
    assert res.counts.copy_to_host()[0].tolist() == [want.count, int((scores >= seed).sum())]
    check_topk(row(res), scores, k)


@pytest.mark.parametrize("path", ["filter", "scan"])
@pytest.mark.parametrize("fraction", [0.6, 0.05, 0.0])
def test_seeded_scan_with_an_eligible_set(rng, fraction, path):
    """Seeding samples only eligible scores (ineligible ones as -inf): exact against the oracle,
    including a sample with the highest scores all ineligible and an empty eligible set."""
    config = small_seed(path)
    n, k = 2048, 20
    scores = rng.standard_normal(n).astype(np.float32)
    eligible = rng.random(n) < fraction
    scores[~eligible] += 50.0  # the best scores are ineligible: a seed from them would be wrong
    sws = SeedWorkspace.make(n, k, config=config)
    seed = launch_seed(launch.to_device(scores), n, sws, elig=launch.to_device(bits_from_mask(eligible)))
    seed = seed.copy_to_host()[0]
    assert seed < 40.0  # drawn from eligible scores (or -inf when too few are eligible)
    check_topk(T.topk_scores(scores, k, eligible=eligible, config=config), scores, k, eligible)


def test_filter_overflow_reruns_exactly(monkeypatch):
    """All-equal scores all reach the seed: the filter's buffer overflows (counted, not written
    past its end), the call reports it inexact and the wrapper's rerun answers ties to the lowest id."""
    config = small_seed(filter_min_cap=64, filter_cap_per_k=1)
    n, k = 2048, 20
    scores = np.full(n, 0.5, np.float32)
    res, sws = launch_topk(launch.to_device(scores), n, k, seeded=True, config=config)
    assert isinstance(res, FilterWorkspace) and sws is not None and res.cap == 64
    assert not seeded_exact(res, k)  # n scores reached the seed, 64 fit
    assert seeded_outcome(res, k) == "overflow"
    calls = spy(monkeypatch, "launch_topk", single, record=lambda a, kw: (kw.get("seeded"), kw.get("path")))
    got = T.topk_scores(scores, k, config=config)
    # the rerun keeps the seed (it is at or below the k-th score) and takes the scan path
    assert calls == [(True, "filter"), (True, "scan")]
    check_topk(got, scores, k)
    np.testing.assert_array_equal(got.ids, np.arange(k))
    assert got.count == n


def test_bench_topk_stages_run_in_order_and_answer(rng):
    """The benchmark's per-stage split (bench.topk.topk_stages) on a small seeded case: run in
    order, every stage that writes an answer equals the oracle (GPU time is scarce: a broken stage
    list should fail here, not on the GPU host)."""
    from andromeda_nb.bench.topk import topk_stages

    config = small_seed()
    n, k = 2048 + 19, 20
    scores = draw_seeded_exact(lambda: rng.standard_normal(n).astype(np.float32), n, k, config)
    stages, ws, fws, sws = topk_stages(launch.to_device(scores), n, k, config=config)
    assert [s[0] for s in stages][-1] == "all"
    for name, fn, _, res in stages:
        fn()
        if res is not None:
            check_topk(row(res), scores, k, msg=name)
    assert seeded_exact(fws, k)


@pytest.mark.parametrize("case", ["small_unseeded", "k_is_n", "seeded_filter",
                                  pytest.param("seeded_rerun", marks=pytest.mark.slow)])
def test_k_beyond_the_block_topk_limit(monkeypatch, rng, case):
    """2048 < k <= 4096: answered by radix select only (the seeded filter path, else one pass
    keeping every eligible score), exact with NaN, ties, ids and an eligible set; pads past the
    eligible count. The seeded cases take 24,000 scores, the fewest whose sample ranks such a k
    (a rank of at most a quarter of the 512 samples)."""
    k = T.BLOCK_TOPK_MAX_K + 77
    n = {"small_unseeded": 2400, "k_is_n": k, "seeded_filter": 24_000, "seeded_rerun": 24_000}[case]
    config = T.DEFAULT_CONFIG
    if case.startswith("seeded"):
        config = small_seed(max_sample_chunks=16, seed_sample_rank=4096)
        sws = SeedWorkspace.make(n, k, config=config)
        assert sws is not None and sws.r > sws.m // 5  # close to the largest rank a seed takes
    scores = rng.integers(-50, 50, n).astype(np.float32)
    scores[rng.choice(n, n // 20, replace=False)] = np.nan
    if case == "seeded_rerun":  # the best scores sit in the sampled chunks: the seed lands too high
        for j in range(16):
            off = (2 * j + 1) * n // 32 - 16
            scores[off: off + 32] = 1000.0 + j
    eligible = rng.random(n) < 0.8
    ids = rng.permutation(3 * n)[:n].astype(np.int64)
    caps = []

    class Spy(FilterWorkspace):  # which buffers the call used: seeded filter, then a full pass?
        def __init__(self, n_, k_, cap=None, *, config=None):
            super().__init__(n_, k_, cap, config=config)
            caps.append(cap)

    monkeypatch.setattr(single, "FilterWorkspace", Spy)
    got = T.topk_scores(scores, k, eligible=eligible, ids=ids, config=config)
    assert caps == {"small_unseeded": [n], "k_is_n": [n], "seeded_filter": [None], "seeded_rerun": [None, n]}[case]
    check_topk(got, scores, k, eligible, ids)
    want = reference.topk(scores, k, ids=ids, eligible=eligible)
    if case in ("small_unseeded", "k_is_n"):  # fewer eligible than k: pads
        assert want.count < k and (got.ids[want.count:] == -1).all()


def test_filter_workspace_reuse_starts_from_zero(rng):
    """The filter path's counters are zeroed inside its sample launch (no separate reset kernel):
    a workspace reused on new scores answers for them alone (a missing reset would carry the first
    call's fill and counts into the second)."""
    config = small_seed()
    n, k = 2048, 20
    sws, fws = SeedWorkspace.make(n, k, config=config), FilterWorkspace(n, k, config=config)
    for trial in range(2):
        scores = draw_seeded_exact(
            lambda: np.where(np.arange(n) < 100 * trial, np.nan, rng.standard_normal(n)).astype(np.float32), n, k,
            config)
        res, _ = launch_topk(launch.to_device(scores), n, k, seeded=True, sws=sws, fws=fws, config=config)
        assert res is fws and seeded_exact(fws, k)
        want = reference.topk(scores, k)
        check_topk(row(fws, count=int(fws.counts.copy_to_host()[0, 0])), scores, k)
        c = fws.counts.copy_to_host()[0]
        assert c[0] == want.count and c[1] == fws.fill.copy_to_host()[0]
