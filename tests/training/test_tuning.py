"""Tuning the project's models on the training part's validation split (andromeda_nb.training.tuning)."""

import argparse
import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")

from andromeda_nb.analysis import quality  # noqa: E402
from andromeda_nb.datasets import multi_interest as mi  # noqa: E402
from andromeda_nb.training import data as tdata  # noqa: E402
from andromeda_nb.training import tuning  # noqa: E402

PRESET = quality.PRESETS["smoke"]


@pytest.fixture(scope="module")
def data():
    return tdata.from_multi_interest(mi.build_world(mi.WorldDesign(n_users=200, n_ads=300, topics=6), seed=3))


@pytest.mark.parametrize("split", ["session", "click"])
def test_validation_view_holds_back_each_users_last_training_session_or_click(data, split):
    """split="session": each user's last training session is held back, found here from the
    world's events (the default, "auto", for data with sessions); split="click": the last click. The held-back clicks are the
    targets, requested with the first one's context; popularity drops them; a user keeps at least
    one click (a one-session user keeps everything under split="session"). Data without sessions
    (MovieLens-100K) refuse split="session", and an unknown split is refused."""
    sessions = split == "session"
    short = np.arange(0, data.n_users, 10)  # cut to three clicks: inside the first session
    cut_seq, cut_len = data.seq.copy(), data.seq_len.copy()
    cut_seq[short, 3:], cut_len[short] = data.n_ads, 3
    data = replace(data, seq=cut_seq, seq_len=cut_len)
    seq, lens, pop = data.seq.copy(), data.seq_len.copy(), data.popularity.copy()
    ev = data.world.events
    tr = ~ev["heldout"]
    start = np.full(data.n_users, -1)
    for r in range(data.n_users):
        if sessions:
            sess = ev["session"][tr][ev["user"][tr] == r][: lens[r]]
            first = int(np.flatnonzero(sess == sess[-1])[0]) if sess.size else 0
        else:
            first = lens[r] - 1
        start[r] = first if first >= 1 else -1
    assert (start >= 0).any() and ((start >= 0) & (start < lens - 1) if sessions else start == lens - 1).any()
    np.testing.assert_array_equal(data.held_back_start(split), start)
    view = tuning.validation_view(data, split)
    if sessions:  # the default where the data have sessions; without them, the click
        np.testing.assert_array_equal(tuning.validation_view(data).seq_len, view.seq_len)
    else:
        np.testing.assert_array_equal(replace(data, seq_start=None).held_back_start(), start)
    with pytest.raises(ValueError, match="needs sessions"):
        replace(data, seq_start=None).held_back_start("session")
    with pytest.raises(ValueError, match="split must be"):
        tuning.validation_view(data, "day")
    np.testing.assert_array_equal(data.seq, seq)  # the source is unchanged
    np.testing.assert_array_equal(data.seq_len, lens)
    np.testing.assert_array_equal(view.seq_len, np.where(start >= 0, start, lens))
    held = []
    for r in np.flatnonzero(start >= 0).tolist():
        np.testing.assert_array_equal(view.seq[r, : view.seq_len[r]], seq[r, : start[r]])
        assert (view.seq[r, start[r]:] == data.n_ads).all()
        np.testing.assert_array_equal(view.req_ctx[r], data.seq_ctx[r, start[r]])
        held += seq[r, start[r]: lens[r]].tolist()
    np.testing.assert_array_equal(view.popularity, pop - np.bincount(held, minlength=data.n_ads))
    assert set(view.eval_rows.tolist()) == {r for r in data.eval_rows.tolist() if start[r] >= 0}
    assert tuning.validation_users(data, split=split) == view.eval_rows.size
    one_session = [r for r in range(data.n_users) if sessions and lens[r] and data.seq_start[r, lens[r] - 1] == 0]
    assert set(short.tolist()) <= set(one_session) or not sessions
    for r in one_session:  # nothing to hold back: the user keeps every click and is not validated on
        assert start[r] == -1 and view.seq_len[r] == lens[r] and r not in set(view.eval_rows.tolist())
    for r in view.eval_rows.tolist():
        assert view.heldout[r].tolist() == seq[r, start[r]: lens[r]].tolist()
        assert not view.eligible([r])[0, view.seq[r, : view.seq_len[r]]].any()  # kept clicks excluded
        for ad in view.heldout[r]:  # a held-back click is a candidate where targeting allows it
            assert view.eligible([r])[0, ad] == data.eligible([r], exclude_seen=False)[0, ad]


def test_tune_reads_only_the_training_part(data):
    blind = tdata.InteractionData(**{**data.__dict__, "heldout": {}})  # no held-out clicks to read
    grid = tuning.GRID[:2]
    best, trials = tuning.tune("mixture_k2", blind, PRESET.cfg("multi_interest", "mixture_k2"), n_users=40,
                               grid=grid, device="cpu")
    assert [p for p, _ in trials] == list(grid)
    assert all(0 <= v <= 1 for _, v in trials) and [v for p, v in trials if p is best] == [max(v for _, v in trials)]
    base = PRESET.cfg("multi_interest", "mixture_k2")
    cfg = tuning.grid_config(base, {"lr_scale": 3.0, "steps_scale": 2})
    assert cfg.lr == pytest.approx(3 * base.lr)
    assert cfg.steps == 2 * base.steps  # the chosen length trains with its own schedule
    assert tuning.describe({"lr_scale": 9.0, "steps_scale": 0.25}).endswith("(grid edge: lr_scale, steps_scale)")
    assert tuning.describe({"lr_scale": 1 / 9, "steps_scale": 2}).endswith("(grid edge: lr_scale)")
    assert "edge" not in tuning.describe({"lr_scale": 3.0, "steps_scale": 1})
    for split, said in (("session", "split of last sessions: "), ("click", "split of last clicks: "), (None, "split: ")):
        assert tuning.describe({"lr_scale": 3.0, "steps_scale": 1}, split=split).startswith(
            "tuned on the validation " + said)
    base = PRESET.cfg("multi_interest", "single_tower")
    for grid, match in (((), "empty grid"), (None, "sequence"), ({"lr_scale": 1, "steps_scale": 1}, "sequence"),
                        ([{"lr_scale": 1}], "grid point"), ([{"lr_scale": 0, "steps_scale": 1}], "positive"),
                        ([{"lr_scale": 1, "steps_scale": -1}], "positive"), ([{"lr_scale": np.inf, "steps_scale": 1}],
                                                                              "finite")):
        with pytest.raises(ValueError, match=match):  # refused before anything trains
            tuning.tune("single_tower", data, base, grid=grid)
    for n_users in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="n_users"):
            tuning.tune("single_tower", data, base, n_users=n_users, grid=tuning.GRID[:1])
    assert tuning.grid_config(base, {"lr_scale": 1, "steps_scale": 1e-9}).steps == 1
    lr = tuning.grid_config(base, {"lr_scale": np.float32(3), "steps_scale": 1}).lr
    assert type(lr) is float and lr == pytest.approx(3 * base.lr)  # a numpy scale: a run key JSON can write
    with pytest.raises(ValueError, match="lengths"):
        tuning.describe({"lr_scale": 1.0, "steps_scale": 1}, lengths="early")
    for refined in ({"depth_scale": 2}, {"negatives_scale": 0}):  # not a second-stage point: no KeyError, no row
        with pytest.raises(ValueError, match="grid point|positive"):
            tuning.describe({"lr_scale": 1.0, "steps_scale": 1}, refined=refined)
    assert tuning.describe({"lr_scale": 1.0, "steps_scale": 1}, refined={"negatives_scale": 4}).endswith(
        "second stage: negatives x4 (grid edge)")


def _recall(view, rows):
    def recall(tm):
        return quality.recalls(view, rows, quality.retrieve_top(tm, rows, tuning.TUNE_METRIC_K),
                               [tuning.TUNE_METRIC_K])[f"recall@{tuning.TUNE_METRIC_K}"]
    return recall


def test_each_length_is_its_own_run_by_default(data, tmp_path, monkeypatch):
    """By default a grid point's value is the validation recall@100 of a run trained at that point's
    own length and schedule (the model its seeds then train); a kept checkpoints run's end stands in
    for the own run of its length, and a cut-off own tuning resumes where it stopped."""
    from andromeda_nb.training.train import train_model

    base = PRESET.cfg("multi_interest", "single_tower")
    grid = [{"lr_scale": lr, "steps_scale": s} for lr in (1.0, 3.0) for s in (1, 3)]
    best, trials = tuning.tune("single_tower", data, base, n_users=40, grid=grid, device="cpu")
    view = tuning.validation_view(data)
    recall = _recall(view, quality.eval_rows(view, 40, seed=0))
    for point, value in trials:
        assert value == recall(train_model("single_tower", view, tuning.grid_config(base, point), seed=0,
                                           device="cpu", progress=False))
    assert len({v for _, v in trials}) > 1  # the points differ: the comparison can fail
    assert "each length its own run" in tuning.describe(best)
    assert "early stopping in a x3 run" in tuning.describe(best, grid, lengths="checkpoints")
    with pytest.raises(ValueError, match="lengths"):
        tuning.tune("single_tower", data, base, grid=grid, lengths="early")

    runs = tmp_path / "tuned.runs.json"
    real, trained = tuning._validated_run, []

    def counted(*args):
        trained.append(args[3].steps)
        return real(*args)

    monkeypatch.setattr(tuning, "_validated_run", counted)
    checkpoints = tuning.tune_many({"single_tower": base}, data, n_users=40, grid=grid, device="cpu",
                                   runs_file=runs, lengths="checkpoints")["single_tower"][1]
    assert trained == [3 * base.steps] * 2  # one run a learning rate
    for (p, own), (_, chk) in zip(trials, checkpoints):  # the longest length is the same model either way
        if p["steps_scale"] == 3:
            assert own == chk
    trained.clear()
    assert tuning.tune_many({"single_tower": base}, data, n_users=40, grid=grid, device="cpu",
                            runs_file=runs)["single_tower"] == (best, trials)
    assert trained == [base.steps] * 2  # the longest lengths came from the checkpoints runs' ends
    assert len(tuning.read_runs(runs)) == 6  # 2 checkpoints runs, 4 own runs (2 of them their ends)

    def cut_after(n):
        def run(*args):
            if len(trained) == n:
                raise KeyboardInterrupt  # the time limit
            trained.append(args[3].steps)
            return real(*args)
        return run

    other = {"single_tower": replace(base, weight_decay=1e-3)}
    trained.clear()
    monkeypatch.setattr(tuning, "_validated_run", cut_after(3))
    with pytest.raises(KeyboardInterrupt):
        tuning.tune_many(other, data, n_users=40, grid=grid, device="cpu", runs_file=runs)
    trained.clear()
    monkeypatch.setattr(tuning, "_validated_run", cut_after(99))
    tuning.tune_many(other, data, n_users=40, grid=grid, device="cpu", runs_file=runs)
    assert len(trained) == 1 and len(tuning.read_runs(runs)) == 10  # only the missing point trained


def test_lengths_can_be_checkpoints_of_one_run_a_learning_rate(data):
    """With lengths="checkpoints" each learning rate trains once, over the longest length's
    schedule; a length's value is that run's validation recall@100 after that many steps (a
    checkpoint: the model so far, in eval mode), and training goes on unchanged after each
    checkpoint."""
    from andromeda_nb.training.train import train_model

    base = PRESET.cfg("multi_interest", "single_tower")
    grid = [{"lr_scale": lr, "steps_scale": s} for lr in (1.0, 3.0) for s in (1, 3)]
    best, trials = tuning.tune("single_tower", data, base, n_users=40, grid=grid, device="cpu", lengths="checkpoints")
    view = tuning.validation_view(data)
    recall = _recall(view, quality.eval_rows(view, 40, seed=0))
    for lr in (1.0, 3.0):
        long = tuning.grid_config(base, {"lr_scale": lr, "steps_scale": 3})
        tm = train_model("single_tower", view, long, seed=0, device="cpu", progress=False,
                         checkpoints=[base.steps, 3 * base.steps], validate=recall)
        assert sorted(tm.validation) == [base.steps, 3 * base.steps] and len(tm.history) == 3 * base.steps
        for point, value in trials:
            if point["lr_scale"] == lr:
                assert value == tm.validation[point["steps_scale"] * base.steps]
        plain = train_model("single_tower", view, long, seed=0, device="cpu", progress=False)
        assert plain.history == tm.history and recall(plain) == tm.validation[3 * base.steps]
    assert [v for p, v in trials if p is best] == [max(v for _, v in trials)]  # the best point is the best value
    seen = []
    tm = train_model("single_tower", view, base, seed=0, device="cpu", progress=False, checkpoints=[base.steps, 2],
                     validate=lambda m: seen.append(len(m.history)) or len(seen))
    assert seen == [2, base.steps] and tm.validation == {2: 1.0, base.steps: 2.0}
    for bad in ([base.steps + 1], [0], [2.0], [True], ["3"]):
        with pytest.raises(ValueError, match="checkpoints"):
            train_model("single_tower", view, base, device="cpu", progress=False, checkpoints=bad, validate=len)
    for validate in (None, 5):
        with pytest.raises(ValueError, match="checkpoints"):
            train_model("single_tower", view, base, device="cpu", progress=False, checkpoints=[2], validate=validate)
    for seed in (-1, 1.5, True, 2**63):
        with pytest.raises(ValueError, match=r"seed must be an int in 0\.\.2\*\*63 - 1"):
            train_model("single_tower", view, base, seed=seed, device="cpu", progress=False)
    for device in ("bogus", "cuda:99"):
        with pytest.raises(ValueError, match="device"):
            train_model("single_tower", view, base, device=device, progress=False)
    for value in (float("nan"), "0.7", None):
        with pytest.raises(ValueError, match="validate returned"):
            train_model("single_tower", view, base, device="cpu", progress=False, checkpoints=[2],
                        validate=lambda m, v=value: v)


@pytest.mark.slow  # ~30 s of training; the second stage is tested below with a fake run, real tuning runs in the resume test
def test_tuned_models_train_every_seed_at_their_point(data):
    # checkpoints: a third of the own runs' cost here (the default is tested above); one model, a
    # mixture (its grid has the most settings), keeps the default tier short
    # the tuning validates on the preset's tune_users, not on its (held-out) eval_users
    preset = replace(PRESET, tune_users={"multi_interest": 25})
    tuned, val = quality.tune_models(data, preset, models=["mixture_k2"], device="cpu",
                                     progress=False, lengths="checkpoints")
    assert set(tuned) == {"mixture_k2"} and list(val["metric"]) == ["validation_recall@100"]
    assert tuning.validation_users(data, 25) == 25 < tuning.validation_users(data, PRESET.eval_users["multi_interest"])
    assert (val["n_users"] == 25).all()
    assert val["value"].between(0, 1).all() and val["scorer"].str.startswith("tuned on the validation split").all()
    assert val["scorer"].str.contains("length by early stopping").all()  # the note says how lengths were trained
    frame, _ = quality.run_expert_count(data, PRESET, models=["mixture_k2"], device="cpu",
                                       progress=False, tuned=tuned)
    rec = frame[(frame["metric"] == "recall@100") & ~frame["model"].isin(quality.GENERATOR_MODELS)]
    assert len(rec) == 1 and rec["scorer"].str.startswith("tuned on the validation split").all()
    assert len(frame[frame["metric"] == "train_seconds"]) == 1
    for name, (cfg, note) in tuned.items():  # the point chosen: a first-stage point, then a second-stage one
        base = PRESET.cfg("multi_interest", name)
        assert any(cfg == tuning.grid_config(tuning.grid_config(base, p), q)
                   for p in tuning.GRID for q in tuning.refine_grid(name))
        assert "; second stage: " in note


def test_the_second_stage_scales_one_setting_at_a_time(data, tmp_path, monkeypatch):
    """tune_models' second stage (refine_grid) trains, around each model's first-stage point, each of
    its settings scaled down and up, the others kept: the load-balancing weight only for a mixture
    choosing fewer experts than it has; the first-stage point is not trained again; the better point
    is taken, and the note names it; refine=False stops after the first stage."""
    trained = []

    def fake_run(name, view, rows, run, stops, device, progress):
        trained.append((name, run))
        return {stops[0]: min(1.0, run.lr * 10 + (run.negatives > 100) * 0.1 + (run.lb_coef > 0.05) * 0.2)}

    monkeypatch.setattr(tuning, "_validated_run", fake_run)
    preset = replace(PRESET, tune_users={"multi_interest": 25})
    models = ["single_tower", "mixture_k2", "dense_mixture"]
    first, _ = quality.tune_models(data, preset, models=models, device="cpu", progress=False, refine=False,
                                   runs_file=tmp_path / "runs.json")
    assert len(trained) == 3 * len(tuning.GRID) and all("second stage" not in n for _, n in first.values())
    trained.clear()
    tuned, val = quality.tune_models(data, preset, models=models, device="cpu", progress=False,
                                     runs_file=tmp_path / "runs.json")
    per_model = {m: [run for name, run in trained if name == m] for m in models}
    assert [len(per_model[m]) for m in models] == [6, 8, 6]  # the first stage's runs and point kept
    for m in models:
        base = first[m][0]
        assert tuning.refine_grid(m)[0] == {"lr_scale": 1.0, "steps_scale": 1.0}
        changed = [{f for f in ("negatives", "temperature", "width", "lb_coef") if getattr(r, f) != getattr(base, f)}
                   for r in per_model[m]]
        assert all(len(c) == 1 for c in changed)  # one setting at a time, lr and length kept
        assert all((r.lr, r.steps) == (base.lr, base.steps) for r in per_model[m])
    one = first["single_tower"][0]
    assert tuned["single_tower"][0] == replace(one, negatives=4 * one.negatives)
    assert "second stage: negatives x4 (grid edge)" in tuned["single_tower"][1]
    assert tuned["mixture_k2"][0].lb_coef == pytest.approx(10 * first["mixture_k2"][0].lb_coef)
    assert "second stage: lb_coef x10 (grid edge)" in tuned["mixture_k2"][1]
    assert list(val["value"]) == pytest.approx([
        min(1.0, tuned[m][0].lr * 10 + (tuned[m][0].negatives > 100) * 0.1 + (tuned[m][0].lb_coef > 0.05) * 0.2)
        for m in models])
    with pytest.raises(ValueError, match="a grid point"):
        tuning.check_grid([{"lr_scale": 1.0, "steps_scale": 1.0, "batch_scale": 2.0}])
    for bad in (0.0, 10**400, float("nan")):
        with pytest.raises(ValueError, match="finite positive"):
            tuning.check_grid([{"lr_scale": 1.0, "steps_scale": 1.0, "width_scale": bad}])
    with pytest.raises(ValueError, match="lengths='own'"):  # checkpoints would not train the scaled settings
        tuning.tune("single_tower", data, first["single_tower"][0], grid=tuning.refine_grid("single_tower"),
                    lengths="checkpoints")


def test_the_validation_row_is_the_chosen_runs_own_value(data, monkeypatch):
    """With lengths="checkpoints" a first-stage point's value is a checkpoint of a longer run; the
    validation row reports the value of the run the second stage chose, not the largest seen."""
    def fake_run(name, view, rows, run, stops, device, progress):  # checkpoints score above own runs
        return {s: (0.5 if len(stops) > 1 else 0.3) + run.negatives * 1e-4 for s in stops}

    monkeypatch.setattr(tuning, "_validated_run", fake_run)
    tuned, val = quality.tune_models(data, replace(PRESET, tune_users={"multi_interest": 25}), models=["single_tower"],
                                     device="cpu", progress=False, lengths="checkpoints")
    assert tuned["single_tower"][0].negatives == 4 * PRESET.cfg("multi_interest", "single_tower").negatives
    assert val["value"].iloc[0] == pytest.approx(0.3 + tuned["single_tower"][0].negatives * 1e-4)


def test_tuned_configurations_are_kept_and_trained_later(tmp_path):
    """save_tuned keeps a tuning run's choices per dataset and preset in one JSON file, load_tuned
    gives back the same TrainConfig and scorer note of each model asked for, and a file that cannot
    serve (missing, malformed, of another version or preset, lacking the dataset or a model) is
    refused with the file named, before anything trains."""
    import json

    from andromeda_nb.training.__main__ import main

    base = PRESET.cfg("multi_interest", "single_tower")
    a = {"single_tower": (tuning.grid_config(base, {"lr_scale": 3.0, "steps_scale": 2}), "note a")}
    b = {"ranking": (replace(base, width=8), "note b")}
    path = tmp_path / "tuned.json"
    tuning.save_tuned(path, "multi_interest", "smoke", a)
    tuning.save_tuned(path, "multi_interest", "smoke", b)
    tuning.save_tuned(path, "ml-100k", "smoke", b)
    assert tuning.load_tuned(path, "multi_interest", "smoke", ["single_tower", "ranking"]) == {**a, **b}
    assert tuning.load_tuned(path, "multi_interest", "smoke", ["single_tower"]) == a
    assert tuning.load_tuned(path, "multi_interest", "smoke", ["single_tower"])["single_tower"][0].steps == 2 * base.steps
    for args, match in ((("multi_interest", "smoke", ["single_tower", "mixture_k2"]), "of \\['mixture_k2'\\]"),
                        (("multi_interest", "full", ["ranking"]), "tuned at preset 'smoke', not 'full'"),
                        (("other", "smoke", ["ranking"]), "no tuned configuration on other")):
        with pytest.raises(ValueError, match=match):
            tuning.load_tuned(path, *args)
    tuning.save_tuned(path, "ml-100k", "full", a)  # another preset replaces the dataset's entry
    assert tuning.load_tuned(path, "ml-100k", "full", ["single_tower"]) == a
    with pytest.raises(ValueError, match="ranking"):
        tuning.load_tuned(path, "ml-100k", "full", ["ranking"])
    good = json.loads(path.read_text())
    cfg = good["multi_interest"]["models"]["single_tower"]["config"]
    # a configuration kept before ad_features and interest_experts existed loads as what it was
    # tuned as (id embeddings alone, experts reading signal groups), and so does a kept run's key
    old = tmp_path / "old.json"
    legacy = {k: v for k, v in cfg.items() if k not in ("ad_features", "interest_experts")}
    old.write_text(json.dumps({"d": {"preset": "smoke", "models": {"m": {"config": legacy, "scorer": ""}}}}))
    was = replace(a["single_tower"][0], ad_features=0, interest_experts=0)
    assert tuning.load_tuned(old, "d", "smoke", ["m"])["m"][0] == was
    runs = tmp_path / "old.runs.json"
    runs.write_text(json.dumps({json.dumps({"model": "m", "config": legacy, "stops": [legacy["steps"]], "data": "x"}):
                                {str(legacy["steps"]): 0.25}}))
    assert tuning.read_runs(runs) == {tuning.run_key("m", "x", was, [was.steps]): {str(was.steps): 0.25}}
    for text, match in (("{", "cannot read"), ("[]", "top level"), ('{"x": {"models": {}}}', "'x' is not"),
                        (json.dumps({"d": {"preset": "smoke", "models": {"m": {"config": cfg}}}}), "d/m is not"),
                        (json.dumps({"d": {"preset": "smoke", "models": {"m": {"config": {**cfg, "new": 1},
                                                                               "scorer": ""}}}}), "fields"),
                        (json.dumps({"d": {"preset": "smoke", "models": {"m": {"config": {**cfg, "steps": "ten"},
                                                                               "scorer": ""}}}}), "steps is 'ten'"),
                        (json.dumps({"d": {"preset": "smoke", "models": {"m": {"config": {**cfg, "lr": True},
                                                                               "scorer": ""}}}}), "lr is True")):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ValueError, match=match):
            tuning.load_tuned(bad, "d", "smoke", ["m"])
        with pytest.raises(ValueError, match=match):  # a tuning run refuses it before it tunes
            quality.run_all("smoke", tmp_path, datasets=["ml-100k"], models=["single_tower"], tune=True,
                            tuned_file=bad, progress=False)
    with pytest.raises(ValueError, match="no tuned configurations at"):
        tuning.load_tuned(tmp_path / "none.json", "multi_interest", "smoke", ["ranking"])
    for where, match in ((tmp_path, "is a folder"), (path / "x.json", "is a file")):
        with pytest.raises(ValueError, match=match):
            quality.run_all("smoke", tmp_path, datasets=["ml-100k"], models=["single_tower"], tune=True,
                            tuned_file=where, progress=False)
    with pytest.raises(ValueError, match="mixture_k2"):
        quality.run_all("smoke", tmp_path, datasets=["multi_interest"], models=["mixture_k2"], tuned_file=path,
                        progress=False)
    with pytest.raises(ValueError, match="needs sessions, which ml-100k does not have"):
        quality.run_all("smoke", tmp_path, tune=True, tune_split="session", progress=False)
    with pytest.raises(ValueError, match="of \\['mixture_k1', 'mixture_k2', 'mixture_k4', 'dense_mixture'\\]"):  # all train
        quality.run_all("smoke", tmp_path, datasets=["multi_interest"], tuned_file=path, progress=False)
    assert not (tmp_path / "quality.csv").exists()
    for argv in (["--tune-only", "--tuned", str(path), "--seeds", "1"], ["--tune-only"],
                 ["--tuned", str(path), "--set", "steps=3"], ["--tune", "--tune-split", "session"]):  # ml-100k too
        with pytest.raises(SystemExit):  # argparse's error: refused before anything runs
            main(["--preset", "smoke", "--out", str(tmp_path), *argv])
    assert not (tmp_path / "quality.csv").exists()
    for argv in (["--models", "foo"], ["--tuned", str(path), "--models", "mixture_k2"],
                 ["--tune-lengths", "checkpoints", "--seeds", "0"],  # how a tuning trains, without a tuning
                 ["--tune-split", "session", "--seeds", "0"], ["--tune", "--tune-split", "day"],
                 ["--tune-budget", "60", "--seeds", "0"], ["--tune-only", "--tuned", str(path), "--tune-budget", "0"],
                 ["--no-refine", "--seeds", "0"], ["--tune-lrs", "1", "--seeds", "0"],  # a tuning's stage without a tuning
                 ["--tune-steps", "2", "--seeds", "0"], ["--tune", "--tune-steps", "0"], ["--tune", "--tune-lrs", "1/0"],
                 ["--tune", "--tune-lrs", "1", "1.0"], ["--tune", "--tune-lrs", "1/"], ["--tune", "--tune-steps", "1e20"]):
        with pytest.raises(SystemExit):  # unknown models, a file lacking one: usage errors before any row
            main(["--preset", "smoke", "--datasets", "multi_interest", "--out", str(tmp_path), *argv])
    assert not (tmp_path / "quality.csv").exists()


def test_a_narrower_first_stage_trains_only_its_points(data, monkeypatch, tmp_path):
    """tune_models(grid=scale_grid(...)) trains the first stage at exactly those learning rates x
    lengths (the time limit of one call bounds the longest run) and names the grid's own edges."""
    from andromeda_nb.training.__main__ import _scale

    assert data.resolve_split() == "session" and replace(data, seq_start=None).resolve_split() == "click"  # auto
    assert data.resolve_split("click") == "click" and replace(data, seq_start=None).resolve_split("session") == "session"
    with pytest.raises(ValueError, match="split must be"):
        data.resolve_split("day")
    assert tuning.scale_grid() == tuning.GRID
    assert tuning.scale_grid([1 / 3, 3], [2]) == ({"lr_scale": 1 / 3, "steps_scale": 2},
                                                  {"lr_scale": 3, "steps_scale": 2})
    assert _scale("1/3") == 1 / 3 and _scale("0.5") == 0.5
    for lrs, steps in (([1, 1.0], None), (None, [0.5, 0.5]), ([0], None), (None, [float("inf")]), ([], None)):
        with pytest.raises(ValueError):
            tuning.scale_grid(lrs, steps)
    real, trained = tuning._validated_run, []

    def counted(*args):
        trained.append((args[3].lr, args[3].steps))
        return real(*args)

    for bad in ("1/", "1_000", "-1", "0", "nan", "1/0", "1/3/2", "a"):
        with pytest.raises(argparse.ArgumentTypeError):
            _scale(bad)
    for lrs, steps in ((None, [1e20]), ([1e-9], None), ([True], None)):  # past 1/100 .. 100: refused up front
        with pytest.raises(ValueError, match="within 1/100"):
            tuning.scale_grid(lrs, steps)
    with pytest.raises(ValueError, match="learning rate and the length only"):  # the second stage's axes
        quality.tune_models(data, PRESET, models=["single_tower"], device="cpu", progress=False,
                            grid=[{"lr_scale": 1, "steps_scale": 1, "negatives_scale": 4}])
    monkeypatch.setattr(tuning, "_validated_run", counted)
    base = PRESET.cfg("multi_interest", "single_tower")
    tuned, rows = quality.tune_models(data, PRESET, models=["single_tower"], device="cpu", progress=False,
                                      grid=tuning.scale_grid([1, 3, 9], [1]))
    first = [(base.lr * s, base.steps) for s in (1, 3, 9)]
    assert sorted(trained[:3]) == first and len(trained) == 3 + len(tuning.refine_grid("single_tower"))
    cfg, note = tuned["single_tower"]
    assert "steps x1 " in note and "of last sessions" in note and "second stage" in note  # the default split
    assert ("grid edge: lr_scale" in note) == (abs(cfg.lr - base.lr * 3) > 1e-12)  # x1 and x9: this grid's edges

    # the command line passes the narrowed grid through, with the default split
    from andromeda_nb.training.__main__ import main

    trained.clear()
    assert main(["--preset", "smoke", "--datasets", "multi_interest", "--models", "single_tower", "--tune-only",
                 "--tuned", str(tmp_path / "t.json"), "--out", str(tmp_path), "--no-progress", "--no-refine",
                 "--tune-lrs", "1/3", "3", "--tune-steps", "2"]) == 0
    assert sorted(trained) == [(base.lr / 3, 2 * base.steps), (base.lr * 3, 2 * base.steps)]
    kept = json.loads((tmp_path / "t.json").read_text())["multi_interest"]["models"]["single_tower"]["scorer"]
    assert kept.startswith("tuned on the validation split of last sessions: lr x")
    # seeds from that file under another experiment's name sit beside the main rows, not over them
    quality.write_rows(pd.DataFrame(_main_rows()), tmp_path / "quality.csv")
    assert main(["--preset", "smoke", "--datasets", "multi_interest", "--models", "single_tower", "--tuned",
                 str(tmp_path / "t.json"), "--out", str(tmp_path), "--no-progress", "--experiment", "tuned_session"]) == 0
    out = quality.load_results(tmp_path / "quality.csv")
    rec = out[(out["metric"] == "recall@100") & (out["model"] == "single_tower")]
    assert sorted(rec["experiment"]) == ["expert_count", "tuned_session"] and (rec["value"] == 0.5).sum() == 1
    assert set(out.loc[out["model"] == "true_model", "experiment"]) == {"expert_count"}  # the generator's stay
    for bad in ("precision", "Tuned", "", "a-b"):
        with pytest.raises(SystemExit):
            main(["--preset", "smoke", "--datasets", "multi_interest", "--out", str(tmp_path), "--experiment", bad])
    with pytest.raises(SystemExit):  # the baselines write their own experiment
        main(["--preset", "smoke", "--out", str(tmp_path), "--baselines", "--experiment", "x"])


def _main_rows():
    return [dict(dataset="multi_interest", model="single_tower", experts=1, k_experts=1, dtype="fp32", d=16, seed=0,
                 metric="recall@100", value=0.5, commit="x", device="cpu", experiment="expert_count", preset="smoke",
                 scorer="s", n_users=40)]


def test_ties_go_to_the_point_nearest_the_preset(data):
    """Two lengths that round to the same steps (a one-step preset: x0.5 and x1) train the same
    model and tie: the preset's own length wins, not the grid's edge."""
    from dataclasses import replace

    base = replace(PRESET.cfg("multi_interest", "single_tower"), steps=1, warmup=0)
    grid = [{"lr_scale": 1.0, "steps_scale": s} for s in (0.5, 1)]
    best, trials = tuning.tune("single_tower", data, base, n_users=20, grid=grid, device="cpu")
    assert [tuning.grid_config(base, p).steps for p, _ in trials] == [1, 1]
    assert trials[0][1] == trials[1][1] and best == {"lr_scale": 1.0, "steps_scale": 1}


@pytest.mark.slow  # worker processes import torch: the failed-run test keeps them in the default tier
def test_runs_in_worker_processes_choose_what_one_process_chooses(data):
    """tune_many with workers trains each (model, learning rate) run in its own process; the
    values and choices equal those of the runs trained one after another here."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers take the caller's count: the same arithmetic
    try:
        grid = [{"lr_scale": lr, "steps_scale": s} for lr in (1 / 3, 3.0) for s in (1, 2)]
        configs = {m: PRESET.cfg("multi_interest", m) for m in ("single_tower", "mixture_k2")}
        here = tuning.tune_many(configs, data, n_users=40, grid=grid, device="cpu")
        apart = tuning.tune_many(configs, data, n_users=40, grid=grid, device="cpu", workers=3)
    finally:
        torch.set_num_threads(threads)
    assert set(here) == set(apart) == set(configs)
    for m in configs:
        assert [p for p, _ in apart[m][1]] == grid
        assert apart[m][1] == here[m][1] and apart[m][0] == here[m][0]
    assert len({v for m in configs for _, v in here[m][1]}) > 1  # the runs differ: the comparison can fail
    for workers in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="workers"):
            tuning.tune_many(configs, data, grid=grid, workers=workers)


def test_a_failed_run_in_a_worker_loses_no_other_run(data, tmp_path):
    """A run that fails in a worker process is raised once the others finished, and every other
    run is kept in the runs file; unknown models are refused before anything trains."""
    grid = [{"lr_scale": 1.0, "steps_scale": s} for s in (1, 2)]
    good = PRESET.cfg("multi_interest", "single_tower")
    runs = tmp_path / "tuned.runs.json"
    broken = replace(good, d=2**40)  # a configuration TrainConfig accepts whose model cannot be allocated
    with pytest.raises(RuntimeError, match="allocate"):
        tuning.tune_many({"single_tower": good, "mixture_k2": broken}, data, n_users=20, grid=grid,
                         device="cpu", workers=2, runs_file=runs)
    kept = [json.loads(k)["model"] for k in tuning.read_runs(runs)]
    assert kept == ["single_tower", "single_tower"]
    with pytest.raises(ValueError, match="unknown models"):
        tuning.tune_many({"single": good}, data, grid=grid)


def test_a_cut_off_tuning_resumes_from_its_runs_file(data, tmp_path, monkeypatch):
    """Each finished run is kept in the runs file as it finishes; a tuning cut off part-way and run
    again trains only the runs that are missing and chooses what an uninterrupted tuning chooses
    (checkpoints runs here: one run a learning rate, several values a run)."""
    from functools import partial

    tune_many = partial(tuning.tune_many, lengths="checkpoints")
    grid = [{"lr_scale": lr, "steps_scale": s} for lr in (1 / 3, 3.0) for s in (1, 2)]
    configs = {m: PRESET.cfg("multi_interest", m) for m in ("single_tower", "mixture_k2")}
    whole = tune_many(configs, data, n_users=40, grid=grid, device="cpu")
    runs = tmp_path / "tuned.runs.json"
    real, trained = tuning._validated_run, []

    def cut_after(n):
        def run(*args):
            if len(trained) == n:
                raise KeyboardInterrupt  # the time limit
            trained.append(args[0])
            return real(*args)
        return run

    monkeypatch.setattr(tuning, "_validated_run", cut_after(3))
    with pytest.raises(KeyboardInterrupt):
        tune_many(configs, data, n_users=40, grid=grid, device="cpu", runs_file=runs)
    assert len(tuning.read_runs(runs)) == 3
    trained.clear()
    monkeypatch.setattr(tuning, "_validated_run", cut_after(99))
    resumed = tune_many(configs, data, n_users=40, grid=grid, device="cpu", runs_file=runs)
    assert trained == ["mixture_k2"] and len(tuning.read_runs(runs)) == 4  # only the missing run trained
    assert resumed == whole
    trained.clear()
    assert tune_many(configs, data, n_users=40, grid=grid, device="cpu", runs_file=runs) == whole
    assert trained == []
    # another configuration or other users are other runs
    other = {"single_tower": replace(configs["single_tower"], weight_decay=1e-3)}
    tune_many(other, data, n_users=40, grid=grid[:2], device="cpu", runs_file=runs)
    tune_many(configs, data, n_users=30, grid=grid[:2], device="cpu", runs_file=runs)
    assert trained == ["single_tower", "single_tower", "mixture_k2"] and len(tuning.read_runs(runs)) == 7
    assert tuning.runs_file_of(tmp_path / "tuned.json") == runs
    # a kept run that lacks one of its checkpoints trains again
    runs.write_text(json.dumps({k: {s: v for s, v in list(vals.items())[1:]} for k, vals in
                                json.loads(runs.read_text()).items()}))
    trained.clear()
    assert tune_many(configs, data, n_users=40, grid=grid, device="cpu", runs_file=runs) == whole
    assert len(trained) == 4
    key = json.dumps(next(iter(json.loads(runs.read_text()))))  # a real run key, as a JSON string
    for text in ("{", "[]", '{"a": {"3": 0.5}}', '{"[1]": {"3": 0.5}}', '{"{\\"model\\": 1}": {"3": 0.5}}',
                 *("{" + key + ": " + v + "}" for v in ('{"x": 1}', '{"3": "0.5"}', "{}", '{"3": NaN}', '{"3": 1.5}',
                                                     '{"\u00b2": 0.5}', '{"03": 0.5}'))):
        runs.write_text(text)
        with pytest.raises(ValueError, match="tuning runs"):  # refused before anything trains
            tune_many(configs, data, n_users=40, grid=grid, device="cpu", runs_file=runs)
        with pytest.raises(ValueError, match="tuning runs"):
            tuning.check_tuned_use(tmp_path / "tuned.json", ["multi_interest"], "smoke", None, tune=True)
    with pytest.raises(ValueError, match="folder"):
        tune_many(configs, data, grid=grid, runs_file=tmp_path)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ValueError, match="cannot keep tuning runs"):  # refused before anything trains
        tune_many(configs, data, n_users=40, grid=grid, device="cpu", runs_file=tmp_path / "a_file" / "r.json")
    assert len(trained) == 4


def test_a_time_budget_starts_runs_longest_first_and_only_those_that_fit(data, tmp_path, monkeypatch):
    """With ``budget_s`` a run starts only while it can finish in time at the slowest seconds a step
    seen so far (a clock here that each run moves on by its steps); the runs left raise
    TuningIncomplete after the others were kept, and the same call again resumes and chooses what an
    unbudgeted tuning chooses."""
    import time

    base = PRESET.cfg("multi_interest", "single_tower")
    grid = [{"lr_scale": lr, "steps_scale": st} for lr in (1 / 3, 3.0) for st in (1, 2, 4)]
    steps = {tuning.grid_config(base, p).steps for p in grid}
    assert len(steps) == 3  # three lengths s < 2 s < 4 s (the budget below counts on them)
    s1, s2, s4 = sorted(steps)
    clock, trained = [0.0], []

    def fake_run(name, view, rows, run, stops, device, progress):
        clock[0] += run.steps  # one second a step
        trained.append((run.lr, run.steps))
        return {stops[0]: run.lr * 1e-3 + run.steps * 1e-6}

    monkeypatch.setattr(tuning, "_validated_run", fake_run)
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    whole = tuning.tune_many({"single_tower": base}, data, n_users=20, grid=grid, device="cpu")
    trained.clear()
    clock[0] = 0.0
    runs = tmp_path / "tuned.runs.json"
    # s4 (always, the first), not the second s4 (2 s4 > budget), s2, not the second s2, s1, not the second s1
    with pytest.raises(tuning.TuningIncomplete, match="3 of the 6 runs"):
        tuning.tune_many({"single_tower": base}, data, n_users=20, grid=grid, device="cpu", runs_file=runs,
                         budget_s=s4 + s2 + s1)
    assert [st for _, st in trained] == [s4, s2, s1] and len(tuning.read_runs(runs)) == 3
    trained.clear()
    assert tuning.tune_many({"single_tower": base}, data, n_users=20, grid=grid, device="cpu", runs_file=runs,
                            budget_s=1e9) == whole
    assert sorted(st for _, st in trained) == [s1, s2, s4]  # only the runs left
    for bad in (0, -1.0, True, "60"):
        with pytest.raises(ValueError, match="budget_s"):
            tuning.tune_many({"single_tower": base}, data, grid=grid, runs_file=runs, budget_s=bad)
    with pytest.raises(ValueError, match="runs_file"):
        tuning.tune_many({"single_tower": base}, data, grid=grid, budget_s=60)


@pytest.mark.slow  # worker processes (the budget itself: the test above, in one process)
def test_a_time_budget_with_workers_keeps_the_runs_it_started(data, tmp_path):
    """In worker processes the first ``workers`` runs start whatever the budget (nothing is timed yet);
    a budget they use up leaves every other run, and the started ones are kept."""
    base = PRESET.cfg("multi_interest", "single_tower")
    grid = [{"lr_scale": lr, "steps_scale": 1} for lr in (1 / 3, 1.0, 3.0)]
    runs = tmp_path / "tuned.runs.json"
    with pytest.raises(tuning.TuningIncomplete, match="1 of the 3 runs"):
        tuning.tune_many({"single_tower": base}, data, n_users=20, grid=grid, device="cpu", workers=2,
                         runs_file=runs, budget_s=1e-6)
    assert len(tuning.read_runs(runs)) == 2


def test_the_cli_exits_75_when_the_budget_leaves_runs(tmp_path, capsys):
    """``--tune-budget``: the first run starts whatever the budget, the rest are left; the command
    says so and exits with EXIT_TUNING_LEFT (a script's cue to run it again), the run kept. Each
    call first says what it resumes from (a path that misses the kept runs shows at once)."""
    from andromeda_nb.training.__main__ import EXIT_TUNING_LEFT, main

    tuned = tmp_path / "tuned.json"
    argv = ["--preset", "smoke", "--datasets", "multi_interest", "--models", "single_tower", "--tune-only",
            "--tuned", str(tuned), "--tune-budget", "1e-9", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == EXIT_TUNING_LEFT == 75
    assert len(tuning.read_runs(tuning.runs_file_of(tuned))) == 1
    assert not tuned.exists()  # no choice made from a partial grid
    assert f"no runs kept at {tuning.runs_file_of(tuned)} yet: every run trains" in capsys.readouterr().out
    assert main(argv) == EXIT_TUNING_LEFT
    assert f"tuning: 1 run kept at {tuning.runs_file_of(tuned)}" in capsys.readouterr().out
    assert len(tuning.read_runs(tuning.runs_file_of(tuned))) == 2


def test_the_prediction_counts_a_fixed_cost_a_run(data, tmp_path, monkeypatch):
    """Runs cost a fixed 100 s plus a second a step; once a long and a short run are timed, a run is
    predicted at least at what it takes, so a budget that the next run would overrun leaves it
    (seconds a step alone, from the long runs, predicted the short ones far too cheap)."""
    import time

    base = PRESET.cfg("multi_interest", "single_tower")
    grid = [{"lr_scale": lr, "steps_scale": st} for lr in (1 / 3, 1.0, 3.0) for st in (1, 4)]
    s1, s4 = sorted({tuning.grid_config(base, p).steps for p in grid})
    clock, trained = [0.0], []

    def fake_run(name, view, rows, run, stops, device, progress):
        clock[0] += 100 + run.steps
        trained.append(run.steps)
        return {stops[0]: run.lr}

    monkeypatch.setattr(tuning, "_validated_run", fake_run)
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    assert tuning._predicted_seconds([(s4, 100 + s4), (s1, 100 + s1)], s1) == 100 + s1
    # three long runs fit (the first untimed, the next two predicted at their own time), then one
    # short one; a second short one would end 1 s past the budget
    budget = 3 * (100 + s4) + 2 * (100 + s1) - 1
    with pytest.raises(tuning.TuningIncomplete, match="2 of the 6 runs"):
        tuning.tune_many({"single_tower": base}, data, n_users=20, grid=grid, device="cpu",
                         runs_file=tmp_path / "r.json", budget_s=budget)
    assert trained == [s4, s4, s4, s1] and clock[0] <= budget


def test_one_budget_for_every_datasets_tuning(data, tmp_path, monkeypatch):
    """run_all's tune_budget_s counts from the call's start over all datasets: a budget the first
    dataset's tuning uses up leaves the second one's untouched, and a bad budget is refused before
    any row is written."""
    import time
    from dataclasses import replace as dc_replace

    clock, trained = [0.0], []

    def fake_run(name, view, rows, run, stops, device, progress):
        clock[0] += run.steps
        trained.append(view.name)
        return {stops[0]: run.lr}

    monkeypatch.setattr(tuning, "_validated_run", fake_run)
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(quality, "load_data", lambda ds, p, data_dir=None: dc_replace(data, name=ds))
    base = PRESET.cfg("multi_interest", "single_tower")
    # the first dataset's whole tuning: the first stage, then the second's six runs around its point
    # (lr x9 wins, its lengths tie and go to the preset's; the point itself is not trained again)
    whole = sum(tuning.grid_config(base, p).steps for p in tuning.GRID) + 6 * base.steps
    with pytest.raises(tuning.TuningIncomplete, match="before ml-100k's tuning"):
        quality.run_all("smoke", tmp_path, datasets=("multi_interest", "ml-100k"), seeds=[], device="cpu",
                        progress=False, models=["single_tower"], tune=True, tuned_file=tmp_path / "t.json",
                        tune_budget_s=whole)
    assert trained == ["multi_interest"] * (len(tuning.GRID) + 6) and clock[0] == whole
    for bad, kw in ((float("nan"), {"tuned_file": tmp_path / "u.json"}), (60, {})):
        with pytest.raises(ValueError, match="budget_s"):
            quality.run_all("smoke", tmp_path / "bad", datasets=("multi_interest",), seeds=[], progress=False,
                            models=["single_tower"], tune=True, tune_budget_s=bad, **kw)
    assert not (tmp_path / "bad").exists()


def test_rows_of_changed_settings_name_them(data, tmp_path, monkeypatch):
    """A run at changed TrainConfig fields (run_all's ``settings``, the CLI's --set) names them in the
    scorer column of every row it trains, tuned or not, and in the kept tuned notes, so its rows never
    pass for the preset's; --set refuses an unknown field, a malformed item or a value TrainConfig
    refuses before anything trains."""
    from dataclasses import replace as dc_replace

    from andromeda_nb.training.__main__ import main

    monkeypatch.setattr(tuning, "_validated_run", lambda name, view, rows, run, stops, device, progress:
                        {stops[0]: run.lr * (1 + stops[0])})
    monkeypatch.setattr(quality, "load_data", lambda ds, p, data_dir=None: dc_replace(data, name=ds))
    seen = []
    monkeypatch.setattr(quality, "run_expert_count", lambda *a, tuned=None, **k: (seen.append(tuned), 1/0))
    out = quality.run_all("smoke", tmp_path, datasets=("multi_interest",), seeds=[], device="cpu", progress=False,
                          models=["single_tower"], tune=True, tuned_file=tmp_path / "t.json",
                          settings="weight_decay=0.0001")
    val = out[out["metric"] == "validation_recall@100"]
    assert len(val) == 1 and val["scorer"].iloc[0].startswith("tuned on the validation split of last sessions: lr x")  # the default there
    assert val["scorer"].iloc[0].endswith(" at weight_decay=0.0001")
    kept = tuning.load_tuned(tmp_path / "t.json", "multi_interest", "smoke", ["single_tower"])["single_tower"][1]
    assert kept == val["scorer"].iloc[0]
    with pytest.raises(ZeroDivisionError):  # untuned: the note reaches the training of every seed
        quality.run_all("smoke", tmp_path, datasets=("multi_interest",), seeds=[0], device="cpu", progress=False,
                        models=["single_tower", "ranking"], settings="ad_features=1")
    assert {m: note for m, (_, note) in seen[-1].items()} == {
        m: "untuned: preset settings with ad_features=1" for m in ("single_tower", "ranking")}
    for item in ("foo=1", "steps", "steps=ten", "steps=0", "ad_features=2", "lr=nan", "weight_decay=-1",
                 "lr=1" + "0" * 400, "steps=3 steps=5", "shared_inputs=1 interest_experts=1"):
        with pytest.raises(SystemExit):
            main(["--preset", "smoke", "--out", str(tmp_path / "bad"), "--set", *item.split()])
    assert not (tmp_path / "bad").exists()


def test_set_reads_counts_in_float_notation():
    """--set steps=1e3 is the count 1000 (an int, as TrainConfig takes it); a count that is not whole
    is refused; float fields stay floats."""
    import argparse

    from andromeda_nb.training.__main__ import _parse_settings

    kv = _parse_settings(argparse.ArgumentParser(), ["steps=1e3", "negatives=64.0", "lr=1e-3", "temperature=2"])
    assert kv == {"steps": 1000, "negatives": 64, "lr": 1e-3, "temperature": 2}
    assert type(kv["steps"]) is int and type(kv["negatives"]) is int and type(kv["lr"]) is float
    for item in ("steps=2.5", "batch=1e400"):
        with pytest.raises(SystemExit):
            _parse_settings(argparse.ArgumentParser(), [item])


@pytest.mark.parametrize("argv, expected", [
    (["--device", "bogus"], "device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    (["--device", "cuda:99"], "CUDA device(s)"),
    (["--threads", "0"], "--threads must be at least 1"), (["--threads", "-1"], "--threads must be at least 1"),
    (["--seeds", "0", "-1"], "--seeds must be non-negative"),
    (["--set", "steps=1", "--out", "COMMITTED"], "would replace the main table's"),
])
def test_bad_training_arguments_are_refused_before_anything_runs(argv, expected, tmp_path, capsys):
    """A device torch does not have, thread and seed counts out of range, and changed settings
    whose rows would replace the committed main table's (the settings are not in quality.csv's
    key) are usage errors naming the argument; nothing is written."""
    from andromeda_nb.provenance import COMMITTED_RESULTS
    from andromeda_nb.training.__main__ import main

    committed = (COMMITTED_RESULTS / "quality.csv").read_bytes()
    argv = [str(COMMITTED_RESULTS) if a == "COMMITTED" else a for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as e:
        main(["--preset", "smoke", "--datasets", "multi_interest", "--models", "single_tower", *out, *argv])
    assert e.value.code == 2 and expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and (COMMITTED_RESULTS / "quality.csv").read_bytes() == committed


@pytest.mark.parametrize("argv", [["--baselines", "--set", "steps=3"], ["--baselines", "als", "--tune"],
                                  ["--compute-only", "--models", "ranking"], ["--compute-only", "--set", "lr=0.1"],
                                  ["--baselines", "--compute-only"], ["--compute-only", "--workers", "2"],
                                  ["--baselines", "--device", "cuda"], ["--baselines", "als", "--threads", "2"],
                                  ["--baselines", "--scoring-csv", "x.csv"], ["--compute-only", "--seeds", "0"],
                                  ["--compute-only", "--device", "cpu"]])
def test_runs_that_train_no_project_model_refuse_its_options(argv, tmp_path, capsys):
    """--baselines and --compute-only train no project model: a training option beside them is a
    usage error naming it, before anything runs (it would be silently ignored)."""
    from andromeda_nb.training.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["--preset", "smoke", "--out", str(tmp_path / "out"), *argv])
    err, flag = capsys.readouterr().err, [a for a in argv if a.startswith("--")][-1]
    assert e.value.code == 2 and "trains no project model" in err and f"{flag} would be ignored" in err
    assert not (tmp_path / "out").exists()


def test_mixture_fields_leave_models_without_experts_the_same_run():
    """shared_inputs / interest_experts / route_coef change only a mixture: the single tower's and
    the ranking model's run keys ignore them (a tuning with --set shared_inputs=1 reuses their kept
    runs), a mixture's keys do not; a key kept before route_coef or session_history existed reads
    as that field at 0; session_history changes every model's key."""
    from dataclasses import replace as dc_replace

    from andromeda_nb.training.train import TrainConfig

    cfg = TrainConfig(steps=7)
    for name in ("single_tower", "ranking"):
        for field in tuning.MIXTURE_FIELDS:
            assert tuning.run_key(name, "d", dc_replace(cfg, **{field: 1}), [7]) == tuning.run_key(name, "d", cfg, [7])
    for field in tuning.MIXTURE_FIELDS:
        assert (tuning.run_key("mixture_k2", "d", dc_replace(cfg, **{field: 1}), [7])
                != tuning.run_key("mixture_k2", "d", cfg, [7]))
    assert tuning.run_key("single_tower", "d", cfg, [7]) != tuning.run_key("single_tower", "d", dc_replace(cfg, lr=1e-3), [7])
    for name in ("single_tower", "mixture_k2"):
        assert (tuning.run_key(name, "d", dc_replace(cfg, session_history=1), [7])
                != tuning.run_key(name, "d", cfg, [7]))
        for field in ("route_coef", "session_history"):
            old = json.loads(tuning.run_key(name, "d", cfg, [7]))
            del old["config"][field]
            assert tuning._with_legacy_fields(json.dumps(old)) == tuning.run_key(name, "d", cfg, [7])
