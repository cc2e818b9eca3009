"""Host wrappers of the block top-K kernels (topk/block.py)."""

from __future__ import annotations

import threading

import numpy as np

from ..device import launch
from ..model import TopK, all_unique
from ..targeting import WORD_BITS, bits_from_mask

#: Largest k of :func:`topk_scores`: its radix-select steps hold the answer, next_pow2(k) entries of
#: 8 bytes, in shared memory (32 KiB at 4096, within Numba's 48 KiB per block).
MAX_K = 4096
#: Largest k of the block top-K (scan path, batched form, unseeded fallback, fused scoring): its
#: shared buffer of next_pow2(k + block * items) entries of 8 bytes must fit in 48 KiB.
BLOCK_TOPK_MAX_K = 2048
#: Item counts are int32 slots inside the kernels.
MAX_ITEMS = 2**31 - 1
#: Threads of the one-block radix select (seed, filter path's final, merge's radix final): one block
#: does all of that work, so the more threads the fewer serial loads, histogram rounds and bitonic
#: compare-exchanges each (its kernels use 56 registers a thread: 1024 fit the register file).
RADIX_BLOCK = 1024


def radix_block() -> int:
    """Threads per block of the radix-select launches (:data:`RADIX_BLOCK`; the simulator's default
    block there, since it runs every thread as a Python thread)."""
    return launch.default_block() if launch.backend.is_simulator() else RADIX_BLOCK


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
    """A caller's ``block`` also runs the block top-K (a fallback of the seeded paths) for every k up
    to ``BLOCK_TOPK_MAX_K`` among ``ks``: its scan keeps ``next_pow2(k + 8 * block)`` entries of 8
    bytes in shared memory, at most 4,096 within Numba's 48 KiB. Returns ``block``.

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


#: entries of the block top-K's shared buffer that fit Numba's 48 KiB (8 bytes each, a power of two)
BLOCK_TOPK_BUFFER = 4096


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


#: Requests at most per batched call.
MAX_BATCH = 65535


#: each per-block list covers at least this many scores per unit of k: with fewer, the merge's bound
#: (the best per-list k-th score) is loose and ~k * lists entries survive into the final block
SCORES_PER_K = 32


def _blocks_per_request(max_n: int, batch: int, block: int, kmax: int, seeded: bool = False) -> int:
    from .block import SCAN_ITEMS

    # seeded, few scores pass the seed (about SEED_MARGIN * k in all), so the lists may be short and
    # the bound loose: one block per round of scores keeps a small request's scan one round deep
    per_list = block * SCAN_ITEMS if seeded else max(block * SCAN_ITEMS, SCORES_PER_K * kmax)
    need = max(1, -(-max_n // per_list))
    cap = launch.SIM_MAX_BLOCKS if launch.backend.is_simulator() else max(1, launch.sm_count() * 4 // batch)
    return min(need, cap)


class TopKWorkspace:
    """Device buffers for one top-K launch shape, reused across calls.

    Per call, the launch path then neither allocates nor copies host data to the device (both can
    stall the stream, and a serving system keeps such buffers anyway): counters are zeroed by a
    kernel. ``offsets`` (host int64 ``[batch + 1]``) and ``ks`` (host int64 ``[batch]``) are uploaded
    once; ``lists`` is the number of per-block lists per request.
    """

    def __init__(self, offsets, ks, lists: int):
        cuda = launch.cuda()
        self.offsets_host = np.asarray(offsets, np.int64)
        self.ks_host = np.asarray(ks, np.int64)
        self.batch, self.kmax, self.lists = len(self.ks_host), int(self.ks_host.max()), int(lists)
        if self.kmax > BLOCK_TOPK_MAX_K:
            raise ValueError(f"k={self.kmax}: the block top-K (batched form, scan path) supports k <= "
                             f"{BLOCK_TOPK_MAX_K} (its shared buffer must fit in 48 KiB); topk_scores answers "
                             f"one request up to k = {MAX_K} by radix select")
        b, m, kmax = self.batch, self.lists * self.kmax, self.kmax
        self.offsets = cuda.to_device(self.offsets_host)
        self.ks = cuda.to_device(self.ks_host)
        self.no_seeds = cuda.to_device(np.full(b, -np.inf, np.float32))
        self.cand_s = cuda.device_array((b, m), np.float32)
        self.cand_i = cuda.device_array((b, m), np.int32)
        self.counts = cuda.device_array((b, 2), np.int64)
        self.bound_s = cuda.device_array(b, np.float32)
        self.bound_i = cuda.device_array(b, np.int32)
        self.buf_s = cuda.device_array((b, m), np.float32)
        self.buf_i = cuda.device_array((b, m), np.int32)
        self.fill = cuda.device_array(b, np.int64)
        self.out_s = cuda.device_array((b, kmax), np.float32)
        self.out_slot = cuda.device_array((b, kmax), np.int32)
        self.out_id = cuda.device_array((b, kmax), np.int64)

    def reset(self) -> None:
        from .block import reset_kernel

        reset_kernel()[(1, self.batch), 32](self.counts, self.fill)


#: The final step of the merge: "radix" (radix select, then one sort of k: see
#: topk.block.final_radix_kernel) or "offer" (the block top-K over the compact buffer). Both are
#: exact and tested against the oracle. Radix measured faster on the H200 (data/results/topk.csv,
#: commit a6f74b2, 500,000 scores, k = 1000, 4,003 candidates: merge 116 -> 47 us, seeded call
#: 367 -> 264 us).
FINAL_MERGE = "radix"


def launch_merge_lists(ws: TopKWorkspace, ids=None, block: int | None = None, final: str | None = None):
    """Enqueue the merge of the workspace's per-block top-k lists (``ws.cand_s/cand_i``: each list
    sorted best first, slots local to the request's slice, -1 pads; entries past a request's k
    ignored) into each request's exact top-k, in ``ws.out_id`` / ``ws.out_s``.

    Steps: bound (the best of the lists' k-th keys, a lower bound of the answer's k-th), select (the
    entries at or above it into a compact buffer), final (one block's exact top-k of the buffer).
    ``ids``: device int64 (global) tie-break and output ids, or None (slots). ``final``: "offer" or
    "radix" (default :data:`FINAL_MERGE`).
    """
    from .block import (bound_kernel, buffer_capacity, final_kernel, final_radix_kernel, next_pow2,
                               select_kernel)

    final = final or FINAL_MERGE
    if final not in ("offer", "radix"):
        raise ValueError(f"final must be 'offer' or 'radix', got {final!r}")

    block = block or launch.default_block()
    batch, m = ws.batch, ws.lists * ws.kmax
    has_ids = ids is not None
    ids_arg = ids if has_ids else launch.dummy(np.int64)
    bound_kernel(block, has_ids)[(1, batch), block](ws.cand_s, ws.cand_i, ws.lists, ws.kmax, ws.ks, ws.offsets,
                                                    ids_arg, ws.bound_s, ws.bound_i)
    grid = max(1, min(-(-m // block), 64))
    select_kernel(has_ids)[(grid, batch), block](ws.cand_s, ws.cand_i, m, ws.kmax, ws.ks, ws.offsets, ids_arg,
                                                 ws.bound_s, ws.bound_i, ws.buf_s, ws.buf_i, ws.fill)
    # a request's radix select alone on an SM takes the wide block; past one request per SM, the
    # caller's block leaves room for several requests' blocks on each
    fblock = radix_block() if final == "radix" and batch <= launch.sm_count() else block
    kern = (final_radix_kernel(max(2, next_pow2(ws.kmax)), fblock, has_ids) if final == "radix"
            else final_kernel(buffer_capacity(ws.kmax, block), block, has_ids))
    kern[(1, batch), fblock](ws.buf_s, ws.buf_i, ws.fill, ws.offsets, ids_arg, ws.ks, ws.out_s, ws.out_slot, ws.out_id)


def scan_lists(offsets, ks, block: int | None = None, seeded: bool = False) -> int:
    """Per-block lists (blocks per request) the scan uses for this shape (``seeded``: a seed
    threshold will be passed, so more and shorter lists pay)."""
    block = block or launch.default_block()
    sizes = np.diff(np.asarray(offsets, np.int64))
    return _blocks_per_request(int(sizes.max()) if sizes.size else 1, len(ks), block, int(np.max(ks)), seeded)


def launch_topk_batch(d_scores, ws: TopKWorkspace, elig=None, d_ids=None, seeds=None, block: int | None = None):
    """Enqueue the batched block top-K into a workspace (no validation, no allocation, no host copy).

    Args:
        d_scores: device ``float32[total]``; request r owns ``scores[offsets[r]:offsets[r+1]]`` of
            ``ws`` (build it with ``TopKWorkspace(offsets, ks, scan_lists(offsets, ks))``);
        elig: device ``uint64[batch, words]`` per-request bitsets over their slices, or None;
        d_ids: device int64 ``[total]`` ids, or None (ids = positions within the slice);
        seeds: device float32 ``[batch]`` seed thresholds (-inf: none), or None.

    Results in ``ws.out_id [batch, kmax]``, ``ws.out_s``, ``ws.counts [batch, 2]`` (eligible
    non-NaN scores; those >= seed).
    """
    launch_scan(d_scores, ws, elig, d_ids, seeds, block)
    launch_merge_lists(ws, d_ids, block)


def launch_scan(d_scores, ws: TopKWorkspace, elig=None, d_ids=None, seeds=None, block: int | None = None):
    """Enqueue the counters' reset and the scan of :func:`launch_topk_batch` (its first half: per-block
    lists in ``ws.cand_s / cand_i``, counts in ``ws.counts``); :func:`launch_merge_lists` is the rest."""
    from .block import SCAN_ITEMS, buffer_capacity, scan_kernel

    block = block or launch.default_block()
    ws.reset()
    kern = scan_kernel(buffer_capacity(ws.kmax, block, SCAN_ITEMS), block, elig is not None, d_ids is not None)
    kern[(ws.lists, ws.batch), block](d_scores, ws.offsets, elig if elig is not None else launch.dummy2d(np.uint64),
                                      d_ids if d_ids is not None else launch.dummy(np.int64), ws.ks, ws.kmax,
                                      seeds if seeds is not None else ws.no_seeds, ws.cand_s, ws.cand_i, ws.counts)


#: Single requests at least this large get a seed threshold from a sample.
SEED_MIN_N = 1 << 16
SAMPLE_CHUNK = 256
#: 4,096 runs of 256: a 1 M-score sample (4 MB) at 10^8 scores, seed rank 27 for k = 1000
MAX_SAMPLE_CHUNKS = 4096
#: the seed aims at about this many scores per unit of k at or above it: few enough for the sort
#: final (topk.select.SORT_CAP) up to k ~ 1,600, enough that a seed above the k-th score (an
#: unseeded rerun) is rare: with seed rank r the kept count is about Gamma(r) * n / m, so r = 27
#: (10^8 scores, k = 1000) falls short of k with p ~ 1e-5
SEED_MARGIN = 2.5
#: the seed rank is at least this (a small k on a large array): the kept count's relative spread
#: is about 1 / sqrt(r)
SEED_MIN_RANK = 8
#: sample no more than a seed of about this rank needs: the sample is a gather of its own, and on
#: a small array a large one costs more than the pass it saves
SEED_SAMPLE_RANK = 64


def sample_positions(n: int, chunks: int) -> np.ndarray:
    """The positions a seed samples from ``n`` items: ``chunks`` contiguous runs of SAMPLE_CHUNK,
    each centred in one of ``chunks`` equal strata (the formula of
    :func:`~andromeda_nb.topk.select.seed_kernel`), as int32 ``[chunks * SAMPLE_CHUNK]``."""
    offs = (2 * np.arange(chunks, dtype=np.int64) + 1) * n // (2 * chunks) - SAMPLE_CHUNK // 2
    return (offs[:, None] + np.arange(SAMPLE_CHUNK, dtype=np.int64)[None, :]).ravel().astype(np.int32)


def seed_block() -> int:
    """Threads per block of the seed launch (topk.select.SEED_BLOCK on a GPU, the simulator's
    default block there)."""
    from .select import SEED_BLOCK

    return launch.default_block() if launch.backend.is_simulator() else SEED_BLOCK


class SeedWorkspace:
    """Buffers of :func:`launch_seed` for arrays of n scores and top-k (``make`` returns None where
    no seed pays): a sample of ``chunks`` contiguous runs of SAMPLE_CHUNK scores (at most n / 8,
    at most MAX_SAMPLE_CHUNKS runs, no more than a seed of rank ~SEED_SAMPLE_RANK needs), the seed
    rank ``r`` (about ``SEED_MARGIN * k`` of the n scores reach the r-th best sample; r at least
    SEED_MIN_RANK), the candidate keys and control words of
    :func:`~andromeda_nb.topk.select.seed_kernel` (zero between calls: its last block re-zeroes
    them) and the seed (device ``float32[1]``)."""

    @classmethod
    def make(cls, n: int, k: int):
        from .select import CAND_CAP, CTL_SIZE

        if n < SEED_MIN_N or k < 1:
            return None
        enough = int(np.ceil(SEED_SAMPLE_RANK * n / (SEED_MARGIN * k * SAMPLE_CHUNK)))
        chunks = int(min(MAX_SAMPLE_CHUNKS, n // 8 // SAMPLE_CHUNK, enough))
        m = chunks * SAMPLE_CHUNK
        r = max(SEED_MIN_RANK, int(np.ceil(SEED_MARGIN * k * m / n)))
        if chunks < 2 or r > m // 4:
            return None
        self = cls()
        cuda = launch.cuda()
        self.r, self.m, self.chunks = r, m, chunks
        self.sample_flat = cuda.device_array(m, np.float32)
        self.cand = cuda.device_array(CAND_CAP, np.uint32)
        self.ctl = cuda.to_device(np.zeros(CTL_SIZE, np.uint32))
        self.seeds = cuda.to_device(np.full(1, -np.inf, np.float32))
        return self

    def seed(self):
        """The seed :func:`launch_seed` leaves (device ``float32[1]``, read in place)."""
        return self.seeds


def _launch_seed_kernel(sws: SeedWorkspace, gather: bool, d_scores, n: int, elig=None, reset=None) -> None:
    from .select import SEED_PER_THREAD, seed_kernel

    sb = seed_block()
    grid = -(-sws.m // (sb * SEED_PER_THREAD))
    seed_kernel(sb, SAMPLE_CHUNK, gather, elig is not None, reset is not None)[grid, sb](
        d_scores, n, sws.chunks, sws.sample_flat, elig if elig is not None else launch.dummy(np.uint64), sws.r,
        sws.cand, sws.ctl, sws.seeds, reset.counts if reset is not None else launch.dummy2d(np.int64),
        reset.fill if reset is not None else launch.dummy(np.int64))


def launch_seed(d_scores, n: int, sws: SeedWorkspace, elig=None, reset=None):
    """Enqueue a seed threshold for one request's top-k, one launch
    (:func:`~andromeda_nb.topk.select.seed_kernel`): a stratified sample of contiguous chunks
    (NaN, and ineligible scores when ``elig``, a device uint64 bitset, is given, sampled as -inf:
    they never seed), and the lower edge of the 24-bit key prefix of its r-th best, so at least r
    samples, and about ``r * n / m`` scores of the array, reach it. ``reset``: a
    :class:`FilterWorkspace` whose counters the launch zeroes on the way. The launch runs
    :func:`seed_block` threads. Returns device ``float32[1]``."""
    _launch_seed_kernel(sws, True, d_scores, n, elig, reset)
    return sws.seed()


def launch_seed_select(sws: SeedWorkspace):
    """Enqueue the seed of :func:`launch_seed` on a sample already in ``sws.sample_flat`` (NaN and
    -inf never seed; fused scoring writes its sample there), one launch. Returns the seed, device
    ``float32[1]`` (-inf when fewer than r samples are real scores)."""
    _launch_seed_kernel(sws, False, launch.dummy(np.float32), 0)
    return sws.seed()


#: How a seeded single request is answered: "filter" (one pass appends the scores at or above the
#: seed to a compact buffer, then one block's sort or radix select: two launches after the seed) or
#: "scan" (per-block top-k lists behind the seed, then bound / select / final: five launches). Both exact.
SEEDED_PATH = "filter"
#: the filter's buffer holds this many entries per unit of k (at least FILTER_MIN_CAP). A fuller
#: buffer than this means the seed was low (on sorted input the stratified sample's r-th best lies
#: in its top chunk): the call reruns on the seeded scan path, which takes any number of scores
#: above the seed.
FILTER_CAP_PER_K = 64
FILTER_MIN_CAP = 4096


class FilterWorkspace:
    """Device buffers of the "filter" path for one request of n scores and top-k
    (:func:`launch_filtered`), or, built by :meth:`batched`, for a batch of requests
    (:func:`launch_topk_batch_seeded`); results in the same attributes as :class:`TopKWorkspace`
    (``out_id``, ``out_s``, ``out_slot`` ``[batch, kmax]``; ``counts [batch, 2]``)."""

    def __init__(self, n: int, k: int, cap: int | None = None):
        cap = max(1, int(cap)) if cap is not None else max(FILTER_MIN_CAP, FILTER_CAP_PER_K * int(k))
        self._alloc(np.array([0, int(n)], np.int64), np.array([int(k)], np.int64), cap)

    @classmethod
    def batched(cls, offsets, ks, cap: int | None = None) -> "FilterWorkspace":
        """Buffers for a batch (host int64 ``offsets [batch + 1]``, ``ks [batch]``): ``cap``
        candidates a request, default :func:`batch_filter_cap`."""
        self = cls.__new__(cls)
        offsets, ks = np.asarray(offsets, np.int64), np.asarray(ks, np.int64)
        self._alloc(offsets, ks, batch_filter_cap(offsets, ks) if cap is None else max(1, int(cap)))
        self.seeds = launch.cuda().to_device(np.full(self.batch, -np.inf, np.float32))  # the batch seed's
        return self

    def _alloc(self, offsets, ks, cap: int) -> None:
        cuda = launch.cuda()
        self.offsets_host, self.ks_host = offsets, ks
        self.batch, self.kmax, self.cap = len(ks), int(ks.max()), cap
        b = self.batch
        self.buf_s = cuda.device_array((b, cap), np.float32)
        self.buf_i = cuda.device_array((b, cap), np.int32)
        self.fill = cuda.device_array(b, np.int64)
        self.counts = cuda.device_array((b, 2), np.int64)
        self.offsets = cuda.to_device(offsets)
        self.ks = cuda.to_device(ks)
        self.out_s = cuda.device_array((b, self.kmax), np.float32)
        self.out_slot = cuda.device_array((b, self.kmax), np.int32)
        self.out_id = cuda.device_array((b, self.kmax), np.int64)

    def reset(self) -> None:
        from .block import reset_kernel

        reset_kernel()[(1, self.batch), 32](self.counts, self.fill)


def launch_filtered(d_scores, n: int, k: int, fws: FilterWorkspace, sws: SeedWorkspace, elig=None, d_ids=None,
                    block: int | None = None) -> FilterWorkspace:
    """Enqueue the "filter" path of one seeded request: seed (:func:`launch_seed`, whose sample
    launch also zeroes the counters), one pass keeping the eligible scores at or above it
    (:func:`~andromeda_nb.topk.select.filter_kernel`), and the top-k among them
    (:func:`launch_final`). Exact when at least ``min(k, eligible)`` and at most ``fws.cap``
    scores reached the seed (``fws.counts[0, 1]``); see :func:`seeded_exact`. ``elig``: device
    uint64 ``[words]`` bitset or None."""
    block = block or launch.default_block()
    seed = launch_seed(d_scores, n, sws, elig, reset=fws)  # its sample kernel zeroes fws's counters
    return launch_filter_final(d_scores, n, k, fws, seed, elig, d_ids, block)


def launch_filter_final(d_scores, n: int, k: int, fws: FilterWorkspace, seed, elig=None, d_ids=None,
                        block: int | None = None) -> FilterWorkspace:
    """Enqueue the filter pass at device threshold ``seed`` (``float32[1]``; -inf keeps every eligible
    score) and the top-k among the kept scores (:func:`launch_final`), into ``fws`` (counters
    reset by the caller). ``block``: the filter's threads per block."""
    launch_filter(d_scores, fws, seed, elig, block)
    return launch_final(k, fws, d_ids)


def word_view(d_scores, n: int):
    """``(head, words)``: ``d_scores[head : head + 2 * len(words)]`` as uint64 words (8-byte loads
    of two scores), ``head`` = 1 when the array starts 4 bytes past an 8-byte boundary (a slice)."""
    head = 1 if n and launch.address(d_scores) % 8 else 0
    body = max(0, n - head) // 2 * 2
    return head, d_scores[head:head + body].view(np.uint64)


#: rounds of 8-byte loads a block of the batched filter takes (grid-stride) before it exits: one
#: block a request up to 65,536 scores (H200, 1,024 x 50,000 scores: 4 rounds 69 us, 13 65 us)
BATCH_FILTER_ROUNDS = 16


def launch_filter(d_scores, fws: FilterWorkspace, seed, elig=None, block: int | None = None,
                  rounds: int | None = None) -> None:
    """Enqueue the filter pass alone (:func:`~andromeda_nb.topk.select.filter_kernel`): each
    request's eligible scores at or above its seed (``seed`` device ``float32[batch]``) appended
    to its row of ``fws``'s buffer. ``elig``: device uint64 ``[words]`` (one request) or ``[batch,
    words]``, or None. One request: a grid filling the GPU (grid-stride); a batch: blocks of
    ``rounds`` rounds each (default :data:`BATCH_FILTER_ROUNDS`) over each request's slice."""
    from .select import FILTER_LOADS, filter_kernel

    block = block or launch.default_block()
    total = int(fws.offsets_host[-1])
    head, words = word_view(d_scores, total)
    if fws.batch == 1:
        grid = (launch.grid_for(-(-words.shape[0] // FILTER_LOADS), block, blocks_per_sm=8), 1)
    else:
        longest = int(np.diff(fws.offsets_host).max()) // 2 + 1
        grid = (max(1, -(-longest // (block * FILTER_LOADS * (rounds or BATCH_FILTER_ROUNDS)))), fws.batch)
    if elig is not None and elig.ndim == 1:
        elig = elig.reshape(1, elig.shape[0])
    filter_kernel(block, elig is not None)[grid, block](
        words, d_scores, head, fws.offsets, elig if elig is not None else launch.dummy2d(np.uint64), seed,
        fws.buf_s, fws.buf_i, fws.fill, fws.counts)


#: threads of the sort final's blocks (a request each): about half the ~2.5 k candidates padded
#: to a power of two, a compare-exchange a thread a step
SORT_BLOCK = 128
#: the sort final's steps of stride <= 32 end with warp barriers (topk.select._sort_funcs); off
#: until timed on the GPU (bench topk, batch phase: the sort stage with and without)
SORT_WARP_SYNC = False
#: the rank final's candidate limit in the simulator (topk.select.RANK_CAP on a GPU)
SIM_RANK_CAP = 512


def launch_final(k: int, fws: FilterWorkspace, d_ids=None, block: int | None = None,
                 d_scores=None) -> FilterWorkspace:
    """Enqueue each request's top-k of ``fws``'s buffer into its outputs: by counting each
    candidate's place over many blocks when the buffer holds at most
    :data:`~andromeda_nb.topk.select.RANK_CAP` entries
    (:func:`~andromeda_nb.topk.select.final_rank_kernel`), else by one block's radix select
    (:func:`~andromeda_nb.topk.block.final_radix_kernel`, ``block`` threads, default
    :func:`radix_block`; launched after the rank final only when the buffer can hold more than
    it takes, it exits when that answered). ``k``: the largest k of the batch. A batch whose
    buffer holds at most :data:`~andromeda_nb.topk.select.SORT_CAP` candidates a request, given
    its ``d_scores``, is answered by a block a request sorting them
    (:func:`~andromeda_nb.topk.select.final_sort_kernel`) instead."""
    from . import select
    from .select import RANK_BLOCK, SORT_CAP, final_rank_kernel, final_sort_kernel
    from .block import final_radix_kernel, next_pow2

    block = block or radix_block()
    has_ids = d_ids is not None
    ids = d_ids if has_ids else launch.dummy(np.int64)
    args = (fws.buf_s, fws.buf_i, fws.fill, fws.offsets, ids, fws.ks, fws.out_s, fws.out_slot, fws.out_id)
    if d_scores is not None and fws.batch > 1 and fws.cap <= SORT_CAP:  # a block a request sorts
        sb = launch.default_block() if launch.backend.is_simulator() else SORT_BLOCK
        final_sort_kernel(sb, has_ids, max(2, next_pow2(fws.cap)), SORT_WARP_SYNC)[(1, fws.batch), sb](d_scores, *args)
        return fws
    if launch.backend.is_simulator():
        # a thread a candidate and at most SIM_RANK_CAP of them: the simulator runs every barrier of
        # every tile and round in Python (2,000 candidates took seconds); the radix select above
        rb, split, cap = launch.default_block(), 1, min(select.RANK_CAP, SIM_RANK_CAP)
    else:
        rb, split, cap = RANK_BLOCK, select.RANK_SPLIT, select.RANK_CAP
    per_block = rb // split
    if fws.batch == 1:  # one pass over the most candidates it takes
        grid = launch.grid_for(cap, per_block, 1 << 20)
    else:  # one pass over about twice the candidates a seed aims at; more take more rounds
        grid = max(1, min(-(-cap // per_block), -(-int(2 * SEED_MARGIN * fws.kmax) // per_block)))
    final_rank_kernel(rb, has_ids, cap, split)[(grid, fws.batch), rb](*args)
    if fws.cap > cap:
        final_radix_kernel(max(2, next_pow2(k)), block, has_ids, skip_upto=cap)[(1, fws.batch), block](*args)
    return fws


def batch_seed_shape() -> tuple[int, int]:
    """(threads, samples a thread) of the batched seed: topk.select.BATCH_SEED_BLOCK x
    BATCH_SEED_PER_THREAD on a GPU (4,096 samples a request); the simulator's default block x the
    same samples a thread."""
    from .select import BATCH_SEED_BLOCK, BATCH_SEED_PER_THREAD

    blk = launch.default_block() if launch.backend.is_simulator() else BATCH_SEED_BLOCK
    return blk, BATCH_SEED_PER_THREAD


#: the batched path's candidate buffer holds at least this many a request
BATCH_MIN_CAP = 1024


def batch_filter_cap(offsets, ks) -> int:
    """Candidates a request the batched seeded path buffers: four times what its seed aims at
    (``SEED_MARGIN * k``, or SEED_MIN_RANK samples' worth of the longest request), at least
    BATCH_MIN_CAP, at most what the rank final takes (topk.select.RANK_CAP) and what the
    longest request holds. Up to topk.select.SORT_CAP (k up to ~200) the sort final answers."""
    from .select import RANK_CAP

    blk, per = batch_seed_shape()
    longest = int(np.diff(np.asarray(offsets, np.int64)).max(initial=0))
    aim = max(SEED_MARGIN * int(np.max(ks)), SEED_MIN_RANK * longest / (blk * per))
    return int(max(1, min(RANK_CAP, longest, max(BATCH_MIN_CAP, 4 * aim))))


def launch_topk_batch_seeded(d_scores, fws: FilterWorkspace, elig=None, d_ids=None, block: int | None = None,
                             rounds: int | None = None) -> FilterWorkspace:
    """Enqueue the seeded batched top-K (no validation, no allocation, no host copy), three launches:
    a block a request seeds a threshold from a sample of its scores and zeroes its counters
    (:func:`~andromeda_nb.topk.select.batch_seed_kernel`), one filter pass over the batch keeps
    each request's eligible scores at or above its seed (:func:`launch_filter`), and the final
    orders each request's kept scores (:func:`launch_final`: a block a request sorting them).

    One launch doing all three in a block a request was slower on the H200 (121 us against 110 us
    for 1,024 requests of 50,000 scores, k = 100; data/results/topk_diagnostics.md): all blocks
    seed, stream and sort in step, so the sorts overlap no streaming.

    Args:
        d_scores: device ``float32[total]``; request r owns ``scores[offsets[r]:offsets[r+1]]`` of
            ``fws`` (:meth:`FilterWorkspace.batched`);
        elig: device ``uint64[batch, words]`` per-request bitsets over their slices, or None;
        d_ids: device int64 ``[total]`` ids, or None (ids = positions within the slice).

    Results in ``fws.out_id [batch, kmax]``, ``fws.out_s``, ``fws.counts [batch, 2]`` (eligible
    non-NaN scores; those at or above the seed). A request's answer is exact unless
    :func:`batch_outcomes` says otherwise (its seed above its k-th score, or more kept scores
    than ``fws.cap``): :func:`topk_batch` reruns those."""
    from .select import BATCH_SAMPLE_CHUNK, batch_seed_kernel

    blk, per = batch_seed_shape()
    has_elig = elig is not None
    # a lone request's seed by the threads' best keys (topk.select.batch_seed_kernel: its latency)
    batch_seed_kernel(blk, per, BATCH_SAMPLE_CHUNK, has_elig, int(2 * SEED_MARGIN), SEED_MIN_RANK,
                      fws.batch == 1)[fws.batch, blk](
        d_scores, fws.offsets, fws.ks, elig if has_elig else launch.dummy2d(np.uint64), fws.seeds, fws.counts,
        fws.fill)
    launch_filter(d_scores, fws, fws.seeds, elig, block, rounds)
    return launch_final(fws.kmax, fws, d_ids, d_scores=d_scores)


def batch_outcomes(fws: FilterWorkspace, counts=None) -> np.ndarray:
    """Per request of a seeded batch (host ``counts int64[batch, 2]``, copied from ``fws`` when not
    given): "exact", "seed_high" (fewer than ``min(k, eligible)`` scores reached the seed) or
    "overflow" (more than ``fws.cap`` did), as a str array ``[batch]``."""
    c = fws.counts.copy_to_host() if counts is None else np.asarray(counts)
    out = np.full(len(c), "exact", dtype=object)
    out[c[:, 1] < np.minimum(fws.ks_host, c[:, 0])] = "seed_high"
    out[c[:, 1] > fws.cap] = "overflow"
    return out


def _result(res, counts) -> TopK:
    """The host :class:`TopK` of a finished single-request workspace (any path)."""
    return TopK(ids=res.out_id[0].copy_to_host(), scores=res.out_s[0].copy_to_host(), count=int(counts[0]))


def seeded_outcome(res, k: int, counts=None) -> str:
    """How a seeded call ended, from its counts (host ``int64[2]``: eligible non-NaN scores, those
    at or above the seed; copied from ``res.counts[0]`` when not given): "exact"; "seed_high"
    (fewer than ``min(k, eligible)`` scores reached the seed: rerun unseeded); or "overflow" (on
    the filter path, more scores reached it than its buffer holds: the seed is valid, rerun on a
    path that takes any number above it)."""
    c = res.counts.copy_to_host()[0] if counts is None else counts
    if c[1] < min(k, c[0]):
        return "seed_high"
    if isinstance(res, FilterWorkspace) and c[1] > res.cap:
        return "overflow"
    return "exact"


def seeded_exact(res, k: int, counts=None) -> bool:
    """Whether a seeded call's answer is exact (:func:`seeded_outcome` is "exact")."""
    return seeded_outcome(res, k, counts) == "exact"


#: :func:`topk_scores` answers a request of SEED_MIN_N up to this many scores (L2-resident right
#: after scoring) by the batched seeded path on a batch of one: its seed is one block's 4,096-score
#: sample (the single-request seed's multi-block sample and merge took 18 us of 37 at 500,000
#: scores, k = 1000, on the H200; the batched path 24 us in all, commit e80b90f)
SMALL_MAX_N = 1 << 20
#: the one-launch path (:func:`launch_onelaunch`) takes at most this many scores
ONELAUNCH_MAX_N = 1 << 20
#: its last block's sort ends steps of stride <= 32 with warp barriers (off until timed)
ONELAUNCH_WARP_SYNC = False


def onelaunch_shape() -> tuple[int, int, int]:
    """(threads a block, samples a thread, scores a thread) of the one-launch path:
    topk.onelaunch.ONELAUNCH_BLOCK x ONELAUNCH_SAMPLES x ONELAUNCH_SCORES on a GPU (a 8,192-
    score sample; a block covers 8,192 scores), the simulator's default block there."""
    from .onelaunch import ONELAUNCH_BLOCK, ONELAUNCH_SAMPLES, ONELAUNCH_SCORES

    blk = launch.default_block() if launch.backend.is_simulator() else ONELAUNCH_BLOCK
    return blk, ONELAUNCH_SAMPLES, ONELAUNCH_SCORES


class OneLaunchWorkspace(FilterWorkspace):
    """Device buffers of the one-launch path (:func:`launch_onelaunch`) for one request of n scores
    and top-k, or None from :meth:`make` where it does not apply: fewer than twice its sample
    (``block * samples`` scores) or more than :data:`ONELAUNCH_MAX_N` scores, or a k whose aimed
    candidates (``SEED_MARGIN * k``, kept to 5/8 of the sort's ``ONELAUNCH_CAP``: an overflow
    means a rerun) do not fit. Results and counts as :class:`FilterWorkspace` (``cap`` =
    ONELAUNCH_CAP, so :func:`seeded_outcome` applies); ``r`` is the seed's rank in the sample."""

    @classmethod
    def make(cls, n: int, k: int):
        from .onelaunch import ACC_SIZE, ONELAUNCH_CAP

        blk, samples, _ = onelaunch_shape()
        m = blk * samples
        if n < 2 * m or n > ONELAUNCH_MAX_N or k < 1 or SEED_MARGIN * k > ONELAUNCH_CAP * 5 // 8:
            return None
        r = max(SEED_MIN_RANK, int(np.ceil(SEED_MARGIN * k * m / n)))
        if r > m // 4:
            return None
        self = cls(n, k, cap=ONELAUNCH_CAP)
        cuda = launch.cuda()
        self.n, self.r, self.m = n, r, m
        self.acc = cuda.to_device(np.zeros(ACC_SIZE, np.int64))
        self.ticket = cuda.to_device(np.zeros(1, np.uint32))
        return self


#: batch-of-one workspaces topk_scores keeps a thread, by (n, k), for its CUDA context: a fresh one took ~10 device
#: allocations and copies a call (H200, 500,000 scores, k = 1000: 1.35 ms host wall time a call)
SMALL_WORKSPACES = 8
_small_cache = threading.local()


def _small_workspace(n: int, k: int) -> FilterWorkspace:
    """The batch-of-one :class:`FilterWorkspace` for (n, k) of this thread (its counters are zeroed
    by every call's seed launch; its results are copied out before the next call reuses it)."""
    cache = getattr(_small_cache, "ws", None)
    if cache is None:
        cache = _small_cache.ws = {}
    # a workspace belongs to the CUDA context it was made in (the simulator has one, and hands out a
    # new stand-in object each call)
    ctx = None if launch.backend.is_simulator() else launch.cuda().current_context()
    made_in, fws = cache.pop((n, k), (None, None))
    if fws is None or made_in is not ctx:
        fws = FilterWorkspace.batched(np.array([0, n], np.int64), np.array([k], np.int64))
        while len(cache) >= SMALL_WORKSPACES:
            cache.pop(next(iter(cache)))  # the least recently used
    cache[(n, k)] = (ctx, fws)
    return fws


def launch_onelaunch(d_scores, n: int, k: int, olw: OneLaunchWorkspace, elig=None) -> OneLaunchWorkspace:
    """Enqueue one request's top-k in one launch
    (:func:`~andromeda_nb.topk.onelaunch.onelaunch_topk_kernel`: every block seeds from the
    same sample, filters its share, and the last block sorts the kept scores). No validation, no
    allocation, no host copy. Exact unless :func:`seeded_outcome` says otherwise (a seed above
    the k-th score, or more kept scores than ``olw.cap``). ``elig``: device uint64 ``[words]`` or
    None. Ids are positions."""
    from .onelaunch import onelaunch_topk_kernel

    if n != olw.n or not 1 <= k <= olw.kmax:  # its sample positions and rank are n's, its outputs kmax wide
        raise ValueError(f"a one-launch workspace for n = {olw.n}, k <= {olw.kmax}, got n = {n}, k = {k}")
    blk, samples, per = onelaunch_shape()
    grid = -(-n // (blk * per))
    onelaunch_topk_kernel(blk, samples, per, elig is not None, olw.cap, ONELAUNCH_WARP_SYNC)[grid, blk](
        d_scores[:n], elig if elig is not None else launch.dummy(np.uint64), olw.r, k, olw.buf_s[0],
        olw.buf_i[0], olw.acc, olw.ticket, olw.counts, olw.out_s, olw.out_slot, olw.out_id)
    return olw


def launch_topk(d_scores, n: int, k: int, elig=None, d_ids=None, block: int | None = None,
                seeded: bool = False, ws: TopKWorkspace | None = None, sws: SeedWorkspace | None = None,
                fws: FilterWorkspace | None = None, path: str | None = None):
    """Enqueue top-K over one device score array (no validation, no host copies when the
    workspaces are given). A seeded call takes :data:`SEEDED_PATH` (or ``path``): "filter" uses
    ``fws``, "scan" uses ``ws``; an unseeded one the block top-K in ``ws``.

    Returns:
        the workspace holding the results (``.out_id[0]``, ``.out_s[0]``, ``.counts[0]``), and the
        seed workspace used (None when unseeded). Check a seeded call with :func:`seeded_exact`.
    """
    if seeded:
        sws = sws or SeedWorkspace.make(n, k)
        path = path or SEEDED_PATH
        if path not in ("filter", "scan"):
            raise ValueError(f"path must be 'filter' or 'scan', got {path!r}")
        if sws is not None and path == "filter":
            fws = fws or FilterWorkspace(n, k)
            return launch_filtered(d_scores, n, k, fws, sws, elig, d_ids, block), sws
    if ws is None:
        offsets, ks = np.array([0, n], np.int64), np.array([k], np.int64)
        ws = TopKWorkspace(offsets, ks, scan_lists(offsets, ks, block, seeded=sws is not None and seeded))
    seeds = None
    if seeded:
        if sws is not None:
            seeds = launch_seed(d_scores, n, sws, elig)
    else:
        sws = None
    elig2 = None if elig is None else elig.reshape(1, elig.shape[0])
    launch_topk_batch(d_scores, ws, elig2, d_ids, seeds, block)
    return ws, sws


def topk_scores(scores, k: int, eligible=None, ids=None, block: int | None = None, seeded: bool = True) -> TopK:
    """Exact top-k of a score array on the device: a seed threshold from a sample, one pass keeping
    the scores at or above it, and the top-k of those (or, for small or unseeded calls, the block
    top-K and a merge on the device).

    Contract (DESIGN.md): score descending, ties to the lower id, NaN never selected, fewer than k
    candidates padded with id -1 and score -inf.

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
        seeded: for large arrays, seed a threshold from a sample of the (eligible) scores and
            answer by :data:`SEEDED_PATH` (default "filter": one pass keeps the scores at or above
            the seed, one block's radix select picks the top-k). A request of
            :data:`SEED_MIN_N` to :data:`SMALL_MAX_N` scores takes the batched seeded path
            first (:func:`launch_topk_batch_seeded` on a batch of one: a one-block seed). Exact
            either way: a seed above the k-th score, or one letting more scores through than the
            buffer holds, triggers a rerun (the batched path's on the single-request path, that
            one's unseeded or on the scan path).

    Returns:
        :class:`~andromeda_nb.model.TopK` with host arrays and the count of eligible non-NaN scores.

    Raises:
        TypeError / ValueError: bad dtype, shape, contiguity, k, block, or ids (negative or repeated),
            before any launch.
    """

    k = check_k(k)
    launch.check_array("scores", scores, np.float32, ndim=1)
    n = int(scores.shape[0])
    if n > MAX_ITEMS:
        raise ValueError(f"at most {MAX_ITEMS} scores per call, got {n}")
    block = check_block_topk_block(launch.check_block(block), [k])
    if ids is not None:
        check_ids(ids, np.array([0, n]))
    elig = None if eligible is None else eligible_bitset(eligible, n)
    d_ids = None if ids is None else launch.to_device(ids)
    d_scores = launch.to_device(scores)
    if k > BLOCK_TOPK_MAX_K:
        return _topk_beyond_block(d_scores, n, k, elig, d_ids, block, seeded)
    if seeded and SEED_MIN_N <= n <= SMALL_MAX_N:  # the batched seeded path, a batch of one
        fws = _small_workspace(n, k)
        launch_topk_batch_seeded(d_scores, fws, None if elig is None else elig.reshape(1, elig.shape[0]), d_ids,
                                 block)
        c = fws.counts.copy_to_host()
        if batch_outcomes(fws, c)[0] == "exact":
            return _result(fws, c[0])
    ws, sws = launch_topk(d_scores, n, k, elig, d_ids, block, seeded=seeded)
    c = ws.counts.copy_to_host()[0]
    outcome = "exact" if sws is None else seeded_outcome(ws, k, c)
    if outcome == "seed_high":
        ws, _ = launch_topk(d_scores, n, k, elig, d_ids, block, seeded=False)
        c = ws.counts.copy_to_host()[0]
    elif outcome == "overflow":  # the seed is valid: the seeded scan path takes any number above it
        ws, _ = launch_topk(d_scores, n, k, elig, d_ids, block, seeded=True, sws=sws, path="scan")
        c = ws.counts.copy_to_host()[0]
    return _result(ws, c)


def topk_batch(scores, offsets, ks, eligible=None, ids=None, block: int | None = None) -> list[TopK]:
    """Exact top-k of many requests at once: request ``r`` owns ``scores[offsets[r]:offsets[r+1]]``
    and its own ``ks[r]``; the contract of :func:`topk_scores` per request.

    One launch set for the batch (:func:`launch_topk_batch_seeded`: a seed a request from a sample,
    one filter pass, a block a request sorting its kept scores; the rank final for k above ~200). The few requests it cannot answer exactly (a seed above the
    k-th score, or more kept scores than the buffer holds: ties, sorted input, requests of
    millions of scores) are rerun: one by one by :func:`topk_scores`, or, past
    :data:`RERUN_ONE_BY_ONE` of them, the whole batch by the unseeded block top-K (k <=
    ``BLOCK_TOPK_MAX_K``).

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

    Returns:
        one :class:`~andromeda_nb.model.TopK` per request (host arrays of length ``ks[r]``).

    Raises:
        TypeError / ValueError: bad dtype, shape, contiguity, offsets, k, block, mask or ids,
            before any launch.
    """
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
    block = check_block_topk_block(launch.check_block(block), ks.tolist())
    elig = None if eligible is None else _batch_bitset(eligible, offsets)
    host_ids = None if ids is None else check_ids(ids, offsets)
    d_scores = launch.to_device(scores)
    d_ids = None if ids is None else launch.to_device(ids)
    fws = FilterWorkspace.batched(offsets, ks)
    launch_topk_batch_seeded(d_scores, fws, elig, d_ids, block)
    counts = fws.counts.copy_to_host()

    def rows(res, which):
        """Requests ``which`` of a finished workspace as TopK (the count: eligible non-NaN scores,
        the same on every path)."""
        out_id, out_s = res.out_id.copy_to_host(), res.out_s.copy_to_host()
        return {r: TopK(ids=out_id[r, :ks[r]].copy(), scores=out_s[r, :ks[r]].copy(), count=int(counts[r, 0]))
                for r in which}

    out = list(rows(fws, range(B)).values())
    redo = np.flatnonzero(batch_outcomes(fws, counts) != "exact")
    if redo.size > RERUN_ONE_BY_ONE and ks.max() <= BLOCK_TOPK_MAX_K:
        ws = TopKWorkspace(offsets, ks, scan_lists(offsets, ks, block))
        launch_topk_batch(d_scores, ws, elig, d_ids, block=block)
        for r, res in rows(ws, redo).items():
            out[r] = res
    else:
        for r in redo:
            a, b = int(offsets[r]), int(offsets[r + 1])
            own = None if elig is None else elig[r, :-(-(b - a) // WORD_BITS)]
            out[r] = topk_scores(d_scores[a:b], int(ks[r]), own, None if ids is None else host_ids[a:b], block)
    return out


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


#: a seeded batch reruns up to this many requests one by one (topk_scores); more, the whole batch at
#: once by the unseeded block top-K
RERUN_ONE_BY_ONE = 8


def _topk_beyond_block(d_scores, n: int, k: int, elig, d_ids, block, seeded: bool) -> TopK:
    """k above the block top-K's limit: the seeded filter path when it answers exactly; otherwise
    (no seed for this size, a seed above the k-th score, or an overflowing buffer) one filter pass
    with no threshold, which keeps every eligible score, and one block's radix select over all of
    them: exact at any size, but one block reads all n scores four times (slow for large n)."""
    sws = SeedWorkspace.make(n, k) if seeded else None
    if sws is not None:
        fws = launch_filtered(d_scores, n, k, FilterWorkspace(n, k), sws, elig, d_ids, block)
        c = fws.counts.copy_to_host()[0]
        if seeded_exact(fws, k, c):
            return _result(fws, c)
    fws = FilterWorkspace(n, k, cap=n)
    fws.reset()
    no_seed = launch.cuda().to_device(np.full(1, -np.inf, np.float32))
    launch_filter_final(d_scores, n, k, fws, no_seed, elig, d_ids, block)
    c = fws.counts.copy_to_host()[0]
    return _result(fws, c)
