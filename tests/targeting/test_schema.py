"""Categories, schemas and user profiles: malformed input raises a clear error."""

import numpy as np
import pytest

from andromeda_nb.targeting import Category, RuleError, TargetingSchema, make_profile

SCHEMA = TargetingSchema([Category("age", 7), Category("interest", 30, multi_valued=True)])


def test_profiles():
    assert make_profile(SCHEMA, {"age": 3})["age"] == frozenset({3})
    assert make_profile(SCHEMA, {})["interest"] == frozenset()
    with pytest.raises(RuleError, match="single-valued"):
        make_profile(SCHEMA, {"age": [1, 2]})
    with pytest.raises(RuleError, match="out of range"):
        make_profile(SCHEMA, {"interest": [30]})
    with pytest.raises(RuleError, match="unknown category"):
        make_profile(SCHEMA, {"height": 1})


def test_category_limits():
    with pytest.raises(ValueError, match="cardinality"):
        Category("x", 0)
    with pytest.raises(ValueError, match="cardinality"):
        Category("x", 1 << 31)
    for bad in ("no", 1, None):  # a truthy string made the category multi-valued
        with pytest.raises(ValueError, match="multi_valued must be True or False"):
            Category("x", 3, multi_valued=bad)
    assert Category("x", 3, multi_valued=np.True_).multi_valued and not Category("x", 3).multi_valued


def test_schema_lookup_and_profile_forms():
    assert SCHEMA.index("interest") == 1 and SCHEMA["age"].cardinality == 7 and len(SCHEMA) == 2
    with pytest.raises(KeyError, match="unknown category"):
        SCHEMA.index("height")
    with pytest.raises(ValueError, match="duplicate"):
        TargetingSchema([Category("a", 2), Category("a", 3)])
    assert make_profile(SCHEMA, {"age": np.array(4), "interest": np.array([2, 2, 5])}) == {
        "age": frozenset({4}), "interest": frozenset({2, 5})}
    with pytest.raises(RuleError, match="profile must map"):
        make_profile(SCHEMA, [("age", 1)])
    with pytest.raises(RuleError, match="list of ints"):
        make_profile(SCHEMA, {"age": True})
    with pytest.raises(RuleError, match="not an integer"):
        make_profile(SCHEMA, {"interest": [True]})
