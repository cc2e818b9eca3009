"""Code-generated fused gather-gate-score kernels, specialized per (d, E, K, dtype, layout, access).

Why generated: the per-ad work is straight-line code over compile-time dimensions; writing it out
keeps every per-ad value in registers and lets every weight read be a 16-byte vector load at a
constant offset. Per ad (d = 64, fp16, E = 6, K = 2), counted from the SASS of this kernel:
16 eight-byte row loads, 64 widenings (HADD2.F32), 64 FFMA + 64 FMNMX.NAN (context encoding),
384 FFMA (gate), 6 exp, ~40 compare/select (softmax and expert choice), 128 FFMA (the K value dots),
and 128 sixteen-byte shared loads (gamma, beta and G are warp-uniform broadcasts; the chosen V rows
differ per ad). That is ~950 instructions per ad, against ~1,050 a thread can issue per ad at 90% of
the H200 read ceiling (132 SMs x 4 issue slots x 1.98 GHz x 32 lanes / 31.6 G ads/s): the gated
kernel sits right at the point where it turns issue-bound, which the throughput notebook marks.
Measured, the 128 shared loads were the tighter limit (a warp's 16-byte load moves 512 bytes
through the shared pipe): with ``weights="param"`` gamma, beta and G come in as a tuple kernel
argument, which ptxas reads from the constant bank with uniform loads (``ULDC.64``, two floats
each, ~240 per ad: more instructions, 1,213 per 32 ads in the loop, but no shared traffic);
17.0 -> 20.5 G ads/s on the H200, where Nsight Compute then shows instruction issue at 0.79 per
scheduler cycle: issue-bound.

``mma=True`` generates the tensor-core variant instead (see :func:`_emit_mma`): a warp scores 32
ads with ``mma.sync`` m16n8k8 TF32 steps, 3 products per step (3xTF32), from a per-lane weight
image (:func:`mma_image`); measured L1 / shared-pipe bound (92 %) at 19.7 G ads/s with truncated
splits; the splits are now rounded to nearest (more accurate, ~40 % more instructions, unmeasured).

Weights live in one 16-byte-aligned shared image (host-prepared by :func:`weight_image`)::

    gated: [gamma (d) | beta (d) | G / sqrt(d) (E*d, row-major) | V (E rows of pitch d + 4)]
    dot:   [u (d)]

V rows are padded to ``d + 4`` floats so that 8 threads holding 8 different chosen experts read 8
disjoint bank groups in one 16-byte load. ``h`` (d floats) stays in registers between the gate and
the value pass; nothing per ad touches device memory except the row, the bias (and the int8 scale),
and, unfused, the score.

Kernel arguments (in order)::

    words   uint64 view of the table: [n_ads, d/W] (rows) or [d/W, n_ads] (tiles), W = elements per word
    scale   float32[n_ads] (int8) or dummy        bias    float32[n_ads]
    wimg    float32 weight image (see above)
    elig    uint64 eligible bitset (bitset access) or dummy
    cand    int32[n_items] slots (candidates access) or dummy
    n_items int64; ids int64[n_ads] (tie-break ad ids) ; k (fused top-k)
    out     float32[n_items] (unfused) or dummy
    cand_s, cand_i, counts: per-block top-k outputs (fused) or dummies
    wt      (weights="param" only) UniTuple(float32, n): the weight image's first n floats
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, int16, int32, int64, uint64
from numba.cuda.core import config

from ..device.bits import test_bit
from ..device.intrinsics import DECODE, PER_WORD, lds4, max_nan, mma_tf32, mma_tf32_warp, tf32_round
from ..topk.block import block_topk

ACCESS = ("pool", "bitset", "candidates")
#: eligible-bitset positions each thread expands per tile of the compacting (top-K) bitset kernels
BITS_PER_THREAD = 16
LAYOUTS = ("rows", "tiles")
MODELS = ("gated", "dot")
#: shared-memory row pitch of V: d + PAD floats
PAD = 4


def image_size(model: str, d: int, experts: int) -> int:
    """Floats in the weight image (see the module docstring)."""
    return d if model == "dot" else 2 * d + experts * d + experts * (d + PAD)


def weight_image(model: str, request=None, user=None) -> np.ndarray:
    """The float32 weight image for a request (gated) or a user vector (dot)."""
    if model == "dot":
        return np.ascontiguousarray(user, dtype=np.float32)
    E, d = request.V.shape
    G = (request.G.astype(np.float64) / np.sqrt(d)).astype(np.float32)
    V = np.zeros((E, d + PAD), np.float32)
    V[:, :d] = request.V
    return np.concatenate([request.gamma, request.beta, G.ravel(), V.ravel()]).astype(np.float32)


#: ad rows per tensor-core tile (mma m16n8k8: 16 rows, 8 experts, 8 dims per step)
MMA_ROWS = 16


def mma_image_size(d: int) -> int:
    """Floats in the tensor-core weight image (see :func:`mma_image`)."""
    return (d // 8) * 3 * 32 * 4


def mma_dims(d: int) -> np.ndarray:
    """``dims[c, i]``: the embedding dimension lane ``c = lane % 4`` holds as its i-th value
    (``i < d / 4``): it loads the 8-byte words ``c, c + 4, c + 8, ...`` of a row (4 dims each), and
    step ``j`` of the dot product feeds values ``2j`` and ``2j + 1`` to the mma as k = c and c + 4."""
    i = np.arange(d // 4)
    c = np.arange(4)[:, None]
    return 4 * (c + 4 * (i // 4)) + i % 4


def mma_image(request) -> np.ndarray:
    """The float32 per-lane weight image of the tensor-core kernels, ``[d/8, 3, 32, 4]``:
    for step j and lane l = 4 g + c (dims ``a, b = dims[c, 2j], dims[c, 2j+1]``)::

        part 0: gamma[a], gamma[b], beta[a], beta[b]
        part 1: hi(G'[g, a]), hi(G'[g, b]), lo(G'[g, a]), lo(G'[g, b])     G' = G / sqrt(d)
        part 2: the same for V

    with hi(x) = x rounded to TF32 and lo(x) = tf32(x - hi(x)), both to nearest (3xTF32: hi*hi +
    hi*lo + lo*hi; |lo| <= 2^-12 |x| and the rounding of lo adds 2^-24 |x|: fp32-level accuracy;
    truncating instead measured several times less accurate); experts g >= E are zero. Lanes read consecutive 16-byte pieces (no
    bank conflicts)."""
    from ..device.intrinsics import tf32_round_host

    E, d = request.V.shape
    if d % 16 or E > 8:
        raise ValueError(f"the tensor-core kernel needs d a multiple of 16 and E <= 8, got d={d}, E={E}")

    def split(x):
        x = np.asarray(x, np.float32)
        hi = tf32_round_host(x)
        with np.errstate(invalid="ignore", over="ignore"):
            lo = tf32_round_host((x - hi).astype(np.float32))
        return hi, lo

    Gs = np.zeros((8, d), np.float32)
    Gs[:E] = (request.G.astype(np.float64) / np.sqrt(d)).astype(np.float32)
    Vs = np.zeros((8, d), np.float32)
    Vs[:E] = request.V
    dims = mma_dims(d)
    img = np.zeros((d // 8, 3, 32, 4), np.float32)
    gamma, beta = np.asarray(request.gamma, np.float32), np.asarray(request.beta, np.float32)
    for j in range(d // 8):
        for lane in range(32):
            g, c = lane // 4, lane % 4
            a, b = dims[c, 2 * j], dims[c, 2 * j + 1]
            img[j, 0, lane] = gamma[a], gamma[b], beta[a], beta[b]
            for part, M in ((1, Gs), (2, Vs)):
                hi, lo = split([M[g, a], M[g, b]])
                img[j, part, lane] = hi[0], hi[1], lo[0], lo[1]
    return img.ravel()


def _emit_mma_load(emit, ind: str, t: int, base: str, d: int, layout: str, access: str, compact: bool) -> None:
    """Emit the loads of tile t (rows 16 t + g and 16 t + g + 8 of a warp's 32 ads, counted from
    ``base``): each lane's 4-dim words c, c + 4, ... of both rows into ``m{q}_{wi}`` (zero for a
    row past the end or not eligible)."""
    for q in (2 * t, 2 * t + 1):  # q = 2 t + half: row 16 t + 8 half + g of the warp's 32
        half = q % 2
        emit(f"{ind}ir{q} = {base} + wbase + {16 * t + 8 * half} + g8")
        if compact:
            emit(f"{ind}okr{q} = ir{q} < n_list")
            emit(f"{ind}sr{q} = tile0 + int64(lst[ir{q}]) if okr{q} else int64(0)")
        else:
            emit(f"{ind}okr{q} = ir{q} < n_items")
            emit(f"{ind}sr{q} = ir{q}")
            if access == "candidates":
                emit(f"{ind}if okr{q}:")
                emit(f"{ind}    sr{q} = int64(cand[ir{q}])")
            elif access == "bitset":
                emit(f"{ind}if okr{q}:")
                emit(f"{ind}    okr{q} = test_bit(elig, ir{q}) != 0")
        emit(f"{ind}ur{q} = uint64(sr{q})")
        for wi in range(d // 16):
            emit(f"{ind}m{q}_{wi} = uint64(0)")
        emit(f"{ind}if okr{q}:")
        for wi in range(d // 16):
            col = f"c4 + {4 * wi}"
            idx = f"ur{q}, {col}" if layout == "rows" else f"{col}, ur{q}"
            emit(f"{ind}    m{q}_{wi} = words[{idx}]")


def _emit_mma_tile(emit, ind: str, t: int, d: int, terms: int = 3) -> None:
    """Emit tile t's encoding and mma steps: ``cg{t}_*`` (8 gate logits) and ``cv{t}_*`` (8 value
    dots) of its 16 rows, from the words ``m{2t}_*`` and ``m{2t+1}_*``."""
    for r in range(4):
        emit(f"{ind}cg{t}_{r} = zero")
        emit(f"{ind}cv{t}_{r} = zero")
    rows = (2 * t, 2 * t + 1)
    for j in range(d // 8):
        wi, e0 = divmod(2 * j, 4)
        if e0 == 0:
            for q in rows:
                emit(f"{ind}x{q}_0, x{q}_1, x{q}_2, x{q}_3 = decode(m{q}_{wi})")
        for part, names in ((0, "ga, gb, ba, bb"), (1, "gh0, gh1, gl0, gl1"), (2, "vh0, vh1, vl0, vl1")):
            emit(f"{ind}{names} = lds4(wsh, wo + {((j * 3 + part) * 32) * 4} + lane * 4)")
        for q in rows:
            emit(f"{ind}ha{q} = max_nan(x{q}_{e0} * ga + ba, zero)")
            emit(f"{ind}hb{q} = max_nan(x{q}_{e0 + 1} * gb + bb, zero)")
        # A fragment: a0 = (row g, k = c), a1 = (g + 8, c), a2 = (g, c + 4), a3 = (g + 8, c + 4)
        frag = [f"ha{rows[0]}", f"ha{rows[1]}", f"hb{rows[0]}", f"hb{rows[1]}"]
        for r, a in enumerate(frag):
            emit(f"{ind}ah{r} = tf32_round({a})")
            emit(f"{ind}al{r} = tf32_round({a} - ah{r})")
        for acc, bh0, bh1, bl0, bl1 in ((f"cg{t}", "gh0", "gh1", "gl0", "gl1"), (f"cv{t}", "vh0", "vh1", "vl0", "vl1")):
            # terms < 3 (diagnostics only: less accurate) keeps the last products
            for A, B0, B1 in (("al", bh0, bh1), ("ah", bl0, bl1), ("ah", bh0, bh1))[3 - terms:]:
                _emit_mma_call(emit, ind, acc, [f"{A}{r}" for r in range(4)], B0, B1)


def _emit_mma_store(emit, ind: str) -> None:
    """Emit the hand-over of both tiles' results to shared memory (``msc[wid, row, 0:8]`` logits,
    ``8:16`` values) between two warp barriers. C fragment: c0, c1 = (row g, experts 2c, 2c + 1),
    c2, c3 = (row g + 8, ...)."""
    emit(f"{ind}{SYNC_WARP}")  # the previous round's readers are done with msc
    for t in range(2):
        for half in range(2):
            row = f"{16 * t + 8 * half} + g8"
            for which, off in (("cg", 0), ("cv", 8)):
                emit(f"{ind}msc[wid, {row}, {off} + 2 * c4] = {which}{t}_{2 * half}")
                emit(f"{ind}msc[wid, {row}, {off + 1} + 2 * c4] = {which}{t}_{2 * half + 1}")
    emit(f"{ind}{SYNC_WARP}")


def _emit_mma(emit, d: int, dtype: str, layout: str, access: str, compact: bool, terms: int = 3,
              prefetch: bool = False) -> None:
    """Emit the warp-collective tensor-core part of one round (outside any per-ad branch: mma.sync
    needs all 32 lanes). With ``prefetch`` the round's words were loaded by the previous round (or
    before the loop), and each tile's words for the next round (``base + stride``) are loaded as
    soon as that tile is encoded, so loads stay in flight while the warp computes."""
    ind = "        "
    if not prefetch:
        for t in range(2):
            _emit_mma_load(emit, ind, t, "base", d, layout, access, compact)
    for t in range(2):
        _emit_mma_tile(emit, ind, t, d, terms)
        if prefetch:
            _emit_mma_load(emit, ind, t, "base + stride", d, layout, access, compact)
    _emit_mma_store(emit, ind)


def _emit_mma_call(emit, ind, acc, a, b0, b1):
    cs = [f"{acc}_{r}" for r in range(4)]
    if config.ENABLE_CUDASIM:  # the warp's fragments meet in shared memory (mma_tf32_warp)
        for r, v in enumerate(a + [b0, b1] + cs):
            emit(f"{ind}scr[wid, lane, {r}] = {v}")
        emit(f"{ind}cuda.syncthreads()")
        emit(f"{ind}{', '.join(cs)} = mma_tf32_warp(scr[wid], lane)")
        emit(f"{ind}cuda.syncthreads()")
    else:
        emit(f"{ind}{', '.join(cs)} = mma_tf32({', '.join(a + [b0, b1] + cs)})")


#: a warp barrier (the simulator has no syncwarp; its block barrier stands in, every thread of the
#: block reaches it together)
SYNC_WARP = "cuda.syncthreads()" if config.ENABLE_CUDASIM else "cuda.syncwarp()"


def _source(model: str, d: int, E: int, K: int, dtype: str, layout: str, access: str, fused: bool,
            block: int, values: str = "chosen", items: int = 1, seed_filter: bool = False,
            weights: str = "shared", guard: str = "fence", mma: bool = False, mma_terms: int = 3,
            prefetch: bool = True) -> str:
    param_weights = weights == "param"
    if mma:
        values = "all"  # the tensor cores compute every expert's value dot (8 experts per tile)
    # the next round's rows are loaded while this one computes, where rounds follow each other
    # simply (not through a compacted list, one round per top-K barrier pair)
    prefetch = mma and prefetch and not (access == "bitset" and (fused or seed_filter)) and (items == 1 or not fused)
    W = PER_WORD[dtype]
    NW = d // W
    size = image_size(model, d, E)
    align = "" if config.ENABLE_CUDASIM else ", alignment=16"
    o_beta, o_g, o_v, pitch = d, 2 * d, 2 * d + E * d, d + PAD
    L = []
    emit = L.append
    wt = ", wt" if param_weights else ""
    if seed_filter:
        emit(f"def kernel(words, scale, bias, wimg, elig, cand, n_items, ids, seeds, buf_s, buf_i, fill, counts{wt}):")
    else:
        emit(f"def kernel(words, scale, bias, wimg, elig, cand, n_items, ids, k, out, cand_s, cand_i, counts{wt}):")
    emit("    tid = cuda.threadIdx.x")
    if mma:
        size = mma_image_size(d)
        emit("    lane = tid % 32")
        emit("    wid = tid // 32")
        emit("    wbase = wid * 32")
        emit("    g8 = lane // 4")
        emit("    c4 = lane % 4")
        emit(f"    msc = cuda.shared.array(({block // 32}, 32, 16), float32)")  # per warp: 32 ads x (8 logits, 8 values)
        if config.ENABLE_CUDASIM:
            emit(f"    scr = cuda.shared.array(({block // 32}, 32, 10), float32)")
    emit(f"    wsh = cuda.shared.array({size}, float32{align})")
    emit(f"    for t in range(tid, {size}, {block}):")
    emit("        wsh[t] = wimg[t]")
    if fused:
        emit("    buf_s = cuda.shared.array(CAP, float32)")
        emit("    buf_i = cuda.shared.array(CAP, int32)")
        emit("    st = cuda.shared.array(1, int32)")
        emit("    thr_s = cuda.shared.array(1, float32)")
        emit("    thr_i = cuda.shared.array(1, int32)")
        emit("    n_ok = cuda.shared.array(1, int64)")
        emit("    if tid == 0:")
        emit("        n_ok[0] = 0")
    if seed_filter:
        emit("    tally = cuda.shared.array(2, int64)")
        emit("    if tid == 0:")
        emit("        tally[0] = 0")
        emit("        tally[1] = 0")
        emit("    seed = seeds[0]")
        emit("    cap = buf_s.shape[1]")
        emit("    above = 0")
    emit("    cuda.syncthreads()")
    if fused:
        emit("    topk_init(st, thr_s, thr_i, float32(-math.inf))")
    emit("    mine = 0")
    emit("    zero = float32(0.0)")
    per_round = block * items if fused else block
    emit("    rnd = 0")
    # an eligible bitset feeding a top-K (not scores to memory, which writes NaN where ineligible):
    # each tile of BITS_PER_THREAD * block positions is first compacted into a shared list of its
    # eligible positions, and the threads score the list densely; scoring position by position
    # runs the gate in every warp that holds one eligible ad (nearly all of them at 10 %)
    compact = access == "bitset" and (fused or seed_filter)
    if compact:
        tile = BITS_PER_THREAD * block
        emit(f"    lst = cuda.shared.array({tile}, int16)")
        emit(f"    bcnt = cuda.shared.array({block}, int32)")
        emit(f"    for tile0 in range(cuda.blockIdx.x * {tile}, n_items, cuda.gridDim.x * {tile}):")
        emit(f"      p0 = tile0 + {BITS_PER_THREAD} * tid")
        emit("      bits = uint64(0)")
        emit("      if p0 < n_items:")
        emit(f"        bits = (elig[p0 >> 6] >> uint64(p0 & 63)) & uint64({(1 << BITS_PER_THREAD) - 1})")
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
        if not fused and not param_weights and guard == "fence":  # keep the shared weight loads in it (see below)
            emit("        cuda.threadfence_block()")
        emit("        jj = base + tid")
        emit("        ok = jj < n_list")
        emit("        j = tile0 + int64(lst[jj]) if ok else int64(0)")
        emit("        slot = j")
    else:
        emit(f"    stride = cuda.gridDim.x * {per_round}")
        if prefetch:  # the first round's words (see _emit_mma)
            emit(f"    base = cuda.blockIdx.x * {per_round}")
            for t in range(2):
                _emit_mma_load(emit, "    ", t, "base", d, layout, access, False)
        emit(f"    for base0 in range(cuda.blockIdx.x * {per_round}, n_items, stride):")
        if fused:
            # several ads per thread between two top-K barrier pairs (the barriers, not the scoring,
            # were a third of the fused kernel's time with one ad per round)
            emit(f"      for it in range({items}):")
            emit(f"        base = base0 + it * {block}")
        else:
            emit("        base = base0")
        if not fused and not param_weights and guard == "fence":
            # keeps ptxas from hoisting the loop-invariant shared weight loads out of the loop (it
            # would hold all of them in registers and spill); the fused loop has barriers instead
            emit("        cuda.threadfence_block()")
        emit("        j = base + tid")
        emit("        ok = j < n_items")
        emit("        slot = j")
    if access == "candidates":
        emit("        if ok:")
        emit("            slot = int64(cand[j])")
    elif access == "bitset" and not compact:
        emit("        if ok:")
        emit("            ok = test_bit(elig, j) != 0")
    emit("        s = float32(math.nan)")
    # "offset" guard: the shared weight loads are addressed from wo, zero at run time but unknown
    # to ptxas (j < 2^62), so it cannot hoist them out of the loop either, without a fence
    emit("        wo = int64(j >> 62)" if guard == "offset" and not fused and not param_weights else "        wo = 0")
    if mma:
        _emit_mma(emit, d, dtype, layout, access, compact, mma_terms, prefetch)
    emit("        if ok:")
    ind = "            "
    emit(f"{ind}us = uint64(slot)")  # unsigned index: no negative-index wraparound code
    if mma:  # this thread's ad is row `lane` of its warp's tile
        for e in range(E):
            emit(f"{ind}l{e} = msc[wid, lane, {e}]")
            emit(f"{ind}a{e} = msc[wid, lane, {8 + e}]")
    else:  # this thread's own row: all loads first, then the widening
        for w in range(NW):
            idx = f"us, {w}" if layout == "rows" else f"{w}, us"
            emit(f"{ind}w{w} = words[{idx}]")
        for w in range(NW):
            names = ", ".join(f"x{w * W + i}" for i in range(W))
            emit(f"{ind}{names} = decode(w{w})")
    # int8: the dot kernel multiplies its sum by the row scale once (sum_i u_i (s x_i) = s sum_i u_i x_i);
    # the gated kernel needs s x_i itself, inside the ReLU
    int8_dot = dtype == "int8" and model == "dot"
    if dtype == "int8" and not mma:
        emit(f"{ind}rs = scale[us]")
        for i in range(d if not int8_dot else 0):
            emit(f"{ind}x{i} = x{i} * rs")
    if model == "dot" and param_weights:
        for i in range(d):
            emit(f"{ind}acc = x{i} * wt[{i}]" if i == 0 else f"{ind}acc = acc + x{i} * wt[{i}]")
        emit(f"{ind}s = acc * rs + bias[us]" if int8_dot else f"{ind}s = acc + bias[us]")
    elif param_weights:
        for i in range(d):
            emit(f"{ind}h{i} = max_nan(x{i} * wt[{i}] + wt[{o_beta + i}], zero)")
        for e in range(E):
            for i in range(d):
                emit(f"{ind}l{e} = h{i} * wt[{o_g + e * d + i}]" if i == 0 else f"{ind}l{e} = l{e} + h{i} * wt[{o_g + e * d + i}]")
    if param_weights or mma:
        pass
    elif model == "dot":
        for q in range(d // 4):
            emit(f"{ind}u0, u1, u2, u3 = lds4(wsh, wo + {4 * q})")
            for t in range(4):
                i = 4 * q + t
                emit(f"{ind}acc = x{i} * u{t}" if i == 0 else f"{ind}acc = acc + x{i} * u{t}")
        emit(f"{ind}s = acc * rs + bias[us]" if int8_dot else f"{ind}s = acc + bias[us]")
    else:
        for q in range(d // 4):
            emit(f"{ind}g0, g1, g2, g3 = lds4(wsh, wo + {4 * q})")
            emit(f"{ind}c0, c1, c2, c3 = lds4(wsh, wo + {o_beta + 4 * q})")
            for t in range(4):
                i = 4 * q + t
                emit(f"{ind}h{i} = max_nan(x{i} * g{t} + c{t}, zero)")
            for e in range(E):
                emit(f"{ind}q0, q1, q2, q3 = lds4(wsh, wo + {o_g + e * d + 4 * q})")
                terms = " + ".join(f"h{4 * q + t} * q{t}" for t in range(4))
                emit(f"{ind}l{e} = {terms}" if q == 0 else f"{ind}l{e} = l{e} + {terms}")
            if values == "all":  # every expert's value dot in the same pass: h need not stay live
                for e in range(E):
                    emit(f"{ind}q0, q1, q2, q3 = lds4(wsh, {o_v + e * pitch + 4 * q})")
                    terms = " + ".join(f"h{4 * q + t} * q{t}" for t in range(4))
                    emit(f"{ind}a{e} = {terms}" if q == 0 else f"{ind}a{e} = a{e} + {terms}")
    if model != "dot":
        emit(f"{ind}m = l0")
        for e in range(1, E):
            emit(f"{ind}if l{e} > m:")
            emit(f"{ind}    m = l{e}")
        for e in range(E):
            emit(f"{ind}p{e} = math.exp(l{e} - m)")
        emit(f"{ind}z = " + " + ".join(f"p{e}" for e in range(E)))
        emit(f"{ind}taken = 0")
        for r in range(K):
            emit(f"{ind}b = -1")
            emit(f"{ind}bl = zero")
            emit(f"{ind}bp = zero")
            for e in range(E):
                emit(f"{ind}if (taken & {1 << e}) == 0 and (b < 0 or l{e} > bl):")
                emit(f"{ind}    b = {e}")
                emit(f"{ind}    bl = l{e}")
                emit(f"{ind}    bp = p{e}")
            emit(f"{ind}taken |= 1 << b")
            if values == "all":
                emit(f"{ind}v{r} = a0")
                for e in range(1, E):
                    emit(f"{ind}if b == {e}:")
                    emit(f"{ind}    v{r} = a{e}")
            else:
                emit(f"{ind}vb = {o_v} + b * {pitch}")
                for q in range(d // 4):
                    emit(f"{ind}q0, q1, q2, q3 = lds4(wsh, vb + {4 * q})")
                    terms = " + ".join(f"h{4 * q + t} * q{t}" for t in range(4))
                    emit(f"{ind}v{r} = {terms}" if q == 0 else f"{ind}v{r} = v{r} + {terms}")
            emit(f"{ind}wp{r} = bp")
        emit(f"{ind}mixed = " + " + ".join(f"wp{r} * v{r}" for r in range(K)))
        emit(f"{ind}s = mixed / z + bias[us]")
    if fused:
        emit("        if ok and not math.isnan(s):")
        emit("            mine += 1")
        emit("        topk_insert(buf_s, buf_i, st, thr_s, thr_i, s, int32(slot), ok, ids)")
        if compact:  # a round per list chunk (m is the same in every thread: the rounds are uniform)
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
    elif seed_filter:
        # the score never reaches memory: only those at or above the seed are appended (a few
        # thousand of 10^8), for one block's radix select (topk.block.final_radix_kernel)
        emit("        if ok and not math.isnan(s):")
        emit("            mine += 1")
        emit("            if s >= seed:")
        emit("                above += 1")
        emit("                pos = cuda.atomic.add(fill, 0, 1)")
        emit("                if pos < cap:")
        emit("                    buf_s[0, pos] = s")
        emit("                    buf_i[0, pos] = int32(slot)")
        if compact:
            emit("      cuda.syncthreads()")  # the next tile rewrites the list
        emit("    cuda.atomic.add(tally, 0, mine)")
        emit("    cuda.atomic.add(tally, 1, above)")
        emit("    cuda.syncthreads()")
        emit("    if tid == 0:")
        emit("        cuda.atomic.add(counts[0], 0, tally[0])")
        emit("        cuda.atomic.add(counts[0], 1, tally[1])")
    else:
        emit("        if j < n_items:")
        emit("            out[j] = s")
    return "\n".join(L) + "\n"


@functools.lru_cache(maxsize=None)
def fused_kernel(model: str, d: int, experts: int, k_experts: int, dtype: str, layout: str, access: str,
                 block: int, topk_cap: int = 0, has_ids: bool = True, values: str = "chosen",
                 max_registers: int | None = None, items: int = 1, every: int = 1, seed_filter: bool = False,
                 weights: str = "shared", guard: str = "fence", mma: bool = False, mma_terms: int = 3,
                 prefetch: bool = True):
    """Compile (lazily, on first launch) the generated kernel for one configuration.

    Args:
        model: ``"gated"`` (DESIGN.md's model) or ``"dot"`` (two-tower ``dot(u, a) + b``).
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
            ``seeds, buf_s, buf_i, fill`` (the filter path of topk.select.filter_kernel, fused).
        weights: ``"shared"`` (every weight from the shared image) or ``"param"`` (gamma, beta, G,
            or the dot model's u, from an extra tuple argument ``wt``; scoring.KernelConfig).
        guard: ``"fence"`` or ``"offset"``: how the unfused loops keep ptxas from hoisting the
            shared weight loads (see _source).
        mma: the tensor-core variant (gated, fp16 / bf16, d % 16 == 0, E <= 8, whole warps,
            shared weights; ``wimg`` is then :func:`mma_image`).
        mma_terms: products per mma step, 3 (3xTF32, the only accurate choice; 1 and 2 exist for
            diagnostics). prefetch: the tensor-core kernel loads the next round's rows early.

    Raises:
        ValueError: for a configuration the generator cannot build (before any compilation).
    """
    if values not in ("chosen", "all"):
        raise ValueError(f"values must be 'chosen' or 'all', got {values!r}")
    if model not in MODELS or layout not in LAYOUTS or access not in ACCESS:
        raise ValueError(f"bad kernel configuration {model, layout, access}")
    if d % PER_WORD[dtype]:
        raise ValueError(f"d={d} must be a multiple of {PER_WORD[dtype]} for {dtype}")
    if weights not in ("shared", "param") or guard not in ("fence", "offset"):
        raise ValueError(f"bad weights / guard {weights!r} / {guard!r}")
    if mma_terms not in (1, 2, 3):
        raise ValueError(f"mma_terms must be 1, 2 or 3, got {mma_terms!r}")
    if mma and (model != "gated" or PER_WORD[dtype] != 4 or d % 16 or experts > 8 or block % 32
                or weights != "shared"):
        raise ValueError("the tensor-core kernel takes the gated model, fp16 or bf16 rows, d a multiple of 16, "
                         f"E <= 8, whole warps and shared weights; got {model}, {dtype}, d={d}, E={experts}, "
                         f"block={block}, weights={weights}")
    if weights == "param" and values == "all":
        raise ValueError('weights="param" computes the chosen experts\' values only (values="chosen")')
    if seed_filter and topk_cap:
        raise ValueError("seed_filter and a block top-K buffer (topk_cap) exclude each other")
    src = _source(model, d, experts, k_experts, dtype, layout, access, topk_cap > 0, block, values, items,
                  seed_filter, weights, guard, mma, mma_terms, prefetch)
    env = {"cuda": cuda, "float32": float32, "int16": int16, "int32": int32, "int64": int64, "uint64": uint64,
           "math": math, "np": np, "decode": DECODE[dtype], "max_nan": max_nan, "test_bit": test_bit,
           "lds4": lds4, "CAP": max(topk_cap, 1), "tf32_round": tf32_round, "mma_tf32": mma_tf32,
           "mma_tf32_warp": mma_tf32_warp}
    if topk_cap:
        t = block_topk(topk_cap, block, has_ids, items, every)
        env.update(topk_init=t.init, topk_insert=t.insert, topk_round_end=t.round_end, topk_finish=t.finish)
    mma_tag = f"_mma{mma_terms}{'p' if prefetch else ''}" if mma else ""
    name = (f"fused_{model}_d{d}_E{experts}_K{k_experts}_{dtype}_{layout}_{access}_b{block}_cap{topk_cap}_{values}"
            f"_i{items}_e{every}{'_filter' if seed_filter else ''}_{weights}_{guard}{mma_tag}")
    code = compile(src, f"<{name}>", "exec")
    exec(code, env)
    fn = env["kernel"]
    fn.__name__ = fn.__qualname__ = name
    fn.__source__ = src
    if max_registers and not config.ENABLE_CUDASIM:  # the simulator has no register cap
        return cuda.jit(fn, max_registers=max_registers)
    return cuda.jit(fn)


@functools.lru_cache(maxsize=None)
def sample_prep_kernel(has_cand: bool, has_elig: bool):
    """Launch ``[grid, block]`` (grid-stride over the ``m`` sample positions): with ``has_cand``,
    ``slots[i] = cand[pos[i]]`` (the sampled candidates' table slots, for scoring the sample);
    with ``has_elig``, ``sample[i] = -inf`` where position ``pos[i]`` is not in the eligible
    bitset ``elig uint64[words]`` (run after the sample is scored: an ineligible ad never seeds).
    Block 0 also zeroes ``counts int64[1, 2]`` and ``fill int64[1]`` of the filter pass that
    follows (when ``reset``)."""

    @cuda.jit
    def kernel(pos, cand, slots, elig, sample, reset, counts, fill):
        i = cuda.grid(1)
        if reset and i < 2:
            counts[0, i] = 0
            if i == 0:
                fill[0] = 0
        while i < pos.shape[0]:
            p = pos[i]
            if has_cand:
                slots[i] = cand[p]
            if has_elig and test_bit(elig, p) == 0:
                sample[i] = float32(-math.inf)
            i += cuda.gridsize(1)

    return kernel
