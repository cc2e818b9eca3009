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


def test_estimated_interests_follow_the_training_clicks(world):
    """Topics: those clicked twice or more in training, most clicked first (ties to the lower
    topic), at most 4, the most clicked alone when none was; weights: their click shares; taste:
    the unit mean latent of the topic's clicked ads. true_scores with them is a distribution over
    eligible ads, and with the user's own interests it is true_scores itself."""
    for u in world.users[:40]:
        seen = world.seen_slots(u)
        topics, weights, taste = world.estimated_interests(u)
        uniq, counts = np.unique(world.ad_topic[seen], return_counts=True)
        ranked = sorted(zip(-counts, uniq))
        want = [t for c, t in ranked if -c >= 2][:4] or [ranked[0][1]]
        held = topics >= 0
        assert topics[held].tolist() == want and not held[len(want):].any()
        share = np.array([np.sum(world.ad_topic[seen] == t) for t in want], float)
        np.testing.assert_allclose(weights[held], share / share.sum())
        assert np.all(weights[~held] == 0)
        for j, t in enumerate(want):
            m = world.ad_latent[seen[world.ad_topic[seen] == t]].mean(axis=0)
            np.testing.assert_allclose(taste[j], m / np.linalg.norm(m), atol=1e-12)
        p = world.true_scores(u, (topics, weights, taste))
        assert np.all(p >= 0) and p.sum() == pytest.approx(1.0, abs=1e-6) and p[~world.eligible(u)].sum() == 0
        own = (world.interest_topics[u], world.interest_weights[u], world.interest_taste[u])
        np.testing.assert_array_equal(world.true_scores(u, own), world.true_scores(u))


def test_estimated_topics_are_mostly_the_users_own_interests(world):
    """Topics clicked twice or more are mostly the user's interests (exploration clicks spread one
    a topic); taking every clicked topic lets exploration in."""
    def precision(min_clicks):
        hit = total = 0
        for u in world.users:
            topics = world.estimated_interests(u, min_clicks)[0]
            topics = set(topics[topics >= 0].tolist())
            hit += len(topics & set(world.interest_topics[u].tolist()))
            total += len(topics)
        return hit / total

    assert precision(2) > 0.8 and precision(1) < precision(2) - 0.1


def test_estimated_interests_need_training_clicks(world):
    u = int(world.users[0])
    saved = world._train_slots[u]
    world._train_slots[u] = np.zeros(0, np.int64)
    try:
        with pytest.raises(ValueError, match="no training clicks"):
            world.estimated_interests(u)
    finally:
        world._train_slots[u] = saved


def test_true_scores_read_only_the_interests_given(world):
    """One interest given (a topic the user may not hold): its ads take the non-exploring share
    (0.9), spread by the given taste; exploration takes the rest over every other topic in
    proportion to its popularity, whatever the user's own interests are."""
    d = world.design
    pop = mi._topic_pop(d)
    rng = np.random.default_rng(0)
    for u in world.users[:10]:
        elig = world.eligible(u)
        t = int(rng.choice(np.unique(world.ad_topic[elig])))
        taste = np.zeros((4, d.latent_dim))
        taste[0] = mi._unit(rng.standard_normal(d.latent_dim))
        p = world.true_scores(u, (np.array([t, -1, -1, -1]), np.array([1.0, 0, 0, 0]), taste))
        ads = np.flatnonzero((world.ad_topic == t) & elig)
        logit = world.ad_latent[ads] @ taste[0] / d.tau + world.ad_quality[ads]
        want = np.exp(logit - logit.max())
        np.testing.assert_allclose(p[ads], (1 - d.explore_prob) * want / want.sum(), rtol=1e-12)
        others = np.array([o for o in range(d.topics) if o != t and (elig & (world.ad_topic == o)).any()])
        share = np.array([p[elig & (world.ad_topic == o)].sum() for o in others])
        all_others = np.array([o for o in range(d.topics) if o != t])
        np.testing.assert_allclose(share, d.explore_prob * pop[others] / pop[all_others].sum(), rtol=1e-9)
        # two interests given: the session's share follows their affinity to the request's context
        t2 = int(rng.choice([o for o in others if o != t]))
        p = world.true_scores(u, (np.array([t, t2, -1, -1]), np.array([0.5, 0.5, 0, 0]), np.stack([taste[0]] * 4)))
        dev, part = world.request_context[u]
        aff = np.exp(world.topic_affinity[[t, t2], dev, part])
        session = aff[0] / aff.sum()
        want = (1 - d.explore_prob) * (d.session_interest_prob * session + (1 - d.session_interest_prob) * 0.5)
        assert p[ads].sum() == pytest.approx(want, rel=1e-12)


def test_estimated_interests_fall_back_to_the_most_clicked_topic(world):
    """A user whose topics were each clicked once: the lowest of them alone (every count ties)."""
    u = int(world.users[0])
    saved = world._train_slots[u]
    firsts = np.array(sorted(int(np.flatnonzero(world.ad_topic == t)[0]) for t in (7, 2, 5)))
    world._train_slots[u] = firsts
    try:
        topics, weights, taste = world.estimated_interests(u)
        assert topics.tolist() == [2, -1, -1, -1] and weights.tolist() == [1, 0, 0, 0]
        np.testing.assert_allclose(taste[0], world.ad_latent[firsts[world.ad_topic[firsts] == 2][0]])
        assert world.estimated_interests(u, min_clicks=1)[0].tolist() == [2, 5, 7, -1]
    finally:
        world._train_slots[u] = saved


@pytest.mark.parametrize("change, expected", [
    ({"n_ads": 0}, "n_ads must be at least 1"), ({"topics": 4}, "topics must be more than the 4 interests"),
    ({"session_len": 0}, "session_len must be at least 1"), ({"latent_dim": 0}, "latent_dim must be at least 1"),
    ({"countries": 0}, r"countries must be in 1\.\.62"), ({"countries": 70}, r"countries must be in 1\.\.62"),
    ({"ages": 63}, r"ages must be in 1\.\.62"), ({"min_sessions": 9}, "must be at least min_sessions"),
    ({"zipf": float("nan")}, "zipf must be a finite number"), ({"tau": 0.0}, "tau .* must be positive"),
    ({"explore_prob": 1.5}, "explore_prob is a probability"), ({"ad_spread": -0.1}, "ad_spread must be non-negative"),
    ({"n_users": 2.5}, "n_users must be an int"), ({"tau": True}, "tau must be a finite number"),
])
def test_a_design_no_world_can_be_built_from_is_refused(change, expected):
    """Sizes below one, more values than an int64 rule mask holds, fewer maximum than minimum
    sessions, non-finite or out-of-range numbers and non-integer counts are refused when the
    design is made, naming the field; the edge values build."""
    with pytest.raises(ValueError, match=expected):
        mi.WorldDesign(**change)
    for design in (dict(n_ads=120, countries=62, ages=1, min_sessions=3, max_sessions=3, explore_prob=1.0, tau=1e-3),
                   dict(n_ads=2, countries=1, ages=2, genders=1)):  # topics without ads
        w = mi.build_world(mi.WorldDesign(n_users=40, topics=5, **design), seed=1)
        scores = w.true_scores(0)  # a topic without ads takes its share of the clicks with it
        assert np.isfinite(scores).all() and (scores >= 0).all() and 0 < scores.sum() <= 1 + 1e-9
