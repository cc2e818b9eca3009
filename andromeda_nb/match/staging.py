"""Uploads of small int64 tables (request plans, update deltas) that never block the host.

Every upload goes through pinned staging buffers with an asynchronous copy on the default stream,
and every kernel runs on that stream, so the device executes updates and requests in the order
the host issued them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..device import launch


class Stager:
    """Uploads small int64 arrays without blocking the host: a ring of pinned host buffers, each
    rewritten only after the asynchronous copy out of it finished (an event). The device side is
    either a new array the caller owns (prepared plans, launched later) or a ring of device
    buffers (for work launched right after the copy: a later copy into the same buffer is queued
    after every kernel that read it)."""

    def __init__(self, regions: int = 4, capacity: int = 1 << 15):
        self.cuda = launch.cuda()
        self.stream = self.cuda.default_stream()
        self.regions = [{"host": self.cuda.pinned_array(capacity, np.int64), "dev": None, "event": None}
                        for _ in range(regions)]
        self.next = 0
        self._kept = []  # replaced device buffers stay alive (queued kernels may still read them)

    def retain(self, buffer) -> None:
        """Keep a replaced device buffer alive: kernels queued on the stream may still read it."""
        self._kept.append(buffer)

    def upload(self, arrays: Sequence[np.ndarray]) -> list:
        """Device int64 views of ``arrays`` in a new device array the caller owns (each at least one
        element long: an empty array gets one zero, so kernels can take it as an argument)."""
        if not len(arrays):
            return []
        dev, starts, sizes = self._stage(arrays, owned=True)
        return [launch.view1d(dev, off, n) for off, n in zip(starts, sizes)]

    def upload_spans(self, arrays: Sequence[np.ndarray]) -> tuple:
        """``arrays`` copied into the ring's next device buffer: ``(buffer, starts)``, array ``i``
        at ``buffer[starts[i]:]`` (an empty one is one zero), for bound launches that point their
        arguments there (:meth:`~andromeda_nb.device.launch.BoundLaunch.set_array`) without a
        view object an array."""
        dev, starts, _ = self._stage(arrays, owned=False)
        return dev, starts

    def _grow(self, total: int, ring: bool) -> None:
        """Every region's buffers to hold ``total`` int64 (the next power of two), with ``ring``
        its device buffer too: all at once, as the ring goes through every region and a pinned
        allocation costs milliseconds (a batch size larger than any before pays once, not once a
        region). A region's copy in flight finishes first; replaced device buffers are kept."""
        size = 1 << int(np.ceil(np.log2(max(total, 1))))
        for r in self.regions:
            if r["event"] is not None:
                r["event"].synchronize()
            if r["host"].size < size:
                r["host"] = self.cuda.pinned_array(size, np.int64)
            if ring and (r["dev"] is None or r["dev"].size < size):
                if r["dev"] is not None:
                    self.retain(r["dev"])
                r["dev"] = self.cuda.device_array(size, np.int64)

    def _stage(self, arrays: Sequence[np.ndarray], owned: bool) -> tuple:
        sizes = [max(int(a.size), 1) for a in arrays]
        starts = np.cumsum([0] + sizes[:-1]).tolist()
        total = sum(sizes)
        reg = self.regions[self.next]
        self.next = (self.next + 1) % len(self.regions)
        if reg["event"] is not None:
            reg["event"].synchronize()
        if reg["host"].size < total or (not owned and (reg["dev"] is None or reg["dev"].size < total)):
            self._grow(max(total, reg["host"].size), ring=not owned)
        host = reg["host"]
        dev = self.cuda.device_array(total, np.int64) if owned else reg["dev"]
        for a, off in zip(arrays, starts):
            if a.size:
                host[off:off + a.size] = a
            else:
                host[off] = 0
        if owned:  # a new array each call: numba's copy (copy_async takes persistent buffers)
            dev.copy_to_device(host[:total], stream=self.stream)
        else:
            launch.copy_async(dev, host, 8 * total)
        ev = self.cuda.event() if launch.backend.is_simulator() else self.cuda.event(timing=False)
        ev.record(self.stream)
        reg["event"] = ev
        return dev, starts, sizes
