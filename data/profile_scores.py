"""Launches to profile under Nsight Compute (``bash data/gpu_session.sh ncu``): the gated E6 K2 d64
scores-to-memory kernel (``score_ads`` on the whole pool, default config) on fp16 and int8 tables,
and on int8 rows through the shared-memory ring of 3 and of 2 rounds a warp (``ring_stages``, blocks
of 128, four an SM). Each case launches twice (the first compiles); ncu profiles every launch of a
``fused_`` kernel, so read each case's second.

Usage: python data/profile_scores.py [N_ADS]   (4 x 10^7 ads by default: 2.7-5.1 GB, far past L2;
under the simulator, NUMBA_ENABLE_CUDASIM=1, a few hundred ads check the script itself)
"""

import sys

import numpy as np

import andromeda_nb as anb
from andromeda_nb.device import backend, launch
from andromeda_nb.score.api import score_ads
from andromeda_nb.score.table import DeviceAdTable


def table_of(n: int, dtype: str) -> DeviceAdTable:
    """A random table in the tiles layout: made on the GPU (cupy), or on the host under the simulator."""
    if backend.is_simulator():
        rng = np.random.default_rng(1)
        return DeviceAdTable(anb.AdTable.from_float(rng.standard_normal((n, 64)), dtype=dtype), "tiles")
    from andromeda_nb.bench.tables import gpu_table

    return gpu_table(n, 64, dtype, "tiles")


n = int(sys.argv[1]) if len(sys.argv) > 1 else 40_000_000
request = anb.Request.random(64, 6, 2, np.random.default_rng(0))
cases = [("fp16", "default", anb.KernelConfig()), ("int8", "default", anb.KernelConfig()),
         ("int8", "ring_stages=3", anb.KernelConfig(block=128, blocks_per_sm=4, ring_stages=3)),
         ("int8", "ring_stages=2", anb.KernelConfig(block=128, blocks_per_sm=4, ring_stages=2))]
for dtype, label, config in cases:
    table = table_of(n, dtype)
    for _ in range(2):  # the first launch compiles; ncu profiles both, read the second
        out = score_ads(request, table, config=config)
    launch.cuda().synchronize()
    print(f"{dtype} {label}: scores finite: {bool(np.isfinite(out.copy_to_host()).all())}")
    del table, out
