"""Bitset targeting kernels: the match (one request or a batch), the list scatter / clear passes
around it, real-time index updates, and candidate compaction.

All slot and word arithmetic is int64 (pools beyond 2^31 bits); ``slot_base`` (a multiple of 64)
is the slot of bit 0 of word 0 of the arrays a kernel writes, 0 except when a kernel works on a
window of a larger virtual pool (tests at large offsets).

One request's device work, in stream order (host wrappers: :mod:`andromeda_nb.match.api`):

1. :func:`prep_kernel`: zero the result counts; scatter the slots of the user's sparse include
   lists into the request's patch rows (``atomic or``).
2. :func:`match_kernel`: per 64-ad word, ``e = AND over categories (OR of include rows) & ~(OR of
   exclude rows)``, most selective category first; a word stops reading once ``e == 0`` and an OR
   stops once it covers ``e``; write ``e`` (last word ANDed with the valid-bit mask) and add its
   popcount.
3. :func:`post_kernel`: clear the slots of the user's sparse exclude lists and of the caller's
   exclude slots from the result (``atomic and``, count decremented per bit actually cleared), and
   zero the patch rows' touched words again.

Bytes per request (count first): ``8 * n_words`` per row read for words still alive (32-byte
sectors: a warp's load covers 32 consecutive words, so a sector is read when any of its 4 words
is alive), plus ``n_words * 8`` written, plus the lists' entries (4 or 8 bytes each) and one
32-byte sector per scattered / cleared entry.
"""

import functools

from numba import cuda, int32, int64, uint64

ALL = uint64(0xFFFFFFFFFFFFFFFF)
MASK40 = (1 << 40) - 1
#: Requests per launch of the post pass (its per-block decrement table lives in shared memory).
MAX_BATCH = 64


@cuda.jit(device=True, inline=True)
def last_mask(n_bits, n_words):
    """Valid bits of word ``n_words - 1`` of an ``n_bits``-long bitset."""
    rem = n_bits - (n_words - 1) * 64
    if rem >= 64:
        return ALL
    return (uint64(1) << uint64(rem)) - uint64(1)


@functools.lru_cache(maxsize=None)
def _result_words(block: int, U: int):
    """Inline device function shared by the match kernels: write a thread's ``U`` result words
    (``e[u]`` at word ``base + u * block + tid``, the last word masked to the valid bits) and
    return their popcount."""

    @cuda.jit(device=True, inline=True)
    def store(out, b, e, base, tid, n_words, lmask):
        n = int64(0)
        for u in range(U):
            w = base + u * block + tid
            if w < n_words:
                x = e[u]
                if w == n_words - 1:
                    x &= lmask
                out[b, w] = x
                n += int64(cuda.popc(x))
        return n

    return store


@cuda.jit(device=True, inline=True)
def add_count(counts, b, block_count, mine):
    """Sum the threads' counts in shared ``block_count[0]`` (zeroed and synchronised at the
    start), then one global add to ``counts[b]``."""
    cuda.atomic.add(block_count, 0, mine)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        cuda.atomic.add(counts, b, block_count[0])


@functools.lru_cache(maxsize=None)
def match_kernel(block: int, words_per_thread: int = 4, min_blocks_per_sm: int = 0, prefetch: bool = False):
    """The match. Launch ``[(gx, B), block]``, ``blockIdx.y`` = request.

    Thread ``t`` of a block handles words ``base + u * block + t`` (``u < words_per_thread``) of
    each tile of ``block * words_per_thread`` words, grid-stride over tiles: for a fixed ``u`` a
    warp reads 32 consecutive words (256 contiguous bytes), and each thread has
    ``words_per_thread`` independent loads in flight per row.

    Args: ``rows uint64[n_rows, W]`` (index rows), ``scratch uint64[n_scratch, W]`` (patch rows;
    a plan row id ``r >= n_rows`` reads ``scratch[r - n_rows]``), ``n_bits int64`` (valid bits:
    the pool, or a prefix of it), ``n_words int64`` (words matched, ``<= W``), ``req_cat
    int64[B + 1]`` (request ``b`` owns categories ``req_cat[b]:req_cat[b + 1]``), ``inc_ptr,
    exc_ptr int64[C + 1]`` and ``inc_rows, exc_rows int64[...]`` (every request's categories in
    reading order), ``out uint64[B, >= n_words]``, ``counts int64[B]`` (incremented; zero them
    first).

    ``min_blocks_per_sm`` > 0 sets launch bounds ``(block, min_blocks_per_sm)`` (the compiler caps
    registers so that many blocks fit on an SM: more warps, more loads in flight; the default
    bounds per words per thread: :data:`andromeda_nb.match.config.THREADS_PER_SM_BOUNDS`).

    ``prefetch``: while a category's first include row is loading, also load the next category's
    first include row for the words still alive *before* this category (a superset of the words
    that will need it), so two rows are in flight instead of one: the chain of dependent loads
    halves where categories have one include row, for the bytes of words this category kills.
    """
    U = int(words_per_thread)
    PF = bool(prefetch)
    # the simulator's cuda.jit takes no launch_bounds: pass it only when set
    opts = {"launch_bounds": (int(block), int(min_blocks_per_sm))} if min_blocks_per_sm else {}
    store = _result_words(int(block), U)

    @cuda.jit(device=True, inline=True)
    def load_row(rows, scratch, r, nr, wb, e, acc, new_only, t):
        """``t[u]`` = word ``wb + u * block`` of row ``r`` (a scratch patch row when ``r >= nr``) for
        the words still needed, else 0: alive (``e[u]``), and with ``new_only`` not yet covered by
        this category's OR (``acc[u]``). The row-or-scratch branch is taken once per row, outside
        the per-word loop."""
        if r < nr:
            ru = uint64(r)
            for u in range(U):
                t[u] = uint64(0)
                if (e[u] & ~acc[u] if new_only else e[u]) != 0:
                    t[u] = rows[ru, wb + uint64(u * block)]
        else:
            ru = uint64(r - nr)
            for u in range(U):
                t[u] = uint64(0)
                if (e[u] & ~acc[u] if new_only else e[u]) != 0:
                    t[u] = scratch[ru, wb + uint64(u * block)]

    @cuda.jit(**opts)
    def kernel(rows, scratch, n_bits, n_words, req_cat, inc_ptr, inc_rows, exc_ptr, exc_rows, out, counts):
        block_count = cuda.shared.array(1, int64)
        tid = cuda.threadIdx.x
        if tid == 0:
            block_count[0] = 0
        cuda.syncthreads()
        b = cuda.blockIdx.y
        c0 = req_cat[b]
        c1 = req_cat[b + 1]
        nr = rows.shape[0]
        lmask = last_mask(n_bits, n_words)
        e = cuda.local.array(U, uint64)
        acc = cuda.local.array(U, uint64)
        t = cuda.local.array(U, uint64)
        tn = cuda.local.array(U, uint64)  # the next category's first include row (prefetch)
        mine = int64(0)
        tile = int64(block) * U
        base = int64(cuda.blockIdx.x) * tile
        step = int64(cuda.gridDim.x) * tile
        while base < n_words:
            # unsigned indices: no negative-index wraparound code per load (fewer registers and
            # instructions; the loads take immediate offsets from one address)
            wb = uint64(base + tid)
            alive = uint64(0)
            for u in range(U):
                w = base + u * block + tid
                e[u] = ALL if w < n_words else uint64(0)
                alive |= e[u]
            c = c0
            have_next = False
            while c < c1 and alive != 0:
                for u in range(U):
                    acc[u] = uint64(0)
                j0 = inc_ptr[c]
                pf_here = PF and c + 1 < c1 and inc_ptr[c + 2] > inc_ptr[c + 1] and inc_ptr[c + 1] > j0
                for j in range(j0, inc_ptr[c + 1]):
                    r = inc_rows[j]
                    # all loads first (independent, in flight together), then the ORs
                    if PF and j == j0 and have_next:  # loaded during the previous category
                        for u in range(U):
                            t[u] = tn[u]
                    else:
                        load_row(rows, scratch, r, nr, wb, e, acc, True, t)
                    if pf_here and j == j0:  # the next category's first row, for words alive now
                        load_row(rows, scratch, inc_rows[inc_ptr[c + 1]], nr, wb, e, acc, False, tn)
                    for u in range(U):
                        acc[u] |= t[u]
                have_next = pf_here
                alive = uint64(0)
                for u in range(U):
                    e[u] &= acc[u]
                    alive |= e[u]
                for j in range(exc_ptr[c], exc_ptr[c + 1]):
                    load_row(rows, scratch, exc_rows[j], nr, wb, e, acc, False, t)
                    for u in range(U):
                        e[u] &= ~t[u]
                if exc_ptr[c + 1] > exc_ptr[c]:
                    alive = uint64(0)
                    for u in range(U):
                        alive |= e[u]
                c += 1
            mine += store(out, b, e, base, tid, n_words, lmask)
            base += step
        add_count(counts, b, block_count, mine)

    return kernel


#: Op kinds of the grouped match's flattened plan (bit flags): FIRST starts a category's include OR
#: (``acc = row`` instead of ``acc |= row``), CLOSE ends it (``e &= acc``), EXC removes a row
#: (``e &= ~row``), ZERO empties the set (a category whose include set is empty; no row read).
OP_FIRST, OP_CLOSE, OP_EXC, OP_ZERO = 1, 2, 4, 8


@functools.lru_cache(maxsize=None)
def match_grouped_kernel(block: int, words_per_thread: int = 4, group: int = 4, min_blocks_per_sm: int = 0):
    """The match with loads issued ``group`` rows at a time. Launch ``[(gx, B), block]``.

    Same words per thread and result as :func:`match_kernel`, but the request's plan is a flat list
    of row ops (``op_row``, ``op_kind``: OP_* flags; request ``b`` owns ops ``req_op[b]:req_op[b +
    1]``), and a thread loads the next ``group`` rows together, for every word alive before them,
    before combining them in order. The plain kernel's chain of dependent loads is one row deep
    per row of the plan (about 20 rows per request on the benchmark world, and words rarely die
    early), so it is latency-bound; here the chain is ``rows / group`` deep and ``group *
    words_per_thread`` loads are in flight per thread. The price: a word that dies inside a group
    still had the group's rows read, and include rows are read even where the category's OR
    already covers the word.

    Args: ``rows``, ``scratch``, ``n_bits``, ``n_words``, ``out``, ``counts`` as in
    :func:`match_kernel`; ``req_op int64[B + 1]``, ``op_row int64[...]`` (a row id ``>= n_rows``
    reads ``scratch``), ``op_kind int64[...]``.
    """
    U = int(words_per_thread)
    G = int(group)
    GU = G * U
    opts = {"launch_bounds": (int(block), int(min_blocks_per_sm))} if min_blocks_per_sm else {}
    store = _result_words(int(block), U)

    @cuda.jit(device=True, inline=True)
    def load_alive(rows, scratch, r, nr, wb, e, t, off):
        """``t[off + u]`` = word ``wb + u * block`` of row ``r`` where word u is alive, else 0."""
        if r < nr:
            ru = uint64(r)
            for u in range(U):
                t[off + u] = uint64(0)
                if e[u] != 0:
                    t[off + u] = rows[ru, wb + uint64(u * block)]
        else:
            ru = uint64(r - nr)
            for u in range(U):
                t[off + u] = uint64(0)
                if e[u] != 0:
                    t[off + u] = scratch[ru, wb + uint64(u * block)]

    @cuda.jit(**opts)
    def kernel(rows, scratch, n_bits, n_words, req_op, op_row, op_kind, out, counts):
        block_count = cuda.shared.array(1, int64)
        tid = cuda.threadIdx.x
        if tid == 0:
            block_count[0] = 0
        cuda.syncthreads()
        b = cuda.blockIdx.y
        j0 = req_op[b]
        j1 = req_op[b + 1]
        nr = rows.shape[0]
        lmask = last_mask(n_bits, n_words)
        e = cuda.local.array(U, uint64)
        acc = cuda.local.array(U, uint64)
        t = cuda.local.array(GU, uint64)
        mine = int64(0)
        tile = int64(block) * U
        base = int64(cuda.blockIdx.x) * tile
        step = int64(cuda.gridDim.x) * tile
        while base < n_words:
            wb = uint64(base + tid)
            alive = uint64(0)
            for u in range(U):
                w = base + u * block + tid
                e[u] = ALL if w < n_words else uint64(0)
                acc[u] = uint64(0)
                alive |= e[u]
            j = j0
            while j < j1 and alive != 0:
                # every load of the group first (independent, in flight together), then the ops in order
                for g in range(G):
                    if j + g < j1 and (op_kind[j + g] & OP_ZERO) == 0:
                        load_alive(rows, scratch, op_row[j + g], nr, wb, e, t, g * U)
                for g in range(G):
                    if j + g < j1:
                        kind = op_kind[j + g]
                        for u in range(U):
                            x = t[g * U + u]
                            if kind & OP_ZERO:
                                e[u] = uint64(0)
                            elif kind & OP_EXC:
                                e[u] &= ~x
                            else:
                                acc[u] = x if kind & OP_FIRST else acc[u] | x
                                if kind & OP_CLOSE:
                                    e[u] &= acc[u]
                alive = uint64(0)
                for u in range(U):
                    alive |= e[u]
                j += G
            mine += store(out, b, e, base, tid, n_words, lmask)
            base += step
        add_count(counts, b, block_count, mine)

    return kernel


@cuda.jit(device=True, inline=True)
def find_segment(seg_off, n_seg, i):
    """The segment ``k`` with ``seg_off[k] <= i < seg_off[k + 1]`` (binary search)."""
    lo = 0
    hi = n_seg
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if seg_off[mid] <= i:
            lo = mid
        else:
            hi = mid
    return lo


@cuda.jit(device=True, inline=True)
def patch_set(scratch, row, s, slot_base):
    """Set slot ``s``'s bit in patch row ``row`` (a removed entry, ``s < 0``, or a slot past the
    row: nothing)."""
    if s >= 0:
        t = s - slot_base
        w = t >> 6
        if w < scratch.shape[1]:
            cuda.atomic.or_(scratch, (row, w), uint64(1) << uint64(t & 63))


@cuda.jit(device=True, inline=True)
def patch_zero(scratch, row, s, slot_base):
    """Zero the word of patch row ``row`` that holds slot ``s`` (as :func:`patch_set`, nothing for
    ``s < 0`` or past the row)."""
    if s >= 0:
        w = (s - slot_base) >> 6
        if w < scratch.shape[1]:
            scratch[row, w] = uint64(0)


@functools.lru_cache(maxsize=None)
def prep_kernel():
    """Zero ``counts[0:n_counts]``; set in patch row ``seg_dst[k]`` of ``scratch`` the bit of every
    slot listed in ``pool[seg_start[k] : seg_start[k] + seg_len[k]]`` (negative entries are removed
    ones, skipped). Launch ``[grid, block]``, grid-stride over all segments' entries (``seg_off``:
    their exclusive prefix sums, ``int64[n_seg + 1]``).

    Args: ``counts int64[>= n_counts]``, ``n_counts int64``, ``pool int32|int64[...]``,
    ``seg_start, seg_off, seg_dst int64``, ``scratch uint64[n_scratch, W]``, ``slot_base int64``.
    """

    @cuda.jit
    def kernel(counts, n_counts, pool, seg_start, seg_off, seg_dst, scratch, slot_base):
        gid = cuda.grid(1)
        gs = cuda.gridsize(1)
        for i in range(gid, n_counts, gs):
            counts[i] = 0
        n_seg = seg_dst.shape[0]
        total = seg_off[n_seg]
        i = int64(gid)
        while i < total:
            k = find_segment(seg_off, n_seg, i)
            patch_set(scratch, seg_dst[k], int64(pool[seg_start[k] + i - seg_off[k]]), slot_base)
            i += gs

    return kernel


@functools.lru_cache(maxsize=None)
def post_kernel(block: int):
    """Clear listed slots from results, and zero patch rows again. Launch ``[grid, block]``,
    grid-stride over all segments' entries.

    Segment ``k`` covers ``seg_off[k]:seg_off[k + 1]`` of the flattened entries; its entries are
    ``src[seg_start[k] + j]`` where ``src`` is ``pool`` (op 0, 2) or ``extra`` (op 1).
    Op 0 / 1: clear the slot's bit in ``out[seg_arg[k]]`` and decrement ``counts[seg_arg[k]]``
    when the bit was set (``seg_arg < MAX_BATCH``). Op 2: zero the slot's word in patch row
    ``scratch[seg_arg[k]]``. Negative entries are skipped; slots past ``n_words`` words are ignored.
    """

    @cuda.jit
    def kernel(out, counts, n_words, pool, extra, seg_start, seg_off, seg_op, seg_arg, scratch, slot_base):
        dec = cuda.shared.array(MAX_BATCH, int64)
        tid = cuda.threadIdx.x
        for j in range(tid, MAX_BATCH, block):
            dec[j] = 0
        cuda.syncthreads()
        n_seg = seg_op.shape[0]
        total = seg_off[n_seg]
        width = n_words
        gs = cuda.gridsize(1)
        i = int64(cuda.grid(1))
        while i < total:
            k = find_segment(seg_off, n_seg, i)
            op = seg_op[k]
            q = seg_start[k] + i - seg_off[k]
            s = int64(extra[q]) if op == 1 else int64(pool[q])
            if op == 2:
                patch_zero(scratch, seg_arg[k], s, slot_base)
            elif s >= 0:
                t = s - slot_base
                w = t >> 6
                if w < width:
                    bit = uint64(1) << uint64(t & 63)
                    if out[seg_arg[k], w] & bit:  # most listed ads are not eligible: read first
                        old = cuda.atomic.and_(out, (seg_arg[k], w), ~bit)
                        if old & bit:
                            cuda.atomic.add(dec, seg_arg[k], 1)
            i += gs
        cuda.syncthreads()
        for j in range(tid, MAX_BATCH, block):
            if dec[j] != 0:
                cuda.atomic.sub(counts, j, dec[j])

    return kernel


#: entries a thread of the segment-grid list passes loads together (independent loads in flight)
SEG_LOADS = 4


@functools.lru_cache(maxsize=None)
def prep_segment_kernel(block: int):
    """:func:`prep_kernel` on a segment grid: launch ``[(gx, max(1, n_seg)), block]`` with
    ``gx * block * SEG_LOADS`` at least the longest segment. Block ``(x, y)`` takes entries
    ``x * block * SEG_LOADS ..`` of segment ``y`` (its ``SEG_LOADS`` loads a thread issued
    together), so no entry needs a search for its segment; block (0, 0) zeroes the counts. Same
    arguments and result as :func:`prep_kernel`."""
    B = int(block)

    @cuda.jit
    def kernel(counts, n_counts, pool, seg_start, seg_off, seg_dst, scratch, slot_base):
        tid = cuda.threadIdx.x
        if cuda.blockIdx.x == 0 and cuda.blockIdx.y == 0:
            for i in range(tid, n_counts, B):
                counts[i] = 0
        k = cuda.blockIdx.y
        if k >= seg_dst.shape[0]:
            return
        length = seg_off[k + 1] - seg_off[k]
        first = int64(cuda.blockIdx.x) * (B * SEG_LOADS) + tid
        src = seg_start[k]
        row = seg_dst[k]
        s = cuda.local.array(SEG_LOADS, int64)
        for u in range(SEG_LOADS):  # the loads first, in flight together
            j = first + u * B
            s[u] = int64(pool[src + j]) if j < length else int64(-1)
        for u in range(SEG_LOADS):
            patch_set(scratch, row, s[u], slot_base)

    return kernel


@functools.lru_cache(maxsize=None)
def post_segment_kernel(block: int):
    """:func:`post_kernel` on a segment grid: launch ``[(gx, n_seg), block]`` with ``gx * block *
    SEG_LOADS`` at least the longest segment; block ``(x, y)`` takes entries ``x * block *
    SEG_LOADS ..`` of segment ``y``: its op and argument are the block's, each thread's
    ``SEG_LOADS`` list loads, then its result-word loads, are in flight together, and the block
    subtracts its cleared bits from the request's count with one atomic. Same arguments and
    result as :func:`post_kernel`."""
    B = int(block)

    @cuda.jit
    def kernel(out, counts, n_words, pool, extra, seg_start, seg_off, seg_op, seg_arg, scratch, slot_base):
        dec = cuda.shared.array(1, int32)
        tid = cuda.threadIdx.x
        if tid == 0:
            dec[0] = 0
        cuda.syncthreads()
        k = cuda.blockIdx.y
        length = seg_off[k + 1] - seg_off[k]
        first = int64(cuda.blockIdx.x) * (B * SEG_LOADS) + tid
        src = seg_start[k]
        op = seg_op[k]
        arg = seg_arg[k]
        s = cuda.local.array(SEG_LOADS, int64)
        x = cuda.local.array(SEG_LOADS, uint64)
        for u in range(SEG_LOADS):  # the list loads first, in flight together
            j = first + u * B
            s[u] = int64(-1)
            if j < length:
                s[u] = int64(extra[src + j]) if op == 1 else int64(pool[src + j])
        if op == 2:  # zero the patch row's touched words
            for u in range(SEG_LOADS):
                patch_zero(scratch, arg, s[u], slot_base)
            return  # uniform: the op is the block's
        for u in range(SEG_LOADS):  # then the result words, in flight together
            x[u] = uint64(0)
            if s[u] >= 0 and ((s[u] - slot_base) >> 6) < n_words:
                x[u] = out[arg, (s[u] - slot_base) >> 6]
        cleared = int32(0)
        for u in range(SEG_LOADS):
            if s[u] >= 0:
                t = s[u] - slot_base
                bit = uint64(1) << uint64(t & 63)
                if x[u] & bit:  # most listed ads are not eligible: read first
                    old = cuda.atomic.and_(out, (arg, t >> 6), ~bit)
                    if old & bit:
                        cleared += 1
        if cleared:
            cuda.atomic.add(dec, 0, cleared)
        cuda.syncthreads()
        if tid == 0 and dec[0] != 0:
            cuda.atomic.sub(counts, arg, int64(dec[0]))

    return kernel


@functools.lru_cache(maxsize=None)
def apply_kernel():
    """Apply one update batch: ``buf int64 = [bit codes (n_bits)] [pool positions (n_pos)]
    [pool values (n_pos)]``. Each code ``row << 40 | slot`` names a bit that *changes* (the host
    computed the net difference between the old and the new state), so it is flipped with one
    ``atomic xor`` (one atomic kind for all codes: no set/clear ordering question, and the CUDA
    simulator's per-kind atomic locks cannot race); then ``pool[pos] = value``. Codes name
    distinct (row, slot) pairs and positions are distinct, so the order does not matter.
    Launch ``[grid, block]``, grid-stride.
    """

    @cuda.jit
    def kernel(rows, pool, buf, n_bits, n_pos, slot_base):
        gs = cuda.gridsize(1)
        i = int64(cuda.grid(1))
        while i < n_bits:
            code = buf[i]
            t = (code & MASK40) - slot_base
            cuda.atomic.xor(rows, (code >> 40, t >> 6), uint64(1) << uint64(t & 63))
            i += gs
        i = int64(cuda.grid(1))
        while i < n_pos:
            pool[buf[n_bits + i]] = buf[n_bits + n_pos + i]
            i += gs

    return kernel


#: what a bitset row holds, as :meth:`~andromeda_nb.targeting.TargetingIndex.row_meanings` names
#: it: ``(kind, arg, val)`` a row; a slot's bit in it, from the slot's rule (:func:`flip_kernel`)
ROW_LIVE, ROW_UNC, ROW_INC, ROW_EXC, ROW_GROUP = 0, 1, 2, 3, 4


@cuda.jit(device=True, inline=True)
def lower_bound(codes, lo, hi, key):
    while lo < hi:
        mid = (lo + hi) >> 1
        if codes[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


@cuda.jit(device=True, inline=True)
def has_code(codes, lo, hi, key):
    p = lower_bound(codes, lo, hi, key)
    return p < hi and codes[p] == key


@cuda.jit(device=True, inline=True)
def unconstrained(codes, lo, hi, c):
    """No include code of category ``c`` in the rule ``codes[lo:hi]`` (sorted)."""
    key = int64(c) << 33
    p = lower_bound(codes, lo, hi, key)
    return not (p < hi and codes[p] < key + (int64(1) << 32))


@cuda.jit(device=True, inline=True)
def allows(codes, lo, hi, c, v, m):
    """Whether the rule admits value ``v`` of folded category ``c`` (``v == m``: the user has none)."""
    unc = unconstrained(codes, lo, hi, c)
    if v == m:
        return unc
    key = int64(c) << 33
    return (unc or has_code(codes, lo, hi, key | v)) and not has_code(codes, lo, hi, key | (int64(1) << 32) | v)


@functools.lru_cache(maxsize=None)
def flip_kernel():
    """Bring the touched slots' bits in every row to what their rules say: the device half of an
    update batch where the host keeps no bitset rows (it sends each touched slot's final rule,
    a few codes an op, instead of its ~400 bit flips an op).

    ``buf int64 = [slots (n)] [live (n)] [ptr (n + 1)] [codes]``: slot ``slots[i]``'s rule is
    ``codes[ptr[i]:ptr[i + 1]]`` (``(cat << 33) | (kind << 32) | value``, sorted), ``live[i]``
    its live flag (a freed slot: not live, no codes). ``meaning int64 [3, n_rows]``: each row's
    ``(kind, arg, val)`` (:data:`ROW_LIVE` ...). A thread owns one row and ``per`` consecutive
    slots (grid ``(rows / block, slots / per)``): it evaluates the row's predicate on each rule,
    reads the slot's bit and flips it (``atomic xor``, as :func:`apply_kernel`) where it
    differs; the slots are distinct, so no two threads own a bit. The row's popcount change goes
    into ``change[row]`` (zero before) with one ``atomic add`` a thread.
    """

    @cuda.jit
    def kernel(rows, change, meaning, group_ptr, group_members, cat_m, carrier, buf, n, per):
        r = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if r >= rows.shape[0]:
            return
        kind = meaning[0, r]
        arg = meaning[1, r]
        val = meaning[2, r]
        codes = buf[3 * n + 1:]
        i0 = int64(cuda.blockIdx.y) * per
        i1 = min(i0 + per, n)
        diff = int64(0)
        for i in range(i0, i1):
            s = buf[i]
            lo = buf[2 * n + i]
            hi = buf[2 * n + i + 1]
            live = buf[n + i] != 0
            if kind == ROW_LIVE:
                bit = live
            elif kind == ROW_UNC:
                bit = unconstrained(codes, lo, hi, arg)
            elif kind == ROW_INC:
                bit = unconstrained(codes, lo, hi, arg) or has_code(codes, lo, hi, (arg << 33) | val)
            elif kind == ROW_EXC:
                bit = has_code(codes, lo, hi, (arg << 33) | (int64(1) << 32) | val)
            else:  # a folded group's value combination: mixed radix over its members, first fastest
                bit = live or arg != carrier
                combo = val
                for t in range(group_ptr[arg], group_ptr[arg + 1]):
                    c = group_members[t]
                    m = cat_m[c]
                    if bit:
                        bit = allows(codes, lo, hi, c, combo % (m + 1), m)
                    combo //= m + 1
            word = s >> 6
            mask = uint64(1) << uint64(s & 63)
            if ((rows[r, word] & mask) != 0) != bit:
                cuda.atomic.xor(rows, (r, word), mask)
                diff += 1 if bit else -1
        if diff != 0:
            cuda.atomic.add(change, r, diff)

    return kernel


@functools.lru_cache(maxsize=None)
def fill_kernel():
    """``rows[:, :] = value`` (uint64). Launch ``[grid, block]``, grid-stride over the words."""

    @cuda.jit
    def kernel(rows, value):
        n = rows.shape[1]
        total = int64(rows.shape[0]) * n
        gs = cuda.gridsize(1)
        i = int64(cuda.grid(1))
        while i < total:
            rows[i // n, i % n] = value
            i += gs

    return kernel


@functools.lru_cache(maxsize=None)
def chunk_count_kernel(block: int):
    """Set bits per chunk of ``chunk`` words of ``words[b, :n_words]``: ``counts[k]`` for chunk
    ``k``. Launch ``[grid, block]``; blocks grid-stride over chunks."""

    @cuda.jit
    def kernel(words, b, n_words, chunk, counts):
        total = cuda.shared.array(1, int64)
        tid = cuda.threadIdx.x
        n_chunks = (n_words + chunk - 1) // chunk
        k = int64(cuda.blockIdx.x)
        while k < n_chunks:
            if tid == 0:
                total[0] = 0
            cuda.syncthreads()
            mine = int64(0)
            w = k * chunk + tid
            end = min(n_words, (k + 1) * chunk)
            while w < end:
                mine += int64(cuda.popc(words[b, w]))
                w += block
            cuda.atomic.add(total, 0, mine)
            cuda.syncthreads()
            if tid == 0:
                counts[k] = total[0]
            cuda.syncthreads()
            k += cuda.gridDim.x

    return kernel


@functools.lru_cache(maxsize=None)
def compact_kernel(block: int):
    """Write the slots of the set bits of ``words[b, :n_words]`` in ascending order to ``out``
    (int32 or int64; ``slot_base`` added). ``counts``: per-chunk set bits from
    :func:`chunk_count_kernel` with the same ``chunk``. Launch ``[grid, block]``; blocks
    grid-stride over chunks; each chunk finds its offset (sum of the counts before it), then
    walks its words ``block`` at a time with a block-wide exclusive scan of their popcounts.
    """

    @cuda.jit
    def kernel(words, b, n_words, chunk, counts, out, slot_base):
        scan = cuda.shared.array(block, int64)
        offset = cuda.shared.array(1, int64)
        tid = cuda.threadIdx.x
        n_chunks = (n_words + chunk - 1) // chunk
        k = int64(cuda.blockIdx.x)
        while k < n_chunks:
            if tid == 0:
                offset[0] = 0
            cuda.syncthreads()
            part = int64(0)
            for j in range(tid, k, block):
                part += counts[j]
            cuda.atomic.add(offset, 0, part)
            cuda.syncthreads()
            pos0 = offset[0]
            start = k * chunk
            end = min(n_words, (k + 1) * chunk)
            r = start
            while r < end:
                w = r + tid
                x = words[b, w] if w < end else uint64(0)
                pc = int64(cuda.popc(x))
                scan[tid] = pc
                cuda.syncthreads()
                d = 1
                while d < block:
                    add = scan[tid - d] if tid >= d else int64(0)
                    cuda.syncthreads()
                    scan[tid] += add
                    cuda.syncthreads()
                    d *= 2
                p = pos0 + scan[tid] - pc
                round_total = scan[block - 1]
                slot = slot_base + w * 64
                while x != 0:
                    low = x & (~x + uint64(1))
                    bitpos = int64(cuda.popc(low - uint64(1)))
                    out[p] = slot + bitpos
                    p += 1
                    x ^= low
                cuda.syncthreads()
                pos0 += round_total
                r += block
            k += cuda.gridDim.x

    return kernel


@functools.lru_cache(maxsize=None)
def clear_bits_kernel():
    """Clear the bits of listed slots in a bitset and subtract the bits that were set from ``count``.

    Launch ``[grid, block]`` over the list. Args: ``words uint64[n_words]``, ``slots int64[m]``,
    ``count int64[1]``. Slots must be in range (the wrapper checks); duplicates are harmless.
    """

    @cuda.jit
    def kernel(words, slots, count):
        for t in range(cuda.grid(1), slots.shape[0], cuda.gridsize(1)):
            s = slots[t]
            bit = uint64(1) << uint64(s & 63)
            old = cuda.atomic.and_(words, s >> 6, ~bit)
            if old & bit:
                cuda.atomic.sub(count, 0, 1)

    return kernel
