"""Top-K suite: ``python -m andromeda_nb.bench topk`` (GPU only; ``--list`` anywhere).

Standalone top-K over fp32 scores against torch.topk (and cupy.argpartition) on the same scores,
every answer checked against torch.topk (equal values, ids holding their scores, ties to the
lowest id). Phases (``--phases``, comma-separated; default ``DEFAULT_PHASES``), in run order:

    large       10^8 scores, k = 100 / 1000 / 2048 / 4096, random and ascending, seeded and not
    nsweep      10^5, 10^6 and 10^7 scores, k = 1000, with torch.topk and cupy.argpartition
    elig        10^8 scores with an eligible bitset of 50 % / 10 %, seeded and not
    small       one request of 500,000, k = 1000: the seeded paths, the batched path on a batch of
                one, the one-launch path
    stages      the small request's device time per stage
    stages_large the stages of 10^8 scores, k = 1000 (not in the default set)
    batch       1,024 x 50,000, k = 100: batched seeded (whole and by stage), unseeded, torch.topk(dim=1)

The ``access`` column holds the score order (random, ascending) or ``bitset``; ``path`` the path
that answered (filter, scan, unseeded, batched, onelaunch; empty for the baselines).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import harness
from .. import checks
from ..device import launch

L2_SMALL = "2 MB: L2-resident, as right after scoring"
#: the stages of one seeded call (:func:`topk_stages`), in the order they run
STAGES = ("seed", "filter", "final", "final_radix", "scan", "merge", "merge_radix", "all")
#: the path each stage belongs to
STAGE_PATH = {"scan": "scan", "merge": "scan", "merge_radix": "scan"}
#: the stages of the batched seeded call (:func:`batch_rows`)
BATCH_STAGES = ("seed", "filter", "final", "final_warp_sync")


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class BlockTopKCase(harness.Case):
    """One top-K call (:func:`~andromeda_nb.topk.single.launch_topk`): seeded on ``path`` ("filter"
    or "scan") or "unseeded", on scores in ``access`` order or behind an eligible bitset."""

    variant: str
    n_ads: int
    k: int
    access: str
    path: str
    eligible_fraction: float | None = None
    seed: int | None = None  # of the random scores (None: n + k)
    note: str = ""
    batch: int = 1
    dtype: str = "fp32"

    @property
    def seeded(self) -> bool:
        return self.path != "unseeded"


@dataclass(frozen=True)
class BaselineCase(harness.Case):
    """torch.topk or cupy.argpartition on the same scores as the case before it."""

    variant: str
    n_ads: int
    k: int
    access: str = "random"
    note: str = ""
    batch: int = 1
    dtype: str = "fp32"


@dataclass(frozen=True)
class BatchPathCase(harness.Case):
    """One request through the batched seeded path (a batch of one)."""

    variant: str
    n_ads: int
    k: int
    rounds: int | None = None  # the filter's rounds a block (None: the tuning's)
    wall: bool = False  # also the host wall time of topk_scores on the device scores
    path: str = "batched"
    access: str = "random"
    batch: int = 1
    dtype: str = "fp32"


@dataclass(frozen=True)
class OneLaunchCase(harness.Case):
    """One request through the one-launch path."""

    variant: str
    n_ads: int
    k: int
    warp_sync: bool = False
    path: str = "onelaunch"
    access: str = "random"
    batch: int = 1
    dtype: str = "fp32"

    def configs(self) -> tuple:
        from ..topk.config import TopKConfig

        return (TopKConfig(onelaunch_warp_sync=self.warp_sync),)


@dataclass(frozen=True)
class StagesCase(harness.Case):
    """Each stage of one seeded call timed alone (:func:`topk_stages`), a row a stage."""

    n_ads: int
    k: int
    access: str = "random"
    batch: int = 1
    dtype: str = "fp32"

    def variants(self) -> tuple[str, ...]:
        return tuple(f"block_topk_stage_{s}" for s in STAGES)


@dataclass(frozen=True)
class BatchedCase(harness.Case):
    """The batched top-K (``batch`` requests of ``n_ads`` scores): seeded whole and by stage, the
    unseeded block top-K, torch.topk(dim=1)."""

    n_ads: int = 50_000
    k: int = 100
    batch: int = 1024
    access: str = "random"
    dtype: str = "fp32"

    def variants(self) -> tuple[str, ...]:
        return ("block_topk_batched_seeded", *(f"block_topk_batched_seeded_stage_{s}" for s in BATCH_STAGES),
                "block_topk_batched", "torch.topk")

    def configs(self) -> tuple:
        from ..topk.config import TopKConfig

        return (TopKConfig(sort_warp_sync=True),)


def block(n, k, path="filter", access="random", frac=None, seed=None, note="") -> BlockTopKCase:
    name = ("block_topk" if path == "unseeded" else "block_topk_seeded") + ("_scan_path" if path == "scan" else "")
    return BlockTopKCase(name + ("_eligible" if access == "bitset" else ""), n, k, access, path, frac, seed, note)


def torch_topk(n, k, access="random", note="") -> BaselineCase:
    return BaselineCase("torch.topk", n, k, access, note)


def argpartition(n, k, note="") -> BaselineCase:
    return BaselineCase("cupy.argpartition", n, k, "random", note)


def with_torch(case: BlockTopKCase) -> tuple:
    """A top-K case and torch.topk on the same scores, right after it."""
    return case, torch_topk(case.n_ads, case.k, case.access, case.note)


N_LARGE, N_SMALL = 100_000_000, 500_000
#: n at most 12.5 M: the scores (4 B each) fit in the 50 MB L2
L2_WARM = "scores fit in L2 (n x 4 B < 50 MB): warm after the first run"

#: phase -> cases, in run order
PHASES = {
    "large": (
        *(c for k in (100, 1000, 2048, 4096)  # 4096: the filter path only (above BLOCK_TOPK_MAX_K)
          for c in with_torch(block(N_LARGE, k)) + (
              (block(N_LARGE, k, "scan", note="seeded scan + merge path"),
               *with_torch(block(N_LARGE, k, "unseeded")), argpartition(N_LARGE, k)) if k == 1000 else ())),
        *(c for path in ("filter", "unseeded") for c in with_torch(block(N_LARGE, 1000, path, "ascending")))),
    "nsweep": tuple(c for n in (100_000, 1_000_000, 10_000_000)  # throughput and latency against n at k = 1000
                    for c in with_torch(block(n, 1000, note=L2_WARM if n * 4 < 50e6 else ""))
                    + (argpartition(n, 1000, L2_WARM if n * 4 < 50e6 else ""),)),
    "elig": tuple(block(N_LARGE, 1000, path, "bitset", frac, seed=11,
                        note="scores + the eligible bitset read (4.125 B per score)")
                  for frac in (0.5, 0.1) for path in ("filter", "unseeded")),
    "small": (
        *with_torch(block(N_SMALL, 1000, note=L2_SMALL)), *with_torch(block(N_SMALL, 1000, "unseeded", note=L2_SMALL)),
        *with_torch(block(N_SMALL, 1000, "scan", note="2 MB: L2-resident; seeded scan + merge path")),
        # topk_scores's route for 65,536..2^20 scores
        BatchPathCase("block_topk_seeded_batch_path", N_SMALL, 1000, wall=True),
        *(BatchPathCase(f"block_topk_seeded_batch_path_rounds{r}", N_SMALL, 1000, rounds=r) for r in (4, 1)),
        *(OneLaunchCase("block_topk_onelaunch" + ("_warp_sync" if ws else ""), N_SMALL, k, warp_sync=ws)
          for k in (1000, 100) for ws in (False, True))),
    "stages": (StagesCase(N_SMALL, 1000),),
    "stages_large": (StagesCase(N_LARGE, 1000),),  # where 10^8 scores' seeded call spends its time
    "batch": (BatchedCase(),),
}
DEFAULT_PHASES = ("large", "elig", "small", "stages", "batch", "nsweep")


def cases(options: harness.Options) -> dict:
    return PHASES


# ----------------------------------------------------------------------------- measuring


def random_scores(case):
    """The case's scores on the device (cupy): ascending ``arange / n``, else N(0, 1) from its seed."""
    import cupy as cp

    n = case.n_ads
    if case.access == "ascending":
        return cp.arange(n, dtype=cp.float32) / n
    seed = getattr(case, "seed", None)
    return cp.random.RandomState(n + case.k if seed is None else seed).standard_normal(n, dtype=cp.float32)


def block_topk_row(run, case: BlockTopKCase) -> dict:
    """Time one top-K call (seeded on the case's path, or unseeded; optionally on an eligible
    bitset), check it against torch.topk. A seeded case where no seed pays (SeedWorkspace.make
    gives None) runs unseeded and is recorded under the unseeded name."""
    import cupy as cp

    from ..targeting import bits_from_mask
    from ..topk.api import (BLOCK_TOPK_MAX_K, FilterWorkspace, SeedWorkspace, TopKWorkspace, launch_topk,
                            scan_lists, seeded_outcome)

    cuda = launch.cuda()
    n, k = case.n_ads, case.k
    scores = random_scores(case)
    elig = mask = None
    if case.access == "bitset":  # seeding samples eligible scores only
        frac = case.eligible_fraction
        mask = cp.random.RandomState(int(frac * 100)).random_sample(n) < frac
        elig = cuda.to_device(bits_from_mask(mask.get()))
    d_scores = cuda.as_cuda_array(scores)
    offsets, ks = np.array([0, n], np.int64), np.array([k], np.int64)
    sws = SeedWorkspace.make(n, k) if case.seeded else None
    # above the block top-K's k limit only the filter path runs (no block top-K workspace)
    ws = (TopKWorkspace(offsets, ks, scan_lists(offsets, ks, seeded=sws is not None))
          if k <= BLOCK_TOPK_MAX_K else None)
    fws = FilterWorkspace(n, k) if sws is not None else None
    path = None if case.path == "unseeded" else case.path

    def call():
        return launch_topk(d_scores, n, k, elig=elig, seeded=case.seeded, ws=ws, sws=sws, fws=fws, path=path)

    res, _ = call()
    timing = harness.time_device(call, reps=run.options.reps)
    c = res.counts.copy_to_host()[0]
    verified = harness.verify_topk_torch(res.out_id[0], res.out_s[0], scores, k, eligible_mask=mask)
    outcome = "exact" if sws is None else seeded_outcome(res, k, c)
    if outcome != "exact":
        rerun = ("unseeded (seed above the k-th score)" if outcome == "seed_high" else
                 "on the scan path (filter buffer overflow)" if k <= BLOCK_TOPK_MAX_K else
                 "as one pass keeping every score (k above the block top-K's limit)")
        verified = checks.Check(False, f"seeded run not exact ({c[1]} scores reached the seed): topk_scores "
                                       f"would rerun {rerun}")
    fields = case.columns()
    if case.seeded and sws is None:
        fields.update(variant=case.variant.replace("block_topk_seeded", "block_topk"), path="unseeded")
    return harness.row("topk", run.env, run.ceil, timing, n, 4.0 if elig is None else 4.0 + 1 / 8, None,
                       str(verified), **fields, notes=case.note)


def baseline_row(run, case: BaselineCase) -> dict:
    import cupy as cp
    import torch

    scores = random_scores(case)
    k = case.k
    if case.variant == "torch.topk":
        t = torch.as_tensor(scores, device="cuda")
        timing = harness.time_device(lambda: torch.topk(t, k), reps=run.options.reps)
        verified = "baseline (values checked above)"
    else:
        timing = harness.time_device(lambda: cp.argpartition(scores, scores.size - k)[-k:], reps=run.options.reps)
        verified = "baseline (unsorted top-k indices)"
    return harness.row("topk", run.env, run.ceil, timing, case.n_ads, 4.0, None, verified, **case.columns(),
                       notes=case.note)


def topk_stages(d_scores, n: int, k: int, *, config=None):
    """The stages of one seeded :func:`andromeda_nb.topk.api.launch_topk` call as separately launchable
    steps, each on the inputs the earlier ones leave in place: ``(stages, ws, fws, sws)`` with
    ``stages`` a list of ``(name, enqueue_fn, note, result workspace or None)`` named as
    :data:`STAGES`; the last, ``all``, is the whole call (the default "filter" path). The "scan"
    path's stages (scan, merge) follow the filter path's (filter, final). Stages that append to a
    buffer run the counters' reset (a 1-block kernel) first, so repeats start from the same state.
    Needs ``n`` large enough to be seeded under ``config`` (a
    :class:`~andromeda_nb.topk.config.TopKConfig`, default the measured one)."""
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


def stage_rows(run, case: StagesCase) -> list[dict]:
    """Where one request's seeded top-K spends its device time: each stage of :func:`topk_stages`
    timed alone (CUDA events behind the busy kernel)."""
    import cupy as cp

    cuda = launch.cuda()
    n, k = case.n_ads, case.k
    scores = cp.random.RandomState(n + k).standard_normal(n, dtype=cp.float32)
    stages, ws, fws, sws = topk_stages(cuda.as_cuda_array(scores), n, k)
    if tuple(s[0] for s in stages) != STAGES:
        raise RuntimeError(f"topk_stages gave stages {[s[0] for s in stages]}, the case declares {STAGES}")
    for _, fn, _, _ in stages:  # in order, once: every stage's inputs in place
        fn()
    cuda.synchronize()
    rows = []
    kept = int(fws.fill.copy_to_host()[0])
    # bytes a score each stage reads: the seed its sample, the finals the kept scores (8 B each), the
    # merge the block lists; the passes over the scores 4
    moved = {"seed": 4.0 * sws.m / n, "final": 8.0 * kept / n, "final_radix": 8.0 * kept / n,
             "merge": 8.0 * ws.lists * k / n, "merge_radix": 8.0 * ws.lists * k / n}
    for (name, fn, note, res), variant in zip(stages, case.variants()):
        verified = "n/a (stage timing; the 'all' row is verified)"
        if res is not None:  # these write the answer: check it
            fn()
            cuda.synchronize()
            verified = str(harness.verify_topk_torch(res.out_id[0], res.out_s[0], scores, k))
        timing = harness.time_device(fn, reps=run.options.reps)
        note = note + ("; bytes_per_item: what the stage reads a score" if name in moved else "")
        rows.append(harness.row("topk", run.env, run.ceil, timing, n, moved.get(name, 4.0), None, verified,
                                **case.columns(), variant=variant, path=STAGE_PATH.get(name, "filter"),
                                notes=(f"{4 * n / 1e6:.0f} MB: L2-resident; " if 4 * n < 25e6 else
                                       f"{4 * n / 1e6:.0f} MB: beyond the 50 MB L2; ") + note))
    c = fws.counts.copy_to_host()[0]
    rows[-1]["notes"] += (f"; {int(c[1])} scores reached the seed (filter buffer {fws.cap}); "
                          f"{int(ws.fill.copy_to_host()[0])} candidates reached the scan path's final step")
    return rows


def batch_path_row(run, case: BatchPathCase) -> dict:
    """One request through the batched seeded path (a batch of one): its seed is one block's 4,096-
    score sample (the single-request seed samples 12,800 at n = 500,000 over 4 blocks and a last-
    block merge), then the same filter pass and rank final. The row says whether the answer was
    exact without a rerun. ``case.rounds``: the filter's rounds a block (default
    TopKTuning.batch_filter_rounds); ``case.wall``: also the host wall time of ``topk_scores`` on
    the device scores (it takes this path: allocation, three launches, copies)."""
    import cupy as cp

    from ..topk.api import DEFAULT_CONFIG, FilterWorkspace, topk_scores
    from ..topk.batched import batch_outcomes, launch_topk_batch_seeded

    cuda = launch.cuda()
    n, k, rounds = case.n_ads, case.k, case.rounds
    scores = cp.random.RandomState(n + k).standard_normal(n, dtype=cp.float32)
    d_scores = cuda.as_cuda_array(scores)
    fws = FilterWorkspace.batched(np.array([0, n], np.int64), np.array([k], np.int64))

    def call():
        return launch_topk_batch_seeded(d_scores, fws, rounds=rounds)

    call()
    outcome = batch_outcomes(fws)[0]
    verified = harness.verify_topk_torch(fws.out_id[0], fws.out_s[0], scores, k)
    if outcome != "exact":
        verified = checks.Check(False, f"not exact on the batched path ({outcome}): topk_batch would rerun it")
    timing = harness.time_device(call, reps=run.options.reps)
    kept = int(fws.counts.copy_to_host()[0, 1])
    note = ""
    if case.wall:
        walls = []
        for _ in range(20):
            t0 = time.perf_counter()
            topk_scores(d_scores, k)
            walls.append(time.perf_counter() - t0)
        note = f"; topk_scores on device scores: {np.median(walls[5:]) * 1e6:.0f} us host wall time a call (median of 15)"
    return harness.row("topk", run.env, run.ceil, timing, n, 4.0, None, str(verified), **case.columns(),
                       notes=f"{4 * n / 1e6:.0f} MB: L2-resident; the batched path on one request: a one-block seed, "
                             f"{kept} scores kept (buffer {fws.cap}); filter "
                             f"{rounds or DEFAULT_CONFIG.tuning.batch_filter_rounds} rounds a block" + note)


def onelaunch_row(run, case: OneLaunchCase) -> dict:
    """One request through the one-launch path (:func:`~andromeda_nb.topk.onelaunch.launch_onelaunch`:
    every block seeds from the same 8,192-score sample, filters its 8,192 scores, the last block
    sorts the kept ones), device time with the workspace preallocated. Not topk_scores's route: on
    the H200 the last block's sort of ~1,000 / ~3,000 kept scores alone took 15 / 44 us
    (data/results/topk_diagnostics.md)."""
    import cupy as cp

    from ..topk.api import seeded_outcome
    from ..topk.onelaunch import OneLaunchWorkspace, launch_onelaunch

    cuda = launch.cuda()
    n, k = case.n_ads, case.k
    scores = cp.random.RandomState(n + k).standard_normal(n, dtype=cp.float32)
    d_scores = cuda.as_cuda_array(scores)
    olw = OneLaunchWorkspace.make(n, k)
    (config,) = case.configs()

    def call():
        return launch_onelaunch(d_scores, n, k, olw, config=config)

    call()
    c = olw.counts.copy_to_host()[0]
    outcome = seeded_outcome(olw, k, c)
    verified = harness.verify_topk_torch(olw.out_id[0], olw.out_s[0], scores, k)
    if outcome != "exact":
        verified = checks.Check(False, f"not exact in one launch ({outcome}): a caller would rerun it")
    timing = harness.time_device(call, reps=run.options.reps)
    return harness.row("topk", run.env, run.ceil, timing, n, 4.0, None, str(verified), **case.columns(),
                       notes=f"{4 * n / 1e6:.0f} MB: L2-resident, as right after scoring; one launch "
                             f"({-(-n // 8192)} blocks of 1,024 threads); sample rank {olw.r} of {olw.m}, "
                             f"{int(c[1])} scores kept (sort cap {olw.cap})")


def batch_rows(run, case: BatchedCase) -> list[dict]:
    """The batched top-K (``batch`` requests of ``n_ads`` scores, top-``k`` each): the seeded path
    (:func:`andromeda_nb.topk.batched.launch_topk_batch_seeded`) whole and stage by stage, the
    unseeded block top-K (its fallback), and torch.topk(dim=1) on the same scores. The seeded row is
    verified only when every request's answer was exact (no request needed a rerun) and equals torch's."""
    import cupy as cp
    import torch

    from ..topk.api import DEFAULT_CONFIG, FilterWorkspace, TopKWorkspace
    from ..topk.batched import batch_outcomes, batch_seed_shape, launch_topk_batch_seeded
    from ..topk.filter import launch_filter
    from ..topk.final import launch_final
    from ..topk.scan import launch_topk_batch, scan_lists
    from ..topk.seed_kernels import BATCH_SAMPLE_CHUNK, batch_seed_kernel

    cuda = launch.cuda()
    batch, per, k = case.batch, case.n_ads, case.k
    variants = iter(case.variants())
    rows = []

    def add(timing, bytes_per_score, verified, path, notes=""):
        rows.append(harness.row("topk", run.env, run.ceil, timing, batch * per, bytes_per_score, None, str(verified),
                                **case.columns(), variant=next(variants), path=path, notes=notes))

    scores = cp.random.RandomState(7).standard_normal(batch * per, dtype=cp.float32)
    offsets = np.arange(batch + 1, dtype=np.int64) * per
    ks = np.full(batch, k, np.int64)
    d_scores = cuda.as_cuda_array(scores)
    t = torch.as_tensor(scores, device="cuda").view(batch, per)
    want = torch.topk(t, k, dim=1).values.cpu().numpy()

    def values_check(out_s, what):
        ok = np.array_equal(out_s.copy_to_host(), want)
        return checks.Check(ok, f"{batch} requests' top-{k} values equal torch.topk(dim=1){what}" if ok else
                            f"batched values differ from torch.topk{what}")

    fws = FilterWorkspace.batched(offsets, ks)

    def call():
        return launch_topk_batch_seeded(d_scores, fws)

    call()
    outcomes = batch_outcomes(fws)
    kept = fws.counts.copy_to_host()[:, 1]
    verified = values_check(fws.out_s, "")
    if (outcomes != "exact").any():
        verified = checks.Check(False, f"{int((outcomes != 'exact').sum())} requests not exact on the seeded path "
                                       f"(topk_batch would rerun them)")
    timing = harness.time_device(call, reps=run.options.reps)
    blk, per_thread = batch_seed_shape()
    add(timing, 4.0, verified, "batched",
        f"seed ({blk * per_thread} samples a request), filter, sort final: 3 launches; kept scores a "
        f"request: median {int(np.median(kept))}, max {int(kept.max())} (buffer {fws.cap})")
    seed_kern = batch_seed_kernel(blk, per_thread, BATCH_SAMPLE_CHUNK, False, int(2 * DEFAULT_CONFIG.tuning.seed_margin),
                                  DEFAULT_CONFIG.tuning.seed_min_rank)
    samples = min(per, blk * per_thread)
    kept_bytes = float(kept.mean()) * 8 + k * (4 + 4 + 16)  # kept (score, slot); out scores read + 3 outputs
    (sort_config,) = case.configs()  # the sort's short steps end with warp barriers
    # bytes a score each stage moves: the seed reads its sample, the final the kept scores and writes k
    stages = [
        ("seed", lambda: seed_kern[batch, blk](d_scores, fws.offsets, fws.ks, launch.dummy2d(np.uint64), fws.seeds,
                                              fws.counts, fws.fill),
         4.0 * samples / per, f"a block a request: the seed from a {samples}-score sample, counters zeroed"),
        ("filter", lambda: (fws.reset(), launch_filter(d_scores, fws, fws.seeds)), 4.0,
         "counter reset + the filter pass over the batch"),
        ("final", lambda: launch_final(k, fws, d_scores=d_scores), kept_bytes / per,
         "a block a request sorts its kept scores"),
        ("final_warp_sync", lambda: launch_final(k, fws, d_scores=d_scores, config=sort_config),
         kept_bytes / per, "the same sort, its steps of stride <= 32 ending with warp barriers"),
    ]
    if tuple(s[0] for s in stages) != BATCH_STAGES:
        raise RuntimeError(f"batch stages {[s[0] for s in stages]} differ from the declared {BATCH_STAGES}")
    for name, fn, bytes_per_score, note in stages:  # in order: each stage's inputs in place
        fn()
        timing = harness.time_device(fn, reps=run.options.reps)
        verified = (values_check(fws.out_s, " (after the stage)") if name.startswith("final")
                    else "n/a (stage timing)")
        add(timing, bytes_per_score, verified, "batched", f"{note}; bytes_per_item: what the stage moves a score")
    ws = TopKWorkspace(offsets, ks, scan_lists(offsets, ks))
    timing = harness.time_device(lambda: launch_topk_batch(d_scores, ws), reps=run.options.reps)
    add(timing, 4.0, values_check(ws.out_s, ""), "unseeded", "unseeded block top-K lists + merge (the fallback)")
    timing = harness.time_device(lambda: torch.topk(t, k, dim=1), reps=run.options.reps)
    add(timing, 4.0, "baseline", "")
    return rows


class Run(harness.Run):
    """The top-K run: every case makes its own scores; the memory pool is emptied after each."""

    MEASURE = {BlockTopKCase: block_topk_row, BaselineCase: baseline_row, BatchPathCase: batch_path_row,
               OneLaunchCase: onelaunch_row, StagesCase: stage_rows, BatchedCase: batch_rows}

    def measure(self, planned):
        import cupy as cp

        rows = super().measure(planned)
        cp.get_default_memory_pool().free_all_blocks()
        return rows
