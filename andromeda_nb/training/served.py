"""A MovieLens world that serves a trained model (the quickstart's default): the world's ads, rules,
profiles and held-out interactions; the ad table and every user's Request from a retrieval model
trained on the world's training interactions only.

    world = movielens.build_world(ml, split, dtype="fp16")
    served = train_world(world, ml, split, "mixture_k2", preset="demo")   # a minute on a CPU
    evaluation.run_users(served, users)                                  # targeting -> gated scoring -> top-K

The configuration is the preset's (:data:`~andromeda_nb.analysis.quality.PRESETS`), or at preset
``full`` the tuned one where ``tuned`` holds it (:func:`~.tuning.load_tuned`: tuned on the
validation split of the training part, never on the held-out part).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..model import Request
from .data import from_movielens
from .train import MODELS, TrainedModel, train_model

#: where :func:`train_world` looks for tuned configurations (preset ``full``)
TUNED = "data/results/tuned.json"


class TrainedWorld:
    """``world`` (a :class:`~andromeda_nb.datasets.movielens.MovieLensWorld`) with the ad table and
    requests of ``model``, a trained retrieval model on ``world``'s users and ads: what
    :func:`~andromeda_nb.analysis.evaluation.run_users` and the oracle read (``table``, ``rules``,
    ``request``, ``profile``, ``seen_slots``, ``heldout``, ``eligible``, ``users``). Every user's
    request is exported at construction, in one forward pass.

    Raises:
        TypeError: ``model`` is not a retrieval model (the ranking model exports no Request).
        ValueError: ``model`` was trained on other users or ads than ``world``'s.
    """

    def __init__(self, world, model: TrainedModel, dtype: str = "fp16", note: str = ""):
        if not isinstance(model, TrainedModel) or not model.is_retrieval:
            raise TypeError("model must be a trained retrieval model (TrainedModel of a key of MODELS other than "
                            "'ranking')")
        if not (np.array_equal(model.data.ad_ids, world.table.ad_ids)
                and np.array_equal(model.data.user_ids, world.user_ids)):
            raise ValueError("the model was trained on other users or ads than this world's (from_movielens(world, ...))")
        self.world, self.model, self.note = world, model, note
        self.table = model.export_table(dtype)
        self.k_experts = model.k_experts
        self._V, self._G, self._gamma, self._beta = model.request_tensors(np.arange(model.data.n_users))

    def request(self, user_id, k_experts: int | None = None) -> Request:
        """The user's request from the trained user tower (its context: the first held-out click's,
        or just after the last training click). Raises KeyError for an unknown user."""
        r = self.model.data.row_of(user_id)
        return Request(V=self._V[r], G=self._G[r], gamma=self._gamma[r], beta=self._beta[r],
                       k_experts=self.k_experts if k_experts is None else k_experts)

    @property
    def experts(self) -> int:
        return int(self.model.experts)

    @property
    def d(self) -> int:
        return int(self.table.d)

    def describe(self) -> dict:
        """The world's counts with the served model in place of the placeholder's."""
        out = {k: v for k, v in self.world.describe().items() if k not in ("factors",)}
        cfg = self.model.cfg
        out.update(model=self.model.name, experts=self.experts, k_experts=int(self.k_experts), d=self.d,
                   train_steps=int(cfg.steps), train_batch=int(cfg.batch), train_seconds=round(self.model.seconds, 1))
        return out

    def __getattr__(self, name):  # the rest of the world (rules, profile, heldout, ...)
        if name.startswith("__") or name == "world":
            raise AttributeError(name)
        return getattr(self.world, name)


def train_world(world, ml, split, model: str = "mixture_k2", preset: str = "demo", seed: int = 0,
                dtype: str = "fp16", device: str = "auto", tuned=TUNED, progress: bool = True) -> TrainedWorld:
    """Train ``model`` (a retrieval model of :data:`~.train.MODELS`) on ``world``'s training
    interactions (:func:`~.data.from_movielens`) at ``preset``'s configuration for MovieLens-100K
    (at ``full``: the tuned one in the file ``tuned`` where it holds this model), and serve it.

    Raises:
        ValueError: an unknown or non-retrieval model, an unknown preset.
    """
    from ..analysis.quality import PRESETS
    from .tuning import load_tuned

    if model not in MODELS or model == "ranking":
        raise ValueError(f"model must be one of {sorted(MODELS)} (the ranking model serves no Request), got {model!r}")
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    cfg, note = PRESETS[preset].cfg("ml-100k", model), f"preset {preset}"
    if preset == "full" and tuned is not None and Path(tuned).exists():
        try:
            cfg, why = load_tuned(tuned, "ml-100k", "full", [model])[model]
            note = f"preset full, {why}"
        except ValueError:  # not tuned (yet): the preset's settings
            pass
    data = from_movielens(world, ml, split)
    trained = train_model(model, data, cfg, seed=seed, device=device, progress=progress)
    return TrainedWorld(world, trained, dtype=dtype, note=note)
