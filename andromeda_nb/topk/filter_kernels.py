"""The filter pass: one pass over each request's scores keeping the eligible ones at or above its
seed in a compact candidate buffer (host side :mod:`~andromeda_nb.topk.filter`).

One grid-stride pass, 8-byte loads, no block barrier in the loop: a kept score is staged in shared
memory (a shared atomic), and each block takes its slots in the candidate buffer with one global
atomic at its end (a few thousand candidates in all when the seed aims at a small multiple of k).
"""

import functools
import math

from numba import cuda, float32, int32, int64, uint64
from numba.cuda.core import config as numba_config

from ..device.intrinsics import decode_fp32, max_nan
from .config import DEFAULT_CONFIG

#: 32-bit registers of an SM (H100 / H200), the most a block's threads can share
REGISTER_FILE = 65536
#: 8-byte loads per thread per round of the filter (16 scores)
FILTER_LOADS = 8


@functools.lru_cache(maxsize=None)
def _filter_funcs(block: int, has_elig: bool, stage: int):
    """The filter pass's device function ``stream(...)``: one block's share of one request's pass
    (see :func:`filter_kernel`; ``stage`` its shared stage's entries)."""
    NEG = float32(-math.inf)
    ONE = uint64(1)

    @cuda.jit(device=True, inline=True)
    def keep(s, i, q, st_s, st_i, st_n, buf_s, buf_i, fill, cap):
        """Stage a kept score in shared memory (a shared atomic: the warp goes on at once); past
        the stage's entries, straight to the buffer (a global atomic)."""
        p = cuda.atomic.add(st_n, 0, int32(1))
        if p < stage:
            st_s[p] = s
            st_i[p] = int32(i)
        else:
            pos = cuda.atomic.add(fill, q, 1)
            if pos < cap:
                buf_s[q, pos] = s
                buf_i[q, pos] = int32(i)

    @cuda.jit(device=True, inline=True)
    def pair(x, i, q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap):
        """Local scores ``i``, ``i + 1`` of request ``q`` in word ``x``: returns (eligible among
        them, NaN among the eligible, kept)."""
        a, b = decode_fp32(x)
        ea = int32(1)
        eb = int32(1)
        if has_elig:
            bits = elig[i >> uint64(6)] >> (i & uint64(63))
            ea = int32(bits & ONE)
            eb = int32((bits >> ONE) & ONE)
            if (i & uint64(63)) == uint64(63):  # the pair straddles two bitset words
                eb = int32(elig[(i + ONE) >> uint64(6)] & ONE)
            if ea == 0:
                a = NEG
            if eb == 0:
                b = NEG
        nan = int32(0)
        kept = int32(0)
        if not (max_nan(a, b) < seed):  # rare: a NaN, or a score at or above the seed
            if math.isnan(a):
                nan += ea
            elif ea and a >= seed:  # an ineligible score is -inf here, and the seed may be -inf
                keep(a, i, q, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
                kept += 1
            if math.isnan(b):
                nan += eb
            elif eb and b >= seed:
                keep(b, i + ONE, q, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
                kept += 1
        return ea + eb, nan, kept

    @cuda.jit(device=True, inline=True)
    def pair_if(ok, x, i, q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap):
        """:func:`pair` for a word of the partial round, nothing when ``ok`` is false (past the end)."""
        if ok:
            return pair(x, i, q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
        return int32(0), int32(0), int32(0)

    @cuda.jit(device=True, inline=True)
    def single(scores, g, i, q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap):
        """Global score ``g`` (local ``i``) outside the words: returns (eligible, NaN among the
        eligible, kept)."""
        s = scores[g]
        if has_elig and (elig[i >> uint64(6)] >> (i & uint64(63))) & ONE == uint64(0):
            return int32(0), int32(0), int32(0)
        if math.isnan(s):
            return int32(1), int32(1), int32(0)
        if s >= seed:
            keep(s, i, q, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
            return int32(1), int32(0), int32(1)
        return int32(1), int32(0), int32(0)

    @cuda.jit(device=True, inline=True)
    def stream(words, scores, head, q, start, end, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap, bx, gxn):
        """Block ``bx`` of ``gxn`` over request ``q``'s scores ``[start, end)`` (uint64): its share of
        the pass; returns this thread's (eligible, NaN among them, kept). ``elig``: the batch's
        bitsets ``[batch, words]``; the pass reads row q (a 1-D view: no 2-D index arithmetic a
        pair)."""
        tid = cuda.threadIdx.x
        elig = elig[q] if has_elig else elig[0]  # without a bitset, the 1 x 1 stand-in's row
        h = uint64(head)
        # the words wholly inside [start, end): global scores h + 2w and h + 2w + 1 (start >= h - 1)
        wa = (start + ONE - h) // uint64(2)
        wb = (end - h) // uint64(2) if end >= h else uint64(0)
        if wb < wa:
            wb = wa
        B = uint64(block)
        per_round = B * uint64(FILTER_LOADS)
        stride = uint64(gxn) * per_round
        w0 = wa + uint64(bx) * per_round + uint64(tid)
        el = int32(0)
        nan = int32(0)
        kept = int32(0)
        while w0 + uint64(FILTER_LOADS - 1) * B < wb:  # whole rounds: no bounds checks
            x0 = words[w0]
            x1 = words[w0 + B]
            x2 = words[w0 + uint64(2) * B]
            x3 = words[w0 + uint64(3) * B]
            x4 = words[w0 + uint64(4) * B]
            x5 = words[w0 + uint64(5) * B]
            x6 = words[w0 + uint64(6) * B]
            x7 = words[w0 + uint64(7) * B]
            i = h + uint64(2) * w0 - start
            # written out: a loop over the tuple compiles to a branch tree on the index
            e0, c0, k0 = pair(x0, i, q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
            e1, c1, k1 = pair(x1, i + uint64(2) * B, q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
            e2, c2, k2 = pair(x2, i + uint64(4) * B, q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
            e3, c3, k3 = pair(x3, i + uint64(6) * B, q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
            e4, c4, k4 = pair(x4, i + uint64(8) * B, q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
            e5, c5, k5 = pair(x5, i + uint64(10) * B, q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
            e6, c6, k6 = pair(x6, i + uint64(12) * B, q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
            e7, c7, k7 = pair(x7, i + uint64(14) * B, q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
            el += e0 + e1 + e2 + e3 + e4 + e5 + e6 + e7
            nan += c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7
            kept += k0 + k1 + k2 + k3 + k4 + k5 + k6 + k7
            w0 += stride
        if w0 < wb:  # the last, partial round: its loads in flight together, each guarded
            z = uint64(0)
            x0 = words[w0]
            x1 = words[w0 + B] if w0 + B < wb else z
            x2 = words[w0 + uint64(2) * B] if w0 + uint64(2) * B < wb else z
            x3 = words[w0 + uint64(3) * B] if w0 + uint64(3) * B < wb else z
            x4 = words[w0 + uint64(4) * B] if w0 + uint64(4) * B < wb else z
            x5 = words[w0 + uint64(5) * B] if w0 + uint64(5) * B < wb else z
            x6 = words[w0 + uint64(6) * B] if w0 + uint64(6) * B < wb else z
            i = h + uint64(2) * w0 - start
            # at most 7 words here (a whole round is 8); written out, as the whole rounds
            e0, c0, k0 = pair(x0, i, q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
            e1, c1, k1 = pair_if(w0 + B < wb, x1, i + uint64(2) * B, q, seed, elig, st_s, st_i, st_n, buf_s,
                                 buf_i, fill, cap)
            e2, c2, k2 = pair_if(w0 + uint64(2) * B < wb, x2, i + uint64(4) * B, q, seed, elig, st_s, st_i, st_n,
                                 buf_s, buf_i, fill, cap)
            e3, c3, k3 = pair_if(w0 + uint64(3) * B < wb, x3, i + uint64(6) * B, q, seed, elig, st_s, st_i, st_n,
                                 buf_s, buf_i, fill, cap)
            e4, c4, k4 = pair_if(w0 + uint64(4) * B < wb, x4, i + uint64(8) * B, q, seed, elig, st_s, st_i, st_n,
                                 buf_s, buf_i, fill, cap)
            e5, c5, k5 = pair_if(w0 + uint64(5) * B < wb, x5, i + uint64(10) * B, q, seed, elig, st_s, st_i, st_n,
                                 buf_s, buf_i, fill, cap)
            e6, c6, k6 = pair_if(w0 + uint64(6) * B < wb, x6, i + uint64(12) * B, q, seed, elig, st_s, st_i, st_n,
                                 buf_s, buf_i, fill, cap)
            el += e0 + e1 + e2 + e3 + e4 + e5 + e6
            nan += c0 + c1 + c2 + c3 + c4 + c5 + c6
            kept += k0 + k1 + k2 + k3 + k4 + k5 + k6
        if bx == 0 and tid == 0 and start < end:  # the odd scores before and after the words
            first = h + uint64(2) * wa
            if first > start:  # the slice starts mid-word
                e, c, kk = single(scores, start, uint64(0), q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
                el += e
                nan += c
                kept += kk
            last = h + uint64(2) * wb
            if last < end and last >= start:  # ends mid-word (or, no word at all, starts on one)
                e, c, kk = single(scores, last, last - start, q, seed, elig, st_s, st_i, st_n, buf_s, buf_i, fill, cap)
                el += e
                nan += c
                kept += kk
        return el, nan, kept

    return stream


@cuda.jit(device=True, inline=True)
def add_totals(red, el, nan, kept):
    """Add a thread's eligible scores, NaN among them and kept scores to its block's shared totals
    ``red int32[3]`` (zero ones skipped: the atomics are rare)."""
    if el:
        cuda.atomic.add(red, 0, el)
    if nan:
        cuda.atomic.add(red, 1, nan)
    if kept:
        cuda.atomic.add(red, 2, kept)


@functools.lru_cache(maxsize=None)
def filter_kernel(block: int, has_elig: bool, stage: int = DEFAULT_CONFIG.tuning.filter_stage):
    """Launch ``[(grid, batch), block]`` (grid-stride within each request): one pass over each
    request's scores that appends every eligible score at or above its seed (NaN never is) to
    its row of the candidate buffer. Request ``q = blockIdx.y`` owns ``scores[offsets[q] :
    offsets[q + 1]]`` (``offsets int64[batch + 1]``), its seed ``seeds[q]``, its eligible bitset
    row ``elig[q] uint64[words]`` over the slice's local positions (read when ``has_elig``), and
    ``buf_s float32[batch, cap]`` / ``buf_i int32[batch, cap]`` (local slots) through
    ``fill int64[batch]`` (past ``cap`` counted, not written); it adds to ``counts int64[batch, 2]``
    the eligible non-NaN scores and those kept.

    The scores are read as ``words uint64[nw]`` = ``scores[head : head + 2 * nw]`` (two scores an
    8-byte load: ``head`` is 1 when ``scores`` starts 4 bytes past an 8-byte boundary), 8 loads in
    flight a thread; a request's block 0 takes the odd score before and after its words.

    Per 8-byte word the common case is one ``max.NaN`` and one compare: both scores below the seed
    and neither NaN (ineligible ones count as -inf); anything else takes the per-score path. The
    eligible non-NaN count is the eligible scores less the NaNs met there.
    Unsigned indices and whole rounds without bounds checks: signed indices and per-score checks
    made the pass compute-bound (measured on the H200, data/results/topk_diagnostics.md). No
    barrier in the loop: a kept score is staged in shared memory (``stage`` entries, a shared
    atomic; ``TopKTuning.filter_stage``) and the block takes its buffer slots with one global
    atomic at its end; past the stage, a global atomic a kept score. A global atomic a kept score
    throughout was fine for one large request (a few thousand kept) but halved a batch's pass
    (0.5 % kept: about one a warp a round, each stalling its warp).
    """
    stream = _filter_funcs(block, has_elig, stage)
    ONE = uint64(1)

    def kernel(words, scores, head, offsets, elig, seeds, buf_s, buf_i, fill, counts):
        red = cuda.shared.array(3, int32)  # block totals: eligible, NaN among them, kept
        st_s = cuda.shared.array(stage, float32)
        st_i = cuda.shared.array(stage, int32)
        st_n = cuda.shared.array(1, int32)  # staged count (int32: a native shared atomic)
        st_base = cuda.shared.array(1, int64)  # the block's place in the buffer
        tid = cuda.threadIdx.x
        q = uint64(cuda.blockIdx.y)
        if tid == 0:  # one thread: a block may have fewer threads than totals
            red[0] = 0
            red[1] = 0
            red[2] = 0
            st_n[0] = 0
        cuda.syncthreads()
        cap = buf_s.shape[1]
        el, nan, kept = stream(words, scores, head, q, uint64(offsets[q]), uint64(offsets[q + ONE]), seeds[q], elig,
                               st_s, st_i, st_n, buf_s, buf_i, fill, cap, cuda.blockIdx.x, cuda.gridDim.x)
        add_totals(red, el, nan, kept)
        cuda.syncthreads()
        staged = min(st_n[0], stage)
        if tid == 0:
            if red[0] != red[1]:
                cuda.atomic.add(counts[q], 0, int64(red[0] - red[1]))
            if red[2]:
                cuda.atomic.add(counts[q], 1, int64(red[2]))
            if staged:
                st_base[0] = cuda.atomic.add(fill, q, int64(staged))  # one global atomic a block
        cuda.syncthreads()
        if staged:  # uniform
            base = st_base[0]
            j = tid
            while j < staged:
                pos = base + j
                if pos < cap:
                    buf_s[q, pos] = st_s[j]
                    buf_i[q, pos] = st_i[j]
                j += block

    # a block of more than 512 threads must fit the register file: 64 registers a thread at 1,024
    # (the bitset variant takes 78 uncapped)
    regs = REGISTER_FILE // block // 8 * 8
    if regs < 128 and not numba_config.ENABLE_CUDASIM:  # the simulator has no register cap
        return cuda.jit(kernel, max_registers=regs)
    return cuda.jit(kernel)
