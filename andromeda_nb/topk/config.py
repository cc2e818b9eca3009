"""Top-K limits (what the kernels can hold) and choices (:class:`TopKConfig`, what a caller may pick).

Every algorithm choice and tuning value of the top-K paths is a field of :class:`TopKConfig` (the
algorithm) or of its :class:`TopKTuning` (the sizes and thresholds), passed as ``config=`` to
:func:`~andromeda_nb.topk.api.topk_scores`, :func:`~andromeda_nb.topk.api.topk_batch` and to the
``launch_*`` functions and workspaces that use them. The defaults are the measured choices.

The paths (``TopKConfig.path``) for one request of n scores, top-k:

- ``"batched"``: the batched seeded path on a batch of one (:mod:`~andromeda_nb.topk.batched`: a
  one-block seed from a 4,096-score sample, one filter pass, a rank or sort final); a request it
  cannot answer exactly (its seed above the k-th score, more kept scores than its buffer) reruns
  on ``"filter"``.
- ``"filter"``: a seed from a stratified sample (:mod:`~andromeda_nb.topk.seed`), one pass keeping
  the scores at or above it (:mod:`~andromeda_nb.topk.filter`), the top-k of those
  (:mod:`~andromeda_nb.topk.final`). A seed above the k-th score reruns ``"unseeded"``; more kept
  scores than the buffer holds reruns on ``"scan"`` with the same (valid) seed (above
  :data:`BLOCK_TOPK_MAX_K`, both rerun ``"unseeded"``). Where no seed pays (n below
  ``seed_min_n``, or a k the sample cannot rank) it runs ``"unseeded"``.
- ``"scan"``: the same seed, then per-block top-k lists behind it and their merge
  (:mod:`~andromeda_nb.topk.scan`); a seed above the k-th score reruns ``"unseeded"``. k at most
  :data:`BLOCK_TOPK_MAX_K`.
- ``"unseeded"``: the block top-K lists and merge over every score; for k above
  :data:`BLOCK_TOPK_MAX_K`, one filter pass keeping every eligible score and one block's radix
  select (exact at any size, slow for large n).

The auto rule (``path="auto"``, :func:`choose_path`): ``seeded=False`` takes ``"unseeded"``; k
above :data:`BLOCK_TOPK_MAX_K` takes ``"filter"`` (only the radix finals hold such a k); n from
``seed_min_n`` to ``small_max_n`` takes ``"batched"``; anything else ``"filter"``.
:func:`~andromeda_nb.topk.api.topk_batch` always takes the batched seeded path for the whole batch
(``"auto"`` or ``"batched"``; the requests it cannot answer exactly rerun one by one under the same
config, or all at once unseeded past ``rerun_one_by_one``), or ``"unseeded"`` (the block top-K over
the whole batch).

Importing this module does not import numba.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from numbers import Integral, Real

from ..device import launch

# ----------------------------------------------------------------------------- limits

#: Largest k of :func:`~andromeda_nb.topk.api.topk_scores`: its radix-select steps hold the answer,
#: next_pow2(k) entries of 8 bytes, in shared memory (32 KiB at 4096, within Numba's 48 KiB per block).
MAX_K = 4096
#: Largest k of the block top-K (scan path, batched unseeded form, fused scoring): its shared
#: buffer of next_pow2(k + block * items) entries of 8 bytes must fit in 48 KiB.
BLOCK_TOPK_MAX_K = 2048
#: Entries of the block top-K's shared buffer that fit Numba's 48 KiB (8 bytes each, a power of two).
BLOCK_TOPK_BUFFER = 4096
#: Item counts are int32 slots inside the kernels.
MAX_ITEMS = 2**31 - 1
#: Requests at most per batched call (the grid's y dimension).
MAX_BATCH = 65535
#: Threads of the one-block radix select (the filter path's final, the merge's radix final): one
#: block does all of that work, so the more threads the fewer serial loads, histogram rounds and
#: bitonic compare-exchanges each (its kernels use 56 registers a thread: 1024 fit the register file).
RADIX_BLOCK = 1024


def radix_block() -> int:
    """Threads per block of the radix-select launches (:data:`RADIX_BLOCK`; the simulator's default
    block there, since it runs every thread as a Python thread)."""
    return launch.default_block() if launch.backend.is_simulator() else RADIX_BLOCK


# ----------------------------------------------------------------------------- choices

#: ``TopKConfig.path`` values (see the module docstring).
PATHS = ("auto", "batched", "filter", "scan", "unseeded")
#: ``TopKConfig.final_merge`` values.
FINAL_MERGES = ("radix", "offer")
#: ``TopKConfig.final`` values: how a filter buffer's final answers (``"auto"``: :func:`final_for`).
FINALS = ("auto", "rank", "radix")
#: ``final="auto"`` answers batches of at least this many requests by the radix select (a block a
#: request), smaller ones by the rank final (many blocks a request): the rank final's blocks each
#: re-read a request's whole buffer, which a batch multiplies, while the radix select's blocks run
#: side by side on separate SMs (measured on the H200, data/results/request_path_diagnostics.md).
RADIX_FINAL_MIN_BATCH = 4


@dataclass(frozen=True)
class TopKTuning:
    """Sizes and thresholds of the seeded paths. Each default is the measured or derived choice;
    tests shrink them to reach a path's branches on small arrays."""

    #: Single requests of at least this many scores get a seed (below, the block top-K alone is
    #: cheaper than a sample and its launch).
    seed_min_n: int = 1 << 16
    #: Contiguous scores a sampled run of the single-request seed (a warp's 128-byte lines, 8 of them).
    sample_chunk: int = 256
    #: Sampled runs at most: 4,096 runs of 256 is a 1 M-score sample (4 MB) at 10^8 scores, seed
    #: rank 27 for k = 1000.
    max_sample_chunks: int = 4096
    #: The seed aims at about this many scores per unit of k at or above it: few enough for the sort
    #: final (final_kernels.SORT_CAP) up to k ~ 1,600, enough that a seed above the k-th score (a
    #: rerun) is rare: with seed rank r the kept count is about Gamma(r) * n / m, so r = 27 (10^8
    #: scores, k = 1000) falls short of k with p ~ 1e-5.
    seed_margin: float = 2.5
    #: The seed rank is at least this (a small k on a large array): the kept count's relative
    #: spread is about 1 / sqrt(r).
    seed_min_rank: int = 8
    #: Sample no more than a seed of about this rank needs: the sample is a gather of its own, and
    #: on a small array a large one costs more than the pass it saves.
    seed_sample_rank: int = 64
    #: Candidate keys the single-request seed's last block can take (each block's samples at or
    #: above its own r-th best's 24-bit key prefix: about r a block, more with ties); more leave the
    #: seed at the highest block threshold (lower than the sample's r-th best, still valid).
    seed_cand_cap: int = 1 << 17
    #: The filter path's buffer holds this many entries per unit of k (at least ``filter_min_cap``).
    #: A fuller buffer means the seed was low (on sorted input the stratified sample's r-th best
    #: lies in its top chunk): the call reruns on the seeded scan path, which takes any number of
    #: scores above the seed.
    filter_cap_per_k: int = 64
    #: The filter path's buffer holds at least this many entries.
    filter_min_cap: int = 4096
    #: Kept scores a filter block stages in shared memory before its one global atomic (8 KiB; a
    #: kernel-factory size): a global atomic per kept score stalled its warp for the round trip,
    #: which halved the batched filter's bandwidth (250 kept of 50,000 a request: about one a warp
    #: a round).
    filter_stage: int = 1024
    #: Rounds of 8-byte loads a block of the batched filter takes (grid-stride) before it exits:
    #: one block a request up to 65,536 scores (measured on the H200, data/results/topk.csv).
    batch_filter_rounds: int = 16
    #: Candidates the rank final takes (a kernel-factory size); more leave the request to the radix
    #: select launched after it.
    rank_cap: int = 8192
    #: ``path="auto"`` answers a request of ``seed_min_n`` up to this many scores (L2-resident right
    #: after scoring) by the batched path on a batch of one: its seed is one block's 4,096-score
    #: sample, where the single-request seed's multi-block sample and merge cost more than the rest
    #: of the call (measured on the H200, data/results/topk.csv).
    small_max_n: int = 1 << 20
    #: A seeded batch reruns up to this many requests one by one (topk_scores); more, the whole
    #: batch at once by the unseeded block top-K.
    rerun_one_by_one: int = 8

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "seed_margin":
                # positive (below 1 the seed is often above the k-th score: the exact rerun, which tests
                # force this way) and at most 1,000 (its rank and buffer sizes stay kernel integers)
                if isinstance(v, bool) or not isinstance(v, Real) or not 0 < v <= 1000:
                    raise ValueError(f"TopKTuning.seed_margin must be a number in (0, 1000], got {v!r}")
                object.__setattr__(self, f.name, float(v))
                continue
            low = 0 if f.name in ("rerun_one_by_one", "small_max_n") else 1
            if isinstance(v, bool) or not isinstance(v, Integral) or v < low:
                raise ValueError(f"TopKTuning.{f.name} must be an int >= {low}, got {v!r}")
            object.__setattr__(self, f.name, int(v))  # a numpy integer too: kernel sizes are Python ints


@dataclass(frozen=True)
class TopKConfig:
    """The top-K algorithm: which path answers, which final step the merge takes, which barriers the
    sorts use, and the :class:`TopKTuning` of the seeded paths. Frozen and hashable: cached
    workspaces are keyed on it."""

    #: Which path answers a request (:data:`PATHS`; the module docstring says what each does and
    #: the auto rule).
    path: str = "auto"
    #: The merge's final step: "radix" (radix select, then one sort of k: final_kernels.
    #: final_radix_kernel) or "offer" (the block top-K over the compact buffer). Both exact; radix
    #: measured faster on the H200 (data/results/topk.csv).
    final_merge: str = "radix"
    #: The sort final's steps of stride <= 32 end with warp barriers (final_kernels._sort_funcs);
    #: off until timed on the GPU (bench topk, batch phase: the sort stage with and without).
    sort_warp_sync: bool = False
    #: The same for the one-launch path's last-block sort (off until timed).
    onelaunch_warp_sync: bool = False
    #: How a filter buffer's exact top-k is taken (:data:`FINALS`): "rank" counts each candidate's
    #: place over many blocks, "radix" selects by radix in one block a request; "auto" by the batch
    #: size (:func:`final_for`).
    final: str = "auto"
    #: Sizes and thresholds of the seeded paths.
    tuning: TopKTuning = field(default_factory=TopKTuning)

    def __post_init__(self):
        if not isinstance(self.path, str) or self.path not in PATHS:
            raise ValueError(f"TopKConfig.path must be one of {PATHS}, got {self.path!r}")
        if not isinstance(self.final, str) or self.final not in FINALS:
            raise ValueError(f"TopKConfig.final must be one of {FINALS}, got {self.final!r}")
        if not isinstance(self.final_merge, str) or self.final_merge not in FINAL_MERGES:
            raise ValueError(f"TopKConfig.final_merge must be one of {FINAL_MERGES}, got {self.final_merge!r}")
        for name in ("sort_warp_sync", "onelaunch_warp_sync"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"TopKConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.tuning, TopKTuning):
            raise TypeError(f"TopKConfig.tuning must be a TopKTuning, got {type(self.tuning).__name__}")


#: The measured defaults.
DEFAULT_CONFIG = TopKConfig()


def final_for(config: TopKConfig, batch: int) -> str:
    """The final a filter buffer of ``batch`` requests takes: ``config.final``, or for ``"auto"``
    the radix select from :data:`RADIX_FINAL_MIN_BATCH` requests on, else the rank final."""
    if config.final != "auto":
        return config.final
    return "radix" if batch >= RADIX_FINAL_MIN_BATCH else "rank"


def check_config(config) -> TopKConfig:
    """``config`` or :data:`DEFAULT_CONFIG` for None.

    Raises:
        TypeError: not a :class:`TopKConfig`.
    """
    if config is None:
        return DEFAULT_CONFIG
    if not isinstance(config, TopKConfig):
        raise TypeError(f"config must be a TopKConfig, got {type(config).__name__}")
    return config


def choose_path(config: TopKConfig, n: int, k: int, seeded: bool = True) -> str:
    """The path :func:`~andromeda_nb.topk.api.topk_scores` takes for one request of ``n`` scores,
    top-``k`` (the auto rule of the module docstring when ``config.path`` is "auto").

    Raises:
        ValueError: ``seeded=False`` with a seeded path, or "scan" for a k above
            :data:`BLOCK_TOPK_MAX_K` (the block top-K's lists cannot hold it).
    """
    if not seeded:
        if config.path not in ("auto", "unseeded"):
            raise ValueError(f"seeded=False is path 'unseeded', but config.path is {config.path!r}")
        return "unseeded"
    if config.path == "scan" and k > BLOCK_TOPK_MAX_K:
        raise ValueError(f"k={k}: path 'scan' runs the block top-K, which supports k <= {BLOCK_TOPK_MAX_K}; "
                         f"the 'filter' path takes k <= {MAX_K}")
    if config.path != "auto":
        return config.path
    if k > BLOCK_TOPK_MAX_K:
        return "filter"
    if config.tuning.seed_min_n <= n <= config.tuning.small_max_n:
        return "batched"
    return "filter"
