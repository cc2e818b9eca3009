"""Update batches: records, columns and JSON lines; malformed input raises naming the ad."""

import numpy as np
import pytest

from andromeda_nb.targeting import Category, RuleError, TargetingRules, TargetingSchema

SCHEMA = TargetingSchema([Category("age", 7), Category("interest", 30, multi_valued=True)])


def test_update_batch_columns_and_records():
    from andromeda_nb.targeting import CHANGE, CREATE, RETIRE, UpdateBatch

    recs = [{"op": "create", "ad_id": 3, "include": {"age": [2, 1]}, "exclude": {"interest": [7]}},
            {"op": "change", "ad_id": 3, "live": False},
            {"op": "retire", "ad_id": 3}]
    b = UpdateBatch.from_records(SCHEMA, recs)
    assert b.ops.tolist() == [CREATE, CHANGE, RETIRE] and len(b) == 3
    assert b.records()[0] == {"op": "create", "ad_id": 3, "live": True, "include": {"age": [1, 2]},
                              "exclude": {"interest": [7]}}
    assert b.records()[1]["live"] is False and b.records()[2] == {"op": "retire", "ad_id": 3}
    cols = UpdateBatch.from_columns(SCHEMA, ["create", "retire"], [1, 2],
                                    include={"age": (np.array([0, 1, 1]), np.array([6]))})
    assert cols.ops.tolist() == [CREATE, RETIRE] and cols.codes.size == 1
    with pytest.raises(RuleError, match="ad 2: a retire carries no rule"):
        UpdateBatch.from_columns(SCHEMA, ["create", "retire"], [1, 2],
                                 include={"age": (np.array([0, 0, 1]), np.array([6]))})
    with pytest.raises(RuleError, match="ad 2: unknown op"):
        UpdateBatch.from_columns(SCHEMA, [0, 7], [1, 2])
    with pytest.raises(RuleError, match="ad -4: ad_id must be non-negative"):
        UpdateBatch.from_columns(SCHEMA, [0], [-4])
    assert UpdateBatch.from_jsonl(SCHEMA, '{"op": "retire", "ad_id": 8}\n').ad_ids.tolist() == [8]


def test_update_batch_columns_reject_non_integer_ids():
    from andromeda_nb.targeting import UpdateBatch

    with pytest.raises(RuleError, match="ad_ids must be integers"):
        UpdateBatch.from_columns(SCHEMA, ["create"], np.array([5.7]))
    with pytest.raises(RuleError, match="ad_ids must be integers"):
        UpdateBatch.from_columns(SCHEMA, ["create"], np.array(["5"]))
    with pytest.raises(RuleError, match="ops must be a 1-D"):
        UpdateBatch.from_columns(SCHEMA, "create", 1)
    with pytest.raises(RuleError, match="ops must be a 1-D"):
        UpdateBatch.from_columns(SCHEMA, ["create", [1]], np.array([1, 2]))
    with pytest.raises(RuleError, match="not an op code or name"):
        UpdateBatch.from_columns(SCHEMA, np.array(["create", 1.5], dtype=object), np.array([1, 2]))
    with pytest.raises(RuleError, match=r"ad 3: unknown op -1\b"):
        UpdateBatch.from_columns(SCHEMA, np.array([0, -1]), np.array([2, 3]))
    with pytest.raises(RuleError, match="ad_id must be in 0..2"):
        TargetingRules.from_columns(SCHEMA, np.array([2**63 + 5], np.uint64))
