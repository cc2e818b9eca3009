"""Serving a pool through Dask: two topologies and a sharded pool, on real workers.

The source's second change: a request carries only the user's features and targeting query to one
GPU server, which runs targeting, scoring and top-K and returns only the top-K; shipping candidate
lists from CPU targeting hosts to remote GPU scorers had saturated the network. Both run here, on
``dask.distributed`` actors (a worker holds its server between requests; an actor call goes
straight to that worker):

    Colocated       the request (its tensors and profile) goes to the worker holding the
                    :class:`~andromeda_nb.pipeline.Pool`; only the top-k comes back.
    RemoteScoring   targeting on a CPU worker (the host index's match), the eligible slots
                    (int32) shipped to the GPU worker, which scores them and selects the top-k.
    ShardedPool     the ads split among N workers by ``ad_id % N``, a Pool each; a request fans
                    out, each shard returns its exact top-k, :func:`.merge.merge_topk` merges them
                    exactly; updates go to the shard that owns the ad.

Servers are built on their worker by a ``build`` function (a module-level function and its
arguments, shipped by pickle), so a large pool is made where it lives rather than sent.
:mod:`.transport` counts the bytes every comm carries.

A request's call carries its arguments and answer in one pickle each (:func:`_request`): Dask
would serialise each of its small arrays on its own, ~1.3 ms a call more.

A request goes to a server by a handler of the worker's own (:class:`_Direct`), run on the worker's
event loop: the actor's call machinery (its future, its task bookkeeping) cost ~0.45 ms more a
call on a local cluster (0.98 against 0.53 ms for a round trip doing nothing). The actor still
holds the server and answers the calls that are not on the request path.

Make the client with ``Client(cluster, direct_to_workers=True)``: an actor call then goes straight
to its worker. A default client sends it through the scheduler (``proxy``): two hops, the
request's bytes written twice (34 against 17 KB a call of a top-1000 answer, measured on a local
cluster), and a longer wait.
"""

from __future__ import annotations

import asyncio
import collections
import pickle

import numpy as np

from ..pipeline.pool import Retrieved
from .merge import merge_topk


#: retrieve times a :class:`PoolServer` keeps for :meth:`PoolServer.served_seconds`
SERVED_KEPT = 4096
#: the worker handler of direct calls (:class:`_Direct`)
HANDLER = "andromeda_nb_call"


def _request(actor, method: str, *args, on_loop: bool = False):
    """Call ``method(*args)`` of a server actor with its arguments in one pickle (its future's
    result is the answer, packed the same way: :func:`_answer`). Dask sends bytes as one frame,
    where it serialises each of a request's dozen small arrays (tensors, profile) on its own:
    ~1.3 ms a call more, measured on a local cluster.

    ``on_loop``: run the call on the worker's event loop rather than handing it to the actor's
    thread and back (Dask's ``separate_thread=False``): for a call that returns in about a
    millisecond and waits on nothing of Dask's. A call that waits on another actor (the targeting
    server's) must not: it would block the loop that brings its answer."""
    payload = pickle.dumps((method, *args), protocol=5)
    return actor.call(payload, separate_thread=False) if on_loop else actor.call(payload)


def _answer(payload: bytes):
    return pickle.loads(payload)


def _install_direct(dask_worker) -> None:
    """Register :data:`HANDLER` on this worker (run there by ``client.run``): a packed call to
    one of its server actors, by key, run on the worker's event loop."""

    async def handler(comm=None, key=None, payload=None):
        server = dask_worker.state.actors.get(key)
        if server is None:
            raise KeyError(f"no server {key!r} on worker {dask_worker.address}")
        return server.call(payload)

    dask_worker.handlers[HANDLER] = handler


class _Direct:
    """Packed calls (:func:`_request`'s) to server actors through their workers' :data:`HANDLER`,
    on the workers' event loops: for calls that return in about a millisecond and wait on
    nothing of Dask's."""

    def __init__(self, client, actors):
        self.client = client
        self.targets = [(a._address, a.key) for a in actors]
        client.run(_install_direct, workers=sorted({address for address, _ in self.targets}))

    def call(self, payloads) -> list:
        """One packed call a server, all at once: each one's answer (bytes) or its exception."""

        async def one(address, key, payload):
            return await getattr(self.client.rpc(address), HANDLER)(key=key, payload=payload)

        async def every():
            return await asyncio.gather(*(one(a, key, p) for (a, key), p in zip(self.targets, payloads)),
                                        return_exceptions=True)

        return self.client.sync(every)


class _PackedCalls:
    """The server side of :func:`_request`: ``call(payload)`` runs one of ``PACKED``."""

    PACKED: tuple = ()

    def call(self, payload: bytes) -> bytes:
        if not isinstance(payload, bytes):
            raise TypeError(f"a packed call is bytes (serving.cluster._request), got {type(payload).__name__}")
        call = pickle.loads(payload)
        if not isinstance(call, tuple) or not call or not isinstance(call[0], str):
            raise ValueError("a packed call is the pickle of a tuple (method name, *arguments)")
        method, *args = call
        if method not in self.PACKED:
            raise ValueError(f"{type(self).__name__} serves {self.PACKED} through call(), not {method!r}")
        return pickle.dumps(getattr(self, method)(*args), protocol=5)


class PoolServer(_PackedCalls):
    """A worker's pool (Dask actor): ``build(*args)`` returns its ``(table, index)``, a host or
    device ad table and a :class:`~andromeda_nb.targeting.TargetingIndex`."""

    PACKED = ("retrieve", "retrieve_batch", "score_candidates", "ping")

    def __init__(self, build, args=(), pool_options=None):
        from ..pipeline import Pool

        table, index = build(*args)
        self.pool = Pool(table, index, **(pool_options or {}))
        # the latest retrieve times (a bounded log: a long-lived server is never asked for them)
        self._served = collections.deque(maxlen=SERVED_KEPT)

    def retrieve(self, request, profile, k: int) -> Retrieved:
        import time

        t0 = time.perf_counter()
        out = self.pool.retrieve(request, profile, k=k)
        self._served.append(time.perf_counter() - t0)
        return out

    def served_seconds(self) -> list:
        """The wall time of each :meth:`retrieve` on this worker since the last call, the latest
        ``SERVED_KEPT`` at most (and forget them): what the pool took, without the trip to and from the caller."""
        out = list(self._served)
        self._served.clear()
        return out

    def ping(self) -> None:
        """Nothing: a call's round trip through Dask alone."""

    def retrieve_batch(self, requests, profiles, k: int) -> list:
        """A batch (lists, or tuples: a pickled call may carry either) through the pool, whose
        own checks name what is wrong with anything else."""
        requests = list(requests) if isinstance(requests, tuple) else requests
        profiles = list(profiles) if isinstance(profiles, tuple) else profiles
        return self.pool.retrieve(requests, profiles, k=k)

    def score_candidates(self, request, slots: np.ndarray, k: int) -> Retrieved:
        """The top-k of ``slots`` (remote scoring: the targeting worker's eligible slots), with the
        pool's limit on k, as a co-located request has.

        Raises:
            TypeError / ValueError: ``slots`` not a 1-D integer array of the pool's slots (checked
                before the int32 the kernel reads), ``k`` past the pool's ``max_k``."""
        from ..score import score_topk

        slots = np.asarray(slots)
        if slots.dtype.kind not in "iu" or slots.ndim != 1:
            raise TypeError(f"slots must be a 1-D integer array, got {slots.dtype} of shape {slots.shape}")
        if slots.size and (int(slots.min()) < 0 or int(slots.max()) >= self.pool.n_ads):
            raise ValueError(f"slots must lie in 0..{self.pool.n_ads - 1}")
        if isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k > self.pool.max_k:
            raise ValueError(f"k={k} exceeds this pool's max_k={self.pool.max_k}")
        top = score_topk(request, self.pool.table, k, candidates=slots.astype(np.int32), config=self.pool.config)
        return Retrieved(ids=top.ids, scores=top.scores, n_eligible=int(len(slots)), n_scored=int(top.count))

    def check(self, update) -> None:
        """Raise what :meth:`apply` would for a :class:`~andromeda_nb.pipeline.PoolUpdate`
        (:meth:`Pool.check <andromeda_nb.pipeline.Pool.check>`), changing nothing."""
        self.pool.check(update)

    def apply(self, update) -> int:
        """Apply a :class:`~andromeda_nb.pipeline.PoolUpdate`; the live ads after it."""
        self.pool.apply(update)
        return self.pool.n_ads - self.pool.n_free

    def live_ads(self) -> int:
        return self.pool.n_ads - self.pool.n_free

    def check_answers(self, requests, profiles, k: int) -> tuple[int, int]:
        """``(checked, mismatches)``: this pool's answers to the requests against the reference over
        its own ads (the host index's match, the top-k of the kernel's own scores: ids, scores,
        eligible count), where no reference pool can hold the whole sharded pool."""
        from .. import reference
        from ..score import score_ads
        from ..targeting import mask_from_bits

        table, index = self.pool.table, self.pool.index.index
        if not index.host_bits:  # updates moved the rows to the device: the CPU match runs on a rebuild
            index = index.rebuild()
        outs = self.pool.retrieve(list(requests), list(profiles), k=k)
        bad = 0
        for req, prof, out in zip(requests, profiles, outs):
            words, count = index.match_cpu(prof)
            elig = mask_from_bits(words, index.n_ads) & (table.host_ad_ids >= 0)
            scores = score_ads(req, table, config=self.pool.config).copy_to_host()
            want = reference.topk(scores, k, ids=table.host_ad_ids, eligible=elig)
            bad += not (np.array_equal(out.ids, want.ids) and np.array_equal(out.scores, want.scores)
                        and out.n_eligible == int(elig.sum()))
        return len(outs), bad


class TargetingServer(_PackedCalls):
    """A CPU worker's targeting index (Dask actor), built by the same ``build`` as its scorer's
    pool (so slot for slot the same index): each request's match on the host, its eligible slots
    sent to ``scorer`` (a :class:`PoolServer` actor) to score and select."""

    PACKED = ("retrieve",)

    def __init__(self, build, args, scorer):
        from ..targeting import TargetingIndex

        _, index = build(*args)
        self.index = index if isinstance(index, TargetingIndex) else index.index
        self.scorer = scorer

    def retrieve(self, request, profile, k: int) -> Retrieved:
        from ..targeting import mask_from_bits

        words, _ = self.index.match_cpu(profile)
        slots = np.flatnonzero(mask_from_bits(words, self.index.n_ads)).astype(np.int32)
        return _answer(_request(self.scorer, "score_candidates", request, slots, k, on_loop=True).result())


def _actor(client, cls, args, worker):
    """An actor of ``cls(*args)`` on ``worker`` (None: where the scheduler puts it)."""
    where = {} if worker is None else {"workers": [worker]}
    return client.submit(cls, *args, actor=True, **where).result()


class Colocated:
    """The co-located topology: one worker holds the pool and runs the whole request.

    ``route``: how a request reaches the pool: ``"direct"`` (default; the worker's handler, on its
    event loop: :class:`_Direct`), ``"loop"`` (the actor's method on the worker's event loop) or
    ``"thread"`` (the actor's method on the actor's thread; :func:`_request`)."""

    ROUTES = ("direct", "loop", "thread")

    def __init__(self, client, build, args=(), worker: str | None = None, route: str = "direct", **pool_options):
        if route not in self.ROUTES:
            raise ValueError(f"route must be one of {self.ROUTES}, got {route!r}")
        self.server = _actor(client, PoolServer, (build, args, pool_options), worker)
        self.direct = _Direct(client, [self.server])
        self.route = route

    def retrieve(self, request, profile, k: int) -> Retrieved:
        return _answer(self._send("retrieve", request, profile, k))

    def ping(self) -> None:
        """A call doing nothing, by the same route: the round trip alone."""
        self._send("ping")

    def _send(self, method: str, *args) -> bytes:
        if self.route == "direct":
            (out,) = self.direct.call([pickle.dumps((method, *args), protocol=5)])
            if isinstance(out, BaseException):
                raise out
            return out
        return _request(self.server, method, *args, on_loop=self.route == "loop").result()


class RemoteScoring:
    """The remote-scoring topology: targeting on ``cpu_worker``, scoring and top-k on
    ``gpu_worker``, the eligible slots between them."""

    def __init__(self, client, build, args=(), cpu_worker: str | None = None, gpu_worker: str | None = None,
                 targeting_build=None, **pool_options):
        """``targeting_build(*args)``: the targeting worker's ``(table, index)`` (default ``build``;
        its table is not used: a build that makes none spares the CPU worker the rows)."""
        self.scorer = _actor(client, PoolServer, (build, args, pool_options), gpu_worker)
        self.targeting = _actor(client, TargetingServer, (targeting_build or build, args, self.scorer), cpu_worker)

    def retrieve(self, request, profile, k: int) -> Retrieved:
        return _answer(_request(self.targeting, "retrieve", request, profile, k).result())


def byte_model(topology: str, request, n_eligible: int, k: int) -> int:
    """The payload bytes one request moves (no framing, no Dask messages of its own): the request's
    tensors (V and G ``[E, d]``, gamma and beta ``[d]``, fp32) and the answer (``k`` int64 ids and
    float32 scores), once each co-located; remote scoring sends both twice (through the targeting
    worker) and the ``n_eligible`` int32 slots between the workers."""
    E, d = request.V.shape
    req, ans = (2 * E + 2) * d * 4, 12 * k
    if topology == "colocated":
        return req + ans
    if topology == "remote":
        return 2 * req + 4 * int(n_eligible) + 2 * ans
    raise ValueError(f"topology must be 'colocated' or 'remote', got {topology!r}")


def shard_of(ad_ids, n_shards: int) -> np.ndarray:
    """The shard that owns each ad: ``ad_id % n_shards``."""
    return np.asarray(ad_ids, np.int64) % n_shards


class ShardedPool:
    """A pool split among ``n_shards`` workers by :func:`shard_of`: ``build(shard, n_shards,
    *args)`` returns the shard's ``(table, index)`` (its own ads only). Retrieval is exact: each
    shard's top-k over its ads, merged (:func:`.merge.merge_topk`); a shard that fails fails the
    request, never a partial answer."""

    def __init__(self, client, build, n_shards: int, args=(), workers=None, **pool_options):
        if isinstance(n_shards, bool) or not isinstance(n_shards, int) or n_shards < 1:
            raise ValueError(f"n_shards must be a positive int, got {n_shards!r}")
        workers = list(workers) if workers else [None]
        self.n_shards = n_shards
        self.shards = [_actor(client, PoolServer, (build, (s, n_shards, *args), pool_options),
                              workers[s % len(workers)]) for s in range(n_shards)]
        self.direct = _Direct(client, self.shards)

    def retrieve(self, request, profile, k: int) -> Retrieved:
        return self.retrieve_batch([request], [profile], k)[0]

    def retrieve_batch(self, requests, profiles, k: int) -> list:
        """A batch of requests: one call a shard (each shard's Pool serves the batch at once), the
        answers merged request by request. ``merge_seconds`` holds the client's merge time of the
        last call."""
        import time

        payload = pickle.dumps(("retrieve_batch", requests, profiles, k), protocol=5)
        answers = self._guarded(None, lambda: self.direct.call([payload] * self.n_shards))
        for i, a in enumerate(answers):
            if isinstance(a, BaseException):
                self._guarded(i, lambda: _raise(a))
        parts = [self._guarded(i, lambda: _answer(a)) for i, a in enumerate(answers)]
        t0 = time.perf_counter()
        out = [merge_topk([p[b] for p in parts], k) for b in range(len(requests))]
        self.merge_seconds = time.perf_counter() - t0
        return out

    def shard_checks(self, requests, profiles, k: int) -> list:
        """Each shard's own check of its answers to the requests (:meth:`PoolServer.check_answers`):
        a list a shard of ``(checked, mismatches)``."""
        return [self._guarded(i, s.check_answers(requests, profiles, k).result) for i, s in enumerate(self.shards)]

    def _guarded(self, i: int | None, call):
        try:
            return call()
        except Exception as e:  # a dead worker (the call or its result), a failed request: no partial answer
            who = "a shard" if i is None else f"shard {i}"
            raise RuntimeError(f"{who} of {self.n_shards} failed ({type(e).__name__}: {e}); no answer: the "
                               "other shards' would not be the whole pool's") from e

    def apply(self, update) -> int:
        """Route a :class:`~andromeda_nb.pipeline.PoolUpdate` op by op to the shards owning its
        ads (their order kept within each shard); the live ads after it. Every shard checks its
        part before any shard applies one, so a bad batch (an unknown or duplicate ad, a malformed
        rule, rows of another width) is refused whole and no shard changes."""
        from ..pipeline.updates import take_ops

        owner = shard_of(update.targeting.ad_ids, self.n_shards)
        parts = {s: take_ops(update, owner == s) for s in range(self.n_shards) if (owner == s).any()}
        for f in [self.shards[s].check(part) for s, part in parts.items()]:
            f.result()
        for f in [self.shards[s].apply(part) for s, part in parts.items()]:
            f.result()
        return sum(f.result() for f in [s.live_ads() for s in self.shards])


def _raise(e: BaseException):
    raise e


def gpu_cluster(n_gpus: int):
    """A local cluster of one worker a GPU (``dask_cuda.LocalCUDACluster``: each worker sees its own
    GPU; TCP comms, so no NVLink multicast), or for one GPU without dask-cuda a one-worker
    ``LocalCluster``. Returns ``(cluster, client)``."""
    from distributed import Client, LocalCluster

    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        if n_gpus != 1:
            raise RuntimeError(f"{n_gpus} GPU workers need dask-cuda (pip install dask-cuda)") from None
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                               memory_limit=0)  # (a worker's memory is its pool, not Dask data)
    else:
        cluster = LocalCUDACluster(n_workers=n_gpus, threads_per_worker=1, protocol="tcp", dashboard_address=":0",
                                   memory_limit=0)
    return cluster, Client(cluster, direct_to_workers=True)


def generated_shard(shard: int, n_shards: int, n_per_shard: int, seed: int = 0, d: int = 64, dtype: str = "fp16"):
    """Shard ``shard`` of a pool generated shard by shard (no host holds the whole pool's rules):
    ``n_per_shard`` benchmark-world rules of its own (seed ``seed + shard``) with ad ids
    ``j * n_shards + shard`` (so :func:`shard_of` owns them here), rows generated on the GPU
    (numpy on the simulator). ``(table, TargetingIndex)``."""
    from ..datasets import synthetic
    from ..device import launch
    from ..model import AdTable
    from ..targeting import TargetingIndex

    ids = np.arange(n_per_shard, dtype=np.int64) * n_shards + shard
    rules = synthetic.generate_rules(synthetic.benchmark_schema(), n_per_shard, seed=seed + shard, ad_ids=ids)
    if launch.backend.is_simulator():
        rng = np.random.default_rng(seed + shard)
        table = AdTable.from_float(rng.standard_normal((n_per_shard, d)), rng.standard_normal(n_per_shard),
                                   dtype=dtype, ad_ids=ids)
    else:
        from ..bench.tables import gpu_table

        table = gpu_table(n_per_shard, d, dtype, "rows", seed=1 + shard, ad_ids=ids)
    return table, TargetingIndex(rules)


def demo_world(n_ads: int, seed: int = 0, d: int = 64):
    """A small benchmark world to serve (tests, the serving notebook on any backend): the benchmark
    schema's rules and fp16 rows, ``(AdTable, TargetingIndex)``; ad ids are the rules' own."""
    from ..datasets import synthetic
    from ..model import AdTable
    from ..targeting import TargetingIndex

    rules = synthetic.generate_rules(synthetic.benchmark_schema(), n_ads, seed=seed)
    rng = np.random.default_rng(seed)
    table = AdTable.from_float(rng.standard_normal((n_ads, d)) * 0.5, rng.standard_normal(n_ads), dtype="fp16",
                               ad_ids=rules.ad_ids)
    return table, TargetingIndex(rules)


def demo_shard(shard: int, n_shards: int, n_ads: int, seed: int = 0, d: int = 64):
    """Shard ``shard`` of :func:`demo_world`: its ads with ``ad_id % n_shards == shard`` (their rules
    and rows), ``(AdTable, TargetingIndex)``."""
    from ..model import AdTable
    from ..targeting import TargetingIndex

    table, index = demo_world(n_ads, seed, d)
    mine = np.flatnonzero(shard_of(table.ad_ids, n_shards) == shard)
    rules = index.current_rules().subset(mine)
    part = AdTable(embeddings=table.embeddings[mine], bias=table.bias[mine], scale=None,
                   ad_ids=table.ad_ids[mine], dtype=table.dtype)
    return part, TargetingIndex(rules)
