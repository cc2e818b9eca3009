"""Block top-K: each thread block keeps its best k candidates in shared memory behind a running
threshold; a merge launch reduces the per-block lists to the exact global answer.

Contract (DESIGN.md, "Top-K semantics"): score descending, ties to the lower ad id, NaN never
selected, pads of slot -1 / score -inf. Candidates are ``(score float32, slot int32)``; when the
kernel has an ``ids`` array, ties compare ``ids[slot]`` (the ad id), else the slot itself.

Block protocol (every thread of the block calls every step, the same number of times):
``init`` once, ``offer`` once per round (one candidate per thread, ``ok=False`` for none), ``finish``
at the end. The shared buffer holds ``C = next_pow2(k + block)`` entries; a round appends at most
``block`` candidates that beat the threshold, and when fewer than ``block`` free entries remain the
block sorts the buffer (bitonic, in shared memory), keeps the best k and raises the threshold to the
k-th score. Shared memory: ``8 * C`` bytes (k = 2048 with 256 threads: 32 KiB). Uses only
``syncthreads`` and shared atomics, so the simulator runs it unchanged.
"""

import functools
import math

from numba import cuda, float32, int32, int64

from .bits import test_bit


def next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def buffer_capacity(k: int, block: int) -> int:
    """Shared-buffer entries a block needs for top-``k`` with ``block`` threads."""
    return next_pow2(k + block)


@functools.lru_cache(maxsize=None)
def block_topk(cap: int, block: int, has_ids: bool):
    """Device functions ``(init, offer, finish)`` for a shared buffer of ``cap`` entries (a power of
    two, at least ``k + block``; see :func:`buffer_capacity`) and ``block`` threads; ``k`` is a
    runtime argument, so every k of one capacity bucket shares the compiled code. Also returns
    ``cap`` (the size the kernel must give ``cuda.shared.array``)."""
    C = cap
    HALF = C // 2

    @cuda.jit(device=True, inline=True)
    def better(s1, i1, s2, i2, ids):
        """(s1, i1) ranks before (s2, i2): higher score, then lower id; slot -1 ranks last."""
        if s1 != s2:
            return s1 > s2
        if i2 < 0:
            return i1 >= 0
        if i1 < 0:
            return False
        if has_ids:
            return ids[i1] < ids[i2]
        return i1 < i2

    @cuda.jit(device=True)
    def sort_desc(bs, bi, ids):
        """Bitonic sort of the C entries, best first. Whole block, ends synchronised."""
        tid = cuda.threadIdx.x
        size = 2
        while size <= C:
            stride = size // 2
            while stride > 0:
                t = tid
                while t < HALF:
                    i = 2 * stride * (t // stride) + (t % stride)
                    j = i + stride
                    best_first = (i & size) == 0
                    if better(bs[j], bi[j], bs[i], bi[i], ids) == best_first:
                        ts = bs[i]
                        bs[i] = bs[j]
                        bs[j] = ts
                        ti = bi[i]
                        bi[i] = bi[j]
                        bi[j] = ti
                    t += block
                cuda.syncthreads()
                stride //= 2
            size *= 2

    @cuda.jit(device=True)
    def compact(bs, bi, st, thr_s, thr_i, ids, k):
        """Sort, keep the best k, raise the threshold. Whole block; entered synchronised."""
        tid = cuda.threadIdx.x
        count = st[0]
        t = count + tid
        while t < C:
            bs[t] = -math.inf
            bi[t] = -1
            t += block
        cuda.syncthreads()
        sort_desc(bs, bi, ids)
        if tid == 0:
            keep = min(count, k)
            st[0] = keep
            if keep == k:
                thr_s[0] = bs[k - 1]
                thr_i[0] = bi[k - 1]
        cuda.syncthreads()

    @cuda.jit(device=True)
    def init(st, thr_s, thr_i):
        if cuda.threadIdx.x == 0:
            st[0] = 0
            thr_s[0] = -math.inf
            thr_i[0] = -1
        cuda.syncthreads()

    @cuda.jit(device=True)
    def offer(bs, bi, st, thr_s, thr_i, s, slot, ok, ids, k):
        """One round: this thread's candidate ``(s, slot)`` if ``ok`` (NaN is dropped here)."""
        if ok and not math.isnan(s):
            if better(s, slot, thr_s[0], thr_i[0], ids):
                pos = cuda.atomic.add(st, 0, 1)
                bs[pos] = s
                bi[pos] = slot
        cuda.syncthreads()
        full = st[0] > C - block
        cuda.syncthreads()
        if full:
            compact(bs, bi, st, thr_s, thr_i, ids, k)

    @cuda.jit(device=True)
    def finish(bs, bi, st, thr_s, thr_i, ids, out_s, out_i, base, k):
        """Write the block's best k, sorted, to ``out_s/out_i[base : base + k]`` (pads: -inf, -1)."""
        cuda.syncthreads()
        compact(bs, bi, st, thr_s, thr_i, ids, k)
        count = st[0]
        t = cuda.threadIdx.x
        while t < k:
            if t < count:
                out_s[base + t] = bs[t]
                out_i[base + t] = bi[t]
            else:
                out_s[base + t] = -math.inf
                out_i[base + t] = -1
            t += block

    return init, offer, finish, C


@functools.lru_cache(maxsize=None)
def topk_scores_kernel(cap: int, block: int, has_elig: bool, has_ids: bool):
    """Standalone pass 1: per-block top-k of a score array (k <= cap - block, a runtime argument).

    Launch: ``[grid, block]``, 1-D. Args: ``scores float32[n]``, ``elig uint64[ceil(n/64)]``
    (ignored unless ``has_elig``), ``ids int64[n]`` (tie-break ids, ignored unless ``has_ids``),
    ``n``, ``k``, ``cand_s float32[grid*k]``, ``cand_i int32[grid*k]`` (slots, -1 pads),
    ``counts int64[1]`` (atomically += eligible non-NaN scores).
    """
    init, offer, finish, C = block_topk(cap, block, has_ids)

    @cuda.jit
    def kernel(scores, elig, ids, n, k, cand_s, cand_i, counts):
        bs = cuda.shared.array(C, float32)
        bi = cuda.shared.array(C, int32)
        st = cuda.shared.array(1, int32)
        thr_s = cuda.shared.array(1, float32)
        thr_i = cuda.shared.array(1, int32)
        n_ok = cuda.shared.array(1, int64)
        tid = cuda.threadIdx.x
        if tid == 0:
            n_ok[0] = 0
        init(st, thr_s, thr_i)
        mine = 0
        stride = cuda.gridDim.x * block
        for base in range(cuda.blockIdx.x * block, n, stride):
            i = base + tid
            ok = i < n
            s = float32(math.nan)
            if ok:
                if has_elig:
                    ok = test_bit(elig, i) != 0
                s = scores[i]
            if ok and not math.isnan(s):
                mine += 1
            offer(bs, bi, st, thr_s, thr_i, s, int32(i), ok, ids, k)
        cuda.atomic.add(n_ok, 0, mine)
        finish(bs, bi, st, thr_s, thr_i, ids, cand_s, cand_i, cuda.blockIdx.x * k, k)
        cuda.syncthreads()
        if tid == 0:
            cuda.atomic.add(counts, 0, n_ok[0])

    return kernel


@functools.lru_cache(maxsize=None)
def merge_kernel(cap: int, block: int, has_ids: bool):
    """Merge pass: block ``b`` reduces candidates ``[b*seg, min(m, (b+1)*seg))`` to its exact top-k.

    Launch ``[ceil(m / seg), block]``. Args: ``cand_s float32[m]``, ``cand_i int32[m]`` (slots,
    -1 = empty), ``m``, ``seg``, ``k`` (<= cap - block), ``ids int64[n]``, ``out_s float32[grid*k]``,
    ``out_slot int32[grid*k]``, ``out_id int64[grid*k]`` (written only when ``final``: ``ids[slot]``
    or the slot without ids, -1 pads), ``final`` (int). A tree of these launches ends in one block.
    """
    init, offer, finish, C = block_topk(cap, block, has_ids)

    @cuda.jit
    def kernel(cand_s, cand_i, m, seg, k, ids, out_s, out_slot, out_id, final):
        bs = cuda.shared.array(C, float32)
        bi = cuda.shared.array(C, int32)
        st = cuda.shared.array(1, int32)
        thr_s = cuda.shared.array(1, float32)
        thr_i = cuda.shared.array(1, int32)
        init(st, thr_s, thr_i)
        tid = cuda.threadIdx.x
        start = cuda.blockIdx.x * seg
        stop = min(m, start + seg)
        for base in range(start, stop, block):
            j = base + tid
            s = float32(math.nan)
            slot = int32(-1)
            if j < stop:
                s = cand_s[j]
                slot = cand_i[j]
            offer(bs, bi, st, thr_s, thr_i, s, slot, slot >= 0, ids, k)
        out_base = cuda.blockIdx.x * k
        finish(bs, bi, st, thr_s, thr_i, ids, out_s, out_slot, out_base, k)
        if final:
            t = tid
            while t < k:
                slot = out_slot[out_base + t]
                if slot < 0:
                    out_id[out_base + t] = -1
                elif has_ids:
                    out_id[out_base + t] = ids[slot]
                else:
                    out_id[out_base + t] = slot
                t += block

    return kernel
