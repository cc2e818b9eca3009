"""The final step, host side: each request's exact top-k of a candidate buffer (the filter's kept
scores), by the rank, sort or radix kernels of :mod:`~andromeda_nb.topk.final_kernels`.

Which kernel answers (:func:`launch_final`): a batch whose buffer holds at most ``SORT_CAP``
candidates a request, a block a request sorting them; otherwise the rank final (each candidate's
place counted over many blocks) for buffers of at most ``TopKTuning.rank_cap`` entries, then one
block's radix select for the requests that hold more. Importing this module does not import numba.
"""

from __future__ import annotations

import numpy as np

from ..device import launch
from .config import TopKConfig, check_config, final_for, radix_block

#: Threads of the sort final's blocks (a request each): about half the ~2.5 k candidates padded
#: to a power of two, a compare-exchange a thread a step.
SORT_BLOCK = 128
#: The rank final's candidate limit in the simulator (``TopKTuning.rank_cap`` on a GPU): the
#: simulator runs every barrier of every tile and round in Python (2,000 candidates took seconds),
#: so above it the radix select answers.
SIM_RANK_CAP = 512


def launch_final(k: int, fws, d_ids=None, block: int | None = None, d_scores=None, *,
                 config: TopKConfig | None = None):
    """Enqueue each request's top-k of ``fws``'s buffer (a :class:`~andromeda_nb.topk.filter.FilterWorkspace`)
    into its outputs: by counting each candidate's place over many blocks when the buffer holds at
    most ``config.tuning.rank_cap`` entries (:func:`~andromeda_nb.topk.final_kernels.final_rank_kernel`),
    else by one block's radix select (:func:`~andromeda_nb.topk.final_kernels.final_radix_kernel`,
    ``block`` threads, default :func:`~andromeda_nb.topk.config.radix_block`; launched after the rank
    final only when the buffer can hold more than it takes, it exits when that answered); a batch
    of :data:`~andromeda_nb.topk.config.RADIX_FINAL_MIN_BATCH` or more requests (``config.final``,
    :func:`~andromeda_nb.topk.config.final_for`) by the radix select alone. ``k``: the
    largest k of the batch. A batch whose buffer holds at most
    :data:`~andromeda_nb.topk.final_kernels.SORT_CAP` candidates a request, given its ``d_scores``,
    is answered by a block a request sorting them
    (:func:`~andromeda_nb.topk.final_kernels.final_sort_kernel`, with warp barriers when
    ``config.sort_warp_sync``) instead. Returns ``fws``."""
    from .block import next_pow2
    from .final_kernels import (RANK_BLOCK, RANK_SPLIT, SORT_CAP, final_radix_kernel, final_rank_kernel,
                                final_sort_kernel)

    config = check_config(config)
    block = block or radix_block()
    has_ids = d_ids is not None
    ids = d_ids if has_ids else launch.dummy(np.int64)
    args = (fws.buf_s, fws.buf_i, fws.fill, fws.offsets, ids, fws.ks, fws.out_s, fws.out_slot, fws.out_id)
    if d_scores is not None and fws.batch > 1 and fws.cap <= SORT_CAP:  # a block a request sorts
        sb = launch.default_block() if launch.backend.is_simulator() else SORT_BLOCK
        final_sort_kernel(sb, has_ids, max(2, next_pow2(fws.cap)), config.sort_warp_sync)[(1, fws.batch), sb](
            d_scores, *args)
        return fws
    if final_for(config, fws.batch) == "radix":
        final_radix_kernel(max(2, next_pow2(k)), block, has_ids)[(1, fws.batch), block](*args)
        return fws
    if launch.backend.is_simulator():
        # a thread a candidate and at most SIM_RANK_CAP of them; the radix select above
        rb, split, cap = launch.default_block(), 1, min(config.tuning.rank_cap, SIM_RANK_CAP)
    else:
        rb, split, cap = RANK_BLOCK, RANK_SPLIT, config.tuning.rank_cap
    per_block = rb // split
    if fws.batch == 1:  # one pass over the most candidates it takes
        grid = launch.grid_for(cap, per_block, 1 << 20)
    else:  # one pass over about twice the candidates a seed aims at; more take more rounds
        grid = max(1, min(-(-cap // per_block), -(-int(2 * config.tuning.seed_margin * fws.kmax) // per_block)))
    final_rank_kernel(rb, has_ids, cap, split)[(grid, fws.batch), rb](*args)
    if fws.cap > cap:
        final_radix_kernel(max(2, next_pow2(k)), block, has_ids, skip_upto=cap)[(1, fws.batch), block](*args)
    return fws
