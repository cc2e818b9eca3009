"""Top-K selection on the device for one score array or a batch of requests.

Importing this package does not import ``numba.cuda``.
"""

from .api import BLOCK_TOPK_MAX_K, MAX_K, topk_batch, topk_scores

__all__ = ["BLOCK_TOPK_MAX_K", "MAX_K", "topk_batch", "topk_scores"]
