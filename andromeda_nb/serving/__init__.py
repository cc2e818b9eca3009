"""Serving a pool across workers: the exact merge of the shards' answers (:mod:`.merge`), the two
topologies and the sharded pool on Dask (:mod:`.cluster`, needs ``dask[distributed]``: the
``serving`` extra) and the bytes their comms carry (:mod:`.transport`)."""

from .merge import merge_topk

__all__ = ["merge_topk"]
