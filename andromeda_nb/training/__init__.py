"""Training (PyTorch, optional extra ``train``) of the retrieval models of docs/design.md and of a ranking
model, on the synthetic multi-interest world and MovieLens-100K; export to Request / AdTable.

Modules: :mod:`.data` (features, signal groups, request context), :mod:`.models` (towers, gated
mixtures, ranking model), :mod:`.train` (sampled softmax with logQ correction, training loop,
:class:`~.train.TrainedModel` with ``export_request`` / ``export_table``), :mod:`.served` (a MovieLens
world serving a trained model: the quickstart's).

Run every configuration for every seed and dataset (writes ``<out>/quality.csv``)::

    python -m andromeda_nb.training --preset full --out data/results     # GPU host: minutes
    python -m andromeda_nb.training --preset smoke --out build/quality    # any CPU: seconds
"""

from .data import GROUPS, InteractionData, from_movielens, from_multi_interest
from .train import MODELS, TrainConfig, TrainedModel, score_exported, train_model

__all__ = ["GROUPS", "MODELS", "InteractionData", "TrainConfig", "TrainedModel", "from_movielens",
           "from_multi_interest", "score_exported", "train_model"]
