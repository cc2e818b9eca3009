"""topk/config.py: the configuration's validation, the auto rule of the paths, and the refusals of a
config that cannot run (before any launch)."""

import numpy as np
import pytest

from andromeda_nb.topk import api as T
from andromeda_nb.topk.config import (BLOCK_TOPK_MAX_K, DEFAULT_CONFIG, PATHS, TopKConfig, TopKTuning, check_config,
                                      choose_path)

from .helpers import small_seed


def test_defaults_are_the_documented_choices():
    t = DEFAULT_CONFIG.tuning
    assert (DEFAULT_CONFIG.path, DEFAULT_CONFIG.final_merge, DEFAULT_CONFIG.final) == ("auto", "radix", "auto")
    assert not DEFAULT_CONFIG.sort_warp_sync and not DEFAULT_CONFIG.onelaunch_warp_sync
    assert (t.seed_min_n, t.sample_chunk, t.max_sample_chunks, t.seed_margin, t.seed_min_rank) == (65536, 256, 4096,
                                                                                                     2.5, 8)
    assert (t.seed_sample_rank, t.seed_cand_cap, t.filter_cap_per_k, t.filter_min_cap) == (64, 1 << 17, 64, 4096)
    assert (t.filter_stage, t.batch_filter_rounds, t.rank_cap, t.small_max_n, t.rerun_one_by_one) == (
        1024, 16, 8192, 1 << 20, 8)
    assert TopKConfig() == DEFAULT_CONFIG and hash(TopKConfig()) == hash(DEFAULT_CONFIG)  # a cache key


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(path="fast"), ValueError, "path"), (dict(final_merge="sort"), ValueError, "final_merge"),
    (dict(final="sort"), ValueError, "final"), (dict(final=np.array(["radix"])), ValueError, "final"),
    (dict(path=np.array(["auto"])), ValueError, "path"),
    (dict(sort_warp_sync=1), TypeError, "sort_warp_sync"), (dict(tuning={"seed_min_n": 5}), TypeError, "TopKTuning"),
])
def test_bad_config_is_refused(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        TopKConfig(**kwargs)


@pytest.mark.parametrize("field,value", [("seed_min_n", 0), ("sample_chunk", 2.0), ("rank_cap", True),
                                         ("seed_margin", 0), ("seed_margin", "2"), ("seed_margin", float("inf")), ("seed_margin", 1e300), ("filter_stage", -1),
                                         ("rerun_one_by_one", -1)])
def test_bad_tuning_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        TopKTuning(**{field: value})
    TopKTuning(rerun_one_by_one=0, small_max_n=0)  # zero: never rerun one by one; never the batch of one


def test_numpy_numbers_are_plain_numbers():
    """Kernel sizes come from the tuning: a numpy integer is taken as its Python int (and a config
    built from numpy values is the same cache key as one built from Python values)."""
    t = TopKTuning(rank_cap=np.int64(64), seed_margin=np.float32(0.5))
    assert type(t.rank_cap) is int and type(t.seed_margin) is float
    assert TopKConfig(tuning=t) == TopKConfig(tuning=TopKTuning(rank_cap=64, seed_margin=0.5))


def test_check_config():
    assert check_config(None) is DEFAULT_CONFIG
    cfg = TopKConfig(path="scan")
    assert check_config(cfg) is cfg
    with pytest.raises(TypeError, match="TopKConfig"):
        check_config({"path": "scan"})


def test_auto_rule():
    t = DEFAULT_CONFIG.tuning
    rule = lambda n, k, seeded=True: choose_path(DEFAULT_CONFIG, n, k, seeded)  # noqa: E731
    assert rule(t.seed_min_n - 1, 10) == "filter"  # below seed_min_n: "filter" finds no seed, runs unseeded
    assert rule(t.seed_min_n, 10) == rule(t.small_max_n, 10) == "batched"
    assert rule(t.small_max_n + 1, 10) == "filter"
    assert rule(t.seed_min_n, BLOCK_TOPK_MAX_K + 1) == "filter"  # only the radix finals hold such a k
    assert rule(10**6, 10, seeded=False) == "unseeded"
    small = TopKConfig(tuning=TopKTuning(seed_min_n=100, small_max_n=200))
    assert [choose_path(small, n, 5) for n in (99, 100, 200, 201)] == ["filter", "batched", "batched", "filter"]
    for path in PATHS[1:]:  # an explicit path is taken whatever the size
        assert choose_path(TopKConfig(path=path), 10, 5) == path


def test_path_conflicts_are_refused_before_any_launch(monkeypatch):
    s = np.zeros(3000, np.float32)
    monkeypatch.setattr(T, "topk_one", lambda *a, **kw: pytest.fail("launched"))
    with pytest.raises(ValueError, match="seeded=False"):
        T.topk_scores(s, 5, seeded=False, config=small_seed("filter"))
    with pytest.raises(ValueError, match="'scan' runs the block top-K"):
        T.topk_scores(s, BLOCK_TOPK_MAX_K + 1, config=TopKConfig(path="scan"))
    with pytest.raises(TypeError, match="TopKConfig"):
        T.topk_scores(s, 5, config="filter")
    for path in ("filter", "scan"):
        with pytest.raises(ValueError, match="one request"):
            T.topk_batch(s, [0, 3000], [5], config=TopKConfig(path=path))
    with pytest.raises(ValueError, match="'unseeded' runs the block top-K"):
        T.topk_batch(s, [0, 3000], [BLOCK_TOPK_MAX_K + 1], config=TopKConfig(path="unseeded"))
    with pytest.raises(TypeError, match="TopKConfig"):
        T.topk_batch(s, [0, 3000], [5], config=object())
