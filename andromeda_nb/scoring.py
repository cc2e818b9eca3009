"""Host wrappers of the fused gather-gate-score kernels (kernels/score.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import launch
from .model import MAX_EXPERTS, AdTable, Request, TopK
from .topk import MAX_ITEMS, check_k, eligible_bitset, merge

#: Embedding dimensions the kernels accept: multiples of 8 (whole 8-byte pieces for every dtype).
MAX_D = 256


def check_kernel_shape(d: int, experts: int) -> None:
    """Raise ValueError unless the kernels support this (d, E)."""
    if d % 8 or not 8 <= d <= MAX_D:
        raise ValueError(f"kernels need d a multiple of 8 in 8..{MAX_D}, got d={d}")
    if not 1 <= experts <= MAX_EXPERTS:
        raise ValueError(f"kernels need 1 <= E <= {MAX_EXPERTS}, got E={experts}")


class DeviceAdTable:
    """An :class:`~andromeda_nb.model.AdTable` resident on the device in a kernel layout.

    Args:
        table: the host table.
        layout: ``"rows"`` (``[n_ads, d]``) or ``"tiles"`` (``[d/W, n_ads, W]``, W = 8 / itemsize);
            see kernels/score.py.

    Raises:
        ValueError: unsupported d or layout, or more than 2**31 - 1 ads.
    """

    def __init__(self, table: AdTable, layout: str = "rows"):
        from .kernels.score import LAYOUTS, tile_width

        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        check_kernel_shape(table.d, 1)
        if table.n_ads > MAX_ITEMS:
            raise ValueError(f"at most {MAX_ITEMS} ads per table, got {table.n_ads}")
        self.table = table
        self.layout = layout
        emb = table.embeddings
        if layout == "tiles":
            W = tile_width(table.dtype)
            emb = np.ascontiguousarray(emb.reshape(table.n_ads, table.d // W, W).transpose(1, 0, 2))
        self.embeddings = launch.to_device(emb)
        self.bias = launch.to_device(table.bias)
        self.scale = launch.to_device(table.scale) if table.scale is not None else launch.dummy(np.float32)
        self.ad_ids = launch.to_device(table.ad_ids)

    n_ads = property(lambda self: self.table.n_ads)
    d = property(lambda self: self.table.d)
    dtype = property(lambda self: self.table.dtype)


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

    req = dreq.request
    kern = gated_score_kernel(req.d, req.experts, req.k_experts, table.dtype, table.layout,
                              access, block, topk_k, topk_k > 0)
    kern[grid, block](
        table.embeddings, table.scale, table.bias, dreq.G, dreq.V, dreq.gamma, dreq.beta,
        elig if elig is not None else launch.dummy(np.uint64),
        cand if cand is not None else launch.dummy(np.int32),
        n_items, table.ad_ids,
        out if out is not None else launch.dummy(np.float32),
        cand_s if cand_s is not None else launch.dummy(np.float32),
        cand_i if cand_i is not None else launch.dummy(np.int32),
        counts if counts is not None else launch.dummy(np.int64),
    )


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
    block = block or launch.default_block()
    _launch(dreq, table, access, elig, cand, n_items, launch.grid_for(n_items, block), block, 0,
            out, None, None, None)
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
    cuda = launch.cuda()
    block = block or launch.default_block()
    grid = launch.grid_for(n_items, block)
    cand_s = cuda.device_array(grid * k, np.float32)
    cand_i = cuda.device_array(grid * k, np.int32)
    counts = cuda.to_device(np.zeros(1, np.int64))
    _launch(dreq, table, access, elig, cand, n_items, grid, block, k, None, cand_s, cand_i, counts)
    ids, scores = merge(cand_s, cand_i, k, table.ad_ids, block)
    return TopK(ids=ids, scores=scores, count=int(counts.copy_to_host()[0]))
