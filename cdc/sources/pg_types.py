"""How PostgreSQL values are loaded: every value exact, and no value fails a read.

docs/TYPES.md lists every type and its JSON encoding. Nearly every type can
be published; the ``reg*`` types cannot (``pg_catalog.REFERENCE_TYPES``), and
a table with such a column among those the config publishes is refused by
``describe`` (so by ``cdc validate`` and ``cdc run``) and by ``cdc tracking
enable`` (``check_published``), naming the column, its type and the fix.

Values are read in text format, so each arrives as PostgreSQL prints it, and
the loaders registered on every connection (``prepare_session``) decide what
``cdc.values`` then writes:

- the driver's own loaders where its Python value is exact (integers,
  numeric, floats, bool, text, bytea, uuid, dates and times Python can hold);
- json/jsonb as ``RawJson``, the server's own JSON text, never parsed;
- the server's text for types JSON has no better spelling of (inet, ranges,
  geometry, bit strings, tsvector, xml, money, ...; and any type psycopg does
  not know: enums, composites, extension types); ``interval`` as ISO 8601
  (``IntervalStyle = iso_8601``); ``money`` as the number it is (a ``Decimal``);
- dates and times Python cannot hold (``infinity``, years before 1 or after
  9999, ``24:00:00``) as ISO 8601 text (``IsoText``);
- every array through the catalog's own list of array types, so that arrays
  of enums, domains and extension types are arrays too.

A loader never raises: psycopg's row loader would fail the whole read, and a
table would be stuck on one row. A value no loader can read becomes
``cdc.values.Unreadable``, which sends its row to the dead letter naming the
column (``cdc.values``), while the other rows flow.

Sessions run with ``TimeZone = UTC`` (``timestamptz`` values carry ``+00:00``),
``DateStyle = ISO``, ``extra_float_digits = 1`` (floats printed exactly) and
``client_encoding = UTF8`` (JSON text is UTF-8), whatever the server's defaults.
A ``SQL_ASCII`` database stores any bytes, which the server will not convert
to UTF8 (one such value would fail the whole read): its sessions keep
``SQL_ASCII``, and every text is decoded here, a value that is not UTF-8
becoming ``Unreadable`` (``Utf8TextLoader``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import abc
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Dumper, Loader
from psycopg.pq import Format
from psycopg.rows import TupleRow
from psycopg.types.hstore import HstoreLoader

from cdc.errors import UnsupportedType
from cdc.values import RawJson, Unreadable

if TYPE_CHECKING:  # pg_catalog imports this module
    from cdc.config import TableConfig
    from cdc.sources.pg_catalog import CatalogColumn, CatalogTable

Connection = psycopg.AsyncConnection[TupleRow]


def check_supported(table: str, column: CatalogColumn) -> None:
    """Raise UnsupportedType when the column's values cannot be mirrored."""
    if column.refused:
        raise UnsupportedType(f"{table}.{column.name}: {column.refused}")


def check_published(table_config: TableConfig, found: CatalogTable) -> None:
    """``check_supported`` for every column the config publishes (those it
    names that do not exist are ``describe``'s to report)."""
    names = [c.name for c in found.columns] if table_config.columns is None else table_config.columns
    for name in (*found.primary_key, *names):
        column = found.column(name)
        if column is not None:
            check_supported(table_config.table, column)


# -- the session ----------------------------------------------------------------

# The settings, and the scale money is printed with (its currency's, from lc_monetary).
_PREPARE = """
select set_config('TimeZone', 'UTC', false), set_config('IntervalStyle', 'iso_8601', false),
       set_config('DateStyle', 'ISO', false), set_config('extra_float_digits', '1', false),
       set_config('statement_timeout', %s, false), scale(1::money::numeric),
       set_config('client_encoding', case current_setting('server_encoding')
                                     when 'SQL_ASCII' then 'SQL_ASCII' else 'UTF8' end, false),
       current_setting('server_encoding') = 'SQL_ASCII'
"""

# The types loaded by oid: every array type with its element's loader oid (a
# domain element resolved to its base type) and delimiter (a few hundred, a
# millisecond to register), and the hstore extension's type, if installed
# (no element).
_CATALOG_TYPES = """
with recursive bases(oid, base) as (
    select t.oid, t.typbasetype from pg_type t where t.typtype = 'd'
    union all
    select b.oid, t.typbasetype from bases b join pg_type t on t.oid = b.base where t.typtype = 'd'
)
select a.oid, coalesce((select b.base from bases b join pg_type t on t.oid = b.base
                         where b.oid = e.oid and t.typtype <> 'd'), e.oid), e.typdelim::text
  from pg_type a join pg_type e on e.oid = a.typelem
 where a.typoutput = 'array_out'::regproc
union all
select t.oid, null, null
  from pg_type t join pg_depend d on d.classid = 'pg_type'::regclass and d.objid = t.oid and d.deptype = 'e'
  join pg_extension x on x.oid = d.refobjid
 where x.extname = 'hstore' and t.typname = 'hstore'
"""


async def prepare_session(conn: Connection, statement_timeout: float) -> None:
    """Session settings, loaders and dumpers that every connection of the source uses."""
    row = await (await conn.execute(_PREPARE, [f"{int(statement_timeout * 1000)}ms"])).fetchone()
    assert row is not None
    *_, money_scale, _, sql_ascii = row
    adapters = conn.adapters
    for name, loader in _BY_NAME.items():
        adapters.register_loader(name, loader)
    adapters.register_loader("money", _money_loader(money_scale))
    if sql_ascii:
        _decode_any_bytes(conn)
    await _register_catalog_types(conn)
    adapters.register_dumper(IsoText, SourceTextDumper)
    adapters.register_dumper(Money, SourceTextDumper)
    adapters.register_dumper(RawJson, RawJsonDumper)


async def ensure_loaders(conn: Connection, columns: Sequence[tuple[int, bool, str]]) -> None:
    """Make sure ``conn`` loads these columns' types by oid, each given as
    (the oid values arrive with, whether it is an array, base type name): a
    type created since the connection was prepared (an enum's array, say, or
    hstore's) would read as its text."""
    if not all(_loaded(conn, oid, is_array, base) for oid, is_array, base in columns):
        await _register_catalog_types(conn)


def _loaded(conn: Connection, oid: int, is_array: bool, base: str) -> bool:
    if not (is_array or base == "hstore"):
        return True
    loader = conn.adapters.get_loader(oid, Format.TEXT)
    return loader is not None and issubclass(loader, _SafeArray if is_array else SafeHstoreLoader)


async def _register_catalog_types(conn: Connection) -> None:
    for oid, element, delimiter in await (await conn.execute(_CATALOG_TYPES)).fetchall():
        if element is None:
            conn.adapters.register_loader(oid, SafeHstoreLoader)
        else:
            conn.adapters.register_loader(oid, _array_loader(element, delimiter.encode()))


def _decode_any_bytes(conn: Connection) -> None:
    """A SQL_ASCII session: psycopg would return text as bytes; decode it here."""
    for name in _TEXT_TYPES:
        conn.adapters.register_loader(name, Utf8TextLoader)
    conn.adapters.register_loader(0, Utf8TextLoader)  # every type psycopg does not know
    conn.adapters.register_loader("json", Utf8RawJsonLoader)
    conn.adapters.register_loader("jsonb", Utf8RawJsonLoader)


def _driver_loader(type_name: str) -> type[abc.Loader]:
    """psycopg's own text loader of a type: its C implementation where
    psycopg-binary (or psycopg-c) is installed, several times faster."""
    loader = psycopg.adapters.get_loader(psycopg.adapters.types[type_name].oid, Format.TEXT)
    assert loader is not None, type_name
    return loader


# -- loaders that cannot fail ---------------------------------------------------------


class _Safe(Loader):
    """The driver's loader, whose errors become ``fallback``'s value.

    Wraps the driver's loader instead of subclassing it: the C row loader calls
    a C loader's own load, bypassing any override of it in a subclass."""

    driver: type[abc.Loader]
    type_name: str

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        self._load = self.driver(oid, context).load

    def load(self, data: Buffer) -> Any:
        try:
            return self._load(data)
        except Exception as exc:  # any error would fail the whole read
            return self.fallback(bytes(data).decode("utf-8", "replace"), exc)

    def fallback(self, text: str, error: Exception) -> Any:
        return Unreadable(f"{self.type_name} value {_cut(text)} cannot be read: {error}")


class IsoText(str):
    """A date or time Python cannot hold, as its ISO 8601 text (what documents
    and keys show), and ``source``, the server's own text: what is sent back
    when the value is a query parameter (a key in a keyset page's bound)."""

    source: str

    def __new__(cls, iso: str, source: str) -> IsoText:
        self = super().__new__(cls, iso)
        self.source = source
        return self


class _DateTime(_Safe):
    """A date/time type: Python's value where it can hold it, else ISO 8601 text."""

    iso: Callable[[str], str | None]

    def fallback(self, text: str, error: Exception) -> Any:
        iso = type(self).iso(text)
        return super().fallback(text, error) if iso is None else IsoText(iso, text)


def _date_time_loader(type_name: str, iso: Callable[[str], str | None]) -> type[Loader]:
    attributes = {"driver": _driver_loader(type_name), "type_name": type_name, "iso": staticmethod(iso)}
    return type(f"Safe{type_name.title()}Loader", (_DateTime,), attributes)


_DATETIME = re.compile(
    r"(\d{4,})-(\d\d-\d\d)(?: (\d\d:\d\d:\d\d)(?:\.(\d{1,6}))?([+-]\d\d(?::\d\d){0,2})?)?( BC)?"
)
_TIME = re.compile(r"(\d\d:\d\d:\d\d)(?:\.(\d{1,6}))?([+-]\d\d(?::\d\d){0,2})?")
_INFINITE = frozenset({"infinity", "-infinity"})


def iso_datetime(text: str) -> str | None:
    """A date or timestamp[tz] as PostgreSQL prints it (DateStyle ISO) in
    ISO 8601: ``infinity`` and ``-infinity`` as they are; years after 9999 and
    before 1 as ISO 8601 expanded years in astronomical numbering (1 BC is
    year 0, 44 BC year -43): ``+10000-01-01``, ``-0043-03-15T10:00:00``.
    None when the text is none of these."""
    if text in _INFINITE:
        return text
    match = _DATETIME.fullmatch(text)
    if match is None:
        return None
    year, month_day, time, fraction, offset, bc = match.groups()
    iso = f"{_iso_year(1 - int(year) if bc else int(year))}-{month_day}"
    return iso if time is None else f"{iso}T{_iso_time(time, fraction, offset)}"


def iso_time(text: str) -> str | None:
    """A time[tz] as PostgreSQL prints it in ISO 8601 (``24:00:00`` is the end
    of the day in both), or None."""
    match = _TIME.fullmatch(text)
    return None if match is None else _iso_time(*match.groups())


def _iso_year(year: int) -> str:
    if year > 9999:
        return f"+{year}"
    return f"{year:04d}" if year >= 0 else f"-{-year:04d}"


def _iso_time(time: str, fraction: str | None, offset: str | None) -> str:
    """As Python's ``isoformat`` writes it: six fraction digits or none, offset ±hh:mm."""
    text = time if fraction is None else f"{time}.{fraction:0<6}"
    if offset is not None and len(offset) == 3:  # +hh
        offset += ":00"
    return text + (offset or "")


class RawJsonLoader(Loader):
    """json/jsonb: the server's JSON text, never parsed (``cdc.values.RawJson``).

    Unless it escapes half a UTF-16 surrogate pair (``"\\ud800"``), which a
    json (not jsonb) value may: that names no character, so no UTF-8 reader
    can hold it (orjson, which the subscribers use, refuses the whole
    message), and the row goes to the dead letter, as a text column's lone
    surrogate does on SQL Server."""

    def load(self, data: Buffer) -> RawJson | Unreadable:
        text = bytes(data)
        if _SURROGATE_HINT.search(text) is not None and (lone := _lone_surrogate(text)):
            return Unreadable(
                f"json value escapes half a UTF-16 surrogate pair ({lone}), which names no character "
                "and which JSON readers refuse; escape the whole pair, or store the text another way"
            )
        return RawJson(text)


# Where a text may escape a surrogate (\\ud..., \\uD...): one regular
# expression search, 4x faster than the two ``in`` tests it replaces (measured
# on this machine's CPython 3.11: 0.22 against 0.9 us on a 45-byte value; a
# bytes ``in`` costs ~0.4 us whatever the length), once per json value read.
_SURROGATE_HINT = re.compile(rb"\\u[dD]")

# An escape: a surrogate pair, half a pair (group 1), or any other (so that
# "\\\\ud800", an escaped backslash and then letters, is not taken for one).
_ESCAPE = re.compile(
    rb"\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|(u[dD][89a-fA-F][0-9a-fA-F]{2})|.)"
)


def _lone_surrogate(text: bytes) -> str | None:
    """The first half surrogate pair ``text`` escapes, as written (``\\ud800``), or None."""
    for match in _ESCAPE.finditer(text):
        if match.group(1):
            return "\\" + match.group(1).decode()
    return None


class Utf8TextLoader(Loader):
    """Text from a SQL_ASCII database, which stores any bytes: UTF-8, or Unreadable."""

    def load(self, data: Buffer) -> str | Unreadable:
        raw = bytes(data)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _not_utf8(raw, exc)


class Utf8RawJsonLoader(RawJsonLoader):
    """JSON text from a SQL_ASCII database: checked to be UTF-8 first."""

    def load(self, data: Buffer) -> RawJson | Unreadable:
        raw = bytes(data)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _not_utf8(raw, exc)
        return super().load(raw)


def _not_utf8(raw: bytes, error: UnicodeDecodeError) -> Unreadable:
    return Unreadable(
        f"text {_cut(raw.decode('utf-8', 'replace'))} is not UTF-8 (byte {error.start}: {error.reason}); "
        "the database's encoding is SQL_ASCII, which stores any bytes: correct the value, or store bytes as bytea"
    )


class IsoIntervalLoader(Loader):
    """An interval as the server prints it under IntervalStyle iso_8601:
    psycopg's ``timedelta`` would turn a month into 30 days."""

    def load(self, data: Buffer) -> str:
        return bytes(data).decode("ascii")


class Money(Decimal):
    """A money value as the number it is, and ``source``, the server's own
    text: what is sent back when it is a query parameter (a key in a keyset
    page's bound; the server has no money = numeric operator)."""

    __slots__ = ("source",)
    source: str


class MoneyLoader(Loader):
    """money as the number it is: its digits, ``scale`` of them after the
    point. The server prints it for its lc_monetary (``$1,234.56``,
    ``-1.234,56 €``, ``($5.00)``), with exactly ``scale`` fraction digits,
    the scale ``money::numeric`` gives too."""

    scale = 2

    def load(self, data: Buffer) -> Money | Unreadable:
        raw = bytes(data)
        text = raw.decode("utf-8", "replace")
        digits = _NOT_DIGITS.sub(b"", raw)
        if not digits:
            return Unreadable(f"money value {_cut(text)} has no digits")
        sign = "-" if b"-" in raw or b"(" in raw else ""
        value = Money(f"{sign}{int(digits)}E-{self.scale}")
        value.source = text
        return value


_NOT_DIGITS = re.compile(rb"[^0-9]")


@functools.cache
def _money_loader(scale: int) -> type[Loader]:
    return type("MoneyLoader", (MoneyLoader,), {"scale": scale})


class SafeHstoreLoader(_Safe):
    """hstore (the extension) as a JSON object of strings (null for NULL)."""

    driver = HstoreLoader
    type_name = "hstore"


class _SafeArray(_Safe):
    """An array as a JSON array (of arrays, for several dimensions), its
    elements loaded by their own (safe) loaders."""

    type_name = "array"

    def load(self, data: Buffer) -> Any:
        if len(data) and data[0] == ord("["):
            text = _cut(bytes(data).decode("utf-8", "replace"))
            return Unreadable(
                f"array {text} does not start at index 1, which a JSON array cannot say; "
                "store it from index 1 (one dimension: col = col[array_lower(col, 1):])"
            )
        return super().load(data)


@functools.cache
def _array_loader(element: int, delimiter: bytes) -> type[Loader]:
    """The loader of an array type: psycopg's own (C where available) over the
    element's loader. Cached: a class psycopg's C code derives from is never freed."""
    int4_array = psycopg.adapters.get_loader(psycopg.adapters.types["int4"].array_oid, Format.TEXT)
    assert int4_array is not None
    base = int4_array.__bases__[0]  # psycopg's ArrayLoader, of which its int4[] loader is one
    driver = type(f"Array{element}Loader", (base,), {"base_oid": element, "delimiter": delimiter})
    return type(f"SafeArray{element}Loader", (_SafeArray,), {"driver": driver})


def _cut(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


_TEXT = _driver_loader("text")
_RANGES = tuple(
    f"{kind}{shape}"
    for kind in ("int4", "int8", "num", "ts", "tstz", "date")
    for shape in ("range", "multirange")
)
_INT = _driver_loader("int8")

# The types psycopg loads with its text loader (as bytes, in a SQL_ASCII
# session), and those loaded with it here.
_TEXT_TYPES = ("text", "varchar", "bpchar", "name", '"char"', "inet", "cidr", *_RANGES)

# Loaders by type name, on top of psycopg's; the array types, money and hstore
# are registered by oid.
_BY_NAME: dict[str, type[abc.Loader]] = {
    "json": RawJsonLoader,
    "jsonb": RawJsonLoader,
    "interval": IsoIntervalLoader,
    "date": _date_time_loader("date", iso_datetime),
    "timestamp": _date_time_loader("timestamp", iso_datetime),
    "timestamptz": _date_time_loader("timestamptz", iso_datetime),
    "time": _date_time_loader("time", iso_time),
    "timetz": _date_time_loader("timetz", iso_time),
    # integers psycopg leaves as text
    "xid": _INT,
    "xid8": _INT,
    "cid": _INT,
    # the server's text, not psycopg's objects (ipaddress, Range) that JSON cannot hold
    **dict.fromkeys(("inet", "cidr"), _TEXT),
    **dict.fromkeys(_RANGES, _TEXT),
}


# -- dumpers: loaded values sent back as parameters (a keyset page's bound) --------


class SourceTextDumper(Dumper):
    """``IsoText`` and ``Money`` as the server's text, of unknown type: the
    server reads it as the type of what it is compared with."""

    def dump(self, obj: IsoText | Money) -> Buffer:
        return obj.source.encode()


class RawJsonDumper(Dumper):
    """A json/jsonb key value as its text, of unknown type (as ``SourceTextDumper``)."""

    def dump(self, obj: RawJson) -> Buffer:
        return obj.text
