"""SQL Server column types to values, and how each is read (docs/TYPES.md, DESIGN.md §5).

Every type has a lossless encoding; only CLR user-defined types are refused
(``converter_for``, at describe: so ``cdc validate``, ``cdc run`` and ``cdc
tracking enable`` refuse the table before anything is installed). Some types
are not read as the driver would hand them over, but as a text or bytes the
server writes (the select expression ``mssql_sql.column_select`` builds), so that the value is exact whatever the ODBC driver (Microsoft ODBC
Driver 18, FreeTDS):

=================================================  ======================  ==========================
SQL Server type                                    read as                 JSON
=================================================  ======================  ==========================
decimal, numeric, money, smallmoney                the driver's Decimal    string, every digit
bit                                                bool                    true / false
tinyint, smallint, int, bigint                     int                     number
float / real                                       float                   number (real: its shortest
                                                                           float32 spelling)
date                                               date                    "2024-02-29"
datetime2, datetime, smalldatetime                 server text, style 121  "2024-02-29T13:45:30.1234567"
time                                               server text, style 121  "13:45:30.1234567"
datetimeoffset                                     server text, style 121  "2024-02-29T13:45:30.1234567+02:00"
uniqueidentifier                                   str                     lowercase string
binary, varbinary, image, timestamp (rowversion)   bytes                   base64
char, varchar, nchar, nvarchar, text, ntext        str                     string
xml                                                nvarchar(max) text      string
hierarchyid                                        its ToString() text     "/1/2/"
geometry, geography                                varbinary(max): their   base64
                                                   serialized bytes
sql_variant                                        "<base type>:<text>"    {"type": ..., "value": ...}
=================================================  ======================  ==========================

Dates and times keep SQL Server's 100 ns: Python's datetime holds
microseconds, and pyodbc cuts the driver's nanoseconds to them, so these
types are read as the server's own text (``CONVERT(nvarchar(40), col, 121)``,
"ODBC canonical (with milliseconds)", the default style for time, date,
datetime2 and datetimeoffset, with every fractional digit of the column's
scale: "CAST and CONVERT (Transact-SQL)" and "datetime2 (Transact-SQL)",
learn.microsoft.com) and written as ISO 8601 with the fraction as Python's
``isoformat`` writes it (none when zero, else six digits) and a seventh digit
only when it is not zero: values and keys of rows whose 100 ns digit is 0
read exactly as cdc-sync wrote them before it kept that digit.

A converter raises on a value it cannot read; ``mssql_reads`` puts a
``cdc.values.Unreadable`` in its place, and that row goes to the dead letter.

pyodbc has no native datetimeoffset: it hands over the ODBC
``SQL_SS_TIMESTAMPOFFSET_STRUCT`` as bytes unless an output converter is
registered for SQL type -155; ``decode_datetimeoffset`` is that converter
(``register_converters`` installs it on every connection, for anything that
selects such a column as it is).
"""

from __future__ import annotations

import datetime as dt
import re
import struct
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from cdc.errors import UnsupportedType

Converter = Callable[[Any], Any]

SQL_SS_TIMESTAMPOFFSET = -155  # the ODBC SQL type of datetimeoffset
_DTO_STRUCT = struct.Struct("<6hI2h")  # y m d H M S, fraction (ns), tz hour, tz minute: 20 bytes


# -- converters (None passes through every one of them) --------------------


def to_decimal(value: Any) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    return Decimal(str(value))


def to_bool(value: Any) -> bool:
    return bool(value)


def to_int(value: Any) -> int:
    return int(value)


def to_float(value: Any) -> float:
    return float(value)


def to_real(value: Any) -> float:
    """A ``real`` (float32) as the shortest double that round-trips through
    float32: pyodbc widens 1.1 to 1.100000023841858, this gives back 1.1."""
    number = float(value)
    packed = struct.pack("<f", number)
    for digits in range(6, 10):
        candidate = float(f"{number:.{digits}g}")
        if struct.pack("<f", candidate) == packed:
            return candidate
    return number


def to_str(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8")
    return str(value)


def to_uuid(value: Any) -> str:
    """uniqueidentifier as a lowercase string (pyodbc returns it uppercase,
    or as ``uuid.UUID`` with ``pyodbc.native_uuid``, or as 16 bytes in
    SQL Server's mixed-endian order)."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray)) and len(value) == 16:
        return str(uuid.UUID(bytes_le=bytes(value)))
    return str(uuid.UUID(str(value)))


def to_bytes(value: Any) -> bytes:
    return bytes(value)


_FRACTION = re.compile(r"(\.\d{1,6})\d*")
_SPACED_OFFSET = re.compile(r"\s+([+-]\d{2}:?\d{2})$")


def _iso(text: str) -> str:
    """A SQL Server date/time string that ``fromisoformat`` accepts: at most
    six fractional digits and no blank before the offset."""
    text = _FRACTION.sub(r"\1", text.strip())
    return _SPACED_OFFSET.sub(r"\1", text)


def to_date(value: Any) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    return dt.date.fromisoformat(str(value).strip()[:10])


# -- dates and times as the server's text, to 100 ns -----------------------------

# What CONVERT(nvarchar(40), x, 121) writes (and FreeTDS hands over below TDS
# 7.3, in the same "default string literal format"): "yyyy-mm-dd hh:mi:ss" with
# up to 7 fractional digits, and for datetimeoffset " +hh:mi" after it.
_DATE = r"(\d{4}-\d{2}-\d{2})"
_TIME = r"(\d{2}:\d{2}:\d{2})(?:\.(\d{1,7}))?"
_OFFSET = r"\s*([+-]\d{2}:\d{2})"
_DATETIME_TEXT = re.compile(rf"{_DATE}[ T]{_TIME}")
_TIME_TEXT = re.compile(_TIME)
_OFFSET_TEXT = re.compile(rf"{_DATE}[ T]{_TIME}{_OFFSET}")


def fraction(digits: str | None) -> str:
    """ISO 8601 fractional seconds of up to 7 digits (100 ns): none when zero,
    six digits (Python's ``isoformat``), or seven when the seventh is not 0."""
    ticks = int((digits or "0").ljust(7, "0"))
    if ticks == 0:
        return ""
    if ticks % 10 == 0:
        return f".{ticks // 10:06d}"
    return f".{ticks:07d}"


def _text(value: Any) -> str:
    return (bytes(value).decode("ascii") if isinstance(value, (bytes, bytearray)) else str(value)).strip()


def _matched(pattern: re.Pattern[str], value: Any, what: str) -> re.Match[str]:
    found = pattern.fullmatch(_text(value))
    if found is None:
        raise ValueError(f"{_text(value)[:60]!r} is not a {what} as SQL Server writes it (style 121)")
    return found


def _micro(value: dt.datetime | dt.time) -> str:
    return f"{value.microsecond:06d}"


def iso_datetime(value: Any) -> str:
    """datetime2, datetime, smalldatetime: ``2024-02-29T13:45:30.1234567``.
    The server's text, or a driver's datetime (microseconds: all it holds)."""
    if isinstance(value, dt.datetime):
        return f"{value:%Y-%m-%dT%H:%M:%S}{fraction(_micro(value))}"
    day, time, digits = _matched(_DATETIME_TEXT, value, "datetime").groups()
    return f"{day}T{time}{fraction(digits)}"


def iso_time(value: Any) -> str:
    """time: ``13:45:30.1234567``."""
    if isinstance(value, dt.time):
        return f"{value:%H:%M:%S}{fraction(_micro(value))}"
    time, digits = _matched(_TIME_TEXT, value, "time").groups()
    return f"{time}{fraction(digits)}"


def iso_datetimeoffset(value: Any) -> str:
    """datetimeoffset: ``2024-02-29T13:45:30.1234567+02:00``, the date and
    time local to the offset, as written (SQL Server offsets are whole
    minutes, -14:00 to +14:00)."""
    if isinstance(value, dt.datetime):
        offset = value.utcoffset()
        if offset is None:
            raise ValueError(f"datetimeoffset {value!r} has no offset")
        sign, minutes = "-" if offset < dt.timedelta(0) else "+", abs(offset) // dt.timedelta(minutes=1)
        return (
            f"{value:%Y-%m-%dT%H:%M:%S}{fraction(_micro(value))}{sign}{minutes // 60:02d}:{minutes % 60:02d}"
        )
    day, time, digits, zone = _matched(_OFFSET_TEXT, value, "datetimeoffset").groups()
    return f"{day}T{time}{fraction(digits)}{zone}"


def decode_datetimeoffset(value: Any) -> dt.datetime | None:
    """The pyodbc output converter for SQL type -155 (datetimeoffset).

    The driver hands over ``SQL_SS_TIMESTAMPOFFSET_STRUCT``: six 16-bit
    fields (year .. second), the fraction in nanoseconds (32 bits), and the
    offset's hours and minutes (16 bits each, both negative west of UTC).
    The date and time are local to that offset, as they were written.
    """
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, str):
        parsed = dt.datetime.fromisoformat(_iso(value))
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    raw = bytes(value)
    if len(raw) != _DTO_STRUCT.size:
        raise ValueError(f"datetimeoffset: expected {_DTO_STRUCT.size} bytes from the driver, got {len(raw)}")
    year, month, day, hour, minute, second, nanos, tz_hour, tz_minute = _DTO_STRUCT.unpack(raw)
    offset = dt.timezone(dt.timedelta(hours=tz_hour, minutes=tz_minute))
    return dt.datetime(year, month, day, hour, minute, second, nanos // 1000, tzinfo=offset)


def register_converters(connection: Any) -> None:
    """Install the output converters this module needs on a pyodbc connection."""
    connection.add_output_converter(SQL_SS_TIMESTAMPOFFSET, decode_datetimeoffset)


# -- types read through the server's own conversion ---------------------------------


def to_hierarchyid(value: Any) -> str:
    """hierarchyid as its canonical text, ``/1/2/`` (``CAST(x AS nvarchar(4000))``
    calls ToString(), the opposite of Parse: "ToString (Database Engine)",
    learn.microsoft.com), which a keyset cursor hands back as ``CAST(? AS hierarchyid)``."""
    text = _text(value)
    if not text.startswith("/") or not text.endswith("/"):
        raise ValueError(f"{text[:60]!r} is not a hierarchyid path")
    return text


def to_spatial(value: Any) -> bytes:
    """geometry, geography: their serialized bytes (``CAST(x AS varbinary(max))``,
    the format "[MS-SSCLRT]: Microsoft SQL Server CLR Types Serialization
    Formats" specifies: the SRID first, then every point with its Z and M, the
    figures and shapes). Lossless, unlike WKT, whose digits no page promises."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise ValueError(f"expected the serialized bytes of a spatial value, got {type(value).__name__}")
    return bytes(value)


def _variant_binary(text: str) -> bytes:
    if not text.startswith("0x"):
        raise ValueError(f"{text[:60]!r} is not binary as CONVERT style 1 writes it")
    return bytes.fromhex(text[2:])


def _variant_date(text: str) -> str:
    return dt.date.fromisoformat(text).isoformat()


# A sql_variant's base type (SQL_VARIANT_PROPERTY(x, 'BaseType'), which lists
# exactly these: "SQL_VARIANT_PROPERTY (Transact-SQL)") -> how its text, as
# ``mssql_sql.variant_text`` has the server write it, reads back.
VARIANT_TEXT: dict[str, Converter] = {
    "bigint": int,
    "int": int,
    "smallint": int,
    "tinyint": int,
    "bit": lambda text: text == "1",
    "decimal": Decimal,
    "numeric": Decimal,
    "money": Decimal,
    "smallmoney": Decimal,
    "float": float,
    "real": lambda text: to_real(float(text)),
    "char": str,
    "varchar": str,
    "nchar": str,
    "nvarchar": str,
    "uniqueidentifier": to_uuid,
    "binary": _variant_binary,
    "varbinary": _variant_binary,
    "date": _variant_date,
    "datetime2": iso_datetime,
    "datetime": iso_datetime,
    "smalldatetime": iso_datetime,
    "time": iso_time,
    "datetimeoffset": iso_datetimeoffset,
}


def to_variant(value: Any) -> dict[str, Any]:
    """sql_variant as ``{"type": <its base type>, "value": <the value as a
    column of that type reads>}``: a variant's type changes from row to row,
    and the value alone would not say whether ``"5"`` was nvarchar or decimal."""
    base, sep, text = str(value).partition(":")
    read = VARIANT_TEXT.get(base)
    if not sep or read is None:
        raise ValueError(f"sql_variant {str(value)[:60]!r} has no base type cdc-sync knows")
    return {"type": base, "value": read(text)}


# -- the mapping -------------------------------------------------------------

CONVERTERS: dict[str, Converter] = {
    "decimal": to_decimal,
    "numeric": to_decimal,
    "money": to_decimal,
    "smallmoney": to_decimal,
    "bit": to_bool,
    "tinyint": to_int,
    "smallint": to_int,
    "int": to_int,
    "bigint": to_int,
    "float": to_float,
    "real": to_real,
    "date": to_date,
    "time": iso_time,
    "datetime": iso_datetime,
    "datetime2": iso_datetime,
    "smalldatetime": iso_datetime,
    "datetimeoffset": iso_datetimeoffset,
    "uniqueidentifier": to_uuid,
    "binary": to_bytes,
    "varbinary": to_bytes,
    "image": to_bytes,
    "timestamp": to_bytes,  # rowversion: an 8-byte counter
    "char": to_str,
    "varchar": to_str,
    "nchar": to_str,
    "nvarchar": to_str,
    "text": to_str,
    "ntext": to_str,
    "xml": to_str,
    "hierarchyid": to_hierarchyid,
    "geometry": to_spatial,
    "geography": to_spatial,
    "sql_variant": to_variant,
}

# Types a primary key may hold but whose key cannot be mirrored: a keyset
# cursor compares the last key with its next page's, and a variant compares
# by its base type's family first ("sql_variant (Transact-SQL)": a varchar
# and an int never compare as either type does), which no cursor value can
# follow. (geometry, geography, xml, text, ntext and image cannot be key columns.)
_NO_KEY: dict[str, str] = {
    "sql_variant": "a key's values must compare as one type for the table to be read in key order, "
    "and a sql_variant's type changes from row to row",
}
_CLR_FIX = (
    "a CLR user-defined type's value is .NET-serialized bytes that only its assembly can read. Leave the "
    "column out: list the table's other columns under `columns:` in the config; or publish a computed column "
    "that converts it to a standard type (e.g. [{column}_text] AS CAST([{column}] AS nvarchar(4000)), when "
    "the type converts to a string) and list that instead"
)
_UNKNOWN_FIX = (
    "cdc-sync has no JSON encoding for it. Leave the column out: list the table's other columns under "
    "`columns:` in the config; or publish a computed column that converts it to a standard type (e.g. "
    "[{column}_text] AS CAST([{column}] AS nvarchar(max))) and list that instead"
)
_KEY_FIX = (
    "change the column to the one type its values have (ALTER TABLE ... ALTER COLUMN), or leave the table "
    "out of the config"
)


def converter_for(
    table: str,
    column: str,
    base_type: str,
    declared: str | None = None,
    *,
    key: bool = False,
    assembly: bool = False,
) -> Converter:
    """The converter of a column of SQL Server type ``base_type`` (the system
    type under any alias type; a CLR user-defined type's own name, with
    ``assembly``), or UnsupportedType naming table, column, type and the fix."""
    base = base_type.lower()
    shown = declared if declared and declared.lower() != base else base_type
    found = CONVERTERS.get(base)
    if found is None:
        why = (_CLR_FIX if assembly else _UNKNOWN_FIX).format(column=column)
        raise UnsupportedType(f"{table}.{column}: type {shown} cannot be mirrored: {why}")
    if key and base in _NO_KEY:
        raise UnsupportedType(
            f"{table}.{column}: a primary-key column of type {shown} cannot be mirrored: {_NO_KEY[base]}; "
            f"{_KEY_FIX}"
        )
    return found


def convert(converter: Converter, value: Any) -> Any:
    return None if value is None else converter(value)


def format_type(base_type: str, max_length: int, precision: int, scale: int) -> str:
    """The declared spelling of a column type from sys.columns, e.g.
    ``nvarchar(50)``, ``varbinary(max)``, ``decimal(12,2)``, ``datetime2(7)``."""
    base = base_type.lower()
    if base in ("char", "varchar", "binary", "varbinary"):
        return f"{base}({'max' if max_length == -1 else max_length})"
    if base in ("nchar", "nvarchar"):
        return f"{base}({'max' if max_length == -1 else max_length // 2})"
    if base in ("decimal", "numeric"):
        return f"{base}({precision},{scale})"
    if base in ("datetime2", "time", "datetimeoffset"):
        return f"{base}({scale})"
    return base
