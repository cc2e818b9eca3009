"""Benchmark harness: ``python -m andromeda_nb.bench <suite> [options]`` (GPU only; ``--list`` runs anywhere).

It holds what every suite shares: the timing rules, the ceilings, the top-K check against torch,
the CSV rows, and the one loop that runs a suite's cases. A suite (``scoring``, ``topk``,
``targeting``, ``pipeline``, each a module of this package) declares its phases as data, a mapping
phase -> cases, a case a frozen dataclass of one measurement's parameters (:class:`Case`), and a
:class:`Run` that maps each kind of case to its measurement function.

House rules (docs/design.md, "Measuring"): the read ceiling (cupy sum over >= 4 GiB), the device copy
and the best Numba 8-byte read kernel are measured in the same run; every case is timed with CUDA
events after warm-up, median of >= 10 repetitions (p20 / p80 too), on data far larger than L2 and
never zeros, with a >= 1 ms busy kernel queued ahead of the start event so the events time the GPU
and not Numba's ~47 us launch overhead; the host wall time per call is reported separately. Every
row checks its own output and says so in ``verified``. Rows follow docs/design.md's results schema
("Results tables") and are written to ``<out>/<suite>.csv``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as _dt
import functools
import importlib
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..provenance import is_committed_results

SCHEMA = (
    "suite variant device driver numba numba_cuda commit timestamp n_ads d dtype experts k_experts "
    "access eligible_fraction categories k batch seconds_median seconds_p20 seconds_p80 items_per_s "
    "bytes_per_item flops_per_item achieved_TBps ceiling_read_TBps ceiling_copy_TBps "
    "fraction_of_read_ceiling verified"
).split()
#: Columns after docs/design.md's schema: ``path`` (the top-K path of a row: block, filter, scan,
#: unseeded, batched, onelaunch) and ``math`` (the arithmetic of a scoring kernel: fp32) where they
#: apply; the serving suite's ``n_gpus``, ``n_workers`` and ``transport_bytes_per_request``.
EXTRA = ["host_seconds_per_call", "layout", "path", "math", "seconds_p99", "device_seconds", "requests_per_s",
         "notes", "n_gpus", "n_workers", "transport_bytes_per_request"]
GIB = 1 << 30
#: The suites: name -> module of this package.
SUITES = ("scoring", "topk", "targeting", "pipeline", "pool", "serving")
SIZED_BY_CASE = ("topk",)  # suites whose cases carry their own sizes: --n-ads would change nothing


# ----------------------------------------------------------------------------- environment

def commit_id() -> str:
    """The commit under test (:func:`andromeda_nb.provenance.commit_id`)."""
    from ..provenance import commit_id as commit

    return commit()


def env_info() -> dict:
    """Device, driver, versions, commit and timestamp for every row."""
    import numba
    from numba import cuda

    from ..device import backend

    try:
        import importlib.metadata as md

        numba_cuda = md.version("numba-cuda")
    except Exception:
        numba_cuda = "unknown"
    drv = cuda.cudadrv.driver.driver.get_version()
    return {
        "device": backend.device_name(),
        "driver": ".".join(map(str, drv)) if isinstance(drv, tuple) else str(drv),
        "numba": numba.__version__,
        "numba_cuda": numba_cuda,
        "commit": commit_id(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


# ----------------------------------------------------------------------------- timing

_busy = {}


def _busy_kernel():
    if "k" not in _busy:
        from numba import cuda, float32

        @cuda.jit
        def spin(out, iters):
            x = float32(cuda.threadIdx.x) * float32(1e-7)
            for _ in range(iters):
                x = x * float32(0.9999999) + float32(1e-7)
            if x == float32(-1.0):  # never true; keeps the loop alive
                out[0] = x

        _busy["k"] = spin
        _busy["out"] = cuda.device_array(1, np.float32)
        _busy["iters"] = 1 << 14
    return _busy


def busy(ms: float = 1.0) -> None:
    """Enqueue a kernel that keeps the GPU busy for about ``ms`` milliseconds.

    The spin rate (iterations per millisecond) is calibrated once, on the first call; every call
    then scales the iteration count to its own ``ms``.
    """
    from numba import cuda

    b = _busy_kernel()
    if "iters_per_ms" not in b:
        iters = b["iters"]
        for _ in range(4):
            s, e = cuda.event(), cuda.event()
            s.record()
            b["k"][264, 128](b["out"], iters)
            e.record()
            e.synchronize()
            took = max(cuda.event_elapsed_time(s, e), 1e-3)
            rate = iters / took
            iters = max(1, int(rate * 2.0))  # calibrate on a ~2 ms run
        b["iters_per_ms"] = rate
    b["k"][264, 128](b["out"], max(1, int(b["iters_per_ms"] * ms)))


@dataclass
class Timing:
    """Device seconds (median, p20, p80) over ``reps`` runs, and host seconds per call."""

    median: float
    p20: float
    p80: float
    host_per_call: float
    reps: int


#: the fewest timed runs a result row's median may come from (docs/design.md's measuring rules)
MIN_REPS = 10


def time_device(fn, reps: int = 15, warmup: int = 3, busy_ms: float = 2.0) -> Timing:
    """Time ``fn()`` (which must only enqueue device work, never synchronise) with CUDA events.

    Before each start event a busy kernel of ``busy_ms`` is queued so the stream is never idle and
    the event pair measures the GPU, not Python's launch overhead.
    """
    from numba import cuda

    for _ in range(warmup):
        fn()
    cuda.synchronize()
    events = []
    host = []
    for _ in range(reps):
        busy(busy_ms)
        s, e = cuda.event(), cuda.event()
        s.record()
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
        e.record()
        events.append((s, e))
    cuda.synchronize()
    secs = sorted(cuda.event_elapsed_time(s, e) / 1e3 for s, e in events)
    q = statistics.quantiles(secs, n=5) if len(secs) > 1 else [secs[0]] * 4
    return Timing(statistics.median(secs), q[0], q[3], statistics.median(host), reps)


# ----------------------------------------------------------------------------- ceilings

@dataclass
class Ceilings:
    read_TBps: float
    copy_TBps: float
    numba_read_TBps: float


def numba_read_kernel():
    """The best plain Numba read: 8-byte loads, 4 independent loads in flight per thread."""
    from numba import cuda, uint64

    @cuda.jit
    def read4(x, out):
        n = x.shape[0]
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        acc = uint64(0)
        while i + 3 * stride < n:
            a = x[i]
            b = x[i + stride]
            c = x[i + 2 * stride]
            d = x[i + 3 * stride]
            acc ^= a ^ b ^ c ^ d
            i += 4 * stride
        while i < n:
            acc ^= x[i]
            i += stride
        if acc == uint64(0x5DEECE66D):  # data-dependent, practically never true
            out[0] = acc

    return read4


def measure_ceilings(nbytes: int = 4 * GIB, reps: int = 15) -> Ceilings:
    """Read-only reduction (cupy sum over fp32), device-to-device copy (cupy, bytes read + written)
    and the Numba 8-byte read kernel, on ``nbytes`` of random data."""
    import cupy as cp
    from numba import cuda

    from ..device import launch

    x = cp.random.random(nbytes // 4, dtype=cp.float32)
    t_sum = time_device(x.sum, reps=reps)
    half = x[: x.size // 2]
    y = cp.empty_like(half)
    t_copy = time_device(functools.partial(cp.copyto, y, half), reps=reps)
    del y
    xu = cuda.as_cuda_array(x.view(cp.uint64))
    out = cuda.device_array(1, np.uint64)
    grid = launch.sm_count() * 8
    t_numba = time_device(functools.partial(numba_read_kernel()[grid, 256], xu, out), reps=reps)
    del x, xu
    cp.get_default_memory_pool().free_all_blocks()
    return Ceilings(nbytes / t_sum.median / 1e12, 2 * (nbytes // 2) / t_copy.median / 1e12,
                    nbytes / t_numba.median / 1e12)


# ----------------------------------------------------------------------------- verification

def verify_topk_torch(ids_dev, scores_dev, all_scores_dev, k: int, eligible_mask=None):
    """A device top-K answer against torch.topk on the same fp32 scores: equal score multisets,
    every returned id holds its returned score, no duplicates, and exact ties at the k-th score
    resolved to the lowest ids. Returns a :class:`~andromeda_nb.checks.Check`."""
    import cupy as cp
    import torch

    from ..checks import Check

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
        return Check(False, f"top-{k} scores differ from torch.topk")
    if kk < k and not ((ids[kk:] == -1).all() and np.isneginf(got[kk:]).all()):
        return Check(False, "pads are not -1 / -inf")
    real = ids[:kk]
    if len(set(real.tolist())) != kk or (real < 0).any():
        return Check(False, "duplicate or missing ids")
    at = cp.asarray(all_scores_dev)[cp.asarray(real)].get()
    if not np.array_equal(at, got[:kk]):
        return Check(False, "a returned id does not hold its returned score")
    if kk:
        kth = got[kk - 1]
        tied = cp.flatnonzero((cp.asarray(all_scores_dev) == kth) & valid).get()
        n_tied_in = int(np.sum(got[:kk] == kth))
        if not np.array_equal(np.sort(real[got[:kk] == kth]), np.sort(tied)[:n_tied_in]):
            return Check(False, "ties at the k-th score not resolved to the lowest ids")
    return Check(True, "equals torch.topk values; ids hold their scores; ties to lowest id")


# ----------------------------------------------------------------------------- rows

def row(suite: str, env: dict, ceil: Ceilings, timing: Timing, items: int, bytes_per_item: float,
        flops_per_item: float | None, verified: str, **fields) -> dict:
    """One results row in docs/design.md's schema (plus EXTRA columns); ``fields`` fill the rest
    (a case's :meth:`Case.columns`, measured values)."""
    ips = items / timing.median
    achieved = ips * bytes_per_item / 1e12
    out = {c: "" for c in SCHEMA + EXTRA}
    out.update(env)
    out.update(suite=suite, seconds_median=f"{timing.median:.6e}", seconds_p20=f"{timing.p20:.6e}",
               seconds_p80=f"{timing.p80:.6e}", items_per_s=f"{ips:.6e}", bytes_per_item=f"{bytes_per_item:.4g}",
               flops_per_item="" if flops_per_item is None else f"{flops_per_item:.6g}",
               achieved_TBps=f"{achieved:.4f}", ceiling_read_TBps=f"{ceil.read_TBps:.4f}",
               ceiling_copy_TBps=f"{ceil.copy_TBps:.4f}",
               fraction_of_read_ceiling=f"{achieved / ceil.read_TBps:.4f}", verified=verified,
               host_seconds_per_call=f"{timing.host_per_call:.3e}")
    out.update(fields)
    return out


def ceiling_rows(env: dict, ceil: Ceilings, suite: str) -> list[dict]:
    """The ceilings as rows of the suite's own table (variant ``ceiling_*``)."""
    rows = []
    for variant, tbps in (("ceiling_read_cupy_sum", ceil.read_TBps), ("ceiling_copy_cupy", ceil.copy_TBps),
                          ("ceiling_read_numba_8B_x4", ceil.numba_read_TBps)):
        r = {c: "" for c in SCHEMA + EXTRA}
        r.update(env, suite=suite, variant=variant, achieved_TBps=f"{tbps:.4f}",
                 ceiling_read_TBps=f"{ceil.read_TBps:.4f}", ceiling_copy_TBps=f"{ceil.copy_TBps:.4f}",
                 fraction_of_read_ceiling=f"{tbps / ceil.read_TBps:.4f}", verified="n/a (ceiling)",
                 bytes_per_item="", notes=f"{4 * GIB} bytes of random fp32")
        rows.append(r)
    return rows


def failed_row(env: dict, suite: str, variant: str, exc: BaseException) -> dict:
    """The row of a case that raised: its variant, ``verified`` FAILED with the exception."""
    r = {c: "" for c in SCHEMA + EXTRA}
    r.update(env, suite=suite, variant=variant, verified=f"FAILED: {type(exc).__name__}: {exc}"[:300])
    return r


def write_rows(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SCHEMA + EXTRA, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


_sink: Path | None = None  # the CSV rows are appended to as they are printed (a cut-off run keeps them)


def side_file(path: Path) -> Path:
    """The text a suite's run writes beside its CSV ``path`` (host profiles): ``<out>/<suite>_host_profiles.txt``,
    started afresh with the CSV."""
    return path.with_name(f"{path.stem}_host_profiles.txt")


def host_profile_file(out_dir) -> Path:
    """Where a host profile goes: the running suite's :func:`side_file`, or ``<out_dir>/host_profiles.txt`` for a
    case called outside a bench run."""
    return side_file(_sink) if _sink is not None else Path(out_dir, "host_profiles.txt")


def print_rows(rows: list[dict]) -> None:
    if _sink is not None:
        new = not _sink.exists()
        with _sink.open("a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=SCHEMA + EXTRA, extrasaction="ignore")
            if new:
                w.writeheader()
            w.writerows(rows)
    cols = ["variant", "dtype", "layout", "path", "d", "experts", "k_experts", "access", "eligible_fraction", "k",
            "items_per_s", "achieved_TBps", "fraction_of_read_ceiling", "verified"]
    print(" | ".join(cols))
    for r in rows:
        vals = []
        for c in cols:
            v = r.get(c, "")
            if c == "items_per_s" and v:
                v = f"{float(v) / 1e9:.2f}G"
            vals.append(str(v))
        print(" | ".join(vals))
    sys.stdout.flush()


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Settings:
    """Keyword arguments of a config class (KernelConfig, TopKConfig, MatchConfig) held as data:
    hashable, printable, built (and so validated) by :meth:`build`."""

    pairs: tuple = ()

    @classmethod
    def of(cls, **kwargs) -> "Settings":
        return cls(tuple(kwargs.items()))

    def get(self, name: str, default=None):
        return dict(self.pairs).get(name, default)

    def build(self, config_class):
        return config_class(**dict(self.pairs))

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.pairs) or "default"


class Case:
    """What the suites' cases share. A case is a frozen dataclass of one measurement's parameters.

    A field named like a results column (SCHEMA + EXTRA: ``variant``, ``dtype``, ``d``, ``layout``,
    ``access``, ``k``, ``path``, ``math``, ...) is that column's value in every row the case writes
    (None: not applicable, left empty); the other fields are settings of the measurement, listed by
    ``--list``. A ``variant`` with ``{placeholders}`` is completed at run time from the run's own
    measurements (the fastest shape of a sweep, the host's thread count). Plan fields a case class
    may declare: ``run_in`` ("both", "full": not in a ``--quick`` run, "quick": only there) and
    ``skip_with`` (a phase that measures the same case: skipped when that phase runs too).
    """

    run_in = "both"
    skip_with = ""

    def variants(self) -> tuple[str, ...]:
        """The variant names of the rows the case writes, in order."""
        return (self.variant,)

    def columns(self) -> dict:
        """The fields that are results columns, without the unset (None) ones."""
        names = set(SCHEMA + EXTRA)
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name in names and getattr(self, f.name) is not None}

    def settings(self) -> dict:
        """The fields that are not results columns (how the case is measured)."""
        names = set(SCHEMA + EXTRA) | {"run_in", "skip_with"}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in names}

    def configs(self) -> tuple:
        """The config objects (KernelConfig, TopKConfig, MatchConfig) the measurement builds from
        the case's settings, built here so a bad field fails before a GPU is touched."""
        return ()

    def fits(self, options: "Options") -> bool:
        """Whether the case applies to a run of these options (e.g. a pool prefix below ``--n-ads``)."""
        return True


@dataclass(frozen=True)
class Options:
    """What a run was asked for on the command line."""

    n_ads: int = 100_000_000
    reps: int = 15
    quick: bool = False
    out: str = "data/results"
    min_n_ads: int = 0  # cases of smaller pools are left out (a run of the largest size alone)


@dataclass(frozen=True)
class Planned:
    """A case in the plan of a run, with the phase that declared it."""

    phase: str
    case: Case


def suite_module(name: str):
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; known: {', '.join(SUITES)}")
    return importlib.import_module(f".{name}", __package__)


def plan(suite: str, phases: str | None, options: Options) -> list[Planned]:
    """The cases a run measures, in order: the chosen phases (comma-separated, default the suite's
    ``DEFAULT_PHASES``) of the suite's ``cases(options)`` mapping, in declaration order (the run
    order), without the cases the options leave out (``run_in``, ``skip_with``, :meth:`Case.fits`,
    a pool below ``min_n_ads``: a case without its own ``n_ads`` has the run's).

    Raises:
        ValueError: an unknown suite or phase, or ``phases`` naming none.
    """
    module = suite_module(suite)
    declared = module.cases(options)
    chosen = ([p.strip() for p in phases.split(",") if p.strip()] if phases is not None else list(module.DEFAULT_PHASES))
    if not chosen:
        raise ValueError(f"--phases {phases!r} names no phase; known: {', '.join(declared)}")
    unknown = [p for p in chosen if p not in declared]
    if unknown:
        raise ValueError(f"unknown {suite} phases {unknown}; known: {', '.join(declared)}")
    mode = "quick" if options.quick else "full"
    def size(case) -> int:
        n = getattr(case, "n_ads", None)
        return options.n_ads if n is None else n

    out = [Planned(phase, case) for phase, cases in declared.items() if phase in chosen for case in cases
           if case.run_in in ("both", mode) and case.skip_with not in chosen and case.fits(options)
           and size(case) >= options.min_n_ads]
    order = getattr(module, "order", None)
    return order(out) if order else out


def describe(p: Planned) -> str:
    """One line of ``--list``: phase, variant(s), columns, settings."""
    c = p.case
    names = list(dict.fromkeys(c.variants()))
    shown = " + ".join(n + (f" x{c.variants().count(n)}" if c.variants().count(n) > 1 else "") for n in names)
    cols = " ".join(f"{k}={v}" for k, v in c.columns().items() if k != "variant")
    sets = " ".join(f"{k}={v}" for k, v in c.settings().items() if v not in ("", None, False) and k != "note")
    return f"{p.phase:<13} {shown:<44} {cols}" + (f" | {sets}" if sets else "")


class Run:
    """One run of a suite: the state its cases share (tables, worlds, the fastest configuration of
    a sweep, ...). ``MEASURE`` maps each case class to its measurement function ``fn(run, case)``,
    which returns the case's rows (or one row)."""

    MEASURE: dict = {}

    def __init__(self, env: dict, ceil: Ceilings, options: Options):
        self.env, self.ceil, self.options = env, ceil, options

    def measure(self, planned: Planned) -> list[dict]:
        out = self.MEASURE[type(planned.case)](self, planned.case)
        return [out] if isinstance(out, dict) else list(out)

    def close(self) -> None:
        pass


def run_plan(suite: str, env: dict, ceil: Ceilings, options: Options, planned: list[Planned]) -> list[dict]:
    """The one loop: every planned case through its measurement function; rows printed (and
    appended to the sink) case by case."""
    run = suite_module(suite).Run(env, ceil, options)
    rows = []
    try:
        for p in planned:
            new = run.measure(p)
            rows += new
            print_rows(new)
    finally:
        run.close()
    return rows


# ----------------------------------------------------------------------------- command line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m andromeda_nb.bench", description=__doc__.splitlines()[0])
    ap.add_argument("suite", choices=SUITES, help="which suite to run")
    ap.add_argument("--out", default="build/bench",
                    help="folder for <suite>.csv, replaced by the run (default build/bench; not the committed "
                         "data/results, whose rows are merged in by hand)")
    ap.add_argument("--quick", action="store_true", help="a small subset of cases (targeting, pipeline)")
    ap.add_argument("--n-ads", type=int, default=None,
                    help="the largest pool (default 10^8); not for topk, whose cases carry their own sizes")
    ap.add_argument("--min-n-ads", type=int, default=0,
                    help="leave out the cases of smaller pools (e.g. the serving suite at 10^8 alone)")
    ap.add_argument("--reps", type=int, default=15, help="timed runs of a case's device time, median reported (at least 10: docs/design.md); "
                                                          "a public call's wall time takes 60 calls whatever this is")
    ap.add_argument("--phases", default=None, help="comma-separated phases of the suite (default: its default set)")
    ap.add_argument("--name", default=None, help="output file stem (default: the suite name)")
    ap.add_argument("--list", action="store_true", help="print the cases a run would measure and exit (no GPU needed)")
    args = ap.parse_args(argv)
    if args.reps < MIN_REPS:
        ap.error(f"--reps must be at least {MIN_REPS} (a median of >= {MIN_REPS} timings; docs/design.md), got {args.reps}")
    if args.n_ads is not None and args.suite in SIZED_BY_CASE:
        ap.error(f"--n-ads does not apply to the {args.suite} suite: its cases carry their own sizes "
                 "(--min-n-ads leaves out the smaller ones)")
    args.n_ads = Options.n_ads if args.n_ads is None else args.n_ads
    if args.n_ads < 1 or args.min_n_ads < 0:
        ap.error(f"--n-ads must be positive and --min-n-ads non-negative, got {args.n_ads} and {args.min_n_ads}")
    if is_committed_results(args.out):
        ap.error(f"--out {args.out} is the committed tables' folder, and a run replaces <suite>.csv there: write "
                 "elsewhere (the default build/bench) and merge the rows into the committed table")
    options = Options(n_ads=args.n_ads, reps=args.reps, quick=args.quick, out=args.out, min_n_ads=args.min_n_ads)
    try:
        planned = plan(args.suite, args.phases, options)
    except ValueError as exc:
        ap.error(str(exc))
    if args.list:
        size = "" if args.suite in SIZED_BY_CASE else f", pools up to {args.n_ads:,} ads"
        try:
            print(f"{args.suite}: {len(planned)} cases ({'quick' if args.quick else 'full'} run{size})")
            for p in planned:
                print(describe(p))
            sys.stdout.flush()
        except BrokenPipeError:  # a reader that stopped early (| head): the rest goes nowhere, no traceback
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    from ..device import backend

    if backend.set_backend("auto") != "cuda":
        print("benchmarks need a CUDA GPU (backend resolved to the simulator)", file=sys.stderr)
        return 2
    env = env_info()
    t0 = time.time()
    ceil = measure_ceilings(reps=args.reps)
    print(f"ceilings: read {ceil.read_TBps:.3f} TB/s, copy {ceil.copy_TBps:.3f} TB/s, "
          f"numba 8B read {ceil.numba_read_TBps:.3f} TB/s ({time.time() - t0:.1f}s)")
    global _sink
    path = Path(args.out) / f"{args.name or args.suite}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in (path, side_file(path)):
        old.unlink(missing_ok=True)
    _sink = path
    rows = ceiling_rows(env, ceil, args.suite)
    print_rows(rows)
    try:
        rows += run_plan(args.suite, env, ceil, options, planned)
    finally:
        _sink = None
    write_rows(rows, path)
    print_rows(rows)
    print(f"wrote {len(rows)} rows to {path} in {time.time() - t0:.0f}s")
    return 0
