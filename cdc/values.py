"""Column values to JSON text, per DESIGN.md §5.

Sources return native Python values; this module is the one place that turns
them into the JSON text stored in Redis and spliced into change messages:

- integers and floats are JSON numbers; NaN and Infinity are rejected
- decimals are strings (lossless: ``Decimal("12.50")`` -> ``"12.50"``)
- date/time values are ISO 8601 strings; intervals ISO 8601 durations
- binary is base64; UUIDs lowercase strings; JSON columns nested values

A value that cannot be encoded raises ``PoisonChange`` naming the column, so
the change goes to the dead letter with that reason.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import orjson

from cdc.errors import PoisonChange


def encode_value(value: Any, column: str = "?") -> bytes:
    """The JSON text of one column value."""
    try:
        return orjson.dumps(_plain(value, column), default=_default)
    except orjson.JSONEncodeError as exc:
        raise PoisonChange(f"column {column}: value cannot be encoded as JSON: {exc}") from None


def encode_row(values: Mapping[str, Any]) -> dict[str, bytes]:
    """Every column of a row to JSON text, in the row's column order."""
    return {column: encode_value(value, column) for column, value in values.items()}


def _plain(value: Any, column: str) -> Any:
    """Scalars orjson would get wrong, handled before it sees them."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PoisonChange(f"column {column}: {value} cannot be represented in JSON")
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise PoisonChange(f"column {column}: decimal {value} cannot be represented in JSON")
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(item, column) for item in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, column) for k, v in value.items()}
    return value


def _default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.timedelta):
        return iso_duration(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"type {type(value).__name__} is not supported")


def iso_duration(value: dt.timedelta) -> str:
    """``timedelta`` as an ISO 8601 duration, e.g. ``P1DT2H3M4.5S``."""
    sign = "-" if value < dt.timedelta(0) else ""
    value = abs(value)
    seconds = value.seconds + value.microseconds / 1_000_000
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    out = f"{sign}P{value.days}D" if value.days else f"{sign}P"
    time = ""
    if hours:
        time += f"{int(hours)}H"
    if minutes:
        time += f"{int(minutes)}M"
    if secs or not (value.days or time):
        time += f"{secs:g}S" if secs != int(secs) else f"{int(secs)}S"
    return out + ("T" + time if time else "")
