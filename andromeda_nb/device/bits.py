"""Device helpers for widening stored ad-table elements to fp32, and their simulator shims.

Numba's CUDA simulator has no ``cuda.libdevice``; the bit cast ``int_as_float`` gets a numpy shim
there, so the same kernel source runs in the simulator and on the GPU.
"""

import numpy as np
from numba import cuda, float32, int32, uint32
from numba.cuda.core import config

if config.ENABLE_CUDASIM:

    def _f32_from_bits(bits):
        return np.uint32(int(bits) & 0xFFFFFFFF).view(np.float32)

else:

    @cuda.jit(device=True, inline=True)
    def _f32_from_bits(bits):
        return cuda.libdevice.int_as_float(int32(bits))


@cuda.jit(device=True, inline=True)
def widen_fp32(x):
    return x


@cuda.jit(device=True, inline=True)
def widen_fp16(x):
    return float32(x)


@cuda.jit(device=True, inline=True)
def widen_bf16(x):
    """bf16 stored as uint16: its bits are the upper half of an fp32 (exact widening)."""
    return _f32_from_bits(uint32(x) << uint32(16))


@cuda.jit(device=True, inline=True)
def widen_int8(x):
    return float32(x)


WIDEN = {"fp32": widen_fp32, "fp16": widen_fp16, "bf16": widen_bf16, "int8": widen_int8}


@cuda.jit(device=True, inline=True)
def relu_keep_nan(x):
    """max(x, 0) that propagates NaN (fmaxf would turn NaN into 0 and hide bad data)."""
    return float32(0.0) if x < float32(0.0) else x


@cuda.jit(device=True, inline=True)
def test_bit(words, i):
    """Bit ``i`` of a uint64 bitset (bit i % 64 of word i // 64) as 0 or 1."""
    return (words[i >> 6] >> uint32(i & 63)) & 1
