"""Device time of each step of :meth:`~andromeda_nb.pipeline.Pool.retrieve`'s targeted path."""

from __future__ import annotations

from ..device import launch


class StepTimes:
    """Device time of each step of :meth:`Pool.retrieve`'s targeted path, by CUDA events around it
    (``pool.trace = StepTimes(busy)``; each call appends ``{step: seconds}`` to :attr:`calls`).

    ``busy``: a function enqueueing a kernel that keeps the device busy longer than the host takes
    to enqueue the call (e.g. ``bench.harness.busy``): the steps then queue up behind it and each
    event pair times the device's work alone, not the host's gaps between launches."""

    def __init__(self, busy=None):
        self.busy = busy
        self.calls: list[dict] = []

    def run(self, steps) -> None:
        cuda = launch.cuda()
        if self.busy is not None:
            self.busy()
        marks = []
        for name, step in steps:
            start, end = cuda.event(), cuda.event()
            start.record()
            step()
            end.record()
            marks.append((name, start, end))
        end.synchronize()
        # Event.elapsed_time is numba-cuda's and the simulator's (which has no event_elapsed_time)
        self.calls.append({name: s.elapsed_time(e) / 1e3 for name, s, e in marks})
