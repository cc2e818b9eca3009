"""Benchmark suites (GPU only): each takes ``(env, ceilings, args)`` and returns result rows.

Data is generated on the GPU with cupy (a 100M-ad fp16 table is 12.8 GB; generating it on the
host would take minutes). Every row verifies its own output: scores of a random sample of ads
against the float64 oracle, and top-K answers against torch.topk on the same scores.
"""

from __future__ import annotations

import gc

import numpy as np

from . import harness
from .. import checks
from ..device import launch
from ..model import AdTable, Request

SAMPLE = 2048  # ads per row checked against the float64 oracle


# ----------------------------------------------------------------------------- data on the GPU

def gpu_table(n: int, d: int, dtype: str, layout: str, seed: int = 0, chunk: int = 1 << 23):
    """A random ad table generated on the GPU: rows ~ N(0, 1), biases ~ N(0, 1), ad ids = slots.

    Returns a :class:`~andromeda_nb.score.api.DeviceAdTable` (cupy-owned memory kept alive on it).
    """
    import cupy as cp

    from ..score.naive import tile_width
    from ..model import STORAGE_DTYPES
    from ..score.api import DeviceAdTable

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


# ----------------------------------------------------------------------------- checks

def verify_scores_sample(dreq, table, scores_dev=None, rng=None, eligible_mask=None, config=None) -> checks.Check:
    """Score a random sample of slots through the candidates path (same kernel configuration) and
    compare with the oracle; if ``scores_dev`` (a scores array the case wrote) is given, the same
    slots must hold equal values."""
    import cupy as cp

    from ..score.api import score_ads

    rng = rng or np.random.default_rng(0)
    slots = np.sort(rng.choice(table.n_ads, min(SAMPLE, table.n_ads), replace=False))
    got = score_ads(dreq, table, candidates=slots.astype(np.int32), config=config).copy_to_host()
    rows = host_rows(table, slots)
    if dreq.model == "dot":
        from .. import reference

        ref = reference.dot_score(dreq.user, rows)
        scale = np.abs(rows.dequantized()) @ np.abs(dreq.user.astype(np.float64)) + np.abs(rows.bias)
        err = np.abs(got - ref)
        ok = bool(np.all(err <= checks.SCORE_RTOL * scale.max()))
        result = checks.Check(ok, f"{got.size} dot scores vs float64, max err {err.max():.2g}")
    else:
        result = checks.compare_scores(got, dreq.request, rows)
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
    return checks.Check(True, "equals torch.topk values; ids hold their scores; ties to lowest id")


# ----------------------------------------------------------------------------- scoring suite

def model_flops(model: str, d: int, E: int, K: int, values: str = "chosen") -> float:
    """FLOPs per ad (a multiply-add counts 2): gated = encode 2d + gate 2Ed + values 2Kd (or 2Ed when
    all E value dots are computed) + softmax/choice ~4E; dot = 2d."""
    if model == "dot":
        return 2.0 * d
    return 2 * d + 2 * E * d + 2 * (E if values == "all" else K) * d + 4 * E


ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}


class _Tables:
    """One GPU table at a time (keyed by dtype, d, layout): regenerating costs seconds, memory is
    tens of GB."""

    def __init__(self, n):
        self.n, self.key, self.table = n, None, None

    def get(self, dtype, d, layout):
        import cupy as cp

        if self.key != (dtype, d, layout):
            self.table = None
            gc.collect()
            cp.get_default_memory_pool().free_all_blocks()
            self.table = gpu_table(self.n, d, dtype, layout, seed=d * 7 + len(dtype))
            self.key = (dtype, d, layout)
        return self.table


def _access_inputs(n, access, frac, seed):
    """(elig device bitset or None, cand device int32 or None, items scored, n_items, eligible mask)."""
    import cupy as cp

    cuda = launch.cuda()
    if access == "bitset":
        words, items = bernoulli_bitset(n, frac, seed)
        return cuda.as_cuda_array(words), None, items, n, bitset_mask(words, n)
    if access == "candidates":
        mask = cp.random.RandomState(seed).random_sample(n, dtype=cp.float32) < frac
        c = cp.flatnonzero(mask).astype(cp.int32)
        return None, cuda.as_cuda_array(c), int(c.size), int(c.size), mask
    return None, None, n, n, None


def _scores_full(dreq, table, access, elig, cand, n_items, config):
    """All scores of the case written to memory, indexed by slot (NaN where not scored)."""
    import cupy as cp

    from ..score.launches import launch_score

    out = launch.cuda().device_array(n_items, np.float32)
    launch_score(dreq, table, access, elig, cand, n_items, out, config)
    if access != "candidates":
        return out
    full = cp.full(table.n_ads, cp.nan, dtype=cp.float32)
    full[cp.asarray(cand)] = cp.asarray(out)
    return full


def _fused_row(env, ceil, args, tables, rng, model, dtype, d, E, K, layout, access, frac, k, config, variant,
               notes="", path="block"):
    """Fused scoring + top-k timed, verified against torch.topk of the same kernel's scores, as a
    row. ``path``: "block" (scoring.launch_score_topk) or "filter" (scoring.launch_score_filter; a
    seeded run that is not exact, where score_topk would fall back to the block path, fails the row)."""
    from ..score.launches import (DeviceRequest, ScoreFilterWorkspace, _resolve, launch_score_filter, launch_score_topk,
                          topk_workspace)
    from ..topk.api import seeded_outcome
    from ..score.unfused import fused_bytes_per_ad

    table = tables.get(dtype, d, layout)
    n = table.n_ads
    dreq = DeviceRequest.of(Request.random(d, E, K, rng) if model == "gated" else rng.standard_normal(d))
    elig, cand, items, n_items, mask = _access_inputs(n, access, frac, seed=int(frac * 1e4) + 1)
    if path == "filter":
        sfw = ScoreFilterWorkspace.make(n_items, k, access)
        res = sfw.fws
        call = lambda: launch_score_filter(dreq, table, k, access, elig, cand, n_items, config, sfw)  # noqa: E731
    else:
        res = topk_workspace(table, k, n_items, config)
        call = lambda: launch_score_topk(dreq, table, k, access, elig, cand, n_items, config, res)  # noqa: E731
    timing = harness.time_device(call, reps=args.reps)
    verified = verify_scores_sample(dreq, table, rng=rng)
    if path == "filter":
        c = res.counts.copy_to_host()[0]
        outcome = seeded_outcome(res, k, c)
        notes = (f"seeded filter path: {sfw.sws.m} sampled ads scored, seed = their top-{sfw.sws.r}, {int(c[1])} "
                 f"scores reached it (buffer {res.cap})" + (f"; {notes}" if notes else ""))
        if verified.ok and outcome != "exact":
            verified = checks.Check(False, f"seeded run not exact ({outcome}: {c[1]} scores reached the seed): "
                                           "score_topk would fall back to the block path")
    if verified.ok:
        full = _scores_full(dreq, table, access, elig, cand, n_items, config)
        verified = verify_topk_torch(res.out_id[0], res.out_s[0], full, k,
                                     eligible_mask=mask if access == "bitset" else None)
        del full
    return harness.row("scoring", env, ceil, timing, items, fused_bytes_per_ad(d, dtype, access, frac),
                     model_flops(model, d, E, K, "all" if config.tensor_cores else config.values), str(verified), variant=variant, n_ads=n, d=d,
                     dtype=dtype, experts=E if model == "gated" else "", k_experts=K if model == "gated" else "",
                     access=access, eligible_fraction=frac, k=k, layout=layout,
                     notes=f"{_config_note(_resolve(config, dreq, table, access, 0 if path == 'filter' else k, True))}; items = ads scored"
                           f"{'; ' + notes if notes else ''}")


def _config_note(config):
    parts = ["naive" if config.naive else f"values={config.values}", f"block={config.threads()}",
             f"items={config.items}"]
    if config.max_registers:
        parts.append(f"maxreg={config.max_registers}")
    if config.blocks_per_sm != launch.GPU_BLOCKS_PER_SM:
        parts.append(f"blocks/SM={config.blocks_per_sm}")
    if config.sync_every != 1:
        parts.append(f"sync_every={config.sync_every}")
    if config.weights != "shared":
        parts.append(f"weights={config.weights}")
    if config.guard != "fence":
        parts.append(f"guard={config.guard}")
    if config.tensor_cores:
        parts.append("tensor_cores (3xTF32 mma)")
    return " ".join(parts)


def _scores_row(env, ceil, args, tables, rng, model, dtype, d, E, K, layout, config, variant):
    from ..score.launches import DeviceRequest, _resolve, launch_score
    from ..score.unfused import fused_bytes_per_ad

    table = tables.get(dtype, d, layout)
    n = table.n_ads
    dreq = DeviceRequest.of(Request.random(d, E, K, rng) if model == "gated" else rng.standard_normal(d))
    out = launch.cuda().device_array(n, np.float32)
    timing = harness.time_device(lambda: launch_score(dreq, table, "pool", None, None, n, out, config), reps=args.reps)
    verified = verify_scores_sample(dreq, table, scores_dev=out, rng=rng, config=config)
    return harness.row("scoring", env, ceil, timing, n, fused_bytes_per_ad(d, dtype) + 4, model_flops(model, d, E, K, "all" if config.tensor_cores else config.values),
                     str(verified), variant=variant, n_ads=n, d=d, dtype=dtype, experts=E if model == "gated" else "",
                     k_experts=K if model == "gated" else "", access="pool", eligible_fraction=1.0, layout=layout,
                     notes=f"{_config_note(_resolve(config, dreq, table, 'pool'))}; scores written to memory (4 B/ad)")


def scoring(env, ceil, args) -> list[dict]:
    """Phases (``--phases``, comma-separated; default all):

    design : d=64 fp16 E=6 K=2 pool: kernel configurations, layouts, the naive kernel, dot, scores vs fused
    unfused: per-op (pool, all candidates) and pre-fusion pipelines against the fused kernel, with byte budgets
    dtype  : fp32 / bf16 / fp16 / int8, gated and dot
    sweep  : ads/s against E, K and d (fp16)
    dense  : the dense mixture E = K = 6 (issue 6's compute column)
    sync   : the fused top-K's barrier interval (sync_every 1, 2, 4, 8), gated and dot, and scores
             to memory (not in the default set: run it with --phases=sync)
    access : bitset (0.5, 0.1, 0.01) and candidates (0.1, 0.01), rows and tiles; pre-fusion and per-op on bitsets
    filter : fused scoring + top-k by the seeded filter path (k = 1000 and 4096) against scores to
             memory and the fused block top-K, same run (not in the default set)
    weights: request weights read from shared memory or the constant bank (kernel parameters), the
             per-ad fence or an opaque offset, register caps; scores to memory (not in the default set)
    tensor : the gate and value dot products on the tensor cores (KernelConfig.tensor_cores): scores
             to memory, fused top-K, against the CUDA-core kernel and dot (not in the default set)
    defaults: the default configuration on the headline cases: gated and dot (fp16, int8; d 64 and
             128), scores to memory and the filter path; bitset filter; block top-K (not in the default set)
    int8   : int8 against fp16, dot (d 64 and 128, scores to memory and the filter path) and gated d 64
             scores to memory (not in the default set)
    bitset_sweep: the gated filter path on a 10 % eligible bitset, rows layout, over register caps,
             block sizes and blocks per SM, with the full-pool pass of the same run (not in the default set)
    sweep_dtypes: the E / K / d grid of ``sweep`` for fp32, bf16 and int8 tables (fused block
             top-1000, the dot product in each), so "complexity is free" can be read per dtype (not
             in the default set: ~40 cases more)
    """
    import cupy as cp

    from ..score.api import DEFAULT_CONFIG, KernelConfig  # noqa: F811

    phases = set((args.phases or "design,unfused,dtype,sweep,dense,access").split(","))  # "final": short run
    tables = _Tables(args.n_ads)
    rng = np.random.default_rng(1)
    rows = []
    K1000 = 1000

    def add(r):
        rows.append(r)
        harness.print_rows([r])

    best = DEFAULT_CONFIG
    if "design" in phases:
        tried = []
        for cfg in (KernelConfig(values="chosen"), KernelConfig(values="chosen", block=128),
                    KernelConfig(values="chosen", max_registers=128), KernelConfig(values="all"),
                    KernelConfig(values="all", block=128), KernelConfig(naive=True),
                    # fewer top-K barriers: a fullness check every 2 / 4 / 8 rounds (prediction:
                    # the barrier pairs cost ~30 % at every round; 4 should recover most of it)
                    KernelConfig(values="chosen", max_registers=128, sync_every=2),
                    KernelConfig(values="chosen", max_registers=128, sync_every=4),
                    KernelConfig(values="chosen", max_registers=128, sync_every=8)):
            r = _fused_row(env, ceil, args, tables, rng, "gated", "fp16", 64, 6, 2, "tiles", "pool", 1.0, K1000, cfg,
                           "gated_naive_fused_topk" if cfg.naive else "gated_fused_topk")
            add(r)
            if not cfg.naive and r["verified"].startswith("ok"):
                tried.append((float(r["items_per_s"]), cfg))
        if tried:
            best = max(tried, key=lambda t: t[0])[1]
            print(f"best configuration (used by the later phases): {_config_note(best)}")
        for cfg in (KernelConfig(values="chosen"), KernelConfig(values="all")):
            add(_scores_row(env, ceil, args, tables, rng, "gated", "fp16", 64, 6, 2, "tiles", cfg, "gated_scores_to_memory"))
        add(_fused_row(env, ceil, args, tables, rng, "dot", "fp16", 64, 1, 1, "tiles", "pool", 1.0, K1000, best,
                       "dot_fused_topk"))
        add(_scores_row(env, ceil, args, tables, rng, "dot", "fp16", 64, 1, 1, "tiles", best, "dot_scores_to_memory"))
        add(_fused_row(env, ceil, args, tables, rng, "gated", "fp16", 64, 6, 2, "rows", "pool", 1.0, K1000, best,
                       "gated_fused_topk"))
        add(_fused_row(env, ceil, args, tables, rng, "dot", "fp16", 64, 1, 1, "rows", "pool", 1.0, K1000, best,
                       "dot_fused_topk"))
    DEFAULT_CONFIG = best  # noqa: N806 (the later phases measure the configuration chosen above)
    if "sync" in phases:  # the top-K barrier interval alone, on the design case and dot (short run)
        for every in (1, 2, 4, 8):
            for model, E, K in (("gated", 6, 2), ("dot", 1, 1)):
                cfg = KernelConfig(values="chosen", max_registers=128, sync_every=every)
                add(_fused_row(env, ceil, args, tables, rng, model, "fp16", 64, E, K, "tiles", "pool", 1.0, K1000,
                               cfg, f"{model}_fused_topk"))
        for cfg in (KernelConfig(values="chosen", max_registers=128),):
            add(_scores_row(env, ceil, args, tables, rng, "gated", "fp16", 64, 6, 2, "tiles", cfg,
                            "gated_scores_to_memory"))
    if "final" in phases:  # the default configuration on the cases that matter most, in one short run
        for model, d, E, K, layout, access, frac in (
                ("gated", 64, 6, 2, "tiles", "pool", 1.0), ("dot", 64, 1, 1, "tiles", "pool", 1.0),
                ("gated", 64, 8, 4, "tiles", "pool", 1.0), ("gated", 64, 6, 2, "tiles", "bitset", 0.1),
                ("gated", 32, 6, 2, "tiles", "pool", 1.0), ("gated", 128, 6, 2, "tiles", "pool", 1.0),
                ("gated", 64, 6, 2, "rows", "bitset", 0.01), ("gated", 64, 6, 2, "rows", "candidates", 0.01)):
            add(_fused_row(env, ceil, args, tables, rng, model, "fp16", d, E, K, layout, access, frac, K1000,
                           DEFAULT_CONFIG, f"{model}_fused_topk"))
    if "filter" in phases:  # fused scoring + top-k by the seeded filter path, against scoring alone
        # prediction: per ad one compare instead of the block top-K's barriers, so the filter path
        # runs within a few % of scores-to-memory (17.1 G ads/s at 2c2e901); the sample, seed and
        # final add ~0.1-0.2 ms to a ~6 ms pass at 10^8 ads
        for model, d, E, K, layout, access, frac, k in (
                ("gated", 64, 6, 2, "tiles", "pool", 1.0, 1000), ("gated", 64, 6, 2, "tiles", "pool", 1.0, 4096),
                ("dot", 64, 1, 1, "tiles", "pool", 1.0, 1000), ("gated", 64, 6, 2, "rows", "pool", 1.0, 1000),
                ("gated", 64, 6, 2, "tiles", "bitset", 0.5, 1000), ("gated", 64, 6, 2, "tiles", "bitset", 0.1, 1000),
                ("gated", 64, 6, 2, "tiles", "bitset", 0.01, 1000), ("gated", 64, 6, 2, "rows", "bitset", 0.1, 1000),
                ("gated", 64, 6, 2, "rows", "candidates", 0.01, 1000)):
            add(_fused_row(env, ceil, args, tables, rng, model, "fp16", d, E, K, layout, access, frac, k,
                           DEFAULT_CONFIG, f"{model}_fused_topk_filter", path="filter"))
        # the bitset tiles compacted in the kernel (prediction: 10 % eligible in ~0.15 of the full
        # pool's time, was 0.93 at 0a826c3 when every warp ran the gate for its few eligible ads)
        add(_fused_row(env, ceil, args, tables, rng, "gated", "fp16", 64, 6, 2, "tiles", "bitset", 0.1, K1000,
                       DEFAULT_CONFIG, "gated_fused_topk"))
        for model, E, K in (("gated", 6, 2), ("dot", 1, 1)):
            add(_scores_row(env, ceil, args, tables, rng, model, "fp16", 64, E, K, "tiles", DEFAULT_CONFIG,
                            f"{model}_scores_to_memory"))
        add(_fused_row(env, ceil, args, tables, rng, "gated", "fp16", 64, 6, 2, "tiles", "pool", 1.0, K1000,
                       DEFAULT_CONFIG, "gated_fused_topk"))
    if "weights" in phases:  # where the per-ad loop reads the request weights from (not in the default set)
        # prediction: the gated kernel issues 128 sixteen-byte shared loads per ad; if the shared
        # pipe is what holds it at 0.51 of the ceiling, reading gamma, beta and G from the constant
        # bank (weights="param", ~110 uniform loads instead) lifts it toward ~25 G ads/s; if
        # instruction issue is the limit, nothing changes. Dropping the per-ad fence (guard=
        # "offset"): +5-10 % if the fence stalls the warp.
        for model, dtype, d, E, K in (("gated", "fp16", 64, 6, 2), ("dot", "fp16", 64, 1, 1),
                                      ("dot", "int8", 64, 1, 1), ("dot", "int8", 128, 1, 1)):
            cfgs = [KernelConfig(weights="shared", max_registers=128),
                    KernelConfig(weights="shared", max_registers=128, guard="offset"),
                    KernelConfig(weights="param", max_registers=128)]
            if model == "gated":
                cfgs += [KernelConfig(weights="param", max_registers=None), KernelConfig(weights="param", max_registers=96),
                         KernelConfig(weights="param", max_registers=80),
                         KernelConfig(weights="param", block=128, max_registers=128),
                         KernelConfig(weights="shared", guard="offset", max_registers=None)]
            for cfg in cfgs:
                add(_scores_row(env, ceil, args, tables, rng, model, dtype, d, E, K, "tiles", cfg,
                                f"{model}_scores_to_memory"))
    if "tensor" in phases:  # the gate and value dots on the tensor cores (not in the default set)
        # prediction: 742 SASS instructions per 32 ads in the loop (96 HMMA) against 1,213 for the
        # CUDA-core kernel with weights in kernel parameters (20.5 G ads/s at 95363e3, issue-bound);
        # issue alone would allow ~45 G ads/s, so the kernel turns memory-bound: 27-30 G ads/s
        # (0.8-0.9 of the read ceiling), unless the tensor pipe (96 mma per 32 ads) holds it back
        tc = KernelConfig(tensor_cores=True, max_registers=128)
        for cfg in (tc, KernelConfig(tensor_cores=True, max_registers=None),
                    KernelConfig(tensor_cores=True, max_registers=96),
                    KernelConfig(tensor_cores=True, guard="offset", max_registers=128),
                    KernelConfig(weights="param", max_registers=96)):
            add(_scores_row(env, ceil, args, tables, rng, "gated", "fp16", 64, 6, 2, "tiles", cfg,
                            "gated_scores_to_memory"))
        add(_scores_row(env, ceil, args, tables, rng, "dot", "fp16", 64, 1, 1, "tiles",
                        KernelConfig(weights="param", max_registers=128), "dot_scores_to_memory"))
        for dtype, d, E, K, layout in (("fp16", 64, 6, 2, "rows"), ("bf16", 64, 6, 2, "tiles"),
                                       ("fp16", 64, 8, 4, "tiles"), ("fp16", 128, 6, 2, "tiles"),
                                       ("fp16", 32, 6, 2, "tiles")):
            add(_scores_row(env, ceil, args, tables, rng, "gated", dtype, d, E, K, layout, tc, "gated_scores_to_memory"))
        for access, frac, k, path, variant in (("pool", 1.0, 1000, "filter", "gated_fused_topk_filter"),
                                               ("pool", 1.0, 4096, "filter", "gated_fused_topk_filter"),
                                               ("pool", 1.0, 1000, "block", "gated_fused_topk"),
                                               ("bitset", 0.1, 1000, "filter", "gated_fused_topk_filter")):
            add(_fused_row(env, ceil, args, tables, rng, "gated", "fp16", 64, 6, 2, "tiles", access, frac, k, tc,
                           variant, path=path))
    if "defaults" in phases:  # the default configuration ("auto" weights and registers), headline cases
        # prediction: gated scores to memory and the filter path ~20.5 G ads/s (the param, 96-register
        # kernel of the "weights" phase; was 17.0-17.1); dot unchanged; int8 dot a few % faster
        # (its row scale now multiplies the sum once, 64 fewer FMULs per ad)
        auto = KernelConfig()
        for model, dtype, d, E, K in (("gated", "fp16", 64, 6, 2), ("dot", "fp16", 64, 1, 1), ("dot", "int8", 64, 1, 1),
                                      ("dot", "fp16", 128, 1, 1), ("dot", "int8", 128, 1, 1)):
            add(_scores_row(env, ceil, args, tables, rng, model, dtype, d, E, K, "tiles", auto,
                            f"{model}_scores_to_memory"))
            add(_fused_row(env, ceil, args, tables, rng, model, dtype, d, E, K, "tiles", "pool", 1.0, K1000, auto,
                           f"{model}_fused_topk_filter", path="filter"))
        for layout, access, frac, k, path, variant in (
                ("tiles", "pool", 1.0, 4096, "filter", "gated_fused_topk_filter"),
                ("tiles", "pool", 1.0, K1000, "block", "gated_fused_topk"),
                ("tiles", "bitset", 0.1, K1000, "filter", "gated_fused_topk_filter"),
                ("rows", "bitset", 0.1, K1000, "filter", "gated_fused_topk_filter")):
            add(_fused_row(env, ceil, args, tables, rng, "gated", "fp16", 64, 6, 2, layout, access, frac, k, auto,
                           variant, path=path))
    if "bitset_sweep" in phases:  # the 10 % eligible bitset on rows: launch shapes (not in the default set)
        # prediction: the rows layout's 10 % bitset filter path took 0.27 of the fastest full-pool
        # pass (7.5 G eligible ads/s, 1.33 ms, against 20.3 G, 76c2e8a; target 0.25: ~8 % short).
        # Its compacted tiles gather scattered rows, so loads in flight decide: more resident warps
        # (a lower register cap, smaller blocks, more blocks an SM) should help by up to ~10 %;
        # the full-pool reference is timed in the same run
        add(_fused_row(env, ceil, args, tables, rng, "gated", "fp16", 64, 6, 2, "tiles", "pool", 1.0, K1000,
                       KernelConfig(), "gated_fused_topk_filter", path="filter"))
        for cfg in (KernelConfig(), KernelConfig(max_registers=80), KernelConfig(max_registers=64),
                    KernelConfig(block=128), KernelConfig(block=512), KernelConfig(blocks_per_sm=8),
                    KernelConfig(blocks_per_sm=8, max_registers=80), KernelConfig(weights="shared")):
            add(_fused_row(env, ceil, args, tables, rng, "gated", "fp16", 64, 6, 2, "rows", "bitset", 0.1, K1000, cfg,
                           "gated_fused_topk_filter", path="filter"))
    if "int8" in phases:  # int8 rows widened by PRMT + FADD instead of I2F (not in the default set)
        # prediction (commit after 37e5b94): I2F runs at 16 / clock / SM, so 64 of them an ad held
        # int8 d = 64 near 6.5e10 ads/s (measured 5.37e10 scores to memory, 0.90; 5.10e10 filter,
        # 0.81); without them the int8 kernels turn memory-bound like fp16: ~0.92 of the ceiling,
        # int8 / fp16 dot ~1.79 at d = 64 (the byte ratio 136 / 76) and ~1.85 at d = 128
        auto = KernelConfig()
        for model, dtype, d, E, K in (("dot", "fp16", 64, 1, 1), ("dot", "int8", 64, 1, 1), ("dot", "fp16", 128, 1, 1),
                                      ("dot", "int8", 128, 1, 1), ("gated", "int8", 64, 6, 2), ("gated", "fp16", 64, 6, 2)):
            add(_scores_row(env, ceil, args, tables, rng, model, dtype, d, E, K, "tiles", auto,
                            f"{model}_scores_to_memory"))
            if model == "dot":
                add(_fused_row(env, ceil, args, tables, rng, model, dtype, d, E, K, "tiles", "pool", 1.0, K1000, auto,
                               f"{model}_fused_topk_filter", path="filter"))
    if "bitset_auto" in phases:  # the compacted bitset paths after the "auto" fix (short run)
        for layout in ("tiles", "rows"):
            add(_fused_row(env, ceil, args, tables, rng, "gated", "fp16", 64, 6, 2, layout, "bitset", 0.1, K1000,
                           KernelConfig(), "gated_fused_topk_filter", path="filter"))
    if "unfused" in phases:
        rows += _unfused_rows(env, ceil, args, tables, rng)
    if "dtype" in phases:
        for dtype in ("fp32", "bf16", "int8"):
            for model, E, K in (("gated", 6, 2), ("dot", 1, 1)):
                add(_fused_row(env, ceil, args, tables, rng, model, dtype, 64, E, K, "tiles", "pool", 1.0, K1000,
                               DEFAULT_CONFIG, f"{model}_fused_topk"))
    if "sweep" in phases:
        grid = {64: [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (6, 1), (6, 2), (6, 4), (8, 1), (8, 2), (8, 4)],
                32: [(1, 1), (6, 2), (8, 4)], 128: [(1, 1), (6, 2), (8, 4)]}
        for d, eks in grid.items():
            add(_fused_row(env, ceil, args, tables, rng, "dot", "fp16", d, 1, 1, "tiles", "pool", 1.0, K1000,
                           DEFAULT_CONFIG, "dot_fused_topk"))
            for E, K in eks:
                if (d, E, K) == (64, 6, 2) and "design" in phases:
                    continue
                add(_fused_row(env, ceil, args, tables, rng, "gated", "fp16", d, E, K, "tiles", "pool", 1.0, K1000,
                               DEFAULT_CONFIG, "gated_fused_topk"))
    if "sweep_dtypes" in phases:
        for dtype in ("fp32", "bf16", "int8"):
            for d, eks in {64: [(1, 1), (2, 1), (2, 2), (4, 2), (6, 2), (8, 2), (8, 4)], 32: [(1, 1), (6, 2), (8, 4)],
                           128: [(1, 1), (6, 2), (8, 4)]}.items():
                add(_fused_row(env, ceil, args, tables, rng, "dot", dtype, d, 1, 1, "tiles", "pool", 1.0, K1000,
                               DEFAULT_CONFIG, "dot_fused_topk"))
                for E, K in eks:
                    add(_fused_row(env, ceil, args, tables, rng, "gated", dtype, d, E, K, "tiles", "pool", 1.0, K1000,
                                   DEFAULT_CONFIG, "gated_fused_topk"))
    if "dense" in phases:  # the dense mixture of issue 6 (every expert's value dot product, K = E)
        add(_fused_row(env, ceil, args, tables, rng, "gated", "fp16", 64, 6, 6, "tiles", "pool", 1.0, K1000,
                       DEFAULT_CONFIG, "gated_fused_topk"))
    if "access" in phases:
        for layout in ("rows", "tiles"):
            for access, frac in (("bitset", 0.5), ("bitset", 0.1), ("bitset", 0.01), ("candidates", 0.1),
                                 ("candidates", 0.01)):
                add(_fused_row(env, ceil, args, tables, rng, "gated", "fp16", 64, 6, 2, layout, access, frac, K1000,
                               DEFAULT_CONFIG, "gated_fused_topk"))
        rows += _prefusion_access_rows(env, ceil, args, tables, rng)
    tables.table = None
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()
    return rows


def topk_stages(d_scores, n: int, k: int, *, config=None):
    """The stages of one seeded :func:`andromeda_nb.topk.api.launch_topk` call as separately launchable
    steps, each on the inputs the earlier ones leave in place: ``(stages, ws, fws, sws)`` with
    ``stages`` a list of ``(name, enqueue_fn, note, result workspace or None)``; the last, ``all``,
    is the whole call (the default "filter" path). The "scan" path's stages (scan, merge) follow
    the filter path's (filter, final). Stages that append to a buffer run the counters' reset (a
    1-block kernel) first, so repeats start from the same state. Needs ``n`` large enough to be
    seeded under ``config`` (a :class:`~andromeda_nb.topk.config.TopKConfig`, default the measured one)."""
    from ..topk.block import next_pow2
    from ..topk.config import radix_block
    from ..topk.filter import FilterWorkspace, launch_filter
    from ..topk.final import launch_final
    from ..topk.final_kernels import final_radix_kernel
    from ..topk.scan import TopKWorkspace, launch_merge_lists, launch_scan, scan_lists
    from ..topk.seed import SeedWorkspace, launch_seed
    from ..topk.single import launch_topk

    offsets, ks = np.array([0, n], np.int64), np.array([k], np.int64)
    ws = TopKWorkspace(offsets, ks, scan_lists(offsets, ks, seeded=True))
    fws = FilterWorkspace(n, k, config=config)
    sws = SeedWorkspace.make(n, k, config=config)
    if sws is None:
        raise ValueError(f"n = {n}, k = {k} is not seeded (see SeedWorkspace.make)")
    block = launch.default_block()

    def reset_merge(w, final=None):
        def fn():
            w.reset()
            launch_merge_lists(w, final=final)
        return fn

    def reset_filter():
        fws.reset()
        launch_filter(d_scores, fws, sws.seed(), block=block, config=config)

    stages = [
        ("seed", lambda: launch_seed(d_scores, n, sws),
         f"the r = {sws.r}-th best of a {sws.m}-score sample to 24 key bits (one launch)", None),
        ("filter", reset_filter, "counter reset + one pass keeping the scores at or above the seed", None),
        ("final", lambda: launch_final(k, fws, config=config),
         "the filter's buffer ranked by counting over many blocks (the radix select launch after it idle when "
         "that answered)", fws),
        ("final_radix", lambda: final_radix_kernel(max(2, next_pow2(k)), radix_block(), False)[(1, 1), radix_block()](
            fws.buf_s, fws.buf_i, fws.fill, fws.offsets, launch.dummy(np.int64), fws.ks, fws.out_s, fws.out_slot,
            fws.out_id), "one block's radix select of the filter's buffer (the final above SORT_CAP candidates)", fws),
        ("scan", lambda: launch_scan(d_scores, ws, seeds=sws.seed()),
         f"scan path: counter reset + scan, {ws.lists} block lists over {n} scores", None),
        ("merge", reset_merge(ws, "offer"), "scan path: counter reset, bound, select, final (offer: block top-K "
                                             "over the buffer)", ws),
        ("merge_radix", reset_merge(ws, "radix"), "scan path: counter reset, bound, select, final by radix select",
         ws),
        ("all", lambda: launch_topk(d_scores, n, k, seeded=True, ws=ws, sws=sws, fws=fws, path="filter", config=config),
         "the whole seeded call (filter path)", fws),
    ]
    return stages, ws, fws, sws


def _topk_stage_rows(env, ceil, args, n: int, k: int) -> list[dict]:
    """Where one small request's seeded top-K spends its device time: each stage of
    :func:`topk_stages` timed alone (CUDA events behind the busy kernel)."""
    import cupy as cp

    cuda = launch.cuda()
    scores = cp.random.RandomState(n + k).standard_normal(n, dtype=cp.float32)
    stages, ws, fws, sws = topk_stages(cuda.as_cuda_array(scores), n, k)
    for _, fn, _, _ in stages:  # in order, once: every stage's inputs in place
        fn()
    cuda.synchronize()
    rows = []
    kept = int(fws.fill.copy_to_host()[0])
    # bytes a score each stage reads: the seed its sample, the finals the kept scores (8 B each), the
    # merge the block lists; the passes over the scores 4
    moved = {"seed": 4.0 * sws.m / n, "final": 8.0 * kept / n, "final_radix": 8.0 * kept / n,
             "merge": 8.0 * ws.lists * k / n, "merge_radix": 8.0 * ws.lists * k / n}
    for name, fn, note, res in stages:
        verified = "n/a (stage timing; the 'all' row is verified)"
        if res is not None:  # these write the answer: check it
            fn()
            cuda.synchronize()
            verified = str(verify_topk_torch(res.out_id[0], res.out_s[0], scores, k))
        timing = harness.time_device(fn, reps=args.reps)
        note = note + ("; bytes_per_item: what the stage reads a score" if name in moved else "")
        r = harness.row("topk", env, ceil, timing, n, moved.get(name, 4.0), None, verified,
                      variant=f"block_topk_stage_{name}", n_ads=n, k=k, batch=1, dtype="fp32", access="random",
                      notes=(f"{4 * n / 1e6:.0f} MB: L2-resident; " if 4 * n < 25e6 else
                             f"{4 * n / 1e6:.0f} MB: beyond the 50 MB L2; ") + note)
        rows.append(r)
        harness.print_rows([r])
    c = fws.counts.copy_to_host()[0]
    rows[-1]["notes"] += (f"; {int(c[1])} scores reached the seed (filter buffer {fws.cap}); "
                          f"{int(ws.fill.copy_to_host()[0])} candidates reached the scan path's final step")
    return rows


def _topk_one_request_batch_path(add, env, ceil, args, n: int, k: int, rounds: int | None = None,
                                 wall: bool = False) -> None:
    """One request through the batched seeded path (a batch of one): its seed is one block's 4,096-
    score sample (the single-request seed samples 12,800 at n = 500,000 over 4 blocks and a last-
    block merge, 18 us alone), then the same filter pass and rank final. A candidate for the small
    request's path; its row says whether the answer was exact without a rerun. ``rounds``: the
    filter's rounds a block (default TopKTuning.batch_filter_rounds); ``wall``: also the host wall time of
    ``topk_scores`` on the device scores (it takes this path: allocation, three launches, copies)."""
    import time

    import cupy as cp

    from ..topk.api import DEFAULT_CONFIG, FilterWorkspace, topk_scores
    from ..topk.batched import batch_outcomes, launch_topk_batch_seeded

    cuda = launch.cuda()
    scores = cp.random.RandomState(n + k).standard_normal(n, dtype=cp.float32)
    d_scores = cuda.as_cuda_array(scores)
    fws = FilterWorkspace.batched(np.array([0, n], np.int64), np.array([k], np.int64))
    call = lambda: launch_topk_batch_seeded(d_scores, fws, rounds=rounds)  # noqa: E731
    call()
    outcome = batch_outcomes(fws)[0]
    verified = verify_topk_torch(fws.out_id[0], fws.out_s[0], scores, k)
    if outcome != "exact":
        verified = checks.Check(False, f"not exact on the batched path ({outcome}): topk_batch would rerun it")
    timing = harness.time_device(call, reps=args.reps)
    kept = int(fws.counts.copy_to_host()[0, 1])
    note = ""
    if wall:
        walls = []
        for _ in range(20):
            t0 = time.perf_counter()
            topk_scores(d_scores, k)
            walls.append(time.perf_counter() - t0)
        note = f"; topk_scores on device scores: {np.median(walls[5:]) * 1e6:.0f} us host wall time a call (median of 15)"
    add(harness.row("topk", env, ceil, timing, n, 4.0, None, str(verified), variant="block_topk_seeded_batch_path" + (f"_rounds{rounds}" if rounds else ""),
                  n_ads=n, k=k, batch=1, dtype="fp32", access="random",
                  notes=f"{4 * n / 1e6:.0f} MB: L2-resident; the batched path on one request: a one-block seed, "
                        f"{kept} scores kept (buffer {fws.cap}); filter "
                        f"{rounds or DEFAULT_CONFIG.tuning.batch_filter_rounds} rounds a block" + note))


def _topk_one_request_onelaunch(add, env, ceil, args, n: int, k: int, warp_sync: bool = False) -> None:
    """One request through the one-launch path (:func:`~andromeda_nb.topk.onelaunch.launch_onelaunch`: every
    block seeds from the same 8,192-score sample, filters its 8,192 scores, the last block sorts
    the kept ones), device time with the workspace preallocated. Not topk_scores's route: on the
    H200 the last block's sort of ~1,000 / ~3,000 kept scores alone took 15 / 44 us
    (data/results/topk_diagnostics.md)."""
    import cupy as cp

    from ..topk.api import TopKConfig, seeded_outcome
    from ..topk.onelaunch import OneLaunchWorkspace, launch_onelaunch

    cuda = launch.cuda()
    scores = cp.random.RandomState(n + k).standard_normal(n, dtype=cp.float32)
    d_scores = cuda.as_cuda_array(scores)
    olw = OneLaunchWorkspace.make(n, k)
    config = TopKConfig(onelaunch_warp_sync=warp_sync)
    call = lambda: launch_onelaunch(d_scores, n, k, olw, config=config)  # noqa: E731
    call()
    c = olw.counts.copy_to_host()[0]
    outcome = seeded_outcome(olw, k, c)
    verified = verify_topk_torch(olw.out_id[0], olw.out_s[0], scores, k)
    if outcome != "exact":
        verified = checks.Check(False, f"not exact in one launch ({outcome}): a caller would rerun it")
    timing = harness.time_device(call, reps=args.reps)
    add(harness.row("topk", env, ceil, timing, n, 4.0, None, str(verified),
                  variant="block_topk_onelaunch" + ("_warp_sync" if warp_sync else ""),
                  n_ads=n, k=k, batch=1, dtype="fp32", access="random",
                  notes=f"{4 * n / 1e6:.0f} MB: L2-resident, as right after scoring; one launch "
                        f"({-(-n // 8192)} blocks of 1,024 threads); sample rank {olw.r} of {olw.m}, "
                        f"{int(c[1])} scores kept (sort cap {olw.cap})"))


def _topk_batch_rows(env, ceil, args, batch: int = 1024, per: int = 50_000, k: int = 100) -> list[dict]:
    """The batched top-K (``batch`` requests of ``per`` scores, top-``k`` each): the seeded path
    (:func:`andromeda_nb.topk.batched.launch_topk_batch_seeded`) whole and stage by stage, the unseeded
    block top-K (its fallback), and torch.topk(dim=1) on the same scores. The seeded row is verified
    only when every request's answer was exact (no request needed a rerun) and equals torch's.

    Prediction for the seed by the threads' best keys (commit after 019d815, rank 21 <= 128 / 4):
    the seed stage 19 us -> ~8 us, the whole call 109 us -> ~100 us (0.45 of the ceiling); the
    filter keeps a few more scores (the seed is a looser lower bound), the sort final as before."""
    import cupy as cp
    import torch

    from ..topk.api import DEFAULT_CONFIG, FilterWorkspace, TopKConfig, TopKWorkspace
    from ..topk.batched import batch_outcomes, batch_seed_shape, launch_topk_batch_seeded
    from ..topk.filter import launch_filter
    from ..topk.final import launch_final
    from ..topk.scan import launch_topk_batch, scan_lists
    from ..topk.seed_kernels import BATCH_SAMPLE_CHUNK, batch_seed_kernel

    cuda = launch.cuda()
    rows = []

    def add(r):
        rows.append(r)
        harness.print_rows([r])

    scores = cp.random.RandomState(7).standard_normal(batch * per, dtype=cp.float32)
    offsets = np.arange(batch + 1, dtype=np.int64) * per
    ks = np.full(batch, k, np.int64)
    d_scores = cuda.as_cuda_array(scores)
    t = torch.as_tensor(scores, device="cuda").view(batch, per)
    want = torch.topk(t, k, dim=1).values.cpu().numpy()
    fields = dict(n_ads=per, k=k, batch=batch, dtype="fp32", access="random")

    def values_check(out_s, what):
        ok = np.array_equal(out_s.copy_to_host(), want)
        return checks.Check(ok, f"{batch} requests' top-{k} values equal torch.topk(dim=1){what}" if ok else
                            f"batched values differ from torch.topk{what}")

    fws = FilterWorkspace.batched(offsets, ks)
    call = lambda: launch_topk_batch_seeded(d_scores, fws)  # noqa: E731
    call()
    outcomes = batch_outcomes(fws)
    kept = fws.counts.copy_to_host()[:, 1]
    verified = values_check(fws.out_s, "")
    if (outcomes != "exact").any():
        verified = checks.Check(False, f"{int((outcomes != 'exact').sum())} requests not exact on the seeded path "
                                       f"(topk_batch would rerun them)")
    timing = harness.time_device(call, reps=args.reps)
    blk, per_thread = batch_seed_shape()
    add(harness.row("topk", env, ceil, timing, batch * per, 4.0, None, str(verified),
                  variant="block_topk_batched_seeded", **fields,
                  notes=f"seed ({blk * per_thread} samples a request), filter, sort final: 3 launches; kept scores a "
                        f"request: median {int(np.median(kept))}, max {int(kept.max())} (buffer {fws.cap})"))
    seed_kern = batch_seed_kernel(blk, per_thread, BATCH_SAMPLE_CHUNK, False, int(2 * DEFAULT_CONFIG.tuning.seed_margin),
                                  DEFAULT_CONFIG.tuning.seed_min_rank)
    samples = min(per, blk * per_thread)
    kept_bytes = float(kept.mean()) * 8 + k * (4 + 4 + 16)  # kept (score, slot); out scores read + 3 outputs
    # bytes a score each stage moves: the seed reads its sample, the final the kept scores and writes k
    stages = [
        ("seed", lambda: seed_kern[batch, blk](d_scores, fws.offsets, fws.ks, launch.dummy2d(np.uint64), fws.seeds,
                                              fws.counts, fws.fill),
         4.0 * samples / per, f"a block a request: the seed from a {samples}-score sample, counters zeroed"),
        ("filter", lambda: (fws.reset(), launch_filter(d_scores, fws, fws.seeds)), 4.0,
         "counter reset + the filter pass over the batch"),
        ("final", lambda: launch_final(k, fws, d_scores=d_scores), kept_bytes / per,
         "a block a request sorts its kept scores"),
        # prediction (commit after 28169f9): steps of stride <= 32 (39 of the 45 steps of a 512-entry
        # sort) end with a warp barrier instead of a block barrier: the sort 28 us -> ~20 us
        ("final_warp_sync", lambda: launch_final(k, fws, d_scores=d_scores, config=TopKConfig(sort_warp_sync=True)),
         kept_bytes / per, "the same sort, its steps of stride <= 32 ending with warp barriers"),
    ]
    for name, fn, bytes_per_score, note in stages:  # in order: each stage's inputs in place
        fn()
        timing = harness.time_device(fn, reps=args.reps)
        verified = (values_check(fws.out_s, " (after the stage)") if name.startswith("final")
                    else "n/a (stage timing)")
        add(harness.row("topk", env, ceil, timing, batch * per, bytes_per_score, None, str(verified),
                      variant=f"block_topk_batched_seeded_stage_{name}", **fields,
                      notes=f"{note}; bytes_per_item: what the stage moves a score"))
    ws = TopKWorkspace(offsets, ks, scan_lists(offsets, ks))
    timing = harness.time_device(lambda: launch_topk_batch(d_scores, ws), reps=args.reps)
    add(harness.row("topk", env, ceil, timing, batch * per, 4.0, None, str(values_check(ws.out_s, "")),
                  variant="block_topk_batched", **fields, notes="unseeded block top-K lists + merge (the fallback)"))
    timing = harness.time_device(lambda: torch.topk(t, k, dim=1), reps=args.reps)
    add(harness.row("topk", env, ceil, timing, batch * per, 4.0, None, "baseline", variant="torch.topk", **fields))
    del t, scores
    cp.get_default_memory_pool().free_all_blocks()
    return rows


def _unfused_rows(env, ceil, args, tables, rng) -> list[dict]:
    import cupy as cp

    from ..score.table import DeviceRequest
    from ..score.unfused import (PerOpBuffers, PreFusionBuffers, launch_per_op, launch_pre_fusion, per_op_bytes_per_ad,
                          pre_fusion_bytes_per_ad)
    from ..topk.api import TopKWorkspace, scan_lists

    rows = []
    d, E, K, k, dtype = 64, 6, 2, 1000, "fp16"
    table = tables.get(dtype, d, "tiles")
    n = table.n_ads
    req = Request.random(d, E, K, rng)
    dreq = DeviceRequest.of(req)
    offsets, ks = np.array([0, n], np.int64), np.array([k], np.int64)
    ws = TopKWorkspace(offsets, ks, scan_lists(offsets, ks))
    bufs = PerOpBuffers(n, d, E, K)
    cand = launch.cuda().as_cuda_array(cp.arange(n, dtype=cp.int32))  # every ad, as a candidate list
    for access, listed, note in (("pool", None, ""), ("candidates", cand, "every ad as a candidate list; ")):
        timing = harness.time_device(lambda: launch_per_op(dreq, table, k, bufs, ws=ws, cand=listed), reps=args.reps)
        verified = verify_topk_torch(ws.out_id[0], ws.out_s[0], bufs.score, k)
        budget = per_op_bytes_per_ad(d, E, K, dtype, access)
        rows.append(harness.row("scoring", env, ceil, timing, n, sum(budget.values()), model_flops("gated", d, E, K),
                              str(verified), variant="unfused_per_op", n_ads=n, d=d, dtype=dtype, experts=E,
                              k_experts=K, access=access, eligible_fraction=1.0, k=k, layout="tiles",
                              notes=note + "intermediates fp32 in device memory; bytes/ad " +
                                    ", ".join(f"{a} {b:g}" for a, b in budget.items())))
        harness.print_rows(rows[-1:])
    del bufs
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()
    pbufs = PreFusionBuffers(n, d, dtype)
    timing = harness.time_device(lambda: launch_pre_fusion(dreq, table, k, pbufs, n, cand=cand, ws=ws),
                               reps=args.reps)
    full = _scores_full(dreq, table, "pool", None, None, n, None)
    verified = verify_topk_torch(ws.out_id[0], ws.out_s[0], full, k)
    budget = pre_fusion_bytes_per_ad(d, dtype, "candidates")
    rows.append(harness.row("scoring", env, ceil, timing, n, sum(budget.values()), model_flops("gated", d, E, K),
                          str(verified), variant="unfused_pre_fusion", n_ads=n, d=d, dtype=dtype, experts=E,
                          k_experts=K, access="candidates", eligible_fraction=1.0, k=k, layout="tiles",
                          notes="gather rows to a contiguous buffer, score to memory, then top-K; bytes/ad " +
                                ", ".join(f"{a} {b:g}" for a, b in budget.items())))
    harness.print_rows(rows[-1:])
    del pbufs, full, cand
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()
    return rows


def _prefusion_access_rows(env, ceil, args, tables, rng) -> list[dict]:
    import cupy as cp

    from ..score.table import DeviceRequest
    from ..topk.api import TopKWorkspace, scan_lists
    from ..score.unfused import (PerOpBuffers, PreFusionBuffers, launch_per_op, launch_pre_fusion, per_op_bytes_per_ad,
                          pre_fusion_bytes_per_ad)

    rows = []
    d, E, K, k, dtype = 64, 6, 2, 1000, "fp16"
    table = tables.get(dtype, d, "rows")
    n = table.n_ads
    dreq = DeviceRequest.of(Request.random(d, E, K, rng))
    for frac in (0.1, 0.01):
        elig, _, items, _, mask = _access_inputs(n, "bitset", frac, seed=int(frac * 1e4) + 1)
        offsets, ks = np.array([0, items], np.int64), np.array([k], np.int64)
        ws = TopKWorkspace(offsets, ks, scan_lists(offsets, ks))
        bufs = PreFusionBuffers(items, d, dtype)
        timing = harness.time_device(lambda: launch_pre_fusion(dreq, table, k, bufs, items, elig=elig, ws=ws),
                                   reps=args.reps)
        full = _scores_full(dreq, table, "bitset", elig, None, n, None)
        verified = verify_topk_torch(ws.out_id[0], ws.out_s[0], full, k, eligible_mask=mask)
        budget = pre_fusion_bytes_per_ad(d, dtype, "bitset", frac)
        rows.append(harness.row("scoring", env, ceil, timing, items, sum(budget.values()), model_flops("gated", d, E, K),
                              str(verified), variant="unfused_pre_fusion", n_ads=n, d=d, dtype=dtype, experts=E,
                              k_experts=K, access="bitset", eligible_fraction=frac, k=k, layout="rows",
                              notes="bitset -> slot list, gather rows, score to memory, top-K; bytes/ad " +
                                    ", ".join(f"{a} {b:.3g}" for a, b in budget.items())))
        harness.print_rows(rows[-1:])
        del bufs
        gc.collect()
        cp.get_default_memory_pool().free_all_blocks()
        obufs = PerOpBuffers(items, d, E, K)
        timing = harness.time_device(lambda: launch_per_op(dreq, table, k, obufs, ws=ws, elig=elig, m=items),
                                   reps=args.reps)
        verified = verify_topk_torch(ws.out_id[0], ws.out_s[0], full, k, eligible_mask=mask)
        budget = per_op_bytes_per_ad(d, E, K, dtype, "bitset", frac)
        rows.append(harness.row("scoring", env, ceil, timing, items, sum(budget.values()), model_flops("gated", d, E, K),
                              str(verified), variant="unfused_per_op", n_ads=n, d=d, dtype=dtype, experts=E,
                              k_experts=K, access="bitset", eligible_fraction=frac, k=k, layout="rows",
                              notes="bitset -> slot list, one kernel per model step (fp32 intermediates), top-K; "
                                    "bytes/ad " + ", ".join(f"{a} {b:.3g}" for a, b in budget.items())))
        harness.print_rows(rows[-1:])
        del obufs, full, ws
        gc.collect()
        cp.get_default_memory_pool().free_all_blocks()
    return rows


# ----------------------------------------------------------------------------- top-K suite

def topk(env, ceil, args) -> list[dict]:
    """Standalone block top-K against torch.topk (and cupy) on the same scores.

    Phases (``--phases``, comma-separated; default: all but ``stages_large``): ``large`` (10^8
    scores, k = 100 / 1000 / 2048 / 4096, random and ascending, seeded and not), ``small`` (one
    request of 500,000, k = 1000),
    ``stages`` (the small request's device time per stage), ``batch`` (1,024 x 50,000, k = 100),
    ``elig`` (10^8 scores with an eligible bitset of 50 % / 10 %, seeded and not), ``nsweep`` (10^5,
    10^6 and 10^7 scores, k = 1000, with torch.topk and cupy.argpartition); and ``stages_large`` (the
    stages of 10^8 scores, k = 1000).
    """
    import cupy as cp
    import torch

    from ..topk.api import (BLOCK_TOPK_MAX_K, FilterWorkspace, SeedWorkspace, TopKWorkspace, launch_topk,
                       scan_lists, seeded_outcome)

    rows = []
    phases = set((args.phases or "large,elig,small,stages,batch,nsweep").split(","))
    cuda = launch.cuda()

    def add(r):
        rows.append(r)
        harness.print_rows([r])

    def block_topk_row(scores, n, k, seeded, suffix="", elig=None, mask=None, path=None, **fields):
        """Time one block top-K call (seeded or not, by ``path`` or the default seeded path,
        optionally on an eligible bitset),
        check it against torch.topk and add its row."""
        d_scores = cuda.as_cuda_array(scores)
        offsets, ks = np.array([0, n], np.int64), np.array([k], np.int64)
        sws = SeedWorkspace.make(n, k) if seeded else None
        # above the block top-K's k limit only the filter path runs (no block top-K workspace)
        ws = (TopKWorkspace(offsets, ks, scan_lists(offsets, ks, seeded=sws is not None))
              if k <= BLOCK_TOPK_MAX_K else None)
        fws = FilterWorkspace(n, k) if sws is not None else None
        def call():
            return launch_topk(d_scores, n, k, elig=elig, seeded=seeded, ws=ws, sws=sws, fws=fws, path=path)

        res, _ = call()
        timing = harness.time_device(call, reps=args.reps)
        c = res.counts.copy_to_host()[0]
        verified = verify_topk_torch(res.out_id[0], res.out_s[0], scores, k, eligible_mask=mask)
        outcome = "exact" if sws is None else seeded_outcome(res, k, c)
        if outcome != "exact":
            rerun = ("unseeded (seed above the k-th score)" if outcome == "seed_high" else
                     "on the scan path (filter buffer overflow)" if k <= BLOCK_TOPK_MAX_K else
                     "as one pass keeping every score (k above the block top-K's limit)")
            verified = checks.Check(False, f"seeded run not exact ({c[1]} scores reached the seed): topk_scores "
                                           f"would rerun {rerun}")
        path = "" if sws is None else ("_scan_path" if isinstance(res, TopKWorkspace) else "")
        variant = ("block_topk_seeded" if sws is not None else "block_topk") + path + suffix
        add(harness.row("topk", env, ceil, timing, n, 4.0 if elig is None else 4.0 + 1 / 8, None, str(verified),
                      variant=variant, n_ads=n, k=k, batch=1, dtype="fp32", **fields))

    def one(n, k, order, seeded, l2_note="", suffix="", path=None):
        if order == "ascending":
            scores = cp.arange(n, dtype=cp.float32) / n
        else:
            scores = cp.random.RandomState(n + k).standard_normal(n, dtype=cp.float32)
        block_topk_row(scores, n, k, seeded, suffix, path=path, access=order, notes=l2_note)
        t = torch.as_tensor(scores, device="cuda")
        timing = harness.time_device(lambda: torch.topk(t, k), reps=args.reps)
        add(harness.row("topk", env, ceil, timing, n, 4.0, None, "baseline (values checked above)", variant="torch.topk",
                      n_ads=n, k=k, batch=1, dtype="fp32", access=order, notes=l2_note))
        return scores, t

    if "large" in phases:
        for k in (100, 1000, 2048, 4096):  # 4096: the filter path only (above BLOCK_TOPK_MAX_K)
            scores, t = one(100_000_000, k, "random", True)
            if k == 1000:  # the seeded block top-K lists + merge, for comparison
                block_topk_row(scores, 100_000_000, k, True, path="scan", access="random",
                               notes="seeded scan + merge path")
                one(100_000_000, k, "random", False)
                timing = harness.time_device(lambda: cp.argpartition(scores, scores.size - k)[-k:], reps=args.reps)
                add(harness.row("topk", env, ceil, timing, scores.size, 4.0, None, "baseline (unsorted top-k indices)",
                              variant="cupy.argpartition", n_ads=scores.size, k=k, batch=1, dtype="fp32", access="random"))
            del scores, t
            cp.get_default_memory_pool().free_all_blocks()
        for seeded in (True, False):
            scores, t = one(100_000_000, 1000, "ascending", seeded)
            del scores, t
            cp.get_default_memory_pool().free_all_blocks()
    if "nsweep" in phases:  # throughput and latency against n at k = 1000 (10^8 is in "large")
        for n in (100_000, 1_000_000, 10_000_000):
            note = "scores fit in L2 (n x 4 B < 50 MB): warm after the first run" if n * 4 < 50e6 else ""
            scores, t = one(n, 1000, "random", True, l2_note=note)
            timing = harness.time_device(lambda: cp.argpartition(scores, scores.size - 1000)[-1000:], reps=args.reps)
            add(harness.row("topk", env, ceil, timing, n, 4.0, None, "baseline (unsorted top-k indices)",
                          variant="cupy.argpartition", n_ads=n, k=1000, batch=1, dtype="fp32", access="random",
                          notes=note))
            del scores, t
            cp.get_default_memory_pool().free_all_blocks()
    if "elig" in phases:  # an eligible bitset: seeding samples eligible scores only
        from ..targeting import bits_from_mask

        n, k = 100_000_000, 1000
        scores = cp.random.RandomState(11).standard_normal(n, dtype=cp.float32)
        for frac in (0.5, 0.1):
            mask = cp.random.RandomState(int(frac * 100)).random_sample(n) < frac
            bits = cuda.to_device(bits_from_mask(mask.get()))
            for seeded in (True, False):
                block_topk_row(scores, n, k, seeded, "_eligible", elig=bits, mask=mask, access="bitset",
                               eligible_fraction=frac, notes="scores + the eligible bitset read (4.125 B per score)")
            del mask, bits
        del scores
        cp.get_default_memory_pool().free_all_blocks()
    if "small" in phases:
        for seeded in (True, False):
            one(500_000, 1000, "random", seeded, l2_note="2 MB: L2-resident, as right after scoring")
        # the seeded block top-K lists + merge (the earlier default)
        one(500_000, 1000, "random", True, l2_note="2 MB: L2-resident; seeded scan + merge path", path="scan")
        # topk_scores's route for 65,536..2^20 scores; prediction for the seed by the threads' best
        # keys (commit after 019d815): 24 us -> ~20 us (the seed's radix levels ~5 us of it)
        _topk_one_request_batch_path(add, env, ceil, args, 500_000, 1000, wall=True)
        for rounds in (4, 1):  # more filter blocks for a batch of one (16 rounds: 16 blocks)
            _topk_one_request_batch_path(add, env, ceil, args, 500_000, 1000, rounds=rounds)
        for k_small in (1000, 100):
            _topk_one_request_onelaunch(add, env, ceil, args, 500_000, k_small)
            # prediction (commit after 28169f9): the last block's sort (4,096 entries, 1,024 threads)
            # with warp barriers on 57 of its 78 steps: 52 us -> ~30 us at k = 1000
            _topk_one_request_onelaunch(add, env, ceil, args, 500_000, k_small, warp_sync=True)
    if "stages" in phases:
        rows.extend(_topk_stage_rows(env, ceil, args, 500_000, 1000))
    if "stages_large" in phases:  # where 10^8 scores' seeded call spends its time (not in the default set)
        rows.extend(_topk_stage_rows(env, ceil, args, 100_000_000, 1000))
        cp.get_default_memory_pool().free_all_blocks()
    if "batch" in phases:
        rows.extend(_topk_batch_rows(env, ceil, args))
    return rows
