"""The training-step profile: wall time a step beside its ops' time, from steps the training loop
reports one by one, and the command-line run that writes its table."""

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from andromeda_nb.datasets import multi_interest as mi  # noqa: E402
from andromeda_nb.training import data as tdata  # noqa: E402
from andromeda_nb.training.profiling import TOP_OPS, profile_steps  # noqa: E402
from andromeda_nb.training.train import TrainConfig, train_model  # noqa: E402

TINY = TrainConfig(d=16, width=16, hidden=16, steps=4, batch=32, negatives=32, warmup=1)


@pytest.fixture(scope="module")
def data():
    return tdata.from_multi_interest(mi.build_world(mi.WorldDesign(n_users=200, n_ads=240, topics=6), seed=1))


def test_on_step_sees_every_step_after_its_update(data):
    seen = []

    def record(step):  # the step's update is in: the loss of this step is already recorded
        seen.append((step, torch.cat([p.detach().flatten() for p in tm_params[0]]).clone()))

    tm_params = []
    orig = torch.optim.Adam.step

    def grab(self, *a, **k):
        if not tm_params:
            tm_params.append([p for g in self.param_groups for p in g["params"]])
        return orig(self, *a, **k)

    torch.optim.Adam.step = grab
    try:
        tm = train_model("mixture_k2", data, TINY, seed=3, device="cpu", progress=False, on_step=record)
    finally:
        torch.optim.Adam.step = orig
    assert [s for s, _ in seen] == list(range(TINY.steps))
    assert all(not torch.equal(a, b) for (_, a), (_, b) in zip(seen, seen[1:]))  # each after a new update
    final = torch.cat([p.detach().flatten() for p in tm.net.parameters()])
    assert torch.equal(seen[-1][1], final)
    plain = train_model("mixture_k2", data, TINY, seed=3, device="cpu", progress=False)
    assert plain.history == tm.history  # the callback changes nothing


@pytest.mark.parametrize("name", ["single_tower", "mixture_k2", "ranking"])
def test_profile_reports_a_steps_time_and_its_ops(data, name):
    r = profile_steps(name, data, TINY, steps=3, warmup=2, device="cpu")
    assert r["model"] == name and r["device"] == "cpu" and r["steps"] == 3
    assert r["wall_ms"] > 0 and r["device_ms"] > 0 and np.isclose(r["device_over_wall"], r["device_ms"] / r["wall_ms"])
    assert r["launches"] >= 50  # a forward, a backward and Adam's update are hundreds of ops
    ops = r["top_ops"].split("; ")
    assert len(ops) == TOP_OPS and all(o.startswith("aten::") and float(o.rsplit(" ", 1)[1]) >= 0 for o in ops)
    times = [float(o.rsplit(" ", 1)[1]) for o in ops]
    assert times == sorted(times, reverse=True) and sum(times) <= r["device_ms"] + 1e-9


@pytest.mark.parametrize("bad", [{"steps": 0}, {"warmup": 0}, {"steps": 2.0}, {"warmup": True}])
def test_profile_refuses_counts_it_cannot_time(data, bad):
    with pytest.raises(ValueError, match="steps|warmup"):
        profile_steps("single_tower", data, TINY, device="cpu", **bad)


@pytest.mark.slow  # ~20 s of two models' training steps; profile_steps itself is tested above
def test_profile_command_writes_one_row_a_model(tmp_path, capsys):
    from andromeda_nb.training.__main__ import main

    assert main(["--preset", "smoke", "--datasets", "multi_interest", "--models", "single_tower", "ranking",
                 "--profile-steps", "2", "--set", "ad_features=1", "--device", "cpu", "--out", str(tmp_path)]) == 0
    t = pd.read_csv(tmp_path / "training_profile.csv")
    assert t["model"].tolist() == ["single_tower", "ranking"] and set(t["settings"]) == {"ad_features=1"}
    assert (t["steps"] == 2).all() and (t["wall_ms"] > 0).all() and t["commit"].notna().all()
    assert not (tmp_path / "quality.csv").exists()  # no quality rows
    out = capsys.readouterr().out
    assert "multi_interest ranking:" in out and "ms a step wall" in out


@pytest.mark.parametrize("argv", [["--profile-steps", "0"], ["--profile-steps", "2", "--seeds", "1"],
                                  ["--profile-steps", "2", "--tune"], ["--profile-steps", "2", "--baselines"]])
def test_profile_command_refuses_what_it_would_ignore(argv, tmp_path, capsys):
    from andromeda_nb.training.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["--preset", "smoke", "--out", str(tmp_path / "out"), *argv])
    assert e.value.code == 2 and "--profile-steps" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
