"""The block top-K path, host side: per-block top-k lists over each request's scores (the scan) and
their merge into each request's exact top-k (bound, select, final), a request a grid row.

Kernels: :mod:`~andromeda_nb.topk.block` (scan, bound, select, the "offer" final) and the merge's
radix final (:func:`~andromeda_nb.topk.final_kernels.final_radix_kernel`). Used unseeded (path
"unseeded", :func:`~andromeda_nb.topk.api.topk_batch`'s whole-batch rerun), behind a seed (path
"scan") and by fused scoring (its merge). Importing this module does not import numba.
"""

from __future__ import annotations

import numpy as np

from ..device import launch
from .config import BLOCK_TOPK_MAX_K, FINAL_MERGES, MAX_K, TopKConfig, check_config, radix_block

#: Each per-block list covers at least this many scores per unit of k: with fewer, the merge's bound
#: (the best per-list k-th score) is loose and ~k * lists entries survive into the final block.
SCORES_PER_K = 32


def _blocks_per_request(max_n: int, batch: int, block: int, kmax: int, seeded: bool = False) -> int:
    from .block import SCAN_ITEMS

    # seeded, few scores pass the seed (about seed_margin * k in all), so the lists may be short and
    # the bound loose: one block per round of scores keeps a small request's scan one round deep
    per_list = block * SCAN_ITEMS if seeded else max(block * SCAN_ITEMS, SCORES_PER_K * kmax)
    need = max(1, -(-max_n // per_list))
    cap = launch.SIM_MAX_BLOCKS if launch.backend.is_simulator() else max(1, launch.sm_count() * 4 // batch)
    return min(need, cap)


def scan_lists(offsets, ks, block: int | None = None, seeded: bool = False) -> int:
    """Per-block lists (blocks per request) the scan uses for this shape (``seeded``: a seed
    threshold will be passed, so more and shorter lists pay)."""
    block = block or launch.default_block()
    sizes = np.diff(np.asarray(offsets, np.int64))
    return _blocks_per_request(int(sizes.max()) if sizes.size else 1, len(ks), block, int(np.max(ks)), seeded)


class TopKWorkspace:
    """Device buffers for one block top-K launch shape, reused across calls.

    Per call, the launch path then neither allocates nor copies host data to the device (both can
    stall the stream, and a serving system keeps such buffers anyway): counters are zeroed by a
    kernel. ``offsets`` (host int64 ``[batch + 1]``) and ``ks`` (host int64 ``[batch]``) are uploaded
    once; ``lists`` is the number of per-block lists per request (:func:`scan_lists`).

    Raises:
        ValueError: a k above :data:`~andromeda_nb.topk.config.BLOCK_TOPK_MAX_K`.
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


def launch_merge_lists(ws: TopKWorkspace, ids=None, block: int | None = None, final: str | None = None, *,
                       config: TopKConfig | None = None):
    """Enqueue the merge of the workspace's per-block top-k lists (``ws.cand_s/cand_i``: each list
    sorted best first, slots local to the request's slice, -1 pads; entries past a request's k
    ignored) into each request's exact top-k, in ``ws.out_id`` / ``ws.out_s``.

    Steps: bound (the best of the lists' k-th keys, a lower bound of the answer's k-th), select (the
    entries at or above it into a compact buffer), final (one block's exact top-k of the buffer).
    ``ids``: device int64 (global) tie-break and output ids, or None (slots). ``final``: "offer" or
    "radix" (default ``config.final_merge``).
    """
    from .block import bound_kernel, buffer_capacity, final_kernel, next_pow2, select_kernel
    from .final_kernels import final_radix_kernel

    final = final or check_config(config).final_merge
    if final not in FINAL_MERGES:
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


def launch_topk_batch(d_scores, ws: TopKWorkspace, elig=None, d_ids=None, seeds=None, block: int | None = None, *,
                      config: TopKConfig | None = None):
    """Enqueue the batched block top-K into a workspace (no validation, no allocation, no host copy).

    Args:
        d_scores: device ``float32[total]``; request r owns ``scores[offsets[r]:offsets[r+1]]`` of
            ``ws`` (build it with ``TopKWorkspace(offsets, ks, scan_lists(offsets, ks))``);
        elig: device ``uint64[batch, words]`` per-request bitsets over their slices, or None;
        d_ids: device int64 ``[total]`` ids, or None (ids = positions within the slice);
        seeds: device float32 ``[batch]`` seed thresholds (-inf: none), or None;
        config: the merge's final step (``final_merge``).

    Results in ``ws.out_id [batch, kmax]``, ``ws.out_s``, ``ws.counts [batch, 2]`` (eligible
    non-NaN scores; those >= seed).
    """
    launch_scan(d_scores, ws, elig, d_ids, seeds, block)
    launch_merge_lists(ws, d_ids, block, config=config)
