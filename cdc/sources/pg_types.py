"""Which PostgreSQL column types cdc-sync publishes, and how they are loaded.

Every published value must reach Redis as lossless JSON (DESIGN.md §5), so a
column whose type has no such mapping is refused when the table is described
(``UnsupportedType``), not discovered row by row later. Most supported types
load into the native Python values that ``cdc.values`` encodes (int, Decimal,
float, bool, str, bytes, UUID, date/time, dict/list for JSON). Some loaders are
replaced on every connection the source opens:

- ``interval`` loads as its ISO 8601 text (the session runs with
  ``IntervalStyle = iso_8601``): psycopg's ``timedelta`` would turn a month
  into 30 days, and a month is not a fixed number of days.
- ``date``/``timestamp``/``timestamptz`` values that Python cannot hold
  (``infinity``, years beyond 9999) load as their text instead of failing:
  one such row must not stop a whole table from being read.
- ``json``/``jsonb`` load with orjson where it is exact (``load_json``):
  every row of a net-change read carries one (its changed columns), so the
  standard library's decoder was a tenth of a read's time.

Sessions also run with ``TimeZone = UTC``, so ``timestamptz`` values carry an
explicit UTC offset whatever the server's default is.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import psycopg
from psycopg import abc
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Loader
from psycopg.pq import Format
from psycopg.rows import TupleRow
from psycopg.types.json import set_json_loads

from cdc.errors import UnsupportedType
from cdc.sources.pg_catalog import CatalogColumn

# pg_type.typname of the supported base types (array elements and domains are
# resolved to these before the check); enums are supported too, as strings.
SUPPORTED_TYPES = frozenset(
    {
        "int2", "int4", "int8", "numeric", "float4", "float8", "bool",
        "text", "varchar", "bpchar", "bytea", "uuid",
        "date", "time", "timestamp", "timestamptz", "interval",
        "json", "jsonb",
        "citext",  # the extension's case-insensitive text: read as text
    }
)  # fmt: skip


def check_supported(table: str, column: CatalogColumn) -> None:
    """Raise UnsupportedType unless the column's values map losslessly to JSON."""
    if column.custom_array:
        problem = "is an array of a type that is not built in, which the driver reads as unparsed text"
    elif column.is_enum or column.base_type in SUPPORTED_TYPES:
        return
    else:
        problem = "has no lossless JSON mapping"
    raise UnsupportedType(
        f"{table}.{column.name}: type {column.type_name} {problem}; leave the column out of the "
        f"table's 'columns' or change its type. Supported: integers, numeric, real/double, boolean, "
        f"text/varchar/char, bytea, uuid, date, time, timestamp, timestamptz, interval, json, jsonb, "
        f"citext, enums, domains over these, and arrays of the built-in ones"
    )


async def prepare_session(conn: psycopg.AsyncConnection[TupleRow], statement_timeout: float) -> None:
    """Session settings and loaders that every connection of the source uses."""
    await conn.execute(
        "select set_config('TimeZone', 'UTC', false), set_config('IntervalStyle', 'iso_8601', false),"
        " set_config('statement_timeout', %s, false)",
        [f"{int(statement_timeout * 1000)}ms"],
    )
    conn.adapters.register_loader("interval", IsoIntervalLoader)
    conn.adapters.register_loader("date", TolerantDateLoader)
    conn.adapters.register_loader("timestamp", TolerantTimestampLoader)
    conn.adapters.register_loader("timestamptz", TolerantTimestamptzLoader)
    set_json_loads(load_json, conn)


class IsoIntervalLoader(Loader):
    """An interval as the server prints it under IntervalStyle iso_8601."""

    def load(self, data: Buffer) -> str:
        return bytes(data).decode("ascii")


def _driver_loader(type_name: str) -> type[abc.Loader]:
    """psycopg's own text loader of a type: its C implementation where
    psycopg-binary (or psycopg-c) is installed, several times faster."""
    loader = psycopg.adapters.get_loader(psycopg.adapters.types[type_name].oid, Format.TEXT)
    assert loader is not None, type_name
    return loader


class _KeepTextWhenOutOfRange(Loader):
    """Fall back to the server's text where Python's datetime cannot hold the value.

    Wraps the driver's loader instead of subclassing it: the C row loader calls
    a C loader's own load, bypassing any override of it in a subclass."""

    driver: type[abc.Loader]

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        self._load = self.driver(oid, context).load

    def load(self, data: Buffer) -> Any:
        try:
            return self._load(data)
        except psycopg.DataError:
            return bytes(data).decode("ascii")


class TolerantDateLoader(_KeepTextWhenOutOfRange):
    driver = _driver_loader("date")


class TolerantTimestampLoader(_KeepTextWhenOutOfRange):
    driver = _driver_loader("timestamp")


class TolerantTimestamptzLoader(_KeepTextWhenOutOfRange):
    driver = _driver_loader("timestamptz")


_LONG_DIGITS = re.compile(rb"[0-9]{19}")  # a number that may not fit 64 bits


def load_json(data: str | bytes) -> Any:
    """json/jsonb values: orjson where it is exact, else the standard library.

    orjson reads an integer beyond 64 bits as a float (losing digits), so text
    with 19 digits in a row (in a number or not) goes to ``json.loads``, as
    does anything orjson refuses (lone surrogates, 1e400, deep nesting)."""
    raw = data.encode() if isinstance(data, str) else data
    if not _LONG_DIGITS.search(raw):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)
