"""The seeds (topk/seed.py, topk/seed_kernels.py) against independent numpy models (tests/topk/models.py):
the single-request seed's r-th best sample to 24 key bits, its sample sizing, and the batched seed
(radix levels, the threads'-best search) bit for bit."""

import numpy as np
import pytest

from andromeda_nb.device import launch
from andromeda_nb.topk.config import DEFAULT_CONFIG
from andromeda_nb.topk.seed import SeedWorkspace, launch_seed, sample_positions, seed_block
from andromeda_nb.topk.seed_kernels import BATCH_SAMPLE_CHUNK, batch_seed_kernel

from ..helpers import poison_device_arrays
from .helpers import bits, elig_rows, f32_keys, make_scores, small_seed
from .models import (KEY_NEG_INF, batch_seed_model, seed_rank, sim_shape, single_seed_model, thread_best_keys)


@pytest.fixture(autouse=True)
def poisoned_device_memory(monkeypatch):
    """Device arrays start as 0xA5 bytes (simulator), so an output element left unwritten shows."""
    if launch.backend.is_simulator():
        poison_device_arrays(monkeypatch)


# ----------------------------------------------------------------------------- the single-request seed

@pytest.mark.parametrize("kind", ["normal", "narrow", "negative", "ties", "few_real", "inf", "cand_overflow"])
def test_histogram_seed_is_the_rth_sample_to_24_key_bits(rng, kind):
    """The seed launch (seed_kernels.seed_kernel) gives the r-th best real sample's 24-bit key prefix, so
    at least r samples reach it; NaN / -inf samples never count; the candidate count, threshold
    and ticket are left zero (a second call on other data agrees too). Several blocks, so the
    per-block pruning and the last block's pick both run. More candidates than the buffer holds:
    the seed is the highest block's own r-th best prefix (lower, still reached by r samples)."""
    config = small_seed(max_sample_chunks=16, **({"seed_cand_cap": 5} if kind == "cand_overflow" else {}))
    n, k = 4096 + 3, 40
    sws = SeedWorkspace.make(n, k, config=config)
    assert sws.cand.shape[0] == config.tuning.seed_cand_cap
    for trial in range(2):
        scores = {"normal": rng.standard_normal(n), "narrow": 0.5 + 1e-6 * rng.random(n),
                  "negative": -1e3 - rng.random(n), "ties": rng.integers(0, 3, n) * 0.25,
                  "few_real": np.where(rng.random(n) < 0.01, rng.standard_normal(n), np.nan),
                  "inf": np.where(rng.random(n) < 0.5, np.inf, -np.inf),
                  "cand_overflow": rng.standard_normal(n)}[kind].astype(np.float32)
        if trial:
            scores[: n // 3] = -scores[: n // 3]
        seed = launch_seed(launch.to_device(scores), n, sws).copy_to_host()[0]
        sample = sws.sample_flat.copy_to_host()
        np.testing.assert_array_equal(sample, np.where(np.isnan(scores), -np.inf, scores)[sws.positions()])
        want = single_seed_model(sample, sws.r)
        if kind == "cand_overflow":  # the best block threshold: each block's r-th best prefix
            per = 4 * seed_block()
            want = max(single_seed_model(sample[b:b + per], sws.r) for b in range(0, sample.size, per))
        assert seed == want or (np.isinf(want) and seed == want), (seed, want)
        if np.isfinite(seed) or seed == np.inf:
            assert (sample >= seed).sum() >= sws.r
        assert sws.ctl.copy_to_host().tolist() == [0, 0, 0]
    t = config.tuning
    assert sws.r == max(t.seed_min_rank, int(np.ceil(t.seed_margin * k * sws.m / n)))
    np.testing.assert_array_equal(sws.positions(), sample_positions(n, sws.chunks, chunk=t.sample_chunk))
    if launch.backend.is_simulator():  # several blocks: each prunes, the last one picks
        assert sws.m // (4 * seed_block()) >= 4


def test_seed_sample_is_sized_for_its_rank():
    """A small array samples only what a seed of rank ~seed_sample_rank needs (the sample is a
    gather of its own); a large one is capped at max_sample_chunks runs; a small k still gets a
    seed of rank seed_min_rank (the default tuning)."""
    t = DEFAULT_CONFIG.tuning
    small = SeedWorkspace.make(500_000, 1000)
    assert small.m == 50 * t.sample_chunk  # ceil(64 * 500000 / (2.5 * 1000 * 256)) = 50 chunks
    assert small.r == int(np.ceil(t.seed_margin * 1000 * small.m / 500_000)) == 64
    large = SeedWorkspace.make(10**8, 1000)
    assert large.chunks == t.max_sample_chunks and large.r == 27
    tiny_k = SeedWorkspace.make(10**6, 1)
    assert tiny_k.r == t.seed_min_rank and tiny_k.m == 10**6 // 8 // t.sample_chunk * t.sample_chunk
    assert SeedWorkspace.make(t.seed_min_n - 1, 10) is None


# ----------------------------------------------------------------------------- the batched seed


@pytest.mark.parametrize("by_max", [False, True])
@pytest.mark.parametrize("use_elig", [False, True])
@pytest.mark.parametrize("margin_x2,min_rank", [(5, 8), (3, 1)])
def test_batch_seed_matches_numpy_model(rng, use_elig, margin_x2, min_rank, by_max):
    """One launch, a block a request: whole requests (n <= M: 0, 1, 3, M - 1, M, k > n) and sampled
    ones (n > M: M + 1 up to ~30 M), NaN / +-inf / -0 / ties / narrow / negative / all-NaN /
    all -inf, with and without an eligible bitset, the rank just at and just past M / 4; each seed
    bit for bit the model's; counts and fill zeroed whatever they held."""
    blk, per, M = sim_shape()
    # the largest k at n = 2M whose rank stays within M / 4 (the next one gives -inf)
    k_edge = max(k for k in range(1, 4 * M) if -(-(margin_x2 * k * M) // (4 * M)) <= M // 4)
    reqs = [  # (n, k, kind)
        (0, 3, "normal"), (1, 1, "normal"), (3, 2, "ties"), (5, 9, "normal"),  # k > n
        (M - 1, 17, "normal"), (M, 40, "narrow"), (M + 1, 5, "normal"), (2 * M, k_edge, "normal"),
        (2 * M, k_edge + 1, "normal"), (3 * M + 17, 30, "ties"), (5 * M + 3, 1, "negative"),
        (7 * M, 64, "posinf"), (2 * M + 1, 10, "all_nan"), (700 % M + 1, 4, "all_nan"),
        (3 * M, 3, "all_neginf"), (30 * M + 11, 100, "narrow"), (9 * M, 25, "normal"),
        (M + 1, M // 4, "normal"),  # rank far past M / 4 (r ~ 1.25 k at n ~ M), at any M
    ]
    sizes = [n for n, _, _ in reqs]
    ks = np.array([k for _, k, _ in reqs], np.int64)
    parts = [make_scores(rng, n, kind) for n, _, kind in reqs]
    scores = np.concatenate(parts)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    masks = [rng.random(n) < 0.6 for n in sizes] if use_elig else None
    words = max(1, -(-max(sizes) // 64))
    d_elig = launch.to_device(elig_rows(masks, words)) if use_elig else launch.dummy2d(np.uint64)
    B = len(reqs)
    seeds = launch.to_device(np.full(B, 12345.0, np.float32))
    counts = launch.to_device(np.full((B, 2), 7, np.int64))
    fill = launch.to_device(np.full(B, 9, np.int64))
    batch_seed_kernel(blk, per, BATCH_SAMPLE_CHUNK, use_elig, margin_x2, min_rank, by_max)[B, blk](
        launch.to_device(scores), launch.to_device(offsets), launch.to_device(ks), d_elig, seeds, counts, fill)
    got = seeds.copy_to_host()
    assert (counts.copy_to_host() == 0).all() and (fill.copy_to_host() == 0).all()
    kinds = {"finite": 0, "by_max": 0, "rank_too_deep": 0, "few_real": 0}
    for q, (n, k, kind) in enumerate(reqs):
        s, mask = parts[q], None if masks is None else masks[q]
        want = batch_seed_model(s, k, mask, M, margin_x2, min_rank, by_max)
        assert bits(got[q]) == bits(want), (q, n, k, kind, got[q], want)
        pos, r, too_deep = seed_rank(n, k, M, margin_x2, min_rank)
        sample = s[pos]
        real = ~np.isnan(sample) & (sample != -np.inf) & (True if mask is None else mask[pos])
        if too_deep:
            kinds["rank_too_deep"] += 1
            assert got[q] == -np.inf
        elif real.sum() < r:
            kinds["few_real"] += 1
            assert got[q] == -np.inf
        else:  # a property of its own: r real samples reach the seed
            assert (sample[real] >= got[q]).sum() >= r
            top = thread_best_keys(np.where(real, f32_keys(sample), 0), blk, M)
            if by_max and r <= blk // 4 and (top != 0).sum() >= r:  # the threads' best: few more reach it
                kinds["by_max"] += 1
                assert (top >= int(f32_keys([got[q]])[0])).sum() >= r
                best = np.sort(top)[::-1]
                loose = best[r + r // 4] if (top != 0).sum() > r + r // 4 else 0
                key = int(f32_keys([got[q]])[0])
                assert key > loose or key == max(int(best[r - 1]), KEY_NEG_INF)  # stopped early, or exact
            else:  # the radix: fewer reach the next 24-bit prefix
                kinds["finite"] += 1
                nxt = int(f32_keys([got[q]])[0]) + 0x100
                if nxt <= 0xFF800000:
                    assert (f32_keys(sample[real]) >= nxt).sum() < r
    if not by_max:
        assert kinds.pop("by_max") == 0
    assert min(kinds.values()) >= 2, kinds  # each branch of the kernel met
    assert seed_rank(2 * M, k_edge, M, margin_x2, min_rank)[2] is False
    assert seed_rank(2 * M, k_edge + 1, M, margin_x2, min_rank)[2] is True

