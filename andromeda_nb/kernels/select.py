"""Seeded top-K selection: a one-launch histogram seed over a sample, a barrier-free filter pass,
and a final that ranks the few survivors by counting.

One request's top-k over n scores (n >> k), as the host wrapper ``topk.launch_filtered`` chains it:

1. **seed** (:func:`seed_kernel`): the r-th best of a stratified sample, to 24 key bits
   (:func:`~andromeda_nb.kernels.intrinsics.float_key` order), in one launch: a 12-bit histogram
   per block, merged from each block's own r-th best's bin up (the rest cannot matter), then the
   last block to finish picks the global bin and runs the next 12 bits over the candidates in it.
   The seed is that prefix's lower edge, so at least r samples reach it and few more than r do.
   (The earlier seed, a block top-K of the sample, took five launches and 79 us at 10^8 scores.)
2. **filter** (:func:`filter_kernel`): one grid-stride pass, 8-byte loads, no block barrier: a
   score at or above the seed takes a global atomic slot in the candidate buffer (a few thousand
   in all when the seed aims at a small multiple of k).
3. **final** (:func:`final_rank_kernel`): each candidate's place in the contract's order is the
   number of candidates before it, counted by tiles over many blocks; the last block writes the
   first k. More than ``RANK_CAP`` candidates leave the answer to ``topk.final_radix_kernel``,
   launched after it, which exits when the rank final has answered.

Memory order of the last-block pattern (seed and final): each block's global atomics and stores
precede its ``threadfence`` and its ticket increment; the last block then reads them with plain
loads, which no block of the launch cached before (L1 holds nothing of an earlier launch). The
simulator runs blocks one after another, so it exercises the same code with the last block last.
"""

import functools
import math

from numba import cuda, float32, int32, int64, uint32, uint64

from .bits import _f32_from_bits, test_bit
from .intrinsics import decode_fp32, float_key
from .topk import NEG_INF

#: key bits of the seed's histogram levels; two levels fix the top 24 of the 32 key bits
HIST_BITS = 12
HIST_BINS = 1 << HIST_BITS
LOW_SHIFT = 32 - 2 * HIST_BITS
#: int32 slots of the seed's control array: the ticket of the last-block election, the candidate count
CTL_TICKET, CTL_CAND = 0, 1
CTL_SIZE = 2
#: threads of the seed launch on a GPU, and samples a thread takes (loads in flight)
SEED_BLOCK = 1024
SEED_PER_THREAD = 4
#: sample keys the seed's level 1 can take (candidates: each block's samples at or above its own
#: r-th best's bin); more leave the seed at level 0's 12-bit bin edge (lower, still valid)
CAND_CAP = 1 << 16
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


@functools.lru_cache(maxsize=None)
def _block_funcs(block: int):
    """Whole-block histogram helpers for ``block`` threads (a power of two, 32..1024), each thread
    owning HIST_BINS / block consecutive bins (a compile-time count: its loads are unrolled)."""
    PER = HIST_BINS // block

    @cuda.jit(device=True)
    def zero(h):
        base = cuda.threadIdx.x * PER
        for q in range(PER):
            h[base + q] = 0
        cuda.syncthreads()

    @cuda.jit(device=True)
    def pick_from_top(h, need, part, out):
        """The bin of ``h`` (int32[HIST_BINS], shared or global) holding the ``need``-th entry
        counted from the top bin: ``out[0]`` = bin (-1 when fewer than ``need`` entries, or need
        < 1), ``out[1]`` = entries still needed inside it. Entered and left synchronised."""
        tid = cuda.threadIdx.x
        hi = HIST_BINS - tid * PER  # thread 0 owns the top PER bins
        s = 0
        for q in range(PER):
            s += h[hi - 1 - q]
        part[tid] = s
        if tid == 0:
            out[0] = -1
            out[1] = 0
        cuda.syncthreads()
        off = 1  # inclusive prefix over threads in order (top bins first), Hillis-Steele
        while off < block:
            v = part[tid - off] if tid >= off else 0
            cuda.syncthreads()
            part[tid] += v
            cuda.syncthreads()
            off *= 2
        incl = part[tid]
        before = incl - s
        if need >= 1 and before < need <= incl:
            acc = before
            for q in range(PER):
                c = h[hi - 1 - q]
                if acc < need <= acc + c:
                    out[0] = hi - 1 - q
                    out[1] = need - acc
                acc += c
        cuda.syncthreads()

    return zero, pick_from_top


@functools.lru_cache(maxsize=None)
def seed_kernel(block: int, chunk: int, gather: bool, has_elig: bool = False, resets: bool = False):
    """Launch ``[ceil(m / (block * SEED_PER_THREAD)), block]``: the seed of one request's top-k in one
    launch, from a sample of ``m`` scores (``sample float32[m]``).

    ``gather``: the sample is ``chunks`` contiguous runs of ``chunk`` scores of ``scores
    float32[n]``, run j centred in the j-th of ``chunks`` equal strata (``topk.sample_positions``),
    copied into ``sample`` with NaN, and ineligible scores when ``has_elig`` (``elig
    uint64[words]``), as -inf. Otherwise ``sample`` already holds it (fused scoring writes it).

    Level 0: each block histograms its samples' top 12 key bits in shared memory, finds the bin of
    its own r-th best (the global r-th best's bin can only be at or above it: the global count at
    or above any bin is at least the block's), adds its bins from there up to the global histogram
    ``ghist int32[HIST_BINS]`` and appends those samples' keys to ``cand uint32[cap]`` (its few
    best, the only ones the global pick can need). Pruning the lower bins keeps the global
    atomics few (every block adding every bin contended on the populous ones: 37 us for 10^8
    scores' 1 M samples). The last block (ticket in ``ctl int32[CTL_SIZE]``) picks the global bin
    holding the r-th best, then runs level 1 on the candidates in that bin (their next 12 key
    bits, in shared memory) and writes ``seeds[0]``: the lower edge of the 24-bit key prefix of
    the r-th best sample, so at least ``r`` samples reach it (-inf when fewer than ``r`` are
    real; level 0's bin edge when more than ``cap`` candidates were appended). It leaves
    ``ghist``, the candidate count and the ticket zero for the next call. With ``resets``, block
    0 also zeroes ``counts int64[1, c]`` and ``fill int64[1]`` for the filter that follows.
    """
    zero, pick_from_top = _block_funcs(block)
    TOP = uint32(32 - HIST_BITS)

    @cuda.jit(device=True, inline=True)
    def take(scores, n, chunks, sample, elig, idx, m):
        """Sample ``idx``'s key (0: none, or past the sample)."""
        if idx >= m:
            return uint32(0)
        if gather:
            j = idx // chunk
            i = (2 * j + 1) * n // (2 * chunks) - chunk // 2 + idx % chunk  # topk.sample_positions
            s = scores[i]
            if math.isnan(s) or (has_elig and test_bit(elig, i) == 0):
                s = NEG_INF
            sample[idx] = s
        else:
            s = sample[idx]
        return sample_key(s)

    @cuda.jit(device=True, inline=True)
    def offer(cand, ctl, key, low_bin):
        if key != 0 and int32(key >> TOP) >= low_bin:
            pos = cuda.atomic.add(ctl, CTL_CAND, 1)
            if pos < cand.shape[0]:
                cand[pos] = key

    @cuda.jit
    def kernel(scores, n, chunks, sample, elig, r, ghist, cand, ctl, seeds, counts, fill):
        sh = cuda.shared.array(HIST_BINS, int32)
        part = cuda.shared.array(block, int32)
        out = cuda.shared.array(2, int32)
        flag = cuda.shared.array(1, int32)
        tid = cuda.threadIdx.x
        if resets and cuda.blockIdx.x == 0:
            if tid < counts.shape[1]:
                counts[0, tid] = 0
            if tid == 0:
                fill[0] = 0
        zero(sh)
        m = sample.shape[0]
        i0 = cuda.blockIdx.x * block * SEED_PER_THREAD + tid
        k0 = take(scores, n, chunks, sample, elig, i0, m)
        k1 = take(scores, n, chunks, sample, elig, i0 + block, m)
        k2 = take(scores, n, chunks, sample, elig, i0 + 2 * block, m)
        k3 = take(scores, n, chunks, sample, elig, i0 + 3 * block, m)
        for key in (k0, k1, k2, k3):
            if key != 0:
                cuda.atomic.add(sh, int32(key >> TOP), 1)
        cuda.syncthreads()
        # level 0, this block: bins from its own r-th best's up (all of them with fewer than r)
        pick_from_top(sh, r, part, out)
        low_bin = max(out[0], 0)
        b = tid * (HIST_BINS // block)
        for q in range(HIST_BINS // block):
            c = sh[b + q]
            if c and b + q >= low_bin:
                cuda.atomic.add(ghist, b + q, c)
        offer(cand, ctl, k0, low_bin)
        offer(cand, ctl, k1, low_bin)
        offer(cand, ctl, k2, low_bin)
        offer(cand, ctl, k3, low_bin)
        cuda.threadfence()
        cuda.syncthreads()
        if tid == 0:
            t = cuda.atomic.add(ctl, CTL_TICKET, 1)
            flag[0] = 1 if t == cuda.gridDim.x - 1 else 0
        cuda.syncthreads()
        if flag[0] == 0:
            return
        # --- the last block: every block's bins and candidates are in
        pick_from_top(ghist, r, part, out)
        top_bin = out[0]
        need = out[1]
        nc = ctl[CTL_CAND]
        zero(ghist)
        zero(sh)
        if top_bin >= 0 and nc <= cand.shape[0]:  # level 1 over the candidates in that bin
            j = tid
            while j < nc:
                key = cand[j]
                if int32(key >> TOP) == top_bin:
                    cuda.atomic.add(sh, int32((key >> uint32(LOW_SHIFT)) & uint32(HIST_BINS - 1)), 1)
                j += block
            cuda.syncthreads()
            pick_from_top(sh, need, part, out)
        if tid == 0:
            seed = NEG_INF
            if top_bin >= 0:
                key = uint32(top_bin) << TOP
                if nc <= cand.shape[0] and out[0] >= 0:
                    key |= uint32(out[0]) << uint32(LOW_SHIFT)
                seed = key_float(max(key, uint32(KEY_NEG_INF)))
            seeds[0] = seed
            ctl[CTL_CAND] = 0
            ctl[CTL_TICKET] = 0

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
            # uint64(0), not 0: uint64 and int64 unify to float64 in Numba (the low bits lost)
            x1 = words[w0 + block] if w0 + block < nw else uint64(0)
            x2 = words[w0 + 2 * block] if w0 + 2 * block < nw else uint64(0)
            x3 = words[w0 + 3 * block] if w0 + 3 * block < nw else uint64(0)
            x4 = words[w0 + 4 * block] if w0 + 4 * block < nw else uint64(0)
            x5 = words[w0 + 5 * block] if w0 + 5 * block < nw else uint64(0)
            x6 = words[w0 + 6 * block] if w0 + 6 * block < nw else uint64(0)
            x7 = words[w0 + 7 * block] if w0 + 7 * block < nw else uint64(0)
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


#: candidates the rank final takes (c^2 / 2 compares spread over the GPU: 8,192 in ~3 us); more
#: leave the request to the radix select launched after it
RANK_CAP = 8192
#: threads of the rank final's blocks (a tile of candidates per block)
RANK_BLOCK = 256


@functools.lru_cache(maxsize=None)
def final_rank_kernel(block: int, has_ids: bool, cap: int = RANK_CAP):
    """Launch ``[grid, block]`` (any grid; about two blocks per SM): one request's exact top-k of its
    candidate buffer (``buf_s float32[1, cap]``, ``buf_i int32[1, cap]`` slots, ``m = min(fill[0],
    cap)`` entries, no NaN) when ``m <= cap`` (default RANK_CAP), by counting: a candidate's place in the
    contract's order (score descending, ties to the lower id, ``ids[start + slot]`` when
    ``has_ids`` else the slot; -0 ties with +0) is the number of candidates before it, unique
    because ids are. Blocks take (candidate tile, comparison tile) pairs grid-stride and add each
    candidate's partial count to ``rank int32[cap]`` (zero on entry); the last block to
    finish (ticket ``ctl[0]``) writes each candidate whose place is below ``min(k, m)`` there in
    ``out_s / out_slot / out_id [1, kmax]``, pads the rest of the row (-inf, -1, -1) and leaves
    ``rank`` and the ticket zero. More than ``cap`` candidates: every block returns at once and
    ``topk.final_radix_kernel`` (launched after, ``skip_upto = cap``) answers.

    Replaces one block's bitonic sort of the candidates: 60 us for 2,798 of them on the H200,
    issue-bound on its one SM (O(c log^2 c) compare-exchanges of ~100 instructions each)."""

    @cuda.jit(device=True, inline=True)
    def id_of(buf_i, q, ids, start):
        if has_ids:
            return ids[start + buf_i[0, q]]
        return int64(buf_i[0, q])

    @cuda.jit
    def kernel(buf_s, buf_i, fill, offsets, ids, ks, out_s, out_slot, out_id, rank, ctl):
        tile_s = cuda.shared.array(block, float32)
        tile_id = cuda.shared.array(block, int64)
        flag = cuda.shared.array(1, int32)
        tid = cuda.threadIdx.x
        m = min(fill[0], buf_s.shape[1])
        if m > cap:
            return  # uniform: the radix select answers
        start = offsets[0]
        tiles = (m + block - 1) // block
        p = cuda.blockIdx.x
        while p < tiles * tiles:
            i = (p // tiles) * block + tid
            j0 = (p % tiles) * block
            si = NEG_INF
            idi = int64(0)
            if i < m:
                si = buf_s[0, i]
                idi = id_of(buf_i, i, ids, start)
            if j0 + tid < m:
                tile_s[tid] = buf_s[0, j0 + tid]
                tile_id[tid] = id_of(buf_i, j0 + tid, ids, start)
            cuda.syncthreads()
            cnt = 0
            for q in range(min(block, m - j0)):
                sq = tile_s[q]
                cnt += (sq > si) | ((sq == si) & (tile_id[q] < idi))
            if i < m and cnt:
                cuda.atomic.add(rank, i, int32(cnt))
            cuda.syncthreads()  # the tile is overwritten next
            p += cuda.gridDim.x
        cuda.threadfence()
        cuda.syncthreads()
        if tid == 0:
            t = cuda.atomic.add(ctl, 0, 1)
            flag[0] = 1 if t == cuda.gridDim.x - 1 else 0
        cuda.syncthreads()
        if flag[0] == 0:
            return
        kk = min(ks[0], m)
        q = tid
        while q < m:
            place = rank[q]
            rank[q] = 0
            if place < kk:
                out_s[0, place] = buf_s[0, q]
                out_slot[0, place] = buf_i[0, q]
                out_id[0, place] = id_of(buf_i, q, ids, start)
            q += block
        q = kk + tid
        while q < out_s.shape[1]:
            out_s[0, q] = NEG_INF
            out_slot[0, q] = -1
            out_id[0, q] = -1
            q += block
        if tid == 0:
            ctl[0] = 0

    return kernel
