"""Launch helpers shared by the host wrappers: block and grid sizes, device arrays, dummies."""

from __future__ import annotations

import ctypes
import functools
import weakref

import numpy as np

from . import backend

#: Threads per block on a GPU and in the simulator (the simulator runs a block's threads as
#: Python threads, so it gets small blocks).
GPU_BLOCK = 256
SIM_BLOCK = 32
#: Resident blocks per SM a grid-stride launch asks for on a GPU; blocks at most in the simulator.
GPU_BLOCKS_PER_SM = 4
SIM_MAX_BLOCKS = 4


def cuda():
    return backend.cuda_module()


def ensure_context() -> None:
    """Make the device's context current on the calling thread (Numba's primary context). A
    thread that has not touched the device has none, and the driver entry points this module
    calls directly (bound launches, :func:`copy_async`, graphs) would fail there with
    CUDA_ERROR_INVALID_CONTEXT: e.g. a pool built on one thread and called on another (a Dask
    worker's event loop). Numba's check is a thread-local lookup after the first call."""
    if not backend.is_simulator():
        cuda().current_context()


def default_block() -> int:
    return SIM_BLOCK if backend.is_simulator() else GPU_BLOCK


@functools.lru_cache(maxsize=None)
def sm_count() -> int:
    if backend.is_simulator():
        return 1
    return int(cuda().get_current_device().MULTIPROCESSOR_COUNT)


def grid_for(n_items: int, block: int, blocks_per_sm: int = GPU_BLOCKS_PER_SM) -> int:
    """Blocks for a grid-stride loop over ``n_items``: enough to fill the GPU, no more than needed."""
    need = max(1, -(-int(n_items) // block))
    cap = SIM_MAX_BLOCKS if backend.is_simulator() else sm_count() * blocks_per_sm
    return min(need, cap)


def check_block(block) -> int | None:
    """Validate a threads-per-block argument: None (the default) or an int in 1..1024. Returns it as
    a Python int (a numpy uint32 or int8 would wrap in the launch arithmetic), or None.

    Raises:
        ValueError: anything else (bools included).
    """
    if block is not None and (isinstance(block, (bool, np.bool_)) or not isinstance(block, (int, np.integer))
                              or not 1 <= block <= 1024):
        raise ValueError(f"block must be None or an int in 1..1024 (threads per block), got {block!r}")
    return None if block is None else int(block)


def is_device_array(x) -> bool:
    return cuda().is_cuda_array(x) if hasattr(cuda(), "is_cuda_array") else hasattr(x, "copy_to_host")


def address(x) -> int:
    """The device address of a device array's first element (the simulator: its host buffer's)."""
    if hasattr(x, "__cuda_array_interface__"):
        return int(x.__cuda_array_interface__["data"][0])
    return int(x._ary.ctypes.data)  # simulator FakeCUDAArray


_addresses: dict = {}


def persistent_address(x) -> int:
    """:func:`address` of a host or device buffer used again and again (a pool's buffers), looked
    up once and remembered while the buffer lives (a weak reference: a freed buffer's entry is
    never returned for another buffer)."""
    hit = _addresses.get(id(x))
    if hit is not None and hit[0]() is x:
        return hit[1]
    if len(_addresses) > 4096:  # drop the entries of freed buffers
        for key in [k for k, (ref, _) in _addresses.items() if ref() is None]:
            del _addresses[key]
    addr = x.ctypes.data if isinstance(x, np.ndarray) else address(x)
    _addresses[id(x)] = (weakref.ref(x), addr)
    return addr


def view1d(x, start: int, n: int):
    """``x[start:start + n]`` of a 1-D contiguous device array, built directly: numba's general
    slicing costs ~60 us of host time a slice, and every update batch's staging slices its buffer
    several times."""
    if x.ndim != 1 or not 0 <= start <= start + n <= x.shape[0]:
        raise ValueError(f"view [{start}, {start + n}) of a device array of shape {x.shape}")
    if backend.is_simulator() or n == 0:
        return x[start:start + n]
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    if not x.is_c_contiguous():
        raise ValueError("view1d takes a contiguous device array")
    item = x.dtype.itemsize
    return DeviceNDArray((n,), (item,), x.dtype, stream=x.stream,
                         gpu_data=x.gpu_data.view(start * item, (start + n) * item))


def to_device(x: np.ndarray):
    """Copy a host array to the device (a device array is returned unchanged)."""
    if is_device_array(x):
        return x
    return cuda().to_device(np.ascontiguousarray(x))


def dummy(dtype) -> object:
    """A one-element device array standing in for an argument a kernel variant ignores."""
    return _dummy(np.dtype(dtype).str)


def dummy2d(dtype) -> object:
    """A 1x1 device array standing in for a 2-D argument a kernel variant ignores."""
    return _dummy2d(np.dtype(dtype).str)


@functools.lru_cache(maxsize=None)
def _dummy2d(dtype_str: str):
    return cuda().to_device(np.zeros((1, 1), dtype=np.dtype(dtype_str)))


@functools.lru_cache(maxsize=None)
def _dummy(dtype_str: str):
    return cuda().to_device(np.zeros(1, dtype=np.dtype(dtype_str)))


def check_array(name: str, x, dtype, ndim: int | None = None, shape: tuple | None = None):
    """Validate a host or device array's dtype, rank, shape and C-contiguity.

    Raises:
        TypeError: not an array, or the wrong dtype.
        ValueError: wrong rank or shape, or not C-contiguous.
    """
    if not (isinstance(x, np.ndarray) or is_device_array(x)):
        raise TypeError(f"{name} must be a numpy or device array, got {type(x).__name__}")
    if np.dtype(x.dtype) != np.dtype(dtype):
        got = np.dtype(x.dtype)
        order = " (non-native byte order)" if got.newbyteorder("=") == np.dtype(dtype) else ""
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {got.name}{order}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
    if not _c_contiguous(x):
        raise ValueError(f"{name} must be C-contiguous")


def _c_contiguous(x) -> bool:
    if isinstance(x, np.ndarray):
        return bool(x.flags["C_CONTIGUOUS"])
    if hasattr(x, "is_c_contiguous"):
        return bool(x.is_c_contiguous())
    iface = getattr(x, "__cuda_array_interface__", {})
    strides = iface.get("strides")
    if strides is None:
        return True
    expected, step = [], np.dtype(iface["typestr"]).itemsize
    for dim in reversed(iface["shape"]):
        expected.append(step)
        step *= dim
    return tuple(reversed(expected)) == tuple(strides)


class BoundLaunch:
    """One kernel launch whose arguments are prepared once; each call only enqueues it.

    Numba's launch path types every argument and flattens each array into its fields on every
    call (tens of microseconds for a kernel of a dozen arrays). A serving loop launches the same
    kernels on the same persistent buffers call after call: binding resolves the compiled kernel
    for the arguments' types and flattens them once, and each call hands the prepared fields to the
    driver. Arguments must stay alive and keep their addresses (the object keeps them). Between
    calls, :meth:`set_array` points a 1-D array argument at a span of a persistent buffer,
    :meth:`set_scalar` changes an integer argument, :meth:`set_grid` the grid: each rewrites a
    prepared field, nothing is typed again. In the simulator a call is Numba's ordinary launch.

    Args:
        kernel: a ``cuda.jit`` dispatcher; grid, block: its launch shape; args: its arguments.
        stream: a Numba stream or 0 (the default stream).
    """

    def __init__(self, kernel, grid, block, args, stream=0):
        self.kernel, self.grid, self.block, self.args, self.stream = kernel, grid, block, list(args), stream
        self._bound = None if backend.is_simulator() else _Bound(kernel, grid, block, self.args, stream)

    def set_array(self, i: int, base, start: int, n: int, dtype=None) -> None:
        """Argument ``i`` (a 1-D array argument) becomes ``base[start : start + n]`` (``base`` a
        1-D device array of the argument's dtype). With ``dtype`` (the argument's, another than
        ``base``'s): the ``n`` values of that dtype from element ``start`` of ``base`` on (a
        float32 argument read out of an int64 staging buffer). The span must lie inside ``base``."""
        size = np.dtype(dtype if dtype is not None else base.dtype).itemsize
        if not (0 <= start and 0 <= n and start * base.dtype.itemsize + n * size <= base.nbytes):
            raise ValueError(f"span of {n} x {size} bytes from element {start} of a {base.nbytes}-byte buffer")
        if self._bound is None:
            if dtype is None:
                self.args[i] = base[start:start + n]
            else:
                span = -(-n * size // base.dtype.itemsize)
                self.args[i] = base[start:start + span].view(dtype)[:n]
        else:
            self._bound.set_array(i, persistent_address(base) + int(start) * base.dtype.itemsize, int(n))

    def set_scalar(self, i: int, value: int) -> None:
        """Integer argument ``i`` becomes ``value``."""
        if self._bound is None:
            self.args[i] = value
        else:
            self._bound.flat[self._bound.offsets[i]].value = int(value)

    def set_floats(self, i: int, values) -> None:
        """Argument ``i``, a tuple of floats (a kernel's parameter weights), takes ``values``."""
        if self._bound is None:
            self.args[i] = tuple(values)
        else:
            flat, o = self._bound.flat, self._bound.offsets[i]
            for j, v in enumerate(values):
                flat[o + j].value = float(v)

    def set_grid(self, grid) -> None:
        self.grid = grid
        if self._bound is not None:
            self._bound.set_grid(grid)

    def __call__(self) -> None:
        if self._bound is None:
            self.kernel[self.grid, self.block, self.stream](*self.args)
        else:
            self._bound.enqueue()


class Recorder:
    """The kernel launches made inside a ``with Recorder() as rec:`` block, in order, as
    ``rec.launches`` (kernel, grid, block, args); they still run unless ``run=False`` (the path is
    only recorded: the caller must not read what it would have computed). A call path recorded once
    is replayed as :class:`BoundLaunch` objects (:func:`bind_all`)."""

    def __init__(self, run: bool = True):
        self.run = run

    def __enter__(self) -> "Recorder":
        self.launches = []
        if backend.is_simulator():
            from numba.cuda.simulator.kernel import FakeCUDAKernel as target

            original = target.__call__

            def spy(kernel, *args):
                if not kernel._device:
                    self.launches.append((kernel, kernel.grid_dim, kernel.block_dim, args))
                    if not self.run:
                        return None
                return original(kernel, *args)
        else:
            from numba.cuda.dispatcher import _LaunchConfiguration as target

            original = target.__call__

            def spy(config, *args):
                self.launches.append((config.dispatcher, config.griddim, config.blockdim, args))
                return original(config, *args) if self.run else None

        self._restore = (target, original)
        target.__call__ = spy
        return self

    def __exit__(self, *exc) -> None:
        target, original = self._restore
        target.__call__ = original


def bind_all(launches) -> list:
    """:class:`BoundLaunch` objects replaying recorded launches (:class:`Recorder`)."""
    return [BoundLaunch(kernel, grid, block, args) for kernel, grid, block, args in launches]


class _Bound:
    """A bound launch on a GPU: Numba's own argument preparation, done once, each field kept as a
    ctypes value (``flat``; argument i's fields from ``offsets[i]``) behind one prepared
    ``void**`` parameter array, so a launch is one ``cuLaunchKernel`` through ctypes (about
    2 us of host time) where cuda.core's ``launch`` re-packs every field on every call (about
    10 us for a kernel of a dozen arrays). Where libcuda cannot be called directly the launch
    goes through cuda.core as Numba's ``_Kernel.launch`` does, with the same prepared values."""

    def __init__(self, kernel, grid, block, args, stream):
        from numba.cuda._compat import CUDA_CORE_GE_1_0
        from numba.cuda.cudadrv import driver

        compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
        flat, self.offsets, keep = [], [], []
        for ty, val in zip(compiled.argument_types, args):
            self.offsets.append(len(flat))
            compiled._prepare_args(ty, val, stream, keep, flat)
        if keep:  # host arrays would be copied in and back on every launch: not a bound launch
            raise TypeError("a bound launch takes device arrays only")
        self.flat = [_as_ctype(v) for v in flat]
        self._coop = {"is_cooperative" if CUDA_CORE_GE_1_0 else "cooperative_launch": compiled.cooperative}
        self._cooperative = bool(compiled.cooperative)
        self._block = block if isinstance(block, tuple) else (block,)
        self._configs: dict = {}
        self._kernel = compiled._codelibrary.get_cufunc().kernel
        self._stream = driver._to_core_stream(stream)
        self._direct = None if self._cooperative else _driver_launch(self._kernel, self._stream)
        if self._direct is not None:
            self._params = (ctypes.c_void_p * max(len(self.flat), 1))(*[ctypes.addressof(v) for v in self.flat])
            self._dims = None
        self.set_grid(grid)

    def set_grid(self, grid) -> None:
        grid = grid if isinstance(grid, tuple) else (grid,)
        if self._direct is not None:
            g, b = (*grid, 1, 1)[:3], (*self._block, 1, 1)[:3]
            self._dims = (*g, *b)
            return
        from cuda.core import LaunchConfig

        if grid not in self._configs:
            self._configs[grid] = LaunchConfig(grid=grid, block=self._block, shmem_size=0, **self._coop)
        self._config = self._configs[grid]

    def set_array(self, i: int, ptr: int, n: int) -> None:
        # a 1-D array's fields: meminfo, parent, size, itemsize, data, shape[0], strides[0]
        o = self.offsets[i]
        self.flat[o + 2].value = n
        self.flat[o + 4].value = ptr
        self.flat[o + 5].value = n

    def enqueue(self) -> None:
        if self._direct is not None:
            fn, func, stream = self._direct
            err = fn(func, *self._dims, 0, stream if _capturing is None else _capturing, self._params, None)
            if err:
                raise RuntimeError(f"cuLaunchKernel failed: {_driver_error(err)}")
            return
        if _capturing is not None:
            raise _NotCapturable("a launch through cuda.core (a cooperative kernel) is not captured")
        from cuda.core import launch as core_launch

        core_launch(self._stream, self._config, self._kernel, *self.flat)


def _as_ctype(v):
    """A kernel argument field as a ctypes value whose bytes are what cuda.core would pass for it
    (a Python int is an ``intptr_t``, a bool a C ``bool``, numpy scalars their own width)."""
    if isinstance(v, ctypes._SimpleCData):
        return v
    if isinstance(v, (bool, np.bool_)):
        return ctypes.c_bool(bool(v))
    if isinstance(v, int):
        return ctypes.c_ssize_t(v)
    if isinstance(v, float):
        return ctypes.c_double(v)
    if isinstance(v, (np.integer, np.floating)):
        return np.ctypeslib.as_ctypes_type(v.dtype)(v.item())
    raise TypeError(f"a bound launch cannot hold an argument field of type {type(v).__name__}")


@functools.lru_cache(maxsize=None)
def _libcuda():
    """libcuda's launch and copy entry points through ctypes, or None where it cannot be loaded."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    vp, u, sz = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t
    lib.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
    lib.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, vp, sz, vp]
    lib.cuMemcpyDtoHAsync_v2.argtypes = [vp, ctypes.c_uint64, sz, vp]
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    pvp = ctypes.POINTER(vp)
    lib.cuStreamCreate.argtypes = [pvp, u]
    lib.cuStreamDestroy_v2.argtypes = [vp]
    lib.cuStreamBeginCapture_v2.argtypes = [vp, ctypes.c_int]
    lib.cuStreamEndCapture.argtypes = [vp, pvp]
    lib.cuGraphInstantiateWithFlags.argtypes = [pvp, vp, ctypes.c_ulonglong]
    lib.cuGraphLaunch.argtypes = [vp, vp]
    lib.cuGraphExecDestroy.argtypes = [vp]
    lib.cuGraphDestroy.argtypes = [vp]
    lib.cuStreamSynchronize.argtypes = [vp]
    for f in (lib.cuLaunchKernel, lib.cuMemcpyHtoDAsync_v2, lib.cuMemcpyDtoHAsync_v2, lib.cuGetErrorName,
              lib.cuStreamCreate, lib.cuStreamDestroy_v2, lib.cuStreamBeginCapture_v2, lib.cuStreamEndCapture,
              lib.cuGraphInstantiateWithFlags, lib.cuGraphLaunch, lib.cuGraphExecDestroy, lib.cuGraphDestroy,
              lib.cuStreamSynchronize):
        f.restype = ctypes.c_int
    return lib


def _driver_launch(kernel, stream):
    """(cuLaunchKernel, the kernel's CUfunction in the current context, the stream's handle) as
    ctypes arguments, or None (launch through cuda.core)."""
    lib = _libcuda()
    if lib is None:
        return None
    from cuda.bindings import driver as cu

    handle = kernel.handle
    if isinstance(handle, cu.CUkernel):
        err, handle = cu.cuKernelGetFunction(handle)
        if err != cu.CUresult.CUDA_SUCCESS:
            return None
    return lib.cuLaunchKernel, ctypes.c_void_p(int(handle)), ctypes.c_void_p(int(stream.handle))


def _driver_error(code: int) -> str:
    name = ctypes.c_char_p()
    lib = _libcuda()
    if lib is not None and lib.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
        return f"{name.value.decode()} ({code})"
    return f"CUresult {code}"


#: CUresult of a driver call made on a thread with no current context
_INVALID_CONTEXT = 201


def synchronize() -> None:
    """Wait for the default stream (the one :func:`copy_async`, bound launches and graphs enqueue
    on) through libcuda: Numba's ``default_stream().synchronize()`` first asks the driver for the
    thread's context (its ``require_context`` wrapper), tens of microseconds of a serving call's
    host time. A thread with no current context gets Numba's (which makes it current) and tries
    again. The simulator runs everything at once: nothing to wait for."""
    if backend.is_simulator():
        return
    lib = _libcuda()
    if lib is None:
        cuda().default_stream().synchronize()
        return
    err = lib.cuStreamSynchronize(None)
    if err == _INVALID_CONTEXT:
        ensure_context()
        err = lib.cuStreamSynchronize(None)
    _check(err, "cuStreamSynchronize")


def copy_async(dst, src, nbytes: int, src_offset: int = 0) -> None:
    """Enqueue a copy of ``nbytes`` of ``src`` from byte ``src_offset`` on into the start of
    ``dst`` on the default stream, one of them a pinned host array and the other a device array
    (either direction), both persistent buffers (:func:`persistent_address`), without Numba's
    per-copy checks (a serving loop copies the same buffers every call). The simulator copies at
    once."""
    if any(isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) for x in (nbytes, src_offset)):
        raise ValueError(f"copy of {nbytes!r} bytes from byte {src_offset!r}: both must be ints")
    nbytes, src_offset = int(nbytes), int(src_offset)
    if not (0 <= src_offset and 0 <= nbytes and src_offset + nbytes <= src.nbytes and nbytes <= dst.nbytes):
        raise ValueError(f"copy of {nbytes} bytes from byte {src_offset} of a {src.nbytes}-byte buffer into a "
                         f"{dst.nbytes}-byte one")
    if nbytes == 0:
        return
    if backend.is_simulator():
        d = dst if isinstance(dst, np.ndarray) else dst._ary
        s = src if isinstance(src, np.ndarray) else src._ary
        d.reshape(-1).view(np.uint8)[:nbytes] = s.reshape(-1).view(np.uint8)[src_offset:src_offset + nbytes]
        return
    lib = _libcuda()
    dev_to_host = isinstance(dst, np.ndarray)
    if lib is not None:
        if dev_to_host:
            err = lib.cuMemcpyDtoHAsync_v2(persistent_address(dst), persistent_address(src) + src_offset, nbytes,
                                           _capturing)
        else:
            err = lib.cuMemcpyHtoDAsync_v2(persistent_address(dst), persistent_address(src) + src_offset, nbytes,
                                           _capturing)
        if err:
            raise RuntimeError(f"asynchronous copy of {nbytes} bytes failed: {_driver_error(err)}")
        return
    if _capturing is not None:
        raise _NotCapturable("copies are captured through libcuda only")
    from cuda.bindings import driver as cu

    if dev_to_host:
        (err,) = cu.cuMemcpyDtoHAsync(persistent_address(dst), persistent_address(src) + src_offset, nbytes, 0)
    else:
        (err,) = cu.cuMemcpyHtoDAsync(persistent_address(dst), persistent_address(src) + src_offset, nbytes, 0)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"asynchronous copy of {nbytes} bytes failed: {err}")


# ----------------------------------------------------------------------------- CUDA graphs

#: the stream being captured into a graph (:func:`capture_graph`), or None: while set, bound
#: launches and :func:`copy_async` enqueue on it instead of their own stream
_capturing = None


class _NotCapturable(RuntimeError):
    pass


class Graph:
    """Launches and copies captured once (:func:`capture_graph`) and replayed by one
    ``cuGraphLaunch`` on the default stream: a serving call's fixed sequence of a dozen launches and
    copies costs the host one driver call instead of one each. The captured nodes keep
    their arguments and buffers: what changes between calls is the buffers' contents."""

    def __init__(self, exec_handle, graph_handle):
        self._exec = exec_handle
        weakref.finalize(self, _destroy_graph, exec_handle, graph_handle)

    def __call__(self) -> None:
        err = _libcuda().cuGraphLaunch(self._exec, None)
        if err:
            raise RuntimeError(f"cuGraphLaunch failed: {_driver_error(err)}")


def _destroy_graph(exec_handle, graph_handle) -> None:
    lib = _libcuda()
    lib.cuGraphExecDestroy(exec_handle)
    lib.cuGraphDestroy(graph_handle)


def capture_graph(steps) -> Graph | None:
    """The calls ``steps`` (each enqueueing :class:`BoundLaunch` launches or :func:`copy_async`
    copies, nothing else) captured as one :class:`Graph`, or None where graphs are not available:
    the simulator, no libcuda, or a step that cannot be captured (a cooperative launch). Nothing
    runs while capturing; the capture stream is a non-blocking one of its own, so no other work
    enqueued on other streams joins the graph. Not thread-safe: while one thread captures, bound
    launches and :func:`copy_async` copies of every thread go to the capture stream (the package
    calls it from one thread)."""
    global _capturing
    lib = None if backend.is_simulator() else _libcuda()
    if lib is None or _capturing is not None:
        return None
    stream = ctypes.c_void_p()
    _check(lib.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")  # CU_STREAM_NON_BLOCKING
    graph, ok = ctypes.c_void_p(), False
    try:
        _check(lib.cuStreamBeginCapture_v2(stream, 2), "cuStreamBeginCapture")  # relaxed: this thread's calls only
        _capturing = stream
        try:
            for step in steps:
                step()
            ok = True
        except _NotCapturable:
            pass
        finally:
            _capturing = None
            end = lib.cuStreamEndCapture(stream, ctypes.byref(graph))
        if not ok:
            if graph.value:
                lib.cuGraphDestroy(graph)
            return None
        _check(end, "cuStreamEndCapture")
        exec_handle = ctypes.c_void_p()
        err = lib.cuGraphInstantiateWithFlags(ctypes.byref(exec_handle), graph, 0)
        if err:
            lib.cuGraphDestroy(graph)
            _check(err, "cuGraphInstantiate")
        return Graph(exec_handle, graph)
    finally:
        lib.cuStreamDestroy_v2(stream)


def _check(err: int, what: str) -> None:
    if err:
        raise RuntimeError(f"{what} failed: {_driver_error(err)}")
