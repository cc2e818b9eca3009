"""Standard retrieval baselines on exactly the quality experiment's split, candidates and metric.

Why: a mixture that trails a tuned ALS says more about the training than about the idea; the
project's models only mean something beside the standard methods, tuned as carefully, on the same
data. Every baseline here

- fits on the training clicks of :class:`~andromeda_nb.training.data.InteractionData` (each user's
  clicks before the held-out ones; a binary user x item matrix);
- is tuned on a **validation split carved from the training part only**: each evaluated user's last
  training click is held back, the model fits on the rest, and the grid point with the best mean
  validation recall@100 (targeting applied, the remaining training clicks excluded) wins; the held-out
  clicks are never read while tuning;
- is refit with that point on every training click and scored like the project's models: recall@k
  of the held-out clicks over the eligible ads (targeting applied, training clicks excluded), and
  without targeting (every ad but the training clicks).

Models: ``most_popular`` (training click counts), ``itemknn_cosine`` and ``itemknn_bm25`` (item
neighbourhoods of :mod:`implicit.nearest_neighbours`), ``als`` (:mod:`implicit.als`, Hu et al. 2008),
``bpr`` (:mod:`implicit.bpr`, Rendle et al. 2009) and ``ease`` (Steck 2019, closed form; dense item x
item, so only up to :data:`EASE_MAX_ITEMS` items). The ``implicit`` library is the ``train`` extra.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

BASELINES = ("most_popular", "itemknn_cosine", "itemknn_bm25", "als", "bpr", "ease")
#: the grid each baseline is tuned over (the same tuning rule for all: best validation recall@100)
GRIDS = {
    "most_popular": ({},),
    "itemknn_cosine": tuple({"K": k} for k in (10, 20, 50, 100, 200, 400)),
    "itemknn_bm25": tuple({"K": k, "K1": k1, "B": b} for k in (50, 100, 200, 400, 800, 1600) for k1 in (0.6, 1.2, 2.0)
                          for b in (0.5, 0.75, 1.0)),
    "als": tuple({"factors": f, "regularization": r, "alpha": a, "iterations": 20}
                 for f in (8, 16, 32, 64, 128) for r in (0.001, 0.01, 0.1, 1.0) for a in (1.0, 5.0, 20.0)),
    "bpr": tuple({"factors": f, "learning_rate": lr, "regularization": r, "iterations": 200}
                 for f in (32, 64, 128) for lr in (0.001, 0.003, 0.01, 0.03) for r in (0.001, 0.003, 0.01, 0.03)),
    "ease": tuple({"l2": l2} for l2 in (10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 3000.0)),
}
#: baselines with a random start (fit once per seed; the others are deterministic)
SEEDED = ("als", "bpr")
#: EASE inverts a dense item x item matrix: 20,000 items is 3.2 GB in float64
EASE_MAX_ITEMS = 20_000
TUNE_METRIC_K = 100
#: users scored at once (a dense users x items block of float32 each)
CHUNK = 256


@dataclass
class Fitted:
    """A baseline fitted on a user x item matrix: ``scores(rows)`` gives ``[len(rows), n_items]``."""

    name: str
    params: dict
    user_items: object  # scipy.sparse.csr_matrix, binary
    item_vectors: np.ndarray | None = None  # factor models: [n_items, f]
    user_vectors: np.ndarray | None = None  # [n_users, f]
    item_item: object = None  # neighbourhood / EASE: [n_items, n_items] (sparse or dense)
    popularity: np.ndarray | None = None

    def scores(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        if self.popularity is not None:
            return np.broadcast_to(self.popularity.astype(np.float32), (rows.size, self.popularity.size)).copy()
        if self.item_vectors is not None:
            return (self.user_vectors[rows] @ self.item_vectors.T).astype(np.float32)
        x = self.user_items[rows]
        out = x @ self.item_item
        out = out.toarray() if hasattr(out, "toarray") else np.asarray(out)
        return out.astype(np.float32)


def user_items(data):
    """The training clicks as a binary csr ``[n_users, n_items]`` (of
    :func:`~andromeda_nb.training.tuning.validation_view` for the validation split's)."""
    from scipy.sparse import csr_matrix

    rows, t = data.events()
    items = data.seq[rows, t]
    m = csr_matrix((np.ones(rows.size, np.float32), (rows, items)), shape=(data.n_users, data.n_ads))
    m.sum_duplicates()
    m.data[:] = 1.0
    return m


#: each baseline's parameters: name -> (type, smallest allowed value, inclusive)
PARAMS = {
    "most_popular": {},
    "itemknn_cosine": {"K": (int, 1, True)},
    "itemknn_bm25": {"K": (int, 1, True), "K1": (float, 0.0, False), "B": (float, 0.0, True)},
    "als": {"factors": (int, 1, True), "regularization": (float, 0.0, True), "alpha": (float, 0.0, False),
            "iterations": (int, 1, True)},
    "bpr": {"factors": (int, 1, True), "learning_rate": (float, 0.0, False), "regularization": (float, 0.0, True),
            "iterations": (int, 1, True)},
    "ease": {"l2": (float, 0.0, False)},
}


def check_params(name: str, params: dict) -> None:
    """Raise ValueError unless ``name`` is a baseline and ``params`` holds exactly its parameters,
    each a number in range (a bad value can crash the library underneath: item kNN with K = 0)."""
    if name not in PARAMS:
        raise ValueError(f"unknown baseline {name!r}; choose from {BASELINES}")
    spec = PARAMS[name]
    if not isinstance(params, dict) or set(params) != set(spec):
        raise ValueError(f"{name} takes the parameters {sorted(spec)}, got {params!r}")
    for key, (kind, low, inclusive) in spec.items():
        v = params[key]
        ok = (isinstance(v, (int, np.integer)) if kind is int else isinstance(v, (int, float, np.integer, np.floating)))
        if isinstance(v, bool) or not ok or not np.isfinite(v) or (v < low if inclusive else v <= low):
            raise ValueError(f"{name}: {key} must be {'an int' if kind is int else 'a number'} "
                             f"{'>=' if inclusive else '>'} {low}, got {v!r}")
    if name == "itemknn_bm25" and params["B"] > 1:
        raise ValueError(f"itemknn_bm25: B must be in [0, 1], got {params['B']!r}")


def fit(name: str, X, params: dict, seed: int = 0) -> Fitted:
    """Fit baseline ``name`` with ``params`` (checked: :func:`check_params`) on the binary user x
    item csr ``X``."""
    check_params(name, params)
    if name == "most_popular":
        return Fitted(name, params, X, popularity=np.asarray(X.sum(axis=0)).ravel())
    if name == "ease":
        if X.shape[1] > EASE_MAX_ITEMS:
            raise ValueError(f"EASE needs a dense {X.shape[1]:,} x {X.shape[1]:,} inverse (at most "
                             f"{EASE_MAX_ITEMS:,} items)")
        G = (X.T @ X).toarray().astype(np.float64)
        G[np.diag_indices_from(G)] += params["l2"]
        P = np.linalg.inv(G)
        B = -P / np.diag(P)[None, :]
        B[np.diag_indices_from(B)] = 0.0
        return Fitted(name, params, X, item_item=B.astype(np.float32))
    from implicit.nearest_neighbours import BM25Recommender, CosineRecommender

    from implicit.cpu.als import AlternatingLeastSquares
    from implicit.cpu.bpr import BayesianPersonalizedRanking
    from threadpoolctl import threadpool_limits

    # implicit's own threads do the work: a threaded BLAS under them slows it (one thread here)
    with threadpool_limits(limits=1, user_api="blas"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*expects CSR input.*")  # its internal transpose
        if name in ("itemknn_cosine", "itemknn_bm25"):
            model = (CosineRecommender(K=params["K"]) if name == "itemknn_cosine"
                     else BM25Recommender(K=params["K"], K1=params["K1"], B=params["B"]))
            model.fit(X, show_progress=False)
            return Fitted(name, params, X, item_item=model.similarity.tocsr())
        if name == "als":
            model = AlternatingLeastSquares(factors=params["factors"], regularization=params["regularization"],
                                            alpha=params["alpha"], iterations=params["iterations"],
                                            random_state=seed, calculate_training_loss=False)
        elif name == "bpr":
            model = BayesianPersonalizedRanking(factors=params["factors"], learning_rate=params["learning_rate"],
                                                regularization=params["regularization"],
                                                iterations=params["iterations"], random_state=seed)
        else:
            raise ValueError(f"unknown baseline {name!r}; choose from {BASELINES}")
        model.fit(X, show_progress=False)
    return Fitted(name, params, X, item_vectors=np.asarray(model.item_factors),
                  user_vectors=np.asarray(model.user_factors))


def topk(fitted: Fitted, rows: np.ndarray, mask_fn, k: int) -> np.ndarray:
    """``[len(rows), k]`` top-k slots per row among ``mask_fn(rows)`` (bool ``[n, n_items]``), ties to
    the lower slot, pads -1; scored ``CHUNK`` users at a time."""
    from ..analysis.quality import _topk_rows

    out = []
    for s in range(0, len(rows), CHUNK):
        r = rows[s: s + CHUNK]
        out.append(_topk_rows(fitted.scores(r), mask_fn(r), k))
    return np.concatenate(out) if out else np.zeros((0, k), np.int64)


def _mean_recall(top: np.ndarray, relevant: list, k: int) -> float:
    from ..analysis.metrics import recall_at_k

    return float(np.mean([recall_at_k(t, rel, k) for t, rel in zip(top, relevant)])) if len(top) else float("nan")


def tune(name: str, data, rows: np.ndarray, seed: int = 0, grid=None, split: str = "auto") -> tuple[dict, list]:
    """The grid point of ``name`` with the best validation recall@100 on ``rows`` (those with
    held-back clicks), fitted without each user's held-back clicks (the validation split, ``split``:
    :func:`~andromeda_nb.training.tuning.validation_view`, the project's models' too) and scored
    over the eligible ads minus the clicks it kept. Returns (best params, [(params, recall), ...])."""
    grid = GRIDS[name] if grid is None and name in GRIDS else grid
    if grid is None:
        raise ValueError(f"unknown baseline {name!r}; choose from {BASELINES}")
    if not len(grid):
        raise ValueError(f"{name}: an empty grid")
    for params in grid:  # every point checked before the first fit
        check_params(name, params)
    from .tuning import validation_view

    view = validation_view(data, split)
    X = user_items(view)
    rows = np.asarray(rows, np.int64)
    rows = rows[view.seq_len[rows] < data.seq_len[rows]]  # those with clicks held back
    if not rows.size:
        raise ValueError(f"{data.name}: no evaluated user has training clicks to hold back for validation "
                         "with one left to learn from")
    relevant = [data.seq[r, view.seq_len[r]: data.seq_len[r]] for r in rows]

    def candidates(r):
        mask = data.eligible(r, exclude_seen=False)
        mask &= X[r].toarray() == 0
        return mask

    trials = []
    for params in grid:
        if name == "ease" and X.shape[1] > EASE_MAX_ITEMS:
            break
        fitted = fit(name, X, params, seed)
        trials.append((params, _mean_recall(topk(fitted, rows, candidates, TUNE_METRIC_K), relevant, TUNE_METRIC_K)))
    if not trials:
        raise ValueError(f"{name} does not apply to {data.name} ({data.n_ads:,} items)")
    best = max(trials, key=lambda t: t[1])[0]
    return best, trials


def evaluate(name: str, params: dict, data, rows: np.ndarray, ks, seed: int = 0) -> dict:
    """Refit on every training click and score held-out recall@k, with targeting (``recall@k``) and
    without (``recall@k_untargeted``: every ad but the user's training clicks)."""
    X = user_items(data)
    fitted = fit(name, X, params, seed)
    relevant = [data.heldout[int(r)] for r in rows]
    kmax = max(ks)
    targeted = topk(fitted, rows, lambda r: data.eligible(r), kmax)
    untargeted = topk(fitted, rows, lambda r: X[r].toarray() == 0, kmax)
    out = {}
    for k in ks:
        out[f"recall@{k}"] = _mean_recall(targeted, relevant, k)
        out[f"recall@{k}_untargeted"] = _mean_recall(untargeted, relevant, k)
    return out


def grid_edges(params: dict, grid) -> list[str]:
    """The parameters of ``params`` at the smallest or largest value ``grid`` tries (of those it
    varies): a tuned point there may be short of the best one, and says so."""
    out = []
    for key, value in params.items():
        tried = sorted({p[key] for p in grid})
        if len(tried) > 1 and value in (tried[0], tried[-1]):
            out.append(key)
    return out


def describe(name: str, params: dict, grid=()) -> str:
    """The scorer column of a baseline's rows: library, model, the tuned point and which of its
    parameters sit at the edge of the grid tried."""
    lib = "numpy" if name in ("most_popular", "ease") else "implicit"
    edges = grid_edges(params, grid) if grid else []
    return (f"{lib} {name}" + (" " + " ".join(f"{k}={v}" for k, v in params.items()) if params else "")
            + (f" (grid edge: {', '.join(edges)})" if edges else ""))
