"""The device match (match.api) against the rule-set oracle, for every match algorithm: the device
index, one request, a batch, exclude slots, candidate compaction, stale copies, the CPU baseline."""

import numpy as np
import pytest

from andromeda_nb.device import launch
from andromeda_nb.match import (DeviceTargetingIndex, MatchConfig, compact, match_batch, match_cpu,
                                match_eligible)
from andromeda_nb.match.api import plan_ops
from andromeda_nb.targeting import TargetingIndex, TargetingRules, UpdateBatch

from ..helpers import random_profile, random_rules, random_schema
from .helpers import ALGORITHMS, check_match, config_id

# (dense_min, exclude_dense_min, group_max): all lists, all rows, mixed, one folded row per category
LAYOUTS = [(10**9, 10**9, 512), (1, 1, 512), (3, 2, 64), (2, 10**9, 1)]
# (words per thread, prefetch, group) of the match kernel; the list passes alternate between them
SHAPES = [(1, False, 0), (2, False, 0), (4, False, 0), (8, False, 0), (16, False, 0), (1, True, 0),
          (4, True, 0), (1, False, 1), (2, False, 3), (4, False, 4), (8, False, 2), (1, False, 64)]

by_algorithm = pytest.mark.parametrize("config", ALGORITHMS, ids=config_id)


@pytest.mark.parametrize("n", [1, 31, 32, 33, 63, 64, 65, 127, 128, 200, 1000,
                               pytest.param(4101, marks=pytest.mark.slow)])
def test_match_equals_oracle(rng, n):
    """Pool sizes around the word and tile sizes, every layout, every kernel shape and variant
    (each list pass with each variant), through prepare / launch."""
    dense_min, xmin, gmax = LAYOUTS[n % len(LAYOUTS)]
    rules = random_rules(rng, n)
    index = DeviceTargetingIndex(TargetingIndex(rules, dense_min=dense_min, exclude_dense_min=xmin, group_max=gmax))
    for i, (U, prefetch, group) in enumerate(SHAPES):
        config = MatchConfig(words_per_thread=U, prefetch=prefetch, group=group,
                             list_kernels=("search", "segment")[i % 2])
        prof = random_profile(rng, rules.schema)
        out, counts = index.launch(index.prepare([prof]), config=config)
        check_match(index, prof, (out[0], counts.copy_to_host()[0]), rules=rules)


@pytest.mark.parametrize("block", [1, 33, 64, 128])
def test_block_sizes(rng, block):
    """Blocks that are not the simulator's default (one not a multiple of the warp): same answer."""
    rules = random_rules(rng, 700, p_constrain=0.5, p_exclude=0.3)
    index = DeviceTargetingIndex(TargetingIndex(rules, dense_min=3, exclude_dense_min=2, group_max=64))
    prof = random_profile(rng, rules.schema)
    for config in (MatchConfig(block=block, words_per_thread=2), MatchConfig(block=block, group=2)):
        check_match(index, prof, match_eligible(index, prof, config=config), rules=rules)


@by_algorithm
def test_every_layout_on_one_pool(rng, config):
    rules = random_rules(rng, 300, p_constrain=0.5, p_exclude=0.3)
    profiles = [random_profile(rng, rules.schema) for _ in range(3)]
    for dense_min, xmin, gmax in LAYOUTS:
        index = DeviceTargetingIndex(TargetingIndex(rules, dense_min=dense_min, exclude_dense_min=xmin,
                                                    group_max=gmax))
        for prof in profiles:
            check_match(index, prof, match_eligible(index, prof, config=config), rules=rules)


@by_algorithm
def test_dense_and_empty_extremes(config):
    schema = random_schema()
    n = 150
    # nobody constrains anything: every live ad matches every profile, even an empty one
    free = TargetingRules.from_records(schema, [{"ad_id": i, "live": i % 7 != 0} for i in range(n)])
    index = DeviceTargetingIndex(TargetingIndex(free))
    got = match_eligible(index, {}, config=config)
    np.testing.assert_array_equal(got.to_mask(), np.arange(n) % 7 != 0)
    check_match(index, {}, got, rules=free)
    # everybody excludes the user's value: nothing matches (as a list, then as a dense row)
    recs = [{"ad_id": i, "exclude": {"interest": [3]}} for i in range(n)]
    none = TargetingRules.from_records(schema, recs)
    for xmin in (None, 1):
        index = DeviceTargetingIndex(TargetingIndex(none, exclude_dense_min=xmin))
        got = match_eligible(index, {"interest": [3, 4]}, config=config)
        assert got.count == 0 and not got.to_mask().any()
        check_match(index, {"interest": [3, 4]}, got, rules=none)
    # the user without values fails includes only, in folded and split categories
    recs = [{"ad_id": 0, "include": {"age": [2]}}, {"ad_id": 1, "exclude": {"age": [2]}}, {"ad_id": 2},
            {"ad_id": 3, "include": {"interest": [1]}}, {"ad_id": 4, "exclude": {"interest": [1]}}]
    r = TargetingRules.from_records(schema, recs)
    for dm in (1, None):
        index = DeviceTargetingIndex(TargetingIndex(r, dense_min=dm))
        got = match_eligible(index, {}, config=config)
        assert got.to_mask().tolist() == [False, True, True, False, True]
        check_match(index, {}, got, rules=r)


@by_algorithm
def test_padding_never_matches_after_not(config):
    """Only exclusions (NOT / ANDNOT of sparse rows): the last word's padding stays clear."""
    schema = random_schema()
    for n in (1, 33, 65, 100):
        recs = [{"ad_id": i, "exclude": {"interest": [i % 3], "age": [i % 2]}} for i in range(n)]
        rules = TargetingRules.from_records(schema, recs)
        for xmin in (1, None):
            index = DeviceTargetingIndex(TargetingIndex(rules, exclude_dense_min=xmin))
            prof = {"interest": [5], "age": 6}
            got = match_eligible(index, prof, config=config)
            words = got.words.copy_to_host()
            assert got.count == n
            if n % 64:
                assert int(words[-1]) >> (n % 64) == 0
            check_match(index, prof, got, rules=rules)


@by_algorithm
def test_exclude_slots_clear_bits_and_count(rng, config):
    rules = random_rules(rng, 300, p_constrain=0.1, p_exclude=0.0, live_p=1.0)
    index = DeviceTargetingIndex(TargetingIndex(rules))
    prof = random_profile(rng, rules.schema)
    base = match_eligible(index, prof, config=config).to_mask()
    drop = rng.choice(300, 40, replace=False)
    excl = np.concatenate([drop, drop[:5]])  # duplicates harmless
    got = match_eligible(index, prof, exclude_slots=excl, config=config)
    want = base.copy()
    want[drop] = False
    np.testing.assert_array_equal(got.to_mask(), want)
    assert got.count == want.sum()
    check_match(index, prof, got, rules=rules, exclude_slots=excl)
    with pytest.raises(ValueError, match="0..299"):
        match_eligible(index, prof, exclude_slots=[300], config=config)


@by_algorithm
def test_batch_equals_single_requests(rng, config):
    rules = random_rules(rng, 250)
    index = DeviceTargetingIndex(TargetingIndex(rules, dense_min=2))
    profiles = [random_profile(rng, rules.schema) for _ in range(5)]
    excl = [None, rng.choice(250, 10, replace=False), None, [0, 1, 2], None]
    batch = match_batch(index, profiles, exclude_slots=excl, config=config)
    masks = batch.to_masks()
    for b, prof in enumerate(profiles):
        single = match_eligible(index, prof, exclude_slots=excl[b], config=config)
        np.testing.assert_array_equal(masks[b], single.to_mask())
        assert batch.counts[b] == single.count == batch[b].count
        check_match(index, prof, batch[b], rules=rules, exclude_slots=excl[b])
    with pytest.raises(ValueError, match="at least one"):
        match_batch(index, [], config=config)


@pytest.mark.parametrize("group,lists", [(1, "search"), (2, "segment"), (3, "segment"), (5, "search")])
def test_grouped_match_batch_equals_oracle(rng, group, lists):
    """Several requests in one grouped launch (grid.y = request), a group size that does and does
    not divide the requests' op counts, against the oracle and the plain kernel."""
    n = 777
    rules = random_rules(rng, n, p_constrain=0.5, p_exclude=0.3)
    index = DeviceTargetingIndex(TargetingIndex(rules, dense_min=3, exclude_dense_min=2, group_max=64))
    profiles = [random_profile(rng, rules.schema) for _ in range(5)] + [{}]
    prepared = index.prepare(profiles)
    grouped = MatchConfig(words_per_thread=2, group=group, list_kernels=lists)
    out, counts = index.launch(prepared, config=grouped)
    words, got_counts = out.copy_to_host(), counts.copy_to_host()
    plain, plain_counts = index.launch(index.prepare(profiles), config=MatchConfig(list_kernels=lists))
    np.testing.assert_array_equal(words, plain.copy_to_host())
    np.testing.assert_array_equal(got_counts, plain_counts.copy_to_host())
    for b, prof in enumerate(profiles):
        check_match(index, prof, (words[b], got_counts[b]), rules=rules)


@by_algorithm
def test_candidates_are_the_eligible_slots(rng, config):
    rules = random_rules(rng, 700, p_constrain=0.2)
    index = DeviceTargetingIndex(TargetingIndex(rules))
    prof = random_profile(rng, rules.schema)
    elig = match_eligible(index, prof, config=config)
    want = check_match(index, prof, elig, rules=rules)
    cand = elig.candidates()
    assert cand.dtype == np.int32
    np.testing.assert_array_equal(cand.copy_to_host(), np.flatnonzero(want))
    np.testing.assert_array_equal(elig.candidates(np.int64).copy_to_host(), np.flatnonzero(want))
    with pytest.raises(ValueError, match="int64"):
        compact(elig.words, 1 << 32, elig.count, np.int32)
    with pytest.raises(TypeError, match="int32 or int64"):
        elig.candidates(np.uint32)


def test_cpu_baseline_takes_either_index(rng):
    rules = random_rules(rng, 300)
    host = TargetingIndex(rules, dense_min=2)
    dev = DeviceTargetingIndex(host)
    prof = random_profile(rng, rules.schema)
    excl = [0, 5, 299]
    words, count = match_cpu(dev, prof, exclude_slots=excl)
    check_match(host, prof, (words, count), rules=rules, exclude_slots=excl)
    again, again_count = match_cpu(host, prof, exclude_slots=excl)
    np.testing.assert_array_equal(again, words)
    assert again_count == count


def test_stale_device_copy_and_prepared_batch_raise(rng):
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


@by_algorithm
def test_empty_pool_matches_nothing(config):
    schema = random_schema()
    for capacity in (None, 10):
        rules = TargetingRules.from_records(schema, [])
        index = DeviceTargetingIndex(TargetingIndex(rules, capacity=capacity))
        got = match_eligible(index, {}, config=config)
        assert got.count == 0 and not got.to_mask().any()
        check_match(index, {}, got)
        batch = match_batch(index, [{}, {}], config=config)
        assert list(batch.counts) == [0, 0]


def test_launch_refuses_bad_arguments(rng):
    """Wrong types and sizes are refused before anything launches."""
    rules = random_rules(rng, 100)
    index = DeviceTargetingIndex(TargetingIndex(rules))
    prepared = index.prepare([{}, {}])
    cuda = launch.cuda()
    with pytest.raises(TypeError, match="MatchConfig"):
        index.launch(prepared, config={"group": 2})
    with pytest.raises(TypeError, match="MatchConfig"):
        match_eligible(index, {}, config="segment")
    with pytest.raises(TypeError, match="MatchConfig"):
        match_batch(index, [{}], config=4)
    with pytest.raises(TypeError, match="PreparedMatch"):
        index.launch([{}])
    with pytest.raises(ValueError, match="kernels must be a subset"):
        index.launch(prepared, kernels=("prep", "scatter"))
    with pytest.raises(ValueError, match="kernels must be a subset"):
        index.launch(prepared, kernels="match")
    with pytest.raises(ValueError, match="out must be uint64"):
        index.launch(prepared, out=cuda.device_array((1, index.n_words), np.uint64))
    with pytest.raises(ValueError, match="out must be uint64"):
        index.launch(prepared, out=cuda.device_array((2, index.n_words), np.int64))
    with pytest.raises(ValueError, match="counts must be int64"):
        index.launch(prepared, counts=cuda.device_array(1, np.int64))
    with pytest.raises(ValueError, match="counts must be int64"):
        index.launch(prepared, counts=cuda.device_array(2, np.int32))
    with pytest.raises(ValueError, match="1..64"):
        index.prepare([{}] * 65)
    with pytest.raises(ValueError, match="2 profiles but 1 exclude"):
        index.prepare([{}, {}], exclude_slots=[None])
    with pytest.raises(ValueError, match="n_words"):
        index.prepare([{}], n_words=index.n_words + 1)


def test_launch_with_a_subset_of_kernels_then_the_rest(rng):
    """The benchmark's stage timing: prep alone, then match and post, gives the full answer."""
    rules = random_rules(rng, 400)
    index = DeviceTargetingIndex(TargetingIndex(rules, dense_min=10**9))
    prof = random_profile(rng, rules.schema)
    prepared = index.prepare([prof])
    out, counts = index.launch(prepared, kernels=("prep",))
    index.launch(prepared, out, counts, kernels=("match", "post"))
    check_match(index, prof, (out[0], counts.copy_to_host()[0]), rules=rules)


@by_algorithm
def test_pool_prefix(rng, config):
    """``n_words``: the match of the first words of the pool only (pool-size sweeps)."""
    rules = random_rules(rng, 1000, p_constrain=0.3)
    index = DeviceTargetingIndex(TargetingIndex(rules, dense_min=4))
    prof = random_profile(rng, rules.schema)
    out, counts = index.launch(index.prepare([prof], [[3, 900]], n_words=5), config=config)
    check_match(index, prof, (out[0], counts.copy_to_host()[0]), rules=rules, exclude_slots=[3, 900], n_words=5)


def test_plan_ops_flags_each_category():
    """The grouped kernel's flat op list: first / last include row of each category flagged, an
    empty include set one ZERO op (its excludes dropped), excludes after their category's includes."""
    from andromeda_nb.match.kernels import OP_CLOSE, OP_EXC, OP_FIRST, OP_ZERO

    inc_ptr = np.array([0, 1, 4, 4, 6])
    inc_rows = np.array([10, 11, 12, 13, 14, 15])
    exc_ptr = np.array([0, 0, 1, 2, 3])
    exc_rows = np.array([20, 21, 22])
    rows, kinds = plan_ops(inc_ptr, inc_rows, exc_ptr, exc_rows)
    assert rows.tolist() == [10, 11, 12, 13, 20, 0, 14, 15, 22]
    assert kinds.tolist() == [OP_FIRST | OP_CLOSE, OP_FIRST, 0, OP_CLOSE, OP_EXC, OP_ZERO, OP_FIRST, OP_CLOSE, OP_EXC]


@by_algorithm
def test_launch_runs_the_configured_kernels(rng, config, monkeypatch):
    """Each config reaches its own kernels (the answers are equal by design, so only a record of
    the launched kernel factories shows that ``list_kernels``, ``group`` and ``prefetch`` route)."""
    from andromeda_nb.match import kernels as K

    launched = []
    for name in ("prep_kernel", "prep_segment_kernel", "match_kernel", "match_grouped_kernel", "post_kernel",
                 "post_segment_kernel"):
        def spy(*args, _name=name, _real=getattr(K, name)):
            launched.append((_name, args))
            return _real(*args)

        monkeypatch.setattr(K, name, spy)
    rules = random_rules(rng, 200, p_constrain=0.6, p_exclude=0.3)
    index = DeviceTargetingIndex(TargetingIndex(rules, dense_min=10**9, exclude_dense_min=10**9))
    prof = random_profile(rng, rules.schema)
    check_match(index, prof, match_eligible(index, prof, exclude_slots=[0], config=config), rules=rules,
                exclude_slots=[0])
    lists = "_segment" if config.list_kernels == "segment" else ""
    sim = launch.backend.is_simulator()
    U, block, bounds = config.words_per_thread, config.block_size(sim), config.launch_bounds(sim)
    match = ("match_grouped_kernel", (block, U, config.group, bounds)) if config.group else \
        ("match_kernel", (block, U, bounds, config.prefetch))
    assert [name for name, _ in launched] == [f"prep{lists}_kernel", match[0], f"post{lists}_kernel"]
    assert launched[1][1] == match[1]
