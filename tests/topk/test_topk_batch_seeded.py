"""The batched seeded top-K (topk/select.py: batch_seed_kernel, the batched filter_kernel,
final_sort_kernel; topk.py: launch_filter, launch_final, launch_topk_batch_seeded, batch_outcomes,
topk_batch), kernel by kernel against independent numpy models, then end to end against the
oracle, forced seed_high / overflow outcomes and both rerun paths of topk_batch."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andromeda_nb.device import launch
from andromeda_nb import reference
import andromeda_nb.topk.api as T
from andromeda_nb.topk import select
from andromeda_nb.topk.select import BATCH_SAMPLE_CHUNK, batch_seed_kernel, filter_kernel, final_sort_kernel
from andromeda_nb.targeting import bits_from_mask

from ..helpers import poison_device_arrays, poison_shared_memory


@pytest.fixture(autouse=True)
def poisoned_device_memory(monkeypatch):
    """Device arrays start as 0xA5 bytes (simulator), so an output element left unwritten shows."""
    if launch.backend.is_simulator():
        poison_device_arrays(monkeypatch)

KEY_NEG_INF = 0x007FFFFF


# --------------------------------------------------------------------------------------------------
# independent numpy models


def f32_keys(a) -> np.ndarray:
    """float_key of float32 values, as int64: the order-preserving uint32 image of a float."""
    u = np.ascontiguousarray(a, np.float32).reshape(-1).view(np.uint32).astype(np.int64)
    return np.where(u & 0x80000000, u ^ 0xFFFFFFFF, u | 0x80000000)


def key_to_f32(key: int) -> np.float32:
    key = int(key)
    u = key & 0x7FFFFFFF if key & 0x80000000 else key ^ 0xFFFFFFFF
    return np.array([u], np.uint32).view(np.float32)[0]


def bits(x) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


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


def seed_model(s: np.ndarray, k: int, mask, M: int, margin_x2: int, min_rank: int, by_max: bool,
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


def elig_rows(masks, words: int) -> np.ndarray:
    out = np.zeros((len(masks), words), np.uint64)
    for q, m in enumerate(masks):
        b = bits_from_mask(m)
        out[q, : b.size] = b
    return out


def sim_shape():
    blk, per = T.batch_seed_shape()
    if launch.backend.is_simulator():
        assert blk == launch.default_block() == 32
    return blk, per, blk * per


def make_scores(rng, n: int, kind: str) -> np.ndarray:
    if kind == "normal":
        s = rng.standard_normal(n).astype(np.float32)
        u = rng.random(n)
        s[u < 0.08] = np.nan
        s[(u >= 0.08) & (u < 0.12)] = -np.inf
        s[(u >= 0.12) & (u < 0.13)] = np.inf
        s[(u >= 0.13) & (u < 0.15)] = -0.0
        s[(u >= 0.15) & (u < 0.17)] = 0.0
        return s
    if kind == "ties":
        return (rng.integers(0, 3, n) * 0.25).astype(np.float32)
    if kind == "narrow":  # the 24-bit prefix matters: many keys share the top bytes
        return (0.5 + 1e-6 * rng.random(n)).astype(np.float32)
    if kind == "negative":
        return (-1e3 - rng.random(n)).astype(np.float32)
    if kind == "posinf":  # the r-th best sample may well be +inf
        return np.where(rng.random(n) < 0.5, np.inf, rng.standard_normal(n)).astype(np.float32)
    if kind == "all_nan":
        return np.full(n, np.nan, np.float32)
    if kind == "all_neginf":
        return np.full(n, -np.inf, np.float32)
    raise ValueError(kind)


# --------------------------------------------------------------------------------------------------
# 1. batch_seed_kernel


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
        want = seed_model(s, k, mask, M, margin_x2, min_rank, by_max)
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


# --------------------------------------------------------------------------------------------------
# 2. the batched filter


FILTER_SIZES = [0, 1, 2, 3, 517, 1, 2, 3, 1200, 0, 64, 65, 130, 777, 3, 2]


def _filter_case(rng, sizes, use_elig):
    n = sum(sizes)
    scores = rng.integers(-20, 21, n).astype(np.float32)
    u = rng.random(n)
    scores[u < 0.06] = np.nan
    scores[(u >= 0.06) & (u < 0.08)] = np.inf
    scores[(u >= 0.08) & (u < 0.10)] = -np.inf
    scores[(u >= 0.10) & (u < 0.13)] = -0.0
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    masks = [rng.random(sz) < 0.7 for sz in sizes] if use_elig else None
    return scores, offsets, masks


def _seeds_for(rng, scores, offsets, choices):
    """A seed a request: -inf, +inf, 0.0 (-0 reaches it), a score of the slice (ties at the seed),
    or the q-quantile of its finite scores."""
    out = []
    for q, c in enumerate(choices):
        s = scores[offsets[q]:offsets[q + 1]]
        fin = s[np.isfinite(s)]
        if c == "value" and fin.size:
            out.append(fin[rng.integers(fin.size)])
        elif isinstance(c, float) and c < 1.0 and fin.size:
            out.append(np.quantile(fin, c, method="lower"))
        elif c == "+inf":
            out.append(np.inf)
        elif c == "zero":
            out.append(0.0)
        else:
            out.append(-np.inf)
    return np.array(out, np.float32)


def _run_batched_filter(scores, offsets, ks, seeds, cap, masks=None, offset=0, rounds=None, block=None):
    """launch_filter on a fresh FilterWorkspace.batched with poisoned buffers and zeroed counters;
    the scores placed ``offset`` floats into a device array. Returns host (fill, counts, buf_i,
    buf_s, fws)."""
    total = scores.size
    base = launch.to_device(np.concatenate([np.full(offset, 77.0, np.float32), scores, np.float32([77.0])]))
    d_scores = base[offset:offset + total]
    if total:
        assert launch.address(d_scores) % 8 == 4 * (offset % 2)
    fws = T.FilterWorkspace.batched(offsets, ks, cap=cap)
    B = len(ks)
    fws.buf_s.copy_to_device(np.full((B, fws.cap), 123.0, np.float32))
    fws.buf_i.copy_to_device(np.full((B, fws.cap), -5, np.int32))
    fws.fill.copy_to_device(np.zeros(B, np.int64))
    fws.counts.copy_to_device(np.zeros((B, 2), np.int64))
    elig = None
    if masks is not None:
        words = max(1, -(-int(np.diff(offsets).max()) // 64)) + 1  # one spare word of zeros
        elig = launch.to_device(elig_rows(masks, words))
    T.launch_filter(d_scores, fws, launch.to_device(np.asarray(seeds, np.float32)), elig, block, rounds)
    return (fws.fill.copy_to_host(), fws.counts.copy_to_host(), fws.buf_i.copy_to_host(),
            fws.buf_s.copy_to_host(), fws)


def _check_filter(scores, offsets, seeds, masks, fill, counts, buf_i, buf_s, cap):
    over = 0
    for q in range(len(offsets) - 1):
        s = scores[offsets[q]:offsets[q + 1]]
        valid = ~np.isnan(s) & (True if masks is None else masks[q])
        want = np.flatnonzero(valid & (s >= seeds[q]))
        assert counts[q].tolist() == [int(valid.sum()), want.size], q
        assert fill[q] == want.size, q
        m = min(want.size, cap)
        got = buf_i[q, :m]
        assert np.unique(got).size == m, q  # each slot at most once
        if want.size <= cap:
            np.testing.assert_array_equal(np.sort(got), want)  # each kept slot exactly once
        else:
            over += 1
            assert np.isin(got, want).all(), q  # only cap of them written, all kept ones
        np.testing.assert_array_equal(bits(buf_s[q, :m]), bits(s[got]))  # -0 stays -0
        assert (buf_i[q, m:] == -5).all() and (buf_s[q, m:] == 123.0).all(), q  # untouched past fill
    return over


@pytest.mark.parametrize("rounds", [1, None])
@pytest.mark.parametrize("use_elig", [False, True])
@pytest.mark.parametrize("offset", [0, 1])
def test_batched_filter_keeps_each_score_once(rng, offset, use_elig, rounds):
    """Request boundaries at odd and even offsets (slices starting and ending mid-word), slices of
    0..3 scores, a device slice 4 bytes past 8-byte alignment; one block a request (default rounds)
    or several (rounds=1, the grid-stride split); seeds -inf / +inf / 0 / a score of the slice /
    quantiles; two requests keep more than the cap (fill counts all, cap written)."""
    scores, offsets, masks = _filter_case(rng, FILTER_SIZES, use_elig)
    assert len(set(offsets % 2)) == 2  # odd and even boundaries
    choices = ["-inf", "value", "zero", "+inf", "-inf", "-inf", "value", 0.3, "-inf", "value", 0.5, "value",
               "zero", 0.75, "+inf", "value"]
    seeds = _seeds_for(rng, scores, offsets, choices)
    cap = 300
    ks = np.full(len(FILTER_SIZES), 5, np.int64)
    fill, counts, buf_i, buf_s, fws = _run_batched_filter(scores, offsets, ks, seeds, cap, masks, offset, rounds)
    assert fws.cap == cap and fws.batch == len(FILTER_SIZES)
    over = _check_filter(scores, offsets, seeds, masks, fill, counts, buf_i, buf_s, cap)
    assert over >= 1  # the 1200-score request at -inf at least


@pytest.fixture
def small_filter_stage(monkeypatch):
    """FILTER_STAGE = 5 for kernels compiled inside the test (filter_kernel and its device functions
    are lru_cached: cleared before and after, so no kernel of the default stage is reused, nor this
    one leaked)."""
    filter_kernel.cache_clear()
    select._filter_funcs.cache_clear()
    monkeypatch.setattr(select, "FILTER_STAGE", 5)
    try:
        yield 5
    finally:
        filter_kernel.cache_clear()
        select._filter_funcs.cache_clear()


@pytest.mark.parametrize("use_elig", [False, True])
@pytest.mark.parametrize("offset", [0, 1])
def test_batched_filter_past_the_shared_stage(rng, small_filter_stage, offset, use_elig):
    """Blocks keeping more than FILTER_STAGE scores: the first ones staged in shared memory (one
    global atomic a block), the rest straight to the buffer by global atomics; nothing lost or
    duplicated, with and without the cap overflowing."""
    sizes = [3, 400, 0, 1, 257, 130, 2, 96]
    scores, offsets, masks = _filter_case(rng, sizes, use_elig)
    seeds = _seeds_for(rng, scores, offsets, ["-inf", "-inf", "-inf", "-inf", 0.2, "value", "-inf", 0.5])
    for cap, rounds in ((450, 1), (450, None), (150, None)):
        ks = np.full(len(sizes), 3, np.int64)
        fill, counts, buf_i, buf_s, _ = _run_batched_filter(scores, offsets, ks, seeds, cap, masks, offset, rounds)
        over = _check_filter(scores, offsets, seeds, masks, fill, counts, buf_i, buf_s, cap)
        assert fill.max() > 4 * small_filter_stage  # the fallback ran
        assert over == int((fill > cap).sum()) and (over == 0 if cap == 450 else over >= 1)


# --------------------------------------------------------------------------------------------------
# 3. final_sort_kernel


def _expected_final(scores, offsets, q, slots, k, kmax, ids):
    """The contract's top-k of request q's candidate slots: (scores, slots, ids) rows of kmax."""
    start = offsets[q]
    cand_s = scores[start + slots]
    cand_id = slots.astype(np.int64) if ids is None else ids[start + slots]
    want = reference.topk(cand_s, k, ids=cand_id)
    got_n = min(k, slots.size)
    exp_s = np.full(kmax, -np.inf, np.float32)
    exp_slot = np.full(kmax, -1, np.int32)
    exp_id = np.full(kmax, -1, np.int64)
    exp_s[:k] = want.scores
    exp_id[:k] = want.ids
    for j in range(got_n):
        exp_slot[j] = slots[np.flatnonzero(cand_id == want.ids[j])[0]]
    return exp_s, exp_slot, exp_id


def _sort_case(rng):
    """Candidate buffers of crafted requests: (sizes, ks, buffer slot lists, fills)."""
    sizes = [5, 40, 60, 30, 50, 70, 2, 45]
    ks = np.array([3, 1, 16, 20, 24, 12, 4, 30], np.int64)
    total = sum(sizes)
    pool = np.array([0.0, -0.0, 1.5, -1.5, np.inf, -np.inf, 2.0, 2.0, 3.25], np.float32)
    scores = pool[rng.integers(0, pool.size, total)]  # a small pool: many ties
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    cap = 24
    # m a request: 0, 1, 16 (a power of two), 13 (not, k > m), 24 (the cap, not a power of two),
    # 24 of a fill of 40 (more than the buffer holds: its first 24 entries), 2, 17
    ms = [0, 1, 16, 13, 24, 24, 2, 17]
    fills = np.array([0, 1, 16, 13, 24, 40, 2, 17], np.int64)
    slot_lists = [rng.choice(sizes[q], ms[q], replace=False).astype(np.int32) for q in range(len(sizes))]
    # the 16-candidate request: signed zeros and infinities among tied scores
    s2 = scores[offsets[2]:offsets[3]]
    sl = slot_lists[2]
    s2[sl[:4]] = -0.0
    s2[sl[4:8]] = 0.0
    s2[sl[8]] = np.inf
    s2[sl[9]] = -np.inf
    s2[sl[10:13]] = 2.0
    s2[sl[13:16]] = 5.0
    return scores, offsets, ks, slot_lists, fills, cap


@pytest.mark.parametrize("warp_sync", [False, True])
@pytest.mark.parametrize("with_ids", [False, True])
def test_final_sort_kernel_on_crafted_buffers(rng, with_ids, warp_sync, monkeypatch):
    """launch_final(..., d_scores=...) on a batched workspace: each request's candidates sorted by
    score descending (-0 tied with +0, ties to the lower id or slot), the original -0 bits read
    back, +-inf in place, m = 0, 1, k > m, m a power of two and not, fill past the buffer; every
    output entry written (poisoned first), pads (-inf, -1, -1)."""
    monkeypatch.setattr(T, "SORT_WARP_SYNC", warp_sync)
    scores, offsets, ks, slot_lists, fills, cap = _sort_case(rng)
    B, kmax = len(ks), int(ks.max())
    ids = rng.permutation(10 * scores.size)[: scores.size].astype(np.int64) if with_ids else None
    fws = T.FilterWorkspace.batched(offsets, ks, cap=cap)
    assert fws.cap == cap <= select.SORT_CAP and fws.batch > 1  # launch_final takes the sort final
    buf_i = np.full((B, cap), 999, np.int32)  # past m: junk the kernel must not read
    buf_s = np.full((B, cap), np.nan, np.float32)
    for q, sl in enumerate(slot_lists):
        buf_i[q, : sl.size] = sl
        buf_s[q, : sl.size] = scores[offsets[q] + sl]
    fws.buf_i.copy_to_device(buf_i)
    fws.buf_s.copy_to_device(buf_s)
    fws.fill.copy_to_device(fills)
    fws.out_s.copy_to_device(np.full((B, kmax), 555.0, np.float32))
    fws.out_slot.copy_to_device(np.full((B, kmax), -7, np.int32))
    fws.out_id.copy_to_device(np.full((B, kmax), -9, np.int64))
    d_ids = None if ids is None else launch.to_device(ids)
    # a rank-final kernel would need ids / no scores: the sort final is the one given d_scores
    T.launch_final(kmax, fws, d_ids, d_scores=launch.to_device(scores))
    out_s, out_slot, out_id = fws.out_s.copy_to_host(), fws.out_slot.copy_to_host(), fws.out_id.copy_to_host()
    for q in range(B):
        exp_s, exp_slot, exp_id = _expected_final(scores, offsets, q, slot_lists[q], int(ks[q]), kmax, ids)
        np.testing.assert_array_equal(out_id[q], exp_id, err_msg=f"request {q}")
        np.testing.assert_array_equal(out_slot[q], exp_slot, err_msg=f"request {q}")
        np.testing.assert_array_equal(bits(out_s[q]), bits(exp_s), err_msg=f"request {q}")  # -0 bits too
    # the signed zeros of request 2 come back with their own signs
    zs = out_s[2][out_s[2] == 0]
    assert zs.size == 8 and np.signbit(zs).sum() == 4
    np.testing.assert_array_equal(np.signbit(zs), np.signbit(scores[offsets[2] + out_slot[2][out_s[2] == 0]]))


@pytest.mark.parametrize("with_ids", [False, True])
def test_final_sort_kernel_skips_requests_past_its_cap(rng, with_ids):
    """A sort-final kernel of cap 8 over a buffer 16 wide: requests of more than 8 candidates are
    left alone (outputs untouched: the caller reruns them), the others answered exactly."""
    blk = launch.default_block()
    sizes = [20, 20, 20, 20, 20]
    fills = np.array([5, 8, 9, 16, 40], np.int64)
    ks = np.array([3, 8, 2, 5, 6], np.int64)
    B, kmax, width = len(sizes), int(ks.max()), 16
    scores = rng.integers(-2, 3, sum(sizes)).astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    ids = rng.permutation(5 * scores.size)[: scores.size].astype(np.int64) if with_ids else None
    slot_lists = [rng.choice(20, min(f, width), replace=False).astype(np.int32) for f in fills]
    buf_i = np.zeros((B, width), np.int32)
    buf_s = np.zeros((B, width), np.float32)
    for q, sl in enumerate(slot_lists):
        buf_i[q, : sl.size] = sl
        buf_s[q, : sl.size] = scores[offsets[q] + sl]
    out_s = launch.to_device(np.full((B, kmax), 555.0, np.float32))
    out_slot = launch.to_device(np.full((B, kmax), -7, np.int32))
    out_id = launch.to_device(np.full((B, kmax), -9, np.int64))
    final_sort_kernel(blk, with_ids, 8)[(1, B), blk](
        launch.to_device(scores), launch.to_device(buf_s), launch.to_device(buf_i), launch.to_device(fills),
        launch.to_device(offsets), launch.to_device(ids) if with_ids else launch.dummy(np.int64),
        launch.to_device(ks), out_s, out_slot, out_id)
    got_s, got_slot, got_id = out_s.copy_to_host(), out_slot.copy_to_host(), out_id.copy_to_host()
    for q in range(B):
        if min(fills[q], width) > 8:
            assert (got_s[q] == 555.0).all() and (got_slot[q] == -7).all() and (got_id[q] == -9).all()
            continue
        exp_s, exp_slot, exp_id = _expected_final(scores, offsets, q, slot_lists[q], int(ks[q]), kmax, ids)
        np.testing.assert_array_equal(got_id[q], exp_id)
        np.testing.assert_array_equal(got_slot[q], exp_slot)
        np.testing.assert_array_equal(bits(got_s[q]), bits(exp_s))


# --------------------------------------------------------------------------------------------------
# 4. launch_topk_batch_seeded + batch_outcomes


def _batch_inputs(rng, sizes, kinds, use_elig, with_ids):
    parts = [make_scores(rng, n, kind) if isinstance(kind, str) else kind(n) for n, kind in zip(sizes, kinds)]
    scores = np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    masks = [rng.random(n) < 0.7 for n in sizes] if use_elig else None
    ids = rng.permutation(3 * scores.size + 3)[: scores.size].astype(np.int64) if with_ids else None
    return scores, offsets, masks, ids


def _run_seeded(scores, offsets, ks, masks, ids, cap=None, rounds=None):
    fws = T.FilterWorkspace.batched(offsets, ks, cap=cap)
    B = len(ks)
    fws.out_s.copy_to_device(np.full((B, fws.kmax), 555.0, np.float32))
    fws.out_id.copy_to_device(np.full((B, fws.kmax), -9, np.int64))
    elig = None
    if masks is not None:
        elig = launch.to_device(elig_rows(masks, max(1, -(-int(np.diff(offsets).max()) // 64))))
    res = T.launch_topk_batch_seeded(launch.to_device(scores), fws, elig,
                                     None if ids is None else launch.to_device(ids), rounds=rounds)
    assert res is fws
    return fws


def _check_seeded(fws, scores, offsets, ks, masks, ids):
    """Seeds, counts and outcomes against the models; every exact request against the oracle.
    Returns the outcomes."""
    blk, per, M = sim_shape()
    seeds, counts = fws.seeds.copy_to_host(), fws.counts.copy_to_host()
    outcomes = T.batch_outcomes(fws)
    np.testing.assert_array_equal(outcomes, T.batch_outcomes(fws, counts))
    out_s, out_id, out_slot = fws.out_s.copy_to_host(), fws.out_id.copy_to_host(), fws.out_slot.copy_to_host()
    for q in range(len(ks)):
        a, b, k = offsets[q], offsets[q + 1], int(ks[q])
        s, mask = scores[a:b], None if masks is None else masks[q]
        want_seed = seed_model(s, k, mask, M, int(2 * T.SEED_MARGIN), T.SEED_MIN_RANK, len(ks) == 1)
        assert bits(seeds[q]) == bits(want_seed), (q, seeds[q], want_seed)
        valid = ~np.isnan(s) & (True if mask is None else mask)
        kept = int((valid & (s >= seeds[q])).sum())
        assert counts[q].tolist() == [int(valid.sum()), kept], q
        want_outcome = ("overflow" if kept > fws.cap else "seed_high" if kept < min(k, int(valid.sum()))
                        else "exact")
        assert outcomes[q] == want_outcome, (q, outcomes[q], want_outcome)
        if b - a <= M:  # a whole request's seed lower-bounds its k-th best
            assert outcomes[q] == "exact" or kept > fws.cap, q
        if outcomes[q] != "exact":
            continue
        want = reference.topk(s, k, ids=None if ids is None else ids[a:b], eligible=mask)
        np.testing.assert_array_equal(out_id[q, :k], want.ids, err_msg=f"request {q}")
        np.testing.assert_array_equal(bits(out_s[q, :k]), bits(want.scores), err_msg=f"request {q}")
        assert (out_id[q, k:] == -1).all() and np.isneginf(out_s[q, k:]).all()
        real = out_id[q, :k] >= 0
        local = out_slot[q, :k][real]
        assert (out_slot[q, :k][~real] == -1).all()
        np.testing.assert_array_equal(local if ids is None else ids[a + local], out_id[q, :k][real])
    return outcomes


@pytest.mark.parametrize("use_elig,with_ids,rounds", [(False, False, None), (True, True, 1), (True, False, None),
                                                       (False, True, 1)])
def test_seeded_batch_end_to_end(rng, use_elig, with_ids, rounds):
    """Random requests, whole and sampled, with NaN / +-inf / -0 / ties, ids and eligible bitsets:
    seeds bit for bit the model's, counts exact, outcomes as the counts say, the exact answers the
    oracle's (whole requests always exact)."""
    blk, per, M = sim_shape()
    sizes = [0, 1, 2, 37, 300, M, M + 1, 2 * M + 501, 6 * M + 5]
    kinds = ["normal", "normal", "ties", "normal", "ties", "normal", "narrow", "normal", "ties"]
    ks = rng.integers(1, 60, len(sizes)).astype(np.int64)
    ks[1] = 3  # k > n
    scores, offsets, masks, ids = _batch_inputs(rng, sizes, kinds, use_elig, with_ids)
    fws = _run_seeded(scores, offsets, ks, masks, ids, rounds=rounds)
    outcomes = _check_seeded(fws, scores, offsets, ks, masks, ids)
    assert (outcomes[[0, 1, 2, 3, 4, 5]] == "exact").all()


def _forced_requests(rng, M):
    """(sizes, ks, makers): a small whole request (exact); top scores exactly on the sampled
    positions (rank 32 < k = 50: seed_high); all equal (every score kept: overflow); sorted
    ascending, 8 M scores (the 8th best sample leaves 120 kept: exact at the default cap,
    overflow at cap 64); a sampled request of finite normal scores."""
    n_big = 4 * M

    def top_in_sample(n):
        s = rng.random(n).astype(np.float32)
        pos = seed_positions(n, M, BATCH_SAMPLE_CHUNK)
        s[pos] = 100.0 + rng.permutation(pos.size).astype(np.float32)  # distinct 24-bit prefixes
        return s

    sizes = [500, n_big, n_big, 2 * n_big, 3 * M + 7]
    ks = np.array([5, 50, 10, 10, 6], np.int64)
    makers = ["normal", top_in_sample, lambda n: np.ones(n, np.float32),
              lambda n: np.arange(n, dtype=np.float32),
              # finite normal scores: with "normal"'s 1 % of +inf the seed is +inf and every +inf is
              # kept, ~n / 100: over the cap of 64 at the GPU's sample size (M = 4,096, n ~ 12,300)
              lambda n: rng.standard_normal(n).astype(np.float32)]
    return sizes, ks, makers


@pytest.mark.parametrize("with_ids", [False, True])
def test_seeded_batch_forced_outcomes(rng, with_ids):
    """batch_outcomes flags exactly the requests that need a rerun: a seed above the k-th score
    (top scores on the sampled positions: ~r < k scores reach it) is seed_high; all-equal scores
    (every one kept, more than the cap) and a sorted request under a tiny cap overflow; the
    others are exact and the oracle's."""
    blk, per, M = sim_shape()
    sizes, ks, makers = _forced_requests(rng, M)
    scores, offsets, masks, ids = _batch_inputs(rng, sizes, makers, False, with_ids)
    fws = _run_seeded(scores, offsets, ks, masks, ids)
    assert fws.cap < sizes[2]  # all-equal keeps more than the cap
    got = _check_seeded(fws, scores, offsets, ks, masks, ids)
    assert got.tolist() == ["exact", "seed_high", "overflow", "exact", "exact"], got
    fws = _run_seeded(scores, offsets, ks, masks, ids, cap=64)
    got = _check_seeded(fws, scores, offsets, ks, masks, ids)
    # request 4 (3,079 normal scores, k = 6, seed rank 8) keeps ~24 on average: more than 64, a
    # correct overflow, on ~3e-5 of draws; _check_seeded holds its outcome to the counts' either way
    assert got[:4].tolist() == ["exact", "seed_high", "overflow", "overflow"], got
    kept_sorted = fws.counts.copy_to_host()[3, 1]
    assert ks[3] <= kept_sorted and kept_sorted > 64


# --------------------------------------------------------------------------------------------------
# 5. topk_batch reruns


def _check_topk_batch(got, scores, offsets, ks, mask, ids):
    for r, k in enumerate(np.asarray(ks).tolist()):
        a, b = offsets[r], offsets[r + 1]
        want = reference.topk(scores[a:b], k, ids=None if ids is None else ids[a:b],
                           eligible=None if mask is None else mask[a:b])
        np.testing.assert_array_equal(got[r].ids, want.ids, err_msg=f"request {r}")
        np.testing.assert_array_equal(bits(got[r].scores), bits(want.scores), err_msg=f"request {r}")
        assert got[r].count == want.count, r


def _spy(monkeypatch, name):
    calls = []
    orig = getattr(T, name)

    def spy(*a, **kw):
        calls.append(a[0].shape[0] if hasattr(a[0], "shape") else a[0])
        return orig(*a, **kw)

    monkeypatch.setattr(T, name, spy)
    return calls


def _rerun_batch(rng, M):
    sizes, ks, makers = _forced_requests(rng, M)
    # more requests answered at once; the two non-exact ones (seed_high, overflow) rerun
    sizes = sizes + [0, 64, 2 * M + 3]
    ks = np.concatenate([ks, [4, 70, 9]]).astype(np.int64)
    makers = makers + ["normal", "ties", "normal"]
    return sizes, ks, makers


def _spy_outcomes(monkeypatch):
    seen = []
    orig = T.batch_outcomes

    def spy(*a, **kw):
        out = orig(*a, **kw)
        seen.append(out)
        return out

    monkeypatch.setattr(T, "batch_outcomes", spy)
    return seen


def _rerun_inputs(rng, M, use_elig, with_ids):
    sizes, ks, makers = _rerun_batch(rng, M)
    scores, offsets, _, ids = _batch_inputs(rng, sizes, makers, False, with_ids)
    mask = rng.random(scores.size) < 0.8 if use_elig else None
    if use_elig:  # keep the seed_high request forced: its sampled positions eligible
        mask[offsets[1] + seed_positions(sizes[1], M, BATCH_SAMPLE_CHUNK)] = True
    return sizes, ks, scores, offsets, mask, ids


def _run_rerun_case(rng, monkeypatch, use_elig, with_ids):
    """topk_batch on _rerun_inputs with its outcomes, topk_scores calls and whole-batch launches
    spied on; the answer checked against the oracle. Returns (sizes, outcomes, one, whole)."""
    blk, per, M = sim_shape()
    sizes, ks, scores, offsets, mask, ids = _rerun_inputs(rng, M, use_elig, with_ids)
    outcomes = _spy_outcomes(monkeypatch)
    one = _spy(monkeypatch, "topk_scores")
    whole = _spy(monkeypatch, "launch_topk_batch")
    got = T.topk_batch(scores, offsets, ks, eligible=mask, ids=ids)
    _check_topk_batch(got, scores, offsets, ks, mask, ids)
    return sizes, outcomes, one, whole


@pytest.mark.parametrize("use_elig,with_ids,limit", [(False, False, None), (True, True, None), (False, True, 2)])
def test_topk_batch_reruns_few_one_by_one(rng, monkeypatch, use_elig, with_ids, limit):
    """Up to RERUN_ONE_BY_ONE non-exact requests (a seed_high and an overflow one, forced; the
    limit as shipped, and patched to 2: exactly as many as rerun): each rerun by topk_scores on
    its own slice, no whole-batch rerun; the whole answer the oracle's."""
    if limit is not None:
        monkeypatch.setattr(T, "RERUN_ONE_BY_ONE", limit)
    sizes, outcomes, one, whole = _run_rerun_case(rng, monkeypatch, use_elig, with_ids)
    assert len(outcomes) == 1 and outcomes[0][1] == "seed_high" and outcomes[0][2] == "overflow"
    redo = np.flatnonzero(outcomes[0] != "exact")
    assert 2 <= redo.size <= T.RERUN_ONE_BY_ONE
    assert one == [sizes[r] for r in redo]  # topk_scores on each rerun slice, in order
    assert len(whole) == len(one)  # the one inside each topk_scores call, none for the batch


def test_topk_batch_reruns_one_by_one_from_a_device_bitset(rng, monkeypatch):
    """The eligible set as a device uint64 bitset a request: each rerun request takes its own row
    (its first ceil(n / 64) words) to topk_scores; the answer the oracle's."""
    from .test_topk_kernel import batch_bitset

    blk, per, M = sim_shape()
    sizes, ks, scores, offsets, mask, ids = _rerun_inputs(rng, M, True, True)
    one = _spy(monkeypatch, "topk_scores")
    got = T.topk_batch(scores, offsets, ks, eligible=launch.to_device(batch_bitset(mask, offsets)), ids=ids)
    _check_topk_batch(got, scores, offsets, ks, mask, ids)
    assert len(one) >= 2  # the forced seed_high and overflow requests


@pytest.mark.parametrize("use_elig,with_ids", [(False, True), (True, False)])
def test_topk_batch_reruns_many_as_one_batch(rng, monkeypatch, use_elig, with_ids):
    """More than RERUN_ONE_BY_ONE non-exact requests (RERUN_ONE_BY_ONE patched to 1, two forced
    ones): one unseeded block top-K over the whole batch answers them, no one-by-one rerun; the
    whole answer the oracle's."""
    monkeypatch.setattr(T, "RERUN_ONE_BY_ONE", 1)
    sizes, outcomes, one, whole = _run_rerun_case(rng, monkeypatch, use_elig, with_ids)
    assert len(outcomes) == 1 and (outcomes[0] != "exact").sum() >= 2 > T.RERUN_ONE_BY_ONE
    assert one == [] and len(whole) == 1


def test_topk_batch_under_poisoned_shared_memory(rng, monkeypatch):
    """Shared arrays start as 0xA5 bytes (simulator): the seed's histograms, the filter's totals
    and stage, the sort's keys must all be written before read; a rerun request included."""
    if not launch.backend.is_simulator():
        pytest.skip("poisons the simulator's shared arrays")
    poison_shared_memory(monkeypatch)
    blk, per, M = sim_shape()
    sizes = [0, 1, 33, 250, M, 4 * M, 2 * M + 9]
    ks = np.array([2, 1, 40, 17, 30, 10, 12], np.int64)
    makers = ["normal", "normal", "ties", "normal", "narrow", lambda n: np.ones(n, np.float32), "normal"]
    scores, offsets, _, ids = _batch_inputs(rng, sizes, makers, False, True)
    mask = rng.random(scores.size) < 0.75
    for kw in ({}, {"eligible": mask, "ids": ids}):
        got = T.topk_batch(scores, offsets, ks, **kw)
        _check_topk_batch(got, scores, offsets, ks, kw.get("eligible"), kw.get("ids"))


# --------------------------------------------------------------------------------------------------
# 6. validation found by an adversarial review

@pytest.mark.parametrize("dtype", [np.uint64, np.uint32, np.uint16, np.uint8, np.int8])
def test_topk_batch_refuses_decreasing_offsets_of_any_integer_type(dtype):
    """A difference of unsigned (or overflowing narrow) offsets wraps around: the check compares
    neighbours instead, so overlapping or negative-length requests never reach a kernel."""
    s = np.arange(10, dtype=np.float32)
    for offsets in ([0, 6, 5, 10], [0, 10, 3, 10]):
        with pytest.raises(ValueError, match="never decrease"):
            T.topk_batch(s, np.array(offsets, dtype), [2, 2, 2])
    with pytest.raises(ValueError, match="never decrease"):
        T.topk_batch(s, np.array([0, 6, 5, 10], dtype), [2, 2, 2], eligible=np.ones(10, bool))
    got = T.topk_batch(s, np.array([0, 4, 10], dtype), [2, 3])  # a valid one of the same dtype
    np.testing.assert_array_equal(got[0].ids, [3, 2])
    np.testing.assert_array_equal(got[1].ids, [5, 4, 3])


@pytest.mark.parametrize("block", [np.uint32(32), np.int8(32), np.int16(33)])
def test_numpy_integer_blocks_are_plain_ints(rng, block):
    """A numpy integer block is taken as its value (an int8 or uint32 would wrap in the launch
    arithmetic: a hang or an overflow after the first launch)."""
    scores = rng.standard_normal(700).astype(np.float32)
    got = T.topk_batch(scores, [0, 300, 700], [5, 7], block=block)
    for r, (lo, hi, k) in enumerate(((0, 300, 5), (300, 700, 7))):
        np.testing.assert_array_equal(got[r].ids, reference.topk(scores[lo:hi], k).ids)
    one = T.topk_scores(scores, 9, block=block)
    np.testing.assert_array_equal(one.ids, reference.topk(scores, 9).ids)


def test_block_too_large_for_the_block_topk_is_refused_up_front():
    """A block whose block top-K buffer (next_pow2(k + 8 * block) entries of 8 bytes) passes 48 KiB
    is refused before any launch, naming the largest block that fits; k above the block top-K's
    limit does not run it, so any block is fine there."""
    s = np.ones(20000, np.float32)
    with pytest.raises(ValueError, match=r"block <= 499"):
        T.topk_batch(s, [0, 10000, 20000], [100, 10], block=512)
    with pytest.raises(ValueError, match=r"block <= 256"):
        T.topk_scores(s, 2048, block=257)
    T.check_block_topk_block(499, [100])  # next_pow2(100 + 8 * 499) = 4096 fits
    with pytest.raises(ValueError, match="block <= 499"):
        T.check_block_topk_block(500, [100])
    T.check_block_topk_block(1024, [T.BLOCK_TOPK_MAX_K + 1])


def test_topk_scores_answers_a_small_request_as_a_batch_of_one(rng, monkeypatch):
    """topk_scores sends a request of SEED_MIN_N..SMALL_MAX_N scores through the batched seeded path
    (a batch of one, its seed by the threads' best keys), and reruns it on the single-request path
    when the batch of one says it is not exact (here: the sampled positions hold the best scores,
    so the seed lies above the k-th score)."""
    blk, per, M = sim_shape()
    monkeypatch.setattr(T, "SEED_MIN_N", 2 * M)
    calls = {"batch": [], "single": 0}
    batch_seeded, single = T.launch_topk_batch_seeded, T.launch_topk

    def spy_batch(d_scores, fws, *args, **kwargs):
        calls["batch"].append(fws.batch)
        return batch_seeded(d_scores, fws, *args, **kwargs)

    def spy_single(*args, **kwargs):
        calls["single"] += 1
        return single(*args, **kwargs)

    monkeypatch.setattr(T, "launch_topk_batch_seeded", spy_batch)
    monkeypatch.setattr(T, "launch_topk", spy_single)
    n = 9 * M + 5
    s = make_scores(rng, n, "normal")
    mask = rng.random(n) < 0.7
    for k, eligible in ((30, None), (7, mask)):
        got = T.topk_scores(s, k, eligible=eligible)
        want = reference.topk(s, k, eligible=eligible)
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.scores.view(np.uint32), want.scores.view(np.uint32))
        assert got.count == want.count
    assert calls == {"batch": [1, 1], "single": 0}
    # the best scores at the sampled positions: the rank-th best sample is above the k-th score
    s = rng.random(n).astype(np.float32)
    s[seed_positions(n, M, BATCH_SAMPLE_CHUNK)] += 10.0
    k = 3 * M // 4
    got = T.topk_scores(s, k)
    np.testing.assert_array_equal(got.ids, reference.topk(s, k).ids)
    assert calls["batch"] == [1, 1, 1] and calls["single"] == 1
    monkeypatch.setattr(T, "SMALL_MAX_N", n - 1)  # past it: the single-request path alone
    T.topk_scores(s[:n], 5)
    assert calls["batch"] == [1, 1, 1] and calls["single"] == 2


def test_small_workspaces_are_reused_and_bounded(rng, monkeypatch):
    """topk_scores reuses a batch-of-one workspace for the same (n, k), whatever the previous call
    left in it, and keeps at most SMALL_WORKSPACES of them."""
    blk, per, M = sim_shape()
    monkeypatch.setattr(T, "SEED_MIN_N", 2 * M)
    monkeypatch.setattr(T, "SMALL_WORKSPACES", 2)
    monkeypatch.setattr(T, "_small_cache", __import__("threading").local())
    n = 3 * M + 1
    first = T._small_workspace(n, 9)
    for trial in range(3):
        s = make_scores(np.random.default_rng(trial), n, "normal")
        mask = None if trial != 1 else rng.random(n) < 0.5
        got = T.topk_scores(s, 9, eligible=mask)
        np.testing.assert_array_equal(got.ids, reference.topk(s, 9, eligible=mask).ids)
        assert got.count == reference.topk(s, 9, eligible=mask).count
    assert T._small_workspace(n, 9) is first
    T._small_workspace(n, 10)
    T._small_workspace(n, 11)  # evicts the least recently used: (n, 9)
    assert set(T._small_cache.ws) == {(n, 10), (n, 11)}
    assert T._small_workspace(n, 9) is not first


def test_sort_steps_between_warp_barriers_stay_inside_each_warp():
    """The index map of _sort_funcs.sort_desc: pair p of a step (thread p % block) touches entries
    i = ((p & ~(stride - 1)) << 1) | (p & (stride - 1)) and i + stride. Where a step of stride <= 32
    is followed by another of stride <= 32 (a warp barrier between them with warp_sync), every entry
    belongs to the same warp in both steps, for every block size and sort size."""

    def owner(P, stride, block):
        p = np.arange(P // 2)
        low = stride - 1
        i = ((p & ~low) << 1) | (p & low)
        own = np.empty(P, np.int64)
        own[i] = (p % block) // 32
        own[i + stride] = (p % block) // 32
        return own

    for block in (32, 128, 1024):
        for P in (2, 8, 64, 128, 512, 4096):
            steps = [(size, size >> j) for size in (1 << e for e in range(1, P.bit_length())) for j in
                     range(1, size.bit_length())]
            warp_local = [(a, b) for a, b in zip(steps, steps[1:]) if a[1] <= 32 and b[1] <= 32]
            assert warp_local or P <= 2
            for (_, s1), (_, s2) in warp_local:
                np.testing.assert_array_equal(owner(P, s1, block), owner(P, s2, block))


@st.composite
def small_request_cases(draw):
    """A request in the batch-of-one route's range (SEED_MIN_N patched to twice the sample):
    scores of one of make_scores's kinds, k from 1 to past n, an optional mask and ids."""
    _, _, M = sim_shape()
    n = draw(st.integers(2 * M, 3 * M + 100))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["normal", "ties", "narrow", "negative", "posinf", "all_nan"]))
    k = draw(st.one_of(st.integers(1, 40), st.sampled_from([n, n + 3, 600])))
    mask = rng.random(n) < draw(st.sampled_from([0.0, 0.05, 0.5])) if draw(st.booleans()) else None
    ids = rng.choice(4 * n, n, replace=False).astype(np.int64) if draw(st.booleans()) else None
    return make_scores(rng, n, kind), k, mask, ids


@settings(max_examples=12)
@given(small_request_cases())
def test_batch_of_one_route_matches_oracle(case):
    """topk_scores through the batched path on a batch of one (or its rerun), against the oracle."""
    scores, k, mask, ids = case
    _, _, M = sim_shape()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(T, "SEED_MIN_N", 2 * M)
        got = T.topk_scores(scores, k, eligible=mask, ids=ids)
    want = reference.topk(scores, k, ids=ids, eligible=mask)
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.scores.view(np.uint32), want.scores.view(np.uint32))
    assert got.count == want.count
