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
