"""Host side of the unfused baselines (score/unfused_kernels.py), with their byte budgets.

Both return the same answer as the fused path (same ids and scores: the per-op pipeline's scores
differ from the fused kernel's only by fp32 rounding order, the pre-fusion pipeline's are bitwise
the fused kernel's), so the benchmarks can check them like any other variant.
"""

from __future__ import annotations

import numpy as np

from ..device import launch
from ..model import STORAGE_DTYPES
from .config import DEFAULT_CONFIG
from .launches import launch_score
from .table import DeviceAdTable, DeviceRequest
from ..topk.api import launch_topk

ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}


ACCESS = ("pool", "bitset", "candidates")


def _check_budget_args(d, dtype: str, access: str, eligible_fraction) -> None:
    if not isinstance(dtype, str) or dtype not in ITEMSIZE or access not in ACCESS or not (isinstance(d, (int, np.integer)) and d >= 1):
        raise ValueError(f"need d >= 1 (int), dtype in {sorted(ITEMSIZE)} and access in {ACCESS}; "
                         f"got {d!r}, {dtype!r}, {access!r}")
    if not 0 < eligible_fraction <= 1:
        raise ValueError(f"eligible_fraction must be in (0, 1], got {eligible_fraction!r}")


def fused_bytes_per_ad(d: int, dtype: str, access: str = "pool", eligible_fraction: float = 1.0) -> float:
    """Bytes the fused kernel moves per scored ad: the row, the bias, the int8 scale, and the
    bitset share (bitset access) or the candidate slot (candidates access). Raises ValueError for
    an unknown dtype or access, d < 1 or a fraction outside (0, 1]."""
    _check_budget_args(d, dtype, access, eligible_fraction)
    b = d * ITEMSIZE[dtype] + 4 + (4 if dtype == "int8" else 0)
    if access == "bitset":
        b += 1 / (8 * eligible_fraction)
    elif access == "candidates":
        b += 4
    return b


def per_op_bytes_per_ad(d: int, E: int, K: int, dtype: str, access: str = "pool",
                        eligible_fraction: float = 1.0) -> dict:
    """Bytes per scored ad of each per-op kernel (reads + writes), fp32 intermediates. Off the
    pool, the listed slots are read by encode and combine (4 bytes each) and the ad ids gathered
    for the top-K (slot, id read, id written: 20); a bitset is first compacted into that list
    (the bitset's share and the slot written). Raises ValueError as :func:`fused_bytes_per_ad`."""
    _check_budget_args(d, dtype, access, eligible_fraction)
    row = d * ITEMSIZE[dtype] + (4 if dtype == "int8" else 0)
    slot = 0 if access == "pool" else 4
    out = {}
    if access == "bitset":
        out["list"] = 1 / (8 * eligible_fraction) + 4
    out.update({
        "encode": row + 4 * d + slot,
        "gate": 4 * d + 4 * E,
        "choose": 4 * E + K * (1 + 4),
        "values": 4 * d + K + 4 * K,
        "combine": 4 * K + 4 * K + 4 + 4 + slot,
    })
    if access != "pool":
        out["ids"] = 20
    out["topk"] = 4
    return out


def pre_fusion_bytes_per_ad(d: int, dtype: str, access: str, eligible_fraction: float = 1.0) -> dict:
    """Bytes per scored ad of the pre-fusion pipeline: list building (bitset access), gather
    (read row + bias, write both; the slot off the pool), the candidates' ad ids (id read and
    written; the slot off the pool), model (read row + bias, write score), top-K (read score).
    Raises ValueError as :func:`fused_bytes_per_ad`."""
    _check_budget_args(d, dtype, access, eligible_fraction)
    row = fused_bytes_per_ad(d, dtype)  # row, bias (and the int8 scale)
    slot = 4 if access != "pool" else 0
    out = {}
    if access == "bitset":
        out["list"] = 1 / (8 * eligible_fraction) + 4
    out["gather"] = 2 * row + slot
    out["ids"] = 16 + slot
    out["model"] = row + 4
    out["topk"] = 4
    return out


def network_bytes_per_request(n_candidates: int, k: int, d: int = 64, dtype: str = "fp16") -> dict:
    """Bytes one request sends over the network between retrieval and scoring, per design
    (counted, not measured): the candidate list shipped to a scoring tier elsewhere, as 8-byte ad
    ids (the tier holds the embedding table) or with each candidate's row and bias (it does not),
    against the fused design's answer, ``min(k, n_candidates)`` (id, score) pairs of 8 + 4 bytes and
    an 8-byte count. The source system fused these stages on one GPU so that only the final result
    leaves it.

    Args: ``n_candidates`` (ads passing targeting, >= 0), ``k`` (>= 1), ``d`` and ``dtype`` (the
    table's rows: ``d * itemsize + 4`` bytes of row and bias, + 4 for an int8 row scale).
    Returns: dict design -> bytes per request (floats).
    Raises: ValueError for a negative count, k < 1 or an unknown dtype.
    """
    ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (n_candidates, k))
    if not ints or n_candidates < 0 or k < 1:
        raise ValueError(f"need n_candidates >= 0 and k >= 1 (ints), got {n_candidates!r}, {k!r}")
    row = fused_bytes_per_ad(d, dtype)  # row, bias (and the int8 scale); checks d and dtype
    return {
        "candidate ids": 8.0 * n_candidates,
        "candidate ids + rows": float((8 + row) * n_candidates),
        "final top-K (fused)": 12.0 * min(k, n_candidates) + 8,
    }


class PerOpBuffers:
    """Device intermediates of the per-op pipeline for up to n scored ads (allocated once,
    reused), and the slot list and ad ids of a bitset or candidate run."""

    def __init__(self, n: int, d: int, E: int, K: int):
        cuda = launch.cuda()
        n = max(int(n), 1)
        self.h = cuda.device_array((d, n), np.float32)
        self.logits = cuda.device_array((E, n), np.float32)
        self.chosen = cuda.device_array((K, n), np.int8)
        self.weight = cuda.device_array((K, n), np.float32)
        self.val = cuda.device_array((K, n), np.float32)
        self.score = cuda.device_array(n, np.float32)
        self.slots = cuda.device_array(n, np.int32)
        self.count = cuda.device_array(1, np.int64)
        self.ids = cuda.device_array(n, np.int64)


def launch_per_op(dreq: DeviceRequest, table: DeviceAdTable, k: int, bufs: PerOpBuffers, block: int | None = None,
                  ws=None, elig=None, cand=None, m: int | None = None):
    """Enqueue the per-op pipeline over the whole pool, or over ``m`` candidates given as an int32
    slot list ``cand`` (distinct slots of the table) or a uint64 eligible bitset ``elig``
    ``[ceil(n_ads / 64)]`` (compacted into a list first). ``m`` is the bitset's count of set
    bits; it is not checked against the bitset (that would read the count back inside a timed
    call; the benchmarks check every answer against torch.topk), but the compaction never writes
    past the buffers. Returns the top-K workspace (results in ``ws.out_id[0]``, ``ws.out_s[0]``,
    ``ws.counts[0]``; ids are the table's ad ids; a given ``ws`` must be sized for the items).

    Raises:
        TypeError / ValueError (before any launch): k out of range; both ``elig`` and ``cand``; a
            bitset without ``m`` or of the wrong dtype or length; ``m`` not an int in 0..len(cand)
            (a list) or given without a list or bitset; ``cand`` not int32 1-D; more items than
            ``bufs`` holds or buffers of other dimensions.
    """
    from . import unfused_kernels as U
    from ..topk.api import check_k

    r = dreq.request
    d, E, K = table.d, r.experts, r.k_experts
    k = check_k(k)
    if elig is not None and cand is not None:
        raise ValueError("give an eligible bitset or a candidate list, not both")
    if m is not None and (not isinstance(m, (int, np.integer)) or isinstance(m, bool) or m < 0):
        raise ValueError(f"m must be a non-negative int, got {m!r}")
    if elig is None and cand is None and m is not None:
        raise ValueError("m counts the items of a bitset or candidate list; neither was given")
    if elig is not None:
        if m is None:
            raise ValueError("a bitset run needs m, its count of set bits")
        launch.check_array("elig", elig, np.uint64, shape=(-(-table.n_ads // 64),))
    if cand is not None:
        launch.check_array("cand", cand, np.int32, ndim=1)
        if m is not None and m != cand.shape[0]:
            raise ValueError(f"m = {m} but the candidate list holds {cand.shape[0]}")
    if (bufs.h.shape[0], bufs.logits.shape[0], bufs.chosen.shape[0]) != (d, E, K):
        raise ValueError(f"buffers for d, E, K = {bufs.h.shape[0], bufs.logits.shape[0], bufs.chosen.shape[0]}, "
                         f"the request and table have {d, E, K}")
    gather = elig is not None or cand is not None
    n = table.n_ads if not gather else int(cand.shape[0] if m is None else m)
    if n > bufs.score.shape[0]:
        raise ValueError(f"{n} items, but the buffers hold {bufs.score.shape[0]}")
    block = block or launch.default_block()
    grid = launch.grid_for(max(n, 1), block)
    G, V, gamma, beta = dreq.naive_arrays()
    slots, ids = bufs.slots, table.ad_ids
    if elig is not None:
        _compact_bitset(elig, bufs.slots, bufs.count, block)
    elif cand is not None:
        slots = cand
    if gather:
        U.gather_ids_kernel()[grid, block](table.ad_ids, slots, n, bufs.ids)
        ids = bufs.ids[:max(n, 1)]
    U.encode_kernel(d, table.dtype, table.layout, gather)[grid, block](table.words, table.scale, gamma, beta, n,
                                                                      bufs.h, slots)
    U.gate_kernel(d, E)[grid, block](bufs.h, G, n, bufs.logits)
    U.choose_kernel(E, K)[grid, block](bufs.logits, n, bufs.chosen, bufs.weight)
    U.values_kernel(d, K)[grid, block](bufs.h, V, bufs.chosen, n, bufs.val)
    U.combine_kernel(K, gather)[grid, block](bufs.weight, bufs.val, table.bias, n, bufs.score, slots)
    return launch_topk(bufs.score[:max(n, 1)], n, k, None, ids, block, ws=ws)[0]


def _compact_bitset(elig, slots, count, block: int) -> None:
    """Enqueue the slots of an eligible bitset's set bits into ``slots`` (never past its end) and
    their count into ``count[0]``."""
    from . import unfused_kernels as U

    U.zero_kernel()[1, 1](count)
    U.bitset_to_slots_kernel()[launch.grid_for(elig.shape[0], block), block](elig, slots, count)


class PreFusionBuffers:
    """Device buffers of the pre-fusion pipeline for up to ``cap`` candidates."""

    def __init__(self, cap: int, d: int, dtype: str):
        cuda = launch.cuda()
        self.slots = cuda.device_array(max(cap, 1), np.int32)
        self.count = cuda.device_array(1, np.int64)
        self.emb = cuda.device_array((max(cap, 1), d), STORAGE_DTYPES[dtype])
        self.words = self.emb.view(np.uint64)
        self.bias = cuda.device_array(max(cap, 1), np.float32)
        self.scores = cuda.device_array(max(cap, 1), np.float32)
        self.ids = cuda.device_array(max(cap, 1), np.int64)


def launch_pre_fusion(dreq: DeviceRequest, table: DeviceAdTable, k: int, bufs: PreFusionBuffers, m: int,
                      elig=None, cand=None, block: int | None = None, ws=None):
    """Enqueue gather -> model (scores to memory) -> top-K over ``m`` candidates given as a slot
    list ``cand`` (distinct slots) or an eligible bitset ``elig`` (compacted into a list first;
    ``m`` must be its count: not checked, as :func:`launch_per_op`). Returns the top-K workspace;
    ids are the table's ad ids. Raises ValueError for ``m`` past the buffers or not exactly one of
    ``elig`` / ``cand`` (before any launch)."""
    from . import unfused_kernels as U

    if not isinstance(m, (int, np.integer)) or isinstance(m, bool) or not 0 <= m <= bufs.slots.shape[0]:
        raise ValueError(f"m must be an int in 0..{bufs.slots.shape[0]} (the buffers' capacity), got {m!r}")
    if (elig is None) == (cand is None):
        raise ValueError("give an eligible bitset or a candidate list (exactly one)")
    block = block or launch.default_block()
    if elig is not None:
        _compact_bitset(elig, bufs.slots, bufs.count, block)
        cand = bufs.slots
    grid = launch.grid_for(m * bufs.words.shape[1], block)
    U.gather_rows_kernel(table.layout)[grid, block](table.words, table.bias, cand, m, bufs.words[:m], bufs.bias[:m])
    U.gather_ids_kernel()[launch.grid_for(max(m, 1), block), block](table.ad_ids, cand, m, bufs.ids)
    compact = DeviceAdTable.from_device(bufs.emb[:m], bufs.bias[:m], table.dtype, "rows", ad_ids=bufs.ids[:m])
    launch_score(dreq, compact, "pool", None, None, m, bufs.scores[:m], DEFAULT_CONFIG)
    return launch_topk(bufs.scores[:m], m, k, None, compact.ad_ids, block, ws=ws)[0]
