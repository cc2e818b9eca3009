"""Training: the torch score is the model of docs/design.md, features never leak, training is seeded, the gate
learns at K = 1, and the exported weights scored by the fused kernel (simulator) give the torch
model's own top-K."""

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from andromeda_nb import AdTable, Request, reference  # noqa: E402
from andromeda_nb.datasets import multi_interest as mi  # noqa: E402
from andromeda_nb.training import data as tdata  # noqa: E402
from andromeda_nb.training.models import gated_scores, routing_term  # noqa: E402
from andromeda_nb.training.train import MODELS, TrainConfig, score_exported, train_model  # noqa: E402

TINY = TrainConfig(d=16, width=16, hidden=16, steps=4, batch=32, negatives=32, warmup=1)


@pytest.fixture(scope="module")
def data():
    return tdata.from_multi_interest(mi.build_world(mi.WorldDesign(n_users=200, n_ads=240, topics=6), seed=1))


@pytest.mark.parametrize("E,K", [(1, 1), (6, 1), (6, 2), (6, 6)])
def test_torch_score_is_the_oracle(E, K, rng):
    d, n = 16, 50
    req = Request.random(d, E, K, rng)
    table = AdTable.from_float(rng.standard_normal((n, d)), rng.standard_normal(n))
    t = lambda x: torch.tensor(np.array(x, np.float32))[None]  # noqa: E731
    got = gated_scores(t(req.V), t(req.G), t(req.gamma), t(req.beta), torch.tensor(np.array(table.dequantized(), np.float32)),
                       torch.as_tensor(table.bias), K)[0].numpy()
    want = reference.score(req, table)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_features_see_only_earlier_clicks(data):
    rows, t = data.events()
    pick = np.random.default_rng(0).choice(rows.size, 40, replace=False)
    b = data.batch(rows[pick], t[pick])
    for i, j in enumerate(pick):
        r, tt = rows[j], t[j]
        hist = b["hist"][i][b["hist"][i] < data.n_ads]
        np.testing.assert_array_equal(hist, data.seq[r, max(0, tt - tdata.HIST_LEN): tt])
    ev = data.batch(data.eval_rows[:20])
    for i, r in enumerate(data.eval_rows[:20]):
        hist = set(ev["hist"][i][ev["hist"][i] < data.n_ads].tolist())
        assert not hist & set(data.heldout[int(r)].tolist())
        np.testing.assert_array_equal(ev["ctx"][i], data.req_ctx[r])


def test_session_history_ends_where_the_clicks_session_began(data):
    """seq_start against the world's events: each training click's session's first position. A
    request built with ``session=True`` holds the history before that position and the click's own
    context; the evaluation request and ``session=False`` are unchanged; data without sessions
    refuse it, as does training with session_history=1 on them."""
    ev = data.world.events
    tr = ~ev["heldout"]
    for r in np.random.default_rng(0).choice(data.n_users, 30, replace=False):
        sess = ev["session"][tr][ev["user"][tr] == r]
        assert sess.size == data.seq_len[r]
        want = [int(np.flatnonzero(sess == s)[0]) for s in sess]
        np.testing.assert_array_equal(data.seq_start[r, : data.seq_len[r]], want)
    rows, t = data.events()
    assert (data.seq_start[rows, t] < t).any() and (data.seq_start[rows, t] == t).any()
    pick = np.random.default_rng(1).choice(rows.size, 60, replace=False)
    b, plain = data.batch(rows[pick], t[pick], session=True), data.batch(rows[pick], t[pick])
    for i, j in enumerate(pick):
        r, start = rows[j], data.seq_start[rows[j], t[j]]
        hist = b["hist"][i][b["hist"][i] < data.n_ads]
        np.testing.assert_array_equal(hist, data.seq[r, max(0, start - tdata.HIST_LEN): start])
        np.testing.assert_array_equal(b["ctx"][i], data.seq_ctx[r, t[j]])
        np.testing.assert_array_equal(b["ctx"][i], data.seq_ctx[r, start])  # one context a session
    np.testing.assert_array_equal(plain["hist"], data.batch(rows[pick], t[pick], session=False)["hist"])
    for t_bad in (None, data.seq_len[rows[:3]], np.array([-1, 0, 0])):  # no session has begun there
        with pytest.raises(ValueError, match="session=True takes training clicks' positions"):
            data.batch(rows[:3], t_bad, session=True)
    no_sessions = replace(data, seq_start=None)
    with pytest.raises(ValueError, match="no sessions"):
        no_sessions.batch(rows[:3], t[:3], session=True)
    with pytest.raises(ValueError, match="session_history=1 needs sessions"):
        train_model("single_tower", no_sessions, replace(TINY, session_history=1), device="cpu", progress=False)


def test_session_history_trains_on_the_session_requests(data, monkeypatch):
    """With session_history=1 every training batch is built with ``session=True`` (and without it
    with ``session=False``), and the run differs from the one on click histories."""
    seen = []
    real = tdata.InteractionData.batch
    monkeypatch.setattr(tdata.InteractionData, "batch",
                        lambda self, rows, t=None, session=False: (seen.append((t is None, session)),
                                                                   real(self, rows, t, session))[1])
    runs = {}
    for flag in (0, 1):
        seen.clear()
        runs[flag] = train_model("single_tower", data, replace(TINY, session_history=flag), seed=0, device="cpu",
                                 progress=False).history
        assert seen and set(seen) == {(False, bool(flag))}
    assert runs[0] != runs[1]


def test_training_is_seeded(data):
    a = train_model("mixture_k2", data, TINY, seed=5, device="cpu", progress=False)
    b = train_model("mixture_k2", data, TINY, seed=5, device="cpu", progress=False)
    np.testing.assert_array_equal(a.ad_arrays()[0], b.ad_arrays()[0])
    assert a.history == b.history and all(np.isfinite(a.history))


def test_gate_learns_at_k1(data):
    m = train_model("mixture_k1", data, TrainConfig(**{**TINY.__dict__, "steps": 1}), seed=0, device="cpu",
                    progress=False)
    net = m.net
    rows, t = data.events()
    b = {k: torch.as_tensor(v) for k, v in data.batch(rows[:16], t[:16]).items()}
    cats = m._cats
    net.zero_grad()
    net.train()
    s = net.score(b, torch.arange(data.n_ads), cats)
    s.sum().backward()
    # the gate-key half of every expert's last layer gets a gradient although only one expert is selected
    for head in net.heads:
        g = head[2].weight.grad[net.d:]
        assert torch.count_nonzero(g) > 0


@pytest.mark.parametrize("name", list(MODELS))
def test_export_shapes(data, name):
    m = train_model(name, data, TINY, seed=0, device="cpu", progress=False)
    rows = data.eval_rows[:3]
    sc = m.forward_scores(rows)
    assert sc.shape == (3, data.n_ads) and np.isfinite(sc).all()
    if name == "ranking":
        with pytest.raises(TypeError):
            m.export_table()
        return
    E, K = MODELS[name]
    req = m.export_request(data.user_ids[rows[0]])
    assert (req.experts, req.k_experts, req.d) == (E, K, TINY.d)
    for dt in ("fp32", "bf16", "fp16", "int8"):
        tab = m.export_table(dt)
        assert tab.dtype == dt and tab.n_ads == data.n_ads
        np.testing.assert_array_equal(tab.ad_ids, data.ad_ids)
    # exported tensors + DESIGN's formula = the model's own forward pass
    V, G, gamma, beta = m.request_tensors(rows)
    np.testing.assert_allclose(score_exported(V, G, gamma, beta, m.export_table("fp32"), K), sc, rtol=1e-5, atol=1e-5)
    # and the float64 oracle
    np.testing.assert_allclose(reference.score(req, m.export_table("fp32")), sc[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["single_tower", "mixture_k2"])
def test_fused_kernel_gives_the_torch_top_k(data, name):
    from andromeda_nb.analysis import quality

    m = train_model(name, data, TINY, seed=0, device="cpu", progress=False)
    users = data.user_ids[data.eval_rows[:2]]
    for check in quality.kernel_check(m, users, k=10):
        assert check.ok, check.message


def test_movielens_features_respect_the_temporal_split():
    from pathlib import Path

    from andromeda_nb.datasets import movielens

    if not all((Path("data/ml-100k") / f).is_file() for f in movielens.FILES):
        pytest.skip("MovieLens-100K files not fetched")
    ml = movielens.load("data/ml-100k")
    split = movielens.split(ml)
    world = movielens.build_world(ml, split, d=16, experts=1, k_experts=1)
    d = tdata.from_movielens(world, ml, split)
    assert d.n_train == len(split.train) and d.n_ads == 1682
    held_ts = split.heldout.groupby("user_id")["timestamp"].min()
    train = split.train.sort_values(["user_id", "timestamp", "item_id"], kind="mergesort")
    for r in d.eval_rows[:30]:
        uid = int(d.user_ids[r])
        seq = d.seq[r, : d.seq_len[r]]
        np.testing.assert_array_equal(d.ad_ids[seq], train.loc[train["user_id"] == uid, "item_id"].to_numpy())
        assert not set(d.heldout[int(r)].tolist()) & set(seq.tolist())
        # the request context is computed at the first held-out click from training clicks only
        ts = train.loc[train["user_id"] == uid, "timestamp"].to_numpy()
        np.testing.assert_array_equal(d.req_ctx[r], tdata._ml_context(np.array([held_ts[uid]]), ts)[0])
    assert (d.eligible(d.eval_rows[:3]).sum(axis=1) > 0).all()


@pytest.mark.parametrize("name", ["single_tower", "mixture_k2", "ranking"])
def test_ad_features_add_a_category_projection(data, name):
    """With ad_features an ad's row is its id embedding plus a projection of its categories, shared
    by every ad of a category; ad_features=0 (the default) leaves the id embedding alone."""
    assert TrainConfig().ad_features == 0
    m = train_model(name, data, TrainConfig(**{**TINY.__dict__, "ad_features": 1}), seed=0, device="cpu",
                    progress=False)
    proj = m.net.ad_feat.proj.weight.detach().numpy()  # [d + 1, n_cats]
    cats = data.ad_cats
    want_a = m.net.ad.weight.detach().numpy() + cats @ proj[:-1].T
    want_b = m.net.ad_bias.detach().numpy() + cats @ proj[-1]
    if name != "ranking":
        a, b = m.ad_arrays()
        np.testing.assert_allclose(a, want_a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b, want_b, rtol=1e-5, atol=1e-6)
    plain = train_model(name, data, TrainConfig(**{**TINY.__dict__, "ad_features": 0}), seed=0, device="cpu",
                        progress=False)
    assert plain.net.ad_feat is None
    if name != "ranking":
        np.testing.assert_array_equal(plain.ad_arrays()[0], plain.net.ad.weight.detach().numpy())


def test_interest_experts_pool_the_history_per_expert(data):
    """With interest_experts each mixture expert reads its own softmax-weighted mean of the user's
    history embeddings (weights over the clicked positions only, none for an empty history), so the
    view ignores the order of the clicks; the exported request still scores as the torch model."""
    cfg = TrainConfig(**{**TINY.__dict__, "interest_experts": 1})
    assert TrainConfig().interest_experts == 0
    m = train_model("mixture_k2", data, cfg, seed=0, device="cpu", progress=False)
    net = m.net
    b = {k: torch.as_tensor(v) for k, v in data.batch(data.eval_rows[:5]).items()}  # after every training click
    ad_cats = torch.as_tensor(data.ad_cats, dtype=torch.float32)
    ad_cats = torch.cat([ad_cats, torch.zeros(1, ad_cats.shape[1])])
    hist = b["hist"].clone()
    hist[0] = data.n_ads  # an empty history
    b["hist"] = hist
    with torch.no_grad():
        f = net.features(b, ad_cats)
        views = net.interest_views(f)  # [E, B, width]
        emb, mask = f["_hist_emb"].numpy(), f["_hist_mask"].numpy()
        logits = net.interests(f["_hist_emb"]).numpy()  # [B, L, E]
        for i in range(1, hist.shape[0]):
            on = mask[i] > 0
            for e in range(net.experts):
                w = np.exp(logits[i, on, e] - logits[i, on, e].max())
                np.testing.assert_allclose(views[e, i].numpy(), (w / w.sum()) @ emb[i, on], rtol=1e-4, atol=1e-5)
        assert not views[:, 0].numpy().any()
        b2 = dict(b, hist=hist.flip(1))  # the same clicks in reverse order
        np.testing.assert_allclose(net.interest_views(net.features(b2, ad_cats)).numpy(), views.numpy(),
                                   rtol=1e-4, atol=1e-6)
    sc = m.forward_scores(data.eval_rows[:3])
    V, G, gamma, beta = m.request_tensors(data.eval_rows[:3])
    np.testing.assert_allclose(score_exported(V, G, gamma, beta, m.export_table("fp32"), 2), sc, rtol=1e-5, atol=1e-5)


def test_shared_inputs_experts_read_every_signal_group(data):
    """With shared_inputs every mixture expert reads all signal groups: changing one group's input
    moves every expert's (V, G), where with group experts it moves only that group's expert; the
    exported request still scores as the torch model. It excludes interest_experts."""
    from andromeda_nb.training.data import GROUPS

    outs = {}
    for shared in (0, 1):
        cfg = TrainConfig(**{**TINY.__dict__, "shared_inputs": shared})
        m = train_model("mixture_k2", data, cfg, seed=0, device="cpu", progress=False)
        net = m.net
        b = {k: torch.as_tensor(v) for k, v in data.batch(data.eval_rows[:4]).items()}
        ad_cats = torch.as_tensor(data.ad_cats, dtype=torch.float32)
        ad_cats = torch.cat([ad_cats, torch.zeros(1, ad_cats.shape[1])])
        with torch.no_grad():
            f = net.features(b, ad_cats)
            heads = lambda f: torch.stack(  # noqa: E731 - the experts' outputs [B, E, 2d] from features f
                [h(torch.cat([f[g] for g in GROUPS], 1) if shared else f[GROUPS[e]])
                 for e, h in enumerate(net.heads)], 1)
            V, G, _, _ = net.request(b, ad_cats)
            np.testing.assert_allclose(torch.cat([V, G], -1).numpy(), heads(f).numpy(), rtol=1e-6)
            moved = dict(f, **{GROUPS[0]: f[GROUPS[0]] + 1.0})
            changed = (heads(moved) - heads(f)).abs().amax(dim=(0, 2)) > 0
        outs[shared] = changed.tolist()
        sc = m.forward_scores(data.eval_rows[:3])
        V, G, gamma, beta = m.request_tensors(data.eval_rows[:3])
        np.testing.assert_allclose(score_exported(V, G, gamma, beta, m.export_table("fp32"), 2), sc,
                                   rtol=1e-5, atol=1e-5)
    E = len(outs[0])
    assert outs[0] == [True] + [False] * (E - 1) and outs[1] == [True] * E
    with pytest.raises(ValueError, match="set one of them"):
        TrainConfig(interest_experts=1, shared_inputs=1)


@pytest.mark.parametrize("field,value", [("ad_features", 2), ("interest_experts", -1), ("shared_inputs", 2), ("steps", 0),
                                         ("batch", 2.5), ("lr", 0.0), ("lr", float("nan")),
                                         ("weight_decay", -1e-4), ("grad_clip", float("inf")), ("warmup", -1),
                                         ("temperature", 0.0), ("steps", True), ("ad_features", 1.0), ("lr", "1e-3"),
                                         ("lb_coef", True), ("route_coef", -0.1), ("route_coef", float("nan")),
                                         ("session_history", 2), ("session_history", "1")])
def test_train_config_refuses_values_it_cannot_train(field, value):
    """TrainConfig refuses, by name, a value that would train something else than asked (a switch of
    2, a zero length, a NaN learning rate) before any model is built."""
    with pytest.raises(ValueError, match=f"TrainConfig.{field}"):
        TrainConfig(**{field: value})
    assert TrainConfig(**{field: type(getattr(TrainConfig(), field))(1)}) is not None  # the field's sound value


def test_train_config_keeps_numpy_scalars_as_python_numbers():
    """A configuration built from numpy scalars (a user's sweep) holds Python numbers, so it is
    written to JSON (tuned configurations, run keys) like one built from literals."""
    import json
    from dataclasses import asdict

    cfg = TrainConfig(steps=np.int64(40), lr=np.float32(0.5), width=np.int32(8), ad_features=np.int64(1))
    assert cfg == TrainConfig(steps=40, lr=0.5, width=8, ad_features=1)
    assert json.loads(json.dumps(asdict(cfg))) == asdict(TrainConfig(steps=40, lr=0.5, width=8, ad_features=1))


def test_temperature_divides_the_scores_before_the_sampling_correction(data, monkeypatch):
    """The first step's logits (before any update: same seed, network and batch) are score /
    temperature - log Q: with the scores the network gave that step and log Q from the run at
    temperature 1, the run at 1/4 gives 4 s - log Q (not (s - log Q) * 4, not s - log Q)."""
    import andromeda_nb.training.train as T

    seen = {"logits": [], "scores": []}
    real_ce, real_score = T.torch.nn.functional.cross_entropy, T.RetrievalNet.score
    monkeypatch.setattr(T.torch.nn.functional, "cross_entropy",
                        lambda logits, target: (seen["logits"].append(logits.detach().clone()),
                                                real_ce(logits, target))[1])
    monkeypatch.setattr(T.RetrievalNet, "score",
                        lambda self, *a, **k: (lambda out: (seen["scores"].append(out.detach().clone()), out)[1])(
                            real_score(self, *a, **k)))
    runs = {}
    for tau in (1.0, 0.25):
        seen["logits"].clear(), seen["scores"].clear()
        m = train_model("single_tower", data, TrainConfig(**{**TINY.__dict__, "steps": 1, "temperature": tau}),
                        seed=0, device="cpu", progress=False)
        runs[tau] = (seen["scores"][0], seen["logits"][0], m.history[0])
    (s1, l1, h1), (s4, l4, h4) = runs[1.0], runs[0.25]
    torch.testing.assert_close(s1, s4)  # the same network and batch
    kept = l1 > -1e8  # the masked accidental hits stay at -1e9
    logq = s1 - l1
    torch.testing.assert_close(l4[kept], (4 * s1 - logq)[kept], rtol=1e-5, atol=1e-4)
    assert h1 != h4 and np.isfinite([h1, h4]).all()


def test_routing_term_is_minus_the_mutual_information_of_ad_and_expert(rng):
    """routing_term against a float64 numpy oracle on random gates, and its two ends: 0 for a
    gate that gives every ad of a request the same distribution (collapsed or flat), -1 for
    one-hot choices that use every expert equally within each request."""
    p = torch.softmax(torch.tensor(rng.standard_normal((5, 7, 4)) * 3, dtype=torch.float64), -1)
    q = p.numpy()
    ent = lambda x: -(x * np.log(x)).sum(-1)  # noqa: E731
    want = np.mean(ent(q).mean(1) - ent(q.mean(1))) / np.log(4)
    assert routing_term(p).item() == pytest.approx(want, rel=1e-9)
    assert -1 < want < 0
    same = torch.softmax(torch.tensor(rng.standard_normal((3, 1, 4))), -1).expand(3, 8, 4)
    assert routing_term(same).item() == pytest.approx(0.0, abs=1e-7)
    onehot = torch.eye(4, dtype=torch.float64).repeat(2, 1).expand(3, 8, 4)  # each expert twice a request
    assert routing_term(onehot).item() == pytest.approx(-1.0, abs=1e-6)


def test_route_coef_adds_the_routing_term_to_a_mixtures_loss(data, monkeypatch):
    """The first step's loss (same seed, network and batch) grows by route_coef x routing_term of
    that step's gate for a mixture, and not at all for the single tower, which has no gate."""
    import andromeda_nb.training.train as T

    gates = []
    real = T.routing_term
    monkeypatch.setattr(T, "routing_term", lambda p: (gates.append(real(p).item()), real(p))[1])
    for name in ("mixture_k2", "single_tower"):
        gates.clear()
        h = {c: train_model(name, data, TrainConfig(**{**TINY.__dict__, "steps": 1, "route_coef": c}), seed=0,
                            device="cpu", progress=False).history[0] for c in (0.0, 0.5)}
        if name == "mixture_k2":
            assert len(gates) == 1 and gates[0] < 0
            assert h[0.5] - h[0.0] == pytest.approx(0.5 * gates[0], rel=1e-4, abs=1e-6)
        else:
            assert gates == [] and h[0.5] == h[0.0]
