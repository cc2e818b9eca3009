"""The seeded batched path, host side: many requests (each its own slice of one score array and its
own k) in three launches, or one request as a batch of one (path "batched").

1. seed: a block a request seeds a threshold from a sample of its scores and zeroes its counters
   (:func:`~andromeda_nb.topk.seed_kernels.batch_seed_kernel`);
2. filter: one pass over the batch keeps each request's eligible scores at or above its seed
   (:func:`~andromeda_nb.topk.filter.launch_filter`, a grid row a request);
3. final: each request's kept scores ordered (:func:`~andromeda_nb.topk.final.launch_final`: a
   block a request sorting them; for larger buffers the rank final (1-3 requests) or a block a
   request's radix select (4 or more: :func:`~andromeda_nb.topk.config.final_for`)).

A request is exact unless :func:`batch_outcomes` says otherwise (its seed above its k-th score, or
more kept scores than the buffer holds); :func:`~andromeda_nb.topk.api.topk_batch` reruns those.
Importing this module does not import numba.
"""

from __future__ import annotations

import numpy as np

from ..device import launch
from .config import TopKConfig, check_config
from .filter import FilterWorkspace, launch_filter
from .final import launch_final

#: The batched path's candidate buffer holds at least this many a request.
BATCH_MIN_CAP = 1024


def batch_seed_shape() -> tuple[int, int]:
    """(threads, samples a thread) of the batched seed: seed_kernels.BATCH_SEED_BLOCK x
    BATCH_SEED_PER_THREAD on a GPU (4,096 samples a request); the simulator's default block x the
    same samples a thread."""
    from .seed_kernels import BATCH_SEED_BLOCK, BATCH_SEED_PER_THREAD

    blk = launch.default_block() if launch.backend.is_simulator() else BATCH_SEED_BLOCK
    return blk, BATCH_SEED_PER_THREAD


def batch_filter_cap(offsets, ks, *, config: TopKConfig | None = None) -> int:
    """Candidates a request the batched seeded path buffers: four times what its seed aims at
    (``seed_margin * k``, or ``seed_min_rank`` samples' worth of the longest request), at least
    :data:`BATCH_MIN_CAP`, at most what the rank final takes (``rank_cap``) and what the longest
    request holds. Up to final_kernels.SORT_CAP (k up to ~200) the sort final answers."""
    t = check_config(config).tuning
    blk, per = batch_seed_shape()
    longest = int(np.diff(np.asarray(offsets, np.int64)).max(initial=0))
    aim = max(t.seed_margin * int(np.max(ks)), t.seed_min_rank * longest / (blk * per))
    return int(max(1, min(t.rank_cap, longest, max(BATCH_MIN_CAP, 4 * aim))))


def launch_topk_batch_seeded(d_scores, fws: FilterWorkspace, elig=None, d_ids=None, block: int | None = None,
                             rounds: int | None = None, *, config: TopKConfig | None = None) -> FilterWorkspace:
    """Enqueue the seeded batched top-K (no validation, no allocation, no host copy), three launches
    (the module docstring). One launch doing all three in a block a request was slower on the H200
    (data/results/topk_diagnostics.md): all blocks seed, stream and sort in step, so the sorts
    overlap no streaming.

    Args:
        d_scores: device ``float32[total]``; request r owns ``scores[offsets[r]:offsets[r+1]]`` of
            ``fws`` (:meth:`FilterWorkspace.batched <andromeda_nb.topk.filter.FilterWorkspace.batched>`);
        elig: device ``uint64[batch, words]`` per-request bitsets over their slices, or None;
        d_ids: device int64 ``[total]`` ids, or None (ids = positions within the slice);
        block: the filter pass's threads per block; ``rounds``: its rounds a block (default
            ``config.tuning.batch_filter_rounds``);
        config: the seed's rank (``seed_margin``, ``seed_min_rank``), the filter's stage, the
            final's caps and barriers.

    Results in ``fws.out_id [batch, kmax]``, ``fws.out_s``, ``fws.counts [batch, 2]`` (eligible
    non-NaN scores; those at or above the seed)."""
    from .seed_kernels import BATCH_SAMPLE_CHUNK, batch_seed_kernel

    config = check_config(config)
    t = config.tuning
    blk, per = batch_seed_shape()
    has_elig = elig is not None
    # a lone request's seed by the threads' best keys (seed_kernels.batch_seed_kernel: its latency)
    batch_seed_kernel(blk, per, BATCH_SAMPLE_CHUNK, has_elig, int(2 * t.seed_margin), t.seed_min_rank,
                      fws.batch == 1)[fws.batch, blk](
        d_scores, fws.offsets, fws.ks, elig if has_elig else launch.dummy2d(np.uint64), fws.seeds, fws.counts,
        fws.fill)
    launch_filter(d_scores, fws, fws.seeds, elig, block, rounds, config=config)
    return launch_final(fws.kmax, fws, d_ids, d_scores=d_scores, config=config)


def batch_outcomes(fws: FilterWorkspace, counts=None) -> np.ndarray:
    """Per request of a seeded batch (host ``counts int64[batch, 2]``, copied from ``fws`` when not
    given): "exact", "seed_high" (fewer than ``min(k, eligible)`` scores reached the seed) or
    "overflow" (more than ``fws.cap`` did), as a str array ``[batch]``."""
    c = fws.counts.copy_to_host() if counts is None else np.asarray(counts)
    out = np.full(len(c), "exact", dtype=object)
    out[c[:, 1] < np.minimum(fws.ks_host, c[:, 0])] = "seed_high"
    out[c[:, 1] > fws.cap] = "overflow"
    return out
