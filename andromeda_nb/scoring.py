"""Host wrappers of the fused gather-gate-score kernels (kernels/score.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import launch
from .model import MAX_EXPERTS, AdTable, Request, TopK
from .topk import MAX_ITEMS, check_k, eligible_bitset, launch_merge

#: Embedding dimensions the kernels accept: multiples of 8 (whole 8-byte pieces for every dtype).
MAX_D = 256


def check_kernel_shape(d: int, experts: int) -> None:
    """Raise ValueError unless the kernels support this (d, E)."""
    if d % 8 or not 8 <= d <= MAX_D:
        raise ValueError(f"kernels need d a multiple of 8 in 8..{MAX_D}, got d={d}")
    if not 1 <= experts <= MAX_EXPERTS:
        raise ValueError(f"kernels need 1 <= E <= {MAX_EXPERTS}, got E={experts}")


class DeviceAdTable:
    """An ad table resident on the device in a kernel layout.

    Build it from a host :class:`~andromeda_nb.model.AdTable` (``DeviceAdTable(table, layout)``),
    or wrap arrays already on the device with :meth:`from_device` (benchmarks generate 100M-ad
    tables on the GPU).

    Args:
        table: the host table.
        layout: ``"rows"`` (``[n_ads, d]``) or ``"tiles"`` (``[d/W, n_ads, W]``, W = 8 / itemsize);
            see kernels/score.py.

    Attributes:
        n_ads, d, dtype, layout; device arrays ``embeddings``, ``bias``, ``scale`` (int8, else a
        dummy), ``ad_ids`` (int64); ``host_ad_ids`` (numpy, or None when unknown); ``table`` (the
        host table, or None).

    Raises:
        ValueError: unsupported d or layout, or more than 2**31 - 1 ads.
    """

    def __init__(self, table: AdTable, layout: str = "rows"):
        from .kernels.score import tile_width

        _check_layout(layout, table.d, table.n_ads)
        emb = table.embeddings
        if layout == "tiles":
            W = tile_width(table.dtype)
            emb = np.ascontiguousarray(emb.reshape(table.n_ads, table.d // W, W).transpose(1, 0, 2))
        self._set(launch.to_device(emb), launch.to_device(table.bias), table.dtype, layout,
                  launch.to_device(table.scale) if table.scale is not None else None,
                  launch.to_device(table.ad_ids), table.n_ads, table.d)
        self.table = table
        self.host_ad_ids = table.ad_ids

    def _set(self, embeddings, bias, dtype, layout, scale, ad_ids, n_ads, d):
        self.embeddings, self.bias, self.dtype, self.layout = embeddings, bias, dtype, layout
        self.scale = scale if scale is not None else launch.dummy(np.float32)
        self.ad_ids, self.n_ads, self.d = ad_ids, int(n_ads), int(d)
        self.table, self.host_ad_ids = None, None

    @classmethod
    def from_device(cls, embeddings, bias, dtype: str, layout: str = "rows", scale=None, ad_ids=None):
        """Wrap device arrays (Numba device arrays or anything with ``__cuda_array_interface__``).

        Args:
            embeddings: ``[n_ads, d]`` (rows) or ``[d/W, n_ads, W]`` (tiles) in the storage dtype of
                ``dtype`` (float32, float16, uint16 bf16 bits, int8).
            bias: ``float32[n_ads]``; scale: ``float32[n_ads]`` for int8; ad_ids: ``int64[n_ads]``
                (None: the slots 0..n_ads-1, materialised on the device).

        Raises:
            TypeError / ValueError: dtype or shape mismatches.
        """
        from .kernels.score import tile_width
        from .model import STORAGE_DTYPES

        cuda = launch.cuda()
        wrap = (lambda a: a if a is None or hasattr(a, "copy_to_host") else cuda.as_cuda_array(a))
        embeddings, bias, scale, ad_ids = map(wrap, (embeddings, bias, scale, ad_ids))
        if dtype not in STORAGE_DTYPES:
            raise ValueError(f"dtype must be one of {tuple(STORAGE_DTYPES)}, got {dtype!r}")
        if layout == "rows":
            launch.check_array("embeddings", embeddings, STORAGE_DTYPES[dtype], ndim=2)
            n_ads, d = embeddings.shape
        else:
            launch.check_array("embeddings", embeddings, STORAGE_DTYPES[dtype], ndim=3)
            n_ads, d = embeddings.shape[1], embeddings.shape[0] * embeddings.shape[2]
            if embeddings.shape[2] != tile_width(dtype):
                raise ValueError(f"tiles layout needs last axis {tile_width(dtype)} for {dtype}")
        _check_layout(layout, d, n_ads)
        launch.check_array("bias", bias, np.float32, shape=(n_ads,))
        if (scale is None) != (dtype != "int8"):
            raise ValueError("scale is required for int8 tables and only for them")
        if scale is not None:
            launch.check_array("scale", scale, np.float32, shape=(n_ads,))
        if ad_ids is None:
            ad_ids = cuda.to_device(np.arange(n_ads, dtype=np.int64))
        launch.check_array("ad_ids", ad_ids, np.int64, shape=(n_ads,))
        self = cls.__new__(cls)
        self._set(embeddings, bias, dtype, layout, scale, ad_ids, n_ads, d)
        return self


def _check_layout(layout: str, d: int, n_ads: int) -> None:
    from .kernels.score import LAYOUTS

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    check_kernel_shape(d, 1)
    if n_ads > MAX_ITEMS:
        raise ValueError(f"at most {MAX_ITEMS} ads per table, got {n_ads}")


@dataclass
class DeviceRequest:
    """A request's tensors on the device, in the kernel's form (G pre-scaled by 1/sqrt(d))."""

    request: Request
    G: object
    V: object
    gamma: object
    beta: object

    @classmethod
    def from_request(cls, request: Request) -> "DeviceRequest":
        check_kernel_shape(request.d, request.experts)
        G = (request.G.astype(np.float64) / np.sqrt(request.d)).astype(np.float32).ravel()
        return cls(request, launch.to_device(G), launch.to_device(request.V.ravel()),
                   launch.to_device(request.gamma), launch.to_device(request.beta))


def _prepare(request, table: DeviceAdTable, eligible, candidates):
    if not isinstance(table, DeviceAdTable):
        raise TypeError(f"table must be a DeviceAdTable, got {type(table).__name__}")
    dreq = request if isinstance(request, DeviceRequest) else DeviceRequest.from_request(request)
    if dreq.request.d != table.d:
        raise ValueError(f"request d={dreq.request.d} does not match table d={table.d}")
    if eligible is not None and candidates is not None:
        raise ValueError("give eligible or candidates, not both")
    n = table.n_ads
    if candidates is not None:
        launch.check_array("candidates", candidates, np.int32, ndim=1)
        if isinstance(candidates, np.ndarray) and candidates.size:
            lo, hi = int(candidates.min()), int(candidates.max())
            if lo < 0 or hi >= n:
                raise ValueError(f"candidate slots must be in 0..{n - 1}, got range {lo}..{hi}")
        return dreq, "candidates", None, launch.to_device(candidates), int(candidates.shape[0])
    if eligible is not None:
        return dreq, "bitset", eligible_bitset(eligible, n), None, n
    return dreq, "pool", None, None, n


def _launch(dreq, table, access, elig, cand, n_items, grid, block, topk_k, out, cand_s, cand_i, counts):
    from .kernels.score import gated_score_kernel
    from .kernels.topk import buffer_capacity

    req = dreq.request
    cap = buffer_capacity(topk_k, block) if topk_k else 0
    kern = gated_score_kernel(req.d, req.experts, req.k_experts, table.dtype, table.layout,
                              access, block, cap, topk_k > 0)
    kern[grid, block](
        table.embeddings, table.scale, table.bias, dreq.G, dreq.V, dreq.gamma, dreq.beta,
        elig if elig is not None else launch.dummy(np.uint64),
        cand if cand is not None else launch.dummy(np.int32),
        n_items, table.ad_ids, topk_k,
        out if out is not None else launch.dummy(np.float32),
        cand_s if cand_s is not None else launch.dummy(np.float32),
        cand_i if cand_i is not None else launch.dummy(np.int32),
        counts if counts is not None else launch.dummy(np.int64),
    )


def launch_score(dreq: "DeviceRequest", table: DeviceAdTable, access: str, elig, cand, n_items: int,
                 out, block: int | None = None) -> None:
    """Enqueue the scores-to-memory kernel (no validation, no host copies; for benchmarks and
    :func:`score_ads`). ``out``: device ``float32[n_items]``."""
    block = block or launch.default_block()
    _launch(dreq, table, access, elig, cand, n_items, launch.grid_for(n_items, block), block, 0,
            out, None, None, None)


def launch_score_topk(dreq: "DeviceRequest", table: DeviceAdTable, k: int, access: str, elig, cand,
                      n_items: int, block: int | None = None):
    """Enqueue fused scoring + block top-K + merge (no validation, no host copies).

    Returns:
        Device arrays ``(ids int64[k], scores float32[k], count int64[1])``.
    """
    cuda = launch.cuda()
    block = block or launch.default_block()
    grid = launch.grid_for(n_items, block)
    cand_s = cuda.device_array(grid * k, np.float32)
    cand_i = cuda.device_array(grid * k, np.int32)
    counts = cuda.to_device(np.zeros(1, np.int64))
    _launch(dreq, table, access, elig, cand, n_items, grid, block, k, None, cand_s, cand_i, counts)
    ids, scores = launch_merge(cand_s, cand_i, k, table.ad_ids, block)
    return ids, scores, counts


def score_ads(request, table: DeviceAdTable, eligible=None, candidates=None, block: int | None = None):
    """Scores of the fused gated model, written to device memory (the unfused-top-K path).

    Args:
        request: :class:`~andromeda_nb.model.Request` or :class:`DeviceRequest`.
        table: :class:`DeviceAdTable`.
        eligible: optional bool ``[n_ads]`` mask or uint64 bitset: only eligible rows are read;
            ineligible slots get NaN.
        candidates: optional ``int32[m]`` slots to score (gather); the output is ``[m]``.
        block: threads per block.

    Returns:
        Device ``float32[n_ads]`` (or ``[m]`` for candidates).

    Raises:
        TypeError / ValueError: bad table, request, mask, candidates (slots out of range).
    """
    dreq, access, elig, cand, n_items = _prepare(request, table, eligible, candidates)
    out = launch.cuda().device_array(n_items, np.float32)
    launch_score(dreq, table, access, elig, cand, n_items, out, block)
    return out


def score_topk(request, table: DeviceAdTable, k: int, eligible=None, candidates=None,
               block: int | None = None) -> TopK:
    """Fused scoring + block top-K: scores never reach device memory; only the k ad ids, k scores
    and the count come back to the host.

    Args:
        request, table, eligible, candidates, block: as for :func:`score_ads`.
        k: ``1 <= k <= topk.MAX_K``.

    Returns:
        :class:`~andromeda_nb.model.TopK` by ad id (ties to the lower ad id), count = ads scored
        with a non-NaN score.
    """
    k = check_k(k)
    dreq, access, elig, cand, n_items = _prepare(request, table, eligible, candidates)
    ids, scores, count = launch_score_topk(dreq, table, k, access, elig, cand, n_items, block)
    return TopK(ids=ids.copy_to_host(), scores=scores.copy_to_host(), count=int(count.copy_to_host()[0]))
