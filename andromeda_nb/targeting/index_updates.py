"""Update batches on the host index: :class:`IndexUpdates` holds :class:`~.index.TargetingIndex`'s
validation, slot allocation, rule overlay and diff (its :meth:`~IndexUpdates.apply` returns the
delta for the device copy). A mixin: the index's state is built in :mod:`.index`."""

from __future__ import annotations

import itertools

import numpy as np

from .schema import RuleError
from .updates import CHANGE, CREATE, RETIRE, UpdateBatch, UpdateDelta

#: Default slots per parallel chunk of an update's diff: a batch touching fewer than two chunks'
#: worth of slots runs the diff in one call (the parallel call's set-up costs more than it saves).
DIFF_CHUNK_SLOTS = 64


#: a direct ad id -> slot table may span up to this many ids a slot of capacity (plus 2^16): past
#: it (sparse ids, e.g. hashes) the index searches its build's sorted ids and keeps a dict of the
#: ids updates moved, a Python lookup per op instead of one vectorised gather for the batch
DENSE_ID_SPAN = 4


def dense_id_table(ad_ids: np.ndarray, capacity: int) -> np.ndarray | None:
    """``table[ad_id]`` = the slot of ``ad_ids[slot]`` (-1: no such ad) for the ids ``>= 0``, or
    None where the largest id is past ``DENSE_ID_SPAN * capacity + 2^16``."""
    real = np.flatnonzero(ad_ids >= 0)
    top = int(ad_ids[real].max()) + 1 if real.size else 0
    if top > DENSE_ID_SPAN * max(int(capacity), 1) + (1 << 16):
        return None
    table = np.full(max(top, 1 << 10), -1, np.int32 if capacity < 1 << 31 else np.int64)
    table[ad_ids[real]] = real
    return table


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The positions ``starts[i] .. starts[i] + lens[i] - 1`` of every range, in order."""
    ends = np.cumsum(lens)
    return np.repeat(starts - (ends - lens), lens) + np.arange(int(ends[-1]) if ends.size else 0)


def order_by_slot(slots: np.ndarray) -> np.ndarray:
    """The ops' order by slot, then op order (``np.lexsort((arange, slots))``): one unstable sort of
    distinct keys ``slot * k + i``, several times faster than a stable one (where the keys fit int64)."""
    k = slots.size
    if k and not (0 <= int(slots.min()) and int(slots.max()) < (1 << 62) // k):
        return np.lexsort((np.arange(k), slots))
    return np.argsort(slots.astype(np.int64) * k + np.arange(k, dtype=np.int64))


class IndexUpdates:
    """:class:`~.index.TargetingIndex`'s update half (validation, allocation, the overlay of
    rewritten rules, the diff into list operations and, with host rows, bit flips)."""

    def check(self, batch: UpdateBatch) -> None:
        """Raise what :meth:`apply` would raise for ``batch`` (a create of an existing ad, a change
        or retire of an unknown one, a retire twice, another schema), except running out of free
        slots; change nothing. A pool checks a batch this way before growing for it."""
        if not isinstance(batch, UpdateBatch):
            raise TypeError(f"batch must be an UpdateBatch, got {type(batch).__name__}")
        if batch.schema != self.schema:
            raise RuleError("update batch was built for another schema")
        batch.check_columns()
        self._allocate(batch, range(-1, -len(batch) - 1, -1))  # as many (virtual) free slots as ops

    def _allocate(self, batch: UpdateBatch, free) -> tuple:
        """Validate the batch's ops in order and take their slots from the end of ``free``, on a
        scratch view of the id map (nothing here changes): ``(pending {ad: slot, None when
        retired}, final {slot: the op that sets its final state, -1 when freed}, each op's slot,
        slots taken from free, slots freed)``. A slot the batch frees is reused by its next create
        before a free one is taken.

        Raises:
            RuleError: naming the ad (no free slot left among the reasons)."""
        pending: dict[int, int | None] = {}
        n_popped = 0
        pushed: list[int] = []
        final: dict[int, int] = {}  # slot -> index of the op that sets its final state (-1: freed)
        op_slots = np.empty(len(batch), np.int64)
        ops, ids = batch.ops.tolist(), batch.ad_ids.tolist()
        now = self._current_slots(batch.ad_ids).tolist()  # before the batch (vectorised)
        for i, (op, ad) in enumerate(zip(ops, ids)):
            if ad in pending:
                cur = pending[ad]
            else:
                cur = now[i] if now[i] >= 0 else None
            if op == CREATE:
                if cur is not None:  # (check()'s slots are virtual, negative: not named)
                    raise RuleError(f"ad {ad}: create of an ad that already exists"
                                    + (" (created earlier in this batch)" if ad in pending else f" (slot {cur})"))
                if pushed:
                    s = pushed.pop()
                else:
                    if n_popped >= len(free):
                        raise RuleError(f"ad {ad}: no free slot left (capacity {self.n_ads})")
                    n_popped += 1
                    s = free[-n_popped]
                pending[ad] = s
                final[s] = i
            elif cur is None:  # never held, or retired earlier in this batch
                retired = ad in pending
                raise RuleError(f"ad {ad}: {'change' if op == CHANGE else 'retire'} of "
                                + ("an ad retired earlier in this batch" if retired else "an unknown ad"))
            elif op == CHANGE:
                s = cur
                final[s] = i
            else:
                s = cur
                pending[ad] = None
                final[s] = -1
                pushed.append(s)
            op_slots[i] = s
        return pending, final, op_slots, n_popped, pushed

    def _hold_base_by_slot(self) -> None:
        """The build's rules slot by slot, ``(ptr, codes)``, made at the first update: every batch
        reads its touched slots' old rules, a contiguous run a slot here against ~2 x 40 random
        reads a slot in the per-category columns. Costs 8 bytes a rule code and a slot (~110
        bytes an ad in the benchmark world, ~13 codes an ad); a read-only index never makes it."""
        if self._base_by_slot is None and not self._cols[0]:  # no rule constrains anything
            self._base_by_slot = (np.zeros(self._n_base + 1, np.int64), np.zeros(0, np.int64))
        if self._base_by_slot is None:
            from .update_kernels import GATHER_PARALLEL_MIN, gather_codes, gather_codes_parallel

            run = gather_codes_parallel if self._n_base >= GATHER_PARALLEL_MIN else gather_codes
            self._base_by_slot = run(*self._cols, np.arange(self._n_base, dtype=np.int64), self._n_base)

    def _current_slots(self, ad_ids: np.ndarray) -> np.ndarray:
        """The slot holding each (non-negative) ad id now, -1 for none (int64)."""
        t = self._slot_by_id
        if t is not None:
            inside = ad_ids < t.size
            return np.where(inside, t[np.where(inside, ad_ids, 0)], -1).astype(np.int64)
        k = ad_ids.size
        moved = np.fromiter(map(self._id_slot.get, ad_ids.tolist(), itertools.repeat(-1, k)), np.int64, k)
        return np.where(moved >= 0, moved, self._base_slots(ad_ids))

    def _overlay_write(self, slots: np.ndarray, ptr: np.ndarray, codes: np.ndarray) -> None:
        """The overlay's rules of ``slots`` become ``codes[ptr[i]:ptr[i + 1]]``: appended to the
        arena (compacted first when more than half of it would be dead, grown by doubling)."""
        if self._ov_start is None:
            self._ov_start = np.zeros(self.n_ads, np.int64)
            self._ov_len = np.zeros(self.n_ads, np.int64)
        n = int(codes.size)
        self._ov_held += n - int(self._ov_len[slots][self._overlaid[slots]].sum())
        if self._ov_used + n > self._ov_codes.size:
            if 2 * (self._ov_held - n) < self._ov_used:  # more than half dead: keep the held codes only
                held = np.flatnonzero(self._overlaid)
                held = held[~np.isin(held, slots, assume_unique=True)]  # (slots get new codes below)
                lens = self._ov_len[held]
                starts = np.zeros(held.size, np.int64)
                np.cumsum(lens[:-1], out=starts[1:])
                kept = self._ov_codes[_ranges(self._ov_start[held], lens)]
                self._ov_start[held] = starts
                self._ov_used = kept.size
            else:
                kept = self._ov_codes[:self._ov_used]
            arena = np.empty(max(2 * (self._ov_used + n), 1 << 16), np.int64)
            arena[:self._ov_used] = kept
            self._ov_codes = arena
        self._ov_codes[self._ov_used:self._ov_used + n] = codes
        self._ov_start[slots] = self._ov_used + ptr[:-1]
        self._ov_len[slots] = np.diff(ptr)
        self._overlaid[slots] = True
        self._ov_used += n

    def _slots_of_ops(self, batch: UpdateBatch, free) -> tuple:
        """:meth:`_allocate` as :meth:`apply` needs it: ``(each op's slot, slots taken from free,
        freed slots no create took, the touched slots sorted, the op that sets each one's final
        state (-1: freed), (ad ids, their final slots or -1) for :meth:`_commit_ids`)``. A batch
        whose ad ids are distinct (the usual one) is allocated by one compiled pass; any other,
        or one that fails, by :meth:`_allocate` (which names the failing ad)."""
        from .update_kernels import allocate_distinct

        k = len(batch)
        ids, ops = batch.ad_ids, batch.ops
        srt = np.sort(ids)
        if k and (srt[1:] != srt[:-1]).all():
            cur = self._current_slots(ids)
            n_creates = int((ops == CREATE).sum())
            tail = np.array(free[len(free) - min(n_creates, len(free)):], np.int64)
            op_slots, pushed = np.empty(k, np.int64), np.empty(k, np.int64)
            bad, n_popped, n_pushed = allocate_distinct(ops, cur, tail, op_slots, pushed)
            if bad < 0:
                order = order_by_slot(op_slots)
                s = op_slots[order]
                last = np.append(s[1:] != s[:-1], True)
                slots, final_op = s[last], order[last]
                creates = ops == CREATE
                placed = (ids[creates], op_slots[creates])
                return (op_slots, int(n_popped), pushed[:n_pushed].tolist(), slots,
                        np.where(ops[final_op] == RETIRE, -1, final_op), placed)
        pending, final, op_slots, n_popped, pushed = self._allocate(batch, free)
        slots = np.fromiter(final.keys(), np.int64, len(final))
        order = np.argsort(slots)
        placed = (np.fromiter(pending.keys(), np.int64, len(pending)),
                  np.fromiter((-1 if v is None else v for v in pending.values()), np.int64, len(pending)))
        final_ops = np.fromiter(final.values(), np.int64, len(final))[order]
        return op_slots, n_popped, pushed, slots[order], final_ops, placed

    def _commit_ids(self, retired: np.ndarray, placed: tuple) -> None:
        """The id map after a batch: ``retired`` ids leave it, then ``placed = (ids, slots)`` (-1:
        retired in the end) set each id's final slot. An id past the direct table grows it by
        doubling while the ids stay dense (:data:`DENSE_ID_SPAN`), else the map turns sparse."""
        ids, slots = placed
        t = self._slot_by_id
        if t is not None and ids.size and int(ids.max()) >= t.size:
            top, span = int(ids.max()) + 1, DENSE_ID_SPAN * self.n_ads + (1 << 16)
            size = min(max(2 * t.size, top), span)
            if top > span:  # sparse now: the dict of moved ids
                held = np.flatnonzero(self.ad_ids >= 0)
                moved = held[self._base_slots(self.ad_ids[held]) != held]
                self._id_slot = dict(zip(self.ad_ids[moved].tolist(), moved.tolist()))
                self._slot_by_id = t = None
            else:
                grown = np.full(size, -1, t.dtype)
                grown[:t.size] = t
                self._slot_by_id = t = grown
        if t is not None:
            t[retired] = -1
            t[ids] = slots
            return
        for ad in retired.tolist():
            self._id_slot.pop(ad, None)
        for ad, s in zip(ids.tolist(), slots.tolist()):
            if s >= 0:
                self._id_slot[ad] = s

    def apply(self, batch: UpdateBatch, diff_chunk_slots: int = DIFF_CHUNK_SLOTS,
              keep_host_bits: bool = True) -> UpdateDelta:
        """Apply an update batch to the host index (:mod:`~andromeda_nb.targeting.updates`) and
        return the delta for the device. Validates the whole batch first: on any error nothing
        changes.

        Args:
            batch: the updates, applied in order.
            diff_chunk_slots: touched slots per parallel chunk of the diff (old rules -> bit flips
                and list operations); with fewer than two chunks the diff runs in one call. Both
                paths give the same delta, in the same order.
            keep_host_bits: False drops the host's bitset rows (:meth:`drop_host_bits`) once the
                batch is validated: the device works out this batch's bits and every later one's
                (a refused batch drops nothing).

        Raises:
            RuleError: a create of an existing ad id, a change or retire of an unknown one, a batch
                built for another schema, or no free slot left (the message names the ad).
        """
        if not isinstance(batch, UpdateBatch):
            raise TypeError(f"batch must be an UpdateBatch, got {type(batch).__name__}")
        if batch.schema != self.schema:
            raise RuleError("update batch was built for another schema")
        if (isinstance(diff_chunk_slots, (bool, np.bool_)) or not isinstance(diff_chunk_slots, (int, np.integer))
                or diff_chunk_slots < 1):
            raise ValueError(f"diff_chunk_slots must be a positive int, got {diff_chunk_slots!r}")
        batch.check_columns()
        # ---- validate and allocate, on a scratch view of the id map
        free = self._free
        op_slots, n_popped, pushed, slots, which, placed = self._slots_of_ops(batch, free)
        if not keep_host_bits:
            self.drop_host_bits()
        # ---- net change per touched slot
        from .numba_common import threads
        from .update_kernels import apply_bits, diff, diff_par, list_ops, partition_codes

        self._hold_base_by_slot()
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
        # with host rows, the bits too; without, the device works them out from the final rules
        # (and the diff writes no bit codes: no room for them)
        with_bits = self.bitsets is not None
        bound = slots.size * (self.n_rows + 1) + 4 if with_bits else 4
        out_set = np.empty(bound, np.int64)
        out_clr = np.empty(bound, np.int64)
        out_lists = np.empty((old_codes.size + new_codes.size + 1, 3), np.int64)
        cons_delta = np.zeros(C, np.int64)
        nv = int(self._voff[-1]) + 1
        tables = (self.cat_m, self.cat_group, self.unc_row, self._dinc_ptr, self._dinc_vals, self._dinc_rows,
                  self._vrow_ptr, self._vrow, self._list_ptr, self.group_ptr, self.group_members, self.group_base,
                  self.group_size, self.layout.carrier, self._voff)
        n_chunks = min(4 * threads(), slots.size // int(diff_chunk_slots))
        if n_chunks >= 2:  # chunks of slots in parallel, outputs in the same order as one call
            n_set, n_clr, n_lo = diff_par(
                n_chunks, slots, old_ptr, old_codes, old_live, new_ptr, new_codes, new_live, *tables, nv, max_m,
                self.n_rows, out_set, out_clr, out_lists, cons_delta, with_bits)
        else:
            n_set, n_clr, n_lo = diff(
                slots, old_ptr, old_codes, old_live, new_ptr, new_codes, new_live, *tables,
                np.zeros(nv, np.bool_), np.zeros(nv, np.bool_), np.zeros(max_m + 1, np.int8), out_set, out_clr,
                out_lists, cons_delta, with_bits)
        lops = out_lists[:n_lo]
        # ---- lists: make room (moves need up to twice a list's size), then apply on the host
        if n_lo:
            adds = lops[lops[:, 2] > 0, 0]
            if adds.size:
                cnt = np.bincount(adds, minlength=self.l_live.size)
                lids = np.flatnonzero(cnt)
                need = int((4 * (self.l_live[lids] + cnt[lids]) + 16).sum())
                if self.pool.size - int(self._pool_used[0]) < need:
                    grown = np.full(max(2 * self.pool.size, int(self._pool_used[0]) + need), -1, self.pool.dtype)
                    grown[:self.pool.size] = self.pool
                    self.pool = grown
            dirty = np.empty((2 * n_lo + 1, 2), np.int64)
            nd = list_ops(lops, self.l_start, self.l_len, self.l_cap, self.l_live, self.l_sorted, self.pool,
                          self._pool_used, dirty, threads())
            if nd < 0:
                raise AssertionError(f"internal: list entry missing for op {lops[-1 - nd].tolist()}")
            dirty = dirty[:nd]
            # every position written, in order; one written twice (a list compacted after single
            # writes in the same batch: ~0.3 % of them at 10^4 ops) comes twice, and the device
            # writes its final value twice: cheaper than a unique over the positions
            pos = _ranges(dirty[:, 0], dirty[:, 1])
        else:
            pos = np.zeros(0, np.int64)
        set_codes, clr_codes = out_set[:n_set], out_clr[:n_clr]
        if with_bits:
            n_parts = 4 * threads()
            order = np.empty(set_codes.size + clr_codes.size, np.int64)
            starts = np.empty(n_parts + 1, np.int64)
            partition_codes(set_codes, clr_codes, n_parts, order, starts)
            apply_bits(self.bitsets, set_codes, clr_codes, self.row_count, order, starts)
            self._counts_version = self.version + 1
        # ---- commit the id map, rules and free list
        self.constrained += cons_delta
        self._commit_ids(batch.ad_ids[batch.ops == RETIRE], placed)
        if n_popped:
            del free[-n_popped:]
        free.extend(pushed)
        self.ad_ids[slots] = np.where(which >= 0, batch.ad_ids[np.maximum(which, 0)], -1)
        self.live[slots] = new_live  # (a freed slot: not live, no codes)
        self._overlay_write(slots, new_ptr, new_codes)
        self.version += 1
        return UpdateDelta(bit_codes=np.concatenate([set_codes, clr_codes]), n_set=int(n_set), list_pos=pos,
                           list_vals=self.pool[pos].astype(np.int64), pool_size=int(self.pool.size),
                           slots=op_slots, version=self.version,
                           rules=None if with_bits else (slots, new_ptr, new_codes, new_live))
