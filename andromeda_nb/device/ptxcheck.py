"""Compile every kernel variant to PTX for a real GPU target, without a GPU.

The CUDA simulator runs kernels as Python and type-checks nothing; this compiles each variant with
NVVM for ``sm_90`` (H100 / H200), so typing and lowering errors show up in CI, and reports what the
PTX says about each variant (local-memory traffic, global load widths). Needs the NVVM and NVRTC
wheels (``nvidia-nvvm``, ``nvidia-cuda-nvrtc``; in the test extras) and must run in a process where
the simulator is off: ``NUMBA_ENABLE_CUDASIM=0 python -m andromeda_nb.device.ptxcheck``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys


def _fake_device(cc):
    """Device functions compile for the current device; give them one without a driver."""
    import numba.cuda.dispatcher as dispatcher

    class _Device:
        compute_capability = cc

    dispatcher.get_current_device = lambda: _Device()


def variants():
    """(name, dispatcher, signature) for every kernel variant the host wrappers can launch."""
    from numba import types as nt

    from ..match import kernels as M
    from ..score import naive as S

    f32, i32, i64, u64, u32 = nt.float32, nt.int32, nt.int64, nt.uint64, nt.uint32

    def A(t, nd=1):
        return nt.Array(t, nd, "C")

    from ..score import filter_kernels as FKF
    from ..score import fused as FK

    store = {"fp32": f32, "fp16": nt.float16, "bf16": nt.uint16, "int8": nt.int8}
    out = []
    fused_sig = (A(u64, 2), A(f32), A(f32), A(f32), A(u64), A(i32), i64, A(i64), i64, A(f32), A(f32), A(i32), A(i64))
    # every axis of variation at least once (the full cross product takes many minutes)
    configs = [("gated", 64, 6, 2, "chosen", dt, lay, "pool", 0) for dt in store for lay in FK.LAYOUTS]
    configs += [("gated", 64, 6, 2, "chosen", "fp16", "tiles", acc, cap) for acc in FK.ACCESS for cap in (0, 2048)
                if (acc, cap) != ("pool", 0)]
    configs += [("gated", 64, 6, 2, "chosen", "int8", "rows", "candidates", 2048),
                ("gated", 64, 6, 2, "all", "fp16", "tiles", "pool", 2048),
                ("gated", 64, 6, 2, "all", "bf16", "rows", "bitset", 0),
                ("dot", 64, 1, 1, "chosen", "fp16", "tiles", "pool", 2048),
                ("dot", 128, 1, 1, "chosen", "int8", "rows", "bitset", 0),
                ("gated", 32, 1, 1, "chosen", "fp32", "rows", "pool", 512),
                ("gated", 128, 8, 4, "chosen", "fp16", "tiles", "pool", 0)]
    for model, d, E, K, values, dtype, layout, access, cap in configs:
        k = FK.fused_kernel(model, d, E, K, dtype, layout, access, 256, cap, True, values)
        out.append((f"fused {model} d{d} E{E} K{K} {values} {dtype} {layout} {access} cap{cap}", k, fused_sig))
    # request weights as kernel parameters (KernelConfig.weights="param"), the offset hoisting guard
    for model, E, K, dtype in (("gated", 6, 2, "fp16"), ("dot", 1, 1, "int8")):
        n = 64 if model == "dot" else (2 + E) * 64
        k = FK.fused_kernel(model, 64, E, K, dtype, "tiles", "pool", 256, 0, True, "chosen", None, 1, 1, False, "param")
        out.append((f"fused {model} d64 E{E} K{K} {dtype} tiles pool cap0 weights=param", k,
                    fused_sig + (nt.UniTuple(f32, n),)))
    k = FK.fused_kernel("gated", 64, 6, 2, "fp16", "tiles", "pool", 256, 0, True, "chosen", None, 1, 1, False, "shared",
                        "offset")
    out.append(("fused gated d64 E6 K2 fp16 tiles pool cap0 guard=offset", k, fused_sig))
    # the tensor-core kernel (KernelConfig.tensor_cores): scores, fused block top-K, each access (a
    # buffer of 1024: with 2048 its static shared memory passed 48 KB, a kernel check_shared refuses)
    for dtype, layout, access, cap in (("fp16", "tiles", "pool", 0), ("bf16", "rows", "candidates", 1024),
                                       ("fp16", "tiles", "bitset", 0)):
        k = FK.fused_kernel("gated", 64, 6, 2, dtype, layout, access, 256, cap, True, "chosen", None, 1, 1, False,
                            "shared", "fence", True)
        out.append((f"fused gated d64 E6 K2 {dtype} {layout} {access} cap{cap} tensor_cores", k, fused_sig))
    # the fp16 math mode (KernelConfig(math="fp16"): mma.sync m16n8k16, weights in registers as uint32)
    f16_sig = (A(u64, 2),) + fused_sig[1:3] + (A(u32),) + fused_sig[4:]
    for layout, access, cap in (("rows", "pool", 0), ("tiles", "pool", 0), ("tiles", "bitset", 0),
                                ("rows", "candidates", 2048)):
        k = FK.fused_kernel("gated", 64, 6, 2, "fp16", layout, access, 256, cap, True, "chosen", None, 1, 1, False,
                            math="fp16")
        out.append((f"fused gated d64 E6 K2 fp16 {layout} {access} cap{cap} math=fp16", k, f16_sig))
    # int8 rows in fp16 math (dequantized to fp16 pairs in the tile): scores, the filter's access
    # (dequant="fma": one fused multiply-add a pair, for tables whose scales allow it)
    for layout, access, dequant in (("rows", "pool", "mul"), ("tiles", "pool", "mul"), ("rows", "candidates", "mul"),
                                    ("tiles", "pool", "fma"), ("rows", "candidates", "fma")):
        k = FK.fused_kernel("gated", 64, 6, 2, "int8", layout, access, 256, 0, True, "chosen", None, 1, 1, False,
                            math="fp16", dequant=dequant)
        out.append((f"fused gated d64 E6 K2 int8 {layout} {access} cap0 math=fp16 dequant={dequant}", k, f16_sig))
    # the two tiles' mma steps alternating (tile_order="steps"): int8 and fp16 rows
    for dtype, layout, access in (("int8", "tiles", "pool"), ("fp16", "rows", "candidates")):
        k = FK.fused_kernel("gated", 64, 6, 2, dtype, layout, access, 256, 0, True, "chosen", None, 1, 1, False,
                            math="fp16", dequant="fma" if dtype == "int8" else "mul", tile_order="steps")
        out.append((f"fused gated d64 E6 K2 {dtype} {layout} {access} cap0 math=fp16 tile_order=steps", k, f16_sig))
    # fp16 math's weights read from shared memory (f16_weights="shared"), int8 rows (the filter pass below)
    k = FK.fused_kernel("gated", 64, 6, 2, "int8", "tiles", "pool", 256, 0, True, "chosen", None, 1, 1, False,
                        math="fp16", dequant="fma", f16_weights="shared")
    out.append(("fused gated d64 E6 K2 int8 tiles pool cap0 math=fp16 f16_weights=shared", k, f16_sig))
    # two rounds of rows in flight (rows_ahead=2), the weights shared: int8 and fp16 rows
    for dtype in ("int8", "fp16"):
        k = FK.fused_kernel("gated", 64, 6, 2, dtype, "tiles", "pool", 256, 0, True, "chosen", None, 1, 1, False,
                            math="fp16", dequant="fma" if dtype == "int8" else "mul", f16_weights="shared",
                            rows_ahead=2)
        out.append((f"fused gated d64 E6 K2 {dtype} tiles pool cap0 math=fp16 f16_weights=shared rows_ahead=2", k,
                    f16_sig))
    # int8 rows through a shared-memory ring filled by cp.async (ring_stages), scores and the filter pass
    k = FK.fused_kernel("gated", 64, 6, 2, "int8", "tiles", "pool", 128, 0, True, "chosen", None, 1, 1, False,
                        math="fp16", dequant="fma", ring_stages=3)
    # "ring" names its own family: --quick (the tests) compiles the cp.async inline PTX too
    out.append(("ring fused gated d64 E6 K2 int8 tiles pool cap0 math=fp16 ring_stages=3", k, f16_sig))
    # int8 rows' scales read as the table's fp16 pairs (row_scales="fp16_pairs": the scale argument
    # uint32), its own family so --quick compiles their inline PTX
    pairs_sig = f16_sig[:1] + (A(u32),) + f16_sig[2:]
    for ring in (0, 3):
        k = FK.fused_kernel("gated", 64, 6, 2, "int8", "tiles", "pool", 128 if ring else 256, 0, True, "chosen", None,
                            1, 1, False, math="fp16", dequant="fma", ring_stages=ring, scale_pairs=True)
        out.append((f"pairs fused gated d64 E6 K2 int8 tiles pool cap0 math=fp16 dequant=fma"
                    f"{' ring_stages=3' if ring else ''} row_scales=fp16_pairs", k, pairs_sig))
    # L2 prefetch a few rounds ahead (l2_ahead): fp16 and int8 rows, scores and the filter pass
    for dtype, layout in (("fp16", "tiles"), ("int8", "rows")):
        k = FK.fused_kernel("gated", 64, 6, 2, dtype, layout, "pool", 256, 0, True, "chosen", None, 1, 1, False,
                            math="fp16", l2_ahead=2)
        out.append((f"fused gated d64 E6 K2 {dtype} {layout} pool cap0 math=fp16 l2_ahead=2", k, f16_sig))
    # the frontier's widest rows (--ptxas: d = 128 holds 234 registers a thread, one block of 256 an SM)
    k = FK.fused_kernel("gated", 128, 6, 2, "fp16", "tiles", "pool", 256, 0, True, "chosen", None, 1, 1, False,
                        math="fp16")
    out.append(("fused gated d128 E6 K2 fp16 tiles pool cap0 math=fp16", k, f16_sig))
    # the seeded filter path of fused scoring + top-k (scoring.launch_score_filter), each access
    filter_sig = (A(u64, 2), A(f32), A(f32), A(f32), A(u64), A(i32), i64, A(i64), A(f32), A(f32, 2), A(i32, 2),
                  A(i64), A(i64, 2))
    for access in FK.ACCESS:
        k = FK.fused_kernel("gated", 64, 6, 2, "fp16", "tiles", access, 256, 0, True, "chosen", None, 1, 1, True)
        out.append((f"fused gated d64 E6K2 fp16 tiles {access} seed_filter", k, filter_sig))
    k = FK.fused_kernel("gated", 64, 6, 2, "fp16", "tiles", "bitset", 256, 0, True, "chosen", None, 1, 1, True,
                        "shared", "fence", True)
    out.append(("fused gated d64 E6K2 fp16 tiles bitset seed_filter tensor_cores", k, filter_sig))
    f16_filter = (A(u64, 2), A(f32), A(f32), A(u32)) + filter_sig[4:]
    k = FK.fused_kernel("gated", 64, 6, 2, "fp16", "rows", "pool", 256, 0, True, "chosen", None, 1, 1, True,
                        math="fp16")
    out.append(("fused gated d64 E6K2 fp16 rows pool seed_filter math=fp16", k, f16_filter))
    k = FK.fused_kernel("gated", 64, 6, 2, "fp16", "tiles", "pool", 256, 0, True, "chosen", None, 1, 1, True,
                        math="fp16", l2_ahead=2)
    out.append(("fused gated d64 E6K2 fp16 tiles pool seed_filter math=fp16 l2_ahead=2", k, f16_filter))
    k = FK.fused_kernel("gated", 64, 6, 2, "int8", "tiles", "bitset", 256, 0, True, "chosen", None, 1, 1, True,
                        math="fp16", dequant="fma", f16_weights="shared")
    out.append(("fused gated d64 E6K2 int8 tiles bitset seed_filter math=fp16 f16_weights=shared", k, f16_filter))
    k = FK.fused_kernel("gated", 64, 6, 2, "int8", "tiles", "pool", 128, 0, True, "chosen", None, 1, 1, True,
                        math="fp16", dequant="fma", ring_stages=3)
    out.append(("ring fused gated d64 E6K2 int8 tiles pool seed_filter math=fp16 ring_stages=3", k, f16_filter))
    # the defaults as launched over the whole pool: the loop in two (split_loop), int8 rows reading
    # scale pairs and fp16 rows, scores and the filter pass; "split" names its own family (--quick)
    pairs_filter = f16_filter[:1] + (A(u32),) + f16_filter[2:]
    for dtype, sigs in (("int8", (pairs_sig, pairs_filter)), ("fp16", (f16_sig, f16_filter))):
        for seed_filter, sig in zip((False, True), sigs):
            k = FK.fused_kernel("gated", 64, 6, 2, dtype, "tiles", "pool", 256, 0, True, "chosen", None, 1, 1,
                                seed_filter, math="fp16", dequant="fma" if dtype == "int8" else "mul",
                                scale_pairs=dtype == "int8", split_loop=True)
            out.append((f"split fused gated d64 E6 K2 {dtype} tiles pool cap0 math=fp16"
                        f"{' seed_filter' if seed_filter else ''} split_loop", k, sig))
    for seed_filter, sig in zip((False, True), (pairs_sig, pairs_filter)):  # and the int8 rows' ring (blocks of 128)
        k = FK.fused_kernel("gated", 64, 6, 2, "int8", "tiles", "pool", 128, 0, True, "chosen", None, 1, 1,
                            seed_filter, math="fp16", dequant="fma", scale_pairs=True, ring_stages=3, split_loop=True)
        out.append((f"split fused gated d64 E6 K2 int8 tiles pool cap0 math=fp16{' seed_filter' if seed_filter else ''}"
                    " ring_stages=3 split_loop", k, sig))
    # the request path's batched kernels (pipeline.Pool): the sample and the filter over candidate lists
    batched = (A(u64, 2), A(f32), A(f32), A(f32, 2), A(u64), A(i32, 2), A(i64), A(i64))
    k = FK.fused_kernel("gated", 64, 6, 2, "fp16", "rows", "candidates", 256, 0, True, "chosen", None, 1, 1, False,
                        batched=True, sample=4096)
    out.append(("fused gated d64 E6K2 fp16 rows batched sample", k, batched + (i64, A(f32, 2), A(f32), A(i32), A(i64))))
    k = FK.fused_kernel("gated", 64, 6, 2, "fp16", "rows", "candidates", 256, 0, True, "chosen", None, 1, 1, True,
                        batched=True)
    out.append(("fused gated d64 E6K2 fp16 rows batched seed_filter", k,
                batched + (A(f32), A(f32, 2), A(i32, 2), A(i64), A(i64, 2))))
    k = FK.fused_kernel("gated", 64, 6, 2, "fp16", "rows", "candidates", 256, 0, True, "chosen", None, 1, 1, True,
                        batched=True, math="fp16")
    out.append(("fused gated d64 E6K2 fp16 rows batched seed_filter math=fp16", k,
                (A(u64, 2), A(f32), A(f32), A(u32, 2)) + batched[4:] + (A(f32), A(f32, 2), A(i32, 2), A(i64),
                                                                        A(i64, 2))))
    from ..pipeline import kernels as P

    out.append(("pipeline gather_candidates", P.gather_candidates_kernel(256), (A(u64, 2), i64, A(i32, 2), A(i64))))
    out.append(("pipeline pool_seed", P.pool_seed_kernel(128, 32, 6, 16),
                (A(f32), A(i64), A(i64), i64, i64, A(i64), A(f32), A(i64, 2), A(i64))))
    out.append(("pipeline reset", P.reset_kernel(), (A(i64), A(i64), i64, i64)))
    out.append(("pipeline scatter_slots tiles", P.scatter_slots_kernel(True),
                (A(u64, 2), A(f32), A(f32), A(i64), A(i64), A(i64), A(i64), A(u64), A(f32), A(f32), nt.boolean,
                 A(u32), nt.boolean)))
    from ..score.table_kernels import int8_max_abs_kernel, max_abs_kernel, scale_pairs_kernel

    out.append(("table max_abs fp16", max_abs_kernel("fp16"), (A(u64), A(f32))))
    out.append(("table max_abs int8", int8_max_abs_kernel, (A(u64, 2), A(f32), nt.boolean, A(nt.float64))))
    out.append(("table scale_pairs", scale_pairs_kernel, (A(f32), A(u32))))
    out.append(("sample_prep cand", FKF.sample_prep_kernel(True, False),
                (A(i32), A(i32), A(i32), A(u64), A(f32), nt.boolean, A(i64, 2), A(i64))))
    out.append(("sample_prep elig", FKF.sample_prep_kernel(False, True),
                (A(i32), A(i32), A(i32), A(u64), A(f32), nt.boolean, A(i64, 2), A(i64))))
    for every in (2, 4):  # the top-K barrier only every few rounds (KernelConfig.sync_every)
        k = FK.fused_kernel("gated", 64, 6, 2, "fp16", "tiles", "pool", 256, 2048, True, "chosen", None, 1, every)
        out.append((f"fused gated d64 E6K2 chosen fp16 tiles pool cap2048 every{every}", k, fused_sig))
    for dtype, layout, access in (("fp16", "tiles", "pool"), ("int8", "rows", "bitset")):
        k = S.gated_score_kernel(64, 6, 2, dtype, layout, access, 256, 2048, True)
        tab = A(store[dtype], 2 if layout == "rows" else 3)
        sig = (tab, A(f32), A(f32), A(f32), A(f32), A(f32), A(f32), A(u64), A(i32), i64,
               A(i64), i64, A(f32), A(f32), A(i32), A(i64))
        out.append((f"naive gated d64 E6 K2 {dtype} {layout} {access} cap2048", k, sig))
    from ..score import unfused_kernels as U

    for gather in (False, True):
        out.append((f"unfused encode fp16 tiles{' gather' if gather else ''}", U.encode_kernel(64, "fp16", "tiles", gather),
                    (A(u64, 2), A(f32), A(f32), A(f32), i64, A(f32, 2), A(i32))))
    out.append(("unfused gate", U.gate_kernel(64, 6), (A(f32, 2), A(f32), i64, A(f32, 2))))
    out.append(("unfused choose", U.choose_kernel(6, 2), (A(f32, 2), i64, A(nt.int8, 2), A(f32, 2))))
    out.append(("unfused values", U.values_kernel(64, 2), (A(f32, 2), A(f32), A(nt.int8, 2), i64, A(f32, 2))))
    for gather in (False, True):
        out.append((f"unfused combine{' gather' if gather else ''}", U.combine_kernel(2, gather),
                    (A(f32, 2), A(f32, 2), A(f32), i64, A(f32), A(i32))))
    out.append(("unfused gather rows", U.gather_rows_kernel("tiles"), (A(u64, 2), A(f32), A(i32), i64, A(u64, 2), A(f32))))
    out.append(("unfused bitset to slots", U.bitset_to_slots_kernel(), (A(u64), A(i32), A(i64))))
    out.append(("unfused gather ids", U.gather_ids_kernel(), (A(i64), A(i32), i64, A(i64))))
    # top-K: the block top-K (topk/block.py), the finals (topk/final_kernels.py), the seeds
    # (topk/seed_kernels.py), the filter pass (topk/filter_kernels.py) and the one-launch path
    from ..topk import block as TB
    from ..topk import filter_kernels as TF
    from ..topk import final_kernels as TL
    from ..topk import onelaunch_kernels as TO
    from ..topk import seed_kernels as TS
    from ..topk.config import DEFAULT_CONFIG as TOPK

    final_sig = (A(f32, 2), A(i32, 2), A(i64), A(i64), A(i64), A(i64), A(f32, 2), A(i32, 2), A(i64, 2))
    for cap in (512, 4096):
        for elig in (False, True):
            for ids in (False, True):
                out.append((f"topk scan cap{cap} elig{elig} ids{ids}", TB.scan_kernel(cap, 256, elig, ids),
                            (A(f32), A(i64), A(u64, 2), A(i64), A(i64), i64, A(f32), A(f32, 2), A(i32, 2), A(i64, 2))))
        out.append((f"topk final cap{cap}", TB.final_kernel(cap, 256, True), final_sig))
        for ids in (False, True):  # at the launch's block (topk.config.RADIX_BLOCK: 1024, at most 64 registers)
            out.append((f"topk final_radix cap{cap} ids{ids}", TL.final_radix_kernel(cap, 1024, ids), final_sig))
    out.append(("topk bound", TB.bound_kernel(256, True),
                (A(f32, 2), A(i32, 2), i64, i64, A(i64), A(i64), A(i64), A(f32), A(i32))))
    out.append(("topk select", TB.select_kernel(True),
                (A(f32, 2), A(i32, 2), i64, i64, A(i64), A(i64), A(i64), A(f32), A(i32), A(f32, 2), A(i32, 2), A(i64))))
    for gather, elig in ((True, False), (True, True), (False, False)):
        out.append((f"topk seed gather{gather} elig{elig}", TS.seed_kernel(1024, TOPK.tuning.sample_chunk, gather, elig,
                                                                          gather),
                    (A(f32), i64, i64, A(f32), A(u64), i64, A(u32), A(u32), A(f32), A(i64, 2), A(i64))))
    for elig in (False, True):
        out.append((f"topk filter elig{elig}", TF.filter_kernel(256, elig, TOPK.tuning.filter_stage),
                    (A(u64), A(f32), i64, A(i64), A(u64, 2), A(f32), A(f32, 2), A(i32, 2), A(i64), A(i64, 2))))
        for by_max in (False, True):
            out.append((f"topk batch_seed elig{elig} by_max{by_max}",
                        TS.batch_seed_kernel(TS.BATCH_SEED_BLOCK, TS.BATCH_SEED_PER_THREAD, TS.BATCH_SAMPLE_CHUNK, elig,
                                             int(2 * TOPK.tuning.seed_margin), TOPK.tuning.seed_min_rank, by_max),
                        (A(f32), A(i64), A(i64), A(u64, 2), A(f32), A(i64, 2), A(i64))))
    for ids in (False, True):
        for ws in (False, True):
            out.append((f"topk final_sort ids{ids} warp_sync{ws}", TL.final_sort_kernel(128, ids, 1024, ws),
                        (A(f32),) + final_sig))
        out.append((f"topk final_rank ids{ids}", TL.final_rank_kernel(TL.RANK_BLOCK, ids, TOPK.tuning.rank_cap),
                    final_sig))
    for elig in (False, True):
        out.append((f"topk onelaunch elig{elig} warp_sync{elig}",
                    TO.onelaunch_topk_kernel(TO.ONELAUNCH_BLOCK, TO.ONELAUNCH_SAMPLES, TO.ONELAUNCH_SCORES, elig,
                                             TO.ONELAUNCH_CAP, elig),
                    (A(f32), A(u64), i64, i64, A(f32), A(i32), A(i64), A(u32), A(i64, 2), A(f32, 2), A(i32, 2),
                     A(i64, 2))))
    # match (andromeda_nb.match.kernels): the match kernel per words-per-thread and block, with the
    # launch bounds MatchConfig's "auto" rule gives on a GPU, the list passes and the update kernel
    # per list-pool dtype (int32 below 2^31 slots, int64 beyond), compaction per output dtype
    from ..match.config import MatchConfig

    match_sig = (A(u64, 2), A(u64, 2), i64, i64, A(i64), A(i64), A(i64), A(i64), A(i64), A(u64, 2), A(i64))
    for blk in (256, 512):
        for U in (1, 2, 4, 8, 16):
            out.append((f"match b{blk} U{U}", M.match_kernel(blk, U), match_sig))
            bounds = MatchConfig(words_per_thread=U, block=blk).launch_bounds(simulator=False)
            if bounds:
                out.append((f"match b{blk} U{U} bounds{bounds}", M.match_kernel(blk, U, bounds), match_sig))
    for U in (4, 8):
        out.append((f"match b256 U{U} prefetch", M.match_kernel(256, U, 0, True), match_sig))
    grouped_sig = (A(u64, 2), A(u64, 2), i64, i64, A(i64), A(i64), A(i64), A(u64, 2), A(i64))
    for U, G in ((1, 8), (2, 4), (2, 8), (4, 2), (4, 4), (4, 8), (8, 2), (8, 4)):
        out.append((f"match grouped b256 U{U} G{G}", M.match_grouped_kernel(256, U, G), grouped_sig))
    for pool_t in (i32, i64):
        out.append((f"match prep pool {pool_t}", M.prep_kernel(),
                    (A(i64), i64, A(pool_t), A(i64), A(i64), A(i64), A(u64, 2), i64)))
        out.append((f"match post pool {pool_t}", M.post_kernel(256),
                    (A(u64, 2), A(i64), i64, A(pool_t), A(i64), A(i64), A(i64), A(i64), A(i64), A(u64, 2), i64)))
        out.append((f"match prep_segment pool {pool_t}", M.prep_segment_kernel(256),
                    (A(i64), i64, A(pool_t), A(i64), A(i64), A(i64), A(u64, 2), i64)))
        out.append((f"match post_segment pool {pool_t}", M.post_segment_kernel(256),
                    (A(u64, 2), A(i64), i64, A(pool_t), A(i64), A(i64), A(i64), A(i64), A(i64), A(u64, 2), i64)))
        out.append((f"match apply pool {pool_t}", M.apply_kernel(), (A(u64, 2), A(pool_t), A(i64), i64, i64, i64)))
    out.append(("match fill", M.fill_kernel(), (A(u64, 2), u64)))
    out.append(("match chunk_count", M.chunk_count_kernel(256), (A(u64, 2), i64, i64, i64, A(i64))))
    for cand_t in (i32, i64):
        out.append((f"match compact {cand_t}", M.compact_kernel(256), (A(u64, 2), i64, i64, i64, A(i64), A(cand_t), i64)))
    out.append(("clear_bits", M.clear_bits_kernel(), (A(u64), A(i64), A(i64))))
    return out


def inspect_ptx(ptx: str) -> dict:
    """Counts read off PTX text: local-memory ops and global loads by width."""
    loads = re.findall(r"ld\.global(?:\.\w+)*?\.(v[24]\.)?([busf]\d+)", ptx)
    widths = {}
    for vec, ty in loads:
        nbytes = int(ty[1:]) // 8 * (int(vec[1]) if vec else 1)
        widths[nbytes] = widths.get(nbytes, 0) + 1
    return {
        "local_ops": len(re.findall(r"\b(?:ld|st)\.local", ptx)),
        "global_load_bytes": dict(sorted(widths.items())),
        "lines": ptx.count("\n"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cc", default="9.0", help="compute capability to compile for (default 9.0)")
    ap.add_argument("--only", default=None, help="regex on variant names")
    ap.add_argument("--json", action="store_true", help="print one JSON object per variant")
    ap.add_argument("--quick", action="store_true",
                    help="one variant per kernel family (CI); the generated kernels take seconds each to compile")
    ap.add_argument("--ptxas", action="store_true",
                    help="also assemble each variant with ptxas (CUDA's assembler, when on PATH): inline PTX "
                         "(mma, f16x2) is checked there, not by NVVM; prints registers and spills")
    ap.add_argument("--maxrregcount", type=int, default=None, metavar="N",
                    help="with --ptxas or --sass: assemble at this register cap (a launch's max_registers)")
    ap.add_argument("--sass", action="store_true",
                    help="assemble (ptxas) and disassemble (nvdisasm, both on PATH) each variant and count the "
                         "instructions of its main loop (its longest backward branch) by opcode: the issue "
                         "cost of one round of a kernel")
    args = ap.parse_args(argv)
    import shutil

    if args.sass and not (shutil.which("ptxas") and shutil.which("nvdisasm")):
        ap.error("--sass needs ptxas and nvdisasm on PATH (nvdisasm: the nvidia-cuda-nvdisasm wheel)")
    if args.maxrregcount is not None and not (args.ptxas or args.sass):
        ap.error("--maxrregcount is a cap for ptxas: give --ptxas or --sass")
    if args.maxrregcount is not None and not 16 <= args.maxrregcount <= 255:
        ap.error(f"--maxrregcount must be 16..255 registers, got {args.maxrregcount}")
    args.ptxas = args.ptxas or args.sass
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        print("ptxcheck needs NUMBA_ENABLE_CUDASIM=0 (it compiles for a real GPU)", file=sys.stderr)
        return 2
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    from numba import cuda

    from . import backend

    backend._chosen = "cuda"  # compile only: nothing here launches
    cc = tuple(int(x) for x in args.cc.split("."))
    _fake_device(cc)
    failures = 0
    seen_families = set()
    for name, disp, sig in variants():
        if args.only and not re.search(args.only, name):
            continue
        family = " ".join(name.split()[:2])
        if args.quick and family in seen_families:
            continue
        seen_families.add(family)
        try:
            ptx, _ = cuda.compile_ptx(disp.py_func, sig, cc=cc, launch_bounds=disp.targetoptions.get("launch_bounds"))
        except Exception as exc:  # report every failing variant, then fail
            failures += 1
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            continue
        info = inspect_ptx(ptx)
        if args.ptxas:
            ok, note = _assemble(ptx, args.cc.replace(".", ""), args.maxrregcount,
                                 sass := [] if args.sass else None)
            info["ptxas"] = note
            if not ok:
                failures += 1
                print(f"FAIL {name}: ptxas: {note}")
                continue
        if args.sass:
            info["main_loop"] = dict(loop_opcodes(sass[0]).most_common())
            info["outer_loops"] = [sum(c.values()) for c in outer_loops(sass[0])]
        if args.json:
            print(json.dumps({"variant": name, **info}))
            continue
        flag = "" if info["local_ops"] == 0 else "  <-- local memory"
        extra = f"; {info['ptxas']}" if args.ptxas else ""
        print(f"ok   {name}: local ops {info['local_ops']}, global loads {info['global_load_bytes']}{flag}{extra}")
        if args.sass:
            print(f"     main loop: {sum(info['main_loop'].values())} instructions: "
                  + ", ".join(f"{op} {n}" for op, n in info["main_loop"].items()))
            rounds = [n for n in info["outer_loops"] if n >= 64]  # not the setup's copy loops
            if len(rounds) > 1:  # a split loop over rounds: its first runs most of them
                print(f"     outer loops in order (of 64 or more): {', '.join(map(str, rounds))} instructions")
    return 1 if failures else 0


def loop_opcodes(sass: str):
    """Opcode counts (a Counter) of the instructions in the longest span from a backward branch's
    target to the branch, in nvdisasm's text of one kernel: a generated kernel's main loop (one
    round of a warp's ads), where the issue cost per ad is decided. Predicates and modifiers are
    dropped (``@!P0 LDG.E.64`` counts as ``LDG``). Static counts: a ``CALL`` in the span counts as
    one instruction (the callee's are not added), and a kernel with a rarely taken path inside
    its loop (the block top-K's buffer flush) counts that path as if it ran every round."""
    from collections import Counter

    at, spans = _loop_spans(sass)
    if not spans:
        return Counter()
    return _opcodes(at, *max(spans, key=lambda span: span[1] - span[0]))


def outer_loops(sass: str) -> list:
    """Opcode counts of every outermost loop (a backward branch's span inside no other), in
    address order: a kernel whose loop over rounds is split in two (``split_loop``) runs most
    rounds in the first, which :func:`loop_opcodes` (the longest) does not pick."""
    at, spans = _loop_spans(sass)
    outer = sorted(s for s in spans if not any(o != s and o[0] <= s[0] and s[1] <= o[1] for o in spans))
    return [_opcodes(at, lo, hi) for lo, hi in outer]


def _loop_spans(sass: str) -> tuple[list, list]:
    """nvdisasm's text as (address, instruction) pairs and every backward branch's (target, branch)."""
    at, label_at, pending = [], {}, []
    for line in sass.splitlines():
        label = re.match(r"\s*\.(L_x_\d+):", line)
        if label:
            pending.append(label.group(1))
            continue
        ins = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if ins:
            addr = int(ins.group(1), 16)
            label_at.update((name, addr) for name in pending)
            pending = []
            at.append((addr, ins.group(2)))
    spans = [(label_at[m.group(1)], addr) for addr, text in at
             if (m := re.search(r"\bBRA\b.*?\.?(L_x_\d+)", text)) and label_at.get(m.group(1), addr) < addr]
    return at, spans


def _opcodes(at: list, lo: int, hi: int):
    from collections import Counter

    return Counter(re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0] for addr, text in at if lo <= addr <= hi)


def _assemble(ptx: str, sm: str, maxrregcount: int | None = None, sass: list | None = None) -> tuple[bool, str]:
    """ptxas on one PTX module for sm_<sm>: (assembled, its resource line or its error); with a
    ``sass`` list, nvdisasm's text of the assembled module is appended to it (when on PATH)."""
    import shutil
    import subprocess
    import tempfile

    exe = shutil.which("ptxas")
    if exe is None:
        return True, "ptxas not on PATH (not assembled)"
    cap = [f"-maxrregcount={maxrregcount}"] if maxrregcount else []

    def run(text):
        with tempfile.TemporaryDirectory() as tmp:
            src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
            with open(src, "w") as f:
                f.write(text)
            r = subprocess.run([exe, f"-arch=sm_{sm}", "-v", *cap, src, "-o", cubin], capture_output=True, text=True)
            if sass is not None and not r.returncode:  # main() checked that nvdisasm is on PATH
                d = subprocess.run([shutil.which("nvdisasm"), "-c", "-g", cubin], capture_output=True, text=True)
                if d.returncode:  # reported as the assembly's failure, with nvdisasm's words
                    r = subprocess.CompletedProcess(r.args, d.returncode, r.stdout, "nvdisasm: " + d.stderr)
                else:
                    sass.append(d.stdout)
            return r

    r = run(ptx)
    older = re.search(r"current version is '([0-9.]+)'", r.stderr)
    if r.returncode and older:  # NVVM newer than the assembler: the ISA version the assembler knows
        r = run(re.sub(r"^\.version [0-9.]+", f".version {older.group(1)}", ptx, count=1, flags=re.M))
    lines = [ln.split("info    : ")[-1] for ln in r.stderr.splitlines() if "registers" in ln or "spill" in ln]
    if r.returncode:
        return False, " ".join(r.stderr.split())[-300:]
    return True, "; ".join(lines[-2:])


if __name__ == "__main__":
    sys.exit(main())
