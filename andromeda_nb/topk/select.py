"""Seeded top-K selection: a one-launch histogram seed over a sample, a barrier-free filter pass,
and a final that ranks the few survivors (by counting, or, a request of a batch, by sorting).

One request's top-k over n scores (n >> k), as the host wrapper ``topk.launch_filtered`` chains it:

1. **seed** (:func:`seed_kernel`): the r-th best of a stratified sample, to 24 key bits
   (:func:`~andromeda_nb.device.intrinsics.float_key` order), in one launch: each block finds its
   own r-th best with two 12-bit histograms in shared memory and appends the samples at or above
   it; the last block to finish picks the whole sample's r-th best among those. The seed is that
   prefix's lower edge, so at least r samples reach it and few more than r do. (The earlier seed,
   a block top-K of the sample, took five launches and 79 us at 10^8 scores; this one 34 us.)
2. **filter** (:func:`filter_kernel`): one grid-stride pass, 8-byte loads, no block barrier in
   the loop: a score at or above the seed is staged in shared memory (a shared atomic), and each
   block takes its slots in the candidate buffer with one global atomic at its end (a few
   thousand candidates in all when the seed aims at a small multiple of k).
3. **final** (:func:`final_rank_kernel`): each candidate's place in the contract's order is the
   number of candidates before it, counted over many blocks, each block placing its own share.
   More than ``RANK_CAP`` candidates leave the answer to ``topk.final_radix_kernel``, launched
   after it, which exits when the rank final has answered.

A batch of requests (``topk.launch_topk_batch_seeded``) takes the same three steps, a request
each: :func:`batch_seed_kernel` (a block a request, its sample in registers, three 8-bit radix
levels), :func:`filter_kernel` over the batch (``blockIdx.y`` a request) and
:func:`final_sort_kernel` (a block a request sorts its few candidates in shared memory).

Memory order of the seed's last-block pattern: each block's candidate stores and atomics precede
a barrier, then its thread 0's ``threadfence`` and ticket increment; the last block's thread 0
fences again, and after a barrier the block reads them with plain loads, which no block of the
launch cached before (L1 holds nothing of an earlier launch). The simulator
runs blocks one after another, so it exercises the same code with the last block last.
"""

import functools
import math

from numba import cuda, float32, int32, int64, uint32, uint64
from numba.cuda.core import config

from ..device.bits import _f32_from_bits, test_bit
from ..device.intrinsics import decode_fp32, float_key, max_nan
from .block import NEG_INF, score_key

if config.ENABLE_CUDASIM:

    @cuda.jit(device=True)
    def sync_warp():
        """The simulator has no warp barrier: its block barrier stands in (every thread of the block
        reaches the call together where it is used)."""
        cuda.syncthreads()

else:

    @cuda.jit(device=True, inline=True)
    def sync_warp():
        """``__syncwarp()`` over the whole warp."""
        cuda.syncwarp()


#: key bits of the seed's histogram levels; two levels fix the top 24 of the 32 key bits
HIST_BITS = 12
HIST_BINS = 1 << HIST_BITS
LOW_SHIFT = 32 - 2 * HIST_BITS
#: uint32 slots of the seed's control array: the ticket of the last-block election, the
#: candidate count, the highest block threshold (the fallback seed when candidates overflow)
CTL_TICKET, CTL_CAND, CTL_EDGE = 0, 1, 2
CTL_SIZE = 3
#: threads of the seed launch on a GPU, and samples a thread takes (loads in flight)
SEED_BLOCK = 1024
SEED_PER_THREAD = 4
#: candidate keys the seed's last block can take (each block's samples at or above its own r-th
#: best's 24-bit key prefix: about r a block, more with ties); more leave the seed at the highest
#: block threshold (lower than the r-th best of the whole sample, still valid)
CAND_CAP = 1 << 17
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


@cuda.jit(device=True, inline=True)
def best_key_seed(top, rank):
    """A seed from each thread's best sample key ``top`` (uint32, 0: no real sample; every thread
    of the block calls it): the rank-th best of the threads' best keys lower-bounds the rank-th
    best sample (that many threads hold a sample at or above it), and the top samples rarely share
    a thread. Key bits from the top, one ``syncthreads_count`` each, until at most ``rank + rank /
    4`` threads' best reach the bits found so far. Returns the seed (float32; a lower bound of the
    rank-th best sample), or NaN when fewer than rank threads hold a real sample."""
    if cuda.syncthreads_count(int32(top != 0)) < rank:  # uniform
        return float32(math.nan)
    edge = uint32(0)
    bit = uint32(0x80000000)
    while bit != 0:
        cand = edge | bit
        c = cuda.syncthreads_count(int32(top >= cand))
        if c >= rank:  # uniform
            edge = cand
            if c <= rank + rank // 4:
                break
        bit >>= uint32(1)
    return key_float(max(edge, uint32(KEY_NEG_INF)))


@functools.lru_cache(maxsize=None)
def _block_funcs(block: int, bins: int = HIST_BINS):
    """Whole-block histogram helpers for ``block`` threads (a power of two, 32..1024, at most
    ``bins``), each thread owning ``bins / block`` consecutive bins (a compile-time count: its
    loads are unrolled)."""
    PER = bins // block

    @cuda.jit(device=True)
    def zero(h):
        base = cuda.threadIdx.x * PER
        for q in range(PER):
            h[base + q] = 0
        cuda.syncthreads()

    @cuda.jit(device=True)
    def pick_from_top(h, need, part, out):
        """The bin of ``h`` (int32[bins], shared or global) holding the ``need``-th entry
        counted from the top bin: ``out[0]`` = bin (-1 when fewer than ``need`` entries, or need
        < 1), ``out[1]`` = entries still needed inside it. Entered and left synchronised."""
        tid = cuda.threadIdx.x
        hi = bins - tid * PER  # thread 0 owns the top PER bins
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


@cuda.jit(device=True, inline=True)
def count_key(sh, key, level, b0):
    """Histogram step of a seed: level 0 counts the key's top HIST_BITS bits; level 1 its next
    HIST_BITS, if its top bits are ``b0``. Key 0 (no sample) is never counted."""
    if key != 0:
        top = int32(key >> uint32(32 - HIST_BITS))
        if level == 0:
            cuda.atomic.add(sh, top, 1)
        elif top == b0:
            cuda.atomic.add(sh, int32((key >> uint32(LOW_SHIFT)) & uint32(HIST_BINS - 1)), 1)


@functools.lru_cache(maxsize=None)
def seed_kernel(block: int, chunk: int, gather: bool, has_elig: bool = False, resets: bool = False):
    """Launch ``[ceil(m / (block * SEED_PER_THREAD)), block]``: the seed of one request's top-k in one
    launch, from a sample of ``m`` scores (``sample float32[m]``).

    ``gather``: the sample is ``chunks`` contiguous runs of ``chunk`` scores of ``scores
    float32[n]``, run j centred in the j-th of ``chunks`` equal strata (``topk.sample_positions``),
    copied into ``sample`` with NaN, and ineligible scores when ``has_elig`` (``elig
    uint64[words]``), as -inf. Otherwise ``sample`` already holds it (fused scoring writes it).

    Each block finds the 24-bit key prefix of its own r-th best sample (two 12-bit histograms in
    shared memory) and appends its samples at or above that prefix to ``cand uint32[cap]``: the
    whole sample's r-th best is at or above every block's (the block alone has r samples there),
    so the candidates hold it and everything above it. The last block to finish (ticket in ``ctl
    uint32[CTL_SIZE]``) runs the same two histograms over the candidates and writes ``seeds[0]``:
    the lower edge of the 24-bit key prefix of the sample's r-th best real score, so at least
    ``r`` samples reach it (-inf when fewer than ``r`` are real). More candidates than ``cap``
    (massive ties): the highest block prefix instead (lower, still valid). It leaves ``ctl`` zero
    for the next call. With ``resets``, block 0 also zeroes ``counts int64[1, c]`` and ``fill
    int64[1]`` for the filter that follows.

    Earlier versions merged per-block histograms into a global one (37 us at 10^8 scores'
    1 M-sample: contended atomics on the populous bins), then pruned to each block's 12-bit bin
    (34 us; sorted input overflowed the candidates)."""
    zero, pick_from_top = _block_funcs(block)
    TOP = uint32(32 - HIST_BITS)
    LOW = uint32(LOW_SHIFT)

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

    @cuda.jit(device=True)
    def prefix_of_rth(sh, part, out, r, k0, k1, k2, k3, cand, nc, level):
        """Whole block: the 24-bit key prefix (lower edge) of the r-th best of the keys counted by
        ``count`` over either the four keys each thread holds (``nc < 0``) or ``cand[:nc]``;
        0 when fewer than r keys."""
        edge = uint32(0)
        b0 = int32(0)
        need = r
        for lv in range(2):
            zero(sh)
            if nc < 0:
                count_key(sh, k0, lv, b0)
                count_key(sh, k1, lv, b0)
                count_key(sh, k2, lv, b0)
                count_key(sh, k3, lv, b0)
            else:
                j = cuda.threadIdx.x
                while j < nc:  # 4 loads in flight
                    c0 = cand[j]
                    c1 = cand[j + block] if j + block < nc else uint32(0)
                    c2 = cand[j + 2 * block] if j + 2 * block < nc else uint32(0)
                    c3 = cand[j + 3 * block] if j + 3 * block < nc else uint32(0)
                    count_key(sh, c0, lv, b0)
                    count_key(sh, c1, lv, b0)
                    count_key(sh, c2, lv, b0)
                    count_key(sh, c3, lv, b0)
                    j += 4 * block
            cuda.syncthreads()
            pick_from_top(sh, need, part, out)
            if out[0] < 0:
                return uint32(0)
            if lv == 0:
                b0 = out[0]
                need = out[1]
                edge = uint32(b0) << TOP
            else:
                edge |= uint32(out[0]) << LOW
            cuda.syncthreads()  # out is rewritten by the next pick
        return edge

    @cuda.jit(device=True, inline=True)
    def offer(cand, ctl, key, edge):
        if key != 0 and key >= edge:
            pos = cuda.atomic.add(ctl, CTL_CAND, uint32(1))
            if pos < cand.shape[0]:
                cand[pos] = key

    @cuda.jit
    def kernel(scores, n, chunks, sample, elig, r, cand, ctl, seeds, counts, fill):
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
        m = sample.shape[0]
        i0 = cuda.blockIdx.x * block * SEED_PER_THREAD + tid
        k0 = take(scores, n, chunks, sample, elig, i0, m)
        k1 = take(scores, n, chunks, sample, elig, i0 + block, m)
        k2 = take(scores, n, chunks, sample, elig, i0 + 2 * block, m)
        k3 = take(scores, n, chunks, sample, elig, i0 + 3 * block, m)
        edge = prefix_of_rth(sh, part, out, r, k0, k1, k2, k3, cand, -1, 0)  # 0: all of them
        offer(cand, ctl, k0, edge)
        offer(cand, ctl, k1, edge)
        offer(cand, ctl, k2, edge)
        offer(cand, ctl, k3, edge)
        if tid == 0 and edge != 0:
            cuda.atomic.max(ctl, CTL_EDGE, edge)
        cuda.syncthreads()
        # one fence a block, not a thread: the barrier orders the block's stores before thread 0's
        # fence, which is cumulative (the pattern of cooperative groups' grid sync)
        if tid == 0:
            cuda.threadfence()
            t = cuda.atomic.add(ctl, CTL_TICKET, uint32(1))
            last = t == cuda.gridDim.x - 1
            if last:
                cuda.threadfence()  # the acquire side: the candidates are read after it
            flag[0] = 1 if last else 0
        cuda.syncthreads()
        if flag[0] == 0:
            return
        # --- the last block: every block's candidates are in
        nc = int64(ctl[CTL_CAND])
        if nc <= cand.shape[0]:
            key = prefix_of_rth(sh, part, out, r, k0, k1, k2, k3, cand, nc, 0)
        else:
            key = ctl[CTL_EDGE]
        if tid == 0:
            seeds[0] = key_float(max(key, uint32(KEY_NEG_INF))) if key != 0 else NEG_INF
            ctl[CTL_CAND] = 0
            ctl[CTL_EDGE] = 0
            ctl[CTL_TICKET] = 0

    return kernel


#: the batched seed: threads a request's block, samples a thread (4,096 a request, all of a
#: request of at most that many), contiguous scores a sampled run
BATCH_SEED_BLOCK = 128
BATCH_SEED_PER_THREAD = 32
BATCH_SAMPLE_CHUNK = 32
#: the batched seed's radix: three levels of 8 key bits (256 bins: a bin a thread, a 1 KiB histogram)
SEED_RADIX_BITS = 8
SEED_RADIX = 1 << SEED_RADIX_BITS


@functools.lru_cache(maxsize=None)
def batch_seed_kernel(block: int, per_thread: int, chunk: int, has_elig: bool, margin_x2: int, min_rank: int,
                      by_max: bool = False):
    """Launch ``[batch, block]`` (``block`` a power of two, at most 256): one block a request, the
    seed of each request's top-k from a sample of ``M = block * per_thread`` of its scores, and
    the request's counters zeroed for the filter pass that follows (``counts int64[batch, 2]``,
    ``fill int64[batch]``).

    Request ``q`` owns ``scores[offsets[q] : offsets[q + 1]]`` (n scores), ``ks[q]`` and, when
    ``has_elig``, ``elig[q] uint64[words]`` over its local positions. A request of at most M
    scores is sampled whole at rank k: its seed lower-bounds its k-th best. A larger one is
    sampled as M / chunk runs of ``chunk`` contiguous scores, run j centred in the j-th stratum
    of ``n // (M / chunk)`` scores, at rank ``r = max(min_rank, ceil(margin_x2 * k * M / (2 * n)))``:
    about ``margin_x2 / 2 * k`` of its scores reach the r-th best sample; past ``r > M / 4`` the
    sample decides little and the seed is -inf (keep every eligible score). NaN, -inf and
    ineligible samples never seed. ``seeds[q]`` is at most the r-th best real sample (see below),
    -inf when fewer than r are real.

    ``by_max`` (a lone request, whose seed is one block on an otherwise idle GPU: latency counts):
    a rank up to ``block / 4`` whose real samples sit in at least rank threads takes instead a
    lower bound of the r-th best of the threads' best sample keys (at least r samples reach it),
    found key bit by key bit from the top with one ``syncthreads_count`` each, stopping once at
    most ``r + r / 4`` threads' best reach it. On the H200 (commit 1ec4125) it cut one 500,000-
    score request from 24.1 to 22.6 us, but a batch of 1,024 x 50,000 (k = 100) kept more scores
    a request (median 312 against 252), so the seed's 19.0 -> 12.5 us went to the sort final
    (27.9 -> 36.1 us): 111 us against 109 in all; a batch takes the radix. Otherwise three
    radix levels of 8 bits (a 256-bin shared histogram each, a bin a thread), the keys in
    registers: the seed is the lower edge of the r-th best sample's 24-bit key prefix. The first
    version, two 12-bit levels as :func:`seed_kernel` (4,096 bins, 16 a thread), took 48 us for
    1,024 requests of 50,000 scores on the H200: 120 registers (two blocks an SM, four waves) and
    ~2,000 dependent instructions a thread; the radix levels 19 us. One block holds the whole
    sample: no merge across blocks, no fence."""
    request_seed = _batch_seed_funcs(block, per_thread, chunk, has_elig, margin_x2, min_rank, by_max)

    @cuda.jit
    def kernel(scores, offsets, ks, elig, seeds, counts, fill):
        sh = cuda.shared.array(SEED_RADIX, int32)
        part = cuda.shared.array(block, int32)
        out = cuda.shared.array(2, int32)
        keys = cuda.local.array(per_thread, uint32)
        q = cuda.blockIdx.x
        if cuda.threadIdx.x == 0:
            counts[q, 0] = 0
            counts[q, 1] = 0
            fill[q] = 0
        seed = request_seed(scores, offsets, ks, elig, q, sh, part, out, keys)
        if cuda.threadIdx.x == 0:
            seeds[q] = seed

    return kernel


@functools.lru_cache(maxsize=None)
def _batch_seed_funcs(block: int, per_thread: int, chunk: int, has_elig: bool, margin_x2: int, min_rank: int,
                      by_max: bool = False):
    """The device function of :func:`batch_seed_kernel`: ``request_seed(scores, offsets, ks, elig, q,
    sh, part, out, keys)`` returns request ``q``'s seed in every thread of the block (``sh
    int32[SEED_RADIX]``, ``part int32[block]``, ``out int32[2]`` shared; ``keys uint32[per_thread]``
    local). Whole block; ends synchronised."""
    zero, pick_from_top = _block_funcs(block, SEED_RADIX)
    M = block * per_thread
    MAX_RANK_BY_MAX = block // 4 if by_max else 0  # a rank up to this takes the threads' best keys
    CHUNKS = M // chunk
    RB = uint64(SEED_RADIX_BITS)
    DIGIT = uint64(SEED_RADIX - 1)

    @cuda.jit(device=True, inline=True)
    def key_at(scores, a, n, step, whole, elig, q, idx):
        """Sample ``idx``'s key: score ``idx`` of a whole request, else score ``idx % chunk`` of run
        ``idx // chunk``, centred in its stratum of ``step = n // CHUNKS >= chunk`` scores (32-bit
        arithmetic: n < 2^31; one division a block, not one a sample)."""
        if whole:
            if idx >= n:
                return uint32(0)
            i = idx
        else:
            i = (idx // uint32(chunk)) * step + (step - uint32(chunk)) // uint32(2) + idx % uint32(chunk)
        if has_elig and test_bit(elig[q], i) == 0:
            return uint32(0)
        return sample_key(scores[a + i])

    @cuda.jit(device=True, inline=True)
    def count_digit(sh, key, shift, edge):
        """Count ``key``'s digit at ``shift`` if its bits above the digit are those of ``edge``
        (64-bit shifts: above the top digit, both are 0)."""
        if key != 0 and (uint64(key) >> (shift + RB)) == (uint64(edge) >> (shift + RB)):
            cuda.atomic.add(sh, int32((uint64(key) >> shift) & DIGIT), 1)

    @cuda.jit(device=True)
    def request_seed(scores, offsets, ks, elig, q, sh, part, out, keys):
        tid = cuda.threadIdx.x
        a = offsets[q]
        n = offsets[q + 1] - a
        k = ks[q]
        whole = n <= M
        rank = k if whole else max(min_rank, (margin_x2 * k * M + 2 * n - 1) // (2 * n))
        if not whole and rank > M // 4:  # uniform
            return NEG_INF
        step = uint32(n // CHUNKS) if not whole else uint32(0)
        for j in range(per_thread):  # constant trip count: unrolled, the keys in registers
            keys[j] = key_at(scores, a, n, step, whole, elig, q, uint32(j * block + tid))
        if rank <= MAX_RANK_BY_MAX:  # uniform
            top = keys[0]
            for j in range(1, per_thread):
                top = max(top, keys[j])
            seed = best_key_seed(top, rank)
            if not math.isnan(seed):  # uniform; else fewer threads than rank hold real samples: the radix
                return seed
        edge = uint32(0)  # the digits found so far, in place
        need = rank
        for lv in range(3):  # digits at bits 24, 16, 8: a 24-bit prefix
            shift = uint64(24 - 8 * lv)
            zero(sh)
            for j in range(per_thread):
                count_digit(sh, keys[j], shift, edge)
            cuda.syncthreads()
            pick_from_top(sh, need, part, out)
            if out[0] < 0:  # uniform: fewer than rank real samples
                edge = uint32(0)
                break
            edge |= uint32(out[0]) << uint32(shift)
            need = out[1]
            cuda.syncthreads()  # out is rewritten by the next pick
        cuda.syncthreads()
        return key_float(max(edge, uint32(KEY_NEG_INF))) if edge != 0 else NEG_INF

    return request_seed


#: 32-bit registers of an SM (H100 / H200), the most a block's threads can share
REGISTER_FILE = 65536
#: 8-byte loads per thread per round of the filter (16 scores)
FILTER_LOADS = 8
#: kept scores a filter block stages in shared memory before its one global atomic (8 KiB): a
#: global atomic per kept score stalled its warp for the round trip, which halved the batched
#: filter's bandwidth (250 kept of 50,000 a request: about one a warp a round)
FILTER_STAGE = 1024


@functools.lru_cache(maxsize=None)
def _filter_funcs(block: int, has_elig: bool):
    """The filter pass's device function ``stream(...)``: one block's share of one request's pass
    (see :func:`filter_kernel`)."""
    NEG = float32(-math.inf)
    ONE = uint64(1)

    @cuda.jit(device=True, inline=True)
    def keep(s, i, q, st_s, st_i, st_n, buf_s, buf_i, fill, cap):
        """Stage a kept score in shared memory (a shared atomic: the warp goes on at once); past
        the stage's FILTER_STAGE entries, straight to the buffer (a global atomic)."""
        p = cuda.atomic.add(st_n, 0, int32(1))
        if p < FILTER_STAGE:
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
def filter_kernel(block: int, has_elig: bool):
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
    Unsigned indices and whole rounds without bounds checks: the first version, signed indices
    and per-score checks, issued 28 instructions a score and ran compute-bound at 0.56 of the read
    ceiling (157 us at 10^8 scores; Nsight Compute: SM 81 %, DRAM 42 %). No barrier in the loop:
    a kept score is staged in shared memory (FILTER_STAGE entries, a shared atomic) and the block
    takes its buffer slots with one global atomic at its end; past the stage, a global atomic a
    kept score. A global atomic a kept score throughout was fine at 10^8 scores (~2,800 kept)
    but halved a batch's pass (0.5 % kept: about one a warp a round, each stalling its warp).
    """
    stream = _filter_funcs(block, has_elig)
    ONE = uint64(1)

    def kernel(words, scores, head, offsets, elig, seeds, buf_s, buf_i, fill, counts):
        red = cuda.shared.array(3, int32)  # block totals: eligible, NaN among them, kept
        st_s = cuda.shared.array(FILTER_STAGE, float32)
        st_i = cuda.shared.array(FILTER_STAGE, int32)
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
        staged = min(st_n[0], FILTER_STAGE)
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
    if regs < 128 and not config.ENABLE_CUDASIM:  # the simulator has no register cap
        return cuda.jit(kernel, max_registers=regs)
    return cuda.jit(kernel)


#: candidates the rank final takes; more leave the request to the radix select launched after it
RANK_CAP = 8192
#: threads of the rank final's blocks, and threads sharing one candidate's comparisons (a block
#: ranks RANK_BLOCK // RANK_SPLIT candidates; each thread compares against every RANK_SPLIT-th
#: entry of each tile)
RANK_BLOCK = 256
RANK_SPLIT = 8


@functools.lru_cache(maxsize=None)
def final_rank_kernel(block: int, has_ids: bool, cap: int = RANK_CAP, split: int = RANK_SPLIT):
    """Launch ``[(grid, batch), block]`` (``split`` a power of two dividing ``block``; grid-stride
    over groups of candidates, one pass with ``cap // (block // split)`` blocks): each request's
    (``r = blockIdx.y``) exact top-k of its candidate buffer (``buf_s float32[batch, cap_b]``,
    ``buf_i int32[batch, cap_b]`` slots, ``m = min(fill[r], cap_b)`` entries, no NaN) when
    ``m <= cap``, by counting: a
    candidate's place in the contract's order (score descending, ties to the lower id,
    ``ids[start + slot]`` when ``has_ids`` else the slot; -0 ties with +0) is the number of
    candidates before it, unique because ids are. Block b ranks candidates ``b * (block // split)``
    onward, ``split`` threads each, over all m candidates in shared-memory tiles of ``4 * block``
    (one load round each, 4 loads in flight a thread), and writes each one placed below
    ``min(k, m)`` to ``out_s / out_slot / out_id [batch, kmax]``; block 0 pads the rest of the row
    (-inf, -1, -1). Without ids a candidate's key is one uint64 (score key, then the complement
    of its slot): one 64-bit compare a pair. One launch, no global atomics. More than ``cap``
    candidates: every block returns at once and ``topk.final_radix_kernel`` (launched after,
    ``skip_upto = cap``) answers.

    Replaces one block's bitonic sort of the candidates (60 us for 2,798 on the H200: issue-bound
    on its one SM) and a first counting version (tile pairs, atomics, a last block scattering:
    41 us, latency-bound)."""
    PER_BLOCK = block // split
    TILE = 4 * block

    @cuda.jit(device=True, inline=True)
    def key_of(buf_s, buf_i, r, q, ids, start):
        """(64-bit key, id) of request r's candidate q: without ids the key orders completely
        (higher first)."""
        sk = uint64(score_key(buf_s[r, q]))
        slot = buf_i[r, q]
        if has_ids:
            return sk, ids[start + slot]
        return (sk << uint64(32)) | uint64(uint32(0xFFFFFFFF) - uint32(slot)), int64(0)

    @cuda.jit(device=True, inline=True)
    def stage(buf_s, buf_i, r, ids, start, m, j):
        if j < m:
            kq, iq = key_of(buf_s, buf_i, r, j, ids, start)
        else:
            kq, iq = uint64(0), int64(0)  # key 0: before nobody (real keys are above 0x7FFFFF)
        return kq, iq

    @cuda.jit
    def kernel(buf_s, buf_i, fill, offsets, ids, ks, out_s, out_slot, out_id):
        tile_k = cuda.shared.array(TILE, uint64)
        tile_id = cuda.shared.array(TILE if has_ids else 1, int64)
        part = cuda.shared.array(PER_BLOCK, int32)
        tid = cuda.threadIdx.x
        r = cuda.blockIdx.y
        m = min(fill[r], buf_s.shape[1])
        if m > cap:
            return  # uniform: the radix select answers
        kk = min(ks[r], m)
        start = offsets[r]
        if cuda.blockIdx.x == 0:
            q = kk + tid
            while q < out_s.shape[1]:
                out_s[r, q] = NEG_INF
                out_slot[r, q] = -1
                out_id[r, q] = -1
                q += block
        base = cuda.blockIdx.x * PER_BLOCK
        while base < m:  # uniform; one pass on the GPU's grid (cap // PER_BLOCK blocks)
            c = base + tid // split
            sub = tid % split
            ki = uint64(0)
            idi = int64(0)
            if c < m:
                ki, idi = key_of(buf_s, buf_i, r, c, ids, start)
            if tid < PER_BLOCK:
                part[tid] = 0
            cnt = int32(0)
            j0 = 0
            while j0 < m:
                a0, b0 = stage(buf_s, buf_i, r, ids, start, m, j0 + tid)
                a1, b1 = stage(buf_s, buf_i, r, ids, start, m, j0 + tid + block)
                a2, b2 = stage(buf_s, buf_i, r, ids, start, m, j0 + tid + 2 * block)
                a3, b3 = stage(buf_s, buf_i, r, ids, start, m, j0 + tid + 3 * block)
                cuda.syncthreads()  # the previous tile (and round) is done with
                tile_k[tid] = a0
                tile_k[tid + block] = a1
                tile_k[tid + 2 * block] = a2
                tile_k[tid + 3 * block] = a3
                if has_ids:
                    tile_id[tid] = b0
                    tile_id[tid + block] = b1
                    tile_id[tid + 2 * block] = b2
                    tile_id[tid + 3 * block] = b3
                cuda.syncthreads()
                u = uint32(sub)
                lim = uint32(min(TILE, m - j0))  # the tile's real entries: few candidates, few compares
                while u < lim:  # 32-bit unsigned: no 64-bit index arithmetic a compare
                    kq = tile_k[u]
                    if has_ids:
                        cnt += int32((kq > ki) | ((kq == ki) & (tile_id[u] < idi)))
                    else:
                        cnt += int32(kq > ki)
                    u += uint32(split)
                j0 += TILE
            if c < m and cnt:
                cuda.atomic.add(part, tid // split, cnt)
            cuda.syncthreads()
            if sub == 0 and c < m:
                place = part[tid // split]
                if place < kk:
                    out_s[r, place] = buf_s[r, c]
                    out_slot[r, place] = buf_i[r, c]
                    out_id[r, place] = idi if has_ids else int64(buf_i[r, c])
            cuda.syncthreads()  # part is read above and zeroed in the next round
            base += cuda.gridDim.x * PER_BLOCK

    return kernel


#: candidates a request the sort final takes (a bitonic sort in shared memory: 8-byte keys, 4-byte
#: buffer positions and, with ids, 8-byte ids: 40 KiB at 2,048)
SORT_CAP = 2048


@functools.lru_cache(maxsize=None)
def final_sort_kernel(block: int, has_ids: bool, cap: int, warp_sync: bool = False):
    """Launch ``[(1, batch), block]``: each request's exact top-k of its candidate buffer by one
    block's bitonic sort in shared memory, for requests of few candidates (the batched path: about
    ``SEED_MARGIN * k`` each). Request ``r = blockIdx.y``: ``m = min(fill[r], buf_s.shape[1])``
    candidates (``buf_s float32[batch, cap_b]``, ``buf_i int32[...]`` local slots, no NaN); when
    ``m <= cap`` (a power of two) the block sorts them, padded to the next power of two, in the
    contract's order (score descending, -0 tied with +0, then the lower id: ``ids[offsets[r] +
    slot]`` when ``has_ids`` else the slot) and writes the best ``min(k, m)`` to ``out_s / out_slot
    / out_id [batch, kmax]`` (scores read back from ``scores float32[total]``, so -0 stays -0),
    pads (-inf, -1, -1) after them. More than ``cap`` candidates: the block returns at once (the
    caller reruns the request).

    Without ids a candidate is one 64-bit key (score key, then the complement of its slot); with
    ids, the 32-bit score key, the id and the slot. Indices are 32-bit unsigned (no 64-bit index
    arithmetic or negative-index checks a compare-exchange). Replaces, for the batch, the rank
    final (m^2 compares: 45 to 68 us for 1,024 requests of ~250 candidates on the H200, whatever
    its split, instruction-bound)."""
    KEY_CAP = cap
    ID_CAP = cap if has_ids else 1
    sort_buffer, write_top = _sort_funcs(block, has_ids, warp_sync)

    @cuda.jit
    def kernel(scores, buf_s, buf_i, fill, offsets, ids, ks, out_s, out_slot, out_id):
        sk = cuda.shared.array(KEY_CAP, uint64)
        sid = cuda.shared.array(ID_CAP, int64)
        sslot = cuda.shared.array(ID_CAP, int32)
        r = cuda.blockIdx.y
        m = min(fill[r], buf_s.shape[1])
        if m > cap:
            return  # uniform
        start = offsets[r]
        sort_buffer(sk, sid, sslot, buf_s[r], buf_i[r], m, ids, start)
        write_top(sk, sid, sslot, scores, start, uint32(min(ks[r], m)), r, out_s, out_slot, out_id)

    return kernel


@functools.lru_cache(maxsize=None)
def _sort_funcs(block: int, has_ids: bool, warp_sync: bool = False):
    """Device functions of the sort final (:func:`final_sort_kernel`), returned:
    ``sort_buffer(sk, sid, sslot, buf_s, buf_i, m, ids, start)`` writes the m candidates of a
    buffer row as entries and sorts them, padded to a power of two, best first (whole block,
    entered and left synchronised); ``write_top(sk, sid, sslot, scores, start,
    kk, r, out_s, out_slot, out_id)`` writes the best kk to row r, pads after them. Inside:
    ``key_of(sk, sid, sslot, j, s, slot, ids, start)`` writes entry j (slot -1: a pad, after every
    real entry); ``sort_desc(sk, sid, sslot, P)`` sorts the first P entries (a power of two).

    ``warp_sync`` (``block`` a multiple of 32): a compare-exchange step of stride at most 32 whose
    next step's stride is at most 32 too ends with a warp barrier instead of a block barrier. Pair p of a step
    touches entries ``i = ((p & ~(stride - 1)) << 1) | (p & (stride - 1))`` and ``i + stride``;
    for a stride up to 32 the 32 pairs of a warp (p = 32 w .. 32 w + 31) stay inside entries
    ``64 w .. 64 w + 63``, and thread t handles pairs t, t + block, ...: the same warp, step
    after step. So between two such steps only the warp's own writes are read. (The simulator's
    stand-in is its block barrier: every thread reaches it together.)"""
    B = uint32(block)
    WARP_SYNC = bool(warp_sync)
    WARP_STRIDE = uint32(32)

    @cuda.jit(device=True, inline=True)
    def key_of(sk, sid, sslot, j, s, slot, ids, start):
        if slot < 0:
            sk[j] = uint64(0)  # below every real key (those are above 0x7FFFFF << 32)
            if has_ids:
                sid[j] = int64(0x7FFFFFFFFFFFFFFF)
                sslot[j] = -1
            return
        key = uint64(score_key(s)) << uint64(32)
        if has_ids:
            sid[j] = ids[start + slot]
            sslot[j] = slot
        else:  # the lower slot first: its complement is higher
            key |= uint64(uint32(0xFFFFFFFF) - uint32(slot))
        sk[j] = key

    @cuda.jit(device=True)
    def sort_desc(sk, sid, sslot, P):
        tid = uint32(cuda.threadIdx.x)
        half = P >> uint32(1)
        size = uint32(2)
        while size <= P:  # uniform: P is the same in every thread
            stride = size >> uint32(1)
            while stride > uint32(0):
                low = stride - uint32(1)
                t = tid
                while t < half:
                    i = ((t & ~low) << uint32(1)) | (t & low)
                    o = i + stride
                    ki = sk[i]
                    ko = sk[o]
                    if has_ids:
                        ii = sid[i]
                        io = sid[o]
                        o_first = ko > ki or (ko == ki and io < ii)
                    else:
                        o_first = ko > ki
                    if o_first == ((i & size) == uint32(0)):
                        sk[i] = ko
                        sk[o] = ki
                        if has_ids:
                            sid[i] = io
                            sid[o] = ii
                            si = sslot[i]
                            sslot[i] = sslot[o]
                            sslot[o] = si
                    t += B
                # the next step's stride: half this one, or, after stride 1, the next size's first
                # (size itself); after the last step the sort ends, left synchronised
                nxt = stride >> uint32(1) if stride > uint32(1) else size
                last = stride == uint32(1) and size == P
                # this step wrote, and the next reads, only the warp's own 64 entries: a warp barrier
                if WARP_SYNC and stride <= WARP_STRIDE and nxt <= WARP_STRIDE and not last:  # uniform
                    sync_warp()
                else:
                    cuda.syncthreads()
                stride >>= uint32(1)
            size <<= uint32(1)

    @cuda.jit(device=True, inline=True)
    def sort_buffer(sk, sid, sslot, buf_s, buf_i, m, ids, start):
        """Entries of the ``m`` candidates ``buf_s[j]`` / ``buf_i[j]`` (a request's buffer row), pads
        up to the next power of two, sorted best first (:func:`sort_desc`); whole block."""
        mu = uint32(m)
        P = uint32(1)
        while P < mu:
            P <<= uint32(1)
        j = uint32(cuda.threadIdx.x)
        while j < P:
            if j < mu:
                key_of(sk, sid, sslot, j, buf_s[j], buf_i[j], ids, start)
            else:
                key_of(sk, sid, sslot, j, NEG_INF, int32(-1), ids, start)
            j += B
        cuda.syncthreads()
        sort_desc(sk, sid, sslot, P)

    @cuda.jit(device=True, inline=True)
    def write_top(sk, sid, sslot, scores, start, kk, r, out_s, out_slot, out_id):
        q = uint32(cuda.threadIdx.x)
        while q < uint32(out_s.shape[1]):
            if q < kk:
                if has_ids:
                    slot = sslot[q]
                    out_id[r, q] = sid[q]
                else:
                    slot = int32(uint32(0xFFFFFFFF) - uint32(sk[q] & uint64(0xFFFFFFFF)))
                    out_id[r, q] = int64(slot)
                out_s[r, q] = scores[start + slot]  # the score itself: -0 stays -0
                out_slot[r, q] = slot
            else:
                out_s[r, q] = NEG_INF
                out_slot[r, q] = -1
                out_id[r, q] = -1
            q += B

    return sort_buffer, write_top

