"""The simulator barrier shim keeps syncthreads semantics (runs only under the simulator)."""

import numpy as np
import pytest

from andromeda_nb import backend

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
