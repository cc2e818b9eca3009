"""The kernels a device table needs for itself: the largest finite magnitude it stores (the range
checks of :func:`~andromeda_nb.score.launches.check_range` read it), and an int8 table's row scales
as the fp16 pairs fp16 math multiplies by (``KernelConfig.row_scales``)."""

import functools

import numpy as np
from numba import cuda, float32, float64

from ..device.intrinsics import DECODE, decode_int8, dequant_offset_h2, half2_of

FLOAT32_MAX = float32(np.finfo(np.float32).max)


@functools.lru_cache(maxsize=None)
def max_abs_kernel(dtype: str):
    """Launch ``[grid, block]`` (grid-stride over ``words uint64[n]``, the table as 8-byte words):
    ``out[0]`` (float32, zero before) becomes the largest finite |value| of the widened elements
    of a float table (int8 tables: :func:`int8_max_abs_kernel`); one float atomic max a thread."""
    if dtype == "int8":  # |q| alone is not the stored value: each row's scale multiplies it
        raise ValueError("max_abs_kernel reads float tables; an int8 table's is int8_max_abs_kernel")
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


@cuda.jit
def int8_max_abs_kernel(words, scale, tiles, out):
    """Launch ``[grid, block]`` (grid-stride over rows; ``words`` the table's uint64 words,
    ``[n_w, n_ads]`` where ``tiles`` else ``[n_ads, n_w]``): ``out[0]`` (float64, zero before)
    becomes the largest |q * scale| of any row, as the host computes it (a row's largest |q| times
    its |scale|, in float64: a finite scale may take it past fp32's range); one atomic max a thread."""
    n_w = words.shape[0] if tiles else words.shape[1]
    best = float64(0.0)
    r = cuda.grid(1)
    while r < scale.shape[0]:
        top = float32(0.0)
        for w in range(n_w):
            for v in decode_int8(words[w, r] if tiles else words[r, w]):
                top = max(top, abs(v))
        best = max(best, float64(top) * abs(float64(scale[r])))
        r += cuda.gridsize(1)
    cuda.atomic.max(out, 0, best)


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
