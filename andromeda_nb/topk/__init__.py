"""Top-K selection on the device for one score array or a batch of requests.

Public entries and checks: :mod:`~andromeda_nb.topk.api`; the paths, their auto rule and the
configuration: :mod:`~andromeda_nb.topk.config`. Each job has a host module (workspaces and
``launch_*``: ``seed``, ``filter``, ``final``, ``scan``, ``batched``, ``single``, ``onelaunch``)
beside its kernels (``seed_kernels``, ``filter_kernels``, ``final_kernels``, ``block``,
``onelaunch_kernels``), which the host modules import on first launch.

Importing this package does not import ``numba.cuda``.
"""

from .api import BLOCK_TOPK_MAX_K, MAX_K, topk_batch, topk_scores
from .config import DEFAULT_CONFIG, TopKConfig, TopKTuning

__all__ = ["BLOCK_TOPK_MAX_K", "DEFAULT_CONFIG", "MAX_K", "TopKConfig", "TopKTuning", "topk_batch", "topk_scores"]
