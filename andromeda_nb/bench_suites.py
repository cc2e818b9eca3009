"""Benchmark suites (GPU only): each takes ``(env, ceilings, args)`` and returns result rows.

Data is generated on the GPU with cupy (a 100M-ad fp16 table is 12.8 GB; generating it on the
host would take minutes). Every row verifies its own output: scores of a random sample of ads
against the float64 oracle, and top-K answers against torch.topk on the same scores.
"""

from __future__ import annotations

import gc
import math

import numpy as np

from . import bench, checks, launch
from .model import AdTable, Request

SAMPLE = 2048  # ads per row checked against the float64 oracle


# ----------------------------------------------------------------------------- data on the GPU

def gpu_table(n: int, d: int, dtype: str, layout: str, seed: int = 0, chunk: int = 1 << 23):
    """A random ad table generated on the GPU: rows ~ N(0, 1), biases ~ N(0, 1), ad ids = slots.

    Returns a :class:`~andromeda_nb.scoring.DeviceAdTable` (cupy-owned memory kept alive on it).
    """
    import cupy as cp

    from .kernels.score import tile_width
    from .model import STORAGE_DTYPES
    from .scoring import DeviceAdTable

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
            s = cp.abs(x).max(axis=1) / 127
            scale[lo:hi] = s
            store[lo:hi] = cp.clip(cp.rint(x / cp.where(s > 0, s, 1)[:, None]), -127, 127).astype(cp.int8)
        del x
    if layout == "tiles":
        W = tile_width(dtype)
        store = cp.ascontiguousarray(store.reshape(n, d // W, W).transpose(1, 0, 2))
    bias = rs.standard_normal(n, dtype=cp.float32)
    table = DeviceAdTable.from_device(store, bias, dtype, layout, scale=scale)
    table._keep = (store, bias, scale)
    return table


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

    from .targeting import WORD_BITS

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


# ----------------------------------------------------------------------------- checks

def verify_scores_sample(dreq, table, scores_dev=None, rng=None, eligible_mask=None) -> checks.Check:
    """Score a random sample of slots through the candidates path and compare with the oracle; if
    ``scores_dev`` (a scores array the case wrote) is given, the same slots must hold equal values."""
    import cupy as cp

    from .scoring import score_ads

    rng = rng or np.random.default_rng(0)
    slots = np.sort(rng.choice(table.n_ads, min(SAMPLE, table.n_ads), replace=False))
    got = score_ads(dreq, table, candidates=slots.astype(np.int32)).copy_to_host()
    result = checks.compare_scores(got, dreq.request, host_rows(table, slots))
    if result.ok and scores_dev is not None:
        written = cp.asarray(scores_dev)[cp.asarray(slots)].get()
        if eligible_mask is not None:
            elig = cp.asarray(eligible_mask)[cp.asarray(slots)].get()
            if not (np.array_equal(written[elig], got[elig]) and np.isnan(written[~elig]).all()):
                return checks.Check(False, "written scores differ from the candidates path on the sample")
        elif not np.array_equal(written, got):
            return checks.Check(False, "written scores differ from the candidates path on the sample")
    return result


def verify_topk_torch(ids_dev, scores_dev, all_scores_dev, k: int, eligible_mask=None) -> checks.Check:
    """A device top-K answer against torch.topk on the same fp32 scores: equal score multisets,
    every returned id holds its returned score, no duplicates, and exact ties at the k-th score
    resolved to the lowest ids."""
    import cupy as cp
    import torch

    s = cp.asarray(all_scores_dev).astype(cp.float32, copy=True)
    s[cp.isnan(s)] = -cp.inf
    valid = ~cp.isnan(cp.asarray(all_scores_dev))
    if eligible_mask is not None:
        valid &= cp.asarray(eligible_mask)
        s[~cp.asarray(eligible_mask)] = -cp.inf
    n_valid = int(valid.sum())
    t = torch.as_tensor(s, device="cuda")
    kk = min(k, n_valid)
    want_vals = torch.topk(t, kk).values.cpu().numpy() if kk else np.zeros(0, np.float32)
    ids = cp.asarray(ids_dev).get()
    got = cp.asarray(scores_dev).get()
    if not np.array_equal(got[:kk], want_vals):
        return checks.Check(False, f"top-{k} scores differ from torch.topk")
    if kk < k and not ((ids[kk:] == -1).all() and np.isneginf(got[kk:]).all()):
        return checks.Check(False, "pads are not -1 / -inf")
    real = ids[:kk]
    if len(set(real.tolist())) != kk or (real < 0).any():
        return checks.Check(False, "duplicate or missing ids")
    at = cp.asarray(all_scores_dev)[cp.asarray(real)].get()
    if not np.array_equal(at, got[:kk]):
        return checks.Check(False, "a returned id does not hold its returned score")
    if kk:
        kth = got[kk - 1]
        tied = cp.flatnonzero((cp.asarray(all_scores_dev) == kth) & valid).get()
        n_tied_in = int(np.sum(got[:kk] == kth))
        if not np.array_equal(np.sort(real[got[:kk] == kth]), np.sort(tied)[:n_tied_in]):
            return checks.Check(False, "ties at the k-th score not resolved to the lowest ids")
    return checks.Check(True, f"equals torch.topk values; ids hold their scores; ties to lowest id")


# ----------------------------------------------------------------------------- scoring suite

def gated_flops(d: int, E: int, K: int, all_values: bool = True) -> float:
    """FLOPs per ad of the fused gated kernel: encode 2d, gate 2Ed, values 2Ed (all E) or 2Kd,
    softmax ~4E, combine 2K (a multiply-add counts 2)."""
    return 2 * d + 2 * E * d + 2 * (E if all_values else K) * d + 4 * E + 2 * K


def scoring(env, ceil, args) -> list[dict]:
    import cupy as cp

    from .scoring import DeviceRequest, launch_score, launch_score_topk

    n = args.n_ads
    rows = []
    rng = np.random.default_rng(1)
    cases = []  # (dtype, d, E, K, layout, access, fraction, fused_k)
    for layout in ("rows", "tiles"):
        cases.append(("fp16", 64, 6, 2, layout, "pool", 1.0, 0))
        cases.append(("fp16", 64, 6, 2, layout, "pool", 1.0, 1000))
        cases.append(("fp16", 64, 1, 1, layout, "pool", 1.0, 1000))
    for dtype in ("fp32", "bf16", "int8"):
        cases.append((dtype, 64, 6, 2, "tiles", "pool", 1.0, 1000))
    for frac in (0.5, 0.1, 0.01):
        for layout in ("rows", "tiles"):
            cases.append(("fp16", 64, 6, 2, layout, "bitset", frac, 1000))
    cases.append(("fp16", 64, 6, 2, "rows", "candidates", 0.1, 1000))
    if args.quick:
        cases = [c for c in cases if c[0] == "fp16" and c[5] != "candidates"][:8]
    tables = {}
    for dtype, d, E, K, layout, access, frac, fused_k in cases:
        key = (dtype, d, layout)
        if key not in tables:
            tables.clear()
            gc.collect()
            cp.get_default_memory_pool().free_all_blocks()
            tables[key] = gpu_table(n, d, dtype, layout, seed=hash(key) % 1000)
        table = tables[key]
        req = Request.random(d, E, K, rng)
        dreq = DeviceRequest.from_request(req)
        elig = cand = None
        items = n
        emask = None
        if access == "bitset":
            elig, items = bernoulli_bitset(n, frac, seed=int(frac * 1000))
            elig = launch.cuda().as_cuda_array(elig)
            emask = bitset_mask(cp.asarray(elig), n)
        elif access == "candidates":
            c = cp.flatnonzero(cp.random.random(n, dtype=cp.float32) < frac).astype(cp.int32)
            cand, items = launch.cuda().as_cuda_array(c), int(c.size)
        n_items = items if access == "candidates" else n
        row_bytes = d * {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}[dtype] + 4 + (4 if dtype == "int8" else 0)
        extra_bytes = (n / 8 / items) if access == "bitset" else (4.0 if access == "candidates" else 0.0)
        if fused_k:
            out = {}

            def run():
                out["r"] = launch_score_topk(dreq, table, fused_k, access, elig, cand, n_items)

            timing = bench.time_device(run, reps=args.reps)
            ids, sc, cnt = out["r"]
            verified = verify_scores_sample(dreq, table, rng=rng)
            if verified.ok:
                full = launch.cuda().device_array(n_items, np.float32)
                launch_score(dreq, table, access, elig, cand, n_items, full)
                # candidates: the scores are per list position; map returned ad ids (= slots) back
                if access == "candidates":
                    pos = cp.full(n, cp.nan, dtype=cp.float32)
                    pos[cp.asarray(cand)] = cp.asarray(full)
                    full = pos
                verified = verify_topk_torch(ids, sc, full, fused_k,
                                             eligible_mask=emask)
                del full
            variant, write_bytes = "gated_fused_topk" if E > 1 else "tower_fused_topk", 0.0
        else:
            full = launch.cuda().device_array(n_items, np.float32)
            timing = bench.time_device(lambda: launch_score(dreq, table, access, elig, cand, n_items, full),
                                       reps=args.reps)
            verified = verify_scores_sample(dreq, table, scores_dev=full if access == "pool" else None, rng=rng)
            del full
            variant, write_bytes = "gated_scores_to_memory" if E > 1 else "tower_scores_to_memory", 4.0
        rows.append(bench.row(
            "scoring", env, ceil, timing, items, row_bytes + extra_bytes + write_bytes, gated_flops(d, E, K),
            str(verified), variant=variant, n_ads=n, d=d, dtype=dtype, experts=E, k_experts=K,
            access=access if access != "pool" else "pool", eligible_fraction=frac, k=fused_k or "",
            layout=layout, notes="items = ads scored; bytes = row + bias (+ scale) + bitset share + writes"))
        bench.print_rows(rows[-1:])
    return rows


# ----------------------------------------------------------------------------- top-K suite

def topk(env, ceil, args) -> list[dict]:
    import cupy as cp
    import torch

    from .topk import launch_topk

    rows = []
    cases = [(100_000_000, 100, "random"), (100_000_000, 1000, "random"), (100_000_000, 1000, "ascending"),
             (500_000, 1000, "random")]
    if args.quick:
        cases = cases[:2] + cases[3:]
    for n, k, order in cases:
        if order == "ascending":
            scores = cp.arange(n, dtype=cp.float32) / n
        else:
            scores = cp.random.RandomState(n + k).standard_normal(n, dtype=cp.float32)
        d_scores = launch.cuda().as_cuda_array(scores)
        out = {}

        def run():
            out["r"] = launch_topk(d_scores, n, k)

        timing = bench.time_device(run, reps=args.reps)
        ids, sc, cnt = out["r"]
        verified = verify_topk_torch(ids, sc, scores, k)
        rows.append(bench.row("topk", env, ceil, timing, n, 4.0, None, str(verified), variant="block_topk",
                              n_ads=n, k=k, batch=1, dtype="fp32", access=order,
                              notes="L2-resident (2 MB)" if n * 4 < 50e6 else ""))
        t = torch.as_tensor(scores, device="cuda")
        timing = bench.time_device(lambda: torch.topk(t, k), reps=args.reps)
        rows.append(bench.row("topk", env, ceil, timing, n, 4.0, None, "baseline", variant="torch.topk",
                              n_ads=n, k=k, batch=1, dtype="fp32", access=order,
                              notes="L2-resident (2 MB)" if n * 4 < 50e6 else ""))
        bench.print_rows(rows[-2:])
        del scores, d_scores, t
        cp.get_default_memory_pool().free_all_blocks()
    return rows

