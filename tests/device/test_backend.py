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
