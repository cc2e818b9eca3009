"""The request path's compaction kernels against numpy: the block prefix sum and the candidate
gather (random bitsets, sizes off the tile and the word, a list capacity below the count)."""

import numpy as np
import pytest
from numba import cuda, int32

from andromeda_nb.device import launch
from andromeda_nb.device.scan import block_exclusive_sum


def _scan_kernel(block):
    scan = block_exclusive_sum(block)

    @cuda.jit
    def kernel(x, before, total):
        scratch = cuda.shared.array(block, int32)
        tid = cuda.threadIdx.x
        b, t = scan(x[tid], scratch)
        before[tid] = b
        total[tid] = t

    return kernel


def test_block_exclusive_sum_matches_numpy(rng):
    block = launch.default_block()
    x = rng.integers(0, 65, block).astype(np.int32)
    x[rng.integers(block)] = 0
    before, total = cuda.device_array(block, np.int32), cuda.device_array(block, np.int32)
    _scan_kernel(block)[1, block](cuda.to_device(x), before, total)
    np.testing.assert_array_equal(before.copy_to_host(), np.cumsum(x) - x)
    np.testing.assert_array_equal(total.copy_to_host(), np.full(block, x.sum()))


@pytest.mark.parametrize("density", [0.0, 0.02, 0.5, 1.0])
def test_gather_candidates_lists_every_eligible_slot(rng, density):
    from andromeda_nb.pipeline.kernels import gather_candidates_kernel

    block, words = launch.default_block(), 2
    B = 3
    n_bits = int(rng.integers(1, 3 * block * words * 64 + 100))  # several tiles, the last one partial
    n_words = -(-n_bits // 64)
    dense = rng.random((B, n_words * 64)) < density
    dense[:, n_bits:] = False  # the gather's contract: padding bits clear
    dense[1] = False  # a request with nothing eligible
    bits = np.packbits(dense, axis=1, bitorder="little").view(np.uint64)
    expect = [np.flatnonzero(row) for row in dense]
    cap = max(1, int(dense[0].sum()) - 3)  # request 0 overflows its list: count still exact
    cand = cuda.to_device(np.full((B, cap), -7, np.int32))
    count = cuda.to_device(np.zeros(B, np.int64))
    grid = int(rng.integers(1, 4))  # grid-stride over the tiles
    gather_candidates_kernel(block, words)[(grid, B), block](cuda.to_device(bits), n_words, cand, count)
    got, counts = cand.copy_to_host(), count.copy_to_host()
    for b in range(B):
        assert counts[b] == expect[b].size
        listed = got[b, :min(cap, expect[b].size)]
        assert np.unique(listed).size == listed.size
        assert np.isin(listed, expect[b]).all()
        if expect[b].size <= cap:
            np.testing.assert_array_equal(np.sort(listed), expect[b])
            assert (got[b, expect[b].size:] == -7).all()
