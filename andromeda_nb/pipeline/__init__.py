"""The request path: targeting match -> fused scoring + top-K -> ad ids, on one device."""

from .retrieve import Retrieved, retrieve

__all__ = ["Retrieved", "retrieve"]
