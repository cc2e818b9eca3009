"""Checks of public functions' arguments shared across the package."""

from __future__ import annotations

import numpy as np


def is_int(x) -> bool:
    """Whether ``x`` is an integer: a Python int or a numpy integer, not a bool (a float, even a
    whole one, is not: a count or seed given as 2.5 would be cut silently)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
