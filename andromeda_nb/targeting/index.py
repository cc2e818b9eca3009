"""The host-side bitset index over a pool of ad slots (:class:`TargetingIndex`): built from
:class:`~andromeda_nb.targeting.rules.TargetingRules` with a
:class:`~andromeda_nb.targeting.layout.IndexLayout`, planned per request, updated in place by update batches
(:class:`~andromeda_nb.targeting.updates.UpdateBatch`), and matched on the CPU (the baseline).

Memory at ``n`` ads: a row is ``n / 8`` bytes (12.5 MB at 10^8), a list entry 4 bytes (8 beyond
2^31 slots). :meth:`TargetingIndex.memory_by_category` counts it per folded group / split category
(rows, list entries, bytes; ``at_n_ads`` scales to another pool size), beside the two layouts it
replaces: every member of a folded group folded alone (``per_category_folded_bytes``) and a bitset
per value and kind of a split category (``all_dense_bytes``). The benchmark world's figures at
10^8 ads are in data/results/targeting_memory.csv (``python -m andromeda_nb.bench targeting``).

The host-side map ad id -> (slot, rule) is the source of truth: :meth:`TargetingIndex.rebuild`
builds an index from it from scratch, and :meth:`TargetingIndex.assert_same` checks that two
indexes hold the same bits.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from .bits import WORD_BITS, bits_from_mask, table_slots
from .layout import FOLD_MAX, GROUP_MAX, IndexLayout, MatchPlan, choose_layout, list_dtype_for
from .rules import TargetingRules
from .schema import make_profile
from .index_updates import IndexUpdates, dense_id_table
from .updates import MAX_ROWS, SLOT_BITS


class TargetingIndex(IndexUpdates):
    """Host-side bitset index over a pool of ad slots, updatable in place (rows and lists as
    :mod:`~andromeda_nb.targeting.layout` describes; updates as :mod:`~andromeda_nb.targeting.updates`).

    Args:
        rules: the initial rules; slot ``i`` holds ``rules.ad_ids[i]`` (``-1``: a free slot).
        capacity: total slots (default ``rules.n_ads``); slots past the rules start free, for
            ads created later.
        layout: an :class:`IndexLayout` to reuse (a rebuild keeps its original's); default
            :func:`choose_layout` with ``fold_max``, ``dense_min``, ``exclude_dense_min`` and
            ``group_max``.
        list_dtype: the inverted lists' entry type: ``"auto"`` (int32 for pools of up to
            ``INT32_LIST_MAX_SLOTS`` slots, int64 beyond: :func:`~andromeda_nb.targeting.layout.list_dtype_for`),
            or ``np.int32`` / ``np.int64`` (int32 only when every slot fits).

    Attributes:
        n_ads: slots in the pool (the bitset length); ``n_words = ceil(n_ads / 64)``.
        bitsets: ``[n_rows, n_words]`` uint64 rows (row 0 = live).
        ad_ids: ``[n_ads]`` int64, slot -> ad id (``-1`` for a free slot).
        pool: the inverted lists' entries (``list_dtype``; ``-1 - slot`` marks a removed entry).
        version: incremented by every applied update batch.
    """

    def __init__(self, rules: TargetingRules, capacity: int | None = None, *, layout: IndexLayout | None = None,
                 fold_max: int = FOLD_MAX, dense_min: int | None = None, exclude_dense_min: int | None = None,
                 group_max: int = GROUP_MAX, list_dtype="auto"):
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
        if isinstance(list_dtype, str) and list_dtype == "auto":
            self.list_dtype = list_dtype_for(cap)
        else:
            try:
                self.list_dtype = np.dtype(list_dtype)
            except TypeError:
                self.list_dtype = None
            if self.list_dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
                raise ValueError(f"list_dtype must be 'auto', np.int32 or np.int64, got {list_dtype!r}")
            if self.list_dtype == np.int32 and cap > np.iinfo(np.int32).max:
                raise ValueError(f"list_dtype int32 cannot hold the slots of a {cap}-slot pool")
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
        # where the device flips the bits: each batch's row popcount changes, (index version, a
        # callable giving them once their copy back landed), folded into row_count in order
        self._count_changes: list = []
        self._counts_version = 0  # the index version row_count describes
        # the overlay: the rules an update rewrote since the build. Slot s (where _overlaid[s])
        # holds _ov_codes[_ov_start[s]:_ov_start[s] + _ov_len[s]], an append-only arena compacted
        # when more than half of it is dead; start and length arrays come with the first update
        self._overlaid = np.zeros(cap, bool)
        self._ov_start = self._ov_len = None
        self._ov_codes = np.zeros(0, np.int64)
        self._ov_used = self._ov_held = 0  # arena codes written, codes the overlaid slots hold
        # ad id -> slot: a direct table while the ids are dense (:func:`dense_id_table`); else the
        # build's ids sorted (searched) and a dict of the ids an update moved since
        self._id_slot: dict[int, int] = {}
        base_real = rules.ad_ids >= 0
        ids = rules.ad_ids
        if ids.size < 2 or np.all(ids[1:] > ids[:-1]):
            self._sorted_ids, self._sorted_slots = ids, None
        else:
            order = np.argsort(ids, kind="stable")
            self._sorted_ids, self._sorted_slots = ids[order], order
        self._slot_by_id = dense_id_table(ids, cap)
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
        from .build_kernels import (build_folded, build_split, combine_group, count_constrained, fill_lists,
                                    popcounts)

        schema, L = self.schema, self.layout
        n, cap = self._n_base, self.n_ads
        self.bitsets = np.empty((self.n_rows, self.n_words), np.uint64)
        live_pad = np.zeros(cap, bool)
        live_pad[:n] = self.live[:n]
        self.bitsets[0] = bits_from_mask(live_pad)
        chunk = 256
        empty_p, empty_v = np.zeros(1, np.int64), np.zeros(0, np.int32)

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
                build_folded(pi, vi, px, vx, n, cap, int(self.cat_m[c]), tmp[o:], chunk)
            combine_group(tmp, off, radix, self.bitsets[0], g == L.carrier, self.bitsets,
                               int(self.group_base[g]), int(self.group_size[g]), chunk)
        counts = np.zeros(self.n_lists, np.int64)
        cols = []
        for ci, cat in enumerate(schema):
            if self.cat_group[ci] >= 0:
                continue
            pi, vi = column(rules.include, cat.name)
            px, vx = column(rules.exclude, cat.name)
            build_split(pi, vi, px, vx, n, cap, self._dense_index(L.dense_inc[ci], cat.cardinality),
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
            fill_lists(p, v, n, list_of, self.l_start.copy(), self.pool)
        self.row_count = np.zeros(self.n_rows, np.int64)
        popcounts(self.bitsets, self.row_count.view(np.uint64))
        self.constrained = np.zeros(len(schema), np.int64)
        for ci, cat in enumerate(schema):
            pi, _ = column(rules.include, cat.name)
            px, _ = column(rules.exclude, cat.name)
            self.constrained[ci] = int(count_constrained(pi, px, n, 1 << 16))
        # base columns for rule lookups (the source of truth, with the overlay)
        colhi, ptrs, valss = [], [], []
        for ci, cat in enumerate(schema):
            for kind, csr in enumerate((rules.include, rules.exclude)):
                if cat.name in csr and csr[cat.name][0].size == n + 1:
                    ptrs.append(np.ascontiguousarray(csr[cat.name][0], np.int64))
                    valss.append(np.ascontiguousarray(csr[cat.name][1], np.int32))
                    colhi.append((ci << 33) | (kind << 32))
        if not all(a.flags.writeable for a in ptrs + valss):
            # one array type for every column (Numba indexes a tuple at run time only when its
            # members share a type): read-only views of all where any is read-only (memory-mapped
            # rules with a column that loading made canonical)
            ptrs, valss = [_read_only(a) for a in ptrs], [_read_only(a) for a in valss]
        self._cols = (tuple(ptrs), tuple(valss), np.array(colhi, np.int64))
        self._base_by_slot = None  # the same rules slot by slot, from the first update on (_hold_base_by_slot)

    @staticmethod
    def _dense_index(dense: np.ndarray, m: int) -> np.ndarray:
        out = np.full(m, -1, np.int64)
        out[dense] = np.arange(dense.size)
        return out

    # ------------------------------------------------------------------ inspection

    @property
    def nbytes(self) -> int:
        """Bytes of the index: its bitset rows (wherever they live: host, device or both) and the
        used part of the list pool."""
        return self.n_rows * self.n_words * 8 + int(self._pool_used[0]) * self.pool.itemsize

    @property
    def row_count(self) -> np.ndarray:
        """Each row's popcount (int64 ``[n_rows]``). Where the device flips the bits (the host
        keeps none: :meth:`drop_host_bits`), as of the last batch a device copy applied, waiting
        for its copy back; :meth:`planning_counts` does not wait."""
        self._fold_counts(wait=True)
        return self._row_count

    @row_count.setter
    def row_count(self, counts: np.ndarray) -> None:
        self._row_count, self._counts_version = counts, self.version

    def planning_counts(self) -> np.ndarray:
        """:attr:`row_count` without waiting for the device: the changes whose copy back has
        landed (a plan uses the counts to order its categories, never to decide what matches)."""
        self._fold_counts(wait=False)
        return self._row_count

    def _fold_counts(self, wait: bool, through: int | None = None) -> None:
        """Add the device's popcount changes to :attr:`row_count`, oldest first: those landed, or
        with ``wait`` all (``through``: those of versions up to it). A batch two device copies
        applied counts once."""
        while self._count_changes and (through is None or self._count_changes[0][0] <= through):
            version, landed = self._count_changes[0]
            change = landed(wait or through is not None)
            if change is None:
                return
            self._count_changes.pop(0)
            if version > self._counts_version:
                self._row_count += change
                self._counts_version = version

    def adopt_counts(self, rebuilt: "TargetingIndex") -> None:
        """Take a rebuild's row popcounts (a device copy made from an index without host rows: a
        batch no device applied left the counts behind)."""
        self._count_changes.clear()
        self._row_count, self._counts_version = rebuilt.row_count.copy(), self.version

    def row_meanings(self) -> np.ndarray:
        """What each bitset row holds, int64 ``[3, n_rows]`` of ``(kind, arg, val)``: ``ROW_LIVE``
        (the live flag), ``ROW_UNC`` (category ``arg`` has no include value), ``ROW_INC`` (category
        ``arg`` unconstrained or including ``val``), ``ROW_EXC`` (excluding ``val``), ``ROW_GROUP``
        (folded group ``arg``'s value combination ``val``, mixed radix over its members, the first
        fastest; ANDed with the live flag in the carrier group); kinds in
        :mod:`andromeda_nb.match.kernels`, which evaluates them on the device."""
        live, unc, inc, exc, group = range(5)  # = match.kernels.ROW_* (that module imports numba.cuda)
        out = np.zeros((3, self.n_rows), np.int64)
        out[0, 0] = live
        for g in range(self.group_size.size):
            b, n = int(self.group_base[g]), int(self.group_size[g])
            out[0, b:b + n], out[1, b:b + n], out[2, b:b + n] = group, g, np.arange(n)
        for c in range(len(self.schema)):
            if self.cat_group[c] >= 0:
                continue
            out[0, self.unc_row[c]], out[1, self.unc_row[c]] = unc, c
            for kind, row_of in ((inc, self._inc_row_of[c]), (exc, self._exc_row_of[c])):
                vals = np.flatnonzero(row_of >= 0)
                out[0, row_of[vals]], out[1, row_of[vals]], out[2, row_of[vals]] = kind, c, vals
        return out

    @property
    def host_bits(self) -> bool:
        """Whether this index still keeps its bitset rows on the host (see :meth:`drop_host_bits`)."""
        return self.bitsets is not None

    def drop_host_bits(self) -> None:
        """Stop keeping the bitset rows on the host (for an index whose rows live on the device).

        Frees ``n_rows * n_words * 8`` bytes of host memory (most of the index: see
        data/results/targeting_memory.csv) and every update's bit flips: :meth:`apply` then
        still validates, allocates slots, updates rules and lists, and returns each touched
        slot's final rule for the device, which works out the bits and the row popcounts
        (:attr:`row_count` follows the device). Afterwards the host-bit methods
        (:meth:`match_cpu`, :meth:`assert_same` without the device's rows, a new device copy)
        raise RuntimeError.
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
        entry_bytes = list_dtype_for(n).itemsize
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
        """The slot holding ``ad_id`` now, or None (an id outside int64's range included).

        Raises:
            TypeError: ``ad_id`` not an integer."""
        if isinstance(ad_id, (bool, np.bool_)) or not isinstance(ad_id, (int, np.integer)):
            raise TypeError(f"ad_id must be an integer, got {type(ad_id).__name__}")
        ad_id = int(ad_id)
        if not 0 <= ad_id < 1 << 63:
            return None
        s = int(self._current_slots(np.array([ad_id], np.int64))[0])
        return s if s >= 0 else None

    def _base_slots(self, ad_ids: np.ndarray) -> np.ndarray:
        """Slots of ad ids that still sit where the build put them (-1 otherwise)."""
        ids = self._sorted_ids
        if ids.size == 0:
            return np.full(ad_ids.size, -1, np.int64)
        order = np.argsort(ad_ids)  # sorted needles: the search walks the (large) id array once
        i = np.empty(ad_ids.size, np.int64)
        i[order] = np.minimum(np.searchsorted(ids, ad_ids[order]), ids.size - 1)
        s = i if self._sorted_slots is None else self._sorted_slots[i]
        ok = (ids[i] == ad_ids) & (self.ad_ids[s] == ad_ids)
        return np.where(ok, s, -1).astype(np.int64)

    def _rule_codes(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr, codes, live) of the current rules of some slots: the build's columns, and for the
        slots an update rewrote since (the overlay) their new codes."""
        slots = np.asarray(slots, np.int64)
        live = self.live[slots].copy()
        if self._base_by_slot is not None:  # every update made it: the base and the overlay in one pass
            from .update_kernels import gather_slot_codes

            none = np.zeros(1, np.int64)
            ov = (none, none, none) if self._ov_start is None else (self._ov_start, self._ov_len, self._ov_codes)
            ptr, codes = gather_slot_codes(*self._base_by_slot, self._n_base, self._overlaid, *ov, slots)
            return ptr, codes, live
        # never updated (no overlay): the build's columns
        ptrs, vals, colhi = self._cols
        if not ptrs:
            return np.zeros(slots.size + 1, np.int64), np.zeros(0, np.int64), live
        from .update_kernels import GATHER_PARALLEL_MIN, gather_codes, gather_codes_parallel

        run = gather_codes_parallel if slots.size >= GATHER_PARALLEL_MIN else gather_codes
        ptr, codes = run(ptrs, vals, colhi, slots, self._n_base)
        return ptr, codes, live

    def rules_of_slots(self, slots) -> TargetingRules:
        """The current rules of some slots as TargetingRules (free slots: ad id -1), e.g. a sample
        for the oracle after updates.

        Raises:
            TypeError / ValueError: ``slots`` not a 1-D integer array of slots in ``0..n_ads-1``."""
        slots = table_slots(slots, self.n_ads)
        ptr, codes, live = self._rule_codes(slots)
        from .update_kernels import codes_by_column

        # columns (cat, kind) in use, numbered in order: their CSRs in one parallel pass
        used = np.bincount(codes >> 32, minlength=2 * len(self.schema)) > 0
        col_of = np.where(used, np.cumsum(used) - 1, -1).astype(np.int64)
        col_ptr, vals, col_off = codes_by_column(ptr, codes, col_of)
        inc, exc = {}, {}
        for ci, cat in enumerate(self.schema):
            for kind, out in ((0, inc), (1, exc)):
                j = col_of[2 * ci + kind]
                if j >= 0:
                    out[cat.name] = (col_ptr[j], vals[col_off[j]:col_off[j + 1]])
        return TargetingRules(self.schema, self.ad_ids[slots].copy(), live, inc, exc)

    def current_rules(self) -> TargetingRules:
        """Every slot's current rule (free slots: ad id -1, not live, unconstrained)."""
        return self.rules_of_slots(np.arange(self.n_ads))

    def rebuild(self) -> "TargetingIndex":
        """An index built from scratch from the current ad id -> (slot, rule) map, with this
        index's layout, capacity and list entry type (the reference for "updates equal a rebuild")."""
        return TargetingIndex(self.current_rules(), self.n_ads, layout=self.layout, list_dtype=self.list_dtype)

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
        if self.layout is not other.layout and not self.layout.same_as(other.layout):
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

    # ------------------------------------------------------------------ CPU baseline

    def match_cpu(self, profile: Mapping, exclude_slots=None, n_words: int | None = None,
                  out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """The same match on the host's cores (Numba-parallel over words; the CPU baseline).

        Returns ``(words uint64[n_words], count)``. ``n_words`` limits the match to a prefix of the
        pool (pool-size sweeps); ``out``: a uint64 array of at least ``n_words`` words to write.

        Raises:
            RuleError: a malformed profile. ValueError / TypeError: ``n_words``, ``out`` or
            exclude slots out of range. RuntimeError: the host bits were dropped.
        """
        from .cpu_kernels import cpu_clear, cpu_match, cpu_scatter

        rows = self._need_bits("match_cpu")
        prof = make_profile(self.schema, profile)
        nw = self.n_words if n_words is None else int(n_words)
        if not (0 < nw <= self.n_words or nw == self.n_words == 0):
            raise ValueError(f"n_words must be in 1..{self.n_words}")
        if out is not None and (not isinstance(out, np.ndarray) or out.dtype != np.uint64 or out.ndim != 1
                                or out.size < nw):
            raise ValueError(f"out must be a uint64 numpy array of at least {nw} words")
        ex = None if exclude_slots is None else table_slots(exclude_slots, self.n_ads)
        plan = self.plan(prof)
        n = min(self.n_ads, nw * WORD_BITS)
        if getattr(self, "_cpu_scratch", None) is None or self._cpu_scratch.shape[0] < max(plan.n_patches, 1):
            self._cpu_scratch = np.zeros((max(plan.n_patches, 1), self.n_words), np.uint64)
        scratch = self._cpu_scratch
        nr = self.n_rows
        seg_s, seg_l, seg_d = self._patch_segments(plan)
        cpu_scatter(self.pool, seg_s, seg_l, seg_d, scratch, 1)
        inc = np.where(plan.inc_rows < 0, nr - 1 - plan.inc_rows, plan.inc_rows)
        words = np.empty(nw, np.uint64) if out is None else out
        count = int(cpu_match(rows, scratch, n, plan.inc_ptr, inc, plan.exc_ptr, plan.exc_rows, words[:nw], 256))
        cpu_scatter(self.pool, seg_s, seg_l, seg_d, scratch, 0)
        xs, xl = self.segments(plan.exclude_lists)
        count -= int(cpu_clear(self.pool, xs, xl, words[:nw]))
        if ex is not None:
            count -= int(cpu_clear(ex, np.zeros(1, np.int64), np.array([ex.size], np.int64), words[:nw]))
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


def _read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (``a`` itself stays as it was)."""
    v = a.view()
    v.flags.writeable = False
    return v
