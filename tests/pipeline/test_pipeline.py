"""retrieve(): targeting -> fused scoring -> top-K, against the oracle pipeline."""

import numpy as np
import pytest

from andromeda_nb import checks, reference
from andromeda_nb.match.api import DeviceTargetingIndex
from andromeda_nb.model import AdTable, Request
from andromeda_nb.pipeline.retrieve import retrieve
from andromeda_nb.score import DeviceRequest, KernelConfig
from andromeda_nb.score.api import DeviceAdTable, score_ads
from andromeda_nb.targeting import TargetingIndex, make_profile

from ..helpers import check_topk_against_float64, random_profile, random_rules


def world(rng, n=157, d=32, dtype="fp16"):
    rules = random_rules(rng, n)
    table = AdTable.from_float(rng.standard_normal((n, d)), rng.standard_normal(n), dtype=dtype,
                               ad_ids=rules.ad_ids)
    return rules, table, DeviceAdTable(table), DeviceTargetingIndex(TargetingIndex(rules))


def test_batch_equals_oracle(rng):
    rules, table, dt, di = world(rng)
    reqs = [Request.random(32, 4, 2, rng) for _ in range(3)]
    profs = [random_profile(rng, rules.schema) for _ in range(3)]
    k = 20
    outs = retrieve(reqs, dt, di, profs, k)
    assert len(outs) == 3
    for req, prof, out in zip(reqs, profs, outs):
        elig = reference.match(rules, make_profile(rules.schema, prof))
        kernel_scores = score_ads(req, dt).copy_to_host()
        want = reference.topk(kernel_scores, k, ids=table.ad_ids, eligible=elig)
        np.testing.assert_array_equal(out.ids, want.ids)  # exact on the kernel's own fp32 scores
        np.testing.assert_array_equal(out.scores, want.scores)
        assert out.n_eligible == elig.sum() and out.n_scored == elig.sum()
        math = KernelConfig().with_math(DeviceRequest.of(req), dt).math  # the default: fp16 on fp16 tables
        assert math == "fp16"
        check_topk_against_float64(out.ids, out.scores, reference.score(req, table, math=math), table.ad_ids, k, elig,
                                   checks.near_tie_ads(req, table, math))


def test_single_request_exclusions_and_no_index(rng):
    rules, table, dt, di = world(rng, n=90)
    req = Request.random(32, 2, 1, rng)
    prof = random_profile(rng, rules.schema)
    elig = reference.match(rules, make_profile(rules.schema, prof))
    seen = np.flatnonzero(elig)[:3]
    out = retrieve(req, dt, di, prof, 5, exclude_slots=seen)
    elig[seen] = False
    want = reference.topk(score_ads(req, dt).copy_to_host(), 5, ids=table.ad_ids, eligible=elig)
    np.testing.assert_array_equal(out.ids, want.ids)
    assert out.n_eligible == elig.sum()
    whole = retrieve(req, dt, None, None, 5, exclude_slots=[0, 1])
    mask = np.ones(90, bool)
    mask[[0, 1]] = False
    want = reference.topk(score_ads(req, dt).copy_to_host(), 5, ids=table.ad_ids, eligible=mask)
    np.testing.assert_array_equal(whole.ids, want.ids)
    assert whole.n_eligible == 88


def test_mismatches_are_refused_before_launch(rng):
    rules, table, dt, di = world(rng, n=40)
    req = Request.random(32, 2, 1, rng)
    other = AdTable.from_float(np.zeros((41, 32)), dtype="fp32")
    with pytest.raises(ValueError, match="41"):
        retrieve(req, DeviceAdTable(other), di, {}, 3)
    with pytest.raises(ValueError, match="2 requests but 1 profiles"):
        retrieve([req, req], dt, di, [{}], 3)
    with pytest.raises(ValueError, match="ad id"):
        shuffled = AdTable.from_float(np.zeros((40, 32)), dtype="fp32", ad_ids=table.ad_ids[::-1])
        retrieve(req, DeviceAdTable(shuffled), di, {}, 3)
    with pytest.raises(ValueError, match="d=64"):
        retrieve(Request.random(64, 2, 1, rng), dt, di, {}, 3)


@pytest.mark.slow  # ~15 s in the simulator
def test_k_above_the_block_topk_limit(rng):
    """k = 2100 > BLOCK_TOPK_MAX_K: retrieval still answers exactly (fewer eligible than k: pads)."""
    rules, table, dt, di = world(rng, n=2300)
    req = Request.random(32, 4, 2, rng)
    prof = random_profile(rng, rules.schema)
    out = retrieve(req, dt, di, prof, 2100)
    elig = reference.match(rules, make_profile(rules.schema, prof))
    want = reference.topk(score_ads(req, dt).copy_to_host(), 2100, ids=table.ad_ids, eligible=elig)
    np.testing.assert_array_equal(out.ids, want.ids)
    np.testing.assert_array_equal(out.scores, want.scores)
    assert out.n_scored == elig.sum()
