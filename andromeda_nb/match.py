"""Host wrappers of the targeting-match kernels (kernels/match.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from . import launch
from .targeting import TargetingIndex, make_profile, mask_from_bits, table_slots


class DeviceTargetingIndex:
    """A :class:`~andromeda_nb.targeting.TargetingIndex` with its bitset rows on the device."""

    def __init__(self, index: TargetingIndex):
        if not isinstance(index, TargetingIndex):
            raise TypeError(f"index must be a TargetingIndex, got {type(index).__name__}")
        self.index = index
        self.bitsets = launch.to_device(index.bitsets)

    n_ads = property(lambda self: self.index.n_ads)
    n_words = property(lambda self: self.index.n_words)
    schema = property(lambda self: self.index.schema)


@dataclass
class Eligible:
    """A request's eligible set on the device: ``words`` (uint64 bitset) and its ``count``.

    ``count`` is read from the device when asked for (one 8-byte copy)."""

    words: object
    n_ads: int
    _count: object

    @property
    def count(self) -> int:
        return int(self._count.copy_to_host()[0])

    def to_mask(self) -> np.ndarray:
        """The eligible set as a host bool ``[n_ads]`` mask (copies the bitset; for checks)."""
        return mask_from_bits(self.words.copy_to_host(), self.n_ads)


def match_eligible(index: DeviceTargetingIndex, profile: Mapping, exclude_slots=None,
          block: int | None = None) -> Eligible:
    """Eligible bitset of one request: live, and every category's rule satisfied by ``profile``.

    Args:
        index: the device index.
        profile: ``{category: value or values}`` (validated with
            :func:`~andromeda_nb.targeting.make_profile`).
        exclude_slots: optional int slots to remove afterwards (e.g. ads the user already
            converted on); out-of-range slots raise.
        block: threads per block.

    Returns:
        :class:`Eligible` (device bitset and count).

    Raises:
        RuleError: malformed profile. ValueError: exclude slots out of range.
    """
    from .kernels.match import clear_bits_kernel, match_kernel

    if not isinstance(index, DeviceTargetingIndex):
        raise TypeError(f"index must be a DeviceTargetingIndex, got {type(index).__name__}")
    prof = make_profile(index.schema, profile)
    excl = None if exclude_slots is None else table_slots(exclude_slots, index.n_ads)
    plan = index.index.plan(prof)
    cuda = launch.cuda()
    block = block or launch.default_block()
    words = cuda.device_array(index.n_words, np.uint64)
    count = cuda.to_device(np.zeros(1, np.int64))
    args = [launch.to_device(a) if a.size else launch.dummy(np.int32)
            for a in (plan.inc_rows, plan.exc_rows)]
    match_kernel(block)[launch.grid_for(max(index.n_words, 1), block), block](
        index.bitsets, launch.to_device(plan.inc_ptr), args[0], launch.to_device(plan.exc_ptr),
        args[1], words, count)
    if excl is not None and excl.size:
        clear_bits_kernel()[launch.grid_for(excl.size, block), block](words, launch.to_device(excl), count)
    return Eligible(words=words, n_ads=index.n_ads, _count=count)
