"""Shared checks against the oracle (docs/design.md, "Checking against the oracle")."""

import numpy as np

from andromeda_nb import checks
from andromeda_nb.model import AdTable, Request
from andromeda_nb.targeting import Category, TargetingRules, TargetingSchema


def small_seed_config(**tuning):
    """A TopKConfig whose seed pays from 256 items (chunks of 16, at most 16 of them): at the
    simulator's sizes ``score_topk(path="auto")`` then takes the filter path, as it does on a GPU's
    large pools (the defaults seed from 65,536 items up)."""
    from andromeda_nb.topk.config import TopKConfig, TopKTuning

    return TopKConfig(tuning=TopKTuning(max_sample_chunks=16, sample_chunk=16, seed_min_n=256, **tuning))


def filter_path_only(monkeypatch) -> None:
    """Make ``score_topk``'s block top-K launch fail: a call that still answers was answered by the
    filter path (which falls back to the block top-K when its seed is not exact)."""
    from andromeda_nb.score import api

    def refuse(*args, **kwargs):
        raise AssertionError("score_topk fell back to the block top-K")

    monkeypatch.setattr(api, "launch_score_topk", refuse)


def check_scores(got, request: Request, table: AdTable, math: str = "fp32"):
    """Assert kernel scores match the oracle of ``math``'s model (andromeda_nb.checks.compare_scores)."""
    result = checks.compare_scores(got, request, table, math=math)
    assert result.ok, result.message


def check_topk_against_float64(ids, scores, ref_scores, all_ids, k, eligible=None, swappable=None):
    """Assert ids differ from the float64 oracle's only among near-ties of the k-th score (or at
    ads ``swappable`` marks: near-tied gate logits, checks.near_tie_ads)."""
    result = checks.compare_topk_float64(ids, ref_scores, k, all_ids, eligible, swappable)
    assert result.ok, result.message


class _PoisonedNumpy:
    """numpy, except ``empty`` fills its arrays with 0xA5 bytes."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(shape, dtype):
        a = np.empty(shape, dtype)
        a.view(np.uint8)[...] = 0xA5
        return a


def poison_shared_memory(monkeypatch) -> None:
    """Make the simulator's shared arrays start as 0xA5 bytes (it allocates them with the numpy of
    its kernel API), as uninitialised shared memory may hold on a GPU: a kernel reading shared
    memory it never wrote then sees garbage. Simulator only."""
    import numba.cuda.simulator.kernelapi as kernelapi

    monkeypatch.setattr(kernelapi, "np", _PoisonedNumpy())


def poison_device_arrays(monkeypatch) -> None:
    """Make the simulator's ``cuda.device_array`` return arrays of 0xA5 bytes instead of whatever
    ``np.ndarray`` memory holds (often zeros, or a previous call's answer), as device memory may
    on a GPU: an output element a kernel never writes then shows. Simulator only."""
    import numba.cuda as nbcuda

    real = nbcuda.device_array

    def poisoned(*args, **kwargs):
        a = real(*args, **kwargs)
        host = np.empty(a.shape, a.dtype)
        host.reshape(-1).view(np.uint8)[...] = 0xA5
        a.copy_to_device(host)
        return a

    monkeypatch.setattr(nbcuda, "device_array", poisoned)


def random_schema():
    return TargetingSchema([
        Category("age", 7), Category("gender", 2), Category("country", 5),
        Category("interest", 30, multi_valued=True), Category("audience", 12, multi_valued=True),
    ])


def random_rules(rng, n: int, schema=None, p_constrain=0.4, p_exclude=0.2, live_p=0.9) -> TargetingRules:
    """Small random rule set (records path) with includes, excludes, dead ads."""
    schema = schema or random_schema()
    ids = rng.choice(10 * n + 10, size=n, replace=False)
    recs = [{"ad_id": int(ids[i]), "live": bool(rng.random() < live_p),
             **random_rule(rng, schema, p_constrain, p_exclude)} for i in range(n)]
    return TargetingRules.from_records(schema, recs)


def random_rule(rng, schema, p_constrain=0.4, p_exclude=0.2) -> dict:
    """One ad's random ``include`` / ``exclude`` sets (a record's rule part)."""
    r = {"include": {}, "exclude": {}}
    for c in schema:
        if rng.random() < p_constrain:
            r["include"][c.name] = rng.choice(c.cardinality, rng.integers(1, min(4, c.cardinality) + 1),
                                              replace=False).tolist()
        if rng.random() < p_exclude:
            r["exclude"][c.name] = rng.choice(c.cardinality, 1).tolist()
    return r


def random_profile(rng, schema) -> dict:
    prof = {}
    for c in schema:
        if c.multi_valued:
            prof[c.name] = rng.choice(c.cardinality, rng.integers(0, 4), replace=False).tolist()
        elif rng.random() < 0.85:
            prof[c.name] = int(rng.integers(c.cardinality))
    return prof
