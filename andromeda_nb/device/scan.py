"""A block-wide exclusive prefix sum, the compaction kernels' primitive.

On a GPU each warp scans its 32 values with shuffles (five steps, no barrier), one barrier
publishes the warp totals, and every thread adds the totals of the warps before its own: one
barrier a scan. Numba's CUDA simulator has no warp shuffles (and runs a block's threads as Python
threads, so warp-synchronous code is not synchronous there): it gets a Hillis-Steele scan over
shared memory with a barrier pair a step, the same results.
"""

from __future__ import annotations

import functools

from numba import cuda, int32
from numba.cuda.core import config

FULL_MASK = 0xFFFFFFFF


@functools.lru_cache(maxsize=None)
def block_exclusive_sum(block: int):
    """A device function ``(x, scratch) -> (before, total)``: ``before`` = the sum of ``x`` over the
    threads of lower index in the block, ``total`` = the block's sum (int32). Every thread of the
    block calls it (it holds barriers); ``scratch = cuda.shared.array(block, int32)`` (the GPU form
    uses its first ``block // 32`` entries). The caller places a barrier between two calls that
    share ``scratch`` (a thread may still read the previous totals). ``block`` a multiple of 32 on
    a GPU."""
    if config.ENABLE_CUDASIM:

        @cuda.jit(device=True)
        def scan(x, scratch):
            tid = cuda.threadIdx.x
            scratch[tid] = x
            cuda.syncthreads()
            off = 1  # inclusive Hillis-Steele
            while off < block:
                add = scratch[tid - off] if tid >= off else 0
                cuda.syncthreads()
                scratch[tid] += add
                cuda.syncthreads()
                off *= 2
            return scratch[tid] - x, scratch[block - 1]

        return scan

    if block % 32:
        raise ValueError(f"block_exclusive_sum needs whole warps, got a block of {block}")
    warps = block // 32

    @cuda.jit(device=True, inline=True)
    def scan(x, scratch):
        tid = cuda.threadIdx.x
        lane = tid & 31
        v = int32(x)
        off = 1
        while off < 32:  # inclusive warp scan
            y = cuda.shfl_up_sync(FULL_MASK, v, off)
            if lane >= off:
                v += y
            off *= 2
        if lane == 31:
            scratch[tid >> 5] = v
        cuda.syncthreads()
        before = v - x
        total = int32(0)
        for w in range(warps):
            s = scratch[w]
            if w < (tid >> 5):
                before += s
            total += s
        return before, total

    return scan
