"""Scoring suite: ``python -m andromeda_nb.bench scoring`` (GPU only; ``--list`` anywhere).

The fused gather-gate-score kernel (gated and dot) with scores written to memory, with the fused
block top-K and with the seeded filter path, over kernel configurations, storage dtypes, layouts,
E / K / d and eligible sets, against the unfused pipelines (one kernel per model step; gather,
score, top-K). Data is generated on the GPU (:mod:`.tables`). Every row verifies its own output:
the scores of a random sample of ads against the float64 oracle, and top-K answers against
torch.topk on the same kernel's scores.

Phases (``--phases``, comma-separated; default ``DEFAULT_PHASES``), in run order:

    design : d=64 fp16 E=6 K=2 pool: kernel configurations, layouts, the naive kernel, dot, scores vs
             fused; the fastest verified configuration of its contenders is the ``best`` of later phases
    sync   : the fused top-K's barrier interval (sync_every 1, 2, 4, 8), gated and dot, and scores to memory
    final  : the best configuration on the cases that matter most (a short run)
    filter : fused scoring + top-k by the seeded filter path (k = 1000 and 4096) against scores to
             memory and the fused block top-K, same run
    weights: request weights read from shared memory or the constant bank (kernel parameters), the
             per-ad fence or an opaque offset, register caps; scores to memory
    tensor : the gate and value dot products on the tensor cores (KernelConfig.tensor_cores): scores
             to memory, fused top-K, against the CUDA-core kernel and dot
    defaults: the default configuration on the headline cases: gated and dot (fp16, int8; d 64 and
             128), scores to memory and the filter path; bitset filter; block top-K
    bitset_sweep: the gated filter path on a 10 % eligible bitset, rows layout, over register caps,
             block sizes and blocks per SM, with the full-pool pass of the same run
    int8   : int8 against fp16, dot (d 64 and 128, scores to memory and the filter path) and gated
             d 64 scores to memory
    bitset_auto: the compacted bitset filter paths, tiles and rows, default configuration
    unfused: per-op (pool, all candidates) and pre-fusion pipelines, with byte budgets
    dtype  : fp32 / bf16 / int8, gated and dot
    sweep  : ads/s against E, K and d (fp16)
    sweep_dtypes: the E / K / d grid of ``sweep`` for fp32, bf16 and int8 tables (~40 cases)
    dense  : the dense mixture E = K = 6
    access : bitset (0.5, 0.1, 0.01) and candidates (0.1, 0.01), rows and tiles; pre-fusion and
             per-op on bitsets
    peers  : a Triton kernel of the gated model (over its tuning grid), torch.compile and eager
             PyTorch (:mod:`.peers`), beside the fused kernel and the dot product, same tables
    int8_math: int8 rows in fp16 math beside fp16 rows in fp16 math, int8 in fp32 math and the dot
             products, scores to memory (d 64 E6 K2, E8 K4; d 128) and the fused top-1000
    int8_occupancy: int8 rows in fp16 math at register caps, block sizes and grids of one wave
             (more resident warps against spills), and with the tiles' mma steps alternating
             (``tile_order="steps"``, fp16 rows too), beside fp16 rows, one run
    f16_weights: fp16 math's weights in shared memory against registers (fp16 and int8 rows, scores to
             memory and the fused top-1000), and int8 with shared weights at lower register caps, one run
    rows_ahead: two rounds of rows in flight in registers (``rows_ahead=2``, weights in shared memory)
             beside one round with the weights in registers or shared memory, int8 and fp16 rows
    ring   : int8 rows through a shared-memory ring filled by ``cp.async`` (``ring_stages`` 2, 3, 4,
             blocks of 128) beside the default launch and blocks of 128 without a ring, one run
    row_scales: int8 rows reading their scales as the table's fp16 pairs (the default) beside float32
             scales made into pairs each round (``row_scales="fp32"``), and fp16 rows, one run
    loop   : fp16 math's loop over rounds in two (the default) beside one checked loop
             (``loop="checked"``), fp16 and int8 rows, scores to memory and the fused top-1000, one run
    frontier: how large may the model grow: gated scores to memory over E / K at d 32, 64 and 128 in
             fp16 and fp32 math, beside the dot product of each d, one run (~40 cases)

Columns of every row: ``path`` ("block": the fused block top-K, "filter": the seeded filter path,
empty for scores to memory), ``math`` (fp32: every product and sum), ``layout``.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, replace

import numpy as np

from . import harness
from ..analysis.scoring_report import FRONTIER_D, FRONTIER_EK  # the frontier phase's grid: every (E, K) at every d
from ..model import Request
from .harness import Settings
from .peers import TRITON_CONFIGS

SAMPLE = 2048  # ads per row checked against the float64 oracle
#: The configuration of a case that measures whatever the run's ``design`` phase found fastest
#: (its verified contenders; the default KernelConfig when it did not run).
BEST = "best"
cfg = Settings.of
AUTO = cfg()  # KernelConfig(): every field at its measured default


# ----------------------------------------------------------------------------- cases


def variant_name(model: str, path: str | None, naive: bool = False) -> str:
    """The committed tables' names (docs/design.md, "Results tables"): ``<model>_scores_to_memory``,
    ``<model>[_naive]_fused_topk[_filter]``."""
    if path is None:
        return f"{model}_scores_to_memory"
    return f"{model}_{'naive_' if naive else ''}fused_topk" + ("_filter" if path == "filter" else "")


@dataclass(frozen=True)
class ScoringCase(harness.Case):
    """One run of the fused kernel: scores to memory (``k`` None) or scoring + top-k by ``path``.
    ``experts`` / ``k_experts`` are None for the dot model."""

    variant: str
    model: str
    dtype: str
    d: int
    experts: int | None
    k_experts: int | None
    layout: str
    access: str
    eligible_fraction: float
    k: int | None
    path: str | None
    config: Settings | str = BEST
    math: str = "fp32"
    contender: bool = False  # a design candidate for the run's best configuration
    skip_with: str = ""
    note: str = ""

    def configs(self) -> tuple:
        from ..score.config import KernelConfig

        return () if self.config == BEST else (self.config.build(KernelConfig),)


@dataclass(frozen=True)
class UnfusedCase(harness.Case):
    """An unfused pipeline of the gated model: ``per_op`` (one kernel per model step, fp32
    intermediates in memory, then top-K) or ``pre_fusion`` (gather rows, score to memory, top-K)."""

    variant: str
    pipeline: str
    layout: str
    access: str
    eligible_fraction: float
    dtype: str = "fp16"
    d: int = 64
    experts: int = 6
    k_experts: int = 2
    k: int = 1000
    math: str = "fp32"


@dataclass(frozen=True)
class PeerCase(harness.Case):
    """A peer of the gated kernel (:mod:`.peers`): ``peer`` is ``triton`` (with its ``block``,
    ``warps`` and ``stages``), ``torch_eager`` or ``torch_compile``; every score to memory, the
    model of ``math="fp16"``, on the rows-layout fp16 table the gated rows of its phase read."""

    variant: str
    peer: str
    d: int = 64
    experts: int = 6
    k_experts: int = 2
    dtype: str = "fp16"
    layout: str = "rows"
    access: str = "pool"
    eligible_fraction: float = 1.0
    math: str = "fp16"
    block: int | None = None  # Triton only
    warps: int | None = None
    stages: int | None = None
    programs_per_sm: int | None = None


def peer(name: str, **settings) -> PeerCase:
    variant = {"triton": "triton_gated_scores_to_memory", "torch_eager": "torch_eager_gated",
               "torch_compile": "torch_compile_gated"}[name]
    return PeerCase(variant, name, **settings)


def scores(model, dtype="fp16", d=64, E=6, K=2, layout="tiles", config=BEST) -> ScoringCase:
    gated = model == "gated"
    return ScoringCase(variant_name(model, None), model, dtype, d, E if gated else None, K if gated else None, layout,
                       "pool", 1.0, None, None, config)


def fused(model, dtype="fp16", d=64, E=6, K=2, layout="tiles", access="pool", frac=1.0, k=1000, config=BEST,
          path="block", **plan) -> ScoringCase:
    gated = model == "gated"
    naive = config != BEST and bool(config.get("naive"))
    return ScoringCase(variant_name(model, path, naive), model, dtype, d, E if gated else None, K if gated else None,
                       layout, access, frac, k, path, config, **plan)


def unfused(pipeline, layout, access, frac=1.0) -> UnfusedCase:
    return UnfusedCase(f"unfused_{pipeline}", pipeline, layout, access, frac)


DESIGN_CONTENDERS = (cfg(values="chosen"), cfg(values="chosen", block=128), cfg(values="chosen", max_registers=128),
                     cfg(values="all"), cfg(values="all", block=128), cfg(naive=True),
                     # fewer top-K barriers: a fullness check every 2 / 4 / 8 rounds
                     cfg(values="chosen", max_registers=128, sync_every=2),
                     cfg(values="chosen", max_registers=128, sync_every=4),
                     cfg(values="chosen", max_registers=128, sync_every=8))
TC = cfg(tensor_cores=True, max_registers=128)
#: d -> (E, K) of the sweep
SWEEP_GRID = {64: [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (6, 1), (6, 2), (6, 4), (8, 1), (8, 2), (8, 4)],
              32: [(1, 1), (6, 2), (8, 4)], 128: [(1, 1), (6, 2), (8, 4)]}
SWEEP_DTYPES_GRID = {64: [(1, 1), (2, 1), (2, 2), (4, 2), (6, 2), (8, 2), (8, 4)], 32: [(1, 1), (6, 2), (8, 4)],
                     128: [(1, 1), (6, 2), (8, 4)]}
WEIGHTS_MODELS = (("gated", "fp16", 64, 6, 2), ("dot", "fp16", 64, 1, 1), ("dot", "int8", 64, 1, 1),
                  ("dot", "int8", 128, 1, 1))
WEIGHTS_CONFIGS = (cfg(weights="shared", max_registers=128), cfg(weights="shared", max_registers=128, guard="offset"),
                   cfg(weights="param", max_registers=128))
WEIGHTS_GATED_CONFIGS = (cfg(weights="param", max_registers=None), cfg(weights="param", max_registers=96),
                         cfg(weights="param", max_registers=80), cfg(weights="param", block=128, max_registers=128),
                         cfg(weights="shared", guard="offset", max_registers=None))



def in_math(case: ScoringCase, math: str) -> ScoringCase:
    """``case`` in a math mode, at the default configuration (the ``math`` column says which)."""
    return replace(case, math=math, config=cfg(math=math) if math != "fp32" else AUTO)


#: the E / K / d of the math phase: the source's headline model and the two the issue's targets name
MATH_MODELS = ((64, 6, 2), (64, 8, 4), (128, 6, 2))
#: phase -> cases, in run order
PHASES = {
    "design": (
        *(fused("gated", config=c, contender=not c.get("naive")) for c in DESIGN_CONTENDERS),
        scores("gated", config=cfg(values="chosen")), scores("gated", config=cfg(values="all")),
        fused("dot"), scores("dot"), fused("gated", layout="rows"), fused("dot", layout="rows")),
    "sync": (
        *(fused(m, config=cfg(values="chosen", max_registers=128, sync_every=every))
          for every in (1, 2, 4, 8) for m in ("gated", "dot")),
        scores("gated", config=cfg(values="chosen", max_registers=128))),
    "final": tuple(fused(m, d=d, E=E, K=K, layout=lay, access=a, frac=f) for m, d, E, K, lay, a, f in (
        ("gated", 64, 6, 2, "tiles", "pool", 1.0), ("dot", 64, 1, 1, "tiles", "pool", 1.0),
        ("gated", 64, 8, 4, "tiles", "pool", 1.0), ("gated", 64, 6, 2, "tiles", "bitset", 0.1),
        ("gated", 32, 6, 2, "tiles", "pool", 1.0), ("gated", 128, 6, 2, "tiles", "pool", 1.0),
        ("gated", 64, 6, 2, "rows", "bitset", 0.01), ("gated", 64, 6, 2, "rows", "candidates", 0.01))),
    "filter": (
        *(fused(m, E=E, K=K, layout=lay, access=a, frac=f, k=k, path="filter") for m, E, K, lay, a, f, k in (
            ("gated", 6, 2, "tiles", "pool", 1.0, 1000), ("gated", 6, 2, "tiles", "pool", 1.0, 4096),
            ("dot", 1, 1, "tiles", "pool", 1.0, 1000), ("gated", 6, 2, "rows", "pool", 1.0, 1000),
            ("gated", 6, 2, "tiles", "bitset", 0.5, 1000), ("gated", 6, 2, "tiles", "bitset", 0.1, 1000),
            ("gated", 6, 2, "tiles", "bitset", 0.01, 1000), ("gated", 6, 2, "rows", "bitset", 0.1, 1000),
            ("gated", 6, 2, "rows", "candidates", 0.01, 1000))),
        fused("gated", access="bitset", frac=0.1),  # the bitset tiles compacted in the kernel
        scores("gated"), scores("dot"), fused("gated")),
    "weights": tuple(scores(m, dt, d, E, K, config=c) for m, dt, d, E, K in WEIGHTS_MODELS
                     for c in WEIGHTS_CONFIGS + (WEIGHTS_GATED_CONFIGS if m == "gated" else ())),
    "tensor": (
        *(scores("gated", config=c) for c in (TC, cfg(tensor_cores=True, max_registers=None),
                                              cfg(tensor_cores=True, max_registers=96),
                                              cfg(tensor_cores=True, guard="offset", max_registers=128),
                                              cfg(weights="param", max_registers=96))),
        scores("dot", config=cfg(weights="param", max_registers=128)),
        *(scores("gated", dt, d, E, K, lay, TC) for dt, d, E, K, lay in (
            ("fp16", 64, 6, 2, "rows"), ("bf16", 64, 6, 2, "tiles"), ("fp16", 64, 8, 4, "tiles"),
            ("fp16", 128, 6, 2, "tiles"), ("fp16", 32, 6, 2, "tiles"))),
        *(fused("gated", access=a, frac=f, k=k, config=TC, path=p) for a, f, k, p in (
            ("pool", 1.0, 1000, "filter"), ("pool", 1.0, 4096, "filter"), ("pool", 1.0, 1000, "block"),
            ("bitset", 0.1, 1000, "filter")))),
    "defaults": (
        *(c for m, dt, d, E, K in (("gated", "fp16", 64, 6, 2), ("dot", "fp16", 64, 1, 1), ("dot", "int8", 64, 1, 1),
                                   ("dot", "fp16", 128, 1, 1), ("dot", "int8", 128, 1, 1))
          for c in (scores(m, dt, d, E, K, config=AUTO), fused(m, dt, d, E, K, config=AUTO, path="filter"))),
        *(fused("gated", layout=lay, access=a, frac=f, k=k, config=AUTO, path=p) for lay, a, f, k, p in (
            ("tiles", "pool", 1.0, 4096, "filter"), ("tiles", "pool", 1.0, 1000, "block"),
            ("tiles", "bitset", 0.1, 1000, "filter"), ("rows", "bitset", 0.1, 1000, "filter")))),
    "bitset_sweep": (
        fused("gated", config=AUTO, path="filter"),
        *(fused("gated", layout="rows", access="bitset", frac=0.1, config=c, path="filter") for c in (
            AUTO, cfg(max_registers=80), cfg(max_registers=64), cfg(block=128), cfg(block=512),
            cfg(blocks_per_sm=8), cfg(blocks_per_sm=8, max_registers=80), cfg(weights="shared")))),
    "int8": tuple(c for m, dt, d, E, K in (("dot", "fp16", 64, 1, 1), ("dot", "int8", 64, 1, 1),
                                           ("dot", "fp16", 128, 1, 1), ("dot", "int8", 128, 1, 1),
                                           ("gated", "int8", 64, 6, 2), ("gated", "fp16", 64, 6, 2))
                  for c in (scores(m, dt, d, E, K, config=AUTO),)
                  + ((fused(m, dt, d, E, K, config=AUTO, path="filter"),) if m == "dot" else ())),
    "bitset_auto": tuple(fused("gated", layout=lay, access="bitset", frac=0.1, config=AUTO, path="filter")
                         for lay in ("tiles", "rows")),
    "unfused": (unfused("per_op", "tiles", "pool"), unfused("per_op", "tiles", "candidates"),
                unfused("pre_fusion", "tiles", "candidates")),
    "dtype": tuple(fused(m, dt) for dt in ("fp32", "bf16", "int8") for m in ("gated", "dot")),
    "sweep": tuple(c for d, eks in SWEEP_GRID.items()
                   for c in (fused("dot", d=d),) + tuple(
                       fused("gated", d=d, E=E, K=K, skip_with="design" if (d, E, K) == (64, 6, 2) else "")
                       for E, K in eks)),
    "sweep_dtypes": tuple(c for dt in ("fp32", "bf16", "int8") for d, eks in SWEEP_DTYPES_GRID.items()
                          for c in (fused("dot", dt, d),) + tuple(fused("gated", dt, d, E, K) for E, K in eks)),
    "dense": (fused("gated", E=6, K=6),),
    # the fp16 math mode (gate and value dots on the tensor cores) beside fp32 math and the dot
    # product of the same d, same run, fp16 tables: scores to memory, the fused top-1000 (filter
    # path) and the sparse accesses
    "math": (
        *(c for d in (64, 128) for c in (in_math(scores("dot", d=d), "fp32"),
                                         in_math(fused("dot", d=d, path="filter"), "fp32"))),
        *(in_math(c, m) for d, E, K in MATH_MODELS for m in ("fp32", "fp16")
          for c in (scores("gated", d=d, E=E, K=K), fused("gated", d=d, E=E, K=K, path="filter"))),
        *(in_math(fused("gated", layout=lay, access=a, frac=f, path="filter"), m)
          for m in ("fp32", "fp16") for lay, a, f in (("tiles", "bitset", 0.1), ("rows", "bitset", 0.01),
                                                       ("rows", "candidates", 0.01)))),  # every expert's value dot product, K = E
    # the peers (Triton, torch.compile, eager PyTorch: the model of math="fp16", scores to memory)
    # beside the fused kernel in fp16 and fp32 math and the dot product, rows then tiles tables
    "peers": (
        in_math(scores("gated", layout="rows"), "fp16"),
        *(peer("triton", block=b, warps=w, stages=st, programs_per_sm=p) for b, w, st, p in TRITON_CONFIGS),
        peer("torch_compile"), peer("torch_eager"),
        in_math(scores("dot", layout="rows"), "fp32"),
        in_math(scores("gated"), "fp16"), in_math(scores("gated"), "fp32"), in_math(scores("dot"), "fp32"),
        in_math(fused("gated", path="filter"), "fp16"), in_math(fused("dot", path="filter"), "fp32")),
    # the register cap of the gated kernels: 128 (what max_registers="auto" gave every width before
    # the wide rows' kernels were found spilling ~400 bytes a thread at d = 128) against "auto"
    # (uncapped past d = 64), both maths, d = 64 and 128, one run
    "registers": tuple(c for m in ("fp16", "fp32") for d in (64, 128)
                       for c in (replace(in_math(scores("gated", d=d), m), config=cfg(math=m, max_registers=128)),
                                 in_math(scores("gated", d=d), m))),
    # int8 rows in fp16 math (dequantized to fp16 in the tile) against fp16 rows in fp16 math, int8
    # in fp32 math and the dot products of both dtypes: scores to memory over MATH_MODELS, and the
    # fused top-1000 (filter path) at d = 64, one run (the target: gated int8 >= 1.6x fp16);
    # first the E6 K2 int8 rows dequantized by a subtract and a multiply (dequant="mul"), against the
    # default's one fused multiply-add a pair (dequant=fma in the notes)
    "int8_math": (
        replace(in_math(scores("gated", "int8"), "fp16"), config=cfg(math="fp16", dequant="mul")),
        *(in_math(scores("dot", dt, d), "fp32") for d in (64, 128) for dt in ("fp16", "int8")),
        *(in_math(scores("gated", dt, d, E, K), m) for d, E, K in MATH_MODELS
          for dt, m in (("fp16", "fp16"), ("int8", "fp16"), ("int8", "fp32"))),
        *(in_math(fused("gated", dt, path="filter"), "fp16") for dt in ("fp16", "int8"))),
    # int8 rows in fp16 math are bound by neither bytes nor issue at 16 warps an SM (127 registers
    # uncapped, two blocks of 256): more resident warps for more row bytes in flight, against the
    # spills a register cap costs (ptxas, sm_90: 96 -> 128 bytes a thread, 80 -> 288, 64 -> 392),
    # each grid one wave of resident blocks; fp16 rows at the default beside them, scores to memory
    # and the fused top-1000, one run
    "int8_occupancy": (
        in_math(scores("gated", "fp16"), "fp16"), in_math(fused("gated", "fp16", path="filter"), "fp16"),
        *(replace(in_math(scores("gated", "int8"), "fp16"), config=cfg(math="fp16", **c)) for c in (
            {}, {"blocks_per_sm": 2}, {"max_registers": 96, "block": 128, "blocks_per_sm": 5},
            {"max_registers": 80, "blocks_per_sm": 3}, {"max_registers": 72, "block": 128, "blocks_per_sm": 7},
            {"max_registers": 64, "blocks_per_sm": 4})),
        *(replace(in_math(fused("gated", "int8", path="filter"), "fp16"), config=cfg(math="fp16", **c)) for c in (
            {}, {"max_registers": 80, "blocks_per_sm": 3}, {"max_registers": 64, "blocks_per_sm": 4})),
        # the two tiles' mma steps alternating (four accumulator chains in flight), both dtypes
        *(replace(in_math(case, "fp16"), config=cfg(math="fp16", tile_order="steps"))
          for dt in ("fp16", "int8") for case in (scores("gated", dt), fused("gated", dt, path="filter")))),
    # fp16 math's per-lane weights in shared memory (f16_weights="shared": 32 registers freed at
    # d 64) beside registers, each at the caps that freed registers would allow without spilling
    "f16_weights": (
        *(replace(in_math(case, "fp16"), config=cfg(math="fp16", f16_weights=w))
          for dt in ("fp16", "int8") for case in (scores("gated", dt), fused("gated", dt, path="filter"))
          for w in ("registers", "shared")),
        *(replace(in_math(case, "fp16"), config=cfg(math="fp16", f16_weights="shared", **c))
          for case in (scores("gated", "int8"), fused("gated", "int8", path="filter")) for c in (
              {"max_registers": 96, "block": 128, "blocks_per_sm": 5}, {"max_registers": 80, "blocks_per_sm": 3},
              {"max_registers": 64, "blocks_per_sm": 4})),
        # fp16 rows fit 96 registers too (ptxas, sm_90): five blocks of 128 an SM
        *(replace(in_math(case, "fp16"), config=cfg(math="fp16", f16_weights="shared", max_registers=96, block=128,
                                                     blocks_per_sm=5))
          for case in (scores("gated", "fp16"), fused("gated", "fp16", path="filter")))),
    # two rounds of rows in flight in registers (rows_ahead=2), the weights in shared memory to make
    # room, beside one round with the weights in either place: int8 and fp16 rows, scores to memory
    # and the fused top-1000 (int8 rows on the H200 read at 0.77 of the ceiling with one round)
    "rows_ahead": tuple(
        replace(in_math(case, "fp16"), config=cfg(math="fp16", **c))
        for dt in ("int8", "fp16") for case in (scores("gated", dt), fused("gated", dt, path="filter"))
        for c in ({}, {"f16_weights": "shared"}, {"f16_weights": "shared", "rows_ahead": 2})),
    # int8 rows through a shared-memory ring filled by cp.async (ring_stages: 1-3 rounds in flight
    # without registers), blocks of 128 (four an SM, the occupancy of two of 256) beside the default
    # launch and blocks of 128 without a ring; scores to memory and the fused top-1000
    "ring": tuple(
        replace(in_math(case, "fp16"), config=cfg(math="fp16", **c))
        for case in (scores("gated", "int8"), fused("gated", "int8", path="filter"))
        for c in ({}, {"block": 128, "blocks_per_sm": 4},
                  *({"block": 128, "blocks_per_sm": 4, "ring_stages": r} for r in (2, 3, 4)))),
    # int8 rows' scales as the table's fp16 pairs (the default: 16 fewer instructions a round) beside
    # the float32 scales made into pairs each round (row_scales="fp32"), and fp16 rows for the int8 /
    # fp16 ratio; scores to memory and the fused top-1000
    "row_scales": tuple(
        replace(in_math(case, "fp16"), config=cfg(math="fp16", **c))
        for dt, settings in (("fp16", ({},)), ("int8", ({}, {"row_scales": "fp32"})))
        for case in (scores("gated", dt), fused("gated", dt, path="filter")) for c in settings),
    # fp16 math's loop over rounds in two (loop="auto": the rounds followed by a whole round run
    # unchecked, ~28 % fewer instructions a round) beside one checked loop, fp16 and int8 rows,
    # scores to memory and the fused top-1000
    "loop": tuple(
        replace(in_math(case, "fp16"), config=cfg(math="fp16", **c))
        for dt in ("fp16", "int8") for case in (scores("gated", dt), fused("gated", dt, path="filter"))
        for c in ({}, {"loop": "checked"})),
    # how large may the model grow: gated / dot time against the model's FLOPs per ad, per math mode
    "frontier": (
        *(in_math(scores("dot", d=d), "fp32") for d in FRONTIER_D),
        *(in_math(scores("gated", d=d, E=E, K=K), m) for m in ("fp16", "fp32") for d in FRONTIER_D
          for E, K in FRONTIER_EK)),
    "access": (
        *(fused("gated", layout=lay, access=a, frac=f) for lay in ("rows", "tiles")
          for a, f in (("bitset", 0.5), ("bitset", 0.1), ("bitset", 0.01), ("candidates", 0.1), ("candidates", 0.01))),
        *(c for f in (0.1, 0.01) for c in (unfused("pre_fusion", "rows", "bitset", f),
                                           unfused("per_op", "rows", "bitset", f)))),
}
DEFAULT_PHASES = ("design", "unfused", "dtype", "sweep", "dense", "access")


def cases(options: harness.Options) -> dict:
    return PHASES


# ----------------------------------------------------------------------------- measuring


def model_flops(model: str, d: int, E: int, K: int, values: str = "chosen") -> float:
    """FLOPs per ad (a multiply-add counts 2): gated = encode 2d + gate 2Ed + values 2Kd (or 2Ed when
    all E value dots are computed) + softmax/choice ~4E; dot = 2d."""
    if model == "dot":
        return 2.0 * d
    return 2 * d + 2 * E * d + 2 * (E if values == "all" else K) * d + 4 * E


def verify_scores_sample(dreq, table, scores_dev=None, rng=None, eligible_mask=None, config=None):
    """Score a random sample of slots through the candidates path (same kernel configuration) and
    compare with the oracle; if ``scores_dev`` (a scores array the case wrote) is given, the same
    slots must hold equal values. Returns a :class:`~andromeda_nb.checks.Check`."""
    import cupy as cp

    from .. import checks
    from ..score.api import score_ads
    from ..score.config import KernelConfig
    from .tables import host_rows

    config = (config or KernelConfig(math="fp32")).with_math(dreq, table)  # the math the kernel ran
    rng = rng or np.random.default_rng(0)
    slots = np.sort(rng.choice(table.n_ads, min(SAMPLE, table.n_ads), replace=False))
    got = score_ads(dreq, table, candidates=slots.astype(np.int32), config=config).copy_to_host()
    rows = host_rows(table, slots)
    if dreq.model == "dot":
        from .. import reference

        ref = reference.dot_score(dreq.user, rows)
        scale = np.abs(rows.dequantized()) @ np.abs(dreq.user.astype(np.float64)) + np.abs(rows.bias)
        err = np.abs(got - ref)
        ok = bool(np.all(err <= checks.SCORE_RTOL * scale.max()))
        result = checks.Check(ok, f"{got.size} dot scores vs float64, max err {err.max():.2g}")
    else:
        result = checks.compare_scores(got, dreq.request, rows, math="fp32" if config is None else config.math)
    if result.ok and scores_dev is not None:
        written = cp.asarray(scores_dev)[cp.asarray(slots)].get()
        if eligible_mask is not None:
            elig = cp.asarray(eligible_mask)[cp.asarray(slots)].get()
            if not (np.array_equal(written[elig], got[elig]) and np.isnan(written[~elig]).all()):
                return checks.Check(False, "written scores differ from the candidates path on the sample")
        elif not np.array_equal(written, got):
            return checks.Check(False, "written scores differ from the candidates path on the sample")
    return result


def access_inputs(n, access, frac, seed):
    """(elig device bitset or None, cand device int32 or None, items scored, n_items, eligible mask)."""
    import cupy as cp

    from ..device import launch
    from .tables import bernoulli_bitset, bitset_mask

    cuda = launch.cuda()
    if access == "bitset":
        words, items = bernoulli_bitset(n, frac, seed)
        return cuda.as_cuda_array(words), None, items, n, bitset_mask(words, n)
    if access == "candidates":
        mask = cp.random.RandomState(seed).random_sample(n, dtype=cp.float32) < frac
        c = cp.flatnonzero(mask).astype(cp.int32)
        return None, cuda.as_cuda_array(c), int(c.size), int(c.size), mask
    return None, None, n, n, None


def scores_full(dreq, table, access, elig, cand, n_items, config):
    """All scores of the case written to memory, indexed by slot (NaN where not scored)."""
    import cupy as cp

    from ..device import launch
    from ..score.launches import launch_score

    out = launch.cuda().device_array(n_items, np.float32)
    launch_score(dreq, table, access, elig, cand, n_items, out, config)
    if access != "candidates":
        return out
    full = cp.full(table.n_ads, cp.nan, dtype=cp.float32)
    full[cp.asarray(cand)] = cp.asarray(out)
    return full


def config_note(config, dtype: str = "fp16") -> str:
    """The launch settings of a scoring row on a table of ``dtype``: every setting off the default
    spelled ``name=value`` (:data:`~andromeda_nb.analysis.results.EXPERIMENT` catches those)."""
    from ..device import launch
    from ..score.config import KernelConfig

    parts = ["naive" if config.naive else f"values={config.values}", f"block={config.threads()}",
             f"items={config.items}"]
    if config.max_registers:
        parts.append(f"maxreg={config.max_registers}")
    if config.blocks_per_sm != launch.GPU_BLOCKS_PER_SM:
        parts.append(f"blocks/SM={config.blocks_per_sm}")
    if config.sync_every != 1:
        parts.append(f"sync_every={config.sync_every}")
    if config.weights != "shared":
        parts.append(f"weights={config.weights}")
    if config.guard != "fence":
        parts.append(f"guard={config.guard}")
    if config.tensor_cores:
        parts.append("tensor_cores (3xTF32 mma)")
    if config.math != "fp32":
        parts.append(f"math={config.math} (mma.m16n8k16, fp32 accumulate)")
    int8_f16 = dtype == "int8" and config.math == "fp16"  # the only kernels that widen int8 rows to fp16
    if int8_f16 and config.dequant == "fma":
        parts.append("dequant=fma (one HFMA2 a pair of int8 values)")
    elif int8_f16 and config.dequant == "mul":
        parts.append("dequant=mul (an HADD2 and an HMUL2 a pair of int8 values)")
    if config.kernel_tile_order() != KernelConfig.tile_order:  # only where it differs from the default
        parts.append(f"tile_order={config.tile_order}")
    if config.kernel_f16_weights() == "shared":
        parts.append("f16_weights=shared")
    if config.kernel_rows_ahead() != 1:
        parts.append(f"rows_ahead={config.kernel_rows_ahead()}")
    if config.kernel_ring_stages():
        parts.append(f"ring_stages={config.kernel_ring_stages()}")
    if config.kernel_row_scales(dtype):
        parts.append("scales as fp16 pairs (made once a table)" if config.row_scales == "auto" else
                     "row_scales=fp16_pairs (the int8 scales as fp16 pairs made once a table)")
    elif config.row_scales == "fp32" and int8_f16:
        parts.append("row_scales=fp32 (the int8 scales made into fp16 pairs each round)")
    if not config.kernel_split_loop() and config.math == "fp16":
        parts.append("loop=checked")
    return " ".join(parts)


def _request(run, case):
    from ..score.table import DeviceRequest

    E, K = case.experts or 1, case.k_experts or 1
    return DeviceRequest.of(Request.random(case.d, E, K, run.rng) if case.model == "gated"
                            else run.rng.standard_normal(case.d))


def fused_row(run, case: ScoringCase) -> dict:
    """Fused scoring + top-k timed, verified against torch.topk of the same kernel's scores, as a
    row. ``case.path``: "block" (launch_score_topk) or "filter" (launch_score_filter; a seeded run
    that is not exact, where score_topk would fall back to the block path, fails the row)."""
    from .. import checks
    from ..score.launches import (ScoreFilterWorkspace, _resolve, launch_score_filter, launch_score_topk,
                                  topk_workspace)
    from ..score.unfused import fused_bytes_per_ad
    from ..topk.api import seeded_outcome

    config = run.config(case)
    model, dtype, d, E, K = case.model, case.dtype, case.d, case.experts or 1, case.k_experts or 1
    access, frac, k, path, notes = case.access, case.eligible_fraction, case.k, case.path, case.note
    table = run.tables.get(dtype, d, case.layout)
    n = table.n_ads
    dreq = _request(run, case)
    elig, cand, items, n_items, mask = access_inputs(n, access, frac, seed=int(frac * 1e4) + 1)
    if path == "filter":
        sfw = ScoreFilterWorkspace.make(n_items, k, access)
        res = sfw.fws

        def call():
            return launch_score_filter(dreq, table, k, access, elig, cand, n_items, config, sfw)
    else:
        res = topk_workspace(table, k, n_items, config)

        def call():
            return launch_score_topk(dreq, table, k, access, elig, cand, n_items, config, res)
    timing = harness.time_device(call, reps=run.options.reps)
    verified = verify_scores_sample(dreq, table, rng=run.rng, config=config)
    if path == "filter":
        c = res.counts.copy_to_host()[0]
        outcome = seeded_outcome(res, k, c)
        notes = (f"seeded filter path: {sfw.sws.m} sampled ads scored, seed = their top-{sfw.sws.r}, {int(c[1])} "
                 f"scores reached it (buffer {res.cap})" + (f"; {notes}" if notes else ""))
        if verified.ok and outcome != "exact":
            verified = checks.Check(False, f"seeded run not exact ({outcome}: {c[1]} scores reached the seed): "
                                           "score_topk would fall back to the block path")
    if verified.ok:
        full = scores_full(dreq, table, access, elig, cand, n_items, config)
        verified = harness.verify_topk_torch(res.out_id[0], res.out_s[0], full, k,
                                             eligible_mask=mask if access == "bitset" else None)
        del full
    resolved = _resolve(config, dreq, table, access, 0 if path == "filter" else k, True)
    return harness.row("scoring", run.env, run.ceil, timing, items, fused_bytes_per_ad(d, dtype, access, frac),
                       model_flops(model, d, E, K, "all" if config.tensor_cores else config.values), str(verified),
                       **case.columns(), n_ads=n,
                       notes=f"{config_note(resolved, dtype)}; items = ads scored{'; ' + notes if notes else ''}")


def scores_row(run, case: ScoringCase) -> dict:
    """Scores of the whole pool written to memory (4 B an ad), the written scores checked on a
    sample against the candidates path and the oracle."""
    from ..device import launch
    from ..score.launches import _resolve, launch_score
    from ..score.unfused import fused_bytes_per_ad

    config = run.config(case)
    model, dtype, d, E, K = case.model, case.dtype, case.d, case.experts or 1, case.k_experts or 1
    table = run.tables.get(dtype, d, case.layout)
    n = table.n_ads
    dreq = _request(run, case)
    out = launch.cuda().device_array(n, np.float32)
    timing = harness.time_device(lambda: launch_score(dreq, table, "pool", None, None, n, out, config),
                                 reps=run.options.reps)
    verified = verify_scores_sample(dreq, table, scores_dev=out, rng=run.rng, config=config)
    return harness.row("scoring", run.env, run.ceil, timing, n, fused_bytes_per_ad(d, dtype) + 4,
                       model_flops(model, d, E, K, "all" if config.tensor_cores else config.values), str(verified),
                       **case.columns(), n_ads=n,
                       notes=f"{config_note(_resolve(config, dreq, table, 'pool'), dtype)}; scores written to memory (4 B/ad)")


def scoring_row(run, case: ScoringCase) -> dict:
    return scores_row(run, case) if case.path is None else fused_row(run, case)


def peer_row(run, case: PeerCase) -> dict:
    """A peer's every score to memory (:mod:`.peers`), timed with events like the kernels' rows,
    checked on a sample against the float64 oracle of the fp16 model; its top-1000 against the
    fused kernel's (fp16 math) on the same table and request, in the notes."""
    import torch

    from .. import checks
    from ..score.api import score_ads
    from ..score.config import KernelConfig
    from ..score.unfused import fused_bytes_per_ad
    from .peers import peer_weights, table_tensors, torch_gated_scores, triton_gated_scores
    from .tables import host_rows

    d, E, K = case.d, case.experts, case.k_experts
    table = run.tables.get(case.dtype, d, case.layout)
    n = table.n_ads
    req = Request.random(d, E, K, run.rng)
    rows, bias = table_tensors(table)
    w = peer_weights(req)
    out = torch.empty(n, dtype=torch.float32, device="cuda")
    if case.peer == "triton":
        def call():
            triton_gated_scores(rows, bias, w, out, case.block, case.warps, case.stages, case.programs_per_sm)
        how = (f"Triton, {case.block} rows a block, {case.warps} warps, {case.stages} stages, "
               + (f"persistent: {case.programs_per_sm} programs an SM" if case.programs_per_sm else "a program a block"))
    else:
        def call():
            torch_gated_scores(rows, bias, w, out, compiled=case.peer == "torch_compile")
        how = f"PyTorch {'torch.compile' if case.peer == 'torch_compile' else 'eager'}, chunks of 2^21 rows"
    call()  # compiles (Triton, Inductor) outside the timing
    torch.cuda.synchronize()
    timing = harness.time_device(call, reps=run.options.reps)
    slots = np.sort(run.rng.choice(n, min(SAMPLE, n), replace=False))
    got = out[torch.as_tensor(slots, device="cuda")].cpu().numpy()
    verified = checks.compare_scores(got, req, host_rows(table, slots), math="fp16")
    ours = torch.as_tensor(score_ads(req, table, config=KernelConfig(math="fp16")), device="cuda")
    top_peer = torch.topk(out, 1000).indices
    top_ours = torch.topk(ours, 1000).indices
    same = int(torch.isin(top_peer, top_ours).sum())
    del ours, out
    return harness.row("scoring", run.env, run.ceil, timing, n, fused_bytes_per_ad(d, case.dtype) + 4,
                       model_flops("gated", d, E, K, "all"), str(verified), **case.columns(), n_ads=n,
                       notes=f"{how}; scores written to memory (4 B/ad); top-1000 shares {same} ads with the "
                             "fused kernel's (math='fp16') on the same table and request")


#: the notes of the unfused rows: (pipeline, access) -> what the pipeline does
UNFUSED_NOTES = {
    ("per_op", "pool"): "intermediates fp32 in device memory",
    ("per_op", "candidates"): "every ad as a candidate list; intermediates fp32 in device memory",
    ("pre_fusion", "candidates"): "gather rows to a contiguous buffer, score to memory, then top-K",
    ("pre_fusion", "bitset"): "bitset -> slot list, gather rows, score to memory, top-K",
    ("per_op", "bitset"): "bitset -> slot list, one kernel per model step (fp32 intermediates), top-K",
}


def unfused_row(run, case: UnfusedCase) -> dict:
    """An unfused pipeline over the pool, every ad as a candidate list (slots 0..n-1) or an i.i.d.
    eligible bitset, verified against torch.topk of its own (per-op, pool or candidates) or the
    fused kernel's scores (the others). Its buffers (tens of GB at 10^8 ads) are freed after it."""
    import cupy as cp

    r = _unfused_row(run, case)
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()
    return r


def _unfused_row(run, case: UnfusedCase) -> dict:
    import cupy as cp

    from ..device import launch
    from ..score.unfused import (PerOpBuffers, PreFusionBuffers, launch_per_op, launch_pre_fusion,
                                 per_op_bytes_per_ad, pre_fusion_bytes_per_ad)
    from ..topk.api import TopKWorkspace, scan_lists

    d, E, K, k, dtype, access, frac = (case.d, case.experts, case.k_experts, case.k, case.dtype, case.access,
                                       case.eligible_fraction)
    table = run.tables.get(dtype, d, case.layout)
    n = table.n_ads
    dreq = _request(run, case)
    elig = cand = mask = None
    items = n
    if access == "bitset":
        elig, _, items, _, mask = access_inputs(n, "bitset", frac, seed=int(frac * 1e4) + 1)
    elif access == "candidates":
        cand = launch.cuda().as_cuda_array(cp.arange(n, dtype=cp.int32))
    offsets, ks = np.array([0, items], np.int64), np.array([k], np.int64)
    ws = TopKWorkspace(offsets, ks, scan_lists(offsets, ks))
    if case.pipeline == "per_op":
        bufs = PerOpBuffers(items, d, E, K)
        if access == "bitset":
            def call():
                return launch_per_op(dreq, table, k, bufs, ws=ws, elig=elig, m=items)
        else:
            def call():
                return launch_per_op(dreq, table, k, bufs, ws=ws, cand=cand)
        budget = per_op_bytes_per_ad(d, E, K, dtype, access, frac)
    else:
        bufs = PreFusionBuffers(items, d, dtype)

        def call():
            return launch_pre_fusion(dreq, table, k, bufs, items, elig=elig, cand=cand, ws=ws)
        budget = pre_fusion_bytes_per_ad(d, dtype, access, frac)
    timing = harness.time_device(call, reps=run.options.reps)
    if case.pipeline == "per_op" and access != "bitset":
        full = bufs.score  # indexed by slot: the pool, or every slot listed in order
    else:
        from ..score.config import KernelConfig

        full = scores_full(dreq, table, "bitset" if access == "bitset" else "pool", elig, None, n,
                           KernelConfig(math="fp32"))
    verified = harness.verify_topk_torch(ws.out_id[0], ws.out_s[0], full, k, eligible_mask=mask)
    fmt = ".3g" if access == "bitset" else "g"
    return harness.row("scoring", run.env, run.ceil, timing, items, sum(budget.values()),
                       model_flops("gated", d, E, K), str(verified), **case.columns(), n_ads=n,
                       notes=f"{UNFUSED_NOTES[case.pipeline, access]}; bytes/ad "
                             + ", ".join(f"{a} {b:{fmt}}" for a, b in budget.items()))


class Run(harness.Run):
    """The scoring run: one GPU table at a time, one random stream, the design phase's contenders."""

    MEASURE = {ScoringCase: scoring_row, UnfusedCase: unfused_row, PeerCase: peer_row}

    def __init__(self, env, ceil, options):
        from .tables import TableCache

        super().__init__(env, ceil, options)
        self.tables = TableCache(options.n_ads)
        self.rng = np.random.default_rng(1)
        self.tried = []  # (items_per_s, KernelConfig) of the verified design contenders
        self._announced = False

    def config(self, case: ScoringCase):
        """The case's KernelConfig, its math the case's ``math`` column unless the settings name one
        (the default ``math="auto"`` would pick fp16 math on fp16 tables behind an fp32 row)."""
        cfg = self._config(case)
        return cfg if cfg.math != "auto" else replace(cfg, math=case.math)

    def _config(self, case: ScoringCase):
        from ..score.config import DEFAULT_CONFIG, KernelConfig

        if case.config != BEST:
            return case.config.build(KernelConfig)
        if not self.tried:
            return DEFAULT_CONFIG
        best = max(self.tried, key=lambda t: t[0])[1]
        if not self._announced:
            print(f"best configuration (used by the later phases): {config_note(best)}")
            self._announced = True
        return best

    def measure(self, planned):
        rows = super().measure(planned)
        case = planned.case
        if getattr(case, "contender", False) and rows[0]["verified"].startswith("ok"):
            self.tried.append((float(rows[0]["items_per_s"]), self.config(case)))
        return rows

    def close(self):
        self.tables.clear()
