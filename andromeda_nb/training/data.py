"""Training data in one form for both worlds: per-user click sequences, user features, request
context, ad features, and what evaluation needs (held-out clicks, targeting, seen ads).

Features (the signal groups the user experts read; the same for both datasets):

================== =======================================================================
group              what it reads at request time
================== =======================================================================
demographics       static categorical user attributes (MovieLens: age bucket, gender,
                   occupation, region; synthetic: age bucket, gender, country, main device)
user_id            the user's id (a learned embedding)
long_term          the last ``hist_len`` (50) clicked ads before the request (mean of embeddings)
recent             the last 5 of them
last_item          the last one
category_profile   the category mix of the ``hist_len`` window (MovieLens: genres, multi-hot;
                   synthetic: the ad's topic)
================== =======================================================================

Request context (drives FiLM ``gamma``/``beta``, never the experts): MovieLens: daypart of the
request time (UTC hour // 6), weekend flag, and the user's activity in the previous 24 hours
(0, 1-4, 5-19, 20+ clicks); synthetic: the session's device and daypart. For a training click the
request is "just before that click" (its time and its own session); for evaluation it is the time /
session of the first held-out click. Only clicks strictly before the request enter any feature
(no leakage: the target click and everything after it are invisible to its own features).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

GROUPS = ("demographics", "user_id", "long_term", "recent", "last_item", "category_profile")
HIST_LEN = 50
RECENT = 5


@dataclass(eq=False)
class InteractionData:
    """Everything a model trains and is evaluated on (indices are rows / slots, not ids).

    Attributes:
        name: dataset name (``"multi_interest"`` or ``"ml-100k"``).
        user_ids: ``[n_users]`` int64 external user ids (row ``i`` is ``user_ids[i]``).
        ad_ids: ``[n_ads]`` int64 ad ids in table slot order.
        seq: ``[n_users, Lmax]`` int64 training clicks (slots) in time order, padded with ``n_ads``.
        seq_len: ``[n_users]`` int64.
        seq_ctx: ``[n_users, Lmax, n_ctx]`` int64 request context of each click.
        req_ctx: ``[n_users, n_ctx]`` int64 context of the evaluation request.
        ctx_cards: cardinality of each context feature.
        demo: ``[n_users, n_demo]`` int64; demo_cards: their cardinalities.
        ad_cats: ``[n_ads, n_cats]`` float32 ad category membership.
        popularity: ``[n_ads]`` training clicks per ad.
        eval_rows: ``[n_eval]`` rows of users with held-out clicks.
        heldout: row -> int64 slots of held-out clicks.
        world: the source world (targeting lives there).
        seq_start: ``[n_users, Lmax]`` int64 position of each training click's session's first
            click (pad: 0), or None where the data has no sessions (MovieLens-100K).
    """

    name: str
    user_ids: np.ndarray
    ad_ids: np.ndarray
    seq: np.ndarray
    seq_len: np.ndarray
    seq_ctx: np.ndarray
    req_ctx: np.ndarray
    ctx_cards: tuple
    demo: np.ndarray
    demo_cards: tuple
    ad_cats: np.ndarray
    popularity: np.ndarray
    eval_rows: np.ndarray
    heldout: dict
    world: object = field(repr=False)
    category_names: tuple = ()
    seq_start: np.ndarray | None = field(default=None, repr=False)

    @property
    def n_users(self) -> int:
        return int(self.user_ids.size)

    @property
    def n_ads(self) -> int:
        return int(self.ad_ids.size)

    @property
    def n_train(self) -> int:
        return int(self.seq_len.sum())

    def row_of(self, user_id) -> int:
        row = int(np.searchsorted(self.user_ids, int(user_id)))
        if row >= self.n_users or self.user_ids[row] != int(user_id):
            raise KeyError(f"unknown user id {user_id!r}")
        return row

    def resolve_split(self, split: str = "auto") -> str:
        """``split`` itself (``"click"`` or ``"session"``), or for ``"auto"`` the session where these
        data have sessions (``seq_start``: the synthetic world), else the click. The session is the
        default there because it asks what the held-out part asks (a new session): at preset full
        the ranking model's session-split choice did 0.38 point better held out than the preset's
        settings, where the last click's choices did 0.8 worse (docs/design.md)."""
        if split == "auto":
            return "click" if self.seq_start is None else "session"
        if split not in ("click", "session"):
            raise ValueError(f"split must be 'auto', 'click' or 'session', got {split!r}")
        return split

    def held_back_start(self, split: str = "auto") -> np.ndarray:
        """Where each row's validation clicks begin (the split of the tuning, the baselines' too:
        :func:`~andromeda_nb.training.tuning.validation_view`): ``"click"``, the user's last
        training click; ``"session"``, the first click of the user's last training session (data
        with sessions only); ``"auto"``: :meth:`resolve_split`. -1 where no training click would
        stay before it."""
        split = self.resolve_split(split)
        L = self.seq_len
        if split == "click":
            start = L - 1
        elif split == "session":
            if self.seq_start is None:
                raise ValueError(f"split='session' needs sessions, which {self.name} does not have")
            start = self.seq_start[np.arange(self.n_users), np.maximum(L - 1, 0)]
        return np.where((L >= 1) & (start >= 1), start, -1).astype(np.int64)

    def events(self) -> tuple[np.ndarray, np.ndarray]:
        """Every training click as ``(row, t)``: the target is ``seq[row, t]``."""
        rows = np.repeat(np.arange(self.n_users), self.seq_len)
        t = np.arange(rows.size) - np.repeat(np.cumsum(self.seq_len) - self.seq_len, self.seq_len)
        return rows, t

    def batch(self, rows: np.ndarray, t: np.ndarray | None = None, session: bool = False) -> dict:
        """Request features of users ``rows`` just before click ``t`` (None: the evaluation request,
        after every training click); ``session``: just before the session of click ``t`` began
        (its history ends at the session's first click; needs ``seq_start``). Returns numpy arrays:
        ``user, demo, hist [B, HIST_LEN]`` (right-aligned, pad = n_ads), ``ctx``."""
        rows = np.asarray(rows, dtype=np.int64)
        if t is None:
            if session:
                raise ValueError("session=True takes training clicks' positions t; the evaluation request "
                                 "(t=None) comes after every training click")
            t = self.seq_len[rows]
            ctx = self.req_ctx[rows]
        else:
            t = np.asarray(t, dtype=np.int64)
            ctx = self.seq_ctx[rows, t]  # one context a session: its first click's
            if session:
                if self.seq_start is None:
                    raise ValueError(f"{self.name} has no sessions (seq_start is None)")
                if (t < 0).any() or (t >= self.seq_len[rows]).any():
                    raise ValueError("session=True takes training clicks' positions (0 <= t < seq_len): past "
                                     "them no session has begun")
                t = self.seq_start[rows, t]
        pos = t[:, None] - HIST_LEN + np.arange(HIST_LEN)[None, :]
        hist = np.where(pos >= 0, self.seq[rows[:, None], np.maximum(pos, 0)], self.n_ads)
        return {"user": rows, "demo": self.demo[rows], "hist": hist, "ctx": ctx}

    def unseen(self, rows: np.ndarray) -> np.ndarray:
        """``[len(rows), n_ads]`` bool: every ad but the user's training clicks (no targeting)."""
        rows = np.asarray(rows, dtype=np.int64)
        mask = np.ones((rows.size, self.n_ads), bool)
        for i, r in enumerate(rows):
            mask[i, self.seq[r, : self.seq_len[r]]] = False
        return mask

    def eligible(self, rows: np.ndarray, exclude_seen: bool = True) -> np.ndarray:
        """``[len(rows), n_ads]`` bool: targeting match, minus the user's training clicks."""
        rows = np.asarray(rows, dtype=np.int64)
        w = self.world
        if hasattr(w, "eligible_matrix"):
            mask = w.eligible_matrix(self.user_ids[rows])
        else:
            mask = np.stack([w.eligible(int(u)) for u in self.user_ids[rows]])
        if exclude_seen:
            for i, r in enumerate(rows):
                s = self.seq[r, : self.seq_len[r]]
                mask[i, s] = False
        return mask


def _pad(seqs: list, n_ads: int) -> tuple[np.ndarray, np.ndarray]:
    lens = np.array([len(s) for s in seqs], dtype=np.int64)
    out = np.full((len(seqs), max(1, int(lens.max()) + 1)), n_ads, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out, lens


def from_multi_interest(world) -> InteractionData:
    """Training data of a :class:`~andromeda_nb.datasets.multi_interest.MultiInterestWorld`."""
    ev = world.events
    d = world.design
    tr = ~ev["heldout"]
    U, A = world.design.n_users, world.n_ads
    user, ad = ev["user"][tr], ev["ad"][tr]
    ctx = np.stack([ev["device"][tr], ev["daypart"][tr]], axis=1)
    starts = np.searchsorted(user, np.arange(U + 1))
    lens = np.diff(starts)
    Lmax = int(lens.max()) + 1
    seq = np.full((U, Lmax), A, np.int64)
    seq_ctx = np.zeros((U, Lmax, 2), np.int64)
    t = np.arange(user.size) - starts[user]
    seq[user, t] = ad
    seq_ctx[user, t] = ctx
    # each click's session's first position: a user's clicks are in time order, a session's contiguous
    sess = ev["session"][tr]
    first = np.r_[True, (user[1:] != user[:-1]) | (sess[1:] != sess[:-1])]
    seq_start = np.zeros((U, Lmax), np.int64)
    seq_start[user, t] = t[np.maximum.accumulate(np.where(first, np.arange(user.size), 0))]
    seq_ctx[np.arange(U), lens] = world.request_context
    heldout = {int(u): world.heldout(u) for u in world.users}
    demo = np.concatenate([world.demo, world.main_device[:, None]], axis=1)
    cats = np.zeros((A, d.topics), np.float32)
    cats[np.arange(A), world.ad_topic] = 1.0
    return InteractionData(
        name="multi_interest", user_ids=np.arange(U, dtype=np.int64), ad_ids=world.ad_ids.copy(),
        seq=seq, seq_len=lens.astype(np.int64), seq_ctx=seq_ctx, req_ctx=world.request_context.copy(),
        ctx_cards=(d.devices, d.dayparts), demo=demo.astype(np.int64),
        demo_cards=(d.ages, d.genders, d.countries, d.devices), ad_cats=cats,
        popularity=np.bincount(ad, minlength=A).astype(np.float64),
        eval_rows=world.users.copy(), heldout=heldout, world=world,
        category_names=tuple(f"topic_{i}" for i in range(d.topics)), seq_start=seq_start)


def _ml_context(ts: np.ndarray, prev_ts: np.ndarray) -> np.ndarray:
    """MovieLens request context of a request at time ``ts`` with the user's earlier click times
    ``prev_ts`` (sorted): (daypart, weekend, activity bucket of the previous 24 hours)."""
    hour = (ts // 3600) % 24
    day = (ts // 86400 + 4) % 7  # 1970-01-01 was a Thursday: 0 = Monday
    n24 = np.searchsorted(prev_ts, ts, side="left") - np.searchsorted(prev_ts, ts - 86400, side="left")
    act = np.digitize(n24, [1, 5, 20])
    return np.stack([hour // 6, (day >= 5).astype(np.int64), act], axis=1).astype(np.int64)


def from_movielens(world, ml, split) -> InteractionData:
    """Training data of a :class:`~andromeda_nb.datasets.movielens.MovieLensWorld` (its ``ml`` and
    ``split``): the training interactions in ``(timestamp, item_id)`` order per user."""
    from ..datasets.movielens import item_genres

    user_ids = world.user_ids
    ad_ids = world.table.ad_ids
    A = ad_ids.size
    train = split.train.sort_values(["user_id", "timestamp", "item_id"], kind="mergesort")
    tu = np.searchsorted(user_ids, train["user_id"].to_numpy(np.int64))
    ti = world.table.slots_of(train["item_id"].to_numpy(np.int64))
    ts = train["timestamp"].to_numpy(np.int64)
    U = user_ids.size
    starts = np.searchsorted(tu, np.arange(U + 1))
    lens = np.diff(starts)
    Lmax = int(lens.max()) + 1
    seq = np.full((U, Lmax), A, np.int64)
    seq_ctx = np.zeros((U, Lmax, 3), np.int64)
    req_ctx = np.zeros((U, 3), np.int64)
    held = split.heldout.sort_values(["user_id", "timestamp", "item_id"], kind="mergesort")
    first_held = held.groupby("user_id")["timestamp"].min()
    for r in range(U):
        s, e = starts[r], starts[r + 1]
        seq[r, : e - s] = ti[s:e]
        seq_ctx[r, : e - s] = _ml_context(ts[s:e], ts[s:e])
        uid = int(user_ids[r])
        # no held-out click: a request just after the last training click
        when = int(first_held.get(uid, ts[e - 1] + 1 if e > s else 0))
        req_ctx[r] = _ml_context(np.array([when]), ts[s:e])[0]
    seq_ctx[np.arange(U), lens] = req_ctx
    heldout = {}
    for uid in world.users:
        heldout[int(np.searchsorted(user_ids, uid))] = world.table.slots_of(world.heldout(uid))
    genres, IG = item_genres(ml.items)
    pos = np.searchsorted(ml.items["item_id"].to_numpy(np.int64), ad_ids)
    cats = IG[pos].astype(np.float32)
    demo = world.profile_values.astype(np.int64)
    cards = tuple(int(demo[:, j].max()) + 1 for j in range(demo.shape[1]))
    cards = (7, 2, max(cards[2], len(world.occupations)), 11)
    return InteractionData(
        name="ml-100k", user_ids=user_ids.copy(), ad_ids=ad_ids.copy(), seq=seq, seq_len=lens.astype(np.int64),
        seq_ctx=seq_ctx, req_ctx=req_ctx, ctx_cards=(4, 2, 4), demo=demo, demo_cards=cards, ad_cats=cats,
        popularity=np.bincount(ti, minlength=A).astype(np.float64),
        eval_rows=np.array(sorted(heldout), dtype=np.int64), heldout=heldout, world=world,
        category_names=tuple(genres))
