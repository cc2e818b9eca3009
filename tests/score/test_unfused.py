"""The unfused baselines give the fused pipeline's answer (they exist to be timed against it)."""

import numpy as np
import pytest

from andromeda_nb import checks, reference
from andromeda_nb.model import AdTable, Request
from andromeda_nb.score.api import DeviceAdTable, DeviceRequest, score_topk
from andromeda_nb.targeting import bits_from_mask
from andromeda_nb.score.unfused import (PerOpBuffers, PreFusionBuffers, launch_per_op, launch_pre_fusion,
                                  per_op_bytes_per_ad, pre_fusion_bytes_per_ad)

from ..helpers import check_topk_against_float64


@pytest.mark.parametrize("dtype,layout", [("fp16", "tiles"), ("int8", "rows"), ("bf16", "rows"), ("fp32", "tiles")])
def test_per_op_pipeline_matches_oracle(rng, dtype, layout):
    n, d, E, K, k = 83, 32, 4, 2, 12
    req = Request.random(d, E, K, rng)
    table = AdTable.from_float(rng.standard_normal((n, d)), rng.standard_normal(n), dtype=dtype,
                               ad_ids=rng.permutation(1000)[:n])
    dt = DeviceAdTable(table, layout)
    ws = launch_per_op(DeviceRequest.of(req), dt, k, PerOpBuffers(n, d, E, K))
    assert int(ws.counts.copy_to_host()[0, 0]) == n
    check_topk_against_float64(ws.out_id[0].copy_to_host(), ws.out_s[0].copy_to_host(), reference.score(req, table),
                               table.ad_ids, k, swappable=checks.near_tie_ads(req, table))


@pytest.mark.parametrize("mode", ["bitset", "candidates"])
def test_pre_fusion_pipeline_equals_fused(rng, mode):
    n, d, k = 130, 32, 10
    req = Request.random(d, 3, 2, rng)
    table = AdTable.from_float(rng.standard_normal((n, d)), rng.standard_normal(n), dtype="fp16",
                               ad_ids=rng.permutation(1000)[:n])
    dt = DeviceAdTable(table, "tiles")
    mask = rng.random(n) < 0.4
    m = int(mask.sum())
    bufs = PreFusionBuffers(m, d, "fp16")
    if mode == "bitset":
        from andromeda_nb.device import launch
        out = launch_pre_fusion(DeviceRequest.of(req), dt, k, bufs, m, elig=launch.to_device(bits_from_mask(mask)))
    else:
        from andromeda_nb.device import launch
        out = launch_pre_fusion(DeviceRequest.of(req), dt, k, bufs, m,
                                cand=launch.to_device(np.flatnonzero(mask).astype(np.int32)))
    fused = score_topk(req, dt, k, eligible=mask)
    np.testing.assert_array_equal(out.out_id[0].copy_to_host(), fused.ids)
    np.testing.assert_array_equal(out.out_s[0].copy_to_host(), fused.scores)


def test_byte_budgets():
    per_op = per_op_bytes_per_ad(64, 6, 2, "fp16")
    assert sum(per_op.values()) == 992  # vs 132 fused: the ratio the per-op baseline should show
    # off the pool: two slot reads and the ids' gather; a bitset adds its share and the list write
    assert sum(per_op_bytes_per_ad(64, 6, 2, "fp16", "candidates").values()) == 992 + 4 + 4 + 20
    assert per_op_bytes_per_ad(64, 6, 2, "fp16", "bitset", 0.1)["list"] == pytest.approx(1 / 0.8 + 4)
    pre = pre_fusion_bytes_per_ad(64, "fp16", "pool")
    assert sum(pre.values()) == 2 * 132 + 16 + 136 + 4  # gather, ids, model, top-K
    assert sum(pre_fusion_bytes_per_ad(64, "fp16", "candidates").values()) == 2 * 132 + 4 + 16 + 4 + 136 + 4
    for bad in (dict(access="bitsets"), dict(dtype="fp8"), dict(access="bitset", eligible_fraction=0.0),
                dict(eligible_fraction=1.5)):
        args = dict(d=64, E=6, K=2, dtype="fp16", access="pool", eligible_fraction=1.0) | bad
        with pytest.raises(ValueError):
            per_op_bytes_per_ad(**args)
        with pytest.raises(ValueError):
            pre_fusion_bytes_per_ad(args["d"], args["dtype"], args["access"], args["eligible_fraction"])


@pytest.mark.parametrize("access", ["bitset", "candidates"])
def test_per_op_pipeline_off_the_pool_equals_its_pool_run(rng, access):
    """The per-op pipeline over a bitset or a candidate list scores each listed ad as the pool run
    does (same kernels, gathered rows and biases) and answers the oracle's top-K of those scores;
    no candidates at all gives pads."""
    from andromeda_nb.device import launch

    n, d, E, K, k = 97, 32, 4, 2, 9
    req = Request.random(d, E, K, rng)
    table = AdTable.from_float(rng.standard_normal((n, d)), rng.standard_normal(n), dtype="fp16",
                               ad_ids=rng.permutation(1000)[:n])
    dt, dreq = DeviceAdTable(table, "tiles"), DeviceRequest.of(req)
    bufs = PerOpBuffers(n, d, E, K)
    launch_per_op(dreq, dt, k, bufs)
    pool = bufs.score.copy_to_host()
    for fraction in (0.3, 0.0):
        mask = rng.random(n) < fraction
        m = int(mask.sum())
        if access == "bitset":
            ws = launch_per_op(dreq, dt, k, bufs, elig=launch.to_device(bits_from_mask(mask)), m=m)
        else:
            ws = launch_per_op(dreq, dt, k, bufs, cand=launch.to_device(rng.permutation(np.flatnonzero(mask)).astype(np.int32)))
        want = reference.topk(pool, k, ids=table.ad_ids, eligible=mask)
        np.testing.assert_array_equal(ws.out_id[0].copy_to_host(), want.ids)
        np.testing.assert_array_equal(ws.out_s[0].copy_to_host(), want.scores)
        assert int(ws.counts.copy_to_host()[0, 0]) == want.count == m
    with pytest.raises(ValueError, match="not both"):
        launch_per_op(dreq, dt, k, bufs, elig=launch.to_device(bits_from_mask(mask)), cand=launch.to_device(np.zeros(1, np.int32)))
    with pytest.raises(ValueError, match="needs m"):
        launch_per_op(dreq, dt, k, bufs, elig=launch.to_device(bits_from_mask(mask)))
    cand = launch.to_device(np.arange(5, dtype=np.int32))
    for kw, match in ((dict(cand=cand, m=4), "holds 5"), (dict(cand=cand, m=-1), "non-negative"),
                      (dict(m=3), "neither"), (dict(cand=launch.to_device(np.arange(5.0))), "int32"),
                      (dict(elig=launch.to_device(np.zeros(1, np.uint64)), m=0), "shape"),
                      (dict(cand=launch.to_device(np.arange(n + 1, dtype=np.int32))), "buffers hold")):
        with pytest.raises((TypeError, ValueError), match=match):
            launch_per_op(dreq, dt, k, bufs, **kw)
    with pytest.raises(ValueError, match="k=0"):
        launch_per_op(dreq, dt, 0, bufs)
    with pytest.raises(ValueError, match="d, E, K"):
        launch_per_op(dreq, dt, k, PerOpBuffers(n, d, E + 1, K))


def test_network_bytes_count_ids_rows_and_the_final_answer():
    from andromeda_nb.score.unfused import network_bytes_per_request

    got = network_bytes_per_request(10**6, 1000, 64, "fp16")
    assert got == {"candidate ids": 8e6, "candidate ids + rows": (8 + 128 + 4) * 1e6,
                   "final top-K (fused)": 12 * 1000 + 8}
    assert network_bytes_per_request(10, 1000, 32, "int8")["candidate ids + rows"] == 10 * (8 + 32 + 4 + 4)
    assert network_bytes_per_request(0, 5)["final top-K (fused)"] == 8  # nothing eligible: the count alone
    for bad in (dict(n_candidates=-1, k=5), dict(n_candidates=5, k=0), dict(n_candidates=5, k=5, dtype="fp8")):
        with pytest.raises(ValueError):
            network_bytes_per_request(**bad)
