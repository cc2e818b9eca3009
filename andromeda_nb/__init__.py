"""andromeda-nb: a Numba-CUDA sandbox for Andromeda-style ads retrieval.

Host-side pieces (numpy only) import eagerly; anything that touches ``numba.cuda`` is imported on
first use, so a notebook can call :func:`set_backend` after its parameters cell.
"""

from importlib import import_module

from .device.backend import device_name, get_backend, set_backend
from .model import AdTable, Request, TopK
from .targeting import (Category, ProfileBatch, RuleError, TargetingIndex, TargetingRules, TargetingSchema,
                        make_profile)

__version__ = "0.1.0"

_LAZY = {
    "DeviceAdTable": "score",
    "DeviceRequest": "score",
    "score_ads": "score",
    "score_topk": "score",
    "KernelConfig": "score",
    "topk_scores": "topk",
    "topk_batch": "topk",
    "MAX_K": "topk",
    "BLOCK_TOPK_MAX_K": "topk",
    "DeviceTargetingIndex": "match",
    "match_eligible": "match",
    "retrieve": "pipeline",
    "Retrieved": "pipeline",
    "Pool": "pipeline",
    "PoolUpdate": "pipeline",
    "TopKConfig": "topk",
    "MatchConfig": "match",
}


def __getattr__(name):
    if name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # kept: later lookups skip this hook (~1.5 us a call on a serving path)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AdTable", "Category", "ProfileBatch", "Request", "RuleError", "TargetingIndex", "TargetingRules",
    "TargetingSchema", "TopK", "device_name", "get_backend", "make_profile", "set_backend", *_LAZY,
]
