"""Rule and profile validation: malformed input raises a clear error naming the ad and category."""

import numpy as np
import pandas as pd
import pytest

from andromeda_nb.targeting import Category, RuleError, TargetingRules, TargetingSchema, make_profile

SCHEMA = TargetingSchema([Category("age", 7), Category("interest", 30, multi_valued=True)])


@pytest.mark.parametrize("record,msg", [
    ({"ad_id": 5, "include": {"planet": [1]}}, "ad 5.*unknown category 'planet'"),
    ({"ad_id": 5, "include": {"age": [7]}}, "ad 5.*'age'.*out of range 0..6"),
    ({"ad_id": 5, "exclude": {"interest": [-1]}}, "ad 5.*'interest'.*out of range"),
    ({"ad_id": 5, "include": {"age": "3"}}, "ad 5.*'age'.*list of ints"),
    ({"ad_id": 5, "include": {"age": [1.5]}}, "ad 5.*'age'.*not an integer"),
    ({"ad_id": 5, "include": {"age": [True]}}, "ad 5.*'age'.*not an integer"),
    ({"ad_id": 5, "include": [1, 2]}, "ad 5: include must map"),
    ({"ad_id": 5, "live": "yes"}, "ad 5: live must be a bool"),
    ({"ad_id": -2}, "ad_id must be a non-negative int"),
    ({"ad_id": "x"}, "ad_id must be a non-negative int"),
    ({"ad_id": 5, "color": 1}, "unknown fields"),
])
def test_bad_records(record, msg):
    with pytest.raises(RuleError, match=msg):
        TargetingRules.from_records(SCHEMA, [{"ad_id": 1}, record])


def test_duplicate_ad_id():
    with pytest.raises(RuleError, match="ad 3: duplicate"):
        TargetingRules.from_records(SCHEMA, [{"ad_id": 3}, {"ad_id": 3}])


def test_records_roundtrip_and_frame():
    recs = [{"ad_id": 9, "live": True, "include": {"age": [3, 1]}, "exclude": {"interest": [4, 4]}},
            {"ad_id": 2, "live": False, "include": {}, "exclude": {}}]
    rules = TargetingRules.from_records(SCHEMA, recs)
    assert rules.to_records() == [
        {"ad_id": 9, "live": True, "include": {"age": [1, 3]}, "exclude": {"interest": [4]}},
        {"ad_id": 2, "live": False, "include": {}, "exclude": {}},
    ]
    frame = pd.DataFrame({"ad_id": [9, 9, 9], "category": ["age", "age", "interest"],
                          "kind": ["include", "include", "exclude"], "value": [3, 1, 4]})
    from_frame = TargetingRules.from_frame(SCHEMA, frame, ad_ids=[9, 2])
    assert from_frame.to_records()[0] == rules.to_records()[0]
    with pytest.raises(RuleError, match="kind"):
        TargetingRules.from_frame(SCHEMA, frame.assign(kind="maybe"))


def test_from_columns_validation():
    ptr, vals = np.array([0, 1, 3]), np.array([2, 6, 6])
    ok = TargetingRules.from_columns(SCHEMA, [4, 8], include={"age": (ptr, vals)})
    assert ok.rule(1).include == {"age": frozenset({6})}  # de-duplicated
    with pytest.raises(RuleError, match="ad 8 \\(include\\), category 'age': value 9 out of range"):
        TargetingRules.from_columns(SCHEMA, [4, 8], include={"age": (ptr, np.array([2, 6, 9]))})
    with pytest.raises(RuleError, match="malformed indptr"):
        TargetingRules.from_columns(SCHEMA, [4, 8], include={"age": (np.array([0, 2, 1]), vals)})
    with pytest.raises(RuleError, match="duplicate"):
        TargetingRules.from_columns(SCHEMA, [4, 4])
    with pytest.raises(RuleError, match="unknown category"):
        TargetingRules.from_columns(SCHEMA, [4, 8], exclude={"zzz": (ptr, vals)})


def test_profiles():
    assert make_profile(SCHEMA, {"age": 3})["age"] == frozenset({3})
    assert make_profile(SCHEMA, {})["interest"] == frozenset()
    with pytest.raises(RuleError, match="single-valued"):
        make_profile(SCHEMA, {"age": [1, 2]})
    with pytest.raises(RuleError, match="out of range"):
        make_profile(SCHEMA, {"interest": [30]})
    with pytest.raises(RuleError, match="unknown category"):
        make_profile(SCHEMA, {"height": 1})
