"""The expert-count and precision notebooks' tables and findings on hand-made quality rows
(andromeda_nb.analysis.expert_count_report, precision_report)."""

import numpy as np
import pandas as pd
import pytest

from andromeda_nb.analysis import expert_count_report as EC
from andromeda_nb.analysis import precision_report as PR
from andromeda_nb.analysis import quality


def _rows(dataset, model, metric, values, experiment="expert_count", dtype="fp32", scorer="s", **extra):
    return [dict(dataset=dataset, model=model, experts=6, k_experts=2, dtype=dtype, d=64, seed=s, metric=metric,
                 value=v, commit="x", device="cpu", experiment=experiment, preset="full", scorer=scorer, n_users=10,
                 **extra)
            for s, v in enumerate(values)]


def _expert_count_frame():
    rows = []
    for model, base in (("single_tower", 0.10), ("mixture_k2", 0.12), ("ranking", 0.30)):
        for k in quality.KS["multi_interest"]:
            rows += _rows("multi_interest", model, f"recall@{k}", [base * k / 100, base * k / 100 + 0.01])
    rows += _rows("multi_interest", "mixture_k2", "overlap@100_ranking", [0.4, 0.5])
    for model, flops in (("single_tower", 300), ("mixture_k2", 1200)):
        rows += _rows("multi_interest", model, "flops_per_ad", [flops], experiment="compute", dtype="fp16")
        rows += _rows("multi_interest", model, "kernel_ads_per_s", [2e10 if model == "single_tower" else 1e10],
                      experiment="compute", dtype="fp16", scorer="data/results/scoring.csv, run r1")
    return pd.DataFrame(rows)


def test_expert_count_tables_metrics_and_verdict():
    frame = _expert_count_frame()
    tables = EC.recall_tables(frame, ["multi_interest", "ml-100k"])
    assert list(tables) == ["multi_interest"]  # no ml-100k rows: no table
    r100 = tables["multi_interest"]["recall@100"]
    assert list(r100.index) == ["single_tower", "mixture_k2", "ranking"] and r100.loc["mixture_k2", "seeds"] == 2
    assert EC.recall_metrics(tables)["multi_interest/mixture_k2/recall@100"] == pytest.approx(0.125)
    shown = EC.recall_display(tables["multi_interest"])
    assert shown.loc["mixture_k2", "recall@100"] == "0.1250 ± 0.0071" and shown["seeds"].tolist() == [2, 2, 2]
    comp = EC.compute_table(frame, "multi_interest")
    assert comp.loc["mixture_k2", "flops_per_ad"] == 1200 and comp.loc["mixture_k2", "overlap@100_ranking"] == 0.45
    text = EC.findings(frame, tables, ["multi_interest", "ml-100k"])
    assert "mixture_k2: recall@50 +18.2 % against the single tower, recall@100 +2.00 pp" in text
    assert "the anchor is stronger" in text and "ml-100k: no results" in text
    assert ("20.0 G ads/s for one vector, 10.0 G for K = 2 (cpu, run r1; fp16 tables in fp32 math): K = 2 takes "
            "2.00x the one vector's time there.") in text
    # rates of two runs are each named with their run, not compared as a cost
    apart = frame.assign(scorer=np.where((frame["metric"] == "kernel_ads_per_s") & (frame["model"] == "mixture_k2"),
                                         "data/results/scoring.csv, run r2", frame["scorer"]))
    apart_text = EC.findings(apart, tables, ["multi_interest"])
    assert "from different runs (r1 and r2)" in apart_text and "not a like-for-like cost" in apart_text
    assert "takes" not in apart_text
    # the generator fed estimated interests is neither a retrieval model nor tuned: the verdict and
    # the tuning line read as before, the table names what it is
    est = pd.concat([frame, pd.DataFrame(_rows("multi_interest", "true_model_estimated", "recall@100", [0.9],
                                               scorer="ground_truth with interests estimated from training clicks")
                                         + _rows("multi_interest", "baseline_als", "recall@100", [0.1, 0.1],
                                                 experiment="baselines"))])
    est_text = EC.findings(est, EC.recall_tables(est, ["multi_interest"]), ["multi_interest"])
    assert "against the best retrieval model (mixture_k2)" in est_text and "true_model_estimated" not in est_text
    assert "against the best project retrieval model (mixture_k2)" in est_text
    assert EC.tuning_line(est) == EC.tuning_line(frame)
    shown_est = EC.recall_display(EC.recall_tables(est, ["multi_interest"])["multi_interest"])
    assert shown_est.loc["true_model_estimated", "trained"] == "generator, interests from clicks"
    # a ranking model kept only at the preset's settings is not the anchor: the finding says so
    no_anchor = frame[frame["model"] != "ranking"]
    kept = frame[frame["model"] == "ranking"].assign(experiment="preset_settings")
    text = EC.findings(pd.concat([no_anchor, kept]), EC.recall_tables(no_anchor, ["multi_interest"]), ["multi_interest"])
    assert "ranking model: no rows among the models compared here, only preset_settings rows" in text
    assert "anchor is" not in text


def test_variant_line_pairs_each_change_with_its_model_at_the_preset_settings():
    """variant_* rows: the change read from the scorers (added, changed and dropped settings), both
    means and the paired difference over the seeds both ran against the same model's
    preset_settings rows, 'within noise' only inside the interval; a variant without preset rows of
    its model or with one seed is left out, another dataset's rows are not mixed in."""
    preset = "untuned: preset settings with ad_features=1 weight_decay=1e-4"
    rows = (_rows("multi_interest", "mixture_k2", "recall@100", [0.20, 0.21, 0.22, 0.5], experiment="preset_settings",
                  scorer=preset)
            + _rows("multi_interest", "ranking", "recall@100", [0.30, 0.31, 0.32], experiment="preset_settings",
                    scorer=preset)
            # seeds 0-2, each 1.0 / 1.1 / 1.2 pp below: -1.10 pp, t(2) 4.303 x 0.1 / sqrt(3) = 0.25 pp; the
            # preset's seed 3 has no partner and stays out of its mean
            + _rows("multi_interest", "mixture_k2", "recall@100", [0.19, 0.199, 0.208], experiment="variant_shared",
                    scorer=preset + " shared_inputs=1")
            # +1.0, +0.2, +0.6 pp: +0.60 pp, t(2) 4.303 x 0.4 / sqrt(3) = 0.99 pp: within noise
            + _rows("multi_interest", "ranking", "recall@100", [0.31, 0.312, 0.326], experiment="variant_plain",
                    scorer="untuned: preset settings with weight_decay=1e-3")
            + _rows("multi_interest", "single_tower", "recall@100", [0.1, 0.1], experiment="variant_orphan",
                    scorer=preset + " hidden=256")
            + _rows("multi_interest", "mixture_k2", "recall@100", [0.3], experiment="variant_one_seed",
                    scorer=preset + " route_coef=1")
            + _rows("multi_interest", "mixture_k2", "recall@100", [0.21, 0.22], experiment="variant_tuned",
                    scorer="tuned on the validation split: lr x3")
            # another dataset's rows of the same names
            + _rows("ml-100k", "mixture_k2", "recall@100", [0.9, 0.9, 0.9], experiment="preset_settings", scorer=preset)
            + _rows("ml-100k", "mixture_k2", "recall@100", [0.1, 0.1, 0.1], experiment="variant_shared",
                    scorer=preset + " shared_inputs=1"))
    frame = pd.DataFrame(rows)
    text = EC.variant_line(frame, "multi_interest")
    assert ("mixture_k2 with shared_inputs=1: 0.1990 against 0.2100, -1.10 pp (paired over 3 seeds ±0.25)"
            in text), text
    assert ("ranking with weight_decay=1e-3 (was 1e-4) without ad_features=1: 0.3160 against 0.3100, +0.60 pp "
            "(paired over 3 seeds ±0.99, within noise)") in text, text
    assert "mixture_k2 (variant_tuned): 0.2150 against 0.2050, +1.00 pp" in text and "trained on" not in text
    moved = frame.assign(device=np.where(frame["experiment"] == "variant_shared", "gpu-b", "cpu"))
    assert "-1.10 pp (paired over 3 seeds ±0.25; trained on gpu-b against cpu)" in EC.variant_line(moved, "multi_interest")
    assert text.count("within noise") == 1 and "single_tower" not in text and "route_coef" not in text
    # values as read from a CSV (strings), no scorer column: the same pairs, the experiment named
    plain = EC.variant_line(frame.astype({"value": str}).drop(columns="scorer"), "multi_interest")
    assert "mixture_k2 (variant_shared): 0.1990 against 0.2100, -1.10 pp" in plain
    ml = EC.variant_line(frame, "ml-100k")
    assert "0.1000 against 0.9000, -80.00 pp (paired over 3 seeds ±0.00)" in ml and "ranking" not in ml
    assert EC.variant_line(frame.drop(columns="experiment"), "x") == ""
    assert "(`variant_*` rows)" in EC.findings(frame, {}, ["multi_interest"])
    with pytest.raises(ValueError, match="several presets"):
        EC.variant_line(pd.concat([frame, frame.assign(preset="demo", value=0.5)]), "multi_interest")


def test_tuning_line_says_which_rows_are_tuned():
    """All tuned, none tuned, or a mix: the mix names each dataset's untuned models; rows of other
    experiments (preset_settings, tuned_session) do not count."""
    tuned = "tuned on the validation split: lr x1, steps x1"
    rows = (_rows("multi_interest", "single_tower", "recall@100", [0.2, 0.2], scorer=tuned)
            + _rows("multi_interest", "ranking", "recall@100", [0.2, 0.2], scorer=tuned)
            + _rows("multi_interest", "ranking", "recall@100", [0.3], experiment="preset_settings", scorer="untuned")
            + _rows("multi_interest", "true_model", "recall@100", [0.3], scorer="ground_truth"))
    assert EC.tuning_line(pd.DataFrame(rows)).startswith("The project's models were tuned")
    mixed = pd.DataFrame(rows + _rows("ml-100k", "mixture_k1", "recall@100", [0.1, 0.1, 0.1])
                         + _rows("ml-100k", "dense_mixture", "recall@100", [0.1]))
    assert EC.tuning_line(mixed) == ("4 of 8 of the project's recall@100 rows come from tuned models, the rest from "
                                     "the preset's settings; untuned: ml-100k mixture_k1, dense_mixture: compare "
                                     "within one kind.")
    assert EC.tuning_line(pd.DataFrame(rows).assign(scorer="s")).startswith("The project's models were trained at")


def test_split_tuning_line_pairs_another_split_s_rows_with_the_other_trainings():
    """tuned_session rows: held-out mean and 95 % interval over seeds, the tuned point, paired
    differences against the same model at the preset's settings and tuned on the last-click split
    (expert_count), 'within noise' only inside the interval; models tuned there with no trained
    seed are named; another dataset's rows stay out; tuned_last_click rows alike, named so."""
    point = "tuned on the validation split of last sessions: lr x3, steps x2 (each length its own run) at x=1"
    rows = (_rows("multi_interest", "ranking", "recall@100", [0.21, 0.212, 0.214], experiment="tuned_session",
                  scorer=point)
            + _rows("multi_interest", "ranking", "validation_recall@100", [0.3], experiment="tuned_session",
                    scorer=point)
            + _rows("multi_interest", "mixture_k2", "validation_recall@100", [0.3], experiment="tuned_session",
                    scorer=point)
            # the preset's settings 1 pp below on every seed: +1.00 pp ±0.00; the last-click tuning +0.6,
            # +0.2, +1.0 pp: +0.60 pp, t(2) 4.303 x 0.4 / sqrt(3) = 0.99: within noise
            + _rows("multi_interest", "ranking", "recall@100", [0.20, 0.202, 0.204], experiment="preset_settings")
            + _rows("multi_interest", "ranking", "recall@100", [0.204, 0.21, 0.204],
                    scorer="tuned on the validation split: lr x0.111, steps x2 (each length its own run)")
            + _rows("ml-100k", "single_tower", "recall@100", [0.5, 0.5], experiment="tuned_session"))
    frame = pd.DataFrame(rows)
    text = EC.split_tuning_line(frame, "multi_interest")
    # mean 0.212, sd 0.002: t(2) 4.303 x 0.002 / sqrt(3) = 0.0050
    assert ("held-out recall@100: ranking 0.2120 ±0.0050 (95 %) over 3 seeds (lr x3, steps x2); against the preset's "
            "settings +1.00 pp (paired over 3 seeds ±0.00); against the `expert_count` rows' last-click tuning +0.60 pp "
            "(paired over 3 "
            "seeds ±0.99, within noise). Tuned there, not yet trained at their points: mixture_k2.") in text, text
    assert "single_tower" not in text and "0.5000" not in text and "trained on" not in text
    # a seed's rows count once, a NaN value not at all, one seed gets no interval, generator rows
    # are not project models, devices apart are named
    more = pd.concat([frame, pd.DataFrame(
        _rows("multi_interest", "ranking", "recall@100", [0.21], experiment="tuned_session", scorer=point)  # seed 0 again
        + [dict(r, seed=3, value=float("nan")) for r in _rows("multi_interest", "ranking", "recall@100", [0.0],
                                                              experiment="tuned_session", scorer=point)]
        + _rows("multi_interest", "single_tower", "recall@100", [0.2], experiment="tuned_session", scorer=point)
        + _rows("multi_interest", "true_model", "recall@100", [0.3, 0.3], experiment="tuned_session"))],
        ignore_index=True)
    more_text = EC.split_tuning_line(more, "multi_interest")
    assert "ranking 0.2120 ±0.0050 (95 %) over 3 seeds" in more_text, more_text
    assert "single_tower 0.2000 over 1 seed (lr x3, steps x2)" in more_text and "±nan" not in more_text
    assert "true_model" not in more_text
    moved = frame.assign(device=np.where(frame["experiment"] == "tuned_session", "gpu-b", "cpu"))
    assert ("+1.00 pp (paired over 3 seeds ±0.00; trained on gpu-b against cpu)"
            in EC.split_tuning_line(moved, "multi_interest"))
    # seeds one side has and the other has not pair with nothing: their devices are not named
    extra = pd.concat([frame, pd.DataFrame([dict(r, seed=r["seed"] + 5, device="gpu-c") for r in _rows(
        "multi_interest", "ranking", "recall@100", [0.3, 0.3, 0.3], experiment="preset_settings")])],
        ignore_index=True)
    extra_text = EC.split_tuning_line(extra, "multi_interest")
    assert "settings +1.00 pp (paired over 3 seeds ±0.00)" in extra_text and "gpu-c" not in extra_text, extra_text
    # what the expert_count rows are is read from their scorer: a session tuning, or untuned rows
    main = (frame["experiment"] == "expert_count")
    session_main = frame.assign(scorer=np.where(main, point, frame["scorer"]))
    assert "against the `expert_count` rows' session tuning +0.60 pp" in EC.split_tuning_line(session_main,
                                                                                                 "multi_interest")
    untuned = frame.assign(scorer=np.where(main, "torch_fp32_formula", frame["scorer"]))
    assert "against the `expert_count` rows +0.60 pp" in EC.split_tuning_line(untuned, "multi_interest")
    waiting = EC.split_tuning_line(frame[frame["metric"] != "recall@100"], "multi_interest")
    assert waiting.endswith("(`tuned_session` rows): mixture_k2, ranking, not yet trained at their points."), waiting
    assert EC.split_tuning_line(frame, "nowhere") == "" and EC.split_tuning_line(frame.drop(columns="experiment"),
                                                                                     "multi_interest") == ""
    assert "(`tuned_session` rows)" in EC.findings(frame, {}, ["multi_interest"])
    # a tuning that chose the preset's point: the same runs, not a zero difference "within noise"
    same = frame.copy()
    chosen = (same["experiment"] == "preset_settings") & (same["model"] == "ranking")
    same.loc[chosen, "value"] = [0.21, 0.212, 0.214]
    assert "; its tuning chose the point of the preset's settings, so these are the same runs; against" in EC.split_tuning_line(same, "multi_interest")
    # the main table tuned on last sessions, the last-click tuning's rows beside it
    clicks = frame.assign(experiment=frame["experiment"].replace("tuned_session", "tuned_last_click"))
    line = EC.split_tuning_line(clicks, "multi_interest", "tuned_last_click")
    assert line.startswith("multi_interest, tuned on the validation split of each user's last training click "
                           "(`tuned_last_click` rows), held-out recall@100: ranking 0.2120"), line
    assert EC.split_tuning_line(clicks, "multi_interest") == ""  # no tuned_session rows left
    assert line in EC.findings(clicks, {}, ["multi_interest"])
    with pytest.raises(ValueError, match="several presets"):
        EC.split_tuning_line(pd.concat([frame, frame.assign(preset="demo")]), "multi_interest")


def test_routing_table():
    frame = pd.DataFrame(_rows("multi_interest", "mixture_k2", "expert_share_max", [0.3, 0.5])
                         + _rows("multi_interest", "mixture_k2", "routing_entropy", [0.8, 0.6]))
    assert EC.routing_table(frame, "ml-100k").empty
    t = EC.routing_table(frame, "multi_interest")
    assert t.loc["mixture_k2", "expert_share_max (mean)"] == pytest.approx(0.4)
    assert t.loc["mixture_k2", "routing_entropy (std)"] == pytest.approx(np.std([0.8, 0.6], ddof=1))
    assert t.loc["mixture_k2", "balanced share (1/E)"] == pytest.approx(1 / 6)
    assert t.loc["mixture_k2", "collapsed share (1/K)"] == 0.5


def test_tuning_line_reads_the_scorer_column():
    frame = _expert_count_frame()
    assert "not tuned per model" in EC.tuning_line(frame)
    tuned = frame.assign(scorer=np.where(frame["metric"] == "recall@100", "tuned on the validation split: lr x1", "s"))
    assert "were tuned on the training part's validation split" in EC.tuning_line(tuned)
    half = tuned.copy()
    half.loc[half.index[(half["metric"] == "recall@100") & (half["model"] == "ranking")], "scorer"] = "s"
    assert EC.tuning_line(half).startswith("4 of 6")
    assert "not tuned per model" in EC.findings(frame, EC.recall_tables(frame, ["multi_interest"]), ["multi_interest"])
    assert EC.tuning_line(frame[frame["metric"] != "recall@100"]) == ""


def test_tuning_effect_pairs_tuned_and_preset_settings_rows():
    """A model both tuned (expert_count) and at the preset's settings (preset_settings): the paired
    difference on the seeds both ran, and a finding that says where the tuning's choice did worse."""
    tuned = "tuned on the validation split: lr x1"
    frame = pd.DataFrame(_rows("multi_interest", "single_tower", "recall@100", [0.20, 0.205, 0.195], scorer=tuned)
                         + _rows("multi_interest", "single_tower", "recall@100", [0.22, 0.22, 0.22, 0.30],
                                 experiment="preset_settings")
                         + _rows("multi_interest", "mixture_k2", "recall@100", [0.25, 0.24], scorer=tuned)
                         + _rows("multi_interest", "mixture_k2", "recall@100", [0.20, 0.21],
                                 experiment="preset_settings")
                         + _rows("multi_interest", "ranking", "recall@100", [0.3, 0.3])
                         + _rows("multi_interest", "ranking", "recall@100", [0.2, 0.2], experiment="preset_settings")
                         + _rows("multi_interest", "mixture_k2", "routing_entropy", [0.8, 0.6])
                         + _rows("multi_interest", "mixture_k2", "routing_entropy", [0.1, 0.1],
                                 experiment="preset_settings"))
    eff = quality.tuning_effect(frame, "multi_interest")
    assert list(eff.index) == ["single_tower", "mixture_k2"]  # ranking's expert_count rows are not tuned ones
    d = np.array([0.20, 0.205, 0.195]) - 0.22  # seed 3 ran only at the preset's settings
    assert eff.loc["single_tower", "seeds"] == 3 and eff.loc["single_tower", "preset"] == pytest.approx(0.22)
    assert eff.loc["single_tower", "mean"] == pytest.approx(d.mean())
    assert eff.loc["single_tower", "ci95"] == pytest.approx(quality.ci95(d.std(ddof=1), 3))
    assert eff.loc["mixture_k2", "mean"] == pytest.approx(0.04)
    line = EC.tuning_effect_line(frame, "multi_interest")
    assert "single_tower 0.2000 against 0.2200 (-2.00 pp, paired over 3 seeds" in line
    assert "did worse than the preset's settings for single_tower:" in line  # not mixture_k2 (it gained)
    assert EC.tuning_effect_line(frame, "ml-100k") == "" and quality.tuning_effect(frame, "ml-100k").empty
    assert line in EC.findings(frame, EC.recall_tables(frame, ["multi_interest"]), ["multi_interest"])
    one = frame[~((frame["model"] == "mixture_k2") & (frame["seed"] == 1))]
    assert "mixture_k2 0.2500 against 0.2000 (+5.00 pp, one seed: no interval)" in EC.tuning_effect_line(one,
                                                                                                          "multi_interest")
    same = frame[frame["model"] == "single_tower"]  # tuned to the preset's settings: the same runs as rows of both
    same = pd.concat([same[same["experiment"] == "preset_settings"].assign(experiment="expert_count", scorer=tuned),
                      same[same["experiment"] == "preset_settings"]])
    assert "single_tower chose the preset's settings (0.2400, the same runs)" in EC.tuning_effect_line(
        same, "multi_interest")
    with pytest.raises(ValueError, match="presets"):  # seeds of another world do not pair
        quality.tuning_effect(pd.concat([frame, frame.assign(preset="demo")]), "multi_interest")
    # the models at the preset's settings against its single tower, paired on their own seeds (0, 1)
    at_preset = EC.against_single_tower_line(frame, "multi_interest")
    k2 = quality.paired_difference(frame, "multi_interest", "mixture_k2", "single_tower", experiments=("preset_settings",))
    assert k2["seeds"] == 2 and k2["mean"] == pytest.approx(-0.015)
    assert f"mixture_k2 -1.50 pp (paired over 2 seeds ±{100 * k2['ci95']:.2f}, within noise)" in at_preset
    assert "ranking -2.00 pp (paired over 2 seeds ±0.00)" in at_preset
    assert "of the gap" not in at_preset  # the ranking model below the single tower: no gap to close
    assert EC.against_single_tower_line(frame, "ml-100k") == ""
    assert at_preset in EC.findings(frame, EC.recall_tables(frame, ["multi_interest"]), ["multi_interest"])
    # another experiment's rows alike, with the share of the single tower's gap to the ranking model a
    # mixture closes (paired means: K = 2 +1 pp, ranking +4 pp)
    session = pd.DataFrame(_rows("multi_interest", "single_tower", "recall@100", [0.20, 0.21, 0.22],
                                 experiment="tuned_session")
                           + _rows("multi_interest", "mixture_k2", "recall@100", [0.21, 0.22, 0.23],
                                   experiment="tuned_session")
                           + _rows("multi_interest", "ranking", "recall@100", [0.25, 0.25, 0.25],
                                   experiment="tuned_session"))
    line = EC.against_single_tower_line(pd.concat([frame, session]), "multi_interest", "tuned_session")
    assert line.startswith("multi_interest tuned on last sessions (`tuned_session` rows)")
    assert "mixture_k2 +1.00 pp (paired over 3 seeds ±0.00), 0.25 of the gap to the ranking model" in line
    assert EC.against_single_tower_line(session, "multi_interest") == ""  # no preset_settings rows there
    # no share where the ranking model's lead is within its interval (a tiny gap makes any share huge)
    noisy = session.copy()
    noisy.loc[noisy["model"] == "ranking", "value"] = [0.19, 0.23, 0.22]
    assert "of the gap" not in EC.against_single_tower_line(noisy, "multi_interest", "tuned_session")
    # the share pairs the three models on the seeds all ran: K = 2 on seeds 0 and 1 only (+1 pp on
    # each), the ranking model +4.5 pp on both: 1 / 4.5; a gain inside its interval is said so
    short = pd.DataFrame(_rows("multi_interest", "single_tower", "recall@100", [0.20, 0.22, 0.20, 0.22, 0.20],
                               experiment="tuned_session")
                         + _rows("multi_interest", "mixture_k2", "recall@100", [0.21, 0.23], experiment="tuned_session")
                         + _rows("multi_interest", "ranking", "recall@100", [0.245, 0.265, 0.24, 0.27, 0.24],
                                 experiment="tuned_session"))
    assert "mixture_k2 +1.00 pp (paired over 2 seeds ±0.00), 0.22 of the gap to the ranking model;" in (
        EC.against_single_tower_line(short, "multi_interest", "tuned_session"))
    wobbly = short.copy()
    wobbly.loc[wobbly["model"] == "mixture_k2", "value"] = [0.19, 0.25]  # -1, +3 pp: +1 pp ± 25 pp
    assert "0.22 of the gap to the ranking model (its gain within noise)" in EC.against_single_tower_line(
        wobbly, "multi_interest", "tuned_session")
    assert EC.against_single_tower_line(short.astype(str), "multi_interest", "tuned_session") == (
        EC.against_single_tower_line(short, "multi_interest", "tuned_session"))  # as read from a CSV
    with pytest.raises(ValueError, match="several presets"):
        EC.against_single_tower_line(pd.concat([short, short.assign(preset="demo")]), "multi_interest",
                                     "tuned_session")
    # the main table's verdict gives the share too
    main = pd.concat([session, *(session.assign(metric=f"recall@{k}") for k in quality.KS["multi_interest"]
                                 if k != 100)])
    main = main.assign(experiment="expert_count")
    text = "\n".join(EC.verdict(EC.recall_tables(main, ["multi_interest"]), "multi_interest", main))
    assert "recall@100 +1.00 pp (paired over 3 seeds: 95 % interval ±0.00 pp), 0.25 of the gap to the ranking model" in text
    assert "0.2200: the anchor is stronger (paired over 3 seeds" in text  # +3 pp over K = 2 on average
    near = main.copy()
    near.loc[near["model"] == "ranking", "value"] = np.tile([0.20, 0.24, 0.25], len(quality.KS["multi_interest"]))
    text = "\n".join(EC.verdict(EC.recall_tables(near, ["multi_interest"]), "multi_interest", near))
    assert "the anchor leads, but not beyond the seeds' interval (paired over 3 seeds" in text, text
    # a mixture that ran fewer seeds than the single tower: its line gives the paired difference
    # (seeds 0, 1: +2 pp each), not its mean against the tower's mean over all seeds (+1 pp)
    uneven = []
    for k in quality.KS["multi_interest"]:
        uneven += _rows("multi_interest", "single_tower", f"recall@{k}", [0.10, 0.12, 0.14, 0.16])
        uneven += _rows("multi_interest", "mixture_k2", f"recall@{k}", [0.12, 0.14])
    uneven = pd.DataFrame(uneven)
    text = "\n".join(EC.verdict(EC.recall_tables(uneven, ["multi_interest"]), "multi_interest", uneven))
    assert "mixture_k2: recall@50 +18.2 % against the single tower, recall@100 +2.00 pp (paired over 2 seeds" in text
    unpaired = "\n".join(EC.verdict(EC.recall_tables(uneven, ["multi_interest"]), "multi_interest"))
    assert "against the single tower, recall@100 +0.00 pp" in unpaired  # no rows to pair: the means
    # the routing table is the tuned models' (the recall table's), not the preset-settings rows'
    assert EC.routing_table(frame, "multi_interest").loc["mixture_k2", "routing_entropy (mean)"] == pytest.approx(0.7)


def test_worked_example_findings():
    example = pd.DataFrame({"rank": [1, 2, 3, 4], "interest": ["other", "interest 0", "other", "interest 1"],
                            "chosen": ["a, b"] * 4})
    by = pd.DataFrame({"topic": [3, 7], "chosen_a": [0.9, 0.8], "chosen_b": [0.5, 0.2], "chosen_c": [0.6, 1.0]},
                      index=pd.Index(["interest 0", "interest 1"], name="interest"))
    text = EC.example_findings(example, by)
    assert "50% of the user's top-4 ads belong to neither" in text and "topics 3, 7" in text
    assert "interest 1 (topic 7): `c` 100%, `a` 80%" in text and "different experts first" in text


def _precision_frame():
    rows = []
    for dt, dpp, ov, err in (("fp32", 0.0, 1.0, 0.0), ("fp16", 0.1, 0.995, 1.5), ("int8", -0.8, 0.97, 3.0)):
        for metric, v in (("recall@100", 0.3 + dpp / 100), ("recall@100_delta_pp", dpp), ("overlap@100_fp32", ov),
                          ("score_err_p50", err / 1000), ("score_err_p99", err / 100), ("score_err_p999", err / 10),
                          ("score_err_max", err), ("bytes_per_ad", quality.bytes_per_ad(64, dt))):
            rows += _rows("ml-100k", "mixture_k2", metric, [v, v], experiment="precision", dtype=dt)
    rows += _rows("ml-100k", "mixture_k2", "recall@100", [0.5], experiment="expert_count")  # not a precision row
    return pd.DataFrame(rows)


def test_precision_summary_metrics_and_findings(tmp_path):
    frame = _precision_frame()
    path = tmp_path / "quality.csv"
    quality.write_rows(frame, path)
    prec, source = PR.load(False, path, "smoke", ["ml-100k"])
    assert source == f"{path}, preset 'full'" and set(prec["experiment"]) == {"precision"}
    summary = PR.summaries(prec, ["ml-100k", "multi_interest"])
    assert list(summary) == ["ml-100k"] and list(summary["ml-100k"].index) == ["fp32", "fp16", "int8"]
    got = PR.metrics(summary)
    assert got["ml-100k/int8/recall@100_delta_pp"] == pytest.approx(-0.8) and got["ml-100k/fp32/overlap@100_fp32"] == 1
    thr = pd.DataFrame({"items_per_s": [2e10, 1.8e10], "device": ["H200", "H200"], "commit": ["a", "a"]},
                       index=pd.Index(["fp16", "int8"]))
    table = PR.display_table(summary["ml-100k"], thr)
    assert table.loc["int8", "bytes/ad"] == 72 and table.loc["int8", "ads/s (H200)"] == 1.8e10
    assert np.isnan(table.loc["fp32", "ads/s (H200)"])
    text = PR.findings(summary, thr)
    assert "int8 stores 72 bytes an ad against fp16's 132" in text and "7.2 GB against 13.2 GB" in text
    assert "runs int8 at 0.90x fp16's measured ads/s in fp32 math (H200)" in text
    fast = pd.concat([thr, pd.DataFrame({"items_per_s": [3e10, 4.5e10], "device": ["H200"] * 2, "commit": ["b", "b"]},
                                        index=pd.Index(["fp16_math", "int8_fp16_math"]))])
    assert ("runs int8 at 1.50x fp16's measured ads/s in fp16 math (H200), 0.90x fp16's measured ads/s in fp32 math "
            "(H200)") in PR.findings(summary, fast)
    fast.loc["int8_fp16_math", ["commit", "device"]] = ["c", "H100"]  # the ratio of two runs says so, and their cards
    assert "1.50x fp16's measured ads/s in fp16 math (two runs: H100, H200), 0.90x" in PR.findings(summary, fast)
    assert "**fp16 math on int8 tables?**" in text and "not measured" in text
    # the same-storage metrics of int8_fp16_math rows reach the findings through load()
    same = pd.DataFrame(_rows("ml-100k", "mixture_k2", "recall@100_delta_pp_same_storage", [0.02, 0.04],
                              experiment="precision", dtype="int8_fp16_math")
                        + _rows("ml-100k", "mixture_k2", "overlap@100_same_storage", [0.995, 0.997],
                                experiment="precision", dtype="int8_fp16_math"))
    quality.write_rows(same, path)
    both = PR.summaries(PR.load(False, path, "smoke", ["ml-100k"])[0], ["ml-100k"])
    assert "ml-100k: +0.030 pp, overlap 0.9960: met on every dataset" in PR.findings(both, thr)
    assert "ml-100k, fp16: Δ recall@100 +0.100 pp, top-100 overlap 0.9950: meets the target" in text
    assert "ml-100k, int8: Δ recall@100 -0.800 pp, top-100 overlap 0.9700: **misses**" in text
    assert "maximum* score error is 1.5 to 1.5" in text


def test_kernel_throughput_of_the_precision_configuration(tmp_path):
    csv = tmp_path / "scoring.csv"
    pd.DataFrame([dict(variant="gated_fused_topk", device="H200", dtype=dt, d=d, experts=6, k_experts=2, access="pool",
                       items_per_s=v, verified="ok") for dt, d, v in (("fp16", 64, 2e10), ("int8", 64, 1.8e10),
                                                                        ("fp16", 128, 9e9))]).to_csv(csv, index=False)
    thr = PR.throughput(csv)
    assert thr["items_per_s"].to_dict() == {"fp16": 2e10, "int8": 1.8e10}
    assert PR.kernel_rate(thr, "int8_dimscale") == 1.8e10 and np.isnan(PR.kernel_rate(thr, "bf16"))


def test_kernel_throughput_takes_each_key_from_its_newest_run(tmp_path):
    """A faster row of an older run (or of a diagnostic configuration there) does not stand in for
    the newest run's; rates compare as one run only where both dtypes' newest run is the same."""
    csv = tmp_path / "scoring.csv"
    rows = [("old", "2026-01-01T00:00:00+00:00", "fp16", "fp16", 3.2e10), ("old", "2026-01-01T00:00:00+00:00", "int8",
            "fp16", 4.9e10), ("new", "2026-02-01T00:00:00+00:00", "fp16", "fp16", 3.0e10),
            ("new", "2026-02-01T00:00:00+00:00", "int8", "fp16", 4.2e10), ("new", "2026-02-01T00:00:01+00:00", "int8",
            "fp16", 4.4e10), ("old", "2026-01-01T00:00:00+00:00", "int8", "fp32", 1.2e10),
            ("mid", "2026-01-15T00:00:00+00:00", "fp16", "fp32", 2.0e10)]
    pd.DataFrame([dict(variant="gated_fused_topk_filter", device="H200", commit=c, timestamp=t, dtype=dt, math=m, d=64,
                       experts=6, k_experts=2, access="pool", items_per_s=v, verified="ok")
                  for c, t, dt, m, v in rows]).to_csv(csv, index=False)
    thr = PR.throughput(csv)
    assert thr["items_per_s"].to_dict() == {"fp16": 2.0e10, "fp16_math": 3.0e10, "int8": 1.2e10,
                                             "int8_fp16_math": 4.4e10}
    assert PR.one_run(thr, "int8_fp16_math", "fp16_math") and not PR.one_run(thr, "int8", "fp16")


def test_int8_default_rule_against_fp32_math_on_the_int8_table():
    """fp16 math on int8 tables meets the default rule only within 0.1 pp and overlap 0.99 on every dataset."""
    both = ["ml-100k", "multi_interest"]
    good = {"ml-100k": (-0.05, 0.995), "multi_interest": (0.02, 0.991)}
    assert PR.int8_default_line(good, both).endswith(
        "met on every dataset; `\"auto\"` takes fp16 math on int8 tables.")  # the default as KernelConfig has it
    assert PR.int8_default_line(good, both, auto_fp16=False).endswith("though the data allow fp16 math.")
    for bad in ({"ml-100k": (-0.15, 0.995), "multi_interest": (0.02, 0.991)},
                {"ml-100k": (-0.05, 0.985), "multi_interest": (0.02, 0.991)}):
        line = PR.int8_default_line(bad, both)
        assert "not met on every dataset" in line and line.endswith("which these rows do not support.")
        assert PR.int8_default_line(bad, both, auto_fp16=False).endswith("keeps fp32 math on int8 tables.")
    one = PR.int8_default_line({"ml-100k": (0.0, 1.0)}, both)
    assert "multi_interest: not measured" in one and "not yet measured on every dataset" in one
    assert PR.int8_default_line({}, both).endswith("which these rows do not support.")


def test_committed_compute_rows_take_todays_kernel_rates(tmp_path):
    """The committed rows' kernel ads/s are made again from the scoring rows the report is given."""
    frame = _expert_count_frame()
    old = frame[(frame["metric"] == "kernel_ads_per_s") & (frame["model"] == "mixture_k2")]
    assert len(old) and (old["value"] == 1e10).all()
    csv = tmp_path / "scoring.csv"
    pd.DataFrame([dict(variant="gated_fused_topk_filter", device="H200", commit="x", timestamp="2026-01-01", dtype="fp16",
                       math="fp32", d=int(float(old["d"].iloc[0])), experts=6, k_experts=2, access="pool",
                       items_per_s=2.5e10, verified="ok")]).to_csv(csv, index=False)
    fresh = EC._fresh_compute_rows(frame, ["multi_interest"], csv, "full")
    got = fresh[(fresh["metric"] == "kernel_ads_per_s") & (fresh["model"] == "mixture_k2")]
    assert got["value"].tolist() == [2.5e10] and got["device"].tolist() == ["H200"]
    assert len(fresh[fresh["experiment"] != "compute"]) == len(frame[frame["experiment"] != "compute"])


def test_recall_table_says_how_each_model_was_trained():
    t = "tuned on the validation split: lr x3"
    rows = (_rows("ml-100k", "single_tower", "recall@100", [0.4, 0.41], scorer=t)
            + _rows("ml-100k", "mixture_k4", "recall@100", [0.38, 0.39], scorer="torch_fp32_formula")
            + _rows("ml-100k", "mixture_k2", "recall@100", [0.42], scorer=t)
            + _rows("ml-100k", "mixture_k2", "recall@100", [0.41], scorer="torch_fp32_formula")
            # a preset_settings row of a tuned model does not make it mixed: the table averages expert_count rows
            + _rows("ml-100k", "single_tower", "recall@100", [0.5], experiment="preset_settings")
            + _rows("ml-100k", "baseline_als", "recall@100", [0.44], experiment="baselines",
                    scorer="implicit als factors=64"))
    for k in quality.KS["ml-100k"]:
        if k != 100:
            rows += [dict(r, metric=f"recall@{k}") for r in rows if r["metric"] == "recall@100"]
    shown = EC.recall_display(EC.recall_tables(pd.DataFrame(rows), ["ml-100k"])["ml-100k"])
    assert shown["trained"].to_dict() == {"single_tower": "tuned on last clicks", "mixture_k2": "mixed",
                                          "mixture_k4": "preset's settings", "baseline_als": "tuned on last clicks"}
    # the split each scorer names: a session split's rows say "last sessions"
    frame = pd.DataFrame(rows)
    frame["scorer"] = frame["scorer"].replace({t: "tuned on the validation split of last sessions: lr x3",
                                               "implicit als factors=64": "implicit als factors=64; validated on last "
                                                                          "sessions"})
    assert EC.trained_as(frame, "ml-100k", ["single_tower", "baseline_als", "baseline_ease"]) == [
        "tuned on last sessions", "tuned on last sessions", "tuned"]
    popular = pd.DataFrame(_rows("ml-100k", "baseline_most_popular", "recall@100", [0.3], experiment="baselines",
                                 scorer="numpy most_popular"))
    assert EC.trained_as(popular, "ml-100k", ["baseline_most_popular"]) == ["nothing to tune"]
    assert EC.trained_as(popular.assign(scorer=""), "ml-100k", ["baseline_most_popular"]) == ["tuned"]
    assert EC.trained_as(popular.drop(columns="scorer"), "ml-100k", ["baseline_most_popular"]) == ["tuned"]


def test_trained_as_without_a_scorer_column():
    frame = pd.DataFrame(_rows("ml-100k", "single_tower", "recall@100", [0.4])).drop(columns="scorer")
    assert EC.trained_as(frame, "ml-100k", ["single_tower", "baseline_als", "mixture_k4"]) == [
        "preset's settings", "tuned", "preset's settings"]


def test_fresh_compute_rows_keep_the_analytic_rows():
    """Only the kernel's rows are made again: the committed FLOPs and bytes (which depend on the
    dataset's settings, e.g. ML-100K's 19 genres) stay as written."""
    from andromeda_nb.analysis import quality_results

    frame, _, pick = quality_results.committed("data/results/quality.csv")
    fresh = EC._fresh_compute_rows(frame, ["multi_interest", "ml-100k"], "data/results/scoring.csv", pick)
    key = ["dataset", "model", "dtype", "metric"]
    for metric in ("bytes_per_ad", "flops_per_ad"):
        a = frame[(frame["experiment"] == "compute") & (frame["metric"] == metric)].sort_values(key)
        b = fresh[(fresh["experiment"] == "compute") & (fresh["metric"] == metric)].sort_values(key)
        assert a["value"].tolist() == b["value"].tolist() and len(a)


def test_kernel_throughput_keeps_rows_that_do_not_say_their_run(tmp_path):
    csv = tmp_path / "scoring.csv"
    pd.DataFrame([dict(variant="gated_fused_topk", device="H200", commit=c, timestamp=t, dtype="fp16", d=64, experts=6,
                       k_experts=2, access="pool", items_per_s=2e10, verified="ok")
                  for c, t in ((None, "2026-01-01"),)]).to_csv(csv, index=False)
    thr = PR.throughput(csv)
    assert thr["items_per_s"].to_dict() == {"fp16": 2e10} and not PR.one_run(thr, "fp16", "fp16")


def test_ceiling_line_places_the_best_model_between_the_generator_rows():
    frame = pd.DataFrame(_rows("multi_interest", "true_model", "recall@100", [0.30])
                         + _rows("multi_interest", "true_model_estimated", "recall@100", [0.24])
                         + _rows("multi_interest", "ranking", "recall@100", [0.20, 0.22])
                         + _rows("multi_interest", "single_tower", "recall@100", [0.19, 0.19])
                         + _rows("multi_interest", "single_tower", "recall@100", [0.23, 0.23], experiment="preset_settings")
                         + _rows("multi_interest", "mixture_k2", "recall@100", [0.29], experiment="precision")
                         + _rows("multi_interest", "baseline_als", "recall@100", [0.5], experiment="baselines")
                         + _rows("multi_interest", "baseline_ease", "recall@100", [0.5], experiment="expert_count")
                         + _rows("ml-100k", "mixture_k2", "recall@100", [0.9, 0.9])
                         + _rows("ml-100k", "true_model_estimated", "recall@100", [0.1]))
    text = EC.ceiling_line(frame, "multi_interest")
    assert text.startswith("multi_interest: the true click model reaches recall@100 0.3000; with each user's "
                           "interests estimated from their training clicks") and "0.2400, 0.800 of it" in text
    assert text.endswith("The best project model of the tables (`expert_count` rows: ranking, 0.2100) reaches 0.875 of the "
                         "estimated and 0.700 of the true model; at the preset's settings (single_tower, 0.2300) 0.958 and 0.767."), text
    session = pd.concat([frame, pd.DataFrame(
        _rows("multi_interest", "ranking", "recall@100", [0.25, 0.27], experiment="tuned_session")
        + _rows("multi_interest", "true_model", "recall@100", [0.9], experiment="tuned_session")  # not a project model
        + _rows("ml-100k", "ranking", "recall@100", [0.9], experiment="tuned_session"))])
    assert EC.ceiling_line(session, "multi_interest").endswith(
        "at the preset's settings (single_tower, 0.2300) 0.958 and 0.767; tuned on last sessions (ranking, 0.2600) "
        "1.083 and 0.867.")
    clicks = pd.concat([session, pd.DataFrame(
        _rows("multi_interest", "single_tower", "recall@100", [0.18, 0.18], experiment="tuned_last_click"))])
    assert EC.ceiling_line(clicks, "multi_interest").endswith(
        "tuned on last sessions (ranking, 0.2600) 1.083 and 0.867; tuned on last clicks (single_tower, 0.1800) "
        "0.750 and 0.600.")
    alone = session[~((session["experiment"] == "expert_count") & (session["model"] == "ranking"))
                    & (session["model"] != "single_tower")]
    assert EC.ceiling_line(alone, "multi_interest").endswith(
        "0.800 of it. Tuned on last sessions (ranking, 0.2600) 1.083 and 0.867.")
    with pytest.raises(ValueError, match="several presets"):  # another preset's session rows are not mixed in
        EC.ceiling_line(pd.concat([frame, session[session["experiment"] == "tuned_session"].assign(preset="demo")],
                                  ignore_index=True), "multi_interest")
    assert EC.ceiling_line(frame[frame["model"] != "true_model_estimated"], "multi_interest") == ""
    # without the column every row is a main row (the precision row too): no KeyError
    assert "rows: mixture_k2, 0.2900) reaches" in EC.ceiling_line(frame.drop(columns="experiment"), "multi_interest")
    assert EC.ceiling_line(frame, "ml-100k") == ""  # no true_model row there
    assert "0.800 of it" in EC.findings(frame, {}, ["multi_interest"])
    with pytest.raises(ValueError, match="several presets"):
        EC.ceiling_line(pd.concat([frame, frame.assign(preset="demo")]), "multi_interest")


def test_kernel_cost_line_names_the_newest_k2_rates_beside_the_sweep(tmp_path):
    """The cost line's rates are one run's (the sweep's); a newer run of K = 2 in either math
    mode is named beside them, a math mode no newer run measured is left out."""
    csv = tmp_path / "scoring.csv"
    pd.DataFrame([dict(variant="gated_fused_topk_filter", device="H200", commit=c, timestamp=t, dtype="fp16", d=64,
                       experts=6, k_experts=2, access="pool", items_per_s=v, verified="ok", math=m)
                  for c, t, v, m in (("r1", "2026-01-01", 1e10, "fp32"), ("r9", "2026-02-01", 3.1e10, "fp16"))]
                 ).to_csv(csv, index=False)
    line = EC.kernel_cost_line(_expert_count_frame(), csv)
    assert line.endswith("K = 2 takes 2.00x the one vector's time there; the newest K = 2 runs, fp16 tables, score "
                         "31.0 G in fp16 math (run r9, H200): today's cost of the gate against the dot product is "
                         "notebook 02's"), line
    assert EC.kernel_cost_line(_expert_count_frame(), tmp_path / "none.csv") == EC.kernel_cost_line(_expert_count_frame())


def test_kernel_throughput_of_several_keys_comes_from_one_run(tmp_path):
    """With keys, every rate comes from the run that measured the most of them (the newest of a
    tie), not each key's newest run: a newer run of one shape does not mix into the sweep."""
    csv = tmp_path / "scoring.csv"
    rows = [("sweep", "2026-01-01", 1, 1, 18e9), ("sweep", "2026-01-01", 6, 2, 12e9), ("sweep", "2026-01-01", 6, 4, 9e9),
            ("newer", "2026-02-01", 6, 2, 20e9), ("newer", "2026-02-01", 6, 6, 7e9), ("tie", "2025-12-01", 1, 1, 1e9), ("tie", "2025-12-01", 6, 2, 1e9),
            ("tie", "2025-12-01", 6, 4, 1e9)]
    pd.DataFrame([dict(variant="gated_fused_topk", device="H200", commit=c, timestamp=t, dtype="fp16", d=64,
                       experts=E, k_experts=K, access="pool", items_per_s=v, verified="ok") for c, t, E, K, v in rows]
                 ).to_csv(csv, index=False)
    keys = [("fp16", 64, 1, 1), ("fp16", 64, 6, 2), ("fp16", 64, 6, 4), ("fp16", 64, 6, 6)]
    one = quality.kernel_throughput(csv, keys=keys).set_index(["experts", "k_experts"])
    assert set(one["commit"]) == {"sweep"} and one.loc[(6, 2), "items_per_s"] == 12e9 and (6, 6) not in one.index
    assert quality.kernel_throughput(csv).set_index(["experts", "k_experts"]).loc[(6, 2), "items_per_s"] == 20e9
    assert quality.kernel_throughput(csv, keys=[("int8", 64, 6, 2)]).empty
    made = quality.compute_rows("multi_interest", d=64, dtypes=("fp16",), scoring_csv=csv)
    rate = made[made["metric"] == "kernel_ads_per_s"].set_index("model")
    assert rate.loc["mixture_k2", "value"] == 12e9 and rate.loc["mixture_k2", "scorer"].endswith("run sweep")
    # a model the chosen run did not measure: NaN, another run's rate named beside it
    assert np.isnan(rate.loc["dense_mixture", "value"])
    assert rate.loc["dense_mixture", "scorer"] == "not measured in run sweep; run newer measured 7.00 G ads/s (H200)"
    line = EC.throughput_line(made.assign(dataset="multi_interest"), "multi_interest")
    assert line == ("multi_interest: kernel throughput from run sweep (H200); mixture_k1: not measured; "
                    "dense_mixture: not measured in run sweep; run newer measured 7.00 G ads/s (H200)")
    assert EC.throughput_line(made, "ml-100k") == "ml-100k: kernel throughput not measured (NaN)"
