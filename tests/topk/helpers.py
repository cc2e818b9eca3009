"""Shared pieces of the top-K tests: the one oracle check (:func:`check_topk`), score makers with the
contract's edge values, and small-array configurations that reach the seeded paths."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

from andromeda_nb import reference
from andromeda_nb.model import TopK
from andromeda_nb.targeting import bits_from_mask
from andromeda_nb.topk.config import TopKConfig, TopKTuning

#: values every score pool mixes in: NaN, +-inf, both zeros, and a few plain ones
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0]
#: a seed on small arrays: requests of 1,024 scores or more are seeded, from 8 runs of 32 scores
SMALL_SEED = TopKTuning(seed_min_n=1024, sample_chunk=32, max_sample_chunks=8)


def small_seed(path: str = "filter", **tuning) -> TopKConfig:
    """A config on ``path`` whose seed works on arrays of a few thousand scores (:data:`SMALL_SEED`,
    fields overridden by ``tuning``)."""
    return TopKConfig(path=path, tuning=replace(SMALL_SEED, **tuning))


def check_topk(got, scores, k: int, eligible=None, ids=None, msg: str = "") -> None:
    """Assert ``got`` (a :class:`~andromeda_nb.model.TopK`; ``count`` None skips the count) is the
    oracle's top-k (:func:`andromeda_nb.reference.topk`) of ``scores``: the same ids in the same
    order, the same score bits (-0 stays -0; pads -inf) and the same count."""
    want = reference.topk(scores, k, ids=ids, eligible=eligible)
    np.testing.assert_array_equal(got.ids, want.ids, err_msg=f"ids {msg}")
    np.testing.assert_array_equal(np.asarray(got.scores, np.float32).view(np.uint32),
                                  want.scores.astype(np.float32).view(np.uint32), err_msg=f"score bits {msg}")
    if got.count is not None:
        assert got.count == want.count, (got.count, want.count, msg)


def row(res, r: int = 0, k: int | None = None, count=None) -> TopK:
    """Request ``r`` of a finished workspace (``out_id``, ``out_s``; the first ``k`` entries, default
    all) as a TopK for :func:`check_topk`; ``count`` is the count to check (None: not checked)."""
    k = res.out_id.shape[1] if k is None else k
    return TopK(ids=res.out_id.copy_to_host()[r, :k], scores=res.out_s.copy_to_host()[r, :k], count=count)


def bits(x) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def f32_keys(a) -> np.ndarray:
    """float_key of float32 values, as int64: the order-preserving uint32 image of a float."""
    u = np.ascontiguousarray(a, np.float32).reshape(-1).view(np.uint32).astype(np.int64)
    return np.where(u & 0x80000000, u ^ 0xFFFFFFFF, u | 0x80000000)


def key_to_f32(key: int) -> np.float32:
    key = int(key)
    u = key & 0x7FFFFFFF if key & 0x80000000 else key ^ 0xFFFFFFFF
    return np.array([u], np.uint32).view(np.float32)[0]


def pooled_scores(rng, n: int, pool_size: int, picked=()) -> np.ndarray:
    """n scores drawn from a pool of :data:`SPECIALS`, ``picked`` and ``pool_size`` normal values
    (a small pool forces repeated values: ties)."""
    pool = np.concatenate([np.array(list(picked) + SPECIALS, np.float32),
                           rng.standard_normal(pool_size).astype(np.float32)])
    return pool[rng.integers(0, pool.size, n)]


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


def elig_rows(masks, words: int) -> np.ndarray:
    """Bool masks, one a request, as a uint64 bitset ``[len(masks), words]``."""
    out = np.zeros((len(masks), words), np.uint64)
    for q, m in enumerate(masks):
        b = bits_from_mask(m)
        out[q, : b.size] = b
    return out


def batch_bitset(mask: np.ndarray, offsets, extra_words: int = 0) -> np.ndarray:
    """A bool mask over the joined slices as topk_batch's uint64 bitset [B, W], a row a request."""
    lengths = np.diff(offsets)
    words = max(1, -(-int(lengths.max()) // 64)) + extra_words
    return elig_rows([mask[offsets[r]:offsets[r + 1]] for r in range(lengths.size)], words)


def spy(monkeypatch, name: str, *modules, record=None) -> list:
    """Wrap the function ``name`` where ``modules`` look it up, recording ``record(args, kwargs)``
    (default the positional arguments) of each call; returns the list of records."""
    calls = []
    for module in modules:
        real = getattr(module, name)

        def wrapped(*a, _real=real, **kw):
            calls.append(a if record is None else record(a, kw))
            return _real(*a, **kw)

        monkeypatch.setattr(module, name, wrapped)
    return calls


@st.composite
def score_cases(draw, max_n: int = 300):
    """(scores, k, eligible mask or None, ids or None): up to ``max_n`` scores from a pool of the
    edge values (repeats when the pool is small), k from 1 to past n."""
    n = draw(st.integers(0, max_n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    picked = draw(st.lists(st.floats(width=32, allow_nan=True), min_size=1, max_size=5))
    scores = pooled_scores(rng, n, draw(st.sampled_from([0, 3, 50, 10_000])), picked)
    k = draw(st.one_of(st.integers(1, 8), st.integers(1, 400), st.sampled_from([max(n, 1), n + 1])))
    use_elig = draw(st.booleans())
    eligible = (rng.random(n) < draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))) if use_elig else None
    ids = rng.choice(4 * n + 1, n, replace=False).astype(np.int64) if draw(st.booleans()) else None
    return scores, k, eligible, ids


@st.composite
def batch_cases(draw):
    """(scores, offsets, ks, bitset [B, W] or None, masks or None, ids): up to 5 requests of 0 to
    200 scores (sizes on and off the 32-thread block and the 64-bit word), k from 1 to 70."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    batch = draw(st.integers(1, 5))
    sizes = [draw(st.sampled_from([0, 1, 31, 64, 65, 200])) for _ in range(batch)]
    ks = np.array([draw(st.integers(1, 70)) for _ in range(batch)], np.int64)
    pool = np.concatenate([np.array(SPECIALS, np.float32), rng.integers(-3, 3, 20).astype(np.float32)])
    scores = pool[rng.integers(0, pool.size, sum(sizes))].astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    use_elig = draw(st.booleans())
    masks = [rng.random(sz) < 0.5 for sz in sizes]
    elig = elig_rows(masks, (max(sizes) + 63) // 64 or 1)
    ids = rng.permutation(10 * len(scores) + 10)[: len(scores)].astype(np.int64)
    return scores, offsets, ks, (elig if use_elig else None), masks if use_elig else None, ids
