"""Index layout decisions, memory accounting, reading order and the byte model on the benchmark world."""

import numpy as np
import pytest

from andromeda_nb.datasets import synthetic as syn
from andromeda_nb.match import read_model
from andromeda_nb.targeting import TargetingIndex, choose_layout

from ..match.helpers import check_match


@pytest.fixture(scope="module")
def world():
    schema = syn.benchmark_schema()
    rules = syn.generate_rules(schema, 20_000, seed=4)
    return schema, rules, TargetingIndex(rules, dense_min=40, exclude_dense_min=80)


def test_groups_of_the_benchmark_schema(world):
    schema, rules, index = world
    names = [[schema.categories[c].name for c in g] for g in choose_layout(rules).groups]
    # smallest cardinalities first, each group within 512 rows: (2,3,3,4) (6,8) (10,13) (17,22) ...
    assert names == [["s00", "s01", "s02", "s03"], ["s04", "s05"], ["s06", "s07"], ["s08", "s09"], ["s10"],
                     ["s11"], ["s12"], ["s13"]]
    assert [len(g) for g in choose_layout(rules, group_max=1).groups] == [1] * 14
    assert index.group_size[0] == 3 * 4 * 4 * 5
    assert index.layout.carrier == 4 and index.group_size[4] == 30  # the live bit: the smallest group (s10)


def test_memory_by_category(world):
    schema, rules, index = world
    mem = {m["unit"]: m for m in index.memory_by_category()}
    row = -(-index.n_ads // 64) * 8
    assert mem["s00+s01+s02+s03"]["rows"] == 240 and mem["s00+s01+s02+s03"]["row_bytes"] == 240 * row
    for name in ("m00", "h00"):
        ci = schema.index(name)
        assert mem[name]["rows"] == 1 + index.layout.dense_inc[ci].size + index.layout.dense_exc[ci].size
        # every (ad, value) pair of the category is either in a dense row or in a list
        n_pairs = rules.include[name][1].size + rules.exclude[name][1].size
        dense = np.isin(rules.include[name][1], index.layout.dense_inc[ci]).sum() + \
            np.isin(rules.exclude[name][1], index.layout.dense_exc[ci]).sum()
        assert mem[name]["list_entries"] == n_pairs - dense
    assert index.nbytes == index.bitsets.nbytes + int(index._pool_used[0]) * index.pool.itemsize
    big = {m["unit"]: m for m in index.memory_by_category(10**8)}
    assert big["h00"]["row_bytes"] == mem["h00"]["rows"] * 12_500_000
    assert big["h00"]["all_dense_bytes"] == (2 * 10_000 + 1) * 12_500_000


def test_reading_order_and_byte_model(world, rng):
    schema, rules, index = world
    for prof in syn.generate_profiles(schema, 5, seed=int(rng.integers(1000))):
        plan = index.plan(prof)
        assert list(plan.estimates) == sorted(plan.estimates)  # most selective first
        model = read_model(index, plan)
        per_row = -(-index.n_words // 4)
        assert model["row_sectors"] <= plan.rows_read * per_row
        assert model["bytes"] == model["read_bytes"] + model["write_bytes"]
        check_match(index, prof, index.match_cpu(prof), rules=rules)


def test_per_category_thresholds(world):
    schema, rules, _ = world
    lay = choose_layout(rules, dense_min={"h00": 10**9}, exclude_dense_min={"h00": 10**9})
    h = schema.index("h00")
    assert lay.dense_inc[h].size == 0 and lay.dense_exc[h].size == 0
    assert lay.dense_inc[schema.index("h01")].size > 0
    with pytest.raises(KeyError):
        choose_layout(rules, dense_min={"nope": 3})
