"""A MovieLens world serving a trained model (the quickstart's default): its table and requests are
the model's exports, the rest the world's, and the device pipeline answers as the oracle does."""

import types
from pathlib import Path

import numpy as np
import pytest

from andromeda_nb.analysis import evaluation
from andromeda_nb.datasets import movielens
from andromeda_nb.training.served import TrainedWorld, train_world
from andromeda_nb.training.train import train_model


@pytest.fixture(scope="module")
def ml_world():
    if not all((Path("data/ml-100k") / f).is_file() for f in movielens.FILES):
        pytest.skip("MovieLens-100K files not fetched")
    ml = movielens.load("data/ml-100k")
    split = movielens.split(ml)
    return ml, split, movielens.build_world(ml, split, experts=2, k_experts=1, dtype="fp16")


def test_a_trained_world_serves_the_model_exports(ml_world, rng):
    ml, split, world = ml_world
    served = train_world(world, ml, split, "mixture_k2", preset="smoke", seed=int(rng.integers(100)), device="cpu",
                         progress=False)
    m = served.model
    want = m.export_table("fp16")
    np.testing.assert_array_equal(served.table.embeddings.view(np.uint16), want.embeddings.view(np.uint16))
    np.testing.assert_array_equal(served.table.ad_ids, world.table.ad_ids)
    for user in rng.choice(world.users, 3, replace=False):
        got, ref = served.request(user), m.export_request(user)
        for name in ("V", "G", "gamma", "beta"):
            np.testing.assert_allclose(getattr(got, name), getattr(ref, name), rtol=1e-6, atol=1e-7)
        assert got.k_experts == 2 and served.request(user, k_experts=1).k_experts == 1
        # the rest is the world's: rules, profiles, held-out items
        assert served.profile(user) == world.profile(user)
        np.testing.assert_array_equal(served.heldout(user), world.heldout(user))
    with pytest.raises(KeyError):
        served.request(10 ** 9)
    d = served.describe()
    assert d["model"] == "mixture_k2" and d["experts"] == 6 and d["k_experts"] == 2 and d["train_steps"] == m.cfg.steps
    assert "factors" not in d and served.note == "preset smoke"
    runs = evaluation.run_users(served, [int(world.users[0])], k=20, ks=[10, 20], progress=False)
    assert evaluation.answer_checks(runs).all(), runs


def test_a_trained_world_refuses_what_it_cannot_serve(ml_world):
    ml, split, world = ml_world
    with pytest.raises(ValueError, match="ranking model serves no Request"):
        train_world(world, ml, split, "ranking", preset="smoke", device="cpu", progress=False)
    with pytest.raises(ValueError, match="model must be one of"):
        train_world(world, ml, split, "mixture_k3", preset="smoke", device="cpu", progress=False)
    with pytest.raises(ValueError, match="preset must be one of"):
        train_world(world, ml, split, "mixture_k2", preset="huge", device="cpu", progress=False)
    served = train_world(world, ml, split, "single_tower", preset="smoke", device="cpu", progress=False)
    other = types.SimpleNamespace(table=world.table, user_ids=world.user_ids[1:])
    with pytest.raises(ValueError, match="other users or ads"):
        TrainedWorld(other, served.model)
    ranking = train_model("ranking", served.model.data, served.model.cfg, device="cpu", progress=False)
    with pytest.raises(TypeError, match="retrieval model"):
        TrainedWorld(world, ranking)
