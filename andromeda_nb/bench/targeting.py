"""Targeting benchmark suite: ``python -m andromeda_nb.bench targeting`` (GPU only, ~4 minutes; ``--list`` anywhere).

World: docs/design.md's benchmark world (:func:`andromeda_nb.datasets.synthetic.benchmark_schema`,
``generate_rules`` defaults: 10^8 ads, 20 categories, each constrained with probability 0.3,
excluded with 0.05, Zipf 1.2; 4,096 spare slots for creates), user profiles from
``generate_profiles`` (a multi-valued category holds 0..3 values). Index layout: the default of
:func:`andromeda_nb.targeting.choose_layout`: single-valued categories folded in groups of at most
512 rows (the live bit folded into the smallest group), split categories with an include' row per
value included by >= n/1024 ads, an exclude row per value excluded by >= n/256 ads, inverted lists
for the rest.

Phases (``--phases``, comma-separated; default all), in run order; the first seven on the
full-size world:

    main        ``match_U{1,2,4,8,16}_b256`` (words per thread; launch bounds from
                ``match.config.THREADS_PER_SM_BOUNDS``), ``match_U4_b256_nobounds``, ``match_U4_b512``,
                prefetch variants, segment-grid list passes (one request at a time, 8 profiles back
                to back), ``match_batch{8,32,64}_U{4,8}`` (requests per launch), the CPU baseline
                ``cpu_numba_parallel_<threads>threads``
    grouped     ``match_grouped_U<U>_G<G>_b256`` (rows loaded G at a time), then batches and pool
                prefixes with the fastest verified shape of the run
    stages      ``match_U8_stage_*``: each kernel of a request's launch set timed alone
    pool        ``match_U4_pool_prefix`` (the first 10^6 / 10^7 / 3x10^7 slots)
    values      ``match_U4_user_values_{0,1,2,6,10}``
    updates     ``update_batch_gpu``, ``update_batch_host``, ``update_batch_end_to_end``,
                ``request_after_update_batch`` vs ``request_alone_same_profiles``
    device      ``update_batch_end_to_end_host_bits_{kept,dropped}`` (drops the world's host rows: last)
    layouts     on a quarter-size world (2.5x10^7 ads; a request still reads far more than L2): the
                default layout (``match_U4_density_0.3``) against ``per_category_folding``,
                ``high_cardinality_lists_only``, ``high_cardinality_dense_n_over_16384``
    density     the rule density (``match_U4_density_{0.1,0.6}``)
    categories  the number of constrained categories (``match_U4_categories_{2,5,10}``)

Cases of phases other than main and updates are skipped past ``BUDGET_S`` seconds of the run. A
case that raises leaves a FAILED row under its variant and the run goes on.

Count first (host byte model :func:`andromeda_nb.match.read_model` on a 10^6-ad copy of the world,
20 profiles; the same model counts every row below):

================================  ===========  ========  ============================================
layout                            row bits/ad  bytes/ad  prediction at 85-90 % of a 4.64 TB/s ceiling
================================  ===========  ========  ============================================
default (groups <= 512 rows)      20.5         2.90      1.35-1.45 T ads/s (~70 us per 10^8 request)
one folded row per category       27.2         3.74      1.05-1.10 T ads/s
groups <= 1024 rows               19.5         2.77      1.40-1.50 T ads/s
high-cardinality lists only       ~19.9        ~3.1      ~1.0-1.1 T ads/s (long popular lists scattered)
================================  ===========  ========  ============================================

bytes/ad = row sectors read (32 bytes; a sector is skipped only when its 256 ads are all out,
rare with ~1 % of ads eligible) + list entries + the 32-byte sectors the list passes touch + the
1-bit result written. Three kernels per request add a few microseconds. CPU baseline (same plan,
Numba-parallel over words, 16 cores): ~10-30 G ads/s (host memory bandwidth). Updates (batches of
1,000 mixed creates / changes / retires): ~150-250 bit flips per op (a create or retire flips the
live bit in the allowed rows of the carrier group, the smallest: 30 rows), ~1.5-2 KB of codes per
op copied to the GPU and applied with atomic xor: GPU side ~10-20 M ops/s (the copy dominates);
host side (validation, diff and the host copy) ~0.1-0.3 M ops/s.

Every GPU row is verified against the CPU baseline on the full bitset (same words, same count)
and against the rule oracle (:func:`andromeda_nb.reference.match`) on 2,048 random slots; CPU rows
against the oracle; update rows by requests in lockstep and the device rows / lists against the
host copy. Timing follows harness.time_device (CUDA events, a busy kernel ahead, median of
``--reps``); several requests are launched back to back per timed call, so each row's seconds are
per launch set (one request, or one batch). The memory of every layout, per folded group or split
category (measured, or scaled from the quarter-size world), goes to ``targeting_memory.csv``
beside ``targeting.csv``.
"""

from __future__ import annotations

import gc
import os
import time
import traceback
from dataclasses import dataclass

import numpy as np

from . import harness
from .. import reference
from ..device import launch
from ..targeting import make_profile
from .targeting_world import (PROFILES, UpdateStream, World, byte_model, check_results, check_small_world, cpu_name,
                              elapsed, layout_name, load_results, log, memory_rows, restart_clock, rows_equal,
                              sample_bits, write_memory)

#: the suite (cases, Run) and the notebook's helpers from :mod:`.targeting_world`
__all__ = ["PHASES", "DEFAULT_PHASES", "cases", "Run", "byte_model", "check_small_world", "load_results"]

BUDGET_S = 200  # cases of the optional phases are skipped past this many seconds of the run
#: phases on the full-size world (built once, on the first case that needs it)
MAIN_WORLD_PHASES = ("main", "grouped", "stages", "pool", "values", "updates", "device")
#: the order in which the categories sweep turns categories on (a mix of kinds at every size)
CATEGORY_ORDER = [0, 14, 18, 1, 2, 15, 3, 4, 5, 19, 16, 6, 7, 8, 17, 9, 10, 11, 12, 13]
#: (words per thread, rows per group) of the grouped-match sweep, and their launch bounds (blocks of
#: 256 per SM; sm_90 ptxas registers without bounds: U1G8 40, U2G4 42, U2G8 62, U4G2 54, U4G4 68,
#: U4G8 104, U8G2 95, U8G4 128; with these bounds none spills: U4G4 at (256, 4) spilled 88 bytes)
GROUPED_SWEEP = [(1, 8), (2, 4), (2, 8), (4, 2), (4, 4), (4, 8), (8, 2), (8, 4)]
GROUPED_BOUNDS = {(1, 8): 6, (2, 4): 6, (2, 8): 4, (4, 2): 4, (4, 4): 3, (4, 8): 2, (8, 2): 2, (8, 4): 2}
#: the quarter-size world's layouts: name -> how its index is built (:func:`layout_index_kwargs`)
QUARTER_LAYOUTS = ("default", "per_category_folding", "high_cardinality_lists_only",
                   "high_cardinality_dense_n_over_16384")


# ----------------------------------------------------------------------------- cases

#: the variant of a case measured with the fastest verified grouped shape of the run: ``{U}`` and
#: ``{G}`` are filled from that shape
FASTEST_GROUPED = "fastest_grouped"


@dataclass(frozen=True)
class MatchCase(harness.Case):
    """One request row (:func:`request_row`): the main world's requests through the match kernels.
    Requests: the world's profiles one at a time (default), ``batch`` profiles of ``profile_seed``
    in one launch set, or 8 profiles of ``profile_seed`` holding at most ``max_values`` values;
    ``prefix``: only the first ``prefix`` slots. ``bounds``: launch bounds, blocks per SM (0: none;
    None: the MatchConfig rule). ``note`` may hold ``{bounds}`` (the launch bounds used)."""

    variant: str
    words_per_thread: int | None = None
    block: int | None = None
    bounds: int | None = None
    prefetch: bool = False
    group: int = 0
    lists: str = "auto"
    batch: int = 1
    prefix: int | None = None
    profile_seed: int | None = None
    max_values: int | None = None
    shape: str = ""  # FASTEST_GROUPED: words_per_thread, group and bounds from the run's fastest grouped case
    contender: bool = False  # a grouped shape the FASTEST_GROUPED cases may take
    note: str = ""
    access: str = "pool"
    run_in: str = "both"

    def configs(self) -> tuple:
        if self.shape:
            return ()
        return (match_config(self.words_per_thread, self.block, self.bounds, self.prefetch, self.group, self.lists),)

    def fits(self, options) -> bool:
        return self.prefix is None or self.prefix < options.n_ads


@dataclass(frozen=True)
class CpuCase(harness.Case):
    """The CPU baseline (:func:`cpu_row`); ``{threads}``: Numba's thread count on the host."""

    variant: str = "cpu_numba_parallel_{threads}threads"
    access: str = "pool"
    batch: int = 1


@dataclass(frozen=True)
class StageCase(harness.Case):
    """Some kernels of one request's launch set (prep, match, post), timed alone (:func:`stage_row`)."""

    variant: str
    lists: str
    kernels: tuple
    access: str = "pool"
    batch: int = 1

    def configs(self) -> tuple:
        return (match_config(8, lists=self.lists),)


@dataclass(frozen=True)
class UpdatesCase(harness.Case):
    """Update batches on the device and the host, requests after them (:func:`update_rows`)."""

    n_batches: int
    run_in: str = "both"
    batch_size: int = 1000  # ops a batch (the rows' batch column; the request rows' is 1)

    def variants(self) -> tuple[str, ...]:
        return ("update_batch_gpu", "update_batch_host", "request_after_update_batch", "request_alone_same_profiles",
                "update_batch_end_to_end")


@dataclass(frozen=True)
class HostBitsCase(harness.Case):
    """End-to-end updates with the host rows kept, then dropped (:func:`device_rows_only`)."""

    n_batches: int = 20
    batch_size: int = 1000  # ops a batch (the rows' batch column)
    access: str = "updates"

    def variants(self) -> tuple[str, ...]:
        return ("update_batch_end_to_end_host_bits_kept", "update_batch_end_to_end_host_bits_dropped")


@dataclass(frozen=True)
class QuarterCase(harness.Case):
    """A quarter-size world of its own (:func:`quarter_row`): an index layout (``sweep`` "layouts"),
    a rule density ("density") or a number of constrained categories ("categories")."""

    variant: str
    sweep: str
    index_layout: str = "default"
    constrain_prob: float = 0.3
    categories: int | None = None
    access: str = "pool"
    batch: int = 1
    run_in: str = "both"


def match_config(U=None, block=None, bounds=None, prefetch: bool = False, group: int = 0, lists: str = "auto"):
    """The MatchConfig of a benchmark row (None: the config's default)."""
    from ..match import MatchConfig

    given = {"words_per_thread": U, "block": block, "min_blocks_per_sm": bounds}
    return MatchConfig(prefetch=prefetch, group=group, list_kernels=lists,
                       **{k: v for k, v in given.items() if v is not None})


def layout_index_kwargs(name: str, schema, n: int) -> dict:
    """TargetingIndex keyword arguments of a quarter-size layout (:data:`QUARTER_LAYOUTS`)."""
    huge = 1 << 60
    high = [c.name for c in schema if c.cardinality >= 10_000]
    return {"default": {}, "per_category_folding": {"group_max": 1},
            "high_cardinality_lists_only": {"dense_min": {h: huge for h in high},
                                            "exclude_dense_min": {h: huge for h in high}},
            "high_cardinality_dense_n_over_16384": {"dense_min": {h: max(64, n // 16384) for h in high}}}[name]


ONE_REQUEST = "benchmark world, 1 request per launch set"
#: (stage name, kernels) of the stages phase
STAGE_KERNELS = (("prep", ("prep",)), ("match", ("match",)), ("post", ("post",)), ("prep_match", ("prep", "match")),
                 ("all", ("prep", "match", "post")))

#: phase -> cases, in run order
PHASES = {
    "main": (
        *(MatchCase(f"match_U{U}_b256", U, 256, run_in="both" if U == 4 else "full",
                    note=ONE_REQUEST + " (prep, match, post kernels); launch bounds {bounds}") for U in (1, 2, 4, 8, 16)),
        MatchCase("match_U4_b256_nobounds", 4, 256, bounds=0, run_in="full",
                  note="benchmark world; no launch bounds (72 registers, 768 threads/SM)"),
        MatchCase("match_U4_b512", 4, 512, note="benchmark world; launch bounds (512, 2)", run_in="full"),
        # the next category's first include row loaded one category ahead (two rows in flight)
        MatchCase("match_U4_b256_prefetch", 4, 256, prefetch=True, run_in="full",
                  note="benchmark world; prefetch; launch bounds (256, 4)"),
        MatchCase("match_U8_b256_prefetch_nobounds", 8, 256, bounds=0, prefetch=True, run_in="full",
                  note="benchmark world; prefetch; no launch bounds (92 registers)"),
        # the list passes on a segment grid (MatchConfig.list_kernels), verified
        MatchCase("match_U8_b256_segment_lists", 8, 256, lists="segment",
                  note=ONE_REQUEST + "; the list passes on a segment grid; launch bounds {bounds}"),
        *(MatchCase(f"match_batch{B}_U{U}", U, batch=B, profile_seed=500 + B, run_in=run_in,
                    note=f"{B} requests in one launch set (grid.y = request)")
          for B, Us, run_in in ((8, (4, 8), "full"), (32, (4, 8), "full"), (64, (4, 8), "full"), (16, (4,), "quick"))
          for U in Us),
        CpuCase()),
    # rows loaded `group` at a time (match.kernels.match_grouped_kernel): the plain kernel's chain of
    # ~22 dependent row loads per word becomes rows / group deep
    "grouped": (
        *(MatchCase(f"match_grouped_U{U}_G{G}_b256", U, 256, bounds=GROUPED_BOUNDS.get((U, G), 0), group=G,
                    contender=True, note=f"benchmark world; rows loaded {G} at a time; launch bounds " + "{bounds}")
          for U, G in GROUPED_SWEEP),
        *(MatchCase(f"match_grouped_batch{B}" + "_U{U}_G{G}", batch=B, profile_seed=500 + B, shape=FASTEST_GROUPED,
                    run_in=run_in, note=f"{B} requests in one launch set; the fastest grouped shape of this run")
          for B, run_in in ((8, "full"), (32, "full"), (64, "full"), (16, "quick"))),
        *(MatchCase("match_grouped_U{U}_G{G}_pool_prefix", prefix=m, shape=FASTEST_GROUPED,
                    note=f"the first {m:,} slots of the benchmark world's index; fastest grouped shape")
          for m in (10**6, 10**7))),
    # where one request's device time goes: the list passes around the match (prep: zero the counts,
    # scatter the sparse include lists into patch rows; post: clear sparse excludes from the result,
    # zero the patch rows) against the match itself, with the list passes on a search and a segment grid
    "stages": tuple(StageCase(f"match_U8_stage_{name}" + ("_segment" if lists == "segment" else ""), lists, kern)
                    for lists in ("search", "segment") for name, kern in STAGE_KERNELS
                    if lists == "search" or name != "match"),
    "pool": tuple(MatchCase("match_U4_pool_prefix", prefix=m, note=f"the first {m:,} slots of the benchmark world's index")
                  for m in (10**6, 10**7, 3 * 10**7)),
    "values": tuple(MatchCase(f"match_U4_user_values_{mv}", profile_seed=900 + mv, max_values=mv,
                              run_in="both" if mv in (0, 6) else "full",
                              note=f"users hold 0..{mv} values of each multi-valued category") for mv in (0, 1, 2, 6, 10)),
    "updates": (UpdatesCase(40, run_in="full"), UpdatesCase(20, run_in="quick")),
    "device": (HostBitsCase(),),  # last on the main world: it drops the world's host rows
    # the sweeps and the layout variants on a quarter-size pool (2.5 x 10^7 ads: rows of 3 MB, a
    # request still reads far more than the 60 MB L2), each a new world or a new index
    "layouts": tuple(QuarterCase("match_U4_" + ("density_0.3" if name == "default" else name), "layouts", name,
                                 run_in="both" if i < 2 else "full") for i, name in enumerate(QUARTER_LAYOUTS)),
    "density": tuple(QuarterCase(f"match_U4_density_{p}", "density", constrain_prob=p) for p in (0.1, 0.6)),
    "categories": tuple(QuarterCase(f"match_U4_categories_{k}", "categories", categories=k,
                                    run_in="both" if k == 5 else "full") for k in (2, 5, 10)),
}
DEFAULT_PHASES = tuple(PHASES)


def cases(options: harness.Options) -> dict:
    return PHASES


# ----------------------------------------------------------------------------- measuring


def bytes_of(world: World, prepared, n_words=None, max_requests: int = 8, prefetch: bool = False,
             group: int = 0) -> dict:
    """Byte model summed over a prepared batch's requests (andromeda_nb.match.read_model; a larger
    batch: its first ``max_requests`` requests, scaled to the batch), cached on the batch."""
    from ..match import MatchConfig, read_model

    key = ("bytes", n_words, bool(prefetch), int(group))
    cache = prepared.__dict__.setdefault("_model", {})
    if key in cache:
        return cache[key]
    tot = {"bytes": 0, "row_bytes": 0, "read_bytes": 0, "write_bytes": 0, "list_bytes": 0, "touched": 0,
           "rows": 0, "patches": 0}
    plans = prepared.plans[:max_requests]
    scale = len(prepared.plans) / len(plans)
    for plan in plans:
        r = read_model(world.index, plan, n_words, config=MatchConfig(prefetch=prefetch, group=group))
        tot["bytes"] += r["bytes"]
        tot["row_bytes"] += r["row_bytes"]
        tot["read_bytes"] += r["read_bytes"]
        tot["write_bytes"] += r["write_bytes"]
        tot["list_bytes"] += r["list_bytes"]
        tot["touched"] += r["touched_sectors"]
        tot["rows"] += r["rows_read"]
        tot["patches"] += plan.n_patches
    tot = {k: v * scale for k, v in tot.items()}
    cache[key] = tot
    return tot


def prepare_each(world: World, profiles, n_words=None):
    """One prepared single-request batch per profile."""
    return [world.dev.prepare([p], n_words=n_words) for p in profiles]


def time_requests(world: World, prepared: list, reps: int, U=None, block=None, n_words=None, bounds=None,
                  prefetch: bool = False, group: int = 0, lists: str = "auto"):
    """Time the prepared batches launched back to back; returns (timing per launch, out, counts)."""
    cuda = launch.cuda()
    B = max(p.batch for p in prepared)
    nw = world.index.n_words if n_words is None else n_words
    out = cuda.device_array((B, max(nw, 1)), np.uint64)
    counts = cuda.device_array(B, np.int64)
    config = match_config(U, block, bounds, prefetch, group, lists)

    def fn():
        for p in prepared:
            world.dev.launch(p, out, counts, config=config)

    t = harness.time_device(fn, reps=reps, busy_ms=2.0 + 0.4 * len(prepared))
    k = len(prepared)
    return harness.Timing(t.median / k, t.p20 / k, t.p80 / k, t.host_per_call / k, t.reps), out, counts


def verify_each(world: World, prepared: list, U=None, block=None, n_words=None, bounds=None,
                prefetch: bool = False, group: int = 0, lists: str = "auto") -> tuple[str, list]:
    """Launch each prepared batch once and check it (check_results); returns (verdict, counts)."""
    cuda = launch.cuda()
    nw = world.index.n_words if n_words is None else n_words
    counts_all = []
    for p in prepared:
        out = cuda.device_array((p.batch, max(nw, 1)), np.uint64)
        counts = cuda.device_array(p.batch, np.int64)
        world.dev.launch(p, out, counts, config=match_config(U, block, bounds, prefetch, group, lists))
        ok, msg, c = check_results(world, p, out, counts, n_words)
        if not ok:
            return "FAILED: " + msg, counts_all
        counts_all += c
    return f"ok: {len(counts_all)} requests = CPU baseline (full bitset, count) and oracle", counts_all


def l2_note(bytes_per_request: float) -> str:
    """Where one request's reads stand against the H100 / H200 L2 (50 MB)."""
    mb = bytes_per_request / 1e6
    if mb < 12.5:
        return f"a request reads {mb:.1f} MB: L2-resident across the back-to-back launches (L2 50 MB)"
    if mb < 50:
        return f"a request reads {mb:.0f} MB: within the 50 MB L2, partly resident across back-to-back launches"
    return f"a request reads {mb:.0f} MB: larger than the 50 MB L2"


def request_row(env, ceil, world: World, variant: str, prepared: list, reps: int, U=None, block=None,
                n_words=None, notes: str = "", batch: int = 1, access: str = "pool", bounds=None,
                prefetch: bool = False, group: int = 0, lists: str = "auto", **fields) -> dict:
    timing, _, _ = time_requests(world, prepared, reps, U, block, n_words, bounds, prefetch, group, lists)
    verified, counts = verify_each(world, prepared, U, block, n_words, bounds, prefetch, group, lists)
    nw = world.index.n_words if n_words is None else n_words
    n_bits = min(world.index.n_ads, nw * 64)
    b = {"bytes": 0, "row_bytes": 0, "rows": 0, "patches": 0, "list_bytes": 0, "touched": 0}
    n_req = 0
    for p in prepared:
        m = bytes_of(world, p, nw, prefetch=prefetch, group=group)
        for key in b:
            b[key] += m[key]
        n_req += p.batch
    per_launch = prepared[0].batch
    items = n_bits * per_launch
    bpa = b["bytes"] / (n_bits * n_req)
    bits = 8 * b["row_bytes"] / (n_bits * n_req)
    elig = (np.mean(counts) / n_bits) if counts else float("nan")
    l2 = l2_note(b["bytes"] / n_req)
    note = (f"bits_per_ad={bits:.3f}; rows_per_request={b['rows'] / n_req:.2f}; patches_per_request="
            f"{b['patches'] / n_req:.2f}; list_bytes_per_ad={b['list_bytes'] / (n_bits * n_req):.4f}; "
            f"touched_sectors_per_ad={b['touched'] / (n_bits * n_req):.4f}; {l2}; "
            f"{len(prepared)} launches back to back; bytes = row sectors + lists + touched sectors + result; {notes}")
    row = harness.row("targeting", env, ceil, timing, items, bpa, None, verified, variant=variant,
                    n_ads=n_bits, access=access, eligible_fraction=f"{elig:.5f}", categories=len(world.schema),
                    batch=batch, layout=layout_name(world.index), notes=note, **fields)
    return row


def cpu_row(env, ceil, world: World, variant: str, reps: int = 5, notes: str = "") -> dict:
    """The CPU baseline: the same plans, Numba-parallel over words on the host's cores (``variant``'s
    ``{threads}``: Numba's thread count)."""
    import numba

    idx = world.index
    times = []
    verified = "ok"
    n_bits = idx.n_ads
    sample_rules = idx.rules_of_slots(world.sample)
    total_bytes = 0
    for p in world.profiles:
        idx.match_cpu(p)  # warm-up (compiles once)
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            words, count = idx.match_cpu(p)
            ts.append(time.perf_counter() - t)
        times.append(ts)
        got = sample_bits(words, world.sample)
        if not np.array_equal(got, reference.match(sample_rules, make_profile(idx.schema, p))):
            verified = "FAILED: CPU baseline disagrees with the oracle"
        from ..match import read_model

        total_bytes += read_model(idx, idx.plan(make_profile(idx.schema, p)))["bytes"]
    per = np.array(times).sum(axis=0)  # one "call" = all profiles
    k = len(world.profiles)
    q = np.quantile(per, [0.2, 0.5, 0.8]) / k
    timing = harness.Timing(float(q[1]), float(q[0]), float(q[2]), float(q[1]), reps)
    if verified == "ok":
        verified = f"ok: {k} requests, oracle on {world.sample.size} ads"
    row = harness.row("targeting", env, ceil, timing, n_bits, total_bytes / (n_bits * k), None, verified,
                    variant=variant.format(threads=numba.get_num_threads()), n_ads=n_bits, access="pool",
                    categories=len(world.schema), batch=1, layout=layout_name(idx),
                    notes=f"device={cpu_name()}; wall time per request (perf_counter, median of {reps}); "
                          f"same plan and rows on the host; fraction_of_read_ceiling is against the GPU's; {notes}")
    row["device"] = f"CPU: {cpu_name()} ({os.cpu_count()} cores)"
    return row




def update_rows(env, ceil, world: World, reps: int, n_batches: int = 40, batch_size: int = 1000) -> list[dict]:
    from ..match.staging import Stager

    cuda = launch.cuda()
    rows = []
    dev, idx = world.dev, world.index
    stream = world.stream = UpdateStream(world)  # kept: later sections continue the same id history
    # correctness in lockstep: update, request, compare with the CPU baseline (same state)
    checks = []
    for k in range(3):
        dev.apply(stream.batch(batch_size))
        prep = dev.prepare([world.profiles[k]])
        out, counts = dev.launch(prep)
        ok, msg, _ = check_results(world, prep, out, counts)
        checks.append(ok)
        if not ok:
            log("update check FAILED: " + msg)
    lockstep = "ok: 3 requests after update batches = CPU baseline + oracle" if all(checks) else "FAILED: lockstep"
    # host side: the diffs (timed), then the device side (timed with events, all batches queued)
    batches = [stream.batch(batch_size) for _ in range(n_batches)]
    dev._stager = Stager(regions=n_batches + 8, capacity=1 << 20)
    host_t, deltas = [], []
    for b in batches:
        t = time.perf_counter()
        deltas.append(idx.apply(b))
        host_t.append(time.perf_counter() - t)
    flips = np.array([d.bits_changed for d in deltas])
    h2d = np.array([8 * (d.bit_codes.size + 2 * d.list_pos.size) for d in deltas])
    harness.busy(50.0 + 10.0 * n_batches)  # long enough for the host to queue every batch behind it
    s, e = cuda.event(), cuda.event()
    s.record()
    t = time.perf_counter()
    for d in deltas:
        dev.apply_delta(d)
    enqueue = time.perf_counter() - t
    host_bound = s.query()  # the GPU reached the start event before the host finished queueing
    e.record()
    e.synchronize()
    gpu = cuda.event_elapsed_time(s, e) / 1e3
    per = gpu / n_batches
    ops = n_batches * batch_size
    # check the touched words of every row, a few whole rows, and the lists, against the host copy
    touched = np.unique(np.concatenate([(d.bit_codes & ((1 << 40) - 1)) >> 6 for d in deltas]))
    ok_rows = rows_equal(world, touched)
    verified = lockstep if ok_rows else "FAILED: device rows differ from the host copy after updates"
    timing = harness.Timing(per, per, per, enqueue / n_batches, 1)
    note = (f"{n_batches} batches of {batch_size} mixed ops (1/3 create, 1/3 change, 1/3 retire) queued behind a "
            f"busy kernel, GPU time incl. the async copy of the codes; bit flips per op {flips.mean() / batch_size:.0f}; "
            f"codes copied per op {h2d.mean() / batch_size:.0f} B; device rows (touched words of all rows) = host copy"
            + ("; HOST-BOUND: the busy kernel ended before the host finished queueing (GPU time includes host gaps)"
               if host_bound else "; the host finished queueing before the busy kernel ended"))
    r = harness.row("targeting", env, ceil, timing, batch_size, float(h2d.mean() / batch_size), None, verified,
                  variant="update_batch_gpu", n_ads=idx.n_ads, access="updates", batch=batch_size,
                  categories=len(world.schema), layout=layout_name(idx), notes=note)
    rows.append(r)
    hq = np.quantile(host_t, [0.2, 0.5, 0.8])
    timing = harness.Timing(float(hq[1]), float(hq[0]), float(hq[2]), float(hq[1]), len(host_t))
    r = harness.row("targeting", env, ceil, timing, batch_size, float(h2d.mean() / batch_size), None, verified,
                  variant="update_batch_host", n_ads=idx.n_ads, access="updates", batch=batch_size,
                  categories=len(world.schema), layout=layout_name(idx),
                  notes="host side of one batch: validate, allocate slots, diff to bit flips and list ops, apply "
                        "to the host copy (TargetingIndex.apply; single-threaded Numba); wall time")
    rows.append(r)
    # requests interleaved with update batches vs requests alone (GPU time per request)
    n_pairs = 16
    pairs = []
    for k in range(n_pairs):
        d = idx.apply(stream.batch(batch_size))
        prof = world.profiles[k % len(world.profiles)]
        pairs.append((d, dev.prepare([prof])))
    out = cuda.device_array((1, idx.n_words), np.uint64)
    counts = cuda.device_array(1, np.int64)
    harness.busy(50.0 + 10.0 * n_pairs)
    s, e = cuda.event(), cuda.event()
    s.record()
    for d, p in pairs:
        dev.apply_delta(d)
        dev.launch(p, out, counts)
    pairs_host_bound = s.query()
    e.record()
    e.synchronize()
    both = cuda.event_elapsed_time(s, e) / 1e3 / n_pairs
    ok, msg, _ = check_results(world, pairs[-1][1], out, counts)
    alone = prepare_each(world, [p.profiles[0] for _, p in pairs])
    t_alone, _, _ = time_requests(world, alone, reps)
    timing = harness.Timing(both, both, both, 0.0, 1)
    r = harness.row("targeting", env, ceil, timing, idx.n_ads, 0.0, None,
                  ("ok: last request = CPU baseline + oracle" if ok else "FAILED: " + msg),
                  variant="request_after_update_batch", n_ads=idx.n_ads, access="pool+updates", batch=1,
                  categories=len(world.schema), layout=layout_name(idx),
                  notes=f"GPU time of one update batch ({batch_size} ops) + one request, {n_pairs} pairs queued; "
                        f"the request alone takes {t_alone.median * 1e6:.1f} us (row request_alone_same_profiles); "
                        f"items = pool ads of the request; bytes_per_item not counted"
                        + ("; HOST-BOUND queueing" if pairs_host_bound else "; queued ahead of the GPU"))
    rows.append(r)
    r = harness.row("targeting", env, ceil, t_alone, idx.n_ads, 0.0, None, verify_each(world, alone[:2])[0],
                  variant="request_alone_same_profiles", n_ads=idx.n_ads, access="pool", batch=1,
                  categories=len(world.schema), layout=layout_name(idx),
                  notes="the same profiles as request_after_update_batch, without updates in between")
    rows.append(r)
    e2e_batches = [stream.batch(batch_size) for _ in range(10)]
    cuda.synchronize()
    t = time.perf_counter()
    for b in e2e_batches:
        dev.apply(b)
    cuda.synchronize()
    wall = (time.perf_counter() - t) / len(e2e_batches)
    timing = harness.Timing(wall, wall, wall, wall, 1)
    r = harness.row("targeting", env, ceil, timing, batch_size, 0.0, None, verified,
                  variant="update_batch_end_to_end", n_ads=idx.n_ads, access="updates", batch=batch_size,
                  categories=len(world.schema), layout=layout_name(idx),
                  notes="DeviceTargetingIndex.apply on 10 batches then a sync: host diff + copy + kernel, wall time")
    rows.append(r)
    log(f"updates: GPU {ops / gpu / 1e6:.2f} M ops/s, host {batch_size / hq[1] / 1e6:.2f} M ops/s, "
        f"end-to-end {batch_size / wall / 1e6:.2f} M ops/s; request alone {t_alone.median * 1e6:.1f} us, "
        f"with a batch before it {both * 1e6:.1f} us")
    return rows


def device_rows_only(env, ceil, world: World, n_batches: int = 20, batch_size: int = 1000) -> list[dict]:
    """End-to-end update throughput with the host keeping its bitset rows, then without them
    (``TargetingIndex.drop_host_bits``: the rows live on the device only). Runs last: it drops the
    world's host rows. Verified by a request after the batches against the rule oracle on the
    sample slots and the popcount of its own bitset (the CPU baseline needs the host rows)."""
    stream = getattr(world, "stream", None) or UpdateStream(world)
    dev, idx, cuda = world.dev, world.index, launch.cuda()
    rows = []
    for label in ("kept", "dropped"):
        if label == "dropped":
            idx.drop_host_bits()
        batches = [stream.batch(batch_size) for _ in range(n_batches + 2)]
        for b in batches[:2]:  # warm-up (Numba dispatch, staging buffers)
            dev.apply(b)
        cuda.synchronize()
        t = time.perf_counter()
        for b in batches[2:]:
            dev.apply(b)
        cuda.synchronize()
        wall = (time.perf_counter() - t) / n_batches
        prof = world.profiles[0]
        prep = dev.prepare([prof])
        out, counts = dev.launch(prep)
        words, count = out.copy_to_host()[0], int(counts.copy_to_host()[0])
        got = sample_bits(words, world.sample)
        want = reference.match(idx.rules_of_slots(world.sample), make_profile(idx.schema, prof))
        ok = np.array_equal(got, want) and count == int(np.bitwise_count(words).sum())
        verified = (f"ok: a request after the batches = oracle on {world.sample.size} ads, count = popcount" if ok
                    else "FAILED: request after the batches disagrees with the oracle")
        timing = harness.Timing(wall, wall, wall, wall, n_batches)
        rows.append(harness.row(
            "targeting", env, ceil, timing, batch_size, 0.0, None, verified,
            variant=f"update_batch_end_to_end_host_bits_{label}", n_ads=idx.n_ads, access="updates",
            batch=batch_size, categories=len(world.schema), layout=layout_name(idx),
            notes=f"DeviceTargetingIndex.apply on {n_batches} batches then a sync, wall time; host bitset rows "
                  + ("kept and flipped on every update" if label == "kept" else
                     "dropped (rows on the device only: no host bit flips, popcounts kept)")))
    return rows


# ----------------------------------------------------------------------------- the cases' measurements


def match_row(run, case: MatchCase) -> list[dict]:
    """A :class:`MatchCase` on the main world (none when it needs a grouped shape and none verified)."""
    from ..datasets import synthetic as syn

    world = run.main_world()
    U, group, bounds, variant = case.words_per_thread, case.group, case.bounds, case.variant
    if case.shape == FASTEST_GROUPED:
        if run.fastest_grouped is None:
            log(f"skipping {variant}: no grouped shape verified in this run")
            return []
        _, U, group, bounds = run.fastest_grouped
        variant = variant.format(U=U, G=group)
    n_words = -(-case.prefix // 64) if case.prefix else None
    if case.batch > 1:
        prepared = [world.dev.prepare(syn.generate_profiles(world.schema, case.batch, seed=case.profile_seed))]
    elif case.profile_seed is not None:
        kw = {} if case.max_values is None else {"max_values": case.max_values}
        prepared = prepare_each(world, syn.generate_profiles(world.schema, PROFILES, seed=case.profile_seed, **kw))
    elif n_words is not None:
        prepared = prepare_each(world, world.profiles, n_words=n_words)
    else:
        prepared = run.main_prep
    config = match_config(U, case.block, bounds, case.prefetch, group, case.lists)
    lb = config.launch_bounds(simulator=False)
    notes = case.note.format(bounds=f"({config.block_size(False)}, {lb})" if lb else "none")
    return [request_row(run.env, run.ceil, world, variant, prepared, run.options.reps, U=U, block=case.block,
                        n_words=n_words, notes=notes, batch=case.batch, access=case.access, bounds=bounds,
                        prefetch=case.prefetch, group=group, lists=case.lists)]


def cpu_case_row(run, case: CpuCase) -> dict:
    return cpu_row(run.env, run.ceil, run.main_world(), case.variant)


def stage_row(run, case: StageCase) -> dict:
    """Some kernels of each main-world request's launch set, 8 times back to back, one request at a
    time (requests share the patch rows: mixing them would leave their union in the rows); buffers
    preallocated (an allocation in the timed call stalls the stream)."""
    from ..device import launch

    world = run.main_world()
    cuda = launch.cuda()
    out = cuda.device_array((1, max(world.index.n_words, 1)), np.uint64)
    counts = cuda.device_array(1, np.int64)
    (config,) = case.configs()
    reps, reps_k = run.options.reps, 8
    per = []
    for p in run.main_prep:
        world.dev.launch(p, out, counts, config, kernels=("prep",))  # its patch rows, as the match expects
        t = harness.time_device(lambda: [world.dev.launch(p, out, counts, config, kernels=case.kernels)
                                         for _ in range(reps_k)], reps=reps, busy_ms=6.0)
        per.append(harness.Timing(t.median / reps_k, t.p20 / reps_k, t.p80 / reps_k, t.host_per_call / reps_k, t.reps))
        world.dev.launch(p, out, counts, config, kernels=("post",))  # its patch rows zeroed again
    k = len(per)
    med = sorted(per, key=lambda x: x.median)[k // 2]
    timing = harness.Timing(sum(x.median for x in per) / k, sum(x.p20 for x in per) / k,
                            sum(x.p80 for x in per) / k, sum(x.host_per_call for x in per) / k, med.reps)
    row = harness.row("targeting", run.env, run.ceil, timing, world.index.n_ads, 0.0, None,
                      "n/a (stage timing: a partial launch set; the full set is verified in 'main')",
                      **case.columns(), n_ads=world.index.n_ads, categories=len(world.schema),
                      layout=layout_name(world.index),
                      notes=f"kernels {'+'.join(case.kernels)} of one request's launch set, 8 times back to back; "
                            f"mean over {k} requests of the median of {reps}")
    row.update(bytes_per_item="", achieved_TBps="", fraction_of_read_ceiling="")  # not a byte-model row
    return row


def updates_rows(run, case: UpdatesCase) -> list[dict]:
    return update_rows(run.env, run.ceil, run.main_world(), run.options.reps, n_batches=case.n_batches,
                       batch_size=case.batch_size)


def host_bits_rows(run, case: HostBitsCase) -> list[dict]:
    return device_rows_only(run.env, run.ceil, run.main_world(), n_batches=case.n_batches, batch_size=case.batch_size)


def quarter_row(run, case: QuarterCase) -> dict:
    """A :class:`QuarterCase` on its own quarter-size world (freed after it)."""

    n = run.options.n_ads
    n_sweep = max(1, n // 4)
    if case.sweep == "layouts":
        rules = run.quarter_rules(n_sweep)
        kw = layout_index_kwargs(case.index_layout, rules.schema, n_sweep)
        w = World(n_sweep, index_kw=kw, rules=rules, seed=1)
        if kw:  # memory scaled to the full pool (the default's is measured at full size)
            run.memory.extend(memory_rows(run.env, w, case.index_layout, n))
        notes = (f"{n_sweep:,}-ad world (seed 1); layout "
                 f"{'default (also the 0.3 point of the density sweep)' if not kw else case.index_layout}")
    elif case.sweep == "density":
        w = World(n_sweep, constrain_prob=case.constrain_prob, seed=1)
        notes = (f"{n_sweep:,}-ad world: each ad constrains a category with probability {case.constrain_prob} "
                 f"(benchmark: 0.3, row match_U4_density_0.3)")
    else:
        k = case.categories
        constrain, exclude = np.zeros(20), np.zeros(20)
        constrain[CATEGORY_ORDER[:k]] = case.constrain_prob
        exclude[CATEGORY_ORDER[:k]] = 0.05
        w = World(n_sweep, constrain_prob=constrain, exclude_prob=exclude, seed=1)
        names = "/".join(w.schema.categories[c].name for c in CATEGORY_ORDER[:k])
        notes = f"{n_sweep:,}-ad world: ads constrain {k} of the 20 categories ({names}); 20: row match_U4_density_0.3"
    try:
        r = request_row(run.env, run.ceil, w, case.variant, prepare_each(w, w.profiles), run.options.reps,
                        notes=notes, batch=case.batch, access=case.access)
        if case.categories is not None:
            r["categories"] = case.categories
    finally:
        w.free()
        gc.collect()
    return r


class Run(harness.Run):
    """The targeting run: the full-size world (built on its first case, freed after its phases),
    the fastest verified grouped shape, the index memory rows (``targeting_memory.csv``)."""

    MEASURE = {MatchCase: match_row, CpuCase: cpu_case_row, StageCase: stage_row, UpdatesCase: updates_rows,
               HostBitsCase: host_bits_rows, QuarterCase: quarter_row}

    def __init__(self, env, ceil, options):
        super().__init__(env, ceil, options)
        restart_clock()
        self.world = self.main_prep = self._world_error = self._rules = None
        self.fastest_grouped = None  # (seconds, words_per_thread, group, bounds)
        self.memory: list[dict] = []
        self._phase = None
        log(f"targeting suite: n={options.n_ads:,}, reps={options.reps}, quick={options.quick}, "
            f"CPU {cpu_name()} x{os.cpu_count()}")

    def main_world(self):
        """The full-size benchmark world with 4,096 spare slots, its requests prepared."""
        if self.world is None:
            if self._world_error is not None:
                raise RuntimeError(f"the benchmark world could not be built: {self._world_error!r}")
            try:
                self.world = World(self.options.n_ads, spare=4096)
            except Exception as exc:
                self._world_error = exc
                raise
            self.memory.extend(memory_rows(self.env, self.world, "default", self.options.n_ads))
            self.main_prep = prepare_each(self.world, self.world.profiles)
        return self.world

    def quarter_rules(self, n: int):
        """The quarter-size world's rules (seed 1), shared by the layouts."""
        from ..datasets import synthetic as syn

        if self._rules is None or self._rules.n_ads != n:
            self._rules = syn.generate_rules(syn.benchmark_schema(), n, seed=1)
        return self._rules

    def free_main_world(self) -> None:
        if self.world is not None:
            self.world.free()
        self.world = self.main_prep = None
        gc.collect()

    def measure(self, planned):
        phase, case = planned.phase, planned.case
        if phase != self._phase:
            if phase not in MAIN_WORLD_PHASES:
                self.free_main_world()
            if phase != "layouts":
                self._rules = None
            log(f"--- {phase}")
            self._phase = phase
        if phase not in ("main", "updates") and elapsed() > BUDGET_S:
            log(f"skipping {case.variants()[0]}: past the {BUDGET_S}s budget")
            return []
        try:
            rows = super().measure(planned)
        except Exception as exc:  # keep the other cases' rows
            traceback.print_exc()
            return [harness.failed_row(self.env, "targeting", case.variants()[0], exc)]
        if getattr(case, "contender", False) and rows and rows[0]["verified"].startswith("ok"):
            seconds = float(rows[0]["seconds_median"])
            if self.fastest_grouped is None or seconds < self.fastest_grouped[0]:
                self.fastest_grouped = (seconds, case.words_per_thread, case.group, case.bounds)
        return rows

    def close(self) -> None:
        self.free_main_world()
        write_memory(self.memory, self.options.out)
        log("targeting suite done")
