"""One request's top-K, host side: the enqueue of a path (:func:`launch_topk`), how a seeded run
ended (:func:`seeded_outcome`), and :func:`topk_one`, which runs the path
:func:`~andromeda_nb.topk.config.choose_path` picked and reruns where a seeded answer is not exact.

The paths themselves live in :mod:`~andromeda_nb.topk.batched` ("batched"),
:mod:`~andromeda_nb.topk.filter` ("filter"), :mod:`~andromeda_nb.topk.scan` ("scan", "unseeded").
Importing this module does not import numba.
"""

from __future__ import annotations

import threading

import numpy as np

from ..device import launch
from ..model import TopK
from .batched import batch_outcomes, launch_topk_batch_seeded
from .config import BLOCK_TOPK_MAX_K, TopKConfig, check_config
from .filter import FilterWorkspace, launch_filter_final, launch_filtered
from .scan import TopKWorkspace, launch_topk_batch, scan_lists
from .seed import SeedWorkspace, launch_seed


def launch_topk(d_scores, n: int, k: int, elig=None, d_ids=None, block: int | None = None,
                seeded: bool = False, ws: TopKWorkspace | None = None, sws: SeedWorkspace | None = None,
                fws: FilterWorkspace | None = None, path: str | None = None, *, config: TopKConfig | None = None):
    """Enqueue top-K over one device score array (no validation, no host copies when the
    workspaces are given). A seeded call takes ``path``: "filter" uses ``fws``, "scan" uses ``ws``
    (default "scan" when ``config.path`` is "scan", else "filter"); where no seed pays
    (:meth:`SeedWorkspace.make <andromeda_nb.topk.seed.SeedWorkspace.make>` gives None) and for an
    unseeded call, the block top-K in ``ws``.

    Returns:
        the workspace holding the results (``.out_id[0]``, ``.out_s[0]``, ``.counts[0]``), and the
        seed workspace used (None when unseeded). Check a seeded call with :func:`seeded_exact`.
    """
    config = check_config(config)
    if seeded:
        sws = sws or SeedWorkspace.make(n, k, config=config)
        path = path or ("scan" if config.path == "scan" else "filter")
        if path not in ("filter", "scan"):
            raise ValueError(f"path must be 'filter' or 'scan', got {path!r}")
        if sws is not None and path == "filter":
            fws = fws or FilterWorkspace(n, k, config=config)
            return launch_filtered(d_scores, n, k, fws, sws, elig, d_ids, block, config=config), sws
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
    launch_topk_batch(d_scores, ws, elig2, d_ids, seeds, block, config=config)
    return ws, sws


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


def result_of(res, counts) -> TopK:
    """The host :class:`~andromeda_nb.model.TopK` of a finished single-request workspace (any path;
    ``counts`` its host ``int64[2]``)."""
    return TopK(ids=res.out_id[0].copy_to_host(), scores=res.out_s[0].copy_to_host(), count=int(counts[0]))


class WorkspaceCache:
    """Batch-of-one :class:`~andromeda_nb.topk.filter.FilterWorkspace` s by (n, k, config), at most
    ``capacity`` a thread, the least recently used dropped first. A workspace belongs to the CUDA
    context it was made in; its counters are zeroed by every call's seed launch and its results
    are copied out before the next call reuses it."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self._local = threading.local()

    def _entries(self) -> dict:
        entries = getattr(self._local, "entries", None)
        if entries is None:
            entries = self._local.entries = {}
        return entries

    def get(self, n: int, k: int, config: TopKConfig) -> FilterWorkspace:
        entries = self._entries()
        # the simulator has one context, and hands out a new stand-in object each call
        ctx = None if launch.backend.is_simulator() else launch.cuda().current_context()
        made_in, fws = entries.pop((n, k, config), (None, None))
        if fws is None or made_in is not ctx:
            fws = FilterWorkspace.batched(np.array([0, n], np.int64), np.array([k], np.int64), config=config)
            while len(entries) >= self.capacity:
                entries.pop(next(iter(entries)))  # the least recently used
        entries[(n, k, config)] = (ctx, fws)
        return fws

    def keys(self) -> list:
        """This thread's (n, k, config) keys, least recently used first."""
        return list(self._entries())


#: Batch-of-one workspaces topk_scores keeps a thread: a fresh one took ~10 device allocations and
#: copies a call, most of a small request's host wall time (measured on the H200, data/results/topk.csv).
SMALL_WORKSPACES = 8
small_workspaces = WorkspaceCache(SMALL_WORKSPACES)


def topk_one(d_scores, n: int, k: int, elig, d_ids, block: int | None, path: str, config: TopKConfig) -> TopK:
    """One validated request's exact top-k (device scores, ``elig`` a device bitset or None,
    ``d_ids`` device ids or None) by ``path`` ("batched", "filter", "scan" or "unseeded", as
    :func:`~andromeda_nb.topk.config.choose_path` gives it), rerunning where a seeded run is not exact:
    "batched" on "filter"; "filter" and "scan" unseeded after a seed above the k-th score; "filter"
    on "scan" (same seed) after a buffer overflow. Above
    :data:`~andromeda_nb.topk.config.BLOCK_TOPK_MAX_K` the reruns are :func:`_topk_beyond_block`'s."""
    if path == "batched":
        fws = small_workspaces.get(n, k, config)
        launch_topk_batch_seeded(d_scores, fws, None if elig is None else elig.reshape(1, elig.shape[0]), d_ids,
                                 block, config=config)
        c = fws.counts.copy_to_host()
        if batch_outcomes(fws, c)[0] == "exact":
            return result_of(fws, c[0])
        path = "filter"
    seeded = path != "unseeded"
    if k > BLOCK_TOPK_MAX_K:
        return _topk_beyond_block(d_scores, n, k, elig, d_ids, block, seeded, config)
    ws, sws = launch_topk(d_scores, n, k, elig, d_ids, block, seeded=seeded, path=path if seeded else None,
                          config=config)
    c = ws.counts.copy_to_host()[0]
    outcome = "exact" if sws is None else seeded_outcome(ws, k, c)
    if outcome == "seed_high":
        ws, _ = launch_topk(d_scores, n, k, elig, d_ids, block, seeded=False, config=config)
        c = ws.counts.copy_to_host()[0]
    elif outcome == "overflow":  # the seed is valid: the seeded scan path takes any number above it
        ws, _ = launch_topk(d_scores, n, k, elig, d_ids, block, seeded=True, sws=sws, path="scan", config=config)
        c = ws.counts.copy_to_host()[0]
    return result_of(ws, c)


def _topk_beyond_block(d_scores, n: int, k: int, elig, d_ids, block, seeded: bool, config: TopKConfig) -> TopK:
    """k above the block top-K's limit: the seeded filter path when it answers exactly; otherwise
    (unseeded, no seed for this size, a seed above the k-th score, or an overflowing buffer) one
    filter pass with no threshold, which keeps every eligible score, and one block's radix select
    over all of them: exact at any size, but one block reads all n scores four times (slow for
    large n)."""
    sws = SeedWorkspace.make(n, k, config=config) if seeded else None
    if sws is not None:
        fws = launch_filtered(d_scores, n, k, FilterWorkspace(n, k, config=config), sws, elig, d_ids, block,
                              config=config)
        c = fws.counts.copy_to_host()[0]
        if seeded_exact(fws, k, c):
            return result_of(fws, c)
    fws = FilterWorkspace(n, k, cap=n, config=config)
    fws.reset()
    no_seed = launch.cuda().to_device(np.full(1, -np.inf, np.float32))
    launch_filter_final(d_scores, n, k, fws, no_seed, elig, d_ids, block, config=config)
    c = fws.counts.copy_to_host()[0]
    return result_of(fws, c)
