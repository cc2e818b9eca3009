"""The match kernels' 64-bit slot arithmetic beyond 2^31 bits, without allocating 2^31 bits: the
kernels work on a window of a virtual pool (``slot_base``, a multiple of 64, is the slot of the
window's bit 0) and get slots near 2^31, 2^32, 2^35 and 2^39."""

import numpy as np
import pytest

from andromeda_nb.device import launch
from andromeda_nb.match import kernels as K

BASES = [(1 << 31) - 128, 1 << 32, (1 << 35) + 64 * 7, (1 << 39) - 64 * 3]


@pytest.mark.parametrize("lists", ["search", "segment"])
@pytest.mark.parametrize("base", BASES)
def test_scatter_clear_and_flip_at_large_slots(base, lists):
    """The list passes (a grid-stride search for each entry's segment, or a block row a segment)
    and the update kernel at slot bases past 2^31 and 2^32 (64-bit slot arithmetic)."""
    cuda = launch.cuda()
    block = launch.default_block()
    slots = np.array([base, base + 1, base + 63, base + 64, base + 200, base + 255, -1 - (base + 7)], np.int64)
    pool = cuda.to_device(slots)
    n_words = 4
    scratch = cuda.to_device(np.zeros((2, n_words), np.uint64))
    counts = cuda.to_device(np.full(3, 99, np.int64))
    seg_start = cuda.to_device(np.array([0], np.int64))
    seg_off = cuda.to_device(np.array([0, slots.size], np.int64))
    seg_dst = cuda.to_device(np.array([1], np.int64))
    prep = K.prep_kernel()[2, block] if lists == "search" else K.prep_segment_kernel(block)[(1, 1), block]
    prep(counts, 3, pool, seg_start, seg_off, seg_dst, scratch, np.int64(base))
    got = scratch.copy_to_host()
    want = np.zeros((2, n_words), np.uint64)
    for s in slots[slots >= 0] - base:
        want[1, s >> 6] |= np.uint64(1) << np.uint64(s & 63)
    np.testing.assert_array_equal(got, want)  # the removed entry (negative) is skipped
    assert counts.copy_to_host().tolist() == [0, 0, 0]

    # post: clear three listed slots from a result window (one not set), zero the patch row again
    out = cuda.to_device(np.full((1, n_words), np.uint64(2**64 - 1)))
    counts = cuda.to_device(np.array([4 * 64], np.int64))
    extra = cuda.to_device(np.array([base + 3, base + 3, base + 130], np.int64))
    q_start = cuda.to_device(np.array([0, 0], np.int64))
    q_off = cuda.to_device(np.array([0, 3, 3 + slots.size], np.int64))
    q_op = cuda.to_device(np.array([1, 2], np.int64))
    q_arg = cuda.to_device(np.array([0, 1], np.int64))
    post = K.post_kernel(block)[2, block] if lists == "search" else K.post_segment_kernel(block)[(1, 2), block]
    post(out, counts, n_words, pool, extra, q_start, q_off, q_op, q_arg, scratch, np.int64(base))
    res = out.copy_to_host()[0]
    assert counts.copy_to_host()[0] == 4 * 64 - 2  # the duplicate clears once
    assert res[0] == np.uint64(2**64 - 1) ^ np.uint64(1 << 3) and res[2] == np.uint64(2**64 - 1) ^ np.uint64(1 << 2)
    assert not scratch.copy_to_host().any()

    # apply: flip bits named by row << 40 | slot codes, write list entries
    rows = cuda.to_device(np.zeros((3, n_words), np.uint64))
    codes = [(2 << 40) | (base + 65), (0 << 40) | (base + 255), (2 << 40) | (base + 65 + 64)]
    buf = cuda.to_device(np.array(codes + [1, 4] + [base + 9, -1 - (base + 9)], np.int64))
    pool2 = cuda.to_device(np.zeros(6, np.int64))
    K.apply_kernel()[2, block](rows, pool2, buf, 3, 2, np.int64(base))
    r = rows.copy_to_host()
    assert r[2, 1] == np.uint64(2) and r[2, 2] == np.uint64(2) and r[0, 3] == np.uint64(1 << 63)
    assert pool2.copy_to_host().tolist() == [0, base + 9, 0, 0, -1 - (base + 9), 0]


@pytest.mark.parametrize("base", BASES)
def test_compact_and_last_mask_at_large_slots(base):
    cuda = launch.cuda()
    block = launch.default_block()
    rng = np.random.default_rng(base % 1000)
    host = rng.integers(0, 2**64, (1, 9), dtype=np.uint64, endpoint=False) & np.uint64(0x8000100000F00001)
    host[0, 4] |= np.uint64(1 << 63)  # the top bit at least once: it is where a signed shift would go wrong
    words = cuda.to_device(host)
    chunk = block * 4
    n_chunks = -(-9 // chunk)
    counts = cuda.device_array(n_chunks, np.int64)
    total = int(sum(bin(int(x)).count("1") for x in host[0]))
    out = cuda.device_array(total, np.int64)
    K.chunk_count_kernel(block)[1, block](words, 0, 9, chunk, counts)
    K.compact_kernel(block)[1, block](words, 0, 9, chunk, counts, out, np.int64(base))
    bits = np.unpackbits(host[0].view(np.uint8), bitorder="little")
    np.testing.assert_array_equal(out.copy_to_host(), base + np.flatnonzero(bits))

    @cuda.jit
    def masks(n_bits, n_words, res):
        res[0] = K.last_mask(n_bits, n_words)

    res = cuda.to_device(np.zeros(1, np.uint64))
    for extra, want in ((5, 0b11111), (64, 2**64 - 1), (1, 1)):
        n_bits = base + 64 * 10 + extra if extra < 64 else base + 64 * 11
        masks[1, 1](np.int64(n_bits), np.int64(-(-n_bits // 64)), res)
        assert int(res.copy_to_host()[0]) == want
