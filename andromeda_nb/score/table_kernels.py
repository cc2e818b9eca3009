"""The one kernel a device table needs for itself: the largest finite magnitude it stores (the
range checks of :func:`~andromeda_nb.score.launches.check_range` read it)."""

import functools

import numpy as np
from numba import cuda, float32

from ..device.intrinsics import DECODE

FLOAT32_MAX = float32(np.finfo(np.float32).max)


@functools.lru_cache(maxsize=None)
def max_abs_kernel(dtype: str):
    """Launch ``[grid, block]`` (grid-stride over ``words uint64[n]``, the table as 8-byte words):
    ``out[0]`` (float32, zero before) becomes the largest finite |value| of the widened elements
    (int8: the raw integers, the caller multiplies by the largest row scale); one float atomic max
    a thread."""
    decode = DECODE[dtype]

    @cuda.jit
    def kernel(words, out):
        best = float32(0.0)
        i = cuda.grid(1)
        while i < words.shape[0]:
            for v in decode(words[i]):
                if abs(v) <= FLOAT32_MAX:  # finite only: NaN and inf compare false
                    best = max(best, abs(v))
            i += cuda.gridsize(1)
        cuda.atomic.max(out, 0, best)

    return kernel
