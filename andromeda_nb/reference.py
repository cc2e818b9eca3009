"""Float64 numpy reference of score, targeting match and top-K: the definition of correct.

Every kernel, every storage precision and the trained model's forward pass are tested against these
functions (docs/design.md, "The model", "Targeting", "Top-K").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .model import AdTable, Request, TopK
from .targeting import TargetingRules


@dataclass(frozen=True)
class GateResult:
    """Per-ad gate internals: ``logits [n, E]``, softmax ``p [n, E]``, expert value dots
    ``values [n, E]`` (``dot(V[e], h)``) and the chosen-expert mask ``chosen [n, E]``."""

    logits: np.ndarray
    p: np.ndarray
    values: np.ndarray
    chosen: np.ndarray


def math_rows(table: AdTable, math: str = "fp32") -> np.ndarray:
    """``[n_ads, d]`` float64: the table's rows as the math mode reads them (fp32 math: the stored
    values, int8 as ``q * scale`` in fp32; fp16 math: an int8 row dequantized to fp16)."""
    return _rows(table, math)[0]


def _rows(table, math: str = "fp32") -> tuple[np.ndarray, np.ndarray | None]:
    if isinstance(table, AdTable):
        if math == "fp16" and table.dtype == "int8":
            # fp16 math dequantizes to fp16: q times the scale (at most 65504) rounded to fp16, the
            # product (exact in float64) rounded once, as the kernel's mul.rn.f16x2
            s16 = np.minimum(table.scale, np.float32(65504.0)).astype(np.float16).astype(np.float64)
            with np.errstate(over="ignore"):
                a = (table.embeddings.astype(np.float64) * s16[:, None]).astype(np.float16)
            return a.astype(np.float64), table.bias.astype(np.float64)
        return table.dequantized(), table.bias.astype(np.float64)
    return np.asarray(table, dtype=np.float64), None


MATHS = ("fp32", "fp16")


def gate(request: Request, table, math: str = "fp32") -> GateResult:
    """Run the encode and gate of the model of docs/design.md in float64.

    Args:
        request: the request tensors.
        table: an :class:`AdTable` (its dequantized rows are used) or an ``[n, d]`` float array.
        math: ``"fp32"``: the model as written; ``"fp16"``: the model the fp16 math mode computes
            (docs/design.md, "Storage and math"): gamma, beta, G / sqrt(d) and V rounded to fp16
            (:func:`~andromeda_nb.score.weights.f16_weights`), an int8 table's rows dequantized to
            fp16 (q times its scale rounded to fp16, rounded once), h = max(gamma * a + beta, 0)
            rounded once to fp16, then everything in float64.

    Returns:
        :class:`GateResult`. Expert choice: the ``k_experts`` largest logits, ties to the lower
        expert index (a stable sort of ``-logit``).
    """
    a, _ = _rows(table, math)
    if a.ndim != 2 or a.shape[1] != request.d:
        raise ValueError(f"table rows must be [n, {request.d}], got {a.shape}")
    if math not in MATHS:
        raise ValueError(f"math must be one of {MATHS}, got {math!r}")
    if math == "fp16":
        from .score.weights import f16_weights

        w = {k: v.astype(np.float64) for k, v in f16_weights(request).items()}
        gamma, beta, G, V, scale = w["gamma"], w["beta"], w["G"], w["V"], 1.0
    else:
        gamma, beta = request.gamma.astype(np.float64), request.beta.astype(np.float64)
        G, V, scale = request.G.astype(np.float64), request.V.astype(np.float64), 1 / np.sqrt(request.d)
    with np.errstate(invalid="ignore", over="ignore"):
        h = np.maximum(gamma * a + beta, 0.0)
        # np.maximum propagates NaN, as the kernel's fmax-free max(x, 0) must too
        if math == "fp16":
            h = h.astype(np.float16).astype(np.float64)
        logits = h @ G.T * scale if math == "fp16" else h @ G.T / np.sqrt(request.d)
        values = h @ V.T
        shifted = logits - logits.max(axis=1, keepdims=True) if logits.size else logits
        ex = np.exp(shifted)
        p = ex / ex.sum(axis=1, keepdims=True)
    order = np.argsort(-logits, axis=1, kind="stable")[:, : request.k_experts]
    chosen = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(chosen, order, True, axis=1)
    return GateResult(logits=logits, p=p, values=values, chosen=chosen)


def score(request: Request, table, bias=None, math: str = "fp32") -> np.ndarray:
    """Float64 scores ``[n]`` of every row of ``table`` (the model of docs/design.md).

    ``score = sum_{e in S} p[e] * dot(V[e], h) + b``, with ``p`` the softmax over all E experts
    (not renormalised over S). NaN in a row gives a NaN score.

    Args:
        request: the request tensors.
        table: an :class:`AdTable` (dequantized rows and its bias) or an ``[n, d]`` float array.
        bias: ``[n]`` biases when ``table`` is an array (None: zeros); ignored for an AdTable.
        math: ``"fp32"`` or ``"fp16"``, the model each math mode computes (:func:`gate`).
    """
    a, b = _rows(table, math)
    if b is None:
        b = np.zeros(a.shape[0]) if bias is None else np.asarray(bias, dtype=np.float64)
    g = gate(request, a, math)
    with np.errstate(invalid="ignore", over="ignore"):
        mixed = np.where(g.chosen, g.p * g.values, 0.0).sum(axis=1)
        # a NaN logit or value anywhere in the row poisons the score, as it does in the kernel
        poisoned = ~np.isfinite(g.p).all(axis=1) | np.isnan(g.values).any(axis=1)
        out = mixed + b
    out[poisoned] = np.nan
    return out


def dot_score(user: np.ndarray, table, bias=None) -> np.ndarray:
    """Float64 two-tower baseline ``dot(u, a) + b`` for every row (``[n]``)."""
    a, b = _rows(table)
    if b is None:
        b = np.zeros(a.shape[0]) if bias is None else np.asarray(bias, dtype=np.float64)
    return a @ np.asarray(user, dtype=np.float64) + b


def topk(scores, k: int, ids=None, eligible=None) -> TopK:
    """Exact top-k by docs/design.md's contract.

    Order: score descending, ties to the lower id; NaN never selected; ineligible never selected;
    fewer than k candidates are padded with id -1 and score -inf.

    Args:
        scores: ``[n]`` float scores (any float dtype; returned scores keep it).
        k: ``k >= 1``.
        ids: ``[n]`` int ids used for output and tie-breaks (default ``0..n-1``).
        eligible: ``[n]`` bool mask (default all).

    Raises:
        ValueError: ``k < 1`` or shapes disagree.
    """
    s = np.asarray(scores)
    if s.ndim != 1:
        raise ValueError(f"scores must be 1-D, got {s.shape}")
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    k = int(k)
    n = s.size
    ids = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
    if ids.shape != (n,):
        raise ValueError(f"ids must be ({n},), got {ids.shape}")
    ok = ~np.isnan(s)
    if eligible is not None:
        eligible = np.asarray(eligible, dtype=bool)
        if eligible.shape != (n,):
            raise ValueError(f"eligible must be ({n},), got {eligible.shape}")
        ok &= eligible
    cand = np.flatnonzero(ok)
    order = cand[np.lexsort((ids[cand], -s[cand].astype(np.float64)))][:k]
    out_ids = np.full(k, -1, dtype=np.int64)
    out_scores = np.full(k, -np.inf, dtype=s.dtype if s.dtype.kind == "f" else np.float64)
    out_ids[: order.size] = ids[order]
    out_scores[: order.size] = s[order]
    return TopK(ids=out_ids, scores=out_scores, count=int(cand.size))


def match(rules: TargetingRules, profile: Mapping[str, frozenset]) -> np.ndarray:
    """Eligible mask ``[n_ads]`` bool, straight from the rule sets (no bitsets involved).

    ``match = live and for all c: (I_c empty or I_c & U_c) and not (X_c & U_c)``.

    Args:
        rules: the pool's rules, in slot order.
        profile: ``{category: frozenset of values}`` from :func:`targeting.make_profile`.
    """
    out = np.zeros(rules.n_ads, dtype=bool)
    for slot, r in enumerate(rules.rules):
        if not r.live:
            continue
        ok = True
        for cat, inc in r.include.items():
            if not (inc & profile.get(cat, frozenset())):
                ok = False
                break
        if ok:
            for cat, exc in r.exclude.items():
                if exc & profile.get(cat, frozenset()):
                    ok = False
                    break
        out[slot] = ok
    return out


def retrieve(request: Request, table: AdTable, k: int, eligible=None) -> TopK:
    """The whole pipeline in float64: score every eligible ad, then exact top-k by ad id."""
    return topk(score(request, table), k, ids=table.ad_ids, eligible=eligible)
