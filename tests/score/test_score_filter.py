"""Fused scoring + top-K by the seeded filter path (scoring.SCORE_TOPK_PATH = "filter") against the
oracle top-K of the kernel's own scores, and its fallbacks."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from andromeda_nb.device import launch
from andromeda_nb import reference
from andromeda_nb.score import api as S
from andromeda_nb.model import AdTable, Request
from andromeda_nb.score.api import DeviceAdTable, score_ads, score_topk

from ..helpers import poison_device_arrays, small_seed_config as seed_config

N = 2000  # with the sample shrunk below: 15 chunks of 16 (240 samples), a seed rank r >= 8 for k >= 17


@pytest.fixture(autouse=True)
def poisoned_device_memory(monkeypatch):
    """Device arrays start as 0xA5 bytes (simulator), so an output element left unwritten shows."""
    if launch.backend.is_simulator():
        poison_device_arrays(monkeypatch)


@pytest.fixture
def small_seed():
    return seed_config()


def table_of(rng, n, d=32, dtype="fp16", ties=False):
    emb = rng.standard_normal((n, d))
    if ties:
        emb[100:400] = emb[7]  # 300 identical rows: tied scores around the seed, broken by ad id
    return AdTable.from_float(emb, rng.standard_normal(n) * (0 if ties else 1), dtype=dtype,
                              ad_ids=rng.choice(100 * n, n, replace=False))


def spy(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(a) or real(*a, **kw))
    return calls


def expected(req, table, dt, k, access, rng):
    pool = score_ads(req, dt).copy_to_host()
    kwargs, eligible, ids, scores = {}, None, table.ad_ids, pool
    if access == "bitset":
        eligible = rng.random(table.n_ads) < 0.5
        kwargs["eligible"] = eligible
    elif access == "candidates":
        cand = rng.choice(table.n_ads, 1500, replace=False).astype(np.int32)
        kwargs["candidates"] = cand
        ids, scores = table.ad_ids[cand], pool[cand]
    return kwargs, reference.topk(scores, k, ids=ids, eligible=eligible)


@pytest.mark.parametrize("access", ["pool", "bitset", "candidates"])
def test_filter_path_equals_oracle(monkeypatch, rng, access):
    # a seed of rank >= k: at least k sampled scores reach it, so it can never be high (at the
    # margin's rank 12 < k = 40 it was, correctly, on ~1 draw in 800: the block path answered)
    topk_config = seed_config(seed_min_rank=40)
    req = rng.standard_normal(32)  # two-tower dot: the cheapest kernel in the simulator
    table = table_of(rng, N)
    dt = DeviceAdTable(table, "tiles")
    k = 40
    kwargs, want = expected(req, table, dt, k, access, rng)
    block_calls = spy(monkeypatch, S, "launch_score_topk")
    filter_calls = spy(monkeypatch, S, "launch_score_filter")
    top = score_topk(req, dt, k, topk_config=topk_config, **kwargs)
    assert len(filter_calls) == 1 and not block_calls, "the filter path must answer on its own"
    np.testing.assert_array_equal(top.ids, want.ids)
    np.testing.assert_array_equal(top.scores, want.scores)
    assert top.count == want.count


def test_filter_path_gated_with_ties_and_nan(small_seed, monkeypatch, rng):
    req = Request.random(32, 4, 2, rng)
    emb = rng.standard_normal((N, 32))
    best = int(np.argmax(reference.score(req, AdTable.from_float(emb, np.zeros(N), dtype="fp32"))))
    emb[100:1100] = emb[best]  # 1,001 ads tied at the top score: the seed lands on the tie
    emb[5, 3] = np.nan  # one NaN score: never selected, not counted
    table = AdTable.from_float(emb, np.zeros(N), dtype="fp32", ad_ids=rng.permutation(N) + 10,
                               allow_nonfinite=True)
    dt = DeviceAdTable(table)
    pool = score_ads(req, dt).copy_to_host()
    filter_calls = spy(monkeypatch, S, "launch_score_filter")
    block_calls = spy(monkeypatch, S, "launch_score_topk")
    top = score_topk(req, dt, 100, topk_config=small_seed)  # all 100 from the tie, by ad id
    assert len(filter_calls) == 1 and not block_calls
    want = reference.topk(pool, 100, ids=table.ad_ids)
    np.testing.assert_array_equal(top.ids, want.ids)
    np.testing.assert_array_equal(top.scores, want.scores)
    assert top.count == N - 1


@pytest.mark.parametrize("how", ["seed_high", "overflow"])
def test_filter_path_falls_back_exactly(monkeypatch, rng, how):
    if how == "seed_high":  # aim the seed at k / 4 scores: fewer than k reach it
        topk_config = seed_config(seed_margin=0.25)
        k = 300
    else:  # a buffer of k entries: the ~4k scores at or above the seed overflow it
        # >= 41 sampled scores reach the seed: always past the cap
        topk_config = seed_config(filter_min_cap=1, filter_cap_per_k=1, seed_min_rank=41)
        k = 40
    req = rng.standard_normal(32)
    table = table_of(rng, N)
    dt = DeviceAdTable(table, "rows")
    _, want = expected(req, table, dt, k, "pool", rng)
    block_calls = spy(monkeypatch, S, "launch_score_topk")
    filter_calls = spy(monkeypatch, S, "launch_score_filter")
    top = score_topk(req, dt, k, topk_config=topk_config)
    assert len(filter_calls) == 1 and len(block_calls) == 1
    np.testing.assert_array_equal(top.ids, want.ids)
    np.testing.assert_array_equal(top.scores, want.scores)


def test_k_above_the_block_limit(small_seed, monkeypatch, rng):
    """k = 2100 > BLOCK_TOPK_MAX_K over 2,000 ads: no seed pays, so scores go to memory and
    topk_scores selects (every ad, then pads); the block path refuses such a k."""
    req = rng.standard_normal(32)
    table = table_of(rng, N)
    dt = DeviceAdTable(table)
    pool = score_ads(req, dt).copy_to_host()
    top = score_topk(req, dt, 2100, topk_config=small_seed)
    want = reference.topk(pool, 2100, ids=table.ad_ids)
    np.testing.assert_array_equal(top.ids, want.ids)
    np.testing.assert_array_equal(top.scores, want.scores)
    assert (top.ids[N:] == -1).all()
    with pytest.raises(ValueError, match="2048"):
        score_topk(req, dt, 2100, path="block")
    with pytest.raises(ValueError, match="path"):
        score_topk(req, dt, 5, path="nope")


# each path: empty, sparse, and one of half / all eligible in the default tier (the other slow)
@pytest.mark.parametrize("path, fraction", [(p, f) for p in ("block", "filter") for f in (0.0, 0.03)]
                         + [("block", 1.0), ("filter", 0.5), pytest.param("block", 0.5, marks=pytest.mark.slow),
                            pytest.param("filter", 1.0, marks=pytest.mark.slow)])
def test_bitset_compaction_per_tile(small_seed, rng, fraction, path):
    """With an eligible bitset the top-K kernels compact each tile of positions to a shared list of
    the eligible ones (score.fused.BITS_PER_THREAD per thread) and score it densely: sizes that
    are not a multiple of a tile (512 positions in the simulator), empty, sparse, dense and full
    sets, the gated model (its temporaries must not clobber the list's), against the oracle."""
    n = 2000 + 77
    req = Request.random(32, 4, 2, rng)
    table = table_of(rng, n)
    dt = DeviceAdTable(table, "rows")
    pool = score_ads(req, dt).copy_to_host()
    eligible = rng.random(n) < fraction
    k = 40
    top = score_topk(req, dt, k, eligible=eligible, path=path, topk_config=small_seed)
    want = reference.topk(pool, k, ids=table.ad_ids, eligible=eligible)
    np.testing.assert_array_equal(top.ids, want.ids)
    np.testing.assert_array_equal(top.scores, want.scores)
    assert top.count == want.count == eligible.sum()


@st.composite
def filter_cases(draw):
    """Fused scoring + top-K on the filter path: a dot-product table (the simulator's cheapest
    kernel) of any dtype and layout, repeated rows (tied scores), pool / bitset / candidates
    access, k from 1 past the candidates, a seed below its margin or a k-entry buffer (the
    fallbacks)."""
    n = draw(st.integers(256, 1500))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = draw(st.sampled_from(["fp32", "fp16", "bf16", "int8"]))
    emb = rng.standard_normal((n, 32))
    if draw(st.booleans()):
        emb = emb[rng.integers(0, draw(st.sampled_from([1, 5, 50])), n)]  # few distinct rows: ties
    table = AdTable.from_float(emb, np.zeros(n), dtype=dtype, ad_ids=rng.choice(10 * n, n, replace=False))
    access = draw(st.sampled_from(["pool", "bitset", "candidates"]))
    kwargs = {}
    if access == "bitset":
        kwargs["eligible"] = rng.random(n) < draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
    elif access == "candidates":
        kwargs["candidates"] = rng.choice(n, draw(st.integers(0, n)), replace=False).astype(np.int32)
    k = draw(st.one_of(st.integers(1, 50), st.integers(51, 400), st.just(n + 1)))
    tuning = {}
    if draw(st.booleans()):
        tuning = draw(st.sampled_from([dict(seed_margin=0.25), dict(filter_min_cap=1, filter_cap_per_k=1)]))
    return rng.standard_normal(32), table, draw(st.sampled_from(["rows", "tiles"])), k, kwargs, seed_config(**tuning)


@pytest.mark.slow
@given(filter_cases())
def test_filter_path_matches_oracle_on_generated_cases(case):
    """score_topk's default (filter) path, whatever its fallbacks: exactly the oracle's top-K of the
    kernel's own scores (device outputs poisoned)."""
    req, table, layout, k, kwargs, topk_config = case
    dt = DeviceAdTable(table, layout)
    pool = score_ads(req, dt).copy_to_host()
    top = score_topk(req, dt, k, topk_config=topk_config, **kwargs)
    cand = kwargs.get("candidates")
    if cand is None:
        want = reference.topk(pool, k, ids=table.ad_ids, eligible=kwargs.get("eligible"))
    else:
        want = reference.topk(pool[cand], k, ids=table.ad_ids[cand])
    np.testing.assert_array_equal(top.ids, want.ids)
    np.testing.assert_array_equal(top.scores, want.scores)
    assert top.count == want.count
