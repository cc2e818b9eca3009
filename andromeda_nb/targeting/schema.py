"""Targeting categories, the schema that orders them, user profiles, and the error every
malformed rule, profile or update raises.

Semantics (docs/design.md, "Targeting"): categories ``c`` with cardinality ``m_c``,
single- or multi-valued; a user holds a set ``U_c`` of values per category (possibly empty; at most
one value for a single-valued category).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

#: Largest category cardinality (values are stored as int32).
MAX_CARDINALITY = (1 << 31) - 1


@dataclass(frozen=True)
class Category:
    """A targeting category: ``name``, ``cardinality`` (values are ``0..cardinality-1``), and
    whether a user may hold several values (``multi_valued``)."""

    name: str
    cardinality: int
    multi_valued: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"category name must be a non-empty string, got {self.name!r}")
        if (isinstance(self.cardinality, bool) or not isinstance(self.cardinality, (int, np.integer))
                or not 1 <= self.cardinality <= MAX_CARDINALITY):
            raise ValueError(f"category {self.name!r}: cardinality must be an int in 1..{MAX_CARDINALITY}, "
                             f"got {self.cardinality!r}")


class TargetingSchema:
    """An ordered set of categories. ``schema["age"]`` gives a category, ``schema.index("age")`` its position."""

    def __init__(self, categories: Iterable[Category]):
        self.categories = tuple(categories)
        names = [c.name for c in self.categories]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate category names in {names}")
        self._pos = {n: i for i, n in enumerate(names)}

    def __len__(self):
        return len(self.categories)

    def __iter__(self):
        return iter(self.categories)

    def __getitem__(self, name: str) -> Category:
        return self.categories[self.index(name)]

    def __eq__(self, other):
        return isinstance(other, TargetingSchema) and self.categories == other.categories

    def __hash__(self):
        return hash(self.categories)

    def has(self, name: str) -> bool:
        """Whether the schema holds a category named ``name``."""
        return name in self._pos

    def index(self, name: str) -> int:
        try:
            return self._pos[name]
        except KeyError:
            raise KeyError(f"unknown category {name!r}; known: {list(self._pos)}") from None

    def __repr__(self):
        return f"TargetingSchema({[(c.name, c.cardinality, c.multi_valued) for c in self.categories]})"


class RuleError(ValueError):
    """A malformed targeting rule, profile or update; the message names the ad and the category."""


def value_set(schema: TargetingSchema, where: str, cat: str, values) -> frozenset:
    if not schema.has(cat):
        raise RuleError(f"{where}: unknown category {cat!r}")
    # the common containers skip the abstract-class checks (a request's profile is checked per call)
    if type(values) not in (list, tuple, set, frozenset) and (
            isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__")):
        raise RuleError(f"{where}, category {cat!r}: values must be a list of ints, got {values!r}")
    out = set()
    m = schema[cat].cardinality
    for v in values:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise RuleError(f"{where}, category {cat!r}: value {v!r} is not an integer")
        if not 0 <= int(v) < m:
            raise RuleError(f"{where}, category {cat!r}: value {int(v)} out of range 0..{m - 1}")
        out.add(int(v))
    return frozenset(out)


def make_profile(schema: TargetingSchema, values: Mapping[str, Iterable[int] | int]) -> dict[str, frozenset]:
    """Validate a user profile ``{category: value or values}`` and return ``{category: frozenset}``
    for every category (absent = empty set).

    Raises:
        RuleError: unknown category, value out of range or not an integer, or several values for a
            single-valued category.
    """
    if not isinstance(values, Mapping):
        raise RuleError(f"profile must map category -> values, got {type(values).__name__}")
    out = {c.name: frozenset() for c in schema}
    for cat, vals in values.items():
        if isinstance(vals, np.ndarray) and vals.ndim == 0:
            vals = vals.item()
        if isinstance(vals, (int, np.integer)) and not isinstance(vals, (bool, np.bool_)):
            vals = [vals]
        s = value_set(schema, "profile", cat, vals)
        if len(s) > 1 and not schema[cat].multi_valued:
            raise RuleError(f"profile, category {cat!r}: single-valued but given {sorted(s)}")
        out[cat] = s
    return out
