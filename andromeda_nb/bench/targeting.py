"""Targeting benchmark suite: ``python -m andromeda_nb.bench targeting`` (GPU only, ~4 minutes).

World: docs/design.md's benchmark world (:func:`andromeda_nb.datasets.synthetic.benchmark_schema`,
``generate_rules`` defaults: 10^8 ads, 20 categories, each constrained with probability 0.3,
excluded with 0.05, Zipf 1.2; 4,096 spare slots for creates), user profiles from
``generate_profiles`` (a multi-valued category holds 0..3 values). Index layout: the default of
:func:`andromeda_nb.targeting.choose_layout`: single-valued categories folded in groups of at most
512 rows (the live bit folded into the smallest group), split categories with an include' row per
value included by >= n/1024 ads, an exclude row per value excluded by >= n/256 ads, inverted lists
for the rest.

Sections (rows' ``variant``): ``match_U{1,2,4,8}_b256`` (words per thread; launch bounds from
``match.config.THREADS_PER_SM_BOUNDS``), ``match_U4_b256_nobounds``, ``match_U4_b512`` (one request at a
time, 8 profiles back to back), ``match_batch{8,32,64}_U4`` (requests per launch), the CPU baseline
``cpu_numba_parallel_*``; ``match_U4_pool_prefix`` (the first 10^6 / 10^7 / 3x10^7 slots),
``match_U4_user_values_{0,1,2,6,10}``; updates (``update_batch_gpu``, ``update_batch_host``,
``update_batch_end_to_end``, ``request_after_update_batch`` vs ``request_alone_same_profiles``);
then on a quarter-size world (2.5x10^7 ads; a request still reads far more than L2): the default
layout (``match_U4_density_0.3``) against ``per_category_folding``,
``high_cardinality_lists_only``, ``high_cardinality_dense_n_over_16384``, the rule density
(``match_U4_density_{0.1,0.6}``) and the number of constrained categories
(``match_U4_categories_{2,5,10}``). Sections after the updates are skipped past ``BUDGET_S``.

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
import math
import os
import platform
import time
import traceback

import numpy as np

from . import harness
from ..device import launch
from .. import reference
from ..datasets import synthetic as syn
from ..targeting import (RETIRE, CREATE, CHANGE, TargetingIndex, TargetingRules, UpdateBatch, make_profile,
                        mask_from_bits)

T0 = time.time()
PROFILES = 8  # requests launched back to back per timed call
SAMPLE = 2048  # slots checked against the oracle per request
BUDGET_S = 200  # optional sections are skipped past this many seconds of the suite
# --phases of the suite (default all); the first five run on the full-size benchmark world
PHASE_OF = {"main": "main", "grouped": "grouped", "stages": "stages", "pool size": "pool", "user values": "values", "updates": "updates",
            "device rows only": "device", "layouts": "layouts", "rule density": "density",
            "categories": "categories"}
PHASES = tuple(PHASE_OF.values())
#: the order in which the categories sweep turns categories on (a mix of kinds at every size)
CATEGORY_ORDER = [0, 14, 18, 1, 2, 15, 3, 4, 5, 19, 16, 6, 7, 8, 17, 9, 10, 11, 12, 13]


def log(msg: str) -> None:
    print(f"[targeting {time.time() - T0:6.1f}s] {msg}", flush=True)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def layout_name(index: TargetingIndex) -> str:
    L = index.layout
    n_split = sum(1 for c in range(len(index.schema)) if index.cat_group[c] < 0)
    return (f"folded groups<={L.group_max} rows ({len(L.groups)} groups); {n_split} split: include rows for "
            f">={L.dense_min} ads, exclude rows for >={min(L.exclude_dense_min, 1 << 40)} ads, lists")


# ----------------------------------------------------------------------------- worlds


class World:
    """A generated world: rules, host index, device index, profiles, oracle sample."""

    def __init__(self, n: int, seed: int = 0, spare: int = 0, constrain_prob=0.3, exclude_prob=0.05,
                 index_kw=None, profiles: int = PROFILES, max_values: int = syn.MAX_USER_VALUES,
                 rules: TargetingRules | None = None):
        from ..match.api import DeviceTargetingIndex

        t = time.time()
        self.schema = syn.benchmark_schema()
        self.rules = rules if rules is not None else syn.generate_rules(
            self.schema, n, constrain_prob=constrain_prob, exclude_prob=exclude_prob, seed=seed)
        t_gen = time.time() - t
        t = time.time()
        self.index = TargetingIndex(self.rules, n + spare, **(index_kw or {}))
        t_build = time.time() - t
        t = time.time()
        self.dev = DeviceTargetingIndex(self.index)
        launch.cuda().synchronize()
        t_up = time.time() - t
        self.n = n
        self.profiles = syn.generate_profiles(self.schema, profiles, seed=seed + 101, max_values=max_values)
        rng = np.random.default_rng(seed + 7)
        self.sample = np.sort(rng.choice(n, min(SAMPLE, n), replace=False))
        log(f"world n={n:,} constrain={constrain_prob}: generated {t_gen:.1f}s, index {t_build:.1f}s "
            f"({self.index.n_rows} rows, {self.index.nbytes / 1e9:.1f} GB), uploaded {t_up:.1f}s")

    def free(self):
        self.dev = None
        self.index = None
        gc.collect()
        try:
            launch.cuda().current_context().deallocations.clear()
        except Exception:
            pass


# ----------------------------------------------------------------------------- checks


def sample_bits(words: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Bits of some slots of a host bitset, without unpacking it."""
    return ((words[slots >> 6] >> (slots & 63).astype(np.uint64)) & np.uint64(1)).astype(bool)


def check_results(world: World, prepared, words_dev, counts_dev, n_words=None) -> tuple[bool, str, list]:
    """Each request of a prepared batch: the GPU words equal the CPU baseline's (full bitset), the
    count equals, and the oracle agrees on the sample slots (those inside the matched span).
    Returns (ok, message, counts)."""
    idx = world.index
    nw = idx.n_words if n_words is None else n_words
    n_bits = min(idx.n_ads, nw * 64)
    words = words_dev.copy_to_host()
    counts = counts_dev.copy_to_host()
    sample = world.sample[world.sample < n_bits]
    sample_rules = idx.rules_of_slots(sample)
    for b in range(prepared.batch):
        prof = prepared.profiles[b]
        cpu_words, cpu_count = idx.match_cpu(prof, n_words=nw)
        if not np.array_equal(words[b, :nw], cpu_words):
            bad = int(np.flatnonzero(words[b, :nw] != cpu_words)[0])
            return False, f"request {b}: GPU bitset differs from the CPU baseline at word {bad}", []
        pop = int(np.bitwise_count(words[b, :nw]).sum())
        if int(counts[b]) != cpu_count or pop != cpu_count:
            return False, f"request {b}: count {int(counts[b])} (bits set {pop}) != CPU {cpu_count}", []
        got = sample_bits(words[b, :nw], sample)
        want = reference.match(sample_rules, make_profile(idx.schema, prof))
        if not np.array_equal(got, want):
            return False, f"request {b}: oracle disagrees on {int((got != want).sum())} of {sample.size} sampled ads", []
    return True, (f"ok: {prepared.batch} requests = CPU baseline (full bitset, count) and oracle "
                  f"({sample.size} ads)"), counts[:prepared.batch].tolist()


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


def match_config(U=None, block=None, bounds=None, prefetch: bool = False, group: int = 0, lists: str = "auto"):
    """The MatchConfig of a benchmark row (None: the config's default)."""
    from ..match import MatchConfig

    given = {"words_per_thread": U, "block": block, "min_blocks_per_sm": bounds}
    return MatchConfig(prefetch=prefetch, group=group, list_kernels=lists,
                       **{k: v for k, v in given.items() if v is not None})


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
    harness.print_rows([row])
    return row


def cpu_row(env, ceil, world: World, reps: int = 5, notes: str = "") -> dict:
    """The CPU baseline: the same plans, Numba-parallel over words on the host's cores."""
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
                    variant=f"cpu_numba_parallel_{numba.get_num_threads()}threads", n_ads=n_bits, access="pool",
                    categories=len(world.schema), batch=1, layout=layout_name(idx),
                    notes=f"device={cpu_name()}; wall time per request (perf_counter, median of {reps}); "
                          f"same plan and rows on the host; fraction_of_read_ceiling is against the GPU's; {notes}")
    row["device"] = f"CPU: {cpu_name()} ({os.cpu_count()} cores)"
    harness.print_rows([row])
    return row


# ----------------------------------------------------------------------------- updates


def batch_from_templates(schema, templates: TargetingRules, tmpl_idx, ops, ids, live) -> UpdateBatch:
    """An UpdateBatch whose create / change ops take the rules of template ads (retires: none)."""
    k = ops.size
    sub = templates.subset(tmpl_idx)
    keep = ops != RETIRE

    def strip(csr):
        out = {}
        for name, (ptr, vals) in csr.items():
            sizes = np.diff(ptr) * keep
            new_ptr = np.zeros(k + 1, np.int64)
            np.cumsum(sizes, out=new_ptr[1:])
            mask = np.repeat(keep, np.diff(ptr))
            out[name] = (new_ptr, vals[mask])
        return out

    return UpdateBatch.from_columns(schema, ops, ids, live & keep, strip(sub.include), strip(sub.exclude))


class UpdateStream:
    """Random valid update batches (1/3 creates of new ids, 1/3 changes, 1/3 retires of live ids)."""

    def __init__(self, world: World, seed: int = 11, n_templates: int = 100_000, max_creates: int = 1 << 20):
        self.world = world
        self.rng = np.random.default_rng(seed)
        self.templates = syn.generate_rules(world.schema, n_templates, seed=seed + 1000)
        ids = world.rules.ad_ids
        self.alive = np.empty(ids.size + max_creates, np.int64)  # live ids in [0, n_alive), swap-remove
        self.alive[:ids.size] = ids
        self.n_alive = ids.size
        self.next_id = int(ids.max()) + 1 if ids.size else 0

    def batch(self, size: int = 1000) -> UpdateBatch:
        rng = self.rng
        n_new = size // 3
        n_old = size - n_new
        pick = rng.choice(self.n_alive, n_old, replace=False)
        old_ids = self.alive[pick]
        n_ret = n_old // 2
        ops = np.concatenate([np.full(n_new, CREATE), np.full(n_old - n_ret, CHANGE), np.full(n_ret, RETIRE)])
        new_ids = np.arange(self.next_id, self.next_id + n_new)
        ids = np.concatenate([new_ids, old_ids])
        order = rng.permutation(size)
        ops, ids = ops[order].astype(np.int8), ids[order].astype(np.int64)
        live = rng.random(size) < 0.99
        tmpl = rng.integers(0, self.templates.n_ads, size)
        batch = batch_from_templates(self.world.schema, self.templates, tmpl, ops, ids, live)
        for i in sorted(pick[n_old - n_ret:].tolist(), reverse=True):  # retired ids leave
            self.n_alive -= 1
            self.alive[i] = self.alive[self.n_alive]
        self.alive[self.n_alive:self.n_alive + n_new] = new_ids  # created ids join
        self.n_alive += n_new
        self.next_id += n_new
        return batch


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
    ok_rows = _rows_equal(world, touched)
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
    harness.print_rows(rows)
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
        harness.print_rows(rows[-1:])
    return rows


def _rows_equal(world: World, words: np.ndarray, n_full: int = 16) -> bool:
    """Device rows equal the host copy on the given words of every row and on a few whole rows;
    the device list pool equals the host's on every live list segment."""
    idx = world.index
    words = words[words < idx.n_words]
    try:
        import cupy as cp

        dev_rows = cp.asarray(world.dev.rows)
        got = dev_rows[:, cp.asarray(words)].get()
        full = [(int(r), dev_rows[int(r)].get()) for r in
                np.random.default_rng(3).choice(idx.n_rows, min(n_full, idx.n_rows), replace=False)]
        pool = cp.asarray(world.dev.pool)[: idx.pool.size].get()
    except ImportError:  # the simulator (tests): small pools, copy everything
        host_rows = world.dev.rows.copy_to_host()
        got = host_rows[:, words]
        full = [(r, host_rows[r]) for r in range(idx.n_rows)]
        pool = world.dev.pool.copy_to_host()[: idx.pool.size]
    if not np.array_equal(got, idx.bitsets[:, words]):
        return False
    if not all(np.array_equal(row, idx.bitsets[r]) for r, row in full):
        return False
    mine, theirs = idx.list_sets(), idx._list_sets_of(pool)
    return mine.keys() == theirs.keys() and all(np.array_equal(mine[k], theirs[k]) for k in mine)


# ----------------------------------------------------------------------------- the suite


def memory_rows(env, world: World, label: str, n_at: int) -> list[dict]:
    """Index memory per storage unit (a folded group or a split category) at ``n_at`` ads, as
    rows of the results schema (``variant`` = memory_<layout>_<unit>; timing columns empty)."""
    out = []
    for u in world.index.memory_by_category(n_at):
        r = {c: "" for c in harness.SCHEMA + harness.EXTRA}
        r.update(env, suite="targeting", variant=f"memory_{label}_{u['unit']}", n_ads=n_at,
                 verified="n/a (memory accounting of the host index)", layout=label, pool_ads=n_at)
        r.update(u)  # unit, categories, rows, storage, bytes, ...
        out.append(r)
    return out


def write_memory(rows: list[dict], out_dir: str) -> None:
    import csv
    from pathlib import Path

    if not rows:
        return
    path = Path(out_dir) / "targeting_memory.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys([*harness.SCHEMA, *harness.EXTRA, *(k for r in rows for k in r)]))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    log(f"wrote {len(rows)} rows to {path}")


def failed_row(env, variant: str, exc: BaseException) -> dict:
    r = {c: "" for c in harness.SCHEMA + harness.EXTRA}
    r.update(env, suite="targeting", variant=variant, verified=f"FAILED: {type(exc).__name__}: {exc}"[:300])
    return r


#: (words per thread, rows per group) of the grouped-match sweep, and their launch bounds (blocks of
#: 256 per SM; sm_90 ptxas registers without bounds: U1G8 40, U2G4 42, U2G8 62, U4G2 54, U4G4 68,
#: U4G8 104, U8G2 95, U8G4 128; with these bounds none spills: U4G4 at (256, 4) spilled 88 bytes)
GROUPED_SWEEP = [(1, 8), (2, 4), (2, 8), (4, 2), (4, 4), (4, 8), (8, 2), (8, 4)]
GROUPED_BOUNDS = {(1, 8): 6, (2, 4): 6, (2, 8): 4, (4, 2): 4, (4, 4): 3, (4, 8): 2, (8, 2): 2, (8, 4): 2}


def targeting(env, ceil, args) -> list[dict]:
    global T0
    T0 = time.time()
    n = int(args.n_ads)
    reps = int(args.reps)
    quick = bool(getattr(args, "quick", False))
    rows: list[dict] = []
    mem: list[dict] = []
    log(f"targeting suite: n={n:,}, reps={reps}, quick={quick}, CPU {cpu_name()} x{os.cpu_count()}")

    phases = set(args.phases.split(",")) if getattr(args, "phases", None) else set(PHASES)
    unknown = phases - set(PHASES)
    if unknown:
        raise SystemExit(f"unknown targeting phases {sorted(unknown)}; known: {', '.join(PHASES)}")

    def section(name, fn):
        if PHASE_OF[name] not in phases:
            return
        if time.time() - T0 > BUDGET_S and name not in ("main", "updates"):
            log(f"skipping {name}: past the {BUDGET_S}s budget")
            return
        log(f"--- {name}")
        try:
            fn()
        except Exception as exc:  # keep the other sections' rows
            traceback.print_exc()
            rows.append(failed_row(env, name, exc))

    on_main_world = {"main", "grouped", "stages", "pool", "values", "updates", "device"}
    world = World(n, spare=4096) if phases & on_main_world else None
    if world is not None:
        mem.extend(memory_rows(env, world, "default", n))
        main_prep = prepare_each(world, world.profiles)

    def main():
        from ..match import MatchConfig

        for U in ([4] if quick else [1, 2, 4, 8, 16]):
            lb = MatchConfig(words_per_thread=U, block=256).launch_bounds(simulator=False)
            rows.append(request_row(env, ceil, world, f"match_U{U}_b256", main_prep, reps, U=U, block=256,
                                    notes=f"benchmark world, 1 request per launch set (prep, match, post kernels); "
                                          f"launch bounds {'(256, %d)' % lb if lb else 'none'}"))
        if not quick:
            rows.append(request_row(env, ceil, world, "match_U4_b256_nobounds", main_prep, reps, U=4, block=256,
                                    bounds=0, notes="benchmark world; no launch bounds (72 registers, 768 threads/SM)"))
            rows.append(request_row(env, ceil, world, "match_U4_b512", main_prep, reps, U=4, block=512,
                                    notes="benchmark world; launch bounds (512, 2)"))
            # the next category's first include row loaded one category ahead (two rows in flight;
            # prediction: +10-25 % over the same shape without it, for a few % more bytes)
            rows.append(request_row(env, ceil, world, "match_U4_b256_prefetch", main_prep, reps, U=4, block=256,
                                    prefetch=True, notes="benchmark world; prefetch; launch bounds (256, 4)"))
            rows.append(request_row(env, ceil, world, "match_U8_b256_prefetch_nobounds", main_prep, reps, U=8,
                                    block=256, bounds=0, prefetch=True,
                                    notes="benchmark world; prefetch; no launch bounds (92 registers)"))
        # the list passes on a segment grid (MatchConfig.list_kernels; prediction in stages below), verified
        lb = MatchConfig(words_per_thread=8, block=256).launch_bounds(simulator=False)
        rows.append(request_row(env, ceil, world, "match_U8_b256_segment_lists", main_prep, reps, U=8, block=256,
                                lists="segment", notes="benchmark world, 1 request per launch set; the list passes "
                                                       f"on a segment grid; launch bounds (256, {lb})"))
        for B in ([16] if quick else [8, 32, 64]):
            profs = syn.generate_profiles(world.schema, B, seed=500 + B)
            p = world.dev.prepare(profs)
            for U in ([4] if quick else [4, 8]):
                rows.append(request_row(env, ceil, world, f"match_batch{B}_U{U}", [p], reps, U=U, batch=B,
                                        notes=f"{B} requests in one launch set (grid.y = request)"))
        rows.append(cpu_row(env, ceil, world))

    section("main", main)

    def grouped():
        # rows loaded `group` at a time (match.kernels.match_grouped_kernel): the plain kernel's chain
        # of ~22 dependent row loads per word becomes rows / group deep. Prediction (a latency model,
        # time ~ waves x chain depth x load latency, which fits the U sweep): U4 G4 ~65-75 us per
        # request, bandwidth-bound at ~0.8 of the ceiling, > 1.3 T ads/s
        best = None
        for U, G in GROUPED_SWEEP:
            bounds = GROUPED_BOUNDS.get((U, G), 0)
            row = request_row(env, ceil, world, f"match_grouped_U{U}_G{G}_b256", main_prep, reps, U=U, block=256,
                              bounds=bounds, group=G,
                              notes=f"benchmark world; rows loaded {G} at a time; launch bounds "
                                    f"{'(256, %d)' % bounds if bounds else 'none'}")
            rows.append(row)
            if row["verified"].startswith("ok") and (best is None or float(row["seconds_median"]) < best[0]):
                best = (float(row["seconds_median"]), U, G, bounds)
        if best is None:
            return
        _, U, G, bounds = best
        for B in ([16] if quick else [8, 32, 64]):
            profs = syn.generate_profiles(world.schema, B, seed=500 + B)
            p = world.dev.prepare(profs)
            rows.append(request_row(env, ceil, world, f"match_grouped_batch{B}_U{U}_G{G}", [p], reps, U=U, batch=B,
                                    bounds=bounds, group=G,
                                    notes=f"{B} requests in one launch set; the fastest grouped shape of this run"))
        for m in (10**6, 10**7):
            if m >= n:
                continue
            nw = -(-m // 64)
            prep = prepare_each(world, world.profiles, n_words=nw)
            rows.append(request_row(env, ceil, world, f"match_grouped_U{U}_G{G}_pool_prefix", prep, reps, U=U,
                                    n_words=nw, bounds=bounds, group=G,
                                    notes=f"the first {m:,} slots of the benchmark world's index; fastest grouped shape"))

    section("grouped", grouped)

    def stages():
        # where one request's device time goes: the list passes around the match (prep: zero the
        # counts, scatter the sparse include lists into patch rows; post: clear sparse excludes
        # from the result, zero the patch rows) against the match itself. The pool-prefix rows
        # (1M ads: 40 us, 10M: 50 us, 100M: 107-115 us) suggest ~40 us per request that does
        # not scale with the pool
        cuda = launch.cuda()
        out = cuda.device_array((1, max(world.index.n_words, 1)), np.uint64)
        counts = cuda.device_array(1, np.int64)
        from ..match import MatchConfig

        # the list passes on a segment grid (MatchConfig(list_kernels="segment")), prediction:
        # prep 3.6 -> ~2.5 us, post 9.0 -> ~4.5 us (no binary search an entry, 4
        # list loads then 4 result loads in flight a thread), the whole request 106 -> ~100 us
        stage_list = [(lists, name, kern) for lists in ("search", "segment")
                      for name, kern in (("prep", ("prep",)), ("match", ("match",)), ("post", ("post",)),
                                         ("prep_match", ("prep", "match")), ("all", ("prep", "match", "post")))
                      if lists == "search" or name != "match"]
        for lists, name, kern in stage_list:
            # one request at a time, repeated (requests share the patch rows: mixing them would
            # leave their union in the rows); buffers preallocated (an allocation in the timed
            # call stalls the stream)
            per = []
            config = MatchConfig(words_per_thread=8, list_kernels=lists)
            for p in main_prep:
                world.dev.launch(p, out, counts, config, kernels=("prep",))  # its patch rows, as the match expects
                reps_k = 8
                t = harness.time_device(lambda: [world.dev.launch(p, out, counts, config, kernels=kern)
                                               for _ in range(reps_k)], reps=reps, busy_ms=6.0)
                per.append(harness.Timing(t.median / reps_k, t.p20 / reps_k, t.p80 / reps_k,
                                        t.host_per_call / reps_k, t.reps))
                world.dev.launch(p, out, counts, config, kernels=("post",))  # its patch rows zeroed again
            k = len(per)
            med = sorted(per, key=lambda x: x.median)[k // 2]
            timing = harness.Timing(sum(x.median for x in per) / k, sum(x.p20 for x in per) / k,
                                  sum(x.p80 for x in per) / k, sum(x.host_per_call for x in per) / k, med.reps)
            row = harness.row("targeting", env, ceil, timing, world.index.n_ads, 0.0, None,
                            "n/a (stage timing: a partial launch set; the full set is verified in 'main')",
                            variant=f"match_U8_stage_{name}" + ("_segment" if lists == "segment" else ""),
                            n_ads=world.index.n_ads, access="pool",
                            categories=len(world.schema), batch=1, layout=layout_name(world.index),
                            notes=f"kernels {'+'.join(kern)} of one request's launch set, 8 times back to back; "
                                  f"mean over {k} requests of the median of {reps}")
            row.update(bytes_per_item="", achieved_TBps="", fraction_of_read_ceiling="")  # not a byte-model row
            harness.print_rows([row])
            rows.append(row)

    section("stages", stages)

    def pool_sizes():
        for m in (10**6, 10**7, 3 * 10**7):
            if m >= n:
                continue
            nw = -(-m // 64)
            prep = prepare_each(world, world.profiles, n_words=nw)
            rows.append(request_row(env, ceil, world, "match_U4_pool_prefix", prep, reps, n_words=nw,
                                    notes=f"the first {m:,} slots of the benchmark world's index"))

    section("pool size", pool_sizes)

    def user_values():
        for mv in ([0, 6] if quick else [0, 1, 2, 6, 10]):
            profs = syn.generate_profiles(world.schema, PROFILES, seed=900 + mv, max_values=mv)
            rows.append(request_row(env, ceil, world, f"match_U4_user_values_{mv}", prepare_each(world, profs), reps,
                                    notes=f"users hold 0..{mv} values of each multi-valued category"))

    section("user values", user_values)
    section("updates", lambda: rows.extend(update_rows(env, ceil, world, reps, n_batches=20 if quick else 40)))
    # last on the main world: it drops the world's host rows
    section("device rows only", lambda: rows.extend(device_rows_only(env, ceil, world)))
    if world is not None:
        world.free()
        del main_prep
    world = None
    gc.collect()

    # the sweeps and the layout variants on a quarter-size pool (2.5 x 10^7 ads: rows of 3 MB, a
    # request still reads far more than the 60 MB L2), each a new world or a new index
    n_sweep = max(1, n // 4)
    quarter = {}

    def layouts():
        rules = syn.generate_rules(syn.benchmark_schema(), n_sweep, seed=1)
        quarter["rules"] = rules
        huge = 1 << 60
        high = [c.name for c in rules.schema if c.cardinality >= 10_000]
        variants = [("density_0.3", {}),  # the default layout: the reference of this section
                    ("per_category_folding", {"group_max": 1}),
                    ("high_cardinality_lists_only", {"dense_min": {h: huge for h in high},
                                                     "exclude_dense_min": {h: huge for h in high}}),
                    ("high_cardinality_dense_n_over_16384", {"dense_min": {h: max(64, n_sweep // 16384) for h in high}})]
        if quick:
            variants = variants[:2]
        for name, kw in variants:
            if time.time() - T0 > BUDGET_S:
                log(f"skipping layout {name}: past the budget")
                continue
            w = World(n_sweep, index_kw=kw, rules=rules, seed=1)
            if kw:  # memory scaled to the full pool (the default's is measured at full size above)
                mem.extend(memory_rows(env, w, name, n))
            rows.append(request_row(env, ceil, w, f"match_U4_{name}", prepare_each(w, w.profiles), reps,
                                    notes=f"{n_sweep:,}-ad world (seed 1); layout "
                                          f"{'default (also the 0.3 point of the density sweep)' if not kw else name}"))
            w.free()
            gc.collect()

    section("layouts", layouts)
    quarter.clear()
    gc.collect()

    def density():
        for cp_ in [0.1, 0.6]:
            if time.time() - T0 > BUDGET_S:
                log(f"skipping density {cp_}: past the budget")
                continue
            w = World(n_sweep, constrain_prob=cp_, seed=1)
            rows.append(request_row(env, ceil, w, f"match_U4_density_{cp_}", prepare_each(w, w.profiles), reps,
                                    notes=f"{n_sweep:,}-ad world: each ad constrains a category with probability "
                                          f"{cp_} (benchmark: 0.3, row match_U4_density_0.3)"))
            w.free()

    section("rule density", density)

    def categories():
        for k in ([5] if quick else [2, 5, 10]):
            if time.time() - T0 > BUDGET_S:
                log(f"skipping categories {k}: past the budget")
                continue
            cp_ = np.zeros(20)
            cp_[CATEGORY_ORDER[:k]] = 0.3
            xp_ = np.zeros(20)
            xp_[CATEGORY_ORDER[:k]] = 0.05
            w = World(n_sweep, constrain_prob=cp_, exclude_prob=xp_, seed=1)
            r = request_row(env, ceil, w, f"match_U4_categories_{k}", prepare_each(w, w.profiles), reps,
                            notes=f"{n_sweep:,}-ad world: ads constrain {k} of the 20 categories "
                                  f"({'/'.join(w.schema.categories[c].name for c in CATEGORY_ORDER[:k])}); 20: "
                                  f"row match_U4_density_0.3")
            r["categories"] = k
            rows.append(r)
            w.free()

    section("categories", categories)
    write_memory(mem, args.out)
    log(f"targeting suite done: {len(rows)} rows")
    return rows


# ----------------------------------------------------------------------------- notebook helpers
#: Layout variants of the byte model (name -> TargetingIndex keyword arguments; None: default).
MODEL_LAYOUTS = {
    "default (groups <= 512 rows)": {},
    "one folded row per category": {"group_max": 1},
    "groups <= 1024 rows": {"group_max": 1024},
    "high-cardinality: lists only": "high_lists",
    "dense exclude rows (>= n/1024)": "dense_excl",
}


def layout_kwargs(name: str, n: int, schema) -> dict:
    kw = MODEL_LAYOUTS[name]
    high = [c.name for c in schema if c.cardinality >= 10_000]
    if kw == "high_lists":
        return {"dense_min": {h: 1 << 60 for h in high}, "exclude_dense_min": {h: 1 << 60 for h in high}}
    if kw == "dense_excl":
        return {"exclude_dense_min": max(64, n // 1024)}
    return dict(kw)


def byte_model(n_ads: int, n_profiles: int = 20, seed: int = 0, layouts=None, scale_to: int = 10**8):
    """Count first: bytes per ad of each layout on an ``n_ads`` copy of the benchmark world
    (host only, :func:`andromeda_nb.match.read_model`), and the index memory scaled to
    ``scale_to`` ads. Returns ``(per-layout DataFrame, per-unit memory DataFrame)``."""
    import pandas as pd

    from ..match import read_model

    schema = syn.benchmark_schema()
    rules = syn.generate_rules(schema, n_ads, seed=seed)
    profiles = syn.generate_profiles(schema, n_profiles, seed=seed + 101)
    rows, mem = [], []
    for name in (layouts or MODEL_LAYOUTS):
        index = TargetingIndex(rules, **layout_kwargs(name, n_ads, schema))
        models = [read_model(index, index.plan(make_profile(schema, p))) for p in profiles]
        units = index.memory_by_category(scale_to)
        rows.append({"layout": name, "rows": index.n_rows,
                     "row_bits_per_ad": float(np.mean([m["bits_per_ad"] for m in models])),
                     "bytes_per_ad": float(np.mean([m["bytes_per_ad"] for m in models])),
                     "rows_read": float(np.mean([m["rows_read"] for m in models])),
                     "memory_GB_at_scale": sum(u["bytes"] for u in units) / 1e9,
                     "eligible_fraction": float(np.mean([index.match_cpu(p)[1] for p in profiles]) / n_ads)})
        mem += [{"layout": name, **u} for u in units]
    return pd.DataFrame(rows), pd.DataFrame(mem)


def check_small_world(n_ads: int, n_profiles: int = 4, n_batches: int = 3, batch_size: int = 50, seed: int = 0):
    """Correctness on whatever backend is active: a benchmark-schema world of ``n_ads`` ads; every
    profile through ``match_eligible`` and ``match_batch`` against the oracle; then update batches
    (creates, changes, retires), after each: device copy = host copy = a rebuild from the rule map,
    and a request against the oracle on the current rules. Returns a DataFrame, one row per check."""
    import pandas as pd

    from ..match.api import DeviceTargetingIndex, match_batch, match_eligible

    schema = syn.benchmark_schema()
    rules = syn.generate_rules(schema, n_ads, seed=seed, constrain_prob=0.3)
    host = TargetingIndex(rules, capacity=n_ads + 4 * batch_size, dense_min=max(2, n_ads // 200))
    dev = DeviceTargetingIndex(host)
    profiles = syn.generate_profiles(schema, n_profiles, seed=seed + 1)
    out = []
    batch = match_batch(dev, profiles)
    current = host.current_rules()  # the pool's slots, the spare ones free (never eligible)
    for b, p in enumerate(profiles):
        want = reference.match(current, make_profile(schema, p))
        got = match_eligible(dev, p)
        out.append({"check": f"request {b}", "eligible": int(want.sum()),
                    "ok": bool(np.array_equal(got.to_mask(), want) and got.count == want.sum()
                               and np.array_equal(batch[b].to_mask(), want))})
    world = type("W", (), {})()
    world.schema, world.rules, world.dev, world.index = schema, rules, dev, host
    stream = UpdateStream(world, seed=seed + 5, n_templates=500)
    for k in range(n_batches):
        delta = dev.apply(stream.batch(batch_size))
        try:
            ref = host.rebuild()
            host.assert_same(ref)
            rows, pool = dev.snapshot()
            host.assert_same(ref, bitsets=rows, pool=pool)
            same = True
        except AssertionError:
            same = False
        p = profiles[k % len(profiles)]
        want = reference.match(host.current_rules(), make_profile(schema, p))
        ok = bool(np.array_equal(match_eligible(dev, p).to_mask(), want))
        out.append({"check": f"update batch {k} ({batch_size} ops, {delta.bits_changed} bits flipped)",
                    "eligible": int(want.sum()), "ok": same and ok})
    return pd.DataFrame(out)


def load_results(path="data/results/targeting.csv"):
    """The committed targeting results (None when missing), with the ``key=value`` pairs of the
    ``notes`` column (``bits_per_ad``, ...) as numeric columns."""
    import pandas as pd
    from pathlib import Path

    if not Path(path).exists():
        return None
    df = pd.read_csv(path)
    parsed = df["notes"].fillna("").str.findall(r"(\w+)=([-0-9.eE+]+)")
    for key in ("bits_per_ad", "rows_per_request", "patches_per_request", "list_bytes_per_ad"):
        df[key] = [float(dict(p).get(key, "nan")) for p in parsed]
    return df
