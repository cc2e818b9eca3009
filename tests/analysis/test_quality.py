"""Quality drivers: tidy rows, results merging, compute per ad, precision rows, gamma folding."""

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torch")

from andromeda_nb.analysis import quality  # noqa: E402
from andromeda_nb.datasets import multi_interest as mi  # noqa: E402
from andromeda_nb.training import data as tdata  # noqa: E402
from andromeda_nb.training.train import score_exported, train_model  # noqa: E402

PRESET = quality.PRESETS["smoke"]


@pytest.fixture(scope="module")
def data():
    return tdata.from_multi_interest(mi.build_world(mi.WorldDesign(n_users=200, n_ads=300, topics=6), seed=2))


@pytest.fixture(scope="module")
def k2(data):
    return train_model("mixture_k2", data, PRESET.cfg("multi_interest", "mixture_k2"), seed=0, device="cpu",
                       progress=False)


def test_expert_count_rows(data, tmp_path):
    each = []
    frame, trained = quality.run_expert_count(data, PRESET, models=["single_tower", "mixture_k2", "ranking"],
                                              device="cpu", progress=False, tops_dir=tmp_path, on_model=each.append)
    assert list(frame.columns) == quality.COLUMNS
    # on_model: each model's own rows as it finishes, the same rows the frame holds
    assert [set(f["model"]) for f in each] == [{"single_tower"}, {"mixture_k2"}, {"ranking"}]
    own = frame[frame["model"].isin(["single_tower", "mixture_k2", "ranking"])
                & (frame["metric"] != "overlap@100_ranking")].reset_index(drop=True)
    pd.testing.assert_frame_equal(pd.concat(each, ignore_index=True), own, check_dtype=False)
    rec = frame[frame["metric"].str.startswith("recall@")]
    assert set(rec["metric"]) == {f"recall@{k}{s}" for k in (50, 100, 500) for s in ("", "_untargeted")}
    assert rec["value"].between(0, 1).all()
    assert set(rec["model"]) == {"single_tower", "mixture_k2", "ranking", "true_model", "true_model_estimated"}
    # the generator rows: the true model, and the same with the users' interests estimated from their clicks
    truth = rec[rec["model"] == "true_model_estimated"].set_index("metric")["value"]
    rows = quality.eval_rows(data, PRESET.eval_users["multi_interest"], 0)
    want = quality.recalls(data, rows, quality.true_model_top(data, rows, 500, estimated=True), (50, 100, 500))
    assert truth.to_dict() == want and truth.index.tolist() == ["recall@50", "recall@100", "recall@500"]
    assert want != quality.recalls(data, rows, quality.true_model_top(data, rows, 500), (50, 100, 500))
    w = data.world  # its top lists: the world's formula at the interests its training clicks show
    top = quality.true_model_top(data, rows[:5], 20, estimated=True)
    for r, got in zip(rows[:5], top):
        u = int(data.user_ids[r])
        s = w.true_scores(u, w.estimated_interests(u, min_clicks=2))
        mask = data.eligible(np.array([r]))[0]
        order = [a for a in np.lexsort((np.arange(s.size), -s)) if mask[a]][:20]
        assert got.tolist() == order
    untargeted = rec[rec["metric"].str.endswith("_untargeted")]
    assert set(untargeted["model"]) == {"single_tower", "mixture_k2", "ranking"}  # the ground truth: targeted only
    ov = frame[frame["metric"] == "overlap@100_ranking"]
    assert set(ov["model"]) == {"single_tower", "mixture_k2"} and ov["value"].between(0, 1).all()
    assert ("mixture_k2", 0) in trained
    routing = frame[frame["metric"].isin(["expert_share_max", "routing_entropy"])].set_index("metric")
    assert set(routing["model"]) == {"mixture_k2"}  # one expert (single tower) or none (ranking): no gate
    assert 1 / 6 <= routing.loc["expert_share_max", "value"] <= 1 / 2
    assert 0 <= routing.loc["routing_entropy", "value"] <= 1
    table = quality.recall_table(frame, "multi_interest")
    assert list(table.index) == ["single_tower", "mixture_k2", "ranking", "true_model", "true_model_estimated"]
    # the kept tops give the same overlap rows as the run itself (models trained apart use these)
    assert sorted(f.name for f in tmp_path.iterdir()) == [f"multi_interest_{m}_seed0.npz"
                                                         for m in ("mixture_k2", "ranking", "single_tower")]
    # a precision run's recall@100 row of the same model and seed is not the run the overlap belongs to
    other = frame[(frame["metric"] == "recall@100") & (frame["model"] == "mixture_k2")].assign(
        experiment="precision", scorer="another run")
    again = quality.overlap_rows_from_tops([tmp_path], pd.concat([frame.drop(ov.index), other]))
    cols = ["model", "seed", "metric", "scorer", "commit", "n_users"]
    pd.testing.assert_frame_equal(again.sort_values("model")[cols + ["value"]].reset_index(drop=True),
                                  ov.sort_values("model")[cols + ["value"]].reset_index(drop=True), check_dtype=False)
    # tops of different users are refused, not compared
    kept = np.load(tmp_path / "multi_interest_ranking_seed0.npz")
    quality.save_top(tmp_path, "multi_interest", "ranking", 0, kept["rows"][::-1].copy(), kept["top"])
    with pytest.raises(ValueError, match="different users"):
        quality.overlap_rows_from_tops(tmp_path, frame)


def test_a_cut_off_run_keeps_the_rows_of_each_model_it_finished(data, tmp_path, monkeypatch):
    """run_all writes a model's rows as soon as it is trained: a run stopped during a seed's second
    model (a device call's time limit) leaves the first model's rows in quality.csv."""
    from dataclasses import replace as dc_replace

    from andromeda_nb.training import train

    real = train.train_model

    def cut_at_k2(name, *args, **kwargs):
        if name == "mixture_k2":
            raise RuntimeError("cut off")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(train, "train_model", cut_at_k2)
    monkeypatch.setattr(quality, "load_data", lambda ds, p, data_dir=None: dc_replace(data, name=ds))
    with pytest.raises(RuntimeError, match="cut off"):
        quality.run_all("smoke", tmp_path, datasets=("multi_interest",), seeds=[0], device="cpu", progress=False,
                        models=["single_tower", "mixture_k2"], experiment="tuned_session")
    kept = quality.load_results(tmp_path / "quality.csv")
    trained = kept[kept["experiment"] == "tuned_session"]
    assert set(trained["model"]) == {"single_tower"}
    assert trained[trained["metric"] == "recall@100"]["value"].between(0, 1).all()
    assert len(trained[trained["metric"] == "recall@100"]) == 1


def test_precision_rows(k2, data):
    rows = data.eval_rows[:15]
    frame = quality.run_precision(k2, rows, preset="smoke")
    got = frame.set_index(["dtype", "metric"])["value"]
    assert got[("fp32", "recall@100_delta_pp")] == 0 and got[("fp32", "overlap@100_fp32")] == 1.0
    assert got[("fp32", "score_err_max")] == 0
    for dt in ("bf16", "fp16", "fp16_math", "int8", "int8_fp16_math", "int8_dimscale"):
        assert 0 <= got[(dt, "overlap@100_fp32")] <= 1 and got[(dt, "score_err_p50")] >= 0
    assert got[("int8", "bytes_per_ad")] == 16 + 8 and got[("fp16", "bytes_per_ad")] == 32 + 4
    assert got[("fp16_math", "bytes_per_ad")] == 32 + 4 and got[("int8_fp16_math", "bytes_per_ad")] == 16 + 8
    # fp16 math rounds h and the weights too: more error than the fp16 table alone, never less
    assert got[("fp16_math", "score_err_p50")] >= got[("fp16", "score_err_p50")]
    # the fp16 math rows against fp32 math on their own storage (what math="auto" decides), only those rows
    for dt, st in (("fp16_math", "fp16"), ("int8_fp16_math", "int8")):
        assert got[(dt, "recall@100_delta_pp_same_storage")] == pytest.approx(
            got[(dt, "recall@100_delta_pp")] - got[(st, "recall@100_delta_pp")], abs=1e-9)
        assert 0 <= got[(dt, "overlap@100_same_storage")] <= 1
    assert set(frame.loc[frame["metric"] == "overlap@100_same_storage", "dtype"]) == {"fp16_math", "int8_fp16_math"}
    # without its storage among the dtypes, the storage is scored all the same (and not written)
    alone = quality.run_precision(k2, rows, preset="smoke", dtypes=("fp32", "int8_fp16_math"),
                                  trained_as="untuned: preset settings with lr=0.01")
    assert set(alone["dtype"]) == {"fp32", "int8_fp16_math"}
    assert (frame["scorer"] == "torch_fp32_formula").all()  # a model trained at changed settings says so
    assert (alone["scorer"] == "torch_fp32_formula; model untuned: preset settings with lr=0.01").all()
    again = alone.set_index(["dtype", "metric"])["value"]
    for metric in ("recall@100_delta_pp_same_storage", "overlap@100_same_storage"):
        assert again[("int8_fp16_math", metric)] == pytest.approx(got[("int8_fp16_math", metric)])
    # each lossy row's score errors, recomputed from the float64 oracle on tables stored here
    want = _oracle_score_errors(k2, data, rows)
    for dt, err in want.items():
        assert err.max() > 0 and got[(dt, "score_err_max")] == pytest.approx(err.max(), rel=1e-2), dt
        assert got[(dt, "score_err_p50")] == pytest.approx(np.quantile(err, 0.5), rel=1e-2, abs=1e-6), dt


def _oracle_score_errors(k2, data, rows) -> dict:
    """``{dtype: |score - fp32 score| / (the user's fp32 score spread)}`` over every evaluated user's
    eligible ads, each score the float64 oracle's (reference.score) of the exported request on the
    dtype's table: the precision rows' errors without their code."""
    from andromeda_nb import Request, reference
    from andromeda_nb.model import AdTable

    a, b = k2.ad_arrays()
    s = np.abs(a).max(axis=0)  # int8_dimscale: each column's largest magnitude, folded into gamma
    V, G, gamma, beta = k2.request_tensors(rows)
    elig = data.eligible(rows)
    cases = {"fp16": ("fp16", a, 1.0, "fp32"), "bf16": ("bf16", a, 1.0, "fp32"), "int8": ("int8", a, 1.0, "fp32"),
             "int8_dimscale": ("int8", a / s, s, "fp32"), "fp16_math": ("fp16", a, 1.0, "fp16"),
             "int8_fp16_math": ("int8", a, 1.0, "fp16")}
    base_table = AdTable.from_float(a, b)
    out = {dt: [] for dt in cases}
    for i in range(len(rows)):
        def score(table, scale=1.0, math="fp32"):
            req = Request(V=V[i], G=G[i], gamma=(gamma[i] * scale).astype(np.float32), beta=beta[i],
                          k_experts=k2.k_experts)
            return reference.score(req, table, math=math)
        base = score(base_table)
        sd = base[elig[i]].std() if elig[i].any() else 1.0
        for dt, (storage, rows_a, scale, math) in cases.items():
            err = np.abs(score(AdTable.from_float(rows_a, b, dtype=storage), scale, math) - base) / (sd if sd > 0 else 1.0)
            out[dt].append(err[elig[i]])
    return {dt: np.concatenate(e) for dt, e in out.items()}


@pytest.mark.parametrize("dtype", ["fp16", "int8"])
def test_fp16_math_scores_are_the_fp16_model(rng, dtype):
    """score_exported(math="fp16") (the precision experiment's fp16_math and int8_fp16_math) equals
    the float64 oracle of the fp16 math mode's model to fp32 accuracy, expert swaps at near-ties aside."""
    from andromeda_nb import Request, checks
    from andromeda_nb.model import AdTable

    d, E, K, n = 16, 6, 2, 300
    table = AdTable.from_float(rng.standard_normal((n, d)), rng.standard_normal(n), dtype=dtype)
    reqs = [Request.random(d, E, K, rng) for _ in range(3)]
    V, G, gamma, beta = (np.stack([getattr(r, f) for r in reqs]) for f in ("V", "G", "gamma", "beta"))
    got = score_exported(V, G, gamma, beta, table, K, math="fp16")
    for r, row in zip(reqs, got):
        assert checks.compare_scores(row, r, table, math="fp16"), checks.compare_scores(row, r, table, math="fp16")
    with pytest.raises(ValueError, match="math"):
        score_exported(V, G, gamma, beta, table, K, math="bf16")


def test_dimscale_folds_exactly_into_gamma(k2, data):
    from andromeda_nb.model import AdTable

    a, b = k2.ad_arrays()
    s = quality.dimscale(a)
    assert np.abs(a / s).max(axis=0) == pytest.approx(1.0)  # every stored column spans [-1, 1]
    zero = quality.dimscale(np.zeros((3, 2), np.float32))
    assert (zero == 1).all()  # a zero column keeps scale 1 (no division by zero)
    rows = data.eval_rows[:4]
    V, G, gamma, beta = k2.request_tensors(rows)
    plain = score_exported(V, G, gamma, beta, AdTable.from_float(a, b), 2)
    folded = score_exported(V, G, gamma * s, beta, AdTable.from_float(a / s, b), 2)
    np.testing.assert_allclose(folded, plain, rtol=1e-5, atol=1e-5)


def test_compute_rows_read_scoring_csv(tmp_path):
    csv = tmp_path / "scoring.csv"
    pd.DataFrame([
        dict(variant="gated_fused_topk", device="NVIDIA H200", dtype="fp16", d=64, experts=6, k_experts=2,
             access="pool", items_per_s=3e9, verified="ok: fine"),
        dict(variant="gated_fused_topk", device="NVIDIA H200", dtype="fp16", d=64, experts=6, k_experts=2,
             access="pool", items_per_s=5e9, verified="ok: fine"),
        dict(variant="gated_fused_topk", device="NVIDIA H200", dtype="fp16", d=64, experts=6, k_experts=1,
             access="pool", items_per_s=9e9, verified="FAIL: wrong"),
    ]).to_csv(csv, index=False)
    rows = quality.compute_rows("multi_interest", d=64, dtypes=("fp16",), scoring_csv=csv)
    thr = rows[rows["metric"] == "kernel_ads_per_s"].set_index("model")
    assert thr.loc["mixture_k2", "value"] == 5e9 and thr.loc["mixture_k2", "device"] == "NVIDIA H200"
    assert np.isnan(thr.loc["mixture_k1", "value"])  # failed verification does not count
    fl = rows[rows["metric"] == "flops_per_ad"].set_index("model")["value"]
    assert fl["mixture_k2"] == 2 * 64 + 2 * 6 * 64 + 2 * 2 * 64 + 4 * 6 + 2 * 2
    assert fl["ranking"] > 10 * fl["dense_mixture"]
    missing = quality.compute_rows("multi_interest", scoring_csv=tmp_path / "none.csv")
    assert missing[missing["metric"] == "kernel_ads_per_s"]["value"].isna().all()


def test_write_rows_replaces_by_key(tmp_path):
    path = tmp_path / "quality.csv"
    base = dict(dataset="ml-100k", model="mixture_k2", experts=6, k_experts=2, dtype="fp32", d=64, seed=0,
                commit="abc", device="cpu", preset="smoke", scorer="x", n_users=3)
    quality.write_rows(pd.DataFrame([{**base, "metric": "recall@10", "value": 0.1},
                                     {**base, "metric": "recall@50", "value": 0.2}]), path)
    quality.write_rows(pd.DataFrame([{**base, "metric": "recall@10", "value": 0.3},
                                     {**base, "metric": "recall@10_untargeted", "value": 0.4, "targeting": "on"},
                                     {**base, "metric": "train_seconds", "value": 5.0}]), path)
    df = quality.load_results(path)
    assert len(df) == 4
    assert df.set_index("metric").loc["recall@10", "value"] == 0.3
    assert list(df.columns) == quality.COLUMNS
    # the targeting column follows the metric, whatever a caller put there
    assert df.set_index("metric")["targeting"].fillna("").to_dict() == {
        "recall@10": "on", "recall@50": "on", "recall@10_untargeted": "off", "train_seconds": ""}


def test_join_rows_merges_seed_files_and_keeps_one_row_a_key(tmp_path):
    """Each seed's file from a parallel run: every seed's rows land, a row both files hold (the
    true model's) once, with the last file's value; no file is refused."""
    from andromeda_nb.analysis.quality_results import join_rows

    base = dict(dataset="multi_interest", experts=6, k_experts=2, dtype="fp32", d=64, commit="abc", device="gpu",
                experiment="expert_count", preset="full", scorer="x", n_users=3, metric="recall@100")
    paths = []
    for s, truth in ((0, 0.30), (1, 0.31)):
        paths.append(tmp_path / f"s{s}.csv")
        pd.DataFrame([{**base, "model": "mixture_k2", "seed": s, "value": (0.2, 0.21)[s]},
                      {**base, "model": "true_model", "seed": "", "value": truth}]).to_csv(paths[-1], index=False)
    df = quality.load_results(join_rows(paths, tmp_path / "out" / "quality.csv"))
    assert sorted(zip(df["model"], df["value"])) == [("mixture_k2", 0.2), ("mixture_k2", 0.21), ("true_model", 0.31)]
    with pytest.raises(ValueError, match="no quality CSVs"):
        join_rows([], tmp_path / "x.csv")


def test_a_named_run_sets_every_row_it_trained_apart(tmp_path):
    """relabel: a named run's expert_count and precision rows each get the run's name, so merging
    them (write_rows, keyed on the experiment) replaces none of the main table's rows; the
    generator's, the baselines' and the compute rows stay; the default name changes nothing."""
    from andromeda_nb.analysis.quality_results import relabel, write_rows

    kinds = [("mixture_k2", "expert_count"), ("mixture_k2", "precision"), ("single_tower", "compute"),
             ("true_model", "expert_count"), ("als", "baselines")]
    rows = pd.DataFrame([dict(dataset="multi_interest", model=m, experts=6, k_experts=2, dtype="fp32", d=64, seed=0,
                              metric="recall@100", value=0.1, commit="a", device="cpu", experiment=e, preset="full",
                              scorer="s", n_users=3) for m, e in kinds])
    named = relabel(rows, "tuned_session")
    assert named["experiment"].tolist() == ["tuned_session", "tuned_session_precision", "compute",
                                            "expert_count", "baselines"]
    assert rows["experiment"].tolist() == [e for _, e in kinds]  # the caller's frame untouched
    assert relabel(rows, "expert_count")["experiment"].tolist() == [e for _, e in kinds]
    path = write_rows(rows, tmp_path / "q.csv")
    write_rows(named.assign(value=0.2), path)
    merged = quality.load_results(path)
    # the main table's two trained rows kept; the compute, generator and baseline rows replaced
    assert len(merged) == 7 and (merged["value"] == 0.1).sum() == 2
    with pytest.raises(ValueError, match="experiment name"):
        relabel(rows, "precision")


def test_results_without_experiment_column_are_inferred(tmp_path):
    path = tmp_path / "old.csv"
    base = dict(dataset="ml-100k", model="mixture_k2", experts=6, k_experts=2, d=64, preset="demo")
    pd.DataFrame([
        {**base, "dtype": "fp32", "seed": 0, "metric": "recall@100", "value": 0.4},   # expert count
        {**base, "dtype": "fp32", "seed": 0, "metric": "recall@100", "value": 0.41},  # precision (second)
        {**base, "dtype": "int8", "seed": 0, "metric": "recall@100", "value": 0.39},
        {**base, "dtype": "int8", "seed": 0, "metric": "overlap@100_fp32", "value": 0.99},
        {**base, "dtype": "fp16", "seed": None, "metric": "bytes_per_ad", "value": 132},
        {**base, "dtype": "fp16", "seed": None, "metric": "kernel_ads_per_s", "value": None},
    ]).to_csv(path, index=False)
    df = quality.load_results(path)
    assert df["experiment"].tolist() == ["expert_count", "precision", "precision", "precision", "compute", "compute"]
    assert quality.recall_table(df, "ml-100k").loc["mixture_k2", "mean"] == 0.4


def test_worked_example_helpers(k2, data):
    from andromeda_nb.analysis import expert_count_report as report

    user = report.two_interest_user(data, min_weight=0.0)
    w = data.world
    assert (w.interest_topics[user] >= 0).sum() == 2
    ex = report.gate_example(k2, user, n_top=10)
    pcols = [c for c in ex.columns if c.startswith("p_")]
    assert len(ex) == 10 and len(pcols) == 6
    np.testing.assert_allclose(ex[pcols].sum(axis=1), 1.0, rtol=1e-6)
    assert all(len(c.split(", ")) == 2 for c in ex["chosen"])
    by = report.gate_by_interest(k2, user)
    assert len(by) == 2 and (by[[c for c in by.columns if c.startswith("chosen_")]].sum(axis=1).round(6) == 2).all()


def test_committed_picks_the_full_preset_else_the_first(tmp_path):
    path = tmp_path / "quality.csv"
    base = dict(dataset="ml-100k", model="mixture_k2", experts=6, k_experts=2, dtype="fp32", d=64, seed=0,
                metric="recall@10", commit="abc", device="cpu", scorer="x", n_users=3, experiment="expert_count")
    quality.write_rows(pd.DataFrame([{**base, "preset": "smoke", "value": 0.1}, {**base, "preset": "demo", "value": 0.2}]),
                       path)
    frame, source, pick = quality.committed(path)
    assert pick == "demo" and frame["value"].tolist() == [0.2] and source == f"{path}, preset 'demo'"
    quality.write_rows(pd.DataFrame([{**base, "preset": "full", "value": 0.3}]), path)
    assert quality.committed(path)[2] == "full"
    frame, source, pick = quality.committed(tmp_path / "none.csv")
    assert frame.empty and pick is None and "missing" in source


def _fake_mixture(G, a, K):
    """A stand-in for a trained mixture: its request (gamma 1, beta 0) and ad rows, nothing else."""
    import types

    E, d = G.shape
    return types.SimpleNamespace(
        is_retrieval=True, experts=E, k_experts=K, ad_arrays=lambda: (a.astype(np.float32), np.zeros(len(a))),
        request_tensors=lambda rows: (np.zeros((1, E, d), np.float32), G[None].astype(np.float32),
                                      np.ones((1, d), np.float32), np.zeros((1, d), np.float32)))


def test_routing_stats_show_a_collapsed_and_a_balanced_gate(rng):
    d, n = 8, 40
    a = np.abs(rng.standard_normal((n, d))) + 0.1  # positive rows: h = a
    top = np.array([np.r_[rng.permutation(n)[:12], -1, -1]])  # pads are skipped
    # equal logits: the lower experts are chosen (the kernels' tie rule), the softmax is uniform
    got = quality.routing_stats(_fake_mixture(np.zeros((4, d)), a, 2), [0], top)
    assert got["expert_share_max"] == 0.5 and got["routing_entropy"] == pytest.approx(1.0)
    # two experts keyed to disjoint halves of the dimensions, ads alternating between the halves
    G = np.zeros((2, d))
    G[0, : d // 2] = G[1, d // 2:] = 3.0
    alt = a.copy()
    alt[0::2, d // 2:] = 0
    alt[1::2, : d // 2] = 0
    top = np.arange(n)[None]
    got = quality.routing_stats(_fake_mixture(G, alt, 1), [0], top)
    assert got["expert_share_max"] == 0.5
    logits = alt @ G.T / np.sqrt(d)
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    assert got["routing_entropy"] == pytest.approx(float(-(p * np.log(p)).sum(1).mean() / np.log(2)))
    # every ad on the first half: the first expert takes every choice
    one = a.copy()
    one[:, d // 2:] = 0
    assert quality.routing_stats(_fake_mixture(G, one, 1), [0], top)["expert_share_max"] == 1.0
    assert quality.routing_stats(_fake_mixture(np.zeros((1, d)), a, 1), [0], top) == {}
    dense = quality.routing_stats(_fake_mixture(G, alt, 2), [0], top)  # K = E: no share to report
    assert set(dense) == {"routing_entropy"}


def test_routing_stats_refuse_bad_tops_and_non_finite_models(rng):
    d, n = 8, 40
    a = np.abs(rng.standard_normal((n, d))) + 0.1
    tm = _fake_mixture(rng.standard_normal((4, d)), a, 2)
    for top, match in ((np.array([3, 7]), "integer array"), (np.zeros((2, 5), np.int64), "len\\(rows\\)"),
                       (np.zeros((1, 5)), "integer array"), (np.array([[1, -2]]), "pads"), (np.array([[n]]), "slots")):
        with pytest.raises(ValueError, match=match):
            quality.routing_stats(tm, [0], top)
    bad = a.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        quality.routing_stats(_fake_mixture(rng.standard_normal((4, d)), bad, 2), [0], np.array([[1, 3]]))


def test_paired_difference_and_intervals():
    """Paired over the seeds both models ran: a = b + (1, 2, 1, 2) points on seeds 0-3 (b's seed 4
    has no partner): mean 1.5 points, 95 % half-width t(0.975, 3) sd / sqrt(4)."""
    rows = []
    for seed, (a, b) in enumerate([(0.41, 0.40), (0.43, 0.41), (0.41, 0.40), (0.44, 0.42), (None, 0.5)]):
        for model, v in (("mixture_k2", a), ("single_tower", b)):
            if v is not None:
                rows.append(dict(dataset="ml-100k", model=model, metric="recall@100", value=v, seed=seed,
                                 experiment="expert_count"))
    frame = pd.DataFrame(rows)
    p = quality.paired_difference(frame, "ml-100k", "mixture_k2", "single_tower")
    assert p["seeds"] == 4 and p["mean"] == pytest.approx(0.015)
    assert p["ci95"] == pytest.approx(3.182446 * np.std([0.01, 0.02, 0.01, 0.02], ddof=1) / 2, rel=1e-5)
    t = quality.recall_table(frame, "ml-100k")
    assert t.loc["single_tower", "seeds"] == 5 and np.isfinite(t.loc["single_tower", "ci95"])
    assert np.isnan(quality.ci95(0.1, 1))
    from andromeda_nb.analysis import expert_count_report as EC

    assert EC._paired(frame, "ml-100k", "mixture_k2", "single_tower") == " (paired over 4 seeds: 95 % interval ±0.92 pp)"
    assert EC._paired(frame.assign(value=0.4), "ml-100k", "mixture_k2", "single_tower").endswith("within noise)")


def test_models_trained_in_separate_processes_get_their_overlap_rows(tmp_path):
    """``python -m andromeda_nb.training --save-tops``: the ranking model and a retrieval model
    trained by two runs (two folders, as two processes sharing a GPU do) give, from their kept
    tops, the overlap rows one run of both writes itself."""
    from andromeda_nb.training.__main__ import main

    common = ["--preset", "smoke", "--datasets", "multi_interest", "--device", "cpu", "--no-progress", "--save-tops"]
    for folder, models in (("both", ["single_tower", "ranking"]), ("a", ["single_tower"]), ("b", ["ranking"])):
        assert main([*common, "--out", str(tmp_path / folder), "--models", *models]) == 0
    both = quality.load_results(tmp_path / "both" / "quality.csv")
    own = both[both["metric"] == "overlap@100_ranking"]
    assert len(own) == 1 and 0 <= own["value"].iloc[0] <= 1
    apart = pd.concat([quality.load_results(tmp_path / f / "quality.csv") for f in ("a", "b")], ignore_index=True)
    assert not (apart["metric"] == "overlap@100_ranking").any()  # neither run held both models
    rows = quality.overlap_rows_from_tops([tmp_path / "a" / "tops", tmp_path / "b" / "tops"], apart)
    assert list(rows["model"]) == ["single_tower"] and rows["value"].iloc[0] == pytest.approx(own["value"].iloc[0])


def test_write_rows_keeps_a_reproduced_rows_commit(tmp_path):
    """A rerun that reproduces a row (every column but the commit) leaves the table as it was; a
    changed value, device or scorer replaces the row, commit and all."""
    path = tmp_path / "quality.csv"
    base = dict(dataset="ml-100k", model="single_tower", experts=1, k_experts=1, dtype="fp32", d=64, seed="",
                metric="bytes_per_ad", value=260.0, commit="old", device="", experiment="expert_count",
                preset="full", scorer="analytic", n_users="")
    quality.write_rows(pd.DataFrame([base, {**base, "metric": "flops_per_ad", "value": 520.0}]), path)
    before = path.read_bytes()
    quality.write_rows(pd.DataFrame([{**base, "commit": "new"}, {**base, "metric": "flops_per_ad", "value": 520.0,
                                                                  "commit": "new"}]), path)
    assert path.read_bytes() == before
    quality.write_rows(pd.DataFrame([{**base, "commit": "new", "value": 261.0},
                                     {**base, "metric": "flops_per_ad", "value": 520.0, "commit": "new",
                                      "device": "NVIDIA H200"}]), path)
    df = quality.load_results(path).set_index("metric")
    assert df.loc["bytes_per_ad", "value"] == 261.0 and df.loc["bytes_per_ad", "commit"] == "new"
    assert df.loc["flops_per_ad", "commit"] == "new" and df.loc["flops_per_ad", "device"] == "NVIDIA H200"
    assert len(df) == 2
