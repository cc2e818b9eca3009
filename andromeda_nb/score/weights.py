"""The request's weights as the scoring kernels read them (host side, numpy only).

CUDA-core kernels read one 16-byte-aligned float32 image (:func:`weight_image`)::

    gated: [gamma (d) | beta (d) | G / sqrt(d) (E*d, row-major) | V (E rows of pitch d + PAD)]
    dot:   [u (d)]

V rows are padded to ``d + PAD`` floats so that 8 threads holding 8 different chosen experts read
8 disjoint bank groups in one 16-byte load. The tensor-core kernels read a per-lane image instead
(:func:`mma_image`): each lane's operands of every mma step, consecutive 16-byte pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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




#: largest finite fp16 value: weights and encoded ads of the fp16 math mode must stay within it
FP16_MAX = 65504.0


#: fp16 rounding to nearest: ``|round16(x)| <= |x| (1 + F16_U) + F16_TINY`` (relative for normal values,
#: half the smallest subnormal's step below them)
F16_U, F16_TINY = 2.0 ** -11, 2.0 ** -25

#: the smallest largest-|a| of an int8 table that ``math="auto"`` scores in fp16 math: its largest
#: row scale (``max_abs / 127``) a normal fp16 value, so a row's rounding errors below fp16's
#: subnormal step are at most fp16's relative rounding of the table's largest values
F16_INT8_MIN_MAX_ABS = 127 * 2.0 ** -14


def fp16_encoded_bound(max_abs: float, int8: bool) -> tuple[float, float, float]:
    """``(cg, cb, c0)`` with ``|h| <= cg max|gamma| + cb max|beta| + c0`` for h as fp16 math forms it,
    ``fma(round16(gamma), a16, round16(beta))`` before its own rounding: gamma and beta rounded to
    fp16, and ``a16`` an fp16 row's values exactly or an int8 row's ``round16(q round16(scale))``, two
    roundings above ``max|q| max(scale)`` (``max_abs``)."""
    a16 = max_abs * (1 + F16_U) ** 2 + 2 * F16_TINY if int8 else max_abs
    return (1 + F16_U) * a16, 1 + F16_U, F16_TINY * (a16 + 1)


#: fp16's smallest normal value: below it fp16 keeps fewer significant bits (none under 2^-25)
FP16_MIN_NORMAL = 2.0 ** -14


def fp16_weights_precise(gmax: float, kmax: float, vmax: float, h: float) -> bool:
    """Whether ``math="auto"`` may take fp16 math for a request whose largest |gamma|, |G / sqrt(d)|
    and |V| are ``gmax, kmax, vmax`` and whose encoded ads are bounded by ``h = max|gamma| max|a| +
    max|beta|``: none of them nonzero below :data:`FP16_MIN_NORMAL`. Below it fp16 loses the values
    to its subnormals (V scaled by 1e-8: every fp16 score 0, the ranking gone); a weight small
    beside its array's largest is lost only as much as the score's scale allows. Explicit
    ``math="fp16"`` computes its model on such a request all the same, as on an int8 table's
    small rows (:func:`fp16_rows_precise`)."""
    return not any(0 < x < FP16_MIN_NORMAL for x in (gmax, kmax, vmax, h))


def fp16_request_precise(request, max_abs: float) -> bool:
    """:func:`fp16_weights_precise` of a :class:`~andromeda_nb.model.Request` on a table of largest
    |a| ``max_abs`` (its weights as the fp16 image takes them: G / sqrt(d) in float64, then float32,
    whose largest |x| is that of G so divided and rounded, the rounding being monotone)."""
    d = request.d
    gmax = float(np.abs(request.gamma).max(initial=0))
    kmax = float(np.float32(float(np.abs(request.G).max(initial=0)) / np.sqrt(d)))
    h = gmax * float(max_abs) + float(np.abs(request.beta).max(initial=0))
    return fp16_weights_precise(gmax, kmax, float(np.abs(request.V).max(initial=0)), h)


def fp16_rows_precise(table, max_abs: float) -> bool:
    """Whether ``math="auto"`` may widen this table's rows to fp16 without losing them to fp16's
    subnormals: not an int8 table, or one whose largest value is 0 (every row zero) or at least
    :data:`F16_INT8_MIN_MAX_ABS` (``max_abs``: its :meth:`~.table.DeviceAdTable.max_abs` or an upper
    bound of it). Explicit ``math="fp16"`` computes its model on such a table all the same."""
    return table.dtype != "int8" or max_abs == 0 or max_abs >= F16_INT8_MIN_MAX_ABS


def fp16_rows_fit(table, max_abs: float | None = None) -> bool:
    """Whether the fp16 math mode can hold a device table's rows: an int8 row dequantized to fp16
    (``q`` times its scale, :func:`~andromeda_nb.device.intrinsics.dequant_i8x4_host`) stays finite
    when ``max|q| max(scale)`` (:meth:`~.table.DeviceAdTable.max_abs`) does, with room for the
    scale's rounding to fp16 (up to 2^-11 relative) below 65520, where fp16 rounding reaches inf;
    an fp16 row holds its values already. ``max_abs``: the table's (default :meth:`max_abs`)."""
    a = table.max_abs() if max_abs is None else max_abs
    return table.dtype != "int8" or a * (1 + 2.0 ** -11) < 65520.0


def fma_dequant_exact(scale) -> bool:
    """Whether fp16 math may dequantize these int8 row scales (float32) in one fused multiply-add a
    pair (:func:`~andromeda_nb.device.intrinsics.dequant_i8x4_fma_host`, the values of
    :func:`~andromeda_nb.device.intrinsics.dequant_i8x4_host`, a zero's sign aside, so the same
    scores: the mma sums from +0): ``-1152 s`` exact in fp16 for each
    scale ``s`` as the kernel rounds it, true for scales of at most 7 significant bits up to 56
    (:func:`~andromeda_nb.model.round_scale_up`, which :func:`~andromeda_nb.model.quantize_int8_rows`
    applies)."""
    from ..device.intrinsics import dequant_offset_h2_host, half2_of_host

    scale = np.asarray(scale, np.float32).ravel()
    if not scale.size:
        return True
    s2 = half2_of_host(scale)
    s = np.ascontiguousarray(s2).view(np.float16)[::2].astype(np.float64)
    c = np.ascontiguousarray(dequant_offset_h2_host(s2)).view(np.float16)[::2].astype(np.float64)
    return bool(np.all(c == -1152.0 * s))


def f16_weights(request) -> dict:
    """The request's weights as the fp16 math mode reads them (float16 arrays): ``gamma``, ``beta``,
    ``G`` (= G / sqrt(d), rounded to fp32 as the fp32 image holds it, then to fp16) and ``V``. The
    fp16 reference (:func:`andromeda_nb.reference.score` with ``math="fp16"``) uses the same values.

    Raises:
        ValueError: a weight beyond the fp16 range (it would become inf).
    """
    d = request.d
    parts = {"gamma": request.gamma, "beta": request.beta,
             "G": (request.G.astype(np.float64) / np.sqrt(d)).astype(np.float32), "V": request.V}
    out = {}
    for name, x in parts.items():
        x = np.asarray(x, np.float32)
        if np.abs(x).max(initial=0) > FP16_MAX:
            raise ValueError(f"math='fp16': the request's {name} holds values beyond the fp16 range (|x| > "
                             f"{FP16_MAX:g}); rescale the request or use math='fp32'")
        out[name] = x.astype(np.float16)
    return out


def mma_f16_image(request) -> np.ndarray:
    """The uint32 per-lane weight image of the fp16 tensor-core kernel, ``[d/16, 32, 8]``: for step
    j and lane ``l = 4 g + c``, with ``w = (d/16) c + j`` the group of 4 dims (4w..4w+3) the lane
    reads of a row in that step (:func:`f16_row_groups`)::

        G'[g, 4w:4w+2], G'[g, 4w+2:4w+4], V[g, 4w:4w+2], V[g, 4w+2:4w+4],
        gamma[4w:4w+2], gamma[4w+2:4w+4], beta[4w:4w+2], beta[4w+2:4w+4]

    each a word of two fp16 (the lower dim in the low half). Why this order: mma.m16n8k16's A
    fragment gives lane c the k-columns 2c, 2c+1 and 2c+8, 2c+9, so a lane's 4 dims of a step (an
    8-byte fp16 row word, 4 bytes of an int8 row) fill its k-slots; the dot products are sums over
    dims, so any fixed assignment of dims to k-slots shared by h and the weights is exact. Experts
    g >= E are zero. Each lane keeps its 8 d/16 words in registers for the whole kernel."""
    E, d = request.V.shape
    mma_f16_words(d, E)  # the shape check
    w16 = f16_weights(request)
    G = np.zeros((8, d), np.float16)
    V = np.zeros((8, d), np.float16)
    G[:E], V[:E] = w16["G"], w16["V"]
    g, dims = f16_row_groups(d)
    experts = np.broadcast_to(g[..., None], dims.shape)
    img = np.stack([G[experts, dims], V[experts, dims], w16["gamma"][dims], w16["beta"][dims]], axis=2)
    return np.ascontiguousarray(img).view(np.uint32).reshape(-1)


# ----------------------------------------------------------------------------- a batch at once
# A Pool's batch builds every image of a group of requests of one shape in one compiled pass
# (:mod:`.weight_kernels`): per request, the functions above cost tens of us of small numpy calls.


def stack_requests(requests) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(gamma [B, d], beta [B, d], G [B, E, d], V [B, E, d])`` float32 of requests of one shape."""
    if len(requests) == 1:  # views (np.stack costs a few us an array)
        r = requests[0]
        return r.gamma[None], r.beta[None], r.G[None], r.V[None]
    return (np.stack([r.gamma for r in requests]), np.stack([r.beta for r in requests]),
            np.stack([r.G for r in requests]), np.stack([r.V for r in requests]))


def mma_f16_words(d: int, experts: int) -> int:
    """uint32 words of :func:`mma_f16_image` for requests of width ``d`` and ``experts`` experts.

    Raises:
        ValueError: a shape the fp16 tensor-core kernel does not take."""
    if d % 16 or experts > 8:
        raise ValueError(f"math='fp16' needs d a multiple of 16 and E <= 8, got d={d}, E={experts}")
    return (d // 16) * 32 * 8


def f16_row_groups(d: int) -> tuple[np.ndarray, np.ndarray]:
    """``(g [d/16, 32], dims [d/16, 32, 4])``: in step j, lane ``l = 4 g + c`` computes expert g's
    products and reads dims ``dims[j, l]`` = 4w..4w+3 of a row, ``w = (d/16) c + j``: a lane's dims
    over the steps are one run of d/4 (its d/16 fp16 words, or d/32 whole 8-byte int8 words: one
    load a word, where ``w = c + 4 j`` took half a word a step)."""
    steps, lanes = np.arange(d // 16)[:, None], np.arange(32)[None, :]
    w = (d // 16) * (lanes % 4) + steps  # [steps, 32]
    return np.broadcast_to(lanes // 4, w.shape), 4 * w[..., None] + np.arange(4)


def _mma_f16_index(d: int) -> np.ndarray:
    """Where each fp16 half of :func:`mma_f16_image` comes from in a request's fp16 source row
    ``[G' (8 d) | V (8 d) | gamma (d) | beta (d)]`` (experts past E zero): ``[d/16 * 32 * 8 * 2]``."""
    g, dims = f16_row_groups(d)
    rows = 8 * d
    parts = [g[..., None] * d + dims, rows + g[..., None] * d + dims, 2 * rows + dims, 2 * rows + d + dims]
    return np.ascontiguousarray(np.stack(parts, axis=2).reshape(-1), dtype=np.int64)


_F16_INDEX: dict = {}


@dataclass
class GatedImages:
    """A group's images (:func:`gated_images`): ``bad32`` / ``over16`` bool ``[B]`` (the request
    would be refused in fp32 math / does not fit fp16 math: :func:`~andromeda_nb.score.launches.check_range`
    with ``"fp32"`` / ``"fp16"`` or :func:`f16_weights` would raise); ``low16`` bool ``[B]`` (fp16
    would lose the request's weights or encoded ads to its subnormals: :func:`fp16_weights_precise`
    fails, which leaves ``math="auto"`` in fp32); ``f16`` uint32 ``[B, words]``,
    :func:`mma_f16_image` of each request that fits fp16 math (rows of the others undefined), or
    None when not asked for."""

    bad32: np.ndarray
    over16: np.ndarray
    low16: np.ndarray
    f16: np.ndarray | None


def gated_images(gamma, beta, G, V, max_abs: float, out: np.ndarray, f16: bool, int8: bool = False) -> GatedImages:
    """Every image of B stacked gated requests (:func:`stack_requests`) on a table of ``max_abs``
    (``int8``: an int8 table's, whose rows fp16 math rounds once more, :func:`fp16_encoded_bound`):
    :func:`weight_image` of each into ``out[:B]`` (float32 ``[>= B, image_size]``, rows past B
    untouched), with ``f16`` their fp16 images, and the range checks of both maths, in one compiled
    pass (:func:`~andromeda_nb.score.weight_kernels.gated_images_kernel`). Equal word for word to
    the per-request functions."""
    from .launches import FP32_SAFE
    from .weight_kernels import gated_images_kernel

    B, E, d = G.shape
    if f16 and d % 16 == 0 and d not in _F16_INDEX:
        _F16_INDEX[d] = _mma_f16_index(d)
    index = _F16_INDEX[d] if f16 and d % 16 == 0 else np.zeros(0, np.int64)
    src16 = np.empty((B if index.size else 0, index.size), np.uint16)
    bad32, over16, low16 = np.empty(B, np.bool_), np.empty(B, np.bool_), np.empty(B, np.bool_)
    gated_images_kernel(gamma, beta, G, V, float(max_abs), *fp16_encoded_bound(float(max_abs), int8), PAD, index, out,
                        src16, bad32, over16, low16, FP32_SAFE, FP16_MAX, FP16_MIN_NORMAL)
    return GatedImages(bad32, over16, low16, src16.view(np.uint32) if index.size else None)
