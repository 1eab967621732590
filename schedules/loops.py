"""Loop facts both schedule families read."""
from __future__ import annotations

from tvm import tirx


def static_extent(e) -> int | None:
    """The value of a loop extent fixed at compile time, or None for a symbolic one (T, L, C)."""
    return int(e) if isinstance(e, (int, tirx.IntImm)) else None
