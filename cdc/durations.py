"""Durations as written in the config file: ``50ms``, ``5s``, ``2m``, ``1h``, ``7d``.

Parsed once at the boundary into seconds (float); nothing else handles strings.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_EXACT_UNITS = {unit: Decimal(str(size)) for unit, size in _UNITS.items()}
_PATTERN = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)\s*")


def parse_duration(value: object) -> float:
    """Return ``value`` in seconds. Plain numbers are seconds.

    Raises ValueError with a human message on anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 50ms, 5s or 7d, got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"a duration must be a finite number of seconds, got {value!r}")
        if value < 0:
            raise ValueError(f"a duration cannot be negative, got {value!r}")
        return float(value)
    if isinstance(value, str):
        match = _PATTERN.fullmatch(value)
        if match:  # in decimal, so that 700ms is 0.7, not 0.7000000000000001
            return float(Decimal(match.group(1)) * _EXACT_UNITS[match.group(2)])
    raise ValueError(f"expected a duration such as 50ms, 5s or 7d, got {value!r}")


def format_duration(seconds: float) -> str:
    """The shortest exact spelling of ``seconds`` in the config's units."""
    for unit in ("d", "h", "m", "s"):
        size = _UNITS[unit]
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    return f"{round(seconds * 1000)}ms"
