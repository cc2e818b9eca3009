"""Kernels of the request path between the match and the final top-K (:class:`.pool.Pool`).

A batch of B requests, request ``b = blockIdx.y`` (or ``blockIdx.x`` for a block a request):

1. :func:`reset_kernel` zeroes each request's candidate count;
2. :func:`gather_candidates_kernel` turns each request's eligible bitset into a list of its
   eligible slots (any order: ties break on the ad id, not the position), so the scoring pass
   moves only the eligible rows and runs dense (scoring a bitset position by position, or tile by
   tile, leaves most threads idle at 1 % eligible);
3. the generated kernel scores a sample of each list (:func:`~andromeda_nb.score.fused.fused_kernel`,
   ``batched=True, sample=M``);
4. :func:`pool_seed_kernel` takes each request's seed, the r-th best sample, with r chosen from
   the request's own candidate count on the device (no host round trip), and zeroes the request's
   filter counters;
5. the generated filter pass (``batched=True, seed_filter=True``) and the top-K final follow.
"""

from __future__ import annotations

import functools

from numba import cuda, float32, int32, int64, uint32, uint64

from ..device.scan import block_exclusive_sum
from ..score.table_kernels import scale_pair
from ..topk.seed_kernels import SEED_RADIX, _batch_seed_funcs

#: ``row_of`` of a slot an update freed (:func:`scatter_slots_kernel`)
FREED = -2
#: threads of the candidate gather, and the bitset words each thread reads per tile
GATHER_BLOCK = 256
GATHER_WORDS = 8


@functools.lru_cache(maxsize=None)
def reset_kernel():
    """Launch ``[1, block]``: for ``b < B``, ``count[b] = 0`` (the candidate gather's counter) and
    ``ks[b] = k`` (the final's k of each request)."""

    @cuda.jit
    def kernel(count, ks, B, k):
        b = cuda.threadIdx.x
        while b < B:
            count[b] = 0
            ks[b] = k
            b += cuda.blockDim.x

    return kernel


@functools.lru_cache(maxsize=None)
def gather_candidates_kernel(block: int, words: int = GATHER_WORDS):
    """Launch ``[(grid, B), block]`` (grid-stride over tiles of ``block * words`` bitset words):
    request ``b``'s eligible slots (``bits uint64[>= B, >= n_words]``, padding bits past the pool
    clear) appended to ``cand int32[>= B, cap]`` in any order; ``count int64[>= B]`` (zero before
    the launch) ends as the request's eligible count, entries past ``cap`` not written.

    Per tile: thread ``t`` loads words ``tile + u * block + t`` (``u < words``: a warp reads 256
    contiguous bytes a load, ``words`` loads in flight), a block-wide prefix sum of the threads'
    set-bit counts gives each thread its output offset, one global atomic reserves the tile's
    slots. The scan's totals and the reserved base are double-buffered by tile parity, so a tile
    costs two barriers (the scan's and the base's)."""
    scan = block_exclusive_sum(block)

    @cuda.jit
    def kernel(bits, n_words, cand, count):
        b = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array((2, block), int32)
        base = cuda.shared.array(2, int64)
        mine = cuda.local.array(words, uint64)
        cap = cand.shape[1]
        tile = block * words
        parity = 0
        for w0 in range(cuda.blockIdx.x * tile, n_words, cuda.gridDim.x * tile):
            n = int32(0)
            for u in range(words):
                w = w0 + u * block + tid
                mine[u] = bits[b, w] if w < n_words else uint64(0)
            for u in range(words):
                n += int32(cuda.popc(mine[u]))
            before, total = scan(n, scratch[parity])
            if tid == 0:
                base[parity] = cuda.atomic.add(count, b, int64(total))
            cuda.syncthreads()
            pos = base[parity] + int64(before)
            for u in range(words):
                word = mine[u]
                w = int64(w0 + u * block + tid)
                while word != 0:
                    low = word & (~word + uint64(1))  # the lowest set bit
                    if pos < cap:
                        cand[b, pos] = int32(w * 64 + int64(cuda.popc(low - uint64(1))))
                    pos += 1
                    word ^= low
            parity ^= 1

    return kernel


@functools.lru_cache(maxsize=None)
def pool_seed_kernel(block: int, per_thread: int, margin_x2: int, min_rank: int):
    """Launch ``[B, block]``, a block a request: ``seeds[b]``, the threshold of request b's filter
    pass, from the ``sample = block * per_thread`` scores of its candidates in
    ``scores float32[B * sample]``
    (``offsets int64[B + 1] = b * sample``; NaN for positions past the request's candidates).

    With ``n = min(count[b], cand_cap)`` candidates and top-``k``: a request of at most ``sample``
    candidates is sampled whole, seeded at rank k (a lower bound of its k-th best); a larger one at
    ``r = max(min_rank, ceil(margin_x2 * k * sample / (2 n)))`` (about ``margin_x2 / 2 * k``
    candidates reach it), or -inf (keep every candidate) once ``r > sample / 4``. ``ranks
    int64[B]`` receives r (the seed reads it back). The request's filter counters are zeroed
    (``counts int64[B, 2]``, ``fill int64[B]``)."""
    request_seed = _batch_seed_funcs(block, per_thread, 32, False, margin_x2, min_rank)
    sample = block * per_thread
    neg_inf = float("-inf")

    @cuda.jit
    def kernel(scores, offsets, count, cand_cap, k, ranks, seeds, counts, fill):
        sh = cuda.shared.array(SEED_RADIX, int32)
        part = cuda.shared.array(block, int32)
        out = cuda.shared.array(2, int32)
        keys = cuda.local.array(per_thread, uint32)
        q = cuda.blockIdx.x
        n = min(count[q], cand_cap)
        if n <= sample:
            r = int64(k)
        else:
            r = max(int64(min_rank), (int64(margin_x2) * k * sample + 2 * n - 1) // (2 * n))
        if cuda.threadIdx.x == 0:
            counts[q, 0] = 0
            counts[q, 1] = 0
            fill[q] = 0
            ranks[q] = r
        cuda.syncthreads()  # ranks[q] is read below by every thread
        if n > sample and r > sample // 4:  # uniform: the sample decides little
            seed = neg_inf
        else:
            seed = request_seed(scores, offsets, ranks, scores, q, sh, part, out, keys)
        if cuda.threadIdx.x == 0:
            seeds[q] = seed

    return kernel


@functools.lru_cache(maxsize=None)
def scatter_slots_kernel(tiles: bool):
    """A live pool's table update (:meth:`~andromeda_nb.pipeline.Pool.apply`): entry ``j`` writes
    ``ad_ids[slots[j]] = new_ids[j]`` and, where ``row_of[j] >= 0``, row ``row_of[j]`` of
    ``new_words`` (uint64, ``n_w`` words a row, flat), its bias and its int8 scale into that slot;
    ``row_of[j] == FREED`` zeroes the slot's row, bias and scale (a free slot holds nothing a
    reduction over the table could see); ``-1`` keeps them. ``n_w`` is the table's words a row.
    Launch a thread per (entry, word), no grid-stride: thread ``t`` handles entry ``t // n_w``,
    word ``t % n_w``. ``tiles``: the table's words are ``[n_w, n_ads]``, else ``[n_ads, n_w]``.
    Every argument is a flat array or the table's own (a bound launch points them at a batch's
    staging buffer)."""

    @cuda.jit
    def kernel(words, bias, scale, ad_ids, slots, new_ids, row_of, new_words, new_bias, new_scale, has_scale,
               pairs, has_pairs):
        n_w = words.shape[0] if tiles else words.shape[1]
        t = cuda.grid(1)
        j = t // n_w
        w = t - j * n_w
        if j >= slots.shape[0]:
            return
        s = slots[j]
        r = row_of[j]
        if r >= 0 or r == FREED:
            x = new_words[r * n_w + w] if r >= 0 else uint64(0)
            if tiles:
                words[w, s] = x
            else:
                words[s, w] = x
        if w == 0:
            ad_ids[s] = new_ids[j]
            if r >= 0 or r == FREED:
                bias[s] = new_bias[r] if r >= 0 else float32(0)
                if has_scale:
                    v = new_scale[r] if r >= 0 else float32(0)
                    scale[s] = v
                    if has_pairs:
                        pairs[s] = scale_pair(v)

    return kernel
