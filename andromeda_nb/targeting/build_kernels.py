"""Numba host kernels of the index build: rule-column validation, the folded groups' rows, the
split categories' rows, inverted-list fill, and per-row / per-category counts.

Imported inside the functions that call them (see :mod:`.numba_common`); every loop over words or
chunks of slots runs Numba-parallel on the host's cores.
"""

import numpy as np

# numba_common first: it fixes the backend before numba is imported
from .numba_common import ALL, ONE, popc, valid_mask
from numba import njit, prange, uint64


@njit(parallel=True, cache=True)
def csr_scan(ptr, vals, m, chunk, out):
    """out[k] per chunk of slots: 0 canonical, 1 needs sorting, 2 value out of range,
    3 malformed indptr; out[n_chunks + k]: the first offending position."""
    n = ptr.size - 1
    n_chunks = (n + chunk - 1) // chunk
    for k in prange(n_chunks):
        status = 0
        at = 0
        for s in range(k * chunk, min(n, (k + 1) * chunk)):
            a = ptr[s]
            b = ptr[s + 1]
            if b < a or a < 0 or b > vals.size:
                status = 3
                at = s
                break
            prev = -1
            for q in range(a, b):
                v = vals[q]
                if v < 0 or v >= m:
                    status = 2
                    at = q
                    break
                if v <= prev:
                    status = 1
                prev = v
            if status >= 2:
                break
        out[k] = status
        out[n_chunks + k] = at


@njit(cache=True)
def scatter_word(w, ptr_i, val_i, ptr_x, val_x, n, n_total, has_i, has_x, map_i, map_x, inc, exc):
    """OR the bits of word ``w``'s 64 slots into the accumulators: slot s sets ``inc[map_i[v]]``
    for each included value v and ``exc[map_x[v]]`` for each excluded one (a negative map entry:
    value not accumulated here). Returns the word's unconstrained bits (no include set)."""
    unc = uint64(0)
    for b in range(64):
        s = w * 64 + b
        if s >= n_total:
            break
        bit = ONE << uint64(b)
        if s < n and has_i and ptr_i[s + 1] > ptr_i[s]:
            for q in range(ptr_i[s], ptr_i[s + 1]):
                d = map_i[val_i[q]]
                if d >= 0:
                    inc[d] |= bit
        else:
            unc |= bit
        if s < n and has_x:
            for q in range(ptr_x[s], ptr_x[s + 1]):
                d = map_x[val_x[q]]
                if d >= 0:
                    exc[d] |= bit
    return unc


@njit(parallel=True, cache=True)
def build_folded(ptr_i, val_i, ptr_x, val_x, n, n_total, m, rows, chunk):
    """The m + 1 allows rows of one single-valued category into ``rows[0:m+1]`` (slots past
    the ``n`` with rules, up to ``n_total``, are unconstrained)."""
    n_words = rows.shape[1]
    n_chunks = (n_words + chunk - 1) // chunk
    has_i = ptr_i.size == n + 1
    has_x = ptr_x.size == n + 1
    identity = np.arange(m, dtype=np.int64)
    for k in prange(n_chunks):
        inc = np.zeros(m + 1, np.uint64)
        exc = np.zeros(m + 1, np.uint64)
        for w in range(k * chunk, min(n_words, (k + 1) * chunk)):
            unc = scatter_word(w, ptr_i, val_i, ptr_x, val_x, n, n_total, has_i, has_x, identity, identity,
                               inc, exc)
            vm = valid_mask(w, n_words, n_total)
            for v in range(m):
                rows[v, w] = ((unc | inc[v]) & ~exc[v]) & vm
                inc[v] = 0
                exc[v] = 0
            rows[m, w] = unc & vm


@njit(parallel=True, cache=True)
def combine_group(member_rows, member_off, radix, live, use_live, rows, base, size, chunk):
    """Group rows ``rows[base + r] = AND_i member_rows[member_off[i] + digit_i(r)]`` (mixed radix,
    first member fastest), ANDed with the live bits when ``use_live``."""
    n_words = rows.shape[1]
    k = radix.size
    n_chunks = (n_words + chunk - 1) // chunk
    for t in prange(size * n_chunks):
        r = t // n_chunks
        c = t % n_chunks
        src = np.empty(k, np.int64)
        q = r
        for i in range(k):
            src[i] = member_off[i] + q % radix[i]
            q //= radix[i]
        w0 = c * chunk
        w1 = min(n_words, (c + 1) * chunk)
        if use_live:
            for w in range(w0, w1):
                rows[base + r, w] = live[w]
        else:
            for w in range(w0, w1):
                rows[base + r, w] = ALL
        for i in range(k):
            si = src[i]
            for w in range(w0, w1):
                rows[base + r, w] &= member_rows[si, w]


@njit(parallel=True, cache=True)
def build_split(ptr_i, val_i, ptr_x, val_x, n, n_total, dense_i, n_di, dense_x, n_dx, rows, unc_row,
                inc_base, exc_base, chunk):
    """The rows of one split category: ``rows[unc_row]`` its unconstrained slots, ``rows[inc_base
    + d]`` the include' row of dense value ``d`` (unconstrained slots folded in), ``rows[exc_base
    + d]`` the exclude row of dense exclude value ``d`` (``dense_i`` / ``dense_x`` map a value to
    its dense index, -1 when listed); chunks of words in parallel."""
    n_words = rows.shape[1]
    n_chunks = (n_words + chunk - 1) // chunk
    has_i = ptr_i.size == n + 1
    has_x = ptr_x.size == n + 1
    for k in prange(n_chunks):
        inc = np.zeros(max(n_di, 1), np.uint64)
        exc = np.zeros(max(n_dx, 1), np.uint64)
        for w in range(k * chunk, min(n_words, (k + 1) * chunk)):
            unc = scatter_word(w, ptr_i, val_i, ptr_x, val_x, n, n_total, has_i, has_x, dense_i, dense_x,
                               inc, exc)
            vm = valid_mask(w, n_words, n_total)
            rows[unc_row, w] = unc & vm
            for d in range(n_di):
                rows[inc_base + d, w] = (unc | inc[d]) & vm
                inc[d] = 0
            for d in range(n_dx):
                rows[exc_base + d, w] = exc[d] & vm
                exc[d] = 0


@njit(parallel=True, cache=True)
def count_constrained(ptr_i, ptr_x, n, chunk):
    """Slots with a non-empty include or exclude set (an empty marker ptr counts as none)."""
    has_i = ptr_i.size == n + 1
    has_x = ptr_x.size == n + 1
    n_chunks = (n + chunk - 1) // chunk
    # per-chunk partial sums, not a prange scalar reduction: Numba 0.68.0's parfor reduction
    # analysis fails on this loop under Python 3.12 ("unexpected cycle in lookup()")
    part = np.zeros(n_chunks, np.int64)
    for k in prange(n_chunks):
        t = 0
        for s in range(k * chunk, min(n, (k + 1) * chunk)):
            if (has_i and ptr_i[s + 1] > ptr_i[s]) or (has_x and ptr_x[s + 1] > ptr_x[s]):
                t += 1
        part[k] = t
    return part.sum()


@njit(cache=True)
def fill_lists(ptr, vals, n, list_of, starts, pool):
    """Append each slot to the list of each of its sparse values, in slot order
    (``starts`` is advanced: the caller passes a copy)."""
    for s in range(n):
        for q in range(ptr[s], ptr[s + 1]):
            lid = list_of[vals[q]]
            if lid >= 0:
                pool[starts[lid]] = s
                starts[lid] += 1


@njit(parallel=True, cache=True)
def popcounts(rows, out):
    """``out[r]`` = set bits of row ``r``, rows in parallel."""
    for r in prange(rows.shape[0]):
        t = uint64(0)
        for w in range(rows.shape[1]):
            t += popc(rows[r, w])
        out[r] = t
