"""Seed kernels: a threshold that about ``seed_margin * k`` scores reach, from a sample.

:func:`seed_kernel` (one request, many blocks, host side :mod:`~andromeda_nb.topk.seed`): the r-th
best of a stratified sample, to 24 key bits (:func:`~andromeda_nb.device.intrinsics.float_key`
order), in one launch: each block finds its own r-th best with two 12-bit histograms in shared
memory and appends the samples at or above it; the last block to finish picks the whole sample's
r-th best among those. The seed is that prefix's lower edge, so at least r samples reach it and few
more than r do.

:func:`batch_seed_kernel` (a batch, a block a request, host side :mod:`~andromeda_nb.topk.batched`):
its sample in registers, three 8-bit radix levels (or, for a lone request, the threads' best keys:
:func:`best_key_seed`, also the one-launch path's seed).

Memory order of the seed's last-block pattern: each block's candidate stores and atomics precede
a barrier, then its thread 0's ``threadfence`` and ticket increment; the last block's thread 0
fences again, and after a barrier the block reads them with plain loads, which no block of the
launch cached before (L1 holds nothing of an earlier launch). The simulator runs blocks one after
another, so it exercises the same code with the last block last.
"""

import functools
import math

from numba import cuda, float32, int32, int64, uint32, uint64

from ..device.bits import _f32_from_bits, test_bit
from ..device.intrinsics import float_key
from .block import NEG_INF

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
    float32[n]``, run j centred in the j-th of ``chunks`` equal strata (``seed.sample_positions``),
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

    Each block prunes to its own r-th best rather than merging per-block histograms into a global
    one (contended atomics on the populous bins) or pruning to its 12-bit bin (sorted input
    overflowed the candidates): measured on the H200 (data/results/topk_diagnostics.md)."""
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
            i = (2 * j + 1) * n // (2 * chunks) - chunk // 2 + idx % chunk  # seed.sample_positions
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
    most ``r + r / 4`` threads' best reach it. It shortens a lone request's seed, but on a batch
    the looser seed keeps more scores a request and the sort final loses what the seed gains, so
    a batch takes the radix (measured on the H200, data/results/topk_diagnostics.md). Otherwise
    three radix levels of 8 bits (a 256-bin shared histogram each, a bin a thread), the keys in
    registers: the seed is the lower edge of the r-th best sample's 24-bit key prefix. (Two 12-bit
    levels as :func:`seed_kernel`, 4,096 bins, 16 a thread, took 120 registers and ~2,000 dependent
    instructions a thread: slower on the H200.) One block holds the whole sample: no merge across
    blocks, no fence."""
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
