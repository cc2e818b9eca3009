"""Final kernels: each request's exact top-k of its candidate buffer (host side
:mod:`~andromeda_nb.topk.final`).

- :func:`final_rank_kernel`: each candidate's place in the contract's order is the number of
  candidates before it, counted over many blocks, each block placing its own share. More than its
  ``cap`` candidates leave the answer to :func:`final_radix_kernel`, launched after it, which exits
  when the rank final has answered.
- :func:`final_sort_kernel`: a block a request sorts its few candidates in shared memory (the
  batched path).
- :func:`final_radix_kernel`: one block's radix select over any number of candidates (the filter
  path above the rank final's cap, the merge of per-block lists, k above the block top-K's limit).

Contract (docs/design.md, "Top-K"): score descending, -0 tied with +0, ties to the lower
id, NaN never a candidate, pads of slot -1 / id -1 / score -inf.
"""

import functools

from numba import cuda, float32, int32, int64, uint32, uint64
from numba.cuda.core import config as numba_config

from ..device.intrinsics import float_key
from .block import NEG_INF, block_topk
from .config import DEFAULT_CONFIG

if numba_config.ENABLE_CUDASIM:

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


@cuda.jit(device=True, inline=True)
def score_key(s):
    """The order key of a candidate score: ``float_key`` with -0 folded onto +0 (the contract
    compares scores with ==, so -0 ties with +0)."""
    if s == float32(0.0):
        s = float32(0.0)
    return float_key(s)


#: threads of the rank final's blocks, and threads sharing one candidate's comparisons (a block
#: ranks RANK_BLOCK // RANK_SPLIT candidates; each thread compares against every RANK_SPLIT-th
#: entry of each tile)
RANK_BLOCK = 256
RANK_SPLIT = 8


@functools.lru_cache(maxsize=None)
def final_rank_kernel(block: int, has_ids: bool, cap: int = DEFAULT_CONFIG.tuning.rank_cap,
                      split: int = RANK_SPLIT):
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
    candidates: every block returns at once and :func:`final_radix_kernel` (launched after,
    ``skip_upto = cap``) answers.

    Counting over many blocks beats one block's bitonic sort of a few thousand candidates
    (issue-bound on its one SM) and a counting version of tile pairs, atomics and a last block
    scattering (latency-bound): measured on the H200 (data/results/topk_diagnostics.md)."""
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
    ``seed_margin * k`` each). Request ``r = blockIdx.y``: ``m = min(fill[r], buf_s.shape[1])``
    candidates (``buf_s float32[batch, cap_b]``, ``buf_i int32[...]`` local slots, no NaN); when
    ``m <= cap`` (a power of two) the block sorts them, padded to the next power of two, in the
    contract's order (score descending, -0 tied with +0, then the lower id: ``ids[offsets[r] +
    slot]`` when ``has_ids`` else the slot) and writes the best ``min(k, m)`` to ``out_s / out_slot
    / out_id [batch, kmax]`` (scores read back from ``scores float32[total]``, so -0 stays -0),
    pads (-inf, -1, -1) after them. More than ``cap`` candidates: the block returns at once (the
    caller reruns the request).

    Without ids a candidate is one 64-bit key (score key, then the complement of its slot); with
    ids, the 32-bit score key, the id and the slot. Indices are 32-bit unsigned (no 64-bit index
    arithmetic or negative-index checks a compare-exchange). For a batch it beats the rank final
    (m^2 compares a request: instruction-bound whatever its split; measured on the H200,
    data/results/topk_diagnostics.md)."""
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


RADIX_BITS = 8
RADIX = 1 << RADIX_BITS


@functools.lru_cache(maxsize=None)
def _pick_bin(block: int, descending: bool):
    """Device function ``pick(hist, tmp, need, sel)``: the bin holding the ``need``-th entry of a
    ``RADIX``-bin histogram, counted from the top bin (``descending``) or the bottom one. Scans the
    histogram into cumulative counts (Hillis-Steele, log2(RADIX) steps ping-ponging between
    ``hist`` and ``tmp``: one barrier a step; an even number of steps ends in ``hist``), then the
    one bin where the count first reaches ``need`` writes ``sel[0]`` = bin, ``sel[1]`` = the
    entries still needed inside it, ``sel[3]`` = the bin's size. Whole block; ``need >= 1``."""

    @cuda.jit(device=True, inline=True)
    def step(src, dst, off):
        h = cuda.threadIdx.x
        while h < RADIX:
            nb = h + off if descending else h - off
            dst[h] = src[h] + (src[nb] if 0 <= nb < RADIX else 0)
            h += block
        cuda.syncthreads()

    @cuda.jit(device=True)
    def pick(hist, tmp, need, sel):
        off = 1
        while off < RADIX:
            step(hist, tmp, off)
            step(tmp, hist, 2 * off)
            off *= 4
        h = cuda.threadIdx.x
        while h < RADIX:
            nxt = h + 1 if descending else h - 1
            before = hist[nxt] if 0 <= nxt < RADIX else 0  # entries in the bins ahead of h
            if hist[h] >= need and before < need:
                sel[0] = h
                sel[1] = need - before
                sel[3] = hist[h] - before
            h += block
        cuda.syncthreads()

    return pick


#: shared memory of final_radix_kernel, in all: the answer (8 bytes an entry of ``cap``), two
#: histograms and the staged keys (the rest, under Numba's 48 KiB static limit)
RADIX_SHARED_BYTES = 44 * 1024


def radix_stage_words(cap: int) -> int:
    """uint32 words of :func:`final_radix_kernel`'s staging area for an answer of ``cap`` entries
    (a multiple of 256: 8,448 at cap 1024, 2,304 at cap 4096)."""
    return max(0, (RADIX_SHARED_BYTES - 8 * cap - 2 * RADIX * 4 - 64) // 4 // 256 * 256)


#: where final_radix_kernel reads an entry's key: the buffer (global), the staged keys (entry j's
#: key at stage[j]) or staged pairs (key at stage[j], buffer index at stage[SW / 2 + j])
FROM_BUFFER, FROM_KEYS, FROM_PAIRS = 0, 1, 2


@functools.lru_cache(maxsize=None)
def final_radix_kernel(cap: int, block: int, has_ids: bool, stage_words: int | None = None, skip_upto: int = -1):
    """Launch ``[(1, batch), block]``: the same contract and arguments as :func:`final_kernel`, by
    radix select instead of offering the buffer to a block top-K.

    ``cap`` (a power of two, at least ``kmax``) entries of shared memory hold the answer. Steps, one
    block per request, ``m`` = the request's buffer fill, ``kk = min(k, m)``:

    0. stage: when the ``m`` score keys fit the staging area (:func:`radix_stage_words`), one
       pass copies them to shared memory (4 loads in flight a thread); every later pass reads them
       there, and the buffer only for the winners;
    1. threshold: the kk-th largest score key (:func:`~andromeda_nb.device.intrinsics.float_key`,
       -0 folded onto +0), 8 bits a pass (at most 4, a 256-bin shared histogram each), keeping only
       the entries whose key matches the bits fixed so far; it stops early once the chosen bin
       holds exactly the entries still needed. Unstaged, after each pass the entries at or above
       the chosen bin are compacted into the staging area (key, buffer index) once they fit;
    2. ties: if more entries hold the threshold key than places remain, the same select over their
       tie-break ids (``ids[slot]``, else the slot; unique, non-negative) picks the lowest ones;
    3. gather the kk winners into shared memory, sort them once (bitonic, best first), write.

    ``skip_upto``: requests whose buffer holds at most this many entries are left alone (the sort
    final, :func:`final_rank_kernel` of cap ``skip_upto``, launched before, answered them); -1: none.

    ``stage_words``: the staging area's size (default :func:`radix_stage_words`; tests shrink it
    to reach the unstaged and compacted modes on small buffers). Histogram and gather atomics are
    32-bit increments of shared counters (ptxas aggregates same-address increments of a warp; a
    64-bit shared add is a compare-and-swap loop, which ~1,000 winners contending on one counter
    made slow).
    """
    t = block_topk(cap, block, has_ids)
    ID_PASSES = 8 if has_ids else 4
    SW = max(2, radix_stage_words(cap) if stage_words is None else stage_words)
    HALF = SW // 2
    pick_top = _pick_bin(block, True)
    pick_low = _pick_bin(block, False)

    @cuda.jit(device=True, inline=True)
    def id_of(slot, ids, start):
        if has_ids:
            return uint64(ids[start + slot])
        return uint64(slot)

    @cuda.jit(device=True, inline=True)
    def key_at(stage, mode, buf_s, r, j):
        if mode == FROM_BUFFER:
            return score_key(buf_s[r, j])
        return stage[j]

    @cuda.jit(device=True, inline=True)
    def index_at(stage, mode, j):
        if mode == FROM_PAIRS:
            return int64(stage[HALF + j])
        return j

    @cuda.jit(device=True, inline=True)
    def count_digit(hist, key, mask, prefix, shift):
        if (key & mask) == prefix:
            cuda.atomic.add(hist, (key >> shift) & uint32(RADIX - 1), 1)

    @cuda.jit(device=True)
    def stage_keys(stage, buf_s, r, m):
        """stage[j] = key of buffer entry j, j < m (whole block; ends synchronised)."""
        j = cuda.threadIdx.x
        while j + 3 * block < m:
            s0 = buf_s[r, j]
            s1 = buf_s[r, j + block]
            s2 = buf_s[r, j + 2 * block]
            s3 = buf_s[r, j + 3 * block]
            stage[j] = score_key(s0)
            stage[j + block] = score_key(s1)
            stage[j + 2 * block] = score_key(s2)
            stage[j + 3 * block] = score_key(s3)
            j += 4 * block
        while j < m:
            stage[j] = score_key(buf_s[r, j])
            j += block
        cuda.syncthreads()

    @cuda.jit(device=True)
    def histogram(hist, stage, mode, buf_s, r, count, mask, prefix, shift):
        """Count the digit at ``shift`` of the entries whose key matches ``prefix`` under ``mask``
        (whole block; entered and left synchronised)."""
        h = cuda.threadIdx.x
        while h < RADIX:
            hist[h] = 0
            h += block
        cuda.syncthreads()
        j = cuda.threadIdx.x
        if mode == FROM_BUFFER:  # 4 loads in flight: the buffer is in L2, ~1 us a round trip
            while j + 3 * block < count:
                k0 = score_key(buf_s[r, j])
                k1 = score_key(buf_s[r, j + block])
                k2 = score_key(buf_s[r, j + 2 * block])
                k3 = score_key(buf_s[r, j + 3 * block])
                count_digit(hist, k0, mask, prefix, shift)
                count_digit(hist, k1, mask, prefix, shift)
                count_digit(hist, k2, mask, prefix, shift)
                count_digit(hist, k3, mask, prefix, shift)
                j += 4 * block
        while j < count:
            count_digit(hist, key_at(stage, mode, buf_s, r, j), mask, prefix, shift)
            j += block
        cuda.syncthreads()

    @cuda.jit(device=True)
    def compact(stage, cnt, buf_s, r, m, mask, prefix):
        """Stage (key, buffer index) of every buffer entry whose masked key is at or above
        ``prefix`` (whole block; ends synchronised)."""
        j = cuda.threadIdx.x
        while j < m:
            key = score_key(buf_s[r, j])
            if (key & mask) >= prefix:
                pos = cuda.atomic.add(cnt, 0, 1)
                stage[pos] = key
                stage[HALF + pos] = uint32(j)
            j += block
        cuda.syncthreads()

    @cuda.jit
    def kernel(buf_s, buf_i, fill, offsets, ids, ks, out_s, out_slot, out_id):
        bs = cuda.shared.array(cap, float32)
        bi = cuda.shared.array(cap, int32)
        stage = cuda.shared.array(SW, uint32)
        hist = cuda.shared.array(RADIX, int32)
        tmp = cuda.shared.array(RADIX, int32)
        sel = cuda.shared.array(4, int64)  # [0] bin found, [1] entries still needed, [3] bin size
        cnt = cuda.shared.array(1, int32)  # entries compacted / gathered
        r = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        k = ks[r]
        start = offsets[r]
        sub = ids[start:] if has_ids else ids
        m = min(fill[r], buf_s.shape[1])  # a filter may count past its buffer (the host then reruns)
        if m <= skip_upto:
            return  # uniform: answered by the sort final
        kk = min(k, m)
        if tid == 0:
            cnt[0] = 0
        mode = FROM_BUFFER
        count = m
        if m <= SW:
            mode = FROM_KEYS
            stage_keys(stage, buf_s, r, m)  # its barrier also publishes cnt[0] = 0
        else:
            cuda.syncthreads()
        # --- 1. the kk-th largest score key, 8 bits at a time (most significant first)
        prefix = uint32(0)
        mask = uint32(0)
        need = kk
        ties = int64(0)  # entries whose masked key equals prefix (after the last pass run)
        p = 4 if kk == 0 else 0  # kk == 0: nothing to select, every output is a pad
        while p < 4:
            shift = uint32(24 - 8 * p)
            histogram(hist, stage, mode, buf_s, r, count, mask, prefix, shift)
            pick_top(hist, tmp, need, sel)
            prefix |= uint32(sel[0]) << shift
            mask |= uint32(RADIX - 1) << shift
            need = sel[1]
            ties = sel[3]
            p += 1
            if ties <= need:
                break  # the bin holds exactly the entries still needed: all of them win
            keep = kk - need + ties  # entries at or above the chosen bin
            if mode == FROM_BUFFER and keep <= HALF:
                compact(stage, cnt, buf_s, r, m, mask, prefix)
                mode = FROM_PAIRS
                count = keep
        # --- 2. among the ties (masked key == prefix), the `need` lowest ids: masked ids up to id_cut
        id_prefix = uint64(0)
        id_mask = uint64(0)
        take_all_ties = ties <= need
        if not take_all_ties and kk > 0:
            for p in range(ID_PASSES):
                shift = uint64(8 * (ID_PASSES - 1 - p))
                h = tid
                while h < RADIX:
                    hist[h] = 0
                    h += block
                cuda.syncthreads()
                j = tid
                while j < count:
                    if key_at(stage, mode, buf_s, r, j) == prefix:
                        u = id_of(buf_i[r, index_at(stage, mode, j)], ids, start)
                        if (u & id_mask) == id_prefix:
                            cuda.atomic.add(hist, int64((u >> shift) & uint64(RADIX - 1)), 1)
                    j += block
                cuda.syncthreads()
                pick_low(hist, tmp, need, sel)
                id_prefix |= uint64(sel[0]) << shift
                id_mask |= uint64(RADIX - 1) << shift
                need = sel[1]
                if sel[3] <= need:
                    break  # every id in the chosen bin wins
                cuda.syncthreads()  # sel is rewritten by the next pass's pick
        # --- 3. gather the winners (at most kk: guards against repeated ids), sort, write
        if tid == 0:
            cnt[0] = 0
        cuda.syncthreads()
        j = tid
        while j < count:
            km = key_at(stage, mode, buf_s, r, j) & mask
            win = km > prefix
            idx = index_at(stage, mode, j)
            if km == prefix:
                win = take_all_ties or (id_of(buf_i[r, idx], ids, start) & id_mask) <= id_prefix
            if win:
                pos = cuda.atomic.add(cnt, 0, 1)
                if pos < kk:
                    bs[pos] = buf_s[r, idx]
                    bi[pos] = buf_i[r, idx]
            j += block
        cuda.syncthreads()
        P = 2
        while P < kk:
            P *= 2
        q = kk + tid
        while q < P:
            bs[q] = NEG_INF
            bi[q] = -1
            q += block
        cuda.syncthreads()
        t.sort(bs, bi, sub, P)
        kmax = out_s.shape[1]
        q = tid
        while q < kmax:
            if q < kk:
                out_s[r, q] = bs[q]
                out_slot[r, q] = bi[q]
                out_id[r, q] = ids[start + bi[q]] if has_ids else bi[q]
            else:
                out_s[r, q] = NEG_INF
                out_slot[r, q] = -1
                out_id[r, q] = -1
            q += block

    return kernel
