"""Rules and their I/O (records, JSON lines, DataFrame, CSR columns): malformed input raises a clear
error naming the ad and category."""

import numpy as np
import pandas as pd
import pytest

from andromeda_nb.targeting import Category, RuleError, TargetingRules, TargetingSchema

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
    ({"ad_id": -2}, "ad_id must be an integer in 0..2"),
    ({"ad_id": "x"}, "ad_id must be an integer in 0..2"),
    ({"ad_id": 1.0}, "ad_id must be an integer in 0..2"),
    ({"ad_id": 2**63}, "ad_id must be an integer in 0..2"),
    ({"ad_id": 5, "include": 0}, "ad 5: include must map"),
    ({"ad_id": 5, "exclude": ""}, "ad 5: exclude must map"),
    ({"ad_id": 5, "color": 1}, "unknown fields"),
])
def test_bad_records(record, msg):
    with pytest.raises(RuleError, match=msg):
        TargetingRules.from_records(SCHEMA, [{"ad_id": 1}, record])


def test_duplicate_ad_id():
    with pytest.raises(RuleError, match="ad 3: duplicate"):
        TargetingRules.from_records(SCHEMA, [{"ad_id": 3}, {"ad_id": 3}])


def test_one_record_not_in_a_list_is_named():
    with pytest.raises(RuleError, match="got one mapping: wrap it in a list"):
        TargetingRules.from_records(SCHEMA, {"ad_id": 1})


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


def test_jsonl_roundtrip_and_errors(tmp_path):
    recs = [{"ad_id": 9, "live": True, "include": {"age": [3, 1]}, "exclude": {"interest": [4]}},
            {"ad_id": 2, "live": False}]
    rules = TargetingRules.from_records(SCHEMA, recs)
    path = tmp_path / "rules.jsonl"
    rules.to_jsonl(path)
    again = TargetingRules.from_jsonl(SCHEMA, path)
    assert again.to_records() == rules.to_records()
    assert TargetingRules.from_jsonl(SCHEMA, rules.to_jsonl()).to_records() == rules.to_records()
    with pytest.raises(RuleError, match="line 2: not valid JSON"):
        TargetingRules.from_jsonl(SCHEMA, '{"ad_id": 1}\n{"ad_id": \n')
    with pytest.raises(RuleError, match="ad 7.*'age'.*out of range"):
        TargetingRules.from_jsonl(SCHEMA, '{"ad_id": 7, "include": {"age": [9]}}\n')


def test_from_columns_canonical_fast_path_and_sorting():
    ptr = np.array([0, 2, 2, 5])
    sorted_vals = np.array([1, 4, 0, 2, 6], np.int32)
    r = TargetingRules.from_columns(SCHEMA, [1, 2, 3], include={"age": (ptr, sorted_vals)})
    assert r.include["age"][1] is sorted_vals or np.array_equal(r.include["age"][1], sorted_vals)
    messy = np.array([4, 1, 6, 6, 0], np.int64)  # unsorted and a duplicate: canonicalised
    r = TargetingRules.from_columns(SCHEMA, [1, 2, 3], include={"age": (ptr, messy)})
    assert r.rule(0).include["age"] == {1, 4} and r.rule(2).include["age"] == {0, 6}
    assert r.include["age"][1].dtype == np.int32 and r.include["age"][0].tolist() == [0, 2, 2, 4]
    with pytest.raises(RuleError, match="malformed indptr"):
        TargetingRules.from_columns(SCHEMA, [1, 2, 3], include={"age": (np.array([1, 2, 2, 5]), sorted_vals)})
    with pytest.raises(RuleError, match="\\(indptr, values\\) pair"):
        TargetingRules.from_columns(SCHEMA, [1, 2, 3], include={"age": ptr})


def test_free_slots_and_subsets():
    ptr, vals = np.array([0, 1, 1, 1]), np.array([2])
    r = TargetingRules.from_columns(SCHEMA, [5, -1, 7], np.array([True, False, True]),
                                    include={"age": (ptr, vals)}, allow_free=True)
    assert r.rule(1).ad_id == -1 and not r.rule(1).live
    with pytest.raises(RuleError, match="non-negative"):
        TargetingRules.from_columns(SCHEMA, [5, -1, 7])
    with pytest.raises(RuleError, match="free slot.*must not be live"):
        TargetingRules.from_columns(SCHEMA, [5, -1, 7], allow_free=True)
    with pytest.raises(RuleError, match="free slot.*constrains"):
        TargetingRules.from_columns(SCHEMA, [-1, 6, 7], np.array([False, True, True]),
                                    include={"age": (ptr, vals)}, allow_free=True)
    with pytest.raises(TypeError, match="integers"):
        r.subset(np.array([True, False, True]))
    with pytest.raises(ValueError, match="0..2"):
        r.subset([3])
    sub = r.subset([2, 0])
    assert sub.ad_ids.tolist() == [7, 5] and sub.rule(1).include == {"age": frozenset({2})}
    assert r.restrict(["interest"]).rule(0).include == {}


def test_frame_rejects_what_records_reject():
    """A DataFrame is held to the records' rules: integer ad ids, bool live flags, no NaN values
    (pandas turns an int column with a gap into floats; the error names the row with the gap)."""
    base = dict(category=["age", "age"], kind=["include", "exclude"], value=[1, 2])
    with pytest.raises(RuleError, match="row 0: ad_id must be an integer"):
        TargetingRules.from_frame(SCHEMA, pd.DataFrame({"ad_id": [1.2, 1.7], **base}))
    with pytest.raises(RuleError, match="row 1: ad_id must be an integer"):
        TargetingRules.from_frame(SCHEMA, pd.DataFrame({"ad_id": [1, "1"], **base}, dtype=object))
    with pytest.raises(RuleError, match="ad_ids: ad_id must be an integer"):
        TargetingRules.from_frame(SCHEMA, pd.DataFrame({"ad_id": [1, 1], **base}), ad_ids=[1.7])
    with pytest.raises(RuleError, match="ad 1: live must be a bool"):
        TargetingRules.from_frame(SCHEMA, pd.DataFrame({"ad_id": [1, 1], **base, "live": ["False", "False"]}))
    with pytest.raises(RuleError, match="ad 1: rows disagree on live"):
        TargetingRules.from_frame(SCHEMA, pd.DataFrame({"ad_id": [1, 1], **base, "live": [True, False]}))
    with pytest.raises(RuleError, match="ad 2, category 'age': rule frame row 1 has no value"):
        TargetingRules.from_frame(SCHEMA, pd.DataFrame({"ad_id": [1, 2], "category": ["age", "age"],
                                                        "kind": ["include", "include"], "value": [1, np.nan]}))
    ok = TargetingRules.from_frame(SCHEMA, pd.DataFrame({"ad_id": [1, 1], **base, "live": [False, False]}))
    assert ok.to_records() == [{"ad_id": 1, "live": False, "include": {"age": [1]}, "exclude": {"age": [2]}}]


def _same_rules(a: TargetingRules, b: TargetingRules) -> bool:
    return (a.schema == b.schema and np.array_equal(a.ad_ids, b.ad_ids) and np.array_equal(a.live, b.live)
            and all(x.keys() == y.keys() and all(np.array_equal(x[k][0], y[k][0]) and np.array_equal(x[k][1], y[k][1])
                                                 for k in x)
                    for x, y in ((a.include, b.include), (a.exclude, b.exclude))))


def _indexes_update_alike(rules: TargetingRules, other: TargetingRules, ops) -> bool:
    """Indexes of two rule sets hold the same bits when built, and after the same update records."""
    from andromeda_nb.targeting import TargetingIndex, UpdateBatch

    a, b = TargetingIndex(rules), TargetingIndex(other)
    if not np.array_equal(a.bitsets, b.bitsets):
        return False
    for index in (a, b):
        index.apply(UpdateBatch.from_records(rules.schema, ops))
    return np.array_equal(a.bitsets, b.bitsets) and _same_rules(a.current_rules(), b.current_rules())


def _three_ads() -> TargetingRules:
    return TargetingRules.from_columns(SCHEMA, [5, 6, 9], include={"age": (np.array([0, 1, 1, 3]), np.array([2, 0, 6]))})


@pytest.mark.parametrize("mmap", [True, False])
def test_saved_rules_load_equal_and_an_index_of_them_updates_like_one_of_the_originals(tmp_path, rng, mmap):
    """Rules saved and loaded (memory-mapped read-only, or read) are the same rules, free slots
    included, and an index built on them takes updates as one built on the originals does: the
    index never writes into its base rules."""
    from andromeda_nb.targeting import TargetingIndex

    from ..helpers import random_rule, random_rules, random_schema

    schema = random_schema()
    rules = random_rules(rng, 90, schema=schema)
    held = TargetingIndex(rules, capacity=100).current_rules()  # the index's 10 free slots: ad id -1
    held.save(tmp_path / "r")
    back = TargetingRules.load(tmp_path / "r", mmap=mmap)
    assert _same_rules(held, back) and (back.ad_ids == -1).sum() == 10
    assert all(ptr.flags.writeable != mmap for ptr, _ in back.include.values())  # mapped read-only, or read
    live = [int(i) for i in held.ad_ids if i >= 0]
    ops = ([{"op": "retire", "ad_id": i} for i in live[:5]]
           + [{"op": "change", "ad_id": i, **random_rule(rng, schema)} for i in live[5:15]]
           + [{"op": "create", "ad_id": 10_000 + j, **random_rule(rng, schema)} for j in range(12)])
    assert _indexes_update_alike(held, back, ops)


def test_saved_rules_refuse_an_existing_directory_and_malformed_files(tmp_path):
    import json

    rules = _three_ads()
    rules.save(tmp_path / "r")
    with pytest.raises(FileExistsError, match="exists"):
        rules.save(tmp_path / "r")
    with pytest.raises(FileNotFoundError, match="no saved rules"):
        TargetingRules.load(tmp_path / "nowhere")
    meta = json.loads((tmp_path / "r" / "rules.json").read_text())
    bad = dict(meta, format="something else")
    (tmp_path / "r" / "rules.json").write_text(json.dumps(bad))
    with pytest.raises(RuleError, match="not rules saved by"):
        TargetingRules.load(tmp_path / "r")
    (tmp_path / "r" / "rules.json").write_text(json.dumps(meta))
    np.save(tmp_path / "r" / "include0.values.npy", np.array([2, 0, 7], np.int32))  # 7: past age's 0..6
    with pytest.raises(RuleError, match="ad 9.*'age'.*out of range 0..6"):
        TargetingRules.load(tmp_path / "r")
    np.save(tmp_path / "r" / "include0.indptr.npy", np.array([0, 1, 3], np.int64))  # 3 ads need 4 pointers
    with pytest.raises(RuleError, match=r"include0.indptr.npy: expected int64 of shape \(4,\)"):
        TargetingRules.load(tmp_path / "r")
    np.save(tmp_path / "r" / "include0.indptr.npy", np.array([0, 1, 1, 3], np.int64))
    np.save(tmp_path / "r" / "include0.values.npy", np.array([2, 0, 6], np.int32))
    np.save(tmp_path / "r" / "ad_ids.npy", np.array([5, 5, 9], np.int64))
    with pytest.raises(RuleError, match="ad 5: duplicate ad_id"):
        TargetingRules.load(tmp_path / "r")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rules-")]  # no half-written directory left


def test_generated_rules_own_their_arrays(rng):
    """The generator keeps its own arrays without a second copy, but never the caller's ids."""
    from andromeda_nb.datasets import synthetic as syn

    ids = np.arange(100, dtype=np.int64) * 3
    rules = syn.generate_rules(syn.benchmark_schema(), 100, seed=1, ad_ids=ids)
    ids[0] = 77
    assert rules.ad_ids[0] == 0


def test_loaded_rules_with_a_column_made_canonical_still_take_updates(tmp_path, rng):
    """A saved column whose values loading sorts is a writable copy beside read-only mapped ones:
    the index still reads every column (one array type for all) and updates as the originals do."""
    ptr = np.array([0, 2, 3, 4])
    rules = TargetingRules.from_columns(SCHEMA, [5, 6, 9], include={"age": (ptr, np.array([1, 4, 0, 6])),
                                                                    "interest": (ptr, np.array([3, 8, 2, 29]))})
    rules.save(tmp_path / "r")
    np.save(tmp_path / "r" / "include0.values.npy", np.array([4, 1, 0, 6], np.int32))  # age of ad 5, unsorted
    back = TargetingRules.load(tmp_path / "r")
    assert back.include["age"][1].flags.writeable and not back.include["interest"][1].flags.writeable
    ops = [{"op": "change", "ad_id": 6, "include": {"age": [2]}}, {"op": "retire", "ad_id": 9},
           {"op": "create", "ad_id": 11, "include": {"interest": [7]}}]
    assert _indexes_update_alike(rules, back, ops)


def test_loading_names_the_file_that_is_wrong(tmp_path):
    import json

    rules = _three_ads()
    rules.save(tmp_path / "r")
    meta_path = tmp_path / "r" / "rules.json"
    meta = json.loads(meta_path.read_text())
    for bad, msg in ((dict(meta, schema=[["age", 7, "false"], ["interest", 30, True]]), "malformed"),
                     (dict(meta, n_ads="3"), "malformed"), (dict(meta, columns={"include": "age", "exclude": []}),
                                                            "malformed")):
        meta_path.write_text(json.dumps(bad))
        with pytest.raises(RuleError, match=msg):
            TargetingRules.load(tmp_path / "r")
    meta_path.write_text("{not json")
    with pytest.raises(RuleError, match="rules.json: unreadable"):
        TargetingRules.load(tmp_path / "r")
    meta_path.write_text(json.dumps(meta))
    np.save(tmp_path / "r" / "exclude0.values.npy", np.zeros(1, np.int32))  # a file no column names
    with pytest.raises(RuleError, match="files rules.json does not name.*exclude0.values.npy"):
        TargetingRules.load(tmp_path / "r")
    (tmp_path / "r" / "exclude0.values.npy").unlink()
    data = (tmp_path / "r" / "include0.indptr.npy").read_bytes()
    (tmp_path / "r" / "include0.indptr.npy").write_bytes(data[:-8])  # truncated
    for mmap in (True, False):
        with pytest.raises(RuleError, match="include0.indptr.npy: unreadable"):
            TargetingRules.load(tmp_path / "r", mmap=mmap)
    (tmp_path / "r" / "live.npy").unlink()
    (tmp_path / "r" / "include0.indptr.npy").write_bytes(data)
    with pytest.raises(RuleError, match="live.npy: unreadable"):
        TargetingRules.load(tmp_path / "r")


def test_a_save_that_loses_the_race_for_its_path_says_the_path_exists(tmp_path, monkeypatch):
    import os

    rules = TargetingRules.from_columns(SCHEMA, [5, 6])
    rename = os.rename

    def another_save_first(src, dst):  # another process's directory lands between the check and the rename
        os.makedirs(dst)
        (tmp_path / "r" / "rules.json").write_text("theirs")
        rename(src, dst)

    monkeypatch.setattr(os, "rename", another_save_first)
    with pytest.raises(FileExistsError, match="exists"):
        rules.save(tmp_path / "r")
    monkeypatch.undo()
    assert (tmp_path / "r" / "rules.json").read_text() == "theirs"  # theirs stands, whole
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rules-")]
