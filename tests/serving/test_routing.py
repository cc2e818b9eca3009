"""What the sharded pool does on the client, without a cluster: ops split by owner shard (each
part the same ops, rules and rows in order) and the byte model's arithmetic."""

import numpy as np
import pytest

import andromeda_nb as anb
from andromeda_nb.pipeline import PoolUpdate
from andromeda_nb.pipeline.updates import take_ops
from andromeda_nb.serving.cluster import byte_model, shard_of

from ..helpers import random_rule, random_rules


def test_take_ops_keeps_each_ops_rule_row_and_order(rng):
    rules = random_rules(rng, 30, p_constrain=0.5, p_exclude=0.2)
    schema = rules.schema
    recs = []
    for j in range(25):
        op = ["create", "change", "retire"][j % 3]
        rec = {"op": op, "ad_id": int(rng.integers(0, 10 ** 6))}
        if op != "retire":
            rec.update(random_rule(rng, schema, 0.5, 0.2), embedding=rng.standard_normal(8), bias=float(j),
                       live=bool(j % 2))
        recs.append(rec)
    update = PoolUpdate.from_records(schema, recs, 8)
    owner = shard_of(update.targeting.ad_ids, 3)
    seen = 0
    for s in range(3):
        part = take_ops(update, owner == s).checked()
        idx = np.flatnonzero(owner == s)
        seen += idx.size
        t, whole = part.targeting, update.targeting
        np.testing.assert_array_equal(t.ops, whole.ops[idx])
        np.testing.assert_array_equal(t.ad_ids, whole.ad_ids[idx])
        np.testing.assert_array_equal(t.live, whole.live[idx])
        for j, i in enumerate(idx):
            np.testing.assert_array_equal(t.codes[t.codes_ptr[j]:t.codes_ptr[j + 1]],
                                          whole.codes[whole.codes_ptr[i]:whole.codes_ptr[i + 1]])
        np.testing.assert_array_equal(part.embeddings, update.embeddings[idx])
        np.testing.assert_array_equal(part.bias, update.bias[idx])
        np.testing.assert_array_equal(part.sets_row, update.sets_row[idx])
    assert seen == len(update)
    assert len(take_ops(update, np.zeros(len(update), bool))) == 0


def test_byte_model():
    req = anb.Request.random(64, 6, 2, np.random.default_rng(0))
    req_bytes, ans = 14 * 64 * 4, 12 * 1000
    assert byte_model("colocated", req, 10 ** 6, 1000) == req_bytes + ans
    assert byte_model("remote", req, 10 ** 6, 1000) == 2 * req_bytes + 4 * 10 ** 6 + 2 * ans
    with pytest.raises(ValueError, match="topology"):
        byte_model("carrier pigeon", req, 1, 1)


@pytest.mark.slow  # a simulator pool: seconds
def test_a_packed_call_runs_a_request_method_and_nothing_else(rng):
    """The servers' one-pickle calls (what the topologies send): a request method's answer comes
    back packed and equal to the pool's own; any other method is refused."""
    import pickle

    from andromeda_nb.datasets import synthetic
    from andromeda_nb.serving import cluster as C

    server = C.PoolServer(C.demo_world, (300, 0), dict(max_batch=1, max_k=8))
    req = anb.Request.random(64, 6, 2, rng)
    prof = synthetic.generate_profiles(server.pool.index.index.schema, 1, seed=int(rng.integers(1 << 30)))[0]
    got = C._answer(server.call(pickle.dumps(("retrieve", req, prof, 8))))
    want = server.pool.retrieve(req, prof, k=8)
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.scores, want.scores)
    assert got.n_eligible == want.n_eligible
    for method in ("apply", "__init__", "call"):
        with pytest.raises(ValueError, match="through call"):
            server.call(pickle.dumps((method, None)))
    for payload in (pickle.dumps(()), pickle.dumps(5), pickle.dumps("retrieve"), pickle.dumps({"retrieve": 0})):
        with pytest.raises(ValueError, match="packed call"):
            server.call(payload)
    with pytest.raises(TypeError, match="packed call"):
        server.call("retrieve")
    # remote scoring's slots: checked before the kernel's int32, and k within the pool's max_k
    n = server.pool.n_ads
    for slots, err in ((np.array([0, 2 ** 32 + 1]), ValueError), (np.array([0.9, 1.5]), TypeError),
                       (np.array([False, True]), TypeError), (np.array([[0, 1]]), TypeError),
                       (np.array([-1, 2]), ValueError), (np.array([0, n]), ValueError)):
        with pytest.raises(err, match="slots"):
            server.call(pickle.dumps(("score_candidates", req, slots, 4)))
    with pytest.raises(ValueError, match="max_k"):
        server.call(pickle.dumps(("score_candidates", req, np.arange(20), 9)))
    # a batch's errors are the pool's own
    with pytest.raises(Exception, match="one mapping"):
        server.call(pickle.dumps(("retrieve_batch", [req], prof, 8)))
