"""Real-time index updates: after any sequence of batches the index (host and device) equals one
rebuilt from scratch from the ad id -> (slot, rule) map, requests see exactly the updates issued
before them, errors change nothing, and the bits written are the bits that change."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andromeda_nb.match import DeviceTargetingIndex, MatchConfig, match_eligible
from andromeda_nb.targeting import RuleError, TargetingIndex, TargetingRules, UpdateBatch, make_profile

from ..helpers import random_profile, random_rules, random_schema
from ..match.helpers import ALGORITHMS, check_match, config_id

SCHEMA = random_schema()


def rule_strategy():
    cats = {c.name: c.cardinality for c in SCHEMA}

    def sets(draw_max):
        return st.dictionaries(st.sampled_from(sorted(cats)), st.lists(st.integers(0, 6), min_size=1, max_size=draw_max),
                               max_size=3)

    return st.fixed_dictionaries({"include": sets(3), "exclude": sets(1), "live": st.booleans()}).map(
        lambda r: {"live": r["live"],
                   "include": {c: [v % cats[c] for v in vs] for c, vs in r["include"].items()},
                   "exclude": {c: [v % cats[c] for v in vs] for c, vs in r["exclude"].items()}})


def check_state(host: TargetingIndex, dev: DeviceTargetingIndex, rng, dev_only: DeviceTargetingIndex | None = None,
                config: MatchConfig | None = None):
    """Host and device copies equal a rebuild from the rule map, and a request through ``config``
    matches the oracle on the current rules."""
    ref = host.rebuild()
    host.assert_same(ref)  # the host copy equals a rebuild from the rule map
    rows, pool = dev.snapshot()
    host.assert_same(ref, bitsets=rows, pool=pool)  # so does the device copy
    prof = random_profile(rng, SCHEMA)
    check_match(dev, prof, match_eligible(dev, prof, config=config))
    if dev_only is not None:  # the same updates on an index whose rows live on the device only
        rows2, pool2 = dev_only.snapshot()
        np.testing.assert_array_equal(rows2, ref.bitsets)
        mine, theirs = dev_only.index._list_sets_of(pool2), ref.list_sets()
        assert mine.keys() == theirs.keys() and all(np.array_equal(mine[k], theirs[k]) for k in mine)
        np.testing.assert_array_equal(dev_only.index.row_count, ref.row_count)
        np.testing.assert_array_equal(dev_only.index.constrained, ref.constrained)
        check_match(dev_only, prof, match_eligible(dev_only, prof, config=config), rules=host.current_rules())


def apply_in_chunks(dev: DeviceTargetingIndex, batch):
    """``dev.apply(batch)`` with the update diff split into chunks of one slot (the parallel path
    that large batches take), so the property test checks it against the one-call path of the
    other index."""
    delta = dev.index.apply(batch, diff_chunk_slots=1)
    dev.apply_delta(delta)
    return delta


SEQUENCES = dict(data=st.data(), n=st.integers(1, 60), spare=st.integers(0, 12), layout=st.integers(0, 3),
                 seed=st.integers(0, 2**31), wide_lists=st.booleans())


@settings(max_examples=6)
@given(**SEQUENCES)
def test_random_update_sequences_equal_a_rebuild(data, n, spare, layout, seed, wide_lists):
    """Random create / change / retire / recreate batches, applied on the device (host bits kept
    and dropped): the index equals one rebuilt from the surviving rules after every batch, and
    requests through a random match algorithm match the oracle. With ``wide_lists`` the inverted
    lists hold int64 slots, as in a pool past 2^31 ads."""
    check_update_sequence(data, n, spare, layout, seed, wide_lists)


@pytest.mark.slow
@settings(max_examples=30)
@given(**SEQUENCES)
def test_many_random_update_sequences_equal_a_rebuild(data, n, spare, layout, seed, wide_lists):
    """The property above on five times as many sequences (the slow tier)."""
    check_update_sequence(data, n, spare, layout, seed, wide_lists)


def check_update_sequence(data, n, spare, layout, seed, wide_lists):
    rng = np.random.default_rng(seed)
    rules = random_rules(rng, n, schema=SCHEMA)
    kw = [dict(dense_min=10**9, exclude_dense_min=10**9), dict(dense_min=1, exclude_dense_min=1),
          dict(dense_min=2, exclude_dense_min=3, group_max=16), dict(group_max=1)][layout]
    kw["list_dtype"] = np.int64 if wide_lists else "auto"
    config = data.draw(st.sampled_from(ALGORITHMS), label="config")
    host = TargetingIndex(rules, capacity=n + spare, **kw)
    assert host.list_dtype == (np.int64 if wide_lists else np.int32)
    dev = DeviceTargetingIndex(host, host_bits=True)
    dev_only = DeviceTargetingIndex(TargetingIndex(rules, capacity=n + spare, **kw), host_bits=False)
    alive = list(rules.ad_ids.tolist())
    next_id = 10**6
    for _ in range(data.draw(st.integers(1, 3), label="batches")):
        recs, ids = [], list(alive)
        for _ in range(data.draw(st.integers(1, 8), label="ops")):
            kind = data.draw(st.sampled_from(["create", "change", "retire", "recreate"]), label="op")
            if kind in ("change", "retire") and not ids:
                kind = "create"
            if kind == "create":
                rec = dict(data.draw(rule_strategy(), label="rule"), op="create", ad_id=next_id)
                ids.append(next_id)
                next_id += 1
            elif kind == "change":
                rec = dict(data.draw(rule_strategy(), label="rule"), op="change",
                           ad_id=data.draw(st.sampled_from(ids), label="ad"))
            elif kind == "retire":
                ad = data.draw(st.sampled_from(ids), label="ad")
                ids.remove(ad)
                rec = {"op": "retire", "ad_id": ad}
            else:  # retire an ad and create it again (its slot is reused first)
                if not ids:
                    continue
                ad = data.draw(st.sampled_from(ids), label="ad")
                recs.append({"op": "retire", "ad_id": ad})
                rec = dict(data.draw(rule_strategy(), label="rule"), op="create", ad_id=ad)
            recs.append(rec)
        if not recs:
            continue
        batch = UpdateBatch.from_records(SCHEMA, recs)
        try:
            dev.apply(batch)
        except RuleError as exc:  # only a full index may refuse a valid sequence
            assert "no free slot" in str(exc)
            with pytest.raises(RuleError, match="no free slot"):
                apply_in_chunks(dev_only, batch)
            continue
        apply_in_chunks(dev_only, batch)
        alive = ids
        check_state(host, dev, rng, dev_only, config)


def test_retire_then_recreate_reuses_the_slot_and_changes_a_live_ad(rng):
    rules = TargetingRules.from_records(SCHEMA, [{"ad_id": i, "include": {"age": [i % 7]}} for i in range(70)])
    host = TargetingIndex(rules, dense_min=1)
    dev = DeviceTargetingIndex(host, host_bits=True)
    slot = host.slot_of(13)
    dev.apply(UpdateBatch.from_records(SCHEMA, [{"op": "retire", "ad_id": 13}]))
    assert host.slot_of(13) is None and host.ad_ids[slot] == -1
    dev.apply(UpdateBatch.from_records(SCHEMA, [{"op": "create", "ad_id": 999, "include": {"interest": [4]}}]))
    assert host.slot_of(999) == slot  # the freed slot is reused first
    dev.apply(UpdateBatch.from_records(SCHEMA, [{"op": "change", "ad_id": 999, "include": {"interest": [5]},
                                                 "exclude": {"age": [2]}}]))
    dev.apply(UpdateBatch.from_records(SCHEMA, [{"op": "retire", "ad_id": 999},
                                                {"op": "create", "ad_id": 13, "live": False}]))
    assert host.slot_of(13) == slot and not host.live[slot]
    check_state(host, dev, rng)


def test_errors_change_nothing(rng):
    rules = random_rules(rng, 40, schema=SCHEMA)
    host = TargetingIndex(rules, capacity=42, dense_min=1)
    dev = DeviceTargetingIndex(host, host_bits=True)
    before_rows, before_pool = dev.snapshot()
    ref = host.rebuild()
    ad = int(rules.ad_ids[0])
    bad = [
        [{"op": "retire", "ad_id": 123456789}],                                  # unknown ad
        [{"op": "change", "ad_id": 123456789}],
        [{"op": "create", "ad_id": ad}],                                          # duplicate
        [{"op": "create", "ad_id": 10**7}, {"op": "create", "ad_id": 10**7}],    # duplicate within the batch
        [{"op": "create", "ad_id": 10**7 + i} for i in range(3)],                # only 2 free slots
        [{"op": "create", "ad_id": 10**7}, {"op": "retire", "ad_id": ad}, {"op": "retire", "ad_id": ad}],
    ]
    out_of_slots = 4
    for i, recs in enumerate(bad):
        batch = UpdateBatch.from_records(SCHEMA, recs)
        with pytest.raises(RuleError):
            dev.apply(batch)
        if i != out_of_slots:  # check refuses the same batches, but for capacity (a pool grows for it)
            with pytest.raises(RuleError):
                host.check(batch)
    host.check(UpdateBatch.from_records(SCHEMA, bad[out_of_slots]))
    with pytest.raises(RuleError, match=r"already exists \(created earlier in this batch\)"):  # no virtual slot
        host.check(UpdateBatch.from_records(SCHEMA, bad[3]))
    for index in (host, dev):  # a second retire names the first, not an unknown ad
        with pytest.raises(RuleError, match=rf"ad {ad}: retire of an ad retired earlier in this batch"):
            (index.check if index is host else index.apply)(UpdateBatch.from_records(SCHEMA, bad[5]))
    with pytest.raises(RuleError, match="ad 123456789: retire of an unknown ad"):
        host.check(UpdateBatch.from_records(SCHEMA, bad[0]))
    host.check(UpdateBatch.from_records(SCHEMA, [{"op": "retire", "ad_id": ad}, {"op": "create", "ad_id": ad}]))
    for recs, msg in [([{"op": "create", "ad_id": 5, "include": {"age": [7]}}], "ad 5.*'age'.*out of range"),
                      ([{"op": "create", "ad_id": 5, "include": {"planet": [1]}}], "unknown category"),
                      ([{"op": "bump", "ad_id": 5}], "op must be one of"),
                      ([{"op": "retire", "ad_id": 5, "live": True}], "retire carries only")]:
        with pytest.raises(RuleError, match=msg):
            UpdateBatch.from_records(SCHEMA, recs)
    assert host.version == 0 and dev.version == 0
    host.assert_same(ref)
    rows, pool = dev.snapshot()
    np.testing.assert_array_equal(rows, before_rows)
    np.testing.assert_array_equal(pool, before_pool)


@pytest.mark.parametrize("config", ALGORITHMS, ids=config_id)
def test_requests_see_updates_issued_before_them_and_none_after(rng, config):
    """A pipeline: the host runs ahead computing deltas and plans; the device applies and serves
    them in issue order. Each request's answer is the oracle's on the rules of its own moment."""
    rules = random_rules(rng, 80, schema=SCHEMA)
    host = TargetingIndex(rules, capacity=120, dense_min=2)
    dev = DeviceTargetingIndex(host, host_bits=True)
    prof = random_profile(rng, SCHEMA)
    steps, next_id = [], 10**6
    alive = list(rules.ad_ids.tolist())
    for k in range(4):
        recs = [{"op": "create", "ad_id": next_id, "include": {"interest": list(make_profile(SCHEMA, prof)["interest"])[:1]}}]
        recs.append({"op": "retire", "ad_id": alive.pop(int(rng.integers(len(alive))))})
        next_id += 1
        delta = host.apply(UpdateBatch.from_records(SCHEMA, recs))
        plan = dev.prepare([prof])
        steps.append((delta, plan, host.current_rules()))  # the rules of this request's moment
    with pytest.raises(RuntimeError):
        dev.launch(steps[0][1], config=config)  # the device has not applied delta 1 yet
    for delta, plan, rules_then in steps:
        dev.apply_delta(delta)
        out, counts = dev.launch(plan, config=config)
        check_match(dev, prof, (out[0], counts.copy_to_host()[0]), rules=rules_then)
    with pytest.raises(RuntimeError):
        dev.apply_delta(steps[0][0])  # a delta applies once, in order


def test_bits_written_are_the_bits_that_change():
    rules = TargetingRules.from_records(SCHEMA, [{"ad_id": i} for i in range(200)])
    host = TargetingIndex(rules, group_max=1, dense_min=1)
    # one ad starts including one of age's 7 values: the other 6 allows rows and the "no value" row
    # flip for it, no more
    delta = host.apply(UpdateBatch.from_records(SCHEMA, [{"op": "change", "ad_id": 17, "include": {"age": [3]}}]))
    assert delta.bits_changed == 7 and delta.list_pos.size == 0
    # changing it back flips the same 7 bits back
    delta = host.apply(UpdateBatch.from_records(SCHEMA, [{"op": "change", "ad_id": 17}]))
    assert delta.bits_changed == 7
    # a listed (sparse) value: one list entry written, the unconstrained bit flips
    sparse = TargetingIndex(rules, dense_min=10**9)
    delta = sparse.apply(UpdateBatch.from_records(SCHEMA, [{"op": "change", "ad_id": 5, "include": {"interest": [9]}}]))
    assert delta.bits_changed == 1 and delta.list_pos.size == 1
    sparse.assert_same(sparse.rebuild())


def test_lists_compact_and_move_under_churn(rng):
    """Many adds and removes on a few listed values: lists grow past their capacity (moved to a
    larger region) and shrink below half live (compacted in place); they still equal a rebuild."""
    rules = TargetingRules.from_records(SCHEMA, [{"ad_id": i, "include": {"interest": [i % 3]}} for i in range(60)])
    host = TargetingIndex(rules, capacity=300, dense_min=10**9)
    dev = DeviceTargetingIndex(host, host_bits=True)
    alive, next_id = list(range(60)), 1000
    for k in range(6):
        recs = [{"op": "create", "ad_id": next_id + j, "include": {"interest": [j % 2]}} for j in range(30)]
        next_id += 30
        for ad in rng.choice(alive, 25, replace=False).tolist():
            recs.append({"op": "retire", "ad_id": ad})
            alive.remove(ad)
        alive += [r["ad_id"] for r in recs if r["op"] == "create"]
        dev.apply(UpdateBatch.from_records(SCHEMA, recs))
    check_state(host, dev, rng)


def test_dropped_host_bits_refuse_host_bit_methods(rng):
    rules = random_rules(rng, 40, schema=SCHEMA)
    host = TargetingIndex(rules)
    dev = DeviceTargetingIndex(host, host_bits=False)
    assert not host.host_bits and dev.rows.shape == (host.n_rows, host.n_words)
    for call in (lambda: host.match_cpu({}), lambda: host.assert_same(host.rebuild())):
        with pytest.raises(RuntimeError, match="drop_host_bits"):
            call()
    # a second device copy takes its rows from a rebuild, after updates the device worked out
    dev.apply(UpdateBatch.from_records(SCHEMA, [{"op": "retire", "ad_id": int(rules.ad_ids[3])},
                                                {"op": "change", "ad_id": int(rules.ad_ids[5]), "include": {"age": [2]}}]))
    again = DeviceTargetingIndex(host)
    np.testing.assert_array_equal(again.rows.copy_to_host(), dev.rows.copy_to_host())


def test_auto_host_bits_last_until_the_first_update(rng):
    """``host_bits="auto"`` (the default): the host keeps its rows (CPU match works) until the first
    update; from then the device works out the bits and the popcounts, equal to a rebuild's."""
    rules = random_rules(rng, 70, schema=SCHEMA)
    host = TargetingIndex(rules, capacity=80, dense_min=2, exclude_dense_min=3, group_max=16)
    dev = DeviceTargetingIndex(host)
    host.match_cpu({})
    ids = rules.ad_ids.tolist()
    dev.apply(UpdateBatch.from_records(SCHEMA, [
        {"op": "retire", "ad_id": ids[0]}, {"op": "create", "ad_id": 10**6, "include": {"age": [1, 4]}},
        {"op": "change", "ad_id": ids[1], "live": False}, {"op": "change", "ad_id": ids[2], "exclude": {"age": [0]}}]))
    assert not host.host_bits
    ref = host.rebuild()
    rows, pool = dev.snapshot()
    host.assert_same(ref, bitsets=rows, pool=pool)  # rows, device popcounts, lists, rules
    check_match(dev, {}, match_eligible(dev, {}), rules=host.current_rules())


def test_distinct_batches_take_the_slots_the_general_path_gives(rng):
    """A batch of distinct ad ids is allocated by the compiled pass: each op's slot, the free list
    and the id map come out as the general path's (a create reuses the slot the batch's last
    retire freed before a free one), and its failures raise the general path's errors."""
    rules = random_rules(rng, 50, schema=SCHEMA)
    ids = rules.ad_ids.tolist()
    a, b = TargetingIndex(rules, capacity=70), TargetingIndex(rules, capacity=70)
    for step in range(3):
        olds = rng.choice(ids, 8, replace=False).tolist()
        recs = ([{"op": "retire", "ad_id": x} for x in olds[:3]] + [{"op": "change", "ad_id": x} for x in olds[3:]]
                + [{"op": "create", "ad_id": 10**6 + 10 * step + j} for j in range(5)])
        order = rng.permutation(len(recs))
        batch = UpdateBatch.from_records(SCHEMA, [recs[i] for i in order])
        got = a._slots_of_ops(batch, list(a._free))
        pending, final, op_slots, n_popped, pushed = b._allocate(batch, list(b._free))
        np.testing.assert_array_equal(got[0], op_slots)
        assert (got[1], got[2]) == (n_popped, pushed)
        assert dict(zip(*(x.tolist() for x in got[5]))) == {k: v for k, v in pending.items() if v is not None}
        assert dict(zip(got[3].tolist(), got[4].tolist())) == final
        a.apply(batch), b.apply(batch)
        ids = [x for x in ids if x not in olds[:3]] + [r["ad_id"] for r in recs if r["op"] == "create"]
    a.assert_same(b)
    for bad, msg in (({"op": "create", "ad_id": ids[0]}, "already exists"), ({"op": "retire", "ad_id": 42424242},
                                                                              "unknown ad")):
        with pytest.raises(RuleError, match=msg):
            a.apply(UpdateBatch.from_records(SCHEMA, [{"op": "change", "ad_id": ids[1]}, bad]))
    full = [{"op": "create", "ad_id": 2 * 10**6 + j} for j in range(len(a._free) + 1)]
    with pytest.raises(RuleError, match="no free slot"):
        a.apply(UpdateBatch.from_records(SCHEMA, full))
    a.assert_same(b)  # the refused batches changed nothing


def test_rules_rewritten_many_times_stay_exact_through_the_overlays_compaction(rng):
    """The rules updates write live in an arena that is compacted once more than half of it is
    dead: rewriting a few ads' wide rules many times (past its first 2^16 codes) keeps every rule
    and the index equal to a rebuild."""
    rules = random_rules(rng, 40, schema=SCHEMA)
    host = TargetingIndex(rules, capacity=48)
    ids = rules.ad_ids.tolist()
    for step in range(60):  # 40 ads x 35 codes a batch: past 2^16 codes at the 47th
        recs = [{"op": "change", "ad_id": ad, "include": {"interest": sorted(rng.choice(30, 25, replace=False).tolist()),
                                                          "audience": sorted(rng.choice(12, 9, replace=False).tolist())},
                 "exclude": {"age": [int(rng.integers(7))]}} for ad in ids]
        host.apply(UpdateBatch.from_records(SCHEMA, recs))
        if step in (0, 59):
            host.assert_same(host.rebuild())  # bits flipped from the old rules the overlay returned
    assert host._ov_held == 40 * 35 and host._ov_used < 60 * 40 * 35  # compacted: the dead codes went
    got = host.rules_of_slots(np.array([host.slot_of(ad) for ad in ids]))
    for i, r in enumerate(recs):
        p, v = got.include["interest"]
        assert v[p[i]:p[i + 1]].tolist() == r["include"]["interest"]
        p, v = got.exclude["age"]
        assert v[p[i]:p[i + 1]].tolist() == r["exclude"]["age"]


def test_flip_grid_stays_within_cudas_second_dimension():
    from andromeda_nb.match.api import flip_grid

    assert flip_grid(1473, 10_000, 128) == ((12, 625), 16)
    for n in (65535 * 16, 65535 * 16 + 1, 3 * 10**6, 10**8):
        (gx, gy), per = flip_grid(1473, n, 128)
        assert gy <= 65535 and gy * per >= n and (gy - 1) * per < n


def test_popcounts_follow_two_device_copies_and_a_device_less_batch(rng):
    """Row popcounts count each batch once: two device copies of one index applying the same
    delta, and a batch applied on a host without rows and without a device copy (a device copy
    made later takes a rebuild's counts)."""
    rules = random_rules(rng, 30, schema=SCHEMA)
    ids = rules.ad_ids.tolist()
    batch = UpdateBatch.from_records(SCHEMA, [{"op": "retire", "ad_id": ids[0]},
                                              {"op": "change", "ad_id": ids[1], "include": {"age": [2]}},
                                              {"op": "create", "ad_id": 10**6, "exclude": {"age": [1]}}])
    host = TargetingIndex(rules, capacity=40)
    both, auto = DeviceTargetingIndex(host, host_bits=True), DeviceTargetingIndex(host)
    delta = auto.apply(batch)  # the host drops its rows: the delta carries rules, both copies flip
    both.apply_delta(delta)
    ref = host.rebuild()
    for dev in (auto, both):
        host.assert_same(ref, *dev.snapshot())  # rows, lists, popcounts
    alone = TargetingIndex(rules, capacity=40)
    alone.drop_host_bits()
    alone.apply(batch)
    dev = DeviceTargetingIndex(alone)
    dev.apply(UpdateBatch.from_records(SCHEMA, [{"op": "change", "ad_id": ids[2], "include": {"age": [3]}}]))
    alone.assert_same(alone.rebuild(), *dev.snapshot())


def test_host_bits_take_booleans_and_auto_only_and_a_refused_batch_keeps_the_rows(rng):
    rules = random_rules(rng, 12, schema=SCHEMA)
    for bad in (0, 1, 1.0, None, "yes", "AUTO"):
        with pytest.raises(ValueError, match="host_bits"):
            DeviceTargetingIndex(TargetingIndex(rules), host_bits=bad)
    host = TargetingIndex(rules)
    DeviceTargetingIndex(host, host_bits=np.False_)
    assert not host.host_bits
    host = TargetingIndex(rules, capacity=16)
    dev = DeviceTargetingIndex(host)
    with pytest.raises(RuleError, match="unknown ad"):
        dev.apply(UpdateBatch.from_records(SCHEMA, [{"op": "retire", "ad_id": 10**7}]))
    assert host.host_bits and host.version == 0  # refused: nothing changed, the rows stay
    dup = UpdateBatch.from_records(SCHEMA, [{"op": "create", "ad_id": 10**7}, {"op": "create", "ad_id": 10**7}])
    for call in (host.check, dev.apply):
        with pytest.raises(RuleError, match="created earlier in this batch"):
            call(dup)


@pytest.mark.parametrize("first_id", [0, 10 ** 12])
def test_the_id_map_follows_ids_past_its_table_and_sparse_ids(rng, first_id):
    """The ad id -> slot map (a direct table while the ids are dense, grown by doubling; once an id
    lands far past it, or from the build on, the build's sorted ids and a dict of moved ids) gives
    every held ad's slot and None for any other id, through creates past the table, far past it,
    retires, slot reuse and changes; the index equals a rebuild throughout."""
    from ..helpers import random_rule

    recs = [{"ad_id": first_id + 3 * i, "live": True, **random_rule(rng, SCHEMA)} for i in range(40)]
    index = TargetingIndex(TargetingRules.from_records(SCHEMA, recs), capacity=60)
    held = {r["ad_id"] for r in recs}
    gone = set()

    def step(records):
        index.apply(UpdateBatch.from_records(SCHEMA, records))
        for r in records:
            (held.discard if r["op"] == "retire" else held.add)(r["ad_id"])
            (gone.add if r["op"] == "retire" else gone.discard)(r["ad_id"])
        slot_ids = {int(a): s for s, a in enumerate(index.ad_ids) if a >= 0}
        assert set(slot_ids) == held
        assert all(index.slot_of(a) == s for a, s in slot_ids.items())
        assert all(index.slot_of(a) is None for a in gone | {first_id + 1, first_id + 10 ** 6, 2 ** 62, 2 ** 64, -1})
        for bad in (3.0, "3", True, None):
            with pytest.raises(TypeError, match="ad_id"):
                index.slot_of(bad)
        index.assert_same(index.rebuild())

    near = first_id + 5000  # past the smallest table (1024 ids), within the dense span: the table grows
    step([{"op": "create", "ad_id": near + j, **random_rule(rng, SCHEMA)} for j in range(3)]
         + [{"op": "retire", "ad_id": first_id}])
    assert (index._slot_by_id is None) == (first_id > 0)
    # ids up to the span (4 x 60 slots + 2^16) stay in the table, however it doubles
    span = 4 * 60 + (1 << 16)
    step([{"op": "create", "ad_id": first_id + span // 2, **random_rule(rng, SCHEMA)}])
    step([{"op": "create", "ad_id": first_id + span - 1, **random_rule(rng, SCHEMA)}])
    assert (index._slot_by_id is None) == (first_id > 0)
    step([{"op": "create", "ad_id": first_id + 10 ** 9, **random_rule(rng, SCHEMA)},  # far: the map turns sparse
          {"op": "retire", "ad_id": near}, {"op": "create", "ad_id": first_id, **random_rule(rng, SCHEMA)}])
    assert index._slot_by_id is None
    olds = rng.choice(sorted(held), 6, replace=False).tolist()
    step([{"op": "retire", "ad_id": a} for a in olds[:3]]
         + [{"op": "change", "ad_id": a, **random_rule(rng, SCHEMA)} for a in olds[3:]]
         + [{"op": "create", "ad_id": a, **random_rule(rng, SCHEMA)} for a in olds[:2]])  # back, in reused slots


def test_the_rules_held_slot_by_slot_are_the_columns_rules(rng):
    """An update reads old rules from the build's rules held slot by slot (made at the first
    update): the same codes, slot for slot, as the per-category columns give (free slots past
    the build and repeated slots included)."""
    index = TargetingIndex(random_rules(rng, 70, schema=SCHEMA), capacity=90)
    slots = rng.integers(0, 90, 200)
    want = index._rule_codes(slots)
    assert index._base_by_slot is None  # a read-only index never makes it
    index._hold_base_by_slot()
    got = index._rule_codes(slots)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    assert np.diff(want[0]).sum() > 0


@pytest.mark.parametrize("seed", range(3))
def test_list_ops_keep_every_list_whatever_the_thread_split(seed):
    """update_kernels.list_ops on random adds and removes of a few small lists (sizes off 32, so
    lists compact, move past their region and come back; one list's many ops in a row): every
    list holds exactly its live slots, its sorted head is sorted, every pool position that changed
    lies in a returned dirty range, and 1, 2 or 5 parallel parts give the same pool bit for bit."""
    from andromeda_nb.targeting.update_kernels import decode, list_ops

    rng = np.random.default_rng(seed)
    n_lists, n_ops = 7, 600
    start = np.arange(n_lists, dtype=np.int64) * 16
    contents = [sorted(rng.choice(10_000, int(rng.integers(0, 9)), replace=False).tolist()) for _ in range(n_lists)]
    pool0 = np.full(1 << 16, -1, np.int64)
    for lid, c in enumerate(contents):
        pool0[start[lid]:start[lid] + len(c)] = c
    lens = np.array([len(c) for c in contents], np.int64)
    state0 = dict(l_start=start, l_len=lens, l_cap=np.full(n_lists, 16, np.int64), l_live=lens.copy(),
                  l_sorted=lens.copy(), pool=pool0, used=np.array([16 * n_lists], np.int64))
    live = [set(c) for c in contents]
    ops = np.zeros((n_ops, 3), np.int64)
    for i in range(n_ops):
        lid = int(rng.integers(0, n_lists)) if i % 100 else 3  # op 0, 100, ...: list 3; and a run of it below
        lid = 5 if 300 <= i < 360 else lid
        if live[lid] and rng.random() < (0.3 if i < 400 else 0.9):  # lists grow past 32, then compact
            s = int(rng.choice(sorted(live[lid])))
            live[lid].remove(s)
            ops[i] = lid, s, -1
        else:
            s = int(rng.integers(0, 10_000))
            while s in live[lid]:
                s = int(rng.integers(0, 10_000))
            live[lid].add(s)
            ops[i] = lid, s, 1
    results = []
    for n_parts in (1, 2, 5):
        st_ = {k: v.copy() for k, v in state0.items()}
        dirty = np.empty((2 * n_ops + 1, 2), np.int64)
        nd = list_ops(ops, st_["l_start"], st_["l_len"], st_["l_cap"], st_["l_live"], st_["l_sorted"], st_["pool"],
                      st_["used"], dirty, n_parts)
        assert nd > 0
        pool = st_["pool"]
        for lid in range(n_lists):
            seg = pool[st_["l_start"][lid]:st_["l_start"][lid] + st_["l_len"][lid]]
            assert sorted(seg[seg >= 0].tolist()) == sorted(live[lid]), (n_parts, lid)
            assert st_["l_live"][lid] == len(live[lid]) and st_["l_len"][lid] <= st_["l_cap"][lid]
            head = [decode(v) for v in seg[:st_["l_sorted"][lid]]]
            assert head == sorted(head)
        covered = np.zeros(pool.size, bool)
        for a, n in dirty[:nd]:
            covered[a:a + n] = True
        assert not (pool != pool0)[~covered].any()
        assert st_["used"][0] > 16 * n_lists  # some list moved
        results.append(st_)
    for other in results[1:]:
        for k in state0:
            np.testing.assert_array_equal(other[k], results[0][k], err_msg=k)


def test_rule_codes_changed_after_the_batch_was_built_are_refused():
    """A batch's codes written after it was built (negative, another category, a value past the
    category, unsorted or repeated within an op) are refused by check and apply, naming the op's
    ad, and the index is left as it was; the same codes sorted again pass."""
    rules = TargetingRules.from_records(SCHEMA, [{"ad_id": i, "include": {"age": [i % 7]}} for i in range(20)])
    index = TargetingIndex(rules, 40)
    recs = [{"op": "create", "ad_id": 100 + i, "include": {"age": [1, 3], "interest": [2, 9, 29]},
             "exclude": {"country": [4]}} for i in range(5)] + [{"op": "retire", "ad_id": 3}]
    batch = UpdateBatch.from_records(SCHEMA, recs)
    index.check(batch)
    n_cat = len(SCHEMA)
    at = int(batch.codes_ptr[3])  # op 3's first code (ad 103)
    for name, change in (("negative", lambda c: -1), ("category", lambda c: (n_cat << 33) | 1),
                         ("value", lambda c: (c & ~0xFFFFFFFF) | 7), ("repeated", None), ("unsorted", "swap")):
        b = UpdateBatch.from_records(SCHEMA, recs)
        if change is None:
            b.codes[at + 1] = b.codes[at]
        elif change == "swap":
            b.codes[at], b.codes[at + 1] = b.codes[at + 1], b.codes[at]
        else:
            b.codes[at] = change(b.codes[at])
        for run in (index.check, index.apply):
            with pytest.raises(RuleError, match="^ad 103: its rule codes were changed"):
                run(b)
        assert index.version == 0 and index.slot_of(103) is None, name
    b = UpdateBatch.from_records(SCHEMA, recs)
    b.codes[at + 1], b.codes[at] = b.codes[at], b.codes[at + 1]
    b.codes[at:int(b.codes_ptr[4])].sort()
    index.apply(b)
    assert index.slot_of(103) is not None and index.slot_of(3) is None


def test_order_by_slot_is_lexsort_by_slot_then_op(rng):
    """index_updates.order_by_slot: ops by slot, then op order, as np.lexsort, slots repeated or
    not; keys past int64 (huge slots, negative ones) take the lexsort itself."""
    from andromeda_nb.targeting.index_updates import order_by_slot

    for slots in (rng.integers(0, 50, 997), rng.integers(0, 1 << 40, 3000), np.array([], np.int64),
                  np.array([1 << 61, 3, 1 << 61, 0]), np.array([4, -1, 4, -1])):
        np.testing.assert_array_equal(order_by_slot(slots), np.lexsort((np.arange(slots.size), slots)))
