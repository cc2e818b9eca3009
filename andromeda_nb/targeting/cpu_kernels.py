"""Numba host kernels of the CPU match baseline: the same plan and rows as the device match,
parallel over words on the host's cores (:meth:`~andromeda_nb.targeting.index.TargetingIndex.match_cpu`),
and the list scatter the byte model reuses (:func:`andromeda_nb.match.read_model`).

Imported inside the functions that call them (see :mod:`.numba_common`).
"""

import numpy as np

# numba_common first: it fixes the backend before numba is imported
from .numba_common import ONE, popc, valid_mask
from numba import njit, prange, uint64


@njit(cache=True)
def cpu_scatter(pool, seg_start, seg_len, seg_dst, scratch, value):
    """value 1: set the listed slots' bits in scratch row seg_dst; 0: zero their words."""
    for k in range(seg_start.size):
        for q in range(seg_start[k], seg_start[k] + seg_len[k]):
            s = np.int64(pool[q])
            if s >= 0:
                if value:
                    scratch[seg_dst[k], s >> 6] |= ONE << uint64(s & 63)
                else:
                    scratch[seg_dst[k], s >> 6] = 0


@njit(parallel=True, cache=True)
def cpu_match(rows, scratch, n, inc_ptr, inc_rows, exc_ptr, exc_rows, out, chunk):
    """The match of one plan into ``out`` (its words), chunks of ``chunk`` words in parallel; a
    plan row id ``r >= rows.shape[0]`` reads patch row ``scratch[r - n_rows]``. Per word, as the
    device kernel: categories in order, an include OR stops once it covers the live bits, a word
    stops once it is zero; the last word is masked to the ``n`` valid bits. Returns the count."""
    n_words = out.size
    nr = rows.shape[0]
    n_cat = inc_ptr.size - 1
    n_chunks = (n_words + chunk - 1) // chunk
    part = np.zeros(n_chunks, np.int64)  # per-chunk sums (see build_kernels.count_constrained)
    for k in prange(n_chunks):
        t = 0
        for w in range(k * chunk, min(n_words, (k + 1) * chunk)):
            e = valid_mask(w, n_words, n)
            for c in range(n_cat):
                if e == 0:
                    break
                acc = uint64(0)
                for j in range(inc_ptr[c], inc_ptr[c + 1]):
                    if (e & ~acc) == 0:
                        break
                    r = inc_rows[j]
                    acc |= rows[r, w] if r < nr else scratch[r - nr, w]
                e &= acc
                for j in range(exc_ptr[c], exc_ptr[c + 1]):
                    if e == 0:
                        break
                    r = exc_rows[j]
                    e &= ~(rows[r, w] if r < nr else scratch[r - nr, w])
            out[w] = e
            t += popc(e)
        part[k] = t
    return part.sum()


@njit(cache=True)
def cpu_clear(src, seg_start, seg_len, out):
    """Clear from ``out`` the slots listed in ``src[seg_start[k] : seg_start[k] + seg_len[k]]``
    (negative entries and slots past ``out`` skipped); returns the bits that were set."""
    cleared = 0
    for k in range(seg_start.size):
        for q in range(seg_start[k], seg_start[k] + seg_len[k]):
            s = np.int64(src[q])
            if s >= 0 and (s >> 6) < out.size:
                bit = ONE << uint64(s & 63)
                if out[s >> 6] & bit:
                    cleared += 1
                    out[s >> 6] &= ~bit
    return cleared
