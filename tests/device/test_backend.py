"""Backend selection errors are clear."""

import pytest

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
