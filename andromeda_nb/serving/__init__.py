"""Serving a pool split across workers: the exact merge of the shards' answers (:mod:`.merge`)."""

from .merge import merge_topk

__all__ = ["merge_topk"]
