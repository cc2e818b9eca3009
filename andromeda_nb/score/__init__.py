"""Scoring: the fused gather-gate-score kernels (generated per shape), their host wrappers, the
first loop kernel (``naive``) and the unfused baselines.

Importing this package does not import ``numba.cuda``.
"""

from .api import DeviceAdTable, DeviceRequest, KernelConfig, score_ads, score_topk

__all__ = ["DeviceAdTable", "DeviceRequest", "KernelConfig", "score_ads", "score_topk"]
