"""The compiled batch planner (DeviceTargetingIndex.plan_batch) against the Python one: every plan
array equals the layout of TargetingIndex.plan's per-request plans, on random pools and layouts,
profiles in every accepted form, exclude slots, after updates; malformed profiles raise
make_profile's errors."""

import numpy as np
import pytest

from andromeda_nb.match import DeviceTargetingIndex
from andromeda_nb.match.api import PLAN_ARRAYS, plan_ops
from andromeda_nb.targeting import RuleError, TargetingIndex, UpdateBatch, make_profile, table_slots

from ..helpers import random_profile, random_rules, random_schema

LAYOUTS = [dict(dense_min=10**9, exclude_dense_min=10**9, group_max=512), dict(dense_min=1, exclude_dense_min=1),
           dict(dense_min=3, exclude_dense_min=2, group_max=64), dict(dense_min=2, group_max=1),
           dict(fold_max=0, dense_min=2)]  # no folded group: the live row is read on its own


def python_plan(idx: TargetingIndex, profiles, excl, grouped) -> dict:
    """The batch's arrays assembled from each request's TargetingIndex.plan (the oracle)."""
    nr = idx.n_rows
    out = {name: [] for name in PLAN_ARRAYS}
    out["req_cat"], out["inc_ptr"], out["exc_ptr"], out["req_op"] = [0], [0], [0], [0]
    p_len, q_len, n_extra, scratch = [], [], 0, 0
    for b, prof in enumerate(profiles):
        plan = idx.plan(make_profile(idx.schema, prof))
        out["req_cat"].append(out["req_cat"][-1] + plan.n_categories)
        out["inc_ptr"] += (plan.inc_ptr[1:] + len(out["inc_rows"])).tolist()
        out["exc_ptr"] += (plan.exc_ptr[1:] + len(out["exc_rows"])).tolist()
        mapped = np.where(plan.inc_rows < 0, nr + scratch - 1 - plan.inc_rows, plan.inc_rows)
        out["inc_rows"] += mapped.tolist()
        out["exc_rows"] += plan.exc_rows.tolist()
        if grouped:
            r, kd = plan_ops(plan.inc_ptr, mapped, plan.exc_ptr, plan.exc_rows)
            out["op_row"] += r.tolist()
            out["op_kind"] += kd.tolist()
        out["req_op"].append(len(out["op_row"]))
        for k, lids in enumerate(plan.patch_lists):
            s, ln = idx.segments(lids)
            out["p_start"] += s.tolist()
            p_len += ln.tolist()
            out["p_dst"] += [scratch + k] * s.size
            out["q_start"] += s.tolist()
            q_len += ln.tolist()
            out["q_op"] += [2] * s.size
            out["q_arg"] += [scratch + k] * s.size
        s, ln = idx.segments(plan.exclude_lists)
        out["q_start"] += s.tolist()
        q_len += ln.tolist()
        out["q_op"] += [0] * s.size
        out["q_arg"] += [b] * s.size
        if excl[b] is not None and len(excl[b]):
            out["q_start"].append(n_extra)
            q_len.append(len(excl[b]))
            out["q_op"].append(1)
            out["q_arg"].append(b)
            out["extra"] += list(excl[b])
            n_extra += len(excl[b])
        scratch += plan.n_patches
    out["p_off"] = np.concatenate([[0], np.cumsum(p_len, dtype=np.int64)]).tolist()
    out["q_off"] = np.concatenate([[0], np.cumsum(q_len, dtype=np.int64)]).tolist()
    out["_n"] = (out["p_off"][-1], out["q_off"][-1], scratch, (len(p_len), max(p_len, default=0)),
                 (len(q_len), max(q_len, default=0)))
    return out


def assert_same_plan(dev: DeviceTargetingIndex, profiles, excl=None, grouped=True):
    excl_in = [None] * len(profiles) if excl is None else excl
    got = dev.plan_batch(profiles, excl, grouped=grouped)
    want = python_plan(dev.index, profiles, [None if e is None else table_slots(e, dev.n_ads) for e in excl_in],
                       grouped)
    arrays = got.arrays
    for name in PLAN_ARRAYS:
        np.testing.assert_array_equal(arrays[name], np.asarray(want[name], np.int64), err_msg=name)
        assert arrays[name].dtype == np.int64
    n_prep, n_post, scratch, pseg, qseg = want["_n"]
    assert (got.n_prep, got.n_post, got.n_scratch, got.prep_segments, got.post_segments) == (
        n_prep, n_post, scratch, pseg, qseg)
    # flat: the arrays back to back, an empty one as a single zero
    o = got.offsets
    for i, name in enumerate(PLAN_ARRAYS):
        seg = got.flat[o[i]:o[i + 1]]
        assert seg.size == max(1, arrays[name].size)
        if arrays[name].size == 0:
            assert seg[0] == 0
    assert [p.n_categories for p in got.plans] == [np.diff(want["req_cat"])[b] for b in range(len(profiles))]


@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_plans_equal_the_python_plans(rng, layout):
    """Random pools in each layout, batches of 1..40 random profiles, exclude slots on some,
    both kernel forms."""
    n = int(rng.integers(1, 400))
    rules = random_rules(rng, n)
    dev = DeviceTargetingIndex(TargetingIndex(rules, **LAYOUTS[layout]))
    for B in (1, 2, 7, 40):
        profs = [random_profile(rng, rules.schema) for _ in range(B)]
        excl = [None if rng.random() < 0.5 else rng.choice(n, int(rng.integers(0, min(n, 5) + 1)), replace=False)
                for _ in range(B)]
        assert_same_plan(dev, profs, excl, grouped=bool(B % 2))


def test_profile_forms_and_updates(rng):
    """Values as ints, lists with duplicates, tuples, sets, numpy ints and arrays, an empty
    profile; then after updates (lists and row counts change) the plans follow the index."""
    schema = random_schema()
    rules = random_rules(rng, 300, schema=schema)
    dev = DeviceTargetingIndex(TargetingIndex(rules, dense_min=3, exclude_dense_min=2, group_max=64, capacity=320))
    multi = [c for c in schema if c.multi_valued]
    single = [c for c in schema if not c.multi_valued]
    forms = [{}, {single[0].name: np.int64(1)}, {single[0].name: [2, 2]},
             {multi[0].name: (0, 1, 1, 0)}, {multi[0].name: {1, 2}}, {multi[0].name: np.array([2, 0])},
             {multi[0].name: frozenset([3]), single[-1].name: 0}]
    assert_same_plan(dev, forms)
    for step in range(3):
        live = dev.index.current_rules().ad_ids[:50]
        recs = [{"op": "retire", "ad_id": int(a)} for a in live[step * 5:step * 5 + 5]]
        recs += [{"op": "create", "ad_id": 10_000 + 10 * step + i, "include": {multi[0].name: [i % 3]}}
                 for i in range(8)]
        dev.apply(UpdateBatch.from_records(schema, recs))
        assert_same_plan(dev, [random_profile(rng, schema) for _ in range(9)])


def test_malformed_profiles_raise_make_profiles_errors(rng):
    schema = random_schema()
    dev = DeviceTargetingIndex(TargetingIndex(random_rules(rng, 50, schema=schema)))
    single = next(c for c in schema if not c.multi_valued)
    good = random_profile(rng, schema)
    bad = [{"nope": [1]}, {single.name: [single.cardinality]}, {single.name: -1}, {single.name: [0, 1]},
           {single.name: [True]}, {single.name: 1.0}, {single.name: "1"}, {single.name: [2 ** 70]}, [("x", 1)]]
    for prof in bad:
        with pytest.raises(RuleError) as want:
            make_profile(schema, prof)
        with pytest.raises(RuleError) as got:
            dev.plan_batch([good, prof])
        assert str(got.value) == str(want.value)
