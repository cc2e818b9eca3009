"""Index layout: which categories are folded into joint rows, which are split into dense rows and
inverted lists (decided once per index by :func:`choose_layout`), and the plan of one request.

Every dense bitset is a row of one ``[n_rows, n_words]`` uint64 array; row 0 is the live bitset.

* **folded groups** (single-valued categories with ``m_c <= fold_max``, grouped smallest first
  while the group's rows ``prod(m_c + 1)`` stay within ``group_max``, default 512): one row per
  combination of the members' values, "no value" included, holding ``AND over members of
  allows[c, v_c]`` with ``allows[c, v] = (unconstrained_c | include[c, v]) & ~exclude[c, v]`` and
  ``allows[c, none] = unconstrained_c``. A request reads **one row for the whole group**. The live
  bit is folded into the rows of the group with the fewest rows (the *carrier*), so no request
  reads the live row.
* **split** categories (multi-valued, or single-valued with ``m_c > fold_max``): the row
  ``unconstrained_c``; for each *dense* value (included by at least ``dense_min`` ads, default
  ``n / 1024``) an include row with the unconstrained ads folded in, ``include'[c, v] =
  unconstrained_c | include[c, v]``; for each value excluded by at least ``exclude_dense_min`` ads
  (default ``n / 256``) an exclude row; every other (value, kind) is an *inverted list*: a
  segment of ad slots in one list pool (empty lists cost nothing and are never read). A request
  reads the OR of the include' rows of the user's dense values (the unconstrained row when it
  holds none), plus one *patch* row into which a small scatter kernel sets the slots listed under
  the user's other values; dense exclude rows are ANDNOTed in the match kernel, listed excluders
  are cleared from the result afterwards.

Reading order (:class:`MatchPlan`): groups and categories by estimated pass fraction (row
popcounts and list lengths, kept current by updates), most selective first; a 64-ad word stops
reading once it is all zero (on the benchmark world few ads pass, so this rarely saves a 32-byte
sector; the folding is what cuts the bits).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from .rules import TargetingRules

#: Single-valued categories up to this cardinality get folded "allows" rows.
FOLD_MAX = 256
#: Folded groups hold at most this many rows (combinations of their members' values).
GROUP_MAX = 512
#: Default dense thresholds: a split-category value gets its own include' row when at least
#: ``n_slots // DENSE_DIVISOR`` ads include it, its own exclude row when at least
#: ``n_slots // EXCLUDE_DIVISOR`` ads exclude it (and at least ``DENSE_MIN_ADS``); else a list.
#: A list of L slots costs a request about ``4 L`` bytes plus one 32-byte sector per distinct
#: sector it touches (at most ``n / 256``), a row ``n / 8`` bytes: exclusions break even near
#: ``L = n / 256``; includes need a patch row anyway, so dense pays off earlier (memory permitting).
DENSE_DIVISOR = 1024
EXCLUDE_DIVISOR = 256
DENSE_MIN_ADS = 64
#: Inverted lists hold int32 slots (4 bytes an entry) for pools of up to this many ads, int64 beyond.
INT32_LIST_MAX_SLOTS = int(np.iinfo(np.int32).max)


def list_dtype_for(n_slots: int) -> np.dtype:
    """The list pool's entry type for a pool of ``n_slots`` slots: int32 up to
    :data:`INT32_LIST_MAX_SLOTS`, int64 beyond (a list entry is a slot)."""
    return np.dtype(np.int32 if n_slots <= INT32_LIST_MAX_SLOTS else np.int64)


@dataclass(frozen=True, eq=False)
class IndexLayout:
    """Storage decisions, fixed at build (updates never change them).

    ``groups``: tuples of single-valued category indices folded jointly (one row per combination
    of their values, "no value" included: ``prod(m_i + 1)`` rows; a request reads one row for
    the whole group); every other category is split, with ``dense_inc[c]`` / ``dense_exc[c]`` (sorted
    int64) the values that get their own include' / exclude row (the rest are inverted lists);
    ``carrier``: the group holding the live bit (-1: none, the live row is read).
    """

    fold_max: int
    group_max: int
    dense_min: int
    exclude_dense_min: int
    carrier: int
    groups: tuple
    dense_inc: tuple
    dense_exc: tuple

    def same_as(self, other: "IndexLayout") -> bool:
        """Whether ``other`` makes the same storage decisions (groups, carrier, dense values)."""
        return (self.carrier == other.carrier and self.groups == other.groups
                and len(self.dense_inc) == len(other.dense_inc)
                and all(np.array_equal(x, y) for x, y in zip(self.dense_inc, other.dense_inc))
                and all(np.array_equal(x, y) for x, y in zip(self.dense_exc, other.dense_exc)))

    def group_of(self, n_categories: int) -> np.ndarray:
        out = np.full(n_categories, -1, np.int64)
        for g, members in enumerate(self.groups):
            out[list(members)] = g
        return out

    def describe(self, schema) -> list[dict]:
        """One dict per group or split category: members, layout, rows."""
        out = []
        for g, members in enumerate(self.groups):
            rows = int(np.prod([schema.categories[c].cardinality + 1 for c in members]))
            out.append({"unit": "+".join(schema.categories[c].name for c in members), "layout": "folded",
                        "categories": len(members), "rows": rows, "carries_live": g == self.carrier})
        grouped = {c for m in self.groups for c in m}
        for c, cat in enumerate(schema):
            if c not in grouped:
                out.append({"unit": cat.name, "layout": "split", "categories": 1,
                            "rows": 1 + int(self.dense_inc[c].size) + int(self.dense_exc[c].size),
                            "carries_live": False})
        return out


def choose_layout(rules: TargetingRules, capacity: int | None = None, fold_max: int = FOLD_MAX,
                  dense_min: int | None = None, exclude_dense_min: int | None = None,
                  group_max: int = GROUP_MAX) -> IndexLayout:
    """Pick the folded groups, the split categories and their dense values.

    Args:
        rules: the pool's rules.
        capacity: slots (default ``rules.n_ads``).
        fold_max: single-valued categories with at most this many values are folded.
        group_max: folded categories are grouped greedily, smallest cardinality first, while a
            group's rows ``prod(m_i + 1)`` stay within ``group_max`` (1: one category per group).
        dense_min: a split-category value gets its own include' row when at least this many ads
            include it; default ``max(DENSE_MIN_ADS, capacity // DENSE_DIVISOR)``. A huge value
            gives lists only, 1 a row per targeted value; a mapping ``{category: threshold}`` sets
            some categories (the others keep the default).
        exclude_dense_min: the same for exclude rows; default
            ``max(DENSE_MIN_ADS, capacity // EXCLUDE_DIVISOR)``. Listed excludes are cleared from
            the result after the match (cheaper than a row read when few ads exclude the value).
            A mapping sets some categories.
    """
    schema = rules.schema
    cap = rules.n_ads if capacity is None else int(capacity)
    dflt = max(DENSE_MIN_ADS, cap // DENSE_DIVISOR)
    xdflt = max(DENSE_MIN_ADS, cap // EXCLUDE_DIVISOR)

    def per_category(value, default):
        if isinstance(value, Mapping):
            for name in value:
                schema.index(name)
            return [int(value.get(c.name, default)) for c in schema]
        return [default if value is None else int(value)] * len(schema)

    dmins = per_category(dense_min, dflt)
    xmins = per_category(exclude_dense_min, xdflt)
    dmin = dflt if isinstance(dense_min, Mapping) or dense_min is None else int(dense_min)
    xmin = xdflt if isinstance(exclude_dense_min, Mapping) or exclude_dense_min is None else int(exclude_dense_min)
    foldable = sorted((c for c, cat in enumerate(schema) if not cat.multi_valued and cat.cardinality <= fold_max),
                      key=lambda c: (schema.categories[c].cardinality, c))
    groups, cur, rows = [], [], 1
    for c in foldable:
        r = schema.categories[c].cardinality + 1
        if cur and rows * r > max(int(group_max), 1):
            groups.append(tuple(cur))
            cur, rows = [], 1
        cur.append(c)
        rows *= r
    if cur:
        groups.append(tuple(cur))
    grouped = set(foldable)
    dinc, dexc = [], []
    for c, cat in enumerate(schema):
        pair = []
        for csr, thr in ((rules.include, dmins[c]), (rules.exclude, xmins[c])):
            if c in grouped or cat.name not in csr:
                pair.append(np.zeros(0, np.int64))
                continue
            counts = np.bincount(csr[cat.name][1], minlength=cat.cardinality)
            pair.append(np.flatnonzero(counts >= max(1, thr)).astype(np.int64))
        dinc.append(pair[0])
        dexc.append(pair[1])
    # the live bit goes into the group with the fewest rows (a create or retire flips it in every
    # row of that group where the ad is allowed)
    sizes = [int(np.prod([schema.categories[c].cardinality + 1 for c in g])) for g in groups]
    carrier = int(np.argmin(sizes)) if groups else -1
    return IndexLayout(int(fold_max), int(group_max), dmin, xmin, carrier, tuple(groups), tuple(dinc), tuple(dexc))


@dataclass(frozen=True)
class MatchPlan:
    """What one request reads, categories in reading order (most selective first).

    Category ``j`` ORs rows ``inc_rows[inc_ptr[j]:inc_ptr[j+1]]`` and removes the OR of
    ``exc_rows[exc_ptr[j]:exc_ptr[j+1]]``; a row id ``-1 - k`` is the request's patch row ``k``,
    into which the lists ``patch_lists[k]`` (list ids) are scattered first. ``exclude_lists``:
    lists whose slots are cleared from the result afterwards. ``estimates``: each category's
    estimated pass fraction (the reading order).
    """

    inc_ptr: np.ndarray
    inc_rows: np.ndarray
    exc_ptr: np.ndarray
    exc_rows: np.ndarray
    patch_lists: tuple = ()
    exclude_lists: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    categories: tuple = ()
    estimates: tuple = ()

    @property
    def n_categories(self) -> int:
        return len(self.inc_ptr) - 1

    @property
    def n_patches(self) -> int:
        return len(self.patch_lists)

    @property
    def rows_read(self) -> int:
        """Bitset rows a request reads at most (without early exit), patch rows included."""
        return len(self.inc_rows) + len(self.exc_rows)
