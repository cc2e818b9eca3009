"""The targeting suite's measurement functions run end to end on a tiny world under the simulator:
one case of every kind through the suite's Run, with the harness's event timing replaced (the
simulator has no clock to time) and everything else as on the GPU: worlds, launches, the checks
against the CPU baseline and the rule oracle, the rows."""

import re

import pytest

from andromeda_nb.bench import harness

pytestmark = pytest.mark.slow


def test_one_case_of_every_kind(monkeypatch, tmp_path):
    from andromeda_nb.bench import targeting as T
    from andromeda_nb.device import launch

    def untimed(fn, reps=15, warmup=3, busy_ms=2.0):
        fn()
        return harness.Timing(1e-3, 1e-3, 1e-3, 1e-4, reps)

    monkeypatch.setattr(harness, "time_device", untimed)
    monkeypatch.setattr(harness, "busy", lambda ms=1.0: None)
    cuda = launch.cuda()
    event = type(cuda.event())
    if not hasattr(event, "query"):  # the simulator's events: the work is done when the host gets back
        monkeypatch.setattr(event, "query", lambda self: True, raising=False)
    if not hasattr(cuda, "event_elapsed_time"):
        monkeypatch.setattr(cuda, "event_elapsed_time", lambda s, e: 1.0, raising=False)
    options = harness.Options(n_ads=4096, reps=10, out=str(tmp_path))
    P = T.PHASES
    chosen = [("main", P["main"][2]), ("main", P["main"][9]), ("main", P["main"][-1]),
              ("grouped", P["grouped"][3]), ("grouped", P["grouped"][8]), ("stages", P["stages"][4]),
              ("values", P["values"][0]),
              ("updates", T.UpdatesCase(2, batch_size=20)), ("device", T.HostBitsCase(2, batch_size=20)),
              ("layouts", P["layouts"][2]), ("density", P["density"][0]), ("categories", P["categories"][0])]
    assert {type(c) for _, c in chosen} == set(T.Run.MEASURE)
    run = T.Run({"device": "simulator"}, harness.Ceilings(4.0, 3.0, 3.5), options)
    try:
        for phase, case in chosen:
            rows = run.measure(harness.Planned(phase, case))
            assert len(rows) == len(case.variants()), case
            for r, name in zip(rows, case.variants()):
                assert re.fullmatch(re.sub(r"\\\{\w+\\\}", r"\\w+", re.escape(name)), r["variant"]), (name, r)
                assert r["verified"].startswith(("ok", "n/a")), (r["variant"], r["verified"])
                for k, v in case.columns().items():
                    if k != "variant":
                        assert r[k] == v, (r["variant"], k)
    finally:
        run.close()
    assert (tmp_path / "targeting_memory.csv").exists()
