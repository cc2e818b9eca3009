"""The generated fused gather-gate-score kernel, specialised per shape and access pattern.

Why generated: the per-ad work is straight-line code over compile-time dimensions; writing it out
keeps every per-ad value in registers and lets every weight read be a 16-byte vector load at a
constant offset. Per ad (d = 64, fp16, E = 6, K = 2), from the SASS of this kernel: 16 eight-byte
row loads, 64 widenings, 64 FFMA + 64 FMNMX.NAN (context encoding), 384 FFMA (gate), 6 exp, ~40
compare / select (softmax and expert choice), 128 FFMA (the K value dots), and the weight reads
(16-byte shared loads, or with ``weights="param"`` uniform constant-bank loads: no shared-memory
traffic, more instructions). At the read ceiling an H200 issues about 1,050 instructions per ad
for this row size, so the gated kernel sits where it turns issue-bound (docs/design.md,
"Measuring"; the scoring notebook marks the point).

A kernel is one story, emitted in order by :class:`_Source`:

1. the signature and the weights in shared memory (``_prologue``);
2. the selection state: a block top-K buffer, or the filter pass's tallies (``_selection_state``);
3. the loop over this block's items (``_loop``): a grid-stride loop over positions (pool,
   candidates, or a bitset tested position by position), or, for a bitset feeding a selection,
   tiles of positions compacted in shared memory to their eligible ads;
4. per ad: the row (``_row``), then the model (``_gated`` or ``_dot``), then the score
   (:class:`.emit_per_ad.PerAdEmitter`);
5. the output (``_output``): the score to memory, into the block top-K, or (the filter pass)
   appended to a buffer when at or above the seed.

``batched=True`` scores a batch of requests in one launch, request ``b = blockIdx.y`` over its own
candidate list ``cand[b, :n_items[b]]`` with its own weights ``wimg[b]`` (the request path of
:mod:`andromeda_nb.pipeline`); ``sample=M`` (batched, scores to memory) scores a stratified sample
of M of each request's candidates, the seed's sample (:func:`sample_position`).

The tensor-core variant (``mma=True``) is emitted by :mod:`.emit_mma`.

Kernel arguments (in order)::

    words   uint64 view of the table: [n_ads, d/W] (rows) or [d/W, n_ads] (tiles), W = elements per word
    scale   float32[n_ads] (int8) or dummy        bias    float32[n_ads]
    wimg    float32 weight image (.weights.weight_image); batched: [B, size]
    elig    uint64 eligible bitset (bitset access) or dummy
    cand    int32[n_items] slots (candidates access) or dummy; batched: int32[B, capacity]
    n_items int64; batched: int64[B], request b's candidates (at most the capacity are read)
    ids     int64[n_ads] ad ids (the block top-K's tie-break)
    k, out, cand_s, cand_i, counts   (scores / block top-K) or
    seeds, buf_s, buf_i, fill, counts (filter pass; batched: a row or entry a request)
    wt      (weights="param" only) UniTuple(float32, n): the weight image's first n floats
"""

from __future__ import annotations

import functools
import math as pymath

import numpy as np
from numba import cuda, float32, int16, int32, int64, uint32, uint64
from numba.cuda.core import config

from ..device.bits import test_bit
from ..device.intrinsics import (DECODE, PER_WORD, dequant_i8x4, dequant_i8x4_fma, dequant_offset_h2, exp_shifted,
                                 film_h2, half2_of, lds2, lds4, max_nan, mma_f16, mma_f16_warp, mma_tf32, mma_tf32_warp,
                                 pair_high, pair_low, rcp_approx, sts2, tf32_round)
from ..device.memory_ops import (cp_async_commit, cp_async_row, cp_async_wait, ld_half, ld_u64,
                                 prefetch_l2, prefetch_l2_2d, shared_offset)
from ..topk.block import block_topk
from .emit_mma import (emit_f16_weights, emit_lane_words, emit_mma, emit_mma_load, emit_ring_bases,
                       emit_ring_issue, emit_ring_lanes, emit_tile_offsets, steps_tiles)
from .emit_per_ad import PerAdEmitter
from .weights import PAD, image_size, mma_image_size

ACCESS = ("pool", "bitset", "candidates")
#: eligible-bitset positions each thread expands per tile of the compacting (top-K) bitset kernels
BITS_PER_THREAD = 16
LAYOUTS = ("rows", "tiles")
MODELS = ("gated", "dot")
#: contiguous candidates a sampled run of the batched sample kernel
SAMPLE_RUN = 32
#: floats an ad of the tensor-core kernels' result tile (``msc``, flat: 8 logits, 8 values, 4 unused)
#: takes in shared memory. A lane reads its ad's logits and values in 16- and 8-byte loads (4 LDS a
#: round at E = 6, not 12) and stores its fragment pairs in 8-byte ones (8 STS, not 16): 20 floats
#: keep those loads aligned, and a quarter warp's 16-byte loads (8 ads 80 bytes apart) fall on
#: distinct banks. A pitch of 16 put every lane's ad on 2 banks (16-way conflicts that held the L1 /
#: shared pipe at 98 % in Nsight Compute on the H200); 17, conflict-free for scalar loads, allows no
#: wider ones.
MSC_PITCH = 20


def _insert_cost(E: int, K: int) -> int:
    """Instructions of the one-pass insertion (choice "insert") about: expert e compares with
    min(e, K) slots, and each slot's logit and value take two selects."""
    return sum(min(e, K) * 5 for e in range(1, E))


def sample_position(j: int, n: int, m: int) -> int:
    """The candidate position the batched sample kernel scores as sample ``j`` of ``m`` from a
    request of ``n`` candidates: all of them when ``n <= m`` (``j < n``), else run ``j //
    SAMPLE_RUN`` of SAMPLE_RUN contiguous candidates centred in its stratum of ``n // (m //
    SAMPLE_RUN)`` (the host mirror of the emitted formula, for tests)."""
    if n <= m:
        return j
    step = n // (m // SAMPLE_RUN)
    return (j // SAMPLE_RUN) * step + (step - SAMPLE_RUN) // 2 + j % SAMPLE_RUN


class _Source(PerAdEmitter):
    """The kernel source for one configuration (see :func:`fused_kernel` for the arguments)."""

    def __init__(self, model, d, E, K, dtype, layout, access, fused, block, values, items, seed_filter, weights,
                 guard, mma, mma_terms, prefetch, batched, sample, math="fp32", bias_load="ahead", softmax="auto", choice="auto",
                 l2_ahead=0, dequant="mul", tile_order="tiles", f16_weights="registers", rows_ahead=1,
                 ring_stages=0, scale_pairs=False, split_loop=False):
        self.math, self.dequant, self.tile_order, self.f16_weights = math, dequant, tile_order, f16_weights
        self.scale_pairs = scale_pairs  # int8 rows in fp16 math: the scale argument holds fp16 pairs
        mma = mma or math == "fp16"  # the fp16 math runs on the tensor cores
        self.model, self.d, self.E, self.K, self.dtype, self.layout = model, d, E, K, dtype, layout
        self.access, self.fused, self.block, self.items = access, fused, block, items
        self.seed_filter, self.guard, self.mma, self.mma_terms = seed_filter, guard, mma, mma_terms
        self.param_weights = weights == "param"
        self.values = "all" if mma else values  # the tensor cores compute every expert's value dot
        # the next round's rows are loaded while this one computes, where rounds follow each other
        # simply (not through a compacted list, one round per top-K barrier pair)
        self.prefetch = (mma and prefetch and not (access == "bitset" and (fused or seed_filter))
                         and (items == 1 or not fused))
        # the tensor-core kernels load the lane's bias a round ahead where its slot is its position
        # (pool, a bitset tested position by position), else at the start of its round: a load
        # issued where the score needs it, past the warp barriers (ptxas does not hoist it there),
        # puts a whole memory latency on every round ("end", kept as a diagnostic)
        self.bias_load = bias_load if mma else "end"
        if bias_load == "ahead" and not (self.prefetch and access in ("pool", "bitset") and not batched):
            self.bias_load = "start"
        self.bias_ahead = self.bias_load == "ahead"
        # L2 prefetch of the round l2_ahead rounds on (pool access: the position is the slot, every
        # row is read): the registers bound the rows in flight to one round ahead, L2 does not
        self.l2_ahead = l2_ahead if (self.prefetch and access == "pool" and not batched) else 0
        # rounds of rows in flight in registers (fp16 math): two where rounds follow each other simply
        self.rows_ahead = rows_ahead if self.prefetch else 1
        # int8 rows through a shared-memory ring filled by asynchronous copies (emit_mma's ring):
        # the full pool in fp16 math, one request; it takes the place of the registers' prefetch
        self.ring = ring_stages if (self.prefetch and ring_applies(math, dtype, access, fused, items, batched)) else 0
        if self.ring:
            self.rows_ahead = 1
        # fp16 math's softmax in fewer instructions (exp_shifted, rcp_approx: ~1e-6 relative, inside the
        # fp32 accuracy it promises); the fp32 math keeps libdevice's exp and the IEEE division
        self.fast_softmax = softmax == "fast" or (softmax == "auto" and math == "fp16")
        # the K best experts by K passes over the E logits (~4 K E instructions) or by each expert's
        # rank among them (~1.5 E (E - 1) + 2 E): ranks where that is fewer, with every value dot
        # at hand (the tensor cores compute all E)
        if choice == "auto":
            choice = "passes"
            if math == "fp16":  # every value dot at hand: the fewest instructions of the three
                cost = {"insert": _insert_cost(E, K), "ranks": 3 * E * (E - 1) // 2 + 2 * E, "passes": 8 * K * E}
                choice = min(cost, key=cost.get)
        self.choice = choice
        self.batched, self.sample = batched, sample
        # an eligible bitset feeding a selection is compacted tile by tile (see _loop)
        self.compact = access == "bitset" and (fused or seed_filter)
        self.W = PER_WORD[dtype]
        self.n = "n_req" if batched else "n_items"  # the item count's name in the loop
        self.row = "b, " if batched else ""  # a batched kernel's per-request row of cand / buffers
        self.o_beta, self.o_g, self.o_v, self.pitch = d, 2 * d, 2 * d + E * d, d + PAD
        # the loop in two (_split_rounds): rounds whose loads ahead (the next round's rows, or the
        # ring's copies ring - 1 rounds on) fall on whole rounds run unchecked, then the rest; where
        # rounds follow each other simply and one round (or the ring) is in flight
        self.split = (split_loop and self.prefetch and math == "fp16" and access == "pool" and not batched
                      and not sample and not self.fused and self.rows_ahead == 1 and not self.l2_ahead)
        self.whole = False  # emitting the split loop's unchecked rounds
        self.lines: list[str] = []

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def text(self) -> str:
        self._prologue()
        self._selection_state()
        if self.split:
            self._split_rounds()
        else:
            self._loop()
            self._per_ad()
            self._output()
        self._after_loop()
        if self.ring:  # the last rounds' copies (zeros past the end) land before the block's shared memory is freed
            self.emit("    cp_async_wait(0)")
        return "\n".join(self.lines) + "\n"

    # ---------------------------------------------------------------- 1. signature and weights

    def _prologue(self) -> None:
        emit, block = self.emit, self.block
        wt = ", wt" if self.param_weights else ""
        if self.seed_filter:
            emit(f"def kernel(words, scale, bias, wimg, elig, cand, n_items, ids, seeds, buf_s, buf_i, fill, counts{wt}):")
        else:
            emit(f"def kernel(words, scale, bias, wimg, elig, cand, n_items, ids, k, out, cand_s, cand_i, counts{wt}):")
        emit("    tid = cuda.threadIdx.x")
        size = image_size(self.model, self.d, self.E)
        if self.mma:
            size = mma_image_size(self.d)
            emit("    lane = tid % 32")
            emit("    wid = tid // 32")
            emit("    wbase = wid * 32")
            emit("    g8 = lane // 4")
            emit("    c4 = lane % 4")
            if self.math == "fp16":  # where the lane's dims of a row start, and the whole rounds' offsets
                emit_lane_words(emit, "    ", self.d, self.dtype == "int8")
                if self.split and steps_tiles(self.layout, self.d, self.dtype == "int8"):
                    emit_tile_offsets(emit, "    ", self.d, self.dtype == "int8")
            # a warp: 32 ads x (8 logits, 8 values), MSC_PITCH floats an ad, the warp's tile at mw
            align = "" if config.ENABLE_CUDASIM else ", alignment=16"
            emit(f"    msc = cuda.shared.array({block * MSC_PITCH}, float32{align})")
            emit(f"    mw = wid * {32 * MSC_PITCH}")
            if self.ring:  # each warp's ring slots: the d/8 words and the scale of 32 ads a slot
                emit(f"    ring = cuda.shared.array(({block // 32 * self.ring * (self.d // 8)}, 32), uint64)")
                emit_ring_lanes(emit, "    ", self.d)  # the columns of the ring's swizzle
                emit(f"    rsc = cuda.shared.array(({block // 32 * self.ring}, 32), "
                     f"{'uint32' if self.scale_pairs else 'float32'})")
            if config.ENABLE_CUDASIM:
                emit(f"    scr = cuda.shared.array(({block // 32}, 32, 10), float32)")
                if self.math == "fp16":
                    emit(f"    scu = cuda.shared.array(({block // 32}, 32, 6), uint32)")
        if self.batched:  # request b: its weights, its candidates (at most the list's capacity)
            emit("    b = cuda.blockIdx.y")
            emit("    n_req = min(n_items[b], cand.shape[1])")
        if self.math == "fp16":  # each lane's weights in registers, or its image in shared memory
            emit_f16_weights(emit, "    ", self.d, self.row, block, self.f16_weights == "shared")
            return
        align = "" if config.ENABLE_CUDASIM else ", alignment=16"
        emit(f"    wsh = cuda.shared.array({size}, float32{align})")
        emit(f"    for t in range(tid, {size}, {block}):")
        emit(f"        wsh[t] = wimg[{self.row}t]")

    # ---------------------------------------------------------------- 2. selection state

    def _selection_state(self) -> None:
        emit = self.emit
        if self.fused:
            emit("    buf_s = cuda.shared.array(CAP, float32)")
            emit("    buf_i = cuda.shared.array(CAP, int32)")
            emit("    st = cuda.shared.array(1, int32)")
            emit("    thr_s = cuda.shared.array(1, float32)")
            emit("    thr_i = cuda.shared.array(1, int32)")
            emit("    n_ok = cuda.shared.array(1, int64)")
            emit("    if tid == 0:")
            emit("        n_ok[0] = 0")
        if self.seed_filter:
            emit("    tally = cuda.shared.array(2, int64)")
            emit("    if tid == 0:")
            emit("        tally[0] = 0")
            emit("        tally[1] = 0")
            emit(f"    seed = seeds[{'b' if self.batched else 0}]")
            emit("    cap = buf_s.shape[1]")
            emit("    above = 0")
        emit("    cuda.syncthreads()")
        if self.fused:
            emit("    topk_init(st, thr_s, thr_i, float32(-math.inf))")
        emit("    mine = 0")
        emit("    zero = float32(0.0)")
        emit("    rnd = 0")

    # ---------------------------------------------------------------- 3. the loop over items

    def _loop(self) -> None:
        if self.compact:
            self._loop_compacted_tiles()
        else:
            self._loop_grid_stride()
        self._round_access()

    def _round_access(self) -> None:
        """A round's slot (candidate list, bitset test), bias, and the tensor cores' part."""
        emit = self.emit
        if self.access == "candidates":
            emit("        if ok:")
            if self.sample:  # sample j of the request's candidates (sample_position)
                emit("            slot = int64(cand[b, p])")
            elif self.batched:
                # this round's slot was loaded a round ahead, and the next one is loaded now: its
                # latency overlaps this ad's row loads and arithmetic instead of preceding them
                emit("            slot = nxt")
                emit("            jn = j + stride")
                emit("            if jn < n_req:")
                emit("                nxt = int64(cand[b, jn])")
            else:
                emit(f"            slot = int64(cand[{self.row}j])")
        elif self.access == "bitset" and not self.compact:
            emit("        if ok:")
            emit("            ok = test_bit(elig, j) != 0")
        if self.bias_load != "end":  # this round's bias (see bias_load)
            if self.bias_ahead:
                emit("        bj = bn")
                emit("        jb = j + stride")
                emit("        bn = bias[uint64(jb)]" if self.whole else f"        bn = bias[uint64(jb)] if jb < {self.n} else zero")
            else:
                emit("        bj = bias[uint64(slot)] if ok else zero")
        emit("        s = float32(math.nan)")
        # "offset" guard: the shared weight loads are addressed from wo, zero at run time but
        # unknown to ptxas (j < 2^62), so it cannot hoist them out of the loop either, without a fence
        offset = self.guard == "offset" and not self.fused and not self.param_weights
        emit("        wo = int64(j >> 62)" if offset else "        wo = 0")
        if self.mma:
            emit_mma(self.emit, self.d, self.dtype, self.layout, self.access, self.compact, self.mma_terms,
                     self.prefetch, self.n, self.row, self.math, self.dequant, self.tile_order == "steps",
                     self.f16_weights == "shared", self.rows_ahead, self.ring, self.scale_pairs, self.whole)

    def _fence(self) -> bool:
        # keeps ptxas from hoisting the loop-invariant shared weight loads out of the loop (it would
        # hold all of them in registers and spill); the fused loop has barriers instead, and fp16
        # math holds its weights in registers from the start (no shared weight loads to keep in the
        # loop): there the fence (a MEMBAR.SC.CTA a round) is left out; on the H200 that measured
        # the same speed within the runs' noise (fp16 and int8 rows, 10^8 ads)
        return not self.fused and not self.param_weights and self.guard == "fence" and self.math != "fp16"

    def _loop_grid_stride(self) -> None:
        per_round = self._loop_preamble()
        emit = self.emit
        if self.sample:  # positions 0..M of the sample; p: the candidate each one reads
            emit("    whole = n_req <= {}".format(self.sample))
            emit(f"    step = n_req // {self.sample // SAMPLE_RUN}")
            emit(f"    for base0 in range(cuda.blockIdx.x * {per_round}, {self.sample}, stride):")
        elif self.batched:  # the first candidate; each round loads the next one ahead (see _loop)
            emit(f"    jn = cuda.blockIdx.x * {per_round} + tid")
            emit("    nxt = int64(cand[b, jn]) if jn < n_req else int64(0)")
            emit(f"    for base0 in range(cuda.blockIdx.x * {per_round}, {self.n}, stride):")
        else:
            emit(f"    for base0 in range(cuda.blockIdx.x * {per_round}, {self.n}, stride):")
        self._round_head()

    def _split_rounds(self) -> None:
        """The grid-stride loop in two (``split_loop``): first the rounds whose rounds ahead are
        whole (every ad of this round and of the next, whose rows and bias it loads, exists; with
        the ring, also of the round ``ring - 1`` on, whose rows it copies), with no bounds check,
        no zero fill and an unconditional store (about a quarter of an int8 round's instructions:
        the int8 kernel is bound by its instructions on the H200); then the last rounds, checked
        as before. The round's body is emitted once for each loop; the registers (or ring slots)
        the first loop filled for the rounds ahead carry into the second."""
        emit, block = self.emit, self.block
        self._loop_preamble()
        ahead = max(1, self.ring - 1)  # strides from a round to the last round it loads
        emit(f"    b0 = cuda.blockIdx.x * {block}")
        # b0 <= this: b0 + ahead * stride + block <= n
        emit(f"    last_whole = {self.n} - {'' if ahead == 1 else f'{ahead} * '}stride - {block}")
        emit("    while b0 <= last_whole:")
        emit("        base0 = b0")
        self.whole = True
        self._round()
        emit("        b0 += stride")
        self.whole = False
        emit(f"    for base0 in range(b0, {self.n}, stride):")
        self._round()

    def _round(self) -> None:
        """One round's body (inside the loop over rounds): its head, the model per ad, the output."""
        self._round_head()
        self._round_access()
        self._per_ad()
        self._output()

    def _loop_preamble(self) -> int:
        """The grid-stride loop's setup: the stride, and with ``prefetch`` the first round's rows
        (and bias, ring copies); returns the items a round."""
        emit, block, items = self.emit, self.block, self.items
        per_round = block * items if self.fused else block
        emit(f"    stride = cuda.gridDim.x * {per_round}")
        if self.prefetch:  # the first round's words (see emit_mma)
            emit(f"    base = cuda.blockIdx.x * {per_round}")
            if self.bias_ahead:
                emit("    jb = base + tid")
                emit(f"    bn = bias[uint64(jb)] if jb < {self.n} else zero")
            if self.ring:
                emit_ring_bases(emit, "    ", self.d, self.ring)
            for r in range(self.ring - 1):  # the ring's first rounds, a copy group each (emit_mma)
                emit_ring_issue(emit, "    ", f"base + {r} * stride", str(r), self.d, self.layout, self.ring, self.n)
                emit("    cp_async_commit()")
            if self.ring:
                emit("    rs = 0")  # the ring slot this round reads
                # and the one it refills, (rs + ring - 1) % ring, kept: a 64-bit % costs ~25 instructions
                emit(f"    ws = {self.ring - 1}")
            for t in range(0 if self.ring else 2):
                emit_mma_load(emit, "    ", t, "base", self.d, self.layout, self.access, False, self.n, self.row,
                              self.dtype == "int8", pairs=self.scale_pairs, math=self.math)
            for t in range(2 if self.rows_ahead == 2 else 0):  # and the second round's (emit_mma)
                emit_mma_load(emit, "    ", t, "base + stride", self.d, self.layout, self.access, False, self.n,
                              self.row, self.dtype == "int8", into="b", pairs=self.scale_pairs, math=self.math)
        return per_round

    def _round_head(self) -> None:
        """A round's first lines: its base, the thread's position ``j``, ``ok`` and ``slot``."""
        emit, block, items = self.emit, self.block, self.items
        if self.fused:
            # several ads per thread between two top-K barrier pairs (the barriers, not the scoring,
            # were a third of the fused kernel's time with one ad per round)
            emit(f"      for it in range({items}):")
            emit(f"        base = base0 + it * {block}")
        else:
            emit("        base = base0")
        if self.l2_ahead:
            self._prefetch_l2()
        if self._fence():
            emit("        cuda.threadfence_block()")
        emit("        j = base + tid")
        if self.sample:
            emit("        p = j")
            emit("        ok = j < n_req")
            emit("        if not whole:")
            emit(f"            p = (j // {SAMPLE_RUN}) * step + (step - {SAMPLE_RUN}) // 2 + j % {SAMPLE_RUN}")
            emit("            ok = True")
        else:
            emit("        ok = True" if self.whole else f"        ok = j < {self.n}")
        emit("        slot = j")

    def _prefetch_l2(self) -> None:
        """This warp's 32 ads of the round ``l2_ahead`` rounds on, asked of L2 line by line: their
        ``2 NW`` lines of words (NW words a row; a line holds 16 words: on ``tiles`` word-row
        ``w``'s 32 ads are lines ``2 w`` and ``2 w + 1``, on ``rows`` the 32 rows are contiguous),
        then the bias line (and the int8 scale line), one line a lane, lanes past them idle."""
        emit, NW = self.emit, self.d // self.W
        lines = 2 * NW + 1 + (self.dtype == "int8")
        emit(f"        pa = base + {self.l2_ahead} * stride + wbase")
        emit(f"        if pa < {self.n}:")
        for r in range((lines + 31) // 32):
            emit(f"            ln = lane + {32 * r}")
            emit(f"            if ln < {2 * NW}:")
            if self.layout == "tiles":
                emit("                pd = pa + 16 * (ln % 2)")
                emit(f"                if pd < {self.n}:")
                emit("                    prefetch_l2_2d(words, ln // 2, pd)")
            else:
                emit(f"                pd = pa + (ln * 16) // {NW}")
                emit(f"                if pd < {self.n}:")
                emit(f"                    prefetch_l2_2d(words, pd, (ln * 16) % {NW})")
            emit(f"            elif ln == {2 * NW}:")
            emit("                prefetch_l2(bias, pa)")
            if self.dtype == "int8":
                emit(f"            elif ln == {2 * NW + 1}:")
                emit("                prefetch_l2(scale, pa)")

    def _loop_compacted_tiles(self) -> None:
        """An eligible bitset feeding a selection: each tile of BITS_PER_THREAD * block positions is
        first compacted into a shared list of its eligible positions, and the threads score the list
        densely (scoring position by position runs the gate in every warp that holds one eligible ad:
        nearly all of them at 10 %)."""
        emit, block = self.emit, self.block
        tile = BITS_PER_THREAD * block
        emit(f"    lst = cuda.shared.array({tile}, int16)")
        emit(f"    bcnt = cuda.shared.array({block}, int32)")
        emit(f"    for tile0 in range(cuda.blockIdx.x * {tile}, n_items, cuda.gridDim.x * {tile}):")
        emit(f"      p0 = tile0 + {BITS_PER_THREAD} * tid")
        emit("      bits = uint64(0)")
        emit("      if p0 < n_items:")
        emit(f"        bits = (elig[p0 >> 6] >> uint64(p0 & 63)) & uint64({(1 << BITS_PER_THREAD) - 1})")
        # bits past the pool (a caller's bitset may set its padding bits) are never positions
        emit(f"        if n_items - p0 < {BITS_PER_THREAD}:")
        emit("          bits &= (uint64(1) << uint64(n_items - p0)) - uint64(1)")
        emit("      n_bits = int32(cuda.popc(bits))")
        emit("      bcnt[tid] = n_bits")
        emit("      cuda.syncthreads()")
        emit("      off = 1")  # inclusive scan of the per-thread counts (Hillis-Steele)
        emit(f"      while off < {block}:")
        emit("        add = bcnt[tid - off] if tid >= off else 0")
        emit("        cuda.syncthreads()")
        emit("        bcnt[tid] += add")
        emit("        cuda.syncthreads()")
        emit("        off *= 2")
        emit(f"      n_list = bcnt[{block - 1}]")
        emit("      at_list = bcnt[tid] - n_bits")
        emit("      bit = 0")
        emit("      while bits != 0:")
        emit("        if bits & uint64(1):")
        emit(f"          lst[at_list] = int16({BITS_PER_THREAD} * tid + bit)")
        emit("          at_list += 1")
        emit("        bits >>= uint64(1)")
        emit("        bit += 1")
        emit("      cuda.syncthreads()")
        emit(f"      for base in range(0, n_list, {block}):")
        if self._fence():
            emit("        cuda.threadfence_block()")
        emit("        jj = base + tid")
        emit("        ok = jj < n_list")
        emit("        j = tile0 + int64(lst[jj]) if ok else int64(0)")
        emit("        slot = j")

    # ---------------------------------------------------------------- 4. per ad

    # (the per-ad emitters: .emit_per_ad.PerAdEmitter)

    # ---------------------------------------------------------------- 5. output

    def _output(self) -> None:
        if self.fused:
            self._output_block_topk()
        elif self.seed_filter:
            self._output_filter()
        else:
            # j >= 0: an unsigned index (a signed one adds the negative-index wrap, 6 instructions)
            if not self.whole:
                self.emit("        if j < {}:".format(self.sample if self.sample else self.n))
            self.emit(f"        {'' if self.whole else '    '}out[{self.row}uint64(j)] = s")

    def _output_block_topk(self) -> None:
        emit = self.emit
        emit("        if ok and not math.isnan(s):")
        emit("            mine += 1")
        emit("        topk_insert(buf_s, buf_i, st, thr_s, thr_i, s, int32(slot), ok, ids)")
        if self.compact:  # a round per list chunk (m is the same in every thread: the rounds are uniform)
            emit("        topk_round_end(buf_s, buf_i, st, thr_s, thr_i, ids, k, rnd)")
            emit("        rnd += 1")
            emit("      cuda.syncthreads()")  # the next tile rewrites the list
        else:
            emit("      topk_round_end(buf_s, buf_i, st, thr_s, thr_i, ids, k, rnd)")
            emit("      rnd += 1")
        emit("    cuda.atomic.add(n_ok, 0, mine)")
        emit("    topk_finish(buf_s, buf_i, st, thr_s, thr_i, ids, cand_s, cand_i, cuda.blockIdx.x * k, k)")
        emit("    cuda.syncthreads()")
        emit("    if tid == 0:")
        emit("        cuda.atomic.add(counts, 0, n_ok[0])")

    def _output_filter(self) -> None:
        """The score never reaches memory: only those at or above the seed are appended (a few
        thousand of 10^8), for the final's exact top-k (:mod:`andromeda_nb.topk`)."""
        emit = self.emit
        q = "b" if self.batched else "0"
        emit("        if ok and not math.isnan(s):")
        emit("            mine += 1")
        emit("            if s >= seed:")
        emit("                above += 1")
        emit(f"                pos = cuda.atomic.add(fill, {q}, 1)")
        emit("                if pos < cap:")
        emit(f"                    buf_s[{q}, pos] = s")
        emit(f"                    buf_i[{q}, pos] = int32(slot)")
        if self.compact:
            emit("      cuda.syncthreads()")  # the next tile rewrites the list

    def _after_loop(self) -> None:
        """The filter pass's counts, added once a block after its rounds."""
        if not self.seed_filter or self.fused:
            return
        emit = self.emit
        q = "b" if self.batched else "0"
        emit("    cuda.atomic.add(tally, 0, mine)")
        emit("    cuda.atomic.add(tally, 1, above)")
        emit("    cuda.syncthreads()")
        emit("    if tid == 0:")
        emit(f"        cuda.atomic.add(counts[{q}], 0, tally[0])")
        emit(f"        cuda.atomic.add(counts[{q}], 1, tally[1])")


def ring_applies(math: str, dtype: str, access: str, fused: bool, items: int, batched: bool = False) -> bool:
    """Whether a kernel of this shape takes ``ring_stages``' shared-memory ring: int8 rows in fp16
    math on the full pool, one request, its rounds following each other simply (one ad a thread
    a round where it keeps a block top-K: the rounds where the next one's rows load early)."""
    return math == "fp16" and dtype == "int8" and access == "pool" and not batched and (items == 1 or not fused)


def _source(model: str, d: int, E: int, K: int, dtype: str, layout: str, access: str, fused: bool,
            block: int, values: str = "chosen", items: int = 1, seed_filter: bool = False,
            weights: str = "shared", guard: str = "fence", mma: bool = False, mma_terms: int = 3,
            prefetch: bool = True, batched: bool = False, sample: int = 0, math: str = "fp32",
            bias_load: str = "ahead", softmax: str = "auto", choice: str = "auto", l2_ahead: int = 0,
            dequant: str = "mul", tile_order: str = "tiles", f16_weights: str = "registers",
            rows_ahead: int = 1, ring_stages: int = 0, scale_pairs: bool = False, split_loop: bool = False) -> str:
    return _Source(model, d, E, K, dtype, layout, access, fused, block, values, items, seed_filter, weights, guard,
                   mma, mma_terms, prefetch, batched, sample, math, bias_load, softmax, choice, l2_ahead, dequant,
                   tile_order, f16_weights, rows_ahead, ring_stages, scale_pairs, split_loop).text()


@functools.lru_cache(maxsize=None)
def fused_kernel(model: str, d: int, experts: int, k_experts: int, dtype: str, layout: str, access: str,
                 block: int, topk_cap: int = 0, has_ids: bool = True, values: str = "chosen",
                 max_registers: int | None = None, items: int = 1, every: int = 1, seed_filter: bool = False,
                 weights: str = "shared", guard: str = "fence", mma: bool = False, mma_terms: int = 3,
                 prefetch: bool = True, batched: bool = False, sample: int = 0, math: str = "fp32",
                 bias_load: str = "ahead", softmax: str = "auto", choice: str = "auto", l2_ahead: int = 0,
                 dequant: str = "mul", tile_order: str = "tiles", f16_weights: str = "registers",
                 rows_ahead: int = 1, ring_stages: int = 0, scale_pairs: bool = False, split_loop: bool = False):
    """Compile (lazily, on first launch) the generated kernel for one configuration.

    Args:
        model: ``"gated"`` (the model of docs/design.md) or ``"dot"`` (two-tower ``dot(u, a) + b``).
        d, experts, k_experts: dimensions (``d`` a multiple of the elements per 8-byte word).
        dtype, layout, access: see the module docstring.
        block: threads per block; topk_cap: shared top-K buffer entries (0 = write scores).
        values: ``"chosen"`` computes the value dots of the K chosen experts after the gate (h kept
            in registers); ``"all"`` computes all E in the streaming pass and selects (more FMAs,
            far fewer live registers).
        max_registers: cap on registers per thread (more resident warps, maybe spills).
        items: ads each thread scores per top-K round (fused only; the buffer needs
            ``topk_cap >= k + block * items * every``).
        every: top-K rounds between two barrier pairs (fused only; :func:`block_topk`).
        seed_filter: instead of scores or a block top-K, append every eligible non-NaN score at or
            above ``seeds[0]`` to ``buf_s / buf_i [1, cap]`` (slots; ``fill int64[1]`` counts every
            one, entries past ``cap`` not written) and add to ``counts int64[1, 2]`` the non-NaN
            scores and those at or above the seed: the arguments ``k, out, cand_s, cand_i`` become
            ``seeds, buf_s, buf_i, fill`` (the filter pass of :mod:`andromeda_nb.topk`, fused).
        weights: ``"shared"`` (every weight from the shared image) or ``"param"`` (gamma, beta, G,
            or the dot model's u, from an extra tuple argument ``wt``; :class:`.config.KernelConfig`).
        guard: ``"fence"`` or ``"offset"``: how the scores-to-memory loops keep ptxas from hoisting
            the shared weight loads.
        mma: the tensor-core variant (gated, fp16 / bf16, d % 16 == 0, E <= 8, whole warps,
            shared weights; ``wimg`` is then :func:`.weights.mma_image`).
        mma_terms: products per mma step, 3 (3xTF32, the only accurate choice; 1 and 2 exist for
            diagnostics). prefetch: the tensor-core kernel loads the next round's rows early.
        bias_load: where the tensor-core kernels load an ad's bias: ``"ahead"`` (a round early,
            with pool and position-tested bitset access; elsewhere as ``"start"``), ``"start"`` (at
            the start of its round) or ``"end"`` (where the score needs it: a diagnostic).
        softmax: ``"fast"`` (``exp_shifted`` and ``rcp_approx``), ``"exact"`` (libdevice's exp, the IEEE
            division) or ``"auto"``: fast in fp16 math, exact in fp32 math.
        choice: how the K best experts are found: ``"passes"`` (K passes over the E logits),
            ``"ranks"`` (each expert's rank), ``"insert"`` (one pass inserting each expert into K
            sorted slots; the last two for kernels holding every value dot: fp16 math, the TF32
            tensor cores, ``values="all"``) or ``"auto"``: in fp16 math the one of the three with
            the fewest instructions (insert at E6 K2, ranks at E8 K4), else passes. All three pick
            the same experts (ties: the lower index).
        l2_ahead: the tensor-core kernels on the full pool (``access="pool"``, one request) also
            ask L2 for the rows of the round this many rounds on (0: not; see ``_prefetch_l2``).
            A diagnostic, never faster on the H200 (10^8 ads, fp16 math, tiles, E6 K2 and E8 K4, fp16
            and int8 rows): 1 or 2 rounds 1-8 % slower than none, 3 or more far slower (the
            prefetched rounds evict each other from L2: 4 rounds, 1.45x the time).
        batched: a batch of requests in one launch (candidates access, shared weights, scores to
            memory or the filter pass; launch ``[(grid, B), block]``; see the module docstring).
        sample: with ``batched`` and scores to memory: score the M = ``sample`` stratified sample
            of each request's candidates into ``out [B, M]`` (NaN past a request's candidates);
            a multiple of :data:`SAMPLE_RUN`.
        math: ``"fp32"`` (every product and sum in fp32, on the CUDA cores or 3xTF32 tensor-core
            steps) or ``"fp16"``: h, the gate keys and the values in fp16 (FiLM + ReLU in half2, one
            rounding), the gate logits and value dots by ``mma.sync`` m16n8k16 with fp32
            accumulation, softmax, expert choice and combination in fp32 (docs/design.md, "Storage
            and math"); fp16 or int8 rows (an int8 row dequantized to fp16 first: q times its scale
            rounded to fp16, the product rounded once), d a multiple of 16, E <= 8, whole warps;
            ``wimg`` is then :func:`.weights.mma_f16_image` (uint32), each lane's share kept in registers.
        dequant: how fp16 math dequantizes int8 rows: ``"mul"`` (a subtract and a multiply a pair of
            values, any scale) or ``"fma"`` (one fused multiply-add a pair, the same scores, for tables
            whose every scale passes :func:`.weights.fma_dequant_exact`:
            :meth:`.table.DeviceAdTable.fma_dequant`).
        tile_order: the order of fp16 math's mma work within a round (a warp's two tiles of 16 ads):
            ``"tiles"`` (tile 0's steps, its next-round loads, then tile 1's) or ``"steps"`` (the
            two tiles' steps alternating, then both tiles' loads: four independent accumulator
            chains in one basic block). The same scores either way.
        f16_weights: fp16 math's per-lane weights in ``"registers"`` or ``"shared"`` memory (read
            step by step, the steps alternating; :class:`.config.KernelConfig`). The same scores.
        rows_ahead: rounds of rows fp16 math keeps in flight in registers where the next round's
            are loaded early (``prefetch``; elsewhere 1): 1 or 2 (:class:`.config.KernelConfig`).
            The same scores.
        ring_stages: 0, or 2-4: int8 rows in fp16 math on the full pool travel through a
            shared-memory ring of that many rounds a warp, filled by ``cp.async`` copies instead
            of register loads (elsewhere 0; :class:`.config.KernelConfig`). The same scores.
        scale_pairs: int8 rows in fp16 math: the ``scale`` argument is the table's
            :meth:`~.table.DeviceAdTable.scale_pairs` (uint32), not its float32 scales
            (``row_scales`` of :class:`.config.KernelConfig`). The same scores.
        split_loop: fp16 math over the whole pool, one request, scores to memory or the filter
            pass (not the block top-K, ``rows_ahead=2`` or ``l2_ahead``; elsewhere ignored): the
            loop over rounds in two, the rounds whose loads ahead fall on whole rounds first,
            without bounds checks (``loop`` of :class:`.config.KernelConfig`). The same scores.

    Raises:
        ValueError: for a configuration the generator cannot build (before any compilation).
    """
    if values not in ("chosen", "all"):
        raise ValueError(f"values must be 'chosen' or 'all', got {values!r}")
    if math not in ("fp32", "fp16"):
        raise ValueError(f"math must be 'fp32' or 'fp16', got {math!r}")
    if math == "fp16" and (model != "gated" or dtype not in ("fp16", "int8") or d % 16 or experts > 8 or block % 32 or mma
                           or sample):
        raise ValueError("math='fp16' takes the gated model, fp16 or int8 rows, d a multiple of 16, E <= 8 and whole warps; "
                         f"got {model}, {dtype}, d={d}, E={experts}, block={block}")
    if tile_order not in ("tiles", "steps") or (tile_order == "steps" and math != "fp16"):
        raise ValueError(f"tile_order must be 'tiles', or 'steps' with fp16 math; got {tile_order!r} ({math})")
    if f16_weights not in ("registers", "shared") or (f16_weights == "shared" and math != "fp16"):
        raise ValueError(f"f16_weights must be 'registers', or 'shared' with fp16 math; got {f16_weights!r} ({math})")
    if type(ring_stages) is not int or ring_stages not in (0, 2, 3, 4) or (ring_stages and math != "fp16"):
        raise ValueError(f"ring_stages must be 0, or 2-4 with fp16 math; got {ring_stages!r} ({math})")
    if type(rows_ahead) is not int or rows_ahead not in (1, 2) or (rows_ahead == 2 and math != "fp16"):
        raise ValueError(f"rows_ahead must be 1, or 2 with fp16 math; got {rows_ahead!r} ({math})")
    if type(scale_pairs) is not bool or (scale_pairs and (math != "fp16" or dtype != "int8")):
        raise ValueError(f"scale_pairs must be False, or True with fp16 math on int8 rows; got {scale_pairs!r} "
                         f"({math}, {dtype})")
    if type(split_loop) is not bool:
        raise ValueError(f"split_loop must be a bool, got {split_loop!r}")
    if dequant not in ("mul", "fma") or (dequant == "fma" and (math != "fp16" or dtype != "int8")):
        raise ValueError(f"dequant must be 'mul', or 'fma' with fp16 math on int8 rows; got {dequant!r} "
                         f"({math}, {dtype})")
    if model not in MODELS or layout not in LAYOUTS or access not in ACCESS:
        raise ValueError(f"bad kernel configuration {model, layout, access}")
    if d % PER_WORD[dtype]:
        raise ValueError(f"d={d} must be a multiple of {PER_WORD[dtype]} for {dtype}")
    if weights not in ("shared", "param") or guard not in ("fence", "offset"):
        raise ValueError(f"bad weights / guard {weights!r} / {guard!r}")
    if mma_terms not in (1, 2, 3):
        raise ValueError(f"mma_terms must be 1, 2 or 3, got {mma_terms!r}")
    if bias_load not in ("ahead", "start", "end"):
        raise ValueError(f"bias_load must be 'ahead', 'start' or 'end', got {bias_load!r}")
    if isinstance(l2_ahead, bool) or not isinstance(l2_ahead, int) or not 0 <= l2_ahead <= 8:
        raise ValueError(f"l2_ahead must be an int in 0..8, got {l2_ahead!r}")
    if softmax not in ("auto", "fast", "exact") or choice not in ("auto", "passes", "ranks", "insert"):
        raise ValueError(f"bad softmax / choice {softmax!r} / {choice!r}")
    if choice in ("ranks", "insert") and not (math == "fp16" or mma or values == "all"):
        raise ValueError(f"choice={choice!r} needs every expert's value dot (math='fp16', mma or values='all')")
    if mma and (model != "gated" or PER_WORD[dtype] != 4 or d % 16 or experts > 8 or block % 32
                or weights != "shared"):
        raise ValueError("the tensor-core kernel takes the gated model, fp16 or bf16 rows, d a multiple of 16, "
                         f"E <= 8, whole warps and shared weights; got {model}, {dtype}, d={d}, E={experts}, "
                         f"block={block}, weights={weights}")
    if weights == "param" and values == "all":
        raise ValueError('weights="param" computes the chosen experts\' values only (values="chosen")')
    if seed_filter and topk_cap:
        raise ValueError("seed_filter and a block top-K buffer (topk_cap) exclude each other")
    if batched and (access != "candidates" or topk_cap or weights != "shared" or mma):
        raise ValueError("a batched kernel reads candidate lists with shared weights (or fp16 math's registers), "
                         "not the TF32 tensor-core variant, and writes scores or runs the filter pass")
    if sample and (not batched or seed_filter or sample % SAMPLE_RUN or sample < 2 * SAMPLE_RUN):
        raise ValueError(f"sample={sample}: a batched scores-to-memory kernel's sample, a multiple of {SAMPLE_RUN} "
                         f"of at least {2 * SAMPLE_RUN}")
    src = _source(model, d, experts, k_experts, dtype, layout, access, topk_cap > 0, block, values, items,
                  seed_filter, weights, guard, mma, mma_terms, prefetch, batched, sample, math, bias_load, softmax, choice,
                  l2_ahead, dequant, tile_order, f16_weights, rows_ahead, ring_stages, scale_pairs, split_loop)
    env = {"cuda": cuda, "float32": float32, "int16": int16, "int32": int32, "int64": int64, "uint64": uint64,
           "math": pymath, "np": np, "decode": DECODE[dtype], "max_nan": max_nan, "test_bit": test_bit,
           "lds2": lds2, "lds4": lds4, "sts2": sts2, "rcp_approx": rcp_approx, "CAP": max(topk_cap, 1), "tf32_round": tf32_round, "mma_tf32": mma_tf32,
           "mma_tf32_warp": mma_tf32_warp, "mma_f16": mma_f16, "mma_f16_warp": mma_f16_warp, "film_h2": film_h2,
           "uint32": uint32, "half2_of": half2_of, "pair_low": pair_low, "pair_high": pair_high, "dequant_i8x4": dequant_i8x4,
           "dequant_i8x4_fma": dequant_i8x4_fma, "dequant_offset_h2": dequant_offset_h2, "ld_half": ld_half,
           "ld_u64": ld_u64,
           "exp_shifted": exp_shifted, "prefetch_l2": prefetch_l2, "prefetch_l2_2d": prefetch_l2_2d,
           "cp_async_commit": cp_async_commit, "cp_async_wait": cp_async_wait,
           "cp_async_row": cp_async_row, "shared_offset": shared_offset}
    if topk_cap:
        t = block_topk(topk_cap, block, has_ids, items, every)
        env.update(topk_init=t.init, topk_insert=t.insert, topk_round_end=t.round_end, topk_finish=t.finish)
    mma_tag = f"_mma{mma_terms}{'p' if prefetch else ''}" if mma else ("_f16" if math == "fp16" else "")
    mma_tag += ("" if bias_load == "ahead" else f"_b{bias_load}") + ("" if softmax == "auto" else f"_{softmax}")
    mma_tag += ("" if choice == "auto" else f"_{choice}") + (f"_l2a{l2_ahead}" if l2_ahead else "")
    mma_tag += ("_fma" if dequant == "fma" else "") + ("_steps" if tile_order == "steps" else "")
    mma_tag += ("_wsh" if f16_weights == "shared" else "") + ("_ra2" if rows_ahead == 2 else "")
    mma_tag += (f"_ring{ring_stages}" if ring_stages else "") + ("_sp" if scale_pairs else "")
    mma_tag += "_split" if split_loop else ""
    batch_tag = (f"_batched{'_s' + str(sample) if sample else ''}" if batched else "")
    name = (f"fused_{model}_d{d}_E{experts}_K{k_experts}_{dtype}_{layout}_{access}_b{block}_cap{topk_cap}_{values}"
            f"_i{items}_e{every}{'_filter' if seed_filter else ''}_{weights}_{guard}{mma_tag}{batch_tag}")
    code = compile(src, f"<{name}>", "exec")
    exec(code, env)
    fn = env["kernel"]
    fn.__name__ = fn.__qualname__ = name
    fn.__source__ = src
    if max_registers and not config.ENABLE_CUDASIM:  # the simulator has no register cap
        return cuda.jit(fn, max_registers=max_registers)
    return cuda.jit(fn)
