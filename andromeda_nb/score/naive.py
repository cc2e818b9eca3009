"""Fused gather-gate-score kernels (one thread per ad, grid-stride), optionally feeding block top-K.

Per ad (the model of docs/design.md), all in registers: widen the stored row to fp32 (int8: times the row
scale), ``h = max(gamma * a + beta, 0)`` (NaN kept), the E gate logits ``dot(G[e], h)`` (G arrives
pre-scaled by ``1/sqrt(d)``) and the E value dots ``dot(V[e], h)`` in one pass over the row, the
softmax over all E, the top-K experts by logit (ties: lower index) and
``score = sum_{e in S} exp(l_e - max) * val_e / sum_e exp(l_e - max) + b``.

This first version computes all E value dots in the streaming pass (no per-ad ``h`` kept), so its
work per ad is ``2d + 2Ed`` multiply-adds and ``E`` exps; bytes per ad are the row, the bias and
(int8) the scale. The request tensors (G, V, gamma, beta) sit in shared memory; every thread of a
warp reads the same element at once (a broadcast).

Layouts of the ad table (chosen by the host wrapper):
  ``rows``:  ``[n_ads, d]`` row-major (a row is contiguous: good for gathers).
  ``tiles``: ``[d // W, n_ads, W]`` with ``W = 8 / itemsize`` (dim-blocked: for a full scan, each
             warp load reads 32 consecutive ads' 8-byte pieces, 256 contiguous bytes).

Access patterns: ``pool`` scores slots ``0..n-1``; ``bitset`` scores only slots whose bit is set in
the eligible bitset (others are not read; with ``emit_scores`` they get NaN); ``candidates`` scores
the slots listed in an int32 array.
"""

import functools
import math

from numba import cuda, float32, int32, int64

from ..device.bits import WIDEN, relu_keep_nan, test_bit
from ..topk.block import block_topk

ACCESS = ("pool", "bitset", "candidates")
LAYOUTS = ("rows", "tiles")
ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}


def tile_width(dtype: str) -> int:
    """Elements per 8-byte piece in the ``tiles`` layout."""
    return 8 // ITEMSIZE[dtype]


@functools.lru_cache(maxsize=None)
def gated_score_device(d: int, experts: int, k_experts: int, dtype: str, layout: str):
    """Device function ``score_one(table, scale, bias, slot, G, V, gamma, beta) -> float32``.

    ``G``, ``V``: ``[E * d]`` float32 (row e at ``e * d``), G pre-scaled by ``1/sqrt(d)``;
    ``gamma``, ``beta``: ``[d]``. Constants (d, E, K, dtype, layout) are baked in so the expert
    loops unroll and per-expert state stays in registers.
    """
    E, KE = experts, k_experts
    W = tile_width(dtype)
    widen = WIDEN[dtype]
    is_int8 = dtype == "int8"
    tiles = layout == "tiles"

    @cuda.jit(device=True, inline=True)
    def element(table, slot, j):
        if tiles:
            return table[j // W, slot, j % W]
        return table[slot, j]

    @cuda.jit(device=True, inline=True)
    def score_one(table, scale, bias, slot, G, V, gamma, beta):
        logit = cuda.local.array(E, float32)
        val = cuda.local.array(E, float32)
        for e in range(E):
            logit[e] = float32(0.0)
            val[e] = float32(0.0)
        row_scale = scale[slot] if is_int8 else float32(1.0)
        for j in range(d):
            x = widen(element(table, slot, j))
            if is_int8:
                x = x * row_scale
            h = relu_keep_nan(gamma[j] * x + beta[j])
            for e in range(E):
                logit[e] += G[e * d + j] * h
                val[e] += V[e * d + j] * h
        top = logit[0]
        for e in range(1, E):
            if logit[e] > top:
                top = logit[e]
        # choose the KE largest logits, ties to the lower index (strict >), as a bit mask
        taken = 0
        for r in range(KE):
            best = -1
            best_l = float32(0.0)
            for e in range(E):
                if (taken >> e) & 1 == 0:
                    if best < 0 or logit[e] > best_l:
                        best = e
                        best_l = logit[e]
            taken |= 1 << best
        z = float32(0.0)
        mixed = float32(0.0)
        for e in range(E):
            p = math.exp(logit[e] - top)
            z += p
            if (taken >> e) & 1:
                mixed += p * val[e]
        return mixed / z + bias[slot]

    return score_one


@functools.lru_cache(maxsize=None)
def gated_score_kernel(d: int, experts: int, k_experts: int, dtype: str, layout: str,
                       access: str, block: int, topk_cap: int = 0, has_ids: bool = False):
    """The fused kernel for one configuration.

    Launch ``[grid, block]``, 1-D, grid-stride over items (``n_items`` = pool size, or the
    candidate count for ``candidates``). Args, in order::

        table   [n_ads, d] (rows) or [d/W, n_ads, W] (tiles), storage dtype
        scale   float32[n_ads] (int8) or any float32[1]
        bias    float32[n_ads]
        G, V    float32[E*d]; gamma, beta float32[d]
        elig    uint64[ceil(n_ads/64)] (bitset access) or dummy
        cand    int32[n_items] (candidates access) or dummy
        n_items int64
        ids     int64[n_ads] ad ids for top-K tie-breaks (has_ids) or dummy
        k       top-k per block (fused, k <= topk_cap - block; ignored otherwise)
        out     float32[n_items] scores (topk_cap == 0) or dummy
        cand_s  float32[grid*k], cand_i int32[grid*k]: per-block top-k (fused)
        counts  int64[1]: += items scored with a non-NaN score (fused)

    With ``topk_cap > 0`` scores never reach device memory: each block keeps its best ``k``
    (topk/block.py, shared buffer of ``topk_cap`` entries) and writes only those; the merge
    kernel finishes the job.
    """
    score_one = gated_score_device(d, experts, k_experts, dtype, layout)
    acc = ACCESS.index(access)
    fused = topk_cap > 0
    ED = experts * d
    if fused:
        tk = block_topk(topk_cap, block, has_ids)
        init, offer, finish, C = tk.init, tk.offer, tk.finish, tk.C
    else:
        C = 1

    @cuda.jit
    def kernel(table, scale, bias, G, V, gamma, beta, elig, cand, n_items, ids, k, out,
               cand_s, cand_i, counts):
        Gs = cuda.shared.array(ED, float32)
        Vs = cuda.shared.array(ED, float32)
        gs = cuda.shared.array(d, float32)
        bs = cuda.shared.array(d, float32)
        tid = cuda.threadIdx.x
        for t in range(tid, ED, block):
            Gs[t] = G[t]
            Vs[t] = V[t]
        for t in range(tid, d, block):
            gs[t] = gamma[t]
            bs[t] = beta[t]
        buf_s = cuda.shared.array(C, float32)
        buf_i = cuda.shared.array(C, int32)
        st = cuda.shared.array(1, int32)
        thr_s = cuda.shared.array(1, float32)
        thr_i = cuda.shared.array(1, int32)
        n_ok = cuda.shared.array(1, int64)
        if tid == 0:
            n_ok[0] = 0
        cuda.syncthreads()
        if fused:
            init(st, thr_s, thr_i, float32(-math.inf))
        mine = 0
        stride = cuda.gridDim.x * block
        for base in range(cuda.blockIdx.x * block, n_items, stride):
            j = base + tid
            ok = j < n_items
            slot = j
            if ok:
                if acc == 2:
                    slot = int64(cand[j])
                elif acc == 1:
                    ok = test_bit(elig, j) != 0
            s = float32(math.nan)
            if ok:
                s = score_one(table, scale, bias, slot, Gs, Vs, gs, bs)
            if fused:
                if ok and not math.isnan(s):
                    mine += 1
                offer(buf_s, buf_i, st, thr_s, thr_i, s, int32(slot), ok, ids, k, 0)
            elif j < n_items:
                out[j] = s
        if fused:
            cuda.atomic.add(n_ok, 0, mine)
            finish(buf_s, buf_i, st, thr_s, thr_i, ids, cand_s, cand_i, cuda.blockIdx.x * k, k)
            cuda.syncthreads()
            if tid == 0:
                cuda.atomic.add(counts, 0, n_ok[0])

    return kernel
