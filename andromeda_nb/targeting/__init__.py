"""Targeting on the host: categories and rules and their I/O, user profiles, the bitset index,
its per-request plans and its real-time updates (the device match lives in :mod:`andromeda_nb.match`).

Semantics (docs/design.md, "Targeting")::

    match(ad, user) = ad is live and for all categories c:
                      (I_c empty or I_c & U_c non-empty) and (X_c & U_c empty)

Modules, by job: ``schema`` (categories, profiles, :class:`RuleError`), ``rules`` (per-ad rules
and their record / JSON lines / DataFrame / CSR-column I/O), ``bits`` (slot bitsets), ``layout``
(folded groups, split categories, a request's :class:`MatchPlan`), ``index``
(:class:`TargetingIndex`: build, plan, updates, CPU match), ``updates`` (:class:`UpdateBatch`,
:class:`UpdateDelta`). The Numba host kernels (``build_kernels``, ``update_kernels``,
``cpu_kernels``) are imported by the functions that call them: importing this package does not
import numba (the backend is fixed first; see :mod:`andromeda_nb.device.backend`).
"""

from .bits import WORD_BITS, bit_of, bits_from_mask, last_word_mask, mask_from_bits, table_slots, word_of
from .index import TargetingIndex
from .layout import IndexLayout, MatchPlan, choose_layout
from .rules import AdRule, TargetingRules
from .schema import Category, ProfileBatch, RuleError, TargetingSchema, make_profile
from .updates import CHANGE, CREATE, RETIRE, UpdateBatch, UpdateDelta


def host_kernels() -> dict:
    """Every Numba host kernel of this package by name (index build, update deltas, CPU match),
    for inspection and timing; importing numba on the first call. The package imports them by
    name from ``build_kernels``, ``update_kernels`` and ``cpu_kernels``; each compiles on its
    first call."""
    from . import build_kernels, cpu_kernels, numba_common, update_kernels

    out = {"popc": numba_common.popc}
    for mod in (build_kernels, update_kernels, cpu_kernels):
        out.update({name: f for name, f in vars(mod).items() if hasattr(f, "py_func") and f.__module__ == mod.__name__})
    return out


__all__ = ["CHANGE", "CREATE", "RETIRE", "WORD_BITS", "AdRule", "Category", "IndexLayout", "MatchPlan", "ProfileBatch", "RuleError",
           "TargetingIndex", "TargetingRules", "TargetingSchema", "UpdateBatch", "UpdateDelta", "bits_from_mask",
           "choose_layout", "make_profile", "mask_from_bits", "table_slots", "bit_of", "host_kernels",
           "last_word_mask", "word_of"]
