"""Pipeline suite: the public calls as a user makes them (``python -m andromeda_nb.bench pipeline``).

Each row times one public call on the benchmark world (docs/design.md: 20 categories, ~1 %
eligible) with the wall clock, warm, around the call, which synchronises once: median and p99 of
at least 50 calls, beside ``device_seconds``, the summed device time of the call's own work
(CUDA events around each step of the same calls; idle time between steps excluded). Rows:

    retrieve            Pool.retrieve of a batch of ``batch`` requests (gated E6 K2 fp16 d64, k 1000)
    score_sparse        the steps of one request after the match (gather, sample, seed, filter, final)
    match_eligible      the match of one request (public function, its count read back)
    score_topk          fused scoring + top-1000 over the whole pool (public function, tiles layout)
    retrieve_open_loop  requests arriving at a set rate (Poisson), served in batches of those waiting
                        (up to ``max_batch``); latency from arrival to answer, p50 and p99
    launch_*            host seconds of one launch: Numba's dispatch and a bound launch

The live pool's calls (``Pool.apply``, requests during updates, the soak) are the ``pool`` suite
(:mod:`.pool`); it shares this suite's world, pool and checks.

Every retrieve row is checked on sampled requests against the reference: the CPU match's eligible
set and the top-k of the kernel's own scores (exact ids, order and scores).

Phases (``--phases``; default all but the experiments): ``retrieve`` (a case a batch size), ``match``
(no case of its own: ``match_eligible`` comes with retrieve's batch-1 case), ``launch``,
``open_loop`` (the largest pool only), ``score_topk``, ``fp16`` and ``int8`` (an int8 table in fp16
math: retrieve at batches 1 and 32, score_topk), ``score_topk_dtypes``; the experiments (:data:`EXPERIMENTS`,
named to run): ``score_topk_f16_weights``, ``score_topk_ring``, ``score_topk_row_scales`` and ``score_topk_loop`` (launch
settings off the default, as called), ``score_topk_graph`` (the whole-pool call's graph beside its launches one by one). Run pool size by pool size (10^7, 10^8, those up to ``--n-ads``).
``--quick``: the largest pool, retrieve at batches 1, 8, 32, without the diagnostics.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

import numpy as np

from ..score.unfused import fused_bytes_per_ad
from . import harness
from .tables import gpu_table

K = 1000
D, E, KE = 64, 6, 2
BATCHES = (1, 8, 32, 64, 128, 256)
CALLS = 60  # timed calls a row (median and p99 of them)
DEVICE_CALLS = 12  # traced calls a row (device time)
OPEN_LOOP_RATES = (1000, 2000, 4000, 6000, 8000, 11000)
OPEN_LOOP_REQUESTS = 3000


def _log(msg: str) -> None:
    print(f"[pipeline {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _quantiles(xs) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(np.ceil(0.99 * len(xs))) - 1)]


def _row(env, ceil, variant, n, batch, wall, p99, device, items, bytes_per_item, verified, dtype="fp16", **extra):
    t = harness.Timing(wall, wall, wall, wall, CALLS)
    r = harness.row("pipeline", env, ceil, t, items, bytes_per_item, None, verified, variant=variant, n_ads=n, d=D,
                    dtype=dtype, experts=E, k_experts=KE, k=K, batch=batch, **extra)
    r.update(seconds_p20="", seconds_p80="", seconds_p99=f"{p99:.6e}", device_seconds=f"{device:.6e}",
             requests_per_s=f"{batch / wall:.6e}")
    return r


def _is_topk_of_scores(pool, req, out, elig, count: int, k: int = K) -> bool:
    """``out`` (a Retrieved) is the exact top-k of the kernel's own scores of ``req`` over the slots
    in the mask ``elig``, and its eligible count is ``count`` (= the mask's)."""
    from .. import reference
    from ..score import score_ads

    scores = score_ads(req, pool.table, config=pool.config).copy_to_host()
    want = reference.topk(scores, k, ids=pool.table.host_ad_ids, eligible=elig)
    return (np.array_equal(out.ids, want.ids) and np.array_equal(out.scores, want.scores)
            and out.n_eligible == count == elig.sum())


def _verify(pool, world, reqs, profiles, outs, k: int = K) -> str:
    """Sampled requests (the first, middle and last of the batch) against the reference: CPU match,
    the kernel's own scores, exact top-k."""
    from ..match import match_cpu
    from ..targeting import mask_from_bits

    bad = 0
    sampled = sorted({0, len(outs) // 2, len(outs) - 1})
    for b in sampled:
        words, count = match_cpu(world.index, profiles[b])
        bad += not _is_topk_of_scores(pool, reqs[b], outs[b], mask_from_bits(words, world.n), count, k)
    return (f"{'ok' if not bad else 'FAILED'}: {len(sampled) - bad}/{len(sampled)} sampled requests equal the "
            "reference (CPU match, top-k of the kernel's scores)")


def _match_bytes(world, profiles) -> float:
    """Bytes one request's match moves (the host byte model), mean over a few profiles."""
    from ..match import read_model
    from ..targeting import make_profile

    return float(np.mean([read_model(world.index, world.index.plan(make_profile(world.schema, p)))["bytes"]
                          for p in profiles[:4]]))


def _dtype_suffix(dtype: str) -> str:
    """A host profile's name part for the table's dtype ('' for the benchmark's fp16 table)."""
    return "" if dtype == "fp16" else f"_{dtype}"


def _timed(fn, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _call_breakdown(call, calls: int) -> dict:
    """Where a warm :func:`~andromeda_nb.score.score_topk` call's wall time goes, on the GPU's clock
    (medians over ``calls`` calls, seconds): ``pre``, the host's work before the call's launches
    (events at the call's start and as its recorded launches begin, the stream idle between calls, so
    both record at host time); ``launches``, from then until the GPU has run them (kernels and any
    gaps where the GPU waits for the host's next launch; with the whole pool's graph, the answer's
    copies too); ``after``, the wall time left: the answer's
    copies, the synchronisation and the return. Set beside the launches' back-to-back device time,
    ``launches`` says whether a call's kernels run slower than back to back. Empty where a call did
    not take the filter path's recorded launches."""
    from numba import cuda

    from ..score import api

    run, marks, parts = api._Replay.run, {}, {"pre": [], "launches": [], "after": []}

    def marked_run(self, inputs, copy_answer=None):
        marks["begin"] = cuda.event()
        marks["begin"].record()
        enqueued = run(self, inputs, copy_answer)
        marks["done"] = cuda.event()
        marks["done"].record()
        return enqueued

    api._Replay.run = marked_run
    try:
        for _ in range(calls):
            marks.clear()
            start = cuda.event()
            start.record()
            t0 = time.perf_counter()
            call()
            wall = time.perf_counter() - t0
            if "done" not in marks:
                return {}
            pre = cuda.event_elapsed_time(start, marks["begin"]) / 1e3
            launches = cuda.event_elapsed_time(marks["begin"], marks["done"]) / 1e3
            for key, v in (("pre", pre), ("launches", launches), ("after", wall - pre - launches)):
                parts[key].append(v)
    finally:
        api._Replay.run = run
    return {key: statistics.median(v) for key, v in parts.items()}


def _host_profile(call, calls: int, out_dir, name: str) -> None:
    """Where the host time of a public call goes (cProfile of ``calls`` calls, by own time, then by cumulative time):
    a section headed ``=== <name> (<calls> calls)`` appended to :func:`.harness.host_profile_file` (one file a run,
    however many cases: the GPU host's tool brings back a few files)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    text = io.StringIO()
    text.write(f"=== {name} ({calls} calls)\n")
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(40)
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
    with harness.host_profile_file(out_dir).open("a") as f:
        f.write(text.getvalue())


def _retrieve_rows(env, ceil, world, pool, reqs, profiles, match_bytes, n, args_out, batches=BATCHES,
                   diagnostics: bool = True, profile_batch: bool = False, variant: str = "retrieve") -> list[dict]:
    """``profile_batch``: the profiles given as one :class:`~andromeda_nb.targeting.ProfileBatch` (built
    outside the timing); ``variant``: the rows' name (the case's: ``retrieve_profile_batch`` with
    columns, ``retrieve_bound_launches``), the batch-1 extra rows only for ``retrieve``."""
    from ..pipeline import StepTimes
    from ..targeting import ProfileBatch

    rows = []
    for B in batches:
        if B > pool.max_batch:
            continue
        batch, profs = reqs[:B], profiles[:B]
        dict_profs = profs
        if profile_batch:
            profs = ProfileBatch.from_profiles(world.schema, profs)
        outs = pool.retrieve(batch, profs, K)  # warm: binds this batch size's launches
        verified = (_verify(pool, world, batch, dict_profs, outs) if B in (1, 32, 128)
                    else "not checked (the path of batches 1, 32, 128)")
        for _ in range(3):
            pool.retrieve(batch, profs, K)
        calls = max(CALLS, 1)
        walls = _timed(lambda: pool.retrieve(batch, profs, K), calls)
        pool.trace = StepTimes(lambda: harness.busy(3.0 + 0.2 * B))
        for _ in range(DEVICE_CALLS):
            pool.retrieve(batch, profs, K)
        steps = pool.trace.calls
        pool.trace = None
        device = statistics.median(sum(c.values()) for c in steps)
        per_step = {s: statistics.median(c[s] for c in steps) for s in steps[0]}
        elig = float(np.mean([o.n_eligible for o in outs]))
        wall, p99 = _quantiles(walls)
        dtype = pool.table.dtype
        per_ad = 4 + 4 + fused_bytes_per_ad(D, dtype)  # slot, score, row + bias (+ int8 scale)
        request_bytes = match_bytes + n / 8 + elig * per_ad
        notes = ("device steps (us, median): " + ", ".join(f"{s} {v * 1e6:.1f}" for s, v in per_step.items())
                 + f"; bytes a request: match {match_bytes / 1e6:.1f} MB (host byte model), gather {n / 8e6:.1f} MB, "
                 f"{elig:,.0f} eligible x {per_ad:.0f} B")
        tag = f"{pool.n_ads}_{pool.config.math}{_dtype_suffix(dtype)}"
        if B == 32 and variant != "retrieve_bound_launches":
            _host_profile(lambda: pool.retrieve(batch, profs, K), 30, args_out,
                          f"{tag}_batch{B}{'_columns' if profile_batch else ''}")
        if profile_batch:
            notes += "; profiles as one ProfileBatch (columns)"
        notes += f"; launches after the match: {pool.launches} (device steps timed one by one)"
        notes += _dequant_note(pool.config, pool.table)
        rows.append(_row(env, ceil, variant, n, B, wall, p99, device, B * elig, request_bytes / elig, verified, dtype,
                         access="bitset", eligible_fraction=f"{elig / n:.5f}", categories=len(world.schema),
                         layout=pool.table.layout, notes=notes))
        if B == 1 and variant == "retrieve":
            sparse = [sum(v for s, v in c.items() if s not in ("weights", "match", "answers")) for c in steps]
            dev = statistics.median(sparse)
            rows.append(_row(env, ceil, "score_sparse", n, 1, dev, _quantiles(sparse)[1], dev, elig,
                             per_ad + n / 8 / elig, verified, dtype, access="bitset",
                             eligible_fraction=f"{elig / n:.5f}", layout=pool.table.layout,
                             notes="device time of gather + sample + seed + filter + final (wall = device here)"))
            mt = [c["match"] for c in steps]
            match_dev = statistics.median(mt)
            if diagnostics:
                rows.append(_match_row(env, ceil, world, profiles, n, match_dev, match_bytes))
            _host_profile(lambda: pool.retrieve(batch, profs, K), 200, args_out, tag)
    return rows


def _match_row(env, ceil, world, profiles, n, match_dev, match_bytes) -> dict:
    from ..match import match_eligible

    i = iter(range(10 ** 9))
    walls = _timed(lambda: match_eligible(world.dev, profiles[next(i) % len(profiles)]).count, CALLS)
    wall, p99 = _quantiles(walls)
    return _row(env, ceil, "match_eligible", n, 1, wall, p99, match_dev, n, match_bytes / n,
                "checked by the retrieve rows (same kernels)", access="pool", categories=len(world.schema),
                notes="items: pool ads; device: prep + match + post of Pool.retrieve's match step")


def _dequant_note(config, table) -> str:
    """How fp16 math widened an int8 table's rows (``"; dequant=fma"`` or ``mul``: the results doc's
    ``dequant`` column), '' for other tables and maths."""
    if table.dtype != "int8" or config.math != "fp16":
        return ""
    return f"; dequant={config.resolved_dequant(table)}"


def _score_topk_row(env, ceil, n, reqs, tiles, config, out_dir=None, launch=(), variant="score_topk") -> dict:
    """score_topk's warm wall time beside its launches' device time; ``launch``: the KernelConfig
    fields set off their defaults, named in the notes."""
    from .. import reference
    from ..score import score_ads, score_topk
    from ..score.launches import launch_score_filter
    from ..score.table import DeviceRequest

    req = reqs[0]
    shared = config.kernel_f16_weights() == "shared"
    top = score_topk(req, tiles, K, config=config)  # warm; its workspace stays on the table
    walls = _timed(lambda: score_topk(req, tiles, K, config=config), CALLS)
    wall, p99 = _quantiles(walls)
    if out_dir is not None:
        _host_profile(lambda: score_topk(req, tiles, K, config=config), 30, out_dir,
                      f"score_topk_{n}_{config.math}{_dtype_suffix(tiles.dtype)}{'_shared' if shared else ''}"
                      + "".join(f"_{k}{v}" for k, v in launch))
    dreq = DeviceRequest.of(req)
    concrete = config.with_math(dreq, tiles)  # the math the call resolved
    sfw = next(ws for key, ws in tiles._workspaces.items() if key[:4] == ("filter", n, K, "pool"))
    device = harness.time_device(lambda: launch_score_filter(dreq, tiles, K, "pool", None, None, n, config, sfw),
                                 reps=15).median
    parts = _call_breakdown(lambda: score_topk(req, tiles, K, config=config), CALLS)
    scores = score_ads(req, tiles, config=config).copy_to_host()
    want = reference.topk(scores, K, ids=tiles.host_ad_ids)
    # the first call (on a fresh table, the recording) and a warm one (the replay or its graph)
    ok = all(np.array_equal(t.ids, want.ids) and np.array_equal(t.scores, want.scores)
             for t in (top, score_topk(req, tiles, K, config=config)))
    verified = ("ok: equals the reference top-k of the kernel's scores" if ok else "FAILED")
    return _row(env, ceil, variant, n, 1, wall, p99, device, n, fused_bytes_per_ad(D, tiles.dtype), verified,
                tiles.dtype, access="pool",
                eligible_fraction="1", layout="tiles",
                notes=("f16_weights=shared; " if shared else "") + "".join(f"{'blocks/SM' if k == 'blocks_per_sm' else k}={v}; " for k, v in launch)
                + "device: the same launches back to back behind a busy kernel (harness.time_device)"
                + _dequant_note(concrete, tiles)
                + ("; scales as fp16 pairs" if concrete.kernel_row_scales(tiles.dtype) else "")
                + ("; a call on the GPU's clock (medians of {CALLS}, _call_breakdown): host before its launches "
                   "{pre:.3f} ms, its launches run {launches:.3f} ms, answer copies / sync / return {after:.3f} ms".format(
                       CALLS=CALLS, **{k: v * 1e3 for k, v in parts.items()}) if parts else ""))


def _open_loop_rows(env, ceil, world, pool, reqs, profiles, n) -> list[dict]:
    """Requests arrive at ``rate`` (exponential gaps, fixed seed); the server takes every request
    that has arrived (up to max_batch) whenever it is free; a request's latency runs from its
    arrival to the end of the call that answered it."""
    rows = []
    rng = np.random.default_rng(11)
    for rate in OPEN_LOOP_RATES:
        arrivals = np.cumsum(rng.exponential(1 / rate, OPEN_LOOP_REQUESTS))
        lat, i, batches = [], 0, []
        t0 = time.perf_counter()
        while i < len(arrivals):
            now = time.perf_counter() - t0
            if arrivals[i] > now:
                time.sleep(max(0.0, arrivals[i] - now))
                continue
            j = i
            while j < len(arrivals) and arrivals[j] <= now and j - i < pool.max_batch:
                j += 1
            idx = [q % len(reqs) for q in range(i, j)]
            pool.retrieve([reqs[q] for q in idx], [profiles[q] for q in idx], K)
            done = time.perf_counter() - t0
            lat.extend(done - arrivals[i:j])
            batches.append(j - i)
            i = j
        served = len(arrivals) / (time.perf_counter() - t0)
        p50, p99 = _quantiles(lat)
        r = _row(env, ceil, "retrieve_open_loop", n, pool.max_batch, p50, p99, float("nan"), 1, 0,
                 "latency only (answers checked by the retrieve rows)", access="bitset",
                 notes=f"offered {rate} req/s, served {served:,.0f} req/s, mean batch {np.mean(batches):.1f}")
        r.update(requests_per_s=f"{rate:.6e}", items_per_s="", achieved_TBps="", fraction_of_read_ceiling="",
                 device_seconds="")
        rows.append(r)
    return rows


def _launch_rows(env, ceil, pool) -> list[dict]:
    """Host seconds of one launch of the batched filter kernel (13 arguments): Numba's dispatch
    against a bound launch of the same kernel and arguments."""
    from ..device import launch

    group = next(iter(pool._groups.values()))
    steps = dict(group.steps(1, K))
    bound = steps["filter"]
    kern, grid, block, args = bound.kernel, bound.grid, bound.block, bound.args
    dispatch = lambda: kern[grid, block](*args)  # noqa: E731
    rows = []
    for name, fn in (("launch_numba_dispatch", dispatch), ("launch_bound", bound)):
        fn()
        launch.cuda().synchronize()
        hosts = []
        for _ in range(5):
            harness.busy(20.0)  # launches queue behind it: the host time is the launch path alone
            t0 = time.perf_counter()
            for _ in range(50):
                fn()
            hosts.append((time.perf_counter() - t0) / 50)
            launch.cuda().synchronize()
        host = statistics.median(hosts)
        r = {c: "" for c in harness.SCHEMA + harness.EXTRA}
        r.update(env, suite="pipeline", variant=name, seconds_median=f"{host:.6e}", host_seconds_per_call=f"{host:.3e}",
                 verified="n/a (launch overhead)", notes="host seconds per launch of the batched filter kernel, "
                 "50 launches queued behind a busy kernel, median of 5")
        rows.append(r)
        _log(f"{name}: {host * 1e6:.1f} us a launch")
    return rows


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class RetrieveCase(harness.Case):
    """Pool.retrieve of ``batch`` requests (:func:`_retrieve_rows`); at batch 1 also the
    ``score_sparse`` row and, with ``diagnostics``, ``match_eligible`` and the host profile."""

    batch: int
    diagnostics: bool = True
    n_ads: int | None = None  # set per pool size by :func:`cases`
    math: str = "fp32"
    dtype: str = "fp16"  # the pool table's storage
    run_in: str = "both"
    profile_batch: bool = False  # the profiles as one ProfileBatch (variant retrieve_profile_batch)
    launches: str = "auto"  # "bound": the pool's launches one by one, not its graph (retrieve_bound_launches)

    def variants(self) -> tuple[str, ...]:
        if self.launches == "bound":
            return ("retrieve_bound_launches",)
        if self.profile_batch:
            return ("retrieve_profile_batch",)
        return ("retrieve",) + (("score_sparse", "match_eligible") if self.batch == 1 and self.diagnostics else
                                ("score_sparse",) if self.batch == 1 else ())


@dataclass(frozen=True)
class LaunchCase(harness.Case):
    """Host seconds of one launch (:func:`_launch_rows`); the largest pool only."""

    n_ads: int | None = None
    largest_only = True

    def variants(self) -> tuple[str, ...]:
        return ("launch_numba_dispatch", "launch_bound")


@dataclass(frozen=True)
class OpenLoopCase(harness.Case):
    """Requests arriving at each of ``OPEN_LOOP_RATES`` (:func:`_open_loop_rows`); the largest pool only."""

    n_ads: int | None = None
    access: str = "bitset"
    largest_only = True

    def variants(self) -> tuple[str, ...]:
        return ("retrieve_open_loop",) * len(OPEN_LOOP_RATES)


@dataclass(frozen=True)
class ScoreTopkCase(harness.Case):
    """score_topk over the whole pool, tiles layout (:func:`_score_topk_row`)."""

    variant: str = "score_topk"
    n_ads: int | None = None
    layout: str = "tiles"
    access: str = "pool"
    math: str = "fp32"
    dtype: str = "fp16"
    #: KernelConfig.f16_weights of the call (fp16 math: the weights in registers or shared memory)
    f16_weights: str = "auto"
    #: other KernelConfig fields of the call, (name, value) pairs: a launch setting measured as called
    launch: tuple = ()
    #: "bound": the replayed launches one by one, no graph captured (variant score_topk_bound_launches)
    launches: str = "auto"

    def variants(self) -> tuple[str, ...]:
        return ("score_topk_bound_launches",) if self.launches == "bound" else (self.variant,)

    def configs(self) -> tuple:
        from ..score import KernelConfig

        return (KernelConfig(math=self.math, f16_weights=self.f16_weights, **dict(self.launch)),)


#: phase -> cases, in run order within a pool size. ``match``: the ``match_eligible`` row comes with
#: retrieve's batch-1 case (it reports the device time of that case's traced match step).
PHASES = {
    "retrieve": (*(RetrieveCase(B, run_in="full") for B in BATCHES),
                 *(RetrieveCase(B, diagnostics=False, run_in="quick") for B in (1, 8, 32))),
    "match": (),
    "launch": (LaunchCase(),),
    "open_loop": (OpenLoopCase(),),
    "score_topk": (ScoreTopkCase(),),
    # the fp16 math mode (KernelConfig(math="fp16"): the gate on the tensor cores) on the same calls
    "fp16": (*(RetrieveCase(B, diagnostics=False, math="fp16") for B in (1, 32)),
             *(RetrieveCase(B, diagnostics=False, math="fp16", profile_batch=True) for B in (1, 32)),
             *(RetrieveCase(B, diagnostics=False, math="fp16", launches="bound") for B in (1, 32)),
             ScoreTopkCase(math="fp16")),
    # int8 tables (a scale a row) as a user calls them, in fp16 math (the rows widened into the fragments)
    "int8": (*(RetrieveCase(B, diagnostics=False, math="fp16", dtype="int8") for B in (1, 32)),
             ScoreTopkCase(math="fp16", dtype="int8")),
    # score_topk on fp16 and int8 tables of the same pool, in the math the default picks (fp16 on
    # both), one run: the ratio of the int8 target as the user calls it
    "score_topk_dtypes": (ScoreTopkCase(math="fp16"), ScoreTopkCase(math="fp16", dtype="int8")),
    # the same calls with fp16 math's weights in registers (the default) and in shared memory, a
    # table's two rows side by side: what KernelConfig.f16_weights="auto" should pick, as called
    "score_topk_f16_weights": tuple(ScoreTopkCase(math="fp16", dtype=dt, f16_weights=w)
                                    for dt in ("fp16", "int8") for w in ("registers", "shared")),
    # int8 rows through the cp.async ring (KernelConfig.ring_stages) as called: blocks of 128, four an
    # SM, with 0 (none), 2, 3 or 4 rounds a warp, beside the default launch of both tables
    "score_topk_ring": (ScoreTopkCase(math="fp16"), ScoreTopkCase(math="fp16", dtype="int8"),
                        *(ScoreTopkCase(math="fp16", dtype="int8",
                                        launch=(("block", 128), ("blocks_per_sm", 4), ("ring_stages", r)))
                          for r in (0, 2, 3, 4))),
    # int8 rows' scales as the table's fp16 pairs (KernelConfig.row_scales, the default) as called,
    # beside the float32 scales (row_scales="fp32") and fp16 rows
    "score_topk_row_scales": (ScoreTopkCase(math="fp16"), ScoreTopkCase(math="fp16", dtype="int8"),
                              ScoreTopkCase(math="fp16", dtype="int8", launch=(("row_scales", "fp32"),))),
    # fp16 math's loop over rounds in two (KernelConfig.loop, the default) as called, beside one
    # checked loop, both tables
    "score_topk_loop": tuple(ScoreTopkCase(math="fp16", dtype=dt, launch=launch) for dt in ("fp16", "int8")
                             for launch in ((), (("loop", "checked"),))),
    # the whole-pool call's replayed launches and answer copies as one CUDA graph (the default)
    # beside the same launches one by one, both tables
    "score_topk_graph": tuple(ScoreTopkCase(math="fp16", dtype=dt, launches=launches) for dt in ("fp16", "int8")
                              for launches in ("auto", "bound")),
}
#: the experiments: a setting off the default, measured to choose it (--phases names them)
EXPERIMENTS = ("score_topk_f16_weights", "score_topk_ring", "score_topk_row_scales", "score_topk_loop",
               "score_topk_graph")
#: every phase but the experiments
DEFAULT_PHASES = tuple(p for p in PHASES if p not in EXPERIMENTS)
#: the pool sizes of a run (those at most --n-ads; --quick: the largest)
SIZES = (10 ** 7, 10 ** 8)


def cases(options: harness.Options) -> dict:
    """The declared cases at each pool size (:data:`SIZES` up to ``options.n_ads``; a quick run: the
    largest, its retrieve rows only)."""
    sizes = [n for n in SIZES if n <= options.n_ads]
    if options.quick:
        sizes = sizes[-1:]
    out = {}
    for phase, declared in PHASES.items():
        out[phase] = tuple(replace(c, n_ads=n) for n in sizes for c in declared
                           if not (options.quick and phase not in ("retrieve", "fp16"))
                           and not (getattr(c, "largest_only", False) and n != sizes[-1]))
    return out


def order(planned: list) -> list:
    """Pool size first (one world and pool at a time), then the phases' order."""
    return sorted(planned, key=lambda p: p.case.n_ads)


class Run(harness.Run):
    """The pipeline run: the world, table, pool and requests of one pool size at a time."""

    def __init__(self, env, ceil, options):
        super().__init__(env, ceil, options)
        self.n = None
        self.pool = self.table = self.tiles = None

    def measure(self, planned):
        rows = self._measure(planned.case)
        for r in rows:  # the case's columns where its rows leave them empty (the launch rows' pool size)
            r.update({k: v for k, v in planned.case.columns().items() if r.get(k) in ("", None)})
        return rows

    def _measure(self, case):
        self.setup(case.n_ads, pool=not isinstance(case, ScoreTopkCase), math=getattr(case, "math", "fp32"),
                   dtype=getattr(case, "dtype", "fp16"))
        if isinstance(case, RetrieveCase):
            batches = (case.batch,)
            # the same pool with its launches one by one (the attribute is read at each call)
            launches, self.pool.launches = self.pool.launches, "bound" if case.launches == "bound" else self.pool.launches
            try:
                return _retrieve_rows(self.env, self.ceil, self.world, self.pool, self.reqs, self.profiles,
                                      self.match_bytes, self.n, self.options.out, batches, case.diagnostics,
                                      case.profile_batch, case.variants()[0])
            finally:
                self.pool.launches = launches
        if isinstance(case, LaunchCase):
            return _launch_rows(self.env, self.ceil, self.pool)
        if isinstance(case, OpenLoopCase):
            return _open_loop_rows(self.env, self.ceil, self.world, self.pool, self.reqs, self.profiles, self.n)
        self.pool = self.table = None  # the tiles table takes their place
        if self.tiles is None or self.tiles.dtype != case.dtype:
            self.tiles = None
            self.tiles = gpu_table(self.n, D, case.dtype, "tiles", seed=1)
        if case.launches != "bound":
            return [_score_topk_row(self.env, self.ceil, self.n, self.reqs, self.tiles, *case.configs(),
                                    self.options.out, launch=case.launch)]
        from ..device import launch as device_launch

        capture, device_launch.capture_graph = device_launch.capture_graph, lambda steps: None
        self.tiles.__dict__.pop("_workspaces", None)  # replays recorded afresh, none with a graph
        try:
            return [_score_topk_row(self.env, self.ceil, self.n, self.reqs, self.tiles, *case.configs(),
                                    self.options.out, launch=case.launch, variant="score_topk_bound_launches")]
        finally:
            device_launch.capture_graph = capture
            self.tiles.__dict__.pop("_workspaces", None)

    def setup(self, n: int, pool: bool = True, math: str = "fp32", host_bits=True, spare: int = 0,
              dtype: str = "fp16") -> None:
        """The world and requests of ``n`` ads (a new size frees the last one's), and with ``pool``
        the rows table (``dtype``) and its Pool in ``math``; ``host_bits`` of the world's device index (kept
        for the reference checks; ``"auto"`` where the pool takes updates, as a user's would);
        ``spare`` free slots past the ads (the table's too)."""
        from ..datasets import synthetic as syn
        from ..model import Request
        from ..pipeline import Pool
        from .targeting_world import World

        if n != self.n:
            self.close()
            _log(f"world of {n:,} ads")
            self.n = n
            self.world = World(n, spare=spare, host_bits=host_bits)
            self.profiles = syn.generate_profiles(self.world.schema, max(BATCHES), seed=202)
            rng = np.random.default_rng(5)
            self.reqs = [Request.random(D, E, KE, rng) for _ in range(max(BATCHES))]
            self.match_bytes = _match_bytes(self.world, self.profiles)
            self.pool = self.tiles = None
        if pool and (self.pool is None or self.pool.config.math != math or self.table.dtype != dtype):
            from ..score import KernelConfig

            self.tiles = None
            if self.table is None or self.table.dtype != dtype:
                self.pool = self.table = None  # their buffers go before the new table's come
                ids = self.world.index.ad_ids
                self.table = gpu_table(ids.size, D, dtype, "rows", seed=1, ad_ids=ids if spare else None)
            self.pool = None  # its buffers go before the next pool's come
            self.pool = Pool(self.table, self.world.dev, max_batch=max(BATCHES), max_k=K,
                             config=KernelConfig(math=math))

    def close(self) -> None:
        if self.n is not None:
            self.pool = self.table = self.tiles = None
            self.world.free()
            self.world = None
            self.n = None
