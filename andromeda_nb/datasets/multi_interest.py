"""A synthetic multi-interest ads world with a known ground-truth click model (issue 6).

Purpose: test whether a per-ad gated mixture of user experts retrieves better than one user vector
when users really hold several distinct interests, with a true model to compare against. The design
below was fixed before any model was trained on it and is not tuned to agree with any claim.

Design (all numbers are :class:`WorldDesign` defaults)
------------------------------------------------------
Latent space: ``D = 32`` dims, ``T = 100`` topics with unit centroids ``mu_t ~ unit(N(0, I))``.
Topic popularity is Zipf: ``pop_t ∝ 1 / rank^1.0``.

Ads (``n_ads = 50,000``): topic ``t(a) ~ pop^0.5`` (popular topics hold more ads, not
proportionally more), latent ``z_a = unit(mu_t + 0.7 * g / sqrt(D))`` (``g ~ N(0, I)``), quality
``q_a ~ N(0, 0.5^2)``. Ad id = slot (0..n_ads-1).

Users (``n_users = 50,000``): demographics ``age_bucket`` (5), ``gender`` (2), ``country`` (8),
uniform; a main ``device`` (3). Each (age, gender) segment tilts topic choice:
``P(t | seg) ∝ pop_t * exp(0.8 * N(0, 1)_{seg, t})``. A user holds ``m = 1 + Binomial(3, 0.5)``
interests (1..4, mean 2.5): distinct topics drawn from ``P(t | seg)``, weights ``pi ~ Dirichlet(1)``,
and a personal taste vector per interest ``w_j = unit(mu_t + 0.7 * g / sqrt(D))``.

Request context: ``device`` (3) x ``daypart`` (4). Each topic has an affinity
``aff[t, device, daypart] ~ N(0, 1)``.

Sessions: a user has ``S = 4..8`` sessions (uniform) of ``L = 4`` clicks each. A session's context
is (the user's main device w.p. 0.8, else uniform; daypart uniform). Its active interest is
``j_s ~ P(j | u, c) ∝ pi_j * exp(aff[t_j, c])``. Each click comes from

- exploration w.p. 0.10: a topic the user does not hold, ``∝ pop``; an ad ``∝ exp(q_a)`` in it;
- the session interest w.p. 0.90 * 0.75;
- an interest drawn from ``pi`` w.p. 0.90 * 0.25;

and an interest click picks an ad of topic ``t_j`` with ``P(a | u, j) ∝ exp(<w_j, z_a> / 0.1 + q_a)``
among the ads eligible for the user that it has not clicked before (clicks are distinct).

Targeting (clicks only happen on eligible ads, so every held-out click passes targeting): an ad
includes 1-3 of the 8 countries w.p. 0.3, 2-3 of the 5 age buckets w.p. 0.2, and excludes one
gender w.p. 0.05 (categories ``country``, ``age_bucket``, ``gender``).

Split: the last session of every user is held out (its clicks are the relevant set, its context is
the evaluation request's context); the earlier sessions are training. No held-out click shapes any
training feature, rule or popularity count.

Ground truth (:meth:`MultiInterestWorld.true_scores`): the probability that a click of the next
session (in its known context) is ad ``a``, from the generative model above (without the
no-repeat correction): the ceiling any trained model can approach. It knows each user's
interests; a model knows only their clicks. The same formula with the interests estimated from the
training clicks (:meth:`MultiInterestWorld.estimated_interests`, every world and ad parameter
known) measures how much of the ceiling the clicks reveal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import numpy as np

from ..arguments import is_int
from ..targeting import Category, TargetingRules, TargetingSchema, make_profile

CATEGORIES = ("age_bucket", "gender", "country")


@dataclass(frozen=True)
class WorldDesign:
    """The fixed design of the world (module docstring). Change sizes for tests; keep the rest."""

    n_users: int = 50_000
    n_ads: int = 50_000
    topics: int = 100
    latent_dim: int = 32
    zipf: float = 1.0
    ads_topic_power: float = 0.5
    ad_spread: float = 0.7
    taste_spread: float = 0.7
    quality_sd: float = 0.5
    segment_tilt: float = 0.8
    ages: int = 5
    genders: int = 2
    countries: int = 8
    devices: int = 3
    dayparts: int = 4
    main_device_prob: float = 0.8
    min_sessions: int = 4
    max_sessions: int = 8
    session_len: int = 4
    explore_prob: float = 0.10
    session_interest_prob: float = 0.75
    tau: float = 0.1
    rule_country_prob: float = 0.3
    rule_age_prob: float = 0.2
    rule_gender_prob: float = 0.05

    def __post_init__(self):
        """ValueError for a design no world can be built from (before any generation)."""
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in (int, "int") and not is_int(v):
                raise ValueError(f"WorldDesign.{f.name} must be an int, got {v!r}")
            if f.type in (float, "float") and (isinstance(v, bool) or not isinstance(v, (int, float, np.number))
                                               or not np.isfinite(v)):
                raise ValueError(f"WorldDesign.{f.name} must be a finite number, got {v!r}")
        if self.topics <= MAX_INTERESTS:
            raise ValueError(f"WorldDesign.topics must be more than the {MAX_INTERESTS} interests a user may hold "
                             f"(exploration clicks a topic the user does not hold), got {self.topics}")
        for name in ("n_users", "n_ads", "latent_dim", "genders", "devices", "dayparts", "min_sessions",
                     "session_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"WorldDesign.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("ages", "countries"):  # an ad's rule on them is a bit mask in an int64
            if not 1 <= getattr(self, name) <= MAX_MASK_VALUES:
                raise ValueError(f"WorldDesign.{name} must be in 1..{MAX_MASK_VALUES}, got {getattr(self, name)}")
        if self.max_sessions < self.min_sessions:
            raise ValueError(f"WorldDesign.max_sessions ({self.max_sessions}) must be at least min_sessions "
                             f"({self.min_sessions})")
        for name in ("main_device_prob", "explore_prob", "session_interest_prob", "rule_country_prob",
                     "rule_age_prob", "rule_gender_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"WorldDesign.{name} is a probability, got {getattr(self, name)}")
        for name in ("zipf", "ads_topic_power", "ad_spread", "taste_spread", "quality_sd", "segment_tilt"):
            if getattr(self, name) < 0:
                raise ValueError(f"WorldDesign.{name} must be non-negative, got {getattr(self, name)}")
        if self.tau <= 0:
            raise ValueError(f"WorldDesign.tau (the choice softmax's temperature) must be positive, got {self.tau}")


#: the most values of a category an ad's rule holds as a bit mask (int64, its top bit unused)
MAX_MASK_VALUES = 62
#: the most interests (topics) a user holds
MAX_INTERESTS = 4

@dataclass(eq=False)
class MultiInterestWorld:
    """The generated world (build with :func:`build_world`).

    Attributes:
        design: the :class:`WorldDesign`.
        seed: generator seed.
        schema, rules: targeting schema and rules (slot = ad id).
        ad_ids: ``[n_ads]`` int64 (= slots).
        ad_topic: ``[n_ads]`` int64; ad_latent ``[n_ads, D]``; ad_quality ``[n_ads]``.
        demo: ``[n_users, 3]`` int64 codes (age_bucket, gender, country); main_device ``[n_users]``.
        interest_topics: ``[n_users, 4]`` int64 (-1 = none); interest_weights ``[n_users, 4]``;
        interest_taste: ``[n_users, 4, D]``.
        events: dict of ``[n_events]`` arrays, sorted by (user, time): ``user``, ``ad``, ``time``
            (click index within the user), ``session``, ``device``, ``daypart``, ``interest``
            (the interest slot that produced it, -1 = exploration), ``heldout`` (bool).
        users: ``[n_users]`` int64 user ids (0..n_users-1; every user has a held-out session).
        request_context: ``[n_users, 2]`` int64 (device, daypart) of the held-out session.
    """

    design: WorldDesign
    seed: int
    schema: TargetingSchema
    rules: TargetingRules
    ad_ids: np.ndarray
    ad_topic: np.ndarray
    ad_latent: np.ndarray
    ad_quality: np.ndarray
    topic_centroids: np.ndarray
    topic_affinity: np.ndarray
    demo: np.ndarray
    main_device: np.ndarray
    interest_topics: np.ndarray
    interest_weights: np.ndarray
    interest_taste: np.ndarray
    events: dict
    users: np.ndarray
    request_context: np.ndarray
    ad_country_mask: np.ndarray
    ad_age_mask: np.ndarray
    ad_gender_excl: np.ndarray
    _train_slots: dict = field(default_factory=dict, repr=False)
    _heldout: dict = field(default_factory=dict, repr=False)

    @property
    def n_ads(self) -> int:
        return int(self.ad_ids.size)

    @property
    def n_users(self) -> int:
        return int(self.users.size)

    def profile(self, user_id) -> dict:
        """Targeting profile ``{category: frozenset}``."""
        age, gender, country = (int(v) for v in self.demo[int(user_id)])
        return make_profile(self.schema, {"age_bucket": age, "gender": gender, "country": country})

    def eligible(self, user_id, exclude_seen: bool = False) -> np.ndarray:
        """``[n_ads]`` bool: ads passing the user's targeting (and unseen in training if asked)."""
        mask = _eligible_rows(self, np.array([int(user_id)]))[0]
        if exclude_seen:
            mask[self.seen_slots(user_id)] = False
        return mask

    def eligible_matrix(self, user_ids) -> np.ndarray:
        """``[n, n_ads]`` bool targeting match of several users (vectorised)."""
        return _eligible_rows(self, np.asarray(user_ids, dtype=np.int64))

    def heldout(self, user_id) -> np.ndarray:
        """Ad ids clicked in the held-out (last) session, distinct, in click order."""
        return self._heldout.get(int(user_id), np.zeros(0, np.int64)).copy()

    def seen_slots(self, user_id) -> np.ndarray:
        """Sorted slots of the user's training clicks."""
        return self._train_slots.get(int(user_id), np.zeros(0, np.int64)).copy()

    def true_scores(self, user_id, interests=None) -> np.ndarray:
        """``[n_ads]`` ground-truth probability that a click of the held-out session is each ad
        (in its known context), before targeting and the no-repeat rule are applied. ``interests``:
        ``(topics [4], weights [4], taste [4, D])`` in place of the user's own (as
        :meth:`estimated_interests` returns; topic -1 = none)."""
        d = self.design
        u = int(user_id)
        dev, part = self.request_context[u]
        topics, weights, taste = (interests if interests is not None else
                                  (self.interest_topics[u], self.interest_weights[u], self.interest_taste[u]))
        held = topics >= 0
        ctx_w = np.where(held, weights * np.exp(self.topic_affinity[np.maximum(topics, 0), dev, part]), 0.0)
        ctx_w = ctx_w / ctx_w.sum()
        mix = (1 - d.explore_prob) * (d.session_interest_prob * ctx_w + (1 - d.session_interest_prob) * weights)
        out = np.zeros(self.n_ads)
        elig = self.eligible(u)
        for j in np.flatnonzero(held):
            ads = np.flatnonzero((self.ad_topic == topics[j]) & elig)
            if ads.size == 0:
                continue
            logit = self.ad_latent[ads] @ taste[j] / d.tau + self.ad_quality[ads]
            p = np.exp(logit - logit.max())
            out[ads] += mix[j] * p / p.sum()
        pop = _topic_pop(d)
        other = np.ones(d.topics, bool)
        other[topics[held]] = False
        tp = np.where(other, pop, 0.0)
        tp = tp / tp.sum()
        eq = np.exp(self.ad_quality) * elig
        per_topic = np.bincount(self.ad_topic, weights=eq, minlength=d.topics)
        out += d.explore_prob * tp[self.ad_topic] * eq / np.maximum(per_topic[self.ad_topic], 1e-300)
        return out

    def estimated_interests(self, user_id, min_clicks: int = 2):
        """The user's interests as their training clicks show them, for :meth:`true_scores`:
        the (up to 4) topics they clicked at least ``min_clicks`` times, most clicked first (the
        most clicked alone where none was; a single click is as likely exploration), weights in
        proportion to those clicks, and each topic's taste the unit mean of its clicked ads'
        latents (which the ads' Gumbel-top-n draw pulls toward the true taste). Returns
        ``(topics [4], weights [4], taste [4, D])``; ValueError for a user without training clicks."""
        seen = self.seen_slots(user_id)
        if seen.size == 0:
            raise ValueError(f"user {user_id} has no training clicks to estimate interests from")
        clicked = self.ad_topic[seen]
        uniq, counts = np.unique(clicked, return_counts=True)
        order = np.argsort(-counts, kind="stable")  # ties: the lower topic first
        keep = [i for i in order if counts[i] >= min_clicks][:4] or [order[0]]
        topics = np.full(4, -1, np.int64)
        weights = np.zeros(4)
        taste = np.zeros((4, self.ad_latent.shape[1]))
        for j, i in enumerate(keep):
            topics[j], weights[j] = uniq[i], counts[i]
            taste[j] = _unit(self.ad_latent[seen[clicked == uniq[i]]].mean(axis=0))
        return topics, weights / weights.sum(), taste

    def describe(self) -> dict:
        ev = self.events
        n_train = int((~ev["heldout"]).sum())
        return {
            "users": self.n_users, "ads": self.n_ads, "topics": self.design.topics,
            "train_clicks": n_train, "heldout_clicks": int(ev["heldout"].sum()),
            "mean_interests_per_user": float((self.interest_topics >= 0).sum(1).mean()),
            "ads_with_rules": int(((self.ad_country_mask != (1 << self.design.countries) - 1)
                                   | (self.ad_age_mask != (1 << self.design.ages) - 1)
                                   | (self.ad_gender_excl >= 0)).sum()),
            "mean_eligible_fraction": float(self.eligible_matrix(self.users[:200]).mean()),
            "seed": self.seed,
        }

    @property
    def params(self) -> dict:
        return {"dataset": "multi_interest", "seed": self.seed, **asdict(self.design)}


def _topic_pop(d: WorldDesign) -> np.ndarray:
    p = 1.0 / np.arange(1, d.topics + 1) ** d.zipf
    return p / p.sum()


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _eligible_rows(world: "MultiInterestWorld", users: np.ndarray) -> np.ndarray:
    demo = world.demo[users]
    age, gender, country = demo[:, 0], demo[:, 1], demo[:, 2]
    ok = (world.ad_country_mask[None, :] >> country[:, None]) & 1
    ok &= (world.ad_age_mask[None, :] >> age[:, None]) & 1
    ok = ok.astype(bool) & (world.ad_gender_excl[None, :] != gender[:, None])
    return ok


def _bits_to_csr(masks: np.ndarray, width: int, full: int):
    """Per-ad bit masks -> include CSR (ads whose mask is ``full`` are unconstrained)."""
    rows, vals = [], []
    for v in range(width):
        sel = ((masks >> v) & 1).astype(bool) & (masks != full)
        rows.append(np.flatnonzero(sel))
        vals.append(np.full(sel.sum(), v))
    r = np.concatenate(rows)
    v = np.concatenate(vals)
    order = np.lexsort((v, r))
    r, v = r[order], v[order]
    ptr = np.zeros(masks.size + 1, np.int64)
    np.cumsum(np.bincount(r, minlength=masks.size), out=ptr[1:])
    return ptr, v.astype(np.int32)


def build_world(design: WorldDesign = WorldDesign(), seed: int = 0, progress: bool = False) -> MultiInterestWorld:
    """Generate the world (module docstring). Deterministic for a given ``(design, seed)``.

    Takes about 20-40 s at the default 50,000 x 50,000 size on one CPU core.
    """
    d = design
    rng = np.random.default_rng(seed)
    D, T = d.latent_dim, d.topics
    pop = _topic_pop(d)
    mu = _unit(rng.standard_normal((T, D)))
    aff = rng.standard_normal((T, d.devices, d.dayparts))

    # ---- ads -------------------------------------------------------------------------------
    ad_p = pop ** d.ads_topic_power
    ad_topic = rng.choice(T, size=d.n_ads, p=ad_p / ad_p.sum())
    z = _unit(mu[ad_topic] + d.ad_spread * rng.standard_normal((d.n_ads, D)) / np.sqrt(D))
    quality = d.quality_sd * rng.standard_normal(d.n_ads)
    full_c, full_a = (1 << d.countries) - 1, (1 << d.ages) - 1
    country_mask = np.full(d.n_ads, full_c, np.int64)
    has = rng.random(d.n_ads) < d.rule_country_prob
    for i in np.flatnonzero(has):
        picked = rng.choice(d.countries, min(rng.integers(1, 4), d.countries), replace=False)
        country_mask[i] = int(sum(1 << int(c) for c in picked))
    age_mask = np.full(d.n_ads, full_a, np.int64)
    has = rng.random(d.n_ads) < d.rule_age_prob
    for i in np.flatnonzero(has):
        picked = rng.choice(d.ages, min(rng.integers(2, 4), d.ages), replace=False)
        age_mask[i] = int(sum(1 << int(c) for c in picked))
    gender_excl = np.where(rng.random(d.n_ads) < d.rule_gender_prob, rng.integers(0, d.genders, d.n_ads), -1)

    schema = TargetingSchema([Category("age_bucket", d.ages), Category("gender", d.genders),
                              Category("country", d.countries)])
    g_rows = np.flatnonzero(gender_excl >= 0)
    g_ptr = np.zeros(d.n_ads + 1, np.int64)
    np.cumsum(gender_excl >= 0, out=g_ptr[1:])
    rules = TargetingRules.from_columns(
        schema, np.arange(d.n_ads, dtype=np.int64), None,
        include={"country": _bits_to_csr(country_mask, d.countries, full_c),
                 "age_bucket": _bits_to_csr(age_mask, d.ages, full_a)},
        exclude={"gender": (g_ptr, gender_excl[g_rows].astype(np.int32))})

    # ---- users -----------------------------------------------------------------------------
    U = d.n_users
    demo = np.stack([rng.integers(0, d.ages, U), rng.integers(0, d.genders, U),
                     rng.integers(0, d.countries, U)], axis=1).astype(np.int64)
    main_device = rng.integers(0, d.devices, U)
    seg_pref = pop[None, :] * np.exp(d.segment_tilt * rng.standard_normal((d.ages * d.genders, T)))
    seg_pref /= seg_pref.sum(axis=1, keepdims=True)
    seg = demo[:, 0] * d.genders + demo[:, 1]
    m = 1 + rng.binomial(3, 0.5, U)
    topics = np.full((U, 4), -1, np.int64)
    gumbel = -np.log(-np.log(rng.random((U, T))))
    ranked = np.argsort(-(np.log(seg_pref[seg]) + gumbel), axis=1)[:, :4]  # without replacement
    for j in range(4):
        topics[:, j] = np.where(j < m, ranked[:, j], -1)
    weights = rng.dirichlet(np.ones(4), U) * (topics >= 0)
    weights /= weights.sum(axis=1, keepdims=True)
    taste = _unit(mu[np.maximum(topics, 0)] + d.taste_spread * rng.standard_normal((U, 4, D)) / np.sqrt(D))

    # ---- sessions and the source of each click ------------------------------------------------
    S = rng.integers(d.min_sessions, d.max_sessions + 1, U)
    L = d.session_len
    n_clicks = S * L
    total = int(n_clicks.sum())
    user = np.repeat(np.arange(U), n_clicks)
    start = np.repeat(np.cumsum(n_clicks) - n_clicks, n_clicks)
    time = np.arange(total) - start
    session = time // L
    n_sess = int(S.sum())
    sess_user = np.repeat(np.arange(U), S)
    sess_dev = np.where(rng.random(n_sess) < d.main_device_prob, main_device[sess_user],
                        rng.integers(0, d.devices, n_sess))
    sess_part = rng.integers(0, d.dayparts, n_sess)
    w_ctx = weights[sess_user] * np.exp(aff[np.maximum(topics[sess_user], 0), sess_dev[:, None], sess_part[:, None]])
    w_ctx *= topics[sess_user] >= 0
    sess_int = _sample_rows(rng, w_ctx)
    gsess = (np.cumsum(S) - S)[user] + session  # global session index of each click
    r = rng.random(total)
    explore = r < d.explore_prob
    from_sess = (~explore) & (rng.random(total) < d.session_interest_prob)
    other = _sample_rows(rng, weights[user])
    interest = np.where(explore, -1, np.where(from_sess, sess_int[gsess], other))

    # ---- choose ads: interest clicks by Gumbel-top-n per (user, interest) -----------------
    ad = np.full(total, -1, np.int64)
    by_topic = [np.flatnonzero(ad_topic == t) for t in range(T)]
    sel = interest >= 0
    pair_key = user[sel] * 4 + interest[sel]
    idx_sel = np.flatnonzero(sel)
    order = np.argsort(pair_key, kind="stable")
    keys, starts, counts = np.unique(pair_key[order], return_index=True, return_counts=True)
    pair_user, pair_j = keys // 4, keys % 4
    pair_topic = topics[pair_user, pair_j]
    for t in range(T):
        pidx = np.flatnonzero(pair_topic == t)
        ads_t = by_topic[t]
        if pidx.size == 0:
            continue
        for chunk in np.array_split(pidx, max(1, pidx.size * max(ads_t.size, 1) // 4_000_000 + 1)):
            pu = pair_user[chunk]
            logit = taste[pu, pair_j[chunk]] @ z[ads_t].T / d.tau + quality[ads_t][None, :]
            elig = _eligible_rows_raw(demo[pu], country_mask[ads_t], age_mask[ads_t], gender_excl[ads_t])
            key = np.where(elig, logit - np.log(-np.log(rng.random(logit.shape))), -np.inf)
            need = counts[chunk]
            top = np.argsort(-key, axis=1)[:, : int(need.max())]
            for row, (ci, n) in enumerate(zip(chunk, need)):
                dest = idx_sel[order[starts[ci]: starts[ci] + n]]
                picked = top[row, :n]
                ok = np.isfinite(key[row, picked])
                ad[dest[: picked.size][ok]] = ads_t[picked[ok]]  # a small topic may run out of ads
    # exploration clicks: a topic the user does not hold (∝ pop), an eligible ad ∝ exp(quality)
    ex = np.flatnonzero(explore)
    tp = np.broadcast_to(pop, (ex.size, T)).copy()
    held_t = topics[user[ex]]
    for j in range(4):
        ok = held_t[:, j] >= 0
        tp[np.flatnonzero(ok), held_t[ok, j]] = 0.0
    ex_topic = _sample_rows(rng, tp)
    eq = np.exp(quality)
    for t in np.unique(ex_topic):
        rows = ex[ex_topic == t]
        ads_t = by_topic[t]
        if ads_t.size == 0:  # a topic without ads (a small world): its clicks find none, and are dropped
            continue
        elig = _eligible_rows_raw(demo[user[rows]], country_mask[ads_t], age_mask[ads_t], gender_excl[ads_t])
        w = elig * eq[ads_t][None, :]
        has = w.sum(axis=1) > 0
        pick = _sample_rows(rng, np.where(has[:, None], w, 1.0))
        ad[rows[has]] = ads_t[pick[has]]
    # drop clicks that found no eligible ad, and repeats (keep the first click of an ad)
    keep = ad >= 0
    first = np.zeros(total, bool)
    kk = np.flatnonzero(keep)
    _, fi = np.unique(user[kk] * d.n_ads + ad[kk], return_index=True)
    first[kk[fi]] = True
    keep &= first
    heldout = session == (S[user] - 1)
    dev = sess_dev[gsess]
    part = sess_part[gsess]
    events = {k: v[keep] for k, v in dict(user=user, ad=ad, time=time, session=session, device=dev,
                                           daypart=part, interest=interest, heldout=heldout).items()}
    last = np.cumsum(S) - 1
    request_context = np.stack([sess_dev[last], sess_part[last]], axis=1).astype(np.int64)

    world = MultiInterestWorld(
        design=d, seed=int(seed), schema=schema, rules=rules, ad_ids=np.arange(d.n_ads, dtype=np.int64),
        ad_topic=ad_topic.astype(np.int64), ad_latent=z, ad_quality=quality, topic_centroids=mu,
        topic_affinity=aff, demo=demo, main_device=main_device, interest_topics=topics,
        interest_weights=weights, interest_taste=taste, events=events,
        users=np.arange(U, dtype=np.int64), request_context=request_context,
        ad_country_mask=country_mask, ad_age_mask=age_mask, ad_gender_excl=gender_excl)
    ev = events
    tr = ~ev["heldout"]
    for uid, grp in _split_by(ev["user"][tr], ev["ad"][tr]):
        world._train_slots[int(uid)] = np.unique(grp)
    for uid, grp in _split_by(ev["user"][~tr], ev["ad"][~tr]):
        world._heldout[int(uid)] = grp.copy()
    world.users = np.array(sorted(u for u in world._heldout if world._heldout[u].size), dtype=np.int64)
    return world


def _eligible_rows_raw(demo, cmask, amask, gexcl):
    ok = (cmask[None, :] >> demo[:, 2:3]) & 1
    ok &= (amask[None, :] >> demo[:, 0:1]) & 1
    return ok.astype(bool) & (gexcl[None, :] != demo[:, 1:2])


def _sample_rows(rng, w: np.ndarray) -> np.ndarray:
    """One index per row, with probability proportional to the row's non-negative weights."""
    c = np.cumsum(w, axis=1)
    u = rng.random(w.shape[0]) * c[:, -1]
    return np.minimum((c < u[:, None]).sum(axis=1), w.shape[1] - 1)


def _split_by(keys, values):
    """Group ``values`` by runs of equal ``keys`` (keys sorted): yields ``(key, array)``."""
    if keys.size == 0:
        return
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    for k, grp in zip(keys[starts], np.split(values, starts[1:])):
        yield k, grp
