"""Targeting match on the device: the device copy of the index, eligible bitsets of one request or
a batch, updates ordered with requests on the stream, the CPU baseline and the byte model.

``kernels`` holds the ``@cuda.jit`` code; ``api`` the host side (validate, plan, upload, launch).
Importing this package does not import ``numba.cuda``.
"""

from .api import (DeviceTargetingIndex, Eligible, EligibleBatch, compact, match_batch, match_cpu, match_eligible,
                  read_model)

__all__ = ["DeviceTargetingIndex", "Eligible", "EligibleBatch", "compact", "match_batch", "match_cpu",
           "match_eligible", "read_model"]
