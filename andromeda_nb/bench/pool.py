"""Pool suite: the live ad pool as a user calls it (``python -m andromeda_nb.bench pool``).

Ads are created, changed and retired while requests are served (``Pool.apply``, docs/design.md,
"The live pool"). On the pipeline suite's benchmark world (20 categories, ~1 % eligible), gated
E6 K2 fp16 d64, k = 1000. Rows (``data/results/pool.csv``):

    apply_end_to_end        Pool.apply of a batch of ``batch`` random updates (a third each creates,
                            changes, retires; new rows) in the documented format, wall time with a
                            final sync (a request queued after it sees the batch); updates/s =
                            ``items_per_s``; ``device_seconds`` from ``apply_device``
    apply_device            the device time of the same batch sizes' copies and kernels
    retrieve_alone / retrieve_during_updates
                            one request a call, alone and while update batches arrive at 100 K/s
                            (the same requests, the same run)
    soak                    10^6 updates interleaved with 10^4 requests on a 10^7-ad pool, checked at
                            10 checkpoints (index = rebuild, table = a host mirror of the updates,
                            sampled answers = the float64 oracle over the live ads)

Phases (``--phases``; default all): ``apply``, ``during`` (each grows its 10^7-ad pool: the world has
no spare slots, so each comes last at its size and rebuilds the world after; the 10^8-ad world has
spare slots and is checked by sampling, as neither its growth nor its rebuild fits the GPU host's
memory: :data:`.live_pool.REBUILD_MAX_SLOTS`) and ``soak`` (its own world with spare slots, 10^7
ads); pool sizes 10^7 and 10^8, those up to ``--n-ads`` (``--min-n-ads`` leaves out the smaller).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import harness
from . import pipeline
from .live_pool import APPLY_BATCHES, REBUILD_MAX_SLOTS, SPARE_SLOTS

#: the pool sizes of a run (those at most --n-ads)
SIZES = (10 ** 7, 10 ** 8)
#: the soak's pool (the issue's: 10^6 updates, 10^4 requests on 10^7 ads)
SOAK_ADS = 10 ** 7


@dataclass(frozen=True)
class ApplyCase(harness.Case):
    """Pool.apply of update batches (:func:`.live_pool._apply_rows`), end to end and device."""

    n_ads: int | None = None
    access: str = "bitset"

    def variants(self) -> tuple[str, ...]:
        return ("apply_end_to_end", "apply_device") * len(APPLY_BATCHES)


@dataclass(frozen=True)
class DuringCase(harness.Case):
    """One request at a time alone, then while updates arrive (:func:`.live_pool._during_rows`),
    the default math of the request path (fp16)."""

    n_ads: int | None = None
    access: str = "bitset"
    math: str = "fp16"

    def variants(self) -> tuple[str, ...]:
        return ("retrieve_alone", "retrieve_during_updates")


@dataclass(frozen=True)
class SoakCase(harness.Case):
    """Updates interleaved with requests, checked at checkpoints (:func:`.live_pool._soak_run`), fp32
    math (the float64 oracle's tolerance), on its own world."""

    variant: str = "soak"
    n_ads: int | None = None
    access: str = "bitset"
    math: str = "fp32"


PHASES = {"apply": (ApplyCase(),), "during": (DuringCase(),), "soak": (SoakCase(),)}
DEFAULT_PHASES = tuple(PHASES)


def cases(options: harness.Options) -> dict:
    """The declared cases at each pool size up to ``options.n_ads`` (the soak at :data:`SOAK_ADS`)."""
    sizes = [n for n in SIZES if n <= options.n_ads]
    out = {}
    for phase, declared in PHASES.items():
        out[phase] = tuple(replace(c, n_ads=n) for c in declared
                           for n in ((SOAK_ADS,) if isinstance(c, SoakCase) else sizes))
    return out


order = pipeline.order  # pool size first (one world at a time), then the phases' order


class Run(pipeline.Run):
    """The pipeline run's world, table and pool of one size at a time; every case here moves the
    pool past its world, so the next case builds both again."""

    def _measure(self, case):
        from .live_pool import _apply_rows, _during_rows, _soak_run

        if isinstance(case, SoakCase):
            self.close()  # the soak builds its own world (with spare slots) and pool
            return [_soak_run(self.env, self.ceil, case.n_ads)]
        # the pool's default: the device works out the bits from the first update (host_bits="auto");
        # a pool past what a rebuild fits in the host's memory gets spare slots instead of growing
        spare = SPARE_SLOTS if case.n_ads > REBUILD_MAX_SLOTS else 0
        self.setup(case.n_ads, math=case.math if isinstance(case, DuringCase) else "fp32", host_bits="auto",
                   spare=spare)
        try:
            if isinstance(case, ApplyCase):
                return _apply_rows(self.env, self.ceil, self.world, self.pool, self.reqs, self.profiles,
                                   self.options.out)
            return _during_rows(self.env, self.ceil, self.world, self.pool, self.reqs, self.profiles, self.n)
        finally:
            self.close()
