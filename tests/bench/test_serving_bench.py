"""The serving bench's measurements run end to end on simulator workers (tiny pools, few calls):
every topology's row verified against the in-process pool, the sharded rows exact, the scaling
phase's rows from one worker and none where the host lacks the GPUs. Slow: worker processes."""

import re
from dataclasses import replace

import pytest

from andromeda_nb.bench import harness
from andromeda_nb.bench import serving as S

pytest.importorskip("distributed")
pytestmark = pytest.mark.slow


class Planned:
    def __init__(self, case):
        self.case = case


def test_every_serving_row_is_verified_on_simulator_workers(tmp_path, monkeypatch):
    monkeypatch.setenv("ANDROMEDA_SCRATCH", str(tmp_path / "scratch"))  # the processes' shared rules
    # drawn: the eligible phase's profiles, drawn at setup whatever the phase (2,048 by default: each
    # a retrieve, ten minutes under the simulator)
    run = S.Run({"device": "simulator", "commit": "test"}, harness.Ceilings(1.0, 1.0, 1.0), harness.Options(),
                calls=3, pairs=3, batch=2, drawn=40)
    rows = []
    try:
        for c in S.PHASES["topologies"] + S.PHASES["sharded"]:
            rows += run.measure(Planned(replace(c, n_ads=400)))
        assert (tmp_path / "scratch" / "andromeda-nb-rules" / "benchmark-400-0" / "rules.json").exists()
        scaling = [c for c in S.PHASES["scaling"] if c.scaling == "strong" and c.n_gpus <= 2]
        rows += run.measure(Planned(replace(scaling[0], n_ads=400)))
        assert run.measure(Planned(replace(scaling[1], n_ads=400))) == []  # the simulator has one GPU
    finally:
        run.close()
    assert not list((tmp_path / "scratch" / "andromeda-nb-rules").iterdir())  # the saved rules go with the run
    by = [(r["variant"], r["n_workers"], r["batch"]) for r in rows]
    assert by == [("inprocess_retrieve", 0, 1), ("colocated", 1, 1), ("remote_scoring", 2, 1), ("sharded", 1, 1),
                  ("sharded", 2, 1), ("sharded", 1, 2), ("sharded", 1, 1)]
    assert all(r["verified"].startswith("ok") for r in rows), [r["verified"] for r in rows]
    moved = {r["variant"]: float(r["transport_bytes_per_request"]) for r in rows[:3]}
    assert moved["inprocess_retrieve"] == 0 < moved["colocated"] < moved["remote_scoring"]
    assert "byte model" in rows[1]["notes"] and "strong scaling" in rows[-1]["notes"]
    # the co-located call split: the pool's own time on the worker and a null call's round trip,
    # each a part of the whole call
    got = re.search(r"pool took p50 ([\d.]+) ms, a call doing nothing p50 ([\d.]+) ms", rows[1]["notes"])
    assert got, rows[1]["notes"]
    assert re.search(r"the same calls to the actor on the event loop p50 [\d.]+ ms, p99 [\d.]+ ms \(equal answers\)",
                     rows[1]["notes"]), rows[1]["notes"]
    whole_ms = 1e3 * float(rows[1]["seconds_median"])
    assert all(0 < float(x) < whole_ms for x in got.groups()), (got.groups(), whole_ms)


def test_the_eligible_phase_picks_requests_by_their_eligible_count(tmp_path, monkeypatch):
    """Requests picked from drawn profiles for 0.5 % and 2 % eligible: the in-process rows timed
    before the workers build, every row verified, the picked fractions ordered as their targets
    and remote scoring's bytes growing with them."""
    monkeypatch.setenv("ANDROMEDA_SCRATCH", str(tmp_path / "scratch"))
    run = S.Run({"device": "simulator", "commit": "test"}, harness.Ceilings(1.0, 1.0, 1.0), harness.Options(),
                calls=3, pairs=3, drawn=40)
    try:
        rows = [r for c in S.PHASES["eligible"] for r in run.measure(Planned(replace(c, n_ads=2000)))]
    finally:
        run.close()
    assert [r["variant"] for r in rows] == ["inprocess_retrieve", "colocated", "remote_scoring"] * 2
    assert all(r["verified"].startswith("ok") for r in rows), [r["verified"] for r in rows]
    assert all("requests picked for" in r["notes"] for r in rows)
    low, high = (float(rows[i]["eligible_fraction"]) for i in (0, 3))
    assert low < high and all(r["eligible_fraction"] == rows[i // 3 * 3]["eligible_fraction"]
                              for i, r in enumerate(rows))
    # remote scoring's bytes grow with the eligible count: the byte model's exactly; the measured ones
    # (every TCP comm, heartbeats included) vary between runs by more than that growth at 2,000 ads
    modelled = [float(re.search(r"byte model ([\d,]+) bytes a request", rows[i]["notes"]).group(1).replace(",", ""))
                for i in (2, 5)]
    assert modelled[0] < modelled[1], modelled
    assert all(float(rows[i]["transport_bytes_per_request"]) > 0 for i in (2, 5))


def test_pick_by_eligible_takes_the_closest_fractions():
    counts = [50, 5, 20, 19, 100, 21]
    assert S.pick_by_eligible(counts, 1000, 0.02, 3).tolist() == [2, 3, 5]
    assert S.pick_by_eligible(counts, 1000, 0.005, 1).tolist() == [1]
