"""Launching the scoring kernels: argument preparation, the shared-memory check, the kernel for
a resolved configuration, and the enqueue functions of each path (no validation beyond what the
kernel needs; the public functions in :mod:`.api` validate first).

Paths of fused scoring + top-K (:func:`.api.score_topk` chooses):
    "filter": score a sample of the items, take a seed threshold from it, then one fused pass
    appends only the scores at or above the seed to a small buffer (per ad: one compare, no
    barriers) and the top-K final answers; exact, or the caller falls back (a seed above the k-th
    score, or more scores through than the buffer holds).
    "block": the fused block top-K (per-block lists behind a running threshold) and a merge.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..device import launch
from ..topk.api import TopKWorkspace, eligible_bitset, launch_merge_lists
from ..model import all_unique
from .config import DEFAULT_CONFIG, SHARED_BYTES, KernelConfig
from ..targeting import bits_from_mask
from .table import FREE, DeviceAdTable, DeviceRequest
from .weights import f16_weights, fp16_rows_fit, fp16_rows_precise, gated_images, image_size, mma_f16_words, \
    mma_image_size, stack_requests


def _prepare(request, table: DeviceAdTable, eligible, candidates, unique: bool = False):
    if not isinstance(table, DeviceAdTable):
        raise TypeError(f"table must be a DeviceAdTable, got {type(table).__name__}")
    dreq = DeviceRequest.of(request)
    if dreq.d != table.d:
        raise ValueError(f"request d={dreq.d} does not match table d={table.d}")
    if eligible is not None and candidates is not None:
        raise ValueError("give eligible or candidates, not both")
    n = table.n_ads
    if candidates is not None:
        launch.check_array("candidates", candidates, np.int32, ndim=1)
        # device candidates are copied back once to be checked (m * 4 bytes): an id out of range
        # would read outside the table; the launch_* functions skip this for serving loops
        host = candidates if isinstance(candidates, np.ndarray) else candidates.copy_to_host()
        if host.size:
            lo, hi = int(host.min()), int(host.max())
            if lo < 0 or hi >= n:
                raise ValueError(f"candidate slots must be in 0..{n - 1}, got range {lo}..{hi}")
            if unique and not all_unique(host):
                raise ValueError("candidate slots must be distinct for top-K (a repeated slot would be "
                                 "returned several times)")
            if table.n_free and (table.host_ad_ids[host] == FREE).any():
                raise ValueError("candidate slots must hold ads: some are free slots (ad id -1)")
        return dreq, "candidates", None, launch.to_device(candidates), int(candidates.shape[0])
    if table.n_free:  # free slots (ad id -1) are never eligible: the caller's set AND the live slots
        live = table.host_ad_ids != FREE
        if eligible is None:
            return dreq, "bitset", _live_bitset(table), None, n
        bits = eligible_bitset(eligible, n)
        return dreq, "bitset", launch.to_device(bits.copy_to_host() & bits_from_mask(live)), None, n
    if eligible is not None:
        return dreq, "bitset", eligible_bitset(eligible, n), None, n
    return dreq, "pool", None, None, n


def _live_bitset(table: DeviceAdTable):
    """The device bitset of a table's live slots (ad id >= 0), made once."""
    if getattr(table, "_live_bits", None) is None:
        table._live_bits = launch.to_device(bits_from_mask(table.host_ad_ids != FREE))
    return table._live_bits


def shared_bytes(dreq: DeviceRequest, topk_k: int, config: KernelConfig, access: str = "pool",
                 selects: bool = True, dtype: str = "fp16") -> int:
    """Static shared memory per block of the generated kernel: the weight image, plus for a fused
    block top-K (``topk_k`` > 0) its buffer of 8-byte entries, plus for a bitset feeding a
    selection (``selects``: block top-K or filter) its per-tile list of eligible positions, plus
    for a table of ``dtype`` that takes one (:func:`.fused.ring_applies`) the int8 rows' ring."""
    return sum(_shared_parts(dreq.model, dreq.d, dreq.experts, int(topk_k), config, access, bool(selects),
                             launch.default_block(), dtype))


@lru_cache(maxsize=1024)
def _shared_parts(model: str, d: int, experts: int, topk_k: int, config: KernelConfig, access: str, selects: bool,
                  default_block: int, dtype: str) -> tuple[int, int]:
    """:func:`shared_bytes` of a request's shape as (the int8 rows' ring, the rest) (kept: a call's
    checks ask it several times)."""
    from .fused import BITS_PER_THREAD, MSC_PITCH, ring_applies
    from ..topk.block import buffer_capacity

    block = config.block or default_block
    cap = buffer_capacity(topk_k, block, config.items, config.sync_every) if topk_k else 0
    listed = 2 * BITS_PER_THREAD * block + 4 * block if access == "bitset" and selects else 0
    tile = 4 * MSC_PITCH * block  # each warp's result tile: 32 ads x MSC_PITCH floats
    if config.math == "fp16":  # the weights live in registers, or the per-lane image in shared memory
        image = 4 * mma_f16_words(d, experts) if config.kernel_f16_weights() == "shared" else 0
        # the int8 rows' ring: a slot a warp and round, each 32 ads' d/8 words and scales
        items = config.items if topk_k else 1
        ring = (block // 32 * config.kernel_ring_stages(dtype) * 32 * (d + 4)
                if ring_applies(config.math, dtype, access, topk_k > 0, items) else 0)
        return ring, image + tile + 8 * cap + listed + 64
    if config.tensor_cores:  # and the per-lane weight image
        return 0, 4 * mma_image_size(d) + tile + 8 * cap + listed + 64
    return 0, 4 * image_size(model, d, experts) + 8 * cap + listed + 64


def check_shared(dreq: DeviceRequest, topk_k: int, config: KernelConfig, access: str = "pool",
                 selects: bool = True, dtype: str = "fp16") -> None:
    """Raise ValueError (before any launch) when the kernel for this request, k, access, table
    dtype and configuration needs more shared memory per block than Numba's static limit
    (:data:`SHARED_BYTES`)."""
    ring, rest = _shared_parts(dreq.model, dreq.d, dreq.experts, int(topk_k), config, access, bool(selects),
                               launch.default_block(), dtype)
    if ring + rest > SHARED_BYTES:
        raise ValueError(f"this configuration needs {ring + rest} bytes of shared memory per block (weight image of "
                         f"d={dreq.d}, E={dreq.experts}" + (f" + a top-{topk_k} buffer for block={config.threads()}, "
                                                           f"items={config.items}, sync_every={config.sync_every}"
                                                           if topk_k else "")
                         + (f" + {ring} bytes of the int8 rows' ring, ring_stages={config.ring_stages} of "
                            f"block={config.threads()}" if ring else "")
                         + f"); Numba allows {SHARED_BYTES}: lower k, block, items or sync_every"
                         + (", or ring_stages" if ring else ""))


def _resolve(config: KernelConfig, dreq: DeviceRequest, table: DeviceAdTable, access: str, topk_k: int = 0,
             selects: bool | None = None) -> KernelConfig:
    """``config`` made concrete (:meth:`KernelConfig.resolved`) for the kernel that scores this
    request and table: ``selects`` (default ``topk_k > 0``) says the kernel selects (the block
    top-K or the filter pass), where an eligible bitset is compacted in the kernel."""
    selects = topk_k > 0 if selects is None else selects
    config = config.with_math(dreq, table)
    return config.resolved(dreq, topk_k, access == "bitset" and selects and table.layout == "tiles")


def _weight_args(dreq: DeviceRequest, config: KernelConfig):
    """(the weight image argument, the extra trailing arguments) of the generated kernel for a
    resolved ``config``."""
    if config.math == "fp16":
        image = dreq.mma_f16_image()
    else:
        image = dreq.mma_image() if config.tensor_cores else dreq.image
    return image, ((dreq.param_weights(),) if config.weights == "param" else ())


def _kernel(dreq: DeviceRequest, table: DeviceAdTable, access: str, topk_k: int, config: KernelConfig):
    """The kernel for a resolved ``config`` (:func:`_resolve`); raises ValueError before compiling
    anything for a configuration it cannot build."""
    from ..topk.block import buffer_capacity

    block = config.threads()
    if config.naive:
        cap = buffer_capacity(topk_k, block) if topk_k else 0
        if dreq.model != "gated":
            raise ValueError("the naive kernel implements the gated model only")
        from .naive import gated_score_kernel

        return gated_score_kernel(dreq.d, dreq.experts, dreq.k_experts, table.dtype, table.layout, access,
                                  block, cap, topk_k > 0)
    from .fused import fused_kernel

    cap = buffer_capacity(topk_k, block, config.items, config.sync_every) if topk_k else 0
    check_shared(dreq, topk_k, config, access, topk_k > 0, table.dtype)
    return fused_kernel(dreq.model, dreq.d, dreq.experts, dreq.k_experts, table.dtype, table.layout, access,
                        block, cap, True, config.values, config.max_registers, config.items if topk_k else 1,
                        config.sync_every if topk_k else 1, False, config.weights, config.guard,
                        config.tensor_cores, **config.kernel_options(table.dtype))


def _scales(table: DeviceAdTable, config: KernelConfig):
    """The ``scale`` argument of a generated kernel of ``config`` (concrete math): the table's scale
    pairs where it reads them (:meth:`.config.KernelConfig.kernel_row_scales`), else its float32 scales."""
    return table.scale_pairs() if config.kernel_row_scales(table.dtype) else table.scale


def _launch(dreq, table, access, elig, cand, n_items, grid, topk_k, out, cand_s, cand_i, counts, config):
    config = _resolve(config, dreq, table, access, topk_k)
    kern = _kernel(dreq, table, access, topk_k, config)
    dummy = launch.dummy
    elig = elig if elig is not None else dummy(np.uint64)
    cand = cand if cand is not None else dummy(np.int32)
    out = out if out is not None else dummy(np.float32)
    cand_s = cand_s if cand_s is not None else dummy(np.float32)
    cand_i = cand_i if cand_i is not None else dummy(np.int32)
    counts = counts if counts is not None else dummy(np.int64)
    block = config.threads()
    if config.naive:
        G, V, gamma, beta = dreq.naive_arrays()
        kern[grid, block](table.embeddings, table.scale, table.bias, G, V, gamma, beta, elig, cand, n_items,
                          table.ad_ids, topk_k, out, cand_s, cand_i, counts)
    else:
        image, extra = _weight_args(dreq, config)
        kern[grid, block](table.words, _scales(table, config), table.bias, image, elig, cand, n_items,
                          table.ad_ids, topk_k, out, cand_s, cand_i, counts, *extra)


def launch_score(dreq: DeviceRequest, table: DeviceAdTable, access: str, elig, cand, n_items: int,
                 out, config: KernelConfig | None = None) -> None:
    """Enqueue the scores-to-memory kernel (no validation, no host copies; for benchmarks and
    :func:`score_ads`). ``out``: device ``float32[n_items]``."""
    config = config or DEFAULT_CONFIG
    grid = launch.grid_for(n_items, config.threads(), config.blocks_per_sm)
    _launch(dreq, table, access, elig, cand, n_items, grid, 0, out, None, None, None, config)


def topk_workspace(table: DeviceAdTable, k: int, n_items: int, config: KernelConfig | None = None):
    """A reusable :class:`~andromeda_nb.topk.api.TopKWorkspace` for fused scoring + top-k over n_items."""
    config = config or DEFAULT_CONFIG
    grid = launch.grid_for(n_items, config.threads(), config.blocks_per_sm)
    return TopKWorkspace(np.array([0, table.n_ads], np.int64), np.array([k], np.int64), grid)


def launch_score_topk(dreq: DeviceRequest, table: DeviceAdTable, k: int, access: str, elig, cand,
                      n_items: int, config: KernelConfig | None = None, ws: TopKWorkspace | None = None):
    """Enqueue fused scoring + block top-K + merge (no validation; no allocation or host copy when
    a workspace from :func:`topk_workspace` is given).

    Returns:
        The workspace: ``ws.out_id[0]`` (int64[k] ad ids), ``ws.out_s[0]`` (float32[k]),
        ``ws.counts[0, 0]`` (ads scored with a non-NaN score).
    """
    config = config or DEFAULT_CONFIG
    ws = ws or topk_workspace(table, k, n_items, config)
    ws.reset()
    _launch(dreq, table, access, elig, cand, n_items, ws.lists, k, None, ws.cand_s[0], ws.cand_i[0], ws.counts[0],
            config)
    launch_merge_lists(ws, table.ad_ids, config.threads())
    return ws


class ScoreFilterWorkspace:
    """Device buffers of the "filter" path of fused scoring + top-k (:func:`launch_score_filter`)
    for ``n_items`` items and top-``k``: the sample positions (contiguous chunks spread over the
    items, as :func:`~andromeda_nb.topk.api.launch_seed` samples a score array), their table slots
    (candidates access), the seed's :class:`~andromeda_nb.topk.api.SeedWorkspace` and the filter's
    :class:`~andromeda_nb.topk.api.FilterWorkspace`, sized by ``topk_config``
    (:class:`~andromeda_nb.topk.config.TopKConfig`, default the measured one). ``make`` returns None
    where no seed pays (few items: :meth:`SeedWorkspace.make`)."""

    @classmethod
    def make(cls, n_items: int, k: int, access: str, topk_config=None):
        from ..topk.api import FilterWorkspace, SeedWorkspace, check_config

        topk_config = check_config(topk_config)
        sws = SeedWorkspace.make(n_items, k, config=topk_config)
        if sws is None:
            return None
        self = cls()
        self.n_items, self.k, self.access, self.sws = int(n_items), int(k), access, sws
        self.topk_config = topk_config
        pos = sws.positions()
        cuda = launch.cuda()
        self.pos = cuda.to_device(pos)
        self.slots = cuda.device_array(pos.size, np.int32) if access == "candidates" else self.pos
        self.fws = FilterWorkspace(n_items, k, config=topk_config)
        return self


def launch_score_filter(dreq: DeviceRequest, table: DeviceAdTable, k: int, access: str, elig, cand,
                        n_items: int, config: KernelConfig | None = None, sfw: ScoreFilterWorkspace | None = None):
    """Enqueue the "filter" path of fused scoring + top-k (:func:`~.api.score_topk`; no validation,
    no allocation or host copy when ``sfw`` is given): score the sample (scores-to-memory kernel
    over the sampled slots; ineligible ones set to -inf), select its seed (the r-th best), one
    fused pass keeping the eligible scores at or above the seed, then the exact top-k among them
    (:func:`~andromeda_nb.topk.final.launch_final` for one request: the rank final, each kept
    score's place counted over many blocks, and a radix select after it where the buffer holds
    more than its ``rank_cap``).

    Returns:
        the :class:`~andromeda_nb.topk.api.FilterWorkspace`: ``out_id[0]`` (int64[k] ad ids),
        ``out_s[0]``, ``counts[0]`` (non-NaN scores; those at or above the seed). Exact when
        :func:`~andromeda_nb.topk.api.seeded_outcome` says "exact".
    """
    from .filter_kernels import sample_prep_kernel
    from .fused import fused_kernel
    from ..topk.api import launch_final, launch_seed_select

    config = _resolve(config or DEFAULT_CONFIG, dreq, table, access, selects=True)
    sfw = sfw or ScoreFilterWorkspace.make(n_items, k, access)
    sws, fws = sfw.sws, sfw.fws
    block = config.threads()
    dummy = launch.dummy
    small = launch.default_block()
    m = sfw.pos.shape[0]
    prep_grid = launch.grid_for(m, small)
    if access == "candidates":  # the sampled candidates' slots
        sample_prep_kernel(True, False)[prep_grid, small](sfw.pos, cand, sfw.slots, dummy(np.uint64),
                                                          sws.sample_flat, True, fws.counts, fws.fill)
    elif access == "pool":
        fws.reset()
    grid = launch.grid_for(m, block, config.blocks_per_sm)
    _launch(dreq, table, "candidates", None, sfw.slots, m, grid, 0, sws.sample_flat, None, None, None, config)
    if access == "bitset":  # an ineligible sampled ad never seeds
        sample_prep_kernel(False, True)[prep_grid, small](sfw.pos, dummy(np.int32), dummy(np.int32), elig,
                                                          sws.sample_flat, True, fws.counts, fws.fill)
    seed = launch_seed_select(sws)
    kern = fused_kernel(dreq.model, dreq.d, dreq.experts, dreq.k_experts, table.dtype, table.layout, access, block,
                        0, True, config.values, config.max_registers, 1, 1, True, config.weights, config.guard,
                        config.tensor_cores, **config.kernel_options(table.dtype))
    grid = launch.grid_for(n_items, block, config.blocks_per_sm)
    image, extra = _weight_args(dreq, config)
    kern[grid, block](table.words, _scales(table, config), table.bias, image,
                      elig if elig is not None else dummy(np.uint64), cand if cand is not None else dummy(np.int32),
                      n_items, table.ad_ids, seed, fws.buf_s, fws.buf_i, fws.fill, fws.counts, *extra)
    return launch_final(k, fws, table.ad_ids, config=sfw.topk_config)


#: the resolved configurations :func:`_check_runnable` has generated a kernel for, by
#: (configuration, request shape, table dtype and layout, access, k, default block): the kernel
#: generation and its shared-memory check are the same for every request of a shape (tens of
#: microseconds of a warm call's host time); emptied when it holds RUNNABLE_KEPT keys
_RUNNABLE: dict = {}
RUNNABLE_KEPT = 256


def _check_runnable(dreq: DeviceRequest, table: DeviceAdTable, access: str, config: KernelConfig,
                    topk_k: int = 0) -> None:
    """Raise ValueError, before anything launches, for a configuration the kernels cannot run on
    this request and table: kernel generation (dtype, d, E, block, shared memory), the parameter
    weights' size, the tensor-core weight image. Generating a kernel compiles nothing. The values'
    range is :func:`checked_math`'s check (made once a call). A configuration that passed for a
    request shape, table dtype and layout, access and k is not generated again (:data:`_RUNNABLE`):
    only the checks of this request's values run."""
    if config.naive:
        return
    key = (config, dreq.model, dreq.d, dreq.experts, dreq.k_experts, dreq.param_floats, table.dtype, table.layout,
           access, int(topk_k), launch.default_block())
    cfg = _RUNNABLE.get(key)
    if cfg is None:
        cfg = _resolve(config, dreq, table, access, topk_k)
        _kernel(dreq, table, access, topk_k, cfg)
        if len(_RUNNABLE) >= RUNNABLE_KEPT:
            _RUNNABLE.clear()
        _RUNNABLE[key] = cfg
    if cfg.math == "fp16":  # what _weight_args would raise, without copying anything to the device
        dreq.host_mma_f16_image()
    elif cfg.tensor_cores:
        dreq.mma_image()
    if cfg.weights == "param":
        dreq.param_weights()


NON_FINITE = "the request's weights hold NaN or inf (changed in place after it was made?)"

#: the largest logit, value or score bound the fp32 kernels accept (a margin under the fp32 limit,
#: 3.4e38, for the sums of E products and the bias)
FP32_SAFE = 1e37


def check_range(dreq: DeviceRequest, table: DeviceAdTable, math: str) -> None:
    """Raise ValueError when this request on this table could overflow the chosen math: the
    encoded ads ``|h| <= max|gamma| max|a| + max|beta|`` beyond fp16 (``math="fp16"``), or a gate
    logit or value dot (``|h| * max_e sum_i |W[e, i]|``) beyond :data:`FP32_SAFE` (every score would
    be NaN, and nothing ranked, where the float64 reference ranks every ad). ``max|a|`` over the
    table's finite values (:meth:`DeviceAdTable.max_abs`; its free upper bound first, the exact
    value only where the bound would refuse)."""
    try:
        _check_range(dreq, table, math, table.max_abs_bound())
    except ValueError:
        if table.max_abs_is_exact():
            raise
        _check_range(dreq, table, math, table.max_abs())


def _check_range(dreq: DeviceRequest, table: DeviceAdTable, math: str, a: float) -> None:
    from .weights import FP16_MAX, fp16_encoded_bound, fp16_rows_fit

    img = dreq.image_on_host().astype(np.float64)
    if not (np.isfinite(img).all() and (dreq.request is None or np.isfinite(dreq.request.V).all())):
        raise ValueError(NON_FINITE)
    if dreq.model == "dot":
        if a * float(np.abs(img).sum()) > FP32_SAFE:
            raise ValueError("the user vector and the table's values could overflow fp32 in the dot product; "
                             "rescale them")
        return
    d, E = dreq.d, dreq.experts
    gmax, bmax = float(np.abs(img[:d]).max()), float(np.abs(img[d:2 * d]).max())
    h = gmax * a + bmax
    if math == "fp16" and not fp16_rows_fit(table, a):
        raise ValueError(f"math='fp16': this int8 table's rows reach max|q| max(scale) = {a:.4g}, beyond the fp16 range "
                         f"({FP16_MAX:g}), once dequantized; rescale the table or use math='fp32'")
    cg, cb, c0 = fp16_encoded_bound(a, table.dtype == "int8")  # gamma, beta, an int8 row as fp16 rounds them
    h16 = cg * gmax + cb * bmax + c0
    if math == "fp16" and not h16 <= FP16_MAX:
        raise ValueError(f"math='fp16': encoded ads could reach |gamma| max|a| + |beta| = {h16:.4g} once rounded to "
                         f"fp16, beyond the fp16 range ({FP16_MAX:g}); rescale the request or the table, or use math='fp32'")
    if not h <= FP32_SAFE:
        raise ValueError(f"encoded ads could reach |gamma| max|a| + |beta| = {h:.3g} on this table, beyond what fp32 "
                         "holds (every score would be NaN); rescale the request or the table")
    G = np.abs(img[2 * d:2 * d + E * d].reshape(E, d)).sum(axis=1).max()
    V = np.abs(dreq.request.V.astype(np.float64)).sum(axis=1).max() if dreq.request is not None else 0.0
    if not h * max(G, V) <= FP32_SAFE:
        raise ValueError(f"this request's gate logits or value dots could reach {h * max(G, V):.3g} on this table, "
                         "beyond what fp32 holds (every score would be NaN); rescale the request or the table")


def checked_math(config: KernelConfig, dreq: DeviceRequest, table: DeviceAdTable) -> KernelConfig:
    """``config.with_math(dreq, table)`` (the math made concrete) and :func:`check_range` for that
    math, in one: a gated request made from a :class:`~andromeda_nb.model.Request` takes one
    compiled pass (:func:`request_images`, a few microseconds) that also leaves its fp16 weight
    image on ``dreq`` where fp16 math serves it; the checks in numpy cost tens of microseconds of
    a call's host time.

    Raises:
        ValueError: the request or table could overflow the math (:func:`check_range`'s messages)."""
    # the compiled pass checks the Request's values and builds the images the kernels read from
    # them: it decides for a request that holds no image yet (DeviceRequest.of made it); one that
    # does (made from an image, or used before) gets the numpy checks of the images it holds
    fresh = (dreq.model == "gated" and dreq.request is not None and dreq._host_image is None
             and dreq._image is None and getattr(dreq, "_host_mma_f16", None) is None)
    if fresh:
        images = np.empty((1, image_size("gated", dreq.d, dreq.experts)), np.float32)
        fp16, f16 = request_images([dreq.request], table, config, images)
        dreq._host_image = images[0]
        if fp16[0]:
            dreq._host_mma_f16 = f16[0]
        cfg = config if config.math != "auto" else config.replaced("math", "fp16" if fp16[0] else "fp32")
        return cfg.with_dequant(table)
    cfg = config.with_math(dreq, table)
    if cfg.math == "fp16" and dreq.request is not None:
        f16_weights(dreq.request)  # a weight beyond fp16, named (with_math takes "auto" elsewhere)
    check_range(dreq, table, cfg.math)
    return cfg


class RefusedRequest(ValueError):
    """A request of a group that a range check refuses (:func:`request_images`): ``index``, its
    position in the group; the message, :func:`check_range`'s (or :func:`.weights.f16_weights`')."""

    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index = index


def request_images(group: list, table: DeviceAdTable, config: KernelConfig, images: np.ndarray):
    """Gated :class:`~andromeda_nb.model.Request` objects of one shape on ``table``, in one compiled
    pass (:func:`.weights.gated_images`): their float32 weight images into ``images[:B]``, which of
    them ``config``'s math serves in fp16 (``"auto"``: where the fp16 mode applies to the shape and
    the request and table stay within its range, as :meth:`KernelConfig.with_math` decides), every
    one range-checked for its math (:func:`check_range`).

    On a stale upper bound of the table's max|a| (updates since the last exact value) the rows'
    check of ``"auto"`` (:func:`.weights.fp16_rows_precise`) can pass where the exact value would
    not: a pool whose updates shrank every row below the threshold keeps fp16 math until a range
    check asks for the exact value (:meth:`~.table.DeviceAdTable.max_abs`).

    Returns:
        ``(fp16, f16)``: bool ``[B]``; the fp16 members' per-lane images (uint32 ``[n, words]``,
        in group order, :func:`.weights.mma_f16_image`), or None.

    Raises:
        RefusedRequest: the first request a check refuses.
        ValueError: ``math="fp16"`` on a shape its kernel does not take."""
    experts = group[0].experts
    f16_math = config.picks_fp16("gated", table.d, experts, table.dtype)
    if config.math == "fp16":
        mma_f16_words(table.d, experts)  # raises where the fp16 kernel does not take the shape
    built = _gated_images(group, table, config, table.max_abs_bound(), images, f16_math)
    if (built.bad32.any() or (f16_math and built.over16.any())) and not table.max_abs_is_exact():
        # the bound (stale after updates) would refuse or leave fp16 math: the exact value decides
        built = _gated_images(group, table, config, table.max_abs(), images, f16_math)
    refuse = built.bad32 | built.over16 if config.math == "fp16" else built.bad32
    if refuse.any():
        i = int(np.flatnonzero(refuse)[0])
        r = group[i]
        if not all(np.isfinite(x).all() for x in (r.gamma, r.beta, r.G, r.V)):
            raise RefusedRequest(i, NON_FINITE)
        try:
            if config.math == "fp16":
                f16_weights(r)  # a weight beyond fp16, named
            check_range(DeviceRequest.of(r), table, "fp16" if config.math == "fp16" else "fp32")
        except ValueError as e:
            raise RefusedRequest(i, str(e)) from None
        # at a bound itself the two checks' sums may differ in their last bit: this pass decides
        if built.bad32[i]:
            raise RefusedRequest(i, f"this request's encoded ads, gate logits or value dots could reach {FP32_SAFE:g} on "
                                    "this table, the limit fp32 math allows (every score would be NaN); rescale the "
                                    "request or the table")
        raise RefusedRequest(i, "math='fp16': this request's encoded ads could reach the fp16 range's limit on this "
                                "table; rescale the request or the table, or use math='fp32'")
    fp16 = ~built.over16 if f16_math else np.zeros(len(group), bool)
    f16 = built.f16 if fp16.all() else built.f16[fp16] if fp16.any() else None
    return fp16, f16


def _gated_images(group: list, table: DeviceAdTable, config: KernelConfig, max_abs: float, images: np.ndarray,
                  f16_math: bool):
    """:func:`.weights.gated_images` of a group on ``table`` at ``max_abs``, an int8 table's rows
    past fp16 (:func:`.weights.fp16_rows_fit`) leaving fp16 math, and rows too small for it, or
    requests whose weights or encoded ads are (:func:`.weights.fp16_weights_precise`), leaving
    ``math="auto"``'s (:func:`.weights.fp16_rows_precise`)."""
    built = gated_images(*stack_requests(group), max_abs, images, f16_math, int8=table.dtype == "int8")
    if not fp16_rows_fit(table, max_abs) or (config.math == "auto" and not fp16_rows_precise(table, max_abs)):
        built.over16[:] = True
    elif config.math == "auto":
        built.over16 |= built.low16
    return built
