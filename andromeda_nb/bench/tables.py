"""Benchmark data generated on the GPU with cupy (a 100M-ad fp16 table is 12.8 GB; generating it on
the host would take minutes): ad tables, their rows copied back for oracle checks, i.i.d. eligible
bitsets. Every function imports cupy when called (``--list`` needs no GPU)."""

from __future__ import annotations

import gc

import numpy as np

from ..model import AdTable


def gpu_table(n: int, d: int, dtype: str, layout: str, seed: int = 0, chunk: int = 1 << 23, ad_ids=None):
    """A random ad table generated on the GPU: rows ~ N(0, 1), biases ~ N(0, 1), ad ids = slots
    (or ``ad_ids``, int64 ``[n]``: a shard's own ads).

    Returns a :class:`~andromeda_nb.score.table.DeviceAdTable` (cupy-owned memory kept alive on it).
    """
    import cupy as cp

    from ..model import STORAGE_DTYPES, int8_row_scale
    from ..score.naive import tile_width
    from ..score.table import DeviceAdTable

    rs = cp.random.RandomState(seed)
    store = cp.empty((n, d), dtype=STORAGE_DTYPES[dtype])
    scale = cp.empty(n, dtype=cp.float32) if dtype == "int8" else None
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        x = rs.standard_normal((hi - lo, d), dtype=cp.float32)
        if dtype == "fp32":
            store[lo:hi] = x
        elif dtype == "fp16":
            store[lo:hi] = x.astype(cp.float16)
        elif dtype == "bf16":
            u = x.view(cp.uint32).astype(cp.uint64)
            store[lo:hi] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)
        else:
            s = int8_row_scale(cp.abs(x).max(axis=1), cp)  # as quantize_int8_rows
            scale[lo:hi] = s
            store[lo:hi] = cp.clip(cp.rint(x / cp.where(s > 0, s, 1)[:, None]), -127, 127).astype(cp.int8)
        del x
    if layout == "tiles":
        W = tile_width(dtype)
        store = cp.ascontiguousarray(store.reshape(n, d // W, W).transpose(1, 0, 2))
    bias = rs.standard_normal(n, dtype=cp.float32)
    ids = None if ad_ids is None else cp.asarray(np.asarray(ad_ids, np.int64))
    table = DeviceAdTable.from_device(store, bias, dtype, layout, scale=scale, ad_ids=ids)
    table._keep = (store, bias, scale, ids)
    return table


class TableCache:
    """One GPU table at a time (keyed by dtype, d, layout): regenerating costs seconds, memory is
    tens of GB."""

    def __init__(self, n: int):
        self.n, self.key, self.table = n, None, None

    def get(self, dtype: str, d: int, layout: str):
        import cupy as cp

        if self.key != (dtype, d, layout):
            self.table = None
            gc.collect()
            cp.get_default_memory_pool().free_all_blocks()
            self.table = gpu_table(self.n, d, dtype, layout, seed=d * 7 + len(dtype))
            self.key = (dtype, d, layout)
        return self.table

    def clear(self) -> None:
        import cupy as cp

        self.table, self.key = None, None
        gc.collect()
        cp.get_default_memory_pool().free_all_blocks()


def host_rows(table, slots: np.ndarray) -> AdTable:
    """The stored rows of some slots, copied to the host as an AdTable (for oracle checks)."""
    import cupy as cp

    emb = cp.asarray(table.embeddings)
    idx = cp.asarray(slots)
    if table.layout == "rows":
        rows = emb[idx]
    else:
        rows = emb[:, idx, :].transpose(1, 0, 2).reshape(len(slots), table.d)
    scale = cp.asarray(table.scale)[idx].get() if table.dtype == "int8" else None
    return AdTable(embeddings=cp.ascontiguousarray(rows).get(), bias=cp.asarray(table.bias)[idx].get(),
                   dtype=table.dtype, scale=scale, ad_ids=np.asarray(slots, np.int64))


def bernoulli_bitset(n: int, fraction: float, seed: int):
    """An i.i.d. Bernoulli(fraction) eligible bitset (uint64 words) generated on the GPU, and its count."""
    import cupy as cp

    from ..targeting import WORD_BITS

    rs = cp.random.RandomState(seed)
    n_words = (n + WORD_BITS - 1) // WORD_BITS
    mask = rs.random_sample(n_words * WORD_BITS, dtype=cp.float32) < fraction
    mask[n:] = False
    words = cp.packbits(mask, bitorder="little").view(cp.uint64)
    return words, int(mask.sum())


def bitset_mask(words, n: int):
    """Unpack a device bitset to a device bool mask ``[n]``."""
    import cupy as cp

    return cp.unpackbits(words.view(cp.uint8), bitorder="little")[:n].astype(cp.bool_)
