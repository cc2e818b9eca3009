"""A live Pool (Pool.apply): after any sequence of update batches, every answer equals that of a
pool rebuilt from scratch with the same live ads; bad batches are refused whole."""

import numpy as np
import pytest

import andromeda_nb as anb
from andromeda_nb.pipeline import Pool, PoolUpdate, StepTimes
from andromeda_nb.pipeline.updates import final_rows, rows_max_abs, stored_rows
from andromeda_nb.targeting import CHANGE, CREATE, RETIRE, RuleError, TargetingIndex, TargetingRules

from ..helpers import random_profile, random_rule, random_rules

D = 16


class Mirror:
    """The live ads as the test expects them: ad id -> (record, embedding, bias)."""

    def __init__(self, rules: TargetingRules, table: anb.AdTable, rows=None):
        self.schema = rules.schema
        recs = rules.to_records()
        # the rows the table was made from (an int8 table's dequantized rows quantize to other scales)
        emb = table.dequantized() if rows is None else np.asarray(rows, np.float32)
        self.ads = {int(r["ad_id"]): (r, emb[i].astype(np.float32), float(table.bias[i]))
                    for i, r in enumerate(recs)}
        self.next_id = max(self.ads, default=0) + 1

    def batch(self, rng, size: int, kinds=("create", "change", "change_rule", "retire", "recreate")):
        """A random batch of ``kinds`` (creates, changes with and without a row, retires,
        retire-then-create of the same id) and the state it leads to."""
        ads = dict(self.ads)
        recs, emb, bias = [], [], []
        for _ in range(size):
            kind = rng.choice(list(kinds))
            if kind != "create" and not ads:
                kind = "create"
            if kind == "create":
                ad, rule = self.next_id, random_rule(rng, self.schema, 0.4, 0.15)
                self.next_id += 1
            else:
                ad = int(rng.choice(list(ads)))
                rule = random_rule(rng, self.schema, 0.4, 0.15)
            row = (rng.standard_normal(D) * 0.5).astype(np.float32)
            b = float(rng.standard_normal())
            if kind == "retire" or kind == "recreate":
                recs.append({"op": "retire", "ad_id": ad})
                del ads[ad]
                if kind == "retire":
                    continue
            live = bool(rng.random() < 0.9)
            op = "create" if kind in ("create", "recreate") else "change"
            rec = {"op": op, "ad_id": ad, "live": live, **rule}
            if kind == "change_rule":  # the rule only: the row stays
                ads[ad] = ({"ad_id": ad, "live": live, **rule}, ads[ad][1], ads[ad][2])
            else:
                rec.update(embedding=row, bias=b)
                ads[ad] = ({"ad_id": ad, "live": live, **rule}, row, b)
            recs.append(rec)
        return PoolUpdate.from_records(self.schema, recs, D), ads

    def rebuilt(self, ads: dict, dtype: str):
        ids = sorted(ads)
        rules = TargetingRules.from_records(self.schema, [ads[a][0] for a in ids])
        emb = np.stack([ads[a][1] for a in ids]) if ids else np.zeros((0, D), np.float32)
        table = anb.AdTable.from_float(emb, np.array([ads[a][2] for a in ids], np.float32), dtype=dtype,
                                       ad_ids=np.array(ids, np.int64))
        return Pool(table, TargetingIndex(rules), max_batch=4, max_k=12)


def same_answers(pool, fresh, reqs, profs, k=12):
    for got, want in zip(pool.retrieve(reqs, profs, k=k), fresh.retrieve(reqs, profs, k=k)):
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.scores, want.scores)
        assert got.n_eligible == want.n_eligible


@pytest.mark.parametrize("dtype,host_bits", [("fp16", "auto"), ("int8", True)])
def test_updates_equal_a_rebuild(rng, dtype, host_bits):
    """Random batches on a pool with a little spare capacity (it fills and grows): after each, the
    answers of a batch of requests equal a rebuilt pool's, and the live count matches. The bits
    worked out on the device (the default) or on the host (``host_bits=True``)."""
    from andromeda_nb.match import DeviceTargetingIndex

    n = 60
    rules = random_rules(rng, n, p_constrain=0.3, p_exclude=0.1)
    rows = (rng.standard_normal((n, D)) * 0.5).astype(np.float32)
    table = anb.AdTable.from_float(rows, rng.standard_normal(n), dtype=dtype, ad_ids=rules.ad_ids)
    index = TargetingIndex(rules, capacity=n + 6)
    pool = Pool(table, index if host_bits == "auto" else DeviceTargetingIndex(index, host_bits=host_bits),
                max_batch=4, max_k=12)
    mirror = Mirror(rules, table, rows)
    reqs = [anb.Request.random(D, 3, 2, rng) for _ in range(3)]
    slots0 = pool.n_ads
    for step in range(4):  # the first batch's creates outrun the spare slots
        update, ads = mirror.batch(rng, 12, *([("create",)] if step == 0 else []))
        # odd steps through the traced path (the bench's device time): the same work between events
        pool.trace = StepTimes() if step % 2 else None
        pool.apply(update)
        if step % 2:
            assert [list(c) for c in pool.trace.calls] == [["apply"]] and np.isfinite(pool.trace.calls[0]["apply"])
        pool.trace = None
        mirror.ads = ads
        profs = [random_profile(rng, rules.schema) for _ in reqs[:-1]] + [{}]
        same_answers(pool, mirror.rebuilt(ads, dtype), reqs, profs)
        assert pool.n_ads - pool.n_free == len(ads)
        live_ids = set(pool.table.host_ad_ids[pool.table.host_ad_ids >= 0].tolist())
        assert live_ids == set(ads)
    assert pool.n_ads > slots0  # the creates outran the spare slots: the pool grew
    assert pool.index.index.host_bits == (host_bits is True)  # (kept through the growth's rebuild too)


def test_retired_slot_is_reused_and_never_returns_the_old_ad(rng):
    """Retire ad 10, create ad 777 in the same batch: 777 takes 10's slot, is served, 10 never is."""
    rules = random_rules(rng, 20, p_constrain=0.0, p_exclude=0.0, live_p=1.0)
    ids = rules.ad_ids
    table = anb.AdTable.from_float(rng.standard_normal((20, D)), dtype="fp16", ad_ids=ids)
    pool = Pool(table, TargetingIndex(rules), max_batch=2, max_k=20)
    old = int(ids[3])
    new_id = int(ids.max()) + 777
    row = np.full(D, 4.0, np.float32)
    update = PoolUpdate.from_records(rules.schema, [{"op": "retire", "ad_id": old},
                                                    {"op": "create", "ad_id": new_id, "embedding": row, "bias": 9.0}],
                                     D)
    delta = pool.apply(update)
    assert delta.slots[0] == delta.slots[1] == 3
    out = pool.retrieve(anb.Request.random(D, 2, 1, rng), {}, k=20)
    assert new_id in out.ids.tolist() and old not in out.ids.tolist()
    assert out.n_eligible == 20


def test_bad_batches_are_refused_whole(rng):
    """Unknown ad, duplicate create, an ad retired twice, a malformed rule, rows of the wrong width,
    NaN, fp16 overflow: refused before anything changes (the same answers after)."""
    rules = random_rules(rng, 30, live_p=1.0)
    table = anb.AdTable.from_float(rng.standard_normal((30, D)), dtype="fp16", ad_ids=rules.ad_ids)
    pool = Pool(table, TargetingIndex(rules, capacity=34), max_batch=2, max_k=8)
    req, prof = anb.Request.random(D, 2, 1, rng), random_profile(rng, rules.schema)
    before = pool.retrieve(req, prof, k=8)
    a, b = int(rules.ad_ids[0]), int(rules.ad_ids[1])
    row = np.ones(D, np.float32)
    schema = rules.schema
    cat = schema.categories[0]

    def records(*recs):
        return PoolUpdate.from_records(schema, list(recs), D)

    bad = [
        (RuleError, lambda: pool.apply(records({"op": "change", "ad_id": 10 ** 9, "embedding": row}))),
        (RuleError, lambda: pool.apply(records({"op": "create", "ad_id": a, "embedding": row}))),
        (RuleError, lambda: pool.apply(records({"op": "retire", "ad_id": b}, {"op": "retire", "ad_id": b}))),
        (RuleError, lambda: pool.apply(records({"op": "create", "ad_id": 10 ** 6, "embedding": row,
                                                "include": {cat.name: [cat.cardinality]}}))),
        (ValueError, lambda: records({"op": "create", "ad_id": 10 ** 6, "embedding": np.ones(D + 1)})),
        (ValueError, lambda: records({"op": "create", "ad_id": 10 ** 6, "embedding": np.full(D, np.nan)})),
        (ValueError, lambda: records({"op": "create", "ad_id": 10 ** 6})),
        (ValueError, lambda: pool.apply(records({"op": "create", "ad_id": 10 ** 6, "embedding": np.full(D, 1e5)}))),
        (TypeError, lambda: pool.apply({"op": "create"})),
    ]
    # a batch needing more slots than are free, with a bad op after its creates: refused before
    # the pool grows for it
    creates = [{"op": "create", "ad_id": 10 ** 6 + i, "embedding": row} for i in range(6)]
    bad.append((RuleError, lambda: pool.apply(records(*creates, {"op": "retire", "ad_id": 10 ** 9}))))
    for error, call in bad:
        with pytest.raises(error):
            call()
    after = pool.retrieve(req, prof, k=8)
    np.testing.assert_array_equal(after.ids, before.ids)
    np.testing.assert_array_equal(after.scores, before.scores)
    assert pool.n_free == 4 and pool.n_ads == 34


def test_empty_large_and_grown_from_nothing(rng):
    """An empty batch changes nothing and leaves the pool serving; a batch touching more slots than
    a simulator grid-stride launch covers writes them all; a pool of no slots grows."""
    rules = random_rules(rng, 20, p_constrain=0.0, p_exclude=0.0, live_p=1.0)
    table = anb.AdTable.from_float(rng.standard_normal((20, D)), dtype="fp32", ad_ids=rules.ad_ids)
    pool = Pool(table, TargetingIndex(rules), max_batch=1, max_k=8)
    req = anb.Request.random(D, 2, 1, rng)
    before = pool.retrieve(req, {}, k=8)
    pool.apply(PoolUpdate.from_records(rules.schema, [], D))
    np.testing.assert_array_equal(pool.retrieve(req, {}, k=8).ids, before.ids)
    assert table.ad_ids.min() >= 0  # the caller's table is not the pool's to change
    ids = np.arange(5000, 5040)
    emb = rng.standard_normal((40, D)).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    pool.apply(PoolUpdate.from_columns(rules.schema, ["create"] * 40, ids, emb, bias=bias))
    pool.apply(PoolUpdate.from_columns(rules.schema, ["retire"] * 20, rules.ad_ids, np.zeros((20, D))))
    fresh = Pool(anb.AdTable.from_float(emb, bias, dtype="fp32", ad_ids=ids),
                 TargetingIndex(TargetingRules.from_columns(rules.schema, ids)), max_batch=1, max_k=8)
    out, want = pool.retrieve(req, {}, k=8), fresh.retrieve(req, {}, k=8)
    np.testing.assert_array_equal(out.ids, want.ids)  # the slots past the 32nd written too
    np.testing.assert_array_equal(out.scores, want.scores)
    assert out.n_eligible == 40 and not np.isin(pool.table.ad_ids.copy_to_host(), rules.ad_ids).any()
    empty = Pool(anb.AdTable.from_float(np.zeros((0, D)), dtype="fp16"),
                 TargetingIndex(TargetingRules.from_columns(rules.schema, np.zeros(0, np.int64))), max_k=4)
    empty.apply(PoolUpdate.from_columns(rules.schema, ["create"] * 3, [1, 2, 3], np.ones((3, D))))
    assert empty.n_ads >= 3 and empty.retrieve(req, {}, k=4).n_eligible == 3


def test_a_retired_large_ad_no_longer_bounds_the_math(rng):
    """max|a| follows the live rows: after the ad that raised it retires, the pool serves in the
    math and with the answers of a rebuild."""
    rules = random_rules(rng, 20, p_constrain=0.0, p_exclude=0.0, live_p=1.0)
    table = anb.AdTable.from_float(rng.standard_normal((20, D)) * 0.5, dtype="fp16", ad_ids=rules.ad_ids)
    pool = Pool(table, TargetingIndex(rules, capacity=24), max_batch=1, max_k=8)
    req = anb.Request.random(D, 2, 1, rng)
    before = pool.retrieve(req, {}, k=8)
    pool.apply(PoolUpdate.from_columns(rules.schema, ["create"], [999], np.full((1, D), 60000.0)))
    assert pool.table.max_abs() == 60000.0
    pool.apply(PoolUpdate.from_columns(rules.schema, ["retire"], [999], np.zeros((1, D))))
    after = pool.retrieve(req, {}, k=8)
    np.testing.assert_array_equal(after.ids, before.ids)
    np.testing.assert_array_equal(after.scores, before.scores)


def test_requests_after_updates_reduce_the_table_only_where_the_bound_refuses(rng):
    """After updates that overwrite or free rows, max|a| is only bounded (the old value): requests
    that pass on the bound cost no reduction over the table (a full pass, milliseconds at 10^7
    ads), and a request that would fail on the bound alone gets the exact value, once, and is
    served as on a rebuilt pool. (A reduction is what makes the table's max|a| exact again:
    ``max_abs_is_exact`` says whether one ran.)"""
    rules = random_rules(rng, 20, p_constrain=0.0, p_exclude=0.0, live_p=1.0)
    table = anb.AdTable.from_float(rng.standard_normal((20, D)) * 0.5, dtype="fp16", ad_ids=rules.ad_ids)
    pool = Pool(table, TargetingIndex(rules, capacity=24), max_batch=1, max_k=8)
    pool.apply(PoolUpdate.from_columns(rules.schema, ["create"], [999], np.full((1, D), 6000.0)))
    pool.apply(PoolUpdate.from_columns(rules.schema, ["change", "retire"], [int(rules.ad_ids[0]), 999],
                                       np.full((2, D), 0.25), sets_row=np.array([True, False])))
    assert not pool.table.max_abs_is_exact() and pool.table.max_abs_bound() == 6000.0
    req = anb.Request.random(D, 2, 1, rng)
    for _ in range(3):
        pool.retrieve(req, {}, k=8)
    assert not pool.table.max_abs_is_exact()  # the bound passed: no pass over the table
    # gamma * 6000 past fp16, gamma * (the live rows' max) within it: the exact value decides
    live_max = float(np.abs(table.dequantized()[1:]).max())
    wide = anb.Request(V=req.V, G=req.G, gamma=np.full(D, 20000 / live_max, np.float32), beta=req.beta,
                       k_experts=1)
    fp16 = anb.KernelConfig(math="fp16")
    strict = Pool(table, TargetingIndex(rules, capacity=24), max_batch=1, max_k=8, config=fp16)
    strict.apply(PoolUpdate.from_columns(rules.schema, ["create"], [999], np.full((1, D), 6000.0)))
    strict.apply(PoolUpdate.from_columns(rules.schema, ["change", "retire"], [int(rules.ad_ids[0]), 999],
                                         np.full((2, D), 0.25), sets_row=np.array([True, False])))
    got = strict.retrieve(wide, {}, k=8)
    assert strict.table.max_abs_is_exact()  # the one pass the bound's refusal called for
    mirror = Mirror(rules, table)
    ads = dict(mirror.ads)
    ads[int(rules.ad_ids[0])] = (ads[int(rules.ad_ids[0])][0], np.full(D, 0.25, np.float32), 0.0)
    want = mirror.rebuilt(ads, "fp16")
    want.config = fp16
    ref = want.retrieve(wide, {}, k=8)
    np.testing.assert_array_equal(got.ids, ref.ids)
    np.testing.assert_array_equal(got.scores, ref.scores)


def test_check_refuses_what_apply_would_and_changes_nothing(rng):
    """Pool.check (a sharded pool checks every part before any applies): the same refusals as
    apply (unknown ad, a row past fp16, rows of another width), the pool untouched; a good batch
    passes and applies after."""
    rules = random_rules(rng, 12, p_constrain=0.0, p_exclude=0.0, live_p=1.0)
    table = anb.AdTable.from_float(rng.standard_normal((12, D)), dtype="fp16", ad_ids=rules.ad_ids)
    pool = Pool(table, TargetingIndex(rules), max_batch=1, max_k=4)
    big = np.zeros((1, D))
    big[0, 0] = 7e4
    for bad, err in ((PoolUpdate.from_columns(rules.schema, ["retire"], [10 ** 9], np.zeros((1, D))), RuleError),
                     (PoolUpdate.from_columns(rules.schema, ["create"], [10 ** 9], big), ValueError),
                     (PoolUpdate.from_columns(rules.schema, ["create"], [10 ** 9], np.zeros((1, D + 1))), ValueError)):
        with pytest.raises(err):
            pool.check(bad)
    assert pool.index.version == 0 and pool.n_ads - pool.n_free == 12
    good = PoolUpdate.from_columns(rules.schema, ["retire"], [int(rules.ad_ids[0])], np.zeros((1, D)))
    pool.check(good)
    assert pool.index.version == 0
    pool.apply(good)
    assert pool.n_ads - pool.n_free == 11


def test_updates_behind_the_pools_back_are_refused(rng):
    """An update applied to the host index directly: the pool refuses to apply or serve, even where
    its next batch would grow it."""
    from andromeda_nb.targeting import UpdateBatch

    rules = random_rules(rng, 6, p_constrain=0.0, p_exclude=0.0, live_p=1.0)
    index = TargetingIndex(rules, capacity=7)
    pool = Pool(anb.AdTable.from_float(rng.standard_normal((6, D)), dtype="fp32", ad_ids=rules.ad_ids), index,
                max_k=4)
    other = Pool(anb.AdTable.from_float(rng.standard_normal((6, D)), dtype="fp32", ad_ids=rules.ad_ids), index,
                 max_k=4)
    index.apply(UpdateBatch.from_records(rules.schema, [{"op": "create", "ad_id": 777}]))
    with pytest.raises(RuntimeError, match="outside"):
        pool.apply(PoolUpdate.from_columns(rules.schema, ["create"] * 2, [900, 901], np.ones((2, D))))
    for p in (pool, other):  # (a second pool of the same index too: its device copy never saw the batch)
        with pytest.raises(RuntimeError, match="updated after this pool was built"):
            p.retrieve(anb.Request.random(D, 2, 1, rng), {}, k=4)


def test_a_failed_device_part_leaves_a_pool_that_says_so(rng, monkeypatch):
    """The host index took a batch whose device part then failed: the pool refuses to serve or
    apply, naming the failure, instead of answering from a device copy one batch behind."""
    from andromeda_nb.match import DeviceTargetingIndex

    rules = random_rules(rng, 10)
    pool = Pool(anb.AdTable.from_float(rng.standard_normal((10, D)), dtype="fp32", ad_ids=rules.ad_ids),
                TargetingIndex(rules, capacity=12), max_k=4)

    def fails(self, *args):
        raise RuntimeError("CUDA_ERROR_INVALID_VALUE")

    monkeypatch.setattr(DeviceTargetingIndex, "_flip_rows", fails)
    update = PoolUpdate.from_columns(rules.schema, ["change"] * 2, rules.ad_ids[:2], np.ones((2, D)))
    with pytest.raises(RuntimeError, match="CUDA_ERROR_INVALID_VALUE"):
        pool.apply(update)
    monkeypatch.undo()
    for call in (lambda: pool.retrieve(anb.Request.random(D, 2, 1, rng), {}, k=4), lambda: pool.apply(update)):
        with pytest.raises(RuntimeError, match="device part failed .*CUDA_ERROR_INVALID_VALUE.*build a new Pool"):
            call()


def test_columns_build_the_same_batch_as_records(rng):
    """PoolUpdate.from_columns (the throughput format) and from_records agree; sets_row is checked."""
    rules = random_rules(rng, 10, live_p=1.0)
    schema = rules.schema
    c = schema.categories[0].name
    emb = rng.standard_normal((3, D)).astype(np.float32)
    cols = PoolUpdate.from_columns(schema, ["create", "change", "retire"], [500, int(rules.ad_ids[0]),
                                                                            int(rules.ad_ids[1])],
                                   emb, bias=[1.0, 2.0, 0.0], include={c: (np.array([0, 1, 1, 1]), np.array([0]))})
    recs = PoolUpdate.from_records(schema, [
        {"op": "create", "ad_id": 500, "include": {c: [0]}, "embedding": emb[0], "bias": 1.0},
        {"op": "change", "ad_id": int(rules.ad_ids[0]), "embedding": emb[1], "bias": 2.0},
        {"op": "retire", "ad_id": int(rules.ad_ids[1])}], D)
    for name in ("ops", "ad_ids", "codes_ptr", "codes"):
        np.testing.assert_array_equal(getattr(cols.targeting, name), getattr(recs.targeting, name))
    np.testing.assert_array_equal(cols.sets_row, [True, True, False])
    np.testing.assert_array_equal(cols.embeddings[:2], recs.embeddings[:2])
    with pytest.raises(ValueError, match="create must set"):
        PoolUpdate.from_columns(schema, ["create"], [501], emb[:1], sets_row=np.array([False]))
    with pytest.raises(ValueError, match="sets_row"):
        PoolUpdate.from_columns(schema, ["create"], [501], emb[:1], sets_row=[1])
    with pytest.raises(ValueError, match="bias comes with"):
        PoolUpdate.from_records(schema, [{"op": "change", "ad_id": int(rules.ad_ids[0]), "bias": 3.0}], D)
    with pytest.raises(TypeError, match="real numbers"):
        PoolUpdate.from_records(schema, [{"op": "create", "ad_id": 9, "embedding": np.ones(D) * 1j}], D)
    recs.sets_row[2] = True  # changed after it was built: apply validates it again
    with pytest.raises(ValueError, match="retire sets no row"):
        recs.checked()


def test_final_rows_follow_each_slots_last_occupant():
    """final_rows: the last op per slot; the row from the occupant's latest row-setting op, kept
    where it set none; a freed slot keeps no row."""
    slots = np.array([5, 5, 5, 2, 2, 7, 9, 9])
    ops = np.array([RETIRE, CREATE, CHANGE, CHANGE, CHANGE, CHANGE, CREATE, RETIRE])
    sets = np.array([False, True, False, True, False, False, True, False])
    touched, last, row = final_rows(slots, ops, sets)
    np.testing.assert_array_equal(touched, [2, 5, 7, 9])
    np.testing.assert_array_equal(last, [4, 2, 5, 7])
    np.testing.assert_array_equal(row, [3, 1, -1, -1])


def test_score_topk_on_a_live_pools_table_sees_its_updates(rng):
    """score_topk and score_ads on the pool's table after apply: ads created into free slots are
    scored, freed slots never are (the table's cached bitset of live slots follows the updates)."""
    from andromeda_nb import reference
    from andromeda_nb.score import score_ads

    rules = random_rules(rng, 10, p_constrain=0.0, p_exclude=0.0, live_p=1.0)
    table = anb.AdTable.from_float(rng.standard_normal((10, D)), dtype="fp32", ad_ids=rules.ad_ids)
    pool = Pool(table, TargetingIndex(rules, capacity=12), max_k=12)
    req = anb.Request.random(D, 2, 1, rng)
    anb.score_topk(req, pool.table, 12)  # makes the table's live bitset
    a, b, new = int(rules.ad_ids[0]), int(rules.ad_ids[1]), int(rules.ad_ids.max()) + 1
    pool.apply(PoolUpdate.from_records(rules.schema, [{"op": "create", "ad_id": new, "embedding": np.zeros(D),
                                                        "bias": 100.0}, {"op": "retire", "ad_id": a},
                                                       {"op": "retire", "ad_id": b}], D))
    got = anb.score_topk(req, pool.table, 12)
    ids = pool.table.host_ad_ids
    scores = score_ads(req, pool.table).copy_to_host()
    assert np.isnan(scores[ids < 0]).all() and not np.isnan(scores[ids >= 0]).any()
    want = reference.topk(scores, 12, ids=ids, eligible=ids >= 0)
    np.testing.assert_array_equal(got.ids, want.ids)
    assert got.ids[0] == new and got.count == 9 and not np.isin([a, b], got.ids).any()
    np.testing.assert_array_equal(got.ids, pool.retrieve(req, {}, k=12).ids)


def test_batches_changed_after_they_were_built_are_refused(rng):
    """PoolUpdate and UpdateBatch arrays are the caller's: written after the batch was built (an
    unknown op, a negative ad id, codes of another schema), the batch is refused before anything
    changes; an fp16 row past its range names its ad."""
    rules = random_rules(rng, 20, live_p=1.0)
    table = anb.AdTable.from_float(rng.standard_normal((20, D)), dtype="fp16", ad_ids=rules.ad_ids)
    pool = Pool(table, TargetingIndex(rules, capacity=24), max_k=8)
    req, prof = anb.Request.random(D, 2, 1, rng), random_profile(rng, rules.schema)
    before = pool.retrieve(req, prof, k=8)
    a = int(rules.ad_ids[3])

    def update():
        return PoolUpdate.from_records(rules.schema, [{"op": "change", "ad_id": a, "embedding": np.ones(D)},
                                                      {"op": "create", "ad_id": 10 ** 6, "embedding": np.ones(D),
                                                       "include": {rules.schema.categories[0].name: [0]}}], D)

    for column, index, value, match in (("ops", 0, 7, "unknown op"), ("ad_ids", 1, -5, "non-negative"),
                                        ("codes", 0, (99 << 33), "rule codes")):
        u = update()
        getattr(u.targeting, column)[index] = value
        with pytest.raises(RuleError, match=match):
            pool.apply(u)
    big = PoolUpdate.from_records(rules.schema, [{"op": "create", "ad_id": 777, "embedding": np.full(D, 1e5)}], D)
    with pytest.raises(ValueError, match=r"ads \[777\]"):
        pool.apply(big)
    after = pool.retrieve(req, prof, k=8)
    np.testing.assert_array_equal(after.ids, before.ids)
    assert pool.n_free == 4 and pool.index.version == 0


def test_growth_keeps_the_index_options(rng):
    from andromeda_nb.match import DeviceTargetingIndex

    rules = random_rules(rng, 8, p_constrain=0.0, p_exclude=0.0, live_p=1.0)
    table = anb.AdTable.from_float(rng.standard_normal((8, D)), dtype="fp16", ad_ids=rules.ad_ids)
    dev = DeviceTargetingIndex(TargetingIndex(rules, list_dtype=np.int64), staging_regions=2, host_bits=False)
    pool = Pool(table, dev, max_k=4)
    pool.apply(PoolUpdate.from_columns(rules.schema, ["create"] * 4, np.arange(100, 104), np.ones((4, D))))
    assert pool.n_ads >= 12 and pool.index is not dev
    assert pool.index.index.list_dtype == np.int64 and not pool.index.index.host_bits
    assert len(pool.index._stager.regions) == 2


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "int8", "fp32"])
def test_stored_rows_equal_the_table_of_the_rows_and_refuse_what_it_refuses(rng, dtype):
    """A batch's rows as the pool stores them (fp16: one compiled pass) equal AdTable.from_float of
    the rows that are set, bit for bit, with the same largest |a|; rows it cannot hold (NaN, inf,
    past the fp16 range, in a row or a bias) are refused with the same message, and a row that is
    not set is never looked at. Random magnitudes from subnormal to past 65504, ties to even
    among them (odd multiples of 2^-11 round to even halves)."""
    from andromeda_nb.targeting import UpdateBatch

    schema = random_rules(rng, 4).schema
    for trial in range(30):
        k, d = int(rng.integers(1, 40)), int(rng.choice([1, 3, 8, 64]))
        x = (rng.standard_normal((k, d)) * 10 ** rng.uniform(-9, 4.9)).astype(np.float32)
        if trial % 4 == 1:  # exact ties between halves
            x = ((rng.integers(-2000, 2000, (k, d)) * 2 + 1) * 2.0 ** -11).astype(np.float32)
        b = rng.standard_normal(k).astype(np.float32)
        ops = rng.choice([CREATE, CHANGE, RETIRE], k)
        sets = (ops == CREATE) | ((ops == CHANGE) & (rng.random(k) < 0.5))
        if trial % 7 == 3:  # a nonzero row fp16 stores as zeros (and int8 with a subnormal scale): refused
            x[int(rng.integers(k))] = rng.uniform(-1, 1, d) * 2.0 ** -126
        if trial % 5 == 2:  # a value the stored row cannot hold, in a row that is set or one that is not
            i = int(rng.integers(k))
            x[i, rng.integers(d)] = rng.choice([np.nan, np.inf, 65520.0, -1e5]) if trial % 2 else x[i, 0]
            b[i] = np.nan if trial % 3 == 0 else b[i]
        batch = UpdateBatch(schema, ops.astype(np.int8), np.arange(k, dtype=np.int64), np.ones(k, bool),
                            np.zeros(k + 1, np.int64), np.zeros(0, np.int64))
        update = PoolUpdate(batch, x, b, sets)
        want_err = None
        try:
            update.checked()
            want = anb.AdTable.from_float(x[sets], b[sets], dtype=dtype)
        except ValueError as e:
            want_err = str(e).split(" (ads")[0]
        if want_err is not None:
            with pytest.raises(ValueError) as got_err:
                stored_rows(update, dtype)
            assert str(got_err.value).startswith(want_err)
            continue
        got = stored_rows(update, dtype)
        assert got.embeddings.dtype == want.embeddings.dtype
        np.testing.assert_array_equal(got.embeddings.view(np.uint8), want.embeddings.view(np.uint8))
        np.testing.assert_array_equal(got.bias, want.bias)
        assert got.max_abs == rows_max_abs(want)
        assert (got.scale is None) == (want.scale is None)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "int8", "fp32"])
def test_rows_max_abs_is_the_largest_finite_value_the_kernel_reads(rng, dtype):
    """The bound an update raises the table's max|a| by, read from the stored bits: equal to the
    largest finite |value| of the dequantized rows, on random magnitudes (subnormal to near the
    storage's limit), with NaN and inf entries, and all-zero rows."""
    for trial in range(40):
        n, d = int(rng.integers(1, 30)), int(rng.choice([4, 8, 64]))
        x = rng.standard_normal((n, d)) * 10 ** rng.uniform(-9, 4.5)
        if dtype != "int8" and trial % 3 == 0:
            x[rng.integers(n), rng.integers(d)] = rng.choice([np.nan, np.inf, -np.inf])
        if trial % 10 == 0:
            x[:] = 0.0
        try:
            table = anb.AdTable.from_float(x, np.zeros(n), dtype=dtype, allow_nonfinite=True)
        except ValueError:  # past the storage's range: refused, nothing to bound
            continue
        vals = np.abs(table.dequantized())
        assert rows_max_abs(table) == vals[np.isfinite(vals)].max(initial=0.0)


def test_an_update_whose_scale_ends_the_fused_dequantization_rebinds_the_kernels(rng):
    """An int8 pool in fp16 math dequantizes with one fused multiply-add a pair while every scale
    allows it; an ad whose scale does not (|a| ~ 8000: scale > 56) turns it off, and the batched
    launches bound before are bound again: answers equal a rebuilt pool's, before and after."""
    from andromeda_nb.targeting import TargetingRules

    f16 = anb.KernelConfig(math="fp16")
    rules = random_rules(rng, 30, p_constrain=0.0, p_exclude=0.0, live_p=1.0)
    rows = rng.standard_normal((30, D)).astype(np.float32)
    table = anb.AdTable.from_float(rows, rng.standard_normal(30), dtype="int8", ad_ids=rules.ad_ids)
    pool = Pool(table, TargetingIndex(rules, capacity=32), config=f16, max_batch=2, max_k=8)
    reqs = [anb.Request.random(D, 3, 2, rng) for _ in range(2)]
    assert pool.table.fma_dequant()
    mul = Pool(table, TargetingIndex(rules), config=anb.KernelConfig(math="fp16", dequant="mul"), max_batch=2, max_k=8)
    same_answers(pool, mul, reqs, [{}, {}], k=8)
    big = np.full((1, D), 8000.0)
    big[0, ::2] *= -1
    pool.apply(PoolUpdate.from_columns(rules.schema, ["create"], [999], big, np.zeros(1)))
    assert not pool.table.fma_dequant()
    recs = rules.to_records() + [{"ad_id": 999, "live": True}]
    rebuilt_rules = TargetingRules.from_records(rules.schema, recs)
    rebuilt = anb.AdTable.from_float(np.vstack([rows, big]), np.append(table.bias, 0.0), dtype="int8",
                                     ad_ids=rebuilt_rules.ad_ids)
    fresh = Pool(rebuilt, TargetingIndex(rebuilt_rules), config=f16, max_batch=2, max_k=8)
    assert not fresh.table.fma_dequant()
    same_answers(pool, fresh, reqs, [{}, {}], k=8)
    for req in reqs:  # every ad's score, the large one's too (finite: no overflowed offset)
        a, b = (dict(zip(t.host_ad_ids.tolist(), anb.score_ads(req, t, config=f16).copy_to_host().tolist()))
                for t in (pool.table, fresh.table))
        a = {i: v for i, v in a.items() if i >= 0}
        assert a == b and np.isfinite(a[999])


def test_a_pool_that_asks_for_the_fused_dequantization_refuses_what_would_end_it(rng):
    """dequant="fma" (not "auto") is refused up front on a table whose scales do not allow it, and
    an update whose rows would end it is refused whole, the pool serving on unchanged."""
    fma = anb.KernelConfig(math="fp16", dequant="fma")
    rules = random_rules(rng, 20, p_constrain=0.0, p_exclude=0.0, live_p=1.0)
    table = anb.AdTable.from_float(rng.standard_normal((20, D)), dtype="int8", ad_ids=rules.ad_ids)
    odd = anb.AdTable(embeddings=table.embeddings, bias=table.bias, dtype="int8", scale=table.scale * np.float32(1.01),
                      ad_ids=table.ad_ids)
    for bad, config in ((odd, fma), (table, anb.KernelConfig(dequant="fma"))):
        with pytest.raises(ValueError, match="dequant='fma'"):
            Pool(bad, TargetingIndex(rules), config=config)
    pool = Pool(table, TargetingIndex(rules, capacity=24), config=fma, max_batch=1, max_k=5)
    req = anb.Request.random(D, 3, 2, rng)
    before = pool.retrieve(req, {}, k=5)
    with pytest.raises(ValueError, match="scale past 56"):
        pool.apply(PoolUpdate.from_columns(rules.schema, ["create"], [999], np.full((1, D), 8000.0)))
    assert pool.table.fma_dequant() and 999 not in pool.table.host_ad_ids
    after = pool.retrieve(req, {}, k=5)
    np.testing.assert_array_equal(after.ids, before.ids)
    np.testing.assert_array_equal(after.scores, before.scores)
