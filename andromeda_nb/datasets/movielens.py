"""MovieLens-100K mapped onto the ads world (real data for the quality experiments).

Data
----
The 100,000 ratings of 943 users on 1,682 movies (GroupLens, Harper & Konstan 2015), taken from the
atomic files shipped inside the ``recbole==1.2.1`` wheel on PyPI (:func:`fetch`): tab-separated with
typed headers (``user_id:token``); :func:`load` strips the ``:type`` suffixes.

Every rating, whatever its value, is treated as an **implicit positive** ("the user chose to watch
this"), the usual protocol for retrieval on MovieLens; the rating value is kept but never used.

Split (:func:`split`)
---------------------
Per user, interactions sorted by ``(timestamp, item_id)``; the last ``holdout_fraction`` of them
(``floor(fraction * n)``, at least 1) are held out, the rest are training. If holding out would leave
fewer than ``min_train`` training interactions, fewer are held out (possibly none: such a user is not
evaluated). Every held-out interaction is at or after every training interaction of its user.
**No leakage**: targeting profiles, rules, the embeddings, the expert vectors and the biases read
the training interactions only (plus the static user and item attributes).

Ads world (:func:`build_world`)
-------------------------------
Ads are movies: ``ad_id = item_id``, slot order = sorted item id.

Targeting schema (values are integer codes):

================  ======  ==========================================================
category          values  meaning
================  ======  ==========================================================
age_bucket        7       <18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+ (the MovieLens-1M buckets)
gender            2       sorted codes: F = 0, M = 1
occupation        21      the distinct occupations, sorted
region            11      first digit of the zip code 0-9; 10 = non-numeric zip ("other")
genre_interest    19      MULTI-valued; the genres, sorted (``"unknown"`` last)
================  ======  ==========================================================

A user's profile holds their demographic values and, as ``genre_interest``, their top 3 genres by
count among their *training* interactions (ties to the lower genre id; genres with count 0 are not
held, so a user may hold fewer than 3).

Rule design (:class:`RuleDesign`, fixed before looking at any held-out number). Rules are derived from
each ad's real audience: the users who watched it in the *training* interactions. Only ads with at
least ``min_viewers = 20`` training viewers get rules (the others are unconstrained):

- ``age_bucket`` include = buckets holding >= 5% of the ad's training audience, only if that drops
  at least one of the 7 buckets;
- ``gender`` exclude = a gender holding < 10% of the audience;
- ``region`` include = regions holding >= 3% of the audience, only if that drops at least one of
  the 11 regions;
- ``genre_interest`` include = the ad's own genres, only if >= 60% of its training audience hold one
  of them as an interest;
- ``occupation``: never constrained (a category no ad constrains is legal; the index skips it).

``world.rule_counts`` reports how many ads carry each rule kind, and
:func:`eligible_fraction_of_heldout` the share of each user's held-out positives that pass targeting
(the ceiling recall can reach).

Placeholder model (until a training issue replaces it)
------------------------------------------------------
``X`` = the binarised training user x item matrix, each user row L2-normalised (``1/sqrt(n_u)``).
Its truncated SVD ``X ~ U_r S_r W_r^T`` with ``r = d // 2`` factors gives item factors
``q_i = c * W_r[i] * sqrt(S_r)`` and user factors ``p_u = U_r[u] * sqrt(S_r) / c`` (so ``p q^T``
still approximates ``X``), where ``c`` makes the root-mean-square norm of the item factors of
trained items 1 (items without training viewers have ``q = 0``). Signs are fixed (each component's
largest-magnitude item loading is positive) so the result is deterministic.

The table is **exact** for the model of docs/design.md with ``gamma = 1``, ``beta = 0`` (``h = relu(a)``): ad row
``a = [relu(q), relu(-q)]`` (length ``d = 2r``, non-negative, so ``h = a``) and, for a user-side
vector ``u`` of length ``r``, the value / gate vector ``[u, -u]``, so ``dot([u, -u], h) = dot(u, q)``.

Experts (one signal group each; E = ``experts`` takes the first E of this list)::

    e0 long_term    mean q over all the user's training items
    e1 recent       mean q over the user's last 10 training items (by (timestamp, item_id))
    e2 demographic  mean p over the training users sharing the user's age_bucket and gender
    e3 genre_1      mean q over the user's training items of their top genre
    e4 genre_2      same, 2nd genre
    e5 popularity   the popularity prior: mean q over all training interactions (same for all)
    e6 genre_3      same as e3, 3rd genre
    e7 occupation   mean p over the training users sharing the user's occupation

A genre expert whose genre the user lacks falls back to e0. Each expert vector ``u_e`` is scaled to
unit L2 norm (a zero vector stays zero), so experts compete on direction, not on how many items
they average. Value vectors ``V[e] = [u_e, -u_e]``; gate keys ``G[e] = g * [u_e, -u_e]`` with
``g = sqrt(d) / gate_temperature``, so the gate logit is ``logit[e] = dot(u_e, q) / gate_temperature``:
an ad routes to the experts whose interest it matches best. Score::

    score = sum_{e in top-K by logit} softmax(logit)[e] * dot(u_e, q) + b,
    b     = bias_weight * log(1 + training viewers of the ad)

Scores are O(1) (``|dot(u_e, q)| <= |q|``, about 1), table values are at most a few units, so
every storage dtype (fp16 included) is safe. Everything is deterministic (no random numbers are
drawn; ``seed`` is recorded for the result tables).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .. import reference
from ..analysis.metrics import check_ks, mean_recall
from ..arguments import is_int
from ..model import AdTable, Request
from ..targeting import Category, TargetingRules, TargetingSchema, make_profile

RECBOLE_VERSION = "1.2.1"
FILES = ("ml-100k.inter", "ml-100k.user", "ml-100k.item")
_WHEEL_DIR = "recbole/dataset_example/ml-100k"

#: MovieLens-1M age buckets: lower edges of buckets 1..6 (bucket 0 is < 18).
AGE_EDGES = (18, 25, 35, 45, 50, 56)
AGE_LABELS = ("<18", "18-24", "25-34", "35-44", "45-49", "50-55", "56+")
#: Region codes: first zip digit 0-9, and this code for a non-numeric zip.
REGION_OTHER = 10
#: Expert signal groups, in the order ``experts = E`` takes them.
EXPERT_SIGNALS = ("long_term", "recent", "demographic", "genre_1", "genre_2", "popularity", "genre_3", "occupation")
RECENT_ITEMS = 10
INTEREST_GENRES = 3


# ----------------------------------------------------------------------------------------------
# fetch / load / split


def fetch(data_dir="data/ml-100k") -> Path:
    """Make sure the three MovieLens-100K atomic files are in ``data_dir``; download them if not.

    If any of ``ml-100k.inter``, ``ml-100k.user``, ``ml-100k.item`` is missing, runs
    ``python -m pip download recbole==1.2.1 --no-deps`` into a temporary folder (about 2 MB from
    PyPI), and extracts exactly ``recbole/dataset_example/ml-100k/ml-100k.{inter,user,item}`` from
    the wheel into ``data_dir`` (flat). Each file is written under a temporary name and renamed, so
    a concurrent or interrupted fetch never leaves a half-written file.

    Args:
        data_dir: folder; relative paths are relative to the current working directory.

    Returns:
        The folder as a :class:`pathlib.Path`.

    Raises:
        RuntimeError: pip failed (no network, no PyPI access: the message carries pip's output) or
            the wheel lacks the files.
    """
    path = Path(data_dir)
    if all((path / f).is_file() for f in FILES):
        return path
    path.mkdir(parents=True, exist_ok=True)
    print(f"fetching MovieLens-100K into {path} (the recbole {RECBOLE_VERSION} wheel, about 2 MB)", file=sys.stderr,
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", f"recbole=={RECBOLE_VERSION}", "--no-deps", "-d", tmp]
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        except (subprocess.CalledProcessError, OSError) as exc:
            out = (getattr(exc, "stdout", "") or "") + (getattr(exc, "stderr", "") or "")
            raise RuntimeError(
                f"could not download MovieLens-100K: `{' '.join(cmd)}` failed ({exc}).\n"
                f"pip said:\n{out[-3000:]}\n"
                f"Either give this machine access to PyPI, or copy {', '.join(FILES)} into {path.resolve()}"
            ) from exc
        wheels = sorted(Path(tmp).glob("recbole-*.whl"))
        if not wheels:
            raise RuntimeError(f"pip download produced no recbole wheel in {tmp}")
        with zipfile.ZipFile(wheels[0]) as zf:
            for name in FILES:
                member = f"{_WHEEL_DIR}/{name}"
                try:
                    data = zf.read(member)
                except KeyError:
                    raise RuntimeError(f"{wheels[0].name} lacks {member}") from None
                part = path / f".{name}.{os.getpid()}.part"
                part.write_bytes(data)
                os.replace(part, path / name)
    return path


@dataclass(frozen=True, eq=False)
class MovieLens:
    """The raw tables.

    Attributes:
        interactions: ``user_id`` int64, ``item_id`` int64, ``rating`` float64 (1-5, unused),
            ``timestamp`` int64 (Unix seconds); sorted by ``(user_id, timestamp, item_id)``.
        users: ``user_id`` int64, ``age`` int64 (years), ``gender`` str (F / M), ``occupation`` str,
            ``zip_code`` str; sorted by user id.
        items: ``item_id`` int64, ``movie_title`` str, ``release_year`` Int64 (nullable),
            ``class`` str (genres, space-separated); sorted by item id.
    """

    interactions: pd.DataFrame
    users: pd.DataFrame
    items: pd.DataFrame


def _read(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, quoting=csv.QUOTE_NONE)
    frame.columns = [c.split(":", 1)[0] for c in frame.columns]
    return frame


def load(data_dir="data/ml-100k", download: bool = False) -> MovieLens:
    """Read the three atomic files of :func:`fetch` into a :class:`MovieLens`.

    Args:
        data_dir: folder holding ``ml-100k.{inter,user,item}`` (relative to the working directory).
        download: call :func:`fetch` first.

    Raises:
        FileNotFoundError: a file is missing (call :func:`fetch`, or pass ``download=True``).
        ValueError: a file lacks an expected column.
    """
    path = fetch(data_dir) if download else Path(data_dir)
    for name in FILES:
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path / name} not found; run andromeda_nb.datasets.movielens.fetch({str(path)!r})")
    inter, users, items = (_read(path / name) for name in FILES)
    need = {
        "ml-100k.inter": (inter, {"user_id", "item_id", "rating", "timestamp"}),
        "ml-100k.user": (users, {"user_id", "age", "gender", "occupation", "zip_code"}),
        "ml-100k.item": (items, {"item_id", "movie_title", "release_year", "class"}),
    }
    for name, (frame, cols) in need.items():
        missing = cols - set(frame.columns)
        if missing:
            raise ValueError(f"{path / name} lacks columns {sorted(missing)}")
    inter = pd.DataFrame({
        "user_id": pd.to_numeric(inter["user_id"]).astype(np.int64),
        "item_id": pd.to_numeric(inter["item_id"]).astype(np.int64),
        "rating": pd.to_numeric(inter["rating"]).astype(np.float64),
        "timestamp": pd.to_numeric(inter["timestamp"]).astype(np.int64),
    }).sort_values(["user_id", "timestamp", "item_id"], kind="mergesort").reset_index(drop=True)
    users = users.assign(
        user_id=pd.to_numeric(users["user_id"]).astype(np.int64),
        age=pd.to_numeric(users["age"]).astype(np.int64),
    ).sort_values("user_id", kind="mergesort").reset_index(drop=True)
    items = items.assign(
        item_id=pd.to_numeric(items["item_id"]).astype(np.int64),
        release_year=pd.to_numeric(items["release_year"], errors="coerce").astype("Int64"),
    ).sort_values("item_id", kind="mergesort").reset_index(drop=True)
    return MovieLens(interactions=inter, users=users, items=items)


@dataclass(frozen=True, eq=False)
class Split:
    """A per-user temporal split. ``train`` and ``heldout`` have the interaction columns and are
    sorted by ``(user_id, timestamp, item_id)``; they partition the interactions."""

    train: pd.DataFrame
    heldout: pd.DataFrame
    holdout_fraction: float
    min_train: int


def split(ml: MovieLens, holdout_fraction: float = 0.2, min_train: int = 5) -> Split:
    """Per-user temporal split (every rating an implicit positive).

    Each user's interactions are sorted by ``(timestamp, item_id)``; the last
    ``max(1, floor(holdout_fraction * n))`` are held out, capped so that at least ``min_train``
    stay in training (a user with ``n <= min_train`` holds out nothing).

    Args:
        ml: from :func:`load`.
        holdout_fraction: in ``(0, 1)``.
        min_train: ``>= 1``.

    Raises:
        ValueError: a parameter out of range.
    """
    if (isinstance(holdout_fraction, (bool, np.bool_)) or not isinstance(holdout_fraction, (int, float, np.number))
            or not 0.0 < holdout_fraction < 1.0):
        raise ValueError(f"holdout_fraction must be a number in (0, 1), got {holdout_fraction!r}")
    if int(min_train) != min_train or min_train < 1:
        raise ValueError(f"min_train must be an int >= 1, got {min_train!r}")
    df = ml.interactions.sort_values(["user_id", "timestamp", "item_id"], kind="mergesort").reset_index(drop=True)
    groups = df.groupby("user_id", sort=False)
    pos = groups.cumcount().to_numpy()
    n = groups["item_id"].transform("size").to_numpy()
    n_hold = np.maximum(1, np.floor(holdout_fraction * n + 1e-9).astype(np.int64))
    n_hold = np.minimum(n_hold, np.maximum(n - int(min_train), 0))
    hold = pos >= n - n_hold
    return Split(
        train=df[~hold].reset_index(drop=True),
        heldout=df[hold].reset_index(drop=True),
        holdout_fraction=float(holdout_fraction),
        min_train=int(min_train),
    )


# ----------------------------------------------------------------------------------------------
# the world


@dataclass(frozen=True)
class RuleDesign:
    """Thresholds of the audience-derived targeting rules (see the module docstring)."""

    min_viewers: int = 20
    age_min_share: float = 0.05
    gender_min_share: float = 0.10
    region_min_share: float = 0.03
    genre_min_coverage: float = 0.60


def age_bucket(age) -> np.ndarray:
    """MovieLens-1M age bucket codes ``0..6`` (<18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+)."""
    return np.searchsorted(np.array(AGE_EDGES), np.asarray(age), side="right").astype(np.int64)


def region_code(zip_codes) -> np.ndarray:
    """First digit of each zip code (0-9), or :data:`REGION_OTHER` (10) if it is not a digit."""
    first = pd.Series(list(zip_codes), dtype=str).str[:1]
    return np.where(first.str.isdigit(), pd.to_numeric(first, errors="coerce").fillna(-1), REGION_OTHER).astype(np.int64)


def item_genres(items: pd.DataFrame) -> tuple[tuple[str, ...], np.ndarray]:
    """``(genres, matrix)``: the sorted distinct genres and the ``[n_items, n_genres]`` bool
    membership matrix (rows in the order of ``items``)."""
    tokens = [str(c).split() for c in items["class"]]
    genres = tuple(sorted({g for t in tokens for g in t}))
    pos = {g: j for j, g in enumerate(genres)}
    mat = np.zeros((len(tokens), len(genres)), dtype=bool)
    for i, t in enumerate(tokens):
        mat[i, [pos[g] for g in t]] = True
    return genres, mat


def _csr_from_mask(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[n, m]`` bool -> CSR ``(indptr int64[n+1], values int32)`` of the True columns per row."""
    rows, cols = np.nonzero(mask)
    ptr = np.zeros(mask.shape[0] + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=mask.shape[0]), out=ptr[1:])
    return ptr, cols.astype(np.int32)


def _unit(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


def _group_mean(values: np.ndarray, keys: np.ndarray, member: np.ndarray) -> np.ndarray:
    """Per row, the mean of ``values`` over the member rows sharing its key."""
    uniq, inv = np.unique(keys, return_inverse=True)
    sums = np.zeros((uniq.size, values.shape[1]))
    np.add.at(sums, inv[member], values[member])
    counts = np.bincount(inv[member], minlength=uniq.size)[:, None]
    means = np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)
    return means[inv]


def match_columns(rules: TargetingRules, profile) -> np.ndarray:
    """Vectorised targeting match ``[n_ads]`` bool straight from the CSR columns (same semantics as
    :func:`andromeda_nb.reference.match`, which the tests compare it with; no Python loop per ad).

    Args:
        rules: the pool's rules.
        profile: ``{category: frozenset}`` from :func:`andromeda_nb.targeting.make_profile`.
    """
    n = rules.n_ads
    ok = np.asarray(rules.live, dtype=bool).copy()
    for kind, csr in (("include", rules.include), ("exclude", rules.exclude)):
        for name, (ptr, vals) in csr.items():
            if ptr[-1] == 0:
                continue
            user = np.fromiter(profile.get(name, frozenset()), dtype=np.int64)
            slots = np.repeat(np.arange(n), np.diff(ptr))
            hit = np.bincount(slots[np.isin(vals, user)], minlength=n) > 0
            if kind == "include":
                ok &= (np.diff(ptr) == 0) | hit
            else:
                ok &= ~hit
    return ok


@dataclass(eq=False)
class MovieLensWorld:
    """MovieLens mapped onto the ads world (build with :func:`build_world`; see the module docstring).

    Attributes:
        schema: the targeting schema (5 categories).
        table: :class:`AdTable` of the movies (``ad_id = item_id``, sorted), in ``dtype``.
        rules: :class:`TargetingRules` in slot order.
        users: ``[n_eval]`` int64 user ids with at least one held-out item (the evaluated users).
        user_ids: ``[n_users]`` int64, every user (sorted); rows of the per-user arrays below.
        item_factors: ``[n_ads, r]`` float64 item factors ``q`` (the table is built from them).
        user_factors: ``[n_users, r]`` float64 user factors ``p``.
        expert_vectors: ``[n_users, E, r]`` float64 unit-norm expert vectors ``u_e``.
        expert_names: the E signal names (:data:`EXPERT_SIGNALS` prefix).
        gate_scale: ``g``: ``G[e] = g * [u_e, -u_e]``, ``g = sqrt(d) / gate_temperature``.
        k_experts: default number of active experts of :meth:`request`.
        genres, occupations: value labels of ``genre_interest`` and ``occupation``.
        rule_counts: ads carrying each rule kind (and ``"any"``).
        profile_values: ``[n_users, 4]`` int64 codes of age_bucket, gender, occupation, region.
        interests: ``[n_users, 3]`` int64 top genres (``-1`` = none).
        popularity: ``[n_ads]`` int64 training viewers per ad.
        params: the build parameters (for result tables).
    """

    schema: TargetingSchema
    table: AdTable
    rules: TargetingRules
    users: np.ndarray
    user_ids: np.ndarray
    item_factors: np.ndarray
    user_factors: np.ndarray
    expert_vectors: np.ndarray
    expert_names: tuple
    gate_scale: float
    k_experts: int
    genres: tuple
    occupations: tuple
    rule_counts: dict
    profile_values: np.ndarray
    interests: np.ndarray
    popularity: np.ndarray
    params: dict
    _train_slots: dict = field(repr=False, default_factory=dict)
    _heldout: dict = field(repr=False, default_factory=dict)
    _n_train: int = 0
    _n_heldout: int = 0

    def _row(self, user_id) -> int:
        uid = int(user_id)
        row = int(np.searchsorted(self.user_ids, uid))
        if row >= self.user_ids.size or self.user_ids[row] != uid:
            raise KeyError(f"unknown user id {user_id!r}")
        return row

    @property
    def d(self) -> int:
        """Embedding dimension of the table (``2 * r``)."""
        return self.table.d

    @property
    def experts(self) -> int:
        """E, the number of experts of every request."""
        return self.expert_vectors.shape[1]

    def request(self, user_id, k_experts: int | None = None) -> Request:
        """The user's :class:`Request`: ``V[e] = [u_e, -u_e]``, ``G[e] = gate_scale * V[e]``,
        ``gamma = 1``, ``beta = 0`` (float32). ``k_experts`` defaults to the world's.

        Raises:
            KeyError: unknown user.
        """
        u = self.expert_vectors[self._row(user_id)]
        V = np.concatenate([u, -u], axis=1)
        d = V.shape[1]
        return Request(
            V=V, G=self.gate_scale * V, gamma=np.ones(d), beta=np.zeros(d),
            k_experts=self.k_experts if k_experts is None else k_experts,
        )

    def profile(self, user_id) -> dict:
        """The user's targeting profile ``{category: frozenset}`` (from :func:`make_profile`)."""
        row = self._row(user_id)
        age, gender, occ, region = (int(v) for v in self.profile_values[row])
        interests = [int(g) for g in self.interests[row] if g >= 0]
        return make_profile(self.schema, {
            "age_bucket": age, "gender": gender, "occupation": occ, "region": region,
            "genre_interest": interests,
        })

    def heldout(self, user_id) -> np.ndarray:
        """``[n]`` int64 ad ids of the user's held-out positives (distinct, temporal order)."""
        self._row(user_id)
        return self._heldout.get(int(user_id), np.zeros(0, np.int64)).copy()

    def seen_slots(self, user_id) -> np.ndarray:
        """``[n]`` int64 sorted slots of the user's training items (exclude them from retrieval)."""
        self._row(user_id)
        return self._train_slots.get(int(user_id), np.zeros(0, np.int64)).copy()

    def eligible(self, user_id, exclude_seen: bool = False) -> np.ndarray:
        """``[n_ads]`` bool: ads passing the user's targeting (:func:`match_columns`), and not
        among the user's training items if ``exclude_seen``."""
        mask = match_columns(self.rules, self.profile(user_id))
        if exclude_seen:
            mask[self.seen_slots(user_id)] = False
        return mask

    def describe(self) -> dict:
        """Counts for the notebook (flat dict of ints / strs / floats)."""
        out = {
            "users": int(self.user_ids.size),
            "eval_users": int(self.users.size),
            "ads": int(self.table.n_ads),
            "train_interactions": int(self._n_train),
            "heldout_interactions": int(self._n_heldout),
            "d": int(self.d),
            "factors": int(self.item_factors.shape[1]),
            "experts": int(self.experts),
            "k_experts": int(self.k_experts),
            "dtype": self.table.dtype,
            "categories": len(self.schema),
        }
        out.update({f"ads_with_rule_{k}": int(v) for k, v in self.rule_counts.items()})
        return out


def build_world(
    ml: MovieLens,
    split: Split,
    d: int = 64,
    experts: int = 4,
    k_experts: int = 2,
    seed: int = 0,
    dtype: str = "fp32",
    rule_design: RuleDesign = RuleDesign(),
    gate_temperature: float = 0.25,
    bias_weight: float = 0.02,
) -> MovieLensWorld:
    """Map MovieLens onto the ads world (module docstring: schema, rule design, placeholder model).

    Reads ``ml.users``, ``ml.items`` and ``split.train`` only: held-out rows influence nothing but
    :meth:`MovieLensWorld.heldout` and ``world.users``.

    Args:
        ml: from :func:`load`.
        split: from :func:`split`.
        d: embedding dimension of the table, even, ``2 <= d <= 2 * min(n_users, n_items)``
            (``r = d // 2`` SVD factors).
        experts: E in ``1..8`` (:data:`EXPERT_SIGNALS` prefix).
        k_experts: default K of :meth:`MovieLensWorld.request`, ``1..E``.
        seed: recorded in ``world.params``; the build draws no random numbers (it is deterministic).
        dtype: storage dtype of the table (``fp32``, ``fp16``, ``bf16``, ``int8``).
        rule_design: targeting rule thresholds.
        gate_temperature: ``T > 0`` in ``logit[e] = dot(u_e, q) / T``.
        bias_weight: ``w`` in ``b = w * log(1 + training viewers)``.

    Raises:
        ValueError: a parameter out of range, or interactions naming unknown users or items.
    """
    users_df, items_df, train = ml.users, ml.items, split.train
    user_ids = users_df["user_id"].to_numpy(np.int64)
    item_ids = items_df["item_id"].to_numpy(np.int64)
    n_users, n_items = user_ids.size, item_ids.size
    if isinstance(d, bool) or int(d) != d or d < 2 or d % 2:
        raise ValueError(f"d must be an even int >= 2 (the table stores [relu(q), relu(-q)]), got {d!r}")
    r = int(d) // 2
    if r > min(n_users, n_items):
        raise ValueError(f"d = {d} needs r = {r} SVD factors but the matrix is {n_users} x {n_items}")
    if not is_int(experts) or not 1 <= experts <= len(EXPERT_SIGNALS):
        raise ValueError(f"experts must be an int in 1..{len(EXPERT_SIGNALS)}, got {experts!r}")
    if not is_int(k_experts) or not 1 <= k_experts <= experts:
        raise ValueError(f"k_experts must be an int in 1..experts={experts}, got {k_experts!r}")
    if not (gate_temperature > 0 and np.isfinite(gate_temperature)):
        raise ValueError(f"gate_temperature must be finite and > 0, got {gate_temperature!r}")
    if np.any(np.diff(user_ids) <= 0) or np.any(np.diff(item_ids) <= 0):
        raise ValueError("ml.users / ml.items must be sorted by id without duplicates (use load())")

    def rows_of(ids, known, what):
        pos = np.searchsorted(known, ids)
        pos = np.minimum(pos, known.size - 1)
        bad = known[pos] != ids
        if bad.any():
            raise ValueError(f"interactions name unknown {what} ids, e.g. {np.asarray(ids)[bad][:5].tolist()}")
        return pos

    tu = rows_of(train["user_id"].to_numpy(np.int64), user_ids, "user")
    ti = rows_of(train["item_id"].to_numpy(np.int64), item_ids, "item")

    # ---- training matrix, profiles --------------------------------------------------------
    X = np.zeros((n_users, n_items))
    X[tu, ti] = 1.0
    n_u = X.sum(axis=1)
    popularity = X.sum(axis=0).astype(np.int64)
    genres, IG = item_genres(items_df)
    occupations = tuple(sorted(set(users_df["occupation"])))
    occ_code = np.searchsorted(np.array(occupations), users_df["occupation"].to_numpy(str))
    age = age_bucket(users_df["age"].to_numpy())
    gender_values = ("F", "M")
    gender = users_df["gender"].map({g: i for i, g in enumerate(gender_values)})
    if gender.isna().any():
        raise ValueError(f"gender must be one of {gender_values}")
    gender = gender.to_numpy(np.int64)
    region = region_code(users_df["zip_code"])
    genre_counts = X @ IG.astype(np.float64)
    top = np.argsort(-genre_counts, axis=1, kind="stable")[:, :INTEREST_GENRES]
    interests = np.where(np.take_along_axis(genre_counts, top, axis=1) > 0, top, -1).astype(np.int64)
    H = np.zeros((n_users, len(genres)), dtype=bool)
    for j in range(INTEREST_GENRES):
        ok = interests[:, j] >= 0
        H[np.flatnonzero(ok), interests[ok, j]] = True

    schema = TargetingSchema([
        Category("age_bucket", len(AGE_LABELS)),
        Category("gender", len(gender_values)),
        Category("occupation", len(occupations)),
        Category("region", REGION_OTHER + 1),
        Category("genre_interest", len(genres), multi_valued=True),
    ])

    # ---- rules from the training audience ---------------------------------------------------
    rd = rule_design
    viewers = popularity.astype(np.float64)
    has_rules = popularity >= rd.min_viewers
    safe = np.maximum(viewers, 1.0)[:, None]

    def shares(codes, m):
        onehot = np.zeros((n_users, m))
        onehot[np.arange(n_users), codes] = 1.0
        return (X.T @ onehot) / safe  # [n_items, m]

    age_keep = shares(age, len(AGE_LABELS)) >= rd.age_min_share
    age_rule = has_rules & (age_keep.sum(axis=1) < len(AGE_LABELS))
    gender_drop = shares(gender, len(gender_values)) < rd.gender_min_share
    gender_rule = has_rules & gender_drop.any(axis=1)
    region_keep = shares(region, REGION_OTHER + 1) >= rd.region_min_share
    region_rule = has_rules & (region_keep.sum(axis=1) < REGION_OTHER + 1)
    holds_ad_genre = (H.astype(np.float64) @ IG.T.astype(np.float64)) > 0  # [n_users, n_items]
    coverage = (X * holds_ad_genre).sum(axis=0) / safe[:, 0]
    genre_rule = has_rules & (coverage >= rd.genre_min_coverage) & IG.any(axis=1)
    include = {
        "age_bucket": _csr_from_mask(age_keep & age_rule[:, None]),
        "region": _csr_from_mask(region_keep & region_rule[:, None]),
        "genre_interest": _csr_from_mask(IG & genre_rule[:, None]),
    }
    exclude = {"gender": _csr_from_mask(gender_drop & gender_rule[:, None])}
    rules = TargetingRules.from_columns(schema, item_ids, None, include, exclude)
    rule_counts = {
        "any": int((age_rule | gender_rule | region_rule | genre_rule).sum()),
        "age_bucket_include": int(age_rule.sum()),
        "gender_exclude": int(gender_rule.sum()),
        "region_include": int(region_rule.sum()),
        "genre_interest_include": int(genre_rule.sum()),
        "occupation": 0,
    }

    # ---- placeholder model: truncated SVD of the row-normalised training matrix -------------
    Xn = X / np.sqrt(np.maximum(n_u, 1.0))[:, None]
    U, s, Wt = np.linalg.svd(Xn, full_matrices=False)
    U, s, Wt = U[:, :r], s[:r], Wt[:r]
    big = np.argmax(np.abs(Wt), axis=1)
    sign = np.sign(Wt[np.arange(r), big])
    sign[sign == 0] = 1.0
    U, Wt = U * sign, Wt * sign[:, None]
    q = Wt.T * np.sqrt(s)
    p = U * np.sqrt(s)
    trained = popularity > 0
    rms = np.sqrt(np.mean(np.sum(q[trained] ** 2, axis=1))) if trained.any() else 1.0
    c = 1.0 / rms if rms > 0 else 1.0
    q, p = q * c, p / c

    # ---- expert vectors -----------------------------------------------------------------------
    has_train = n_u > 0
    long_term = (X @ q) / np.maximum(n_u, 1.0)[:, None]
    order = np.lexsort((train["item_id"].to_numpy(), train["timestamp"].to_numpy(), tu))
    tu_sorted = tu[order]
    counts = np.bincount(tu_sorted, minlength=n_users)
    ends = np.cumsum(counts)
    rank_from_end = ends[tu_sorted] - 1 - np.arange(order.size)
    recent_rows = order[rank_from_end < RECENT_ITEMS]
    R = np.zeros_like(X)
    R[tu[recent_rows], ti[recent_rows]] = 1.0
    recent = (R @ q) / np.maximum(R.sum(axis=1), 1.0)[:, None]
    popular = (popularity @ q) / max(popularity.sum(), 1)

    def genre_expert(j):
        g = interests[:, j]
        M = X * IG.T[np.maximum(g, 0)]  # [n_users, n_items]: training items of genre g
        cnt = M.sum(axis=1)
        vec = (M @ q) / np.maximum(cnt, 1.0)[:, None]
        return np.where(((g >= 0) & (cnt > 0))[:, None], vec, long_term)

    signals = {
        "long_term": lambda: long_term,
        "recent": lambda: recent,
        "demographic": lambda: _group_mean(p, age * len(gender_values) + gender, has_train),
        "genre_1": lambda: genre_expert(0),
        "genre_2": lambda: genre_expert(1),
        "popularity": lambda: np.broadcast_to(popular, long_term.shape),
        "genre_3": lambda: genre_expert(2),
        "occupation": lambda: _group_mean(p, occ_code, has_train),
    }
    names = EXPERT_SIGNALS[: int(experts)]
    fallback = np.broadcast_to(popular, long_term.shape)
    vecs = []
    for nm in names:
        v = np.array(signals[nm](), dtype=np.float64)
        v[~has_train] = fallback[~has_train]  # a user without training data gets the prior
        vecs.append(_unit(v))
    expert_vectors = np.stack(vecs, axis=1)  # [n_users, E, r]

    # ---- table -------------------------------------------------------------------------------
    a = np.concatenate([np.maximum(q, 0.0), np.maximum(-q, 0.0)], axis=1)
    bias = bias_weight * np.log1p(viewers)
    table = AdTable.from_float(a, bias, dtype=dtype, ad_ids=item_ids)

    # ---- per-user lookups --------------------------------------------------------------------
    train_slots = {}
    tu_order = np.argsort(tu, kind="stable")
    for row, grp in zip(*_groups(tu[tu_order], ti[tu_order])):
        train_slots[int(user_ids[row])] = np.unique(grp).astype(np.int64)
    held = split.heldout
    heldout = {}
    if len(held):
        hu = held["user_id"].to_numpy(np.int64)
        hi = held["item_id"].to_numpy(np.int64)
        rows_of(hu, user_ids, "user")
        rows_of(hi, item_ids, "item")
        h_order = np.lexsort((hi, held["timestamp"].to_numpy(), hu))
        for uid, grp in zip(*_groups(hu[h_order], hi[h_order])):
            _, first = np.unique(grp, return_index=True)
            heldout[int(uid)] = grp[np.sort(first)].astype(np.int64)
    eval_users = np.array(sorted(heldout), dtype=np.int64)

    return MovieLensWorld(
        schema=schema, table=table, rules=rules, users=eval_users, user_ids=user_ids,
        item_factors=q, user_factors=p, expert_vectors=expert_vectors, expert_names=names,
        gate_scale=float(np.sqrt(2 * r) / gate_temperature), k_experts=int(k_experts),
        genres=genres, occupations=occupations, rule_counts=rule_counts,
        profile_values=np.stack([age, gender, occ_code, region], axis=1).astype(np.int64),
        interests=interests, popularity=popularity,
        params={"dataset": "ml-100k", "d": int(d), "factors": r, "experts": int(experts),
                "k_experts": int(k_experts), "seed": int(seed), "dtype": dtype,
                "gate_temperature": float(gate_temperature), "bias_weight": float(bias_weight),
                "holdout_fraction": split.holdout_fraction, "min_train": split.min_train,
                "rule_design": rd},
        _train_slots=train_slots, _heldout=heldout, _n_train=len(train), _n_heldout=len(held),
    )


def _groups(keys: np.ndarray, values: np.ndarray):
    """Split ``values`` by runs of equal (sorted) ``keys``: ``(unique keys, list of arrays)``."""
    if keys.size == 0:
        return np.zeros(0, keys.dtype), []
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return keys[starts], np.split(values, starts[1:])


# ----------------------------------------------------------------------------------------------
# diagnostics and evaluation


def eligible_fraction_of_heldout(world: MovieLensWorld, users=None, use_oracle: bool = True) -> pd.Series:
    """Per user, the fraction of held-out positives that pass targeting: the ceiling recall@k can
    reach once targeting is applied (for any model and any k).

    Args:
        world: from :func:`build_world`.
        users: user ids (default ``world.users``); users without held-out items are skipped.
        use_oracle: match with :func:`andromeda_nb.reference.match` (the reference, a Python loop per
            ad: about 20 ms a user here, 20 s for all 943); False uses :func:`match_columns`
            (the same result, vectorised: about 0.4 ms a user).

    Returns:
        ``pd.Series`` of floats in ``[0, 1]`` indexed by ``user_id``.
    """
    users = world.users if users is None else np.asarray(users, dtype=np.int64)
    out = {}
    for uid in users:
        held = world.heldout(uid)
        if held.size == 0:
            continue
        prof = world.profile(uid)
        mask = reference.match(world.rules, prof) if use_oracle else match_columns(world.rules, prof)
        out[int(uid)] = float(mask[world.table.slots_of(held)].mean())
    return pd.Series(out, name="eligible_fraction", dtype=np.float64).rename_axis("user_id")


def retrieve_user(world: MovieLensWorld, user_id, k: int, k_experts: int | None = None,
                  targeting: bool = True, exclude_seen: bool = True):
    """Oracle retrieval (float64 :func:`andromeda_nb.reference.retrieve`) for one user: score every ad,
    keep those passing targeting (if ``targeting``) and not seen in training (if ``exclude_seen``),
    return the exact top-k (:class:`andromeda_nb.model.TopK`)."""
    if targeting:
        mask = world.eligible(user_id, exclude_seen=exclude_seen)
    else:
        mask = np.ones(world.table.n_ads, dtype=bool)
        if exclude_seen:
            mask[world.seen_slots(user_id)] = False
    return reference.retrieve(world.request(user_id, k_experts), world.table, k, eligible=mask)


def evaluate_recall(world: MovieLensWorld, ks=(10, 50, 100), users=None, k_experts: int | None = None,
                    targeting: bool = True, exclude_seen: bool = True) -> dict[int, float]:
    """Mean recall@k (:func:`andromeda_nb.analysis.metrics.mean_recall`) of the oracle retrieval of the
    world's model over ``users`` (default every evaluated user), for each k in ``ks`` (ValueError
    before any retrieval where ``ks`` is empty or holds a k below 1).

    Returns:
        ``{k: mean recall@k}``.
    """
    ks = check_ks(ks)
    users = world.users if users is None else np.asarray(users, dtype=np.int64)
    users = [u for u in users if world.heldout(u).size]
    kmax = max(ks)
    got = [retrieve_user(world, u, kmax, k_experts, targeting, exclude_seen).ids for u in users]
    return mean_recall(got, [world.heldout(u) for u in users], ks)
