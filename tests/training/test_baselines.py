"""The standard baselines: their input matrix and validation split, each model's scores against a
direct computation, tuning that never reads the held-out clicks, and the quality rows they write."""

import numpy as np
import pytest

pytest.importorskip("implicit")

from andromeda_nb import reference  # noqa: E402
from andromeda_nb.analysis import quality as Q  # noqa: E402
from andromeda_nb.datasets import multi_interest as mi  # noqa: E402
from andromeda_nb.training import baselines as B  # noqa: E402
from andromeda_nb.training import data as tdata  # noqa: E402


@pytest.fixture(scope="module")
def data():
    return tdata.from_multi_interest(mi.build_world(mi.WorldDesign(n_users=300, n_ads=200, topics=6), seed=2))


def with_short_histories(data, rows, n: int = 1):
    """``data`` with the users of ``rows`` cut to their first ``n`` training clicks (the world's users
    all have many: the one-click edge needs a cut)."""
    from dataclasses import replace

    seq, seq_len = data.seq.copy(), data.seq_len.copy()
    seq[rows, n:] = data.n_ads  # the pad
    seq_len[rows] = n
    return replace(data, seq=seq, seq_len=seq_len)


def test_user_items_and_the_validation_split(data):
    """The baselines fit the validation split's clicks (tuning.validation_view, here holding back
    sessions): every click before the held-back session stays; a user with one training click
    keeps it."""
    from andromeda_nb.training.tuning import validation_view

    data = with_short_histories(data, np.arange(0, data.n_users, 5))  # a fifth with one training click
    assert (data.seq_len < 2).any() and (data.seq_len >= 2).any()
    X = B.user_items(data)
    assert X.shape == (data.n_users, data.n_ads) and set(np.unique(X.data)) == {1.0}
    for r in range(0, data.n_users, 37):
        assert set(X[r].indices) == set(data.seq[r, :data.seq_len[r]].tolist())
    rows = np.arange(0, data.n_users, 11)
    np.testing.assert_array_equal(data.unseen(rows), X[rows].toarray() == 0)  # the untargeted candidates
    start = data.held_back_start("session")
    V = B.user_items(validation_view(data, "session"))
    for r in range(data.n_users):
        n = data.seq_len[r]
        if start[r] >= 0:
            assert set(V[r].indices) == set(data.seq[r, :start[r]].tolist())
        else:
            assert (n < 2 or data.seq_start[r, n - 1] == 0) and V[r].nnz == X[r].nnz


def test_scores_equal_a_direct_computation(data, rng):
    X = B.user_items(data)
    rows = np.sort(rng.choice(data.n_users, 20, replace=False))
    pop = B.fit("most_popular", X, {}).scores(rows)
    np.testing.assert_array_equal(pop[3], np.bincount(X.indices, minlength=data.n_ads))
    Xd = X.toarray().astype(np.float64)
    ease = B.fit("ease", X, {"l2": 30.0})
    P = np.linalg.inv(Xd.T @ Xd + 30.0 * np.eye(data.n_ads))
    Bm = np.eye(data.n_ads) - P / np.diag(P)[None, :]  # Steck 2019: B = I - P diag(1 / diag P)
    np.testing.assert_allclose(ease.scores(rows), Xd[rows] @ Bm, rtol=1e-3, atol=1e-4)
    knn = B.fit("itemknn_cosine", X, {"K": 10})
    np.testing.assert_allclose(knn.scores(rows), (X[rows] @ knn.item_item).toarray(), rtol=1e-6)
    assert (np.diff(knn.item_item.indptr) <= 10).all()  # K neighbours an item at most
    als = B.fit("als", X, {"factors": 8, "regularization": 0.1, "alpha": 5.0, "iterations": 3}, seed=3)
    np.testing.assert_allclose(als.scores(rows), als.user_vectors[rows] @ als.item_vectors.T, rtol=1e-5)
    again = B.fit("als", X, {"factors": 8, "regularization": 0.1, "alpha": 5.0, "iterations": 3}, seed=3)
    np.testing.assert_array_equal(als.scores(rows), again.scores(rows))  # seeded


def test_top_k_is_taken_over_the_candidates_only(data):
    X = B.user_items(data)
    pop = B.fit("most_popular", X, {})
    rows = np.arange(10)
    mask = data.eligible(rows)
    top = B.topk(pop, rows, data.eligible, 15)
    counts = np.bincount(X.indices, minlength=data.n_ads)
    for i, r in enumerate(rows):
        allowed = np.flatnonzero(mask[i])
        want = allowed[np.lexsort((allowed, -counts[allowed]))][:15]  # most clicked first, ties to the lower slot
        got = top[i][top[i] >= 0]
        np.testing.assert_array_equal(got, want)


class _Sealed(dict):
    def __getitem__(self, key):
        raise AssertionError("tuning read a held-out click")

    def get(self, *a):
        raise AssertionError("tuning read a held-out click")


def test_tuning_never_reads_the_held_out_clicks(data, monkeypatch):
    rows = data.eval_rows[:60]
    monkeypatch.setattr(data, "heldout", _Sealed(data.heldout))
    best, trials = B.tune("itemknn_cosine", data, rows, grid=({"K": 5}, {"K": 50}))
    assert best in ({"K": 5}, {"K": 50}) and len(trials) == 2
    assert best == max(trials, key=lambda t: t[1])[0] and all(0 <= v <= 1 for _, v in trials)


def test_tuning_fits_the_split_and_scores_its_held_back_sessions(data, monkeypatch):
    """tune fits the validation split's clicks (user_items of tuning.validation_view), ranks among
    the eligible ads the user did not keep, and with split="session" scores each user's held-back
    session (every click of it, not the last one alone); users whose training part is one session
    are not scored; with split="click" it scores each user's last training click, and by default
    (these data have sessions) the session's."""
    from andromeda_nb.training.tuning import validation_view

    short_rows = data.eval_rows[:5]
    data = with_short_histories(data, short_rows, n=3)  # three clicks of one session: nothing to hold back
    assert (data.seq_start[short_rows, 2] == 0).all() and (data.held_back_start("session")[short_rows] == -1).all()
    view = validation_view(data, "session")
    fitted, tops, scored = [], [], []
    real_fit, real_topk, real_recall = B.fit, B.topk, B._mean_recall
    monkeypatch.setattr(B, "fit", lambda name, X, params, seed=0: (fitted.append(X.copy()), real_fit(name, X, params, seed))[1])
    monkeypatch.setattr(B, "topk", lambda f, rows, mask_fn, k: (tops.append((rows, mask_fn(rows[:4]))), real_topk(f, rows, mask_fn, k))[1])
    monkeypatch.setattr(B, "_mean_recall", lambda top, rel, k: (scored.append(rel), real_recall(top, rel, k))[1])
    rows = data.eval_rows[:40]
    B.tune("most_popular", data, rows, grid=({},), split="session")
    want = B.user_items(view)
    assert len(fitted) == 1 and (fitted[0] != want).nnz == 0
    (got_rows, mask), = tops
    kept = [r for r in rows if r not in set(short_rows.tolist())]
    assert got_rows.tolist() == kept and len(kept) == len(rows) - 5
    np.testing.assert_array_equal(mask, data.eligible(got_rows[:4], exclude_seen=False) & (want[got_rows[:4]].toarray() == 0))
    assert [r.tolist() for r in scored[0]] == [view.heldout[r].tolist() for r in kept]
    assert max(len(r) for r in scored[0]) > 1  # sessions, not last clicks
    scored.clear()
    B.tune("most_popular", data, rows, grid=({},), split="click")  # each user's last training click
    assert [r.tolist() for r in scored[0]] == [[data.seq[r, data.seq_len[r] - 1]] for r in rows]
    scored.clear()
    B.tune("most_popular", data, rows, grid=({},))  # the default here (data with sessions): the session's
    assert [r.tolist() for r in scored[0]] == [view.heldout[r].tolist() for r in kept]


def test_run_baselines_writes_every_baseline_beside_the_models(data, monkeypatch, tmp_path):
    small = {"most_popular": ({},), "itemknn_cosine": ({"K": 20},), "itemknn_bm25": ({"K": 20, "K1": 1.2, "B": 0.75},),
             "als": ({"factors": 8, "regularization": 0.1, "alpha": 5.0, "iterations": 3},),
             "bpr": ({"factors": 8, "learning_rate": 0.05, "regularization": 0.01, "iterations": 5},),
             "ease": ({"l2": 50.0}, {"l2": 500.0})}
    monkeypatch.setattr(B, "GRIDS", small)
    frame = Q.run_baselines(data, "smoke", seeds=[0, 1], progress=False)
    assert set(frame["model"]) == {f"baseline_{n}" for n in B.BASELINES}
    assert (frame["experiment"] == "baselines").all()
    rec = frame[frame["metric"].str.startswith("recall@")]
    assert rec["value"].between(0, 1).all() and rec["value"].max() > 0
    assert set(frame[frame["model"] == "baseline_als"]["seed"]) == {0, 1}  # seeded: a row set per seed
    assert set(frame[frame["model"] == "baseline_ease"]["seed"]) == {0}
    assert {f"recall@{k}{s}" for k in Q.KS[data.name] for s in ("", "_untargeted")} | {"validation_recall@100"} == set(
        frame["metric"])
    ease = frame[frame["model"] == "baseline_ease"]["scorer"].iloc[0]
    # two points: either is an edge; the synthetic world tunes on each user's last session by default
    assert ease.startswith("numpy ease l2=") and ease.endswith("(grid edge: l2); validated on last sessions")
    monkeypatch.setattr(B, "GRIDS", {**small, "ease": ({"l2": 50.0},)})
    clicks = Q.run_baselines(data, "smoke", names=["ease"], progress=False, split="click")
    assert clicks["scorer"].iloc[0] == "numpy ease l2=50.0"  # the last click: the scorer as before
    assert B.grid_edges({"K": 50, "B": 1.0}, [{"K": k, "B": 1.0} for k in (20, 50, 100)]) == []  # B is not varied
    assert B.grid_edges({"K": 100}, [{"K": k} for k in (20, 50, 100)]) == ["K"]
    path = Q.write_rows(frame, tmp_path / "quality.csv")
    assert len(Q.load_results(path)) == len(frame)


def test_reports_show_baselines_beside_the_models():
    """recall tables list the baselines after the project's models; the verdict names the best tuned
    baseline against the best project retrieval model; the orders agree with the module's names."""
    import pandas as pd

    from andromeda_nb.analysis import expert_count_report as R

    assert Q.BASELINE_ORDER == tuple(f"baseline_{n}" for n in B.BASELINES)
    rows = []
    for model, exp, vals in (("single_tower", "expert_count", (0.40, 0.42)), ("mixture_k2", "expert_count", (0.43, 0.45)),
                             ("ranking", "expert_count", (0.46, 0.46)), ("baseline_als", "baselines", (0.45, 0.47)),
                             ("baseline_most_popular", "baselines", (0.29,))):
        for seed, v in enumerate(vals):
            for k in Q.KS["ml-100k"]:
                rows.append(dict(dataset="ml-100k", model=model, experiment=exp, metric=f"recall@{k}", seed=seed,
                                 value=v, dtype="fp32"))
    frame = pd.DataFrame(rows)
    table = Q.recall_table(frame, "ml-100k")
    assert list(table.index) == ["single_tower", "mixture_k2", "ranking", "baseline_most_popular", "baseline_als"]
    assert list(Q.recall_table(frame, "ml-100k", baselines=False).index) == ["single_tower", "mixture_k2", "ranking"]
    text = "\n".join(R.verdict(R.recall_tables(frame, ["ml-100k"]), "ml-100k"))
    assert "best tuned baseline als recall@100 0.4600" in text and "(mixture_k2) 0.4400" in text
    assert "the baseline leads by 2.00 pp" in text
    assert "against the best retrieval model (mixture_k2)" in text  # baselines are not the project's models
    # with the frame, the lead is the paired one on the seeds both ran (mixture_k2 has a third seed the
    # baseline lacks: the means over unequal seeds would have the model lead by 0.4700 - 0.4600 = 1.00 pp,
    # where the seeds both ran have the baseline lead by 2.00)
    more = pd.concat([frame, pd.DataFrame([dict(r, seed=2, value=0.53) for r in rows if r["model"] == "mixture_k2"
                                           and r["seed"] == 0])], ignore_index=True)
    paired = "\n".join(R.verdict(R.recall_tables(more, ["ml-100k"]), "ml-100k", more))
    assert "(mixture_k2) 0.4700" in paired and "the project's model leads" not in paired
    assert "the baseline leads by 2.00 pp on the seeds both ran (paired over 2 seeds" in paired, paired


def test_evaluation_top_k_edges():
    """The evaluation's top-k is the oracle's: ties to the lower slot, +-inf ranked (float64, past
    float32's range too), NaN never returned, pads past the eligible ads, k above the item count."""
    scores = np.array([[1.0, 3.0, 3.0, np.nan, 2.0, -np.inf], [np.nan] * 6, [0.0] * 6], np.float32)
    mask = np.ones_like(scores, bool)
    mask[2, :4] = False
    got = Q._topk_rows(scores, mask, 8)
    np.testing.assert_array_equal(got, [[1, 2, 4, 0, 5, -1, -1, -1], [-1] * 8, [4, 5, -1, -1, -1, -1, -1, -1]])
    assert Q._topk_rows(scores[:, :0], mask[:, :0], 3).tolist() == [[-1] * 3] * 3
    big = np.array([[1e300, 1e301, 5.0, np.inf, -np.inf]])  # past float32: still ordered
    np.testing.assert_array_equal(Q._topk_rows(big, np.ones_like(big, bool), 3), [[3, 1, 0]])
    rng = np.random.default_rng(5)  # against the oracle on random ties
    s = rng.integers(0, 4, (6, 40)).astype(np.float64)
    m = rng.random((6, 40)) < 0.7
    for i, row in enumerate(Q._topk_rows(s, m, 9)):
        np.testing.assert_array_equal(row, reference.topk(s[i], 9, eligible=m[i]).ids)


def test_bad_baseline_input_is_refused_before_any_fit(data):
    X = B.user_items(data)
    for name, params, match in (("itemknn_cosine", {"K": 0}, "K must be an int >= 1"),
                                ("itemknn_bm25", {"K": 5, "K1": 1.2, "B": 2.0}, "B must be in"),
                                ("als", {"factors": 8}, "takes the parameters"),
                                ("ease", {"l2": 0.0}, "l2 must be a number > 0"),
                                ("bpr", {"factors": 8, "learning_rate": float("nan"), "regularization": 0.0,
                                         "iterations": 5}, "learning_rate"),
                                ("nosuch", {}, "unknown baseline")):
        with pytest.raises(ValueError, match=match):
            B.fit(name, X, params)
    with pytest.raises(ValueError, match="K must be"):  # the whole grid is checked before the first fit
        B.tune("itemknn_cosine", data, data.eval_rows[:20], grid=({"K": 5}, {"K": 0}))
    with pytest.raises(ValueError, match="empty grid"):
        B.tune("ease", data, data.eval_rows[:20], grid=())
    one_click = data.eval_rows[:6]
    short = with_short_histories(data, one_click)
    with pytest.raises(ValueError, match="to hold back for validation"):  # nothing to hold back for validation
        B.tune("most_popular", short, one_click)
    from andromeda_nb.training import tuning

    with pytest.raises(ValueError, match="to hold back for validation"):  # the project's models' tuning, the same way
        tuning.tune_many({"single_tower": Q.PRESETS["smoke"].cfg("multi_interest", "single_tower")},
                         with_short_histories(data, data.eval_rows), grid=tuning.GRID[:1], device="cpu")
    for kwargs, match in ((dict(names=["most_popular", "nosuch"]), "unknown baselines"), (dict(seeds=[]), "seed"),
                          (dict(names=[]), "unknown baselines")):
        with pytest.raises(ValueError, match=match):
            Q.run_baselines(data, "smoke", progress=False, **kwargs)
    with pytest.raises(ValueError, match="unknown preset"):
        Q.run_baselines(data, "nosuch", progress=False)


def test_every_grid_point_is_valid():
    assert set(B.GRIDS) == set(B.BASELINES) == set(B.PARAMS)
    for name, grid in B.GRIDS.items():
        for params in grid:
            B.check_params(name, params)
