"""Backend selection: a real GPU (``"cuda"``) or Numba's CUDA simulator (``"cudasim"``).

Numba decides between the real CUDA target and the simulator once, when ``numba.cuda`` is first
imported (it reads ``NUMBA_ENABLE_CUDASIM``). This package therefore never imports ``numba.cuda``
at package import time: the modules that hold kernels are imported on first use, after
:func:`set_backend` (or the automatic choice) has fixed the environment variable.

``"auto"`` picks ``"cuda"`` when the CUDA driver reports at least one device, else ``"cudasim"``;
``NUMBA_ENABLE_CUDASIM=1`` in the environment forces the simulator.
"""

from __future__ import annotations

import ctypes
import os
import sys

BACKENDS = ("auto", "cuda", "cudasim")

_chosen: str | None = None


def gpu_present() -> bool:
    """True when the CUDA driver (``libcuda``) loads and reports at least one device.

    Asks the driver through ctypes, so it does not import ``numba.cuda``.
    """
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            if lib.cuInit(0) != 0:
                return False
            count = ctypes.c_int(0)
            return lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
        except AttributeError:
            return False
    return False


def _loaded_backend() -> str | None:
    """The backend ``numba.cuda`` was imported with, or None when it is not imported yet."""
    if "numba.cuda" not in sys.modules:
        return None
    from numba.cuda.core import config

    return "cudasim" if config.ENABLE_CUDASIM else "cuda"


def resolve(name: str = "auto") -> str:
    """Turn a backend name into ``"cuda"`` or ``"cudasim"`` without importing ``numba.cuda``.

    Raises:
        ValueError: unknown name.
    """
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name != "auto":
        return name
    loaded = _loaded_backend()
    if loaded is not None:
        return loaded
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return "cudasim"
    return "cuda" if gpu_present() else "cudasim"


def set_backend(name: str = "auto") -> str:
    """Fix the backend for this process and return it (``"cuda"`` or ``"cudasim"``).

    Call before the first kernel runs (notebooks call it right after their parameters cell).

    Raises:
        ValueError: unknown name.
        RuntimeError: ``numba.cuda`` was already imported with the other backend (restart the
            process or kernel, or set ``NUMBA_ENABLE_CUDASIM`` before starting it); or ``"cuda"``
            was asked for and no GPU is visible.
    """
    global _chosen
    want = resolve(name)
    loaded = _loaded_backend()
    if loaded is not None and loaded != want:
        raise RuntimeError(
            f"backend {want!r} requested, but numba.cuda was already imported as {loaded!r} in this "
            "process; Numba fixes the choice at its first import. Restart the Python process "
            "(or Jupyter kernel) and call andromeda_nb.set_backend() before any kernel runs."
        )
    if loaded is None:
        if want == "cuda" and not gpu_present():
            raise RuntimeError("backend 'cuda' requested but the CUDA driver reports no GPU")
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if want == "cudasim" else "0"
    if want == "cudasim":
        from . import simshim

        simshim.install()
    _chosen = want
    return want


def get_backend() -> str:
    """The backend in force, choosing ``"auto"`` on first call."""
    return _chosen if _chosen is not None else set_backend("auto")


def cuda_module():
    """Import and return ``numba.cuda`` after the backend is fixed."""
    get_backend()
    from numba import cuda

    return cuda


def is_simulator() -> bool:
    """True when kernels run in Numba's CUDA simulator."""
    return get_backend() == "cudasim"


def device_name() -> str:
    """A human-readable name of the device kernels run on (``"cudasim"`` in the simulator)."""
    cuda = cuda_module()
    if is_simulator():
        return "cudasim (Numba CUDA simulator, CPU)"
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)
