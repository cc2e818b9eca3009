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
        if not isinstance(self.multi_valued, (bool, np.bool_)):
            raise ValueError(f"category {self.name!r}: multi_valued must be True or False, got {self.multi_valued!r}")


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


class ProfileBatch:
    """B user profiles in columns, the form a serving loop builds with numpy instead of B dicts:
    request ``b`` holds the ``(category, value)`` pairs ``ptr[b]:ptr[b + 1]`` of ``category`` (the
    schema's category index) and ``value``. The planner reads these columns directly (a list of
    dicts costs a Python loop over every value of every request).

    Build with :meth:`from_columns` (validated: categories and values in range, at most one value
    for a single-valued category) or :meth:`from_profiles`. ``len(batch)`` is B; iterating yields
    each request's profile as a dict; :meth:`take` selects requests.
    """

    def __init__(self, schema: TargetingSchema, ptr: np.ndarray, category: np.ndarray, value: np.ndarray):
        self.schema, self.ptr, self.category, self.value = schema, ptr, category, value

    @classmethod
    def from_columns(cls, schema: TargetingSchema, ptr, category, value) -> "ProfileBatch":
        """Raises RuleError for malformed columns (copied: the batch never aliases the caller's)."""
        cols = []
        for name, x in (("ptr", ptr), ("category", category), ("value", value)):
            a = np.asarray(x)
            if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
                raise RuleError(f"profile batch: {name} must be a 1-D integer array, got {a.dtype} {a.shape}")
            cols.append(np.array(a, dtype=np.int64))
        ptr, category, value = cols
        if ptr.size < 1 or ptr[0] != 0 or ptr[-1] != category.size or (np.diff(ptr) < 0).any():
            raise RuleError("profile batch: ptr must rise from 0 to len(category) (one entry per request, plus one)")
        if value.size != category.size:
            raise RuleError(f"profile batch: {category.size} categories but {value.size} values")
        C = len(schema)
        bad = (category < 0) | (category >= C)
        if bad.any():
            raise RuleError(f"profile batch, request {_request_of(ptr, bad)}: category index "
                            f"{int(category[bad][0])} outside the schema's 0..{C - 1}")
        cards = np.array([c.cardinality for c in schema], np.int64)
        bad = (value < 0) | (value >= cards[category])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise RuleError(f"profile batch, request {_request_of(ptr, bad)}, category "
                            f"{schema.categories[int(category[i])].name!r}: value {int(value[i])} out of range")
        single = ~np.array([c.multi_valued for c in schema], bool)
        if category.size and single.any():  # distinct values of a single-valued category, per request
            req = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
            keys = np.unique(np.stack([req, category, value], axis=1)[single[category]], axis=0)
            pairs, counts = np.unique(keys[:, :2], axis=0, return_counts=True)
            if (counts > 1).any():
                b, c = pairs[counts > 1][0]
                raise RuleError(f"profile batch, request {int(b)}, category {schema.categories[int(c)].name!r}: "
                                "single-valued but given several values")
        return cls(schema, ptr, category, value)

    @classmethod
    def from_profiles(cls, schema: TargetingSchema, profiles) -> "ProfileBatch":
        """Profiles as :func:`make_profile` takes them (each validated), in columns."""
        pos = {c.name: i for i, c in enumerate(schema)}
        cats, vals, ptr = [], [], [0]
        for prof in profiles:
            for name, vs in make_profile(schema, prof).items():
                cats.extend([pos[name]] * len(vs))
                vals.extend(sorted(vs))
            ptr.append(len(cats))
        return cls(schema, np.array(ptr, np.int64), np.array(cats, np.int64), np.array(vals, np.int64))

    def __len__(self) -> int:
        return int(self.ptr.size - 1)

    def profile(self, b: int) -> dict:
        """Request ``b``'s profile ``{category name: [values]}``."""
        out: dict = {}
        for c, v in zip(self.category[self.ptr[b]:self.ptr[b + 1]].tolist(),
                        self.value[self.ptr[b]:self.ptr[b + 1]].tolist()):
            out.setdefault(self.schema.categories[c].name, []).append(v)
        return out

    def __iter__(self):
        return (self.profile(b) for b in range(len(self)))

    def __getitem__(self, requests: slice) -> "ProfileBatch":
        """A slice of the batch's requests, as a list of profiles is sliced."""
        if not isinstance(requests, slice):
            raise TypeError("a ProfileBatch is sliced (batch[i:j]); profile(b) is request b's profile")
        return self.take(range(*requests.indices(len(self))))

    def take(self, requests) -> "ProfileBatch":
        """The batch of requests ``requests`` (integer indices, in that order; negative ones count
        from the end, as in Python).

        Raises:
            TypeError: indices that are not integers.
            IndexError: an index outside ``-len(self)..len(self) - 1``."""
        idx = np.asarray(requests)
        if idx.size and not np.issubdtype(idx.dtype, np.integer):  # (bools are not numpy integers)
            raise TypeError(f"ProfileBatch.take needs integer indices, got {idx.dtype}")
        idx = idx.astype(np.int64).reshape(-1)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            bad = int(idx[(idx < -n) | (idx >= n)][0])
            raise IndexError(f"request index {bad} out of range for a batch of {n}")
        idx = np.where(idx < 0, idx + n, idx)
        sizes = self.ptr[idx + 1] - self.ptr[idx]
        ptr = np.zeros(idx.size + 1, np.int64)
        np.cumsum(sizes, out=ptr[1:])
        at = np.repeat(self.ptr[idx] - ptr[:-1], sizes) + np.arange(int(ptr[-1]), dtype=np.int64)
        return ProfileBatch(self.schema, ptr, self.category[at], self.value[at])


def _request_of(ptr: np.ndarray, bad: np.ndarray) -> int:
    return int(np.searchsorted(ptr, int(np.flatnonzero(bad)[0]), side="right") - 1)
