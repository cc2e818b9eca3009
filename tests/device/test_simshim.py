"""The simulator barrier shim keeps syncthreads semantics (runs only under the simulator)."""

import numpy as np
import pytest

from andromeda_nb.device import backend, launch

from ..helpers import poison_shared_memory

if backend.is_simulator():  # the simulator swaps module-level `cuda` names inside kernels
    from numba import cuda, int32

pytestmark = pytest.mark.skipif(not backend.is_simulator(), reason="simulator-only shim")


def test_barrier_orders_phases():
    @cuda.jit
    def rotate(out, rounds):
        sh = cuda.shared.array(32, int32)
        t = cuda.threadIdx.x
        sh[t] = t
        for _ in range(rounds):
            cuda.syncthreads()
            v = sh[(t + 1) % 32]
            cuda.syncthreads()
            sh[t] = v
        cuda.syncthreads()
        out[t] = sh[t]

    out = np.zeros(32, np.int32)
    rotate[1, 32](out, 5)
    np.testing.assert_array_equal(out, (np.arange(32) + 5) % 32)


def test_exception_in_one_thread_propagates_without_deadlock():
    @cuda.jit
    def boom(out):
        t = cuda.threadIdx.x
        if t == 3:
            raise ValueError("thread three failed")
        cuda.syncthreads()
        out[t] = 1

    with pytest.raises(ValueError, match="thread three failed"):
        boom[1, 8](np.zeros(8))


def test_exited_threads_stop_counting():
    @cuda.jit
    def early_exit(out):
        t = cuda.threadIdx.x
        if t < 4:
            return
        cuda.syncthreads()
        out[t] = cuda.syncthreads_count(1)

    out = np.zeros(8, np.int64)
    early_exit[1, 8](out)
    np.testing.assert_array_equal(out, [0, 0, 0, 0, 4, 4, 4, 4])


def _prefix_sum_kernel():
    """A ping-pong prefix sum over two shared arrays (module level: the simulator swaps the
    ``cuda`` global for its fake module while a kernel runs)."""
    from numba import int32

    @cuda.jit
    def prefix(out):
        a = cuda.shared.array(256, int32)
        b = cuda.shared.array(256, int32)
        h = cuda.threadIdx.x
        while h < 256:
            a[h] = 1
            h += cuda.blockDim.x
        cuda.syncthreads()
        off = 1
        while off < 256:
            h = cuda.threadIdx.x
            while h < 256:
                b[h] = a[h] + (a[h + off] if h + off < 256 else 0)
                h += cuda.blockDim.x
            cuda.syncthreads()
            h = cuda.threadIdx.x
            while h < 256:
                a[h] = b[h] + (b[h + 2 * off] if h + 2 * off < 256 else 0)
                h += cuda.blockDim.x
            cuda.syncthreads()
            off *= 4
        if cuda.threadIdx.x == 0:
            out[0] = a[0]


    return prefix


def test_shared_arrays_are_one_per_block_under_racing_threads(monkeypatch):
    """Every thread of a block gets the same shared array even when they reach the allocating
    line together (the simulator's unlocked lookup-then-create once gave a thread a private copy:
    with uninitialised memory poisoned, a plain ping-pong prefix sum then read garbage)."""
    import warnings

    if not launch.backend.is_simulator():
        pytest.skip("simulator only")
    poison_shared_memory(monkeypatch)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an int32 overflow means a poisoned value was read
        for _ in range(30):
            out = launch.cuda().to_device(np.zeros(1, np.int32))
            _prefix_sum_kernel()[1, 32](out)
            assert out.copy_to_host()[0] == 256
