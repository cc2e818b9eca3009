"""Serving suite: one GPU's pool served through Dask (``python -m andromeda_nb.bench serving``).

The same requests (gated E6 K2 fp16 d64, k = 1000, the benchmark world: ~1 % eligible) through each
topology of :mod:`andromeda_nb.serving.cluster`, on a local cluster of two worker processes that
share the GPU (``LocalCluster``: TCP comms, as between hosts). Rows (``data/results/serving.csv``):

    inprocess_retrieve  the requests on a Pool in the caller's process (no Dask)
    colocated           the request to the worker holding the Pool; the top-k back
    remote_scoring      targeting on the other worker (the host index), the eligible slots (int32)
                        to the Pool's worker, which scores and selects
    sharded             the pool split between ``n_workers`` shards by ad id, merged exactly; the
                        ``scaling`` phase (not in the default run): one worker a GPU, weak and strong
                        scaling over 1, 2, 4 and 8 GPUs (those the host has), batches and single requests

Each row: wall time of the call (warm, median and p99 of ``CALLS``), ``requests_per_s`` (one caller,
calls back to back), ``transport_bytes_per_request`` (every TCP comm's bytes, client, scheduler and
workers: :mod:`andromeda_nb.serving.transport`) with the byte model's prediction in the notes,
and ``verified``: every request's answer equal to the in-process Pool's (ids, scores, eligible
count). Pool sizes 10^7 and 10^8 (those up to ``--n-ads``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from . import harness
from .pipeline import order as pipeline_order

D, E, KE, K = 64, 6, 2, 1000
CALLS = 60
PAIRS = 8  # distinct requests, in turn
SIZES = (10 ** 7, 10 ** 8)
WORKERS = 2


#: what this process built last: its rules, and one world (a pool's table and index, or a host
#: index) built from them. A worker builds a world once for every topology that asks for the same
#: one, so the 10^8-ad phases fit one GPU-host call; the servers only read them. One world at a
#: time: a 10^8-ad index holds ~21 GB of host memory, and three processes share the host
_LAST: dict = {}


def _last(kind: str, key: tuple, make):
    """``make()``, or this process's last ``kind`` built with ``key``; building a world ("rules"
    aside) drops the one held before it, of any kind, first (its memory, before the new one's)."""
    if _LAST.get(kind, (None,))[0] != key:
        for held in [k for k in _LAST if k == kind or (kind != "rules" and k != "rules")]:
            del _LAST[held]
        import gc

        gc.collect()
        _LAST[kind] = (key, make())
    return _LAST[kind][1]


def rules_path(n: int, seed: int) -> str:
    """Where this host's processes share the benchmark world's rules of ``n`` ads (a directory of
    :meth:`TargetingRules.save <andromeda_nb.targeting.TargetingRules.save>`, in
    ``andromeda-nb-rules`` under ``$ANDROMEDA_SCRATCH`` or the temporary directory)."""
    import os
    import tempfile

    root = os.path.join(os.environ.get("ANDROMEDA_SCRATCH") or tempfile.gettempdir(), "andromeda-nb-rules")
    return os.path.join(root, f"benchmark-{n}-{seed}")


def _rules(n: int, seed: int):
    """The benchmark world's rules, memory-mapped from :func:`rules_path` (the first process to
    ask generates and saves them): the caller's reference and both workers read one copy in the
    page cache, where three copies of a 10^8-ad pool's rules (~37 GB each) would not fit the host."""
    from ..datasets import synthetic as syn
    from ..targeting import TargetingRules

    def make():
        path = rules_path(n, seed)
        try:
            rules = TargetingRules.load(path)
        except FileNotFoundError:
            rules = syn.generate_rules(syn.benchmark_schema(), n, seed=seed)
            try:
                rules.save(path)
                _SAVED.add(path)
            except FileExistsError:  # another process saved them first: theirs are the same rules
                pass
            del rules
            rules = TargetingRules.load(path)
        if rules.schema != syn.benchmark_schema() or rules.n_ads != n:
            raise RuntimeError(f"{path} holds other rules than the benchmark world's {n} ads (another build's?); "
                               "remove it")
        return rules

    return _last("rules", (n, seed), make)


#: the worlds this process saved (:func:`drop_saved_rules` removes them, and no other run's)
_SAVED: set = set()


def drop_saved_rules() -> None:
    """Remove the benchmark worlds this process saved (:func:`rules_path`), and drop the worlds it holds."""
    import shutil

    _LAST.clear()
    while _SAVED:
        shutil.rmtree(_SAVED.pop(), ignore_errors=True)


def gpu_world(n: int, seed: int = 0, shard: int = 0, n_shards: int = 1):
    """A worker's pool (the build function of its server): the benchmark world's rules of the ads
    with ``ad_id % n_shards == shard`` and their fp16 rows generated on the GPU (this process's last
    one again where it asks for the same)."""
    return _last("world", (n, seed, shard, n_shards), lambda: _gpu_world(n, seed, shard, n_shards))


def _gpu_world(n: int, seed: int, shard: int, n_shards: int):
    from ..device import launch
    from ..model import AdTable
    from ..serving.cluster import shard_of
    from ..targeting import TargetingIndex

    # the whole pool's rules and rows, then this shard's: a shard's rows are the whole pool's rows of
    # its ads (the in-process reference holds the same pool)
    rules = _rules(n, seed)
    mine = np.flatnonzero(shard_of(rules.ad_ids, n_shards) == shard)
    if n_shards > 1:
        rules = rules.subset(mine)
    if launch.backend.is_simulator():  # the bench's own tests: rows from numpy
        rng = np.random.default_rng(1)
        emb, bias = rng.standard_normal((n, D)), rng.standard_normal(n)
        return AdTable.from_float(emb[mine], bias[mine], ad_ids=rules.ad_ids), TargetingIndex(rules)
    import cupy as cp

    from ..score.table import DeviceAdTable
    from .tables import gpu_table

    whole = gpu_table(n, D, "fp16", "rows", seed=1)
    if n_shards == 1:
        return whole, TargetingIndex(rules)
    idx = cp.asarray(mine)
    store, bias, ids = whole._keep[0][idx], whole._keep[1][idx], cp.asarray(rules.ad_ids)
    del whole
    table = DeviceAdTable.from_device(store, bias, "fp16", "rows", ad_ids=ids)
    table._keep = (store, bias, ids)
    return table, TargetingIndex(rules)


def gpu_shard(shard: int, n_shards: int, n: int, seed: int = 0):
    return gpu_world(n, seed, shard, n_shards)


def host_index(n: int, seed: int = 0):
    """The targeting worker's side of remote scoring: the same rules' host index, no table."""
    from ..targeting import TargetingIndex

    return _last("host_index", (n, seed), lambda: (None, TargetingIndex(_rules(n, seed))))


@dataclass(frozen=True)
class ServingCase(harness.Case):
    variant: str
    n_ads: int | None = None
    n_workers: int = 1
    n_gpus: int = 1
    batch: int = 1
    k: int = K
    access: str = "bitset"
    #: requests picked for this eligible fraction (:data:`ELIGIBLE`); None: the world's own (~1 %)
    target_eligible: float | None = None


#: the eligible phase's fractions (the issue's 0.5-2 %), and how many profiles are drawn to pick
#: each fraction's requests from (by their eligible count in the in-process Pool)
ELIGIBLE = (0.005, 0.02)
DRAWN = 2048


def pick_by_eligible(counts, n_ads: int, target: float, k: int) -> np.ndarray:
    """The indices of the ``k`` counts whose fraction of ``n_ads`` lies closest to ``target``."""
    return np.argsort(np.abs(np.asarray(counts) / n_ads - target), kind="stable")[:k]


@dataclass(frozen=True)
class ScalingCase(harness.Case):
    """The sharded pool with one worker a GPU (:func:`~andromeda_nb.serving.cluster.gpu_cluster`):
    ``scaling="weak"`` holds 10^8 ads a GPU (``n_ads`` = 10^8 x ``n_gpus``), ``"strong"`` 10^8 in all;
    two rows, batches of ``BATCH`` (requests a second) and single requests (latency, the merge's
    share). Skipped (no rows) where the host has fewer GPUs."""

    variant: str = "sharded"
    n_gpus: int = 1
    scaling: str = "weak"
    n_ads: int | None = None
    access: str = "bitset"
    k: int = K

    def variants(self) -> tuple[str, ...]:
        return ("sharded", "sharded")


#: the scaling phase's batch (requests a second) and GPU counts
BATCH = 32
GPU_COUNTS = (1, 2, 4, 8)
PER_GPU = 10 ** 8

PHASES = {
    "topologies": (ServingCase("inprocess_retrieve", n_workers=0), ServingCase("colocated"),
                   ServingCase("remote_scoring", n_workers=2)),
    "sharded": (ServingCase("sharded", n_workers=1), ServingCase("sharded", n_workers=2)),
    # the co-located call and its in-process reference alone (not in the default run)
    "colocated": (ServingCase("inprocess_retrieve", n_workers=0), ServingCase("colocated")),
    # the topologies on requests picked for 0.5 % and 2 % eligible (the in-process rows timed while
    # the run's reference Pool is up, before any worker builds its world)
    "eligible": tuple(c for f in ELIGIBLE for c in (
        ServingCase("inprocess_retrieve", n_workers=0, target_eligible=f), ServingCase("colocated", target_eligible=f),
        ServingCase("remote_scoring", n_workers=2, target_eligible=f))),
    # the multi-GPU issue's scale-out: weak (10^8 ads a GPU) and strong (10^8 in all) scaling
    "scaling": tuple(ScalingCase(n_gpus=g, scaling=m, n_ads=PER_GPU * g if m == "weak" else PER_GPU)
                     for m in ("weak", "strong") for g in GPU_COUNTS),
}
DEFAULT_PHASES = ("topologies", "sharded")


def cases(options: harness.Options) -> dict:
    sizes = [n for n in SIZES if n <= options.n_ads]
    out = {phase: tuple(replace(c, n_ads=n) for n in sizes for c in declared)
           for phase, declared in PHASES.items() if phase != "scaling"}
    out["scaling"] = PHASES["scaling"]
    return out


order = pipeline_order  # pool size first: one reference pool at a time


class Run(harness.Run):
    """The cluster (started once), and per pool size the in-process reference pool and requests."""

    def __init__(self, env, ceil, options, calls: int = CALLS, pairs: int = PAIRS, batch: int = BATCH,
                 drawn: int = DRAWN):
        """``calls``: timed calls a row; ``pairs``: distinct requests, in turn; ``batch``: the scaling
        phase's batch; ``drawn``: profiles drawn to pick the eligible phase's requests from (the
        harness passes none: the module's values)."""
        super().__init__(env, ceil, options)
        self.calls, self.n_pairs, self.batch, self.drawn = calls, pairs, batch, drawn
        self.client = self.cluster = None
        self.n = self.pool = self.reference = None

    def measure(self, planned):
        from ..serving import cluster as C
        from ..serving.measure import measure

        case = planned.case
        if isinstance(case, ScalingCase):
            return self._scaling(case)
        self._setup(case.n_ads)
        opts = dict(max_batch=1, max_k=K)
        w = self.workers
        f = case.target_eligible
        pairs = self.pairs if f is None else self.targeted[f]
        if case.variant != "inprocess_retrieve":
            self._drop_reference_pool()  # the workers' worlds need the host memory it holds
        if case.variant == "inprocess_retrieve" and f is not None:
            topo, client, model = None, None, None  # timed in _setup, while the pool was up
        elif case.variant == "inprocess_retrieve":
            topo, client, model = self._reference_pool(), None, None
        elif case.variant == "colocated":
            topo, client, model = C.Colocated(self.client, gpu_world, (case.n_ads,), worker=w[0], **opts), self.client, \
                "colocated"
        elif case.variant == "remote_scoring":
            topo = C.RemoteScoring(self.client, gpu_world, (case.n_ads,), cpu_worker=w[1], gpu_worker=w[0],
                                   targeting_build=host_index, **opts)
            client, model = self.client, "remote"
        else:
            topo = C.ShardedPool(self.client, gpu_shard, case.n_workers, (case.n_ads,), workers=w, **opts)
            client, model = self.client, None
        try:
            actor = None
            if topo is None:
                got = self.inprocess_at[f]
            else:
                got = measure(client, topo, pairs, K, self.calls, reference=self.reference, model=model)
            if case.variant == "colocated" and f is None:  # the same calls through the actor, for the notes
                topo.route = "loop"
                actor = measure(client, topo, pairs, K, self.calls, reference=self.reference, model=model)
        finally:
            del topo
            if client is not None:
                self.client.run(_free_device_memory)
        ok = got.ok and (actor is None or actor.ok)
        verified = (f"{'ok' if ok else 'FAILED'}: {got.checked - got.mismatches}/{got.checked} requests equal "
                    "the in-process Pool's (ids, scores, eligible count)")
        t = harness.Timing(got.p50_s, got.p50_s, got.p50_s, got.p50_s, self.calls)
        # math: the Pools' default (math="auto") on the fp16 table: fp16 math on the tensor cores
        r = harness.row("serving", self.env, self.ceil, t, 1, 0, None, verified, **case.columns(), d=D,
                        dtype="fp16", experts=E, k_experts=KE, math="fp16",
                        eligible_fraction=f"{got.mean_eligible / case.n_ads:.4g}",
                        notes=(f"requests picked for {f:.1%} eligible from {self.drawn} drawn profiles; " if f else "")
                              + (f"byte model {got.model_bytes_per_request:,.0f} bytes a request; "
                                 if model else "")
                              + f"mean eligible {got.mean_eligible:,.0f}; {self.calls} calls, one caller"
                              + (f"; on the worker the pool took p50 {got.server_p50_s * 1e3:.3f} ms, a call doing "
                                 f"nothing p50 {got.null_call_p50_s * 1e3:.3f} ms" if got.server_p50_s is not None
                                 else "")
                              + (f"; by the worker's handler (the default); the same calls to the actor on the event loop "
                                 f"p50 {actor.p50_s * 1e3:.3f} ms, p99 {actor.p99_s * 1e3:.3f} ms "
                                 f"({'equal answers' if actor.ok else 'ANSWERS DIFFER'})" if actor else ""))
        r.update(seconds_p20="", seconds_p80="", seconds_p99=f"{got.p99_s:.6e}",
                 requests_per_s=f"{got.requests_per_s:.6e}",
                 transport_bytes_per_request=f"{got.bytes_per_request:.6e}", items_per_s="", achieved_TBps="",
                 fraction_of_read_ceiling="", bytes_per_item="")
        return [r]

    def _scaling(self, case: ScalingCase) -> list[dict]:
        from ..device import launch
        from ..serving import cluster as C
        from ..serving.measure import measure_sharded

        available = len(launch.cuda().gpus)
        if case.n_gpus > available:
            print(f"[serving] {case.scaling} scaling at {case.n_gpus} GPUs: skipped ({available} on this host)")
            return []
        self.close()  # its own cluster: one worker a GPU
        cluster, client = C.gpu_cluster(case.n_gpus)
        try:
            workers = list(client.scheduler_info()["workers"])
            sharded = C.ShardedPool(client, C.generated_shard, case.n_gpus, (case.n_ads // case.n_gpus,),
                                    workers=workers, max_batch=self.batch, max_k=K)
            rng = np.random.default_rng(5)
            from ..datasets import synthetic as syn
            from ..model import Request

            pairs = [(Request.random(D, E, KE, rng), p)
                     for p in syn.generate_profiles(syn.benchmark_schema(), self.n_pairs, seed=202)]
            got = measure_sharded(sharded, pairs, K, self.batch, self.calls)
        finally:
            client.close()
            cluster.close()
        verified = (f"{'ok' if got.ok else 'FAILED'}: {got.checked - got.mismatches}/{got.checked} shard answers "
                    "equal their shard's reference (CPU match, top-k of the kernel's scores); the merge is exact")
        rows = []
        for batch, wall, p99, rps in ((self.batch, got.batch_p50_s, got.batch_p50_s, got.batch_requests_per_s),
                                      (1, got.one_p50_s, got.one_p99_s, 1 / got.one_p50_s)):
            t = harness.Timing(wall, wall, wall, wall, self.calls)
            r = harness.row("serving", self.env, self.ceil, t, batch, 0, None, verified, **case.columns(), d=D,
                            dtype="fp16", experts=E, k_experts=KE, batch=batch, n_workers=case.n_gpus, math="fp16",
                            notes=(f"{case.scaling} scaling, {case.n_ads // case.n_gpus:,} ads a GPU; pool ads "
                                   f"considered a second a GPU {rps * case.n_ads / case.n_gpus:.4g}"
                                   + (f"; the client's merge {got.merge_share:.1%} of a request's wall time"
                                      if batch == 1 else "")))
            r.update(seconds_p20="", seconds_p80="", seconds_p99=f"{p99:.6e}", requests_per_s=f"{rps:.6e}",
                     items_per_s="", achieved_TBps="", fraction_of_read_ceiling="", bytes_per_item="")
            rows.append(r)
        return rows

    def _setup(self, n: int) -> None:
        from distributed import Client, LocalCluster

        from ..datasets import synthetic as syn
        from ..model import Request
        from ..serving.measure import measure

        if self.client is None:
            # no memory limit: a worker's memory is its pool (10^8 ads: tens of GB of rules, index
            # and staging on the host), not Dask data; the nanny's limit (half the host each) would
            # only restart it mid-build
            self.cluster = LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True,
                                        dashboard_address=":0", memory_limit=0)
            self.client = Client(self.cluster, direct_to_workers=True)  # (module docstring of serving.cluster)
            self.workers = list(self.client.scheduler_info()["workers"])
        if n != self.n:
            self.pool = self.reference = None
            drop_saved_rules()  # the last size's (workers that still map them keep them until they let go)
            self.n = n
            rng = np.random.default_rng(5)
            profiles = syn.generate_profiles(syn.benchmark_schema(), self.n_pairs, seed=202)
            self.pairs = [(Request.random(D, E, KE, rng), p) for p in profiles]
            pool = self._reference_pool()
            # the eligible phase's requests: drawn profiles picked by their eligible count, and
            # their in-process timing now, while this process holds the pool
            drawn = [(Request.random(D, E, KE, rng), p)
                     for p in syn.generate_profiles(syn.benchmark_schema(), self.drawn, seed=303)]
            counts = [pool.retrieve(r, p, k=1).n_eligible for r, p in drawn]
            self.targeted = {f: [drawn[i] for i in pick_by_eligible(counts, n, f, self.n_pairs)] for f in ELIGIBLE}
            self.reference = RecordedAnswers(pool, self.pairs + [x for f in ELIGIBLE for x in self.targeted[f]], K)
            self.inprocess_at = {f: measure(None, pool, self.targeted[f], K, self.calls, reference=self.reference)
                                 for f in ELIGIBLE}

    def _reference_pool(self):
        """The in-process Pool of this size's world (built again if :meth:`_drop_reference_pool` let it go)."""
        from ..pipeline import Pool

        if self.pool is None:
            table, index = gpu_world(self.n)
            self.pool = Pool(table, index, max_batch=1, max_k=K)
        return self.pool

    def _drop_reference_pool(self) -> None:
        if self.pool is not None:
            self.pool = None
            _LAST.pop("world", None)
            _free_device_memory()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.cluster.close()
            self.client = None
        self.pool = self.reference = None
        drop_saved_rules()


class RecordedAnswers:
    """An in-process Pool's answers to the run's requests, kept so that the Pool itself can go
    before the Dask topologies start (its host memory is theirs): ``retrieve`` gives the recorded
    answer of a request it was built with (the same request object and profile)."""

    def __init__(self, pool, pairs, k: int):
        self.k = k
        self._answers = [(req, prof, pool.retrieve(req, prof, k=k)) for req, prof in pairs]

    def retrieve(self, request, profile, k: int):
        for req, prof, out in self._answers:
            if req is request and prof is profile and k == self.k:
                return out
        raise KeyError("RecordedAnswers holds no answer to this request (only the pairs it was built with)")


def _free_device_memory() -> None:
    """Collect what a dropped server or pool held (its device arrays with it), and hand CuPy's
    cached blocks back to the device for the next world."""
    import gc

    gc.collect()
    try:
        from ..device import launch

        if not launch.backend.is_simulator():
            import cupy as cp

            cp.get_default_memory_pool().free_all_blocks()
    except ImportError:
        pass
