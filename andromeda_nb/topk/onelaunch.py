"""The one-launch path, host side: one request of up to :data:`ONELAUNCH_MAX_N` scores in a single
launch (:func:`~andromeda_nb.topk.onelaunch_kernels.onelaunch_topk_kernel`: every block seeds from
the same sample, filters its share, and the last block sorts the kept scores).

Not a route of :func:`~andromeda_nb.topk.api.topk_scores`: its last block's sort on one SM costs
more than the batched path on a batch of one (measured on the H200,
data/results/topk_diagnostics.md); it stays for a final that spreads the sort over the GPU.
Importing this module does not import numba.
"""

from __future__ import annotations

import numpy as np

from ..device import launch
from .config import TopKConfig, check_config
from .filter import FilterWorkspace

#: The one-launch path takes at most this many scores: one request right after scoring, L2-resident,
#: where three launches' fixed costs dominate.
ONELAUNCH_MAX_N = 1 << 20


def onelaunch_shape() -> tuple[int, int, int]:
    """(threads a block, samples a thread, scores a thread) of the one-launch path:
    onelaunch_kernels.ONELAUNCH_BLOCK x ONELAUNCH_SAMPLES x ONELAUNCH_SCORES on a GPU (an 8,192-
    score sample; a block covers 8,192 scores), the simulator's default block there."""
    from .onelaunch_kernels import ONELAUNCH_BLOCK, ONELAUNCH_SAMPLES, ONELAUNCH_SCORES

    blk = launch.default_block() if launch.backend.is_simulator() else ONELAUNCH_BLOCK
    return blk, ONELAUNCH_SAMPLES, ONELAUNCH_SCORES


class OneLaunchWorkspace(FilterWorkspace):
    """Device buffers of the one-launch path (:func:`launch_onelaunch`) for one request of n scores
    and top-k, or None from :meth:`make` where it does not apply: fewer than twice its sample
    (``block * samples`` scores) or more than :data:`ONELAUNCH_MAX_N` scores, or a k whose aimed
    candidates (``seed_margin * k``, kept to 5/8 of the sort's ``ONELAUNCH_CAP``: an overflow
    means a rerun) do not fit. Results and counts as :class:`~andromeda_nb.topk.filter.FilterWorkspace`
    (``cap`` = ONELAUNCH_CAP, so :func:`~andromeda_nb.topk.single.seeded_outcome` applies); ``r``
    is the seed's rank in the sample."""

    @classmethod
    def make(cls, n: int, k: int, *, config: TopKConfig | None = None):
        from .onelaunch_kernels import ACC_SIZE, ONELAUNCH_CAP

        t = check_config(config).tuning
        blk, samples, _ = onelaunch_shape()
        m = blk * samples
        if n < 2 * m or n > ONELAUNCH_MAX_N or k < 1 or t.seed_margin * k > ONELAUNCH_CAP * 5 // 8:
            return None
        r = max(t.seed_min_rank, int(np.ceil(t.seed_margin * k * m / n)))
        if r > m // 4:
            return None
        self = cls(n, k, cap=ONELAUNCH_CAP)
        cuda = launch.cuda()
        self.n, self.r, self.m = n, r, m
        self.acc = cuda.to_device(np.zeros(ACC_SIZE, np.int64))
        self.ticket = cuda.to_device(np.zeros(1, np.uint32))
        return self


def launch_onelaunch(d_scores, n: int, k: int, olw: OneLaunchWorkspace, elig=None, *,
                     config: TopKConfig | None = None) -> OneLaunchWorkspace:
    """Enqueue one request's top-k in one launch (the module docstring). No validation, no
    allocation, no host copy. Exact unless :func:`~andromeda_nb.topk.single.seeded_outcome` says
    otherwise (a seed above the k-th score, or more kept scores than ``olw.cap``). ``elig``: device
    uint64 ``[words]`` or None. Ids are positions. ``config.onelaunch_warp_sync``: the last block's
    sort ends its steps of stride <= 32 with warp barriers.

    Raises:
        ValueError: a workspace made for another n, or a k outside ``1..olw.kmax``.
    """
    from .onelaunch_kernels import onelaunch_topk_kernel

    config = check_config(config)
    if n != olw.n or not 1 <= k <= olw.kmax:  # its sample positions and rank are n's, its outputs kmax wide
        raise ValueError(f"a one-launch workspace for n = {olw.n}, k <= {olw.kmax}, got n = {n}, k = {k}")
    blk, samples, per = onelaunch_shape()
    grid = -(-n // (blk * per))
    onelaunch_topk_kernel(blk, samples, per, elig is not None, olw.cap, config.onelaunch_warp_sync)[grid, blk](
        d_scores[:n], elig if elig is not None else launch.dummy(np.uint64), olw.r, k, olw.buf_s[0],
        olw.buf_i[0], olw.acc, olw.ticket, olw.counts, olw.out_s, olw.out_slot, olw.out_id)
    return olw
