"""A faster block barrier for Numba's CUDA simulator (simulator only; never touches the GPU path).

numba-cuda 0.30's simulator runs a block's threads as Python threads and implements
``syncthreads`` with a manager thread that busy-polls every thread under the GIL: a barrier costs
milliseconds to tens of milliseconds, and the block top-K (tens of barriers per round) crawls. This
shim replaces the block runner with one where threads wait on a condition-variable barrier, and the
launching thread simply joins them. Semantics kept from the original: a thread that has exited no
longer counts toward the barrier; an exception in any thread aborts the block and is re-raised with
its thread and block index. ``syncthreads_count/and/or`` keep working (they call ``syncthreads``).

It patches private classes of ``numba.cuda.simulator.kernel`` (numba-cuda pinned to 0.30.x) and
checks that they still have the shape it expects; if not, it leaves the simulator untouched.
"""

from __future__ import annotations

import threading

import numpy as np

_installed = False


class BlockBarrier:
    """A reusable barrier for ``n`` threads where exited threads stop counting."""

    def __init__(self, n: int):
        self.n = n
        self.count = 0
        self.generation = 0
        self.broken = False
        self.cond = threading.Condition()

    def _release(self):
        self.count = 0
        self.generation += 1
        self.cond.notify_all()

    def wait(self):
        with self.cond:
            if self.broken:
                raise RuntimeError("block aborted: another thread of the block raised")
            gen = self.generation
            self.count += 1
            if self.count >= self.n:
                self._release()
                return
            while gen == self.generation and not self.broken:
                self.cond.wait()
            if self.broken:
                raise RuntimeError("block aborted: another thread of the block raised")

    def leave(self):
        with self.cond:
            self.n -= 1
            if self.n > 0 and self.count >= self.n:
                self._release()

    def abort(self):
        with self.cond:
            self.broken = True
            self.cond.notify_all()


def install() -> bool:
    """Patch the simulator's block runner (idempotent). Returns True when the shim is active."""
    global _installed
    if _installed:
        return True
    from numba.cuda.simulator import kernel as simkernel

    BlockThread = getattr(simkernel, "BlockThread", None)
    BlockManager = getattr(simkernel, "BlockManager", None)
    if BlockThread is None or BlockManager is None or not hasattr(BlockThread, "syncthreads"):
        return False
    original_sync = BlockThread.syncthreads
    original_thread_run = BlockThread.run

    def syncthreads(self):
        barrier = getattr(self, "_anb_barrier", None)
        if barrier is None:
            return original_sync(self)
        barrier.wait()

    def thread_run(self):
        try:
            original_thread_run(self)
        finally:
            barrier = getattr(self, "_anb_barrier", None)
            if barrier is not None:
                if self.exception is not None:
                    barrier.abort()
                else:
                    barrier.leave()

    def manager_run(self, grid_point, *args):
        points = list(np.ndindex(*self._block_dim))
        barrier = BlockBarrier(len(points))

        def target():
            self._f(*args)

        threads = []
        for block_point in points:
            t = BlockThread(target, self, grid_point, block_point, self._debug)
            t._anb_barrier = barrier
            threads.append(t)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # report the root cause, not the "block aborted" echoes of the other threads
        failed = [t for t in threads if t.exception is not None]
        root = [t for t in failed if "block aborted" not in str(t.exception[0])]
        for t in root or failed:
            raise t.exception[0].with_traceback(t.exception[1])

    BlockThread.syncthreads = syncthreads
    BlockThread.run = thread_run
    BlockManager.run = manager_run
    _patch_shared_allocation()
    _installed = True
    return True


def _patch_shared_allocation() -> None:
    """Make the simulator's ``cuda.shared.array`` allocation atomic. It looks the array up by the
    calling line and creates it when missing, unlocked: two threads of a block reaching the line
    together could each create one, and the one left out wrote to a private copy its block never
    saw (found by poisoning uninitialised shared memory: a plain prefix sum then read garbage)."""
    import sys
    import traceback

    from numba.cuda.simulator import kernelapi

    shared = getattr(kernelapi, "FakeCUDAShared", None)
    if shared is None or getattr(shared, "_anb_locked", False):
        return
    original = shared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory, or the original's error
            return original(self, shape, dtype, alignment)
        caller = tuple(traceback.extract_stack(sys._getframe(1), limit=1)[0])[0:2]
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                from numba.core import types
                from numba.np import numpy_support

                dt = numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else np.dtype(dtype)
                res = kernelapi.np.empty(shape, dt)  # (tests poison it through kernelapi.np)
                self._allocations[caller] = res
        return res

    shared.array = array
    shared._anb_locked = True
