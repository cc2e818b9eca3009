"""The host index (targeting.index): build options, the per-request plan, the CPU match, and the
Numba host kernels behind them."""

import sys

import numpy as np
import pytest

from andromeda_nb.targeting import (Category, TargetingIndex, TargetingRules, TargetingSchema, UpdateBatch,
                                    host_kernels, make_profile)
from andromeda_nb.targeting.layout import INT32_LIST_MAX_SLOTS, list_dtype_for

from ..helpers import random_profile, random_rules
from ..match.helpers import check_match

SCHEMA = TargetingSchema([Category("age", 7), Category("interest", 30, multi_valued=True)])


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


def test_list_dtype_rule_and_argument(rng):
    """Lists hold int32 slots up to INT32_LIST_MAX_SLOTS ("auto"), int64 beyond or when asked;
    either way the CPU match equals the oracle, and a rebuild keeps the type."""
    assert list_dtype_for(INT32_LIST_MAX_SLOTS) == np.int32 and list_dtype_for(INT32_LIST_MAX_SLOTS + 1) == np.int64
    rules = random_rules(rng, 200)
    for arg, want in (("auto", np.int32), (np.int32, np.int32), (np.int64, np.int64), ("int64", np.int64)):
        index = TargetingIndex(rules, capacity=230, dense_min=10**9, list_dtype=arg)
        assert index.list_dtype == want and index.pool.dtype == want
        assert index.rebuild().list_dtype == want
        prof = random_profile(rng, rules.schema)
        check_match(index, prof, index.match_cpu(prof), rules=rules)
    for bad in ("int16", np.float64, None, "wide"):
        with pytest.raises(ValueError, match="list_dtype must be"):
            TargetingIndex(rules, list_dtype=bad)


def test_memory_entry_bytes_follow_the_list_dtype_rule(rng):
    index = TargetingIndex(random_rules(rng, 100), dense_min=10**9)
    small = {m["unit"]: m for m in index.memory_by_category()}
    big = {m["unit"]: m for m in index.memory_by_category(INT32_LIST_MAX_SLOTS + 1)}
    for unit, m in small.items():
        if m["list_entries"]:
            assert m["list_bytes"] == 4 * m["list_entries"]
            assert big[unit]["list_bytes"] == 8 * big[unit]["list_entries"]


def test_cpu_match_prefix_and_bad_input(rng):
    rules = random_rules(rng, 500)
    index = TargetingIndex(rules, dense_min=3)
    prof = random_profile(rng, rules.schema)
    out = np.full(index.n_words + 2, 7, np.uint64)
    words, count = index.match_cpu(prof, exclude_slots=[1, 400], n_words=3, out=out)
    assert words.base is out or words is out[:3]
    check_match(index, prof, (words, count), rules=rules, exclude_slots=[1, 400], n_words=3)
    for bad in (0, index.n_words + 1, -1):
        with pytest.raises(ValueError, match="n_words must be in"):
            index.match_cpu(prof, n_words=bad)
    for bad in (np.zeros(index.n_words - 1, np.uint64), np.zeros(index.n_words, np.int64), [0] * index.n_words):
        with pytest.raises(ValueError, match="out must be a uint64"):
            index.match_cpu(prof, out=bad)
    with pytest.raises(ValueError, match="0..499"):
        index.match_cpu(prof, exclude_slots=[500])


def test_apply_refuses_a_bad_diff_chunk(rng):
    rules = random_rules(rng, 20)
    index = TargetingIndex(rules, capacity=30)
    batch = UpdateBatch.from_records(rules.schema, [{"op": "create", "ad_id": 10**6}])
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="diff_chunk_slots"):
            index.apply(batch, diff_chunk_slots=bad)
    assert index.version == 0 and index.slot_of(10**6) is None  # nothing changed


def test_host_kernels_by_name():
    """Every Numba host kernel the package imports by name is listed; importing the package
    itself does not import numba (checked in a fresh process: this one has it)."""
    import subprocess

    k = host_kernels()
    for name in ("csr_scan", "build_folded", "combine_group", "build_split", "fill_lists", "popcounts",
                 "count_constrained", "gather_codes", "gather_codes_parallel", "diff", "diff_par", "list_ops", "partition_codes",
                 "apply_bits", "cpu_scatter", "cpu_match", "cpu_clear", "popc"):
        assert callable(k[name]), name
    code = ("import sys, andromeda_nb, andromeda_nb.targeting, andromeda_nb.match; "
            "assert 'numba' not in sys.modules, sorted(m for m in sys.modules if m.startswith('numba'))")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rules_do_not_alias_the_callers_buffers():
    """The index keeps the rules as the truth for later updates: reusing the arrays passed to
    from_columns / UpdateBatch.from_columns afterwards must not change it."""
    ids = np.arange(4, dtype=np.int64)
    ptr = np.arange(5, dtype=np.int64)
    vals = np.ones(4, np.int32)
    live = np.ones(4, bool)
    idx = TargetingIndex(TargetingRules.from_columns(SCHEMA, ids, live, include={"age": (ptr, vals)}))
    vals[0], ids[1], live[2] = 2, 99, False
    op_ids = np.array([0], np.int64)
    batch = UpdateBatch.from_columns(SCHEMA, ["change"], op_ids, include={"age": (np.array([0, 1]), np.array([3]))})
    op_ids[0] = 1
    idx.apply(batch)
    idx.apply(UpdateBatch.from_records(SCHEMA, [{"op": "retire", "ad_id": 1}]))
    idx.assert_same(idx.rebuild())
    assert idx.match_cpu({"age": 1})[1] == 2  # ads 2 and 3 (live, age 1); ad 1 retired; ad 0 now age 3
    assert idx.match_cpu({"age": 3})[1] == 1
    for age in (1, 3):
        check_match(idx, {"age": age}, idx.match_cpu({"age": age}))
    with pytest.raises(TypeError, match="capacity must be an int"):
        TargetingIndex(TargetingRules.from_records(SCHEMA, []), capacity=60.9)


def test_rules_of_slots_regroup_the_columns_exactly(rng):
    """The rules read back, every column's CSR, equal the rules built from (spare slots free and
    unconstrained; any slot order, repeats included)."""
    from andromeda_nb.datasets import synthetic as syn

    n = int(rng.integers(1, 400))
    rules = syn.generate_rules(syn.benchmark_schema(), n, seed=int(rng.integers(1 << 30)), constrain_prob=0.4,
                               exclude_prob=0.2)
    host = TargetingIndex(rules, capacity=n + 37)
    whole = host.current_rules()
    assert whole.ad_ids[n:].tolist() == [-1] * 37 and not whole.live[n:].any()
    for mine, theirs in ((whole.include, rules.include), (whole.exclude, rules.exclude)):
        assert {k for k, (p, _) in theirs.items() if p[-1]} <= set(mine)
        for name, (p, v) in mine.items():
            q, w = theirs[name]
            np.testing.assert_array_equal(p[:n + 1], q)
            assert p[n + 1:].tolist() == [q[-1]] * 37  # spare slots: no values
            np.testing.assert_array_equal(v, w)
    some = rng.integers(0, n + 37, 60)
    got = host.rules_of_slots(some)
    for i, s in enumerate(some.tolist()):
        assert got.rule(i) == whole.rule(s)


def test_rules_of_slots_refuses_bad_slots(rng):
    from andromeda_nb.datasets import synthetic as syn

    rules = syn.generate_rules(syn.benchmark_schema(), 300, seed=int(rng.integers(1 << 30)), constrain_prob=0.3)
    host = TargetingIndex(rules, capacity=500)
    for slots, err in (([-5], ValueError), ([-1], ValueError), ([500], ValueError), ([1.7], TypeError),
                       (["3"], TypeError), ([[1, 2]], TypeError)):
        with pytest.raises(err, match="slots"):
            host.rules_of_slots(slots)
    some = rng.choice(500, 40)
    got, whole = host.rules_of_slots(some), host.current_rules()
    np.testing.assert_array_equal(got.ad_ids, whole.ad_ids[some])
    np.testing.assert_array_equal(got.live, whole.live[some])
