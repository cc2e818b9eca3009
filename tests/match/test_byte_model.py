"""The byte model (match.byte_model.read_model): sectors read per kernel variant."""

import pytest

from andromeda_nb.match import MatchConfig, read_model
from andromeda_nb.targeting import Category, TargetingIndex, TargetingRules, TargetingSchema, make_profile

SCHEMA = TargetingSchema([Category("a", 2), Category("b", 2)])
N = 64 * 9  # 9 words: 3 sectors per row (the last one partial)


def two_categories(constrain_b: bool) -> TargetingIndex:
    """Ads 0..255 (words 0-3) include a = 0 (and b = 0); the rest are unconstrained."""
    inc = {"a": [0], "b": [0]} if constrain_b else {"a": [0]}
    recs = [{"ad_id": i, "include": inc if i < 64 * 4 else {}} for i in range(N)]
    return TargetingIndex(TargetingRules.from_records(SCHEMA, recs), group_max=1)


def test_read_model_counts_sectors():
    index = two_categories(constrain_b=False)
    plan = index.plan(make_profile(SCHEMA, {"a": 1, "b": 0}))
    model = read_model(index, plan)
    # b (unconstrained: skipped). a = 1: words 0-3 all zero, so the carrier row is read fully
    assert model["row_sectors"] == 3 and model["write_bytes"] == 8 * 9
    assert model["bits_per_ad"] == pytest.approx(8 * 96 / N)
    assert model["bytes"] == model["read_bytes"] + model["write_bytes"]


def test_read_model_counts_prefetched_rows():
    """The prefetch kernel reads the next category's first row for the words alive *before* the
    current category: here the first category kills sector 0, which the plain kernel then skips
    in the second category's row and the prefetch kernel has already read."""
    index = two_categories(constrain_b=True)
    plan = index.plan(make_profile(SCHEMA, {"a": 1, "b": 1}))
    assert plan.n_categories == 2
    assert read_model(index, plan)["row_sectors"] == 3 + 2
    assert read_model(index, plan, config=MatchConfig(prefetch=True))["row_sectors"] == 3 + 3


def test_read_model_counts_grouped_rows():
    """The grouped kernel reads every row of a group for the words alive at the group's start:
    with both categories in one group, sector 0 (killed by the first category) is read in the
    second row too; with groups of one it is skipped, as by the plain kernel."""
    index = two_categories(constrain_b=True)
    plan = index.plan(make_profile(SCHEMA, {"a": 1, "b": 1}))
    assert read_model(index, plan, config=MatchConfig(group=1))["row_sectors"] == 3 + 2
    assert read_model(index, plan, config=MatchConfig(group=2))["row_sectors"] == 3 + 3


def test_read_model_refuses_bad_input():
    index = two_categories(constrain_b=False)
    plan = index.plan(make_profile(SCHEMA, {}))
    with pytest.raises(TypeError, match="MatchConfig"):
        read_model(index, plan, config={"prefetch": True})
    with pytest.raises(TypeError, match="TargetingIndex"):
        read_model(plan, plan)
    index.drop_host_bits()
    with pytest.raises(RuntimeError, match="drop_host_bits"):
        read_model(index, plan)
