"""A snapshot's pages with PostgreSQL writing the JSON text of most columns.

Why: mapping a snapshot row in Python (psycopg loading ten values, then
``cdc.values`` encoding them) cost the sidecar ~20 µs a row, half its CPU
in the snapshot (py-spy, bench/RESULTS.md "Snapshot"). For the types below
PostgreSQL's own JSON text is byte for byte what ``cdc.values`` writes for the
value psycopg loads, so the server writes it, and a row arrives as ONE text:
the columns' JSON texts joined by U+0001, which JSON text never holds raw (a
string escapes every control character: RFC 8259 §7; PostgreSQL's
``escape_json`` writes it ``\\u0001``). The other columns (dates and times,
floats, arrays, bytea...: their JSON spelling here differs from
PostgreSQL's) are read as values and encoded in Python, as a change's are.
``tests/cdc/test_snapshot_fast.py`` compares the documents of both paths over
the type zoo.

- integers: the digits (Python: ``%d``);
- boolean: ``true`` / ``false``;
- text, varchar: ``to_json`` escapes ``"``, ``\\``, and control characters
  (``\\b \\f \\n \\r \\t``, others ``\\u00xx``), as orjson does; only in a UTF8
  database (a SQL_ASCII one may hold bytes that are no UTF-8);
- jsonb: its output text (what the json loader passes through), in a UTF8
  database only (as text);
- numeric: its text as a JSON string (``"12.50"``, ``"NaN"``, ``"Infinity"``:
  what ``cdc.values`` writes of the Decimal read from that text);
- uuid: the lowercase text as a JSON string;
- date, timestamp, timestamptz and double precision, in the range where the
  server's spelling converts to ``cdc.values``'s by text alone (years 1 to
  9999; doubles that both print in fixed point). Any other value (infinity,
  a year beyond 9999 or BC, NaN, 1e+15...) is written as ``ODD`` and its
  output text: the mapper loads that text with the session's own loader and
  encodes it in Python (``SnapshotPage.loaders``), exactly as the plain path
  would, dead letter included (a NaN).

Dates, times and doubles in Python cost the sidecar ~1.8 µs a row of the
bench table (a timestamptz, a double, a date: psycopg's loaders, the
``_Safe`` wrapper, orjson; py-spy, 300,000 rows); PostgreSQL writes them for
~0.7 µs of its own.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from psycopg.pq import Format

from cdc.sources import pg_reads
from cdc.sources.base import ENCODED_ODD, ENCODED_SEPARATOR, Column, SnapshotPage, TableInfo
from cdc.sources.pg_catalog import Connection

SEPARATOR = ENCODED_SEPARATOR
ODD = ENCODED_ODD
_OUTPUT = {"smallint", "integer", "bigint"}  # the type's output text is its JSON text
# jsonb's output text is its JSON text too, but only in a UTF8 database: a SQL_ASCII one
# may hold bytes that are no UTF-8 in a jsonb string, and the row's whole text would then
# be unreadable, where the Python path dead-letters that one row naming the column.
_OUTPUT_UTF8 = {"jsonb"}
_QUOTED = {"uuid"}  # its output text, quoted: nothing in it needs escaping
_TEXT = {"text"}
_NUMERIC = re.compile(r"^numeric(\(\d+(,\s*\d+)?\))?$")
_VARCHAR = re.compile(r"^character varying(\(\d+\))?$")
_TIMESTAMP = re.compile(r"^timestamp(\(\d\))? with(out)? time zone$")

# psycopg's name of each type whose odd values the mapper loads (``loaders``).
_LOADED = {"date": "date", "double precision": "float8"}

# The server's text of a value where it is ``cdc.values``'s JSON text but for
# quotes ({0}: the column), and when it is ({1}: a condition). Dates: DateStyle
# ISO prints years 1 to 9999 with four digits, as orjson does. Timestamps:
# ``to_char`` writes the six fraction digits orjson writes, ``replace`` drops
# them when they are all zero, as orjson does (no other part of the text has a
# '.'); the session's TimeZone is UTC (``pg_types.prepare_session``), so a
# timestamptz's offset is +00:00. Doubles (extra_float_digits = 1: the
# shortest exact digits, as orjson's): the server prints 1e-4 <= |x| < 1e15
# in fixed point, orjson too (from 1e-5 to below 1e16), an integral value
# without ".0", which orjson adds (-0 included).
_DATE_TIME_RANGE = "{0} between {2} '0001-01-01' and {2} '9999-12-31 23:59:59.999999'"
_TIMESTAMP_TEXT = "replace(to_char({0}, 'YYYY-MM-DD\"T\"HH24:MI:SS.US'), '.000000', '')"
_FORMS: dict[str, tuple[str, str]] = {
    "date": ("{0} between date '0001-01-01' and date '9999-12-31'", "'\"' || {0}::text || '\"'"),
    "timestamp": (_DATE_TIME_RANGE.replace("{2}", "timestamp"), "'\"' || " + _TIMESTAMP_TEXT + " || '\"'"),
    "timestamptz": (
        _DATE_TIME_RANGE.replace("{2}", "timestamptz"),
        "'\"' || " + _TIMESTAMP_TEXT + " || '+00:00\"'",
    ),
    "float8": (
        "{0} = 0 or abs({0}) >= float8 '1e-4' and abs({0}) < float8 '1e15'",
        "case when {0} = trunc({0}) then {0}::text || '.0' else {0}::text end",
    ),
}


def json_expression(column: Column, *, utf8: bool, table: str | None = None) -> sql.Composable | None:
    """The SQL that writes ``column``'s JSON text exactly as ``cdc.values``
    would (never NULL: ``null`` for a NULL), or None when Python must.
    The type's own output text where it is the JSON text (``to_json`` writes
    the same through its per-value type lookup, which cost PostgreSQL a
    third more CPU a row: 0.87 s against 0.62 s for the bench table's seven
    columns of 200,000 rows, same session)."""
    name = sql.Identifier(column.name) if table is None else sql.Identifier(table, column.name)
    kind = column.type_name
    loaded = loaded_type(column)
    text: sql.Composable
    if loaded is not None:
        when, then = _FORMS[loaded]
        text = sql.SQL("case when " + when + " then " + then + " else {1} || {0}::text end").format(
            name, sql.Literal(ODD)
        )
    elif kind in _OUTPUT or (utf8 and kind in _OUTPUT_UTF8):
        text = sql.SQL("{}::text").format(name)
    elif kind == "boolean":
        text = sql.SQL("case when {0} then 'true' when not {0} then 'false' end").format(name)
    elif kind in _QUOTED or _NUMERIC.match(kind):
        text = sql.SQL("'\"' || {}::text || '\"'").format(name)
    elif utf8 and (kind in _TEXT or _VARCHAR.match(kind)):
        text = sql.SQL("to_json({})::text").format(name)
    else:
        return None
    return sql.SQL("coalesce({}, 'null')").format(text)


def loaded_type(column: Column) -> str | None:
    """psycopg's name of the column's type when its JSON text is written by
    the server but for odd values, which the mapper loads; else None."""
    if _TIMESTAMP.match(column.type_name):
        return "timestamptz" if "without" not in column.type_name else "timestamp"
    return _LOADED.get(column.type_name)


def odd_loaders(conn: Connection, columns: tuple[Column, ...]) -> dict[str, Callable[[str], Any]]:
    """For each column with odd values (``loaded_type``), the session's own
    loader of its text: what the plain path's read would have returned."""
    loaders: dict[str, Callable[[str], Any]] = {}
    for column in columns:
        name = loaded_type(column)
        if name is not None:
            oid = conn.adapters.types[name].oid
            loader_class = conn.adapters.get_loader(oid, Format.TEXT)
            assert loader_class is not None, name
            loaders[column.name] = _text_loader(loader_class(oid, conn).load)
    return loaders


def _text_loader(load: Callable[[bytes], Any]) -> Callable[[str], Any]:
    return lambda text: load(text.encode())


@dataclass(frozen=True)
class Bounds:
    """A snapshot's keys: above ``after`` (the last key read), or at or above
    ``start`` (a range's first page), and at or below ``until``. Values in
    key order; text is read as the column's type (as ``pg_keyed`` reads keys:
    an untyped parameter)."""

    after: tuple[Any, ...] | None = None
    start: tuple[Any, ...] | None = None
    until: tuple[Any, ...] | None = None

    def next(self, last: tuple[Any, ...]) -> Bounds:
        """The bounds of the page after the key ``last``."""
        return Bounds(last, None, self.until)


@dataclass(frozen=True)
class EncodedSelect:
    """A select whose rows are: the primary key's values, the JSON texts of
    ``encoded`` joined by ``SEPARATOR``, then the values of ``plain``."""

    encoded: tuple[str, ...]
    plain: tuple[str, ...]
    select: sql.Composed
    odd: tuple[Column, ...] = ()  # the encoded columns that may hold an ODD value


def encoded_select(info: TableInfo, *, ordinary: bool, utf8: bool) -> EncodedSelect:
    encoded: list[tuple[str, sql.Composable]] = []
    plain: list[str] = []
    for column in info.columns:
        expression = json_expression(column, utf8=utf8)
        if expression is None:
            plain.append(column.name)
        else:
            encoded.append((column.name, expression))
    keys = sql.SQL(", ").join(map(sql.Identifier, info.primary_key))
    joined = sql.SQL("concat_ws({}, {})").format(
        sql.Literal(SEPARATOR), sql.SQL(", ").join(e for _, e in encoded) if encoded else sql.SQL("''")
    )
    select = sql.SQL("select {}, {}{} from {}").format(
        keys,
        joined,
        sql.SQL("").join(sql.SQL(", {}").format(sql.Identifier(c)) for c in plain),
        pg_reads.source_relation(info, ordinary=ordinary),
    )
    odd = tuple(c for c in info.columns if c.name not in plain and loaded_type(c) is not None)
    return EncodedSelect(tuple(c for c, _ in encoded), tuple(plain), select, odd)


def page_query(select: sql.Composable, info: TableInfo, bounds: Bounds) -> tuple[sql.Composed, list[Any]]:
    """``select`` limited to a keyset page within ``bounds``: the query and
    its parameters but the limit (the last one)."""
    keys = sql.SQL(", ").join(map(sql.Identifier, info.primary_key))
    marks = sql.SQL(", ").join(sql.Placeholder() * len(info.primary_key))
    where: list[sql.Composable] = []
    params: list[Any] = []
    for values, operator in ((bounds.after, ">"), (bounds.start, ">="), (bounds.until, "<=")):
        if values is not None:
            where.append(sql.SQL("({}) {} ({})").format(keys, sql.SQL(operator), marks))
            params += [_parameter(v, c) for v, c in zip(values, _key_types(info), strict=True)]
    condition = sql.SQL(" where ") + sql.SQL(" and ").join(where) if where else sql.SQL("")
    query = sql.SQL("{}{} order by {} limit %s").format(select, condition, keys)
    return query, params


def _key_types(info: TableInfo) -> list[str]:
    types = {c.name: c.type_name for c in info.columns}
    return [types.get(k, "") for k in info.primary_key]


def _parameter(value: Any, type_name: str) -> Any:
    """A key value as a parameter: bytea given as hex text decoded (``pg_keyed``)."""
    if type_name == "bytea" and isinstance(value, str):
        return bytes.fromhex(value)
    return value


async def utf8_database(conn: Connection) -> bool:
    row = await (await conn.execute("select current_setting('server_encoding') = 'UTF8'")).fetchone()
    return bool(row and row[0])


async def _records(
    conn: Connection, select: sql.Composable, info: TableInfo, bounds: Bounds, page_size: int
) -> list[Any]:
    query, params = page_query(select, info, bounds)
    return await pg_reads.fetch_all(await conn.execute(query, [*params, page_size]))


async def plain_pages(
    conn: Connection,
    info: TableInfo,
    version: int,
    total: int | None,
    page_size: int,
    bounds: Bounds,
    ordinary: bool,
) -> AsyncIterator[SnapshotPage]:
    """Keyset pages within ``bounds``, every column a value; the first page
    even when empty (the caller learns the version)."""
    select = sql.SQL("select {} from {}").format(
        sql.SQL(", ").join(map(sql.Identifier, info.column_names)),
        pg_reads.source_relation(info, ordinary=ordinary),
    )
    first = True
    while True:
        records = await _records(conn, select, info, bounds, page_size)
        if records or first:
            rows = [dict(zip(info.column_names, r, strict=True)) for r in records]
            yield SnapshotPage(version, rows, total, _last_key(records, len(info.primary_key)))
        first = False
        if len(records) < page_size:
            return
        bounds = bounds.next(tuple(records[-1][: len(info.primary_key)]))


async def encoded_pages(
    conn: Connection,
    info: TableInfo,
    version: int,
    total: int | None,
    page_size: int,
    bounds: Bounds,
    ordinary: bool,
) -> AsyncIterator[SnapshotPage]:
    """``plain_pages`` with most columns' JSON text written by the server
    (``SnapshotPage.records``)."""
    query = encoded_select(info, ordinary=ordinary, utf8=await utf8_database(conn))
    loaders = odd_loaders(conn, query.odd)
    width = len(info.primary_key)
    first = True
    while True:
        records = await _records(conn, query.select, info, bounds, page_size)
        if records or first:
            last = _last_key(records, width)
            yield SnapshotPage(version, [], total, last, query.encoded, query.plain, records, loaders)
        first = False
        if len(records) < page_size:
            return
        bounds = bounds.next(tuple(records[-1][:width]))


def _last_key(records: list[Any], width: int) -> tuple[Any, ...] | None:
    return tuple(records[-1][:width]) if records else None
