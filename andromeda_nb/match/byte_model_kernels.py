"""Numba host kernels of the byte model (:func:`andromeda_nb.match.byte_model.read_model`): the
match kernels' row reads emulated sector by sector on the host, chunks of sectors in parallel.

Imported inside ``read_model`` (importing :mod:`andromeda_nb.targeting.numba_common` first fixes
the backend before numba is imported).
"""

import numpy as np

# numba_common first: it fixes the backend before numba is imported
from ..targeting.numba_common import valid_mask
from numba import njit, prange, uint64


@njit(inline="always")
def sector_start(e, sec, n_words, n):
    """The 4 words of 32-byte sector ``sec``: ``e[u]`` = word u's valid bits (0 past the
    end); returns (first word, words in the sector)."""
    w0 = sec * 4
    nw = min(4, n_words - w0)
    for u in range(4):
        e[u] = valid_mask(w0 + u, n_words, n) if u < nw else uint64(0)
    return w0, nw


@njit(inline="always")
def sum_chunks(part, out, n_cols):
    """``out[c]`` = the sum over chunks (rows) of ``part[:, c]``, for ``c < n_cols``."""
    for c in range(n_cols):
        t = 0
        for k in range(part.shape[0]):
            t += part[k, c]
        out[c] = t


@njit(parallel=True, cache=True)
def sector_counts(rows, scratch, n, n_words, inc_ptr, inc_rows, exc_ptr, exc_rows, out, chunk, prefetch):
    """The match kernel's reads, emulated: ``out[j]`` = 32-byte sectors (4 words) of the
    rows of plan category ``j`` read (a word is read while it is alive, an include row only
    while the OR does not yet cover it); chunks of sectors in parallel. ``prefetch``: the
    kernel variant that reads each category's first include row during the previous category,
    for the words alive before it (counted for the category it belongs to)."""
    nr = rows.shape[0]
    n_cat = inc_ptr.size - 1
    n_sec = (n_words + 3) // 4
    n_chunks = (n_sec + chunk - 1) // chunk
    part = np.zeros((n_chunks, max(n_cat, 1)), np.int64)
    for k in prange(n_chunks):
        e = np.empty(4, np.uint64)
        acc = np.empty(4, np.uint64)
        for sec in range(k * chunk, min(n_sec, (k + 1) * chunk)):
            w0, nw = sector_start(e, sec, n_words, n)
            have_next = False
            for c in range(n_cat):
                for u in range(4):
                    acc[u] = 0
                j0 = inc_ptr[c]
                pf_here = prefetch and c + 1 < n_cat and inc_ptr[c + 2] > inc_ptr[c + 1] and inc_ptr[c + 1] > j0
                for j in range(j0, inc_ptr[c + 1]):
                    r = inc_rows[j]
                    if prefetch and j == j0 and have_next:  # read (and counted) one category earlier
                        for u in range(nw):
                            acc[u] |= rows[r, w0 + u] if r < nr else scratch[r - nr, w0 + u]
                    else:
                        hit = False
                        for u in range(nw):
                            if (e[u] & ~acc[u]) != 0:
                                hit = True
                                acc[u] |= rows[r, w0 + u] if r < nr else scratch[r - nr, w0 + u]
                        if hit:
                            part[k, c] += 1
                    if pf_here and j == j0:
                        for u in range(nw):
                            if e[u] != 0:
                                part[k, c + 1] += 1
                                break
                have_next = pf_here
                for u in range(4):
                    e[u] &= acc[u]
                for j in range(exc_ptr[c], exc_ptr[c + 1]):
                    r = exc_rows[j]
                    hit = False
                    for u in range(nw):
                        if e[u] != 0:
                            hit = True
                            e[u] &= ~(rows[r, w0 + u] if r < nr else scratch[r - nr, w0 + u])
                    if hit:
                        part[k, c] += 1
    sum_chunks(part, out, n_cat)


@njit(parallel=True, cache=True)
def sector_counts_grouped(rows, scratch, n, n_words, op_row, op_kind, op_cat, out, chunk, group):
    """The grouped match kernel's reads, emulated (match.kernels.match_grouped_kernel): ops in
    groups of ``group``; a sector of every op's row in a group is read when one of its 4 words
    is alive at the group's start. ``out[op_cat[j]]`` += sectors read for op ``j``."""
    nr = rows.shape[0]
    n_ops = op_row.size
    n_sec = (n_words + 3) // 4
    n_chunks = (n_sec + chunk - 1) // chunk
    part = np.zeros((n_chunks, out.size), np.int64)
    for k in prange(n_chunks):
        e = np.empty(4, np.uint64)
        acc = np.zeros(4, np.uint64)
        for sec in range(k * chunk, min(n_sec, (k + 1) * chunk)):
            w0, nw = sector_start(e, sec, n_words, n)
            for u in range(4):
                acc[u] = 0
            j = 0
            while j < n_ops:
                alive = False
                for u in range(nw):
                    if e[u] != 0:
                        alive = True
                if not alive:
                    break
                for g in range(j, min(j + group, n_ops)):
                    if (op_kind[g] & 8) == 0:
                        part[k, op_cat[g]] += 1
                for g in range(j, min(j + group, n_ops)):
                    kind = op_kind[g]
                    r = op_row[g]
                    for u in range(nw):
                        if kind & 8:
                            e[u] = 0
                            continue
                        x = rows[r, w0 + u] if r < nr else scratch[r - nr, w0 + u]
                        if kind & 4:
                            e[u] &= ~x
                        else:
                            acc[u] = x if kind & 1 else acc[u] | x
                            if kind & 2:
                                e[u] &= acc[u]
                j += group
    sum_chunks(part, out, out.size)
