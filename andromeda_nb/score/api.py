"""The public scoring calls: every score to device memory (:func:`score_ads`), or fused scoring +
top-K where only the k answers leave the kernel (:func:`score_topk`).

Both validate every input before anything launches; :func:`score_topk` keeps its device buffers
(the seed's sample positions, the filter's buffer, the block top-K's lists) on the table, per
(items, k, access), so a warm call allocates nothing and copies only its answer back.
"""

from __future__ import annotations

import numpy as np

from ..device import launch
from ..model import TopK
from ..topk.api import BLOCK_TOPK_MAX_K, MAX_K, check_k
from .config import DEFAULT_CONFIG, PARAM_FLOATS, SHARED_BYTES, KernelConfig, check_config, with_config
from .launches import (ScoreFilterWorkspace, _check_runnable, _launch, _prepare, check_shared, checked_math,
                       launch_score, launch_score_filter, launch_score_topk, shared_bytes, topk_workspace)
from .table import DeviceAdTable, DeviceRequest

__all__ = ["DEFAULT_CONFIG", "PARAM_FLOATS", "SHARED_BYTES", "DeviceAdTable", "DeviceRequest", "KernelConfig",
           "score_ads", "score_topk", "with_config", "_launch"]

#: paths of :func:`score_topk` (:mod:`.launches` describes each)
PATHS = ("auto", "filter", "block")
#: workspaces a table keeps (by items, k, access); the least recently used goes first
WORKSPACES_PER_TABLE = 8


def score_ads(request, table: DeviceAdTable, eligible=None, candidates=None,
              config: KernelConfig | None = None):
    """Scores written to device memory (the unfused-top-K path).

    Args:
        request: a :class:`~andromeda_nb.model.Request` (gated model), a 1-D user vector ``u[d]``
            (two-tower ``dot(u, a) + b``), or a :class:`DeviceRequest`.
        table: :class:`DeviceAdTable`.
        eligible: optional bool ``[n_ads]`` mask or uint64 bitset: only eligible rows are read;
            ineligible slots get NaN.
        candidates: optional ``int32[m]`` slots to score (gather); the output is ``[m]``.
        config: :class:`KernelConfig` (default :data:`DEFAULT_CONFIG`).

    Returns:
        Device ``float32[n_ads]`` (or ``[m]`` for candidates).

    Raises:
        TypeError / ValueError: bad table, request, mask, candidates (slots out of range).
    """
    config = check_config(config)
    dreq, access, elig, cand, n_items = _prepare(request, table, eligible, candidates)
    config = checked_math(config, dreq, table)
    if config.naive and dreq.model != "gated":
        raise ValueError("the naive kernel implements the gated model only")
    if not config.naive:
        _check_runnable(dreq, table, access, config)  # includes the shared-memory check
    out = launch.cuda().device_array(n_items, np.float32)
    launch_score(dreq, table, access, elig, cand, n_items, out, config)
    return out


def score_topk(request, table: DeviceAdTable, k: int, eligible=None, candidates=None,
               config: KernelConfig | None = None, path: str = "auto", topk_config=None) -> TopK:
    """Fused scoring + top-K: scores never reach device memory (except on the fallback for a k
    above 2048 without an exact seed); only the k ad ids, k scores and the count come back to the
    host.

    Args:
        request, table, eligible, candidates: as for :func:`score_ads`.
        config: a :class:`KernelConfig` (``anb.KernelConfig``) or None for the measured defaults.
        k: ``1 <= k <= MAX_K`` (4096); ``k <= BLOCK_TOPK_MAX_K`` (2048) on the "block" path or
            with a naive config (the fused block top-K's shared buffer).
        path: ``"auto"`` (default), ``"filter"`` or ``"block"`` (:mod:`.launches`). ``"auto"``
            takes "filter" where a seed pays (enough items for a sample: the seeded filter kept
            0.99 of the scores-to-memory rate on the H200 where the block top-K kept 0.68,
            data/results/scoring.csv) and the kernel is the generated one, else "block".
            "filter" falls back to "block" when its seed does not give an exact answer (to
            scores in memory and :func:`~andromeda_nb.topk.topk_scores` when k > 2048 or the
            block top-K's buffer does not fit in shared memory).
        topk_config: the seed and filter's :class:`~andromeda_nb.topk.config.TopKConfig` (its
            tuning; default the measured one), also that of the ``topk_scores`` fallback.

    Returns:
        :class:`~andromeda_nb.model.TopK` by ad id (ties to the lower ad id), count = ads scored
        with a non-NaN score.

    Raises:
        TypeError / ValueError: as :func:`score_ads`, k out of range, bad ``path`` or ``config``,
            repeated candidate slots, a kernel needing more shared memory than Numba allows; all
            before any launch.
    """
    from ..topk.api import seeded_outcome, topk_scores

    from ..topk.config import check_config as check_topk_config

    k = check_k(k)
    config = check_config(config)
    topk_config = check_topk_config(topk_config)
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if k > BLOCK_TOPK_MAX_K and (path == "block" or config.naive):
        raise ValueError(f"k={k}: the fused block top-K supports k <= {BLOCK_TOPK_MAX_K} (its shared buffer); "
                         f"the filter path (path='filter', not naive) takes k <= {MAX_K}")
    dreq, access, elig, cand, n_items = _prepare(request, table, eligible, candidates, unique=True)
    config = checked_math(config, dreq, table)
    if config.naive and dreq.model != "gated":
        raise ValueError("the naive kernel implements the gated model only")
    # whether the block top-K can run for this request: else the fallback is scores to memory
    block_fits = k <= BLOCK_TOPK_MAX_K and (config.naive or shared_bytes(dreq, k, config, access,
                                                                         dtype=table.dtype) <= SHARED_BYTES)
    if path == "block" and not block_fits:
        check_shared(dreq, k, config, access, dtype=table.dtype)  # raises, naming the bytes
    if not config.naive:
        check_shared(dreq, 0, config, access, dtype=table.dtype)  # the filter pass and the scores-to-memory fallback
        _check_runnable(dreq, table, access, config)
        if block_fits:
            _check_runnable(dreq, table, access, config, k)
    sfw = None
    if path != "block" and not config.naive:
        sfw = _workspace(table, ("filter", n_items, k, access, topk_config),
                         lambda: ScoreFilterWorkspace.make(n_items, k, access, topk_config))
    if sfw is not None:
        copied = _filter_path(dreq, table, k, access, elig, cand, n_items, config, sfw)
        c, ids, scores = _answer(sfw, copied)
        if seeded_outcome(sfw.fws, k, c) == "exact":
            return TopK(ids=ids, scores=scores, count=int(c[0]))
    if block_fits:
        ws = _workspace(table, ("block", n_items, k, config.threads(), config.blocks_per_sm),
                        lambda: topk_workspace(table, k, n_items, config))
        launch_score_topk(dreq, table, k, access, elig, cand, n_items, config, ws)
        return TopK(ids=ws.out_id[0].copy_to_host(), scores=ws.out_s[0].copy_to_host(),
                    count=int(ws.counts.copy_to_host()[0, 0]))
    # above the block top-K's limit without an exact seeded answer: scores to memory (NaN where
    # ineligible), then topk_scores over them by ad id
    out = launch.cuda().device_array(n_items, np.float32)
    launch_score(dreq, table, access, elig, cand, n_items, out, config)
    ids = table.ad_ids
    if cand is not None:
        ids = table.ad_ids.copy_to_host()[cand.copy_to_host()]
    return topk_scores(out, k, ids=ids, config=topk_config)


def _filter_path(dreq, table, k, access, elig, cand, n_items, config, sfw):
    """:func:`~.launches.launch_score_filter`, replayed: the first call of a workspace for a
    configuration and request shape records its launches (:class:`~andromeda_nb.device.launch.Recorder`);
    later calls replay them bound, pointed at this call's weights and eligible set or candidates
    (Numba's dispatch of the six launches, the weights tuple's among them, cost milliseconds of host
    time a call). The answer lands in ``sfw.fws``; returns whether its copies to the host are
    enqueued too (the whole pool's graph, :class:`_Replay`)."""
    from .launches import _resolve, _weight_args

    cfg = _resolve(config, dreq, table, access, selects=True)
    replays = sfw.__dict__.setdefault("replays", {})
    key = (cfg, dreq.model, dreq.d, dreq.experts, dreq.k_experts)
    if key not in replays:
        image, params = _weight_args(dreq, cfg)  # the very arrays the launches take (fp16 math: per-lane fp16)
        inputs = {"image": image, "elig": elig, "cand": cand, "params": params[0] if params else None}
        if cfg.kernel_row_scales(table.dtype):
            table.scale_pairs()  # made before recording: a replay reads the kept pairs, never remakes them
        with launch.Recorder() as rec:
            launch_score_filter(dreq, table, k, access, elig, cand, n_items, config, sfw)
        replays[key] = _Replay(rec.launches, inputs)
        return False
    replay = replays[key]
    host = _host_weight_image(dreq, cfg)
    image = replay.stage(host) if host is not None else _weight_args(dreq, cfg)[0]
    params = dreq.param_weights() if cfg.weights == "param" else None
    return replay.run({"image": image, "elig": elig, "cand": cand, "params": params}, lambda: _copy_answer(sfw))


def _host_weight_image(dreq: DeviceRequest, cfg: KernelConfig):
    """The host array of the weight image a resolved ``cfg``'s kernels read, where the request has
    none on the device yet (a replay copies it into its own buffer), else None."""
    if cfg.tensor_cores:
        return None
    if cfg.math == "fp16":
        return dreq.host_mma_f16_image() if getattr(dreq, "_mma_f16", None) is None else None
    return dreq.host_image if dreq._image is None else None


def _answer(sfw, copied: bool) -> tuple:
    """The filter path's counts row, ids and scores: three asynchronous copies into the
    workspace's pinned buffers (unless ``copied``: the call's graph enqueued them) and one
    synchronisation (not three synchronous copies)."""
    if not copied:
        _copy_answer(sfw)
    launch.synchronize()
    return sfw.host_counts.copy(), sfw.host_ids.copy(), sfw.host_scores.copy()


def _copy_answer(sfw) -> None:
    """Enqueue the copies of the answer (row 0 of the filter workspace's counts, ids and scores:
    their first bytes) into the workspace's pinned buffers, made on first use."""
    fws = sfw.fws
    if getattr(sfw, "host_counts", None) is None:
        cuda = launch.cuda()
        sfw.host_counts = cuda.pinned_array(fws.counts.shape[1], fws.counts.dtype)
        sfw.host_ids = cuda.pinned_array(fws.out_id.shape[1], fws.out_id.dtype)
        sfw.host_scores = cuda.pinned_array(fws.out_s.shape[1], fws.out_s.dtype)
    for host, dev in ((sfw.host_counts, fws.counts), (sfw.host_ids, fws.out_id), (sfw.host_scores, fws.out_s)):
        launch.copy_async(host, dev, host.nbytes)


class _Replay:
    """Recorded launches bound once; each run points the arguments that were the recording's
    per-call inputs (weights image, parameter weights, eligible bitset, candidates) at this call's.

    Where nothing a call passes differs but the contents of the replay's own staged weights (the
    whole pool, weights staged by :meth:`stage`, no parameter weights), the launches and the
    answer's copies run as one CUDA graph (:func:`~andromeda_nb.device.launch.capture_graph`),
    captured on the first such run: one driver call where six launches and three copies were
    one each, and no gap on the GPU between a small kernel and the host's next launch."""

    def __init__(self, launches, inputs: dict):
        self.bound = launch.bind_all(launches)
        self.graph, self._graph_image, self._graph_tried = None, None, False
        self.points = []  # (bound launch, argument index, input name)
        for b, (_, _, _, args) in zip(self.bound, launches):
            for i, a in enumerate(args):
                for name, v in inputs.items():
                    if v is not None and a is v:
                        self.points.append((b, i, name))

    def stage(self, host: np.ndarray):
        """``host`` (a request's weight image) copied, in stream order, into this replay's own
        device buffer (kept, with its pinned host twin): no allocation and no synchronous copy a
        call. The previous call synchronised, so its copy out of the pinned buffer is done."""
        staged = getattr(self, "_staged", None)
        if staged is None or staged[0].shape != host.shape or staged[0].dtype != host.dtype:
            cuda = launch.cuda()
            staged = self._staged = (cuda.pinned_array(host.shape, host.dtype),
                                     cuda.device_array(host.shape, host.dtype))
        pinned, dev = staged
        pinned[...] = host
        launch.copy_async(dev, pinned, host.nbytes)
        return dev

    def run(self, inputs: dict, copy_answer=None) -> bool:
        """Enqueue this call's launches, pointed at ``inputs``, and where a graph takes them
        (see the class) ``copy_answer()``'s copies after them. Returns whether the copies were
        enqueued (else the caller enqueues them)."""
        staged = getattr(self, "_staged", None)
        graphable = (copy_answer is not None and staged is not None and inputs["image"] is staged[1]
                     and all(inputs[name] is None for name in ("elig", "cand", "params")))
        if graphable and not self._graph_tried:
            self._graph_tried = True
            self._point(inputs)
            self.graph = launch.capture_graph([self._enqueue, copy_answer])
            self._graph_image = staged[1]
        if graphable and self.graph is not None and self._graph_image is staged[1]:
            self.graph()
            return True
        self._point(inputs)
        self._enqueue()
        return False

    def _point(self, inputs: dict) -> None:
        for b, i, name in self.points:
            v = inputs[name]
            if name == "params":
                b.set_floats(i, v)
            else:
                b.set_array(i, v, 0, v.shape[0])

    def _enqueue(self) -> None:
        for b in self.bound:
            b()


def _workspace(table: DeviceAdTable, key: tuple, make):
    """The table's workspace for ``key``, made (``make()``, which may return None: no workspace
    applies) on first use and kept, up to :data:`WORKSPACES_PER_TABLE` per table."""
    cache = table.__dict__.setdefault("_workspaces", {})
    if key in cache:
        ws = cache.pop(key)
    else:
        ws = make()
        while len(cache) >= WORKSPACES_PER_TABLE:
            cache.pop(next(iter(cache)))
    cache[key] = ws  # most recently used last
    return ws
