"""The targeting match of a pool's batch through bound launches.

:meth:`~andromeda_nb.match.DeviceTargetingIndex.prepare` uploads each plan array as its own device
array (an allocation and a view each) and :meth:`~andromeda_nb.match.DeviceTargetingIndex.launch`
launches through Numba's dispatch: about a millisecond of host work per call on the H200's host,
for a match that runs in a tenth of that. Here a chunk of up to ``MAX_BATCH`` requests packs its
plan arrays into one pinned buffer, copies it with one asynchronous copy into one device buffer
(both kept, grown by doubling), and the prep, match and post kernels, bound once, have their array
arguments pointed at the spans of that buffer. Same kernels, same plans, same answers as
``prepare`` + ``launch`` with the default :class:`~andromeda_nb.match.config.MatchConfig`.
"""

from __future__ import annotations

import numpy as np

from ..device import launch
from ..match.api import PLAN_ARRAYS, BatchPlan
from ..match.config import MatchConfig


class BoundMatch:
    """The match kernels of one chunk of a batch (requests ``first..first + MAX_BATCH``), writing
    rows ``first..`` of ``bits`` and ``counts``."""

    def __init__(self, index, bits, counts, first: int):
        from ..match.kernels import MAX_BATCH

        self.index, self.first, self.max_batch = index, first, MAX_BATCH
        self.out = bits if first == 0 else bits[first:]
        self.counts = counts if first == 0 else counts[first:]
        self.config = MatchConfig()
        self._capacity = 0
        self._scratch = None
        self._launches = None

    def run(self, plan: BatchPlan) -> None:
        """Enqueue the chunk's plan upload and its match kernels (no host synchronisation)."""
        index = self.index
        if plan.version != index.version:
            raise RuntimeError(f"batch planned for index version {plan.version}, device copy at {index.version}")
        total = plan.flat.size
        scratch = index.scratch(plan.n_scratch)
        if total > self._capacity or scratch is not self._scratch:
            self._allocate(max(total, 2 * self._capacity), scratch)
        self.host[:total] = plan.flat
        launch.copy_async(self.dev, self.host, int(total) * 8)
        # as prepare's views: an empty array is one zero, but the segment tables keep their length
        offsets, sizes = plan.offsets, plan.sizes
        span = {name: (int(offsets[i]), int(sizes[i] if name in ("p_dst", "q_op") else max(sizes[i], 1)))
                for i, name in enumerate(PLAN_ARRAYS)}
        self._run_kernels(plan, span)

    def _allocate(self, capacity: int, scratch) -> None:
        cuda = launch.cuda()
        capacity = 1 << int(np.ceil(np.log2(max(capacity, 1024))))
        self.host = cuda.pinned_array(capacity, np.int64)
        self.dev = cuda.device_array(capacity, np.int64)
        self._capacity, self._scratch = capacity, scratch
        self._launches = self._bind(scratch)

    def _bind(self, scratch) -> dict:
        """The prep, match and post launches on this chunk's buffers (arguments pointed per call)."""
        from ..match.kernels import match_kernel, post_kernel, prep_kernel

        index, cfg, dev = self.index, self.config, self.dev
        sim = launch.backend.is_simulator()
        small = launch.default_block()
        one = dev[:1]
        prep = launch.BoundLaunch(prep_kernel(), 1, small,
                                  (self.counts, 1, index.pool, one, one, one, scratch, 0))
        blk, U = cfg.block_size(sim), cfg.words_per_thread
        match = launch.BoundLaunch(match_kernel(blk, U, cfg.launch_bounds(sim), cfg.prefetch), (1, 1), blk,
                                   (index.rows, scratch, index.n_ads, index.n_words, one, one, one, one, one, self.out,
                                    self.counts))
        post = launch.BoundLaunch(post_kernel(small), 1, small,
                                  (self.out, self.counts, index.n_words, index.pool, one, one, one, one, one, scratch,
                                   0))
        # the match grid: its word tiles, at most `blocks` blocks shared by the batch's requests
        blocks = launch.SIM_MAX_BLOCKS if sim else launch.sm_count() * cfg.blocks_per_sm
        return {"prep": prep, "match": match, "post": post, "small": small, "blocks": blocks,
                "tiles": -(-index.n_words // (blk * U))}

    def _run_kernels(self, plan: BatchPlan, span: dict) -> None:
        L, dev, B = self._launches, self.dev, plan.batch
        small = L["small"]

        def point(bound, i, name):
            off, n = span[name]
            bound.set_array(i, dev, off, n)

        prep, match, post = L["prep"], L["match"], L["post"]
        # the pool's bitsets cover every word: n_bits and n_words are the index's (bound once)
        prep.set_scalar(1, B)
        for i, name in ((3, "p_start"), (4, "p_off"), (5, "p_dst")):
            point(prep, i, name)
        prep.set_grid(launch.grid_for(max(plan.n_prep, B), small))
        prep()
        for i, name in ((4, "req_cat"), (5, "inc_ptr"), (6, "inc_rows"), (7, "exc_ptr"), (8, "exc_rows")):
            point(match, i, name)
        match.set_grid((max(1, min(L["tiles"], max(1, L["blocks"] // B))), B))
        match()
        if plan.n_post:
            for i, name in ((4, "extra"), (5, "q_start"), (6, "q_off"), (7, "q_op"), (8, "q_arg")):
                point(post, i, name)
            post.set_grid(launch.grid_for(plan.n_post, small))
            post()
