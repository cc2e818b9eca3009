"""The synthetic multi-interest world: determinism, split without leakage, targeting, ground truth."""

import numpy as np
import pytest

from andromeda_nb import reference
from andromeda_nb.datasets import multi_interest as mi

SMALL = mi.WorldDesign(n_users=300, n_ads=500, topics=10)


@pytest.fixture(scope="module")
def world():
    return mi.build_world(SMALL, seed=3)


def test_deterministic_per_seed(world):
    again = mi.build_world(SMALL, seed=3)
    for k, v in world.events.items():
        np.testing.assert_array_equal(v, again.events[k])
    other = mi.build_world(SMALL, seed=4)
    assert not np.array_equal(world.events["ad"][:50], other.events["ad"][:50])


def test_users_hold_several_interests(world):
    m = (world.interest_topics >= 0).sum(axis=1)
    assert m.min() >= 1 and m.max() <= 4 and 2.0 < m.mean() < 3.0
    np.testing.assert_allclose(world.interest_weights.sum(axis=1), 1.0)
    # interests of one user are distinct topics
    for row in world.interest_topics[:50]:
        t = row[row >= 0]
        assert np.unique(t).size == t.size


def test_split_is_the_last_session_without_leakage(world):
    ev = world.events
    for u in world.users[:60]:
        sel = ev["user"] == u
        sess, held = ev["session"][sel], ev["heldout"][sel]
        assert held.any() and np.all(sess[held] == sess.max())
        assert np.all(ev["time"][sel][held].min() > ev["time"][sel][~held]) if (~held).any() else True
        h, seen = world.heldout(u), world.seen_slots(u)
        assert np.intersect1d(h, seen).size == 0  # clicks are distinct per user
        # every click happened on an ad eligible for the user
        assert world.eligible(u)[ev["ad"][sel]].all()
        dev, part = world.request_context[u]
        assert np.all(ev["device"][sel][held] == dev) and np.all(ev["daypart"][sel][held] == part)


def test_eligibility_matches_the_oracle(world):
    for u in world.users[:5]:
        np.testing.assert_array_equal(world.eligible(u), reference.match(world.rules, world.profile(u)))
    m = world.eligible(world.users[0], exclude_seen=True)
    assert not m[world.seen_slots(world.users[0])].any()


def test_true_scores_are_a_distribution_over_eligible_ads(world):
    for u in world.users[:10]:
        p = world.true_scores(u)
        assert np.all(p >= 0) and p.sum() == pytest.approx(1.0, abs=1e-6)
        assert p[~world.eligible(u)].sum() == 0
        # the user's interest topics carry most of the mass
        topics = world.interest_topics[u][world.interest_topics[u] >= 0]
        assert p[np.isin(world.ad_topic, topics)].sum() > 0.8
