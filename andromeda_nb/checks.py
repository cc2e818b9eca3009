"""Comparisons against the oracle with docs/design.md's tolerances ("Checking against the reference").

Used by the tests (which assert on the result) and by the benchmarks (which record it in each row's
``verified`` column).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import reference
from .model import AdTable, Request

#: Scores: |kernel - oracle| <= SCORE_RTOL * score scale (fp32 accumulation against float64), plus
#: per ad what the logits' rounding can do through the softmax (:func:`score_tolerance`).
SCORE_RTOL = 1e-5
#: Expert choice: where the K-th and (K+1)-th logits are closer than this plus twice the logits'
#: rounding allowance (:func:`logit_error_bound`), either choice is right.
GATE_GAP = 1e-4
#: The fp16 math mode against the fp32 model: |kernel - fp32 oracle| <= FP16_RTOL * score scale
#: (h and the weights rounded to fp16: a relative error near 2^-11 a product, summed over d), plus
#: per ad the softmax's response to the rounding, where the expert set is the fp32 model's
#: (:func:`rounding_tie_ads` names the ads where it may not be).
FP16_RTOL = 1e-2
#: unit roundoffs of fp32 and fp16
FP32_UNIT, FP16_UNIT = 2.0 ** -24, 2.0 ** -11
#: The fp32 logits' rounding allowance, relative to the sum of their terms' magnitudes
#: (:func:`logit_error_bound`). Like SCORE_RTOL a stated allowance, not the worst case ((d + 3) u,
#: which on rows of magnitude 10^4 let a wrong expert or wrongly normalised weights pass): 16 u, over
#: 6x the largest error of fp32 logits seen over sequential, reversed, pairwise and largest-first sums,
#: with and without FMA, at d = 16 to 128.
LOGIT_RTOL = 16 * FP32_UNIT


@dataclass(frozen=True)
class Check:
    """Outcome of a comparison: ``ok`` and a one-line ``message`` (what was compared, worst error)."""

    ok: bool
    message: str

    def __bool__(self):
        return self.ok

    def __str__(self):
        return ("ok: " if self.ok else "FAIL: ") + self.message


def score_scale(request: Request, table: AdTable, math: str = "fp32") -> float:
    """The magnitude fp32 rounding errors scale with: max over ads of
    ``sum_e p_e * sum_j |V_ej h_j| + |b|`` (an upper bound of the magnitudes summed)."""
    return _score_scale(request, table, reference.gate(request, table, math))


def _score_scale(request: Request, table: AdTable, g) -> float:
    """:func:`score_scale` with the gate ``g`` already computed."""
    a = table.dequantized()
    h = np.maximum(request.gamma * a + request.beta, 0.0)
    mags = np.abs(h) @ np.abs(request.V.astype(np.float64)).T
    with np.errstate(invalid="ignore"):
        per_ad = (g.p * mags).sum(axis=1) + np.abs(table.bias)
    finite = per_ad[np.isfinite(per_ad)]
    return float(finite.max()) if finite.size else 1.0


def _magnitudes(request: Request, table: AdTable) -> tuple[np.ndarray, np.ndarray]:
    """``(m, h)`` float64 ``[n_ads, d]``: ``m = |gamma a| + |beta|``, which bounds h's rounding error
    where ``gamma a + beta`` cancels as well, and ``|h|`` of the fp32 model."""
    a = table.dequantized()
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.abs(request.gamma * a) + np.abs(request.beta)
        h = np.abs(np.maximum(request.gamma * a + request.beta, 0.0))
    return m, h


def _per_logit(request: Request, x: np.ndarray) -> np.ndarray:
    """``max_e sum_j x_j |G_ej| / sqrt(d)`` per ad: the magnitudes a logit's terms sum to."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (x @ np.abs(request.G.astype(np.float64)).T).max(axis=1) / np.sqrt(request.d)


def logit_error_bound(request: Request, table: AdTable) -> np.ndarray:
    """float64 ``[n_ads]``: how far an fp32 kernel may put each gate logit from its exact value,
    ``LOGIT_RTOL max_e sum_j (|gamma_j a_j| + |beta_j|) |G_ej| / sqrt(d)``. ~1e-6 for rows of
    magnitude 1 at d = 64; it grows with the row's magnitude, where ``GATE_GAP`` alone would call a
    correct kernel wrong."""
    return LOGIT_RTOL * _per_logit(request, _magnitudes(request, table)[0])


def _fp16_logit_bound(request: Request, table: AdTable, unit: float = FP16_UNIT) -> np.ndarray:
    """float64 ``[n_ads]``: how far a math mode rounding to a format of unit roundoff ``unit`` may put
    each logit from the fp32 model's: gamma, beta (and an int8 row's dequantized values) rounded,
    ``unit 2 (|gamma a| + |beta|)``, h and G rounded, ``unit 2 |h|``, a term; then the fp32 sums."""
    m, h = _magnitudes(request, table)
    return unit * _per_logit(request, 2 * m + 2 * h) + LOGIT_RTOL * _per_logit(request, m)


def _weight_shift(logits: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """float64 ``[n, E]``: the most each softmax weight ``p_e`` (over all E) can move when every logit
    moves by at most ``delta`` ``[n]``. Exact, not first order: with ``R_e = sum_{f != e}
    exp(l_f - l_e)``, ``p_e = 1 / (1 + R_e)`` and R_e moves by at most ``e^{+-2 delta}``. R_e is
    taken from the logits in the log domain (a p of exactly 0 or 1 in float64 can still move)."""
    n, E = logits.shape
    if E == 1 or n == 0:
        return np.zeros((n, E))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = logits[:, None, :] - logits[:, :, None]  # [n, e, f]: l_f - l_e
        diff[:, np.arange(E), np.arange(E)] = -np.inf
        top = diff.max(axis=2, keepdims=True)
        log_r = top[..., 0] + np.log(np.exp(diff - top).sum(axis=2))

        def sigmoid(x):  # 1 / (1 + e^-x), without overflow
            return 0.5 * (1.0 + np.tanh(0.5 * x))

        d2 = 2.0 * np.asarray(delta, np.float64)[:, None]
        p = sigmoid(-log_r)
        shift = np.maximum(sigmoid(d2 - log_r) - p, p - sigmoid(-d2 - log_r))
    return np.where(np.isfinite(shift), shift, 0.0)


def _set_tolerance(request: Request, m: np.ndarray, g, chosen: np.ndarray, base: float, delta: np.ndarray,
                   h_unit: float) -> np.ndarray:
    """float64 ``[n_ads]``: the tolerance of the score of expert set ``chosen`` (bool ``[n, E]``):
    ``base`` (a multiple of the score scale), plus the chosen weights' moves when the logits move
    by ``delta`` (:func:`_weight_shift`, times ``|v_e|``), plus h's rounding through the value dots,
    ``2 h_unit sum_e p_e sum_j |V_ej| m_j`` (``m [n, d]``: :func:`_magnitudes`; it matters where
    ``gamma a + beta`` cancels)."""
    with np.errstate(invalid="ignore", over="ignore"):
        gate = np.where(chosen, _weight_shift(g.logits, delta) * np.abs(g.values), 0.0).sum(axis=1)
        h_err = 2 * h_unit * np.where(chosen, g.p * (m @ np.abs(request.V.astype(np.float64)).T), 0.0).sum(axis=1)
    extra = gate + h_err
    return base + np.where(np.isfinite(extra), extra, 0.0)


def _tolerance_terms(request: Request, table: AdTable, math: str = "fp32", versus_fp32: bool = False) -> tuple:
    """``(g, m, base, delta, h_unit)`` of :func:`_set_tolerance` (the gate, the magnitudes, the scale
    term, the logits' allowance, h's unit roundoff), each computed once: for the kernel against its
    own ``math``'s model, or (``versus_fp32``) the fp16 math mode against the fp32 model."""
    g = reference.gate(request, table, "fp32" if versus_fp32 else math)
    m, h = _magnitudes(request, table)
    delta = LOGIT_RTOL * _per_logit(request, m)
    if versus_fp32:
        rounding = FP16_UNIT * _per_logit(request, 2 * m + 2 * h)  # as _fp16_logit_bound
        return g, m, FP16_RTOL * _score_scale(request, table, g), rounding + delta, FP16_UNIT
    return g, m, SCORE_RTOL * _score_scale(request, table, g), delta, FP32_UNIT


def score_tolerance(request: Request, table: AdTable, math: str = "fp32") -> np.ndarray:
    """float64 ``[n_ads]``: how far a correct fp32-accumulating kernel's score may be from the float64
    oracle of ``math``'s model: ``SCORE_RTOL`` times the request's score scale, plus what the
    logits' rounding allowance (:func:`logit_error_bound`) can do through the softmax to the chosen
    experts' weights, plus h's rounding where ``gamma a + beta`` cancels (:func:`_set_tolerance`).
    The additions are small on ordinary rows and grow on rows of large magnitude."""
    g, m, base, delta, h_unit = _tolerance_terms(request, table, math)
    return _set_tolerance(request, m, g, g.chosen, base, delta, h_unit)


def _other_sets_match(got, bad, request, table, g, m, window, base, delta, h_unit) -> np.ndarray:
    """bool ``[n_ads]``: ads of ``bad`` whose score is within its own tolerance of another expert
    set's, one the logits allow: every expert of the set at least the best left out minus ``window``
    (ties among three or more experts included)."""
    from itertools import combinations

    K, E = request.k_experts, request.experts
    ok = np.zeros(bad.shape, bool)
    if K == E or not bad.any():
        return ok
    rows = np.flatnonzero(bad)
    sub = type(g)(**{f: getattr(g, f)[rows] for f in ("logits", "p", "values", "chosen")})
    m, bias = m[rows], np.asarray(table.bias, np.float64)[rows]
    with np.errstate(invalid="ignore"):
        for members in combinations(range(E), K):
            s = np.zeros(E, bool)
            s[list(members)] = True
            possible = sub.logits[:, s].min(axis=1) >= sub.logits[:, ~s].max(axis=1) - window[rows]
            if not possible.any():
                continue
            chosen = np.broadcast_to(s, sub.chosen.shape)
            alt = np.where(chosen, sub.p * sub.values, 0.0).sum(axis=1) + bias
            tol = _set_tolerance(request, m, sub, chosen, base, delta[rows], h_unit)
            ok[rows] |= possible & (np.abs(got[rows] - alt) <= tol)
    return ok


def _k_gap(g, K: int) -> np.ndarray:
    """float64 ``[n_ads]``: the K-th largest logit minus the (K+1)-th (NaN rows: NaN)."""
    with np.errstate(invalid="ignore"):
        srt = -np.sort(-g.logits, axis=1)
        return np.abs(srt[:, K - 1] - srt[:, K])


def near_tie_ads(request: Request, table: AdTable, math: str = "fp32") -> np.ndarray:
    """bool ``[n_ads]``: ads whose K-th and (K+1)-th gate logits (float64, of ``math``'s model) are
    within ``GATE_GAP`` plus twice the logits' rounding allowance (:func:`logit_error_bound`), so a
    kernel may choose another expert set (docs/design.md: either choice is right)."""
    K, E = request.k_experts, request.experts
    if K == E:
        return np.zeros(table.n_ads, bool)
    g = reference.gate(request, table, math)
    return _k_gap(g, K) < GATE_GAP + 2 * logit_error_bound(request, table)


def rounding_tie_ads(request: Request, table: AdTable, unit: float = FP16_UNIT) -> np.ndarray:
    """bool ``[n_ads]``: ads whose K-th and (K+1)-th logits of the fp32 model are closer than
    ``GATE_GAP`` plus twice what rounding to a format of unit roundoff ``unit`` can move a logit
    (:func:`_fp16_logit_bound`): a math mode in that format may choose another expert set there."""
    K, E = request.k_experts, request.experts
    if K == E:
        return np.zeros(table.n_ads, bool)
    g = reference.gate(request, table)
    return _k_gap(g, K) < GATE_GAP + 2 * _fp16_logit_bound(request, table, unit)


def _widened(tol: np.ndarray, base: float) -> str:
    """The message's note on the ads whose tolerance the logits' rounding widened past twice the base."""
    wide = tol > 2 * base
    return f"; {int(wide.sum())} ads' tolerance widened by their logits' rounding, up to {tol.max():.3g}" if wide.any() else ""


def compare_scores_to_fp32(got, request: Request, table: AdTable, math: str) -> Check:
    """A reduced-precision math mode's scores against the fp32 model (float64 oracle): within
    ``FP16_RTOL`` of the score scale plus the chosen weights' response to the rounding's logit
    error (:func:`_fp16_logit_bound`) and h's rounding where ``gamma a + beta`` cancels, or, where
    the rounding may change the expert set (:func:`rounding_tie_ads`), of another set's score within
    its own tolerance. NaN exactly where the oracle's is."""
    if math != "fp16":
        raise ValueError(f"compare_scores_to_fp32 takes math='fp16', got {math!r} (fp32 math: compare_scores)")
    got = np.asarray(got, dtype=np.float64)
    ref = reference.score(request, table)
    nan_ref = np.isnan(ref)
    if not np.array_equal(np.isnan(got), nan_ref):
        return Check(False, "NaN pattern differs from the fp32 oracle")
    g, m, base, delta, h_unit = _tolerance_terms(request, table, versus_fp32=True)
    tol = _set_tolerance(request, m, g, g.chosen, base, delta, h_unit)
    err = np.where(nan_ref, 0.0, np.abs(got - np.where(nan_ref, 0.0, ref)))
    bad = err > tol
    n_alt = 0
    if bad.any():
        ok_alt = _other_sets_match(got, bad, request, table, g, m, GATE_GAP + 2 * delta, base, delta, h_unit)
        n_alt = int(ok_alt.sum())
        bad &= ~ok_alt
    if bad.any():
        at = np.flatnonzero(bad)
        return Check(False, f"{int(bad.sum())}/{got.size} {math} scores off the fp32 model by more than their "
                            f"tolerance (worst {float(err[bad].max()):.3g} at {at[:5].tolist()}, tolerance "
                            f"{tol[at[0]]:.3g} at {at[0]})")
    worst = float(err[err <= tol].max(initial=0.0))
    return Check(True, f"{got.size} {math} scores within {base:.2g} of the fp32 model (max err {worst:.2g}"
                       + (f", {n_alt} rounding-tie expert swaps" if n_alt else "") + _widened(tol, base) + ")")


def compare_scores(got, request: Request, table: AdTable, math: str = "fp32") -> Check:
    """Kernel scores ``[n]`` against the float64 oracle on the table the kernel read, of the model
    the kernel's ``math`` computes (:func:`~andromeda_nb.reference.score`).

    NaN must appear exactly where the oracle's is NaN; elsewhere the error must be within
    :func:`score_tolerance`, where the logits nearly tie (:func:`near_tie_ads`) the score may
    instead be another expert set's (within that set's own tolerance).
    """
    got = np.asarray(got, dtype=np.float64)
    ref = reference.score(request, table, math=math)
    if got.shape != ref.shape:
        return Check(False, f"shape {got.shape} != oracle {ref.shape}")
    nan_ref = np.isnan(ref)
    if not np.array_equal(np.isnan(got), nan_ref):
        return Check(False, f"NaN pattern differs from the oracle at {np.flatnonzero(np.isnan(got) != nan_ref)[:5].tolist()}")
    g, m, base, delta, h_unit = _tolerance_terms(request, table, math)
    tol = _set_tolerance(request, m, g, g.chosen, base, delta, h_unit)
    err = np.where(nan_ref, 0.0, np.abs(got - np.where(nan_ref, 0.0, ref)))
    bad = err > tol
    n_alt = 0
    if bad.any():
        ok_alt = _other_sets_match(got, bad, request, table, g, m, GATE_GAP + 2 * delta, base, delta, h_unit)
        n_alt = int(ok_alt.sum())
        bad &= ~ok_alt
    worst = float(err[~bad].max(initial=0.0))
    if bad.any():
        at = np.flatnonzero(bad)
        return Check(False, f"{int(bad.sum())}/{got.size} scores off by more than their tolerance "
                            f"(worst {float(err[bad].max()):.3g} at {at[:5].tolist()}, tolerance {tol[at[0]]:.3g} at {at[0]})")
    return Check(True, f"{got.size} scores within {base:.2g} of float64{'' if math == 'fp32' else ' (' + math + ' model)'} "
                       f"(max err {worst:.2g}"
                       + (f", {n_alt} near-tie expert swaps" if n_alt else "") + _widened(tol, base) + ")")


def compare_topk_exact(ids, scores, count, all_scores, k, all_ids=None, eligible=None) -> Check:
    """The answer must equal the oracle's top-k run on the kernel's own fp32 scores: same ids, same
    order, same scores (pads included) and the same count."""
    want = reference.topk(np.asarray(all_scores), k, ids=all_ids, eligible=eligible)
    if not np.array_equal(np.asarray(ids), want.ids):
        where = np.flatnonzero(np.asarray(ids) != want.ids)[:5].tolist()
        return Check(False, f"top-{k} ids differ from the oracle at ranks {where}")
    if not np.array_equal(np.asarray(scores), want.scores.astype(np.asarray(scores).dtype)):
        return Check(False, f"top-{k} scores differ from the oracle")
    if count is not None and int(count) != want.count:
        return Check(False, f"count {int(count)} != oracle {want.count}")
    return Check(True, f"top-{k} equals the oracle's on the kernel's scores ({want.count} candidates)")


def compare_topk_float64(ids, ref_scores, k, all_ids, eligible=None, swappable=None) -> Check:
    """Against float64 scores, ids may differ only among scores within tolerance of the k-th, or
    where ``swappable`` (bool, aligned with ``ref_scores``; e.g. :func:`near_tie_ads`) marks an ad
    whose score may be another expert set's."""
    ids = np.asarray(ids)
    all_ids = np.asarray(all_ids)
    want = reference.topk(ref_scores, k, ids=all_ids, eligible=eligible)
    finite = ref_scores[np.isfinite(ref_scores)]
    tol = 2 * SCORE_RTOL * max(1.0, float(np.abs(finite).max()) if finite.size else 1.0)
    real = want.ids >= 0
    if np.sum(ids >= 0) != np.sum(real):
        return Check(False, f"{np.sum(ids >= 0)} results, float64 oracle has {np.sum(real)}")
    kth = want.scores[real][-1] if real.any() else -np.inf
    lookup = dict(zip(all_ids.tolist(), np.asarray(ref_scores).tolist()))
    diff = set(ids[ids >= 0].tolist()) ^ set(want.ids[real].tolist())
    free = set() if swappable is None else set(all_ids[np.asarray(swappable, bool)].tolist())
    far = [a for a in diff if abs(lookup[a] - kth) > tol and a not in free]
    if far:
        return Check(False, f"ads {far[:5]} differ from the float64 top-{k} and are not near-ties")
    return Check(True, f"top-{k} agrees with float64 up to {len(diff) // 2} near-tie swaps")
