"""Every kernel variant compiles for a real GPU (sm_90) with no local-memory traffic.

The simulator type-checks nothing; this compiles with NVVM in a subprocess with the simulator off.
"""

import importlib.metadata
import os
import subprocess
import sys

import pytest


def _nvvm_available() -> bool:
    try:
        importlib.metadata.version("nvidia-nvvm")
        importlib.metadata.version("nvidia-cuda-nvrtc")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _nvvm_available(), reason="NVVM wheels not installed (pip install -e '.[test]')")
def test_all_kernels_compile_for_sm90_without_local_memory():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    proc = subprocess.run([sys.executable, "-m", "andromeda_nb.device.ptxcheck", "--quick"], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ok")]
    assert len(lines) >= 10
    assert not [line for line in lines if "local memory" in line], "a kernel spills to local memory"
