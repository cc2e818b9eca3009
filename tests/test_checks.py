"""The oracle comparisons themselves fail when they should (a check that cannot fail is a defect)."""

import numpy as np

from andromeda_nb import checks, reference
from andromeda_nb.model import AdTable, Request


def test_compare_scores_catches_errors(rng):
    req = Request.random(16, 4, 2, rng)
    table = AdTable.from_float(rng.standard_normal((60, 16)), rng.standard_normal(60))
    ref = reference.score(req, table).astype(np.float32)
    assert checks.compare_scores(ref, req, table).ok
    off = ref.copy()
    off[7] += 1e-3 * np.abs(ref).max()
    assert not checks.compare_scores(off, req, table).ok
    nan = ref.copy()
    nan[3] = np.nan
    assert "NaN" in checks.compare_scores(nan, req, table).message
    assert not checks.compare_scores(ref[:-1], req, table).ok


def test_compare_scores_accepts_the_other_expert_only_at_near_ties():
    # two experts with identical gate keys: logits tie exactly, either expert is acceptable
    V = np.array([[1.0, 0.0], [0.0, 1.0]])
    req = Request(V=V, G=np.ones((2, 2)), gamma=[1.0, 1.0], beta=[0.0, 0.0], k_experts=1)
    table = AdTable.from_float(np.array([[2.0, 5.0]]))
    g = reference.gate(req, table)
    other = np.array([g.p[0, 1] * g.values[0, 1]])  # the expert the oracle did not choose
    assert checks.compare_scores(other, req, table).ok
    far = AdTable.from_float(np.array([[2.0, 5.0]]))
    req_far = Request(V=V, G=np.array([[1.0, 0.0], [0.0, 1.0]]), gamma=[1.0, 1.0], beta=[0.0, 0.0], k_experts=1)
    g = reference.gate(req_far, far)
    wrong = np.array([g.p[0, 0] * g.values[0, 0]])  # expert 0, but expert 1's logit is clearly larger
    assert not checks.compare_scores(wrong, req_far, far).ok


def test_compare_topk_exact_and_float64():
    scores = np.array([3.0, 1.0, 2.0, 2.0], np.float32)
    ids = np.array([10, 11, 12, 13])
    t = reference.topk(scores, 3, ids=ids)
    assert checks.compare_topk_exact(t.ids, t.scores, t.count, scores, 3, ids).ok
    swapped = t.ids.copy()
    swapped[[1, 2]] = swapped[[2, 1]]
    assert not checks.compare_topk_exact(swapped, t.scores, t.count, scores, 3, ids).ok
    assert not checks.compare_topk_exact(t.ids, t.scores, 9, scores, 3, ids).ok
    ref = scores.astype(np.float64) + np.array([0, 0, 1e-9, -1e-9])
    assert checks.compare_topk_float64(np.array([10, 13, 12]), ref, 3, ids).ok   # near-tie swap
    bad = checks.compare_topk_float64(np.array([10, 11]), ref, 2, ids)  # 11 scores 1.0, far from the 2nd
    assert not bad.ok and "not near-ties" in bad.message


def test_compare_topk_float64_frees_only_the_swappable_ads():
    ids = np.array([10, 11, 12, 13])
    ref = np.array([5.0, 1.0, 4.0, 3.0])  # float64 top-2: 10, 12
    got = np.array([10, 11])  # 11 is far below the 2nd score
    assert not checks.compare_topk_float64(got, ref, 2, ids).ok
    assert checks.compare_topk_float64(got, ref, 2, ids, swappable=np.array([False, True, True, False])).ok
    assert not checks.compare_topk_float64(got, ref, 2, ids, swappable=np.array([False, False, True, True])).ok


def test_score_tolerance_allows_the_logits_fp32_rounding_on_large_rows(rng):
    # one large value whose gate keys are equal across experts: logits in the thousands, their
    # difference O(1), so the softmax is not saturated and an fp32 kernel's logit rounding moves the
    # chosen weight p_e far more than SCORE_RTOL of the score scale allows
    d, E = 32, 2
    G = rng.standard_normal((E, d))
    G[:, 3] = 1.0
    V = rng.standard_normal(d)
    req = Request(V=np.stack([V, -V]), G=G, gamma=rng.uniform(0.5, 1.5, d),  # the other expert's score: far
                  beta=rng.standard_normal(d), k_experts=1)
    emb = rng.standard_normal((5, d))
    emb[2, 3] = 65000.0
    table = AdTable.from_float(emb, rng.standard_normal(5))
    g = reference.gate(req, table)
    ref = reference.score(req, table)
    delta = checks.logit_error_bound(req, table)
    assert delta[2] > 100 * delta[[0, 1, 3, 4]].max()
    # every logit moved by the bound against the chosen expert: what a correct fp32 kernel may return
    logits = g.logits + np.where(g.chosen, -1.0, 1.0) * delta[:, None]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    moved = np.where(g.chosen, p * g.values, 0.0).sum(axis=1) + table.bias
    assert abs(moved[2] - ref[2]) > 10 * checks.SCORE_RTOL * checks.score_scale(req, table)
    assert checks.compare_scores(moved, req, table).ok
    # ...and no further: past the tolerance, or the other expert's score where the logits do not tie
    tol, tie = checks.score_tolerance(req, table), checks.near_tie_ads(req, table)
    for ad in np.flatnonzero(~tie):
        off = moved.copy()
        off[ad] = ref[ad] + 1.5 * tol[ad]
        assert not checks.compare_scores(off, req, table).ok
    if not tie[2]:  # the large row's O(1) gap is wider than 2 delta in ~98 % of draws
        off = moved.copy()
        off[2] = (g.p * g.values)[2, ~g.chosen[2]].sum() + table.bias[2]
        assert not checks.compare_scores(off, req, table).ok


def _fp32_model(req, table):
    """The model computed in float32 throughout (numpy's order of sums): a correct fp32 kernel."""
    f = np.float32
    a = table.dequantized().astype(f)
    h = np.maximum(req.gamma.astype(f) * a + req.beta.astype(f), f(0))
    logits = h @ (req.G.astype(np.float64) / np.sqrt(req.d)).astype(f).T
    values = h @ req.V.astype(f).T
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    top = np.argsort(-logits, axis=1, kind="stable")[:, : req.k_experts]
    chosen = np.zeros(logits.shape, bool)
    np.put_along_axis(chosen, top, True, axis=1)
    return np.where(chosen, p * values, f(0)).sum(axis=1) + table.bias.astype(f)


def test_checks_accept_fp32_where_floats_saturate_cancel_or_tie_three_ways(rng):
    d = 16
    # logits ~1e9 apart by 41: float64's softmax says p = 1, fp32's logits tie (p = 0.5 each)
    G = np.zeros((2, d))
    G[:, 0], G[0, 1:] = 4.0, 11.0
    V = np.zeros((2, d))
    V[:, 1:] = rng.uniform(0.5, 1.5, d - 1) * np.array([[1.0], [-1.0]])  # value dots of opposite signs
    req = Request(V=V, G=G, gamma=np.ones(d), beta=np.zeros(d), k_experts=1)
    rows = np.ones((3, d))
    rows[2, 0] = 1e9
    table = AdTable.from_float(rows, np.zeros(3))
    got = _fp32_model(req, table)
    assert abs(got[2] - reference.score(req, table)[2]) > 0.1
    assert checks.compare_scores(got, req, table).ok
    # gamma a + beta cancels (beta ~ +-5e4, h ~ 1): h's rounding is far above SCORE_RTOL of |h|'s scale
    beta = rng.choice([-1.0, 1.0], d) * 5e4
    gamma = rng.uniform(0.5, 1.5, d)
    req = Request(V=rng.standard_normal((1, d)), G=np.zeros((1, d)), gamma=gamma, beta=beta, k_experts=1)
    table = AdTable.from_float((-beta + rng.uniform(0, 2, (16, d))) / gamma, np.zeros(16))
    got = _fp32_model(req, table)
    assert np.abs(got - reference.score(req, table)).max() > 3 * checks.SCORE_RTOL * checks.score_scale(req, table)
    assert checks.compare_scores(got, req, table).ok
    # three experts whose logits tie within fp32's rounding: any two of the three, each its own score
    G = np.tile(rng.standard_normal(d), (3, 1))
    G[:, -1] += np.array([0.0, 1e-3, 2e-3])
    req = Request(V=rng.standard_normal((3, d)), G=G, gamma=np.ones(d), beta=np.zeros(d), k_experts=2)
    table = AdTable.from_float(np.abs(rng.standard_normal((5, d))) * np.r_[np.ones(d - 1), 1e-5], np.zeros(5))
    for chosen in ([0, 1], [0, 2], [1, 2]):
        g = reference.gate(req, table)
        mask = np.zeros(3, bool)
        mask[chosen] = True
        assert checks.compare_scores((g.p * g.values)[:, mask].sum(axis=1), req, table).ok
    assert checks.compare_scores(np.zeros(0), req, AdTable.from_float(np.zeros((0, d)))).ok


def test_checks_still_reject_wrong_experts_and_weights_on_large_rows(rng):
    # rows of magnitude 1e4 on the half of the dims the experts' keys share: logits ~1e4, gaps O(1)
    d, E = 128, 2
    G = rng.standard_normal((E, d))
    G[:, : d // 2] = rng.standard_normal(d // 2)
    V = rng.standard_normal(d)
    req = Request(V=np.stack([V, -V]), G=G, gamma=np.ones(d), beta=np.zeros(d), k_experts=1)  # a wrong expert: far
    rows = rng.standard_normal((200, d))
    rows[:, : d // 2] = rng.choice([-1e4, 1e4], (200, d // 2))
    table = AdTable.from_float(rows, np.zeros(200), dtype="fp16")
    assert checks.compare_scores(_fp32_model(req, table), req, table).ok
    g = reference.gate(req, table)
    renormalised = np.where(g.chosen, g.values, 0.0).sum(axis=1)  # p_e / sum of the chosen p: 1 at K = 1
    assert not checks.compare_scores(renormalised, req, table).ok
    wrong = np.where(~g.chosen, g.p * g.values, 0.0).sum(axis=1)
    far = ~checks.near_tie_ads(req, table)
    assert far.mean() > 0.5
    for ad in np.flatnonzero(far)[:20]:
        off = reference.score(req, table)
        off[ad] = wrong[ad]
        assert not checks.compare_scores(off, req, table).ok, ad
