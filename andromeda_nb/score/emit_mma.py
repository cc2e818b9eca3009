"""Emitters of the tensor-core part of the generated scoring kernel (:mod:`.fused`, ``mma=True``).

A warp scores 32 ads at once: two tiles of 16 rows, each ``mma.sync`` m16n8k8 TF32 step taking 8
embedding dimensions of 16 ads against 8 experts, three products per step (3xTF32: each operand
split in a TF32 high and a low part, ``hi*hi + hi*lo + lo*hi``), for the gate logits and the
value dots of all experts. The per-lane weight image is :func:`.weights.mma_image`; results meet
in shared memory (``msc[warp, ad, 0:8]`` logits, ``8:16`` values), read back by the ad's own lane.
"""

from __future__ import annotations

from numba.cuda.core import config

from ..device.memory_ops import ROW_BYTES

#: a warp barrier (the simulator has no syncwarp; its block barrier stands in, every thread of the
#: block reaches it together)
SYNC_WARP = "cuda.syncthreads()" if config.ENABLE_CUDASIM else "cuda.syncwarp()"


def emit_mma_load(emit, ind: str, t: int, base: str, d: int, layout: str, access: str, compact: bool,
                   n: str = "n_items", row: str = "", int8: bool = False, into: str = "",
                   pairs: bool = False, whole: bool = False, math: str = "fp16") -> None:
    """Emit the loads of tile t (rows 16 t + g and 16 t + g + 8 of a warp's 32 ads, counted from
    ``base``): each lane's d/16 groups of 4 dims of both rows (:func:`.weights.f16_row_groups`: the
    run of d/4 dims from ``(d/4) c``) into ``m{q}_{wi}`` (zero for a row past the end or not
    eligible). ``n``: the name of the item count; ``row``: the candidate list's row prefix
    (``"b, "`` in batched kernels). fp16 rows: a group is an 8-byte word, ``cw + wi`` (with
    ``math="fp32"``, the TF32 steps' :func:`.weights.mma_image`, ``c4 + 4 wi``). ``int8``
    (fp16 math): a group is 4 bytes, half a word: the lane loads its d/32 whole words ``cw + i``
    (one load, two groups), or where d/16 is odd each group's half-word alone (``ld_half``); and
    the row scale into ``sc{q}`` (``pairs``: the table's scale pair word, uint32).
    ``into``: a suffix of those names (``"b"``: the round after next's registers, :func:`emit_mma`'s
    ``rows_ahead=2``). ``whole`` (the full pool, every row of the round exists): the loads
    without a bounds check or zero fill."""
    for q in (2 * t, 2 * t + 1):  # q = 2 t + half: row 16 t + 8 half + g of the warp's 32
        half = q % 2
        if whole:
            emit(f"{ind}ur{q} = uint64({base} + wbase + {16 * t + 8 * half} + g8)")
            if steps_tiles(layout, d, int8):
                _emit_tile_words(emit, ind, q, d, int8, into, base)
            else:
                _emit_row_words(emit, ind, q, d, layout, int8, into, math)
            continue
        emit(f"{ind}ir{q} = {base} + wbase + {16 * t + 8 * half} + g8")
        if compact:
            emit(f"{ind}okr{q} = ir{q} < n_list")
            emit(f"{ind}sr{q} = tile0 + int64(lst[ir{q}]) if okr{q} else int64(0)")
        else:
            emit(f"{ind}okr{q} = ir{q} < {n}")
            emit(f"{ind}sr{q} = ir{q}")
            if access == "candidates":
                emit(f"{ind}if okr{q}:")
                emit(f"{ind}    sr{q} = int64(cand[{row}ir{q}])")
            elif access == "bitset":
                emit(f"{ind}if okr{q}:")
                emit(f"{ind}    okr{q} = test_bit(elig, ir{q}) != 0")
        emit(f"{ind}ur{q} = uint64(sr{q})")
        for wi in range(row_registers(d, int8)):
            emit(f"{ind}m{q}_{wi}{into} = {'uint32' if int8 and d % 32 else 'uint64'}(0)")
        if int8:
            emit(f"{ind}sc{q}{into} = {'uint32(0)' if pairs else 'zero'}")
        emit(f"{ind}if okr{q}:")
        _emit_row_words(emit, ind + "    ", q, d, layout, int8, into, math)


def _emit_row_words(emit, ind: str, q: int, d: int, layout: str, int8: bool, into: str, math: str) -> None:
    """Row ``ur{q}``'s words of this lane into ``m{q}_*`` (and its scale into ``sc{q}``)."""
    def at(col):
        return f"ur{q}, {col}" if layout == "rows" else f"{col}, ur{q}"

    for i in range(row_registers(d, int8)):
        if int8 and d % 32:
            emit(f"{ind}m{q}_{i}{into} = ld_half(words, {at(f'gw{i}')}, gh{i})")
        else:
            emit(f"{ind}m{q}_{i}{into} = words[{at(f'cw + {i}' if math == 'fp16' else f'c4 + {4 * i}')}]")
    if int8:
        emit(f"{ind}sc{q}{into} = scale[ur{q}]")


def row_registers(d: int, int8: bool) -> int:
    """The registers ``m{q}_*`` of a lane's share of a row (:func:`emit_mma_load`): d/16 8-byte
    fp16 words; d/32 8-byte int8 words (two steps' bytes each, split where used, so a loaded pair
    stays the pair the loop carries: split at the load, ptxas moved every half at the loop's end),
    or where d/16 is odd (a lane's run of d/4 bytes then starts mid-word) d/16 4-byte halves."""
    return d // 16 if not int8 or d % 32 else d // 32


def emit_lane_words(emit, ind: str, d: int, int8: bool) -> None:
    """Emit, once a kernel, where this lane's dims of a row start (:func:`emit_mma_load`): ``cw``
    its first 8-byte word, or for int8 rows whose d/16 is odd the word ``gw{j}`` and half ``gh{j}``
    of each of its 4-byte groups."""
    if int8 and d % 32:
        for j in range(d // 16):
            emit(f"{ind}gw{j} = (c4 * {d // 16} + {j}) >> 1")
            emit(f"{ind}gh{j} = (c4 * {d // 16} + {j}) & 1")
    else:
        emit(f"{ind}cw = c4 * {d // 32 if int8 else d // 16}")


def steps_tiles(layout: str, d: int, int8: bool) -> bool:
    """Whether the whole rounds load this table's rows at stepped offsets (:func:`emit_tile_offsets`):
    on ``tiles``, in whole 8-byte words (int8 rows whose d/16 is odd load half-words by index)."""
    return layout == "tiles" and not (int8 and d % 32)


def emit_tile_offsets(emit, ind: str, d: int, int8: bool) -> None:
    """Emit, once a kernel (after :func:`emit_lane_words`), this lane's byte offset in a ``tiles``
    table (``words [d/8, n]``) of its first word of the warp's first row, ``wlo`` (word row ``cw``,
    column ``wbase + g8``), and ``wcs``, the bytes of a word row:
    :func:`_emit_tile_words`' steps (where :func:`steps_tiles`)."""
    emit(f"{ind}wlo = uint64(cw * words.shape[1] + wbase + g8) * 8")
    emit(f"{ind}wcs = uint64(words.shape[1]) * 8")


def _emit_tile_words(emit, ind: str, q: int, d: int, int8: bool, into: str, base: str) -> None:
    """Row ``ur{q}``'s words of this lane (a whole round on ``tiles``, :func:`emit_tile_offsets`)
    at byte offsets from the round's ``ra``: its rows 8 ads (64 bytes) apart, its word rows ``wcs``
    apart, a 64-bit add a load where :func:`_emit_row_words`' element index recomputes
    ``(column n + row) 8`` from the index (six integer instructions a word row)."""
    if q % 2 == 0:
        emit(f"{ind}ra = wlo + uint64({base}) * 8")

    def at(i):
        return f"ra{'' if i == 0 else f' + {i} * wcs'} + {64 * q}"

    for i in range(row_registers(d, int8)):
        emit(f"{ind}m{q}_{i}{into} = ld_u64(words, {at(i)})")
    if int8:
        emit(f"{ind}sc{q}{into} = scale[ur{q}]")


def ring_groups(d: int) -> tuple[int, list]:
    """``(per, swizzles)`` of a ring slot's word rows: the d/8 rows go in groups of ``per``, group
    g storing ad a in column ``a ^ swizzles[g]``, so that the reads of :func:`_emit_ring_read` fall
    on different banks. d a multiple of 32: the d/32 words of each lane c (:func:`emit_lane_words`)
    a group, ``a ^ 4 c``: a half-warp's 16 lanes (4 ads, c = 0..3) read 16 different columns of 8
    bytes, where unswizzled the 4 groups met on each bank. Otherwise two halves, ``a ^ 8`` in the
    second (read by lanes c = 2, 3 alone): the 32 lanes' 4-byte reads meet two to a bank pair
    only where they read the same word."""
    if d % 32:
        return d // 16, [0, 8]
    return d // 32, [0, 4, 8, 12]


def emit_ring_issue(emit, ind: str, first: str, slot: str, d: int, layout: str, ring: int,
                    n: str = "n_items", whole: bool = False) -> None:
    """Emit this lane's asynchronous copies of one round's int8 rows into the warp's slot ``slot``
    of the shared ring (``ring`` slots; :func:`emit_mma`'s ``ring``): the round's 32 ads start at
    ``first`` + wbase, lane l copies ad l's d/8 words (one 8-byte copy a word: on ``tiles`` a
    table of odd length puts a word row's start off 16 bytes) and its scale; an ad past the end
    gets zeros (nothing read); ``whole`` (every ad of that round exists): no such test. The word
    rows' columns are swizzled by :func:`ring_groups`."""
    nw = d // 8
    per, swizzles = ring_groups(d)
    emit(f"{ind}ra = {first} + wbase + lane")
    if whole:
        emit(f"{ind}rj = ra")
        emit(f"{ind}rb = 8")
    else:
        emit(f"{ind}rok = ra < {n}")
        emit(f"{ind}rj = ra if rok else 0")
        emit(f"{ind}rb = 8 if rok else 0")
    # the slot's word-row groups at rb0.. (emit_ring_bases), its scale at rss, each plus the slot's bytes
    emit(f"{ind}rsl = uint32({slot}) * {nw * ROW_BYTES}")
    bases = [f"rb{c} + rsl" for c in range(len(swizzles))] + ["rb0"] * (4 - len(swizzles))
    emit(f"{ind}cp_async_row(ring, {', '.join(bases)}, words, rj, rb, {nw}, {per}, {int(layout == 'tiles')}, "
         f"rsc, rss + uint32({slot}) * 128, scale)")


def emit_ring_bases(emit, ind: str, d: int, ring: int) -> None:
    """Emit, once a kernel, the shared addresses of this lane's ring words in its warp's first
    slot: ``rb{c}`` (group c's first row, column ``lane ^ swizzle``, :func:`ring_groups`) and
    ``rss`` of its scale; :func:`~andromeda_nb.device.memory_ops.cp_async_row` offsets them by
    constants."""
    per, swizzles = ring_groups(d)
    for c, sw in enumerate(swizzles):
        emit(f"{ind}rb{c} = shared_offset(ring, wid * {ring * (d // 8)} + {c * per}, lane ^ {sw})")
    emit(f"{ind}rss = shared_offset(rsc, wid * {ring}, lane)")  # its scale (rows of 32 4-byte scales)


def emit_ring_lanes(emit, ind: str, d: int) -> None:
    """Emit, once a kernel, the columns :func:`_emit_ring_read` reads of tile row k of the ring
    (:func:`ring_groups`' swizzle): d a multiple of 32, ``(k + g8) ^ 4 c4`` is ``rca`` (k % 16 = 0)
    or ``rcb``, plus ``k & 16``; else ``(k + g8) ^ 8 c4h`` is ``rca + k`` or ``rcb + k``."""
    if d % 32:
        emit(f"{ind}c4h = c4 // 2")
        emit(f"{ind}rca = g8 + c4h * 8")
        emit(f"{ind}rcb = g8 - c4h * 8")
    else:
        emit(f"{ind}rca = g8 ^ (4 * c4)")
        emit(f"{ind}rcb = rca ^ 8")


def _emit_ring_read(emit, ind: str, t: int, d: int, ring: int) -> None:
    """Tile t's words and scales of this round from the ring's slot ``rs`` into the registers
    :func:`emit_mma_load` fills (``m{q}_*``, ``sc{q}``): each lane its d/32 words (8-byte reads),
    or its d/16 halves, in the columns :func:`emit_ring_lanes` names."""
    nw = d // 8
    for q in (2 * t, 2 * t + 1):
        k = 16 * t + 8 * (q % 2)
        if d % 32:  # (k + g8) ^ 8 c4h = k + g8 +- 8 c4h: a base register and an offset
            col = f"{k} + {'rcb' if k % 16 else 'rca'}"
            for j in range(d // 16):
                emit(f"{ind}m{q}_{j} = ld_half(ring, wid * {ring * nw} + rs * {nw} + gw{j}, {col}, gh{j})")
        else:  # (k + g8) ^ 4 c4 = (g8 ^ 4 c4 ^ (k & 8)) + (k & 16)
            col = f"{'rcb' if k % 16 else 'rca'} + {k & 16}"
            for i in range(d // 32):
                # unsigned indices: a signed one costs a negative-index wraparound (a shift, a mask, an add)
                emit(f"{ind}m{q}_{i} = ring[uint64(wid * {ring * nw} + rs * {nw} + cw + {i}), uint64({col})]")
        emit(f"{ind}sc{q} = rsc[uint64(wid * {ring} + rs), uint64({k} + g8)]")


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


#: a lane's fp16 weight words of one step, in :func:`.weights.mma_f16_image`'s order
F16_WEIGHT_WORDS = ("wg{j}_0", "wg{j}_1", "wv{j}_0", "wv{j}_1", "gm{j}_0", "gm{j}_1", "bt{j}_0", "bt{j}_1")


def emit_f16_weights(emit, ind: str, d: int, row: str = "", block: int = 0, shared: bool = False) -> None:
    """Emit the loads of this lane's fp16 weights (:func:`.weights.mma_f16_image`) into registers,
    once per kernel: per step j, ``wg{j}_0/1`` (gate keys), ``wv{j}_0/1`` (values), ``gm{j}_0/1``
    (gamma), ``bt{j}_0/1`` (beta), each a word of two fp16. ``row``: the batched kernels' request
    row prefix (``"b, "``). ``shared``: instead, the block copies the whole image into shared
    memory (``wsh16``; the block barrier after it is the kernel's first) and each step reads its
    words there (:func:`_emit_f16_step_weights`). The copy transposes each step's ``[32 lanes, 8
    words]`` into ``[8 words, 32 lanes]``: a warp's read of word k then touches 32 consecutive
    words, one a bank, where the image's own order (a lane's 8 words together) put 8 lanes on each
    bank."""
    if shared:
        words = (d // 16) * 32 * 8
        emit(f"{ind}wsh16 = cuda.shared.array({words}, uint32)")
        emit(f"{ind}for t in range(tid, {words}, {block}):")  # t = 256 j + 8 lane + k
        emit(f"{ind}    wsh16[(t & ~255) | ((t & 7) << 5) | ((t >> 3) & 31)] = wimg[{row}t]")
        return
    for j in range(d // 16):
        for k, name in enumerate(F16_WEIGHT_WORDS):
            emit(f"{ind}{name.format(j=j)} = wimg[{row}{(j * 32) * 8 + k} + lane * 8]")


def _emit_f16_step_weights(emit, ind: str, j: int) -> None:
    """Step j's 8 weight words of this lane from the shared image (``f16_weights="shared"``), in
    :func:`emit_f16_weights`' transposed order, addressed from ``wz`` (the lane plus a zero
    unknown to ptxas: the loads stay in the loop, not hoisted into 32 live registers). Unsigned:
    a signed index makes Numba wrap negative values, four integer instructions a load (+166 in
    the int8 loop against +9)."""
    for k, name in enumerate(F16_WEIGHT_WORDS):
        emit(f"{ind}{name.format(j=j)} = wsh16[wz + uint64({j * 256 + k * 32})]")


def _emit_mma_f16_start(emit, ind: str, t: int, int8: bool, dequant: str, pairs: bool = False) -> None:
    """Tile t's zero accumulators (and its int8 rows' scales as half2: made from the float32 scale,
    or with ``pairs`` the halves of the table's scale pair word, the same bits)."""
    for r in range(4):
        emit(f"{ind}cg{t}_{r} = zero")
        emit(f"{ind}cv{t}_{r} = zero")
    if int8:
        for q in (2 * t, 2 * t + 1):
            emit(f"{ind}s2{q} = pair_low(sc{q})" if pairs else f"{ind}s2{q} = half2_of(sc{q})")
            if dequant == "fma":
                emit(f"{ind}c2{q} = pair_high(sc{q})" if pairs else f"{ind}c2{q} = dequant_offset_h2(s2{q})")


def _emit_mma_f16_step(emit, ind: str, t: int, j: int, int8: bool, dequant: str, d: int) -> None:
    """Step j of tile t (after :func:`_emit_mma_f16_start`): its fp16 encoding and mma (m16n8k16,
    fp32 accumulation): each row word's two fp16 pairs through FiLM + ReLU in one half2 FMA and max
    each (``film_h2``, one rounding to fp16), straight into the A fragment: a0 / a2 = the low / high
    pair of row g's word, a1 / a3 those of row g + 8 (:func:`.weights.mma_f16_image` assigns dims to
    k-slots to match). ``int8``: the lane's 4 bytes of the step (dims 4w..4w+3, as in an fp16 row:
    half ``j % 2`` of its word ``j // 2``) first become the fp16 pairs ``q * s`` (``dequant_i8x4``;
    s the row scale rounded to fp16), so the weights and the rest are the fp16 rows' own;
    ``dequant="fma"``: the same values in one fused multiply-add a pair (``dequant_i8x4_fma``, the
    offset ``-1152 s`` made once a row), for tables whose scales allow it."""
    rows = (2 * t, 2 * t + 1)
    for q in rows:
        if int8:
            x = f"m{q}_{j}" if d % 32 else (f"uint32(m{q}_{j // 2} >> uint64(32))" if j % 2 else
                                            f"uint32(m{q}_{j // 2} & uint64(0xFFFFFFFF))")
            emit(f"{ind}lo{q}, hi{q} = dequant_i8x4_fma({x}, s2{q}, c2{q})" if dequant == "fma" else
                 f"{ind}lo{q}, hi{q} = dequant_i8x4({x}, s2{q})")
            emit(f"{ind}ha{q} = film_h2(lo{q}, gm{j}_0, bt{j}_0)")
            emit(f"{ind}hb{q} = film_h2(hi{q}, gm{j}_1, bt{j}_1)")
            continue
        emit(f"{ind}ha{q} = film_h2(uint32(m{q}_{j} & uint64(0xFFFFFFFF)), gm{j}_0, bt{j}_0)")
        emit(f"{ind}hb{q} = film_h2(uint32(m{q}_{j} >> uint64(32)), gm{j}_1, bt{j}_1)")
    frag = [f"ha{rows[0]}", f"ha{rows[1]}", f"hb{rows[0]}", f"hb{rows[1]}"]
    _emit_mma_f16_call(emit, ind, f"cg{t}", frag, f"wg{j}_0", f"wg{j}_1")
    _emit_mma_f16_call(emit, ind, f"cv{t}", frag, f"wv{j}_0", f"wv{j}_1")


def _emit_mma_f16_call(emit, ind, acc, a, b0, b1):
    cs = [f"{acc}_{r}" for r in range(4)]
    if config.ENABLE_CUDASIM:  # the warp's fragments meet in shared memory (mma_f16_warp)
        for r, v in enumerate(a + [b0, b1]):
            emit(f"{ind}scu[wid, lane, {r}] = {v}")
        for r, v in enumerate(cs):
            emit(f"{ind}scr[wid, lane, {r}] = {v}")
        emit(f"{ind}cuda.syncthreads()")
        emit(f"{ind}{', '.join(cs)} = mma_f16_warp(scu[wid], scr[wid], lane)")
        emit(f"{ind}cuda.syncthreads()")
    else:
        emit(f"{ind}{', '.join(cs)} = mma_f16({', '.join(a + [b0, b1] + cs)})")


def _emit_mma_store(emit, ind: str) -> None:
    """Emit the hand-over of both tiles' results to the warp's tile of shared memory (``msc`` from
    ``mw``, ``MSC_PITCH`` floats an ad: logits at 0:8, values at 8:16) between two warp barriers.
    C fragment: c0, c1 = (row g, experts 2c, 2c + 1), c2, c3 = (row g + 8, ...): each pair one
    8-byte store."""
    from .fused import MSC_PITCH

    emit(f"{ind}{SYNC_WARP}")  # the previous round's readers are done with msc
    emit(f"{ind}mr = mw + g8 * {MSC_PITCH} + 2 * c4")
    for t in range(2):
        for half in range(2):
            row = (16 * t + 8 * half) * MSC_PITCH
            for which, off in (("cg", 0), ("cv", 8)):
                emit(f"{ind}sts2(msc, mr + {row + off}, {which}{t}_{2 * half}, {which}{t}_{2 * half + 1})")
    emit(f"{ind}{SYNC_WARP}")


def emit_mma(emit, d: int, dtype: str, layout: str, access: str, compact: bool, terms: int = 3,
              prefetch: bool = False, n: str = "n_items", row: str = "", math: str = "fp32",
              dequant: str = "mul", interleave: bool = False, shared_weights: bool = False,
              rows_ahead: int = 1, ring: int = 0, pairs: bool = False, whole: bool = False) -> None:
    """Emit the warp-collective tensor-core part of one round (outside any per-ad branch: mma.sync
    needs all 32 lanes). With ``prefetch`` the round's words were loaded by the previous round (or
    before the loop), and each tile's words for the next round (``base + stride``) are loaded as
    soon as that tile is encoded, so loads stay in flight while the warp computes. ``math``:
    ``"fp32"`` (3xTF32 products) or ``"fp16"`` (h and the weights in fp16, fp32 accumulation);
    ``dequant``: :func:`_emit_mma_f16_step`'s (int8 rows in fp16 math); ``interleave`` (fp16 math):
    the two tiles' steps alternate, and the next round's loads follow both; ``shared_weights``
    (fp16 math): each step's weight words are read from shared memory, once for both tiles (the
    steps alternate). ``rows_ahead=2`` (with ``prefetch``): two rounds of rows in flight, not one:
    the round after next's words sit in a second set of registers (``m*b``, loaded before the
    loop), each tile loads the round two on (``base + 2 stride``) into its own once encoded, and
    the sets trade names at the round's end (register moves ptxas removes), so a warp keeps about
    twice the row bytes in flight for the registers of one more round. ``ring`` (int8 rows in fp16
    math on the full pool; replaces ``prefetch``'s registers): the rows travel through a
    shared-memory ring of that many rounds a warp, filled by asynchronous copies (``cp.async``):
    each round first asks for the round ``ring - 1`` on (its own copy group), waits until this
    round's group has landed (at most ``ring - 1`` pending) and, after a warp barrier (the copies
    are visible to the lane that issued them), reads its words from the ring, so ``ring - 1``
    rounds of rows are in flight without a register held for them. A slot is refilled one round
    after it was read, past :func:`_emit_mma_store`'s warp barriers. ``pairs`` (int8 rows in fp16
    math): the ``scale`` argument holds the table's scale pair words (:func:`_emit_mma_f16_start`).
    ``whole``: the rounds whose rows this round asks for are whole (the full pool: the next one,
    or with ``ring`` the round ``ring - 1`` on): their loads or copies go unchecked
    (:func:`emit_mma_load`, :func:`emit_ring_issue`)."""
    ind = "        "
    int8 = dtype == "int8"
    shared_weights = shared_weights and math == "fp16"
    interleave = interleave or shared_weights
    if shared_weights:
        emit(f"{ind}wz = uint64(j >> 62) + uint64(lane)")
    if ring:
        emit_ring_issue(emit, ind, f"base + {ring - 1} * stride", "ws", d, layout, ring, n,
                        whole)
        emit(f"{ind}cp_async_commit()")
        emit(f"{ind}cp_async_wait({ring - 1})")
        emit(f"{ind}{SYNC_WARP}")
        for t in range(2):
            _emit_ring_read(emit, ind, t, d, ring)
        prefetch = False
    elif not prefetch:
        for t in range(2):
            emit_mma_load(emit, ind, t, "base", d, layout, access, compact, n, row, int8, pairs=pairs, math=math)
    # interleaved: both tiles step by step, four independent accumulator chains in one basic block,
    # where tile by tile the loads of tile 0 (a branch) sat between the tiles' chains
    groups = [(0, 1)] if interleave and math == "fp16" else [(0,), (1,)]
    for tiles in groups:
        for t in tiles:
            if math == "fp16":
                _emit_mma_f16_start(emit, ind, t, int8, dequant, pairs)
            else:
                _emit_mma_tile(emit, ind, t, d, terms)
        for j in range(d // 16 if math == "fp16" else 0):
            if shared_weights:
                _emit_f16_step_weights(emit, ind, j)
            for t in tiles:
                _emit_mma_f16_step(emit, ind, t, j, int8, dequant, d)
        if prefetch:
            for t in tiles:
                emit_mma_load(emit, ind, t, "base + stride" if rows_ahead == 1 else "base + 2 * stride", d, layout,
                              access, compact, n, row, int8, pairs=pairs, whole=whole, math=math)
    if ring:
        emit(f"{ind}ws = rs")  # the slot read now is the next one refilled
        emit(f"{ind}rs = rs + 1 if rs < {ring - 1} else 0")
    if prefetch and rows_ahead == 2:  # the next round's rows become this set's, the loaded ones wait
        for q in range(4):
            names = [f"m{q}_{wi}" for wi in range(row_registers(d, int8))] + ([f"sc{q}"] if int8 else [])
            emit(f"{ind}{', '.join(names)}, {', '.join(x + 'b' for x in names)} = "
                 f"{', '.join(x + 'b' for x in names)}, {', '.join(names)}")
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

