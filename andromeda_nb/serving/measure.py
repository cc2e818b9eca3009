"""One measurement of a serving topology as a caller sees it: the wall time of ``retrieve`` (warm,
median and p99), requests a second, the bytes every comm carried per request (counted, beside the
byte model's prediction), and whether the answers equal an in-process Pool's. The serving bench
(:mod:`andromeda_nb.bench.serving`) and the serving notebook both call it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import transport
from .cluster import byte_model


@dataclass
class Checked:
    """Answers compared with a reference: ``checked`` of them, ``mismatches`` that differed."""

    checked: int
    mismatches: int

    @property
    def ok(self) -> bool:
        return self.mismatches == 0 and self.checked > 0


@dataclass
class Served(Checked):
    """What :func:`measure` found for one topology."""

    p50_s: float
    p99_s: float
    requests_per_s: float
    bytes_per_request: float
    model_bytes_per_request: float
    mean_eligible: float
    #: where the topology has a :class:`~.cluster.PoolServer` that serves the whole request
    #: (co-located): the median of its own retrieve time on the worker, and of a call that does
    #: nothing (the round trip through Dask alone, on the event loop or the actor's thread as the
    #: topology's calls run); None elsewhere
    server_p50_s: float | None = None
    null_call_p50_s: float | None = None


def measure(client, topology, pairs, k: int, calls: int, reference=None, model: str | None = None) -> Served:
    """Time ``calls`` calls of ``topology.retrieve`` over ``pairs`` ((request, profile), in turn)
    after a warm call, counting the bytes of all of them (``client``: its cluster; None for an
    in-process pool, which moves none); answers of every pair's first call are compared with
    ``reference.retrieve`` (ids, scores and eligible count exactly). ``model``: the topology's name
    in :func:`.cluster.byte_model` (None: no prediction)."""
    topology.retrieve(*pairs[0], k)  # warm: the first call sets up what the later ones reuse
    walls, eligible, answers = [], [], {}

    def run():
        for c in range(calls):
            req, prof = pairs[c % len(pairs)]
            t0 = time.perf_counter()
            out = topology.retrieve(req, prof, k)
            walls.append(time.perf_counter() - t0)
            eligible.append(out.n_eligible)
            answers.setdefault(c % len(pairs), out)

    if client is None:
        run()
        traffic = transport.Traffic()
    else:
        with transport.counting(client) as traffic:
            run()
    mismatches = 0
    if reference is not None:
        for i, out in answers.items():
            req, prof = pairs[i]
            want = reference.retrieve(req, prof, k=k)
            mismatches += not (np.array_equal(out.ids, want.ids) and np.array_equal(out.scores, want.scores)
                               and out.n_eligible == want.n_eligible)
    server = null = None
    if hasattr(topology, "server"):  # the calls' time on the worker, and a null call's round trip
        server = float(np.median(topology.server.served_seconds().result()[-calls:]))
        nulls = []
        for _ in range(calls):
            t0 = time.perf_counter()
            topology.ping()
            nulls.append(time.perf_counter() - t0)
        null = float(np.median(nulls))
    predicted = (np.mean([byte_model(model, pairs[c % len(pairs)][0], eligible[c], k) for c in range(calls)])
                 if model else 0.0)
    return Served(p50_s=float(np.median(walls)), p99_s=float(np.quantile(walls, 0.99)),
                  requests_per_s=calls / float(np.sum(walls)), bytes_per_request=traffic.total / calls,
                  model_bytes_per_request=float(predicted), mean_eligible=float(np.mean(eligible)),
                  checked=len(answers) if reference is not None else 0, mismatches=mismatches,
                  server_p50_s=server, null_call_p50_s=null)


@dataclass
class Scaled(Checked):
    """What :func:`measure_sharded` found for one sharded pool."""

    batch_requests_per_s: float
    batch_p50_s: float
    one_p50_s: float
    one_p99_s: float
    merge_share: float


def measure_sharded(sharded, pairs, k: int, batch: int, calls: int, checked: int = 4) -> Scaled:
    """A :class:`~.cluster.ShardedPool` as a caller sees it: batches of ``batch`` requests
    (requests a second, median wall of a batch) and single requests (median and p99, and the
    share of a single request's wall time its client-side merge takes), ``calls`` of each after a
    warm call; then each shard checks its answers to ``checked`` of the requests against its own
    reference (:meth:`~.cluster.PoolServer.check_answers`: the merge of exact shard answers is
    exact, tested apart)."""
    reqs = [pairs[i % len(pairs)][0] for i in range(batch)]
    profs = [pairs[i % len(pairs)][1] for i in range(batch)]
    sharded.retrieve_batch(reqs, profs, k)
    walls = []
    for _ in range(calls):
        t0 = time.perf_counter()
        sharded.retrieve_batch(reqs, profs, k)
        walls.append(time.perf_counter() - t0)
    ones, merges = [], []
    for c in range(calls):
        req, prof = pairs[c % len(pairs)]
        t0 = time.perf_counter()
        sharded.retrieve(req, prof, k)
        ones.append(time.perf_counter() - t0)
        merges.append(sharded.merge_seconds)
    results = sharded.shard_checks(reqs[:checked], profs[:checked], k)
    return Scaled(batch_requests_per_s=batch / float(np.median(walls)), batch_p50_s=float(np.median(walls)),
                  one_p50_s=float(np.median(ones)), one_p99_s=float(np.quantile(ones, 0.99)),
                  merge_share=float(np.sum(merges) / np.sum(ones)), checked=sum(c for c, _ in results),
                  mismatches=sum(b for _, b in results))
