"""Numba host kernels of fp16 weights: a batch's weight images (:func:`andromeda_nb.score.weights.gated_images`):
B stacked gated requests to their float32 images, their fp16 images' sources and their range
checks in one compiled pass.

The same arithmetic as :func:`~andromeda_nb.score.weights.weight_images`,
:func:`~andromeda_nb.score.weights.mma_f16_images` and
:func:`~andromeda_nb.score.launches.out_of_range`; in numpy a request costs some thirty small array
operations (~100 us of host time per request served, more than the device time of its scoring), here
a few microseconds.

:func:`to_f16` is numpy's ``astype(np.float16)`` bit for bit, on every core: numpy converts in
software at ~3 ns a value (10,000 fp16 rows of d = 64: ~2 ms of a live pool's update batch).

Imported inside its wrapper (numba_common first: it fixes the backend before numba is imported).
"""

import math

import numpy as np

from ..targeting import numba_common  # noqa: F401
from numba import njit, prange  # noqa: E402


@njit(cache=True)
def gated_images_kernel(gamma, beta, G, V, max_abs, cg, cb, c0, pad, f16_index, out32, src16, bad32, over16, low16,
                        fp32_safe, fp16_max, fp16_min_normal):
    """Per request ``b`` of ``gamma, beta [B, d]``, ``G, V [B, E, d]`` (float32):

    - ``out32[b]``: the float32 image ``[gamma | beta | G / sqrt(d) | V rows of pitch d + pad]``
      (G / sqrt(d) in float64, rounded once to float32);
    - ``src16[b, i]``: the fp16 bits (uint16) of ``s[f16_index[i]]``, ``s = [G' (8 d) | V (8 d) |
      gamma | beta]`` (experts past E zero): the fp16 image's halves (``src16`` may have 0 rows:
      not built);
    - ``bad32[b]``: a weight is NaN or inf, or ``h <= fp32_safe`` or ``h * max(max_e sum_i |G'[e, i]|,
      max_e sum_i |V[e, i]|) <= fp32_safe`` fails, ``h = max|gamma| max_abs + max|beta|`` (float64);
    - ``over16[b]``: a weight beyond ``fp16_max``, or ``h16 <= fp16_max`` fails, ``h16 = cg max|gamma|
      + cb max|beta| + c0`` the same bound on the values fp16 math holds
      (:func:`~andromeda_nb.score.weights.fp16_encoded_bound`);
    - ``low16[b]``: ``max|gamma|``, ``max|G'|``, ``max|V|`` or ``h`` nonzero below ``fp16_min_normal``
      (:func:`~andromeda_nb.score.weights.fp16_weights_precise` fails).
    """
    B, E, d = G.shape
    sq = math.sqrt(d)
    s = np.zeros(18 * d, np.float32)
    s_bits = s.view(np.uint32)
    n16 = f16_index.size if src16.shape[0] > 0 else 0
    for b in range(B):
        gmax = np.float32(0.0)
        bmax = np.float32(0.0)
        big = False
        finite = True  # a NaN or inf weight refuses the request in every math
        for i in range(d):
            g = gamma[b, i]
            t = beta[b, i]
            out32[b, i] = g
            out32[b, d + i] = t
            s[16 * d + i] = g
            s[17 * d + i] = t
            finite = finite and math.isfinite(g) and math.isfinite(t)
            if abs(g) > gmax:
                gmax = abs(g)
            if abs(t) > bmax:
                bmax = abs(t)
            big = big or abs(g) > fp16_max or abs(t) > fp16_max
        h = np.float64(gmax) * max_abs + np.float64(bmax)
        h16 = cg * np.float64(gmax) + cb * np.float64(bmax) + c0
        keys = 0.0
        vals = 0.0
        kmax = 0.0
        vmax = 0.0
        o = 2 * d
        ov = 2 * d + E * d
        for e in range(E):
            ks = 0.0
            vs = 0.0
            for i in range(d):
                k = np.float32(np.float64(G[b, e, i]) / sq)
                v = V[b, e, i]
                out32[b, o + e * d + i] = k
                out32[b, ov + e * (d + pad) + i] = v
                s[e * d + i] = k
                s[8 * d + e * d + i] = v
                ks += abs(np.float64(k))
                vs += abs(np.float64(v))
                kmax = max(kmax, abs(np.float64(k)))
                vmax = max(vmax, abs(np.float64(v)))
                finite = finite and math.isfinite(k) and math.isfinite(v)
                big = big or abs(k) > fp16_max or abs(v) > fp16_max
            for i in range(pad):
                out32[b, ov + e * (d + pad) + d + i] = 0.0
            if ks > keys:
                keys = ks
            if vs > vals:
                vals = vs
        bad32[b] = not (finite and h <= fp32_safe and h * max(keys, vals) <= fp32_safe)
        over16[b] = big or not (h16 <= fp16_max)
        low16[b] = ((0.0 < gmax < fp16_min_normal) or (0.0 < kmax < fp16_min_normal)
                    or (0.0 < vmax < fp16_min_normal) or (0.0 < h < fp16_min_normal))
        for i in range(n16):
            src16[b, i] = f16_bits(s_bits[f16_index[i]])


@njit(cache=True)
def f16_bits(f):
    """The IEEE half bits (uint16) of the float32 whose bits are ``f`` (uint32), rounded to nearest, ties to even: bit for bit
    numpy's ``astype(np.float16)`` (overflow to inf, subnormals, NaN payloads), which converts in
    software at a few ns a value (a batch of 32 requests' fp16 images: 65,536 values, ~165 us)."""
    f = np.uint32(f)
    sign = np.uint32((f & np.uint32(0x80000000)) >> np.uint32(16))
    f_exp = f & np.uint32(0x7F800000)
    f_sig = f & np.uint32(0x007FFFFF)
    if f_exp >= np.uint32(0x47800000):  # beyond the half range: inf, or NaN keeping its top payload bits
        if f_exp == np.uint32(0x7F800000) and f_sig != 0:
            r = np.uint32(0x7C00) + (f_sig >> np.uint32(13))
            if r == np.uint32(0x7C00):
                r += np.uint32(1)
            return np.uint16(sign + r)
        return np.uint16(sign + np.uint32(0x7C00))
    if f_exp <= np.uint32(0x38000000):  # a half subnormal or zero
        if f_exp < np.uint32(0x33000000):
            return np.uint16(sign)
        e = f_exp >> np.uint32(23)
        sig = (np.uint32(0x00800000) + f_sig) >> (np.uint32(113) - e)
        # ties to even: the bits shifted out of f (up to 11) count as sticky bits
        if (sig & np.uint32(0x3FFF)) != np.uint32(0x1000) or (f & np.uint32(0x7FF)) != 0:
            sig += np.uint32(0x1000)
        return np.uint16(sign + (sig >> np.uint32(13)))
    h_exp = (f_exp - np.uint32(0x38000000)) >> np.uint32(13)
    if (f_sig & np.uint32(0x3FFF)) != np.uint32(0x1000):
        f_sig += np.uint32(0x1000)
    # a carry out of the significand raises the exponent (to inf at the top): the right result
    return np.uint16(sign + ((f_sig >> np.uint32(13)) + h_exp))


@njit(parallel=True, cache=True)
def to_f16(bits32, out16):
    """``out16[i] = f16_bits(bits32[i])`` over flat arrays (uint32 in, uint16 out), in parallel."""
    for i in prange(bits32.size):
        out16[i] = f16_bits(bits32[i])


@njit(parallel=True, cache=True)
def f16_rows(emb, bits32, bias, sets, fp16_max, out16, out_bias):
    """The rows of the ops that set one (``sets[i]``), packed in op order: ``out16`` their half
    bits (:func:`f16_bits`), ``out_bias`` their biases. One pass, every core: the row checks of a
    pool update, its storage and its largest |a| together. ``emb`` float32 ``[k, d]`` and
    ``bits32`` the same memory as uint32. Returns ``(bad, top)``: ``bad`` 0 when every packed value
    is finite and within ``fp16_max`` and no nonzero row packs to zeros (else the caller's slower
    checks name what is wrong; nothing it wrote is used), ``top`` the largest finite |half| as its bits (a half's magnitude orders as
    its bits without the sign)."""
    k, d = emb.shape
    pos = np.empty(k, np.int64)
    c = 0
    for i in range(k):
        pos[i] = c
        c += 1 if sets[i] else 0
    bad = np.zeros(k, np.uint8)
    top = np.zeros(k, np.uint16)
    for i in prange(k):
        if not sets[i]:
            continue
        p = pos[i]
        b = bias[i]
        flag = 0 if np.isfinite(b) else 1
        out_bias[p] = b
        t = np.uint16(0)
        nonzero = False
        for j in range(d):
            x = emb[i, j]
            nonzero = nonzero or x != 0
            if not (abs(x) <= fp16_max):  # NaN too
                flag = 1
            h = f16_bits(bits32[i, j])
            out16[p, j] = h
            m = h & np.uint16(0x7FFF)
            if m < np.uint16(0x7C00) and m > t:
                t = m
        bad[i] = 1 if nonzero and t == 0 else flag  # a nonzero row stored as zeros: from_float names it
        top[i] = t
    return bad.max() if k else np.uint8(0), top.max() if k else np.uint16(0)
