"""Serving through Dask on a local cluster of simulator workers (processes, TCP comms): both
topologies and the sharded pool answer as the in-process Pool does, the bytes on the wire are
counted, updates reach the owning shard, bad batches change no shard, and a dead worker fails
the request instead of answering from the other shards. Marked slow: worker processes and their
servers take tens of seconds to start."""

import numpy as np
import pytest

import andromeda_nb as anb
from andromeda_nb.datasets import synthetic
from andromeda_nb.pipeline import PoolUpdate
from andromeda_nb.serving import cluster as C
from andromeda_nb.serving import transport
from andromeda_nb.targeting import RuleError

distributed = pytest.importorskip("distributed")
pytestmark = pytest.mark.slow

N, K, SEED = 1500, 16, 0
OPTS = dict(max_batch=2, max_k=K)


@pytest.fixture(scope="module")
def served():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = distributed.Client(cluster, direct_to_workers=True)
    w = list(client.scheduler_info()["workers"])
    topologies = {"colocated": C.Colocated(client, C.demo_world, (N, SEED), worker=w[0], **OPTS),
                  "remote": C.RemoteScoring(client, C.demo_world, (N, SEED), cpu_worker=w[1], gpu_worker=w[0], **OPTS)}
    sharded = C.ShardedPool(client, C.demo_shard, 3, (N, SEED), workers=w, **OPTS)
    yield client, w, topologies, sharded
    client.close()
    cluster.close()


def requests(schema, n, seed):
    rng = np.random.default_rng(seed)
    profiles = synthetic.generate_profiles(schema, n, seed=seed, max_values=synthetic.MAX_USER_VALUES)
    profiles[-1] = {}  # broad: only unconstrained categories pass
    return [(anb.Request.random(64, 6, 2, rng), p) for p in profiles]


def same(got, want):
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.scores, want.scores)
    assert got.n_eligible == want.n_eligible


def test_topologies_and_shards_answer_as_the_in_process_pool(served):
    client, w, topologies, sharded = served
    table, index = C.demo_world(N, SEED)
    pool = anb.Pool(table, index, **OPTS)
    # the pool's options reach every server: fp32 math where the default would take fp16
    fp32 = dict(OPTS, config=anb.KernelConfig(math="fp32"))
    pool32 = anb.Pool(table, index, **fp32)
    remote32 = C.RemoteScoring(client, C.demo_world, (N, SEED), cpu_worker=w[1], gpu_worker=w[0], **fp32)
    colocated = topologies["colocated"]
    for req, prof in requests(index.schema, 4, 11):
        want = pool.retrieve(req, prof, k=K)
        for topo in (*topologies.values(), sharded):
            same(topo.retrieve(req, prof, K), want)
        for route in C.Colocated.ROUTES:  # the worker's handler, the actor on the loop, on its thread
            colocated.route = route
            same(colocated.retrieve(req, prof, K), want)
        colocated.route = "direct"
        same(remote32.retrieve(req, prof, K), pool32.retrieve(req, prof, k=K))
    # a bad request raises the pool's own error through the worker's handler, and the pool serves on
    narrow = anb.Request.random(32, 6, 2, np.random.default_rng(1))
    with pytest.raises(ValueError, match="d=32"):
        colocated.retrieve(narrow, prof, K)
    same(colocated.retrieve(req, prof, K), want)
    with pytest.raises(ValueError, match="route"):
        C.Colocated(client, C.demo_world, (N, SEED), route="scheduler")


def test_a_server_goes_where_the_scheduler_puts_it_when_no_worker_is_named(served):
    client, _, _, _ = served
    table, index = C.demo_world(300, SEED)
    req, prof = requests(index.schema, 1, 3)[0]
    same(C.Colocated(client, C.demo_world, (300, SEED), **OPTS).retrieve(req, prof, K),
         anb.Pool(table, index, **OPTS).retrieve(req, prof, k=K))


def test_bytes_are_counted_on_every_comm_and_follow_the_byte_model(served):
    """Remote scoring moves the eligible slots on top of what co-location moves: counted on the
    wire, and at least the byte model's slot bytes apart."""
    client, _, topologies, _ = served
    table, index = C.demo_world(N, SEED)
    req, prof = requests(index.schema, 1, 5)[0]
    traffic = {}
    for name, topo in topologies.items():
        topo.retrieve(req, prof, K)  # warm
        with transport.counting(client) as t:
            out = topo.retrieve(req, prof, K)
        traffic[name] = t
    assert traffic["colocated"].client > 0 and traffic["remote"].workers > 0
    model = {name: C.byte_model(name, req, out.n_eligible, K) for name in topologies}
    assert model["remote"] - model["colocated"] >= 4 * out.n_eligible
    # the co-located request's tensors leave the client once, the answer comes back once
    assert traffic["colocated"].total >= model["colocated"]
    assert traffic["remote"].total >= model["remote"]


def test_sharded_updates_reach_their_shard_and_bad_batches_change_none(served):
    client, _, _, sharded = served
    table, index = C.demo_world(N, SEED)
    schema = index.schema
    rng = np.random.default_rng(3)
    ids = table.ad_ids
    retire = [int(a) for a in ids[:5]]
    new = [int(ids.max()) + 1 + i for i in range(7)]  # every shard gets some
    rows = (rng.standard_normal((12, 64)) * 0.5).astype(np.float32)
    update = PoolUpdate.from_columns(schema, ["retire"] * 5 + ["create"] * 7, retire + new, rows,
                                     bias=rng.standard_normal(12))
    live = sharded.apply(update)
    assert live == N - 5 + 7
    # the whole pool rebuilt with the same live ads answers the same
    keep = ~np.isin(ids, retire)
    rules = index.current_rules().subset(np.flatnonzero(keep))
    from andromeda_nb.targeting import TargetingIndex, TargetingRules

    created = TargetingRules.from_records(schema, [{"ad_id": a} for a in new])
    whole = anb.AdTable.from_float(np.concatenate([table.dequantized()[keep], rows[5:]]),
                                   np.concatenate([table.bias[keep], update.bias[5:]]), dtype="fp16",
                                   ad_ids=np.concatenate([ids[keep], new]))
    both = TargetingRules.from_records(schema, rules.to_records() + created.to_records())
    pool = anb.Pool(whole, TargetingIndex(both), **OPTS)
    for req, prof in requests(schema, 3, 21):
        same(sharded.retrieve(req, prof, K), pool.retrieve(req, prof, k=K))
    # a batch with an unknown ad in one shard's part: refused, and no shard applied its part
    bad = PoolUpdate.from_columns(schema, ["create", "retire"], [int(ids.max()) + 100, 10 ** 12], rows[:2],
                                  sets_row=np.array([True, False]))
    with pytest.raises(RuleError):
        sharded.apply(bad)
    assert sum(s.live_ads().result() for s in sharded.shards) == N - 5 + 7
    # a valid retire on one shard beside a row the tables' fp16 cannot hold on another: none applies
    keep_id = next(int(a) for a in ids[keep] if C.shard_of([a], 3)[0] == 0)
    over = next(x for x in range(int(ids.max()) + 200, int(ids.max()) + 300) if x % 3 == 1)
    huge = np.zeros((2, 64), np.float32)
    huge[1, 0] = 7e4
    with pytest.raises(ValueError, match="fp16"):
        sharded.apply(PoolUpdate.from_columns(schema, ["retire", "create"], [keep_id, over], huge))
    assert sum(s.live_ads().result() for s in sharded.shards) == N - 5 + 7


def test_shards_generated_apart_serve_batches_and_check_themselves(served):
    """The scale-out path: shards generated shard by shard (ids j * N + shard), a batch served as
    the same requests one by one, every shard's answers equal to its own reference."""
    from andromeda_nb.serving.measure import measure_sharded

    client, w, _, _ = served
    sharded = C.ShardedPool(client, C.generated_shard, 2, (200,), workers=w, max_batch=3, max_k=K)
    pairs = requests(C.demo_world(50, SEED)[1].schema, 3, 13)
    reqs, profs = [r for r, _ in pairs], [p for _, p in pairs]
    batch = sharded.retrieve_batch(reqs, profs, K)
    assert len(batch) == len(pairs) == 3  # an answer a request, in order
    for (req, prof), got in zip(pairs, batch):
        same(sharded.retrieve(req, prof, K), got)
    got = measure_sharded(sharded, pairs, K, batch=3, calls=2, checked=2)
    assert got.ok and got.checked == 4 and 0 <= got.merge_share <= 1 and got.batch_requests_per_s > 0


def test_a_dead_shard_fails_the_request(served):
    """Last in the module: it kills a worker. The request errors; nothing partial comes back."""
    client, w, _, _ = served
    sharded = C.ShardedPool(client, C.demo_shard, 2, (N, SEED), workers=w, **OPTS)
    req, prof = requests(C.demo_world(N, SEED)[1].schema, 1, 8)[0]
    sharded.retrieve(req, prof, K)
    try:
        client.run(lambda: __import__("os")._exit(1), workers=[w[1]])  # the worker dies mid-call
    except (OSError, distributed.comm.core.CommClosedError):
        pass
    with pytest.raises(RuntimeError, match="shard 1 of 2 failed.*no answer"):
        sharded.retrieve(req, prof, K)
