"""The kernels a device table needs for itself: the largest finite magnitude it stores (the range
checks of :func:`~andromeda_nb.score.launches.check_range` read it), and an int8 table's row scales
as the fp16 pairs fp16 math multiplies by (``KernelConfig(row_scales="fp16_pairs")``)."""

import functools

import numpy as np
from numba import cuda, float32

from ..device.intrinsics import DECODE, dequant_offset_h2, half2_of

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


@cuda.jit(device=True)
def scale_pair(s):
    """The uint32 word fp16 math reads for row scale ``s`` (float32): the low half ``s`` rounded to
    fp16 (at most 65504), the high half that times -1152 rounded to fp16; the intrinsics the kernel
    calls each round otherwise, so the same bits
    (:func:`~andromeda_nb.device.intrinsics.scale_pairs_host` on the host)."""
    s2 = half2_of(s)
    return (s2 & 0xFFFF) | (dequant_offset_h2(s2) & 0xFFFF0000)


@cuda.jit
def scale_pairs_kernel(scale, out):
    """``out[i] = scale_pair(scale[i])`` (uint32), grid-stride."""
    i = cuda.grid(1)
    while i < scale.shape[0]:
        out[i] = scale_pair(scale[i])
        i += cuda.gridsize(1)
