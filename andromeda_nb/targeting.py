"""Targeting rules, user profiles and the bitset index (host side, numpy only).

Semantics (DESIGN.md, "Targeting semantics"): categories ``c`` with cardinality ``m_c``, single- or
multi-valued. An ad's rule holds, per category, an include set ``I_c`` (empty = unconstrained) and an
exclude set ``X_c``. A request carries the user's values ``U_c`` (possibly empty)::

    match(ad, user) = ad is live and for all c:
                      (I_c empty or I_c & U_c non-empty) and (X_c & U_c empty)

Rule format (one record per ad; a list of dicts, JSON lines, or a long pandas DataFrame; large
pools can skip per-ad records with :meth:`TargetingRules.from_columns`, CSR arrays per category)::

    {"ad_id": 17, "live": true,
     "include": {"age": [2, 3], "interests": [40, 41]},
     "exclude": {"country": [7]}}

Bitsets are uint64 words, bit ``i % 64`` of word ``i // 64`` is ad slot ``i``; padding bits past
``n_ads`` are never set.

Index layout (:class:`TargetingIndex`): every bitset is a row of one ``[n_rows, n_words]`` array.
Single-valued categories use folded "allows" rows, one per value plus one for "user has no value":
``allows[c, v] = (unconstrained_c | include[c, v]) & ~exclude[c, v]``, so a request reads one row per
category. Multi-valued categories keep the unconstrained row, one include row per value that some ad
includes and one exclude row per value that some ad excludes (empty rows are neither stored nor
read). Categories no ad constrains are left out of request plans entirely. Memory is one bit per ad
per stored row (at 10^8 ads, 12.5 MB a row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

WORD_BITS = 64


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
        if isinstance(self.cardinality, bool) or not isinstance(self.cardinality, (int, np.integer)) or self.cardinality < 1:
            raise ValueError(f"category {self.name!r}: cardinality must be a positive int, got {self.cardinality!r}")


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

    def index(self, name: str) -> int:
        try:
            return self._pos[name]
        except KeyError:
            raise KeyError(f"unknown category {name!r}; known: {list(self._pos)}") from None

    def __repr__(self):
        return f"TargetingSchema({[(c.name, c.cardinality, c.multi_valued) for c in self.categories]})"


class RuleError(ValueError):
    """A malformed targeting rule or profile; the message names the ad and the category."""


def _value_set(schema: TargetingSchema, where: str, cat: str, values) -> frozenset:
    if cat not in schema._pos:
        raise RuleError(f"{where}: unknown category {cat!r}")
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__iter__"):
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


@dataclass(frozen=True)
class AdRule:
    """One ad's targeting: include / exclude value sets per category name, and the live flag."""

    ad_id: int
    include: Mapping[str, frozenset]
    exclude: Mapping[str, frozenset]
    live: bool = True


class TargetingRules:
    """The rules of every ad in the pool, stored by column (scales to 10^8 ads).

    Slot ``i`` holds ad ``ad_ids[i]``. Per category name, ``include[name]`` and ``exclude[name]``
    are CSR pairs ``(indptr int64[n_ads + 1], values int32[nnz])``: ad ``i``'s set is
    ``values[indptr[i]:indptr[i + 1]]`` (sorted, no duplicates; empty include = unconstrained).

    Build with :meth:`from_records`, :meth:`from_frame` or :meth:`from_columns`; all validate.
    """

    def __init__(self, schema: TargetingSchema, ad_ids, live, include, exclude):
        self.schema = schema
        self.ad_ids = ad_ids
        self.live = live
        self.include = include
        self.exclude = exclude

    @property
    def n_ads(self) -> int:
        return int(self.ad_ids.shape[0])

    def rule(self, slot: int) -> AdRule:
        """Slot ``slot``'s rule as sets (for the oracle and for inspection)."""
        def sets(csr):
            out = {}
            for name, (ptr, vals) in csr.items():
                s = frozenset(int(v) for v in vals[ptr[slot]:ptr[slot + 1]])
                if s:
                    out[name] = s
            return out

        return AdRule(int(self.ad_ids[slot]), sets(self.include), sets(self.exclude), bool(self.live[slot]))

    @property
    def rules(self) -> list[AdRule]:
        """Every slot's :class:`AdRule` (Python objects, built once and cached: for small pools)."""
        if getattr(self, "_rules", None) is None:
            self._rules = [self.rule(i) for i in range(self.n_ads)]
        return self._rules

    @classmethod
    def from_columns(cls, schema: TargetingSchema, ad_ids, live=None, include=None, exclude=None) -> "TargetingRules":
        """Validate column arrays (see the class docstring) and build the rules without per-ad
        Python objects. Values within an ad's set are sorted and de-duplicated here.

        Raises:
            RuleError: duplicate or negative ad ids, a malformed CSR (indptr not starting at 0,
                decreasing, or not ending at len(values)), an unknown category, or a value out of
                range (the message names the first offending ad and the category).
        """
        ids = np.asarray(ad_ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise RuleError("ad_ids must be a 1-D integer array")
        ids = ids.astype(np.int64)
        n = ids.size
        if n and ids.min() < 0:
            raise RuleError(f"ad {int(ids[ids < 0][0])}: ad_id must be non-negative")
        uniq, counts = np.unique(ids, return_counts=True)
        if uniq.size != n:
            raise RuleError(f"ad {int(uniq[counts > 1][0])}: duplicate ad_id")
        live = np.ones(n, bool) if live is None else np.asarray(live)
        if live.shape != (n,) or live.dtype != np.bool_:
            raise RuleError(f"live must be a bool array of shape ({n},)")

        def check(csr, kind):
            out = {}
            for name, pair in (csr or {}).items():
                if name not in schema._pos:
                    raise RuleError(f"{kind}: unknown category {name!r}")
                ptr, vals = (np.asarray(a) for a in pair)
                if ptr.shape != (n + 1,) or (ptr.size and ptr.dtype.kind not in "iu"):
                    raise RuleError(f"{kind}, category {name!r}: indptr must be ({n + 1},) integers")
                if vals.ndim != 1 or (vals.size and vals.dtype.kind not in "iu"):
                    raise RuleError(f"{kind}, category {name!r}: values must be a 1-D integer array")
                ptr = ptr.astype(np.int64)
                if ptr[0] != 0 or ptr[-1] != vals.size or np.any(np.diff(ptr) < 0):
                    raise RuleError(f"{kind}, category {name!r}: malformed indptr")
                m = schema[name].cardinality
                bad = (vals < 0) | (vals >= m)
                if bad.any():
                    at = int(np.flatnonzero(bad)[0])
                    slot = int(np.searchsorted(ptr, at, side="right") - 1)
                    raise RuleError(f"ad {int(ids[slot])} ({kind}), category {name!r}: "
                                    f"value {int(vals[at])} out of range 0..{m - 1}")
                slots = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))
                key = np.unique(slots * m + vals.astype(np.int64))  # sort and de-duplicate per ad
                new_slots, new_vals = key // m, (key % m).astype(np.int32)
                new_ptr = np.zeros(n + 1, np.int64)
                np.cumsum(np.bincount(new_slots, minlength=n), out=new_ptr[1:])
                out[name] = (new_ptr, new_vals)
            return out

        return cls(schema, ids, live, check(include, "include"), check(exclude, "exclude"))

    @classmethod
    def from_records(cls, schema: TargetingSchema, records: Iterable[Mapping]) -> "TargetingRules":
        """Validate rule records (see module docstring) and keep them in the given order.

        Raises:
            RuleError: a record that is not a mapping, a missing / non-integer / negative /
                duplicate ``ad_id``, an unknown field or category, a value that is not an integer
                or is out of range, ``live`` that is not a bool. The message names the ad and the
                category.
        """
        ids, lives, seen = [], [], set()
        lists = {"include": {c.name: [] for c in schema}, "exclude": {c.name: [] for c in schema}}
        for pos, rec in enumerate(records):
            if not isinstance(rec, Mapping):
                raise RuleError(f"record {pos}: expected a mapping, got {type(rec).__name__}")
            extra = set(rec) - {"ad_id", "live", "include", "exclude"}
            if extra:
                raise RuleError(f"record {pos}: unknown fields {sorted(extra)}")
            ad_id = rec.get("ad_id")
            if isinstance(ad_id, (bool, np.bool_)) or not isinstance(ad_id, (int, np.integer)) or ad_id < 0:
                raise RuleError(f"record {pos}: ad_id must be a non-negative int, got {ad_id!r}")
            ad_id = int(ad_id)
            if ad_id in seen:
                raise RuleError(f"ad {ad_id}: duplicate ad_id")
            seen.add(ad_id)
            live = rec.get("live", True)
            if not isinstance(live, (bool, np.bool_)):
                raise RuleError(f"ad {ad_id}: live must be a bool, got {live!r}")
            for kind in ("include", "exclude"):
                part = rec.get(kind) or {}
                if not isinstance(part, Mapping):
                    raise RuleError(f"ad {ad_id}: {kind} must map category -> values, got {part!r}")
                sets = {cat: _value_set(schema, f"ad {ad_id} ({kind})", cat, vals) for cat, vals in part.items()}
                for cat in lists[kind]:
                    lists[kind][cat].append(sorted(sets.get(cat, ())))
            ids.append(ad_id)
            lives.append(bool(live))

        def csr(per_ad):
            ptr = np.zeros(len(per_ad) + 1, np.int64)
            np.cumsum([len(v) for v in per_ad], out=ptr[1:])
            vals = np.fromiter((v for vs in per_ad for v in vs), dtype=np.int32, count=int(ptr[-1]))
            return ptr, vals

        cols = {kind: {cat: csr(v) for cat, v in d.items() if any(v)} for kind, d in lists.items()}
        return cls.from_columns(schema, np.array(ids, np.int64), np.array(lives, bool),
                                cols["include"], cols["exclude"])

    @classmethod
    def from_frame(cls, schema: TargetingSchema, frame, ad_ids=None) -> "TargetingRules":
        """Rules from a long DataFrame with columns ``ad_id, category, kind, value``
        (``kind`` is ``"include"`` or ``"exclude"``), plus optional ``live`` column.

        ``ad_ids`` fixes the slot order and lets ads without any row exist (unconstrained);
        by default the sorted distinct ad ids of the frame.
        """
        need = {"ad_id", "category", "kind", "value"}
        missing = need - set(frame.columns)
        if missing:
            raise RuleError(f"rule frame lacks columns {sorted(missing)}")
        bad_kind = set(frame["kind"]) - {"include", "exclude"}
        if bad_kind:
            raise RuleError(f"rule frame: kind must be 'include' or 'exclude', got {sorted(bad_kind)}")
        order = sorted(set(int(a) for a in frame["ad_id"])) if ad_ids is None else [int(a) for a in ad_ids]
        recs = {a: {"ad_id": a, "include": {}, "exclude": {}} for a in order}
        if len(recs) != len(order):
            raise RuleError("ad_ids holds duplicates")
        for a, cat, kind, v in zip(frame["ad_id"], frame["category"], frame["kind"], frame["value"]):
            if int(a) not in recs:
                raise RuleError(f"ad {a}: not in ad_ids")
            recs[int(a)][kind].setdefault(cat, []).append(v)
        if "live" in frame.columns:
            for a, live in zip(frame["ad_id"], frame["live"]):
                recs[int(a)]["live"] = bool(live)
        return cls.from_records(schema, recs.values())

    def to_records(self) -> list[dict]:
        """The rules as JSON-ready records (sorted value lists)."""
        return [
            {
                "ad_id": r.ad_id,
                "live": r.live,
                "include": {c: sorted(s) for c, s in r.include.items()},
                "exclude": {c: sorted(s) for c, s in r.exclude.items()},
            }
            for r in self.rules
        ]


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
        if isinstance(vals, (int, np.integer)) and not isinstance(vals, (bool, np.bool_)):
            vals = [vals]
        s = _value_set(schema, "profile", cat, vals)
        if len(s) > 1 and not schema[cat].multi_valued:
            raise RuleError(f"profile, category {cat!r}: single-valued but given {sorted(s)}")
        out[cat] = s
    return out


def bits_from_mask(mask: np.ndarray) -> np.ndarray:
    """Pack a bool ``[n]`` mask into uint64 words ``[ceil(n / 64)]`` (bit i%64 of word i//64)."""
    mask = np.asarray(mask, dtype=bool)
    n_words = (mask.size + WORD_BITS - 1) // WORD_BITS
    padded = np.zeros(n_words * WORD_BITS, dtype=bool)
    padded[: mask.size] = mask
    return np.packbits(padded, bitorder="little").view("<u8").astype(np.uint64)


def mask_from_bits(words: np.ndarray, n: int) -> np.ndarray:
    """Unpack uint64 words into a bool ``[n]`` mask (the inverse of :func:`bits_from_mask`)."""
    words = np.ascontiguousarray(words, dtype="<u8")
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)


class TargetingIndex:
    """Host-built bitset index over a pool of ads (see the module docstring for the layout).

    Attributes:
        n_ads, n_words: pool size and ``ceil(n_ads / 64)``.
        bitsets: ``[n_rows, n_words]`` uint64; row 0 is the live bitset.
        ad_ids: ``[n_ads]`` int64, slot -> ad id.
    """

    def __init__(self, rules: TargetingRules):
        self.schema = rules.schema
        self.n_ads = rules.n_ads
        self.n_words = (self.n_ads + WORD_BITS - 1) // WORD_BITS
        self.ad_ids = rules.ad_ids.copy()
        n = self.n_ads
        rows = [bits_from_mask(rules.live)]
        self._row_of: dict[bytes, int] = {}
        self.single: dict[str, np.ndarray] = {}  # name -> row per value, plus "no value" at [m]
        self.multi_unconstrained: dict[str, int] = {}
        self.multi_include: dict[str, np.ndarray] = {}  # name -> row per value, -1 when empty
        self.multi_exclude: dict[str, np.ndarray] = {}
        self.constrained: dict[str, bool] = {}
        self.selectivity: dict[str, float] = {}

        def add_row(mask: np.ndarray) -> int:
            words = bits_from_mask(mask)
            key = words.tobytes()
            if key not in self._row_of:
                self._row_of[key] = len(rows)
                rows.append(words)
            return self._row_of[key]

        empty = (np.zeros(n + 1, np.int64), np.zeros(0, np.int32))

        def pairs_of(csr):
            ptr, vals = csr
            return vals.astype(np.int64), np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))

        def masks_by_value(values, slots):
            order = np.argsort(values, kind="stable")
            uniq, starts = np.unique(values[order], return_index=True)
            out = {}
            for v, group in zip(uniq, np.split(slots[order], starts[1:])):
                mask = np.zeros(n, dtype=bool)
                mask[group] = True
                out[int(v)] = mask
            return out

        for cat in self.schema:
            m = cat.cardinality
            inc_v, inc_s = pairs_of(rules.include.get(cat.name, empty))
            exc_v, exc_s = pairs_of(rules.exclude.get(cat.name, empty))
            unconstrained = np.ones(n, dtype=bool)
            unconstrained[inc_s] = False
            inc = masks_by_value(inc_v, inc_s)
            exc = masks_by_value(exc_v, exc_s)
            self.constrained[cat.name] = bool(inc or exc)
            self.selectivity[cat.name] = float(unconstrained.mean()) if n else 1.0
            if not cat.multi_valued:
                base = add_row(unconstrained)
                rows_v = np.full(m + 1, base, dtype=np.int64)
                for v in set(inc) | set(exc):
                    allows = unconstrained | inc[v] if v in inc else unconstrained.copy()
                    if v in exc:
                        allows &= ~exc[v]
                    rows_v[v] = add_row(allows)
                self.single[cat.name] = rows_v
            else:
                self.multi_unconstrained[cat.name] = add_row(unconstrained)
                self.multi_include[cat.name] = np.full(m, -1, dtype=np.int64)
                self.multi_exclude[cat.name] = np.full(m, -1, dtype=np.int64)
                for v, mask in inc.items():
                    self.multi_include[cat.name][v] = add_row(mask)
                for v, mask in exc.items():
                    self.multi_exclude[cat.name][v] = add_row(mask)
        self.bitsets = np.ascontiguousarray(np.stack(rows)) if rows else np.zeros((1, 0), np.uint64)

    @property
    def n_rows(self) -> int:
        return self.bitsets.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes held by the bitset rows."""
        return self.bitsets.nbytes

    def plan(self, profile: Mapping[str, frozenset]) -> "MatchPlan":
        """The rows one request reads, grouped by category, most selective category first.

        For each category the eligible words are ``(OR of include rows) & ~(OR of exclude rows)``;
        the request's eligible bitset is the live row AND every category's words.

        Args:
            profile: from :func:`make_profile`.
        """
        cats = []
        for cat in self.schema:
            name = cat.name
            if not self.constrained[name]:
                continue
            vals = sorted(profile.get(name, frozenset()))
            if not cat.multi_valued:
                v = vals[0] if vals else cat.cardinality
                inc_rows, exc_rows = [int(self.single[name][v])], []
            else:
                inc_rows = [self.multi_unconstrained[name]]
                inc_rows += [int(self.multi_include[name][v]) for v in vals if self.multi_include[name][v] >= 0]
                exc_rows = [int(self.multi_exclude[name][v]) for v in vals if self.multi_exclude[name][v] >= 0]
            cats.append((self.selectivity[name], inc_rows, exc_rows))
        cats.sort(key=lambda c: c[0])
        inc_ptr, exc_ptr, inc, exc = [0], [0], [], []
        for _, i_rows, x_rows in cats:
            inc += i_rows
            exc += x_rows
            inc_ptr.append(len(inc))
            exc_ptr.append(len(exc))
        return MatchPlan(
            inc_ptr=np.array(inc_ptr, np.int32),
            inc_rows=np.array(inc, np.int32),
            exc_ptr=np.array(exc_ptr, np.int32),
            exc_rows=np.array(exc, np.int32),
        )


@dataclass(frozen=True)
class MatchPlan:
    """CSR lists of bitset rows for one request: category ``j`` ORs rows
    ``inc_rows[inc_ptr[j]:inc_ptr[j+1]]`` and removes the OR of ``exc_rows[exc_ptr[j]:exc_ptr[j+1]]``."""

    inc_ptr: np.ndarray
    inc_rows: np.ndarray
    exc_ptr: np.ndarray
    exc_rows: np.ndarray

    @property
    def n_categories(self) -> int:
        return len(self.inc_ptr) - 1

    @property
    def rows_read(self) -> int:
        """Bitset rows a request reads at most (without early exit), live row included."""
        return 1 + len(self.inc_rows) + len(self.exc_rows)


def table_slots(slots, n_ads: int) -> np.ndarray:
    """Validate a 1-D integer array of slots in ``0..n_ads-1`` (raises TypeError / ValueError)."""
    arr = np.asarray(slots)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise TypeError("slots must be a 1-D integer array")
    if arr.size and (arr.min() < 0 or arr.max() >= n_ads):
        raise ValueError(f"slots must be in 0..{n_ads - 1}")
    return arr.astype(np.int64)
