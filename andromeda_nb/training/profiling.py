"""Where a training step's time goes: the wall clock of :func:`~.train.train_model`'s steps beside the
device time of the same steps' kernels (``torch.profiler``), per model.

Why: a tuning is thousands of runs' steps on one GPU, and whether a step waits on the GPU (its
kernels' time is its wall time: less work per step helps) or on the host (the GPU idles between
launches: more runs at once, fewer launches per step or CUDA graphs help) decides what makes it
faster. ``device / wall`` near 1 says the former, well below 1 the latter.

Two runs of the same steps: one timed by the wall clock alone (the profiler's own host work would
inflate it), one under ``torch.profiler`` for the kernels' times and the ops that take them. On a CPU
there are no kernels: ``device_ms`` is the ops' self CPU time (the step's compute)."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

#: the ops listed a model (by device time, else CPU time)
TOP_OPS = 8


def profile_steps(name: str, data, cfg, steps: int = 20, warmup: int = 10, device: str = "auto",
                  seed: int = 0) -> dict:
    """Wall and device milliseconds a training step of model ``name`` (``steps`` steps after ``warmup``
    untimed ones, twice: see the module docstring).

    Returns:
        ``{"model", "device", "steps", "wall_ms", "device_ms", "device_over_wall", "launches",
        "top_ops"}``: per step; ``launches`` the kernels launched a step (ops a step on a CPU);
        ``top_ops`` ``"name ms; ..."`` of the :data:`TOP_OPS` ops with the most time a step.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from .train import pick_device, train_model

    for arg, v, least in (("steps", steps, 1), ("warmup", warmup, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
            raise ValueError(f"{arg} must be an int >= {least}, got {v!r}")
    dev = pick_device(device)
    cuda = dev.type == "cuda"
    run = replace(cfg, steps=warmup + steps)

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    marks = {}

    def clock(step):  # called after each step: the timed window is the last ``steps`` steps
        if step + 1 in (warmup, warmup + steps):
            sync()
            marks[step + 1] = time.perf_counter()

    train_model(name, data, run, seed=seed, device=str(dev), progress=False, on_step=clock)
    wall_ms = (marks[warmup + steps] - marks[warmup]) * 1e3 / steps

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
                 acc_events=True) as prof:
        train_model(name, data, run, seed=seed, device=str(dev), progress=False,
                    on_step=lambda step: prof.step())
        sync()
    # kernels (a GPU) or aten ops (a CPU): their time, and how many a step runs
    events = prof.key_averages()
    if cuda:
        work = [e for e in events if e.device_type.name == "CUDA"]
        device_us = sum(e.self_device_time_total for e in work) if work else float("nan")  # none seen: unknown
        launches = sum(e.count for e in work) / steps
        ops = [e for e in events if e.key.startswith("aten::") and e.device_time_total > 0]
        top = sorted(ops, key=lambda e: e.device_time_total, reverse=True)[:TOP_OPS]
        top_ms = [(e.key, e.device_time_total) for e in top]
    else:
        ops = [e for e in events if e.key.startswith("aten::")]
        device_us = sum(e.self_cpu_time_total for e in ops)
        launches = sum(1 for e in prof.events() if e.name.startswith("aten::") and (
            e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))) / steps
        top_ms = [(e.key, e.self_cpu_time_total) for e in sorted(ops, key=lambda e: e.self_cpu_time_total,
                                                                   reverse=True)[:TOP_OPS]]
    device_ms = device_us / 1e3 / steps
    return {"model": name, "device": torch.cuda.get_device_name(dev) if cuda else "cpu", "steps": steps,
            "wall_ms": wall_ms, "device_ms": device_ms, "device_over_wall": device_ms / wall_ms,
            "launches": launches,
            "top_ops": "; ".join(f"{key} {us / 1e3 / steps:.3f}" for key, us in top_ms)}
