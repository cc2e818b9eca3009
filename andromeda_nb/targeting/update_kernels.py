"""Numba host kernels of real-time updates: the current rule codes of touched slots, their net
bit flips and list operations (old rule -> new rule), list maintenance in the host pool, and the
host copy's bit flips.

Imported inside :meth:`~andromeda_nb.targeting.index.TargetingIndex.apply` (see :mod:`.numba_common`).
"""

import numpy as np

# numba_common first: it fixes the backend before numba is imported
from .numba_common import ONE
from numba import njit, prange, uint64

from .updates import CHANGE, CREATE


#: slots from which :meth:`~.index.TargetingIndex._rule_codes` runs :data:`gather_codes_parallel`
#: (below, a parallel region's start costs more than the slots take on one core; at 10^4 slots of
#: a 2 x 10^6-slot index, two cores take 6 ms against one core's 10 ms: random reads of the columns)
GATHER_PARALLEL_MIN = 1 << 12


def _gather_codes(ptrs, vals, colhi, slots, n_base):
    """Rule codes ``(cat << 33) | (kind << 32) | value`` of the given base slots, sorted per slot
    (columns come in (cat, kind) order and values are sorted within a column), as ``(ptr,
    codes)``. Column by column, a column's slots in parallel in :data:`gather_codes_parallel`
    (every slot of an index: the rebuilds that check updates, and a pool's growth)."""
    k = slots.size
    out_ptr = np.zeros(k + 1, np.int64)
    for j in range(len(ptrs)):
        p = ptrs[j]
        for i in prange(k):
            s = slots[i]
            if s < n_base:
                out_ptr[i + 1] += p[s + 1] - p[s]
    for i in range(k):
        out_ptr[i + 1] += out_ptr[i]
    cursor = out_ptr[:k].copy()
    codes = np.empty(out_ptr[k], np.int64)
    for j in range(len(ptrs)):
        p = ptrs[j]
        v = vals[j]
        hi = colhi[j]
        for i in prange(k):
            s = slots[i]
            if s >= n_base:
                continue
            o = cursor[i]
            for q in range(p[s], p[s + 1]):
                codes[o] = hi | np.int64(v[q])
                o += 1
            cursor[i] = o
    return out_ptr, codes


gather_codes = njit(cache=True)(_gather_codes)
gather_codes_parallel = njit(parallel=True)(_gather_codes)  # not cached: one cache entry per function


@njit(parallel=True, cache=True)
def gather_slot_codes(ptr, codes, n_base, overlaid, ov_start, ov_len, ov_codes, slots):
    """:func:`_gather_codes` from rules held slot by slot: the build's (``codes[ptr[s]:ptr[s + 1]]``
    the codes of slot ``s``, none at or past ``n_base``) unless the update overlay holds the slot's
    current rule (``overlaid[s]``: ``ov_codes[ov_start[s]:][:ov_len[s]]``). A slot's codes are one
    contiguous run, where the columns scatter them over ~2 x 40 arrays; the runs are copied in
    parallel (random reads of large arrays, bound by memory latency)."""
    k = slots.size
    out_ptr = np.zeros(k + 1, np.int64)
    for i in prange(k):
        s = slots[i]
        out_ptr[i + 1] = ov_len[s] if overlaid[s] else (ptr[s + 1] - ptr[s] if s < n_base else 0)
    for i in range(k):
        out_ptr[i + 1] += out_ptr[i]
    out = np.empty(out_ptr[k], np.int64)
    for i in prange(k):
        s = slots[i]
        o = out_ptr[i]
        if overlaid[s]:
            for q in range(ov_start[s], ov_start[s] + ov_len[s]):
                out[o] = ov_codes[q]
                o += 1
        elif s < n_base:
            for q in range(ptr[s], ptr[s + 1]):
                out[o] = codes[q]
                o += 1
    return out_ptr, out


@njit(parallel=True, cache=True)
def codes_by_column(ptr, codes, col_of):
    """Rule codes held op by op (``codes[ptr[i]:ptr[i + 1]]``, sorted: a column's run is
    contiguous) regrouped as one CSR per column, the rule format of
    :class:`~.rules.TargetingRules`: ``col_ptr[j]`` (int64, ops + 1) and ``vals`` (int32 values,
    column ``j``'s at ``vals[col_off[j]:col_off[j + 1]]``, op by op). ``col_of``: column (code >>
    32) -> its row in ``col_ptr``, -1 for a column no code uses. In parallel over ops: every slot
    of an index (a rebuild, a pool's growth) regroups in one pass instead of a sort by column."""
    k = ptr.size - 1
    n_cols = 0
    for j in range(col_of.size):
        n_cols = max(n_cols, col_of[j] + 1)
    col_ptr = np.zeros((n_cols, k + 1), np.int64)
    for i in prange(k):
        for q in range(ptr[i], ptr[i + 1]):
            col_ptr[col_of[codes[q] >> 32], i + 1] += 1
    col_off = np.zeros(n_cols + 1, np.int64)
    for j in prange(n_cols):
        row = col_ptr[j]
        for i in range(k):
            row[i + 1] += row[i]
    for j in range(n_cols):
        col_off[j + 1] = col_off[j] + col_ptr[j, k]
    vals = np.empty(col_off[n_cols], np.int32)
    for i in prange(k):
        last, o = -1, 0
        for q in range(ptr[i], ptr[i + 1]):
            j = col_of[codes[q] >> 32]
            if j != last:
                last, o = j, col_off[j] + col_ptr[j, i]
            vals[o] = np.int32(codes[q] & 0xFFFFFFFF)
            o += 1
    return col_ptr, vals, col_off


@njit(cache=True)
def first_bad_code(ptr, codes, cards):
    """The first rule code (index) that is negative, of no category or value of the schema
    (``cards``: each category's cardinality), or not above the previous code of its op; -1 when
    every code holds (:meth:`~.updates.UpdateBatch.check_columns`, one pass)."""
    for i in range(ptr.size - 1):
        for q in range(ptr[i], ptr[i + 1]):
            c = codes[q]
            if c < 0 or (c >> 33) >= cards.size or (c & 0xFFFFFFFF) >= cards[c >> 33]:
                return q
            if q > ptr[i] and codes[q - 1] >= c:
                return q
    return -1


@njit(cache=True)
def allows_vec(codes, lo, mid, hi, m, live, out, off):
    """Allows vector of one single-valued category: ``out[off + v]`` for v in 0..m (m: no value)."""
    unc = mid == lo
    for v in range(m + 1):
        out[off + v] = unc and live
    for q in range(lo, mid):
        out[off + (codes[q] & 0xFFFFFFFF)] = live
    for q in range(mid, hi):
        out[off + (codes[q] & 0xFFFFFFFF)] = False


@njit(cache=True)
def diff(slots, old_ptr, old_codes, old_live, new_ptr, new_codes, new_live, cat_m, cat_group, unc_row,
         dinc_ptr, dinc_vals, dinc_rows, vrow_ptr, vrow, list_ptr, group_ptr, group_members, group_base,
         group_size, carrier, voff, va, vb, mark, out_set, out_clr, out_lists, cons_delta, with_bits=True):
    """Net bit flips and list operations of the touched slots (old state -> new state).

    Rule codes: ``(cat << 33) | (kind << 32) | value``, sorted per slot. Output codes:
    ``row << 40 | slot``. List ops: ``(list id, slot, +1 add / -1 remove)`` rows of out_lists.
    ``with_bits=False``: list ops and constrained counts only (the device evaluates the rows:
    :func:`~andromeda_nb.match.kernels.flip_kernel`), no bit codes. Returns (n_set, n_clr, n_list_ops).
    """
    C = cat_m.size
    G = group_size.size
    sa = np.full((C, 3), -1, np.int64)
    sb = np.full((C, 3), -1, np.int64)
    seen = np.zeros(C, np.bool_)
    gmark = np.zeros(max(G, 1), np.bool_)
    cats = np.empty(C, np.int64)
    kmax = 1
    for g in range(G):
        kmax = max(kmax, group_ptr[g + 1] - group_ptr[g])
    lptr = np.zeros(kmax + 1, np.int64)
    pos = np.zeros(kmax, np.int64)
    lval = np.zeros(va.size, np.int64)
    n_set = 0
    n_clr = 0
    n_lo = 0
    for i in range(slots.size):
        s = slots[i]
        lo_o, hi_o = old_ptr[i], old_ptr[i + 1]
        lo_n, hi_n = new_ptr[i], new_ptr[i + 1]
        lv_changed = old_live[i] != new_live[i] and with_bits
        if lv_changed:
            if new_live[i]:
                out_set[n_set] = s
                n_set += 1
            else:
                out_clr[n_clr] = s
                n_clr += 1
        # the slices of every category either rule mentions
        nc = 0
        for side in range(2):
            codes = old_codes if side == 0 else new_codes
            p = lo_o if side == 0 else lo_n
            hi = hi_o if side == 0 else hi_n
            st = sa if side == 0 else sb
            while p < hi:
                c = codes[p] >> 33
                a0 = p
                while p < hi and (codes[p] >> 33) == c and ((codes[p] >> 32) & 1) == 0:
                    p += 1
                a1 = p
                while p < hi and (codes[p] >> 33) == c:
                    p += 1
                st[c, 0] = a0
                st[c, 1] = a1
                st[c, 2] = p
                if not seen[c]:
                    seen[c] = True
                    cats[nc] = c
                    nc += 1
        for j in range(nc):
            c = cats[j]
            a0, a1, a2 = sa[c, 0], sa[c, 1], sa[c, 2]
            b0, b1, b2 = sb[c, 0], sb[c, 1], sb[c, 2]
            if a0 < 0:
                a0, a1, a2 = lo_o, lo_o, lo_o
            if b0 < 0:
                b0, b1, b2 = lo_n, lo_n, lo_n
            cons_delta[c] += (1 if b2 > b0 else 0) - (1 if a2 > a0 else 0)
            if cat_group[c] >= 0:
                gmark[cat_group[c]] = with_bits
                continue
            unc_o = a1 == a0
            unc_n = b1 == b0
            if unc_o != unc_n and with_bits:
                code = (unc_row[c] << 40) | s
                if unc_n:
                    out_set[n_set] = code
                    n_set += 1
                else:
                    out_clr[n_clr] = code
                    n_clr += 1
            for kind in range(2):
                lo1, hi1 = (a0, a1) if kind == 0 else (a1, a2)
                lo2, hi2 = (b0, b1) if kind == 0 else (b1, b2)
                for q in range(lo1, hi1):
                    mark[old_codes[q] & 0xFFFFFFFF] |= 1
                for q in range(lo2, hi2):
                    mark[new_codes[q] & 0xFFFFFFFF] |= 2
                if kind == 0 and not (unc_o and unc_n) and with_bits:
                    for d in range(dinc_ptr[c], dinc_ptr[c + 1]):
                        v = dinc_vals[d]
                        bo = unc_o or (mark[v] & 1) != 0
                        bn = unc_n or (mark[v] & 2) != 0
                        if bo != bn:
                            code = (dinc_rows[d] << 40) | s
                            if bn:
                                out_set[n_set] = code
                                n_set += 1
                            else:
                                out_clr[n_clr] = code
                                n_clr += 1
                for side in range(2):
                    codes = old_codes if side == 0 else new_codes
                    lo, hi = (lo1, hi1) if side == 0 else (lo2, hi2)
                    only = 1 if side == 0 else 2
                    for q in range(lo, hi):
                        v = codes[q] & 0xFFFFFFFF
                        if mark[v] != only:
                            continue
                        r = vrow[vrow_ptr[2 * c + kind] + v]
                        if r >= 0:
                            if kind == 1 and with_bits:  # a dense exclude row (include rows were handled above)
                                if side == 1:
                                    out_set[n_set] = (r << 40) | s
                                    n_set += 1
                                else:
                                    out_clr[n_clr] = (r << 40) | s
                                    n_clr += 1
                        else:
                            out_lists[n_lo, 0] = list_ptr[2 * c + kind] + v
                            out_lists[n_lo, 1] = s
                            out_lists[n_lo, 2] = 1 if side == 1 else -1
                            n_lo += 1
                for q in range(lo1, hi1):
                    mark[old_codes[q] & 0xFFFFFFFF] = 0
                for q in range(lo2, hi2):
                    mark[new_codes[q] & 0xFFFFFFFF] = 0
        if lv_changed and carrier >= 0:
            gmark[carrier] = True
        # folded groups: allows vectors of the members, then every combination row
        for g in range(G):
            if not gmark[g]:
                continue
            gmark[g] = False
            lv_o = old_live[i] if g == carrier else True
            lv_n = new_live[i] if g == carrier else True
            same = lv_o == lv_n
            for t in range(group_ptr[g], group_ptr[g + 1]):
                c = group_members[t]
                m = cat_m[c]
                if sa[c, 0] >= 0:
                    allows_vec(old_codes, sa[c, 0], sa[c, 1], sa[c, 2], m, True, va, voff[c])
                else:
                    for v in range(m + 1):
                        va[voff[c] + v] = True
                if sb[c, 0] >= 0:
                    allows_vec(new_codes, sb[c, 0], sb[c, 1], sb[c, 2], m, True, vb, voff[c])
                else:
                    for v in range(m + 1):
                        vb[voff[c] + v] = True
                if same:
                    for v in range(m + 1):
                        if va[voff[c] + v] != vb[voff[c] + v]:
                            same = False
                            break
            if same:
                continue
            # candidate digits per member: those allowed before or after (a combination with a
            # digit allowed in neither state stays 0); when a single member changed (and the
            # live bit did not), only its changed digits can flip a combination
            k0, k1 = group_ptr[g], group_ptr[g + 1]
            n_changed = 0
            only = -1
            for t in range(k0, k1):
                c = group_members[t]
                for v in range(cat_m[c] + 1):
                    if va[voff[c] + v] != vb[voff[c] + v]:
                        n_changed += 1
                        only = t
                        break
            single = n_changed == 1 and lv_o == lv_n
            n_l = 0
            for t in range(k0, k1):
                c = group_members[t]
                lptr[t - k0] = n_l
                for v in range(cat_m[c] + 1):
                    x, y = va[voff[c] + v], vb[voff[c] + v]
                    if (single and t == only and x != y) or ((not single or t != only) and (x or y)):
                        lval[n_l] = v
                        n_l += 1
                if n_l == lptr[t - k0]:
                    n_l = -1  # a member with no candidate digit: nothing flips
                    break
            if n_l >= 0:
                k = k1 - k0
                lptr[k] = n_l
                for t in range(k):
                    pos[t] = lptr[t]
                while True:
                    r = 0
                    stride = 1
                    bo = lv_o
                    bn = lv_n
                    for t in range(k):
                        c = group_members[k0 + t]
                        d = lval[pos[t]]
                        r += d * stride
                        stride *= cat_m[c] + 1
                        bo = bo and va[voff[c] + d]
                        bn = bn and vb[voff[c] + d]
                    if bo != bn:
                        code = ((group_base[g] + r) << 40) | s
                        if bn:
                            out_set[n_set] = code
                            n_set += 1
                        else:
                            out_clr[n_clr] = code
                            n_clr += 1
                    t = 0
                    while t < k:  # odometer over the candidate digits
                        pos[t] += 1
                        if pos[t] < lptr[t + 1]:
                            break
                        pos[t] = lptr[t]
                        t += 1
                    if t == k:
                        break
        for j in range(nc):
            c = cats[j]
            seen[c] = False
            sa[c, 0] = -1
            sb[c, 0] = -1
    return n_set, n_clr, n_lo


@njit(parallel=True, cache=True)
def diff_par(n_chunks, slots, old_ptr, old_codes, old_live, new_ptr, new_codes, new_live, cat_m, cat_group,
             unc_row, dinc_ptr, dinc_vals, dinc_rows, vrow_ptr, vrow, list_ptr, group_ptr, group_members,
             group_base, group_size, carrier, voff, nv, max_m, n_rows, out_set, out_clr, out_lists, cons_delta,
             with_bits=True):
    """:func:`diff` over chunks of the slots in parallel, each chunk with its own scratch and its
    own region of the outputs (``n_rows + 1`` codes per slot, one list op per rule code), then
    the regions packed in chunk order: the same outputs, in the same order, as one call."""
    n = slots.size
    C = cat_m.size
    bounds = np.empty(n_chunks + 1, np.int64)
    for c in range(n_chunks + 1):
        bounds[c] = (n * c) // n_chunks
    counts = np.zeros((n_chunks, 3), np.int64)
    cons = np.zeros((n_chunks, C), np.int64)
    per = n_rows + 1
    for c in prange(n_chunks):
        i0, i1 = bounds[c], bounds[c + 1]
        if i1 == i0:
            continue
        l0 = (old_ptr[i0] - old_ptr[0]) + (new_ptr[i0] - new_ptr[0])
        l1 = (old_ptr[i1] - old_ptr[0]) + (new_ptr[i1] - new_ptr[0])
        a, b, d = diff(slots[i0:i1], old_ptr[i0:i1 + 1], old_codes, old_live[i0:i1], new_ptr[i0:i1 + 1],
                       new_codes, new_live[i0:i1], cat_m, cat_group, unc_row, dinc_ptr, dinc_vals, dinc_rows,
                       vrow_ptr, vrow, list_ptr, group_ptr, group_members, group_base, group_size, carrier, voff,
                       np.zeros(nv, np.bool_), np.zeros(nv, np.bool_), np.zeros(max_m + 1, np.int8),
                       out_set[i0 * per:i1 * per], out_clr[i0 * per:i1 * per], out_lists[l0:l1 + 1], cons[c],
                       with_bits)
        counts[c, 0] = a
        counts[c, 1] = b
        counts[c, 2] = d
    n_set = 0
    n_clr = 0
    n_lo = 0
    for c in range(n_chunks):  # pack: every region starts at or after the packed end
        i0 = bounds[c]
        l0 = (old_ptr[i0] - old_ptr[0]) + (new_ptr[i0] - new_ptr[0])
        for q in range(counts[c, 0]):
            out_set[n_set + q] = out_set[i0 * per + q]
        for q in range(counts[c, 1]):
            out_clr[n_clr + q] = out_clr[i0 * per + q]
        for q in range(counts[c, 2]):
            for f in range(3):
                out_lists[n_lo + q, f] = out_lists[l0 + q, f]
        n_set += counts[c, 0]
        n_clr += counts[c, 1]
        n_lo += counts[c, 2]
        for j in range(C):
            cons_delta[j] += cons[c, j]
    return n_set, n_clr, n_lo


@njit(cache=True)
def decode(x):
    return x if x >= 0 else -x - 1


@njit(cache=True)
def _list_op(ops, i, l_start, l_len, l_cap, l_live, l_sorted, pool, used, dirty, nd, may_move):
    """List op ``i`` of ``ops`` (list id, slot, +1 add / -1 remove) on the host list pool, its
    written pool ranges appended to ``dirty`` from row ``nd`` (at most two). Returns the new
    ``nd``; -1: the entry to remove is not there; -2: an add needs its list moved and
    ``may_move`` is False (nothing changed)."""
    lid = ops[i, 0]
    s = ops[i, 1]
    st = l_start[lid]
    if ops[i, 2] < 0:
        pos = -1
        lo = st
        hi = st + l_sorted[lid]
        while lo < hi:  # the sorted head, then the appended tail
            mid = (lo + hi) // 2
            if decode(pool[mid]) < s:
                lo = mid + 1
            else:
                hi = mid
        if lo < st + l_sorted[lid] and pool[lo] == s:
            pos = lo
        else:
            for q in range(st + l_sorted[lid], st + l_len[lid]):
                if pool[q] == s:
                    pos = q
                    break
        if pos < 0:
            return -1
        pool[pos] = -s - 1
        l_live[lid] -= 1
        dirty[nd, 0] = pos
        dirty[nd, 1] = 1
        nd += 1
        if l_len[lid] >= 32 and 2 * l_live[lid] < l_len[lid]:  # compact in place
            k = 0
            for q in range(st, st + l_len[lid]):
                if pool[q] >= 0:
                    pool[st + k] = pool[q]
                    k += 1
            pool[st:st + k].sort()
            l_len[lid] = k
            l_sorted[lid] = k
            dirty[nd, 0] = st
            dirty[nd, 1] = k
            nd += 1
        return nd
    if l_len[lid] < l_cap[lid]:
        q = st + l_len[lid]
        pool[q] = s
        if l_sorted[lid] == l_len[lid] and (l_len[lid] == 0 or decode(pool[q - 1]) < s):
            l_sorted[lid] += 1
        l_len[lid] += 1
        l_live[lid] += 1
        dirty[nd, 0] = q
        dirty[nd, 1] = 1
        return nd + 1
    if not may_move:
        return -2
    cap = max(8, 2 * (l_live[lid] + 1))  # a region twice the live size at the end of the pool
    ns = used[0]
    used[0] += cap
    return _move_list(lid, s, ns, cap, l_start, l_len, l_cap, l_live, l_sorted, pool, dirty, nd)


@njit(cache=True)
def _move_list(lid, s, ns, cap, l_start, l_len, l_cap, l_live, l_sorted, pool, dirty, nd):
    """List ``lid``'s live entries and the added slot ``s``, sorted, to the region of ``cap``
    entries at ``ns``; the written range appended to ``dirty`` at row ``nd``. Returns ``nd + 1``.
    A merge: the list's head is sorted (tombstones in place), its appended tail short."""
    st = l_start[lid]
    head_end = st + l_sorted[lid]
    tail = np.empty(l_len[lid] - l_sorted[lid] + 1, np.int64)
    t = 0
    for q in range(head_end, st + l_len[lid]):
        if pool[q] >= 0:
            tail[t] = pool[q]
            t += 1
    tail[t] = s
    t += 1
    tail[:t].sort()
    k = 0
    j = 0
    for q in range(st, head_end):
        v = pool[q]
        if v < 0:
            continue
        while j < t and tail[j] < v:
            pool[ns + k] = tail[j]
            k += 1
            j += 1
        pool[ns + k] = v
        k += 1
    while j < t:
        pool[ns + k] = tail[j]
        k += 1
        j += 1
    l_start[lid] = ns
    l_len[lid] = k
    l_cap[lid] = cap
    l_sorted[lid] = k
    l_live[lid] = k
    dirty[nd, 0] = ns
    dirty[nd, 1] = k
    return nd + 1


@njit(parallel=True, cache=True)
def list_ops(ops, l_start, l_len, l_cap, l_live, l_sorted, pool, used, dirty, n_parts):
    """Apply list ops (list id, slot, +1/-1) to the host list pool (room for every move made
    beforehand), in ``n_parts`` parallel parts (the threads). ``dirty`` (at least ``2 * len(ops)``
    rows) gets ``(start, length)`` of each pool range written, in op order. Returns the number of
    dirty ranges, or ``-1 - i`` when op ``i`` removes an entry that is not there (an internal error).

    Lists are independent but for the pool's end, where a list that outgrows its region moves. The
    lists are dealt to threads by id (each thread runs its lists' ops in order, skipping the
    others: no sort) up to a list's first move; one thread then gives each such list its new region
    (in the order of the ops that need them); the threads move the lists there and go on with their
    ops; a list that outgrows even that region (rare) finishes in one thread, in op order. Where a
    list lands does not depend on the thread count."""
    n = ops.shape[0]
    done = np.zeros(n, np.int8)  # 1 applied, 0 not yet, -1 failed
    rows = np.zeros(n, np.int64)  # dirty rows of each op (at 2 * i)
    blocked = np.zeros(l_start.size, np.int8)  # 1: waits for a move (its region below), 2: for a second
    new_start = np.zeros(l_start.size, np.int64)
    new_cap = np.zeros(l_start.size, np.int64)
    for phase in range(2):
        for p in prange(n_parts):
            for i in range(n):
                lid = ops[i, 0]
                if lid % n_parts != p or done[i] != 0 or blocked[lid] == 2 or (phase == 0 and blocked[lid]):
                    continue
                if blocked[lid] == 1:  # phase 1: the add that needed the region, moved there
                    r = _move_list(lid, ops[i, 1], new_start[lid], new_cap[lid], l_start, l_len, l_cap, l_live,
                                   l_sorted, pool, dirty, 2 * i)
                    blocked[lid] = 0
                else:
                    r = _list_op(ops, i, l_start, l_len, l_cap, l_live, l_sorted, pool, used, dirty, 2 * i, False)
                if r == -2:
                    blocked[lid] = 1 + phase
                elif r < 0:
                    done[i] = -1
                    blocked[lid] = 2
                else:
                    done[i] = 1
                    rows[i] = r - 2 * i
        if phase == 0:
            for i in range(n):  # the moves' regions, in op order
                lid = ops[i, 0]
                if done[i] == 0 and blocked[lid] == 1 and new_cap[lid] == 0:
                    new_cap[lid] = max(8, 2 * (l_live[lid] + 1))
                    new_start[lid] = used[0]
                    used[0] += new_cap[lid]
    for i in range(n):
        if done[i] < 0:
            return -1 - i
        if done[i] == 0:  # a list's second move and its ops after it
            r = _list_op(ops, i, l_start, l_len, l_cap, l_live, l_sorted, pool, used, dirty, 2 * i, True)
            if r < 0:
                return -1 - i
            rows[i] = r - 2 * i
    nd = 0
    for i in range(n):  # pack: each op's rows start at or after the packed end
        for q in range(2 * i, 2 * i + rows[i]):
            dirty[nd, 0] = dirty[q, 0]
            dirty[nd, 1] = dirty[q, 1]
            nd += 1
    return nd


@njit(cache=True)
def partition_codes(set_codes, clr_codes, n_parts, order, starts):
    """Counting sort of the codes by ``row % n_parts`` (sets first in each part): ``order``
    gets signed indices (``i`` set code i, ``-1 - i`` clear code i), ``starts`` the parts' offsets."""
    counts = np.zeros(n_parts + 1, np.int64)
    for i in range(set_codes.size):
        counts[(set_codes[i] >> 40) % n_parts + 1] += 1
    for i in range(clr_codes.size):
        counts[(clr_codes[i] >> 40) % n_parts + 1] += 1
    for p in range(n_parts):
        counts[p + 1] += counts[p]
    for p in range(n_parts + 1):
        starts[p] = counts[p]
    for i in range(set_codes.size):
        p = (set_codes[i] >> 40) % n_parts
        order[counts[p]] = i
        counts[p] += 1
    for i in range(clr_codes.size):
        p = (clr_codes[i] >> 40) % n_parts
        order[counts[p]] = -1 - i
        counts[p] += 1


@njit(parallel=True, cache=True)
def apply_bits(rows, set_codes, clr_codes, row_count, order, starts):
    """Flip the listed bits (each code names a bit that changes) and count them per row; each
    part (``partition_codes``) holds whole rows, so no two threads touch one word."""
    mask40 = (np.int64(1) << 40) - 1
    for p in prange(starts.size - 1):
        for j in range(starts[p], starts[p + 1]):
            i = order[j]
            if i >= 0:
                code = set_codes[i]
                delta = 1
            else:
                code = clr_codes[-1 - i]
                delta = -1
            r = code >> 40
            s = code & mask40
            rows[r, s >> 6] ^= ONE << uint64(s & 63)
            row_count[r] += delta


@njit(cache=True)
def allocate_distinct(ops, cur, free_tail, op_slots, pushed):
    """Each op's slot for a batch whose ad ids are distinct (as
    :meth:`~.index.TargetingIndex._allocate`, without its id map: ``cur[i]`` is op ``i``'s ad's
    slot now, -1 none): a create takes the slot the batch's last retire freed, else the next of
    ``free_tail`` from its end; a change keeps its slot; a retire frees it. Returns ``(bad,
    n_popped, n_pushed)``: ``bad`` the first op that fails (a create of an existing ad, a change
    or retire of an unknown one, no free slot), -1 when none; ``pushed[:n_pushed]`` the freed
    slots no create took."""
    n_popped = 0
    n_pushed = 0
    for i in range(ops.size):
        if ops[i] == CREATE:
            if cur[i] >= 0:
                return i, 0, 0
            if n_pushed > 0:
                n_pushed -= 1
                s = pushed[n_pushed]
            else:
                if n_popped >= free_tail.size:
                    return i, 0, 0
                n_popped += 1
                s = free_tail[free_tail.size - n_popped]
        elif cur[i] < 0:
            return i, 0, 0
        else:
            s = cur[i]
            if ops[i] != CHANGE:
                pushed[n_pushed] = s
                n_pushed += 1
        op_slots[i] = s
    return -1, n_popped, n_pushed
