"""The ad table and the request on the device, in the forms the scoring kernels read."""

from __future__ import annotations

import numpy as np

from ..device import launch
from ..model import MAX_EXPERTS, STORAGE_DTYPES, AdTable, Request, all_unique, from_bf16_bits
from ..topk.api import MAX_ITEMS
from .config import MAX_D, PARAM_FLOATS

LAYOUTS = ("rows", "tiles")
#: Elements per 8-byte word of each storage dtype (a table row is d / W words).
PER_WORD = {"fp32": 2, "fp16": 4, "bf16": 4, "int8": 8}
#: The slot id of a free slot (no ad): never scored, never returned.
FREE = -1


def resolve_layout(layout: str) -> str:
    """``"auto"`` -> ``"tiles"`` (see :class:`DeviceAdTable`); ``"rows"`` and ``"tiles"`` as given.

    Raises:
        ValueError: any other value.
    """
    if layout == "auto":
        return "tiles"
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'auto' or one of {LAYOUTS}, got {layout!r}")
    return layout


def check_slot_ids(ids: np.ndarray) -> int:
    """Check a slot -> ad id map (``int64[n]``): each live id non-negative and unique, -1 for a
    free slot. Returns the number of free slots.

    Raises:
        ValueError: an id below -1, or an ad id in two slots.
    """
    free = ids == FREE
    n_free = int(np.count_nonzero(free))
    live = ids[~free] if n_free else ids
    if live.size and live.min() < 0:
        raise ValueError(f"ad ids must be non-negative (-1 marks a free slot), got {int(live.min())}")
    if not all_unique(live):
        raise ValueError("ad ids must be unique among the live slots (results report ad ids)")
    return n_free


def check_kernel_shape(d: int, experts: int) -> None:
    """Raise ValueError unless the kernels support this (d, E)."""
    if d % 8 or not 8 <= d <= MAX_D:
        raise ValueError(f"kernels need d a multiple of 8 in 8..{MAX_D}, got d={d}")
    if not 1 <= experts <= MAX_EXPERTS:
        raise ValueError(f"kernels need 1 <= E <= {MAX_EXPERTS}, got E={experts}")


def _check_layout(layout: str, d: int, n_ads: int) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    check_kernel_shape(d, 1)
    if n_ads > MAX_ITEMS:
        raise ValueError(f"at most {MAX_ITEMS} ads per table, got {n_ads}")


class DeviceAdTable:
    """An ad table resident on the device in a kernel layout.

    Build it from a host :class:`~andromeda_nb.model.AdTable` (``DeviceAdTable(table, layout)``),
    or wrap arrays already on the device with :meth:`from_device` (benchmarks generate 100M-ad
    tables on the GPU).

    Layouts (W = elements per 8-byte word: fp32 2, fp16 / bf16 4, int8 8):
        ``rows``:  ``[n_ads, d]``, a row contiguous: a gathered ad (a candidate list, a sparse
        eligible set) reads whole 32-byte sectors;
        ``tiles``: ``[d/W, n_ads, W]``: a warp's load of one word for 32 consecutive ads is 256
        contiguous bytes, the fastest full-pool scan (about 1.6x ``rows`` for the gated kernel
        on the H200, data/results/scoring.csv), but a gathered ad touches d/W sectors.
        ``"auto"`` (default): ``tiles``, the layout of a scan of the pool; a table served mostly
        through sparse eligible sets or candidate lists should use ``rows``
        (:class:`~andromeda_nb.pipeline.Pool` chooses by its targeting index).

    Slots whose ad id is -1 are free (:meth:`from_device`; a :class:`~andromeda_nb.pipeline.Pool`
    with spare capacity): the request path never scores or returns them.

    Attributes:
        n_ads, d, dtype, layout; device arrays ``words`` (the table as uint64: ``[n_ads, d/W]`` or
        ``[d/W, n_ads]``), ``embeddings`` (the same memory in the storage dtype), ``bias``,
        ``scale`` (int8, else a dummy), ``ad_ids`` (int64); ``host_ad_ids`` (numpy, or None when
        unknown); ``table`` (the host table, or None).

    Raises:
        ValueError: unsupported d or layout, or more than 2**31 - 1 ads.
    """

    def __init__(self, table: AdTable, layout: str = "auto"):
        layout = resolve_layout(layout)
        _check_layout(layout, table.d, table.n_ads)
        emb = table.embeddings
        if layout == "tiles":
            W = PER_WORD[table.dtype]
            emb = np.ascontiguousarray(emb.reshape(table.n_ads, table.d // W, W).transpose(1, 0, 2))
        self._set(launch.to_device(emb), launch.to_device(table.bias), table.dtype, layout,
                  launch.to_device(table.scale) if table.scale is not None else None,
                  launch.to_device(table.ad_ids), table.n_ads, table.d)
        self.table = table
        self.host_ad_ids = table.ad_ids
        self.n_free = 0
        if table.dtype == "int8":  # of the scales copied above (the caller may change its arrays later)
            from .weights import fma_dequant_exact

            self._fma_dequant = fma_dequant_exact(table.scale)

    def max_abs(self) -> float:
        """The largest finite ``|a|`` stored in the table (an int8 table: ``max |q| scale`` in float64,
        past fp32's range where a finite scale takes it there), computed once (from the host table,
        else by a reduction on the device)."""
        if getattr(self, "_max_abs", None) is None:
            if self.table is not None:
                m = rows_max_abs(self.table)
            else:
                m = _device_max_abs(self)
            self._max_abs = self._max_abs_bound = m
        return self._max_abs

    def fma_dequant(self) -> bool:
        """Whether fp16 math may dequantize this int8 table's rows with one fused multiply-add a pair
        (:func:`.weights.fma_dequant_exact` over every row scale; always true for tables quantized
        by :func:`~andromeda_nb.model.quantize_int8_rows` with scales up to 56): decided when the host
        table's scales are uploaded, for a table made :meth:`from_device` once from a copy of its
        device scales; a live pool's updates keep it."""
        if getattr(self, "_fma_dequant", None) is None:
            from .weights import fma_dequant_exact

            self._fma_dequant = self.dtype == "int8" and fma_dequant_exact(self.scale.copy_to_host())
        return self._fma_dequant

    def scale_pairs(self):
        """An int8 table's row scales as fp16 math reads them (``KernelConfig.row_scales``, by
        default): a device ``uint32[n_ads]``, each word the scale rounded to fp16 (low half)
        and that times -1152 (high half), made once from the device scales (a kernel over them)
        and kept, 4 bytes a row of device memory. A live pool's update writes the pairs of the rows
        it writes, in place, so recorded launches that read them stay valid; scales
        changed any other way (the caller's own arrays of :meth:`from_device`) are not seen.

        Raises:
            ValueError: the table is not int8."""
        if self.dtype != "int8":
            raise ValueError(f"scale_pairs: an int8 table's, not {self.dtype}'s")
        if self.kept_scale_pairs is None:
            self._scale_pairs = launch.cuda().device_array(self.n_ads, np.uint32)
            self.refresh_scale_pairs()
        return self._scale_pairs

    @property
    def kept_scale_pairs(self):
        """The table's :meth:`scale_pairs` where a request made them, else None (nothing made)."""
        return getattr(self, "_scale_pairs", None)

    def refresh_scale_pairs(self) -> None:
        """Make the kept scale pairs (:meth:`scale_pairs`) again from the device scales, in place and
        in stream order (after the caller wrote the device scales itself; a live pool's update writes
        the pairs with the scales); nothing where none are kept."""
        pairs = self.kept_scale_pairs
        if pairs is not None and self.n_ads:
            from .table_kernels import scale_pairs_kernel

            block = launch.default_block()
            scale_pairs_kernel[launch.grid_for(self.n_ads, block), block](self.scale, pairs)

    def max_abs_bound(self) -> float:
        """An upper bound of :meth:`max_abs` that costs nothing after a live pool's update: the exact
        value where known, else the last exact one raised by every row written since (an update
        that overwrites or frees rows may lower the exact value; the bound keeps the old one). A
        range check that passes on the bound passes on the exact value; one that fails on a stale
        bound asks :meth:`max_abs` (a reduction over the table) before refusing."""
        bound = getattr(self, "_max_abs_bound", None)
        return self.max_abs() if bound is None else bound

    def max_abs_is_exact(self) -> bool:
        """Whether :meth:`max_abs_bound` is the exact value (no update since it was computed)."""
        return getattr(self, "_max_abs", None) is not None

    def relabel(self, slots: np.ndarray, ad_ids: np.ndarray) -> None:
        """The host's view after the ad ids of ``slots`` changed on the device (a live pool's
        update): its ids and free count, and no stale bitset of live slots (score_topk makes it
        again on its next call)."""
        self.n_free += int((ad_ids == FREE).sum()) - int((self.host_ad_ids[slots] == FREE).sum())
        self.host_ad_ids[slots] = ad_ids
        self._live_bits = None

    def _set(self, embeddings, bias, dtype, layout, scale, ad_ids, n_ads, d):
        self.embeddings, self.bias, self.dtype, self.layout = embeddings, bias, dtype, layout
        self.scale = scale if scale is not None else launch.dummy(np.float32)
        self.ad_ids, self.n_ads, self.d = ad_ids, int(n_ads), int(d)
        self.table, self.host_ad_ids, self.n_free = None, None, 0
        W = PER_WORD[dtype]
        if n_ads == 0:
            self.words = launch.cuda().device_array((0, d // W) if layout == "rows" else (d // W, 0), np.uint64)
        elif layout == "rows":
            self.words = embeddings.view(np.uint64)
        else:
            self.words = embeddings.view(np.uint64).reshape(d // W, n_ads)

    @classmethod
    def from_device(cls, embeddings, bias, dtype: str, layout: str = "rows", scale=None, ad_ids=None):
        """Wrap device arrays (Numba device arrays or anything with ``__cuda_array_interface__``).

        Args:
            embeddings: ``[n_ads, d]`` (rows) or ``[d/W, n_ads, W]`` (tiles) in the storage dtype of
                ``dtype`` (float32, float16, uint16 bf16 bits, int8).
            bias: ``float32[n_ads]``; scale: ``float32[n_ads]`` for int8; ad_ids: ``int64[n_ads]``
                (None: the slots 0..n_ads-1, materialised on the device), unique among the live
                slots, -1 for a free slot; checked once here (a copy to the host).

        The table reads the caller's arrays in place: change them only through a
        :class:`~andromeda_nb.pipeline.Pool`, since what the table derives from them once (the fused
        dequantization's check, :meth:`scale_pairs`, :meth:`max_abs`) does not follow other writes.
        A caller that rewrites an int8 table's scales itself calls :meth:`refresh_scale_pairs`
        before the next request (fp16 math reads the pairs by default, and would answer with the
        old scales).

        Raises:
            TypeError / ValueError: dtype or shape mismatches, a repeated ad id, an id below -1.
        """
        cuda = launch.cuda()
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        for name, a in (("embeddings", embeddings), ("bias", bias), ("scale", scale), ("ad_ids", ad_ids)):
            if isinstance(a, np.ndarray):
                raise TypeError(f"from_device takes device arrays; {name} is a host numpy array (build a host "
                                "AdTable and DeviceAdTable(table) instead)")
        wrap = (lambda a: a if a is None or hasattr(a, "copy_to_host") else cuda.as_cuda_array(a))
        embeddings, bias, scale, ad_ids = map(wrap, (embeddings, bias, scale, ad_ids))
        if dtype not in STORAGE_DTYPES:
            raise ValueError(f"dtype must be one of {tuple(STORAGE_DTYPES)}, got {dtype!r}")
        if layout == "rows":
            launch.check_array("embeddings", embeddings, STORAGE_DTYPES[dtype], ndim=2)
            n_ads, d = embeddings.shape
        else:
            launch.check_array("embeddings", embeddings, STORAGE_DTYPES[dtype], ndim=3)
            n_ads, d = embeddings.shape[1], embeddings.shape[0] * embeddings.shape[2]
            if embeddings.shape[2] != PER_WORD[dtype]:
                raise ValueError(f"tiles layout needs last axis {PER_WORD[dtype]} for {dtype}")
        _check_layout(layout, d, n_ads)
        launch.check_array("bias", bias, np.float32, shape=(n_ads,))
        if (scale is None) != (dtype != "int8"):
            raise ValueError("scale is required for int8 tables and only for them")
        if scale is not None:
            launch.check_array("scale", scale, np.float32, shape=(n_ads,))
            host_scale = scale.copy_to_host()
            if n_ads and not (np.all(np.isfinite(host_scale)) and host_scale.min() >= 0):
                raise ValueError("int8 row scales must be finite and non-negative")
        if ad_ids is None:
            host_ids = np.arange(n_ads, dtype=np.int64)
            ad_ids = cuda.to_device(host_ids)
        else:
            launch.check_array("ad_ids", ad_ids, np.int64, shape=(n_ads,))
            host_ids = ad_ids.copy_to_host()
        n_free = check_slot_ids(host_ids)
        self = cls.__new__(cls)
        self._set(embeddings, bias, dtype, layout, scale, ad_ids, n_ads, d)
        self.host_ad_ids, self.n_free = host_ids, n_free
        return self


class DeviceRequest:
    """A request's tensors on the device in the kernels' form.

    ``DeviceRequest.of(x)`` accepts a :class:`~andromeda_nb.model.Request` (the gated model) or a
    1-D user vector ``u[d]`` (the two-tower ``dot(u, a) + b`` baseline).

    Attributes:
        model: ``"gated"`` or ``"dot"``; request (or None); user (or None); d, experts, k_experts;
        host_image: the float32 weight image (:func:`.weights.weight_image`; of a Request, built
        on first use, or by the call's one-pass check: :func:`.launches.checked_math`), None for a
        request made from a device image;
        image: the same on the device (copied on first use: a batch of requests copies its images
        itself, all at once).
    """

    def __init__(self, model: str, d: int, experts: int, k_experts: int, image, request=None, user=None):
        """``image``: the weight image, host (numpy) or device; None: a gated request's, built from
        ``request`` when first needed."""
        self.model, self.d, self.experts, self.k_experts = model, d, experts, k_experts
        self.request, self.user = request, user
        self._host_image = image if isinstance(image, np.ndarray) else None
        self._image = None if isinstance(image, np.ndarray) else image
        self._naive = None
        self._param = None
        self._mma = None

    @property
    def host_image(self):
        """The host weight image (None for a request made from a device image)."""
        if self._host_image is None and self._image is None and self.request is not None:
            from .weights import weight_image

            self._host_image = weight_image("gated", request=self.request)
        return self._host_image

    def image_on_host(self) -> np.ndarray:
        """:attr:`host_image`, or for a request made from a device image, that image copied back."""
        host = self.host_image
        return host if host is not None else self._image.copy_to_host()

    @property
    def image(self):
        """The device weight image (copied from :attr:`host_image` on first use)."""
        if self._image is None:
            self._image = launch.to_device(self.host_image)
        return self._image

    @classmethod
    def of(cls, x) -> "DeviceRequest":
        """Raises TypeError / ValueError for anything else than a Request, a DeviceRequest or a
        finite 1-D float user vector of a supported d."""
        from .weights import weight_image

        if isinstance(x, DeviceRequest):
            return x
        if isinstance(x, Request):
            check_kernel_shape(x.d, x.experts)
            return cls("gated", x.d, x.experts, x.k_experts, None, request=x)  # its image: when first needed
        u = np.asarray(x)
        if u.ndim != 1 or u.dtype.kind not in "fiu":
            raise TypeError(f"expected a Request or a 1-D user vector, got {type(x).__name__} {getattr(u, 'shape', '')}")
        u = u.astype(np.float32)
        if not np.all(np.isfinite(u)):
            raise ValueError("user vector holds non-finite values")
        check_kernel_shape(u.size, 1)
        return cls("dot", u.size, 1, 1, weight_image("dot", user=u), user=u)

    @property
    def param_floats(self) -> int:
        """Floats of the weight image the ``weights="param"`` tuple carries (gated: gamma, beta
        and G, ``(2 + E) d``; dot: u, ``d``)."""
        return self.d if self.model == "dot" else (2 + self.experts) * self.d

    def param_weights(self) -> tuple:
        """The weight image's prefix read per ad (gated: gamma, beta, G / sqrt(d); dot: u) as a
        tuple of numpy float32 (Numba types it ``UniTuple(float32, n)``), for ``weights="param"``.

        Raises ValueError when it holds more than :data:`PARAM_FLOATS` floats."""
        if self._param is None:
            n = self.param_floats
            if n > PARAM_FLOATS:
                raise ValueError(f'weights="param" passes {n} floats (d={self.d}, E={self.experts}); at most '
                                 f'{PARAM_FLOATS} fit in the kernel parameters: use weights="shared"')
            self._param = tuple(np.float32(x) for x in self.image_on_host()[:n])
        return self._param

    def mma_image(self):
        """The device per-lane weight image of the tensor-core kernels (:func:`.weights.mma_image`)."""
        if self._mma is None:
            from .weights import mma_image

            if self.model != "gated":
                raise ValueError("tensor_cores=True implements the gated model only")
            if self.request is None:
                raise ValueError("tensor_cores=True builds its weights from the Request: make the DeviceRequest "
                                 "with DeviceRequest.of(request)")
            self._mma = launch.to_device(mma_image(self.request))
        return self._mma

    def mma_f16_image(self):
        """The device per-lane weight image of the fp16 math mode (:func:`.weights.mma_f16_image`).

        Raises:
            ValueError: not the gated model, no Request behind it, or weights beyond fp16."""
        if getattr(self, "_mma_f16", None) is None:
            self._mma_f16 = launch.to_device(self.host_mma_f16_image())
        return self._mma_f16

    def host_mma_f16_image(self) -> np.ndarray:
        """:meth:`mma_f16_image` on the host (computed once; same errors), for a caller that copies
        it into its own device buffer."""
        if getattr(self, "_host_mma_f16", None) is None:
            from .weights import mma_f16_image

            if self.model != "gated" or self.request is None:
                raise ValueError("math='fp16' implements the gated model, from a Request (DeviceRequest.of(request))")
            self._host_mma_f16 = mma_f16_image(self.request)
        return self._host_mma_f16

    def naive_arrays(self):
        """(G / sqrt(d), V, gamma, beta) flat device arrays for the naive kernel (gated only)."""
        if self._naive is None:
            if self.request is None:
                raise ValueError("the naive kernel builds its arrays from the Request: make the DeviceRequest with "
                                 "DeviceRequest.of(request)")
            r = self.request
            G = (r.G.astype(np.float64) / np.sqrt(r.d)).astype(np.float32).ravel()
            self._naive = tuple(launch.to_device(a) for a in (G, r.V.ravel(), r.gamma, r.beta))
        return self._naive


def rows_max_abs(table: AdTable) -> float:
    """The largest finite |a| of a host table's rows as the kernel reads them, 0 for none. Without
    widening the rows: a 16-bit float's magnitude orders as its bits without the sign (finite
    below the exponent's all-ones), and an int8 row's largest |q * scale| is its largest |q|
    times |scale|."""
    emb = table.embeddings
    if emb.size == 0:
        return 0.0
    if table.dtype in ("fp16", "bf16"):
        bits = emb.view(np.uint16) & np.uint16(0x7FFF)
        inf = np.uint16(0x7C00 if table.dtype == "fp16" else 0x7F80)
        top = np.where(bits < inf, bits, np.uint16(0)).max()
        return float(top.view(np.float16) if table.dtype == "fp16" else from_bf16_bits(top)[()])
    if table.dtype == "int8":  # in float64: a finite scale may take q * scale past fp32's range
        q = np.abs(emb.astype(np.int16)).max(axis=1).astype(np.float64)
        vals = q * np.abs(table.scale.astype(np.float64))
    else:
        vals = np.abs(emb.astype(np.float32, copy=False))
    return float(vals[np.isfinite(vals)].max(initial=0.0))


def _device_max_abs(table: DeviceAdTable) -> float:
    """max finite |a| over a device table's stored values, as :func:`rows_max_abs` gives it for the
    host table (:mod:`.table_kernels`; int8: each row's largest |q| times its own scale)."""
    from .table_kernels import int8_max_abs_kernel, max_abs_kernel

    if not table.words.size:
        return 0.0
    block = launch.default_block()
    if table.dtype == "int8":
        out = launch.to_device(np.zeros(1, np.float64))
        int8_max_abs_kernel[launch.grid_for(table.n_ads, block), block](table.words, table.scale,
                                                                       table.layout == "tiles", out)
        return float(out.copy_to_host()[0])
    words = table.words.reshape(table.words.size)
    out = launch.to_device(np.zeros(1, np.float32))
    max_abs_kernel(table.dtype)[launch.grid_for(words.shape[0], block), block](words, out)
    return float(out.copy_to_host()[0])
