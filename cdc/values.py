"""Column values to JSON text, per DESIGN.md §5.

Sources return native Python values; this module is the one place that turns
them into the JSON text stored in Redis and spliced into change messages:

- integers and floats are JSON numbers; float NaN and Infinity are rejected
- decimals are strings (lossless: ``Decimal("12.50")`` -> ``"12.50"``); a
  decimal NaN or Infinity (PostgreSQL numeric has them) is ``"NaN"``,
  ``"Infinity"``, ``"-Infinity"``
- date/time values are ISO 8601 strings; intervals ISO 8601 durations
- binary is base64; UUIDs lowercase strings; JSON columns nested values

Two wrappers let a source say more than a Python value can (docs/TYPES.md):

- ``RawJson``: JSON text the database wrote (a json/jsonb column), spliced
  into the document as it is. Never parsed, so no number loses a digit to a
  float and no nesting depth meets a recursion limit.
- ``Unreadable``: a value the source could not load, with why. Encoding it
  raises ``PoisonChange`` naming the column: that row goes to the dead letter,
  and the rows around it flow (a driver's error would have failed the read).

A value that cannot be encoded raises ``PoisonChange`` naming the column, so
the change goes to the dead letter with that reason.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import uuid
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import orjson

from cdc.errors import PoisonChange


class RawJson:
    """A JSON value as the source's own JSON text (UTF-8), which the source
    vouches is valid JSON. Its encoding is that text, byte for byte; inside an
    array it is spliced the same way. ``str()`` is the text (a JSON key column
    reads so in a document key).

    A plain class, not a dataclass: orjson would write a dataclass as an object."""

    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RawJson) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __str__(self) -> str:
        return self.text.decode()

    def __repr__(self) -> str:
        return f"RawJson({self.text!r})"


class Unreadable:
    """A value the source could not load: encoding it raises ``PoisonChange``
    with ``reason`` (which says what the value is and why), naming the column.

    A source's loader returns one instead of raising, so that one odd value
    dead-letters its row instead of failing the whole read."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unreadable) and other.reason == self.reason

    def __hash__(self) -> int:
        return hash(self.reason)

    def __repr__(self) -> str:
        return f"Unreadable({self.reason!r})"


def encode_value(value: Any, column: str = "?") -> bytes:
    """The JSON text of one column value.

    This runs once per column of every change, so the common types take a
    shortcut chosen by their exact type (``SHORTCUTS``); anything else, and any
    value a shortcut declines (returns None), takes the general path."""
    try:
        shortcut = SHORTCUTS.get(type(value))
        text = None if shortcut is None else shortcut(value)
        if text is None:
            text = _trim(orjson.dumps(_plain(value, column), default=_default))
        return text
    except (orjson.JSONEncodeError, ValueError) as exc:  # ValueError: an int of over 4300 digits
        raise PoisonChange(f"column {column}: value cannot be encoded as JSON: {exc}") from None


def _trim(text: bytes) -> bytes:
    """A copy the size of the text. orjson (3.12+) returns its bytes in a buffer
    of at least 4 KiB that it never shrinks: a queued change of ten columns
    would hold 40 KiB instead of a few hundred bytes. (``%`` formatting makes
    an exact-size copy in a third of the time ``bytes(memoryview(...))`` takes.)"""
    return b"%b" % text


def _dumps(value: Any) -> bytes:
    return b"%b" % orjson.dumps(value)


def _float(value: float) -> bytes | None:
    return b"%b" % orjson.dumps(value) if math.isfinite(value) else None  # None: the general path raises


def _decimal(value: Decimal) -> bytes:
    """The general path's text of it (digits, '.', '-' and the like: nothing
    to escape). ``str`` writes a finite decimal in fixed point, with the same
    digits ``format(value, "f")`` writes, unless its exponent is positive or
    it is below 1e-6 (then it writes an exponent); and NaN and Infinity end
    in a letter: those take ``_decimal_text``. ``str`` is 4x faster (measured:
    0.3 against 1.2 us), and a numeric column is in most tables' rows."""
    text = str(value)
    if "E" in text or not text[-1].isdigit():
        text = _decimal_text(value)
    return b'"%b"' % text.encode()


def _decimal_text(value: Decimal) -> str:
    """Fixed point, every digit; NaN and Infinity as PostgreSQL spells them."""
    if value.is_finite():
        return format(value, "f")
    if value.is_nan():
        return "NaN"  # PostgreSQL has one NaN: no sign, never signalling
    return "-Infinity" if value < 0 else "Infinity"


def _datetime(value: dt.datetime) -> bytes:
    tz = value.tzinfo
    return b"%b" % orjson.dumps(value if tz is None or tz is dt.UTC else _aware(value))


def _json(value: dict[Any, Any] | list[Any]) -> bytes | None:
    """A JSON column's value (or an array) in one pass when it holds only JSON
    types: orjson refuses the rest (big integers, decimals, bytes, non-string
    keys, and, with the passthrough option, dates and times), and writes NaN
    as null, so output with a null is checked the general way."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_PASSTHROUGH_DATETIME)
    except orjson.JSONEncodeError:
        return None
    return None if b"null" in text else b"%b" % text


SHORTCUTS: dict[type, Callable[[Any], bytes | None]] = {
    type(None): lambda value: b"null",
    bool: lambda value: b"true" if value else b"false",
    int: lambda value: b"%d" % value,  # exact digits at any size (ValueError over 4300 digits)
    float: _float,
    str: _dumps,
    Decimal: _decimal,
    uuid.UUID: _dumps,  # orjson writes the canonical lowercase form
    dt.date: _dumps,
    dt.datetime: _datetime,
    dict: _json,
    list: _json,
    RawJson: lambda value: value.text,
}


def encode_row(values: Mapping[str, Any]) -> dict[str, bytes]:
    """Every column of a row to JSON text, in the row's column order."""
    return {column: encode_value(value, column) for column, value in values.items()}


_INT_RANGE = range(-(2**63), 2**64)  # what orjson writes itself


def _plain(value: Any, column: str) -> Any:
    """Scalars orjson would get wrong, handled before it sees them."""
    if isinstance(value, int) and value not in _INT_RANGE and not isinstance(value, bool):
        # a numeric(40) read as int, or a big number inside a JSON column: exact digits
        return orjson.Fragment(str(value))
    if isinstance(value, float) and not math.isfinite(value):
        raise PoisonChange(f"column {column}: {value} cannot be represented in JSON")
    if isinstance(value, Decimal):
        return _decimal_text(value)
    if isinstance(value, RawJson):
        return orjson.Fragment(value.text)
    if isinstance(value, Unreadable):
        raise PoisonChange(f"column {column}: {value.reason}")
    if isinstance(value, dt.time):
        # orjson refuses an aware time, and (3.13) writes 00:00:00.010000 as 00:00:00.10000
        return value.isoformat()
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return _aware(value)
    if isinstance(value, (list, tuple)):
        return [_plain(item, column) for item in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, column) for k, v in value.items()}
    return value


def _aware(value: dt.datetime) -> dt.datetime:
    """orjson cuts an offset to whole minutes: ``+00:19:32`` (Amsterdam's local
    mean time until 1937) would read ``+00:19``, a different instant. ISO 8601
    offsets have no seconds, so such a datetime is written in UTC."""
    offset = value.utcoffset()
    if offset is not None and offset % dt.timedelta(minutes=1):
        return value.astimezone(dt.UTC)
    return value


def _default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Decimal):
        return _decimal_text(value)
    if isinstance(value, dt.timedelta):
        return iso_duration(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"type {type(value).__name__} is not supported")


def iso_duration(value: dt.timedelta) -> str:
    """``timedelta`` as an ISO 8601 duration, e.g. ``P1DT2H3M4.5S``; exact to the
    microsecond, negative durations with a leading ``-`` (``-PT1S``)."""
    sign = "-" if value < dt.timedelta(0) else ""
    value = abs(value)
    minutes, secs = divmod(value.seconds, 60)
    hours, minutes = divmod(minutes, 60)
    time = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    if value.microseconds:
        time += f"{secs}.{value.microseconds:06d}".rstrip("0") + "S"
    elif secs or not (value.days or time):
        time += f"{secs}S"
    days = f"{value.days}D" if value.days else ""
    return f"{sign}P{days}" + (f"T{time}" if time else "")
