"""Real-time updates: batches of creates, changes and retires, and the delta one applied batch
leaves for the device copy.

:meth:`~andromeda_nb.targeting.index.TargetingIndex.apply` takes an :class:`UpdateBatch` (applied in
order), validates all of it first (an unknown or duplicate ad, a bad rule, a full index: nothing
changes), allocates slots (a LIFO free list, so a retired slot is reused first), and computes
the *net* change per touched slot: the bits that flip in each row and the list entries to add or
remove (tombstones; a list is compacted when half of it is tombstones and moved to a region twice
its size when full, so list maintenance is amortised O(1) per entry). It applies them to the host
copy and returns them as an :class:`UpdateDelta`, which
:class:`~andromeda_nb.match.DeviceTargetingIndex` applies on the GPU in one kernel, ordered with
requests on the stream. Bytes written are proportional to the bits and entries that change;
nothing is rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

from .rules import MAX_AD_ID, check_csr_column, read_jsonl, records_to_columns
from .schema import RuleError, TargetingSchema

#: Update operation codes.
CREATE, CHANGE, RETIRE = 0, 1, 2
OP_NAMES = {"create": CREATE, "change": CHANGE, "retire": RETIRE}
#: Slot and row limits of the update encoding (``row << SLOT_BITS | slot`` in one int64).
SLOT_BITS = 40
MAX_ROWS = 1 << (63 - SLOT_BITS)


class UpdateBatch:
    """An ordered batch of ad updates: ``create`` (a new ad id with its rule), ``change`` (replace
    a live ad's rule and live flag), ``retire`` (remove the ad; its slot is freed for reuse).

    Columns: ``ops int8[k]`` (:data:`CREATE`, :data:`CHANGE`, :data:`RETIRE`), ``ad_ids
    int64[k]``, ``live bool[k]`` and the rules as sorted int64 codes ``(cat << 33) | (kind << 32) |
    value`` in CSR ``codes_ptr[k + 1], codes`` (empty for retires). Build with
    :meth:`from_records` (records of :mod:`~andromeda_nb.targeting.rules`' format plus ``"op"``),
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

    def check_columns(self) -> None:
        """Raise RuleError unless the columns still hold a batch of this schema (the arrays are
        mutable: a caller may have written them after the batch was built): op codes, ad ids in
        0..2^63-1, a bool live flag a op, and each op's codes sorted, distinct, of this schema's
        categories and values, none for a retire."""
        k = len(self)
        ops, ids, live, ptr, codes = self.ops, self.ad_ids, self.live, self.codes_ptr, self.codes
        for name, x, kind, shape in (("ops", ops, "i", (k,)), ("ad_ids", ids, "i", (k,)), ("live", live, "b", (k,)),
                                     ("codes_ptr", ptr, "i", (k + 1,)), ("codes", codes, "i", None)):
            if (not isinstance(x, np.ndarray) or x.dtype.kind != kind or x.ndim != 1
                    or (shape is not None and x.shape != shape)):
                raise RuleError(f"update batch column {name} was changed: it must be a 1-D "
                                f"{'int' if kind == 'i' else 'bool'} array" + (f" of shape {shape}" if shape else ""))
        bad = (ops < CREATE) | (ops > RETIRE)
        if bad.any():
            raise RuleError(f"ad {int(ids[bad][0])}: unknown op {int(ops[bad][0])}")
        if k and ids.min() < 0:
            raise RuleError(f"ad {int(ids[ids < 0][0])}: ad_id must be non-negative")
        if ptr[0] != 0 or ptr[-1] != codes.size or (np.diff(ptr) < 0).any():
            raise RuleError("update batch column codes_ptr was changed: it no longer delimits codes")
        sizes = np.diff(ptr)
        bad = (ops == RETIRE) & ((sizes > 0) | live)
        if bad.any():
            raise RuleError(f"ad {int(ids[bad][0])}: a retire carries no rule and is not live")
        if codes.size:
            from .update_kernels import first_bad_code

            cards = np.array([c.cardinality for c in self.schema], np.int64)
            bad = first_bad_code(ptr.astype(np.int64, copy=False), codes.astype(np.int64, copy=False), cards)
            if bad >= 0:
                op = int(np.searchsorted(ptr, bad, side="right") - 1)
                raise RuleError(f"ad {int(ids[op])}: its rule codes were changed (not of this schema, or not "
                                "sorted and distinct)")

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
                if not schema.has(name):
                    raise RuleError(f"{kind}: unknown category {name!r}")
                ptr, vals = check_csr_column(kind, name, schema[name].cardinality, pair[0], pair[1], k, ids)
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
        ids, lives, cols = records_to_columns(schema, records, allowed=("op", "ad_id", "live", "include", "exclude"))
        return cls.from_columns(schema, np.array(ops, np.int8), ids, lives, cols["include"], cols["exclude"])

    @classmethod
    def from_jsonl(cls, schema: TargetingSchema, source) -> "UpdateBatch":
        """Update records from JSON lines (see :meth:`from_records`)."""
        return cls.from_records(schema, read_jsonl(source))

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
    ``list_pos`` / ``list_vals`` int64: pool positions and their new entries (a position written
    twice comes twice, with its final entry both times); ``pool_size``: the
    host pool's length (the device grows its pool to it first); ``slots``: the slot of each op.
    ``rules``: where the host keeps no bitset rows, no bit codes but each touched slot's final
    rule, ``(slots, ptr, codes, live)`` (slots sorted, ``codes[ptr[i]:ptr[i + 1]]`` the rule codes
    of ``slots[i]``): the device works out the bits (:func:`~andromeda_nb.match.kernels.flip_kernel`).
    """

    bit_codes: np.ndarray
    n_set: int
    list_pos: np.ndarray
    list_vals: np.ndarray
    pool_size: int
    slots: np.ndarray
    version: int
    rules: tuple | None = None

    @property
    def bits_changed(self) -> int:
        """Bits the host found changed (0 where the device works them out: ``rules``)."""
        return int(self.bit_codes.size)

    @property
    def bytes_written(self) -> int:
        """Device bytes the update writes: one 32-byte sector per bit flip and per list entry
        (an upper bound; flips in one sector share it)."""
        return 32 * (self.bit_codes.size + self.list_pos.size)

