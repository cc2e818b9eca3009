"""Targeting match on the device: the device copy of the index, eligible bitsets of one request or
a batch, updates ordered with requests on the stream, the CPU baseline and the byte model.

Modules: ``kernels`` (the ``@cuda.jit`` code), ``api`` (the host side: validate, plan, upload,
launch), ``config`` (:class:`MatchConfig`: how a batch is launched), ``staging`` (non-blocking
uploads), ``byte_model`` (:func:`read_model`, with its Numba host kernels in
``byte_model_kernels``). Importing this package does not import ``numba.cuda``.
"""

from .api import DeviceTargetingIndex, Eligible, EligibleBatch, compact, match_batch, match_cpu, match_eligible
from .byte_model import read_model
from .config import MatchConfig

__all__ = ["DeviceTargetingIndex", "Eligible", "EligibleBatch", "MatchConfig", "compact", "match_batch",
           "match_cpu", "match_eligible", "read_model"]
