"""Request and ad-table data classes, and ad-table quantization (host side, numpy only).

The model (docs/design.md, "The model"): per request, expert value vectors ``V[E, d]``, gate
keys ``G[E, d]``, context modulation ``gamma[d]``, ``beta[d]`` and the number of active experts
``k_experts``; per ad, an embedding row ``a[d]`` and a bias ``b``::

    h        = max(gamma * a + beta, 0)
    logit[e] = dot(G[e], h) / sqrt(d)
    p        = softmax(logit)
    S        = top-k_experts experts by logit (ties: lower expert index)
    score    = sum_{e in S} p[e] * dot(V[e], h) + b
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Largest expert count the kernels support (their per-ad state lives in registers).
MAX_EXPERTS = 8
#: Storage dtypes of the ad table, and the numpy dtype each is stored as.
#: bf16 is stored as its raw 16 upper fp32 bits in uint16 (numpy and the simulator have no bf16).
STORAGE_DTYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16, "int8": np.int8}
FP16_MAX = 65504.0


def all_unique(ids: np.ndarray) -> bool:
    """Whether a 1-D integer array holds no value twice: O(n) when it is strictly increasing (the
    common arange-like case), else one sort."""
    if ids.size < 2:
        return True
    return bool((np.diff(ids) > 0).all()) or np.unique(ids).size == ids.size


def _to_f32(name: str, x: np.ndarray) -> np.ndarray:
    """``x`` as contiguous float32; finite values past float32's range (they would become inf)
    raise ValueError, with ``allow_nonfinite`` or not: the caller gave finite numbers."""
    with np.errstate(over="ignore"):  # refused below, with a message
        out = np.ascontiguousarray(x, dtype=np.float32)
    if x.dtype.kind == "f" and x.dtype.itemsize > 4:
        past = np.isinf(out) & np.isfinite(x)
        if past.any():
            raise ValueError(f"{int(past.sum())} {name} values are past float32's range (|x| > 3.4e38)")
    return out


def _as_f32(name: str, x, ndim: int) -> np.ndarray:
    src = np.asarray(x)
    if src.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be numeric, got dtype {src.dtype}")
    if src.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {src.shape}")
    arr = _to_f32(name, src)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} holds non-finite values (NaN or inf)")
    # the caller's own buffer (an array, a view, a tensor's memory; not a list's fresh array): a
    # copy, so that freezing it leaves theirs writable and their later writes cannot reach the request
    if not isinstance(x, (list, tuple)) and np.may_share_memory(arr, src):
        arr = arr.copy()
    return arr


@dataclass(frozen=True, eq=False)
class Request:
    """One request's model tensors (small; computed once per request).

    Attributes:
        V: ``[E, d]`` float32 expert value vectors.
        G: ``[E, d]`` float32 gate keys (the kernel scales logits by ``1/sqrt(d)`` itself).
        gamma: ``[d]`` float32 request-context scale (FiLM).
        beta: ``[d]`` float32 request-context shift (FiLM).
        k_experts: number of experts each ad activates, ``1 <= k_experts <= E``.

    All arrays are copied to C-contiguous float32.

    Raises:
        ValueError: shapes disagree, ``E`` outside ``1..MAX_EXPERTS``, ``k_experts`` outside
            ``1..E``, or a non-finite value.
        TypeError: a non-numeric array or a non-integer ``k_experts``.
    """

    V: np.ndarray
    G: np.ndarray
    gamma: np.ndarray
    beta: np.ndarray
    k_experts: int

    def __post_init__(self):
        V = _as_f32("V", self.V, 2)
        G = _as_f32("G", self.G, 2)
        gamma = _as_f32("gamma", self.gamma, 1)
        beta = _as_f32("beta", self.beta, 1)
        if G.shape != V.shape:
            raise ValueError(f"G shape {G.shape} must equal V shape {V.shape}")
        E, d = V.shape
        if not 1 <= E <= MAX_EXPERTS:
            raise ValueError(f"expert count E={E} must be in 1..{MAX_EXPERTS}")
        if d < 1:
            raise ValueError("d must be positive")
        if gamma.shape != (d,) or beta.shape != (d,):
            raise ValueError(f"gamma {gamma.shape} and beta {beta.shape} must both be ({d},)")
        if isinstance(self.k_experts, bool) or not isinstance(self.k_experts, (int, np.integer)):
            raise TypeError(f"k_experts must be an int, got {type(self.k_experts).__name__}")
        if not 1 <= int(self.k_experts) <= E:
            raise ValueError(f"k_experts={self.k_experts} must be in 1..E={E}")
        for name, arr in (("V", V), ("G", G), ("gamma", gamma), ("beta", beta)):
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "k_experts", int(self.k_experts))

    @property
    def experts(self) -> int:
        """E, the number of user experts."""
        return self.V.shape[0]

    @property
    def d(self) -> int:
        """Embedding dimension."""
        return self.V.shape[1]

    @classmethod
    def random(cls, d: int, experts: int, k_experts: int, rng: np.random.Generator) -> "Request":
        """A random request of unit-scale tensors (for tests and benchmarks)."""
        return cls(
            V=rng.standard_normal((experts, d)).astype(np.float32),
            G=rng.standard_normal((experts, d)).astype(np.float32),
            gamma=rng.uniform(0.5, 1.5, d).astype(np.float32),
            beta=rng.normal(0.0, 0.5, d).astype(np.float32),
            k_experts=k_experts,
        )


#: values from which :func:`to_f16` converts on every core (compiled): below, numpy's conversion
#: (~3 ns a value) costs less than starting the parallel loop, and a small table needs no compiler
F16_PARALLEL_MIN = 1 << 14


def to_f16(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` as float16, rounded to nearest even (numpy's ``astype(np.float16)``, bit for
    bit: overflow to inf, subnormals, NaN): large arrays on every core. Other input is rounded to
    float32 first (float64: twice, as :meth:`AdTable.from_float` stores it)."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(np.shape(x))  # (a 0-d array stays 0-d)
    if x.size < F16_PARALLEL_MIN:
        with np.errstate(over="ignore"):  # past the half range: inf, as the parallel path (callers check)
            return x.astype(np.float16)
    from .score.weight_kernels import to_f16 as convert

    out = np.empty(x.shape, np.float16)
    convert(x.reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint16))
    return out


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bf16 (round to nearest even) and return the 16 bits as uint16.

    NaN stays NaN (quiet). Source: the bf16 format is the upper half of an IEEE-754 binary32.
    """
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(f)
    rounded[nan] = (u[nan] >> 16) | 0x40  # keep it a quiet NaN
    return rounded.astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """Widen bf16 bits (uint16) to float32 exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


#: significant bits of an int8 row scale (:func:`round_scale_up`): with at most 7, -1152 times the
#: scale is exact in fp16, so fp16 math dequantizes a pair in one fused multiply-add
#: (:func:`~andromeda_nb.score.weights.fma_dequant_exact`)
INT8_SCALE_BITS = 7


def round_scale_up(s, xp=np):
    """``s`` (>= 0) rounded up to :data:`INT8_SCALE_BITS` significant bits (0 stays 0), as float32:
    at most 1/64 larger. ``xp``: numpy or cupy."""
    m, e = xp.frexp(xp.asarray(s, dtype=xp.float64))
    top = 2.0 ** INT8_SCALE_BITS
    return xp.ldexp(xp.ceil(m * top) / top, e).astype(xp.float32)


def int8_row_scale(amax, xp=np):
    """The int8 scale of rows whose largest ``|x|`` is ``amax`` (float32): ``amax / 127`` (in
    float64, so a dequantized row whose largest ``|q|`` is 127 gets its scale back) rounded up to
    :data:`INT8_SCALE_BITS` significant bits (:func:`round_scale_up`), so ``|x| / scale <= 127``."""
    return round_scale_up(xp.asarray(amax, dtype=xp.float64) / 127.0, xp)


#: the smallest largest-|x| of a nonzero int8 row: its scale, max|x| / 127, a normal float32
INT8_MIN_ROW_MAX = 127 * 2.0 ** -126


def quantize_int8_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8 quantization: ``x[i] ~= q[i] * scale[i]``.

    ``scale[i] = max|x[i]| / 127`` rounded up to 7 significant bits (:func:`int8_row_scale`) and
    ``q = clip(round(x / scale), -127, 127)``, so -128 is never emitted and the dequantized range
    is symmetric. An all-zero row gets scale 0 and q = 0 (it
    dequantizes to exactly 0). The table never holds a NaN; scoring still computes in fp32 (docs/design.md),
    so rows near the fp32 limit (|x| ~ 1e38) can overflow the encode or the dot products to inf
    and then NaN, as an fp32 table of the same values would, where the float64 oracle stays finite.

    Args:
        x: ``[n, d]`` finite float array.

    Returns:
        ``(q, scale)``: ``[n, d]`` int8 and ``[n]`` float32.

    Raises:
        ValueError: input not [n, d], non-finite, or a nonzero row below :data:`INT8_MIN_ROW_MAX`.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"int8 quantization takes rows [n, d], got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("int8 quantization needs finite values (an int8 table never holds NaN)")
    amax = np.abs(x).max(axis=1) if x.shape[1] else np.zeros(x.shape[0], np.float32)
    tiny = (amax > 0) & (amax < INT8_MIN_ROW_MAX)
    if tiny.any():
        raise ValueError(f"{int(tiny.sum())} rows (first: row {int(np.flatnonzero(tiny)[0])}) are nonzero with a largest "
                         f"|x| below {INT8_MIN_ROW_MAX:.3g}, where an int8 row's float32 scale (max|x| / 127) is "
                         "subnormal and loses the row (down to zeros); rescale the table or store it as fp32")
    scale = int8_row_scale(amax)
    safe = np.where(scale > 0, scale, np.float32(1.0))
    q = np.clip(np.rint(x / safe[:, None]), -127, 127).astype(np.int8)
    return q, scale


@dataclass(frozen=True, eq=False)
class AdTable:
    """The ad pool: embedding rows in a storage dtype, biases and ad ids, by slot.

    Build it with :meth:`from_float`. Slot ``i`` holds ad ``ad_ids[i]``; results always report ad ids.

    Attributes:
        embeddings: ``[n_ads, d]`` storage array: float32 (fp32), float16 (fp16), uint16 bf16 bits
            (bf16) or int8 (int8).
        bias: ``[n_ads]`` float32.
        dtype: one of ``"fp32"``, ``"fp16"``, ``"bf16"``, ``"int8"``.
        scale: ``[n_ads]`` float32 per-row scale for int8, else None.
        ad_ids: ``[n_ads]`` int64, unique, non-negative.
    """

    embeddings: np.ndarray
    bias: np.ndarray
    dtype: str
    scale: np.ndarray | None
    ad_ids: np.ndarray
    _dequant: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.dtype not in STORAGE_DTYPES:
            raise ValueError(f"dtype must be one of {tuple(STORAGE_DTYPES)}, got {self.dtype!r}")
        emb = self.embeddings
        if emb.ndim != 2 or emb.dtype != STORAGE_DTYPES[self.dtype]:
            raise ValueError(
                f"embeddings must be 2-D {np.dtype(STORAGE_DTYPES[self.dtype]).name} for dtype "
                f"{self.dtype!r}, got {emb.ndim}-D {emb.dtype}"
            )
        n = emb.shape[0]
        for name in ("bias", "ad_ids", "scale"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), np.ndarray):
                raise TypeError(f"{name} must be a numpy array (build tables with AdTable.from_float)")
        if self.bias.shape != (n,) or self.ad_ids.shape != (n,):
            raise ValueError(f"bias {self.bias.shape} and ad_ids {self.ad_ids.shape} must be ({n},)")
        if self.bias.dtype != np.float32 or self.ad_ids.dtype != np.int64:
            raise ValueError(f"bias must be float32 and ad_ids int64, got {self.bias.dtype} and {self.ad_ids.dtype}")
        if (self.scale is None) != (self.dtype != "int8"):
            raise ValueError("scale is required for int8 tables and only for them")
        if self.scale is not None:
            if self.scale.shape != (n,) or self.scale.dtype != np.float32:
                raise ValueError(f"scale must be float32 ({n},), got {self.scale.dtype} {self.scale.shape}")
            if n and not (np.all(np.isfinite(self.scale)) and self.scale.min() >= 0):
                raise ValueError("int8 row scales must be finite and non-negative")
            if not np.all(np.isfinite(self.bias)):  # as from_float: an int8 table never holds NaN or inf
                raise ValueError("an int8 table's biases must be finite")
        if n and self.ad_ids.min() < 0:
            raise ValueError("ad_ids must be non-negative")
        if not all_unique(self.ad_ids):
            raise ValueError("ad_ids must be unique (results report ad ids)")

    @classmethod
    def from_float(
        cls,
        embeddings,
        bias=None,
        dtype: str = "fp32",
        ad_ids=None,
        allow_nonfinite: bool = False,
    ) -> "AdTable":
        """Store float embeddings in ``dtype``.

        Args:
            embeddings: ``[n_ads, d]`` float array.
            bias: ``[n_ads]`` float array, or None for zeros.
            dtype: ``"fp32"``, ``"fp16"``, ``"bf16"`` or ``"int8"`` (symmetric per-row scale,
                :func:`quantize_int8_rows`).
            ad_ids: ``[n_ads]`` unique non-negative integers, or None for ``0..n_ads-1``.
            allow_nonfinite: accept NaN / inf in embeddings and bias (fp32, fp16, bf16 only), for
                testing how NaN scores flow through top-K.

        Raises:
            ValueError: wrong shapes, duplicate or negative ad ids, non-finite values (unless
                allowed; never for int8), fp16 overflow (``|x| > 65504`` would become inf), or a
                nonzero row that the dtype would store as zeros (fp16: every |x| below 2^-25; int8:
                :func:`quantize_int8_rows`).
            TypeError: non-numeric input.
        """
        if dtype not in STORAGE_DTYPES:
            raise ValueError(f"dtype must be one of {tuple(STORAGE_DTYPES)}, got {dtype!r}")
        emb = np.asarray(embeddings)
        if emb.dtype.kind not in "fiu":
            raise TypeError(f"embeddings must be numeric, got dtype {emb.dtype}")
        if emb.ndim != 2:
            raise ValueError(f"embeddings must be [n_ads, d], got shape {emb.shape}")
        emb = _to_f32("embeddings", emb)
        n = emb.shape[0]
        b = np.zeros(n, np.float32) if bias is None else np.asarray(bias)
        if b.dtype.kind not in "fiu":
            raise TypeError(f"bias must be numeric, got dtype {b.dtype}")
        if b.shape != (n,):
            raise ValueError(f"bias must have shape ({n},), got {b.shape}")
        b = _to_f32("bias", b)
        finite = bool(np.all(np.isfinite(emb)) and np.all(np.isfinite(b)))
        if not finite and (dtype == "int8" or not allow_nonfinite):
            raise ValueError(
                "embeddings or bias hold NaN/inf; pass allow_nonfinite=True to keep them "
                "(not possible for int8)"
            )
        ids = np.arange(n, dtype=np.int64) if ad_ids is None else np.asarray(ad_ids)
        if ids.shape != (n,) or ids.dtype.kind not in "iu":
            raise ValueError(f"ad_ids must be ({n},) integers, got {ids.shape} {ids.dtype}")
        ids = np.ascontiguousarray(ids, dtype=np.int64)  # non-negative and unique: checked by __post_init__
        scale = None
        if dtype == "fp32":
            store = emb
        elif dtype == "fp16":
            # every value finite (the usual case): one reduction, no copy of the finite ones
            over = (np.abs(emb) if finite else np.abs(emb[np.isfinite(emb)])) > FP16_MAX
            if over.any():
                raise ValueError(
                    f"{int(over.sum())} embedding values exceed the fp16 range (|x| > {FP16_MAX}); "
                    "rescale the table or store it as bf16 or int8"
                )
            store = to_f16(emb)
            zero = ~store.any(axis=1)  # rows stored as zeros (rare): only those are compared with the input
            lost = zero.copy()
            lost[zero] = emb[zero].any(axis=1)
            if lost.any():
                raise ValueError(
                    f"{int(lost.sum())} rows (first: row {int(np.flatnonzero(lost)[0])}) are nonzero but round to "
                    "all zeros in fp16 (every |x| at most 2^-25, half fp16's smallest subnormal); rescale the table "
                    "or store it as fp32 or bf16"
                )
        elif dtype == "bf16":
            store = to_bf16_bits(emb)
            over = np.isinf(from_bf16_bits(store)) & np.isfinite(emb)
            if over.any():
                raise ValueError(
                    f"{int(over.sum())} embedding values round to inf in bf16 (|x| >= 3.3961e38 rounds past "
                    "the largest bf16); rescale the table or store it as int8"
                )
        else:
            store, scale = quantize_int8_rows(emb)
        return cls(embeddings=store, bias=b, dtype=dtype, scale=scale, ad_ids=ids)

    @property
    def n_ads(self) -> int:
        return self.embeddings.shape[0]

    @property
    def d(self) -> int:
        return self.embeddings.shape[1]

    @property
    def bytes_per_ad(self) -> int:
        """Bytes the scoring kernel must read per ad: the row, the bias and (int8) the scale."""
        row = self.d * self.embeddings.dtype.itemsize
        return row + 4 + (4 if self.dtype == "int8" else 0)

    def dequantized(self) -> np.ndarray:
        """``[n_ads, d]`` float64: exactly the values the kernel reads (the oracle's input)."""
        if "f64" not in self._dequant:
            if self.dtype == "bf16":
                out = from_bf16_bits(self.embeddings).astype(np.float64)
            elif self.dtype == "int8":
                # the kernel computes q * scale in fp32: mirror that rounding exactly
                out = (self.embeddings.astype(np.float32) * self.scale[:, None]).astype(np.float64)
            else:
                out = self.embeddings.astype(np.float64)
            out.setflags(write=False)
            self._dequant["f64"] = out
        return self._dequant["f64"]

    def slots_of(self, ad_ids) -> np.ndarray:
        """Slots holding the given ad ids (int64). Raises KeyError for an unknown id."""
        ids = np.asarray(ad_ids, dtype=np.int64)
        order = np.argsort(self.ad_ids, kind="stable")
        pos = np.searchsorted(self.ad_ids, ids, sorter=order)
        pos = np.minimum(pos, max(self.n_ads - 1, 0))
        slots = order[pos] if self.n_ads else np.zeros_like(ids)
        bad = (self.n_ads == 0) | (self.ad_ids[slots] != ids) if self.n_ads else np.ones(ids.shape, bool)
        if np.any(bad):
            raise KeyError(f"unknown ad ids: {ids[bad][:10].tolist()}")
        return slots.astype(np.int64)


@dataclass(frozen=True)
class TopK:
    """A top-K answer: ``ids [k]`` int64 (pads: -1), ``scores [k]`` (pads: -inf), best first, and
    ``count``, the number of eligible non-NaN candidates."""

    ids: np.ndarray
    scores: np.ndarray
    count: int
