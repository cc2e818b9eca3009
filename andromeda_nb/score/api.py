"""Host wrappers of the fused gather-gate-score kernels (score/fused.py; score/naive.py is the
first loop-based kernel, kept as the ``naive`` baseline)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..device import launch
from ..model import MAX_EXPERTS, STORAGE_DTYPES, AdTable, Request, TopK, all_unique
from ..topk.api import BLOCK_TOPK_MAX_K, MAX_ITEMS, MAX_K, TopKWorkspace, check_k, eligible_bitset, launch_merge_lists

#: Embedding dimensions the kernels accept: multiples of 8 (whole 8-byte words for every dtype).
MAX_D = 256
LAYOUTS = ("rows", "tiles")
PER_WORD = {"fp32": 2, "fp16": 4, "bf16": 4, "int8": 8}


@dataclass(frozen=True)
class KernelConfig:
    """Tuning knobs of the scoring kernels (defaults chosen by measurement; see the scoring notebook).

    Attributes:
        values: ``"chosen"`` (value dots of the K chosen experts only, h kept in registers) or
            ``"all"`` (all E value dots in one streaming pass; fewer registers, more FMAs).
        block: threads per block (None: 256 on a GPU, 32 in the simulator).
        max_registers: register cap per thread (None: the compiler's choice; ``"auto"``: 96 for the
            gated model with weights in kernel parameters outside the block top-K, 128 otherwise,
            measured best on the H200, data/results/scoring.csv, phases "weights" and "tensor").
        items: ads each thread scores between two block top-K barrier pairs (fused path). 4 measured
            ~10x slower than 1 on the H200 (data/results/scoring.csv, "items=4" rows): ptxas gives
            that kernel 255 registers and a 1.8 KB spill stack (122 registers, no spills at 1) as
            the compiler overlaps the round's ads; a register cap makes it spill more.
        sync_every: top-K rounds between two barrier pairs of the fused block top-K (the shared
            buffer grows to hold that many rounds of candidates). 1 is the default: on the H200
            2 / 4 / 8 measured 11.5 / 6.6 / 11.6 G ads/s against 11.6 at 1 (gated E = 6, K = 2,
            fp16, d = 64, top-1000; data/results/scoring.csv, "sync_every=" rows).
        blocks_per_sm: grid size of the grid-stride loop, in blocks per SM.
        naive: use the first loop-based kernel (score/naive.py) instead of the generated one.
        weights: where the per-ad loop reads gamma, beta and the gate keys G (and the dot kernel's
            user vector) from: ``"shared"`` (16-byte shared loads from the weight image) or
            ``"param"`` (a tuple kernel argument: ptxas reads it from the constant bank with
            uniform loads, no shared-memory traffic; V stays in shared memory, its rows differ
            per ad). ``"param"`` needs the tuple within :data:`PARAM_FLOATS`. ``"auto"`` (default):
            ``"param"`` where it fits (d = 64, E = 6: 512 floats) and the kernel is the generated
            CUDA-core one with ``values="chosen"``, else ``"shared"``. Measured on the H200 (gated
            E = 6, K = 2, fp16, d = 64, scores to memory): 17.0 G ads/s shared, 20.5 G param.
        guard: how the scores-to-memory and filter kernels keep ptxas from hoisting the shared
            weight loads out of the ad loop: ``"fence"`` (a block-scope fence per ad) or
            ``"offset"`` (an address offset that is zero at run time but unknown to ptxas).
        tensor_cores: the gate and value dot products on the tensor cores (``mma.sync`` m16n8k8
            TF32, each operand split into a TF32 high and low part rounded to nearest, three
            products summed: ~2^-22 relative error per product against fp32's 2^-24), a warp
            scoring 32 ads at once; every expert's value dot is computed (8 per tile). Gated
            model, fp16 or bf16 tables, d a multiple of 16, E <= 8, whole warps; the weight image
            (192 d bytes) and the result tiles (64 bytes per thread) must fit in 48 KiB of shared
            memory (d <= 160 at block 256). Within the oracle tolerance on unit-scale rows; on
            rows of magnitude ~1000 (logits in the thousands) it exceeded it by up to 1.5x on 2 of
            12 seeds in the simulator, where the CUDA-core kernel stayed within; on the H200 by up
            to 2.97x (commit e80b90f: the hardware accumulates the products less exactly than
            the simulator's round-to-nearest model). Measured on the
            H200 at 19.7 G ads/s (gated E = 6, K = 2, fp16, d = 64), not faster than the default,
            with the splits truncated (up to 3x less accurate); rounding them (``cvt.rna.tf32``,
            which ptxas expands to a few instructions: 1,083 instead of 761 per 32 ads in the
            loop) is not measured on the GPU yet.
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

    def __post_init__(self):
        for name, allowed in (("weights", ("auto", "shared", "param")), ("guard", ("fence", "offset")),
                              ("values", ("chosen", "all"))):
            v = getattr(self, name)
            if not isinstance(v, str) or v not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {v!r}")
        if not isinstance(self.tensor_cores, (bool, np.bool_)):
            raise ValueError(f"tensor_cores must be True or False, got {self.tensor_cores!r}")
        if self.tensor_cores and (self.weights == "param" or self.naive):
            raise ValueError("tensor_cores=True reads its weights from shared memory (weights='shared', naive=False)")
        if self.weights == "param" and (self.values == "all" or self.naive):
            raise ValueError('weights="param" runs the generated kernel with values="chosen" (not values="all", '
                             "not naive)")
        launch.check_block(self.block)
        if self.tensor_cores and self.block is not None and self.block % 32:
            raise ValueError(f"tensor_cores=True needs whole warps: block must be a multiple of 32, got {self.block}")
        regs = self.max_registers
        if not (regs is None or (isinstance(regs, str) and regs == "auto")
                or (isinstance(regs, (int, np.integer)) and not isinstance(regs, (bool, np.bool_))
                    and 16 <= regs <= 255)):
            raise ValueError(f"max_registers must be None, 'auto' or an int in 16..255, got {regs!r}")
        for name in ("items", "sync_every", "blocks_per_sm"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")

    def threads(self) -> int:
        return self.block or launch.default_block()

    def resolved(self, dreq: "DeviceRequest", topk_k: int = 0, compact: bool = False) -> "KernelConfig":
        """This configuration with ``weights`` and ``max_registers`` made concrete for a request
        (``"auto"`` rules in the class docstring); ``topk_k`` > 0: the fused block top-K kernel;
        ``compact``: an eligible bitset compacted in the kernel (a top-K over a bitset) on the
        ``tiles`` layout, where the parameter weights measured slower (2.9 against 4.4 G eligible
        ads/s at 10 %; on ``rows`` faster, 7.5 against 6.1; data/results/scoring.csv): shared
        weights there.

        Raises:
            TypeError: ``dreq`` is not a :class:`DeviceRequest` (``DeviceRequest.of(request)``).
            ValueError: ``topk_k`` not a non-negative int, ``compact`` not a bool."""
        if not isinstance(dreq, DeviceRequest):
            raise TypeError(f"resolved() takes a DeviceRequest (DeviceRequest.of(request)), got {type(dreq).__name__}")
        if isinstance(topk_k, bool) or not isinstance(topk_k, (int, np.integer)) or topk_k < 0:
            raise ValueError(f"topk_k must be a non-negative int, got {topk_k!r}")
        if not isinstance(compact, (bool, np.bool_)):
            raise ValueError(f"compact must be True or False, got {compact!r}")
        weights = self.weights
        if weights == "auto":
            fits = dreq.param_floats <= PARAM_FLOATS
            weights = ("param" if fits and not (self.tensor_cores or self.naive or compact) and self.values == "chosen"
                       else "shared")
        regs = self.max_registers
        if isinstance(regs, str):  # "auto"
            regs = 96 if weights == "param" and dreq.model == "gated" and not topk_k else 128
        if (weights, regs) == (self.weights, self.max_registers):
            return self
        return replace(self, weights=weights, max_registers=regs)


DEFAULT_CONFIG = KernelConfig()
#: Most floats the ``weights="param"`` tuple may hold: kernel parameters share 4 KiB with the
#: other arguments (each array argument is several 8-byte fields).
PARAM_FLOATS = 640
#: Static shared memory a block may use without an opt-in (DESIGN.md: Numba has no public one).
SHARED_BYTES = 48 * 1024


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
        ``rows``:  ``[n_ads, d]``, a row contiguous (gathers read whole 32-byte sectors);
        ``tiles``: ``[d/W, n_ads, W]`` (a warp's load of one word for 32 consecutive ads is 256
        contiguous bytes).

    Attributes:
        n_ads, d, dtype, layout; device arrays ``words`` (the table as uint64: ``[n_ads, d/W]`` or
        ``[d/W, n_ads]``), ``embeddings`` (the same memory in the storage dtype), ``bias``,
        ``scale`` (int8, else a dummy), ``ad_ids`` (int64); ``host_ad_ids`` (numpy, or None when
        unknown); ``table`` (the host table, or None).

    Raises:
        ValueError: unsupported d or layout, or more than 2**31 - 1 ads.
    """

    def __init__(self, table: AdTable, layout: str = "rows"):
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

    def _set(self, embeddings, bias, dtype, layout, scale, ad_ids, n_ads, d):
        self.embeddings, self.bias, self.dtype, self.layout = embeddings, bias, dtype, layout
        self.scale = scale if scale is not None else launch.dummy(np.float32)
        self.ad_ids, self.n_ads, self.d = ad_ids, int(n_ads), int(d)
        self.table, self.host_ad_ids = None, None
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
                (None: the slots 0..n_ads-1, materialised on the device).

        Raises:
            TypeError / ValueError: dtype or shape mismatches.
        """
        cuda = launch.cuda()
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
        if ad_ids is None:
            ad_ids = cuda.to_device(np.arange(n_ads, dtype=np.int64))
        launch.check_array("ad_ids", ad_ids, np.int64, shape=(n_ads,))
        self = cls.__new__(cls)
        self._set(embeddings, bias, dtype, layout, scale, ad_ids, n_ads, d)
        return self


class DeviceRequest:
    """A request's tensors on the device in the kernels' form.

    ``DeviceRequest.of(x)`` accepts a :class:`~andromeda_nb.model.Request` (the gated model) or a
    1-D user vector ``u[d]`` (the two-tower ``dot(u, a) + b`` baseline).

    Attributes:
        model: ``"gated"`` or ``"dot"``; request (or None); user (or None); d, experts, k_experts;
        image: device float32 weight image (score/fused.py).
    """

    def __init__(self, model: str, d: int, experts: int, k_experts: int, image, request=None, user=None):
        self.model, self.d, self.experts, self.k_experts = model, d, experts, k_experts
        self.image, self.request, self.user = image, request, user
        self._naive = None
        self._param = None
        self._mma = None

    @classmethod
    def of(cls, x) -> "DeviceRequest":
        """Raises TypeError / ValueError for anything else than a Request, a DeviceRequest or a
        finite 1-D float user vector of a supported d."""
        from .fused import weight_image

        if isinstance(x, DeviceRequest):
            return x
        if isinstance(x, Request):
            check_kernel_shape(x.d, x.experts)
            return cls("gated", x.d, x.experts, x.k_experts, launch.to_device(weight_image("gated", request=x)),
                       request=x)
        u = np.asarray(x)
        if u.ndim != 1 or u.dtype.kind not in "fiu":
            raise TypeError(f"expected a Request or a 1-D user vector, got {type(x).__name__} {getattr(u, 'shape', '')}")
        u = u.astype(np.float32)
        if not np.all(np.isfinite(u)):
            raise ValueError("user vector holds non-finite values")
        check_kernel_shape(u.size, 1)
        return cls("dot", u.size, 1, 1, launch.to_device(weight_image("dot", user=u)), user=u)

    # backwards-compatible name
    from_request = of

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
            host = self.image.copy_to_host() if hasattr(self.image, "copy_to_host") else np.asarray(self.image)
            self._param = tuple(np.float32(x) for x in host[:n])
        return self._param

    def mma_image(self):
        """The device per-lane weight image of the tensor-core kernels (score.fused.mma_image)."""
        if self._mma is None:
            from .fused import mma_image

            if self.model != "gated":
                raise ValueError("tensor_cores=True implements the gated model only")
            if self.request is None:
                raise ValueError("tensor_cores=True builds its weights from the Request: make the DeviceRequest "
                                 "with DeviceRequest.of(request)")
            self._mma = launch.to_device(mma_image(self.request))
        return self._mma

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


def _prepare(request, table: DeviceAdTable, eligible, candidates, unique: bool = False):
    if not isinstance(table, DeviceAdTable):
        raise TypeError(f"table must be a DeviceAdTable, got {type(table).__name__}")
    dreq = DeviceRequest.of(request)
    if dreq.d != table.d:
        raise ValueError(f"request d={dreq.d} does not match table d={table.d}")
    if eligible is not None and candidates is not None:
        raise ValueError("give eligible or candidates, not both")
    n = table.n_ads
    if candidates is not None:
        launch.check_array("candidates", candidates, np.int32, ndim=1)
        # device candidates are copied back once to be checked (m * 4 bytes): an id out of range
        # would read outside the table; the launch_* functions skip this for serving loops
        host = candidates if isinstance(candidates, np.ndarray) else candidates.copy_to_host()
        if host.size:
            lo, hi = int(host.min()), int(host.max())
            if lo < 0 or hi >= n:
                raise ValueError(f"candidate slots must be in 0..{n - 1}, got range {lo}..{hi}")
            if unique and not all_unique(host):
                raise ValueError("candidate slots must be distinct for top-K (a repeated slot would be "
                                 "returned several times)")
        return dreq, "candidates", None, launch.to_device(candidates), int(candidates.shape[0])
    if eligible is not None:
        return dreq, "bitset", eligible_bitset(eligible, n), None, n
    return dreq, "pool", None, None, n


def shared_bytes(dreq: DeviceRequest, topk_k: int, config: KernelConfig, access: str = "pool",
                 selects: bool = True) -> int:
    """Static shared memory per block of the generated kernel: the weight image, plus for a fused
    block top-K (``topk_k`` > 0) its buffer of 8-byte entries, plus for a bitset feeding a
    selection (``selects``: block top-K or filter) its per-tile list of eligible positions."""
    from .fused import BITS_PER_THREAD, image_size
    from ..topk.block import buffer_capacity

    block = config.threads()
    cap = buffer_capacity(topk_k, block, config.items, config.sync_every) if topk_k else 0
    listed = 2 * BITS_PER_THREAD * block + 4 * block if access == "bitset" and selects else 0
    if config.tensor_cores:  # per-lane weight image and each warp's 32 x 16 result tile
        from .fused import mma_image_size

        return 4 * mma_image_size(dreq.d) + 64 * block + 8 * cap + listed + 64
    return 4 * image_size(dreq.model, dreq.d, dreq.experts) + 8 * cap + listed + 64


def check_shared(dreq: DeviceRequest, topk_k: int, config: KernelConfig, access: str = "pool",
                 selects: bool = True) -> None:
    """Raise ValueError (before any launch) when the kernel for this request, k, access and
    configuration needs more shared memory per block than Numba's static limit
    (:data:`SHARED_BYTES`)."""
    shared = shared_bytes(dreq, topk_k, config, access, selects)
    if shared > SHARED_BYTES:
        raise ValueError(f"this configuration needs {shared} bytes of shared memory per block (weight image of "
                         f"d={dreq.d}, E={dreq.experts}" + (f" + a top-{topk_k} buffer for block={config.threads()}, "
                                                           f"items={config.items}, sync_every={config.sync_every}"
                                                           if topk_k else "")
                         + f"); Numba allows {SHARED_BYTES}: lower k, block, items or sync_every")


def _resolve(config: KernelConfig, dreq: DeviceRequest, table: DeviceAdTable, access: str, topk_k: int = 0,
             selects: bool | None = None) -> KernelConfig:
    """``config`` made concrete (:meth:`KernelConfig.resolved`) for the kernel that scores this
    request and table: ``selects`` (default ``topk_k > 0``) says the kernel selects (the block
    top-K or the filter pass), where an eligible bitset is compacted in the kernel."""
    selects = topk_k > 0 if selects is None else selects
    return config.resolved(dreq, topk_k, access == "bitset" and selects and table.layout == "tiles")


def _weight_args(dreq: DeviceRequest, config: KernelConfig):
    """(the weight image argument, the extra trailing arguments) of the generated kernel for a
    resolved ``config``."""
    image = dreq.mma_image() if config.tensor_cores else dreq.image
    return image, ((dreq.param_weights(),) if config.weights == "param" else ())


def _kernel(dreq: DeviceRequest, table: DeviceAdTable, access: str, topk_k: int, config: KernelConfig):
    """The kernel for a resolved ``config`` (:func:`_resolve`); raises ValueError before compiling
    anything for a configuration it cannot build."""
    from ..topk.block import buffer_capacity

    block = config.threads()
    if config.naive:
        cap = buffer_capacity(topk_k, block) if topk_k else 0
        if dreq.model != "gated":
            raise ValueError("the naive kernel implements the gated model only")
        from .naive import gated_score_kernel

        return gated_score_kernel(dreq.d, dreq.experts, dreq.k_experts, table.dtype, table.layout, access,
                                  block, cap, topk_k > 0)
    from .fused import fused_kernel

    cap = buffer_capacity(topk_k, block, config.items, config.sync_every) if topk_k else 0
    check_shared(dreq, topk_k, config, access, topk_k > 0)
    return fused_kernel(dreq.model, dreq.d, dreq.experts, dreq.k_experts, table.dtype, table.layout, access,
                        block, cap, True, config.values, config.max_registers, config.items if topk_k else 1,
                        config.sync_every if topk_k else 1, False, config.weights, config.guard,
                        config.tensor_cores)


def _launch(dreq, table, access, elig, cand, n_items, grid, topk_k, out, cand_s, cand_i, counts, config):
    config = _resolve(config, dreq, table, access, topk_k)
    kern = _kernel(dreq, table, access, topk_k, config)
    dummy = launch.dummy
    elig = elig if elig is not None else dummy(np.uint64)
    cand = cand if cand is not None else dummy(np.int32)
    out = out if out is not None else dummy(np.float32)
    cand_s = cand_s if cand_s is not None else dummy(np.float32)
    cand_i = cand_i if cand_i is not None else dummy(np.int32)
    counts = counts if counts is not None else dummy(np.int64)
    block = config.threads()
    if config.naive:
        G, V, gamma, beta = dreq.naive_arrays()
        kern[grid, block](table.embeddings, table.scale, table.bias, G, V, gamma, beta, elig, cand, n_items,
                          table.ad_ids, topk_k, out, cand_s, cand_i, counts)
    else:
        image, extra = _weight_args(dreq, config)
        kern[grid, block](table.words, table.scale, table.bias, image, elig, cand, n_items, table.ad_ids,
                          topk_k, out, cand_s, cand_i, counts, *extra)


def launch_score(dreq: DeviceRequest, table: DeviceAdTable, access: str, elig, cand, n_items: int,
                 out, config: KernelConfig | None = None) -> None:
    """Enqueue the scores-to-memory kernel (no validation, no host copies; for benchmarks and
    :func:`score_ads`). ``out``: device ``float32[n_items]``."""
    config = config or DEFAULT_CONFIG
    grid = launch.grid_for(n_items, config.threads(), config.blocks_per_sm)
    _launch(dreq, table, access, elig, cand, n_items, grid, 0, out, None, None, None, config)


def topk_workspace(table: DeviceAdTable, k: int, n_items: int, config: KernelConfig | None = None):
    """A reusable :class:`~andromeda_nb.topk.api.TopKWorkspace` for fused scoring + top-k over n_items."""
    config = config or DEFAULT_CONFIG
    grid = launch.grid_for(n_items, config.threads(), config.blocks_per_sm)
    return TopKWorkspace(np.array([0, table.n_ads], np.int64), np.array([k], np.int64), grid)


def launch_score_topk(dreq: DeviceRequest, table: DeviceAdTable, k: int, access: str, elig, cand,
                      n_items: int, config: KernelConfig | None = None, ws: TopKWorkspace | None = None):
    """Enqueue fused scoring + block top-K + merge (no validation; no allocation or host copy when
    a workspace from :func:`topk_workspace` is given).

    Returns:
        The workspace: ``ws.out_id[0]`` (int64[k] ad ids), ``ws.out_s[0]`` (float32[k]),
        ``ws.counts[0, 0]`` (ads scored with a non-NaN score).
    """
    config = config or DEFAULT_CONFIG
    ws = ws or topk_workspace(table, k, n_items, config)
    ws.reset()
    _launch(dreq, table, access, elig, cand, n_items, ws.lists, k, None, ws.cand_s[0], ws.cand_i[0], ws.counts[0],
            config)
    launch_merge_lists(ws, table.ad_ids, config.threads())
    return ws


#: How :func:`score_topk` selects. "filter": score a sample of the items, take a seed threshold from
#: it, then one fused pass appends only the scores at or above the seed to a small buffer (per-ad
#: work: one compare; no per-round barriers) and one block's radix select answers; exact, or it
#: falls back to "block" (a seed above the k-th score, or more scores through than the buffer
#: holds). "block": the fused block top-K (per-block lists behind a running threshold) and merge.
SCORE_TOPK_PATH = "filter"


class ScoreFilterWorkspace:
    """Device buffers of the "filter" path of fused scoring + top-k (:func:`launch_score_filter`)
    for ``n_items`` items and top-``k``: the sample positions (contiguous chunks spread over the
    items, as :func:`~andromeda_nb.topk.api.launch_seed` samples a score array), their table slots
    (candidates access), the seed's :class:`~andromeda_nb.topk.api.SeedWorkspace` and the filter's
    :class:`~andromeda_nb.topk.api.FilterWorkspace`. ``make`` returns None where no seed pays (few
    items: :meth:`SeedWorkspace.make`)."""

    @classmethod
    def make(cls, n_items: int, k: int, access: str):
        from ..topk.api import FilterWorkspace, SeedWorkspace, sample_positions

        sws = SeedWorkspace.make(n_items, k)
        if sws is None:
            return None
        self = cls()
        self.n_items, self.k, self.access, self.sws = int(n_items), int(k), access, sws
        pos = sample_positions(n_items, sws.chunks)
        cuda = launch.cuda()
        self.pos = cuda.to_device(pos)
        self.slots = cuda.device_array(pos.size, np.int32) if access == "candidates" else self.pos
        self.fws = FilterWorkspace(n_items, k)
        return self


def launch_score_filter(dreq: DeviceRequest, table: DeviceAdTable, k: int, access: str, elig, cand,
                        n_items: int, config: KernelConfig | None = None, sfw: ScoreFilterWorkspace | None = None):
    """Enqueue the "filter" path of fused scoring + top-k (:data:`SCORE_TOPK_PATH`; no validation,
    no allocation or host copy when ``sfw`` is given): score the sample (scores-to-memory kernel
    over the sampled slots; ineligible ones set to -inf), select its seed (the r-th best), one
    fused pass keeping the eligible scores at or above the seed, one block's radix select of the
    top-k among them. Five launches (six for candidates access).

    Returns:
        the :class:`~andromeda_nb.topk.api.FilterWorkspace`: ``out_id[0]`` (int64[k] ad ids),
        ``out_s[0]``, ``counts[0]`` (non-NaN scores; those at or above the seed). Exact when
        :func:`~andromeda_nb.topk.api.seeded_outcome` says "exact".
    """
    from .fused import fused_kernel, sample_prep_kernel
    from ..topk.api import launch_final, launch_seed_select

    config = _resolve(config or DEFAULT_CONFIG, dreq, table, access, selects=True)
    sfw = sfw or ScoreFilterWorkspace.make(n_items, k, access)
    sws, fws = sfw.sws, sfw.fws
    block = config.threads()
    dummy = launch.dummy
    small = launch.default_block()
    m = sfw.pos.shape[0]
    prep_grid = launch.grid_for(m, small)
    if access == "candidates":  # the sampled candidates' slots
        sample_prep_kernel(True, False)[prep_grid, small](sfw.pos, cand, sfw.slots, dummy(np.uint64),
                                                          sws.sample_flat, True, fws.counts, fws.fill)
    elif access == "pool":
        fws.reset()
    grid = launch.grid_for(m, block, config.blocks_per_sm)
    _launch(dreq, table, "candidates", None, sfw.slots, m, grid, 0, sws.sample_flat, None, None, None, config)
    if access == "bitset":  # an ineligible sampled ad never seeds
        sample_prep_kernel(False, True)[prep_grid, small](sfw.pos, dummy(np.int32), dummy(np.int32), elig,
                                                          sws.sample_flat, True, fws.counts, fws.fill)
    seed = launch_seed_select(sws)
    kern = fused_kernel(dreq.model, dreq.d, dreq.experts, dreq.k_experts, table.dtype, table.layout, access, block,
                        0, True, config.values, config.max_registers, 1, 1, True, config.weights, config.guard,
                        config.tensor_cores)
    grid = launch.grid_for(n_items, block, config.blocks_per_sm)
    image, extra = _weight_args(dreq, config)
    kern[grid, block](table.words, table.scale, table.bias, image,
                      elig if elig is not None else dummy(np.uint64), cand if cand is not None else dummy(np.int32),
                      n_items, table.ad_ids, seed, fws.buf_s, fws.buf_i, fws.fill, fws.counts, *extra)
    return launch_final(k, fws, table.ad_ids)


def _check_runnable(dreq: DeviceRequest, table: DeviceAdTable, access: str, config: KernelConfig,
                    topk_k: int = 0) -> None:
    """Raise ValueError, before anything launches, for a configuration the kernels cannot run on
    this request and table: kernel generation (dtype, d, E, block, shared memory), the parameter
    weights' size, the tensor-core weight image. Generating a kernel compiles nothing."""
    if config.naive:
        return
    cfg = _resolve(config, dreq, table, access, topk_k)
    _kernel(dreq, table, access, topk_k, cfg)
    _weight_args(dreq, cfg)


def _check_config(config) -> "KernelConfig":
    """``config`` or the default; TypeError when it is not a :class:`KernelConfig`."""
    if config is None:
        return DEFAULT_CONFIG
    if not isinstance(config, KernelConfig):
        raise TypeError(f"config must be a KernelConfig, got {type(config).__name__}")
    return config


def score_ads(request, table: DeviceAdTable, eligible=None, candidates=None,
              config: KernelConfig | None = None):
    """Scores written to device memory (the unfused-top-K path).

    Args:
        request: a :class:`~andromeda_nb.model.Request` (gated model), a 1-D user vector ``u[d]``
            (two-tower ``dot(u, a) + b``), or a :class:`DeviceRequest`.
        table: :class:`DeviceAdTable`.
        eligible: optional bool ``[n_ads]`` mask or uint64 bitset: only eligible rows are read;
            ineligible slots get NaN.
        candidates: optional ``int32[m]`` slots to score (gather); the output is ``[m]``.
        config: :class:`KernelConfig` (default :data:`DEFAULT_CONFIG`).

    Returns:
        Device ``float32[n_ads]`` (or ``[m]`` for candidates).

    Raises:
        TypeError / ValueError: bad table, request, mask, candidates (slots out of range).
    """
    config = _check_config(config)
    dreq, access, elig, cand, n_items = _prepare(request, table, eligible, candidates)
    if config.naive and dreq.model != "gated":
        raise ValueError("the naive kernel implements the gated model only")
    if not config.naive:
        _check_runnable(dreq, table, access, config)  # includes the shared-memory check
    out = launch.cuda().device_array(n_items, np.float32)
    launch_score(dreq, table, access, elig, cand, n_items, out, config)
    return out


def score_topk(request, table: DeviceAdTable, k: int, eligible=None, candidates=None,
               config: KernelConfig | None = None, path: str | None = None) -> TopK:
    """Fused scoring + top-K: scores never reach device memory (except on the fallback for a k
    above 2048 without an exact seed); only the k ad ids, k scores and the count come back to the
    host. Default "filter" path: 0.99 of the scores-to-memory rate on the H200 (gated E = 6, K = 2,
    fp16, d = 64, 10^8 ads, top-1000; data/results/scoring.csv, commit 76c2e8a), the block top-K
    0.68.

    Args:
        request, table, eligible, candidates: as for :func:`score_ads`.
        config: a :class:`KernelConfig` (``anb.KernelConfig``) or None for the measured defaults.
        k: ``1 <= k <= topk.MAX_K`` (4096); ``k <= topk.BLOCK_TOPK_MAX_K`` (2048) on the "block"
            path or with a naive config (the fused block top-K's shared buffer).
        path: "filter" or "block" (default :data:`SCORE_TOPK_PATH`). "filter" falls back to
            "block" when its seed does not give an exact answer (to scores in memory and
            :func:`~andromeda_nb.topk.api.topk_scores` when k > 2048 or the block top-K's buffer does
            not fit in shared memory), and is not used for small item counts or the naive kernel.

    Returns:
        :class:`~andromeda_nb.model.TopK` by ad id (ties to the lower ad id), count = ads scored
        with a non-NaN score.

    Raises:
        TypeError / ValueError: as :func:`score_ads`, k out of range, bad ``path`` or ``config``,
            repeated candidate slots, a kernel needing more shared memory than Numba allows; all
            before any launch.
    """
    from ..topk.api import seeded_outcome, topk_scores

    k = check_k(k)
    config = _check_config(config)
    path = SCORE_TOPK_PATH if path is None else path
    if path not in ("filter", "block"):
        raise ValueError(f"path must be 'filter' or 'block', got {path!r}")
    if k > BLOCK_TOPK_MAX_K and (path == "block" or config.naive):
        raise ValueError(f"k={k}: the fused block top-K supports k <= {BLOCK_TOPK_MAX_K} (its shared buffer); "
                         f"the filter path (path='filter', not naive) takes k <= {MAX_K}")
    dreq, access, elig, cand, n_items = _prepare(request, table, eligible, candidates, unique=True)
    if config.naive and dreq.model != "gated":
        raise ValueError("the naive kernel implements the gated model only")
    # whether the block top-K can run for this request: else the fallback is scores to memory
    block_fits = k <= BLOCK_TOPK_MAX_K and (config.naive or shared_bytes(dreq, k, config, access) <= SHARED_BYTES)
    if path == "block" and not block_fits:
        check_shared(dreq, k, config, access)  # raises, naming the bytes
    if not config.naive:
        check_shared(dreq, 0, config, access)  # the filter pass and the scores-to-memory fallback
        _check_runnable(dreq, table, access, config)
        if block_fits:
            _check_runnable(dreq, table, access, config, k)
    sfw = ScoreFilterWorkspace.make(n_items, k, access) if path == "filter" and not config.naive else None
    if sfw is not None:
        fws = launch_score_filter(dreq, table, k, access, elig, cand, n_items, config, sfw)
        c = fws.counts.copy_to_host()[0]
        if seeded_outcome(fws, k, c) == "exact":
            return TopK(ids=fws.out_id[0].copy_to_host(), scores=fws.out_s[0].copy_to_host(), count=int(c[0]))
    if block_fits:
        ws = launch_score_topk(dreq, table, k, access, elig, cand, n_items, config)
        return TopK(ids=ws.out_id[0].copy_to_host(), scores=ws.out_s[0].copy_to_host(),
                    count=int(ws.counts.copy_to_host()[0, 0]))
    # above the block top-K's limit without an exact seeded answer: scores to memory (NaN where
    # ineligible), then topk_scores over them by ad id
    out = launch.cuda().device_array(n_items, np.float32)
    launch_score(dreq, table, access, elig, cand, n_items, out, config)
    ids = table.ad_ids
    if cand is not None:
        ids = table.ad_ids.copy_to_host()[cand.copy_to_host()]
    return topk_scores(out, k, ids=ids)


def with_config(config: KernelConfig | None = None, **changes) -> KernelConfig:
    """A copy of ``config`` (default :data:`DEFAULT_CONFIG`) with fields changed."""
    return replace(config or DEFAULT_CONFIG, **changes)
