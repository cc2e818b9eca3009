"""``retrieve``: one request (or a batch) through targeting match, fused scoring and top-K, as a
function of a device table and a device index.

It serves through a :class:`~.pool.Pool` kept on the table for that index (built on the first
call, its buffers sized for a batch of up to :data:`BATCH` and k up to :data:`K`; rebuilt with a
larger k when a call needs one, while a batch larger than its buffers is served in chunks), so
repeated calls are warm. Code that serves many requests should hold a
:class:`~.pool.Pool` itself.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..match import DeviceTargetingIndex
from ..model import Request
from ..score.table import DeviceAdTable
from ..topk.api import check_k
from .pool import Pool, Retrieved

#: the kept pool's buffers: requests per call and the largest k, at least
BATCH = 16
K = 1000


def retrieve(requests: Request | Sequence[Request], table: DeviceAdTable,
             index: DeviceTargetingIndex | None, profiles: Mapping | Sequence[Mapping] | None,
             k: int, exclude_slots=None) -> Retrieved | list[Retrieved]:
    """Targeting -> fused gather-gate-score -> top-K, on the device.

    Args:
        requests: one :class:`~andromeda_nb.model.Request` or a sequence (a batch).
        table: the device ad table; its slots must be the index's slots.
        index: the device targeting index, or None to score the whole pool.
        profiles: one profile ``{category: values}`` per request (a single mapping for a single
            request); ignored when ``index`` is None.
        k: ``1 <= k <= MAX_K`` (4096).
        exclude_slots: per request, optional slots to drop after matching (e.g. ads already seen).

    Returns:
        :class:`~.pool.Retrieved` for a single request, a list for a batch.

    Raises:
        TypeError / ValueError / RuleError: mismatched pool sizes or ad ids, batch lengths, bad k,
            bad profile (all before any launch for that request).
    """
    k = check_k(k)
    if not isinstance(table, DeviceAdTable):
        raise TypeError(f"table must be a DeviceAdTable, got {type(table).__name__}")
    if index is not None and not isinstance(index, DeviceTargetingIndex):
        raise TypeError(f"index must be a DeviceTargetingIndex or None, got {type(index).__name__}")
    single = not isinstance(requests, (list, tuple))  # a Request, a DeviceRequest or a user vector
    n = 1 if single else len(requests)
    pools = table.__dict__.setdefault("_pools", {})
    key = None if index is None else id(index)
    pool = pools.get(key)
    stale = pool is not None and index is not None and pool._index_version != index.version
    if pool is None or pool.index is not index or k > pool.max_k or stale:
        pool = Pool(table, index, max_batch=max(BATCH, min(n, 64)), max_k=max(K, k))
        pools[key] = pool
    if index is not None and profiles is None:
        raise ValueError("retrieve with a targeting index needs one profile per request")
    return pool.retrieve(requests, profiles, k, exclude_slots)
