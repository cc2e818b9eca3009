"""Datasets for the sandbox (host side, numpy / pandas only).

- :mod:`andromeda_nb.datasets.movielens`: real data. MovieLens-100K (fetched from the RecBole wheel on
  PyPI), a per-user temporal split, and a mapping onto the ads world: movies are ads, demographic
  and genre-interest targeting rules derived from each movie's training audience, and a placeholder
  SVD model stored so that docs/design.md's gated model reproduces it exactly.
- :mod:`andromeda_nb.datasets.synthetic`: the seeded benchmark world of docs/design.md (10^8 ads,
  20 targeting categories, Zipf-like value popularity) at any scale.
"""

from . import movielens, synthetic

__all__ = ["movielens", "synthetic"]
