"""Shared checks against the oracle (DESIGN.md, "Checking against the oracle")."""

import numpy as np

from andromeda_nb import oracle
from andromeda_nb.model import AdTable, Request
from andromeda_nb.targeting import Category, TargetingRules, TargetingSchema

#: Scores: |kernel - oracle| <= SCORE_RTOL * score scale (fp32 accumulation vs float64).
SCORE_RTOL = 1e-5
#: Expert choice: where the K-th and (K+1)-th logits are closer than this, either choice is right.
GATE_GAP = 1e-4


def score_scale(request: Request, table: AdTable) -> float:
    """The magnitude fp32 rounding errors scale with: max over ads of
    sum_e p_e * sum_j |V_ej h_j| + |b| (an upper bound of the terms summed)."""
    a = table.dequantized()
    h = np.maximum(request.gamma * a + request.beta, 0.0)
    g = oracle.gate(request, table)
    mags = np.abs(h) @ np.abs(request.V.astype(np.float64)).T
    per_ad = (g.p * mags).sum(axis=1) + np.abs(table.bias)
    finite = per_ad[np.isfinite(per_ad)]
    return float(finite.max()) if finite.size else 1.0


def alternative_scores(request: Request, table: AdTable) -> np.ndarray:
    """Score of every ad with the K-th and (K+1)-th experts swapped (NaN where K == E)."""
    g = oracle.gate(request, table)
    K, E = request.k_experts, request.experts
    out = np.full(table.n_ads, np.nan)
    if K == E:
        return out
    order = np.argsort(-g.logits, axis=1, kind="stable")
    alt = order[:, :K].copy()
    alt[:, K - 1] = order[:, K]
    chosen = np.zeros_like(g.chosen)
    np.put_along_axis(chosen, alt, True, axis=1)
    with np.errstate(invalid="ignore"):
        return np.where(chosen, g.p * g.values, 0.0).sum(axis=1) + table.bias


def near_tie(request: Request, table: AdTable) -> np.ndarray:
    """Ads whose K-th and (K+1)-th logits differ by less than GATE_GAP."""
    g = oracle.gate(request, table)
    K, E = request.k_experts, request.experts
    if K == E:
        return np.zeros(table.n_ads, bool)
    srt = -np.sort(-g.logits, axis=1)
    return np.abs(srt[:, K - 1] - srt[:, K]) < GATE_GAP


def check_scores(got, request: Request, table: AdTable, where=None):
    """Assert kernel scores match the oracle: NaN exactly where the oracle is NaN; elsewhere within
    SCORE_RTOL of the score scale, accepting the alternative expert set only at near-ties."""
    got = np.asarray(got, dtype=np.float64)
    ref = oracle.score(request, table)
    if where is not None:
        ref, got_sel = ref[where], got
    else:
        got_sel = got
    assert got_sel.shape == ref.shape
    nan_ref = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got_sel), nan_ref, err_msg="NaN pattern differs from the oracle")
    tol = SCORE_RTOL * score_scale(request, table)
    err = np.abs(got_sel - ref)
    bad = ~nan_ref & ~(err <= tol)
    if bad.any():
        alt = alternative_scores(request, table)
        tie = near_tie(request, table)
        if where is not None:
            alt, tie = alt[where], tie[where]
        ok_alt = tie & (np.abs(got_sel - alt) <= tol)
        bad &= ~ok_alt
    assert not bad.any(), (
        f"{int(bad.sum())} scores off the oracle by more than {tol:.3g}: "
        f"worst {np.nanmax(err[bad]):.3g} at {np.flatnonzero(bad)[:5].tolist()}"
    )


def check_topk_against_float64(ids, scores, ref_scores, all_ids, k, eligible=None):
    """Ids may differ from the float64 oracle only among scores within tolerance of the k-th."""
    want = oracle.topk(ref_scores, k, ids=all_ids, eligible=eligible)
    tol = SCORE_RTOL * max(1.0, float(np.nanmax(np.abs(ref_scores[np.isfinite(ref_scores)]), initial=1.0)))
    real = want.ids >= 0
    kth = want.scores[real][-1] if real.any() else -np.inf
    assert np.sum(ids >= 0) == np.sum(real)
    diff = set(ids[ids >= 0].tolist()) ^ set(want.ids[real].tolist())
    lookup = dict(zip(all_ids.tolist(), ref_scores.tolist()))
    for ad in diff:
        assert abs(lookup[ad] - kth) <= 2 * tol, f"ad {ad} differs from the float64 top-k and is not a near-tie"


def random_schema():
    return TargetingSchema([
        Category("age", 7), Category("gender", 2), Category("country", 5),
        Category("interest", 30, multi_valued=True), Category("audience", 12, multi_valued=True),
    ])


def random_rules(rng, n: int, schema=None, p_constrain=0.4, p_exclude=0.2, live_p=0.9) -> TargetingRules:
    """Small random rule set (records path) with includes, excludes, dead ads."""
    schema = schema or random_schema()
    recs = []
    ids = rng.choice(10 * n + 10, size=n, replace=False)
    for i in range(n):
        r = {"ad_id": int(ids[i]), "live": bool(rng.random() < live_p), "include": {}, "exclude": {}}
        for c in schema:
            if rng.random() < p_constrain:
                r["include"][c.name] = rng.choice(c.cardinality, rng.integers(1, min(4, c.cardinality) + 1),
                                                  replace=False).tolist()
            if rng.random() < p_exclude:
                r["exclude"][c.name] = rng.choice(c.cardinality, 1).tolist()
        recs.append(r)
    return TargetingRules.from_records(schema, recs)


def random_profile(rng, schema) -> dict:
    prof = {}
    for c in schema:
        if c.multi_valued:
            prof[c.name] = rng.choice(c.cardinality, rng.integers(0, 4), replace=False).tolist()
        elif rng.random() < 0.85:
            prof[c.name] = int(rng.integers(c.cardinality))
    return prof
