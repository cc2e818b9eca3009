"""Test setup: the CUDA simulator unless ANDROMEDA_TEST_BACKEND=cuda (a GPU run of the same suite).

The backend must be fixed before anything imports numba.cuda, so this runs first.
"""

import os

BACKEND = os.environ.get("ANDROMEDA_TEST_BACKEND", "cudasim")
if BACKEND == "cudasim":
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import andromeda_nb  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

andromeda_nb.set_backend(BACKEND)

# The simulator is slow: few examples, no deadline. A GPU run can afford more.
settings.register_profile(
    "sim", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False
)
settings.register_profile("gpu", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("sim" if BACKEND == "cudasim" else "gpu")


def pytest_collection_modifyitems(config, items):
    if BACKEND == "cudasim":
        skip = pytest.mark.skip(reason="needs a real GPU (ANDROMEDA_TEST_BACKEND=cuda)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def rng(request):
    """A fresh seeded generator per test; the seed is printed on failure, and
    ``ANDROMEDA_TEST_SEED=<seed>`` gives every test that seed again (to reproduce a failure)."""
    import numpy as np

    fixed = os.environ.get("ANDROMEDA_TEST_SEED")
    seed = int(fixed) if fixed else int.from_bytes(os.urandom(4), "little")
    print(f"rng seed = {seed}")
    return np.random.default_rng(seed)
