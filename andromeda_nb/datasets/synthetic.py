"""The seeded synthetic benchmark world of docs/design.md, at any scale (throughput work).

docs/design.md, "Targeting" (the benchmark world): 10^8 ads, 20 categories (14 single-valued with 2 to 64 values, 4
multi-valued with 100 to 1,000 values, 2 multi-valued with 10,000 values; a user holds at most 3
values of each multi-valued category), Zipf-like value popularity, each ad constraining a category
with a stated probability.

Conventions:

- **Value popularity.** In category ``c`` with ``m`` values, value ``v`` has popularity rank ``v``
  (value 0 is the most popular): it is drawn with probability ``(v + 1)^-a / sum_w (w + 1)^-a``
  (a Zipf law truncated to ``m`` values, :func:`zipf_pmf`). Ads and users use the same ranking, so
  popular values are both often targeted and often held.
- **Sets** (an ad's include or exclude set, a user's values of a multi-valued category) are drawn
  without replacement from that law: values are drawn one by one and a duplicate is redrawn (up to
  32 rounds; a duplicate left after that, vanishingly rare, is dropped, so a set is never larger
  than asked).
- **Ad ids**: ``0 .. n_ads-1`` by default, slot ``i`` holds ad ``i`` (:func:`generate_rules` and
  :func:`generate_table` agree, so their outputs form one pool); pass ``ad_ids`` to use another id
  space (e.g. a shuffled one).
- **Determinism.** Every function takes ``seed``; each category (and each block of table rows)
  draws from its own stream (:func:`generate_rules`: a counter-based SplitMix64 hash of the seed,
  the category, the kind and the slot, so ads are drawn in parallel; the others: a
  :class:`numpy.random.SeedSequence` child), so a result depends only on the seed and the
  arguments that shape it (not on ``chunk``, nor on the other categories' settings).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..arguments import is_int
from ..model import STORAGE_DTYPES, AdTable, Request, quantize_int8_rows, to_bf16_bits
from ..targeting import Category, TargetingRules, TargetingSchema, make_profile

#: A user holds at most this many values of a multi-valued category (docs/design.md).
MAX_USER_VALUES = 3
#: Rows per generation block of :func:`generate_table` (each block has its own random stream).
TABLE_BLOCK = 4096
_REDRAW_ROUNDS = 32


def _check_seed(seed) -> int:
    """``seed`` as an int, or ValueError: an int (not a bool) in ``0 .. 2**64 - 1``, the seeds that
    give distinct draws (a float's fraction or a multiple of 2**64 would be dropped silently)."""
    if not is_int(seed) or not 0 <= seed <= _MASK64:
        raise ValueError(f"seed must be an int in 0..2**64 - 1, got {seed!r}")
    return int(seed)


def _whole(name: str, x, lo: int = 0) -> int:
    """``x`` as an int at least ``lo``, or ValueError (a float must be whole: 3.0, not 2.5)."""
    ok = not isinstance(x, (bool, np.bool_)) and isinstance(x, (int, float, np.integer, np.floating))
    if not ok or not np.isfinite(x) or int(x) != x or x < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {x!r}")
    return int(x)


def _stream(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=tuple(int(k) for k in key)))


def benchmark_schema(
    n_single: int = 14,
    single_cardinality: tuple[int, int] = (2, 64),
    n_multi: int = 4,
    multi_cardinality: tuple[int, int] = (100, 1000),
    n_high: int = 2,
    high_cardinality: int = 10_000,
) -> TargetingSchema:
    """docs/design.md's benchmark schema (defaults: 20 categories).

    Single-valued ``s00 .. s13`` with cardinalities geometrically spaced from 2 to 64 (2, 3, 3, 4,
    6, 8, 10, 13, 17, 22, 29, 37, 49, 64), multi-valued ``m00 .. m03`` geometrically from 100 to
    1,000 (100, 215, 464, 1000), and multi-valued high-cardinality ``h00 .. h01`` with 10,000 values.

    Raises:
        ValueError: a negative count or a cardinality below 1.
    """
    for name, n in (("n_single", n_single), ("n_multi", n_multi), ("n_high", n_high)):
        if int(n) != n or n < 0:
            raise ValueError(f"{name} must be a non-negative int, got {n!r}")

    def spaced(lo, hi, n):
        if n == 0:
            return []
        if lo < 1 or hi < lo:
            raise ValueError(f"cardinality range must satisfy 1 <= lo <= hi, got ({lo}, {hi})")
        return [int(round(x)) for x in np.geomspace(lo, hi, int(n))]

    cats = [Category(f"s{i:02d}", m) for i, m in enumerate(spaced(*single_cardinality, n_single))]
    cats += [Category(f"m{i:02d}", m, multi_valued=True) for i, m in enumerate(spaced(*multi_cardinality, n_multi))]
    high = _whole("high_cardinality", high_cardinality, 1) if n_high else 0
    cats += [Category(f"h{i:02d}", high, multi_valued=True) for i in range(int(n_high))]
    return TargetingSchema(cats)


def zipf_pmf(m: int, a: float) -> np.ndarray:
    """``[m]`` float64 probabilities ``(v + 1)^-a / sum``: value 0 most popular (``a = 0``: uniform)."""
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    if not a >= 0:
        raise ValueError(f"zipf exponent must be >= 0, got {a!r}")
    w = np.arange(1, m + 1, dtype=np.float64) ** -float(a)
    return w / w.sum()


def _zipf_cdf(m: int, a: float) -> np.ndarray:
    """float32 CDF of :func:`zipf_pmf` (float32 halves the cost of drawing; its 6e-8 resolution is
    far below the smallest probability of a 10,000-value law, about 3e-6)."""
    cdf = np.cumsum(zipf_pmf(m, a)).astype(np.float32)
    cdf[-1] = 1.0
    return cdf


def _zipf_draw(rng: np.random.Generator, cdf: np.ndarray, size: int) -> np.ndarray:
    """``size`` int32 draws by inverse CDF (``cdf`` from :func:`_zipf_cdf`)."""
    idx = np.searchsorted(cdf, rng.random(size, dtype=np.float32), side="right")
    return np.minimum(idx, cdf.size - 1).astype(np.int32)


def _draw_sets(rng: np.random.Generator, sizes: np.ndarray, m: int, a: float) -> tuple[np.ndarray, np.ndarray]:
    """CSR ``(indptr int64[n+1], values int32)``: row ``i`` holds ``sizes[i] <= m`` distinct values
    drawn from the Zipf law, sorted ascending (so ``from_columns`` finds them already canonical).

    Rows with a non-empty set are laid out as a dense ``[k, max size]`` matrix, so duplicate checks
    and the per-row sort are a few vectorised column operations (sets are tiny), never a Python
    loop per row nor a global sort.
    """
    n = sizes.size
    sizes = sizes.astype(np.int64, copy=True)
    hi = int(sizes.max()) if n else 0
    ptr = np.zeros(n + 1, np.int64)
    if hi == 0:
        return ptr, np.zeros(0, np.int32)
    cdf = _zipf_cdf(m, a)
    rows = np.flatnonzero(sizes)
    k = rows.size
    valid = np.arange(hi) < sizes[rows][:, None]  # [k, hi]
    M = _zipf_draw(rng, cdf, k * hi).reshape(k, hi)

    full = sizes[rows] == m  # a set of every value: no sampling needed
    if full.any():
        M[np.ix_(np.flatnonzero(full), np.arange(m))] = np.arange(m, dtype=np.int32)

    def duplicates(sub, ok):
        dup = np.zeros(sub.shape, dtype=bool)
        for j in range(1, hi):
            for i in range(j):
                dup[:, j] |= sub[:, j] == sub[:, i]
        return dup & ok

    todo = np.arange(k)  # rows that may still hold a duplicate
    for _ in range(_REDRAW_ROUNDS):
        dup = duplicates(M[todo], valid[todo])
        bad = dup.any(axis=1)
        if not bad.any():
            break
        todo, dup = todo[bad], dup[bad]
        sub = M[todo]
        sub[dup] = _zipf_draw(rng, cdf, int(dup.sum()))
        M[todo] = sub
    else:  # drop what is left (vanishingly rare)
        valid[todo] &= ~duplicates(M[todo], valid[todo])
        sizes[rows] = valid.sum(axis=1)
    M[~valid] = np.iinfo(np.int32).max  # sorts after every real value
    M.sort(axis=1)
    np.cumsum(sizes, out=ptr[1:])
    vals = M[np.arange(hi) < sizes[rows][:, None]]
    return ptr, np.ascontiguousarray(vals, dtype=np.int32)


def _per_category(name: str, value, n_cat: int, lo: float, hi: float) -> np.ndarray:
    arr = np.broadcast_to(np.asarray(value, dtype=np.float64), (n_cat,)) if np.ndim(value) == 0 \
        else np.asarray(value, dtype=np.float64)
    if arr.shape != (n_cat,):
        raise ValueError(f"{name} must be a scalar or one value per category ({n_cat}), got shape {arr.shape}")
    if np.any(~np.isfinite(arr)) or np.any(arr < lo) or np.any(arr > hi):
        raise ValueError(f"{name} must lie in [{lo}, {hi}], got {value!r}")
    return arr


def _size_range(name: str, size: tuple[int, int]) -> tuple[int, int]:
    if np.ndim(size) != 1 or len(size) != 2:
        raise ValueError(f"{name} must be (lo, hi), got {size!r}")
    lo, hi = (_whole(name, s, 1) for s in size)
    if hi < lo:
        raise ValueError(f"{name} must be (lo, hi) with 1 <= lo <= hi, got {size!r}")
    return lo, hi


def _ids(ad_ids, n_ads: int) -> np.ndarray:
    if ad_ids is None:
        return np.arange(n_ads, dtype=np.int64)
    ids = np.asarray(ad_ids)
    if ids.shape != (n_ads,) or (n_ads and ids.dtype.kind not in "iu"):
        raise ValueError(f"ad_ids must be ({n_ads},) integers, got {ids.shape} {ids.dtype}")
    return np.array(ids, dtype=np.int64)  # a copy: the rules keep it (the caller's buffer stays theirs)


def generate_rules(
    schema: TargetingSchema,
    n_ads: int,
    constrain_prob: float | Sequence[float] = 0.3,
    exclude_prob: float | Sequence[float] = 0.05,
    include_size: tuple[int, int] = (1, 3),
    zipf_a: float | Sequence[float] = 1.2,
    live_fraction: float = 0.99,
    seed: int = 0,
    exclude_size: tuple[int, int] = (1, 1),
    ad_ids=None,
) -> TargetingRules:
    """Random targeting rules for ``n_ads`` ads, built column-wise (no per-ad Python loop).

    Per ad and category ``c`` (independently): with probability ``constrain_prob[c]`` the ad
    includes a set of ``U{include_size}`` distinct values (capped at the cardinality), drawn from
    the category's Zipf law (module docstring); independently, with probability ``exclude_prob[c]``
    it excludes ``U{exclude_size}`` distinct values drawn the same way (an include and an exclude may
    share a value: the exclude wins, as ``match`` defines). Each ad is live with probability
    ``live_fraction``.

    Speed: the draws come from a counter-based generator (a SplitMix64 hash of the seed, the
    category, the kind and the ad's slot), so every ad is drawn independently in a Numba-parallel
    loop on all host cores and the CSR columns are written in place (10^8 ads, 20 categories: a
    few seconds on 16 cores). A result depends only on the seed and the arguments that shape it.

    Args:
        schema: e.g. :func:`benchmark_schema`.
        n_ads: pool size (``>= 0``).
        constrain_prob, exclude_prob, zipf_a: a scalar or one value per category (schema order);
            probabilities in ``[0, 1]``, exponents ``>= 0``.
        include_size, exclude_size: inclusive ``(lo, hi)`` set sizes, ``1 <= lo <= hi``.
        live_fraction: in ``[0, 1]``.
        seed: the random seed (same seed and arguments -> identical rules).
        ad_ids: ``[n_ads]`` unique non-negative ids in slot order (default ``0..n_ads-1``).

    Returns:
        :class:`andromeda_nb.targeting.TargetingRules` (categories no ad constrains are omitted).
        Memory: about 4 bytes per (ad, value) plus an ``int64[n_ads + 1]`` indptr per constrained
        (category, kind).

    Raises:
        ValueError: a parameter out of range; RuleError (from ``from_columns``) for bad ad ids.
    """
    if int(n_ads) != n_ads or n_ads < 0:
        raise ValueError(f"n_ads must be a non-negative int, got {n_ads!r}")
    seed = _check_seed(seed)
    n = int(n_ads)
    C = len(schema)
    cp = _per_category("constrain_prob", constrain_prob, C, 0.0, 1.0)
    xp = _per_category("exclude_prob", exclude_prob, C, 0.0, 1.0)
    za = _per_category("zipf_a", zipf_a, C, 0.0, np.inf)
    inc_lo, inc_hi = _size_range("include_size", include_size)
    exc_lo, exc_hi = _size_range("exclude_size", exclude_size)
    if not 0.0 <= live_fraction <= 1.0:
        raise ValueError(f"live_fraction must be in [0, 1], got {live_fraction!r}")
    ids = _ids(ad_ids, n)
    kern = _hash_kernels()

    def sets(ci, kind, prob, lo, hi, m, a):
        key = _hash_key(seed, ci, kind)
        ptr = np.empty(n + 1, np.int64)
        ptr[0] = 0
        kern["sizes"](key, n, float(prob), min(lo, m), min(hi, m), ptr[1:])
        kern["prefix"](ptr, 1 << 16)
        if ptr[-1] == 0:
            return None
        vals = np.empty(int(ptr[-1]), np.int32)
        got = np.empty(n, np.int64)
        cdf = np.cumsum(zipf_pmf(m, a))
        cdf[-1] = 1.0
        guide = np.minimum(np.searchsorted(cdf, np.arange(4 * m) / (4 * m), side="right"), m - 1)
        if kern["fill"](key, n, ptr, cdf, guide, vals, got):  # a duplicate survived every redraw (vanishingly rare)
            sizes = np.diff(ptr)
            keep = np.arange(vals.size) - np.repeat(ptr[:-1], sizes) < np.repeat(got, sizes)
            vals = vals[keep]
            ptr[1:] = np.cumsum(got)
        return ptr, vals

    include, exclude = {}, {}
    for ci, cat in enumerate(schema):
        for kind, prob, lo, hi, out in ((0, cp[ci], inc_lo, inc_hi, include), (1, xp[ci], exc_lo, exc_hi, exclude)):
            if prob > 0:
                col = sets(ci, kind, prob, lo, hi, cat.cardinality, za[ci])
                if col is not None:
                    out[cat.name] = col
    live = np.empty(n, np.bool_)
    kern["coins"](_hash_key(seed, C, 2), n, float(live_fraction), live)
    # the arrays are this call's own: validated and kept, not copied (a 10^8-ad pool's rules are ~37 GB)
    return TargetingRules.from_columns(schema, ids, live, include, exclude, copy=False)


_MASK64 = (1 << 64) - 1


def _splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _hash_key(seed: int, *key: int) -> np.uint64:
    """The 64-bit stream key of ``(seed, *key)`` for the counter-based generator."""
    h = _splitmix(int(seed) & _MASK64)
    for k in key:
        h = _splitmix(h ^ _splitmix(int(k) & _MASK64))
    return np.uint64(h)


_HASH_KERNELS: dict = {}


def _hash_kernels() -> dict:
    """Numba-compiled (host, parallel) draws of the counter-based generator, compiled on first use.

    Ad ``i`` of stream ``key`` hashes to ``h = splitmix(key + i * golden)``; its ``j``-th uniform
    is ``splitmix(h + j) >> 11`` scaled to ``[0, 1)``: draw 0 is the coin, draw 1 the set size,
    draws 2, 3, ... the values (a duplicate is redrawn, up to 32 times per value).
    """
    if _HASH_KERNELS:
        return _HASH_KERNELS
    from ..device import backend

    backend.get_backend()  # Numba reads NUMBA_ENABLE_CUDASIM on first import: fix the backend first
    from numba import njit, prange, uint64

    golden = uint64(0x9E3779B97F4A7C15)
    scale = 1.0 / 9007199254740992.0

    @njit(inline="always")
    def mix(x):
        x = x + uint64(0x9E3779B97F4A7C15)
        z = x
        z = (z ^ (z >> uint64(30))) * uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> uint64(27))) * uint64(0x94D049BB133111EB)
        return z ^ (z >> uint64(31))

    @njit(inline="always")
    def unif(h, j):
        return float(mix(h + uint64(j)) >> uint64(11)) * scale

    @njit(parallel=True)
    def sizes(key, n, prob, lo, hi, out):
        span = hi - lo + 1
        for i in prange(n):
            h = mix(key + uint64(i) * golden)
            if unif(h, 0) < prob:
                out[i] = lo + min(int(unif(h, 1) * span), span - 1)
            else:
                out[i] = 0

    @njit(inline="always")
    def draw(cdf, guide, u):
        """Inverse CDF: the first index with ``cdf[index] > u``, starting from the guide table's
        cut point (``guide[j]``: that index for ``u = j / len(guide)``), so O(1) steps expected."""
        i = guide[int(u * guide.size)]
        last = cdf.size - 1
        while i < last and cdf[i] <= u:
            i += 1
        return i

    @njit(parallel=True)
    def fill(key, n, ptr, cdf, guide, vals, got):
        m = cdf.size
        short = 0
        for i in prange(n):
            k = ptr[i + 1] - ptr[i]
            base = ptr[i]
            if k == 0:
                got[i] = 0
                continue
            if k >= m:
                for v in range(m):
                    vals[base + v] = v
                got[i] = m
                continue
            h = mix(key + uint64(i) * golden)
            j = 2
            cnt = 0
            for _ in range(k):
                for _r in range(32):
                    v = draw(cdf, guide, unif(h, j))
                    j += 1
                    pos = cnt
                    dup = False
                    for q in range(cnt):
                        x = vals[base + q]
                        if x == v:
                            dup = True
                            break
                        if x > v:
                            pos = q
                            break
                    if dup:
                        continue
                    for q in range(cnt, pos, -1):
                        vals[base + q] = vals[base + q - 1]
                    vals[base + pos] = v
                    cnt += 1
                    break
            got[i] = cnt
            if cnt < k:
                short += 1
        return short

    @njit(parallel=True)
    def prefix(a, chunk):
        """In-place inclusive prefix sum (parallel: chunk sums, their scan, then each chunk)."""
        n = a.size
        n_chunks = (n + chunk - 1) // chunk
        sums = np.zeros(n_chunks, np.int64)
        for k in prange(n_chunks):
            t = 0
            for i in range(k * chunk, min(n, (k + 1) * chunk)):
                t += a[i]
            sums[k] = t
        run = 0
        for k in range(n_chunks):
            t = sums[k]
            sums[k] = run
            run += t
        for k in prange(n_chunks):
            t = sums[k]
            for i in range(k * chunk, min(n, (k + 1) * chunk)):
                t += a[i]
                a[i] = t

    @njit(parallel=True)
    def coins(key, n, prob, out):
        for i in prange(n):
            out[i] = unif(mix(key + uint64(i) * golden), 0) < prob

    _HASH_KERNELS.update(sizes=sizes, fill=fill, coins=coins, prefix=prefix)
    return _HASH_KERNELS


def generate_profiles(
    schema: TargetingSchema,
    n_profiles: int,
    seed: int = 0,
    zipf_a: float | Sequence[float] = 1.2,
    max_values: int = MAX_USER_VALUES,
) -> list[dict]:
    """Random user profiles: a single-valued category always holds exactly one value; a
    multi-valued one holds ``U{0..max_values}`` distinct values (so possibly none). Values follow
    the category's Zipf law (same ranking as the ads', module docstring).

    Args:
        schema: e.g. :func:`benchmark_schema`.
        n_profiles: how many (``>= 0``).
        seed: the random seed.
        zipf_a: a scalar or one exponent per category.
        max_values: most values held per multi-valued category (docs/design.md: 3).

    Returns:
        A list of ``{category: frozenset}`` dicts (:func:`andromeda_nb.targeting.make_profile`),
        usable with :func:`andromeda_nb.reference.match` and :meth:`TargetingIndex.plan`.
    """
    if int(n_profiles) != n_profiles or n_profiles < 0:
        raise ValueError(f"n_profiles must be a non-negative int, got {n_profiles!r}")
    if int(max_values) != max_values or max_values < 0:
        raise ValueError(f"max_values must be a non-negative int, got {max_values!r}")
    seed = _check_seed(seed)
    n = int(n_profiles)
    za = _per_category("zipf_a", zipf_a, len(schema), 0.0, np.inf)
    columns = []
    for ci, cat in enumerate(schema):
        rng = _stream(seed, ci, 3)
        if cat.multi_valued:
            sizes = rng.integers(0, min(int(max_values), cat.cardinality) + 1, size=n)
        else:
            sizes = np.ones(n, np.int64)
        columns.append(_draw_sets(rng, sizes, cat.cardinality, za[ci]))
    out = []
    for i in range(n):
        out.append(make_profile(schema, {
            cat.name: vals[ptr[i]:ptr[i + 1]].tolist() for cat, (ptr, vals) in zip(schema, columns)
        }))
    return out


def generate_table(
    n_ads: int,
    d: int = 64,
    dtype: str = "fp16",
    seed: int = 0,
    chunk: int = 1 << 18,
    bias_scale: float = 0.1,
    ad_ids=None,
) -> AdTable:
    """A random ad table, generated block by block straight into its storage dtype.

    Embeddings are i.i.d. ``N(0, (1/sqrt(d))^2)`` (rows of norm about 1: finite and far inside
    the fp16 range), biases ``N(0, bias_scale^2)``. Rows come in blocks of :data:`TABLE_BLOCK`,
    each with its own random stream, and are converted ``chunk`` rows at a time, so the working
    memory beyond the output is one ``[chunk, d]`` float32 buffer (e.g. 10^8 x 64 fp16, 12.8 GB,
    needs no 25.6 GB float32 copy). The result does not depend on ``chunk``.

    Args:
        n_ads: rows (``>= 0``).
        d: embedding dimension (``>= 1``).
        dtype: ``fp32``, ``fp16``, ``bf16`` (uint16 bits) or ``int8`` (per-row scale,
            :func:`andromeda_nb.model.quantize_int8_rows`).
        seed: the random seed.
        chunk: rows converted per step (``>= 1``; working memory ``4 * chunk * d`` bytes).
        bias_scale: standard deviation of the biases (``>= 0``).
        ad_ids: ``[n_ads]`` unique non-negative ids (default ``0..n_ads-1``; not checked for
            uniqueness here, as the table may be huge).

    Returns:
        :class:`andromeda_nb.model.AdTable`.
    """
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"dtype must be one of {tuple(STORAGE_DTYPES)}, got {dtype!r}")
    if int(n_ads) != n_ads or n_ads < 0:
        raise ValueError(f"n_ads must be a non-negative int, got {n_ads!r}")
    if int(d) != d or d < 1:
        raise ValueError(f"d must be a positive int, got {d!r}")
    if int(chunk) != chunk or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")
    if not (bias_scale >= 0 and np.isfinite(bias_scale)):
        raise ValueError(f"bias_scale must be finite and >= 0, got {bias_scale!r}")
    seed = _check_seed(seed)
    n, d = int(n_ads), int(d)
    ids = _ids(ad_ids, n)
    if n and ids.min() < 0:
        raise ValueError("ad_ids must be non-negative")
    emb = np.empty((n, d), dtype=STORAGE_DTYPES[dtype])
    bias = np.empty(n, dtype=np.float32)
    scale = np.empty(n, dtype=np.float32) if dtype == "int8" else None
    step = max(1, -(-int(chunk) // TABLE_BLOCK)) * TABLE_BLOCK
    buf = np.empty((min(step, n), d), dtype=np.float32)
    inv = np.float32(1.0 / np.sqrt(d))
    for start in range(0, n, step):
        stop = min(start + step, n)
        for b0 in range(start, stop, TABLE_BLOCK):
            b1 = min(b0 + TABLE_BLOCK, n)
            rng = _stream(seed, b0 // TABLE_BLOCK)
            rng.standard_normal((b1 - b0, d), dtype=np.float32, out=buf[b0 - start:b1 - start])
            bias[b0:b1] = rng.standard_normal(b1 - b0, dtype=np.float32) * np.float32(bias_scale)
        rows = buf[: stop - start]
        rows *= inv
        if dtype == "fp32":
            emb[start:stop] = rows
        elif dtype == "fp16":
            emb[start:stop] = rows.astype(np.float16)
        elif dtype == "bf16":
            emb[start:stop] = to_bf16_bits(rows)
        else:
            emb[start:stop], scale[start:stop] = quantize_int8_rows(rows)
    return AdTable(embeddings=emb, bias=bias, dtype=dtype, scale=scale, ad_ids=ids)


def generate_requests(n: int, d: int = 64, experts: int = 6, k_experts: int = 2, seed: int = 0,
                      beta_scale: float = 0.5) -> list[Request]:
    """Random requests matched to :func:`generate_table`'s scale.

    ``V ~ N(0, 1)``; ``G = sqrt(d) * N(0, 1)``, so the gate logit ``dot(G[e], h) / sqrt(d)`` is an
    ``N(0, |h|^2)`` draw (spread about +-1 for rows of norm about 1, a gate that really selects);
    ``gamma ~ U(0.5, 1.5)``; ``beta ~ N(0, (beta_scale / sqrt(d))^2)`` (a shift on the rows' own
    scale, so the ReLU cuts a real fraction of each row). All float32.

    Args:
        n: number of requests (``>= 0``).
        d, experts, k_experts: model shape (``1 <= k_experts <= experts <= MAX_EXPERTS``).
        seed: the random seed (requests are drawn one after another from one stream).
        beta_scale: relative size of the context shift.

    Raises:
        ValueError: shapes out of range (from :class:`andromeda_nb.model.Request`).
    """
    if int(n) != n or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    d = _whole("d", d, 1)
    if not np.isfinite(beta_scale) or beta_scale < 0:
        raise ValueError(f"beta_scale must be finite and non-negative, got {beta_scale!r}")
    rng = _stream(_check_seed(seed), 0)
    s = np.float32(np.sqrt(d))
    out = []
    for _ in range(int(n)):
        V = rng.standard_normal((experts, d), dtype=np.float32)
        G = rng.standard_normal((experts, d), dtype=np.float32) * s
        gamma = rng.uniform(0.5, 1.5, d).astype(np.float32)
        beta = (rng.standard_normal(d, dtype=np.float32) * np.float32(beta_scale / np.sqrt(d)))
        out.append(Request(V=V, G=G, gamma=gamma, beta=beta, k_experts=k_experts))
    return out
