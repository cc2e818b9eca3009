"""The oracle itself, on hand-computed cases (it defines correct for every kernel)."""

import math

import numpy as np
import pytest

from andromeda_nb import reference
from andromeda_nb.model import AdTable, Request
from andromeda_nb.targeting import Category, TargetingRules, TargetingSchema, make_profile


def test_score_by_hand():
    # d = 2, E = 2, K = 1
    req = Request(V=[[1.0, 2.0], [3.0, -1.0]], G=[[1.0, 0.0], [0.0, 2.0]],
                  gamma=[1.0, -1.0], beta=[0.5, 0.0], k_experts=1)
    a = np.array([[1.0, -2.0]])
    h = np.array([1.5, 2.0])  # max(1*1+0.5, 0), max(-1*-2+0, 0)
    logits = np.array([1.5, 4.0]) / math.sqrt(2)
    p = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    want = p[1] * (3.0 * 1.5 - 1.0 * 2.0) + 0.25  # expert 1 wins; p not renormalised
    got = reference.score(req, a, bias=[0.25])
    assert got[0] == pytest.approx(want, rel=1e-12)
    np.testing.assert_array_equal(reference.gate(req, a).chosen, [[False, True]])


def test_relu_context_encoding():
    req = Request(V=[[1.0, 1.0]], G=[[0.0, 0.0]], gamma=[1.0, 1.0], beta=[-5.0, 0.0], k_experts=1)
    # first dim is clipped to 0 by the ReLU, second passes: h = [0, 3]
    assert reference.score(req, np.array([[2.0, 3.0]]))[0] == pytest.approx(3.0)


def test_k_equals_e_is_the_dense_mixture(rng):
    req = Request.random(16, 5, 5, rng)
    a = rng.standard_normal((50, 16))
    g = reference.gate(req, a)
    np.testing.assert_allclose(reference.score(req, a), (g.p * g.values).sum(axis=1), rtol=1e-12)


def test_expert_tie_goes_to_lower_index():
    G = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    req = Request(V=np.eye(3, 2), G=G, gamma=[1.0, 1.0], beta=[0.0, 0.0], k_experts=1)
    chosen = reference.gate(req, np.array([[2.0, 1.0]])).chosen
    np.testing.assert_array_equal(chosen, [[True, False, False]])


def test_nan_row_gives_nan_score():
    req = Request(V=[[1.0, 1.0]], G=[[1.0, 1.0]], gamma=[1.0, 1.0], beta=[0.0, 0.0], k_experts=1)
    s = reference.score(req, np.array([[np.nan, 1.0], [1.0, 1.0]]))
    assert math.isnan(s[0]) and s[1] == pytest.approx(2.0)


def test_topk_order_ties_nan_padding():
    scores = np.array([1.0, np.nan, 3.0, 3.0, -np.inf, 2.0], dtype=np.float32)
    ids = np.array([50, 10, 40, 30, 20, 60])
    t = reference.topk(scores, 8, ids=ids)
    np.testing.assert_array_equal(t.ids, [30, 40, 60, 50, 20, -1, -1, -1])
    np.testing.assert_array_equal(t.scores, np.array([3, 3, 2, 1, -np.inf, -np.inf, -np.inf, -np.inf], np.float32))
    assert t.count == 5 and t.scores.dtype == np.float32


def test_topk_eligible_and_errors():
    t = reference.topk(np.arange(5.0), 2, eligible=[True, False, True, False, False])
    np.testing.assert_array_equal(t.ids, [2, 0])
    assert t.count == 2
    with pytest.raises(ValueError):
        reference.topk(np.arange(3.0), 0)
    assert reference.topk(np.zeros(0), 3).count == 0


def test_match_by_hand():
    schema = TargetingSchema([Category("age", 3), Category("interest", 5, multi_valued=True)])
    rules = TargetingRules.from_records(schema, [
        {"ad_id": 1},                                                     # unconstrained
        {"ad_id": 2, "include": {"age": [1]}},                            # age 1 only
        {"ad_id": 3, "include": {"interest": [2, 3]}, "exclude": {"age": [0]}},
        {"ad_id": 4, "exclude": {"interest": [4]}},
        {"ad_id": 5, "live": False},
    ])
    def m(p):
        return reference.match(rules, make_profile(schema, p)).tolist()
    assert m({"age": 1, "interest": [3, 4]}) == [True, True, True, False, False]
    assert m({"age": 0, "interest": [2]}) == [True, False, False, True, False]
    assert m({}) == [True, False, False, True, False]  # no values: includes fail, excludes pass


def test_int8_table_roundtrip_never_128_and_zero_row(rng):
    x = rng.standard_normal((40, 16)).astype(np.float32) * 10
    x[3] = 0.0
    x[5, 0] = -1e6  # an extreme row
    t = AdTable.from_float(x, dtype="int8")
    assert t.embeddings.min() >= -127
    assert t.scale[3] == 0 and not t.dequantized()[3].any()
    # each row to within half its own step (its scale: the row's largest magnitude / 127 rounded up
    # to 7 significant bits, so that magnitude lands on 125-127), the extreme row's step no
    # looser for the others
    err = np.abs(t.dequantized() - x)
    assert (err <= t.scale[:, None] / 2 * (1 + 1e-3) + 1e-30).all()
    top = np.abs(t.embeddings.astype(np.int16)).max(axis=1)[np.abs(x).max(axis=1) > 0]
    assert ((top >= 125) & (top <= 127)).all()
