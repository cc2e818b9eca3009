"""KernelConfig(row_scales="fp16_pairs"): fp16 math reads an int8 table's row scales as fp16 pairs
(s, -1152 s) made once a table (DeviceAdTable.scale_pairs) instead of making them each round from
the float32 scales. The same bits, so the same scores and top-K on every path that takes it."""

import numpy as np
import pytest
from numba import cuda

import andromeda_nb as anb
from andromeda_nb import reference
from andromeda_nb.device import backend, launch
from andromeda_nb.device.intrinsics import dequant_offset_h2_host, half2_of_host, pair_high, pair_low, \
    scale_pairs_host

from .test_math import _spy_kernels, same_filter_answers, table_of


def _spread_halves(pairs):
    """pair_low / pair_high of each word, run in a kernel (they are device intrinsics on a GPU)."""
    @cuda.jit
    def spread(p, lo, hi):
        i = cuda.grid(1)
        if i < p.size:
            lo[i] = pair_low(p[i])
            hi[i] = pair_high(p[i])

    lo, hi = np.zeros_like(pairs), np.zeros_like(pairs)
    spread[(pairs.size + 63) // 64, 64](pairs, lo, hi)
    return lo, hi


def test_scale_pairs_are_the_halves_the_kernel_makes_each_round(rng):
    """The table's pairs (a device kernel) equal the host model word for word: the low half the
    scale rounded to fp16 (65504 past its range), the high half that times -1152 rounded once (inf
    past fp16's range, -0 for a zero scale); pair_low / pair_high spread a half over both."""
    s = np.concatenate([rng.random(200).astype(np.float32) * np.float32(0.05),
                        np.array([0, 1e-8, 56, 57, 65504, 1e6, np.finfo(np.float32).max], np.float32)])
    q = rng.integers(-127, 128, (s.size, 32)).astype(np.int8)
    table = anb.AdTable(embeddings=q, bias=np.zeros(s.size, np.float32), dtype="int8", scale=s,
                        ad_ids=np.arange(s.size, dtype=np.int64))
    got = anb.DeviceAdTable(table, "tiles").scale_pairs().copy_to_host()
    s2 = half2_of_host(s)
    want = (s2 & 0xFFFF) | (dequant_offset_h2_host(s2) & 0xFFFF0000)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(scale_pairs_host(s), want)
    halves = got.view(np.float16).reshape(-1, 2)
    assert halves[-3, 0] == 65504 and np.isinf(halves[-3, 1]) and np.signbit(halves[s.size - 7, 1])  # 65504; 0 -> -0
    np.testing.assert_array_equal(halves[:200, 0], np.minimum(s[:200], 65504).astype(np.float16))
    lo, hi = _spread_halves(got)
    np.testing.assert_array_equal(lo, (got & 0xFFFF) * np.uint32(0x10001))
    np.testing.assert_array_equal(hi, (got >> 16) * np.uint32(0x10001))
    with pytest.raises(ValueError, match="int8"):
        table_of(rng, 40, 32, "tiles", "fp16")[1].scale_pairs()


@pytest.mark.parametrize("layout", ["tiles", pytest.param("rows", marks=pytest.mark.slow)])
def test_int8_scale_pairs_answer_as_the_float_scales(rng, layout, monkeypatch):
    """Scores to memory and the filter path's top-K over the pool, an eligible set and a candidate
    list (301 ads: a warp's last round past the end), with two rounds in flight and through the
    ring, dequant mul and fma: bit for bit the default's; fp16 tables and fp32 math ignore it; the
    setting reaches the generator at both launch sites; bad values are refused."""
    from andromeda_nb.score.fused import fused_kernel
    from andromeda_nb.topk.config import TopKConfig, TopKTuning

    seeded = TopKConfig(tuning=TopKTuning(max_sample_chunks=16, sample_chunk=16, seed_min_n=256))
    t, dt = table_of(rng, 301, 32, layout, "int8")
    req = anb.Request.random(32, 5, 2, rng)
    plain = anb.KernelConfig(math="fp16", block=32, row_scales="fp32")
    pairs = anb.KernelConfig(math="fp16", block=32, row_scales="fp16_pairs")
    assert pairs.kernel_row_scales("int8") and not pairs.kernel_row_scales("fp16")
    assert anb.KernelConfig(math="fp16").kernel_row_scales("int8")  # the default
    assert not plain.kernel_row_scales() and not anb.KernelConfig(row_scales="fp16_pairs").kernel_row_scales()
    built = _spy_kernels(monkeypatch)
    want = anb.score_ads(req, dt, config=plain).copy_to_host()
    np.testing.assert_array_equal(anb.score_ads(req, dt, config=pairs).copy_to_host(), want)
    np.testing.assert_allclose(want, reference.score(req, t, math="fp16"), rtol=1e-3, atol=1e-3)  # the fp16 model
    same_filter_answers(rng, req, dt, pairs, plain, seeded)
    assert {sf for sf, kw in built if kw.get("scale_pairs")} == {False, True}
    more = [{"dequant": "mul"}, {"f16_weights": "shared", "rows_ahead": 2}]
    if layout == "tiles":
        more.append({"ring_stages": 2})
    for extra in more:
        np.testing.assert_array_equal(
            anb.score_ads(req, dt, config=anb.KernelConfig(math="fp16", block=32, **extra)).copy_to_host(),
            anb.score_ads(req, dt, config=anb.KernelConfig(math="fp16", block=32, row_scales="fp32", **extra))
            .copy_to_host())
    _, d16 = table_of(rng, 301, 32, layout, "fp16")
    np.testing.assert_array_equal(anb.score_ads(req, d16, config=pairs).copy_to_host(),
                                  anb.score_ads(req, d16, config=plain).copy_to_host())
    assert not hasattr(d16, "_scale_pairs")  # never made for a table that does not read them
    for bad in ("fp16", "pairs", None, True):
        with pytest.raises(ValueError, match="row_scales"):
            anb.KernelConfig(row_scales=bad)
    with pytest.raises(ValueError, match="scale_pairs"):
        fused_kernel("gated", 32, 5, 2, "int8", "tiles", "pool", 32, scale_pairs=True)  # fp32 math


def test_a_live_pools_update_writes_the_scale_pairs_of_its_rows(rng, monkeypatch):
    """An int8 live pool's table read with fp16 pairs (the default): an update applied before the
    first request made them, and one after that changes rows (other scales), creates one and
    retires one, keep the pairs equal to the float scales' (the scatter writes them with the
    scales, in place, in the same launch), so score_ads and score_topk still answer as the float
    scales do, the filter path's replayed launches (recorded before the update, reading the same
    pairs array) included; the pairs kernel runs once, never in a replay or an update; the pool's
    memory report counts the pairs."""
    from andromeda_nb.analysis.pool_report import memory_per_ad
    from andromeda_nb.pipeline import Pool, PoolUpdate
    from andromeda_nb.score import table_kernels
    from andromeda_nb.targeting import TargetingIndex
    from andromeda_nb.topk.config import TopKConfig, TopKTuning

    from ..helpers import random_rules

    made = []
    if backend.is_simulator():  # every launch of the pairs kernel, a replay's too, passes here
        from numba.cuda.simulator.kernel import FakeCUDAKernel

        call = FakeCUDAKernel.__call__

        def counted(kernel, *args):
            if kernel.fn is table_kernels.scale_pairs_kernel.fn:
                made.append(args)
            return call(kernel, *args)

        monkeypatch.setattr(FakeCUDAKernel, "__call__", counted)
    d, n = 16, 300
    seeded = TopKConfig(tuning=TopKTuning(max_sample_chunks=16, sample_chunk=16, seed_min_n=256))  # the filter applies
    rules = random_rules(rng, n, p_constrain=0.0, p_exclude=0.0, live_p=1.0)
    table = anb.AdTable.from_float(rng.standard_normal((n, d)), dtype="int8", ad_ids=rules.ad_ids)
    pool = Pool(table, TargetingIndex(rules, capacity=320), config=anb.KernelConfig(math="fp16"), max_k=8)
    plain = anb.KernelConfig(math="fp16", block=32, row_scales="fp32")
    pairs = anb.KernelConfig(math="fp16", block=32)
    req = anb.Request.random(d, 3, 2, rng)
    ids = [int(i) for i in rules.ad_ids[:21]]
    new = int(rules.ad_ids.max()) + 1
    # binds the pool's update launch while the table keeps no pairs
    pool.apply(PoolUpdate.from_records(rules.schema, [{"op": "change", "ad_id": ids[-1],
                                                       "embedding": rng.standard_normal(d)}], d))
    without = memory_per_ad(pool)["table"]
    for k in (5, 8):  # k = 8 records its launches after k = 5 made the pairs
        for c in (plain, pairs):
            anb.score_topk(req, pool.table, k, config=c, topk_config=seeded)
    for k in (5, 8):  # replays, the first of a recording that made the pairs
        anb.score_topk(req, pool.table, k, config=pairs, topk_config=seeded)
    assert len(made) == (1 if backend.is_simulator() else 0)  # made once, not by each replay
    assert memory_per_ad(pool)["table"] - without == pytest.approx(4 * pool.table.n_ads / pool.n_ads)  # counted
    kept = pool.table.scale_pairs()
    before = kept.copy_to_host()
    recs = [{"op": "change", "ad_id": i, "embedding": 30 * rng.standard_normal(d)} for i in ids[1:]]
    recs += [{"op": "retire", "ad_id": ids[0]}, {"op": "create", "ad_id": new, "embedding": rng.standard_normal(d)}]
    pool.apply(PoolUpdate.from_records(rules.schema, recs, d))
    assert pool.table.scale_pairs() is kept and len(made) == (1 if backend.is_simulator() else 0)  # written in place
    after = kept.copy_to_host()
    assert not np.array_equal(before, after)
    np.testing.assert_array_equal(after, scale_pairs_host(pool.table.scale.copy_to_host()))  # the retired row's too
    got = anb.score_ads(req, pool.table, config=pairs).copy_to_host()
    want = anb.score_ads(req, pool.table, config=plain).copy_to_host()
    np.testing.assert_array_equal(got, want)
    assert np.isfinite(want[pool.table.host_ad_ids >= 0]).all()
    for k in (8, 5):  # replays recorded before the update, and the block path
        a = anb.score_topk(req, pool.table, k, config=pairs, topk_config=seeded)
        b = anb.score_topk(req, pool.table, k, config=plain, topk_config=seeded)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.scores, b.scores)
    a, b = (anb.score_topk(req, pool.table, 8, config=c, path="block") for c in (pairs, plain))
    np.testing.assert_array_equal(a.ids, b.ids)


def test_pairs_of_scales_the_caller_rewrote_are_made_again_by_refresh(rng):
    """A from_device int8 table reads the caller's scales in place; its kept pairs follow a rewrite
    of them once the caller calls refresh_scale_pairs (from_device's contract): then the default
    (pairs) answers as the float scales do, bit for bit, and differently from before the rewrite."""
    d, n = 16, 64
    host = anb.AdTable.from_float(rng.standard_normal((n, d)), dtype="int8")
    scale = launch.to_device(host.scale.copy())
    t = anb.DeviceAdTable.from_device(launch.to_device(host.embeddings), launch.to_device(host.bias), "int8", "rows",
                                      scale=scale)
    req = anb.Request.random(d, 3, 2, rng)
    pairs, plain = anb.KernelConfig(math="fp16"), anb.KernelConfig(math="fp16", row_scales="fp32")
    before = anb.score_topk(req, t, 5, config=pairs)  # makes the pairs
    scale.copy_to_device((host.scale * np.float32(0.5)).astype(np.float32))
    t.refresh_scale_pairs()
    np.testing.assert_array_equal(t.kept_scale_pairs.copy_to_host(), scale_pairs_host(host.scale * np.float32(0.5)))
    got, want = (anb.score_topk(req, t, 5, config=c) for c in (pairs, plain))
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.scores, want.scores)
    assert not np.array_equal(got.scores, before.scores)
