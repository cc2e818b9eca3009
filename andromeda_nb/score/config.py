"""How the scoring kernels run: :class:`KernelConfig` and the limits it is checked against."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from ..arguments import is_int
from ..device import launch

if TYPE_CHECKING:
    from .table import DeviceRequest

#: Embedding dimensions the kernels accept: multiples of 8 (whole 8-byte words for every dtype).
MAX_D = 256


@dataclass(frozen=True)
class KernelConfig:
    """How the scoring kernels run (every field has a default chosen by measurement on the H200,
    recorded in data/results/scoring.csv; ``"auto"`` fields are resolved per request by
    :meth:`resolved`).

    Attributes:
        values: ``"chosen"`` (value dots of the K chosen experts only, h kept in registers) or
            ``"all"`` (all E value dots in one streaming pass; fewer registers, more FMAs).
        block: threads per block (None: 256 on a GPU, 32 in the simulator).
        max_registers: register cap per thread (None: the compiler's choice; ``"auto"``: 96 for the
            gated model with weights in kernel parameters outside the block top-K, else 128, for
            rows up to d = :data:`REGISTER_CAP_MAX_D` and the dot product (the fastest measured;
            two blocks of 256 threads an SM); none for the gated model's wider rows: capped at 128,
            its d = 128 kernels spill ~400 bytes a thread (ptxas for sm_90, fp16 and fp32 math,
            shared or parameter weights; uncapped, 155 to 234 registers, no spill) and the fp16
            one ran at 0.43 of the read ceiling).
        items: ads each thread scores between two block top-K barrier pairs (fused block top-K).
            1 is the default: more overlaps the round's ads, and ptxas then spills (items = 4 gave
            255 registers and a spill stack, ~10x slower).
        sync_every: top-K rounds between two barrier pairs of the fused block top-K (the shared
            buffer grows to hold that many rounds of candidates); 2 to 8 measured no faster than 1.
        blocks_per_sm: grid size of the grid-stride loop, in blocks per SM.
        naive: use the first loop-based kernel (:mod:`.naive`) instead of the generated one.
        weights: where the per-ad loop reads gamma, beta and the gate keys G (and the dot kernel's
            user vector) from: ``"shared"`` (16-byte shared loads from the weight image) or
            ``"param"`` (a tuple kernel argument: ptxas reads it from the constant bank with
            uniform loads, no shared-memory traffic; V stays in shared memory, its rows differ
            per ad). ``"param"`` needs the tuple within :data:`PARAM_FLOATS`. ``"auto"`` (default):
            ``"param"`` where it fits (d = 64, E = 6: 512 floats) and the kernel is the generated
            CUDA-core one with ``values="chosen"`` scoring one request, else ``"shared"``: the
            128 shared loads per ad limited the shared-weight kernel, the parameter weights ran
            about 1.2x faster on the full pool.
        guard: how the scores-to-memory and filter kernels keep ptxas from hoisting the shared
            weight loads out of the ad loop: ``"fence"`` (a block-scope fence per ad) or
            ``"offset"`` (an address offset that is zero at run time but unknown to ptxas).
        tensor_cores: fp32 math's TF32 tensor-core variant (fp16 math, the default ``math``, runs on
            the tensor cores without it): the gate and value dot products as ``mma.sync`` m16n8k8
            TF32, each operand split into a TF32 high and low part rounded to nearest, three
            products summed: ~2^-22 relative error per product against fp32's 2^-24), a warp
            scoring 32 ads at once; every expert's value dot is computed (8 per tile). Gated
            model, fp16 or bf16 tables, d a multiple of 16, E <= 8, whole warps; the weight image
            (192 d bytes) and the result tiles (68 bytes per thread) must fit in 48 KiB of shared
            memory (d <= 160 at block 256). Its error against the float64 reference can exceed
            the fp32 tolerance on rows of magnitude ~1000 (logits in the thousands); it measured
            no faster than fp32 math on the CUDA cores (L1 / shared-pipe bound), so it is off.
        math: ``"auto"`` (default), ``"fp32"`` or ``"fp16"``. ``"fp32"``: the model as written,
            every product and sum in fp32. ``"fp16"``: h, the gate keys and the values rounded to
            fp16, the gate logits and value dots on the tensor cores (``mma.sync`` m16n8k16, fp32
            accumulation), softmax, expert choice and combination in fp32 (docs/design.md, "Storage
            and math"); it computes :func:`~andromeda_nb.reference.score` with ``math="fp16"`` to
            fp32 accuracy; fp16 or int8 tables (an int8 row dequantized to fp16 first: q times its
            scale rounded to fp16, the product rounded once), d a multiple of 16, E <= 8; a request
            whose weights, or whose encoded ads (``|gamma| max|a| + |beta|``), could leave the fp16
            range is refused, as is an int8 table whose rows (``127 max scale``) could.
            ``"auto"`` (:meth:`with_math`): fp16 on fp16 and int8 tables where it applies and the
            request and table fit, else fp32.
            The default because fp16 math measured 1.4x (E6 K2) to 1.7x (E8 K4) faster on the
            H200 (fp16 tables, 10^8 ads, scores to memory, each ratio within one run) and kept recall@100 within 0.01 point
            of fp32 (5-seed means), top-100 overlap >= 0.997, on both datasets (the precision
            notebook; the rule: at most 0.1 point, overlap >= 0.99); on int8 tables, against fp32
            math on the same int8 rows, the same, at 2.2x fp32 math's speed (E6 K2 d64, one run).
        dequant: how fp16 math widens an int8 table's rows: ``"mul"`` (per pair of values a
            subtract and a multiply by the row scale), ``"fma"`` (one fused multiply-add, the same
            bits, where every scale of the table has at most 7 significant bits and is at most 56:
            :meth:`~.table.DeviceAdTable.fma_dequant`, true for tables quantized here) or ``"auto"``
            (default): ``"fma"`` where the table allows it, else ``"mul"``. ``"fma"`` on a table
            whose scales do not allow it is refused (it would change the scores).
        tile_order: the order of fp16 math's work within a round, a warp's two tiles of 16 ads:
            ``"tiles"`` (default: tile 0's mma steps, its next-round loads, then tile 1's) or
            ``"steps"`` (the tiles' steps alternating, then both tiles' loads: four independent
            accumulator chains in one basic block; the int8 E6 K2 d64 loop in 390 SASS
            instructions against 401, 123 registers against 127; on the H200 within 2 % of
            "tiles", fp16 and int8 rows, 10^8 ads). The same scores either way; other kernels
            ignore it.
        f16_weights: where fp16 math keeps each lane's share of the request's weights (32
            registers at d = 64): ``"registers"`` (loaded once a kernel) or ``"shared"`` (the
            per-lane image in shared memory, read step by step, the tiles' steps alternating:
            registers freed for resident warps or loads in flight, for int8 rows, whose kernel
            is not bound by bytes at the 128-register cap: ptxas for sm_90 fits the int8 E6 K2
            d64 filter pass in 96 registers without spilling, against 140 bytes of spill loads
            with the weights in registers; each step's words are stored lane-contiguous, one
            bank a lane). ``"auto"`` (default): registers. On the H100 (E6 K2 d64, 10^8 ads, three
            runs) shared weights ran the kernels at 1.004-1.033x registers' speed at the default
            caps (fp16 rows scores / fused top-1000 ~21.5 / 23.0 G ads/s, int8 ~39 / 40.8 G; both
            near the read ceiling there), but ``score_topk`` on int8 rows at 0.97-1.02x by wall
            clock; lower caps did not help int8 rows (0.59-0.98x registers'). On the H200 (one
            run) shared weights ran int8 rows 5 % (scores) and 8 % (fused top-1000) slower, fp16
            rows 2 % faster and 7 % slower. The same scores either way.
        rows_ahead: rounds of rows fp16 math keeps in flight in registers, where each round's rows
            are loaded while the previous one computes (the full pool, candidate lists, a bitset
            outside a selection): ``1`` or ``2`` (a second set of the round's row registers: 16
            more a thread for int8 rows at d = 64, 32 for fp16 rows; with the weights in
            registers that passes the 128-register cap, so pair it with ``f16_weights="shared"``).
            ``"auto"`` (default): 1. The int8 kernel on the H200 reads at 0.77-0.79 of the
            ceiling with one round (2 KB a warp) in flight; on the H100 (E6 K2 d64, 10^8 ads, one run) two
            rounds ran 1-4.3 % slower than one, both dtypes, the weights shared; on the H200 (one
            run) 1-4 % slower than shared weights with one round, int8 and fp16 rows alike. The
            same scores either way.
        ring_stages: int8 rows in fp16 math on the full pool through a shared-memory ring of this
            many rounds a warp (2-4), filled by asynchronous copies (``cp.async``) instead of
            register loads: ``ring_stages - 1`` rounds of rows in flight with no register held
            for them (built for the H200, where the int8 kernel stops at 0.77-0.82 of the
            ceiling). A round's copies go out in one block of PTX from 32-bit shared addresses:
            at E6 K2 d64 with 3 rounds, 304 instructions a round in the split loop against the
            register loads' 274, 335 checked (``ptxcheck --sass``). A slot holds a warp's 32 rows and scales (2,176
            bytes at d = 64), so the ring takes ``block / 32 * ring_stages`` of them: with
            blocks of 256 even two slots pass Numba's 48 KiB of static shared memory beside the
            result tile; use blocks of 128 (at d = 128, two slots). Only kernels over the whole
            table take it: fp16 tables, eligible sets, candidate lists, a table with free slots
            (a live pool scores its live bitset) and the block top-K with ``items`` > 1 ignore
            it, and their shared memory is counted without it; it excludes ``rows_ahead=2``.
            ``"auto"`` (default): 0, no ring: before the copies were cut from 457 instructions a
            round (one checked loop) to the counts above, on the H100 (E6 K2 d64, 10^8 ads, one
            run) 2-4 rounds ran 0-2 % slower, kernels and ``score_topk``; on the H200 (one run)
            4-11 % slower than register loads in blocks of 128: with 3 rounds the wait on memory
            falls from 2.1 to 0.5 cycles an instruction (Nsight Compute), but the ring's extra
            instructions cost more. The cut ring on the H100 (one run): N = 3 0.7-1.9 % faster than
            the register loads (scores to memory, fused top-1000, ``score_topk``); not yet measured
            on the H200, so ``"auto"`` stays 0. The same scores either way
            (the simulator, H100 and H200).
        row_scales: how fp16 math reads an int8 table's row scales: ``"fp32"`` (the table's float32
            scale, made into the fp16 pair ``(s, -1152 s)`` each round: 3 instructions a row) or
            ``"fp16_pairs"`` (those pairs made once a table, :meth:`.table.DeviceAdTable.scale_pairs`:
            4 more bytes a row of device memory, made at the first request that reads them, the
            same bytes read a row; a live pool's update writes them with the scales; 381
            instructions a round against 398 at E6 K2 d64). Scores and the filter path's kernels
            take it; a live pool's batches read the float scales. ``"auto"`` (default):
            ``"fp16_pairs"``: on the H100 (E6 K2 d64, 10^8 ads, one run) the fused top-1000 ran
            2.5 % faster, ``score_topk`` 2 % by wall time, scores to memory the same (bound by
            bytes there); on the H200 (one run) scores 1.2 % faster, the fused top-1000 5 %,
            ``score_topk`` 2.4 % by wall time (6 % device). The same scores either way.
        loop: how fp16 math's kernels over the whole pool (scores to memory and the filter pass)
            run their rounds: ``"split"`` (two loops: first every round whose next round, or with
            the ring the round its copies fill, is whole, with no bounds check, zero fill or
            conditional store, then the last rounds checked: 274 instructions an int8 round
            against 335 checked at E6 K2 d64, fp16 rows 207 against 267, ``ptxcheck --sass``) or
            ``"checked"`` (one loop, every round checked). Kernels with two rounds ahead or an L2
            prefetch, the block top-K and other access paths run one checked loop either way. ``"auto"`` (default): ``"split"``: on
            the H100 (10^8 ads, one run, bound by bytes there) 0-1.5 % faster, kernels and
            ``score_topk`` alike; on the H200, where the int8 kernel is bound by its own
            instructions, ``score_topk``'s device time 12.6 % lower on int8 rows and 6.5 % on
            fp16 rows than with one loop (one run each). The same scores either way.
    """

    values: str = "chosen"
    block: int | None = None
    max_registers: int | None | str = "auto"
    items: int = 1
    sync_every: int = 1
    blocks_per_sm: int = launch.GPU_BLOCKS_PER_SM
    naive: bool = False
    weights: str = "auto"
    guard: str = "fence"
    tensor_cores: bool = False
    math: str = "auto"
    dequant: str = "auto"
    tile_order: str = "tiles"
    f16_weights: str = "auto"
    rows_ahead: int | str = "auto"
    ring_stages: int | str = "auto"
    row_scales: str = "auto"
    loop: str = "auto"

    def __post_init__(self):
        for name, allowed in (("weights", ("auto", "shared", "param")), ("guard", ("fence", "offset")),
                              ("values", ("chosen", "all")), ("math", ("auto", "fp32", "fp16")),
                              ("dequant", ("auto", "mul", "fma")), ("tile_order", ("tiles", "steps")),
                              ("f16_weights", ("auto", "registers", "shared")),
                              ("row_scales", ("auto", "fp32", "fp16_pairs")), ("loop", ("auto", "split", "checked"))):
            v = getattr(self, name)
            if not isinstance(v, str) or v not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {v!r}")
        for name, allowed in (("rows_ahead", (1, 2)), ("ring_stages", (0, 2, 3, 4))):
            v = getattr(self, name)
            if isinstance(v, str) and v == "auto":
                continue
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or int(v) not in allowed:
                raise ValueError(f"{name} must be 'auto' or one of {allowed}, got {v!r}")
            object.__setattr__(self, name, int(v))  # a numpy integer as the same cache key as an int
        if self.rows_ahead == 2 and self.ring_stages not in ("auto", 0):
            raise ValueError("rows_ahead=2 and ring_stages are two ways to keep rows in flight: set one")
        for name in ("tensor_cores", "naive"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.math == "fp16" and (self.tensor_cores or self.naive or self.weights == "param"):
            raise ValueError("math='fp16' runs the generated tensor-core kernel with its own weights (not "
                             "tensor_cores=True, not naive, not weights='param')")
        if self.math == "fp16" and self.block is not None and self.block % 32:
            raise ValueError(f"math='fp16' needs whole warps: block must be a multiple of 32, got {self.block}")
        if self.tensor_cores and (self.weights == "param" or self.naive):
            raise ValueError("tensor_cores=True reads its weights from shared memory (weights='shared', naive=False)")
        if self.weights == "param" and (self.values == "all" or self.naive):
            raise ValueError('weights="param" runs the generated kernel with values="chosen" (not values="all", '
                             "not naive)")
        # numpy integers held as Python ints: equal configurations are then the same key in every
        # cache (a numpy int16 block would also wrap in the shared-memory arithmetic)
        object.__setattr__(self, "block", launch.check_block(self.block))
        if self.tensor_cores and self.block is not None and self.block % 32:
            raise ValueError(f"tensor_cores=True needs whole warps: block must be a multiple of 32, got {self.block}")
        regs = self.max_registers
        if not (regs is None or (isinstance(regs, str) and regs == "auto")
                or (isinstance(regs, (int, np.integer)) and not isinstance(regs, (bool, np.bool_))
                    and 16 <= regs <= 255)):
            raise ValueError(f"max_registers must be None, 'auto' or an int in 16..255, got {regs!r}")
        if isinstance(regs, np.integer):
            object.__setattr__(self, "max_registers", int(regs))
        for name in ("items", "sync_every", "blocks_per_sm"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
            object.__setattr__(self, name, int(v))  # a numpy integer as an int, as block's

    def kernel_f16_weights(self) -> str:
        """``f16_weights`` as the kernel generator takes it: ``"auto"`` is ``"registers"``, and
        only fp16 math has a per-lane weight image to place (others get ``"registers"``)."""
        return "shared" if self.math == "fp16" and self.f16_weights == "shared" else "registers"

    def kernel_rows_ahead(self) -> int:
        """``rows_ahead`` as the kernel generator takes it: ``"auto"`` is 1, and only fp16 math keeps
        a second round (others get 1)."""
        return 2 if self.math == "fp16" and self.rows_ahead == 2 else 1

    def kernel_ring_stages(self, dtype: str = "int8") -> int:
        """``ring_stages`` as the kernel generator takes it for a table of ``dtype``: ``"auto"`` is
        0, and only fp16 math on int8 rows has a ring (others get 0)."""
        return self.ring_stages if (self.math == "fp16" and dtype == "int8" and self.ring_stages != "auto") else 0

    def kernel_row_scales(self, dtype: str = "int8") -> bool:
        """Whether the kernel generator reads a table of ``dtype``'s scale pairs
        (:meth:`.table.DeviceAdTable.scale_pairs`): ``row_scales`` ``"fp16_pairs"`` or ``"auto"``, fp16
        math, int8 rows."""
        return self.row_scales != "fp32" and self.math == "fp16" and dtype == "int8"

    def kernel_split_loop(self) -> bool:
        """Whether the kernel generator splits the loop over rounds (``loop``: ``"split"`` or
        ``"auto"``, fp16 math; the generator applies it where the kernel's shape allows)."""
        return self.loop != "checked" and self.math == "fp16"

    def kernel_options(self, dtype: str) -> dict:
        """The generated kernel's options (:func:`~.fused.fused_kernel`'s keywords) this
        configuration (concrete math) sets for a table of ``dtype``: one place for every launch site."""
        return dict(math=self.math, dequant=self.dequant, tile_order=self.kernel_tile_order(),
                    f16_weights=self.kernel_f16_weights(), rows_ahead=self.kernel_rows_ahead(),
                    ring_stages=self.kernel_ring_stages(dtype), scale_pairs=self.kernel_row_scales(dtype),
                    split_loop=self.kernel_split_loop())

    def kernel_tile_order(self) -> str:
        """``tile_order`` as the kernel generator takes it: only fp16 math has tiles to order (others
        get the one kernel, "tiles")."""
        return self.tile_order if self.math == "fp16" else "tiles"

    def threads(self) -> int:
        return self.block or launch.default_block()

    def with_math(self, dreq: "DeviceRequest", table) -> "KernelConfig":
        """This configuration with ``math="auto"`` made concrete for a request on a table:
        ``"fp16"`` where :meth:`picks_fp16` (an fp16 or int8 table, the gated model from a Request,
        d a multiple of 16, E <= 8, the generated kernel with shared weights and whole warps) and the
        request and table stay within its range and above its subnormals (:func:`.weights.fp16_weights_precise`);
        ``"fp32"`` otherwise; and ``dequant`` made
        concrete (``"fma"`` where fp16 math reads an int8 table that allows it, else ``"mul"``).

        Raises:
            ValueError: ``dequant="fma"`` where it does not apply or would change the scores."""
        cfg = self if self.math != "auto" else replace(self, math="fp16" if self._fp16_applies(dreq, table) else "fp32")
        return cfg.with_dequant(table)

    def with_dequant(self, table) -> "KernelConfig":
        """This (concrete-math) configuration with ``dequant`` made concrete for ``table``
        (:meth:`resolved_dequant`); itself when it already is (no copy: a call's hot path)."""
        dequant = self.resolved_dequant(table)
        return self if dequant == self.dequant else self.replaced("dequant", dequant)

    def replaced(self, field: str, value) -> "KernelConfig":
        """``dataclasses.replace(self, field=value)``, kept (:func:`_replaced`): a call's hot path
        makes the same few concrete configurations again and again, and a validated copy costs
        several microseconds."""
        return _replaced(self, field, value)

    def resolved_dequant(self, table) -> str:
        """``dequant`` made concrete for this configuration's (concrete) math on ``table``: ``"fma"``
        where fp16 math reads an int8 table that allows it (unless ``"mul"`` is asked for), else
        ``"mul"``; ValueError for ``"fma"`` anywhere else."""
        fma = self.math == "fp16" and table.dtype == "int8" and table.fma_dequant()
        if self.dequant == "fma" and not fma:
            raise ValueError("dequant='fma' needs fp16 math on an int8 table whose every row scale has at most 7 "
                             "significant bits and is at most 56 (quantize_int8_rows makes such scales); use "
                             "dequant='auto'")
        return "fma" if fma and self.dequant != "mul" else "mul"

    def _fp16_applies(self, dreq, table) -> bool:
        if dreq.request is None or not self.picks_fp16(dreq.model, dreq.d, dreq.experts, table.dtype):
            return False
        from .launches import check_range
        from .weights import f16_weights, fp16_request_precise, fp16_rows_precise

        try:
            f16_weights(dreq.request)
            check_range(dreq, table, "fp16")
        except ValueError:
            return False
        bound = table.max_abs_bound()
        return fp16_rows_precise(table, bound) and fp16_request_precise(dreq.request, bound)

    def picks_fp16(self, model: str, d: int, experts: int, table_dtype: str) -> bool:
        """Whether this configuration scores requests of this shape on a table of this dtype in fp16
        math, before the per-request range check: ``math="fp16"``, or ``"auto"`` where
        :meth:`fp16_shape` holds (fp16 and int8 tables)."""
        if self.math == "auto":
            return self.fp16_shape(model, d, experts, table_dtype)
        return self.math == "fp16"

    def fp16_shape(self, model: str, d: int, experts: int, table_dtype: str) -> bool:
        """Whether the fp16 math mode applies to requests of this shape on a table of this dtype
        under this configuration (fp16 or int8 rows, the gated model, d a multiple of 16, E <= 8,
        the generated kernel with shared weights and whole warps)."""
        return not (table_dtype not in ("fp16", "int8") or model != "gated" or d % 16 or experts > 8 or self.tensor_cores
                    or self.naive or self.weights == "param" or (self.block is not None and self.block % 32))

    def resolved(self, dreq: "DeviceRequest", topk_k: int = 0, compact: bool = False) -> "KernelConfig":
        """This configuration with ``weights`` and ``max_registers`` made concrete for a request
        (``"auto"`` rules in the class docstring); ``topk_k`` > 0: the fused block top-K kernel;
        ``compact``: an eligible bitset compacted in the kernel (a top-K over a bitset) on the
        ``tiles`` layout, where the parameter weights measured slower than shared ones (on
        ``rows`` faster): shared weights there.

        Raises:
            TypeError: ``dreq`` is not a :class:`DeviceRequest` (``DeviceRequest.of(request)``).
            ValueError: ``topk_k`` not a non-negative int, ``compact`` not a bool."""
        from .table import DeviceRequest

        if not isinstance(dreq, DeviceRequest):
            raise TypeError(f"resolved() takes a DeviceRequest (DeviceRequest.of(request)), got {type(dreq).__name__}")
        if isinstance(topk_k, bool) or not isinstance(topk_k, (int, np.integer)) or topk_k < 0:
            raise ValueError(f"topk_k must be a non-negative int, got {topk_k!r}")
        if not isinstance(compact, (bool, np.bool_)):
            raise ValueError(f"compact must be True or False, got {compact!r}")
        return _resolved(self, dreq.model, dreq.d, dreq.param_floats, int(topk_k), bool(compact))


@lru_cache(maxsize=1024)
def _replaced(self: KernelConfig, field: str, value) -> KernelConfig:
    return replace(self, **{field: value})


@lru_cache(maxsize=1024)
def _resolved(self: KernelConfig, model: str, d: int, param_floats: int, topk_k: int, compact: bool) -> KernelConfig:
    """:meth:`KernelConfig.resolved` for a request's shape (a pure function of it: kept, every call
    of a shape resolves the same)."""
    weights = self.weights
    if weights == "auto":
        fits = param_floats <= PARAM_FLOATS
        weights = ("param" if fits and not (self.tensor_cores or self.naive or compact or self.math == "fp16")
                   and self.values == "chosen"
                   else "shared")
    regs = self.max_registers
    if isinstance(regs, str):  # "auto"
        if model == "gated" and d > REGISTER_CAP_MAX_D:
            regs = None  # capped, the wide rows' kernels spill (96 or 128, either weights)
        else:
            regs = 96 if weights == "param" and model == "gated" and not topk_k else 128
    if (weights, regs) == (self.weights, self.max_registers):
        return self
    return replace(self, weights=weights, max_registers=regs)


DEFAULT_CONFIG = KernelConfig()
#: the widest rows whose gated kernels ``max_registers="auto"`` caps at 128 registers (the caps
#: spill nothing up to here; at d = 128 they spilled ~400 bytes a thread)
REGISTER_CAP_MAX_D = 64
#: Most floats the ``weights="param"`` tuple may hold: kernel parameters share 4 KiB with the
#: other arguments (each array argument is several 8-byte fields).
PARAM_FLOATS = 640
#: Static shared memory a block may use without an opt-in (docs/design.md: Numba has no public one).
SHARED_BYTES = 48 * 1024


def with_config(config: KernelConfig | None = None, **changes) -> KernelConfig:
    """A copy of ``config`` (default :data:`DEFAULT_CONFIG`) with fields changed."""
    return replace(config or DEFAULT_CONFIG, **changes)


def check_config(config) -> KernelConfig:
    """``config`` or the default; TypeError when it is not a :class:`KernelConfig`."""
    if config is None:
        return DEFAULT_CONFIG
    if not isinstance(config, KernelConfig):
        raise TypeError(f"config must be a KernelConfig, got {type(config).__name__}")
    return config
