"""Seeded top-K selection: a histogram seed over a sample, a barrier-free filter pass, and a sort
of the few survivors.

One request's top-k over n scores (n >> k), as the host wrapper ``topk.launch_filtered`` chains it:

1. **seed** (:func:`sample_hist_kernel`, then :func:`hist_kernel` level 1): a 12-bit histogram of
   the sample's order-preserving keys (:func:`~andromeda_nb.kernels.intrinsics.float_key`), then a
   12-bit histogram of the next key bits among the samples in the bin holding the sample's r-th
   best: the seed is the lower edge of that 24-bit key prefix, so at least r samples reach it and
   few more than r do. Each launch's blocks merge their shared histograms into a global one; the
   last block to finish (a ticket counter behind ``threadfence``) picks the bin and leaves the
   global histogram zeroed for the next call. Two launches whatever r is (the earlier seed, a
   block top-K of the sample, took five launches and 79 us at 10^8 scores).
2. **filter** (:func:`filter_kernel`): one grid-stride pass, 8-byte loads, no block barrier: a
   score at or above the seed takes a global atomic slot in the candidate buffer (a few thousand
   in all when the seed aims at a small multiple of k).
3. **final** (:func:`final_sort_kernel`): one block sorts up to ``SORT_CAP`` candidates (bitonic in
   shared memory, the contract's order) and writes the first k; more candidates leave the answer
   to ``topk.final_radix_kernel``, launched after it, which exits when the sort has answered.

Memory order of the last-block pattern: each block's global histogram atomics precede its
``threadfence`` and its ticket increment; the last block reads the histogram with plain loads,
which no earlier block of the launch cached (they only ran atomics, performed in L2), and L1 holds
nothing of an earlier launch. The simulator runs blocks one after another, so it exercises the same
code with the last block last.
"""

import functools
import math

from numba import cuda, float32, int32, int64, uint32

from .bits import _f32_from_bits, test_bit
from .intrinsics import decode_fp32, float_key
from .topk import NEG_INF, block_topk

#: key bits a histogram level resolves; two levels fix the top 24 of the 32 key bits
HIST_BITS = 12
HIST_BINS = 1 << HIST_BITS
#: int32 slots of the seed's control array: tickets of the two levels, level 0's bin and what is
#: still needed inside it
CTL_TICKET0, CTL_TICKET1, CTL_BIN, CTL_NEED = 0, 1, 2, 3
CTL_SIZE = 4
#: threads of the histogram launches on a GPU (each zeroes and merges HIST_BINS / block bins); any
#: power of two from 32 to MAX_HIST_BLOCK works (the simulator runs 32)
HIST_BLOCK = 256
MAX_HIST_BLOCK = 1024
#: float_key(-inf): the lowest key of a non-NaN float
KEY_NEG_INF = 0x007FFFFF


@cuda.jit(device=True, inline=True)
def key_float(key):
    """Inverse of ``float_key``: the float32 whose key is ``key`` (uint32)."""
    if key & uint32(0x80000000):
        return _f32_from_bits(key & uint32(0x7FFFFFFF))
    return _f32_from_bits(~key)


@cuda.jit(device=True, inline=True)
def sample_key(s):
    """The key a sampled score counts under, or 0 for a sample that never seeds (NaN, -inf: the
    lowest keys; a NaN's key may be anywhere, so it is tested first)."""
    if math.isnan(s) or s == NEG_INF:
        return uint32(0)
    return float_key(s)


@cuda.jit(device=True)
def _merge_and_elect(sh, ghist, ticket_arr, ticket_at, flag):
    """Whole block: add the block's nonzero shared bins to the global histogram, then take a
    ticket. Returns True in the last block of the launch (every other block's bins are in)."""
    tid = cuda.threadIdx.x
    cuda.syncthreads()
    b = tid
    while b < HIST_BINS:
        c = sh[b]
        if c:
            cuda.atomic.add(ghist, b, c)
        b += cuda.blockDim.x
    cuda.threadfence()
    cuda.syncthreads()
    if tid == 0:
        t = cuda.atomic.add(ticket_arr, ticket_at, 1)
        flag[0] = 1 if t == cuda.gridDim.x - 1 else 0
    cuda.syncthreads()
    return flag[0] == 1


@cuda.jit(device=True)
def _pick_from_top(ghist, need, part, out):
    """Whole block (a power of two of threads, at most MAX_HIST_BLOCK): the bin holding the ``need``-th entry counted from the
    top bin of ``ghist`` (int32[HIST_BINS]): ``out[0]`` = bin (-1 when fewer than ``need`` entries),
    ``out[1]`` = entries still needed inside it. Then zeroes ``ghist`` for the next launch."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    per = HIST_BINS // nt
    hi = HIST_BINS - tid * per  # thread 0 owns the top `per` bins
    s = 0
    for q in range(per):
        s += ghist[hi - 1 - q]
    part[tid] = s
    if tid == 0:
        out[0] = -1
        out[1] = 0
    cuda.syncthreads()
    # inclusive prefix over threads in order (top bins first), Hillis-Steele
    off = 1
    while off < nt:
        v = part[tid - off] if tid >= off else 0
        cuda.syncthreads()
        part[tid] += v
        cuda.syncthreads()
        off *= 2
    incl = part[tid]
    before = incl - s
    if before < need <= incl:
        acc = before
        for q in range(per):
            c = ghist[hi - 1 - q]
            if acc + c >= need:
                out[0] = hi - 1 - q
                out[1] = need - acc
                break
            acc += c
    cuda.syncthreads()
    for q in range(per):
        ghist[hi - 1 - q] = 0
    cuda.syncthreads()


@cuda.jit(device=True)
def _count(sh, key, level, b1):
    """Count a sample key (0: none) in the block's histogram of ``level``."""
    if key == 0:
        return
    if level == 0:
        cuda.atomic.add(sh, int32(key >> uint32(32 - HIST_BITS)), 1)
    elif int32(key >> uint32(32 - HIST_BITS)) == b1:
        cuda.atomic.add(sh, int32((key >> uint32(32 - 2 * HIST_BITS)) & uint32(HIST_BINS - 1)), 1)


@cuda.jit(device=True)
def _finish_level(sh, level, r, ghist, ctl, seeds, part, out, flag):
    """Whole block, after its samples are counted: merge, and in the last block pick the bin
    (level 0: ``ctl[CTL_BIN]``, ``ctl[CTL_NEED]``; level 1: the seed, ``seeds[0]``)."""
    if not _merge_and_elect(sh, ghist, ctl, CTL_TICKET0 + level, flag):
        return
    if level == 0:
        _pick_from_top(ghist, r, part, out)
        if cuda.threadIdx.x == 0:
            ctl[CTL_BIN] = out[0]
            ctl[CTL_NEED] = out[1]
            ctl[CTL_TICKET0] = 0
    else:
        b1 = ctl[CTL_BIN]
        need = ctl[CTL_NEED] if b1 >= 0 else 1
        _pick_from_top(ghist, need, part, out)
        if cuda.threadIdx.x == 0:
            seed = NEG_INF
            if b1 >= 0 and out[0] >= 0:
                key = (uint32(b1) << uint32(32 - HIST_BITS)) | (uint32(out[0]) << uint32(32 - 2 * HIST_BITS))
                seed = key_float(max(key, uint32(KEY_NEG_INF)))
            seeds[0] = seed
            ctl[CTL_TICKET1] = 0


@cuda.jit(device=True)
def _zero(sh):
    b = cuda.threadIdx.x
    while b < HIST_BINS:
        sh[b] = 0
        b += cuda.blockDim.x
    cuda.syncthreads()


@functools.lru_cache(maxsize=None)
def sample_hist_kernel(chunk: int, has_elig: bool = False, resets: bool = False):
    """Launch ``[chunks, block]`` (``block`` a power of two, 32..MAX_HIST_BLOCK): gather the sample and run the seed's level 0 in one launch.

    Block j copies ``chunk`` contiguous scores centred in the j-th of ``chunks`` equal strata of
    ``scores float32[n]`` (``topk.sample_positions``: stratified, so sorted input is sampled over
    its whole range) into ``sample[j * chunk:]``, NaN and, with an eligible bitset ``elig
    uint64[words]``, ineligible scores as -inf (they never seed), and counts their keys' top 12
    bits; the last block picks the bin of the ``r``-th best sample (``ctl``, ``ghist0``: see the
    module docstring). With ``resets``, block 0 also zeroes ``counts int64[1, c]`` and ``fill
    int64[1]`` for the filter that follows.
    """

    @cuda.jit
    def kernel(scores, n, sample, elig, r, ghist0, ctl, counts, fill):
        sh = cuda.shared.array(HIST_BINS, int32)
        part = cuda.shared.array(MAX_HIST_BLOCK, int32)
        out = cuda.shared.array(2, int32)
        flag = cuda.shared.array(1, int32)
        j = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        if resets and j == 0:
            if tid < counts.shape[1]:
                counts[0, tid] = 0
            if tid == 0:
                fill[0] = 0
        _zero(sh)
        chunks = cuda.gridDim.x
        off = (2 * j + 1) * n // (2 * chunks) - chunk // 2  # topk.sample_positions: the same on the host
        t = tid
        while t < chunk:
            i = off + t
            s = scores[i]
            if math.isnan(s) or (has_elig and test_bit(elig, i) == 0):
                s = NEG_INF
            sample[j * chunk + t] = s
            _count(sh, sample_key(s), 0, 0)
            t += cuda.blockDim.x
        _finish_level(sh, 0, r, ghist0, ctl, sample, part, out, flag)

    return kernel


@functools.lru_cache(maxsize=None)
def hist_kernel(level: int):
    """Launch ``[blocks, block]`` (grid-stride; ``block`` as :func:`sample_hist_kernel`'s): one level of the seed over a sample already in
    ``sample float32[m]`` (NaN and -inf never seed). Level 0: the top 12 key bits, the last block
    picks the bin of the ``r``-th best into ``ctl``; level 1: the next 12 bits of the samples in
    that bin, the last block writes the seed to ``seeds float32[1]`` (-inf when fewer than ``r``
    samples are real scores). ``ghist``: that level's global int32[HIST_BINS], zero on entry and
    left zero."""

    @cuda.jit
    def kernel(sample, r, ghist, ctl, seeds):
        sh = cuda.shared.array(HIST_BINS, int32)
        part = cuda.shared.array(MAX_HIST_BLOCK, int32)
        out = cuda.shared.array(2, int32)
        flag = cuda.shared.array(1, int32)
        _zero(sh)
        b1 = ctl[CTL_BIN] if level == 1 else 0
        m = sample.shape[0]
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        stride = cuda.gridDim.x * cuda.blockDim.x
        if level == 0 or b1 >= 0:
            while i < m:
                _count(sh, sample_key(sample[i]), level, b1)
                i += stride
        _finish_level(sh, level, r, ghist, ctl, seeds, part, out, flag)

    return kernel


#: 8-byte loads per thread per round of the filter (16 scores)
FILTER_LOADS = 8


@functools.lru_cache(maxsize=None)
def filter_kernel(block: int, has_elig: bool):
    """Launch ``[grid, block]`` (grid-stride): one pass over ``scores float32[n]`` that appends every
    eligible score at or above ``seeds[0]`` (NaN never is) to ``buf_s float32[1, cap]`` /
    ``buf_i int32[1, cap]`` (slots) through a global atomic on ``fill int64[1]`` (past ``cap``
    counted, not written), and adds to ``counts int64[1, 2]`` the eligible non-NaN scores and
    those kept. ``elig uint64[words]`` is read when ``has_elig``.

    The scores are read as ``words uint64[nw]`` = ``scores[head : head + 2 * nw]`` (two scores an
    8-byte load: ``head`` is 1 when ``scores`` starts 4 bytes past an 8-byte boundary), 8 loads in
    flight a thread; block 0 takes the odd score before and after them.

    No barrier in the loop: the kept scores are few (the seed aims at a small multiple of k), so a
    global atomic each costs less than a block-wide staging step every round (the earlier filter,
    two barriers a round: 155 us at 10^8 scores, 0.57 of the read ceiling)."""

    @cuda.jit(device=True, inline=True)
    def one(s, i, seed, elig, buf_s, buf_i, fill, cap):
        """Returns (eligible non-NaN, kept) for score ``s`` at index ``i``."""
        if has_elig and test_bit(elig, i) == 0:
            return 0, 0
        if s >= seed:
            pos = cuda.atomic.add(fill, 0, 1)
            if pos < cap:
                buf_s[0, pos] = s
                buf_i[0, pos] = int32(i)
            return 1, 1
        return (0 if math.isnan(s) else 1), 0

    @cuda.jit
    def kernel(words, scores, n, head, elig, seeds, buf_s, buf_i, fill, counts):
        red = cuda.shared.array(2, int32)  # block totals (32-bit shared atomics)
        tid = cuda.threadIdx.x
        if tid == 0:
            red[0] = 0
            red[1] = 0
        cuda.syncthreads()
        seed = seeds[0]
        cap = buf_s.shape[1]
        nw = words.shape[0]
        mine = 0
        kept = 0
        per_round = block * FILTER_LOADS
        w0 = cuda.blockIdx.x * per_round + tid
        stride = cuda.gridDim.x * per_round
        while w0 < nw:
            x0 = words[w0]
            x1 = words[w0 + block] if w0 + block < nw else 0
            x2 = words[w0 + 2 * block] if w0 + 2 * block < nw else 0
            x3 = words[w0 + 3 * block] if w0 + 3 * block < nw else 0
            x4 = words[w0 + 4 * block] if w0 + 4 * block < nw else 0
            x5 = words[w0 + 5 * block] if w0 + 5 * block < nw else 0
            x6 = words[w0 + 6 * block] if w0 + 6 * block < nw else 0
            x7 = words[w0 + 7 * block] if w0 + 7 * block < nw else 0
            for q in range(FILTER_LOADS):
                w = w0 + q * block
                x = (x0 if q == 0 else x1 if q == 1 else x2 if q == 2 else x3 if q == 3 else
                     x4 if q == 4 else x5 if q == 5 else x6 if q == 6 else x7)
                if w < nw:
                    a, b = decode_fp32(x)
                    i = head + 2 * w
                    e0, k0 = one(a, i, seed, elig, buf_s, buf_i, fill, cap)
                    e1, k1 = one(b, i + 1, seed, elig, buf_s, buf_i, fill, cap)
                    mine += e0 + e1
                    kept += k0 + k1
            w0 += stride
        if cuda.blockIdx.x == 0 and tid == 0:  # the odd scores before and after the words
            if head == 1:
                e, kk = one(scores[0], 0, seed, elig, buf_s, buf_i, fill, cap)
                mine += e
                kept += kk
            last = head + 2 * nw
            if last < n:
                e, kk = one(scores[last], last, seed, elig, buf_s, buf_i, fill, cap)
                mine += e
                kept += kk
        if mine:
            cuda.atomic.add(red, 0, int32(mine))
        if kept:
            cuda.atomic.add(red, 1, int32(kept))
        cuda.syncthreads()
        if tid == 0:
            if red[0]:
                cuda.atomic.add(counts[0], 0, int64(red[0]))
            if red[1]:
                cuda.atomic.add(counts[0], 1, int64(red[1]))

    return kernel


#: candidates the sort final takes (next power of two of them, 8 bytes each, in shared memory:
#: 32 KiB at 4096)
SORT_CAP = 4096
#: threads of the sort final (one block; the more, the fewer compare-exchanges each per step)
SORT_BLOCK = 1024


@functools.lru_cache(maxsize=None)
def final_sort_kernel(block: int, has_ids: bool, cap: int = SORT_CAP):
    """Launch ``[(1, batch), block]``: request r's exact top-k of its candidate buffer when it holds
    at most ``cap`` entries (``m = min(fill[r], buf_s.shape[1])``): one bitonic sort of them in
    shared memory by the contract's order (score descending, ties to the lower id: ``ids[start +
    slot]`` when ``has_ids``, else the slot; -0 ties with +0), the first ``min(k, m)`` written to
    ``out_s / out_slot / out_id [batch, kmax]`` and the rest of each row padded (-inf, -1, -1).
    More than ``cap`` entries: the block writes nothing and leaves the request to
    ``topk.final_radix_kernel`` (same arguments), launched after it, which skips the requests this
    kernel answered (``skip_below = cap + 1``). Arguments as ``final_radix_kernel``."""
    t = block_topk(cap, block, has_ids)

    @cuda.jit
    def kernel(buf_s, buf_i, fill, offsets, ids, ks, out_s, out_slot, out_id):
        bs = cuda.shared.array(cap, float32)
        bi = cuda.shared.array(cap, int32)
        r = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        m = min(fill[r], buf_s.shape[1])
        if m > cap:
            return  # uniform: the radix select answers this request
        start = offsets[r]
        sub = ids[start:] if has_ids else ids
        P = 2
        while P < m:
            P *= 2
        q = tid
        while q < P:
            if q < m:
                bs[q] = buf_s[r, q]
                bi[q] = buf_i[r, q]
            else:
                bs[q] = NEG_INF
                bi[q] = -1
            q += block
        cuda.syncthreads()
        t.sort(bs, bi, sub, P)
        kk = min(ks[r], m)
        q = tid
        while q < out_s.shape[1]:
            if q < kk:
                out_s[r, q] = bs[q]
                out_slot[r, q] = bi[q]
                out_id[r, q] = sub[bi[q]] if has_ids else bi[q]
            else:
                out_s[r, q] = NEG_INF
                out_slot[r, q] = -1
                out_id[r, q] = -1
            q += block

    return kernel
