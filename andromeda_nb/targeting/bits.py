"""Bitsets over ad slots: uint64 words, bit ``i % 64`` of word ``i // 64`` is slot ``i``.

Padding bits past the pool are never set in any stored row, and the match kernels AND the last
word with the valid-bit mask, so a padding bit never matches, whatever NOT / ANDNOT does. Slot
arithmetic is 64-bit throughout (pools beyond 2^31 slots).
"""

from __future__ import annotations

import numpy as np

WORD_BITS = 64


def bits_from_mask(mask: np.ndarray) -> np.ndarray:
    """Pack a bool ``[n]`` mask into uint64 words ``[ceil(n / 64)]`` (bit i%64 of word i//64)."""
    mask = np.asarray(mask, dtype=bool)
    n_words = (mask.size + WORD_BITS - 1) // WORD_BITS
    padded = np.zeros(n_words * WORD_BITS, dtype=bool)
    padded[: mask.size] = mask
    return np.packbits(padded, bitorder="little").view("<u8").astype(np.uint64)


def mask_from_bits(words: np.ndarray, n: int) -> np.ndarray:
    """Unpack uint64 words into a bool ``[n]`` mask (the inverse of :func:`bits_from_mask`)."""
    words = np.ascontiguousarray(words, dtype="<u8")
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)


def last_word_mask(n_bits: int) -> np.uint64:
    """The valid bits of the last word of an ``n_bits``-long bitset (all ones when n % 64 == 0)."""
    r = int(n_bits) % WORD_BITS
    return np.uint64((1 << r) - 1 if r else (1 << 64) - 1)


def word_of(slot: int) -> int:
    """The uint64 word holding ``slot`` (64-bit safe)."""
    return int(slot) >> 6


def bit_of(slot: int) -> np.uint64:
    """The mask of ``slot``'s bit within its word."""
    return np.uint64(1 << (int(slot) & 63))


def table_slots(slots, n_ads: int) -> np.ndarray:
    """Validate a 1-D integer array of slots in ``0..n_ads-1`` (raises TypeError / ValueError)."""
    arr = np.asarray(slots)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise TypeError("slots must be a 1-D integer array")
    if arr.size and (arr.min() < 0 or arr.max() >= n_ads):
        raise ValueError(f"slots must be in 0..{n_ads - 1}")
    return arr.astype(np.int64)
