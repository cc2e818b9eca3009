"""Slot bitsets on the host: packing, and 64-bit word / bit arithmetic past 2^31 slots."""

import numpy as np
import pytest

from andromeda_nb.targeting import bit_of, bits_from_mask, last_word_mask, mask_from_bits, table_slots, word_of


def test_host_index_math_at_large_offsets():
    for s in (2**31 - 1, 2**31, 2**32 + 5, 2**40 - 1):
        assert word_of(s) == s // 64
        assert int(bit_of(s)) == 1 << (s % 64)
    assert last_word_mask(2**31 + 3) == np.uint64(0b111)
    assert last_word_mask(2**33) == np.uint64(2**64 - 1)


def test_bitset_roundtrip(rng):
    for n in (0, 1, 63, 64, 65, 1000):
        mask = rng.random(n) < 0.5
        words = bits_from_mask(mask)
        assert words.dtype == np.uint64 and words.size == (n + 63) // 64
        np.testing.assert_array_equal(mask_from_bits(words, n), mask)


def test_table_slots():
    assert table_slots([0, 9, 3], 10).dtype == np.int64
    assert table_slots(np.array([], np.int32), 10).size == 0
    with pytest.raises(ValueError, match="0..9"):
        table_slots([10], 10)
    with pytest.raises(ValueError, match="0..9"):
        table_slots([-1], 10)
    with pytest.raises(TypeError, match="1-D integer"):
        table_slots([1.5], 10)
    with pytest.raises(TypeError, match="1-D integer"):
        table_slots([[1]], 10)
