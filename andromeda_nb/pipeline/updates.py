"""A batch of ad updates for a live :class:`~andromeda_nb.pipeline.Pool` (:meth:`Pool.apply`).

The format is columnar, one entry an op, built with numpy or pandas:

    ops          op codes (``CREATE``, ``CHANGE``, ``RETIRE``) or names, ``[k]``
    ad_ids       int ``[k]``, non-negative
    live         bool ``[k]`` (default all True): a created or changed ad may be paused
    include,     per category name, a CSR over the ops ``(ptr [k + 1], values)``: the op's
    exclude      include / exclude sets (a retire's must be empty); a category left out: no
                 constraint (as :meth:`~andromeda_nb.targeting.TargetingRules.from_columns`)
    embeddings   float ``[k, d]``: the ad's embedding for ops that set one (``sets_row``)
    bias         float ``[k]``
    sets_row     bool ``[k]`` (default: creates and changes): the op writes ``embeddings[i]`` and
                 ``bias[i]`` into the ad's slot; a create must, a retire must not

The ops apply in order (an ad may be created and changed, or retired and created again, in one
batch). A change replaces the ad's whole rule; its row only where ``sets_row``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..device import launch
from ..model import AdTable
from ..score.table import FREE, rows_max_abs
from ..targeting import CREATE, RETIRE, UpdateBatch, UpdateDelta
from ..targeting.index_updates import order_by_slot


@dataclass
class PoolUpdate:
    """An ordered batch of ad updates: the targeting ops (an
    :class:`~andromeda_nb.targeting.UpdateBatch`) and the rows they write. Build it with
    :meth:`from_columns` (or :meth:`from_records` for a few ops); both validate."""

    targeting: UpdateBatch
    embeddings: np.ndarray  # float32 [k, d]
    bias: np.ndarray  # float32 [k]
    sets_row: np.ndarray  # bool [k]

    def __len__(self) -> int:
        return len(self.targeting)

    @property
    def d(self) -> int:
        return int(self.embeddings.shape[1])

    @classmethod
    def from_columns(cls, schema, ops, ad_ids, embeddings, bias=None, live=None, include=None, exclude=None,
                     sets_row=None) -> "PoolUpdate":
        """Validate the columns (module docstring) and build the batch.

        Raises:
            RuleError: the targeting columns (unknown op, negative id, bad CSR, category or value).
            TypeError / ValueError: embeddings not ``[k, d]`` numeric, bias not ``[k]``, a row
                written with NaN or inf, ``sets_row`` not ``[k]`` bool, a create without a row or a
                retire with one.
        """
        targeting = UpdateBatch.from_columns(schema, ops, ad_ids, live=live, include=include, exclude=exclude)
        k = len(targeting)
        emb = np.asarray(embeddings)
        if emb.dtype.kind not in "fiu":
            raise TypeError(f"embeddings must be numeric, got dtype {emb.dtype}")
        if emb.ndim != 2 or emb.shape[0] != k or emb.shape[1] < 1:
            raise ValueError(f"embeddings must be [k={k}, d], got shape {emb.shape}")
        emb = np.ascontiguousarray(emb, dtype=np.float32)
        b = np.zeros(k, np.float32) if bias is None else np.asarray(bias)
        if b.dtype.kind not in "fiu" or b.shape != (k,):
            raise ValueError(f"bias must be [k={k}] numbers, got {b.dtype} {b.shape}")
        b = np.ascontiguousarray(b, dtype=np.float32)
        if sets_row is None:
            sets = targeting.ops != RETIRE
        else:
            sets = np.asarray(sets_row)
            if sets.dtype != np.bool_ or sets.shape != (k,):
                raise ValueError(f"sets_row must be bool [k={k}], got {sets.dtype} {sets.shape}")
        return cls._checked(targeting, emb.copy(), b.copy(), np.array(sets))

    @classmethod
    def from_records(cls, schema, records, d: int) -> "PoolUpdate":
        """A few ops as dicts: the targeting record (``op``, ``ad_id``, ``live``, ``include``,
        ``exclude``; :meth:`~andromeda_nb.targeting.UpdateBatch.from_records`) plus ``embedding``
        (``d`` floats) and ``bias`` where the op sets its row. Convenience only: large batches go
        through :meth:`from_columns`."""
        records = list(records)
        targeting = UpdateBatch.from_records(schema, [{k: v for k, v in r.items() if k not in ("embedding", "bias")}
                                                      for r in records])
        emb = np.zeros((len(records), d), np.float32)
        bias = np.zeros(len(records), np.float32)
        sets = np.zeros(len(records), bool)
        for i, r in enumerate(records):
            if "embedding" in r:
                row, b = np.asarray(r["embedding"]), np.asarray(r.get("bias", 0.0))
                if row.dtype.kind not in "fiu" or b.dtype.kind not in "fiu" or b.shape:
                    raise TypeError(f"ad {r.get('ad_id')}: embedding and bias must be real numbers")
                if row.shape != (d,):
                    raise ValueError(f"ad {r.get('ad_id')}: embedding must have {d} values, got shape {row.shape}")
                emb[i], bias[i], sets[i] = row, b, True
            elif "bias" in r:
                raise ValueError(f"ad {r.get('ad_id')}: a bias comes with its embedding (the row is written whole)")
        return cls._checked(targeting, emb, bias, sets)

    def checked(self, finite: bool = True) -> "PoolUpdate":
        """This batch validated again (:meth:`Pool.apply` calls it: the arrays are the caller's to
        change after the batch was built). ``finite=False`` leaves the rows' values to the
        caller (:func:`check_update` checks them as it stores them)."""
        return self._checked(self.targeting, self.embeddings, self.bias, self.sets_row, finite)

    @classmethod
    def _checked(cls, targeting, emb, bias, sets, finite: bool = True) -> "PoolUpdate":
        k = len(targeting)
        for name, x, shape, dtype in (("embeddings", emb, (k, None), np.float32), ("bias", bias, (k,), np.float32),
                                      ("sets_row", sets, (k,), np.bool_)):
            if (not isinstance(x, np.ndarray) or x.dtype != dtype or x.ndim != len(shape)
                    or any(w is not None and w != v for w, v in zip(shape, x.shape))):
                raise ValueError(f"{name} must be {np.dtype(dtype).name} of shape {shape} (k ops), got "
                                 f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}")
        bad = np.flatnonzero((targeting.ops == CREATE) & ~sets)
        if bad.size:
            raise ValueError(f"ad {int(targeting.ad_ids[bad[0]])}: a create must set its row (an embedding)")
        bad = np.flatnonzero((targeting.ops == RETIRE) & sets)
        if bad.size:
            raise ValueError(f"ad {int(targeting.ad_ids[bad[0]])}: a retire sets no row")
        if finite:
            ok = np.isfinite(emb).all(axis=1) & np.isfinite(bias)
            bad = np.flatnonzero(sets & ~ok)
            if bad.size:
                raise ValueError(f"ad {int(targeting.ad_ids[bad[0]])}: its embedding or bias holds NaN, inf or a "
                                 "value past float32")
        return cls(targeting, emb, bias, sets)


@dataclass(frozen=True)
class StoredRows:
    """The rows a batch writes, in op order of the ops that set one, as the table stores them:
    ``embeddings`` (the storage dtype's array or bits), ``bias`` float32, ``scale`` (int8) or
    None, ``max_abs`` their largest finite |a| as the kernel reads them, and ``fma_dequant``
    whether their scales allow fp16 math's fused dequantization (:func:`~andromeda_nb.score.weights.fma_dequant_exact`;
    true without scales)."""

    embeddings: np.ndarray
    bias: np.ndarray
    scale: np.ndarray | None
    max_abs: float
    fma_dequant: bool = True

    @property
    def n_ads(self) -> int:
        return self.embeddings.shape[0]


def stored_rows(update: PoolUpdate, dtype: str) -> StoredRows:
    """The rows of ``update`` (a batch whose arrays passed :meth:`PoolUpdate.checked`, its values
    left to this: ``finite=False``) stored in ``dtype`` (fp16 range, int8 quantized), or the error
    that names what they cannot hold. fp16, the pool's usual storage, in one compiled pass over the
    batch (:func:`~andromeda_nb.score.weight_kernels.f16_rows`); the other dtypes, and any batch
    that pass finds wrong, through :meth:`~andromeda_nb.model.AdTable.from_float` (its messages)."""
    from ..score.weights import FP16_MAX

    sets = update.sets_row
    if dtype == "fp16" and update.embeddings.size:
        from ..score.weight_kernels import f16_rows

        # (a checked batch's arrays are these already; the kernel reads their bits)
        emb = np.ascontiguousarray(update.embeddings, np.float32)
        sets = np.asarray(sets, np.bool_)
        n = int(np.count_nonzero(sets))
        out = np.empty((n, emb.shape[1]), np.float16)
        bias = np.empty(n, np.float32)
        bad, top = f16_rows(emb, emb.view(np.uint32), np.asarray(update.bias, np.float32), sets, FP16_MAX,
                            out.view(np.uint16), bias)
        if not bad:
            return StoredRows(out, bias, None, float(np.uint16(top).view(np.float16)))
    update.checked()  # non-finite values: the message names the first op
    try:
        rows = AdTable.from_float(update.embeddings[sets], update.bias[sets], dtype=dtype)
    except ValueError as e:  # name the ads whose rows the table's dtype cannot hold
        ids = update.targeting.ad_ids[sets]
        over = ids[(np.abs(update.embeddings[sets]) > FP16_MAX).any(axis=1)]
        named = over if over.size else ids
        raise ValueError(f"{e} (ads {named[:8].tolist()}{' ...' if named.size > 8 else ''})") from None
    from ..score.weights import fma_dequant_exact

    return StoredRows(rows.embeddings, rows.bias, rows.scale, rows_max_abs(rows),
                      rows.scale is None or fma_dequant_exact(rows.scale))


def final_rows(slots: np.ndarray, ops: np.ndarray, sets_row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What a batch leaves in each slot it touched.

    ``slots[i]``: the slot of op ``i`` (:attr:`~andromeda_nb.targeting.UpdateDelta.slots`). A slot's
    final state is its last op: a retire frees it; otherwise its occupant is that op's ad, and its
    row comes from the last row-setting op since the occupant's create (an ad lives in one slot,
    and a slot changes occupant only by a retire and a create), or stays as it was where there is
    none. Returns ``(touched slots sorted, last op per slot, row op per slot or -1: keep)``."""
    k = slots.size
    if k == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = order_by_slot(slots)
    s, o = slots[order], order
    start = np.ones(k, bool)
    start[1:] = s[1:] != s[:-1]
    end = np.flatnonzero(np.append(start[1:], True))  # each slot's last op (sorted positions)
    pos = np.arange(k)
    # the latest row-setting op at each position, and where the current occupant's ops begin (a
    # slot's first op or a create): a row counts only at or after that
    latest = np.maximum.accumulate(np.where(sets_row[o], pos, -1))
    begin = np.maximum.accumulate(np.where(start | (ops[o] == CREATE), pos, -1))
    src = latest[end]
    keep = (src < begin[end]) | (ops[o[end]] == RETIRE)
    return s[end], o[end], np.where(keep, -1, o[np.maximum(src, 0)])


def take_ops(update: PoolUpdate, mask: np.ndarray) -> PoolUpdate:
    """The ops of ``update`` where ``mask`` (bool ``[k]``), in order, with their rules and rows (a
    sharded pool's part for one shard)."""
    t = update.targeting
    mask = np.asarray(mask, bool)
    idx = np.flatnonzero(mask)
    sizes = np.diff(t.codes_ptr)[idx]
    ptr = np.zeros(idx.size + 1, np.int64)
    np.cumsum(sizes, out=ptr[1:])
    take = np.repeat(t.codes_ptr[idx] - ptr[:-1], sizes) + np.arange(int(ptr[-1]))  # each kept code's position
    sub = UpdateBatch(t.schema, t.ops[idx], t.ad_ids[idx], t.live[idx], ptr, t.codes[take])
    return PoolUpdate(sub, update.embeddings[idx], update.bias[idx], update.sets_row[idx])


def check_update(pool, update, index: bool = True) -> tuple[PoolUpdate, StoredRows]:
    """Everything :func:`apply_update` refuses, refused without changing anything: the batch's
    type, schema and row width, its arrays (checked again: a caller may have changed them), its
    rows in the table's storage (fp16 range, int8 quantized; with ``dequant="fma"`` scales it
    allows), and with ``index`` its targeting ops against the index (unknown or duplicate ads,
    retires twice, malformed rules). Returns the checked batch and its rows as the table stores
    them."""
    from ..targeting import RuleError

    if not isinstance(update, PoolUpdate):
        raise TypeError(f"update must be a PoolUpdate (PoolUpdate.from_columns), got {type(update).__name__}")
    if pool.index is None:
        raise ValueError("a pool without a targeting index takes no updates (the index allocates the slots)")
    if pool._failed:
        raise RuntimeError(f"{pool._failed}: build a new Pool")
    if pool.index.version != pool._index_version or pool.index.index.version != pool._index_version:
        raise RuntimeError("the targeting index was updated outside this pool: build a new Pool")
    if update.targeting.schema != pool.index.index.schema:
        raise RuleError("update batch was built for another schema")
    if update.d != pool.table.d:
        raise ValueError(f"the update's rows have d={update.d}, the pool's table d={pool.table.d}")
    # its arrays again (the caller may have changed them since); the rows' values as they are stored
    update = update.checked(finite=False)
    rows = stored_rows(update, pool.table.dtype)
    if pool.config.dequant == "fma" and not rows.fma_dequant:  # the pool could serve no request after it
        raise ValueError("this pool's config asks for dequant='fma', and the batch's rows quantize to a scale "
                         "past 56 (|a| > 7112): serve the pool with dequant='auto', or rescale the rows")
    if index:
        pool.index.index.check(update.targeting)
    return update, rows


def apply_update(pool, update) -> UpdateDelta:
    """:meth:`Pool.apply <andromeda_nb.pipeline.Pool.apply>` (its docstring is the contract): the
    batch checked whole, the host index updated, then its delta and the table's touched slots
    copied and written on the device in stream order."""
    from ..targeting import CHANGE
    from .kernels import FREED

    # the index's own apply checks the ops again, whole, before it changes anything
    update, rows = check_update(pool, update, index=False)
    ops = update.targeting.ops
    sets = update.sets_row
    # slots the batch takes from the free list: the peak of creates minus retires (a retired
    # slot is reused by the batch's next create before a free one is taken)
    step = np.where(ops == CREATE, 1, np.where(ops == RETIRE, -1, 0))
    need = max(0, int(np.cumsum(step).max(initial=0)))
    if need > pool.n_free:
        pool.index.index.check(update.targeting)  # a batch the index refuses never grows the pool
        pool._grow(max(2 * pool.n_ads, pool.n_ads - pool.n_free + need, 64))
    pool.index.check_fresh()
    # the host index (host_bits="auto": its rows go at the first batch that applies; the device
    # works out the bits from then on); its device copy below
    delta = pool.index.index.apply(update.targeting, keep_host_bits=pool.index.host_bits is True)
    slots, last, row_op = final_rows(delta.slots, ops, sets)
    t = pool.table
    if t.table is not None and slots.size:  # the caller's host table no longer describes the slots
        t.max_abs_bound()
        t.table, t.host_ad_ids = None, t.host_ad_ids.copy()
    packed = np.full(ops.size, -1, np.int64)  # op -> its row in `rows`
    packed[sets] = np.arange(int(sets.sum()))
    freed = ops[last] == RETIRE
    new_ids = np.where(freed, FREE, update.targeting.ad_ids[last]).astype(np.int64)
    row_of = np.where(freed, FREED, np.where(row_op >= 0, packed[np.maximum(row_op, 0)], -1))
    W = t.words.shape[1] if t.layout == "rows" else t.words.shape[0]  # uint64 words a row
    words = (np.ascontiguousarray(rows.embeddings).view(np.int64).reshape(-1) if rows.n_ads
             else np.zeros(W, np.int64))
    n_rows = max(rows.n_ads, 1)

    def as_int64(x):  # float32[n_rows] as int64 words (the staging buffers hold int64)
        out = np.zeros(n_rows + n_rows % 2, np.float32)
        out[:x.size] = x
        return out.view(np.int64)

    has_scale = rows.scale is not None
    host = [slots.astype(np.int64), new_ids, row_of.astype(np.int64), words,
            as_int64(rows.bias if rows.n_ads else np.zeros(0, np.float32)),
            as_int64(rows.scale if has_scale and rows.n_ads else np.zeros(0, np.float32))]

    def device_part():
        # the index's delta and the table's slots in one pinned asynchronous copy, then the
        # index's kernels and the table's, all on the stream requests use: a request queued after
        # sees the whole batch
        buf, (s_slots, s_ids, s_row_of, s_words, s_bias, s_scale) = pool.index.apply_delta(delta, also=host)
        if not slots.size:
            return
        run = _scatter_launch(pool)
        for i, start, n in ((4, s_slots, slots.size), (5, s_ids, slots.size), (6, s_row_of, slots.size),
                            (7, s_words, n_rows * W)):
            run.set_array(i, buf, start, n, np.uint64 if i == 7 else None)
        run.set_array(8, buf, s_bias, n_rows, np.float32)
        run.set_array(9, buf, s_scale, n_rows, np.float32)
        # a thread per (slot, word), not a grid-stride loop: the whole grid, in the simulator too
        run.set_grid(max(1, -(-slots.size * W // run.block)))
        run()

    try:
        if pool.trace is None:
            device_part()
        else:  # the device time of the batch's copies and kernels (bench: apply_device)
            pool.trace.run([("apply", device_part)])
    except Exception as e:  # the host index took the batch, the device did not: nothing can serve now
        pool._failed = f"an update's device part failed after the host index took it ({type(e).__name__}: {e})"
        raise
    pool._index_version = pool.index.version
    if not slots.size:  # an empty batch
        return delta
    t.relabel(slots, new_ids)
    # the largest |a| (the overflow checks): new rows can only raise it, a row overwritten or freed
    # (zeroed) may lower it; the bound keeps the old value raised by the new rows (exact until a
    # row is overwritten or freed), and a request asks for the exact one only where the bound
    # would refuse it (a reduction over the table: milliseconds at 10^7 ads, not at every request)
    bound = max(t.max_abs_bound(), rows.max_abs) if rows.n_ads else t.max_abs_bound()
    exact = not ((ops == RETIRE) | ((ops == CHANGE) & sets)).any() and t.max_abs_is_exact()
    t._max_abs, t._max_abs_bound = (bound if exact else None), bound
    # new scales may end it; a row that ended it and is gone again does not start it (that would take a
    # pass over the device's scales): the kernels stay correct, one instruction an int8 pair slower
    if getattr(t, "_fma_dequant", None):
        t._fma_dequant = rows.fma_dequant
    return delta


def _scatter_launch(pool) -> "launch.BoundLaunch":
    """:func:`~.kernels.scatter_slots_kernel` bound to the pool's table (bound again when the
    pool grows into a new table); a batch points its flat arguments at its staging buffer."""
    from .kernels import scatter_slots_kernel

    t = pool.table
    pairs = t.kept_scale_pairs  # kept once a request read them; written with the scales
    cached = pool._scatter
    if cached is None or cached[0] is not t or cached[1] is not pairs:
        i64, f32 = launch.dummy(np.int64), launch.dummy(np.float32)
        run = launch.BoundLaunch(scatter_slots_kernel(t.layout == "tiles"), 1, launch.default_block(), (
            t.words, t.bias, t.scale, t.ad_ids, i64, i64, i64, launch.dummy(np.uint64), f32, f32, t.dtype == "int8",
            launch.dummy(np.uint32) if pairs is None else pairs, pairs is not None))
        pool._scatter = cached = (t, pairs, run)
    return cached[2]


__all__ = ["PoolUpdate", "apply_update", "check_update", "final_rows", "take_ops"]
