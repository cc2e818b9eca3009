"""Scoring: the fused gather-gate-score kernel (generated per shape, :mod:`.fused`), its host side
(:mod:`.config`, :mod:`.table`, :mod:`.launches`, :mod:`.api`), the first loop kernel
(:mod:`.naive`) and the unfused baselines (:mod:`.unfused`).

Importing this package does not import ``numba.cuda``.
"""

from .api import score_ads, score_topk
from .config import DEFAULT_CONFIG, KernelConfig, with_config
from .table import DeviceAdTable, DeviceRequest

__all__ = ["DEFAULT_CONFIG", "DeviceAdTable", "DeviceRequest", "KernelConfig", "score_ads", "score_topk",
           "with_config"]
