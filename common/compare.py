"""The tolerance measure of the fixture references (tests and bench/device_check.py compare with it)."""
from __future__ import annotations

import numpy as np


def rel_err(got, want) -> float:
    """Max over the rows of 2-D arrays (a 1-D array is one row) of max|got - want| / max|want|."""
    got, want = np.atleast_2d(got), np.atleast_2d(want)
    return float((np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max())
