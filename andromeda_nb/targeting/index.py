"""Targeting rules, user profiles, the bitset index and its real-time updates (host side).

Semantics (DESIGN.md, "Targeting semantics"): categories ``c`` with cardinality ``m_c``, single- or
multi-valued. An ad's rule holds, per category, an include set ``I_c`` (empty = unconstrained) and an
exclude set ``X_c``. A request carries the user's values ``U_c`` (possibly empty)::

    match(ad, user) = ad is live and for all c:
                      (I_c empty or I_c & U_c non-empty) and (X_c & U_c empty)

Rule format
-----------
One record per ad, as a list of dicts, JSON lines (:meth:`TargetingRules.from_jsonl`, one object a
line) or a long pandas DataFrame (:meth:`TargetingRules.from_frame`)::

    {"ad_id": 17, "live": true,
     "include": {"age": [2, 3], "interests": [40, 41]},
     "exclude": {"country": [7]}}

``ad_id`` is a non-negative int, unique in the pool; ``live`` a bool (default true); ``include`` and
``exclude`` map a category name to a list of value ids ``0..m_c-1`` (order and repeats do not
matter; an empty or missing list means "no constraint"). Large pools skip per-ad records with
:meth:`TargetingRules.from_columns` (CSR arrays per category). Every path validates and raises
:class:`RuleError` naming the ad (or record / line) and the category.

Updates use the same records with an ``"op"`` field (``create``, ``change``, ``retire``; a retire
needs only the ad id), see :class:`UpdateBatch`.

Bitsets
-------
uint64 words, bit ``i % 64`` of word ``i // 64`` is ad slot ``i``. Padding bits past the pool are
never set in any stored row, and the match kernels AND the last word with the valid-bit mask, so a
padding bit never matches, whatever NOT / ANDNOT does. Slot arithmetic is 64-bit throughout.

Index layout (:class:`TargetingIndex`, decided per category by :func:`choose_layout`)
-------------------------------------------------------------------------------------
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

Reading order: groups and categories by estimated pass fraction (row popcounts and list lengths,
kept current by updates), most selective first; a 64-ad word stops reading once it is all zero
(on the benchmark world ~1 % of ads pass, so this rarely saves a 32-byte sector; the folding
is what cuts the bits).

Memory at ``n`` ads: a row is ``n / 8`` bytes (12.5 MB at 10^8), a list entry 4 bytes (8 beyond
2^31 slots). :meth:`TargetingIndex.memory_by_category` measures it per group / split category; on
DESIGN.md's benchmark world at 10^8 ads (default layout; measured at 10^6 and scaled): folded
groups (2,3,3,4) 240 rows 3.0 GB, (6,8) 0.8 GB, (10,13) 1.9 GB, (17,22) 414 rows 5.2 GB, the four
largest single ones 0.4-0.8 GB each; the 100..1,000-value categories 67-82 rows and 5-17 M list
entries, ~0.9-1.0 GB each; each 10,000-value category 61 rows + 22 M list entries, 0.85 GB
(lists only: 1 row + 65 M entries, 0.27 GB; a bitset per value and kind: 250 GB). Whole index
18.7 GB. A request reads ~20.5 row bits per ad (a folded row per category: ~27; every include and
exclude bitset per user value: ~60).

Real-time updates
-----------------
:meth:`TargetingIndex.apply` takes an :class:`UpdateBatch` (create / change / retire, applied in
order), validates all of it first (an unknown or duplicate ad, a bad rule, a full index: nothing
changes), allocates slots (a LIFO free list, so a retired slot is reused first), and computes
the *net* change per touched slot: the bits that flip in each row and the list entries to add or
remove (tombstones; a list is compacted when half of it is tombstones and moved to a region twice
its size when full, so list maintenance is amortised O(1) per entry). It applies them to the host
copy and returns them as an :class:`UpdateDelta`, which :class:`~andromeda_nb.match.api.DeviceTargetingIndex`
applies on the GPU in one kernel, ordered with requests on the stream. Bytes written are
proportional to the bits and entries that change; nothing is rebuilt. The host-side map ad id ->
(slot, rule) is the source of truth: :meth:`TargetingIndex.rebuild` builds an index from it from
scratch, and :meth:`TargetingIndex.assert_same` checks that two indexes hold the same bits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

WORD_BITS = 64
#: Single-valued categories up to this cardinality get folded "allows" rows.
FOLD_MAX = 256
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
#: Slot and row limits of the update encoding (``row << SLOT_BITS | slot`` in one int64).
SLOT_BITS = 40
MAX_ROWS = 1 << (63 - SLOT_BITS)
MAX_CARDINALITY = (1 << 31) - 1
#: Update operation codes.
CREATE, CHANGE, RETIRE = 0, 1, 2
OP_NAMES = {"create": CREATE, "change": CHANGE, "retire": RETIRE}


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

    def index(self, name: str) -> int:
        try:
            return self._pos[name]
        except KeyError:
            raise KeyError(f"unknown category {name!r}; known: {list(self._pos)}") from None

    def __repr__(self):
        return f"TargetingSchema({[(c.name, c.cardinality, c.multi_valued) for c in self.categories]})"


class RuleError(ValueError):
    """A malformed targeting rule, profile or update; the message names the ad and the category."""


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
    """One ad's targeting: include / exclude value sets per category name, and the live flag.
    A free slot of an index reads as ``AdRule(-1, {}, {}, False)``."""

    ad_id: int
    include: Mapping[str, frozenset]
    exclude: Mapping[str, frozenset]
    live: bool = True


# ============================================================================ host kernels (Numba)

_HOST: dict = {}


def host_kernels() -> dict:
    """Numba-compiled host functions (index build, update deltas, CPU match), compiled on first use.

    Numba reads ``NUMBA_ENABLE_CUDASIM`` when it is first imported, so this fixes the backend
    (:func:`andromeda_nb.device.backend.get_backend`, ``"auto"`` unless set) before importing it.
    """
    if _HOST:
        return _HOST
    from ..device import backend

    backend.get_backend()
    from numba import njit, prange, uint64

    M1, M2, M4 = uint64(0x5555555555555555), uint64(0x3333333333333333), uint64(0x0F0F0F0F0F0F0F0F)
    H01 = uint64(0x0101010101010101)
    ONE, ALL = uint64(1), uint64(0xFFFFFFFFFFFFFFFF)

    @njit(inline="always")
    def popc(x):
        x = x - ((x >> uint64(1)) & M1)
        x = (x & M2) + ((x >> uint64(2)) & M2)
        x = (x + (x >> uint64(4))) & M4
        return (x * H01) >> uint64(56)

    @njit(inline="always")
    def valid_mask(w, n_words, n):
        if w == n_words - 1 and n % 64 != 0:
            return (ONE << uint64(n % 64)) - ONE
        return ALL

    @njit(inline="always")
    def sector_start(e, sec, n_words, n):
        """The 4 words of 32-byte sector ``sec``: ``e[u]`` = word u's valid bits (0 past the
        end); returns (first word, words in the sector)."""
        w0 = sec * 4
        nw = min(4, n_words - w0)
        for u in range(4):
            e[u] = valid_mask(w0 + u, n_words, n) if u < nw else uint64(0)
        return w0, nw

    @njit(inline="always")
    def sum_chunks(part, out, n_cols):
        """``out[c]`` = the sum over chunks (rows) of ``part[:, c]``, for ``c < n_cols``."""
        for c in range(n_cols):
            t = 0
            for k in range(part.shape[0]):
                t += part[k, c]
            out[c] = t

    @njit(parallel=True)
    def csr_scan(ptr, vals, m, chunk, out):
        """out[k] per chunk of slots: 0 canonical, 1 needs sorting, 2 value out of range,
        3 malformed indptr; out[n_chunks + k]: the first offending position."""
        n = ptr.size - 1
        n_chunks = (n + chunk - 1) // chunk
        for k in prange(n_chunks):
            status = 0
            at = 0
            for s in range(k * chunk, min(n, (k + 1) * chunk)):
                a = ptr[s]
                b = ptr[s + 1]
                if b < a or a < 0 or b > vals.size:
                    status = 3
                    at = s
                    break
                prev = -1
                for q in range(a, b):
                    v = vals[q]
                    if v < 0 or v >= m:
                        status = 2
                        at = q
                        break
                    if v <= prev:
                        status = 1
                    prev = v
                if status >= 2:
                    break
            out[k] = status
            out[n_chunks + k] = at

    @njit
    def scatter_word(w, ptr_i, val_i, ptr_x, val_x, n, n_total, has_i, has_x, map_i, map_x, inc, exc):
        """OR the bits of word ``w``'s 64 slots into the accumulators: slot s sets ``inc[map_i[v]]``
        for each included value v and ``exc[map_x[v]]`` for each excluded one (a negative map entry:
        value not accumulated here). Returns the word's unconstrained bits (no include set)."""
        unc = uint64(0)
        for b in range(64):
            s = w * 64 + b
            if s >= n_total:
                break
            bit = ONE << uint64(b)
            if s < n and has_i and ptr_i[s + 1] > ptr_i[s]:
                for q in range(ptr_i[s], ptr_i[s + 1]):
                    d = map_i[val_i[q]]
                    if d >= 0:
                        inc[d] |= bit
            else:
                unc |= bit
            if s < n and has_x:
                for q in range(ptr_x[s], ptr_x[s + 1]):
                    d = map_x[val_x[q]]
                    if d >= 0:
                        exc[d] |= bit
        return unc

    @njit(parallel=True)
    def build_folded(ptr_i, val_i, ptr_x, val_x, n, n_total, m, rows, chunk):
        """The m + 1 allows rows of one single-valued category into ``rows[0:m+1]`` (slots past
        the ``n`` with rules, up to ``n_total``, are unconstrained)."""
        n_words = rows.shape[1]
        n_chunks = (n_words + chunk - 1) // chunk
        has_i = ptr_i.size == n + 1
        has_x = ptr_x.size == n + 1
        identity = np.arange(m, dtype=np.int64)
        for k in prange(n_chunks):
            inc = np.zeros(m + 1, np.uint64)
            exc = np.zeros(m + 1, np.uint64)
            for w in range(k * chunk, min(n_words, (k + 1) * chunk)):
                unc = scatter_word(w, ptr_i, val_i, ptr_x, val_x, n, n_total, has_i, has_x, identity, identity,
                                   inc, exc)
                vm = valid_mask(w, n_words, n_total)
                for v in range(m):
                    rows[v, w] = ((unc | inc[v]) & ~exc[v]) & vm
                    inc[v] = 0
                    exc[v] = 0
                rows[m, w] = unc & vm

    @njit(parallel=True)
    def combine_group(member_rows, member_off, radix, live, use_live, rows, base, size, chunk):
        """Group rows ``rows[base + r] = AND_i member_rows[member_off[i] + digit_i(r)]`` (mixed radix,
        first member fastest), ANDed with the live bits when ``use_live``."""
        n_words = rows.shape[1]
        k = radix.size
        n_chunks = (n_words + chunk - 1) // chunk
        for t in prange(size * n_chunks):
            r = t // n_chunks
            c = t % n_chunks
            src = np.empty(k, np.int64)
            q = r
            for i in range(k):
                src[i] = member_off[i] + q % radix[i]
                q //= radix[i]
            w0 = c * chunk
            w1 = min(n_words, (c + 1) * chunk)
            if use_live:
                for w in range(w0, w1):
                    rows[base + r, w] = live[w]
            else:
                for w in range(w0, w1):
                    rows[base + r, w] = ALL
            for i in range(k):
                si = src[i]
                for w in range(w0, w1):
                    rows[base + r, w] &= member_rows[si, w]

    @njit(parallel=True)
    def build_split(ptr_i, val_i, ptr_x, val_x, n, n_total, dense_i, n_di, dense_x, n_dx, rows, unc_row,
                    inc_base, exc_base, chunk):
        n_words = rows.shape[1]
        n_chunks = (n_words + chunk - 1) // chunk
        has_i = ptr_i.size == n + 1
        has_x = ptr_x.size == n + 1
        for k in prange(n_chunks):
            inc = np.zeros(max(n_di, 1), np.uint64)
            exc = np.zeros(max(n_dx, 1), np.uint64)
            for w in range(k * chunk, min(n_words, (k + 1) * chunk)):
                unc = scatter_word(w, ptr_i, val_i, ptr_x, val_x, n, n_total, has_i, has_x, dense_i, dense_x,
                                   inc, exc)
                vm = valid_mask(w, n_words, n_total)
                rows[unc_row, w] = unc & vm
                for d in range(n_di):
                    rows[inc_base + d, w] = (unc | inc[d]) & vm
                    inc[d] = 0
                for d in range(n_dx):
                    rows[exc_base + d, w] = exc[d] & vm
                    exc[d] = 0

    @njit(parallel=True)
    def count_constrained(ptr_i, ptr_x, n, chunk):
        """Slots with a non-empty include or exclude set (an empty marker ptr counts as none)."""
        has_i = ptr_i.size == n + 1
        has_x = ptr_x.size == n + 1
        n_chunks = (n + chunk - 1) // chunk
        # per-chunk partial sums, not a prange scalar reduction: Numba 0.68.0's parfor reduction
        # analysis fails on this loop under Python 3.12 ("unexpected cycle in lookup()")
        part = np.zeros(n_chunks, np.int64)
        for k in prange(n_chunks):
            t = 0
            for s in range(k * chunk, min(n, (k + 1) * chunk)):
                if (has_i and ptr_i[s + 1] > ptr_i[s]) or (has_x and ptr_x[s + 1] > ptr_x[s]):
                    t += 1
            part[k] = t
        return part.sum()

    @njit
    def fill_lists(ptr, vals, n, list_of, starts, pool):
        """Append each slot to the list of each of its sparse values, in slot order
        (``starts`` is advanced: the caller passes a copy)."""
        for s in range(n):
            for q in range(ptr[s], ptr[s + 1]):
                lid = list_of[vals[q]]
                if lid >= 0:
                    pool[starts[lid]] = s
                    starts[lid] += 1

    @njit(parallel=True)
    def popcounts(rows, out):
        for r in prange(rows.shape[0]):
            t = uint64(0)
            for w in range(rows.shape[1]):
                t += popc(rows[r, w])
            out[r] = t

    @njit
    def gather_codes(ptrs, vals, colhi, slots, n_base):
        """Rule codes ``(cat << 33) | (kind << 32) | value`` of the given base slots, sorted per slot
        (columns come in (cat, kind) order and values are sorted within a column)."""
        k = slots.size
        out_ptr = np.zeros(k + 1, np.int64)
        for i in range(k):
            s = slots[i]
            t = 0
            if s < n_base:
                for j in range(len(ptrs)):
                    t += ptrs[j][s + 1] - ptrs[j][s]
            out_ptr[i + 1] = out_ptr[i] + t
        codes = np.empty(out_ptr[k], np.int64)
        for i in range(k):
            s = slots[i]
            if s >= n_base:
                continue
            o = out_ptr[i]
            for j in range(len(ptrs)):
                p = ptrs[j]
                v = vals[j]
                for q in range(p[s], p[s + 1]):
                    codes[o] = colhi[j] | np.int64(v[q])
                    o += 1
        return out_ptr, codes

    @njit
    def allows_vec(codes, lo, mid, hi, m, live, out, off):
        """Allows vector of one single-valued category: ``out[off + v]`` for v in 0..m (m: no value)."""
        unc = mid == lo
        for v in range(m + 1):
            out[off + v] = unc and live
        for q in range(lo, mid):
            out[off + (codes[q] & 0xFFFFFFFF)] = live
        for q in range(mid, hi):
            out[off + (codes[q] & 0xFFFFFFFF)] = False

    @njit
    def diff(slots, old_ptr, old_codes, old_live, new_ptr, new_codes, new_live, cat_m, cat_group, unc_row,
             dinc_ptr, dinc_vals, dinc_rows, vrow_ptr, vrow, list_ptr, group_ptr, group_members, group_base,
             group_size, carrier, voff, va, vb, mark, out_set, out_clr, out_lists, cons_delta):
        """Net bit flips and list operations of the touched slots (old state -> new state).

        Rule codes: ``(cat << 33) | (kind << 32) | value``, sorted per slot. Output codes:
        ``row << 40 | slot``. List ops: ``(list id, slot, +1 add / -1 remove)`` rows of out_lists.
        Returns (n_set, n_clr, n_list_ops).
        """
        C = cat_m.size
        G = group_size.size
        sa = np.full((C, 3), -1, np.int64)
        sb = np.full((C, 3), -1, np.int64)
        seen = np.zeros(C, np.bool_)
        gmark = np.zeros(max(G, 1), np.bool_)
        cats = np.empty(C, np.int64)
        kmax = 1
        for g in range(G):
            kmax = max(kmax, group_ptr[g + 1] - group_ptr[g])
        lptr = np.zeros(kmax + 1, np.int64)
        pos = np.zeros(kmax, np.int64)
        lval = np.zeros(va.size, np.int64)
        n_set = 0
        n_clr = 0
        n_lo = 0
        for i in range(slots.size):
            s = slots[i]
            lo_o, hi_o = old_ptr[i], old_ptr[i + 1]
            lo_n, hi_n = new_ptr[i], new_ptr[i + 1]
            lv_changed = old_live[i] != new_live[i]
            if lv_changed:
                if new_live[i]:
                    out_set[n_set] = s
                    n_set += 1
                else:
                    out_clr[n_clr] = s
                    n_clr += 1
            # the slices of every category either rule mentions
            nc = 0
            for side in range(2):
                codes = old_codes if side == 0 else new_codes
                p = lo_o if side == 0 else lo_n
                hi = hi_o if side == 0 else hi_n
                st = sa if side == 0 else sb
                while p < hi:
                    c = codes[p] >> 33
                    a0 = p
                    while p < hi and (codes[p] >> 33) == c and ((codes[p] >> 32) & 1) == 0:
                        p += 1
                    a1 = p
                    while p < hi and (codes[p] >> 33) == c:
                        p += 1
                    st[c, 0] = a0
                    st[c, 1] = a1
                    st[c, 2] = p
                    if not seen[c]:
                        seen[c] = True
                        cats[nc] = c
                        nc += 1
            for j in range(nc):
                c = cats[j]
                a0, a1, a2 = sa[c, 0], sa[c, 1], sa[c, 2]
                b0, b1, b2 = sb[c, 0], sb[c, 1], sb[c, 2]
                if a0 < 0:
                    a0, a1, a2 = lo_o, lo_o, lo_o
                if b0 < 0:
                    b0, b1, b2 = lo_n, lo_n, lo_n
                cons_delta[c] += (1 if b2 > b0 else 0) - (1 if a2 > a0 else 0)
                if cat_group[c] >= 0:
                    gmark[cat_group[c]] = True
                    continue
                unc_o = a1 == a0
                unc_n = b1 == b0
                if unc_o != unc_n:
                    code = (unc_row[c] << 40) | s
                    if unc_n:
                        out_set[n_set] = code
                        n_set += 1
                    else:
                        out_clr[n_clr] = code
                        n_clr += 1
                for kind in range(2):
                    lo1, hi1 = (a0, a1) if kind == 0 else (a1, a2)
                    lo2, hi2 = (b0, b1) if kind == 0 else (b1, b2)
                    for q in range(lo1, hi1):
                        mark[old_codes[q] & 0xFFFFFFFF] |= 1
                    for q in range(lo2, hi2):
                        mark[new_codes[q] & 0xFFFFFFFF] |= 2
                    if kind == 0 and not (unc_o and unc_n):
                        for d in range(dinc_ptr[c], dinc_ptr[c + 1]):
                            v = dinc_vals[d]
                            bo = unc_o or (mark[v] & 1) != 0
                            bn = unc_n or (mark[v] & 2) != 0
                            if bo != bn:
                                code = (dinc_rows[d] << 40) | s
                                if bn:
                                    out_set[n_set] = code
                                    n_set += 1
                                else:
                                    out_clr[n_clr] = code
                                    n_clr += 1
                    for side in range(2):
                        codes = old_codes if side == 0 else new_codes
                        lo, hi = (lo1, hi1) if side == 0 else (lo2, hi2)
                        only = 1 if side == 0 else 2
                        for q in range(lo, hi):
                            v = codes[q] & 0xFFFFFFFF
                            if mark[v] != only:
                                continue
                            r = vrow[vrow_ptr[2 * c + kind] + v]
                            if r >= 0:
                                if kind == 1:  # a dense exclude row (include rows were handled above)
                                    if side == 1:
                                        out_set[n_set] = (r << 40) | s
                                        n_set += 1
                                    else:
                                        out_clr[n_clr] = (r << 40) | s
                                        n_clr += 1
                            else:
                                out_lists[n_lo, 0] = list_ptr[2 * c + kind] + v
                                out_lists[n_lo, 1] = s
                                out_lists[n_lo, 2] = 1 if side == 1 else -1
                                n_lo += 1
                    for q in range(lo1, hi1):
                        mark[old_codes[q] & 0xFFFFFFFF] = 0
                    for q in range(lo2, hi2):
                        mark[new_codes[q] & 0xFFFFFFFF] = 0
            if lv_changed and carrier >= 0:
                gmark[carrier] = True
            # folded groups: allows vectors of the members, then every combination row
            for g in range(G):
                if not gmark[g]:
                    continue
                gmark[g] = False
                lv_o = old_live[i] if g == carrier else True
                lv_n = new_live[i] if g == carrier else True
                same = lv_o == lv_n
                for t in range(group_ptr[g], group_ptr[g + 1]):
                    c = group_members[t]
                    m = cat_m[c]
                    if sa[c, 0] >= 0:
                        allows_vec(old_codes, sa[c, 0], sa[c, 1], sa[c, 2], m, True, va, voff[c])
                    else:
                        for v in range(m + 1):
                            va[voff[c] + v] = True
                    if sb[c, 0] >= 0:
                        allows_vec(new_codes, sb[c, 0], sb[c, 1], sb[c, 2], m, True, vb, voff[c])
                    else:
                        for v in range(m + 1):
                            vb[voff[c] + v] = True
                    if same:
                        for v in range(m + 1):
                            if va[voff[c] + v] != vb[voff[c] + v]:
                                same = False
                                break
                if same:
                    continue
                # candidate digits per member: those allowed before or after (a combination with a
                # digit allowed in neither state stays 0); when a single member changed (and the
                # live bit did not), only its changed digits can flip a combination
                k0, k1 = group_ptr[g], group_ptr[g + 1]
                n_changed = 0
                only = -1
                for t in range(k0, k1):
                    c = group_members[t]
                    for v in range(cat_m[c] + 1):
                        if va[voff[c] + v] != vb[voff[c] + v]:
                            n_changed += 1
                            only = t
                            break
                single = n_changed == 1 and lv_o == lv_n
                n_l = 0
                for t in range(k0, k1):
                    c = group_members[t]
                    lptr[t - k0] = n_l
                    for v in range(cat_m[c] + 1):
                        x, y = va[voff[c] + v], vb[voff[c] + v]
                        if (single and t == only and x != y) or ((not single or t != only) and (x or y)):
                            lval[n_l] = v
                            n_l += 1
                    if n_l == lptr[t - k0]:
                        n_l = -1  # a member with no candidate digit: nothing flips
                        break
                if n_l >= 0:
                    k = k1 - k0
                    lptr[k] = n_l
                    for t in range(k):
                        pos[t] = lptr[t]
                    while True:
                        r = 0
                        stride = 1
                        bo = lv_o
                        bn = lv_n
                        for t in range(k):
                            c = group_members[k0 + t]
                            d = lval[pos[t]]
                            r += d * stride
                            stride *= cat_m[c] + 1
                            bo = bo and va[voff[c] + d]
                            bn = bn and vb[voff[c] + d]
                        if bo != bn:
                            code = ((group_base[g] + r) << 40) | s
                            if bn:
                                out_set[n_set] = code
                                n_set += 1
                            else:
                                out_clr[n_clr] = code
                                n_clr += 1
                        t = 0
                        while t < k:  # odometer over the candidate digits
                            pos[t] += 1
                            if pos[t] < lptr[t + 1]:
                                break
                            pos[t] = lptr[t]
                            t += 1
                        if t == k:
                            break
            for j in range(nc):
                c = cats[j]
                seen[c] = False
                sa[c, 0] = -1
                sb[c, 0] = -1
        return n_set, n_clr, n_lo

    @njit(parallel=True)
    def diff_par(n_chunks, slots, old_ptr, old_codes, old_live, new_ptr, new_codes, new_live, cat_m, cat_group,
                 unc_row, dinc_ptr, dinc_vals, dinc_rows, vrow_ptr, vrow, list_ptr, group_ptr, group_members,
                 group_base, group_size, carrier, voff, nv, max_m, n_rows, out_set, out_clr, out_lists, cons_delta):
        """:func:`diff` over chunks of the slots in parallel, each chunk with its own scratch and its
        own region of the outputs (``n_rows + 1`` codes per slot, one list op per rule code), then
        the regions packed in chunk order: the same outputs, in the same order, as one call."""
        n = slots.size
        C = cat_m.size
        bounds = np.empty(n_chunks + 1, np.int64)
        for c in range(n_chunks + 1):
            bounds[c] = (n * c) // n_chunks
        counts = np.zeros((n_chunks, 3), np.int64)
        cons = np.zeros((n_chunks, C), np.int64)
        per = n_rows + 1
        for c in prange(n_chunks):
            i0, i1 = bounds[c], bounds[c + 1]
            if i1 == i0:
                continue
            l0 = (old_ptr[i0] - old_ptr[0]) + (new_ptr[i0] - new_ptr[0])
            l1 = (old_ptr[i1] - old_ptr[0]) + (new_ptr[i1] - new_ptr[0])
            a, b, d = diff(slots[i0:i1], old_ptr[i0:i1 + 1], old_codes, old_live[i0:i1], new_ptr[i0:i1 + 1],
                           new_codes, new_live[i0:i1], cat_m, cat_group, unc_row, dinc_ptr, dinc_vals, dinc_rows,
                           vrow_ptr, vrow, list_ptr, group_ptr, group_members, group_base, group_size, carrier, voff,
                           np.zeros(nv, np.bool_), np.zeros(nv, np.bool_), np.zeros(max_m + 1, np.int8),
                           out_set[i0 * per:i1 * per], out_clr[i0 * per:i1 * per], out_lists[l0:l1 + 1], cons[c])
            counts[c, 0] = a
            counts[c, 1] = b
            counts[c, 2] = d
        n_set = 0
        n_clr = 0
        n_lo = 0
        for c in range(n_chunks):  # pack: every region starts at or after the packed end
            i0 = bounds[c]
            l0 = (old_ptr[i0] - old_ptr[0]) + (new_ptr[i0] - new_ptr[0])
            for q in range(counts[c, 0]):
                out_set[n_set + q] = out_set[i0 * per + q]
            for q in range(counts[c, 1]):
                out_clr[n_clr + q] = out_clr[i0 * per + q]
            for q in range(counts[c, 2]):
                for f in range(3):
                    out_lists[n_lo + q, f] = out_lists[l0 + q, f]
            n_set += counts[c, 0]
            n_clr += counts[c, 1]
            n_lo += counts[c, 2]
            for j in range(C):
                cons_delta[j] += cons[c, j]
        return n_set, n_clr, n_lo

    @njit
    def decode(x):
        return x if x >= 0 else -x - 1

    @njit
    def list_ops(ops, l_start, l_len, l_cap, l_live, l_sorted, pool, used, dirty):
        """Apply list ops (list id, slot, +1/-1) to the host list pool. ``dirty`` rows get
        ``(start, length)`` of each pool range written. Returns the number of dirty ranges, or
        ``-1 - i`` when op ``i`` removes an entry that is not there (an internal error)."""
        nd = 0
        for i in range(ops.shape[0]):
            lid = ops[i, 0]
            s = ops[i, 1]
            st = l_start[lid]
            if ops[i, 2] < 0:
                pos = -1
                lo = st
                hi = st + l_sorted[lid]
                while lo < hi:
                    mid = (lo + hi) // 2
                    if decode(pool[mid]) < s:
                        lo = mid + 1
                    else:
                        hi = mid
                if lo < st + l_sorted[lid] and pool[lo] == s:
                    pos = lo
                else:
                    for q in range(st + l_sorted[lid], st + l_len[lid]):
                        if pool[q] == s:
                            pos = q
                            break
                if pos < 0:
                    return -1 - i
                pool[pos] = -s - 1
                l_live[lid] -= 1
                dirty[nd, 0] = pos
                dirty[nd, 1] = 1
                nd += 1
                if l_len[lid] >= 32 and 2 * l_live[lid] < l_len[lid]:  # compact in place
                    k = 0
                    for q in range(st, st + l_len[lid]):
                        if pool[q] >= 0:
                            pool[st + k] = pool[q]
                            k += 1
                    pool[st:st + k].sort()
                    l_len[lid] = k
                    l_sorted[lid] = k
                    dirty[nd, 0] = st
                    dirty[nd, 1] = k
                    nd += 1
            else:
                if l_len[lid] < l_cap[lid]:
                    q = st + l_len[lid]
                    pool[q] = s
                    if l_sorted[lid] == l_len[lid] and (l_len[lid] == 0 or decode(pool[q - 1]) < s):
                        l_sorted[lid] += 1
                    l_len[lid] += 1
                    l_live[lid] += 1
                    dirty[nd, 0] = q
                    dirty[nd, 1] = 1
                    nd += 1
                else:  # move to a region twice the live size at the end of the pool
                    cap = max(8, 2 * (l_live[lid] + 1))
                    ns = used[0]
                    used[0] += cap
                    k = 0
                    for q in range(st, st + l_len[lid]):
                        if pool[q] >= 0:
                            pool[ns + k] = pool[q]
                            k += 1
                    pool[ns + k] = s
                    k += 1
                    pool[ns:ns + k].sort()
                    l_start[lid] = ns
                    l_len[lid] = k
                    l_cap[lid] = cap
                    l_sorted[lid] = k
                    l_live[lid] = k
                    dirty[nd, 0] = ns
                    dirty[nd, 1] = k
                    nd += 1
        return nd

    @njit
    def partition_codes(set_codes, clr_codes, n_parts, order, starts):
        """Counting sort of the codes by ``row % n_parts`` (sets first in each part): ``order``
        gets signed indices (``i`` set code i, ``-1 - i`` clear code i), ``starts`` the parts' offsets."""
        counts = np.zeros(n_parts + 1, np.int64)
        for i in range(set_codes.size):
            counts[(set_codes[i] >> 40) % n_parts + 1] += 1
        for i in range(clr_codes.size):
            counts[(clr_codes[i] >> 40) % n_parts + 1] += 1
        for p in range(n_parts):
            counts[p + 1] += counts[p]
        for p in range(n_parts + 1):
            starts[p] = counts[p]
        for i in range(set_codes.size):
            p = (set_codes[i] >> 40) % n_parts
            order[counts[p]] = i
            counts[p] += 1
        for i in range(clr_codes.size):
            p = (clr_codes[i] >> 40) % n_parts
            order[counts[p]] = -1 - i
            counts[p] += 1

    @njit(parallel=True)
    def apply_bits(rows, set_codes, clr_codes, row_count, order, starts):
        """Flip the listed bits (each code names a bit that changes) and count them per row; each
        part (``partition_codes``) holds whole rows, so no two threads touch one word."""
        mask40 = (np.int64(1) << 40) - 1
        for p in prange(starts.size - 1):
            for j in range(starts[p], starts[p + 1]):
                i = order[j]
                if i >= 0:
                    code = set_codes[i]
                    delta = 1
                else:
                    code = clr_codes[-1 - i]
                    delta = -1
                r = code >> 40
                s = code & mask40
                rows[r, s >> 6] ^= ONE << uint64(s & 63)
                row_count[r] += delta

    @njit
    def count_bits(set_codes, clr_codes, row_count):
        """Row popcount changes of a delta's bit flips (when the host keeps no bits)."""
        for i in range(set_codes.size):
            row_count[set_codes[i] >> 40] += 1
        for i in range(clr_codes.size):
            row_count[clr_codes[i] >> 40] -= 1

    # ------------------------------------------------------------------ CPU match (baseline)

    @njit
    def cpu_scatter(pool, seg_start, seg_len, seg_dst, scratch, value):
        """value 1: set the listed slots' bits in scratch row seg_dst; 0: zero their words."""
        for k in range(seg_start.size):
            for q in range(seg_start[k], seg_start[k] + seg_len[k]):
                s = np.int64(pool[q])
                if s >= 0:
                    if value:
                        scratch[seg_dst[k], s >> 6] |= ONE << uint64(s & 63)
                    else:
                        scratch[seg_dst[k], s >> 6] = 0

    @njit(parallel=True)
    def cpu_match(rows, scratch, n, inc_ptr, inc_rows, exc_ptr, exc_rows, out, chunk):
        n_words = out.size
        nr = rows.shape[0]
        n_cat = inc_ptr.size - 1
        n_chunks = (n_words + chunk - 1) // chunk
        part = np.zeros(n_chunks, np.int64)  # per-chunk sums (see count_constrained)
        for k in prange(n_chunks):
            t = 0
            for w in range(k * chunk, min(n_words, (k + 1) * chunk)):
                e = valid_mask(w, n_words, n)
                for c in range(n_cat):
                    if e == 0:
                        break
                    acc = uint64(0)
                    for j in range(inc_ptr[c], inc_ptr[c + 1]):
                        if (e & ~acc) == 0:
                            break
                        r = inc_rows[j]
                        acc |= rows[r, w] if r < nr else scratch[r - nr, w]
                    e &= acc
                    for j in range(exc_ptr[c], exc_ptr[c + 1]):
                        if e == 0:
                            break
                        r = exc_rows[j]
                        e &= ~(rows[r, w] if r < nr else scratch[r - nr, w])
                out[w] = e
                t += popc(e)
            part[k] = t
        return part.sum()

    @njit(parallel=True)
    def sector_counts(rows, scratch, n, n_words, inc_ptr, inc_rows, exc_ptr, exc_rows, out, chunk, prefetch):
        """The match kernel's reads, emulated: ``out[j]`` = 32-byte sectors (4 words) of the
        rows of plan category ``j`` read (a word is read while it is alive, an include row only
        while the OR does not yet cover it); chunks of sectors in parallel. ``prefetch``: the
        kernel variant that reads each category's first include row during the previous category,
        for the words alive before it (counted for the category it belongs to)."""
        nr = rows.shape[0]
        n_cat = inc_ptr.size - 1
        n_sec = (n_words + 3) // 4
        n_chunks = (n_sec + chunk - 1) // chunk
        part = np.zeros((n_chunks, max(n_cat, 1)), np.int64)
        for k in prange(n_chunks):
            e = np.empty(4, np.uint64)
            acc = np.empty(4, np.uint64)
            for sec in range(k * chunk, min(n_sec, (k + 1) * chunk)):
                w0, nw = sector_start(e, sec, n_words, n)
                have_next = False
                for c in range(n_cat):
                    for u in range(4):
                        acc[u] = 0
                    j0 = inc_ptr[c]
                    pf_here = prefetch and c + 1 < n_cat and inc_ptr[c + 2] > inc_ptr[c + 1] and inc_ptr[c + 1] > j0
                    for j in range(j0, inc_ptr[c + 1]):
                        r = inc_rows[j]
                        if prefetch and j == j0 and have_next:  # read (and counted) one category earlier
                            for u in range(nw):
                                acc[u] |= rows[r, w0 + u] if r < nr else scratch[r - nr, w0 + u]
                        else:
                            hit = False
                            for u in range(nw):
                                if (e[u] & ~acc[u]) != 0:
                                    hit = True
                                    acc[u] |= rows[r, w0 + u] if r < nr else scratch[r - nr, w0 + u]
                            if hit:
                                part[k, c] += 1
                        if pf_here and j == j0:
                            for u in range(nw):
                                if e[u] != 0:
                                    part[k, c + 1] += 1
                                    break
                    have_next = pf_here
                    for u in range(4):
                        e[u] &= acc[u]
                    for j in range(exc_ptr[c], exc_ptr[c + 1]):
                        r = exc_rows[j]
                        hit = False
                        for u in range(nw):
                            if e[u] != 0:
                                hit = True
                                e[u] &= ~(rows[r, w0 + u] if r < nr else scratch[r - nr, w0 + u])
                        if hit:
                            part[k, c] += 1
        sum_chunks(part, out, n_cat)

    @njit(parallel=True)
    def sector_counts_grouped(rows, scratch, n, n_words, op_row, op_kind, op_cat, out, chunk, group):
        """The grouped match kernel's reads, emulated (match.kernels.match_grouped_kernel): ops in
        groups of ``group``; a sector of every op's row in a group is read when one of its 4 words
        is alive at the group's start. ``out[op_cat[j]]`` += sectors read for op ``j``."""
        nr = rows.shape[0]
        n_ops = op_row.size
        n_sec = (n_words + 3) // 4
        n_chunks = (n_sec + chunk - 1) // chunk
        part = np.zeros((n_chunks, out.size), np.int64)
        for k in prange(n_chunks):
            e = np.empty(4, np.uint64)
            acc = np.zeros(4, np.uint64)
            for sec in range(k * chunk, min(n_sec, (k + 1) * chunk)):
                w0, nw = sector_start(e, sec, n_words, n)
                for u in range(4):
                    acc[u] = 0
                j = 0
                while j < n_ops:
                    alive = False
                    for u in range(nw):
                        if e[u] != 0:
                            alive = True
                    if not alive:
                        break
                    for g in range(j, min(j + group, n_ops)):
                        if (op_kind[g] & 8) == 0:
                            part[k, op_cat[g]] += 1
                    for g in range(j, min(j + group, n_ops)):
                        kind = op_kind[g]
                        r = op_row[g]
                        for u in range(nw):
                            if kind & 8:
                                e[u] = 0
                                continue
                            x = rows[r, w0 + u] if r < nr else scratch[r - nr, w0 + u]
                            if kind & 4:
                                e[u] &= ~x
                            else:
                                acc[u] = x if kind & 1 else acc[u] | x
                                if kind & 2:
                                    e[u] &= acc[u]
                    j += group
        sum_chunks(part, out, out.size)

    @njit
    def cpu_clear(src, seg_start, seg_len, out):
        cleared = 0
        for k in range(seg_start.size):
            for q in range(seg_start[k], seg_start[k] + seg_len[k]):
                s = np.int64(src[q])
                if s >= 0 and (s >> 6) < out.size:
                    bit = ONE << uint64(s & 63)
                    if out[s >> 6] & bit:
                        cleared += 1
                        out[s >> 6] &= ~bit
        return cleared

    _HOST.update(popc=popc, csr_scan=csr_scan, build_folded=build_folded, combine_group=combine_group,
                 build_split=build_split, sector_counts_grouped=sector_counts_grouped,
                 fill_lists=fill_lists, count_constrained=count_constrained, popcounts=popcounts, gather_codes=gather_codes, diff=diff, diff_par=diff_par,
                 list_ops=list_ops, apply_bits=apply_bits, count_bits=count_bits, partition_codes=partition_codes, cpu_scatter=cpu_scatter, cpu_match=cpu_match,
                 cpu_clear=cpu_clear, sector_counts=sector_counts)
    return _HOST


# ============================================================================ rules

_SCAN_CHUNK = 1 << 16


def _check_csr(kind: str, name: str, m: int, ptr, vals, n: int, ids) -> tuple[np.ndarray, np.ndarray]:
    """Validate one CSR column and return it canonical (int64 indptr, int32 sorted distinct values)."""
    ptr, vals = np.asarray(ptr), np.asarray(vals)
    if ptr.shape != (n + 1,) or (ptr.size and ptr.dtype.kind not in "iu"):
        raise RuleError(f"{kind}, category {name!r}: indptr must be ({n + 1},) integers")
    if vals.ndim != 1 or (vals.size and vals.dtype.kind not in "iu"):
        raise RuleError(f"{kind}, category {name!r}: values must be a 1-D integer array")
    ptr = np.ascontiguousarray(ptr, dtype=np.int64)
    if ptr[0] != 0 or ptr[-1] != vals.size:
        raise RuleError(f"{kind}, category {name!r}: malformed indptr (must start at 0 and end at len(values))")
    if vals.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        if vals.size and (vals.min() < np.iinfo(np.int64).min or vals.max() > np.iinfo(np.int64).max):
            raise RuleError(f"{kind}, category {name!r}: value out of range 0..{m - 1}")
        vals = vals.astype(np.int64)
    v64 = np.ascontiguousarray(vals)
    if n == 0:
        return ptr, np.zeros(0, np.int32)
    k = host_kernels()
    n_chunks = -(-n // _SCAN_CHUNK)
    res = np.empty(2 * n_chunks, np.int64)
    k["csr_scan"](ptr, v64, m, _SCAN_CHUNK, res)
    status = res[:n_chunks]
    worst = int(status.max())
    if worst == 3:
        raise RuleError(f"{kind}, category {name!r}: malformed indptr (decreasing)")
    if worst == 2:
        at = int(res[n_chunks + int(np.flatnonzero(status == 2)[0])])
        slot = int(np.searchsorted(ptr, at, side="right") - 1)
        raise RuleError(f"ad {int(ids[slot])} ({kind}), category {name!r}: "
                        f"value {int(v64[at])} out of range 0..{m - 1}")
    if worst == 0:
        return ptr, (vals if vals.dtype == np.int32 else v64.astype(np.int32))
    slots = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))
    key = np.unique(slots * m + v64.astype(np.int64))  # sort and de-duplicate per ad
    new_slots, new_vals = key // m, (key % m).astype(np.int32)
    new_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(new_slots, minlength=n), out=new_ptr[1:])
    return new_ptr, new_vals


class TargetingRules:
    """The rules of every ad in the pool, stored by column (scales to 10^8 ads).

    Slot ``i`` holds ad ``ad_ids[i]`` (``-1``: a free slot of an index, see
    :meth:`TargetingIndex.current_rules`). Per category name, ``include[name]`` and
    ``exclude[name]`` are CSR pairs ``(indptr int64[n_ads + 1], values int32[nnz])``: ad ``i``'s set
    is ``values[indptr[i]:indptr[i + 1]]`` (sorted, no duplicates; empty include = unconstrained).

    Build with :meth:`from_records`, :meth:`from_jsonl`, :meth:`from_frame` or
    :meth:`from_columns`; all validate.
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

    def subset(self, slots) -> "TargetingRules":
        """The rules of some slots (in the given order) as a new, smaller TargetingRules: e.g. a
        sample of a 10^8-ad pool for the oracle. Vectorised; no validation needed."""
        slots = np.asarray(slots, dtype=np.int64)

        def take(csr):
            out = {}
            for name, (ptr, vals) in csr.items():
                lo, hi = ptr[slots], ptr[slots + 1]
                sizes = hi - lo
                new_ptr = np.zeros(slots.size + 1, np.int64)
                np.cumsum(sizes, out=new_ptr[1:])
                idx = np.repeat(lo - new_ptr[:-1], sizes) + np.arange(int(new_ptr[-1]))
                out[name] = (new_ptr, vals[idx])
            return out

        return TargetingRules(self.schema, self.ad_ids[slots], self.live[slots], take(self.include),
                              take(self.exclude))

    def restrict(self, categories: Iterable[str]) -> "TargetingRules":
        """The same ads with only the given categories' constraints (the others unconstrained)."""
        keep = set(categories)
        return TargetingRules(self.schema, self.ad_ids, self.live,
                              {k: v for k, v in self.include.items() if k in keep},
                              {k: v for k, v in self.exclude.items() if k in keep})

    @classmethod
    def from_columns(cls, schema: TargetingSchema, ad_ids, live=None, include=None, exclude=None,
                     allow_free: bool = False) -> "TargetingRules":
        """Validate column arrays (see the class docstring) and build the rules without per-ad
        Python objects. Values within an ad's set are sorted and de-duplicated here (a column that
        is already canonical, as the generator writes them, is validated in one parallel pass and
        kept as is).

        Args:
            allow_free: accept ``-1`` ad ids as free slots (they must be non-live and unconstrained).

        Raises:
            RuleError: duplicate or negative ad ids, a malformed CSR (indptr not starting at 0,
                decreasing, or not ending at len(values)), an unknown category, or a value out of
                range (the message names the first offending ad and the category).
        """
        ids = np.asarray(ad_ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise RuleError("ad_ids must be a 1-D integer array")
        if ids.size and ids.dtype.kind == "u" and ids.max() > MAX_AD_ID:
            raise RuleError(f"ad {int(ids.max())}: ad_id must be in 0..2^63-1")
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = ids.size
        free = ids == -1 if allow_free else np.zeros(n, bool)
        real = ids[~free] if allow_free else ids
        if real.size and real.min() < 0:
            raise RuleError(f"ad {int(real[real < 0][0])}: ad_id must be non-negative")
        if real.size > 1:
            srt = np.sort(real) if not np.all(real[1:] > real[:-1]) else real
            dup = srt[1:] == srt[:-1]
            if dup.any():
                raise RuleError(f"ad {int(srt[1:][dup][0])}: duplicate ad_id")
        live = np.ones(n, bool) if live is None else np.asarray(live)
        if live.shape != (n,) or live.dtype != np.bool_:
            raise RuleError(f"live must be a bool array of shape ({n},)")

        def check(csr, kind):
            out = {}
            for name, pair in (csr or {}).items():
                if name not in schema._pos:
                    raise RuleError(f"{kind}: unknown category {name!r}")
                if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                    raise RuleError(f"{kind}, category {name!r}: expected an (indptr, values) pair")
                out[name] = _check_csr(kind, name, schema[name].cardinality, pair[0], pair[1], n, ids)
            return out

        inc, exc = check(include, "include"), check(exclude, "exclude")
        if allow_free and free.any():
            if live[free].any():
                raise RuleError("a free slot (ad_id -1) must not be live")
            for csr in (inc, exc):
                for name, (ptr, _) in csr.items():
                    if np.any(np.diff(ptr)[free]):
                        raise RuleError(f"a free slot (ad_id -1) constrains category {name!r}")
        # copies: the index keeps these arrays as its source of truth for later updates, so a
        # caller reusing its buffers must not be able to change them underneath it
        inc = {name: (ptr.copy(), vals.copy()) for name, (ptr, vals) in inc.items()}
        exc = {name: (ptr.copy(), vals.copy()) for name, (ptr, vals) in exc.items()}
        return cls(schema, ids.copy(), live.copy(), inc, exc)

    @classmethod
    def from_records(cls, schema: TargetingSchema, records: Iterable[Mapping]) -> "TargetingRules":
        """Validate rule records (see module docstring) and keep them in the given order.

        Raises:
            RuleError: a record that is not a mapping, a missing / non-integer / negative /
                duplicate ``ad_id``, an unknown field or category, a value that is not an integer
                or is out of range, ``live`` that is not a bool. The message names the ad and the
                category.
        """
        ids, lives, cols = _records_to_columns(schema, records, allowed=("ad_id", "live", "include", "exclude"))
        return cls.from_columns(schema, ids, lives, cols["include"], cols["exclude"])

    @classmethod
    def from_jsonl(cls, schema: TargetingSchema, source) -> "TargetingRules":
        """Rules from JSON lines: a path, an open text file, or an iterable of strings, one record
        (module docstring) per non-empty line.

        Raises:
            RuleError: a line that is not valid JSON (the message gives the line number), or any
                error of :meth:`from_records`.
        """
        return cls.from_records(schema, _read_jsonl(source))

    def to_jsonl(self, path=None) -> str:
        """The rules as JSON lines (one record a line, sorted values); written to ``path`` if given."""
        text = "".join(json.dumps(r) + "\n" for r in self.to_records())
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

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
        frame_ids = [_ad_id(a, f"rule frame row {i}") for i, a in enumerate(frame["ad_id"])]
        order = sorted(set(frame_ids)) if ad_ids is None else [_ad_id(a, "ad_ids") for a in ad_ids]
        recs = {a: {"ad_id": a, "include": {}, "exclude": {}} for a in order}
        if len(recs) != len(order):
            raise RuleError("ad_ids holds duplicates")
        for i, (a, cat, kind, v) in enumerate(zip(frame_ids, frame["category"], frame["kind"], frame["value"])):
            if a not in recs:
                raise RuleError(f"ad {a}: not in ad_ids")
            if isinstance(v, (float, np.floating)) and np.isnan(v):
                raise RuleError(f"ad {a}, category {cat!r}: rule frame row {i} has no value (NaN)")
            recs[a][kind].setdefault(cat, []).append(v)
        if "live" in frame.columns:
            for i, (a, live) in enumerate(zip(frame_ids, frame["live"])):
                if not isinstance(live, (bool, np.bool_)):
                    raise RuleError(f"ad {a}: live must be a bool, got {live!r} (rule frame row {i})")
                if recs[a].get("live", bool(live)) != bool(live):
                    raise RuleError(f"ad {a}: rows disagree on live (rule frame row {i})")
                recs[a]["live"] = bool(live)
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


def _read_jsonl(source) -> list:
    """Records from a path (str or os.PathLike), an open text file, a string holding the lines,
    or an iterable of lines."""
    import os

    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source
                                           and not source.lstrip().startswith("{")):
        with open(source) as f:
            lines = f.read().splitlines()
    elif hasattr(source, "read"):
        lines = source.read().splitlines()
    elif isinstance(source, str):
        lines = source.splitlines()
    else:
        lines = list(source)
    out = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise RuleError(f"line {no}: not valid JSON ({exc.msg})") from None
    return out


#: Largest ad id (ids are stored as int64).
MAX_AD_ID = np.iinfo(np.int64).max


def _ad_id(value, where: str) -> int:
    """``value`` as an ad id: an integer (not a bool, not a float) in ``0..MAX_AD_ID``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value <= MAX_AD_ID:
        raise RuleError(f"{where}: ad_id must be an integer in 0..2^63-1, got {value!r}")
    return int(value)


def _records_to_columns(schema, records, allowed, need_rule=lambda rec: True):
    """Validate rule records into (ids, lives, {kind: {cat: (ptr, vals)}}) without de-duplicating ids."""
    ids, lives = [], []
    lists = {"include": {c.name: [] for c in schema}, "exclude": {c.name: [] for c in schema}}
    seen = set()
    check_dup = "op" not in allowed
    for pos, rec in enumerate(records):
        if not isinstance(rec, Mapping):
            raise RuleError(f"record {pos}: expected a mapping, got {type(rec).__name__}")
        extra = set(rec) - set(allowed)
        if extra:
            raise RuleError(f"record {pos}: unknown fields {sorted(extra)}")
        ad_id = _ad_id(rec.get("ad_id"), f"record {pos}")
        if check_dup:
            if ad_id in seen:
                raise RuleError(f"ad {ad_id}: duplicate ad_id")
            seen.add(ad_id)
        live = rec.get("live", True)
        if not isinstance(live, (bool, np.bool_)):
            raise RuleError(f"ad {ad_id}: live must be a bool, got {live!r}")
        for kind in ("include", "exclude"):
            part = rec.get(kind)
            part = {} if part is None else part
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
    return np.array(ids, np.int64), np.array(lives, bool), cols


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


def last_word_mask(n_bits: int) -> np.uint64:
    """The valid bits of the last word of an ``n_bits``-long bitset (all ones when n % 64 == 0)."""
    r = int(n_bits) % WORD_BITS
    return np.uint64((1 << r) - 1 if r else (1 << 64) - 1)


def word_of(slot: int) -> int:
    """The uint64 word holding ``slot`` (64-bit safe)."""
    return int(slot) >> 6


def bit_of(slot: int) -> np.uint64:
    """The mask of ``slot``'s bit within its word."""
    return np.uint64(1 << (int(slot) & 63))


# ============================================================================ updates


class UpdateBatch:
    """An ordered batch of ad updates: ``create`` (a new ad id with its rule), ``change`` (replace
    a live ad's rule and live flag), ``retire`` (remove the ad; its slot is freed for reuse).

    Columns: ``ops int8[k]`` (:data:`CREATE`, :data:`CHANGE`, :data:`RETIRE`), ``ad_ids
    int64[k]``, ``live bool[k]`` and the rules as sorted int64 codes ``(cat << 33) | (kind << 32) |
    value`` in CSR ``codes_ptr[k + 1], codes`` (empty for retires). Build with
    :meth:`from_records` (records of the module docstring's format plus ``"op"``),
    :meth:`from_jsonl` or :meth:`from_columns` (vectorised, for large batches); all validate
    against the schema. The same ad id may appear several times in a batch (e.g. create then
    change): the ops apply in order.
    """

    def __init__(self, schema, ops, ad_ids, live, codes_ptr, codes):
        self.schema = schema
        self.ops = ops
        self.ad_ids = ad_ids
        self.live = live
        self.codes_ptr = codes_ptr
        self.codes = codes

    def __len__(self):
        return int(self.ops.size)

    @classmethod
    def from_columns(cls, schema: TargetingSchema, ops, ad_ids, live=None, include=None,
                     exclude=None) -> "UpdateBatch":
        """``ops``: op codes or names; ``include`` / ``exclude``: per category CSR over the batch's
        ops (as :meth:`TargetingRules.from_columns`; a retire's sets must be empty).

        Raises:
            RuleError: unknown op, negative ad id, bad CSR / category / value (naming the ad).
        """
        try:
            ops = np.asarray(ops)
        except ValueError:  # ragged input
            raise RuleError("ops must be a 1-D array of op codes or names") from None
        if ops.ndim != 1:
            raise RuleError(f"ops must be a 1-D array of op codes or names, got shape {ops.shape}")
        if ops.dtype.kind in "OUS":
            def code(o):
                if isinstance(o, str):
                    return OP_NAMES.get(o, -1)
                if isinstance(o, (int, np.integer)) and not isinstance(o, (bool, np.bool_)):
                    return int(o)
                raise RuleError(f"ops: {o!r} is not an op code or name")
            ops = np.array([code(o) for o in ops.tolist()], np.int64)
        if ops.size and ops.dtype.kind not in "iu":
            raise RuleError("ops must be a 1-D array of op codes or names")
        ids = np.asarray(ad_ids)
        k = ops.size
        if ids.shape != (k,):
            raise RuleError(f"ad_ids must have shape ({k},), got {ids.shape}")
        if k and ids.dtype.kind not in "iu":
            raise RuleError(f"ad_ids must be integers, got dtype {ids.dtype}")
        if k and ids.dtype.kind == "u" and ids.max() > MAX_AD_ID:
            raise RuleError(f"ad {int(ids.max())}: ad_id must be in 0..2^63-1")
        ids = np.array(ids, dtype=np.int64)  # a copy: the batch never aliases the caller's buffer
        bad = (ops < 0) | (ops > RETIRE)
        if bad.any():
            raise RuleError(f"ad {int(ids[bad][0])}: unknown op {int(ops[bad][0])}")
        if k and ids.min() < 0:
            raise RuleError(f"ad {int(ids[ids < 0][0])}: ad_id must be non-negative")
        live = np.ones(k, bool) if live is None else np.asarray(live)
        if live.shape != (k,) or live.dtype != np.bool_:
            raise RuleError(f"live must be a bool array of shape ({k},)")
        parts = []
        for kind_no, (kind, csr) in enumerate((("include", include), ("exclude", exclude))):
            for name, pair in (csr or {}).items():
                if name not in schema._pos:
                    raise RuleError(f"{kind}: unknown category {name!r}")
                ptr, vals = _check_csr(kind, name, schema[name].cardinality, pair[0], pair[1], k, ids)
                sizes = np.diff(ptr)
                retire_with_rule = (ops == RETIRE) & (sizes > 0)
                if retire_with_rule.any():
                    raise RuleError(f"ad {int(ids[retire_with_rule][0])}: a retire carries no rule "
                                    f"(got {kind} values for category {name!r})")
                hi = (schema.index(name) << 33) | (kind_no << 32)
                parts.append((np.repeat(np.arange(k, dtype=np.int64), sizes), vals.astype(np.int64) | hi))
        if parts:
            op_of = np.concatenate([p[0] for p in parts])
            codes = np.concatenate([p[1] for p in parts])
            order = np.lexsort((codes, op_of))
            op_of, codes = op_of[order], codes[order]
            ptr = np.zeros(k + 1, np.int64)
            np.cumsum(np.bincount(op_of, minlength=k), out=ptr[1:])
        else:
            codes, ptr = np.zeros(0, np.int64), np.zeros(k + 1, np.int64)
        live = live & (ops != RETIRE)
        return cls(schema, ops.astype(np.int8), ids, live, ptr, codes)

    @classmethod
    def from_records(cls, schema: TargetingSchema, records: Iterable[Mapping]) -> "UpdateBatch":
        """Records ``{"op": "create" | "change" | "retire", "ad_id": ..., "live": ..., "include":
        {...}, "exclude": {...}}`` (a retire needs only ``op`` and ``ad_id``).

        Raises:
            RuleError: a missing or unknown op, or any rule error of :meth:`TargetingRules.from_records`.
        """
        records = list(records)
        ops = []
        for pos, rec in enumerate(records):
            op = rec.get("op") if isinstance(rec, Mapping) else None
            if op not in OP_NAMES:
                where = f"ad {rec.get('ad_id')!r}" if isinstance(rec, Mapping) and "ad_id" in rec else f"record {pos}"
                raise RuleError(f"{where}: op must be one of {sorted(OP_NAMES)}, got {op!r}")
            if op == "retire" and (set(rec) - {"op", "ad_id"}):
                raise RuleError(f"ad {rec.get('ad_id')!r}: a retire carries only op and ad_id")
            ops.append(OP_NAMES[op])
        ids, lives, cols = _records_to_columns(schema, records, allowed=("op", "ad_id", "live", "include", "exclude"))
        return cls.from_columns(schema, np.array(ops, np.int8), ids, lives, cols["include"], cols["exclude"])

    @classmethod
    def from_jsonl(cls, schema: TargetingSchema, source) -> "UpdateBatch":
        """Update records from JSON lines (see :meth:`from_records`)."""
        return cls.from_records(schema, _read_jsonl(source))

    def records(self) -> list[dict]:
        """The batch as records (for inspection and JSON lines)."""
        names = {v: k for k, v in OP_NAMES.items()}
        out = []
        for i in range(len(self)):
            rec = {"op": names[int(self.ops[i])], "ad_id": int(self.ad_ids[i])}
            if self.ops[i] != RETIRE:
                inc, exc = _codes_to_sets(self.schema, self.codes[self.codes_ptr[i]:self.codes_ptr[i + 1]])
                rec.update(live=bool(self.live[i]), include={c: sorted(s) for c, s in inc.items()},
                           exclude={c: sorted(s) for c, s in exc.items()})
            out.append(rec)
        return out


def _codes_to_sets(schema, codes) -> tuple[dict, dict]:
    inc, exc = {}, {}
    for code in np.asarray(codes, np.int64).tolist():
        cat, kind, v = code >> 33, (code >> 32) & 1, code & 0xFFFFFFFF
        (exc if kind else inc).setdefault(schema.categories[cat].name, set()).add(v)
    return ({k: frozenset(v) for k, v in inc.items()}, {k: frozenset(v) for k, v in exc.items()})


@dataclass
class UpdateDelta:
    """What one :meth:`TargetingIndex.apply` changed, ready for the device.

    ``bit_codes`` int64: ``row << 40 | slot``, the first ``n_set`` to set, the rest to clear;
    ``list_pos`` / ``list_vals`` int64: pool positions and their new entries; ``pool_size``: the
    host pool's length (the device grows its pool to it first); ``slots``: the slot of each op.
    """

    bit_codes: np.ndarray
    n_set: int
    list_pos: np.ndarray
    list_vals: np.ndarray
    pool_size: int
    slots: np.ndarray
    version: int

    @property
    def bits_changed(self) -> int:
        return int(self.bit_codes.size)

    @property
    def bytes_written(self) -> int:
        """Device bytes the update writes: one 32-byte sector per bit flip and per list entry
        (an upper bound; flips in one sector share it)."""
        return 32 * (self.bit_codes.size + self.list_pos.size)


# ============================================================================ layout and index


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


#: Folded groups hold at most this many rows (combinations of their members' values).
GROUP_MAX = 512


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


#: Slots per parallel chunk of an update's diff (smaller batches run it in one call).
DIFF_CHUNK_SLOTS = 64


class TargetingIndex:
    """Host-side bitset index over a pool of ad slots, updatable in place (module docstring).

    Args:
        rules: the initial rules; slot ``i`` holds ``rules.ad_ids[i]`` (``-1``: a free slot).
        capacity: total slots (default ``rules.n_ads``); slots past the rules start free, for
            ads created later.
        layout: an :class:`IndexLayout` to reuse (a rebuild keeps its original's); default
            :func:`choose_layout` with ``fold_max``, ``dense_min``, ``exclude_dense_min`` and
            ``group_max``.

    Attributes:
        n_ads: slots in the pool (the bitset length); ``n_words = ceil(n_ads / 64)``.
        bitsets: ``[n_rows, n_words]`` uint64 rows (row 0 = live).
        ad_ids: ``[n_ads]`` int64, slot -> ad id (``-1`` for a free slot).
        pool: the inverted lists' entries (int32 below 2^31 slots, else int64; ``-1 - slot``
            marks a removed entry).
        version: incremented by every applied update batch.
    """

    def __init__(self, rules: TargetingRules, capacity: int | None = None, *, layout: IndexLayout | None = None,
                 fold_max: int = FOLD_MAX, dense_min: int | None = None, exclude_dense_min: int | None = None,
                 group_max: int = GROUP_MAX):
        if not isinstance(rules, TargetingRules):
            raise TypeError(f"rules must be TargetingRules, got {type(rules).__name__}")
        schema = self.schema = rules.schema
        n_base = rules.n_ads
        if capacity is not None and (isinstance(capacity, (bool, np.bool_))
                                     or not isinstance(capacity, (int, np.integer))):
            raise TypeError(f"capacity must be an int (ad slots), got {capacity!r}")
        cap = n_base if capacity is None else int(capacity)
        if cap < n_base:
            raise ValueError(f"capacity {cap} is below the {n_base} ads given")
        if cap >= 1 << SLOT_BITS:
            raise ValueError(f"capacity must be below 2^{SLOT_BITS} slots")
        self.layout = layout or choose_layout(rules, cap, fold_max, dense_min, exclude_dense_min, group_max)
        L = self.layout
        if len(L.dense_inc) != len(schema):
            raise ValueError("layout does not fit the schema")
        self.n_ads = cap
        self.n_words = (cap + WORD_BITS - 1) // WORD_BITS
        self.version = 0
        self._base = rules
        self._n_base = n_base
        self.ad_ids = np.full(cap, -1, np.int64)
        self.ad_ids[:n_base] = rules.ad_ids
        self.live = np.zeros(cap, bool)
        self.live[:n_base] = rules.live & (rules.ad_ids >= 0)
        self._overlay: dict[int, tuple[bool, np.ndarray]] = {}
        self._id_slot: dict[int, int] = {}
        base_real = rules.ad_ids >= 0
        ids = rules.ad_ids
        if ids.size < 2 or np.all(ids[1:] > ids[:-1]):
            self._sorted_ids, self._sorted_slots = ids, None
        else:
            order = np.argsort(ids, kind="stable")
            self._sorted_ids, self._sorted_slots = ids[order], order
        free = np.concatenate([np.arange(cap - 1, n_base - 1, -1), np.flatnonzero(~base_real)[::-1]])
        self._free = free.astype(np.int64).tolist()  # a stack: pop() gives the lowest free slot first

        # ---- rows: 0 live, then the folded groups, then the split categories
        C = len(schema)
        self.cat_m = np.array([c.cardinality for c in schema], np.int64)
        self.cat_group = L.group_of(C)
        n_rows = 1
        gb, gs, gp, gm = [], [], [0], []
        for members in L.groups:
            size = int(np.prod([self.cat_m[c] + 1 for c in members]))
            gb.append(n_rows)
            gs.append(size)
            gm += list(members)
            gp.append(len(gm))
            n_rows += size
        self.group_base = np.array(gb, np.int64)
        self.group_size = np.array(gs, np.int64)
        self.group_ptr = np.array(gp, np.int64)
        self.group_members = np.array(gm, np.int64)
        self.unc_row = np.full(C, -1, np.int64)
        dinc_ptr, dinc_vals, dinc_rows = [0], [], []
        list_ptr = np.full(2 * C, -(1 << 62), np.int64)  # list id of (c, kind, v) = list_ptr[2c+kind] + v
        self._inc_row_of, self._exc_row_of = {}, {}
        n_lists = 0
        list_owner = []
        for ci, cat in enumerate(schema):
            m = cat.cardinality
            inc_of = np.full(m, -1, np.int64)
            exc_of = np.full(m, -1, np.int64)
            if self.cat_group[ci] < 0:
                self.unc_row[ci] = n_rows
                n_rows += 1
                inc_of[L.dense_inc[ci]] = n_rows + np.arange(L.dense_inc[ci].size)
                n_rows += L.dense_inc[ci].size
                exc_of[L.dense_exc[ci]] = n_rows + np.arange(L.dense_exc[ci].size)
                n_rows += L.dense_exc[ci].size
                dinc_vals.append(L.dense_inc[ci])
                dinc_rows.append(inc_of[L.dense_inc[ci]])
                for kind in (0, 1):
                    list_ptr[2 * ci + kind] = n_lists
                    list_owner.append(np.stack([np.full(m, ci), np.full(m, kind), np.arange(m)], axis=1))
                    n_lists += m
            dinc_ptr.append(dinc_ptr[-1] + (L.dense_inc[ci].size if self.cat_group[ci] < 0 else 0))
            self._inc_row_of[ci] = inc_of
            self._exc_row_of[ci] = exc_of
        if n_rows > MAX_ROWS:
            raise ValueError(f"{n_rows} rows exceed the update encoding's {MAX_ROWS}")
        self.n_rows = n_rows
        self._dinc_ptr = np.array(dinc_ptr, np.int64)
        self._dinc_vals = np.concatenate(dinc_vals) if dinc_vals else np.zeros(0, np.int64)
        self._dinc_rows = np.concatenate(dinc_rows) if dinc_rows else np.zeros(0, np.int64)
        # dense row of (c, kind, v): block 2c holds include' rows, 2c+1 exclude rows, -1 when listed
        parts, ptr = [], [0]
        for ci, cat in enumerate(schema):
            for part in (self._inc_row_of[ci], self._exc_row_of[ci]):
                parts.append(part)
                ptr.append(ptr[-1] + cat.cardinality)
        self._vrow = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        self._vrow_ptr = np.array(ptr, np.int64)
        self._voff = np.concatenate([[0], np.cumsum(self.cat_m + 1)]).astype(np.int64)
        self._list_ptr = list_ptr
        self.n_lists = n_lists
        self._list_owner = np.concatenate(list_owner) if list_owner else np.zeros((0, 3), np.int64)
        self._build(rules)

    # ------------------------------------------------------------------ build

    def _build(self, rules):
        k = host_kernels()
        schema, L = self.schema, self.layout
        n, cap = self._n_base, self.n_ads
        self.bitsets = np.empty((self.n_rows, self.n_words), np.uint64)
        live_pad = np.zeros(cap, bool)
        live_pad[:n] = self.live[:n]
        self.bitsets[0] = bits_from_mask(live_pad)
        chunk = 256
        empty_p, empty_v = np.zeros(1, np.int64), np.zeros(0, np.int32)
        self.list_dtype = np.int32 if cap <= INT32_LIST_MAX_SLOTS else np.int64

        def column(csr, name):
            p, v = csr.get(name, (empty_p, empty_v))
            if p.size != n + 1:
                return empty_p, empty_v
            return np.ascontiguousarray(p, np.int64), np.ascontiguousarray(v, np.int32)

        # folded groups (free capacity slots past the rules are unconstrained and not live)
        for g, members in enumerate(L.groups):
            radix = np.array([self.cat_m[c] + 1 for c in members], np.int64)
            off = np.concatenate([[0], np.cumsum(radix)[:-1]]).astype(np.int64)
            tmp = np.empty((int(radix.sum()), self.n_words), np.uint64)
            for c, o in zip(members, off):
                pi, vi = column(rules.include, schema.categories[c].name)
                px, vx = column(rules.exclude, schema.categories[c].name)
                k["build_folded"](pi, vi, px, vx, n, cap, int(self.cat_m[c]), tmp[o:], chunk)
            k["combine_group"](tmp, off, radix, self.bitsets[0], g == L.carrier, self.bitsets,
                               int(self.group_base[g]), int(self.group_size[g]), chunk)
        counts = np.zeros(self.n_lists, np.int64)
        cols = []
        for ci, cat in enumerate(schema):
            if self.cat_group[ci] >= 0:
                continue
            pi, vi = column(rules.include, cat.name)
            px, vx = column(rules.exclude, cat.name)
            k["build_split"](pi, vi, px, vx, n, cap, self._dense_index(L.dense_inc[ci], cat.cardinality),
                             int(L.dense_inc[ci].size), self._dense_index(L.dense_exc[ci], cat.cardinality),
                             int(L.dense_exc[ci].size), self.bitsets, int(self.unc_row[ci]),
                             int(self.unc_row[ci] + 1), int(self.unc_row[ci] + 1 + L.dense_inc[ci].size), chunk)
            for kind, (p, v, dense) in enumerate(((pi, vi, L.dense_inc[ci]), (px, vx, L.dense_exc[ci]))):
                if p.size != n + 1 or v.size == 0:
                    continue
                c = np.bincount(v, minlength=cat.cardinality)
                c[dense] = 0
                lid0 = self._list_ptr[2 * ci + kind]
                counts[lid0:lid0 + cat.cardinality] = c
                cols.append((ci, kind, p, v))
        # lists: capacity with slack for appends, laid out in list-id order
        caps = np.where(counts > 0, counts + np.maximum(4, counts // 8), 0)
        self.l_start = np.zeros(self.n_lists, np.int64)
        if self.n_lists:
            np.cumsum(caps[:-1], out=self.l_start[1:])
        used = int(caps.sum())
        self.pool = np.full(max(used + max(64, used // 4), 64), -1, self.list_dtype)
        self._pool_used = np.array([used], np.int64)
        self.l_len = counts.copy()
        self.l_cap = caps.astype(np.int64)
        self.l_live = counts.copy()
        self.l_sorted = counts.copy()
        for ci, kind, p, v in cols:
            m = schema.categories[ci].cardinality
            lid0 = self._list_ptr[2 * ci + kind]
            list_of = np.full(m, -1, np.int64)
            has = counts[lid0:lid0 + m] > 0
            list_of[has] = lid0 + np.flatnonzero(has)
            k["fill_lists"](p, v, n, list_of, self.l_start.copy(), self.pool)
        self.row_count = np.zeros(self.n_rows, np.int64)
        k["popcounts"](self.bitsets, self.row_count.view(np.uint64))
        self.constrained = np.zeros(len(schema), np.int64)
        for ci, cat in enumerate(schema):
            pi, _ = column(rules.include, cat.name)
            px, _ = column(rules.exclude, cat.name)
            self.constrained[ci] = int(k["count_constrained"](pi, px, n, 1 << 16))
        # base columns for rule lookups (the source of truth, with the overlay)
        colhi, ptrs, valss = [], [], []
        for ci, cat in enumerate(schema):
            for kind, csr in enumerate((rules.include, rules.exclude)):
                if cat.name in csr and csr[cat.name][0].size == n + 1:
                    ptrs.append(np.ascontiguousarray(csr[cat.name][0], np.int64))
                    valss.append(np.ascontiguousarray(csr[cat.name][1], np.int32))
                    colhi.append((ci << 33) | (kind << 32))
        self._cols = (tuple(ptrs), tuple(valss), np.array(colhi, np.int64))

    @staticmethod
    def _dense_index(dense: np.ndarray, m: int) -> np.ndarray:
        out = np.full(m, -1, np.int64)
        out[dense] = np.arange(dense.size)
        return out

    # ------------------------------------------------------------------ inspection

    @property
    def nbytes(self) -> int:
        """Bytes held by the bitset rows and the used part of the list pool."""
        return self.n_rows * self.n_words * 8 + int(self._pool_used[0]) * self.pool.itemsize

    @property
    def host_bits(self) -> bool:
        """Whether this index still keeps its bitset rows on the host (see :meth:`drop_host_bits`)."""
        return self.bitsets is not None

    def drop_host_bits(self) -> None:
        """Stop keeping the bitset rows on the host (for an index whose rows live on the device).

        Frees ``n_rows * n_words * 8`` bytes of host memory (18.8 GB for the 10^8-ad benchmark
        world) and the host half of every update's bit flips: :meth:`apply` then still validates,
        allocates slots, diffs rules into bit flips (returned in the delta for the device), updates
        the row popcounts, rules and lists, but flips no host bits. Afterwards the host-bit methods
        (:meth:`match_cpu`, :meth:`assert_same`, a new device copy) raise RuntimeError.
        """
        self.bitsets = None

    def _need_bits(self, what: str):
        if self.bitsets is None:
            raise RuntimeError(f"{what} needs the host bitset rows, which this index dropped (drop_host_bits)")
        return self.bitsets

    def memory_by_category(self, at_n_ads: int | None = None) -> list[dict]:
        """Memory per storage unit (a folded group or a split category): rows, live list entries
        and bytes (``storage``: folded or split). ``at_n_ads`` scales to another pool size (e.g.
        10^8): a row is ``n / 8`` bytes and list entries grow linearly (the default dense
        thresholds are fractions of the pool, so the decisions carry over for pools above
        ``DENSE_MIN_ADS * DENSE_DIVISOR`` ads). ``all_dense_bytes``: a split category with a
        bitset per (value, kind) and no lists; ``per_category_folded_bytes``: a folded group's
        members each folded alone.
        """
        scale = 1.0 if at_n_ads is None else at_n_ads / max(self.n_ads, 1)
        n = self.n_ads if at_n_ads is None else int(at_n_ads)
        row_bytes = -(-n // 64) * 8
        entry_bytes = 4 if n <= INT32_LIST_MAX_SLOTS else 8
        out = []
        for u in self.layout.describe(self.schema):
            entries = 0
            if u["layout"] == "split":
                ci = self.schema.index(u["unit"])
                lo = self._list_ptr[2 * ci]
                entries = int(round(self.l_live[lo:lo + 2 * int(self.cat_m[ci])].sum() * scale))
                all_dense = (2 * int(self.cat_m[ci]) + 1) * row_bytes
            else:
                members = u["unit"].split("+")
                all_dense = sum(self.schema[c].cardinality + 1 for c in members) * row_bytes
            u = dict(u, storage=u.pop("layout"))
            out.append({**u, "list_entries": entries, "row_bytes": u["rows"] * row_bytes,
                        "list_bytes": entries * entry_bytes, "bytes": u["rows"] * row_bytes + entries * entry_bytes,
                        "per_category_folded_bytes": all_dense if u["storage"] == "folded" else None,
                        "all_dense_bytes": all_dense if u["storage"] == "split" else None})
        return out

    def slot_of(self, ad_id: int) -> int | None:
        """The slot holding ``ad_id`` now, or None."""
        ad_id = int(ad_id)
        s = self._id_slot.get(ad_id)
        if s is not None:
            return s
        ids = self._sorted_ids
        i = int(np.searchsorted(ids, ad_id))
        if i < ids.size and ids[i] == ad_id:
            s = i if self._sorted_slots is None else int(self._sorted_slots[i])
            if self.ad_ids[s] == ad_id:
                return s
        return None

    def _base_slots(self, ad_ids: np.ndarray) -> np.ndarray:
        """Slots of ad ids that still sit where the build put them (-1 otherwise)."""
        ids = self._sorted_ids
        if ids.size == 0:
            return np.full(ad_ids.size, -1, np.int64)
        i = np.minimum(np.searchsorted(ids, ad_ids), ids.size - 1)
        s = i if self._sorted_slots is None else self._sorted_slots[i]
        ok = (ids[i] == ad_ids) & (self.ad_ids[s] == ad_ids)
        return np.where(ok, s, -1).astype(np.int64)

    def _rule_codes(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr, codes, live) of the current rules of some slots."""
        slots = np.asarray(slots, np.int64)
        over = [i for i, s in enumerate(slots.tolist()) if s in self._overlay]
        base_slots = slots.copy()
        if over:
            base_slots[over] = self.n_ads  # not a base slot: empty
        ptrs, vals, colhi = self._cols
        if ptrs:
            ptr, codes = host_kernels()["gather_codes"](ptrs, vals, colhi, base_slots, self._n_base)
        else:
            ptr, codes = np.zeros(slots.size + 1, np.int64), np.zeros(0, np.int64)
        live = self.live[slots].copy()
        if over:
            sizes = np.diff(ptr).copy()
            for i in over:
                sizes[i] = self._overlay[int(slots[i])][1].size
            new_ptr = np.zeros(slots.size + 1, np.int64)
            np.cumsum(sizes, out=new_ptr[1:])
            out = np.empty(int(new_ptr[-1]), np.int64)
            overset = set(over)
            for i in range(slots.size):
                if i in overset:
                    out[new_ptr[i]:new_ptr[i + 1]] = self._overlay[int(slots[i])][1]
                else:
                    out[new_ptr[i]:new_ptr[i + 1]] = codes[ptr[i]:ptr[i + 1]]
            ptr, codes = new_ptr, out
        return ptr, codes, live

    def rules_of_slots(self, slots) -> TargetingRules:
        """The current rules of some slots as TargetingRules (free slots: ad id -1), e.g. a sample
        for the oracle after updates."""
        slots = np.asarray(slots, np.int64)
        ptr, codes, live = self._rule_codes(slots)
        op_of = np.repeat(np.arange(slots.size, dtype=np.int64), np.diff(ptr))
        inc, exc = {}, {}
        for ci, cat in enumerate(self.schema):
            for kind, out in ((0, inc), (1, exc)):
                sel = (codes >> 32) == ((ci << 1) | kind)
                if not sel.any():
                    continue
                p = np.zeros(slots.size + 1, np.int64)
                np.cumsum(np.bincount(op_of[sel], minlength=slots.size), out=p[1:])
                out[cat.name] = (p, (codes[sel] & 0xFFFFFFFF).astype(np.int32))
        return TargetingRules(self.schema, self.ad_ids[slots].copy(), live, inc, exc)

    def current_rules(self) -> TargetingRules:
        """Every slot's current rule (free slots: ad id -1, not live, unconstrained)."""
        return self.rules_of_slots(np.arange(self.n_ads))

    def rebuild(self) -> "TargetingIndex":
        """An index built from scratch from the current ad id -> (slot, rule) map, with this
        index's layout and capacity (the reference for "updates equal a rebuild")."""
        return TargetingIndex(self.current_rules(), self.n_ads, layout=self.layout)

    def list_sets(self) -> dict:
        """``{(category, kind, value): sorted live slots}`` of every non-empty inverted list."""
        out = {}
        for lid in np.flatnonzero(self.l_live > 0).tolist():
            seg = self.pool[self.l_start[lid]:self.l_start[lid] + self.l_len[lid]].astype(np.int64)
            c, kind, v = self._list_owner[lid].tolist()
            out[(self.schema.categories[c].name, "exclude" if kind else "include", v)] = np.sort(seg[seg >= 0])
        return out

    def assert_same(self, other: "TargetingIndex", bitsets=None, pool=None) -> None:
        """Raise AssertionError unless ``other`` holds the same slots, ad ids, live flags, rules,
        bitset rows and list entries (as sets) as this index. ``bitsets`` / ``pool``: check these
        arrays (e.g. copies from the device) instead of this index's own."""
        if self.layout is not other.layout and not _layouts_equal(self.layout, other.layout):
            raise AssertionError("different layouts")
        if self.n_ads != other.n_ads:
            raise AssertionError(f"capacity {self.n_ads} != {other.n_ads}")
        if not np.array_equal(self.ad_ids, other.ad_ids):
            raise AssertionError(f"ad ids differ at slots {np.flatnonzero(self.ad_ids != other.ad_ids)[:10]}")
        if not np.array_equal(self.live, other.live):
            raise AssertionError("live flags differ")
        a = self._need_bits("assert_same") if bitsets is None else bitsets
        if not np.array_equal(a, other._need_bits("assert_same")):
            bad = np.argwhere(a != other.bitsets)[:5]
            raise AssertionError(f"bitset rows differ at (row, word) {bad.tolist()}")
        if not np.array_equal(self.row_count, other.row_count):
            raise AssertionError("row popcounts differ")
        if not np.array_equal(self.constrained, other.constrained):
            raise AssertionError("per-category constrained counts differ")
        mine = self.list_sets() if pool is None else self._list_sets_of(pool)
        theirs = other.list_sets()
        if mine.keys() != theirs.keys() or any(not np.array_equal(mine[k], theirs[k]) for k in mine):
            diff = sorted(set(mine) ^ set(theirs))[:5] or [k for k in mine if not np.array_equal(mine[k], theirs[k])][:5]
            raise AssertionError(f"inverted lists differ: {diff}")
        if not np.array_equal(self.l_live, other.l_live):
            raise AssertionError("list live counts differ")
        pa, ca, la = self._rule_codes(np.arange(self.n_ads))
        pb, cb, lb = other._rule_codes(np.arange(other.n_ads))
        if not (np.array_equal(pa, pb) and np.array_equal(ca, cb) and np.array_equal(la, lb)):
            raise AssertionError("rules differ")

    def _list_sets_of(self, pool) -> dict:
        saved = self.pool
        try:
            self.pool = pool
            return self.list_sets()
        finally:
            self.pool = saved

    # ------------------------------------------------------------------ requests

    def plan(self, profile: Mapping[str, frozenset]) -> MatchPlan:
        """The rows one request reads, grouped by category, most selective first.

        Per folded group: the one row of the user's value combination. Per split category: the
        OR of the include' rows of the user's dense values (the unconstrained row when there are
        none) and a patch row for the listed values; dense exclude rows are ANDNOTed; listed
        excludes are cleared afterwards. Groups and categories no ad constrains are skipped (except
        the live carrier). The order is by estimated pass fraction (row popcounts, list lengths).

        Args:
            profile: from :func:`make_profile` (every category present).
        """
        cats, patches, excl = [], [], []
        L = self.layout
        n = max(self.n_ads, 1)
        if L.carrier < 0:
            cats.append((self.row_count[0] / n, "live", [0], []))
        for g, members in enumerate(L.groups):
            if g != L.carrier and not any(self.constrained[c] for c in members):
                continue
            r = int(self.group_base[g])
            stride = 1
            for c in members:
                cat = self.schema.categories[c]
                vals = profile.get(cat.name, frozenset())
                r += (min(vals) if vals else cat.cardinality) * stride
                stride *= cat.cardinality + 1
            name = "+".join(self.schema.categories[c].name for c in members)
            cats.append((self.row_count[r] / n, name, [r], []))
        for ci, cat in enumerate(self.schema):
            if self.cat_group[ci] >= 0 or self.constrained[ci] == 0:
                continue
            vals = sorted(profile.get(cat.name, frozenset()))
            inc_of, exc_of = self._inc_row_of[ci], self._exc_row_of[ci]
            rows = [int(inc_of[v]) for v in vals if inc_of[v] >= 0]
            lids = [int(self._list_ptr[2 * ci] + v) for v in vals if inc_of[v] < 0]
            lids = [lid for lid in lids if self.l_live[lid] > 0]
            unc = int(self.row_count[self.unc_row[ci]])
            est = unc + sum(int(self.row_count[r]) - unc for r in rows) + sum(int(self.l_live[x]) for x in lids)
            if not rows:
                rows = [int(self.unc_row[ci])]
            if lids:
                rows.append(-1 - len(patches))
                patches.append(np.array(lids, np.int64))
            xr = [int(exc_of[v]) for v in vals if exc_of[v] >= 0]
            for v in vals:
                lid = int(self._list_ptr[2 * ci + 1] + v)
                if exc_of[v] < 0 and self.l_live[lid] > 0:
                    excl.append(lid)
            cats.append((min(1.0, est / n), cat.name, rows, xr))
        cats.sort(key=lambda c: c[0])
        inc_ptr, exc_ptr, inc, exc = [0], [0], [], []
        for _, _, i_rows, x_rows in cats:
            inc += i_rows
            exc += x_rows
            inc_ptr.append(len(inc))
            exc_ptr.append(len(exc))
        return MatchPlan(
            inc_ptr=np.array(inc_ptr, np.int64), inc_rows=np.array(inc, np.int64),
            exc_ptr=np.array(exc_ptr, np.int64), exc_rows=np.array(exc, np.int64),
            patch_lists=tuple(patches), exclude_lists=np.array(excl, np.int64),
            categories=tuple(c[1] for c in cats), estimates=tuple(float(c[0]) for c in cats))

    def segments(self, list_ids) -> tuple[np.ndarray, np.ndarray]:
        """Pool ``(start, length)`` of some lists (removed entries included; readers skip them)."""
        ids = np.asarray(list_ids, np.int64)
        return self.l_start[ids].copy(), self.l_len[ids].copy()

    # ------------------------------------------------------------------ updates

    def apply(self, batch: UpdateBatch) -> UpdateDelta:
        """Apply an update batch to the host index (module docstring) and return the delta for the
        device. Validates the whole batch first: on any error nothing changes.

        Raises:
            RuleError: a create of an existing ad id, a change or retire of an unknown one, a batch
                built for another schema, or no free slot left (the message names the ad).
        """
        if not isinstance(batch, UpdateBatch):
            raise TypeError(f"batch must be an UpdateBatch, got {type(batch).__name__}")
        if batch.schema != self.schema:
            raise RuleError("update batch was built for another schema")
        # ---- validate and allocate, on a scratch view of the id map
        pending: dict[int, int | None] = {}
        free = self._free
        n_popped = 0
        pushed: list[int] = []
        final: dict[int, int] = {}  # slot -> index of the op that sets its final state (-1: freed)
        op_slots = np.empty(len(batch), np.int64)
        ops, ids = batch.ops.tolist(), batch.ad_ids.tolist()
        base = self._base_slots(batch.ad_ids).tolist()  # vectorised lookup of the build's ids
        id_slot = self._id_slot
        for i, (op, ad) in enumerate(zip(ops, ids)):
            if ad in pending:
                cur = pending[ad]
            else:
                cur = id_slot.get(ad)
                if cur is None and base[i] >= 0:
                    cur = base[i]
            if op == CREATE:
                if cur is not None:
                    raise RuleError(f"ad {ad}: create of an ad that already exists (slot {cur})")
                if pushed:
                    s = pushed.pop()
                else:
                    if n_popped >= len(free):
                        raise RuleError(f"ad {ad}: no free slot left (capacity {self.n_ads})")
                    n_popped += 1
                    s = free[-n_popped]
                pending[ad] = s
                final[s] = i
            elif cur is None:
                raise RuleError(f"ad {ad}: {'change' if op == CHANGE else 'retire'} of an unknown ad")
            elif op == CHANGE:
                s = cur
                final[s] = i
            else:
                s = cur
                pending[ad] = None
                final[s] = -1
                pushed.append(s)
            op_slots[i] = s
        # ---- net change per touched slot
        k = host_kernels()
        slots = np.fromiter(final.keys(), np.int64, len(final))
        order = np.argsort(slots)
        slots = slots[order]
        which = np.fromiter(final.values(), np.int64, len(final))[order]
        old_ptr, old_codes, old_live = self._rule_codes(slots)
        sizes = np.where(which >= 0, batch.codes_ptr[np.maximum(which, 0) + 1] - batch.codes_ptr[np.maximum(which, 0)], 0)
        new_ptr = np.zeros(slots.size + 1, np.int64)
        np.cumsum(sizes, out=new_ptr[1:])
        starts = batch.codes_ptr[np.maximum(which, 0)]
        idx = np.repeat(starts - new_ptr[:-1], sizes) + np.arange(int(new_ptr[-1]))
        new_codes = batch.codes[idx]
        new_live = np.where(which >= 0, batch.live[np.maximum(which, 0)], False)
        C = len(self.schema)
        max_m = int(self.cat_m.max()) if C else 0
        bound = slots.size * (self.n_rows + 1) + 4
        out_set = np.empty(bound, np.int64)
        out_clr = np.empty(bound, np.int64)
        out_lists = np.empty((old_codes.size + new_codes.size + 1, 3), np.int64)
        cons_delta = np.zeros(C, np.int64)
        nv = int(self._voff[-1]) + 1
        tables = (self.cat_m, self.cat_group, self.unc_row, self._dinc_ptr, self._dinc_vals, self._dinc_rows,
                  self._vrow_ptr, self._vrow, self._list_ptr, self.group_ptr, self.group_members, self.group_base,
                  self.group_size, self.layout.carrier, self._voff)
        n_chunks = min(4 * _threads(), slots.size // DIFF_CHUNK_SLOTS)
        if n_chunks >= 2:  # chunks of slots in parallel, outputs in the same order as one call
            n_set, n_clr, n_lo = k["diff_par"](
                n_chunks, slots, old_ptr, old_codes, old_live, new_ptr, new_codes, new_live, *tables, nv, max_m,
                self.n_rows, out_set, out_clr, out_lists, cons_delta)
        else:
            n_set, n_clr, n_lo = k["diff"](
                slots, old_ptr, old_codes, old_live, new_ptr, new_codes, new_live, *tables,
                np.zeros(nv, np.bool_), np.zeros(nv, np.bool_), np.zeros(max_m + 1, np.int8), out_set, out_clr,
                out_lists, cons_delta)
        lops = out_lists[:n_lo]
        # ---- lists: make room (moves need up to twice a list's size), then apply on the host
        if n_lo:
            adds = lops[lops[:, 2] > 0, 0]
            if adds.size:
                lids, cnt = np.unique(adds, return_counts=True)
                need = int((4 * (self.l_live[lids] + cnt) + 16).sum())
                if self.pool.size - int(self._pool_used[0]) < need:
                    grown = np.full(max(2 * self.pool.size, int(self._pool_used[0]) + need), -1, self.pool.dtype)
                    grown[:self.pool.size] = self.pool
                    self.pool = grown
            dirty = np.empty((2 * n_lo + 1, 2), np.int64)
            nd = k["list_ops"](lops, self.l_start, self.l_len, self.l_cap, self.l_live, self.l_sorted, self.pool,
                               self._pool_used, dirty)
            if nd < 0:
                raise AssertionError(f"internal: list entry missing for op {lops[-1 - nd].tolist()}")
            dirty = dirty[:nd]
            if nd:
                starts, lens = dirty[:, 0], dirty[:, 1]
                offs = np.zeros(nd + 1, np.int64)
                np.cumsum(lens, out=offs[1:])
                pos = np.repeat(starts - offs[:-1], lens) + np.arange(int(offs[-1]), dtype=np.int64)
                pos = np.unique(pos)
            else:
                pos = np.zeros(0, np.int64)
        else:
            pos = np.zeros(0, np.int64)
        set_codes, clr_codes = out_set[:n_set], out_clr[:n_clr]
        n_parts = 4 * _threads()
        order = np.empty(set_codes.size + clr_codes.size, np.int64)
        starts = np.empty(n_parts + 1, np.int64)
        if self.bitsets is not None:
            k["partition_codes"](set_codes, clr_codes, n_parts, order, starts)
            k["apply_bits"](self.bitsets, set_codes, clr_codes, self.row_count, order, starts)
        else:  # rows on the device only: keep the popcounts (the planner orders categories by them)
            k["count_bits"](set_codes, clr_codes, self.row_count)
        # ---- commit the id map, rules and free list
        self.constrained += cons_delta
        for i, (op, ad) in enumerate(zip(ops, ids)):
            if op == RETIRE:
                self._id_slot.pop(ad, None)
        for ad, s in pending.items():
            if s is not None:
                self._id_slot[ad] = s
        if n_popped:
            del free[-n_popped:]
        free.extend(pushed)
        for j, s in enumerate(slots.tolist()):
            w = int(which[j])
            if w < 0:
                self.ad_ids[s] = -1
                self.live[s] = False
                self._overlay[s] = (False, np.zeros(0, np.int64))
            else:
                self.ad_ids[s] = batch.ad_ids[w]
                self.live[s] = bool(batch.live[w])
                self._overlay[s] = (bool(batch.live[w]), new_codes[new_ptr[j]:new_ptr[j + 1]].copy())
        self.version += 1
        return UpdateDelta(bit_codes=np.concatenate([set_codes, clr_codes]), n_set=int(n_set), list_pos=pos,
                           list_vals=self.pool[pos].astype(np.int64), pool_size=int(self.pool.size),
                           slots=op_slots, version=self.version)

    # ------------------------------------------------------------------ CPU baseline

    def match_cpu(self, profile: Mapping, exclude_slots=None, n_words: int | None = None,
                  out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """The same match on the host's cores (Numba-parallel over words; the CPU baseline).

        Returns ``(words uint64[n_words], count)``. ``n_words`` limits the match to a prefix of the
        pool (pool-size sweeps).
        """
        k = host_kernels()
        prof = make_profile(self.schema, profile)
        plan = self.plan(prof)
        nw = self.n_words if n_words is None else int(n_words)
        n = min(self.n_ads, nw * WORD_BITS)
        if getattr(self, "_cpu_scratch", None) is None or self._cpu_scratch.shape[0] < max(plan.n_patches, 1):
            self._cpu_scratch = np.zeros((max(plan.n_patches, 1), self.n_words), np.uint64)
        scratch = self._cpu_scratch
        nr = self.n_rows
        seg_s, seg_l, seg_d = self._patch_segments(plan)
        k["cpu_scatter"](self.pool, seg_s, seg_l, seg_d, scratch, 1)
        inc = np.where(plan.inc_rows < 0, nr - 1 - plan.inc_rows, plan.inc_rows)
        words = np.empty(nw, np.uint64) if out is None else out
        count = int(k["cpu_match"](self._need_bits("match_cpu"), scratch, n, plan.inc_ptr, inc, plan.exc_ptr, plan.exc_rows,
                                   words[:nw], 256))
        k["cpu_scatter"](self.pool, seg_s, seg_l, seg_d, scratch, 0)
        xs, xl = self.segments(plan.exclude_lists)
        count -= int(k["cpu_clear"](self.pool, xs, xl, words[:nw]))
        if exclude_slots is not None:
            ex = table_slots(exclude_slots, self.n_ads)
            count -= int(k["cpu_clear"](ex, np.zeros(1, np.int64), np.array([ex.size], np.int64), words[:nw]))
        return words[:nw], count

    def _patch_segments(self, plan: MatchPlan):
        starts, lens, dst = [], [], []
        for j, lids in enumerate(plan.patch_lists):
            s, ln = self.segments(lids)
            starts.append(s)
            lens.append(ln)
            dst.append(np.full(s.size, j, np.int64))
        if not starts:
            z = np.zeros(0, np.int64)
            return z, z, z
        return np.concatenate(starts), np.concatenate(lens), np.concatenate(dst)


def _threads() -> int:
    import numba

    return int(numba.get_num_threads())


def _layouts_equal(a: IndexLayout, b: IndexLayout) -> bool:
    return (a.carrier == b.carrier and a.groups == b.groups
            and all(np.array_equal(x, y) for x, y in zip(a.dense_inc, b.dense_inc))
            and all(np.array_equal(x, y) for x, y in zip(a.dense_exc, b.dense_exc)))


def table_slots(slots, n_ads: int) -> np.ndarray:
    """Validate a 1-D integer array of slots in ``0..n_ads-1`` (raises TypeError / ValueError)."""
    arr = np.asarray(slots)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise TypeError("slots must be a 1-D integer array")
    if arr.size and (arr.min() < 0 or arr.max() >= n_ads):
        raise ValueError(f"slots must be in 0..{n_ads - 1}")
    return arr.astype(np.int64)
