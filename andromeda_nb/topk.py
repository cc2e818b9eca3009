"""Host wrappers of the block top-K kernels (kernels/topk.py)."""

from __future__ import annotations

import numpy as np

from . import launch
from .model import TopK
from .targeting import WORD_BITS, bits_from_mask

#: Largest k the block top-K supports: its shared buffer of next_pow2(k + 256) entries of 8 bytes
#: must stay within Numba's 48 KiB of shared memory per block.
MAX_K = 2048
#: Item counts are int32 slots inside the kernels.
MAX_ITEMS = 2**31 - 1


def check_k(k) -> int:
    """Validate ``k`` (an int in ``1..MAX_K``) and return it as int.

    Raises:
        TypeError: not an integer.
        ValueError: ``k < 1`` or ``k > MAX_K``.
    """
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k={k} is out of range: the block top-K supports 1 <= k <= {MAX_K}")
    return int(k)


def eligible_bitset(eligible, n: int):
    """Accept an eligible set as a bool mask ``[n]`` or a uint64 bitset ``[ceil(n/64)]`` (host or
    device) and return a device bitset. A host bitset must have no bits set past ``n``.

    Raises:
        TypeError / ValueError: wrong dtype, shape or contiguity, or padding bits set.
    """
    n_words = (n + WORD_BITS - 1) // WORD_BITS
    if isinstance(eligible, np.ndarray) and eligible.dtype == np.bool_:
        launch.check_array("eligible", eligible, np.bool_, shape=(n,))
        return launch.to_device(bits_from_mask(eligible))
    launch.check_array("eligible", eligible, np.uint64, shape=(n_words,))
    if isinstance(eligible, np.ndarray) and n % WORD_BITS and n_words:
        if int(eligible[-1]) >> (n % WORD_BITS):
            raise ValueError(f"eligible bitset has bits set past n={n} (padding bits must be 0)")
    return launch.to_device(eligible)


#: Requests at most per batched call.
MAX_BATCH = 65535


def _blocks_per_request(max_n: int, batch: int, block: int) -> int:
    from .kernels.topk import SCAN_ITEMS

    need = max(1, -(-max_n // (block * SCAN_ITEMS)))
    cap = launch.SIM_MAX_BLOCKS if launch.backend.is_simulator() else max(1, launch.sm_count() * 4 // batch)
    return min(need, cap)


def launch_merge_lists(cand_s, cand_i, lists: int, kmax: int, d_ks, d_offsets, ids=None, block: int | None = None):
    """Enqueue the merge of per-block top-k lists into each request's exact top-k.

    Args: device ``cand_s float32[batch, lists * kmax]`` and ``cand_i int32[...]`` (each list sorted
    best first, slots local to the request's slice, -1 pads; entries past a request's k ignored),
    ``d_ks int64[batch]``, ``d_offsets int64[batch + 1]``, ``ids`` (device int64, global) or None.

    Steps: bound (the best of the lists' k-th keys, a lower bound of the answer's k-th), select (the
    entries at or above it into a compact buffer), final (one block's exact top-k of the buffer).

    Returns:
        Device ``(ids int64[batch, kmax], scores float32[batch, kmax])``.
    """
    from .kernels.topk import NEG_INF, bound_kernel, buffer_capacity, final_kernel, select_kernel

    cuda = launch.cuda()
    block = block or launch.default_block()
    batch = cand_s.shape[0]
    m = lists * kmax
    has_ids = ids is not None
    ids_arg = ids if has_ids else launch.dummy(np.int64)
    bound_s = cuda.device_array(batch, np.float32)
    bound_i = cuda.device_array(batch, np.int32)
    bound_kernel(block, has_ids)[(1, batch), block](cand_s, cand_i, lists, kmax, d_ks, d_offsets, ids_arg,
                                                    bound_s, bound_i)
    buf_s = cuda.device_array((batch, m), np.float32)
    buf_i = cuda.device_array((batch, m), np.int32)
    fill = cuda.to_device(np.zeros(batch, np.int64))
    grid = max(1, min(-(-m // block), 64))
    select_kernel(has_ids)[(grid, batch), block](cand_s, cand_i, m, kmax, d_ks, d_offsets, ids_arg,
                                                 bound_s, bound_i, buf_s, buf_i, fill)
    out_s = cuda.device_array((batch, kmax), np.float32)
    out_slot = cuda.device_array((batch, kmax), np.int32)
    out_id = cuda.device_array((batch, kmax), np.int64)
    final_kernel(buffer_capacity(kmax, block), block, has_ids)[(1, batch), block](
        buf_s, buf_i, fill, d_offsets, ids_arg, d_ks, out_s, out_slot, out_id)
    return out_id, out_s


def launch_topk_batch(d_scores, offsets: np.ndarray, ks: np.ndarray, elig=None, d_ids=None, seeds=None,
                      block: int | None = None):
    """Enqueue the batched block top-K (no validation, no host copies).

    Args:
        d_scores: device ``float32[total]``; ``offsets`` host int64 ``[batch + 1]`` (request r owns
            ``scores[offsets[r]:offsets[r+1]]``); ``ks`` host int64 ``[batch]``;
        elig: device ``uint64[batch, words]`` per-request bitsets over their slices, or None;
        d_ids: device int64 ``[total]`` ids, or None (ids = positions within the slice);
        seeds: device float32 ``[batch]`` seed thresholds (-inf: none), or None.

    Returns:
        Device ``(ids int64[batch, kmax], scores float32[batch, kmax], counts int64[batch, 2])``;
        ``counts[r] = (eligible non-NaN scores, those >= seed)``.
    """
    from .kernels.topk import SCAN_ITEMS, buffer_capacity, scan_kernel

    cuda = launch.cuda()
    block = block or launch.default_block()
    batch = len(ks)
    kmax = int(np.max(ks))
    d_offsets = cuda.to_device(np.asarray(offsets, np.int64))
    d_ks = cuda.to_device(np.asarray(ks, np.int64))
    if seeds is None:
        seeds = cuda.to_device(np.full(batch, -np.inf, np.float32))
    sizes = np.diff(offsets)
    bpr = _blocks_per_request(int(sizes.max()) if batch else 1, batch, block)
    cand_s = cuda.device_array((batch, bpr * kmax), np.float32)
    cand_i = cuda.device_array((batch, bpr * kmax), np.int32)
    counts = cuda.to_device(np.zeros((batch, 2), np.int64))
    kern = scan_kernel(buffer_capacity(kmax, block, SCAN_ITEMS), block, elig is not None, d_ids is not None)
    kern[(bpr, batch), block](d_scores, d_offsets, elig if elig is not None else launch.dummy2d(np.uint64),
                              d_ids if d_ids is not None else launch.dummy(np.int64), d_ks, kmax, seeds,
                              cand_s, cand_i, counts)
    ids, scores = launch_merge_lists(cand_s, cand_i, bpr, kmax, d_ks, d_offsets, d_ids, block)
    return ids, scores, counts


#: Single requests at least this large get a seed threshold from a sample.
SEED_MIN_N = 1 << 21
SAMPLE_CHUNKS, SAMPLE_CHUNK = 1024, 256
SEED_MARGIN = 4  # aim for ~4k scores at or above the seed


def launch_seed(d_scores, n: int, k: int, block: int | None = None):
    """Enqueue a seed threshold for a single request's top-k: the r-th best of a sample of
    ``SAMPLE_CHUNKS`` contiguous chunks spread over the array, with ``r`` such that about
    ``SEED_MARGIN * k`` scores of the whole array reach it. Returns device ``float32[1]`` (-inf when
    the sample is too small to say)."""
    from .kernels.topk import sample_chunks_kernel

    cuda = launch.cuda()
    block = block or launch.default_block()
    m = SAMPLE_CHUNKS * SAMPLE_CHUNK
    r = int(np.ceil(SEED_MARGIN * k * m / n))
    seed = cuda.to_device(np.full(1, -np.inf, np.float32))
    if n < 2 * m or r > MAX_K or r < 8:
        return seed
    sample = cuda.device_array(m, np.float32)
    sample_chunks_kernel()[SAMPLE_CHUNKS, SAMPLE_CHUNK](d_scores, n, sample)
    _, top_s, _ = launch_topk_batch(sample, np.array([0, m]), np.array([r]), block=block)
    seed.copy_to_device(top_s[0, r - 1:r])
    return seed


def launch_topk(d_scores, n: int, k: int, elig=None, d_ids=None, block: int | None = None, seed=None):
    """Enqueue block top-K over one device score array (no validation, no host copies).

    ``seed``: a device float32[1] seed threshold (see :func:`launch_seed`) or None.

    Returns:
        Device ``(ids int64[k], scores float32[k], counts int64[2])`` (counts: eligible non-NaN
        scores, and those >= seed).
    """
    elig2 = None if elig is None else elig.reshape(1, elig.shape[0])
    ids, scores, counts = launch_topk_batch(d_scores, np.array([0, n], np.int64), np.array([k], np.int64),
                                            elig2, d_ids, seed, block)
    return ids[0], scores[0], counts[0]


def topk_scores(scores, k: int, eligible=None, ids=None, block: int | None = None, seeded: bool = True) -> TopK:
    """Exact top-k of a score array on the device (block top-K, then a merge on the device).

    Contract (DESIGN.md): score descending, ties to the lower id, NaN never selected, fewer than k
    candidates padded with id -1 and score -inf.

    Args:
        scores: ``float32[n]``, host or device, C-contiguous, ``n < 2**31``.
        k: ``1 <= k <= MAX_K``.
        eligible: optional bool ``[n]`` mask or uint64 ``[ceil(n/64)]`` bitset.
        ids: optional ``int64[n]`` ids (unique) reported and used for tie-breaks; default the index.
        block: threads per block (default: 256 on a GPU, 32 in the simulator).
        seeded: for large arrays without an eligible set, seed the running threshold from a
            sample (exact either way: a seed above the k-th score triggers an unseeded rerun).

    Returns:
        :class:`~andromeda_nb.model.TopK` with host arrays and the count of eligible non-NaN scores.

    Raises:
        TypeError / ValueError: bad dtype, shape, contiguity or k (before any launch).
    """

    k = check_k(k)
    launch.check_array("scores", scores, np.float32, ndim=1)
    n = int(scores.shape[0])
    if n > MAX_ITEMS:
        raise ValueError(f"at most {MAX_ITEMS} scores per call, got {n}")
    if ids is not None:
        launch.check_array("ids", ids, np.int64, shape=(n,))
    elig = None if eligible is None else eligible_bitset(eligible, n)
    d_ids = None if ids is None else launch.to_device(ids)
    d_scores = launch.to_device(scores)
    seed = launch_seed(d_scores, n, k, block) if (seeded and elig is None and n >= SEED_MIN_N) else None
    out_ids, out_scores, counts = launch_topk(d_scores, n, k, elig, d_ids, block, seed)
    c = counts.copy_to_host()
    if seed is not None and c[1] < min(k, c[0]):
        # the seed was above the k-th score: exactness needs the unseeded pass
        out_ids, out_scores, counts = launch_topk(d_scores, n, k, elig, d_ids, block, None)
        c = counts.copy_to_host()
    return TopK(ids=out_ids.copy_to_host(), scores=out_scores.copy_to_host(), count=int(c[0]))
