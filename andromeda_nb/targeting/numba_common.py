"""Shared set-up of the Numba host (CPU) kernels: the backend is fixed before ``numba`` is
imported, then the inline helpers every kernel module uses.

Numba reads ``NUMBA_ENABLE_CUDASIM`` when it is first imported, so importing this module fixes the
backend first (:func:`andromeda_nb.device.backend.get_backend`, ``"auto"`` unless set). The kernel
modules (``build_kernels``, ``update_kernels``, ``cpu_kernels``) import it first and are themselves
imported inside the functions that call them, never at package import: ``import andromeda_nb``
stays free of numba. Each module-level ``@njit`` function compiles on its first call and caches the
machine code on disk (``cache=True``, in ``__pycache__``): every later process (test workers,
notebook kernels) loads it instead of compiling again, ~20 s a process. Numba re-compiles when the
function's own file changes, not when an inlined helper of another file does: after editing this
module, delete the ``__pycache__/*.nbi`` / ``*.nbc`` files of the kernel modules.
"""

from ..device import backend

backend.get_backend()

from numba import njit, uint64  # noqa: E402  (after the backend is fixed)

M1, M2, M4 = uint64(0x5555555555555555), uint64(0x3333333333333333), uint64(0x0F0F0F0F0F0F0F0F)
H01 = uint64(0x0101010101010101)
ONE, ALL = uint64(1), uint64(0xFFFFFFFFFFFFFFFF)


@njit(inline="always")
def popc(x):
    """Set bits of a uint64 (SWAR popcount)."""
    x = x - ((x >> uint64(1)) & M1)
    x = (x & M2) + ((x >> uint64(2)) & M2)
    x = (x + (x >> uint64(4))) & M4
    return (x * H01) >> uint64(56)


@njit(inline="always")
def valid_mask(w, n_words, n):
    """The valid bits of word ``w`` of an ``n``-bit bitset of ``n_words`` words."""
    if w == n_words - 1 and n % 64 != 0:
        return (ONE << uint64(n % 64)) - ONE
    return ALL


def threads() -> int:
    """Threads Numba's parallel loops use (the update path sizes its parallel chunks by it)."""
    import numba

    return int(numba.get_num_threads())
