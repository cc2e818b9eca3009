"""The single-request seed, host side: a threshold that about ``seed_margin * k`` of a request's n
scores reach, from a stratified sample of them, in one launch
(:func:`~andromeda_nb.topk.seed_kernels.seed_kernel`).

The "filter" and "scan" paths start with it (:mod:`~andromeda_nb.topk.filter`,
:mod:`~andromeda_nb.topk.scan`); fused scoring scores the same sample and seeds from it
(:func:`launch_seed_select`). The batched path seeds each request in a block of its own
(:mod:`~andromeda_nb.topk.batched`). Importing this module does not import numba.
"""

from __future__ import annotations

import numpy as np

from ..device import launch
from .config import DEFAULT_CONFIG, TopKConfig, check_config


def sample_positions(n: int, chunks: int, *, chunk: int = DEFAULT_CONFIG.tuning.sample_chunk) -> np.ndarray:
    """The positions a seed samples from ``n`` items: ``chunks`` contiguous runs of ``chunk``
    (``TopKTuning.sample_chunk``), each centred in one of ``chunks`` equal strata (the formula of
    :func:`~andromeda_nb.topk.seed_kernels.seed_kernel`), as int32 ``[chunks * chunk]``."""
    offs = (2 * np.arange(chunks, dtype=np.int64) + 1) * n // (2 * chunks) - chunk // 2
    return (offs[:, None] + np.arange(chunk, dtype=np.int64)[None, :]).ravel().astype(np.int32)


def seed_block() -> int:
    """Threads per block of the seed launch (seed_kernels.SEED_BLOCK on a GPU, the simulator's
    default block there)."""
    from .seed_kernels import SEED_BLOCK

    return launch.default_block() if launch.backend.is_simulator() else SEED_BLOCK


class SeedWorkspace:
    """Buffers of :func:`launch_seed` for arrays of n scores and top-k (:meth:`make` returns None
    where no seed pays).

    Attributes: ``n``; the sample, ``chunks`` contiguous runs of ``chunk`` scores (``m`` in all);
    the seed rank ``r``; the candidate keys and control words of
    :func:`~andromeda_nb.topk.seed_kernels.seed_kernel` (zero between calls: its last block
    re-zeroes them); ``sample_flat`` (device ``float32[m]``) and ``seeds`` (device ``float32[1]``).
    """

    @classmethod
    def make(cls, n: int, k: int, *, config: TopKConfig | None = None):
        """The workspace for n scores and top-k under ``config.tuning``, or None where no seed pays:
        n below ``seed_min_n``, fewer than two sampled runs, or a rank past a quarter of the sample.

        The sample is at most n / 8 scores, at most ``max_sample_chunks`` runs of ``sample_chunk``,
        and no more than a seed of rank ~``seed_sample_rank`` needs; the rank ``r`` makes about
        ``seed_margin * k`` of the n scores reach the r-th best sample, at least ``seed_min_rank``.
        """
        from .seed_kernels import CTL_SIZE

        t = check_config(config).tuning
        if n < t.seed_min_n or k < 1:
            return None
        enough = int(np.ceil(t.seed_sample_rank * n / (t.seed_margin * k * t.sample_chunk)))
        chunks = int(min(t.max_sample_chunks, n // 8 // t.sample_chunk, enough))
        m = chunks * t.sample_chunk
        r = max(t.seed_min_rank, int(np.ceil(t.seed_margin * k * m / n)))
        if chunks < 2 or r > m // 4:
            return None
        self = cls()
        cuda = launch.cuda()
        self.n, self.r, self.m, self.chunks, self.chunk = int(n), r, m, chunks, t.sample_chunk
        self.sample_flat = cuda.device_array(m, np.float32)
        self.cand = cuda.device_array(t.seed_cand_cap, np.uint32)
        self.ctl = cuda.to_device(np.zeros(CTL_SIZE, np.uint32))
        self.seeds = cuda.to_device(np.full(1, -np.inf, np.float32))
        return self

    def positions(self) -> np.ndarray:
        """The sampled positions (:func:`sample_positions` of this workspace's n, runs and run length)."""
        return sample_positions(self.n, self.chunks, chunk=self.chunk)

    def seed(self):
        """The seed :func:`launch_seed` leaves (device ``float32[1]``, read in place)."""
        return self.seeds


def _launch_seed_kernel(sws: SeedWorkspace, gather: bool, d_scores, n: int, elig=None, reset=None) -> None:
    from .seed_kernels import SEED_PER_THREAD, seed_kernel

    sb = seed_block()
    grid = -(-sws.m // (sb * SEED_PER_THREAD))
    seed_kernel(sb, sws.chunk, gather, elig is not None, reset is not None)[grid, sb](
        d_scores, n, sws.chunks, sws.sample_flat, elig if elig is not None else launch.dummy(np.uint64), sws.r,
        sws.cand, sws.ctl, sws.seeds, reset.counts if reset is not None else launch.dummy2d(np.int64),
        reset.fill if reset is not None else launch.dummy(np.int64))


def launch_seed(d_scores, n: int, sws: SeedWorkspace, elig=None, reset=None):
    """Enqueue a seed threshold for one request's top-k, one launch
    (:func:`~andromeda_nb.topk.seed_kernels.seed_kernel`): a stratified sample of contiguous chunks
    (NaN, and ineligible scores when ``elig``, a device uint64 bitset, is given, sampled as -inf:
    they never seed), and the lower edge of the 24-bit key prefix of its r-th best, so at least r
    samples, and about ``r * n / m`` scores of the array, reach it. ``reset``: a
    :class:`~andromeda_nb.topk.filter.FilterWorkspace` whose counters the launch zeroes on the way.
    The launch runs :func:`seed_block` threads. Returns device ``float32[1]``."""
    _launch_seed_kernel(sws, True, d_scores, n, elig, reset)
    return sws.seed()


def launch_seed_select(sws: SeedWorkspace):
    """Enqueue the seed of :func:`launch_seed` on a sample already in ``sws.sample_flat`` (NaN and
    -inf never seed; fused scoring writes its sample there), one launch. Returns the seed, device
    ``float32[1]`` (-inf when fewer than r samples are real scores)."""
    _launch_seed_kernel(sws, False, launch.dummy(np.float32), 0)
    return sws.seed()
