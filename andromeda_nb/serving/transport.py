"""Bytes on the wire: every message Dask's TCP comms write, counted in every process.

Dask's ``TCP.write`` returns the bytes it wrote for a message (its frames and their header). One
wrapper around it, installed in the client's process, the scheduler and every worker, adds them to
a per-process counter, so each byte that crosses a comm is counted once, by its sender, whichever
topology moved it: a request's tensors, candidate slot lists between workers, answers, and Dask's
own traffic (task and actor messages, heartbeats) during the measurement.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

_COUNT = {"bytes": 0, "messages": 0}


def _install() -> bool:
    """Wrap ``distributed.comm.tcp.TCP.write`` in this process (once)."""
    from distributed.comm import tcp

    if getattr(tcp.TCP.write, "_andromeda_counted", False):
        return True
    plain = tcp.TCP.write

    async def write(self, msg, serializers=None, on_error="message"):
        n = await plain(self, msg, serializers=serializers, on_error=on_error)
        _COUNT["bytes"] += int(n)
        _COUNT["messages"] += 1
        return n

    write._andromeda_counted = True
    tcp.TCP.write = write
    return True


def _read_and_reset() -> tuple[int, int]:
    out = (_COUNT["bytes"], _COUNT["messages"])
    _COUNT["bytes"] = _COUNT["messages"] = 0
    return out


@dataclass
class Traffic:
    """Bytes and messages written on TCP comms during a measurement, by the client's process, the
    scheduler and the workers."""

    client: int = 0
    scheduler: int = 0
    workers: int = 0
    messages: int = 0

    @property
    def total(self) -> int:
        return self.client + self.scheduler + self.workers


def install(client) -> None:
    """Count TCP bytes in the client's process, the scheduler and every worker of ``client``'s
    cluster (workers that join later are not counted). The cluster must talk TCP (a
    ``LocalCluster(processes=True)`` or a real one): an in-process cluster writes nothing."""
    _install()
    client.run_on_scheduler(_install)
    client.run(_install)


@contextlib.contextmanager
def counting(client):
    """``with counting(client) as traffic:`` the bytes every process wrote during the block, in
    ``traffic`` when it ends. Resetting and reading the counters are messages too: the workers are
    reset first, then the scheduler, then the client, and read in the opposite order, so only the
    resets' replies (a few hundred bytes) fall inside the block."""
    install(client)
    client.run(_read_and_reset)
    client.run_on_scheduler(_read_and_reset)
    _read_and_reset()
    traffic = Traffic()
    yield traffic
    traffic.client, m = _read_and_reset()
    traffic.scheduler, ms = client.run_on_scheduler(_read_and_reset)
    per_worker = client.run(_read_and_reset)
    traffic.workers = sum(b for b, _ in per_worker.values())
    traffic.messages = m + ms + sum(n for _, n in per_worker.values())
