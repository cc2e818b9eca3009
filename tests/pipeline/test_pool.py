"""Pool.retrieve against the reference: match on the host rules, top-k of the kernel's own scores
(exact: same ids, order and scores), and the float64 scores up to near-ties."""

import numpy as np
import pytest

import andromeda_nb as anb
from andromeda_nb import checks, reference
from andromeda_nb.device import launch
from andromeda_nb.pipeline import Pool
from andromeda_nb.score import DeviceAdTable, DeviceRequest, score_ads
from andromeda_nb.targeting import RuleError, TargetingIndex, make_profile

from ..helpers import check_topk_against_float64, random_profile, random_rules

D = 16


def world(rng, n, dtype="fp16", capacity=None, shuffle=False, **rule_args):
    rules = random_rules(rng, n, **rule_args)
    ids = rules.ad_ids[rng.permutation(n)] if shuffle else rules.ad_ids
    table = anb.AdTable.from_float(rng.standard_normal((n, D)), rng.standard_normal(n), dtype=dtype, ad_ids=ids)
    return rules, table, TargetingIndex(rules, capacity=capacity)


def check_pool_answer(out, req, rules, pool, prof, k, excluded=()):
    """``out`` equals the reference's top-k over the pool's own kernel scores, and float64 up to near-ties."""
    ids = pool.table.host_ad_ids
    elig = np.zeros(ids.size, bool)
    live = ids >= 0
    elig[:rules.n_ads] = reference.match(rules, make_profile(rules.schema, prof))
    elig &= live
    elig[list(excluded)] = False
    scores = score_ads(req, pool.table).copy_to_host()
    want = reference.topk(scores, k, ids=ids, eligible=elig)
    np.testing.assert_array_equal(out.ids, want.ids)
    np.testing.assert_array_equal(out.scores, want.scores)
    assert out.n_eligible == elig.sum()
    assert out.n_scored == want.count
    assert not np.isin(out.ids[out.ids >= 0], ids[~live]).any()
    return elig


@pytest.mark.parametrize("dtype", ["fp16", "int8"])
def test_batch_equals_the_reference(rng, dtype):
    """Requests with more eligible ads than the simulator's 256-score seed sample (the sampled seed),
    fewer (the whole list sampled), none, and k above the eligible count (pads)."""
    n = 900
    rules, table, index = world(rng, n, dtype, p_constrain=0.15, p_exclude=0.05)
    pool = Pool(table, index, max_batch=4, max_k=40)
    reqs = [anb.Request.random(D, 4, 2, rng) for _ in range(4)]
    profs = [random_profile(rng, rules.schema) for _ in range(4)]
    excl = [None, None, np.arange(100, n), np.arange(n)]
    outs = pool.retrieve(reqs, profs, k=30, exclude_slots=excl)
    counts = []
    order = table.slots_of(pool.table.host_ad_ids)
    for req, prof, out, ex in zip(reqs, profs, outs, excl):
        elig = check_pool_answer(out, req, rules, pool, prof, 30, () if ex is None else ex)
        counts.append(int(elig.sum()))
        math = pool.config.with_math(DeviceRequest.of(req), pool.table).math
        assert math == "fp16"  # the default on fp16 and int8 tables alike
        check_topk_against_float64(out.ids, out.scores, reference.score(req, table, math=math)[order],
                                   pool.table.host_ad_ids, 30, elig, checks.near_tie_ads(req, table, math)[order])
    assert counts[0] > 256 and counts[1] > 256 and 0 < counts[2] < 256 and counts[3] == 0
    assert np.all(outs[3].ids == -1) and np.all(outs[3].scores == -np.inf)


def test_mixed_shapes_dot_requests_and_chunks(rng):
    """Requests of several (E, K), a two-tower user vector, and more requests than max_batch: every
    answer in request order."""
    rules, table, index = world(rng, 300)
    pool = Pool(table, index, max_batch=2, max_k=10)
    reqs = [anb.Request.random(D, 2, 1, rng), rng.standard_normal(D).astype(np.float32),
            anb.Request.random(D, 5, 3, rng), anb.Request.random(D, 2, 1, rng), anb.Request.random(D, 2, 1, rng)]
    profs = [random_profile(rng, rules.schema) for _ in reqs]
    outs = pool.retrieve(reqs, profs, k=7, exclude_slots=[None, [0, 1, 2], None, None, [5]])
    for req, prof, out, ex in zip(reqs, profs, outs, [(), (0, 1, 2), (), (), (5,)]):
        check_pool_answer(out, req, rules, pool, prof, 7, ex)
    one = pool.retrieve(reqs[0], profs[0], k=3)
    assert np.array_equal(one.ids, outs[0].ids[:3])


def test_free_slots_and_a_table_in_another_order(rng):
    """An index with spare capacity (free slots) and a host table whose rows are in another order:
    the pool places the table on the index's slots by ad id; free slots are never returned."""
    rules, table, index = world(rng, 200, capacity=260, shuffle=True, live_p=1.0)
    pool = Pool(table, index, max_batch=2, max_k=20)
    assert pool.n_free == 60 and pool.n_ads == 260
    req = anb.Request.random(D, 3, 2, rng)
    prof = random_profile(rng, rules.schema)
    check_pool_answer(pool.retrieve(req, prof, k=20), req, rules, pool, prof, 20)
    whole = Pool(pool.table, None, max_k=20)  # no index: the whole pool but its free slots
    got = whole.retrieve(req, k=20)
    scores = score_ads(req, pool.table).copy_to_host()
    want = reference.topk(scores, 20, ids=pool.table.host_ad_ids, eligible=pool.table.host_ad_ids >= 0)
    np.testing.assert_array_equal(got.ids, want.ids)
    assert got.n_eligible == 200


def test_reruns_are_exact(rng):
    """A request with more eligible ads than its candidate list, and one whose tied scores overflow
    the filter's buffer, are answered again over their bitsets, exactly."""
    rules, table, index = world(rng, 600, p_constrain=0.1)
    emb = np.repeat(rng.standard_normal((1, D)), 600, axis=0)
    tied = anb.AdTable.from_float(emb, np.zeros(600), dtype="fp16", ad_ids=table.ad_ids)
    req = anb.Request.random(D, 3, 2, rng)
    prof = random_profile(rng, rules.schema)
    small = Pool(table, index, max_batch=1, max_k=10, candidate_fraction=0.05)
    out = small.retrieve(req, prof, k=10)
    assert out.n_eligible > small.candidate_capacity
    check_pool_answer(out, req, rules, small, prof, 10)
    ties = Pool(tied, index, max_batch=1, max_k=10, filter_capacity=32)
    out = ties.retrieve(req, prof, k=10)
    assert out.n_eligible > 32
    check_pool_answer(out, req, rules, ties, prof, 10)


def test_nan_scores_are_never_returned(rng):
    # every ad eligible for the empty profile (no rules), so NaN rows are always among the eligible
    rules, table, index = world(rng, 120, p_constrain=0.0, p_exclude=0.0, live_p=1.0)
    emb = rng.standard_normal((120, D))
    emb[::3] = np.nan
    nan_table = anb.AdTable.from_float(emb, np.zeros(120), dtype="fp16", ad_ids=table.ad_ids, allow_nonfinite=True)
    pool = Pool(nan_table, index, max_batch=1, max_k=120)
    req = anb.Request.random(D, 2, 2, rng)
    prof = {}
    out = pool.retrieve(req, prof, k=120)
    check_pool_answer(out, req, rules, pool, prof, 120)
    assert out.n_scored < out.n_eligible and np.isfinite(out.scores[out.ids >= 0]).all()


def test_bad_input_is_refused_before_any_launch(rng, monkeypatch):
    """Every bad argument, profile or request shape is refused before any launch (a request's
    weights are checked before any launch that reads them: test_a_refused_request_leaves_the_pool_serving)."""
    rules, table, index = world(rng, 64)
    pool = Pool(table, index, max_batch=2, max_k=10)
    req = anb.Request.random(D, 2, 1, rng)
    prof = random_profile(rng, rules.schema)

    def boom(*a, **kw):
        raise AssertionError("a launch")

    monkeypatch.setattr(launch.BoundLaunch, "__call__", boom)
    monkeypatch.setattr(pool.index, "launch", boom)
    with pytest.raises(ValueError, match="max_k"):
        pool.retrieve(req, prof, k=11)
    with pytest.raises(ValueError, match="k=0"):
        pool.retrieve(req, prof, k=0)
    with pytest.raises(ValueError, match="d=32"):
        pool.retrieve(anb.Request.random(32, 2, 1, rng), prof, k=3)
    with pytest.raises(ValueError, match="2 requests but 1 profiles"):
        pool.retrieve([req, req], [prof], k=3)
    with pytest.raises(ValueError, match="profile"):
        pool.retrieve(req, None, k=3)
    with pytest.raises(RuleError):
        pool.retrieve(req, {"no such category": 1}, k=3)
    with pytest.raises(ValueError, match="slot"):
        pool.retrieve(req, prof, k=3, exclude_slots=[64])
    with pytest.raises(TypeError):
        pool.retrieve("request", prof, k=3)
    # a bad request or profile in a later chunk of a batch (max_batch 2): refused before the first chunk runs
    wide = anb.Request(V=req.V, G=np.full_like(req.G, 3e38), gamma=req.gamma, beta=req.beta, k_experts=1)
    with pytest.raises(ValueError, match="fp32"):
        pool.retrieve([req] * 4 + [wide], [prof] * 5, k=3)
    with pytest.raises(RuleError):
        pool.retrieve([req] * 5, [prof] * 4 + [{"no such category": 1}], k=3)
    other = anb.AdTable.from_float(np.zeros((64, D)), dtype="fp16", ad_ids=np.arange(1000, 1064))
    with pytest.raises(ValueError, match="lacks"):
        Pool(other, index)
    with pytest.raises(ValueError, match="max_batch"):
        Pool(table, index, max_batch=0)
    with pytest.raises(ValueError, match="candidate_fraction"):
        Pool(table, index, candidate_fraction=0)
    with pytest.raises(ValueError, match="disagree"):
        Pool(DeviceAdTable(other, "rows"), index)


def test_a_pool_refuses_to_serve_after_its_index_changed(rng):
    """Updates applied to the index after the pool was built move slots the pool's table does not
    follow: retrieve refuses rather than return a retired ad."""
    from andromeda_nb.match import DeviceTargetingIndex
    from andromeda_nb.targeting import UpdateBatch

    rules, table, index = world(rng, 60, capacity=70, live_p=1.0)
    dev = DeviceTargetingIndex(index)
    pool = Pool(table, dev, max_batch=1, max_k=5)
    req = anb.Request.random(D, 2, 1, rng)
    pool.retrieve(req, {}, k=3)
    dev.apply(UpdateBatch.from_records(rules.schema, [{"op": "retire", "ad_id": int(table.ad_ids[0])}]))
    with pytest.raises(RuntimeError, match="updated"):
        pool.retrieve(req, {}, k=3)


def test_a_refused_request_leaves_the_pool_serving(rng):
    """A batch of one shape has its match enqueued before its requests' weights are checked: a
    request refused then (beyond fp32's range) leaves the pool answering the next call exactly."""
    rules, table, index = world(rng, 120, p_constrain=0.2)
    pool = Pool(table, index, max_batch=4, max_k=10)
    req = anb.Request.random(D, 2, 1, rng)
    wide = anb.Request(V=req.V, G=np.full_like(req.G, 3e38), gamma=req.gamma, beta=req.beta, k_experts=1)
    profs = [random_profile(rng, rules.schema) for _ in range(2)]
    for bad in (wide, [req, wide]):
        with pytest.raises(ValueError, match="fp32"):
            pool.retrieve(bad, profs[0] if bad is wide else profs, k=10)
        for prof, out in zip(profs, pool.retrieve([req, req], profs, k=10)):
            check_pool_answer(out, req, rules, pool, prof, 10)


def test_pool_edge_tables(rng):
    """Ad ids anywhere in int64 (no placeholder can collide), an empty pool (pads), a table holding
    ads the index lacks (refused: they could never be served)."""
    from andromeda_nb.targeting import TargetingRules

    rules, table, index = world(rng, 50, capacity=60, live_p=1.0)
    ids = table.ad_ids.copy()
    ids[0] = (1 << 62) + 55  # what a free slot's placeholder would once have been
    rules2 = TargetingRules.from_columns(rules.schema, ids, rules.live, rules.include, rules.exclude)
    table2 = anb.AdTable(embeddings=table.embeddings, bias=table.bias, dtype="fp16", scale=None, ad_ids=ids)
    pool = Pool(table2, TargetingIndex(rules2, capacity=60), max_batch=1, max_k=5)
    req = anb.Request.random(D, 2, 1, rng)
    check_pool_answer(pool.retrieve(req, {}, k=5), req, rules2, pool, {}, 5)
    empty_rules = TargetingRules.from_columns(rules.schema, np.zeros(0, np.int64))
    empty = Pool(anb.AdTable.from_float(np.zeros((0, D)), dtype="fp16"), TargetingIndex(empty_rules), max_k=5)
    out = empty.retrieve(req, {}, k=5)
    assert np.all(out.ids == -1) and out.n_eligible == 0
    with pytest.raises(RuleError):  # nothing to match, but a bad profile is still refused
        empty.retrieve(req, {"no such category": 1}, k=5)
    extra = anb.AdTable.from_float(rng.standard_normal((51, D)), dtype="fp16", ad_ids=np.append(table.ad_ids, 10 ** 9))
    with pytest.raises(ValueError, match="index does not"):
        Pool(extra, index)


def test_a_batch_with_one_profile_mapping_is_refused(rng):
    rules, table, index = world(rng, 60)
    pool = Pool(table, index, max_batch=4, max_k=10)
    req = anb.Request.random(D, 4, 2, rng)
    with pytest.raises(ValueError, match="list of profiles"):
        pool.retrieve([req, req], random_profile(rng, rules.schema), k=5)


def test_pool_options_are_checked_when_it_is_built(rng):
    rules, table, index = world(rng, 40)
    for config in (anb.KernelConfig(naive=True), anb.KernelConfig(tensor_cores=True)):
        with pytest.raises(ValueError, match="Pool"):
            Pool(table, index, config=config)
    rules32, table32, index32 = world(rng, 40, dtype="fp32")
    with pytest.raises(ValueError, match="fp16"):
        Pool(table32, index32, config=anb.KernelConfig(math="fp16"))
    with pytest.raises(ValueError, match="max_k"):
        Pool(table, index, max_k=0)
    assert Pool(table, index, filter_capacity=1 << 40).filter_capacity == 40
    with pytest.raises(ValueError, match="launches"):
        Pool(table, index, launches="graphs")
    if launch.backend.is_simulator():
        with pytest.raises(ValueError, match="simulator"):
            Pool(table, index, launches="graph")
        assert Pool(table, index).launches == "bound"
    else:
        assert Pool(table, index).launches == "graph"


@pytest.mark.gpu
def test_graph_replays_answer_as_bound_launches(rng):
    """The captured graph replayed call after call (new weights and plans each time, the batch
    size changing between calls) answers exactly as the same steps launched one by one."""
    rules, table, index = world(rng, 5000, p_constrain=0.15, p_exclude=0.05)
    graph, bound = Pool(table, index, max_batch=8, max_k=50), Pool(table, index, max_batch=8, max_k=50,
                                                                    launches="bound")
    assert graph.launches == "graph"
    for B in (1, 3, 1, 8, 3):
        reqs = [anb.Request.random(D, 4, 2, rng) for _ in range(B)]
        profs = [random_profile(rng, rules.schema) for _ in range(B)]
        for a, b, req, prof in zip(graph.retrieve(reqs, profs, k=40), bound.retrieve(reqs, profs, k=40), reqs, profs):
            np.testing.assert_array_equal(a.ids, b.ids)
            np.testing.assert_array_equal(a.scores, b.scores)
            assert (a.n_eligible, a.n_scored) == (b.n_eligible, b.n_scored)
            check_pool_answer(a, req, rules, graph, prof, 40)
    assert all(g._graphs and all(v is not None for v in g._graphs.values()) for g in graph._groups.values())


def test_retrieve_takes_one_request_of_any_form(rng):
    from andromeda_nb.pipeline import retrieve
    from andromeda_nb.score import DeviceRequest

    rules, table, index = world(rng, 80)
    pool = Pool(table, index, max_k=5)
    req = anb.Request.random(D, 2, 1, rng)
    prof = random_profile(rng, rules.schema)
    want = pool.retrieve(req, prof, k=5)
    for one in (DeviceRequest.of(req),):
        got = retrieve(one, pool.table, pool.index, prof, 5)
        assert np.array_equal(got.ids, want.ids)
    user = rng.standard_normal(D).astype(np.float32)
    got = retrieve(user, pool.table, pool.index, prof, 5)
    check_pool_answer(got, user, rules, pool, prof, 5)
    as_list = pool.retrieve(user.tolist(), prof, k=5)  # a list of numbers is one user vector, not a batch
    np.testing.assert_array_equal(as_list.ids, got.ids)
    batch = pool.retrieve([user.tolist(), req], [prof, prof], k=5)
    np.testing.assert_array_equal(batch[0].ids, got.ids)
    np.testing.assert_array_equal(batch[1].ids, want.ids)


def test_a_request_past_the_fp16_range_is_named_in_its_batch(rng):
    rules, table, index = world(rng, 60)
    pool = Pool(table, index, max_batch=4, max_k=5, config=anb.KernelConfig(math="fp16"))
    reqs = [anb.Request.random(D, 2, 1, rng) for _ in range(3)]
    r = reqs[2]
    reqs[2] = anb.Request(V=r.V, G=r.G, gamma=r.gamma * 1e6, beta=r.beta, k_experts=1)
    with pytest.raises(ValueError, match="request 2 of the batch.*gamma"):
        pool.retrieve(reqs, [{}] * 3, k=5)


@pytest.mark.parametrize("tile_order, f16_weights, rows_ahead",
                         [("tiles", "auto", "auto"), ("steps", "auto", "auto"), ("tiles", "shared", 2),
                          pytest.param("tiles", "shared", "auto", marks=pytest.mark.slow)])
def test_fp16_math_pool_equals_its_model(rng, tile_order, f16_weights, rows_ahead, monkeypatch):
    """math='fp16': the filter pass on the tensor cores over every request's candidates; answers are
    the exact top-k of the fp16 model's scores (score_ads with the same config), the sampled seed
    (fp32 on the CUDA cores) only decides how many scores the filter keeps. Either tile order, the
    weights in registers or shared memory, one or two rounds of rows in flight (the batched filter
    pass is built with the config's rounds)."""
    from andromeda_nb.score import fused

    built, real = [], fused.fused_kernel
    monkeypatch.setattr(fused, "fused_kernel", lambda *a, **kw: built.append(kw) or real(*a, **kw))
    rules, table, index = world(rng, 700, p_constrain=0.15, p_exclude=0.05)
    config = anb.KernelConfig(math="fp16", tile_order=tile_order, f16_weights=f16_weights, rows_ahead=rows_ahead)
    pool = Pool(table, index, max_batch=3, max_k=20, config=config)
    reqs = [anb.Request.random(D, 4, 2, rng) for _ in range(3)]
    profs = [random_profile(rng, rules.schema) for _ in range(3)]
    for req, prof, out in zip(reqs, profs, pool.retrieve(reqs, profs, k=20)):
        elig = reference.match(rules, make_profile(rules.schema, prof))
        scores = score_ads(req, pool.table, config=config).copy_to_host()
        want = reference.topk(scores, 20, ids=pool.table.host_ad_ids, eligible=elig)
        np.testing.assert_array_equal(out.ids, want.ids)
        np.testing.assert_array_equal(out.scores, want.scores)
        assert out.n_eligible == elig.sum()
    assert any(kw.get("batched") and kw.get("math") == "fp16" and kw.get("rows_ahead") == config.kernel_rows_ahead()
               for kw in built)



def test_auto_math_pool_serves_each_request_in_its_math(rng):
    """math='auto': requests within fp16's range in fp16 math, one beyond it (|gamma| max|a| past
    65504) in fp32 math, in one batch; each answer the exact top-k of its own math's scores."""
    from andromeda_nb.score.table import DeviceRequest

    rules, table, index = world(rng, 500, p_constrain=0.15, p_exclude=0.05)
    auto = anb.KernelConfig(math="auto")
    pool = Pool(table, index, max_batch=4, max_k=10, config=auto)
    reqs = [anb.Request.random(D, 4, 2, rng) for _ in range(3)]
    wide = anb.Request(V=reqs[0].V, G=reqs[0].G, gamma=reqs[0].gamma * 3e4, beta=reqs[0].beta, k_experts=2)
    reqs.insert(1, wide)
    profs = [random_profile(rng, rules.schema) for _ in reqs]
    maths = [auto.with_math(DeviceRequest.of(r), pool.table).math for r in reqs]
    assert maths == ["fp16", "fp32", "fp16", "fp16"]
    for req, prof, math, out in zip(reqs, profs, maths, pool.retrieve(reqs, profs, k=10)):
        elig = reference.match(rules, make_profile(rules.schema, prof))
        scores = score_ads(req, pool.table, config=anb.KernelConfig(math=math)).copy_to_host()
        want = reference.topk(scores, 10, ids=pool.table.host_ad_ids, eligible=elig)
        np.testing.assert_array_equal(out.ids, want.ids)
        np.testing.assert_array_equal(out.scores, want.scores)


def test_profiles_in_columns_answer_as_dicts(rng):
    """A ProfileBatch (columns) gives the answers of the same profiles as dicts; malformed columns
    are refused before anything launches, naming the request."""
    from andromeda_nb.targeting import ProfileBatch

    rules, table, index = world(rng, 300, p_constrain=0.3, p_exclude=0.1)
    pool = Pool(table, index, max_batch=2, max_k=6)
    reqs = [anb.Request.random(D, 2, 1, rng) for _ in range(3)] + [rng.standard_normal(D)]
    profs = [random_profile(rng, rules.schema) for _ in range(4)]
    batch = ProfileBatch.from_profiles(rules.schema, profs)
    assert len(batch) == 4 and [make_profile(rules.schema, p) for p in batch] == [
        make_profile(rules.schema, p) for p in profs]
    for got, want in zip(pool.retrieve(reqs, batch, k=6), pool.retrieve(reqs, profs, k=6)):
        np.testing.assert_array_equal(got.ids, want.ids)
        assert got.n_eligible == want.n_eligible
    one = pool.retrieve(reqs[0], batch.take([0]), k=6)
    np.testing.assert_array_equal(one.ids, pool.retrieve(reqs[0], profs[0], k=6).ids)
    cols = (batch.ptr, batch.category, batch.value)
    C = len(rules.schema)
    single = next(i for i, c in enumerate(rules.schema) if not c.multi_valued)
    cat = rules.schema.categories[single]
    for ptr, category, value, match in (
            (cols[0][:-1], cols[1], cols[2], "ptr"), (cols[0], np.full_like(cols[1], C), cols[2], "category index"),
            ([0, 1], [single], [cat.cardinality], "out of range"), ([0, 2], [single, single], [0, 1], "single-valued"),
            (cols[0], cols[1], cols[2].astype(float), "integer")):
        with pytest.raises(RuleError, match=match):
            ProfileBatch.from_columns(rules.schema, ptr, category, value)
    with pytest.raises(ValueError, match="requests but"):
        pool.retrieve(reqs[:2], batch, k=6)


def test_profile_batch_take_checks_its_indices(rng):
    """ProfileBatch.take and indexing: negative indices count from the end (as a slice's do), an
    index outside the batch is an IndexError and a float or bool one a TypeError, never another
    request's profile or a truncated index."""
    from andromeda_nb.targeting import ProfileBatch

    rules, _, _ = world(rng, 50, p_constrain=0.3, p_exclude=0.1)
    profs = [random_profile(rng, rules.schema) for _ in range(6)]
    batch = ProfileBatch.from_profiles(rules.schema, profs)
    canon = [make_profile(rules.schema, p) for p in profs]
    for idx in ([4, 0], [-2], [-6, 5], np.array([3], np.uint8), range(1, 4)):
        want = [canon[i] for i in idx]
        assert [make_profile(rules.schema, p) for p in batch.take(idx)] == want
    assert [make_profile(rules.schema, p) for p in batch[-3:]] == canon[-3:]
    assert len(batch.take([])) == 0
    for idx in ([6], [-7], [0, 99]):
        with pytest.raises(IndexError, match="out of range for a batch of 6"):
            batch.take(idx)
    for idx in ([1.9], [True], np.array([0.0])):
        with pytest.raises(TypeError, match="integer indices"):
            batch.take(idx)


def test_importing_the_request_path_leaves_the_cuda_backend_unchosen():
    """`set_backend("auto")` picks the simulator without a GPU only if nothing imported numba.cuda
    first: the notebooks import the pipeline (through analysis.evaluation) before choosing."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    code = ("import sys, andromeda_nb.pipeline, andromeda_nb.analysis.evaluation, andromeda_nb.serving; "
            "assert 'numba.cuda' not in sys.modules, 'numba.cuda imported'")
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_a_pool_built_on_one_thread_answers_on_another(rng):
    """A thread that never touched the device has no current context; the pool makes it current
    (a Dask worker builds its pool on one thread and may serve it on another): the answers and
    an update applied there are the pool's own."""
    import threading

    rules, table, index = world(rng, 300)
    pool = Pool(table, index, max_batch=2, max_k=20)
    req, prof = anb.Request.random(D, 3, 2, rng), random_profile(rng, rules.schema)
    got = {}

    def serve():
        try:
            got["out"] = pool.retrieve(req, prof, k=20)
        except Exception as e:  # the assertion below names it
            got["error"] = e

    t = threading.Thread(target=serve)
    t.start()
    t.join()
    assert "error" not in got, got.get("error")
    check_pool_answer(got["out"], req, rules, pool, prof, 20)
