"""Independent numpy models of the seeds (the single-request seed's r-th sample to 24 key bits, the
batched seed's radix levels and threads'-best search), as the kernels' docstrings define them."""

from __future__ import annotations

import numpy as np

from andromeda_nb.device import launch
from andromeda_nb.topk.batched import batch_seed_shape
from andromeda_nb.topk.seed import SeedWorkspace
from andromeda_nb.topk.seed_kernels import BATCH_SAMPLE_CHUNK

from .helpers import f32_keys, key_to_f32

#: float_key(-inf): the lowest key of a non-NaN float
KEY_NEG_INF = 0x007FFFFF


def sim_shape():
    """(threads, samples a thread, samples a request) of the batched seed (32 x 32 in the simulator)."""
    blk, per = batch_seed_shape()
    if launch.backend.is_simulator():
        assert blk == launch.default_block() == 32
    return blk, per, blk * per


def seed_positions(n: int, M: int, chunk: int) -> np.ndarray:
    """The local positions a request of n > M scores is sampled at (docstring of batch_seed_kernel):
    M / chunk runs of chunk contiguous scores, run j centred in the j-th stratum of n // (M / chunk)."""
    chunks = M // chunk
    step = n // chunks
    starts = np.arange(chunks, dtype=np.int64) * step + (step - chunk) // 2
    return (starts[:, None] + np.arange(chunk, dtype=np.int64)[None, :]).ravel()


def seed_rank(n: int, k: int, M: int, margin_x2: int, min_rank: int):
    """(positions sampled, rank r, whether the rank is past M / 4 so the seed is -inf)."""
    if n <= M:
        return np.arange(n, dtype=np.int64), k, False
    r = max(min_rank, -(-(margin_x2 * k * M) // (2 * n)))  # ceil(margin_x2 * k * M / (2 n))
    return seed_positions(n, M, BATCH_SAMPLE_CHUNK), r, r > M // 4


def thread_best_keys(sample_keys: np.ndarray, blk: int, M: int) -> np.ndarray:
    """Each thread's best sample key (0: none real): sample idx sits in thread idx % blk (samples
    ``j * blk + t``), sample keys 0 where not real, samples past the array (a whole request of
    fewer than M scores) none."""
    padded = np.zeros(M, np.int64)
    padded[: sample_keys.size] = sample_keys
    return padded.reshape(M // blk, blk).max(axis=0)


def max_seed_model(top: np.ndarray, r: int):
    """The threads'-best search of batch_seed_kernel: key bits from the top, a bit kept when at
    least r threads' best reach it, stopping once at most r + r // 4 do; None when fewer than r
    threads hold a real sample (the kernel takes the radix levels)."""
    if (top != 0).sum() < r:
        return None
    edge = 0
    for b in range(31, -1, -1):
        c = int((top >= (edge | (1 << b))).sum())
        if c >= r:
            edge |= 1 << b
            if c <= r + r // 4:
                break
    return key_to_f32(max(edge, KEY_NEG_INF))


def batch_seed_model(s: np.ndarray, k: int, mask, M: int, margin_x2: int, min_rank: int, by_max: bool,
               blk: int | None = None) -> np.float32:
    """The seed of one request: ``by_max`` and a rank up to blk / 4 with at least that many threads
    holding a real sample (not NaN, not -inf, eligible), :func:`max_seed_model`; else the lower edge of the
    24-bit key prefix of the r-th largest real sample key; -inf with fewer than r real samples or
    a sampled request whose rank exceeds M / 4."""
    blk = blk or sim_shape()[0]
    pos, r, too_deep = seed_rank(s.size, k, M, margin_x2, min_rank)
    if too_deep:
        return np.float32(-np.inf)
    sample = s[pos]
    real = ~np.isnan(sample) & (sample != -np.inf)
    if mask is not None:
        real &= mask[pos]
    if by_max and r <= blk // 4:
        seed = max_seed_model(thread_best_keys(np.where(real, f32_keys(sample), 0), blk, M), r)
        if seed is not None:
            return seed
    keys = np.sort(f32_keys(sample[real]))[::-1]
    if keys.size < r:
        return np.float32(-np.inf)
    return key_to_f32(max(int(keys[r - 1]) & 0xFFFFFF00, KEY_NEG_INF))


def single_seed_model(sample: np.ndarray, r: int, bits: int = 24) -> np.float32:
    """The seed the histogram levels must give: the r-th best real sample's key with all but its
    top ``bits`` cleared, as a float (-inf with fewer than r real samples)."""
    real = sample[~np.isnan(sample) & (sample != -np.inf)].astype(np.float32)
    if real.size < r:
        return np.float32(-np.inf)
    u = int(np.sort(real)[::-1][r - 1:r].view(np.uint32)[0])
    key = u ^ 0xFFFFFFFF if u & 0x80000000 else u | 0x80000000
    key = max(int(key) & (0xFFFFFFFF << (32 - bits)) & 0xFFFFFFFF, 0x007FFFFF)
    back = key & 0x7FFFFFFF if key & 0x80000000 else key ^ 0xFFFFFFFF
    return np.array([back], np.uint32).view(np.float32)[0]


def draw_seeded_exact(draw, n: int, k: int, config, tries: int = 50) -> np.ndarray:
    """Fresh scores from ``draw()`` (float32[n]) on which the single-request seed under ``config``, as the host
    model :func:`single_seed_model` gives it (checked against the kernel by
    test_histogram_seed_is_the_rth_sample_to_24_key_bits), keeps at least ``min(k, non-NaN)``
    scores. The seed is a sampled bound: with its rank r below k (n = 2049, k = 20: r = 8) about
    one normal draw in 600 keeps fewer (seed_high, a rerun); tests of something other than
    the rerun draw again rather than trip on it."""
    sws = SeedWorkspace.make(n, k, config=config)
    for _ in range(tries):
        s = draw()
        sample = np.where(np.isnan(s), -np.inf, s)[sws.positions()]
        seed, valid = single_seed_model(sample, sws.r), ~np.isnan(s)
        if int((valid & (s >= seed)).sum()) >= min(k, int(valid.sum())):
            return s
    raise AssertionError(f"no draw in {tries} kept k = {k} scores at the seed")
