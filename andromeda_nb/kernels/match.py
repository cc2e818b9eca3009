"""Bitset targeting match: one thread per 64-ad word, grid-stride.

For word ``w``: ``e = live[w]``; for each category of the request's plan (most selective first),
``e &= (OR of include rows) & ~(OR of exclude rows)``; stop reading further categories once ``e``
is zero (early exit). Padding bits past ``n_ads`` are zero in the live row, so they never match,
whatever NOT / ANDNOT does to them. Bytes read per word: 8 per row actually read.
"""

import functools

from numba import cuda, int64, uint64


@functools.lru_cache(maxsize=None)
def match_kernel(block: int):
    """Launch ``[grid, block]``. Args: ``bitsets uint64[n_rows, n_words]`` (row 0 = live),
    ``inc_ptr int32[C+1]``, ``inc_rows int32[...]``, ``exc_ptr int32[C+1]``, ``exc_rows int32[...]``,
    ``out uint64[n_words]`` (the eligible bitset), ``count int64[1]`` (+= eligible ads)."""

    @cuda.jit
    def kernel(bitsets, inc_ptr, inc_rows, exc_ptr, exc_rows, out, count):
        block_count = cuda.shared.array(1, int64)
        tid = cuda.threadIdx.x
        if tid == 0:
            block_count[0] = 0
        cuda.syncthreads()
        n_words = out.shape[0]
        n_cat = inc_ptr.shape[0] - 1
        mine = 0
        for w in range(cuda.grid(1), n_words, cuda.gridsize(1)):
            e = bitsets[0, w]
            c = 0
            while c < n_cat and e != 0:
                inc = uint64(0)
                for r in range(inc_ptr[c], inc_ptr[c + 1]):
                    inc |= bitsets[inc_rows[r], w]
                exc = uint64(0)
                for r in range(exc_ptr[c], exc_ptr[c + 1]):
                    exc |= bitsets[exc_rows[r], w]
                e &= inc & ~exc
                c += 1
            out[w] = e
            mine += cuda.popc(e)
        cuda.atomic.add(block_count, 0, mine)
        cuda.syncthreads()
        if tid == 0:
            cuda.atomic.add(count, 0, block_count[0])

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
