"""The small kernel of the seeded filter path beside the generated scoring kernel
(:func:`~andromeda_nb.score.launches.launch_score_filter`): preparing the sample that seeds it."""

from __future__ import annotations

import functools
import math as pymath

from numba import cuda, float32

from ..device.bits import test_bit


@functools.lru_cache(maxsize=None)
def sample_prep_kernel(has_cand: bool, has_elig: bool):
    """Launch ``[grid, block]`` (grid-stride over the ``m`` sample positions): with ``has_cand``,
    ``slots[i] = cand[pos[i]]`` (the sampled candidates' table slots, for scoring the sample);
    with ``has_elig``, ``sample[i] = -inf`` where position ``pos[i]`` is not in the eligible
    bitset ``elig uint64[words]`` (run after the sample is scored: an ineligible ad never seeds).
    Block 0 also zeroes ``counts int64[1, 2]`` and ``fill int64[1]`` of the filter pass that
    follows (when ``reset``)."""

    @cuda.jit
    def kernel(pos, cand, slots, elig, sample, reset, counts, fill):
        i = cuda.grid(1)
        if reset and i < 2:
            counts[0, i] = 0
            if i == 0:
                fill[0] = 0
        while i < pos.shape[0]:
            p = pos[i]
            if has_cand:
                slots[i] = cand[p]
            if has_elig and test_bit(elig, p) == 0:
                sample[i] = float32(-pymath.inf)
            i += cuda.gridsize(1)

    return kernel
