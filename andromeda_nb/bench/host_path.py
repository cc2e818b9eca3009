"""A diagnostic of a warm public call's host work: what :func:`~andromeda_nb.score.score_topk`
costs the host before and around its launches (input checks, the math choice, the range checks,
the weight images, the answer's copies), with the recorded launches stubbed out so that no device
time is counted. It runs on any backend, the simulator included, so a change to the host path can
be measured on a machine without a GPU; the GPU rows' own split (``bench pipeline``'s
``score_topk`` notes) is the figure that counts.

Usage::

    NUMBA_ENABLE_CUDASIM=1 python -m andromeda_nb.bench.host_path [--calls 300] [--repeats 3] [--n-ads 4096]

prints, per table dtype and ``math`` setting, the median over ``repeats`` of the mean host time of
``calls`` warm calls (microseconds), and checks each configuration's first answer against the
reference top-k of its own scores.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

N_ADS, D, E, K, TOP = 4096, 64, 6, 2, 100
#: The fewest ads whose seed can rank k = TOP in a sample of m scores (its rank 2.5 k m / n at most
#: m / 4, so n >= 10 k): fewer take the block path, with no replay to stub.
MIN_N_ADS = 10 * TOP


def host_times(calls: int = 300, repeats: int = 3, seed: int = 0, n_ads: int = N_ADS) -> list[dict]:
    """One row per (table dtype, math): ``us_per_call`` and ``verified``."""
    import andromeda_nb as anb
    from .. import reference
    from ..score import api
    from ..topk.config import TopKConfig, TopKTuning
    from ..topk.seed import SeedWorkspace

    rng = np.random.default_rng(seed)
    seeded = TopKConfig(tuning=TopKTuning(max_sample_chunks=16, sample_chunk=16, seed_min_n=256))  # the filter path
    if SeedWorkspace.make(n_ads, TOP, config=seeded) is None:  # no seed: the block path, no replay to stub
        raise ValueError(f"n_ads={n_ads}: too few ads for the filter path's seed at k={TOP} (at least {MIN_N_ADS})")
    req = anb.Request.random(D, E, K, rng)
    rows = []
    for dtype in ("fp16", "int8"):
        table = anb.AdTable.from_float(rng.standard_normal((n_ads, D)), rng.standard_normal(n_ads), dtype=dtype,
                                       ad_ids=np.arange(n_ads))
        dt = anb.DeviceAdTable(table, "tiles")
        for math in ("auto", "fp16"):
            cfg = anb.KernelConfig(math=math)
            top = anb.score_topk(req, dt, TOP, config=cfg, topk_config=seeded)  # records the launches
            want = reference.topk(anb.score_ads(req, dt, config=cfg).copy_to_host(), TOP, ids=table.ad_ids)
            ok = np.array_equal(top.ids, want.ids) and np.array_equal(top.scores, want.scores)
            run = api._Replay.run
            replayed = []
            # the launches stubbed (host work only); the answer's copies stay the caller's, as without a graph
            api._Replay.run = lambda self, inputs, copy_answer=None: replayed.append(1) or False
            try:
                means = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        anb.score_topk(req, dt, TOP, config=cfg, topk_config=seeded)
                    means.append((time.perf_counter() - t0) / calls)
            finally:
                api._Replay.run = run
            if len(replayed) != repeats * calls:  # a call left the replay: its launches were timed too
                raise RuntimeError(f"{dtype} math={math}: {repeats * calls - len(replayed)} calls did not replay")
            rows.append({"dtype": dtype, "math": math, "us_per_call": 1e6 * statistics.median(means),
                         "verified": "ok" if ok else "FAILED"})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n-ads", type=int, default=N_ADS, help=f"the table's ads (at least {MIN_N_ADS}: the filter path)")
    args = ap.parse_args(argv)
    rows = host_times(args.calls, args.repeats, n_ads=args.n_ads)
    for r in rows:
        print(f"{r['dtype']:5s} math={r['math']:5s} {r['us_per_call']:8.1f} us a warm score_topk call "
              f"(launches stubbed; {r['verified']})")
    return 0 if all(r["verified"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
