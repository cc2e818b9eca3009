"""The byte model of one request: the bytes the device match moves, counted by emulating its
kernels on the host (:func:`read_model`). Benchmarks count ``bytes_per_item`` with it.
"""

from __future__ import annotations

import numpy as np

from ..targeting import WORD_BITS, MatchPlan, TargetingIndex
from .api import plan_ops
from .config import MatchConfig


def read_model(index: TargetingIndex, plan: MatchPlan, n_words: int | None = None, exclude_slots=None,
               config: MatchConfig | None = None) -> dict:
    """Bytes one request moves, by emulating the kernels on the host (Numba-parallel).

    Rows: a 32-byte sector of a row is read when one of its 4 words is still alive at that point
    of the plan (a warp's load covers 32 consecutive words, so the sector is the unit), and an
    include row only where the category's OR does not cover the word yet. Lists: their entries
    are read (twice for patch lists: scatter and clear), and each distinct 32-byte sector of the
    patch row / result they touch counts once (read; patch sectors also written back by the
    clear). The result bitset is written once.

    Args:
        index: the host index (with its bitset rows).
        plan: one request's plan (``index.plan(profile)``).
        n_words: match only the first ``n_words`` words of the pool (default all).
        exclude_slots: the request's exclude slots, if any.
        config: the launch modelled (default ``MatchConfig()``): ``config.prefetch``, the plain
            kernel variant that loads each category's first include row one category ahead;
            ``config.group`` > 0, the grouped match kernel (rows loaded ``group`` at a time for
            the words alive before them; no OR-coverage skipping). The other fields do not change
            the bytes.

    Returns a dict: ``row_sectors``, ``row_bytes`` (32 per row sector), ``list_bytes``,
    ``touched_sectors`` (patch + result sectors the list passes touch), ``read_bytes``,
    ``write_bytes``, ``bytes`` (read + written), ``bits_per_ad`` (row bits read per ad: the match
    kernel's share), ``bytes_per_ad``, ``rows_read`` (rows the plan names),
    ``rows_per_category`` (sectors read per category / sectors per row), ``categories``.
    """
    if not isinstance(index, TargetingIndex):
        raise TypeError(f"index must be a TargetingIndex, got {type(index).__name__}")
    cfg = MatchConfig() if config is None else config
    if not isinstance(cfg, MatchConfig):
        raise TypeError(f"config must be a MatchConfig, got {type(cfg).__name__}")
    rows = index._need_bits("read_model")
    from ..targeting.cpu_kernels import cpu_scatter
    from .byte_model_kernels import sector_counts, sector_counts_grouped

    nw = index.n_words if n_words is None else int(n_words)
    if not (0 < nw <= index.n_words or nw == index.n_words == 0):
        raise ValueError(f"n_words must be in 1..{index.n_words}")
    n_bits = min(index.n_ads, nw * WORD_BITS)
    entry = index.pool.itemsize

    def live_entries(lid):
        seg = index.pool[index.l_start[lid]:index.l_start[lid] + index.l_len[lid]].astype(np.int64)
        return seg[(seg >= 0) & (seg < n_bits)]

    patches = np.zeros((max(plan.n_patches, 1), index.n_words), np.uint64)
    sectors = np.zeros(-(-index.n_words // 4), bool)

    def distinct_sectors(slots):
        sectors[:] = False
        sectors[slots >> 8] = True
        return int(np.count_nonzero(sectors))

    list_bytes = 0
    touched = 0
    for j, lids in enumerate(plan.patch_lists):
        s0, ln = index.segments(lids)
        cpu_scatter(index.pool, s0, ln, np.full(s0.size, j, np.int64), patches, 1)
        list_bytes += 2 * entry * int(ln.sum())
        touched += distinct_sectors(np.concatenate([live_entries(lid) for lid in lids.tolist()]))
    patch_touched = touched
    for lid in plan.exclude_lists.tolist():
        list_bytes += entry * int(index.l_len[lid])
        touched += distinct_sectors(live_entries(lid))
    if exclude_slots is not None:
        ex = np.asarray(exclude_slots, np.int64)
        list_bytes += 8 * ex.size
        touched += distinct_sectors(ex[ex < n_bits])
    nr = index.n_rows
    inc = np.where(plan.inc_rows < 0, nr - 1 - plan.inc_rows, plan.inc_rows).astype(np.int64)
    per = np.zeros(max(plan.n_categories, 1), np.int64)
    if cfg.group:
        op_row, op_kind = plan_ops(plan.inc_ptr, inc, plan.exc_ptr, plan.exc_rows)
        op_cat = np.zeros(op_row.size, np.int64)
        j = 0
        for c in range(plan.n_categories):  # the ops plan_ops emits per category, in order
            n_inc = int(plan.inc_ptr[c + 1] - plan.inc_ptr[c])
            n_ops = n_inc + int(plan.exc_ptr[c + 1] - plan.exc_ptr[c]) if n_inc else 1
            op_cat[j:j + n_ops] = c
            j += n_ops
        sector_counts_grouped(rows, patches, n_bits, nw, op_row, op_kind, op_cat, per, 1024, cfg.group)
    else:
        sector_counts(rows, patches, n_bits, nw, plan.inc_ptr, inc, plan.exc_ptr, plan.exc_rows, per, 1024,
                      cfg.prefetch)
    total = int(per[:plan.n_categories].sum())
    n_sectors_row = max(-(-nw // 4), 1)
    out = {
        "row_sectors": total,
        "row_bytes": 32 * total,
        "list_bytes": list_bytes,
        "touched_sectors": touched,
        "read_bytes": 32 * total + list_bytes + 32 * touched,
        "write_bytes": 8 * nw + 32 * patch_touched,
        "rows_read": plan.rows_read,
        "rows_per_category": (per[:plan.n_categories] / n_sectors_row).tolist(),
        "categories": plan.categories,
    }
    out["bytes"] = out["read_bytes"] + out["write_bytes"]
    out["bits_per_ad"] = 8 * out["row_bytes"] / max(n_bits, 1)
    out["bytes_per_ad"] = out["bytes"] / max(n_bits, 1)
    return out
