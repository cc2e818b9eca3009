"""Top-K, the public entries: :func:`topk_scores` (one score array) and :func:`topk_batch` (many
requests at once), and the input checks they (and fused scoring) run before any launch.

Contract (docs/design.md, "Top-K"): score descending, ties to the lower id, NaN never
selected, fewer than k candidates padded with id -1 and score -inf. Which path answers is
``config.path`` (:class:`~andromeda_nb.topk.config.TopKConfig`; the paths and the auto rule are in
:mod:`~andromeda_nb.topk.config`). The launch-level pieces other packages build on are re-exported
here (workspaces, ``launch_*``). Importing this module does not import numba.
"""

from __future__ import annotations

import numpy as np

from ..device import launch
from ..model import TopK, all_unique
from ..targeting import WORD_BITS, bits_from_mask
from .batched import batch_outcomes, launch_topk_batch_seeded
from .config import (BLOCK_TOPK_BUFFER, BLOCK_TOPK_MAX_K, DEFAULT_CONFIG, MAX_BATCH, MAX_ITEMS, MAX_K, RADIX_BLOCK,
                     TopKConfig, TopKTuning, check_config, choose_path, radix_block)
from .filter import FilterWorkspace
from .final import launch_final
from .scan import TopKWorkspace, launch_merge_lists, launch_topk_batch, scan_lists
from .seed import SeedWorkspace, launch_seed, launch_seed_select, sample_positions
from .single import launch_topk, seeded_outcome, topk_one

__all__ = [
    "BLOCK_TOPK_MAX_K", "DEFAULT_CONFIG", "MAX_BATCH", "MAX_ITEMS", "MAX_K", "RADIX_BLOCK", "FilterWorkspace",
    "SeedWorkspace", "TopKConfig", "TopKTuning", "TopKWorkspace", "check_block_topk_block", "check_ids", "check_k",
    "eligible_bitset", "launch_final", "launch_merge_lists", "launch_seed", "launch_seed_select", "launch_topk",
    "radix_block", "sample_positions", "seeded_outcome", "topk_batch", "topk_scores",
]


# ----------------------------------------------------------------------------- input checks

def check_k(k) -> int:
    """Validate ``k`` (an int in ``1..MAX_K``) and return it as int.

    Raises:
        TypeError: not an integer.
        ValueError: ``k < 1`` or ``k > MAX_K``.
    """
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k={k} is out of range: top-K supports 1 <= k <= {MAX_K}")
    return int(k)


def check_ids(ids, offsets):
    """Validate top-K ids: ``int64[offsets[-1]]``, non-negative, unique within each request's slice
    ``offsets[r]:offsets[r+1]`` (ties are broken by id: a repeated id leaves the order undefined,
    and the radix select's tie count wrong). Returns the host copy.

    Raises:
        TypeError / ValueError: wrong dtype, shape or contiguity, a negative or repeated id.
    """
    total = int(offsets[-1])
    launch.check_array("ids", ids, np.int64, shape=(total,))
    host_ids = ids if isinstance(ids, np.ndarray) else ids.copy_to_host()
    if total and host_ids.min() < 0:
        raise ValueError("ids must be non-negative (-1 marks a pad in the result)")
    for r in range(len(offsets) - 1):
        if not all_unique(host_ids[offsets[r]:offsets[r + 1]]):
            where = f" within each request (request {r} repeats one)" if len(offsets) > 2 else ""
            raise ValueError(f"ids must be unique{where} (ties are broken by id)")
    return host_ids


def check_block_topk_block(block: int | None, ks) -> int | None:
    """A caller's ``block`` also runs the block top-K (a path or a rerun of the seeded paths) for
    every k up to ``BLOCK_TOPK_MAX_K`` among ``ks``: its scan keeps ``next_pow2(k + 8 * block)``
    entries of 8 bytes in shared memory, at most ``BLOCK_TOPK_BUFFER`` within Numba's 48 KiB.
    Returns ``block``.

    Raises:
        ValueError: a block too large for the largest such k, naming the largest that fits.
    """
    from .block import SCAN_ITEMS, buffer_capacity

    small = [int(k) for k in ks if int(k) <= BLOCK_TOPK_MAX_K]
    if block is None or not small:
        return block
    kmax = max(small)
    if buffer_capacity(kmax, block, SCAN_ITEMS) > BLOCK_TOPK_BUFFER:
        fits = (BLOCK_TOPK_BUFFER - kmax) // SCAN_ITEMS
        raise ValueError(f"block={block} with k={kmax}: the block top-K (the fallback path) keeps k + "
                         f"{SCAN_ITEMS} * block entries in 48 KiB of shared memory; block <= {fits} fits")
    return block


def eligible_bitset(eligible, n: int):
    """Accept an eligible set as a bool mask ``[n]`` or a uint64 bitset ``[ceil(n/64)]`` (host or
    device) and return a device bitset. A host bitset must have no bits set past ``n`` (a device
    one is trusted: its padding bits must be 0); a device mask is copied to the host and packed.

    Raises:
        TypeError / ValueError: wrong dtype, shape or contiguity, or padding bits set.
    """
    n_words = (n + WORD_BITS - 1) // WORD_BITS
    if getattr(eligible, "dtype", None) is not None and np.dtype(eligible.dtype) == np.bool_:
        launch.check_array("eligible", eligible, np.bool_, shape=(n,))
        return launch.to_device(bits_from_mask(_on_host(eligible)))
    if getattr(eligible, "dtype", None) is not None and np.dtype(eligible.dtype) != np.uint64:
        raise TypeError(f"eligible must be a bool mask [{n}] or a uint64 bitset [{n_words}] (host or "
                        f"device), got dtype {np.dtype(eligible.dtype).name}"
                        + (" on the device" if not isinstance(eligible, np.ndarray) else ""))
    launch.check_array("eligible", eligible, np.uint64, shape=(n_words,))
    if isinstance(eligible, np.ndarray) and _rows_with_padding_bits(eligible[None, :], np.array([n])):
        raise ValueError(f"eligible bitset has bits set past n={n} (padding bits must be 0)")
    return launch.to_device(eligible)


def _on_host(x) -> np.ndarray:
    """A host array as it is; a device array copied to the host."""
    return x if isinstance(x, np.ndarray) else x.copy_to_host()


def _rows_with_padding_bits(bits: np.ndarray, lengths: np.ndarray) -> list[int]:
    """Rows r of a host uint64 bitset ``[R, W]`` with a bit set at a position ``>= lengths[r]``
    (in the last word it covers, or in a whole word past it)."""
    n_words = -(-lengths // WORD_BITS)
    past = np.arange(bits.shape[1])[None, :] >= n_words[:, None]  # whole words past the end
    whole = np.flatnonzero((np.where(past, bits, 0) != 0).any(axis=1))
    part = np.flatnonzero(lengths % WORD_BITS)  # the last word's bits past the end
    tail = (bits[part, n_words[part] - 1] >> (lengths[part] % WORD_BITS).astype(np.uint64)) != 0
    return sorted(set(whole.tolist()) | set(part[tail].tolist()))


def _batch_bitset(eligible, offsets: np.ndarray):
    """:func:`topk_batch`'s eligible set (a bool mask [total] or a uint64 bitset [B, W], host or
    device) as a device uint64 bitset [B, W], a row a request. Raises TypeError / ValueError for a
    wrong dtype or shape or (host bitsets) bits set past a request's length."""
    B, total = offsets.size - 1, int(offsets[-1])
    lengths = np.diff(offsets)
    need = max(1, -(-int(lengths.max()) // WORD_BITS))
    dtype = getattr(eligible, "dtype", None)
    dtype = None if dtype is None else np.dtype(dtype)
    if dtype == np.bool_:
        launch.check_array("eligible", eligible, np.bool_, shape=(total,))
        mask = _on_host(eligible)
        bits = np.zeros((B, need), np.uint64)
        for r in range(B):
            w = bits_from_mask(mask[offsets[r]:offsets[r + 1]])
            bits[r, :w.size] = w
        return launch.to_device(bits)
    if dtype != np.uint64 or len(getattr(eligible, "shape", ())) != 2:
        raise TypeError(f"eligible must be a bool mask [{total}] or a uint64 bitset [{B}, >= {need}] (host or "
                        f"device), got {type(eligible).__name__} of dtype {dtype}, shape "
                        f"{getattr(eligible, 'shape', None)}")
    launch.check_array("eligible", eligible, np.uint64, ndim=2)
    if eligible.shape[0] != B or eligible.shape[1] < need:
        raise ValueError(f"eligible bitset must be [{B}, >= {need}] (a row a request, 64 positions a word), "
                         f"got {tuple(eligible.shape)}")
    if isinstance(eligible, np.ndarray):
        bad = _rows_with_padding_bits(eligible, lengths)
        if bad:
            raise ValueError(f"eligible bitset row {bad[0]} has bits set past its request's {lengths[bad[0]]} "
                             "scores (padding bits must be 0)")
    return launch.to_device(eligible)


# ----------------------------------------------------------------------------- public entries

def topk_scores(scores, k: int, eligible=None, ids=None, block: int | None = None, seeded: bool = True, *,
                config: TopKConfig | None = None) -> TopK:
    """Exact top-k of a score array on the device (the contract in the module docstring).

    Args:
        scores: ``float32[n]``, host or device, C-contiguous, ``n < 2**31``.
        k: ``1 <= k <= MAX_K`` (4096). Above ``BLOCK_TOPK_MAX_K`` (2048) only by radix select: the
            seeded filter path, else one block's radix select over every eligible score (exact,
            slow for large n).
        eligible: optional bool ``[n]`` mask or uint64 ``[ceil(n/64)]`` bitset.
        ids: optional ``int64[n]`` ids (unique, non-negative) reported and used for tie-breaks;
            default the index.
        block: threads per block (default: 256 on a GPU, 32 in the simulator; for k up to
            ``BLOCK_TOPK_MAX_K`` at most ``(4096 - k) // 8``: see :func:`check_block_topk_block`);
            the one-block radix selects run :data:`RADIX_BLOCK` threads whatever it is.
        seeded: False is ``path="unseeded"`` (the block top-K over every score).
        config: the path and its tuning (default :data:`DEFAULT_CONFIG`: ``path="auto"``, which
            seeds requests of ``seed_min_n`` scores or more: the batched path on a batch of one up
            to ``small_max_n`` scores, the "filter" path past it; see
            :func:`~andromeda_nb.topk.config.choose_path`). Exact on every path: a seed above the
            k-th score, or one letting more scores through than the buffer holds, triggers a rerun
            (:func:`~andromeda_nb.topk.single.topk_one`).

    Returns:
        :class:`~andromeda_nb.model.TopK` with host arrays and the count of eligible non-NaN scores.

    Raises:
        TypeError / ValueError: bad dtype, shape, contiguity, k, block, ids (negative or repeated)
            or config (path "scan" for k above ``BLOCK_TOPK_MAX_K``, ``seeded=False`` with a seeded
            path), before any launch.
    """
    k = check_k(k)
    config = check_config(config)
    launch.check_array("scores", scores, np.float32, ndim=1)
    n = int(scores.shape[0])
    if n > MAX_ITEMS:
        raise ValueError(f"at most {MAX_ITEMS} scores per call, got {n}")
    path = choose_path(config, n, k, seeded)
    block = check_block_topk_block(launch.check_block(block), [k])
    if ids is not None:
        check_ids(ids, np.array([0, n]))
    elig = None if eligible is None else eligible_bitset(eligible, n)
    d_ids = None if ids is None else launch.to_device(ids)
    d_scores = launch.to_device(scores)
    return topk_one(d_scores, n, k, elig, d_ids, block, path, config)


def topk_batch(scores, offsets, ks, eligible=None, ids=None, block: int | None = None, *,
               config: TopKConfig | None = None) -> list[TopK]:
    """Exact top-k of many requests at once: request ``r`` owns ``scores[offsets[r]:offsets[r+1]]``
    and its own ``ks[r]``; the contract of :func:`topk_scores` per request.

    One launch set for the batch (:func:`~andromeda_nb.topk.batched.launch_topk_batch_seeded`: a
    seed a request from a sample, one filter pass, a block a request sorting its kept scores; for k
    above ~200 the rank final (1-3 requests) or a block a request's radix select (4 or more:
    :func:`~andromeda_nb.topk.config.final_for`)). The few requests it cannot answer exactly (a seed above the k-th
    score, or more kept scores than the buffer holds: ties, sorted input, requests of millions of
    scores) are rerun: one by one by :func:`topk_scores`, or, past ``rerun_one_by_one`` of them,
    the whole batch by the unseeded block top-K (k <= ``BLOCK_TOPK_MAX_K``).

    Args:
        scores: ``float32[total]``, host or device, C-contiguous.
        offsets: int ``[B + 1]``, ``offsets[0] == 0``, non-decreasing, ``offsets[-1] == total``;
            ``1 <= B <= MAX_BATCH``; an empty slice answers all pads.
        ks: int ``[B]``, each ``1..MAX_K``.
        eligible: optional eligible set: a bool mask ``[total]`` (each request's slice of it;
            host or device), or a uint64 bitset ``[B, W]`` (host or device), row r request r's
            own bits (bit j of word w: position ``offsets[r] + 64 w + j``), ``W >=
            ceil(longest request / 64)``; a host bitset must have no bit set past its request's
            length (a device one is trusted: such bits must be 0).
        ids: optional ``int64[total]`` ids, non-negative and unique within each request
            (tie-breaks and output); default the position within the request's slice.
        block: threads per block of the filter pass and of the reruns (1..1024; default 256 on a
            GPU, 32 in the simulator; at most ``(4096 - k) // 8`` for the largest k up to
            ``BLOCK_TOPK_MAX_K``: the block top-K a rerun may take keeps ``k + 8 * block`` entries
            in shared memory).
        config: the path ("auto" or "batched": the seeded batch above; "unseeded": the block top-K
            over the whole batch, every k at most ``BLOCK_TOPK_MAX_K``) and its tuning; the
            one-by-one reruns take the same config.

    Returns:
        one :class:`~andromeda_nb.model.TopK` per request (host arrays of length ``ks[r]``).

    Raises:
        TypeError / ValueError: bad dtype, shape, contiguity, offsets, k, block, mask, ids or
            config (a single-request path, or "unseeded" with a k above ``BLOCK_TOPK_MAX_K``),
            before any launch.
    """
    config = check_config(config)
    launch.check_array("scores", scores, np.float32, ndim=1)
    total = int(scores.shape[0])
    offsets = np.asarray(offsets)
    ks = np.asarray(ks)
    if (offsets.ndim != 1 or not np.issubdtype(offsets.dtype, np.integer) or offsets.dtype == np.bool_
            or offsets.size < 2):
        raise ValueError(f"offsets must be a 1-D integer array of B + 1 >= 2 entries, got {offsets!r}")
    B = offsets.size - 1
    if B > MAX_BATCH:
        raise ValueError(f"at most {MAX_BATCH} requests per batch, got {B}")
    # compared, not subtracted: a difference of unsigned or narrow integers wraps around
    if offsets[0] != 0 or offsets[-1] != total or np.any(offsets[1:] < offsets[:-1]):
        raise ValueError(f"offsets must start at 0, never decrease and end at len(scores) = {total}")
    offsets = offsets.astype(np.int64)  # every entry is in 0..total now
    if ks.shape != (B,) or not np.issubdtype(ks.dtype, np.integer) or ks.dtype == np.bool_:
        raise ValueError(f"ks must hold one integer a request ({B}), got {ks!r}")
    for k in ks.tolist():
        check_k(k)
    if total > MAX_ITEMS:
        raise ValueError(f"at most {MAX_ITEMS} scores per call, got {total}")
    if config.path in ("filter", "scan"):
        raise ValueError(f"path {config.path!r} answers one request (topk_scores); topk_batch takes 'auto', "
                         "'batched' or 'unseeded'")
    unseeded = config.path == "unseeded"
    if unseeded and ks.max() > BLOCK_TOPK_MAX_K:
        raise ValueError(f"k={int(ks.max())}: path 'unseeded' runs the block top-K over the batch, which supports "
                         f"k <= {BLOCK_TOPK_MAX_K}; path 'auto' takes k <= {MAX_K}")
    block = check_block_topk_block(launch.check_block(block), ks.tolist())
    elig = None if eligible is None else _batch_bitset(eligible, offsets)
    host_ids = None if ids is None else check_ids(ids, offsets)
    d_scores = launch.to_device(scores)
    d_ids = None if ids is None else launch.to_device(ids)

    def rows(res, counts, which):
        """Requests ``which`` of a finished workspace as TopK (the count: eligible non-NaN scores,
        the same on every path)."""
        out_id, out_s = res.out_id.copy_to_host(), res.out_s.copy_to_host()
        return {r: TopK(ids=out_id[r, :ks[r]].copy(), scores=out_s[r, :ks[r]].copy(), count=int(counts[r, 0]))
                for r in which}

    def whole_batch_unseeded():
        ws = TopKWorkspace(offsets, ks, scan_lists(offsets, ks, block))
        launch_topk_batch(d_scores, ws, elig, d_ids, block=block, config=config)
        return ws

    if unseeded:
        ws = whole_batch_unseeded()
        return list(rows(ws, ws.counts.copy_to_host(), range(B)).values())
    fws = FilterWorkspace.batched(offsets, ks, config=config)
    launch_topk_batch_seeded(d_scores, fws, elig, d_ids, block, config=config)
    counts = fws.counts.copy_to_host()
    out = list(rows(fws, counts, range(B)).values())
    redo = np.flatnonzero(batch_outcomes(fws, counts) != "exact")
    if redo.size > config.tuning.rerun_one_by_one and ks.max() <= BLOCK_TOPK_MAX_K:
        for r, res in rows(whole_batch_unseeded(), counts, redo).items():
            out[r] = res
    else:
        for r in redo:
            a, b = int(offsets[r]), int(offsets[r + 1])
            own = None if elig is None else elig[r, :-(-(b - a) // WORD_BITS)]
            out[r] = topk_scores(d_scores[a:b], int(ks[r]), own, None if ids is None else host_ids[a:b], block,
                                 config=config)
    return out
