"""Block top-K: each thread block keeps its best k candidates in shared memory behind a running
threshold; a merge launch reduces the per-block lists to the exact global answer.

Contract (docs/design.md, "Top-K"): score descending, ties to the lower ad id, NaN never
selected, pads of slot -1 / score -inf. Candidates are ``(score float32, slot int32)``; when the
kernel has an ``ids`` array, ties compare ``ids[slot]`` (the ad id), else the slot itself.

Block protocol (every thread of the block calls every step, the same number of times):
``init`` once (optionally with a seed threshold), then per round ``insert`` up to ``items``
candidates per thread (no barrier) and ``round_end`` (two barriers, every round or every
``every`` rounds; compacts when full), or ``offer`` = one insert + round_end; ``finish`` at the
end. The shared buffer holds ``C = next_pow2(k + block * items * every)`` entries; a round appends
at most ``block * items`` candidates
that beat the threshold, and when fewer free entries remain the block sorts the buffer (bitonic, in
shared memory), keeps the best k and raises the threshold to the k-th key. Shared memory: ``8 * C``
bytes. Uses only ``syncthreads`` and shared atomics, so the simulator runs it unchanged.

Whole-array top-K (all batched: a single request is a batch of one; request ``r`` is
``blockIdx.y``): ``scan`` (per-block lists over the request's slice, 8 scores per thread per round,
a running threshold optionally seeded), ``bound`` (the best per-block k-th key: a lower bound of the
request's k-th), ``select`` (entries at or above the bound, appended to a compact buffer) and
``final`` (one block's exact top-k of the compact buffer, ids mapped; the default final is the
radix select of :mod:`~andromeda_nb.topk.final_kernels`). A seeded scan is exact only if at least k
eligible scores reach the seed; ``counts[r, 1]`` says how many did, and the host wrapper reruns
unseeded when it is short. Host side: :mod:`~andromeda_nb.topk.scan`.
"""
from collections import namedtuple

import functools
import math

from numba import cuda, float32, int32, int64

from ..device.bits import test_bit


def next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def buffer_capacity(k: int, block: int, items: int = 1, every: int = 1) -> int:
    """Shared-buffer entries a block needs for top-``k`` with ``block`` threads offering ``items``
    candidates each per round and checking fullness every ``every`` rounds."""
    return next_pow2(k + block * items * every)


BlockTopK = namedtuple("BlockTopK", "init insert round_end offer finish better sort C")


@functools.lru_cache(maxsize=None)
def block_topk(cap: int, block: int, has_ids: bool, items: int = 1, every: int = 1) -> BlockTopK:
    """Device functions for a shared buffer of ``cap`` entries (a power of two, at least
    ``k + block * items * every``; see :func:`buffer_capacity`) and ``block`` threads; ``k`` is a
    runtime argument, so every k of one capacity bucket shares the compiled code. ``C`` is the size
    the kernel must give ``cuda.shared.array``.

    ``every``: rounds between two fullness checks. ``round_end(..., k, rnd)`` takes the round number
    (the same in every thread) and synchronises only when ``rnd % every == every - 1``; the check
    then leaves room for ``every`` more rounds. Between checks threads run ahead independently (no
    barrier per round); inserts read the threshold without a barrier, which is safe because it only
    rises (a stale one admits a few extra candidates)."""
    C = cap
    SLACK = block * items * every

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
    def sort_desc(bs, bi, ids, P):
        """Bitonic sort of the first P entries (P a power of two), best first. Whole block, ends
        synchronised. Pair indices use bit operations (stride is a power of two; a division per
        compare-exchange cost more than the compare-exchange)."""
        tid = cuda.threadIdx.x
        half = P // 2
        size = 2
        while size <= P:
            stride = size // 2
            while stride > 0:
                t = tid
                while t < half:
                    i = ((t & ~(stride - 1)) << 1) | (t & (stride - 1))
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
        """Sort the live entries, keep the best k, raise the threshold. Whole block; entered
        synchronised. Only the live prefix (the next power of two) is sorted."""
        tid = cuda.threadIdx.x
        count = st[0]
        P = 2
        while P < count:
            P *= 2
        t = count + tid
        while t < P:
            bs[t] = -math.inf
            bi[t] = -1
            t += block
        cuda.syncthreads()
        sort_desc(bs, bi, ids, P)
        if tid == 0:
            keep = min(count, k)
            st[0] = keep
            if keep == k:
                thr_s[0] = bs[k - 1]
                thr_i[0] = bi[k - 1]
        cuda.syncthreads()

    @cuda.jit(device=True)
    def init(st, thr_s, thr_i, seed):
        """Empty buffer; threshold (seed, slot -1): only scores >= seed can enter (-inf: all)."""
        if cuda.threadIdx.x == 0:
            st[0] = 0
            thr_s[0] = seed
            thr_i[0] = -1
        cuda.syncthreads()

    @cuda.jit(device=True, inline=True)
    def insert(bs, bi, st, thr_s, thr_i, s, slot, ok, ids):
        """Append ``(s, slot)`` if ``ok``, not NaN and better than the threshold (no barrier)."""
        if ok and not math.isnan(s):
            if better(s, slot, thr_s[0], thr_i[0], ids):
                pos = cuda.atomic.add(st, 0, 1)
                bs[pos] = s
                bi[pos] = slot

    @cuda.jit(device=True)
    def round_end(bs, bi, st, thr_s, thr_i, ids, k, rnd):
        """End of round ``rnd``: every ``every`` rounds, compact when fewer than
        ``block * items * every`` entries are free."""
        if every == 1 or rnd % every == every - 1:
            cuda.syncthreads()
            full = st[0] > C - SLACK
            cuda.syncthreads()
            if full:
                compact(bs, bi, st, thr_s, thr_i, ids, k)

    @cuda.jit(device=True)
    def offer(bs, bi, st, thr_s, thr_i, s, slot, ok, ids, k, rnd):
        """Round ``rnd`` with one candidate per thread: ``insert`` + ``round_end``."""
        insert(bs, bi, st, thr_s, thr_i, s, slot, ok, ids)
        round_end(bs, bi, st, thr_s, thr_i, ids, k, rnd)

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

    return BlockTopK(init, insert, round_end, offer, finish, better, sort_desc, C)


#: scores per thread per round in the scan (8 loads in flight per thread)
SCAN_ITEMS = 8
NEG_INF = float32(-math.inf)


@functools.lru_cache(maxsize=None)
def round_loads(block: int):
    """Inline device functions of a round of SCAN_ITEMS scores per thread (elements ``i0 + q * block``):
    ``load_round(scores, start, i0, n)`` -> the 8 scores (-inf past ``n``), and ``pick(q, s0..s7)``
    -> the q-th of them (an if-chain: indexing a tuple by a loop variable would spill it to local
    memory). Shared by the scan and the filter."""

    @cuda.jit(device=True, inline=True)
    def load_round(scores, start, i0, n):
        return (scores[start + i0] if i0 < n else NEG_INF,
                scores[start + i0 + block] if i0 + block < n else NEG_INF,
                scores[start + i0 + 2 * block] if i0 + 2 * block < n else NEG_INF,
                scores[start + i0 + 3 * block] if i0 + 3 * block < n else NEG_INF,
                scores[start + i0 + 4 * block] if i0 + 4 * block < n else NEG_INF,
                scores[start + i0 + 5 * block] if i0 + 5 * block < n else NEG_INF,
                scores[start + i0 + 6 * block] if i0 + 6 * block < n else NEG_INF,
                scores[start + i0 + 7 * block] if i0 + 7 * block < n else NEG_INF)

    @cuda.jit(device=True, inline=True)
    def pick(q, s0, s1, s2, s3, s4, s5, s6, s7):
        s = s0
        if q == 1:
            s = s1
        elif q == 2:
            s = s2
        elif q == 3:
            s = s3
        elif q == 4:
            s = s4
        elif q == 5:
            s = s5
        elif q == 6:
            s = s6
        elif q == 7:
            s = s7
        return s

    return load_round, pick


@functools.lru_cache(maxsize=None)
def scan_kernel(cap: int, block: int, has_elig: bool, has_ids: bool):
    """Per-block top-k of each request's slice of a score array.

    Launch ``[(blocks_per_request, batch), block]``. Args: ``scores float32[total]``,
    ``offsets int64[batch + 1]`` (request r owns ``scores[offsets[r]:offsets[r+1]]``), ``elig
    uint64[batch, words]`` (bit i of row r = element i of r's slice; ignored unless ``has_elig``),
    ``ids int64[total]`` (tie-break ids, ignored unless ``has_ids``), ``ks int64[batch]``,
    ``kmax``, ``seeds float32[batch]`` (-inf: no seed), ``cand_s float32[batch, bpr * kmax]``,
    ``cand_i int32[...]`` (slots local to the slice, -1 pads), ``counts int64[batch, 2]``
    (+= eligible non-NaN scores; += those >= seed).
    """
    t = block_topk(cap, block, has_ids, SCAN_ITEMS)
    load_round, pick = round_loads(block)

    @cuda.jit
    def kernel(scores, offsets, elig, ids, ks, kmax, seeds, cand_s, cand_i, counts):
        bs = cuda.shared.array(cap, float32)
        bi = cuda.shared.array(cap, int32)
        st = cuda.shared.array(1, int32)
        thr_s = cuda.shared.array(1, float32)
        thr_i = cuda.shared.array(1, int32)
        tally = cuda.shared.array(2, int64)
        r = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        start = offsets[r]
        n = offsets[r + 1] - start
        k = ks[r]
        seed = seeds[r]
        if tid == 0:
            tally[0] = 0
            tally[1] = 0
        t.init(st, thr_s, thr_i, seed)
        mine = 0
        above = 0
        per_round = block * SCAN_ITEMS
        stride = cuda.gridDim.x * per_round
        base = cuda.blockIdx.x * per_round
        # software pipelined: the next round's 8 scores are loaded before this round's inserts and
        # barriers, so their memory latency overlaps the work instead of following it
        s0, s1, s2, s3, s4, s5, s6, s7 = load_round(scores, start, base + tid, n)
        rnd = 0
        while base < n:
            i0 = base + tid
            n0, n1, n2, n3, n4, n5, n6, n7 = load_round(scores, start, i0 + stride, n)
            for q in range(SCAN_ITEMS):
                i = i0 + q * block
                s = pick(q, s0, s1, s2, s3, s4, s5, s6, s7)
                ok = i < n
                if ok and has_elig:
                    ok = test_bit(elig[r], i) != 0
                if ok and not math.isnan(s):
                    mine += 1
                    if s >= seed:
                        above += 1
                t.insert(bs, bi, st, thr_s, thr_i, s, int32(i), ok, ids[start:] if has_ids else ids)
            t.round_end(bs, bi, st, thr_s, thr_i, ids[start:] if has_ids else ids, k, rnd)
            rnd += 1
            s0, s1, s2, s3, s4, s5, s6, s7 = n0, n1, n2, n3, n4, n5, n6, n7
            base += stride
        cuda.atomic.add(tally, 0, mine)
        cuda.atomic.add(tally, 1, above)
        t.finish(bs, bi, st, thr_s, thr_i, ids[start:] if has_ids else ids, cand_s[r], cand_i[r],
                 cuda.blockIdx.x * kmax, k)
        cuda.syncthreads()
        if tid == 0:
            cuda.atomic.add(counts[r], 0, tally[0])
            cuda.atomic.add(counts[r], 1, tally[1])

    return kernel


@functools.lru_cache(maxsize=None)
def bound_kernel(block: int, has_ids: bool):
    """Launch ``[(1, batch), block]``. Args: ``cand_s float32[batch, lists * kmax]``, ``cand_i``,
    ``lists``, ``kmax``, ``ks``, ``offsets``, ``ids``, ``bound_s float32[batch]``, ``bound_i
    int32[batch]``: the best key among each list's k-th entry (pads rank last). Every member of the
    request's top-k ranks at or above it, since that list alone holds k entries at or above it."""
    t = block_topk(next_pow2(2 * block), block, has_ids)

    @cuda.jit
    def kernel(cand_s, cand_i, lists, kmax, ks, offsets, ids, bound_s, bound_i):
        best_s = cuda.shared.array(block, float32)
        best_i = cuda.shared.array(block, int32)
        r = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        k = ks[r]
        sub = ids[offsets[r]:] if has_ids else ids
        bs_ = NEG_INF
        bi_ = int32(-1)
        for b in range(tid, lists, block):
            s = cand_s[r, b * kmax + k - 1]
            i = cand_i[r, b * kmax + k - 1]
            if i >= 0 and t.better(s, i, bs_, bi_, sub):
                bs_ = s
                bi_ = i
        best_s[tid] = bs_
        best_i[tid] = bi_
        cuda.syncthreads()
        h = block // 2
        while h > 0:
            if tid < h and t.better(best_s[tid + h], best_i[tid + h], best_s[tid], best_i[tid], sub):
                best_s[tid] = best_s[tid + h]
                best_i[tid] = best_i[tid + h]
            cuda.syncthreads()
            h //= 2
        if tid == 0:
            bound_s[r] = best_s[0]
            bound_i[r] = best_i[0]

    return kernel


@functools.lru_cache(maxsize=None)
def select_kernel(has_ids: bool):
    """Launch ``[(grid, batch), block]``. Args: ``cand_s, cand_i`` (as for bound), ``m`` entries per
    request, ``kmax``, ``ks``, ``offsets``, ``ids``, ``bound_s, bound_i``, ``buf_s float32[batch, m]``,
    ``buf_i``, ``fill int64[batch]``: append every written entry ranking at or above the bound."""
    t = block_topk(2, 1, has_ids)

    @cuda.jit
    def kernel(cand_s, cand_i, m, kmax, ks, offsets, ids, bound_s, bound_i, buf_s, buf_i, fill):
        r = cuda.blockIdx.y
        sub = ids[offsets[r]:] if has_ids else ids
        b_s = bound_s[r]
        b_i = bound_i[r]
        k = ks[r]
        for j in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, m,
                       cuda.gridDim.x * cuda.blockDim.x):
            if j % kmax >= k:
                continue
            i = cand_i[r, j]
            if i >= 0:
                s = cand_s[r, j]
                if b_i < 0 or not t.better(b_s, b_i, s, i, sub):
                    pos = cuda.atomic.add(fill, r, 1)
                    buf_s[r, pos] = s
                    buf_i[r, pos] = i

    return kernel


@functools.lru_cache(maxsize=None)
def final_kernel(cap: int, block: int, has_ids: bool):
    """Launch ``[(1, batch), block]``: each request's exact top-k of its compact buffer.

    Args: ``buf_s float32[batch, m]``, ``buf_i``, ``fill int64[batch]``, ``offsets``, ``ids``, ``ks``,
    ``out_s float32[batch, kmax]``, ``out_slot int32[...]``, ``out_id int64[...]`` (global ids:
    ``ids[offset + slot]``, or the slot without ids; pads -1 / -inf up to kmax)."""
    t = block_topk(cap, block, has_ids)

    @cuda.jit
    def kernel(buf_s, buf_i, fill, offsets, ids, ks, out_s, out_slot, out_id):
        bs = cuda.shared.array(cap, float32)
        bi = cuda.shared.array(cap, int32)
        st = cuda.shared.array(1, int32)
        thr_s = cuda.shared.array(1, float32)
        thr_i = cuda.shared.array(1, int32)
        r = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        k = ks[r]
        start = offsets[r]
        sub = ids[start:] if has_ids else ids
        m = fill[r]
        t.init(st, thr_s, thr_i, NEG_INF)
        for base in range(0, m, block):
            j = base + tid
            s = float32(math.nan)
            slot = int32(-1)
            if j < m:
                s = buf_s[r, j]
                slot = buf_i[r, j]
            t.offer(bs, bi, st, thr_s, thr_i, s, slot, slot >= 0, sub, k, 0)
        t.finish(bs, bi, st, thr_s, thr_i, sub, out_s[r], out_slot[r], 0, k)
        cuda.syncthreads()
        kmax = out_s.shape[1]
        q = tid
        while q < kmax:
            if q >= k:
                out_s[r, q] = NEG_INF
                out_slot[r, q] = -1
            slot = out_slot[r, q]
            if slot < 0:
                out_id[r, q] = -1
            elif has_ids:
                out_id[r, q] = ids[start + slot]
            else:
                out_id[r, q] = slot
            q += block

    return kernel


@functools.lru_cache(maxsize=None)
def reset_kernel():
    """Launch ``[(1, batch), 32]``: zero ``counts[r, :]`` and ``fill[r]`` (workspace reuse)."""

    @cuda.jit
    def kernel(counts, fill):
        r = cuda.blockIdx.y
        t = cuda.threadIdx.x
        if t < counts.shape[1]:
            counts[r, t] = 0
        if t == 0:
            fill[r] = 0

    return kernel
