"""Unfused baselines: the same model, with intermediates written to device memory between kernels.

"per-op" (one kernel per model step; intermediates fp32, dim-major so each warp access is coalesced):

    encode  : row a (storage dtype)              -> h      float32 [d, n]
    gate    : h                                  -> logits float32 [E, n]
    choose  : logits                             -> chosen int8 [K, n], weight float32 [K, n]
              (weight = softmax over all E at the chosen expert, divided by the softmax sum)
    values  : h, chosen                          -> val    float32 [K, n]
    combine : weight, val, bias                  -> score  float32 [n]
    then the standalone block top-K over the scores.

"pre-fusion pipeline" (the source's earlier system): a gather kernel copies the candidates' rows
into a contiguous buffer, the model kernel (score/fused.py in scores mode) scores them and
writes every score, then the standalone top-K. Only the gather lives here.

All kernels: one thread per ad (or per row word), grid-stride; the request tensors are read from
device arrays (G pre-scaled by 1/sqrt(d)).
"""

import functools
import math

from numba import cuda, float32, int8, uint64

from ..device.intrinsics import DECODE, PER_WORD, max_nan


@functools.lru_cache(maxsize=None)
def encode_kernel(d: int, dtype: str, layout: str, gather: bool = False):
    """``words, scale, gamma, beta, n, h[d, n], slots``: h = max(gamma * a + beta, 0) (NaN kept);
    with ``gather``, item i is table slot ``slots[i]`` (int32[n]), else slot i (``slots`` unused)."""
    W = PER_WORD[dtype]
    NW = d // W
    decode = DECODE[dtype]
    is_int8 = dtype == "int8"
    tiles = layout == "tiles"

    @cuda.jit
    def kernel(words, scale, gamma, beta, n, h, slots):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            ui = uint64(slots[i]) if gather else uint64(i)
            rs = scale[ui] if is_int8 else float32(1.0)
            for w in range(NW):
                x = decode(words[w, ui] if tiles else words[ui, w])
                for t in range(W):
                    j = w * W + t
                    h[j, i] = max_nan(x[t] * rs * gamma[j] + beta[j], float32(0.0))

    return kernel


@functools.lru_cache(maxsize=None)
def gate_kernel(d: int, E: int):
    """``h[d, n], G[E*d] (scaled), n, logits[E, n]``."""

    @cuda.jit
    def kernel(h, G, n, logits):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            acc = cuda.local.array(E, float32)
            for e in range(E):
                acc[e] = float32(0.0)
            for j in range(d):
                x = h[j, i]
                for e in range(E):
                    acc[e] += G[e * d + j] * x
            for e in range(E):
                logits[e, i] = acc[e]

    return kernel


@functools.lru_cache(maxsize=None)
def choose_kernel(E: int, K: int):
    """``logits[E, n], n, chosen int8[K, n], weight float32[K, n]``: top-K by logit (ties: lower
    index) and each chosen expert's softmax weight p_e / sum_e' p_e'... stored as p_e / z."""

    @cuda.jit
    def kernel(logits, n, chosen, weight):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            l = cuda.local.array(E, float32)
            for e in range(E):
                l[e] = logits[e, i]
            m = l[0]
            for e in range(1, E):
                if l[e] > m:
                    m = l[e]
            z = float32(0.0)
            for e in range(E):
                z += math.exp(l[e] - m)
            taken = 0
            for r in range(K):
                b = -1
                bl = float32(0.0)
                for e in range(E):
                    if (taken >> e) & 1 == 0 and (b < 0 or l[e] > bl):
                        b = e
                        bl = l[e]
                taken |= 1 << b
                chosen[r, i] = int8(b)
                weight[r, i] = math.exp(bl - m) / z

    return kernel


@functools.lru_cache(maxsize=None)
def values_kernel(d: int, K: int):
    """``h[d, n], V[E*d], chosen[K, n], n, val[K, n]``: val = dot(V[chosen], h)."""

    @cuda.jit
    def kernel(h, V, chosen, n, val):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            for r in range(K):
                base = int(chosen[r, i]) * d
                acc = float32(0.0)
                for j in range(d):
                    acc += V[base + j] * h[j, i]
                val[r, i] = acc

    return kernel


@functools.lru_cache(maxsize=None)
def combine_kernel(K: int, gather: bool = False):
    """``weight[K, n], val[K, n], bias, n, score[n], slots``: score = sum_r weight * val + bias of
    the item's slot (``slots[i]`` with ``gather``, else i)."""

    @cuda.jit
    def kernel(weight, val, bias, n, score, slots):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            acc = float32(0.0)
            for r in range(K):
                acc += weight[r, i] * val[r, i]
            score[i] = acc + bias[slots[i] if gather else i]

    return kernel


@functools.lru_cache(maxsize=None)
def gather_rows_kernel(layout: str):
    """``words, bias, cand, m, out_words[m, NW], out_bias[m]``: copy the listed slots' rows (and
    biases) into a contiguous rows-layout buffer; one thread per (row, word)."""
    tiles = layout == "tiles"

    @cuda.jit
    def kernel(words, bias, cand, m, out_words, out_bias):
        nw = out_words.shape[1]
        total = m * nw
        for t in range(cuda.grid(1), total, cuda.gridsize(1)):
            r = t // nw
            w = t - r * nw
            slot = uint64(cand[r])
            out_words[r, w] = words[w, slot] if tiles else words[slot, w]
            if w == 0:
                out_bias[r] = bias[slot]

    return kernel


@functools.lru_cache(maxsize=None)
def bitset_to_slots_kernel():
    """``words uint64[n_words], slots int32[cap], count int64[1]``: append every set bit's slot
    (order not preserved; top-K breaks ties by ad id, not by position); ``count`` counts them all,
    slots past ``cap`` are not written."""

    @cuda.jit
    def kernel(words, slots, count):
        cap = slots.shape[0]
        for w in range(cuda.grid(1), words.shape[0], cuda.gridsize(1)):
            x = words[w]
            c = cuda.popc(x)
            if c:
                pos = cuda.atomic.add(count, 0, c)
                bit = 0
                while x:
                    if x & uint64(1):
                        if pos < cap:
                            slots[pos] = w * 64 + bit
                        pos += 1
                    x >>= uint64(1)
                    bit += 1

    return kernel


@functools.lru_cache(maxsize=None)
def gather_ids_kernel():
    """``ad_ids int64[n], cand int32[m], m, out int64[m]``: the ad ids of listed slots."""

    @cuda.jit
    def kernel(ad_ids, cand, m, out):
        for i in range(cuda.grid(1), m, cuda.gridsize(1)):
            out[i] = ad_ids[cand[i]]

    return kernel


@functools.lru_cache(maxsize=None)
def zero_kernel():
    """``a int64[n]``: a[:] = 0 (launch [1, 1] for tiny counters)."""

    @cuda.jit
    def kernel(a):
        for i in range(a.shape[0]):
            a[i] = 0

    return kernel
