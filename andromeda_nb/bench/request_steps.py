"""Diagnostics of two request-path steps, device time alone (CUDA events behind a busy kernel):

- the candidate gather (:func:`~andromeda_nb.pipeline.kernels.gather_candidates_kernel`): B
  eligible bitsets of ``n`` slots at ``density`` into candidate lists, against the bytes it moves
  (the bitset read, the list written);
- the final of a batch's filter buffers (:func:`~andromeda_nb.topk.final.launch_final`): the rank
  final against the radix select (``TopKConfig.final``) for batches of 1 to 32, each request
  holding about ``kept`` candidates of a pool of ``n`` ids (the auto rule's measurement).

Each row checks its own output (``verified``). Usage (a GPU host)::

    python -m andromeda_nb.bench.request_steps --out DIR [--n 100000000]

writes ``DIR/request_steps.csv`` and prints it as a table.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from . import harness

BATCHES = (1, 2, 4, 8, 16, 32)


def gather_rows(n: int, density: float, batches=BATCHES, reps: int = 15) -> list[dict]:
    """The candidate gather's device time per batch size, checked against numpy on request 0 and
    the last one."""
    from ..device import launch
    from ..pipeline.kernels import GATHER_BLOCK, GATHER_WORDS, gather_candidates_kernel, reset_kernel

    cuda = launch.cuda()
    sim = launch.backend.is_simulator()
    block, words = (launch.default_block(), 2) if sim else (GATHER_BLOCK, GATHER_WORDS)
    n_words = -(-n // 64)
    rng = np.random.default_rng(7)
    B = max(batches)
    host = np.zeros((B, n_words), np.uint64)
    dense = np.zeros(n_words * 64, bool)
    for b in range(B):  # about density * n set bits, at random places
        dense[:] = False
        dense[rng.integers(0, n, int(density * n))] = True
        host[b] = np.packbits(dense, bitorder="little").view(np.uint64)
    bits = cuda.to_device(host)
    cap = int(2 * density * n) + 1024
    cand = cuda.device_array((B, cap), np.int32)
    count, ks = cuda.device_array(B, np.int64), cuda.device_array(B, np.int64)
    reset = reset_kernel()
    kernel = gather_candidates_kernel(block, words)
    tiles = -(-n_words // (block * words))
    resident = launch.SIM_MAX_BLOCKS if sim else launch.sm_count() * max(1, 2048 // block)
    rows = []
    for b in batches:
        grid = (max(1, min(tiles, resident // b)), b)

        def step():
            reset[1, 32](count, ks, B, 0)
            kernel[grid, block](bits, n_words, cand, count)

        t = harness.time_device(step, reps=reps) if not sim else None
        step()
        launch.cuda().synchronize()
        got = count.copy_to_host()[:b]
        want = np.array([int(np.unpackbits(host[i].view(np.uint8)).sum()) for i in range(b)])
        lists = cand.copy_to_host()
        ok = bool((got == want).all()) and all(
            np.array_equal(np.sort(lists[i, :want[i]]), np.flatnonzero(
                np.unpackbits(host[i].view(np.uint8), bitorder="little"))) for i in (0, b - 1))
        moved = b * (8 * n_words + 4 * float(want.mean()))
        rows.append(_row("gather", b, n, density, t, moved, ok,
                         f"grid {grid[0]} x {b}, block {block} x {words} words; the reset kernel ahead timed with it"))
    return rows


def final_rows(n: int, kept: int, k: int, batches=BATCHES, reps: int = 15) -> list[dict]:
    """The batch final's device time, rank final against radix select, each checked against the
    oracle on its first and last request."""
    from .. import reference
    from ..device import launch
    from ..topk.config import TopKConfig
    from ..topk.filter import FilterWorkspace
    from ..topk.final import launch_final

    cuda = launch.cuda()
    rng = np.random.default_rng(11)
    ids_host = rng.permutation(n).astype(np.int64)
    ids = cuda.to_device(ids_host)
    B = max(batches)
    cap = 4 * kept
    slots = np.stack([rng.choice(n, kept, replace=False) for _ in range(B)]).astype(np.int32)
    vals = rng.standard_normal((B, kept)).astype(np.float32)
    rows = []
    for b in batches:
        fws = FilterWorkspace.batched(np.zeros(b + 1, np.int64), np.full(b, k), cap=cap)
        buf_s, buf_i = np.zeros((b, cap), np.float32), np.zeros((b, cap), np.int32)
        buf_s[:, :kept], buf_i[:, :kept] = vals[:b], slots[:b]
        fws.buf_s.copy_to_device(buf_s)
        fws.buf_i.copy_to_device(buf_i)
        fws.fill.copy_to_device(np.full(b, kept, np.int64))
        for final in ("rank", "radix"):
            config = TopKConfig(final=final)

            def step():
                launch_final(k, fws, ids, config=config)

            t = harness.time_device(step, reps=reps) if not launch.backend.is_simulator() else None
            step()
            ok = True
            out_ids = fws.out_id.copy_to_host()
            for r in (0, b - 1):
                scores = np.full(n, np.nan, np.float32)
                scores[slots[r]] = vals[r]
                want = reference.topk(scores, k, ids=ids_host)
                ok &= bool(np.array_equal(out_ids[r, :k], want.ids))
            moved = b * kept * 16.0  # key, slot and id of each candidate, once
            rows.append(_row(f"final_{final}", b, n, kept / n, t, moved, ok, f"{kept} candidates a request, k {k}"))
    return rows


def _row(step, batch, n, fraction, timing, moved, ok, notes) -> dict:
    sec = timing.median if timing is not None else float("nan")
    return {"step": step, "batch": batch, "n": n, "fraction": fraction, "seconds_median": sec,
            "seconds_per_request": sec / batch, "bytes": moved, "achieved_TBps": moved / sec / 1e12,
            "verified": "yes" if ok else "NO", "notes": notes}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m andromeda_nb.bench.request_steps",
                                description="Device time of the candidate gather and of a batch's final "
                                            "(rank against radix select), each row checked; a GPU host.")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--n", type=int, default=100_000_000)
    p.add_argument("--density", type=float, default=0.0094)
    p.add_argument("--kept", type=int, default=2600)
    p.add_argument("--k", type=int, default=1000)
    p.add_argument("--steps", default="gather,final", help="comma-separated: gather, final")
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--reps", type=int, default=15, help="timed calls a row (1 under a profiler)")
    a = p.parse_args(argv)
    steps = [x for x in a.steps.split(",") if x]
    if not steps or set(steps) - {"gather", "final"}:
        p.error(f"--steps takes gather and/or final, got {a.steps!r}")
    try:
        batches = tuple(int(b) for b in a.batches.split(","))
    except ValueError:
        p.error(f"--batches takes comma-separated positive ints, got {a.batches!r}")
    if not batches or min(batches) < 1:
        p.error(f"--batches takes positive ints, got {a.batches!r}")
    if a.reps < 1 or a.n < 1 or not 0 < a.density <= 1:
        p.error("--reps and --n must be >= 1 and --density in (0, 1]")
    if not 1 <= a.k <= 4096 or not a.k <= a.kept <= a.n:
        p.error(f"need 1 <= --k <= 4096 and --k <= --kept <= --n, got k {a.k}, kept {a.kept}, n {a.n}")
    from ..device import backend

    if backend.is_simulator():
        p.error("request_steps times kernels on a CUDA GPU (the simulator has no device time)")
    env = harness.env_info()
    rows = []
    if "gather" in steps:
        rows += gather_rows(a.n, a.density, batches, a.reps)
    if "final" in steps:
        rows += final_rows(a.n, a.kept, a.k, batches, a.reps)
    for r in rows:
        r.update(device=env.get("device", ""), commit=env.get("commit", ""), timestamp=env.get("timestamp", ""))
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "request_steps.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(f"{r['step']:12s} B={r['batch']:3d}  {r['seconds_median'] * 1e6:9.1f} us  "
              f"{r['seconds_per_request'] * 1e6:8.1f} us/req  {r['achieved_TBps']:6.2f} TB/s  {r['verified']}  "
              f"{r['notes']}")
    return 0 if all(r["verified"] == "yes" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
