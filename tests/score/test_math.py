"""The fp16 math mode (KernelConfig(math="fp16")) against the model it computes
(reference.score(math="fp16")), and the range checks that refuse requests a math would overflow."""

import numpy as np
import pytest

import andromeda_nb as anb
from andromeda_nb import checks, reference
from andromeda_nb.score import DeviceAdTable
from andromeda_nb.score.table import DeviceRequest

from ..helpers import filter_path_only, small_seed_config

F16 = anb.KernelConfig(math="fp16")


def table_of(rng, n, d, layout, dtype="fp16"):
    t = anb.AdTable.from_float(rng.standard_normal((n, d)), rng.standard_normal(n), dtype=dtype,
                               ad_ids=rng.choice(10 * n, n, replace=False))
    return t, DeviceAdTable(t, layout)


@pytest.mark.parametrize("dtype", ["fp16", "int8"])
@pytest.mark.parametrize("layout", ["rows", "tiles"])
@pytest.mark.parametrize("d, E, K", [(16, 1, 1), (32, 5, 2), (48, 6, 2), (64, 8, 3)])
def test_fp16_scores_equal_the_fp16_model(rng, dtype, layout, d, E, K):
    """fp32 accuracy against the fp16 model (h, weights rounded to fp16, an int8 row dequantized to
    fp16; products exact, sums in fp32), fp16-rounding distance from the fp32 model; n off the warp
    and block size."""
    n = 77
    t, dt = table_of(rng, n, d, layout, dtype)
    req = anb.Request.random(d, E, K, rng)
    got = anb.score_ads(req, dt, config=F16).copy_to_host()
    ref16, ref32 = reference.score(req, t, math="fp16"), reference.score(req, t)
    tol = checks.score_tolerance(req, t, "fp16")
    swappable = checks.near_tie_ads(req, t, "fp16")  # an ad whose K-th and (K+1)-th logits nearly tie
    bad = ~swappable & (np.abs(got - ref16) > tol)
    assert not bad.any(), (np.abs(got - ref16) / tol)[bad].max()
    # fp16 rounding of h and the weights (and an int8 row), no more; where the fp32 logits nearly
    # tie, either set
    assert checks.compare_scores_to_fp32(got, req, t, "fp16")
    assert np.abs(got - ref32)[~checks.rounding_tie_ads(req, t)].max() < checks.FP16_RTOL * checks.score_scale(req, t)


def test_int8_rows_dequantize_to_fp16_as_the_reference(rng):
    """The kernel's int8 -> fp16 step (dequant_i8x4: q exact, times the fp16 scale, rounded once)
    on every q from -128 to 127 against scales of every fp16 range: normal, subnormal (fewer
    significant bits), past fp16 (inf), and zero; the words' byte order is the rows' dim order."""
    from andromeda_nb.device.intrinsics import dequant_i8x4_host, half2_of_host

    q = np.arange(-128, 128, dtype=np.int8)
    scales = np.array([1.0, 0.0137, 3e-3, 1e-6, 2.0 ** -24, 500.0, 1e5, 0.0], np.float32)
    words = np.tile(q.view(np.uint32), scales.size)  # 64 words of 4 bytes a scale
    with np.errstate(over="ignore"):
        s2 = np.repeat(half2_of_host(scales), q.size // 4)
    lo, hi = dequant_i8x4_host(words, s2)
    got = np.stack([lo, hi], axis=1).view(np.float16).reshape(scales.size, q.size)
    held = np.minimum(scales, 65504.0).astype(np.float16).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        want = (q[None, :].astype(np.float64) * held[:, None]).astype(np.float16)
    np.testing.assert_array_equal(got, want)
    # a scale past fp16 is held at 65504: q = 0 stays 0 (no NaN), the other q overflow (tables with
    # them are refused up front, test_int8_rows_beyond_fp16_are_refused)
    assert not np.isnan(got[6]).any() and (got[6][q == 0] == 0).all() and np.isinf(got[6][np.abs(q) > 1]).all()
    assert np.isfinite(got[5]).all() and (got[7] == 0).all()
    assert (half2_of_host(np.float32(0.0137)) >> 16) == (half2_of_host(np.float32(0.0137)) & 0xFFFF)


def test_fused_dequantization_gives_the_bits_of_the_subtract_and_multiply(rng):
    """dequant="fma" ((1152 + q) s - 1152 s in one fused multiply-add) equals dequant_i8x4's q s on
    every q (as values: a zero scale's -0 becomes +0, which the mma's sums from +0 cannot tell) and
    on scales of 7 significant bits up to 56 (normal, subnormal in fp16, zero), the ones
    quantize_int8_rows makes; a scale of more bits or past 56 does not allow it, and "auto" then
    keeps the subtract and multiply; in the kernel both give the same scores."""
    from andromeda_nb.device.intrinsics import (dequant_i8x4_fma_host, dequant_i8x4_host, dequant_offset_h2_host,
                                                half2_of_host)
    from andromeda_nb.model import quantize_int8_rows, round_scale_up
    from andromeda_nb.score.weights import fma_dequant_exact

    q = np.arange(-128, 128, dtype=np.int8)
    scales = round_scale_up(np.concatenate([rng.uniform(0, 56, 200), 10.0 ** rng.uniform(-12, 1, 200), [56.0, 0.0]])
                            .astype(np.float32))
    assert fma_dequant_exact(scales) and (scales <= 56).all()

    def both(scales):
        words = np.tile(q.view(np.uint32), scales.size)
        s2 = np.repeat(half2_of_host(scales), q.size // 4)
        c2 = dequant_offset_h2_host(s2)
        return dequant_i8x4_fma_host(words, s2, c2), dequant_i8x4_host(words, s2)

    def same(a, b):  # equal fp16 values (a zero's sign may differ: q s = -0 where fma gives +0)
        return all(np.array_equal(x.view(np.float16), y.view(np.float16)) for x, y in zip(a, b))

    fused, plain = both(scales)
    assert same(fused, plain)
    for bad in (np.float32(0.0137), np.float32(57.0), np.float32(1 + 3 * 2.0 ** -10)):
        assert not fma_dequant_exact(np.append(scales, bad))
        assert not same(*both(np.array([bad])))  # the check guards a real difference
    t, dt = table_of(rng, 90, 32, "tiles", "int8")
    req = anb.Request.random(32, 6, 2, rng)
    assert dt.fma_dequant() and F16.with_math(DeviceRequest.of(req), dt).dequant == "fma"
    mul = anb.KernelConfig(math="fp16", dequant="mul")
    np.testing.assert_array_equal(anb.score_ads(req, dt, config=F16).copy_to_host(),
                                  anb.score_ads(req, dt, config=mul).copy_to_host())
    hand = anb.AdTable(embeddings=t.embeddings, bias=t.bias, dtype="int8", scale=t.scale * np.float32(1.01),
                       ad_ids=t.ad_ids)
    dh = DeviceAdTable(hand, "rows")
    assert not dh.fma_dequant() and F16.with_math(DeviceRequest.of(req), dh).dequant == "mul"
    with pytest.raises(ValueError, match="dequant='fma'"):
        anb.score_ads(req, dh, config=anb.KernelConfig(math="fp16", dequant="fma"))
    with pytest.raises(ValueError, match="dequant='fma'"):
        anb.score_ads(req, DeviceAdTable(table_of(rng, 9, 32, "rows")[0]), config=anb.KernelConfig(dequant="fma"))
    with pytest.raises(ValueError, match="dequant"):
        anb.KernelConfig(dequant="fast")
    # the device table's flag describes the scales it uploaded, whatever the caller's array holds later
    sc = np.full(t.n_ads, 0.0137, np.float32)
    late = DeviceAdTable(anb.AdTable(embeddings=t.embeddings, bias=t.bias, dtype="int8", scale=sc, ad_ids=t.ad_ids))
    sc[:] = 0.0078125
    assert not late.fma_dequant()
    for bad in (np.ones(5), np.ones((2, 3, 4))):
        with pytest.raises(ValueError, match=r"\[n, d\]"):
            quantize_int8_rows(bad)
    b = t.bias.copy()
    b[3] = np.nan
    with pytest.raises(ValueError, match="biases must be finite"):
        anb.AdTable(embeddings=t.embeddings, bias=b, dtype="int8", scale=t.scale, ad_ids=t.ad_ids)


def test_int8_fp16_math_top_k_and_sparse_accesses(rng):
    """int8 rows in fp16 math on the sparse accesses and the selection paths: the fused top-k equals
    the top-k of the same kernel's scores; candidate lists and bitsets score the listed ads as the
    whole pool does; the default (math="auto") serves them in fp16 math, in the Pool too."""
    t, dt = table_of(rng, 300, 32, "rows", "int8")
    req = anb.Request.random(32, 6, 2, rng)
    scores = anb.score_ads(req, dt, config=F16).copy_to_host()
    mask = rng.random(300) < 0.4
    for path, seeded in (("auto", small_seed_config()), ("block", None)):  # "auto": the filter path here
        for eligible in (None, mask):
            with pytest.MonkeyPatch.context() as mp:
                if path == "auto":
                    filter_path_only(mp)
                got = anb.score_topk(req, dt, 10, eligible=eligible, config=F16, path=path, topk_config=seeded)
            want = reference.topk(scores, 10, ids=t.ad_ids, eligible=eligible)
            assert np.array_equal(got.ids, want.ids) and np.array_equal(got.scores, want.scores)
    cand = np.flatnonzero(mask).astype(np.int32)
    got = anb.score_ads(req, dt, candidates=cand, config=F16).copy_to_host()
    np.testing.assert_array_equal(got, scores[cand])
    auto = anb.KernelConfig().with_math(DeviceRequest.of(req), dt)
    assert auto.math == "fp16"  # within the precision rule on both datasets against fp32 math on int8 rows
    for config in (F16, anb.KernelConfig()):
        got = anb.Pool(t, config=config, max_k=10).retrieve(req, k=10)
        want = reference.topk(scores, 10, ids=t.ad_ids)
        assert np.array_equal(got.ids, want.ids) and np.array_equal(got.scores, want.scores)


def test_int8_zero_row_with_a_scale_past_fp16_scores_as_zero(rng):
    """A hand-built int8 table may pair an all-zero row with a scale fp16 cannot hold: the row is
    zero, so it scores as a zero row does (no NaN), in the kernel and the reference alike."""
    d, n = 32, 40
    q = np.clip(np.rint(rng.standard_normal((n, d)) * 40), -127, 127).astype(np.int8)
    q[3] = 0
    scale = np.full(n, 0.01, np.float32)
    scale[3] = 1e6
    t = anb.AdTable(embeddings=q, bias=rng.standard_normal(n).astype(np.float32), dtype="int8", scale=scale,
                    ad_ids=np.arange(n))
    req = anb.Request.random(d, 4, 2, rng)
    got = anb.score_ads(req, DeviceAdTable(t, "rows"), config=F16).copy_to_host()
    want = reference.score(req, t, math="fp16")
    assert np.isfinite(got).all() and np.isfinite(want[3])
    zero = reference.score(req, anb.AdTable(embeddings=np.zeros((1, d), np.int8), bias=t.bias[3:4], dtype="int8",
                                            scale=np.zeros(1, np.float32), ad_ids=np.arange(1)), math="fp16")
    assert want[3] == zero[0]
    swappable = checks.near_tie_ads(req, t, "fp16")
    assert (np.abs(got - want) <= checks.score_tolerance(req, t, "fp16"))[~swappable].all()


def test_int8_rows_beyond_fp16_are_refused(rng):
    """An int8 table whose dequantized rows (max|q| max scale) would overflow fp16 is refused by
    math="fp16" before anything launches, and scored in fp32 by the default."""
    big = rng.standard_normal((64, 32)) * 1e5
    big[0, 0] = 9e4  # 127 * scale past 65504 once the scale rounds to fp16
    t = anb.AdTable.from_float(big, dtype="int8")
    dt = DeviceAdTable(t, "rows")
    req = anb.Request(V=np.ones((2, 32), np.float32), G=np.ones((2, 32), np.float32) * 1e-3,
                      gamma=np.full(32, 1e-6, np.float32), beta=np.zeros(32, np.float32), k_experts=1)
    with pytest.raises(ValueError, match="int8 table's rows"):
        anb.score_ads(req, dt, config=F16)
    with pytest.raises(ValueError, match="int8 table's rows"):
        anb.Pool(t, config=F16).retrieve(req, k=3)
    assert anb.KernelConfig().with_math(DeviceRequest.of(req), dt).math == "fp32"  # the default falls back
    got = anb.score_ads(req, dt).copy_to_host()
    np.testing.assert_allclose(got, reference.score(req, t), rtol=1e-4, atol=1e-6)
    got = anb.Pool(t, max_k=3).retrieve(req, k=3)
    want = reference.topk(reference.score(req, t), 3, ids=t.ad_ids)
    np.testing.assert_array_equal(got.ids, want.ids)


@pytest.mark.parametrize("path", ["auto", "block"])
def test_fp16_top_k_is_exact_on_its_own_scores(rng, path, monkeypatch):
    t, dt = table_of(rng, 300, 32, "rows")
    req = anb.Request.random(32, 6, 2, rng)
    scores = anb.score_ads(req, dt, config=F16).copy_to_host()
    mask = rng.random(300) < 0.4
    seeded = small_seed_config() if path == "auto" else None  # "auto": the filter path, as at GPU sizes
    if path == "auto":
        filter_path_only(monkeypatch)
    for eligible in (None, mask):
        got = anb.score_topk(req, dt, 10, eligible=eligible, config=F16, path=path, topk_config=seeded)
        want = reference.topk(scores, 10, ids=t.ad_ids, eligible=eligible)
        assert np.array_equal(got.ids, want.ids) and np.array_equal(got.scores, want.scores)


def test_fp16_replayed_calls_take_each_requests_weights(rng):
    """score_topk replays its recorded launches from the second call on: each call's own fp16
    per-lane weights must be pointed at, not the first request's (every access path)."""
    from andromeda_nb.topk.config import TopKConfig, TopKTuning

    seeded = TopKConfig(tuning=TopKTuning(max_sample_chunks=16, sample_chunk=16, seed_min_n=256))  # from 256 items
    t, dt = table_of(rng, 300, 32, "rows")
    mask = rng.random(300) < 0.9
    reqs = [anb.Request.random(32, 4, 2, rng) for _ in range(2)]
    for eligible in (None, mask):
        for req in reqs + reqs[:1]:
            got = anb.score_topk(req, dt, 8, eligible=eligible, config=F16, path="filter", topk_config=seeded)
            scores = anb.score_ads(req, dt, config=F16).copy_to_host()
            want = reference.topk(scores, 8, ids=t.ad_ids, eligible=eligible)
            np.testing.assert_array_equal(got.ids, want.ids)
            np.testing.assert_array_equal(got.scores, want.scores)


def test_requests_the_math_would_overflow_are_refused(rng, monkeypatch):
    from andromeda_nb.score import api

    def boom(*a, **kw):
        raise AssertionError("a launch")

    for name in ("launch_score", "launch_score_topk", "_filter_path"):
        monkeypatch.setattr(api, name, boom)
    t, dt = table_of(rng, 64, 32, "rows")
    req = anb.Request.random(32, 4, 2, rng)
    wide = anb.Request(V=req.V, G=req.G, gamma=req.gamma * 3e4, beta=req.beta, k_experts=2)
    with pytest.raises(ValueError, match="fp16 range"):
        anb.score_ads(wide, dt, config=F16)  # |gamma| max|a| + |beta| past 65504
    big = anb.Request(V=req.V, G=req.G * 1e6, gamma=req.gamma, beta=req.beta, k_experts=2)
    with pytest.raises(ValueError, match="fp16 range"):
        anb.score_topk(big, dt, 5, config=F16)  # gate keys past fp16
    huge = anb.Request(V=req.V, G=np.full_like(req.G, 3e38), gamma=req.gamma, beta=req.beta, k_experts=2)
    with pytest.raises(ValueError, match="fp32"):
        anb.score_topk(huge, dt, 5)  # finite keys, but every logit would overflow fp32
    with pytest.raises(ValueError, match="math"):
        anb.KernelConfig(math="fp8")
    with pytest.raises(ValueError, match="fp16"):
        anb.score_ads(req, DeviceAdTable(anb.AdTable.from_float(np.ones((8, 32)), dtype="fp32"), "rows"), config=F16)


@pytest.mark.parametrize("d, E", [(16, 1), (32, 5), (64, 8), (128, 6), (24, 3)])
def test_batch_images_equal_each_requests_image(rng, d, E):
    """A Pool builds a batch's weight images at once (weights.gated_images, compiled): word for word
    each request's own image (weight_image / mma_f16_image), rows past B untouched; d off the fp16
    kernel's step (24) builds the fp32 images only."""
    from andromeda_nb.score import weights

    reqs = [anb.Request.random(d, E, 1, rng) for _ in range(5)]
    reqs[1] = anb.Request(V=reqs[1].V, G=reqs[1].G * -3, gamma=reqs[1].gamma, beta=reqs[1].beta, k_experts=1)
    img = np.full((6, weights.image_size("gated", d, E)), 7.0, np.float32)
    built = weights.gated_images(*weights.stack_requests(reqs), 1.0, img, True)
    assert not built.bad32.any() and not built.over16.any()
    for b, r in enumerate(reqs):
        np.testing.assert_array_equal(img[b], weights.weight_image("gated", request=r))
        if d % 16 == 0:
            np.testing.assert_array_equal(built.f16[b], weights.mma_f16_image(r))
    assert (img[5] == 7).all()
    assert (built.f16 is None) == (d % 16 != 0)
    assert weights.gated_images(*weights.stack_requests(reqs), 1.0, img, False).f16 is None


def test_f16_bits_round_as_numpy(rng):
    """The compiled float32 -> fp16 rounding of the batch images (weight_kernels.f16_bits) is numpy's
    astype(float16) bit for bit: random bit patterns of every exponent, and the edges (signed
    zeros, the subnormal and overflow boundaries and the ties beside them, inf, NaN payloads)."""
    from numba import njit

    from andromeda_nb.score.weight_kernels import f16_bits

    @njit
    def convert(bits, out):
        for i in range(bits.size):
            out[i] = f16_bits(bits[i])

    edges = np.array([0.0, -0.0, 2.0 ** -25, 2.0 ** -25 * 1.0000001, 2.0 ** -24, 1.5 * 2.0 ** -24, 2.0 ** -14,
                      2.0 ** -14 * (1 - 2.0 ** -11), 65504.0, 65519.99, 65520.0, -65520.0, 1.0 + 2.0 ** -11,
                      1.0 + 3 * 2.0 ** -11, 2049.0, 2051.0, np.inf, -np.inf], np.float32).view(np.uint32)
    nans = np.array([0x7FC00000, 0x7F800001, 0xFF801000, 0x7FFFFFFF], np.uint32)
    bits = np.concatenate([edges, nans, rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32)])
    got = np.empty(bits.size, np.uint16)
    convert(bits, got)
    with np.errstate(over="ignore", invalid="ignore"):
        want = bits.view(np.float32).astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(got, want)


def test_batch_range_check_agrees_with_each_requests(rng):
    """weights.gated_images's range flags over a stacked batch refuse exactly the requests
    check_range (and, for fp16, f16_weights) refuses, in any order, on a table whose largest value
    is not 1."""
    from andromeda_nb.score import weights
    from andromeda_nb.score.launches import check_range
    from andromeda_nb.score.table import DeviceRequest

    t, dt = table_of(rng, 40, 32, "rows")
    base = anb.Request.random(32, 4, 2, rng)

    def like(**kw):
        return anb.Request(**{"V": base.V, "G": base.G, "gamma": base.gamma, "beta": base.beta, "k_experts": 2, **kw})

    variants = [base, like(gamma=base.gamma * 3e4), like(G=np.full_like(base.G, 3e38)), like(V=base.V * 1e36),
                like(beta=base.beta + 7e4), like(V=base.V * 7e4)]
    refused = {}
    for math in ("fp32", "fp16"):
        refused[math] = []
        for r in variants:
            try:
                check_range(DeviceRequest.of(r), dt, math)
                if math == "fp16":
                    weights.f16_weights(r)
                refused[math].append(False)
            except ValueError:
                refused[math].append(True)
    for order in ([0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0], [0, 0, 2], [0]):
        batch = [variants[i] for i in order]
        img = np.empty((len(batch), weights.image_size("gated", 32, 4)), np.float32)
        built = weights.gated_images(*weights.stack_requests(batch), dt.max_abs(), img, True)
        assert list(built.bad32) == [refused["fp32"][i] for i in order], order
        assert list(built.bad32 | built.over16) == [refused["fp16"][i] for i in order], order
    assert refused["fp32"] == [False, False, True, True, False, False]
    assert refused["fp16"] == [False, True, True, True, True, True]


@pytest.mark.parametrize("dtype", ["fp16", "int8"])
def test_checked_math_is_with_math_and_check_range(rng, dtype):
    """The public calls' one compiled pass (launches.checked_math) decides the math and refuses
    exactly as KernelConfig.with_math, f16_weights and check_range do, with their messages, for each
    config's math; where fp16 math serves a request it leaves mma_f16_image's words on it. Requests
    inside and past each range, a shape fp16 math does not take (d = 24) on "auto", and a bare
    DeviceRequest (a device image, no Request) through the numpy check."""
    from andromeda_nb.score import weights
    from andromeda_nb.score.launches import check_range, checked_math
    from andromeda_nb.score.table import DeviceRequest

    def outcome(fn):
        try:
            return fn()
        except ValueError as e:
            return str(e)

    def slow(cfg, dreq, dt):  # as the calls checked before: the math, its fp16 weights, the range
        chosen = cfg.with_math(dreq, dt)
        if chosen.math == "fp16":
            weights.f16_weights(dreq.request)
        check_range(dreq, dt, chosen.math)
        return chosen

    for d in (32, 24):
        t, dt = table_of(rng, 40, d, "rows", dtype)
        base = anb.Request.random(d, 4, 2, rng)

        def like(**kw):
            return anb.Request(**{"V": base.V, "G": base.G, "gamma": base.gamma, "beta": base.beta, "k_experts": 2,
                                  **kw})

        variants = [base, like(gamma=base.gamma * 3e4), like(G=np.full_like(base.G, 3e38)), like(V=base.V * 1e36),
                    like(beta=base.beta + 7e4), like(V=base.V * 7e4), like(G=base.G * -2.5)]
        for cfg in (anb.KernelConfig(), F16, anb.KernelConfig(math="fp32")):
            for r in variants:
                want = outcome(lambda: slow(cfg, DeviceRequest.of(r), dt))
                if cfg.math == "fp16" and d % 16:  # the shape, before any value
                    want = "math='fp16' needs d a multiple of 16 and E <= 8, got d=24, E=4"
                dreq = DeviceRequest.of(r)
                got = outcome(lambda: checked_math(cfg, dreq, dt))
                assert got == want, (cfg.math, d)
                if not isinstance(got, str) and got.math == "fp16":
                    np.testing.assert_array_equal(dreq.host_mma_f16_image(), weights.mma_f16_image(r))
    served = [checked_math(anb.KernelConfig(), DeviceRequest.of(r), dt).math for r in variants[:2]]
    assert served == ["fp32", "fp32"]  # d = 24: no fp16 kernel
    t, dt = table_of(rng, 40, 32, "rows", dtype)
    ok = anb.Request.random(32, 4, 2, rng)
    bad = anb.Request(V=ok.V, G=np.full_like(ok.G, 3e38), gamma=ok.gamma, beta=ok.beta, k_experts=2)
    bare = DeviceRequest("gated", 32, 4, 2, DeviceRequest.of(ok).image)
    fp32 = anb.KernelConfig(math="fp32")  # what "auto" serves a request without its Request
    np.testing.assert_array_equal(anb.score_ads(bare, dt).copy_to_host(),
                                  anb.score_ads(ok, dt, config=fp32).copy_to_host())
    with pytest.raises(ValueError, match="fp32"):
        anb.score_ads(DeviceRequest("gated", 32, 4, 2, DeviceRequest.of(bad).image), dt)


def test_a_request_changed_in_place_or_at_a_bound_is_refused_clearly(rng, monkeypatch):
    """Requests the constructor would refuse but that reach a call anyway: a NaN or inf written into
    a Request's arrays after it was made (every array, every math: refused before any launch, also
    by a Pool's batch pass); a hand-made DeviceRequest whose image is not its Request's (the image
    the kernels read is checked); a request the compiled pass refuses where numpy's sums, in
    another order, land on the other side of the bound (a ValueError naming the limit, never an
    AssertionError). Equal configs with numpy ints are the same Python ints (one cache entry)."""
    from andromeda_nb.score import api, launches
    from andromeda_nb.score.launches import request_images

    def boom(*a, **kw):
        raise AssertionError("a launch")

    t, dt = table_of(rng, 60, 32, "rows")
    for field, idx, value in (("gamma", (0,), np.nan), ("beta", (3,), np.inf), ("G", (1, 2), np.nan),
                              ("V", (0, 3), -np.inf)):
        req = anb.Request.random(32, 4, 2, rng)
        arr = getattr(req, field)
        arr.setflags(write=True)
        arr[idx] = value
        for name in ("launch_score", "launch_score_topk", "_filter_path"):
            monkeypatch.setattr(api, name, boom)
        for cfg in (anb.KernelConfig(), anb.KernelConfig(math="fp32"), F16):
            with pytest.raises(ValueError, match="NaN or inf"):
                anb.score_topk(req, dt, 5, config=cfg)
            with pytest.raises(ValueError, match="NaN or inf"):
                anb.score_ads(req, dt, config=cfg)
            img = np.empty((2, 32 * 2 + 4 * 32 + 4 * 36), np.float32)
            with pytest.raises(launches.RefusedRequest, match="NaN or inf") as e:
                request_images([anb.Request.random(32, 4, 2, rng), req], dt, cfg, img)
            assert e.value.index == 1
        monkeypatch.undo()
    small = anb.Request.random(32, 4, 2, rng)
    huge = anb.Request(V=small.V, G=small.G, gamma=small.gamma * 1e38, beta=small.beta, k_experts=2)
    mixed = DeviceRequest("gated", 32, 4, 2, DeviceRequest.of(huge).host_image, request=small)
    with pytest.raises(ValueError, match="fp32"):
        anb.score_ads(mixed, dt, config=anb.KernelConfig(math="fp32"))
    monkeypatch.setattr(launches, "check_range", lambda *a: None)  # numpy's sums on the other side
    edge = anb.Request(V=small.V, G=np.full_like(small.G, 3e38), gamma=small.gamma, beta=small.beta, k_experts=2)
    with pytest.raises(ValueError, match="limit fp32 math allows"):
        anb.score_topk(edge, dt, 5)
    monkeypatch.undo()
    a, b = anb.KernelConfig(block=np.int16(1024), max_registers=np.int64(96)), anb.KernelConfig(block=1024,
                                                                                                 max_registers=96)
    assert a == b and type(a.block) is int and type(a.max_registers) is int
    with pytest.raises(ValueError, match="shared memory"):
        anb.score_ads(small, dt, config=anb.KernelConfig(block=np.int16(1024), math="fp16"))


def test_a_configuration_generated_once_a_shape_still_refuses_other_shapes_and_values(rng, monkeypatch):
    """A warm call skips the generation check of a configuration that passed for its request shape,
    table and access (launches._RUNNABLE), yet a shape it cannot build is refused on every call,
    and every call's request values are still checked, all before a launch, and the answer is the
    same."""
    from andromeda_nb.score import launches

    cfg = anb.KernelConfig(math="fp16", block=256, ring_stages=2)  # d 32 fits the ring; d 64 does not
    _, d32 = table_of(rng, 301, 32, "tiles", "int8")
    _, d64 = table_of(rng, 301, 64, "tiles", "int8")
    first = anb.Request.random(32, 5, 2, rng)
    anb.score_ads(first, d32, config=cfg)
    generated, real = [], launches._kernel
    monkeypatch.setattr(launches, "_kernel", lambda *a: generated.append(a[3]) or real(*a))
    other = anb.Request.random(32, 5, 2, rng)
    got = anb.score_ads(other, d32, config=cfg).copy_to_host()
    assert generated == [0]  # the launch's own kernel only: the check was not made again
    np.testing.assert_array_equal(got, anb.score_ads(other, d32, config=anb.KernelConfig(math="fp16",
                                                                                        block=256)).copy_to_host())
    wide = anb.Request.random(64, 5, 2, rng)
    for _ in range(2):
        with pytest.raises(ValueError, match="ring_stages=2"):
            anb.score_ads(wide, d64, config=cfg)
    over = anb.Request(V=other.V, G=other.G, gamma=other.gamma * 1e6, beta=other.beta, k_experts=2)
    launched = []
    monkeypatch.setattr(launches, "_launch", lambda *a: launched.append(1))
    for call in (lambda: anb.score_ads(over, d32, config=cfg), lambda: anb.score_topk(over, d32, 5, config=cfg)):
        with pytest.raises(ValueError, match="fp16 range"):
            call()
    assert not launched


@pytest.mark.parametrize("dtype, access, layout", [("fp16", "pool", "tiles"), ("int8", "pool", "tiles"),
                                                   ("int8", "pool", "rows"), ("fp16", "bitset", "tiles"),
                                                   ("fp16", "candidates", "tiles")])
def test_every_bias_load_gives_the_same_scores_over_several_rounds(rng, dtype, access, layout):
    """One block strides over 77 items (three rounds of a warp's 32, the last one part full): a
    bias loaded a round ahead, at its round's start or where the score needs it belongs to the
    round's own ad (random biases, so a bias one round off or from the wrong lane shows). On the
    pool, L2 prefetches 1 or 3 rounds ahead change no score and ask only for lines inside the
    arrays (the simulator's prefetch checks its index); the two tiles' mma steps alternating
    (tile_order="steps") and the weights read step by step from shared memory
    (f16_weights="shared") change no score either."""
    from numba import cuda

    from andromeda_nb.device import launch
    from andromeda_nb.score.fused import fused_kernel
    from andromeda_nb.score.launches import _resolve, _weight_args

    n, d, E, K = 77, 32, 5, 2
    t, dt = table_of(rng, n, d, layout, dtype)
    req = anb.Request.random(d, E, K, rng)
    dreq = DeviceRequest.of(req)
    image, extra = _weight_args(dreq, _resolve(F16, dreq, dt, access))
    want = reference.score(req, t, math="fp16")
    mask = rng.random(n) < 0.6
    cand = np.flatnonzero(rng.random(n) < 0.7).astype(np.int32)[::-1].copy()  # out of slot order
    elig = np.packbits(mask, bitorder="little").view(np.uint8)
    elig = np.pad(elig, (0, -elig.size % 8)).view(np.uint64)
    items = cand.size if access == "candidates" else n
    outs = []
    l2 = [("ahead", 1, "tiles", "registers"), ("ahead", 3, "tiles", "registers"), ("start", 2, "tiles", "shared")]
    for bias_load, l2_ahead, order, weights in [("ahead", 0, "tiles", "registers"), ("start", 0, "tiles", "registers"),
                                                ("end", 0, "tiles", "registers"), ("ahead", 0, "steps", "registers"),
                                                ("end", 0, "steps", "registers"), ("ahead", 0, "tiles", "shared"),
                                                ("end", 0, "steps", "shared")] + (l2 if access == "pool" else []):
        kern = fused_kernel("gated", d, E, K, dtype, layout, access, 32, 0, True, "chosen", None, math="fp16",
                            bias_load=bias_load, l2_ahead=l2_ahead, tile_order=order, f16_weights=weights)
        out = cuda.to_device(np.full(items, np.nan, np.float32))
        kern[1, 32](dt.words, dt.scale, dt.bias, image,
                    cuda.to_device(elig) if access == "bitset" else launch.dummy(np.uint64),
                    cuda.to_device(cand) if access == "candidates" else launch.dummy(np.int32), items, dt.ad_ids, 0,
                    out, launch.dummy(np.float32), launch.dummy(np.int32), launch.dummy(np.int64), *extra)
        outs.append(out.copy_to_host())
    slots = cand if access == "candidates" else np.arange(n)
    scored = mask if access == "bitset" else np.ones(items, bool)
    tol = checks.score_tolerance(req, t, "fp16")[slots]
    swappable = checks.near_tie_ads(req, t, "fp16")[slots]
    for got in outs:
        assert np.isnan(got[~scored]).all()
        assert (np.abs(got - want[slots]) <= tol)[scored & ~swappable].all()
        np.testing.assert_array_equal(got, outs[0])


@pytest.mark.parametrize("E, K", [(6, 1), (6, 2), (8, 3), (8, 4), (5, 5)])
def test_the_one_pass_insertion_picks_what_the_passes_pick(rng, E, K):
    """The emitted selections run as plain Python on logits drawn from a few values (-inf, -1, 0,
    1, inf, NaN: ties, infinities and NaN in every position): choice="insert" fills its K slots
    with exactly the experts that K passes pick, in their order."""
    from andromeda_nb.score.fused import _Source

    def body(choice):
        src = _Source("gated", 16, E, K, "fp16", "tiles", "pool", False, 32, "chosen", 1, False, "shared", "fence",
                      True, 3, True, False, 0, math="fp16", choice=choice)
        if choice == "insert":
            src._insert("    ")
            ret = ", ".join(f"sv{r}" for r in range(K))
        else:
            src._choose_and_combine("    ")
            ret = ", ".join(f"v{r}" for r in range(K))
        args = ", ".join([f"l{e}" for e in range(E)] + [f"a{e}" for e in range(E)] + [f"p{e}" for e in range(E)])
        scope = {}
        exec(f"def f({args}, z, bj, zero):\n" + "\n".join(src.lines) + f"\n    return ({ret},)\n",
             {"rcp_approx": lambda z: 1 / z}, scope)
        return scope["f"]

    insert, passes = body("insert"), body("passes")
    values = np.array([-np.inf, -1.0, 0.0, 1.0, np.inf, np.nan], np.float32)
    for _ in range(3000):
        logits = list(values[rng.integers(0, len(values), E)])
        index = [np.float32(e) for e in range(E)]  # an expert's value dot names it
        got = insert(*logits, *index, *index, np.float32(1), np.float32(0), np.float32(0))
        want = passes(*logits, *index, *index, np.float32(1), np.float32(0), np.float32(0))
        assert got == want, (logits, got, want)


@pytest.mark.parametrize("K", [1, 2, 3, 4])
def test_the_ranked_choice_equals_the_passes_on_exact_ties(rng, K):
    """E = 8 with gate keys repeated (experts 1 = 2 and 4 = 5: their logits tie exactly on every
    ad), the fast softmax and the exact one: choosing the K best by ranks or by the one-pass
    insertion picks the same experts as K passes (the lower index of a tie), so every score agrees
    to fp32 rounding (the insertion's bit for bit); and all agree with the fp16 model where no tie
    other than the exact ones is near."""
    from numba import cuda

    from andromeda_nb.device import launch
    from andromeda_nb.score.fused import fused_kernel
    from andromeda_nb.score.launches import _resolve, _weight_args

    n, d, E = 77, 16, 8
    t, dt = table_of(rng, n, d, "tiles")
    req = anb.Request.random(d, E, K, rng)
    G = req.G.copy()
    G[2], G[5] = G[1], G[4]
    req = anb.Request(V=req.V, G=G, gamma=req.gamma, beta=req.beta, k_experts=K)
    dreq = DeviceRequest.of(req)
    image, extra = _weight_args(dreq, _resolve(F16, dreq, dt, "pool"))
    outs = {}
    for choice in ("passes", "ranks", "insert"):
        for softmax in ("exact", "fast"):
            kern = fused_kernel("gated", d, E, K, "fp16", "tiles", "pool", 32, 0, True, "chosen", None, math="fp16",
                                softmax=softmax, choice=choice)
            out = cuda.to_device(np.full(n, np.nan, np.float32))
            kern[2, 32](dt.words, dt.scale, dt.bias, image, launch.dummy(np.uint64), launch.dummy(np.int32), n,
                        dt.ad_ids, 0, out, launch.dummy(np.float32), launch.dummy(np.int32), launch.dummy(np.int64),
                        *extra)
            outs[choice, softmax] = out.copy_to_host()
    tol = checks.score_tolerance(req, t, "fp16")
    base = outs["passes", "exact"]
    for softmax in ("exact", "fast"):
        np.testing.assert_array_equal(outs["insert", softmax], outs["passes", softmax])
    for got in outs.values():
        assert (np.abs(got - base) <= tol).all()
    want = reference.score(req, t, math="fp16")
    swappable = checks.near_tie_ads(req, t, "fp16")
    assert swappable.mean() < 0.9  # most ads are checked against the model too
    assert (np.abs(base - want) <= tol)[~swappable].all()


def _auto_math(req, dt):
    return anb.KernelConfig().with_math(DeviceRequest.of(req), dt).math


def test_fp16_range_counts_the_rounding_to_fp16(rng):
    """The encoded ads' bound is taken on the values fp16 math holds: an int8 row whose fp32
    max|q| scale (65,438) is within fp16 but whose fp16-rounded scale takes it to 65,472, plus a
    beta of 60, overflows fp16; so does gamma 1.00735 (1.0078 in fp16) on an fp16 row of 65,024.
    The default scores both in fp32 (the right top-k), explicit fp16 refuses them, in score_ads
    and in the Pool alike."""
    n, d = 40, 16
    q = rng.integers(-20, 21, (n, d)).astype(np.int8)
    q[0, 0] = 127
    scale = np.ones(n, np.float32)
    scale[0] = 515.26  # 127 scale = 65,438; 127 round16(scale) = 65,472
    int8 = anb.AdTable(embeddings=q, bias=np.zeros(n, np.float32), dtype="int8", scale=scale, ad_ids=np.arange(n))
    emb = rng.standard_normal((n, d))
    emb[5, 3] = 65024.0
    fp16 = anb.AdTable.from_float(emb, np.zeros(n), dtype="fp16", ad_ids=np.arange(n))
    small = np.full((2, d), 1e-3, np.float32)
    for t, gamma, beta in ((int8, 1.0, 60.0), (fp16, 1.00735, 0.0)):
        dt = DeviceAdTable(t, "rows")
        req = anb.Request(V=small, G=small, gamma=np.full(d, gamma, np.float32), beta=np.full(d, beta, np.float32),
                          k_experts=1)
        assert _auto_math(req, dt) == "fp32"
        ref = reference.score(req, t)  # float64; small integer rows tie often: near ties may swap
        for got in (anb.score_topk(req, dt, 3), anb.Pool(t, max_k=3).retrieve(req, k=3)):
            assert checks.compare_topk_float64(got.ids, ref, 3, t.ad_ids)
        with pytest.raises(ValueError, match="once rounded to fp16"):
            anb.score_ads(req, dt, config=F16)
        with pytest.raises(ValueError, match="once rounded to fp16"):
            anb.Pool(t, config=F16, max_k=3).retrieve(req, k=3)


def test_int8_rows_below_fp16_normal_range_are_scored_in_fp32_by_default(rng):
    """An int8 table whose largest row scale is an fp16 subnormal would lose its rows' precision
    (down to zero) widened to fp16: the default scores it in fp32 math (the fp32 top-k), explicit
    fp16 computes its own model; an all-zero table still takes fp16 math."""
    n, d = 64, 16
    t = anb.AdTable.from_float(rng.standard_normal((n, d)) * 1e-6, np.zeros(n), dtype="int8", ad_ids=np.arange(n))
    dt = DeviceAdTable(t, "rows")
    r = anb.Request.random(d, 4, 2, rng)
    req = anb.Request(V=r.V, G=r.G, gamma=np.full(d, 3e4, np.float32), beta=np.zeros(d, np.float32), k_experts=2)
    assert _auto_math(req, dt) == "fp32"
    want = reference.topk(reference.score(req, t), 5, ids=t.ad_ids)
    for got in (anb.score_topk(req, dt, 5), anb.Pool(t, max_k=5).retrieve(req, k=5)):
        np.testing.assert_array_equal(got.ids, want.ids)
    got16 = anb.score_ads(req, dt, config=F16).copy_to_host()
    np.testing.assert_allclose(got16, reference.score(req, t, math="fp16"), rtol=1e-5, atol=1e-7)
    zero = anb.AdTable(embeddings=np.zeros((n, d), np.int8), bias=np.zeros(n, np.float32), dtype="int8",
                       scale=np.zeros(n, np.float32), ad_ids=np.arange(n))
    assert _auto_math(req, DeviceAdTable(zero, "rows")) == "fp16"


@pytest.mark.parametrize("dtype", ["fp16", "int8"])
@pytest.mark.parametrize("small", ["V", "G", "gamma", "h"])
def test_requests_below_fp16_normal_range_are_scored_in_fp32_by_default(rng, dtype, small):
    """A request whose V, G / sqrt(d) or gamma, or whose encoded ads' bound (gamma and beta both
    tiny), lies below fp16's normal range would lose them to fp16's subnormals (V * 1e-8: every
    fp16 score 0, the ids in slot order): the default scores it in fp32 math (the fp32 top-k),
    through a fresh request, a kept DeviceRequest and the Pool; explicit fp16 computes its own model."""
    n, d = 96, 16
    t = anb.AdTable.from_float(rng.standard_normal((n, d)), rng.standard_normal(n) * 0.1, dtype=dtype,
                               ad_ids=np.arange(n))
    dt = DeviceAdTable(t, "tiles")
    r = anb.Request.random(d, 4, 2, rng)
    scale = float(rng.uniform(1e-9, 1e-8))
    parts = dict(V=r.V, G=r.G, gamma=r.gamma, beta=r.beta)
    if small == "h":
        parts.update(gamma=r.gamma * scale, beta=r.beta * scale)
    else:
        parts[small] = parts[small] * (scale / np.sqrt(d) if small == "G" else scale)
    req = anb.Request(**parts, k_experts=2)
    want = reference.topk(anb.score_ads(req, dt, config=anb.KernelConfig(math="fp32")).copy_to_host(), 5, ids=t.ad_ids)
    assert _auto_math(req, dt) == "fp32" and _auto_math(r, dt) == "fp16"
    kept = DeviceRequest.of(req)
    anb.score_topk(kept, dt, 5)  # the kept request holds its images: the next call takes the numpy checks
    for got in (anb.score_topk(req, dt, 5), anb.score_topk(kept, dt, 5), anb.Pool(t, max_k=5).retrieve(req, k=5),
                anb.Pool(t, max_k=5).retrieve([r, req], k=5)[1]):
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.scores, want.scores)
    got16 = anb.score_ads(req, dt, config=F16).copy_to_host()
    np.testing.assert_allclose(got16, reference.score(req, t, math="fp16"), rtol=1e-5, atol=1e-7)


def test_fp16_weight_precision_rule_at_its_bound(rng):
    """fp16_weights_precise: zero and fp16's smallest normal pass, the next float32 below it fails,
    for each of its four values; the compiled pass of a group (low16) agrees with the per-request
    rule on random magnitudes around the bound."""
    from andromeda_nb.score.weights import FP16_MIN_NORMAL, fp16_request_precise, fp16_weights_precise, gated_images, \
        image_size, stack_requests

    below = float(np.nextafter(np.float32(FP16_MIN_NORMAL), np.float32(0)))
    for i in range(4):
        for x, ok in ((0.0, True), (FP16_MIN_NORMAL, True), (below, False), (1.0, True)):
            v = [1.0] * 4
            v[i] = x
            assert fp16_weights_precise(*v) is ok
    d, E = 16, 3
    reqs = []
    for i in range(16):  # one part scaled, around the bound (the first two far below and at 1)
        r = anb.Request.random(d, E, 2, rng)
        parts = dict(V=r.V, G=r.G, gamma=r.gamma, beta=r.beta)
        name = ("V", "G", "gamma", "beta")[i % 4]
        parts[name] = parts[name] * (1e-7 if i == 0 else 1.0 if i == 1 else 10.0 ** rng.uniform(-6, -3))
        reqs.append(anb.Request(**parts, k_experts=2))
    max_abs = 1.5
    images = np.empty((len(reqs), image_size("gated", d, E)), np.float32)
    built = gated_images(*stack_requests(reqs), max_abs, images, True)
    want = [not fp16_request_precise(r, max_abs) for r in reqs]
    np.testing.assert_array_equal(built.low16, want)
    assert 0 < sum(want) < len(reqs)  # both sides of the bound drawn


def test_int8_scale_past_fp32_is_refused_in_every_math(rng):
    """A finite row scale whose products pass fp32's range (q 100, scale 3e38) makes every score of
    that row NaN: each math refuses the request with a clear error before any launch, the Pool too."""
    n, d = 40, 16
    q = rng.integers(-50, 51, (n, d)).astype(np.int8)
    q[3] = 100
    s = np.full(n, 0.01, np.float32)
    s[3] = 3e38
    t = anb.AdTable(embeddings=q, bias=np.zeros(n, np.float32), dtype="int8", scale=s, ad_ids=np.arange(n))
    dt = DeviceAdTable(t, "rows")
    req = anb.Request.random(d, 4, 2, rng)
    assert dt.max_abs() == pytest.approx(3e40)
    for math in ("auto", "fp32", "fp16"):
        with pytest.raises(ValueError, match="fp32|fp16"):
            anb.score_ads(req, dt, config=anb.KernelConfig(math=math))
        with pytest.raises(ValueError, match="fp32|fp16"):
            anb.Pool(t, config=anb.KernelConfig(math=math), max_k=3).retrieve(req, k=3)


@pytest.mark.parametrize("dtype", ["fp16", "int8"])
def test_the_tile_order_changes_no_answer(rng, dtype):
    """KernelConfig(tile_order="steps") through the public calls: the same scores bit for bit, and
    the same top-k (block and filter paths, pool, candidates and a bitset); a bad value is refused."""
    from dataclasses import replace

    n, d, E, K = 150, 32, 6, 2
    t, dt = table_of(rng, n, d, "tiles", dtype)
    req = anb.Request.random(d, E, K, rng)
    steps = replace(F16, tile_order="steps")
    np.testing.assert_array_equal(anb.score_ads(req, dt, config=steps).copy_to_host(),
                                  anb.score_ads(req, dt, config=F16).copy_to_host())
    cand = np.flatnonzero(rng.random(n) < 0.5).astype(np.int32)
    elig = rng.random(n) < 0.4
    for kw in ({}, {"candidates": cand}, {"eligible": elig}):
        for k in (5, 40):
            a, b = anb.score_topk(req, dt, k, config=steps, **kw), anb.score_topk(req, dt, k, config=F16, **kw)
            np.testing.assert_array_equal(a.ids, b.ids)
            np.testing.assert_array_equal(a.scores, b.scores)
    with pytest.raises(ValueError, match="tile_order"):
        anb.KernelConfig(tile_order="rows")


def test_fp32_math_ignores_the_tile_order(rng):
    """Only fp16 math has tiles to order: an fp32-math config with tile_order="steps" runs the one
    fp32 kernel (no second compile of the same source), and the generator refuses the pairing."""
    from andromeda_nb.score.fused import fused_kernel

    t, dt = table_of(rng, 40, 32, "rows")
    req = anb.Request.random(32, 4, 2, rng)
    fp32 = anb.KernelConfig(math="fp32")
    assert anb.KernelConfig(math="fp32", tile_order="steps").kernel_tile_order() == "tiles"
    assert anb.KernelConfig(math="fp16", tile_order="steps").kernel_tile_order() == "steps"
    anb.score_ads(req, dt, config=fp32)
    before = fused_kernel.cache_info().currsize
    got = anb.score_ads(req, dt, config=anb.KernelConfig(math="fp32", tile_order="steps")).copy_to_host()
    assert fused_kernel.cache_info().currsize == before
    np.testing.assert_array_equal(got, anb.score_ads(req, dt, config=fp32).copy_to_host())
    with pytest.raises(ValueError, match="tile_order"):
        fused_kernel("gated", 32, 4, 2, "fp16", "rows", "pool", 32, tile_order="steps")


@pytest.mark.parametrize("dtype", ["fp16", pytest.param("int8", marks=pytest.mark.slow)])  # a launch experiment: int8 in the slow tier
def test_shared_f16_weights_answer_as_registers(rng, dtype):
    """KernelConfig(f16_weights="shared") (the per-lane weight image in shared memory) gives the
    registers' answers through the public calls: score_topk's filter and block paths over the pool,
    an eligible bitset and candidates, a Pool's batch; "auto" is registers; fp16 math only in the
    generator, and the config refuses unknown values."""
    from andromeda_nb.score.fused import fused_kernel
    from andromeda_nb.topk.config import TopKConfig, TopKTuning

    seeded = TopKConfig(tuning=TopKTuning(max_sample_chunks=16, sample_chunk=16, seed_min_n=256))
    t, dt = table_of(rng, 300, 32, "tiles", dtype)
    req = anb.Request.random(32, 5, 2, rng)
    shared = anb.KernelConfig(math="fp16", f16_weights="shared")
    assert F16.kernel_f16_weights() == "registers" and shared.kernel_f16_weights() == "shared"
    mask = rng.random(300) < 0.7
    cand = rng.choice(300, 120, replace=False).astype(np.int32)
    np.testing.assert_array_equal(anb.score_ads(req, dt, config=shared).copy_to_host(),
                                  anb.score_ads(req, dt, config=F16).copy_to_host())
    for path in ("filter", "block"):
        for kw in ({}, {"eligible": mask}, {"candidates": cand}):
            got = anb.score_topk(req, dt, 9, config=shared, path=path, topk_config=seeded, **kw)
            want = anb.score_topk(req, dt, 9, config=F16, path=path, topk_config=seeded, **kw)
            np.testing.assert_array_equal(got.ids, want.ids)
            np.testing.assert_array_equal(got.scores, want.scores)
    with pytest.raises(ValueError, match="f16_weights"):
        anb.KernelConfig(f16_weights="constant")
    with pytest.raises(ValueError, match="f16_weights"):
        fused_kernel("gated", 32, 5, 2, dtype, "tiles", "pool", 32, f16_weights="shared")  # fp32 math


def same_filter_answers(rng, req, dt, config, plain, topk_config):
    """The filter path's top-9 under ``config`` equals ``plain``'s (ids and scores) over the whole
    table, a random eligible set and a random candidate list."""
    n = dt.n_ads
    for kw in ({}, {"eligible": rng.random(n) < 0.7},
               {"candidates": rng.choice(n, n // 2, replace=False).astype(np.int32)}):
        got = anb.score_topk(req, dt, 9, config=config, path="filter", topk_config=topk_config, **kw)
        ref = anb.score_topk(req, dt, 9, config=plain, path="filter", topk_config=topk_config, **kw)
        np.testing.assert_array_equal(got.ids, ref.ids)
        np.testing.assert_array_equal(got.scores, ref.scores)


def _spy_kernels(monkeypatch):
    """(seed_filter, keyword arguments) of every fused_kernel build from now on (the launches
    import it when they run): a test then sees a setting reach the generator at each launch site
    (scores to memory and the block top-K: seed_filter False; the filter pass: True), not only
    equal answers."""
    from andromeda_nb.score import fused

    built, real = [], fused.fused_kernel

    def spy(*args, **kw):
        built.append((args[14], kw))  # fused_kernel's 15th parameter: seed_filter
        return real(*args, **kw)

    monkeypatch.setattr(fused, "fused_kernel", spy)
    return built


@pytest.mark.parametrize("dtype", ["fp16", pytest.param("int8", marks=pytest.mark.slow)])  # a launch experiment: int8 in the slow tier
def test_two_rounds_of_rows_ahead_answer_as_one(rng, dtype, monkeypatch):
    """KernelConfig(rows_ahead=2) (a second set of row registers: the round after next loaded while
    this one computes) gives one round's answers: scores to memory over the pool, score_topk's
    filter path over the pool, a bitset and candidates, with weights in registers or shared
    memory. 301 ads in blocks of 32 on the simulator's 4 blocks: each warp runs three rounds, the
    last one partly past the end, so both register sets are read, traded and refilled. "auto" is
    one round; two apply to fp16 math only, and bad values are refused."""
    from andromeda_nb.score.fused import fused_kernel
    from andromeda_nb.topk.config import TopKConfig, TopKTuning

    seeded = TopKConfig(tuning=TopKTuning(max_sample_chunks=16, sample_chunk=16, seed_min_n=256))
    t, dt = table_of(rng, 301, 32, "tiles", dtype)
    req = anb.Request.random(32, 5, 2, rng)
    one = anb.KernelConfig(math="fp16", block=32)
    assert one.kernel_rows_ahead() == 1 and anb.KernelConfig(math="fp32", rows_ahead=2).kernel_rows_ahead() == 1
    mask = rng.random(301) < 0.7
    cand = rng.choice(301, 150, replace=False).astype(np.int32)
    want = anb.score_ads(req, dt, config=one).copy_to_host()
    near = checks.near_tie_ads(req, t, "fp16")  # the fp16 model's answers, as test_fp16_math checks them
    assert not (~near & (np.abs(want - reference.score(req, t, math="fp16")) > checks.score_tolerance(req, t, "fp16"))).any()
    built = _spy_kernels(monkeypatch)
    for weights in ("registers", "shared"):
        two = anb.KernelConfig(math="fp16", block=32, rows_ahead=np.int64(2), f16_weights=weights)
        assert two.kernel_rows_ahead() == 2
        np.testing.assert_array_equal(anb.score_ads(req, dt, config=two).copy_to_host(), want)
        for kw in ({}, {"eligible": mask}, {"candidates": cand}):
            got = anb.score_topk(req, dt, 9, config=two, path="filter", topk_config=seeded, **kw)
            ref = anb.score_topk(req, dt, 9, config=one, path="filter", topk_config=seeded, **kw)
            np.testing.assert_array_equal(got.ids, ref.ids)
            np.testing.assert_array_equal(got.scores, ref.scores)
    # both launch sites (scores to memory, the filter pass) built two-round kernels
    assert {sf for sf, kw in built if kw.get("rows_ahead") == 2} == {False, True}
    for bad in (0, 3, True, np.True_, 2.0, "2"):
        with pytest.raises(ValueError, match="rows_ahead"):
            anb.KernelConfig(rows_ahead=bad)
    with pytest.raises(ValueError, match="rows_ahead"):
        fused_kernel("gated", 32, 5, 2, dtype, "tiles", "pool", 32, rows_ahead=2)  # fp32 math


# the ring is a launch experiment (off by default): one depth in the default tier, the others slow
@pytest.mark.parametrize("stages", [pytest.param(2, marks=pytest.mark.slow), 3, pytest.param(4, marks=pytest.mark.slow)])
def test_int8_rows_through_the_ring_answer_as_registers(rng, stages, monkeypatch):
    """KernelConfig(ring_stages=N): int8 rows in fp16 math reach the registers through a shared
    ring of N rounds a warp, filled by asynchronous copies (the simulator copies at once). The
    same scores and filter-path top-K as the register loads over the pool, on rounds past the end
    (301 ads, blocks of 32, each warp three rounds, zeros copied for ads past the end); other
    access paths and fp16 tables ignore it; a ring too large for static shared memory is refused
    before any launch; bad values are refused."""
    from andromeda_nb.score.fused import fused_kernel
    from andromeda_nb.topk.config import TopKConfig, TopKTuning

    seeded = TopKConfig(tuning=TopKTuning(max_sample_chunks=16, sample_chunk=16, seed_min_n=256))
    t, dt = table_of(rng, 301, 32, "tiles", "int8")
    req = anb.Request.random(32, 5, 2, rng)
    plain = anb.KernelConfig(math="fp16", block=32)
    ring = anb.KernelConfig(math="fp16", block=32, ring_stages=stages)
    assert ring.kernel_ring_stages("int8") == stages and ring.kernel_ring_stages("fp16") == 0
    assert plain.kernel_ring_stages() == 0 and anb.KernelConfig(ring_stages=stages).kernel_ring_stages() == 0  # fp32
    want = anb.score_ads(req, dt, config=plain).copy_to_host()
    built = _spy_kernels(monkeypatch)
    np.testing.assert_array_equal(anb.score_ads(req, dt, config=ring).copy_to_host(), want)
    assert built and all(kw.get("ring_stages") == stages for _, kw in built)  # the setting reached the generator
    same_filter_answers(rng, req, dt, ring, plain, seeded)
    _, d16 = table_of(rng, 301, 32, "tiles", "fp16")
    np.testing.assert_array_equal(anb.score_ads(req, d16, config=ring).copy_to_host(),
                                  anb.score_ads(req, d16, config=plain).copy_to_host())
    # two warps a block (each its own slots), and the rows layout
    for layout, block in (("rows", 32), ("tiles", 64)):
        _, other = table_of(rng, 301, 32, layout, "int8")
        np.testing.assert_array_equal(
            anb.score_ads(req, other, config=anb.KernelConfig(math="fp16", block=block, ring_stages=stages)).copy_to_host(),
            anb.score_ads(req, other, config=anb.KernelConfig(math="fp16", block=block)).copy_to_host())
    wide = anb.Request.random(64, 6, 2, rng)
    _, d64 = table_of(rng, 301, 64, "tiles", "int8")
    with pytest.raises(ValueError, match=r"bytes of the int8 rows' ring, ring_stages=4 .*or ring_stages"):
        anb.score_ads(wide, d64, config=anb.KernelConfig(math="fp16", block=256, ring_stages=4))  # 8 x 4 x 2,176 B
    # the block top-K with several ads a thread a round has no ring, and is not charged for one
    items = anb.KernelConfig(math="fp16", block=128, ring_stages=4, items=4)
    got = anb.score_topk(wide, d64, 9, config=items, path="block")
    want_k = anb.score_topk(wide, d64, 9, config=anb.KernelConfig(math="fp16", block=128, items=4), path="block")
    np.testing.assert_array_equal(got.ids, want_k.ids)
    with pytest.raises(ValueError, match="set one"):
        anb.KernelConfig(rows_ahead=2, ring_stages=stages)
    assert {sf for sf, kw in built if kw.get("ring_stages") == stages} == {False, True}
    for bad in (1, 5, True, np.True_, 3.0, "3"):
        with pytest.raises(ValueError, match="ring_stages"):
            anb.KernelConfig(ring_stages=bad)
    with pytest.raises(ValueError, match="ring_stages"):
        fused_kernel("gated", 32, 5, 2, "int8", "tiles", "pool", 32, ring_stages=3)  # fp32 math


def test_the_ring_waits_for_its_own_round_before_reading_it():
    """What the simulator cannot check (its copies land at once): in the generated loop a round
    commits its copies, waits until at most ring - 1 groups are pending (its own landed), passes a
    warp barrier, then reads the ring; a round's copies (its 8 words and its scale an ad) go out
    together; the kernel ends waiting for every group. Likewise with the loop split in two (the
    unchecked rounds' copies, then the checked ones')."""
    from andromeda_nb.score.fused import _source

    for stages in (2, 3, 4):
        for split in (False, True):
            src = _source("gated", 64, 6, 2, "int8", "tiles", "pool", False, 128, math="fp16", dequant="fma",
                          ring_stages=stages, split_loop=split)
            loops = src.split("    while b0 <= last_whole:") if split else [src[src.index("    for base0 in"):]]
            assert len(loops) == 1 + split
            for loop in loops[split:]:
                order = [loop.index(x) for x in ("cp_async_row(ring", "cp_async_commit()", f"cp_async_wait({stages - 1})",
                                                  "cuda.sync", "= ring[")]
                assert order == sorted(order), order
            assert src.count("cp_async_commit()") == stages + split  # ring - 1 before the loop(s), one a round
            assert src.rstrip().endswith("cp_async_wait(0)")
            assert src.count("cp_async_row(ring, ") == stages - 1 + 1 + split


def test_launch_counts_take_numpy_integers_and_refuse_the_rest():
    """items, sync_every and blocks_per_sm take a numpy integer as the int it holds (the same
    configuration, the same cache key), as block and ring_stages do; 0, bools, floats and strings
    are refused, naming the field."""
    for name in ("items", "sync_every", "blocks_per_sm"):
        got = anb.KernelConfig(**{name: np.int64(2)})
        assert got == anb.KernelConfig(**{name: 2}) and type(getattr(got, name)) is int
        for bad in (0, -1, True, np.True_, 2.0, "2"):
            with pytest.raises(ValueError, match=f"{name} must be a positive int"):
                anb.KernelConfig(**{name: bad})
