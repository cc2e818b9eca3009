"""Bitset targeting match (device kernels and the CPU baseline) against the rule-set oracle."""

import numpy as np
import pytest

import andromeda_nb.match.api as M
from andromeda_nb import reference
from andromeda_nb.match.api import (DeviceTargetingIndex, Eligible, compact, match_batch, match_cpu, match_eligible,
                                read_model)
from andromeda_nb.targeting import (Category, TargetingIndex, TargetingRules, TargetingSchema, bits_from_mask,
                                    make_profile, mask_from_bits)

from ..helpers import random_profile, random_rules, random_schema

# (dense_min, exclude_dense_min, group_max): all lists, all rows, mixed, one folded row per category
LAYOUTS = [(10**9, 10**9, 512), (1, 1, 512), (3, 2, 64), (2, 10**9, 1)]


@pytest.mark.parametrize("n", [1, 31, 32, 33, 63, 64, 65, 127, 128, 200, 1000, 4101])
def test_match_equals_oracle(rng, n, monkeypatch):
    dense_min, xmin, gmax = LAYOUTS[n % len(LAYOUTS)]
    rules = random_rules(rng, n)
    host = TargetingIndex(rules, dense_min=dense_min, exclude_dense_min=xmin, group_max=gmax)
    index = DeviceTargetingIndex(host)
    shapes = [(1, False, 0), (2, False, 0), (4, False, 0), (8, False, 0), (16, False, 0), (1, True, 0),
              (4, True, 0), (1, False, 1), (2, False, 3), (4, False, 4), (8, False, 2), (1, False, 64)]
    for i, (U, prefetch, group) in enumerate(shapes):
        monkeypatch.setattr(M, "LIST_KERNELS", ("search", "segment")[i % 2])  # both list-pass variants
        prof = random_profile(rng, rules.schema)
        want = reference.match(rules, make_profile(rules.schema, prof))
        prepared = index.prepare([prof])
        out, counts = index.launch(prepared, words_per_thread=U, prefetch=prefetch, group=group)
        got = Eligible(words=out[0], n_ads=index.n_ads, _count=counts, _keep=prepared)
        words = got.words.copy_to_host()
        np.testing.assert_array_equal(mask_from_bits(words, n), want)
        assert got.count == want.sum()
        if n % 64:
            assert int(words[-1]) >> (n % 64) == 0, "padding bits must never match"
        cpu_words, cpu_count = match_cpu(host, prof)
        np.testing.assert_array_equal(cpu_words, words)
        assert cpu_count == want.sum()


def test_every_layout_on_one_pool(rng):
    rules = random_rules(rng, 300, p_constrain=0.5, p_exclude=0.3)
    profiles = [random_profile(rng, rules.schema) for _ in range(3)]
    for dense_min, xmin, gmax in LAYOUTS:
        index = DeviceTargetingIndex(TargetingIndex(rules, dense_min=dense_min, exclude_dense_min=xmin,
                                                    group_max=gmax))
        for prof in profiles:
            want = reference.match(rules, make_profile(rules.schema, prof))
            np.testing.assert_array_equal(match_eligible(index, prof).to_mask(), want)


def test_dense_and_empty_extremes(rng):
    schema = random_schema()
    n = 150
    # nobody constrains anything: every live ad matches every profile, even an empty one
    free = TargetingRules.from_records(schema, [{"ad_id": i, "live": i % 7 != 0} for i in range(n)])
    got = match_eligible(DeviceTargetingIndex(TargetingIndex(free)), {})
    np.testing.assert_array_equal(got.to_mask(), np.arange(n) % 7 != 0)
    # everybody excludes the user's value: nothing matches (as a list, then as a dense row)
    recs = [{"ad_id": i, "exclude": {"interest": [3]}} for i in range(n)]
    none = TargetingRules.from_records(schema, recs)
    for xmin in (None, 1):
        got = match_eligible(DeviceTargetingIndex(TargetingIndex(none, exclude_dense_min=xmin)), {"interest": [3, 4]})
        assert got.count == 0 and not got.to_mask().any()
    # the user without values fails includes only, in folded and split categories
    recs = [{"ad_id": 0, "include": {"age": [2]}}, {"ad_id": 1, "exclude": {"age": [2]}}, {"ad_id": 2},
            {"ad_id": 3, "include": {"interest": [1]}}, {"ad_id": 4, "exclude": {"interest": [1]}}]
    r = TargetingRules.from_records(schema, recs)
    for dm in (1, None):
        got = match_eligible(DeviceTargetingIndex(TargetingIndex(r, dense_min=dm)), {}).to_mask()
        assert got.tolist() == [False, True, True, False, True]


def test_padding_never_matches_after_not(rng):
    """Only exclusions (NOT / ANDNOT of sparse rows): the last word's padding stays clear."""
    schema = random_schema()
    for n in (1, 33, 65, 100):
        recs = [{"ad_id": i, "exclude": {"interest": [i % 3], "age": [i % 2]}} for i in range(n)]
        rules = TargetingRules.from_records(schema, recs)
        for xmin in (1, None):
            got = match_eligible(DeviceTargetingIndex(TargetingIndex(rules, exclude_dense_min=xmin)),
                                 {"interest": [5], "age": 6})
            words = got.words.copy_to_host()
            assert got.count == n
            if n % 64:
                assert int(words[-1]) >> (n % 64) == 0


@pytest.mark.parametrize("list_kernels", ["search", "segment"])
def test_exclude_slots_clear_bits_and_count(rng, list_kernels, monkeypatch):
    monkeypatch.setattr(M, "LIST_KERNELS", list_kernels)
    rules = random_rules(rng, 300, p_constrain=0.1, p_exclude=0.0, live_p=1.0)
    index = DeviceTargetingIndex(TargetingIndex(rules))
    prof = random_profile(rng, rules.schema)
    base = match_eligible(index, prof).to_mask()
    drop = rng.choice(300, 40, replace=False)
    got = match_eligible(index, prof, exclude_slots=np.concatenate([drop, drop[:5]]))  # duplicates harmless
    want = base.copy()
    want[drop] = False
    np.testing.assert_array_equal(got.to_mask(), want)
    assert got.count == want.sum()
    with pytest.raises(ValueError, match="0..299"):
        match_eligible(index, prof, exclude_slots=[300])


@pytest.mark.parametrize("list_kernels", ["search", "segment"])
def test_batch_equals_single_requests(rng, list_kernels, monkeypatch):
    monkeypatch.setattr(M, "LIST_KERNELS", list_kernels)
    rules = random_rules(rng, 250)
    index = DeviceTargetingIndex(TargetingIndex(rules, dense_min=2))
    profiles = [random_profile(rng, rules.schema) for _ in range(5)]
    excl = [None, rng.choice(250, 10, replace=False), None, [0, 1, 2], None]
    batch = match_batch(index, profiles, exclude_slots=excl)
    masks = batch.to_masks()
    for b, prof in enumerate(profiles):
        single = match_eligible(index, prof, exclude_slots=excl[b])
        np.testing.assert_array_equal(masks[b], single.to_mask())
        assert batch.counts[b] == single.count == batch[b].count
    with pytest.raises(ValueError, match="at least one"):
        match_batch(index, [])


def test_candidates_are_the_eligible_slots(rng):
    rules = random_rules(rng, 700, p_constrain=0.2)
    index = DeviceTargetingIndex(TargetingIndex(rules))
    prof = random_profile(rng, rules.schema)
    elig = match_eligible(index, prof)
    want = np.flatnonzero(elig.to_mask())
    cand = elig.candidates()
    assert cand.dtype == np.int32
    np.testing.assert_array_equal(cand.copy_to_host(), want)
    np.testing.assert_array_equal(elig.candidates(np.int64).copy_to_host(), want)
    with pytest.raises(ValueError, match="int64"):
        compact(elig.words, 1 << 32, elig.count, np.int32)


def test_plan_groups_folds_live_and_skips_unconstrained():
    schema = TargetingSchema([Category("a", 3), Category("b", 4), Category("c", 5, multi_valued=True)])
    recs = [{"ad_id": i, "include": {"b": [i % 4]}} for i in range(100)]
    rules = TargetingRules.from_records(schema, recs)
    index = TargetingIndex(rules)
    plan = index.plan(make_profile(schema, {"a": 1, "b": 2, "c": [1]}))
    assert plan.categories == ("a+b",)  # one folded group (live folded in); c constrains nothing
    assert plan.rows_read == 1
    per_cat = TargetingIndex(rules, group_max=1).plan(make_profile(schema, {"a": 1, "b": 2}))
    assert per_cat.rows_read == 2 and set(per_cat.categories) == {"a", "b"}  # a: the live carrier
    assert per_cat.categories[0] == "b"  # most selective first: b passes a quarter of the ads


def test_read_model_counts_sectors(rng):
    schema = TargetingSchema([Category("a", 2), Category("b", 2)])
    n = 64 * 9  # 9 words: 3 sectors per row (the last one partial)
    recs = [{"ad_id": i, "include": {"a": [0]} if i < 64 * 4 else {}} for i in range(n)]
    index = TargetingIndex(TargetingRules.from_records(schema, recs), group_max=1)
    plan = index.plan(make_profile(schema, {"a": 1, "b": 0}))
    model = read_model(index, plan)
    # b (unconstrained: skipped). a = 1: words 0-3 all zero, so the carrier row is read fully
    assert model["row_sectors"] == 3 and model["write_bytes"] == 8 * 9
    assert model["bits_per_ad"] == pytest.approx(8 * 96 / n)


def test_bitset_roundtrip(rng):
    for n in (0, 1, 63, 64, 65, 1000):
        mask = rng.random(n) < 0.5
        words = bits_from_mask(mask)
        assert words.dtype == np.uint64 and words.size == (n + 63) // 64
        np.testing.assert_array_equal(mask_from_bits(words, n), mask)


def test_stale_device_copy_and_prepared_batch_raise(rng):
    from andromeda_nb.targeting import UpdateBatch

    rules = random_rules(rng, 50)
    host = TargetingIndex(rules, capacity=60)
    dev = DeviceTargetingIndex(host)
    prep = dev.prepare([{}])
    other = DeviceTargetingIndex(host)
    other.apply(UpdateBatch.from_records(rules.schema, [{"op": "create", "ad_id": 10**6}]))
    with pytest.raises(RuntimeError, match="has not applied"):
        match_eligible(dev, {})
    with pytest.raises(RuntimeError, match="prepare it again"):
        other.launch(prep)


def test_empty_pool_matches_nothing():
    schema = random_schema()
    for capacity in (None, 10):
        index = DeviceTargetingIndex(TargetingIndex(TargetingRules.from_records(schema, []), capacity=capacity))
        got = match_eligible(index, {})
        assert got.count == 0 and not got.to_mask().any()
        batch = match_batch(index, [{}, {}])
        assert list(batch.counts) == [0, 0]


def test_read_model_counts_prefetched_rows():
    """The prefetch kernel reads the next category's first row for the words alive *before* the
    current category: here the first category kills sector 0, which the plain kernel then skips
    in the second category's row and the prefetch kernel has already read."""
    schema = TargetingSchema([Category("a", 2), Category("b", 2)])
    n = 64 * 9  # 9 words: 3 sectors per row (the last one partial)
    recs = [{"ad_id": i, "include": {"a": [0], "b": [0]} if i < 64 * 4 else {}} for i in range(n)]
    index = TargetingIndex(TargetingRules.from_records(schema, recs), group_max=1)
    plan = index.plan(make_profile(schema, {"a": 1, "b": 1}))
    assert plan.n_categories == 2
    assert read_model(index, plan)["row_sectors"] == 3 + 2
    assert read_model(index, plan, prefetch=True)["row_sectors"] == 3 + 3


def test_plan_ops_flags_each_category():
    """The grouped kernel's flat op list: first / last include row of each category flagged, an
    empty include set one ZERO op (its excludes dropped), excludes after their category's includes."""
    from andromeda_nb.match.kernels import OP_CLOSE, OP_EXC, OP_FIRST, OP_ZERO
    from andromeda_nb.match.api import plan_ops

    inc_ptr = np.array([0, 1, 4, 4, 6])
    inc_rows = np.array([10, 11, 12, 13, 14, 15])
    exc_ptr = np.array([0, 0, 1, 2, 3])
    exc_rows = np.array([20, 21, 22])
    rows, kinds = plan_ops(inc_ptr, inc_rows, exc_ptr, exc_rows)
    assert rows.tolist() == [10, 11, 12, 13, 20, 0, 14, 15, 22]
    assert kinds.tolist() == [OP_FIRST | OP_CLOSE, OP_FIRST, 0, OP_CLOSE, OP_EXC, OP_ZERO, OP_FIRST, OP_CLOSE, OP_EXC]


@pytest.mark.parametrize("group", [1, 2, 3, 5])
def test_grouped_match_batch_equals_oracle(rng, group):
    """Several requests in one grouped launch (grid.y = request), a group size that does and does
    not divide the requests' op counts, against the oracle and the plain kernel."""
    n = 777
    rules = random_rules(rng, n, p_constrain=0.5, p_exclude=0.3)
    index = DeviceTargetingIndex(TargetingIndex(rules, dense_min=3, exclude_dense_min=2, group_max=64))
    profiles = [random_profile(rng, rules.schema) for _ in range(5)] + [{}]
    prepared = index.prepare(profiles)
    out, counts = index.launch(prepared, words_per_thread=2, group=group)
    words, got_counts = out.copy_to_host(), counts.copy_to_host()
    plain, plain_counts = index.launch(index.prepare(profiles), group=0)
    np.testing.assert_array_equal(words, plain.copy_to_host())
    np.testing.assert_array_equal(got_counts, plain_counts.copy_to_host())
    for b, prof in enumerate(profiles):
        want = reference.match(rules, make_profile(rules.schema, prof))
        np.testing.assert_array_equal(mask_from_bits(words[b], n), want)
        assert got_counts[b] == want.sum()


def test_grouped_refuses_bad_group(rng):
    rules = random_rules(rng, 50)
    index = DeviceTargetingIndex(TargetingIndex(rules))
    prepared = index.prepare([{}])
    for bad in (-1, 2.5, 0.5, True, "2", 65, 2**40):
        with pytest.raises(ValueError, match="group must be an int"):
            index.launch(prepared, group=bad)
    for g in (1, 2):
        with pytest.raises(ValueError, match="exclude each other"):
            index.launch(prepared, group=g, prefetch=True)


def test_read_model_counts_grouped_rows():
    """The grouped kernel reads every row of a group for the words alive at the group's start:
    with both categories in one group, sector 0 (killed by the first category) is read in the
    second row too; with groups of one it is skipped, as by the plain kernel."""
    schema = TargetingSchema([Category("a", 2), Category("b", 2)])
    n = 64 * 9
    recs = [{"ad_id": i, "include": {"a": [0], "b": [0]} if i < 64 * 4 else {}} for i in range(n)]
    index = TargetingIndex(TargetingRules.from_records(schema, recs), group_max=1)
    plan = index.plan(make_profile(schema, {"a": 1, "b": 1}))
    assert read_model(index, plan, group=1)["row_sectors"] == 3 + 2
    assert read_model(index, plan, group=2)["row_sectors"] == 3 + 3
