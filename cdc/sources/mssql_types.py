"""SQL Server column types to native Python values (DESIGN.md §5).

pyodbc returns most SQL Server types as the right Python type already; this
module pins down the rest so that ``cdc.values`` always sees the same thing
whatever the ODBC driver (Microsoft ODBC Driver 18, or FreeTDS, which returns
some date/time types as strings below TDS 7.3):

==========================================  ======================  ===============
SQL Server type                             Python value            JSON
==========================================  ======================  ===============
decimal, numeric, money, smallmoney         ``Decimal``             string
bit                                         ``bool``                true / false
tinyint, smallint, int, bigint              ``int``                 number
float                                       ``float``               number
real                                        ``float`` (shortest     number
                                            float32 spelling)
date / time                                 ``date`` / ``time``     ISO 8601
datetime, datetime2, smalldatetime          naive ``datetime``      ISO 8601
datetimeoffset                              aware ``datetime``      ISO 8601 +hh:mm
uniqueidentifier                            lowercase ``str``       string
binary, varbinary, image, timestamp         ``bytes``               base64
(rowversion)
char, varchar, nchar, nvarchar, text,       ``str``                 string
ntext, xml
==========================================  ======================  ===============

``sql_variant``, ``geography``, ``geometry``, ``hierarchyid`` and any other
type (CLR user types included) raise ``UnsupportedType`` naming the table,
column and type. Python's datetime holds microseconds: the seventh digit of
``datetime2(7)``, ``time(7)`` and ``datetimeoffset(7)`` is truncated.

pyodbc has no native datetimeoffset: it hands over the ODBC
``SQL_SS_TIMESTAMPOFFSET_STRUCT`` as bytes unless an output converter is
registered for SQL type -155; ``decode_datetimeoffset`` is that converter
(``register_converters`` installs it on a connection).
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


def to_time(value: Any) -> dt.time:
    if isinstance(value, dt.time):
        return value
    if isinstance(value, dt.datetime):
        return value.time()
    return dt.time.fromisoformat(_iso(str(value)))


def to_datetime(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day)
    return dt.datetime.fromisoformat(_iso(str(value)))


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


def to_datetimeoffset(value: Any) -> dt.datetime:
    decoded = decode_datetimeoffset(value)
    assert decoded is not None
    return decoded


def register_converters(connection: Any) -> None:
    """Install the output converters this module needs on a pyodbc connection."""
    connection.add_output_converter(SQL_SS_TIMESTAMPOFFSET, decode_datetimeoffset)


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
    "time": to_time,
    "datetime": to_datetime,
    "datetime2": to_datetime,
    "smalldatetime": to_datetime,
    "datetimeoffset": to_datetimeoffset,
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
}

_WHY_NOT: dict[str, str] = {
    "sql_variant": "its values change type from row to row",
    "geography": "it is a CLR type",
    "geometry": "it is a CLR type",
    "hierarchyid": "it is a CLR type",
}
_HOW_INSTEAD = (
    "leave the column out of `columns:` in the config, or publish a computed column that converts it "
    "(e.g. [Shape_wkt] AS [Shape].STAsText(), [Node_path] AS [Node].ToString(), "
    "CAST([Value] AS nvarchar(4000)))"
)


def converter_for(table: str, column: str, base_type: str, declared: str | None = None) -> Converter:
    """The converter of a column of SQL Server type ``base_type`` (the system
    type under any alias type), or UnsupportedType naming table, column and
    type."""
    base = base_type.lower()
    found = CONVERTERS.get(base)
    if found is not None:
        return found
    shown = declared if declared and declared.lower() != base else base
    why = _WHY_NOT.get(base, "cdc-sync has no JSON mapping for it")
    raise UnsupportedType(
        f"{table}: column {column} has type {shown}, which is not supported ({why}): {_HOW_INSTEAD}"
    )


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
