"""The request path: targeting match -> fused scoring + top-K -> ad ids, on one device.

:class:`Pool` (:mod:`.pool`) is the serving object: built once, it keeps the table, the index and
every buffer a request needs on the device. :func:`retrieve` (:mod:`.retrieve`) is the
one-shot function over a device table and index. A pool stays live: :meth:`Pool.apply` takes a
:class:`PoolUpdate` (:mod:`.updates`, the columnar batch of ad creates, changes and retires).
"""

from .pool import Pool, Retrieved
from .retrieve import retrieve
from .step_times import StepTimes
from .updates import PoolUpdate

__all__ = ["Pool", "PoolUpdate", "Retrieved", "StepTimes", "retrieve"]
