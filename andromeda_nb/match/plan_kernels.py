"""Numba host kernel of the batch planner (:meth:`~andromeda_nb.match.DeviceTargetingIndex.plan_batch`):
a batch of encoded profiles to the match kernels' flat int64 plan arrays in one compiled pass.

It computes what :meth:`~andromeda_nb.targeting.TargetingIndex.plan` computes for each request
(the rows read per folded group and split category, ordered by estimated pass fraction, the
patch lists and the listed excludes) and lays the batch out as ``PLAN_ARRAYS``. In Python that
costs ~100 us a request, as much as the match kernel itself at 10^8 ads; compiled it is a few us.

Imported inside the planner (numba_common first: it fixes the backend before numba is imported).
"""

import numpy as np

# numba_common first: it fixes the backend before numba is imported
from ..targeting import numba_common  # noqa: F401
from numba import njit  # noqa: E402

#: status codes of :func:`plan_batch_kernel` (the wrapper re-validates the named request in Python
#: for the error message)
OK, VALUE_OUT_OF_RANGE, SEVERAL_VALUES = 0, 1, 2
N_ARRAYS = 16  # len(PLAN_ARRAYS)


@njit(cache=True)
def plan_batch_kernel(keys, vals, B, C, cat_m, multi, n_ads, n_rows, carrier, group_ptr, group_members, group_base,
                      constrained, cat_group, row_count, vrow, vrow_ptr, list_ptr, l_live, l_start, l_len, unc_row,
                      excl_ptr, excl_vals, grouped, op_first, op_close, op_exc, op_zero):
    """Plan B requests. ``keys[i] = b * C + category``, ``vals[i]`` the value (a profile's values
    in any order, duplicates allowed). Returns ``(status, bad_request, flat, sizes, stats)``:
    ``flat`` the 16 plan arrays back to back, each padded to at least one element (a zero);
    ``sizes`` their true lengths; ``stats`` = (n_prep, n_post, n_scratch, prep segments, longest
    prep segment, post segments, longest post segment)."""
    n = max(n_ads, 1)
    G = group_ptr.size - 1
    # ---- the values by (request, category): counting sort, then each segment sorted and deduplicated
    S = B * C
    seg = np.zeros(S + 1, np.int64)
    for i in range(keys.size):
        seg[keys[i] + 1] += 1
    for s in range(S):
        seg[s + 1] += seg[s]
    fill = seg[:S].copy()
    sv = np.empty(vals.size, np.int64)
    for i in range(keys.size):
        s = keys[i]
        sv[fill[s]] = vals[i]
        fill[s] += 1
    ulen = np.zeros(S, np.int64)
    for s in range(S):
        a, e = seg[s], seg[s + 1]
        c = s % C
        for i in range(a, e):  # insertion sort: a category holds a few values
            v = sv[i]
            if v < 0 or v >= cat_m[c]:
                return VALUE_OUT_OF_RANGE, s // C, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
            j = i - 1
            while j >= a and sv[j] > v:
                sv[j + 1] = sv[j]
                j -= 1
            sv[j + 1] = v
        u = 0
        for i in range(a, e):
            if u == 0 or sv[a + u - 1] != sv[i]:
                sv[a + u] = sv[i]
                u += 1
        if u > 1 and not multi[c]:
            return SEVERAL_VALUES, s // C, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        ulen[s] = u

    # ---- bounds of every output (a request: at most 1 + G + C entries, each split category at most
    # its values + 2 include rows)
    V = vals.size
    n_ent = B * (1 + G + C)
    n_inc = B * (1 + G + 2 * C) + V
    req_cat = np.zeros(B + 1, np.int64)
    inc_ptr = np.zeros(n_ent + 1, np.int64)
    inc_rows = np.empty(n_inc, np.int64)
    exc_ptr = np.zeros(n_ent + 1, np.int64)
    exc_rows = np.empty(V + 1, np.int64)
    p_start = np.empty(V + 1, np.int64)
    p_len = np.empty(V + 1, np.int64)
    p_dst = np.empty(V + 1, np.int64)
    q_start = np.empty(2 * V + B + 1, np.int64)
    q_len = np.empty(2 * V + B + 1, np.int64)
    q_op = np.empty(2 * V + B + 1, np.int64)
    q_arg = np.empty(2 * V + B + 1, np.int64)
    req_op = np.zeros(B + 1, np.int64)
    op_row = np.empty(n_inc + V if grouped else 1, np.int64)
    op_kind = np.empty(n_inc + V if grouped else 1, np.int64)
    # one request's entries before ordering
    e_est = np.empty(1 + G + C, np.float64)
    e_inc_a = np.empty(1 + G + C, np.int64)
    e_inc_n = np.empty(1 + G + C, np.int64)
    e_exc_a = np.empty(1 + G + C, np.int64)
    e_exc_n = np.empty(1 + G + C, np.int64)
    t_inc = np.empty(1 + G + 2 * C + V, np.int64)
    t_exc = np.empty(V + 1, np.int64)
    t_lid = np.empty(V + 1, np.int64)  # patch lists' ids, patch by patch
    t_patch = np.zeros(C + 1, np.int64)  # patch k's lists: t_lid[t_patch[k]:t_patch[k + 1]]
    t_xl = np.empty(V + 1, np.int64)  # listed excludes

    n_e = n_i = n_x = n_p = n_q = n_op = n_extra = 0
    scratch_base = 0
    for b in range(B):
        ne = ni = nx = npatch = nl = nxl = 0
        for g in range(-1, G):  # one row each: the live row (g = -1), then the folded groups
            if g < 0:
                if carrier >= 0:  # a folded group carries the live bit
                    continue
                r = 0
            else:
                if g != carrier:
                    any_c = False
                    for q in range(group_ptr[g], group_ptr[g + 1]):
                        if constrained[group_members[q]] != 0:
                            any_c = True
                    if not any_c:
                        continue
                r = group_base[g]
                stride = 1
                for q in range(group_ptr[g], group_ptr[g + 1]):
                    c = group_members[q]
                    s = b * C + c
                    r += (sv[seg[s]] if ulen[s] > 0 else cat_m[c]) * stride  # the smallest value
                    stride *= cat_m[c] + 1
            e_est[ne] = row_count[r] / n
            e_inc_a[ne] = ni
            t_inc[ni] = r
            ni += 1
            e_inc_n[ne] = 1
            e_exc_a[ne] = nx
            e_exc_n[ne] = 0
            ne += 1
        for c in range(C):
            if cat_group[c] >= 0 or constrained[c] == 0:
                continue
            s = b * C + c
            a, u = seg[s], ulen[s]
            inc0, exc0 = vrow_ptr[2 * c], vrow_ptr[2 * c + 1]
            unc = row_count[unc_row[c]]
            est = unc
            e_inc_a[ne] = ni
            for i in range(a, a + u):
                rr = vrow[inc0 + sv[i]]
                if rr >= 0:
                    t_inc[ni] = rr
                    ni += 1
                    est += row_count[rr] - unc
            lids0 = nl
            for i in range(a, a + u):
                if vrow[inc0 + sv[i]] < 0:
                    lid = list_ptr[2 * c] + sv[i]
                    if l_live[lid] > 0:
                        t_lid[nl] = lid
                        nl += 1
                        est += l_live[lid]
            if ni == e_inc_a[ne]:  # no dense include row: the unconstrained row
                t_inc[ni] = unc_row[c]
                ni += 1
            if nl > lids0:  # the listed values' patch row
                t_inc[ni] = -1 - npatch
                ni += 1
                npatch += 1
                t_patch[npatch] = nl
            e_inc_n[ne] = ni - e_inc_a[ne]
            e_exc_a[ne] = nx
            for i in range(a, a + u):
                xr = vrow[exc0 + sv[i]]
                if xr >= 0:
                    t_exc[nx] = xr
                    nx += 1
            e_exc_n[ne] = nx - e_exc_a[ne]
            for i in range(a, a + u):
                if vrow[exc0 + sv[i]] < 0:
                    lid = list_ptr[2 * c + 1] + sv[i]
                    if l_live[lid] > 0:
                        t_xl[nxl] = lid
                        nxl += 1
            e_est[ne] = min(1.0, est / n)
            ne += 1

        # ---- the request's entries, most selective first (a stable order, as Python's sort)
        order = np.argsort(e_est[:ne], kind="mergesort")
        for j in range(ne):
            o = order[j]
            for i in range(e_inc_a[o], e_inc_a[o] + e_inc_n[o]):
                rr = t_inc[i]
                inc_rows[n_i] = n_rows + scratch_base - 1 - rr if rr < 0 else rr
                n_i += 1
            for i in range(e_exc_a[o], e_exc_a[o] + e_exc_n[o]):
                exc_rows[n_x] = t_exc[i]
                n_x += 1
            n_e += 1
            inc_ptr[n_e] = n_i
            exc_ptr[n_e] = n_x
            if grouped:
                a_i = inc_ptr[n_e - 1]
                if n_i == a_i:
                    op_row[n_op] = 0
                    op_kind[n_op] = op_zero
                    n_op += 1
                else:
                    for i in range(a_i, n_i):
                        kind = 0
                        if i == a_i:
                            kind |= op_first
                        if i == n_i - 1:
                            kind |= op_close
                        op_row[n_op] = inc_rows[i]
                        op_kind[n_op] = kind
                        n_op += 1
                    for i in range(exc_ptr[n_e - 1], n_x):
                        op_row[n_op] = exc_rows[i]
                        op_kind[n_op] = op_exc
                        n_op += 1
        req_cat[b + 1] = n_e
        req_op[b + 1] = n_op
        # ---- the list passes: patches (prep, then OR into the patch row), listed excludes, slots
        for k in range(npatch):
            for i in range(t_patch[k], t_patch[k + 1]):
                lid = t_lid[i]
                p_start[n_p] = l_start[lid]
                p_len[n_p] = l_len[lid]
                p_dst[n_p] = scratch_base + k
                n_p += 1
                q_start[n_q] = l_start[lid]
                q_len[n_q] = l_len[lid]
                q_op[n_q] = 2
                q_arg[n_q] = scratch_base + k
                n_q += 1
        for i in range(nxl):
            lid = t_xl[i]
            q_start[n_q] = l_start[lid]
            q_len[n_q] = l_len[lid]
            q_op[n_q] = 0
            q_arg[n_q] = b
            n_q += 1
        m = excl_ptr[b + 1] - excl_ptr[b]
        if m > 0:
            q_start[n_q] = n_extra
            q_len[n_q] = m
            q_op[n_q] = 1
            q_arg[n_q] = b
            n_q += 1
            n_extra += m
        scratch_base += npatch

    # ---- the 16 arrays back to back (PLAN_ARRAYS order), each at least one element
    sizes = np.empty(N_ARRAYS, np.int64)
    sizes[0], sizes[1], sizes[2], sizes[3], sizes[4] = B + 1, n_e + 1, n_i, n_e + 1, n_x
    sizes[5], sizes[6], sizes[7], sizes[8], sizes[9] = n_p, n_p + 1, n_p, n_q, n_q + 1
    sizes[10], sizes[11], sizes[12], sizes[13] = n_q, n_q, excl_vals.size, B + 1
    sizes[14], sizes[15] = (n_op, n_op) if grouped else (0, 0)
    total = 0
    for i in range(N_ARRAYS):
        total += max(sizes[i], 1)
    flat = np.zeros(total, np.int64)
    o = 0
    parts = (req_cat, inc_ptr, inc_rows, exc_ptr, exc_rows, p_start, p_len, p_dst, q_start, q_len, q_op, q_arg,
             excl_vals, req_op, op_row, op_kind)
    for i in range(N_ARRAYS):
        src = parts[i]
        if i == 6 or i == 9:  # p_off, q_off: prefix sums of p_len, q_len
            flat[o] = 0
            for j in range(sizes[i] - 1):
                flat[o + j + 1] = flat[o + j] + src[j]
        else:
            for j in range(sizes[i]):
                flat[o + j] = src[j]
        o += max(sizes[i], 1)
    longest_p = 0
    for j in range(n_p):
        longest_p = max(longest_p, p_len[j])
    longest_q = 0
    for j in range(n_q):
        longest_q = max(longest_q, q_len[j])
    n_prep = 0
    for j in range(n_p):
        n_prep += p_len[j]
    n_post = 0
    for j in range(n_q):
        n_post += q_len[j]
    stats = np.array([n_prep, n_post, scratch_base, n_p, longest_p, n_q, longest_q], np.int64)
    return OK, -1, flat, sizes, stats
