"""Bitset targeting match against the rule-set oracle."""

import numpy as np
import pytest

from andromeda_nb import oracle
from andromeda_nb.match import DeviceTargetingIndex, match_eligible
from andromeda_nb.targeting import (Category, TargetingIndex, TargetingRules, TargetingSchema,
                                    bits_from_mask, make_profile, mask_from_bits)

from .helpers import random_profile, random_rules, random_schema


@pytest.mark.parametrize("n", [1, 63, 64, 65, 127, 128, 200, 1000])
def test_match_equals_oracle(rng, n):
    rules = random_rules(rng, n)
    index = DeviceTargetingIndex(TargetingIndex(rules))
    for _ in range(4):
        prof = random_profile(rng, rules.schema)
        want = oracle.match(rules, make_profile(rules.schema, prof))
        got = match_eligible(index, prof)
        words = got.words.copy_to_host()
        np.testing.assert_array_equal(mask_from_bits(words, n), want)
        assert got.count == want.sum()
        if n % 64:
            assert int(words[-1]) >> (n % 64) == 0, "padding bits must never match"


def test_dense_and_empty_extremes(rng):
    schema = random_schema()
    n = 150
    # nobody constrains anything: every live ad matches every profile, even an empty one
    free = TargetingRules.from_records(schema, [{"ad_id": i, "live": i % 7 != 0} for i in range(n)])
    got = match_eligible(DeviceTargetingIndex(TargetingIndex(free)), {})
    np.testing.assert_array_equal(got.to_mask(), np.arange(n) % 7 != 0)
    # everybody excludes the user's value: nothing matches
    recs = [{"ad_id": i, "exclude": {"interest": [3]}} for i in range(n)]
    none = TargetingRules.from_records(schema, recs)
    got = match_eligible(DeviceTargetingIndex(TargetingIndex(none)), {"interest": [3, 4]})
    assert got.count == 0 and not got.to_mask().any()
    # the user without values for a single-valued category fails that category's includes only
    recs = [{"ad_id": 0, "include": {"age": [2]}}, {"ad_id": 1, "exclude": {"age": [2]}}, {"ad_id": 2}]
    r = TargetingRules.from_records(schema, recs)
    assert match_eligible(DeviceTargetingIndex(TargetingIndex(r)), {}).to_mask().tolist() == [False, True, True]


def test_exclude_slots_clear_bits_and_count(rng):
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


def test_bitset_roundtrip(rng):
    for n in (0, 1, 63, 64, 65, 1000):
        mask = rng.random(n) < 0.5
        words = bits_from_mask(mask)
        assert words.dtype == np.uint64 and words.size == (n + 63) // 64
        np.testing.assert_array_equal(mask_from_bits(words, n), mask)


def test_index_skips_unconstrained_categories_and_orders_by_selectivity(rng):
    schema = TargetingSchema([Category("a", 3), Category("b", 4), Category("c", 5, multi_valued=True)])
    recs = [{"ad_id": i, "include": {"b": [i % 4]}} for i in range(100)]
    index = TargetingIndex(TargetingRules.from_records(schema, recs))
    plan = index.plan(make_profile(schema, {"a": 1, "b": 2, "c": [1]}))
    assert plan.n_categories == 1  # only b constrains anything
    assert plan.rows_read == 2  # live + one folded "allows" row
