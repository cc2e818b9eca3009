"""Comparisons against the oracle with docs/design.md's tolerances ("Checking against the reference").

Used by the tests (which assert on the result) and by the benchmarks (which record it in each row's
``verified`` column).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import reference
from .model import AdTable, Request

#: Scores: |kernel - oracle| <= SCORE_RTOL * score scale (fp32 accumulation against float64).
SCORE_RTOL = 1e-5
#: Expert choice: where the K-th and (K+1)-th logits are closer than this, either choice is right.
GATE_GAP = 1e-4
#: The fp16 math mode against the fp32 model: |kernel - fp32 oracle| <= FP16_RTOL * score scale
#: (h and the weights rounded to fp16: a relative error near 2^-11 a product, summed over d), where
#: the expert set is the fp32 model's (:func:`rounding_tie_ads` names the ads where it may not be).
FP16_RTOL = 1e-2


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
    a = table.dequantized()
    h = np.maximum(request.gamma * a + request.beta, 0.0)
    g = reference.gate(request, table, math)
    mags = np.abs(h) @ np.abs(request.V.astype(np.float64)).T
    with np.errstate(invalid="ignore"):
        per_ad = (g.p * mags).sum(axis=1) + np.abs(table.bias)
    finite = per_ad[np.isfinite(per_ad)]
    return float(finite.max()) if finite.size else 1.0


#: fp32's unit roundoff: the logits' error bound (:func:`logit_error_bound`) is in units of it.
FP32_UNIT = 2.0 ** -24


def logit_error_bound(request: Request, table: AdTable) -> np.ndarray:
    """float64 ``[n_ads]``: how far an fp32 computation may put each gate logit from its exact value,
    ``(d + 3) u max_e sum_j (|gamma_j a_j| + |beta_j|) |G_ej| / sqrt(d)`` (u = 2^-24: a d-term fp32
    dot product's worst-case accumulation error, h's FiLM rounding and G's scaling by 1/sqrt(d);
    ``|gamma a| + |beta|`` bounds h's rounding error even where the sum cancels). Small for ordinary
    rows (~1e-5 at |a| ~ 1, d = 64); it grows with the row's magnitude, where an absolute
    ``GATE_GAP`` alone would call a correct kernel wrong."""
    a = table.dequantized()
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.abs(request.gamma * a) + np.abs(request.beta)
        worst = (m @ np.abs(request.G.astype(np.float64)).T).max(axis=1) / np.sqrt(request.d)
    return (request.d + 3) * FP32_UNIT * worst


def _gate_error(request: Request, table: AdTable, math: str, delta: np.ndarray) -> np.ndarray:
    """float64 ``[n_ads]``: the most the score's chosen ``p_e v_e`` can move when every logit moves
    by at most ``delta`` (the expert set held): each ``p_e`` then lies within
    ``1 / (1 + R_e e^{+-2 delta})``, ``R_e = (1 - p_e) / p_e`` (exact, not first-order), times
    ``|v_e|``. Zero where p_e is 0 or 1 and the softmax cannot move."""
    g = reference.gate(request, table, math)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        p = g.p
        r = (1.0 - p) / p
        grow = np.exp(2.0 * delta)[:, None]
        dp = np.maximum(np.abs(1.0 / (1.0 + r / grow) - p), np.abs(1.0 / (1.0 + r * grow) - p))
        dp = np.where(p > 0, dp, 0.0)
        out = np.where(g.chosen, dp * np.abs(g.values), 0.0).sum(axis=1)
    return np.where(np.isfinite(out), out, 0.0)


def score_tolerance(request: Request, table: AdTable, math: str = "fp32") -> np.ndarray:
    """float64 ``[n_ads]``: how far a correct fp32-accumulating kernel's score may be from the float64
    oracle of ``math``'s model: ``SCORE_RTOL`` times the request's score scale (the value dots' and
    sums' rounding), plus what the logits' rounding (:func:`logit_error_bound`) can do through the
    softmax to the chosen experts' weights (:func:`_gate_error`; negligible unless a row's logits are
    large and its softmax not saturated: logits in the thousands, p_e between ~0.01 and ~0.99)."""
    return SCORE_RTOL * score_scale(request, table, math) + _gate_error(
        request, table, math, logit_error_bound(request, table))


def _alternative_scores(request: Request, table: AdTable, math: str = "fp32") -> np.ndarray:
    """Every ad's score with the K-th and (K+1)-th experts swapped (NaN where K == E)."""
    g = reference.gate(request, table, math)
    K, E = request.k_experts, request.experts
    if K == E:
        return np.full(table.n_ads, np.nan)
    order = np.argsort(-g.logits, axis=1, kind="stable")
    alt = order[:, :K].copy()
    alt[:, K - 1] = order[:, K]
    chosen = np.zeros_like(g.chosen)
    np.put_along_axis(chosen, alt, True, axis=1)
    with np.errstate(invalid="ignore"):
        return np.where(chosen, g.p * g.values, 0.0).sum(axis=1) + table.bias


def near_tie_ads(request: Request, table: AdTable, math: str = "fp32") -> np.ndarray:
    """bool ``[n_ads]``: ads whose K-th and (K+1)-th gate logits (float64, of ``math``'s model) are
    within ``GATE_GAP`` plus twice the logits' fp32 error bound (:func:`logit_error_bound`), so a
    kernel may choose either expert set (docs/design.md: either choice is right)."""
    g = reference.gate(request, table, math)
    K, E = request.k_experts, request.experts
    if K == E:
        return np.zeros(table.n_ads, bool)
    srt = -np.sort(-g.logits, axis=1)
    return np.abs(srt[:, K - 1] - srt[:, K]) < GATE_GAP + 2 * logit_error_bound(request, table)


def rounding_tie_ads(request: Request, table: AdTable, unit: float = 2.0 ** -11) -> np.ndarray:
    """bool ``[n_ads]``: ads whose K-th and (K+1)-th logits of the fp32 model are closer than the
    error that rounding h and the gate keys to a format of unit roundoff ``unit`` can put between
    them (``2 * 2 unit sum_j |h_j G_ej| / sqrt(d)`` at the largest e, plus ``GATE_GAP``): a math
    mode in that format may choose either expert set there."""
    K, E = request.k_experts, request.experts
    if K == E:
        return np.zeros(table.n_ads, bool)
    g = reference.gate(request, table)
    srt = -np.sort(-g.logits, axis=1)
    return np.abs(srt[:, K - 1] - srt[:, K]) < 2 * _rounding_logit_bound(request, table, unit) + GATE_GAP


def _rounding_logit_bound(request: Request, table: AdTable, unit: float) -> np.ndarray:
    """float64 ``[n_ads]``: how far rounding h and the gate keys to a format of unit roundoff ``unit``
    can move each logit of the fp32 model, ``2 unit max_e sum_j |h_j G_ej| / sqrt(d)``."""
    a = table.dequantized()
    with np.errstate(invalid="ignore", over="ignore"):
        h = np.abs(np.maximum(request.gamma * a + request.beta, 0.0))
        return 2 * unit * (h @ np.abs(request.G.astype(np.float64)).T).max(axis=1) / np.sqrt(request.d)


def compare_scores_to_fp32(got, request: Request, table: AdTable, math: str) -> Check:
    """A reduced-precision math mode's scores against the fp32 model (float64 oracle): within
    ``FP16_RTOL`` of the score scale plus the chosen weights' response to the rounding's logit
    error (:func:`_gate_error`), or, at a rounding tie (:func:`rounding_tie_ads`), of the
    score with the K-th and (K+1)-th experts swapped. NaN exactly where the oracle's is."""
    if math != "fp16":
        raise ValueError(f"compare_scores_to_fp32 takes math='fp16', got {math!r} (fp32 math: compare_scores)")
    got = np.asarray(got, dtype=np.float64)
    ref = reference.score(request, table)
    nan_ref = np.isnan(ref)
    if not np.array_equal(np.isnan(got), nan_ref):
        return Check(False, "NaN pattern differs from the fp32 oracle")
    delta = _rounding_logit_bound(request, table, 2.0 ** -11) + logit_error_bound(request, table)
    tol = FP16_RTOL * score_scale(request, table) + _gate_error(request, table, "fp32", delta)
    err = np.where(nan_ref, 0.0, np.abs(got - np.where(nan_ref, 0.0, ref)))
    bad = err > tol
    n_alt = 0
    if bad.any():
        ok_alt = rounding_tie_ads(request, table) & (np.abs(got - _alternative_scores(request, table)) <= tol)
        n_alt = int((bad & ok_alt).sum())
        bad &= ~ok_alt
    if bad.any():
        at = np.flatnonzero(bad)
        return Check(False, f"{int(bad.sum())}/{got.size} {math} scores off the fp32 model by more than their "
                            f"tolerance (tolerance {tol[at[0]]:.3g} at {at[0]})")
    worst = float(err[~bad & (err <= tol)].max(initial=0.0))
    return Check(True, f"{got.size} {math} scores within {tol.max():.2g} of the fp32 model (max err {worst:.2g}"
                       + (f", {n_alt} rounding-tie expert swaps" if n_alt else "") + ")")


def compare_scores(got, request: Request, table: AdTable, math: str = "fp32") -> Check:
    """Kernel scores ``[n]`` against the float64 oracle on the table the kernel read, of the model
    the kernel's ``math`` computes (:func:`~andromeda_nb.reference.score`).

    NaN must appear exactly where the oracle's is NaN; elsewhere the error must be within
    :func:`score_tolerance`, where an ad whose K-th and (K+1)-th logits nearly tie
    (:func:`near_tie_ads`) may instead match the score of the swapped expert set.
    """
    got = np.asarray(got, dtype=np.float64)
    ref = reference.score(request, table, math=math)
    if got.shape != ref.shape:
        return Check(False, f"shape {got.shape} != oracle {ref.shape}")
    nan_ref = np.isnan(ref)
    if not np.array_equal(np.isnan(got), nan_ref):
        return Check(False, f"NaN pattern differs from the oracle at {np.flatnonzero(np.isnan(got) != nan_ref)[:5].tolist()}")
    tol = score_tolerance(request, table, math)
    err = np.where(nan_ref, 0.0, np.abs(got - np.where(nan_ref, 0.0, ref)))
    bad = err > tol
    n_alt = 0
    if bad.any():
        alt = _alternative_scores(request, table, math)
        ok_alt = near_tie_ads(request, table, math) & (np.abs(got - alt) <= tol)
        n_alt = int((bad & ok_alt).sum())
        bad &= ~ok_alt
    worst = float(err[~bad].max()) if (~bad).any() else 0.0
    if bad.any():
        at = np.flatnonzero(bad)
        return Check(False, f"{int(bad.sum())}/{got.size} scores off by more than their tolerance "
                            f"(worst {float(err[bad].max()):.3g} at {at[:5].tolist()}, tolerance {tol[at[0]]:.3g} at {at[0]})")
    return Check(True, f"{got.size} scores within {tol.max():.2g} of float64{'' if math == 'fp32' else ' (' + math + ' model)'} "
                       f"(max err {worst:.2g}"
                       + (f", {n_alt} near-tie expert swaps" if n_alt else "") + ")")


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
