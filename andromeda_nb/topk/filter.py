"""The filter pass, host side, and the "filter" path of one seeded request: seed
(:mod:`~andromeda_nb.topk.seed`), one pass keeping the eligible scores at or above it in a compact
buffer (:func:`~andromeda_nb.topk.filter_kernels.filter_kernel`), and the top-k among them
(:func:`~andromeda_nb.topk.final.launch_final`): three launches.

The batched path (:mod:`~andromeda_nb.topk.batched`) runs the same pass over a batch, a grid row a
request. Importing this module does not import numba.
"""

from __future__ import annotations

import numpy as np

from ..device import launch
from .config import TopKConfig, check_config
from .final import launch_final
from .seed import SeedWorkspace, launch_seed


class FilterWorkspace:
    """Device buffers of the "filter" path for one request of n scores and top-k
    (:func:`launch_filtered`), or, built by :meth:`batched`, for a batch of requests
    (:func:`~andromeda_nb.topk.batched.launch_topk_batch_seeded`); results in the same attributes
    as :class:`~andromeda_nb.topk.scan.TopKWorkspace` (``out_id``, ``out_s``, ``out_slot``
    ``[batch, kmax]``; ``counts [batch, 2]``). ``cap``: candidates a request the buffer holds
    (default ``max(filter_min_cap, filter_cap_per_k * k)`` of ``config.tuning``)."""

    def __init__(self, n: int, k: int, cap: int | None = None, *, config: TopKConfig | None = None):
        t = check_config(config).tuning
        cap = max(1, int(cap)) if cap is not None else max(t.filter_min_cap, t.filter_cap_per_k * int(k))
        self._alloc(np.array([0, int(n)], np.int64), np.array([int(k)], np.int64), cap)

    @classmethod
    def batched(cls, offsets, ks, cap: int | None = None, *, config: TopKConfig | None = None) -> "FilterWorkspace":
        """Buffers for a batch (host int64 ``offsets [batch + 1]``, ``ks [batch]``): ``cap``
        candidates a request, default :func:`~andromeda_nb.topk.batched.batch_filter_cap`."""
        from .batched import batch_filter_cap

        self = cls.__new__(cls)
        offsets, ks = np.asarray(offsets, np.int64), np.asarray(ks, np.int64)
        self._alloc(offsets, ks, batch_filter_cap(offsets, ks, config=config) if cap is None else max(1, int(cap)))
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
                    block: int | None = None, *, config: TopKConfig | None = None) -> FilterWorkspace:
    """Enqueue the "filter" path of one seeded request: seed (:func:`~andromeda_nb.topk.seed.launch_seed`,
    whose sample launch also zeroes the counters), one pass keeping the eligible scores at or above
    it (:func:`launch_filter`), and the top-k among them (:func:`~andromeda_nb.topk.final.launch_final`).
    Exact when at least ``min(k, eligible)`` and at most ``fws.cap`` scores reached the seed
    (``fws.counts[0, 1]``); see :func:`~andromeda_nb.topk.single.seeded_outcome`. ``elig``: device
    uint64 ``[words]`` bitset or None."""
    block = block or launch.default_block()
    seed = launch_seed(d_scores, n, sws, elig, reset=fws)  # its sample kernel zeroes fws's counters
    return launch_filter_final(d_scores, n, k, fws, seed, elig, d_ids, block, config=config)


def launch_filter_final(d_scores, n: int, k: int, fws: FilterWorkspace, seed, elig=None, d_ids=None,
                        block: int | None = None, *, config: TopKConfig | None = None) -> FilterWorkspace:
    """Enqueue the filter pass at device threshold ``seed`` (``float32[1]``; -inf keeps every eligible
    score) and the top-k among the kept scores (:func:`~andromeda_nb.topk.final.launch_final`), into
    ``fws`` (counters reset by the caller). ``block``: the filter's threads per block."""
    launch_filter(d_scores, fws, seed, elig, block, config=config)
    return launch_final(k, fws, d_ids, config=config)


def word_view(d_scores, n: int):
    """``(head, words)``: ``d_scores[head : head + 2 * len(words)]`` as uint64 words (8-byte loads
    of two scores), ``head`` = 1 when the array starts 4 bytes past an 8-byte boundary (a slice)."""
    head = 1 if n and launch.address(d_scores) % 8 else 0
    body = max(0, n - head) // 2 * 2
    return head, d_scores[head:head + body].view(np.uint64)


def launch_filter(d_scores, fws: FilterWorkspace, seed, elig=None, block: int | None = None,
                  rounds: int | None = None, *, config: TopKConfig | None = None) -> None:
    """Enqueue the filter pass alone (:func:`~andromeda_nb.topk.filter_kernels.filter_kernel`, its
    shared stage ``config.tuning.filter_stage`` entries): each request's eligible scores at or
    above its seed (``seed`` device ``float32[batch]``) appended to its row of ``fws``'s buffer.
    ``elig``: device uint64 ``[words]`` (one request) or ``[batch, words]``, or None. One request: a
    grid filling the GPU (grid-stride); a batch: blocks of ``rounds`` rounds each (default
    ``config.tuning.batch_filter_rounds``) over each request's slice."""
    from .filter_kernels import FILTER_LOADS, filter_kernel

    t = check_config(config).tuning
    block = block or launch.default_block()
    total = int(fws.offsets_host[-1])
    head, words = word_view(d_scores, total)
    if fws.batch == 1:
        grid = (launch.grid_for(-(-words.shape[0] // FILTER_LOADS), block, blocks_per_sm=8), 1)
    else:
        longest = int(np.diff(fws.offsets_host).max()) // 2 + 1
        grid = (max(1, -(-longest // (block * FILTER_LOADS * (rounds or t.batch_filter_rounds)))), fws.batch)
    if elig is not None and elig.ndim == 1:
        elig = elig.reshape(1, elig.shape[0])
    filter_kernel(block, elig is not None, t.filter_stage)[grid, block](
        words, d_scores, head, fws.offsets, elig if elig is not None else launch.dummy2d(np.uint64), seed,
        fws.buf_s, fws.buf_i, fws.fill, fws.counts)
