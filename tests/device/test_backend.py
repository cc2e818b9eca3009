"""Backend selection errors are clear."""

import pytest
from numba import cuda

from andromeda_nb.device import backend


def test_unknown_backend():
    with pytest.raises(ValueError, match="one of"):
        backend.set_backend("tpu")


def test_switching_after_import_is_refused():
    other = "cuda" if backend.get_backend() == "cudasim" else "cudasim"
    backend.cuda_module()
    with pytest.raises(RuntimeError, match="(?i)restart"):
        backend.set_backend(other)
    assert backend.set_backend("auto") == backend.get_backend()


def test_view1d_is_the_slice(rng):
    """launch.view1d: the same elements as the slice, writes land in the parent, bounds and shape
    checked (on a GPU: the directly built view; in the simulator: the slice itself)."""
    import numpy as np

    from andromeda_nb.device import launch

    host = rng.integers(-2 ** 40, 2 ** 40, 300).astype(np.int64)
    dev = launch.to_device(host)
    for start, n in ((0, 300), (37, 1), (299, 1), (5, 0), (100, 150)):
        np.testing.assert_array_equal(launch.view1d(dev, start, n).copy_to_host(), host[start:start + n])
    launch.view1d(dev, 10, 3).copy_to_device(np.array([7, 8, 9], np.int64))
    want = host.copy()
    want[10:13] = [7, 8, 9]
    np.testing.assert_array_equal(dev.copy_to_host(), want)
    for start, n in ((290, 11), (-3, 2), (2, -1), (301, 0)):
        with pytest.raises(ValueError, match="view"):
            launch.view1d(dev, start, n)
    with pytest.raises(ValueError, match="view"):
        launch.view1d(launch.to_device(host.reshape(3, 100)), 0, 1)


@cuda.jit
def _take(out, src):
    i = cuda.grid(1)
    if i < src.shape[0]:
        out[i] = src[i]


@pytest.mark.parametrize("dtype", ["int64", "float32", "uint64"])
def test_bound_launch_points_an_argument_into_an_int64_buffer(rng, dtype):
    """BoundLaunch.set_array: a 1-D argument pointed at a span of an int64 staging buffer, of the
    buffer's dtype or read as another (float32 bias values, uint64 row words), call after call."""
    import numpy as np

    from andromeda_nb.device import launch

    host = rng.integers(-2 ** 62, 2 ** 62, 64).astype(np.int64)
    buf = launch.to_device(host)
    out = launch.to_device(np.zeros(40, dtype))
    run = launch.BoundLaunch(_take, 1, 64, (out, launch.dummy(dtype)))
    for start, n in ((0, 40), (3, 17), (63, 1) if dtype != "float32" else (63, 2), (10, 0)):
        out.copy_to_device(np.zeros(40, dtype))
        run.set_array(1, buf, start, n, None if dtype == "int64" else dtype)
        run()
        want = host[start:].view(dtype)[:n]
        got = out.copy_to_host()
        np.testing.assert_array_equal(got[:n], want)
        assert not got[n:].any()
    size = np.dtype(dtype).itemsize
    for start, n in ((-3, 2), (2, -1), (64, 1), (0, 64 * 8 // size + 1), (63, 16 // size + 1)):
        with pytest.raises(ValueError, match="span of"):  # on a GPU it would read past the buffer
            run.set_array(1, buf, start, n, None if dtype == "int64" else dtype)


def test_copy_async_copies_from_a_byte_offset(rng):
    """launch.copy_async: device to pinned host from a byte offset, and a span past either
    buffer refused before anything is enqueued."""
    import numpy as np

    from andromeda_nb.device import launch

    host = rng.integers(-2 ** 62, 2 ** 62, 50).astype(np.int64)
    dev = launch.to_device(host)
    pinned = launch.cuda().pinned_array(20, np.int64)
    pinned[:] = 0
    launch.copy_async(pinned, dev, 8 * 7, src_offset=8 * 33)
    launch.cuda().synchronize()
    np.testing.assert_array_equal(pinned[:7], host[33:40])
    assert not pinned[7:].any()
    for n, off in ((8 * 7, 8 * 44), (8 * 21, 0), (8, -8), (-16, 0), (7.9, 0), (8, 8.7), (True, 0)):
        with pytest.raises(ValueError, match="copy of"):
            launch.copy_async(pinned, dev, n, src_offset=off)
    launch.copy_async(pinned, dev, 0, src_offset=8 * 50)  # nothing to copy, from the end: fine


def test_synchronize_waits_through_libcuda_and_makes_a_thread_current_first(monkeypatch):
    """launch.synchronize on a GPU: one cuStreamSynchronize of the default stream; on a thread with
    no current context (CUDA_ERROR_INVALID_CONTEXT) it makes Numba's current and waits again; any
    other error is raised with the driver's name; without libcuda, Numba's default stream waits. (A
    fake driver here: the simulator has none.)"""
    from andromeda_nb.device import launch

    calls = []

    class Driver:
        def __init__(self, results):
            self.results = list(results)

        def cuStreamSynchronize(self, stream):
            calls.append(("sync", stream))
            return self.results.pop(0)

        def cuGetErrorName(self, code, name):
            return 1  # no name: the message gives the code

    monkeypatch.setattr(launch.backend, "is_simulator", lambda: False)
    monkeypatch.setattr(launch, "ensure_context", lambda: calls.append(("context",)))
    for results, want in (([0], [("sync", None)]),
                          ([launch._INVALID_CONTEXT, 0], [("sync", None), ("context",), ("sync", None)])):
        calls.clear()
        monkeypatch.setattr(launch, "_libcuda", lambda d=Driver(results): d)
        launch.synchronize()
        assert calls == want
    monkeypatch.setattr(launch, "_libcuda", lambda d=Driver([700]): d)
    with pytest.raises(RuntimeError, match="cuStreamSynchronize failed: CUresult 700"):
        launch.synchronize()

    class Numba:
        def default_stream(self):
            return self

        def synchronize(self):
            calls.append(("numba",))

    calls.clear()
    monkeypatch.setattr(launch, "_libcuda", lambda: None)
    monkeypatch.setattr(launch, "cuda", lambda: Numba())
    launch.synchronize()
    assert calls == [("numba",)]
