"""The SQL Server source: Change Tracking read through pyodbc.

It follows Microsoft's documented pattern and the checklist in SQLSERVER.md:

- every poll is one ``SET TRANSACTION ISOLATION LEVEL SNAPSHOT`` transaction
  that reads ``CHANGE_TRACKING_MIN_VALID_VERSION(OBJECT_ID(...))`` (NULL is
  an error, never a pass), then ``CHANGE_TRACKING_CURRENT_VERSION()``, checks
  ``since < min_valid`` and ``current < since`` (both ``TrackingExpired``),
  then reads ``CHANGETABLE(CHANGES ...) LEFT JOIN`` the table in
  (version, primary key) order, and commits; ``next_version`` is the current
  version read in that transaction, even when no row came back;
- a read of more than one page keeps every page in that one SNAPSHOT
  transaction, held open on a reader connection of its own between the
  caller's calls and committed with the last page (``_HeldRead``): pages read
  in separate transactions would see a row changed in between only in the
  next read, relative to the bound, so as a ``U`` the caller never had the
  ``I`` of, and without the columns changed before the bound;
- the snapshot reads the current version and the whole table (keyset pages on
  the primary key) in one SNAPSHOT transaction on a connection of its own;
- pyodbc blocks: each connection has one thread of its own and every call on
  it runs there (``_Link``), never on the event loop;
- driver errors are mapped onto ``cdc.errors`` here: link failures, timeouts
  and deadlocks are ``SourceUnavailable`` (retried) while running and
  ``ConnectError`` (exit code 3) at start-up; missing permissions are
  ``SourceError`` naming the permission. Messages never carry the password.

The T-SQL text lives in ``cdc.sources.mssql_sql``, the type mapping in
``cdc.sources.mssql_types``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import math
import re
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pyodbc

from cdc.config import SourceConfig, TableConfig
from cdc.durations import format_duration
from cdc.errors import (
    CdcError,
    ConnectError,
    SchemaError,
    SourceError,
    SourceUnavailable,
    TrackingExpired,
    TrackingNotEnabled,
    TransientError,
    UnsupportedType,
)
from cdc.sources import mssql_sql as sql
from cdc.sources.base import (
    ChangePage,
    ChangeRow,
    Column,
    Cursor,
    Finding,
    Op,
    SnapshotPage,
    TableInfo,
    TrackingStatus,
)
from cdc.sources.mssql_types import Converter, convert, converter_for, format_type, register_converters

T = TypeVar("T")

# -- the connection string ----------------------------------------------------


def parse_dsn(dsn: str) -> dict[str, str]:
    """An ODBC connection string as {UPPER-CASE KEY: value}; ``{...}`` values
    may hold ``;`` and ``}}`` (an escaped ``}``)."""
    out: dict[str, str] = {}
    i, n = 0, len(dsn)
    while i < n:
        while i < n and dsn[i] in "; \t\r\n":
            i += 1
        eq = dsn.find("=", i)
        if i >= n or eq < 0:
            break
        key = dsn[i:eq].strip().upper()
        i = eq + 1
        while i < n and dsn[i] in " \t":
            i += 1
        if i < n and dsn[i] == "{":
            value, i = _braced(dsn, i + 1)
        else:
            end = dsn.find(";", i)
            end = n if end < 0 else end
            value, i = dsn[i:end].strip(), end
        out[key] = value
    return out


def _braced(dsn: str, i: int) -> tuple[str, int]:
    chars: list[str] = []
    while i < len(dsn):
        if dsn[i] == "}":
            if dsn[i + 1 : i + 2] == "}":
                chars.append("}")
                i += 2
                continue
            return "".join(chars), i + 1
        chars.append(dsn[i])
        i += 1
    return "".join(chars), i


def describe_dsn(dsn: str) -> str:
    """Where a DSN points, for messages: server, port, database, driver, user; never the password."""
    fields = parse_dsn(dsn)
    shown = []
    for label, keys in (
        ("dsn", ("DSN",)),
        ("server", ("SERVER", "ADDRESS", "ADDR", "HOST", "SERVERNAME")),
        ("port", ("PORT",)),
        ("database", ("DATABASE", "INITIAL CATALOG")),
        ("driver", ("DRIVER",)),
        ("user", ("UID", "USER ID", "USER")),
    ):
        value = next((fields[k] for k in keys if fields.get(k)), None)
        if value:
            shown.append(f"{label}={value}")
    return ", ".join(shown) or "the configured DSN"


_SECRET = re.compile(r"(?i)\b(pwd|password)\s*=\s*(\{(?:[^}]|\}\})*\}|[^;]*)")


def redact(text: str, dsn: str) -> str:
    """``text`` without the DSN's password, however it appears."""
    password = parse_dsn(dsn).get("PWD") or parse_dsn(dsn).get("PASSWORD")
    if password:
        text = text.replace(password, "***")
    return _SECRET.sub(lambda m: f"{m.group(1)}=***", text)


# -- driver errors -> cdc.errors ---------------------------------------------

# SQLSTATEs worth retrying: the link, a timeout, a deadlock or serialization failure.
TRANSIENT_STATES = frozenset({"08001", "08003", "08004", "08007", "08S01", "HYT00", "HYT01", "40001"})
# SQL Server (and FreeTDS) error numbers worth retrying whatever the SQLSTATE.
TRANSIENT_ERRORS = frozenset(
    {
        233,  # no process on the other end of the pipe
        1205,  # chosen as deadlock victim
        1222,  # lock request time out
        3960,  # snapshot update conflict
        3961,  # snapshot: the object was changed by DDL since the transaction started
        10053,  # transport-level error
        10054,  # connection reset
        10060,  # network timeout
        20003,  # FreeTDS: server connection timed out
        20004,  # FreeTDS: read from the server failed
        20006,  # FreeTDS: write to the server failed
        20009,  # FreeTDS: unable to connect
        20047,  # FreeTDS: connection dead
        40197,  # Azure: service error, retry
        40501,  # Azure: service busy
        40613,  # Azure: database unavailable
        49918,  # Azure: not enough resources
        49919,
        49920,
    }
)
PERMISSION_ERRORS = frozenset({229, 230, 262, 297, 300, 916, 5011, 15247})
SNAPSHOT_NOT_ALLOWED = 3952
NO_PRIMARY_KEY = 4997
TRACKING_OFF_ON_TABLE = 22105
_NATIVE = re.compile(r"\((-?\d+)\)\s*(?=\(SQL\w*\)|;|$)")
_PERMISSION = re.compile(r"(?:The )?([A-Z][A-Z ]*[A-Z]) permission (?:was )?denied")
_DRIVER_TAGS = re.compile(
    r"\[(?:[0-9A-Z]{5}|Microsoft|unixODBC|FreeTDS|Driver Manager|ODBC[^\]'\"]*|[^\]'\"]*SQL Server)\]\s*"
)


def error_parts(exc: BaseException) -> tuple[str, set[int], str]:
    """(SQLSTATE, native error numbers, cleaned message) of a pyodbc error."""
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    state = args[0] if len(args) >= 2 and isinstance(args[0], str) else ""
    message = str(args[-1]) if args else str(exc)
    natives = {int(n) for n in _NATIVE.findall(message)}
    text = _DRIVER_TAGS.sub("", message)
    text = _NATIVE.sub("", text)
    text = re.sub(r"\s*\(SQL\w*\)", "", text).strip(" ;")
    if natives:
        text += f" (error {', '.join(str(n) for n in sorted(natives))})"
    return state, natives, text


def map_error(exc: BaseException, dsn: str, context: str = "") -> CdcError:
    """A pyodbc error raised while running, as a ``cdc.errors`` error."""
    state, natives, text = error_parts(exc)
    text = redact(text, dsn)
    where = f"{context}: " if context else ""
    if state in TRANSIENT_STATES or natives & TRANSIENT_ERRORS:
        return SourceUnavailable(f"{where}SQL Server is unavailable ({describe_dsn(dsn)}): [{state}] {text}")
    if SNAPSHOT_NOT_ALLOWED in natives:
        return SourceError(
            f"{where}snapshot isolation is not allowed in this database: run `cdc tracking enable` "
            f"or ALTER DATABASE CURRENT SET ALLOW_SNAPSHOT_ISOLATION ON ({text})"
        )
    if TRACKING_OFF_ON_TABLE in natives:
        return TrackingNotEnabled(f"{where}change tracking is not enabled: {text}")
    if natives & PERMISSION_ERRORS or "permission" in text.lower() and "denied" in text.lower():
        match = _PERMISSION.search(text)
        missing = f"the {match.group(1)} permission" if match else "a permission"
        return SourceError(f"{where}the login lacks {missing}: {text}")
    if NO_PRIMARY_KEY in natives:
        return SchemaError(f"{where}change tracking needs a primary key: {text}")
    return SourceError(f"{where}SQL Server error [{state}]: {text}")


def connect_error(exc: BaseException, dsn: str, at_startup: bool) -> CdcError:
    """A pyodbc error raised while opening a connection: ConnectError (exit
    code 3) at start-up, SourceUnavailable (retried) when reconnecting."""
    state, natives, text = error_parts(exc)
    text = redact(text, dsn)
    hint = _connect_hint(state, natives, text)
    message = f"cannot connect to SQL Server ({describe_dsn(dsn)}): [{state}] {text}{hint}"
    return ConnectError(message) if at_startup else SourceUnavailable(message)


def _connect_hint(state: str, natives: set[int], text: str) -> str:
    lowered = text.lower()
    if state == "IM002" or "can't open lib" in lowered or "data source name not found" in lowered:
        installed = ", ".join(pyodbc.drivers()) or "none"
        return (
            f". The ODBC driver named in the DSN is not installed (installed: {installed}); "
            "see docs/SQLSERVER.md for the Microsoft ODBC Driver 18 and FreeTDS DSNs"
        )
    if state == "28000" or 18456 in natives:
        return ". Login failed: check UID and PWD, and that the login maps to a user in the database"
    if "certificate" in lowered or "ssl" in lowered or "tls" in lowered:
        return (
            ". TLS failed: ODBC Driver 18 encrypts by default; trust the server's certificate "
            "(or, for a test server only, add TrustServerCertificate=yes)"
        )
    if state.startswith("08") or state.startswith("HYT") or natives & TRANSIENT_ERRORS:
        return ". Is the server up, and are the host and port right?"
    return ""


# -- one connection and its thread ---------------------------------------------


class _Link:
    """One pyodbc connection and the single thread allowed to touch it.

    pyodbc connections are not safe for concurrent use and every call blocks,
    so each runs on this link's own one-thread executor; a unit of work (a
    whole transaction) is one submitted function, so units never interleave.
    The connection is opened lazily and dropped after a transient error, so
    the next call reconnects.
    """

    def __init__(self, open_connection: Callable[[], Any], dsn: str, name: str) -> None:
        self._open_connection = open_connection
        self._dsn = dsn
        self._conn: Any = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def open(self) -> None:
        await self._submit(self._connect, True)

    async def run(self, work: Callable[[Any], T], context: str = "") -> T:
        return await self._submit(self._call, work, context)

    async def close(self) -> None:
        try:
            await self._submit(self._disconnect)
        finally:
            self._executor.shutdown(wait=False)

    async def _submit(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def _connect(self, at_startup: bool) -> None:
        if self._conn is not None:
            return
        try:
            self._conn = self._open_connection()
        except pyodbc.Error as exc:
            raise connect_error(exc, self._dsn, at_startup) from None

    def _call(self, work: Callable[[Any], T], context: str) -> T:
        self._connect(False)
        try:
            return work(self._conn)
        except pyodbc.Error as exc:
            error = map_error(exc, self._dsn, context)
            if isinstance(error, TransientError):
                self._disconnect()
            raise error from exc

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            _rollback_quietly(conn)  # a snapshot abandoned half-way still holds its transaction
            try:
                conn.close()
            except pyodbc.Error:
                pass


# -- statements on a connection ------------------------------------------------


def _execute(conn: Any, statement: sql.Statement | str) -> None:
    """Run a statement that returns no rows (each statement has its own cursor,
    closed at once: without MARS a connection serves one result at a time)."""
    _rows(conn, statement, fetch=False)


def _rows(conn: Any, statement: sql.Statement | str, *, fetch: bool = True) -> list[Any]:
    cursor = conn.cursor()
    try:
        if isinstance(statement, str):
            cursor.execute(statement)
        else:
            cursor.execute(statement.sql, *statement.params)
        return list(cursor.fetchall()) if fetch else []
    finally:
        cursor.close()


def _one(conn: Any, statement: sql.Statement | str) -> Any:
    rows = _rows(conn, statement)
    return rows[0] if rows else None


def _scalar(conn: Any, statement: sql.Statement | str) -> Any:
    row = _one(conn, statement)
    return None if row is None else row[0]


def _rollback_quietly(conn: Any) -> None:
    try:
        _execute(conn, sql.ROLLBACK)
    except pyodbc.Error:
        pass  # the link is gone: so is the transaction


# -- a described table ----------------------------------------------------------


@dataclass(frozen=True)
class _Table:
    """A described table: what read_changes and snapshot need beyond TableInfo."""

    info: TableInfo
    shape: sql.TableShape
    converters: dict[str, Converter]  # every published column (key included)
    always_changed: frozenset[str]  # computed/rowversion columns: never in SYS_CHANGE_COLUMNS
    track_columns_updated: bool
    tracked: bool = True  # change tracking is enabled on the table (as of describe)


@dataclass(frozen=True)
class _CatalogColumn:
    name: str
    declared: str  # e.g. "nvarchar(50)"
    base: str  # system type under any alias type
    nullable: bool
    computed: bool


def _catalog_columns(conn: Any, schema: str, name: str) -> list[_CatalogColumn]:
    out = []
    for row in _rows(conn, sql.columns(schema, name)):
        _, column, type_name, base_name, is_assembly, max_length, precision, scale, nullable, computed = row
        base = str(type_name if is_assembly or not base_name else base_name)
        declared = format_type(base, int(max_length), int(precision), int(scale))
        out.append(_CatalogColumn(str(column), declared, base, bool(nullable), bool(computed)))
    return out


@dataclass(frozen=True)
class _Name:
    table: str  # "schema.name" as registered
    schema: str
    name: str


def _describe(conn: Any, table: _Name, wanted: Sequence[str] | None) -> _Table:
    """Read the catalog: columns, primary key in key order, tracking; raise
    SchemaError or UnsupportedType. A table that change tracking does not
    track yet is described all the same (``tracked`` False): reading its
    changes or snapshot raises TrackingNotEnabled, as the ChangeSource
    contract has it."""
    _execute(conn, sql.SET_READ_COMMITTED)
    catalog = _catalog_columns(conn, table.schema, table.name)
    if not catalog:
        raise SchemaError(
            f"{table.table}: no such table in this database (or the login cannot see it: it needs SELECT on it)"
        )
    by_name = {c.name.lower(): c for c in catalog}
    key = [by_name[str(r[0]).lower()] for r in _rows(conn, sql.primary_key(table.schema, table.name))]
    if not key:
        raise SchemaError(f"{table.table}: the table has no primary key, which change tracking requires")
    published = list(key)
    for name in wanted if wanted is not None else [c.name for c in catalog]:
        column = by_name.get(name.lower())
        if column is None:
            known = ", ".join(c.name for c in catalog)
            raise SchemaError(f"{table.table}: no column {name} (columns: {known})")
        if column not in published:
            published.append(column)
    converters = {c.name: converter_for(table.table, c.name, c.base, c.declared) for c in published}
    tracking = _one(conn, sql.table_tracking(table.schema, table.name))
    described = _build_table(table, key, published, converters, tracking is not None and bool(tracking[0]))
    return described if tracking is not None else replace(described, tracked=False)


def _build_table(
    table: _Name,
    key: list[_CatalogColumn],
    published: list[_CatalogColumn],
    converters: dict[str, Converter],
    track_columns_updated: bool,
) -> _Table:
    key_names = tuple(c.name for c in key)
    # Computed columns never appear in SYS_CHANGE_COLUMNS, and a rowversion changes with
    # every update: when the mask is known, count them as (possibly) changed.
    always = frozenset(c.name for c in published if c.computed or c.base == "timestamp")
    masked = tuple(c.name for c in published if c.name not in key_names and c.name not in always)
    shape = sql.TableShape(
        schema=table.schema,
        name=table.name,
        primary_key=key_names,
        key_types=tuple(c.declared for c in key),
        columns=tuple(c.name for c in published),
        mask_columns=masked if track_columns_updated else (),
    )
    try:
        sql.changes(shape, since=0, upto=0, limit=1, after=(0, [None] * len(key_names)))
    except ValueError as exc:
        raise SchemaError(f"{table.table}: {exc}") from None
    info = TableInfo(
        table=table.table,
        schema=table.schema,
        name=table.name,
        primary_key=key_names,
        columns=tuple(Column(c.name, c.declared, c.nullable) for c in published),
    )
    return _Table(info, shape, converters, always, track_columns_updated)


# -- reading changes -------------------------------------------------------------


def check_versions(table: str, since: int, min_valid: Any, current: Any, upto: int | None) -> int:
    """The checks of SQLSERVER.md, in order; return the read's upper bound."""
    if min_valid is None:
        raise TrackingNotEnabled(
            f"{table}: CHANGE_TRACKING_MIN_VALID_VERSION is NULL: change tracking is off for the table, "
            "or the login lacks VIEW CHANGE TRACKING on it"
        )
    if current is None:
        raise TrackingNotEnabled(
            f"{table}: CHANGE_TRACKING_CURRENT_VERSION() is NULL: change tracking is off"
        )
    if since < min_valid:
        raise TrackingExpired(
            table,
            f"checkpoint {since} is below the minimum valid version {min_valid} "
            "(cleanup ran past it, or the table was truncated)",
        )
    if current < since:
        raise TrackingExpired(
            table,
            f"the database's current version {current} is below the checkpoint {since} "
            "(restored from a backup, or failed over to a copy that is behind)",
        )
    if upto is None:
        return int(current)
    if current < upto:
        raise TrackingExpired(
            table, f"the database's current version {current} went below {upto} between pages"
        )
    return upto


def decode_change(table: _Table, since: int, row: Sequence[Any]) -> ChangeRow:
    """One CHANGETABLE row (the layout of ``mssql_sql.changes``) as a ChangeRow."""
    version, creation, operation, mask = row[0], row[1], row[2], row[3]
    shape = table.shape
    n_key, n_columns = len(shape.primary_key), len(shape.columns)
    key_raw = row[4 : 4 + n_key]
    values_raw = row[4 + n_key : 4 + n_key + n_columns]
    flags = row[4 + n_key + n_columns :]
    key = {
        name: convert(table.converters[name], v) for name, v in zip(shape.primary_key, key_raw, strict=True)
    }
    # t.<first key column> is NULL only when the LEFT JOIN found no row: the row is gone.
    # A D stays a D, even one whose row was created after `since` (inserted and deleted
    # in between): deleting a document that does not exist is harmless, while dropping
    # the D could lose the delete of a key that was deleted, re-inserted and deleted again.
    if operation == "D" or values_raw[0] is None:
        return ChangeRow(op="D", version=int(version), key=key, values=None, changed_columns=None)
    op: Op = "I" if creation is not None and creation > since else "U"
    values = {
        name: convert(table.converters[name], v) for name, v in zip(shape.columns, values_raw, strict=True)
    }
    changed: frozenset[str] | None = None
    if op == "U" and table.track_columns_updated and mask is not None:
        # NULL SYS_CHANGE_COLUMNS means "unknown" (every column changed, or no column tracking).
        changed = (
            frozenset(n for n, f in zip(shape.mask_columns, flags, strict=True) if f) | table.always_changed
        )
    return ChangeRow(op=op, version=int(version), key=key, values=values, changed_columns=changed)


def _param(value: Any) -> Any:
    """A key value as a query parameter (pyodbc binds no timezone: send it as text,
    which the CAST to datetimeoffset reads back exactly)."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.isoformat()
    return value


def _page_rows(conn: Any, statement: sql.Statement, limit: int) -> list[Any]:
    """A page of changes, ``statement`` asking for one row more than ``limit``
    to learn whether another page follows; when none does, the read's
    transaction is committed here, in the same unit of work."""
    rows = _rows(conn, statement)
    if len(rows) <= limit:
        _execute(conn, sql.COMMIT)
    return rows


def _not_tracked(table: str, schema: str, name: str) -> str:
    return (
        f"{table}: change tracking is not enabled on the table: run `cdc tracking enable` "
        f"(ALTER TABLE {sql.qualified(schema, name)} ENABLE CHANGE_TRACKING WITH (TRACK_COLUMNS_UPDATED = ON))"
    )


@dataclass
class _HeldRead:
    """The open SNAPSHOT transaction of a paged read, on a reader of its own.

    Later pages of the read run in it, so they see what the first page saw:
    a row changed again between two pages is not skipped, nor classified
    relative to the bound instead of ``since``. It continues only the read it
    belongs to: same ``since``, ``upto`` equal to its bound, ``after`` equal to
    the cursor of the page last returned."""

    link: _Link
    conn: Any  # the connection holding the transaction (a replaced one has lost it)
    since: int
    bound: int
    after: Cursor

    def continues(self, since: int, upto: int | None, after: Cursor | None) -> bool:
        return (since, upto, after) == (self.since, self.bound, self.after)


# -- the source --------------------------------------------------------------------


class MssqlSource:
    """``ChangeSource`` for SQL Server Change Tracking (see the module docstring)."""

    kind = "mssql"

    def __init__(self, config: SourceConfig, *, connector: Callable[[], Any] | None = None) -> None:
        self.config = config
        self._connector = connector
        self._link = _Link(self._open_connection, config.dsn, "cdc-mssql")
        self._tables: dict[str, _Table] = {}
        # Reads run on readers of their own: a paged read holds its SNAPSHOT
        # transaction open on one (``_held``, by table) until its last page, while
        # other tables' reads, describe and the rest go on elsewhere.
        self._readers: list[_Link] = []  # idle: no transaction open
        self._held: dict[str, _HeldRead] = {}  # table (lower case) -> its paged read

    # -- connections

    def _open_connection(self) -> Any:
        if self._connector is not None:
            conn = self._connector()
        else:
            dsn = self.config.dsn
            if "APP" not in parse_dsn(dsn):
                dsn = dsn.rstrip("; ") + ";APP=cdc-sync"
            conn = pyodbc.connect(
                dsn, autocommit=True, timeout=max(1, math.ceil(self.config.connect_timeout))
            )
        conn.timeout = max(0, math.ceil(self.config.query_timeout))  # HYT00 when a query runs longer
        register_converters(conn)  # datetimeoffset (SQL type -155) arrives as bytes otherwise
        return conn

    async def connect(self) -> None:
        await self._link.open()

    async def close(self) -> None:
        """Close every connection; a paged read still held is rolled back."""
        links = [held.link for held in self._held.values()] + self._readers
        self._held, self._readers = {}, []
        try:
            for link in links:
                await link.close()  # rolls back an open transaction first
        finally:
            await self._link.close()

    # -- tables

    async def describe(self, table: TableConfig) -> TableInfo:
        name = _Name(table.table, table.schema, table.name)
        described = await self._link.run(lambda conn: _describe(conn, name, table.columns), table.table)
        self._tables[table.table.lower()] = described
        return described.info

    async def _table(self, info: TableInfo) -> _Table:
        """The described table behind ``info`` (described again if this source has not seen it)."""
        known = self._tables.get(info.table.lower())
        if known is not None and known.tracked and known.info.column_names == info.column_names:
            return known  # (an untracked table is described again: tracking may be on by now)
        name = _Name(info.table, info.schema, info.name)
        described = await self._link.run(lambda conn: _describe(conn, name, info.column_names), info.table)
        self._tables[info.table.lower()] = described
        return described

    # -- versions and changes

    async def current_version(self) -> int:
        version = await self._link.run(lambda conn: _scalar(conn, sql.CURRENT_VERSION))
        if version is None:
            raise TrackingNotEnabled("CHANGE_TRACKING_CURRENT_VERSION() is NULL: change tracking is off")
        return int(version)

    async def read_changes(
        self,
        table: TableInfo,
        since: int,
        *,
        limit: int,
        upto: int | None = None,
        after: Cursor | None = None,
    ) -> ChangePage:
        """Net changes after ``since``, at most ``limit`` rows, in (version, key) order.

        Every page of one read comes from one SNAPSHOT transaction (``_HeldRead``):
        the first page opens it on a reader connection of its own and checks the
        versions; while more pages follow it stays open, and a call that
        continues the read (same ``since``, ``upto`` = its bound, ``after`` = the
        cursor last returned) reads the next page in it; the last page commits
        it. Any other read of the table rolls it back first. Should the held
        transaction be gone (an error, ``close``), a continuation starts a new
        transaction from ``(upto, after)``: still complete, but a row changed
        again in between then arrives with the next read, relative to ``upto``."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        described = await self._table(table)
        if not described.tracked:
            raise TrackingNotEnabled(_not_tracked(table.table, table.schema, table.name))
        held = self._held.pop(table.table.lower(), None)
        if held is not None and held.continues(since, upto, after):
            link, conn, bound = held.link, held.conn, held.bound
            rows = await self._next_page(held, described, limit)
        else:
            if held is not None:
                await self._release(held.link, rollback=True)  # the caller started another read
            link = self._readers.pop() if self._readers else self._new_reader()
            bound, rows, conn = await self._first_page(link, described, since, limit, upto, after)
        more = len(rows) > limit
        changes = [decode_change(described, since, row) for row in rows[:limit]]
        if not more:
            await self._release(link, rollback=False)  # committed with the last page
            return ChangePage(rows=changes, next_version=bound)
        last = changes[-1]
        cursor: Cursor = (last.version, tuple(last.key[c] for c in table.primary_key))
        self._held[table.table.lower()] = _HeldRead(link, conn, since, bound, cursor)
        return ChangePage(rows=changes, next_version=bound, more=True, cursor=cursor)

    def _new_reader(self) -> _Link:
        return _Link(self._open_connection, self.config.dsn, "cdc-mssql-read")

    async def _first_page(
        self,
        link: _Link,
        described: _Table,
        since: int,
        limit: int,
        upto: int | None,
        after: Cursor | None,
    ) -> tuple[int, list[Any], Any]:
        """Open the read's SNAPSHOT transaction, check the versions, read a page;
        commit at once when it is the whole read, else leave the transaction open."""
        table = described.info
        cursor = None if after is None else (after[0], [_param(v) for v in after[1]])

        def first(conn: Any) -> tuple[int, list[Any], Any]:
            _execute(conn, sql.SET_SNAPSHOT)
            _execute(conn, sql.BEGIN)
            try:
                min_valid = _scalar(conn, sql.min_valid_version(table.schema, table.name))
                current = _scalar(conn, sql.CURRENT_VERSION)
                bound = check_versions(table.table, since, min_valid, current, upto)
                statement = sql.changes(
                    described.shape, since=since, upto=bound, limit=limit + 1, after=cursor
                )
                rows = _page_rows(conn, statement, limit)
            except BaseException:
                _rollback_quietly(conn)
                raise
            return bound, rows, conn

        return await self._run_read(link, first, table.table)

    async def _next_page(self, held: _HeldRead, described: _Table, limit: int) -> list[Any]:
        """The next page in the held transaction; committed when it is the last."""
        table = described.info
        cursor = (held.after[0], [_param(v) for v in held.after[1]])
        statement = sql.changes(
            described.shape, since=held.since, upto=held.bound, limit=limit + 1, after=cursor
        )

        def following(conn: Any) -> list[Any]:
            if conn is not held.conn:
                # the connection was replaced: its transaction is gone, and with it the snapshot
                raise SourceUnavailable(f"{table.table}: the connection of a paged read was lost; read again")
            try:
                return _page_rows(conn, statement, limit)
            except BaseException:
                _rollback_quietly(conn)
                raise

        return await self._run_read(held.link, following, table.table)

    async def _run_read(self, link: _Link, work: Callable[[Any], T], context: str) -> T:
        """Run a page on a reader; an error returns the reader (its transaction
        rolled back) to the idle ones, a cancellation closes it: the page may
        still be running, and its transaction open, on the reader's thread."""
        try:
            return await link.run(work, context)
        except CdcError:
            self._readers.append(link)
            raise
        except BaseException:
            await link.close()
            raise

    async def _release(self, link: _Link, *, rollback: bool) -> None:
        """Back to the idle readers, after rolling back its open transaction if asked."""
        if rollback:
            try:
                await link.run(_rollback_quietly)
            except BaseException:
                await link.close()
                raise
        self._readers.append(link)

    async def snapshot(self, table: TableInfo, *, page_size: int) -> AsyncIterator[SnapshotPage]:
        """The whole table in keyset pages, with the current version read first
        in the same SNAPSHOT transaction, on a connection of its own (the
        transaction stays open between pages). An empty table gives one empty
        page, so the version is always known."""
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        described = await self._table(table)
        if not described.tracked:
            raise TrackingNotEnabled(_not_tracked(table.table, table.schema, table.name))
        link = _Link(self._open_connection, self.config.dsn, "cdc-mssql-snapshot")
        try:
            version, total = await link.run(lambda conn: _snapshot_begin(conn, table), table.table)
            after: list[Any] | None = None
            first = True
            while True:
                statement = sql.snapshot_page(described.shape, limit=page_size, after=after)
                raw = await link.run(_fetch(statement), table.table)
                rows = [_snapshot_row(described, r) for r in raw]
                if rows or first:
                    yield SnapshotPage(version=version, rows=rows, total=total)
                first = False
                if len(raw) < page_size:
                    break
                after = [_param(rows[-1][c]) for c in table.primary_key]
            await link.run(lambda conn: _execute(conn, sql.COMMIT), table.table)
        finally:
            await link.close()  # rolls back first when the snapshot was abandoned or failed

    async def wait_for_changes(self, timeout: float) -> set[str]:
        """SQL Server Change Tracking has no notification: sleep, report nothing."""
        if timeout > 0:
            await asyncio.sleep(timeout)
        return set()

    def quiet_for(self, table: TableInfo, since: int) -> float:
        """Never known: without notifications, only a read can tell."""
        return 0.0

    async def cleanup(self, retention: float) -> int:
        """SQL Server cleans its change tracking up itself (AUTO_CLEANUP)."""
        return 0

    # -- setting tracking up

    async def tracking_enable(self, tables: Sequence[TableConfig]) -> list[str]:
        return await self._link.run(lambda conn: _enable(conn, tables, self.config.retention))

    async def tracking_disable(self, tables: Sequence[TableConfig]) -> list[str]:
        return await self._link.run(lambda conn: _disable(conn, tables))

    async def tracking_status(self, tables: Sequence[TableConfig]) -> list[TrackingStatus]:
        return await self._link.run(lambda conn: _status(conn, tables))

    async def doctor(self, tables: Sequence[TableConfig]) -> list[Finding]:
        known = dict(self._tables)
        return await self._link.run(lambda conn: _doctor(conn, tables, self.config.retention, known))


def _fetch(statement: sql.Statement) -> Callable[[Any], list[Any]]:
    return lambda conn: _rows(conn, statement)


def _snapshot_begin(conn: Any, table: TableInfo) -> tuple[int, int | None]:
    """Open the snapshot's transaction: the current version first, before any
    table is read, so the table's rows include everything up to it."""
    _execute(conn, sql.SET_READ_COMMITTED)
    estimate = _scalar(conn, sql.row_estimate(table.schema, table.name))
    _execute(conn, sql.SET_SNAPSHOT)
    _execute(conn, sql.BEGIN)
    current = _scalar(conn, sql.CURRENT_VERSION)
    if current is None:
        raise TrackingNotEnabled(
            f"{table.table}: CHANGE_TRACKING_CURRENT_VERSION() is NULL: change tracking is off"
        )
    if _scalar(conn, sql.min_valid_version(table.schema, table.name)) is None:
        raise TrackingNotEnabled(
            f"{table.table}: CHANGE_TRACKING_MIN_VALID_VERSION is NULL: change tracking is off for the table, "
            "or the login lacks VIEW CHANGE TRACKING on it"
        )
    return int(current), None if estimate is None else int(estimate)


def _snapshot_row(table: _Table, row: Sequence[Any]) -> dict[str, Any]:
    return {
        name: convert(table.converters[name], v) for name, v in zip(table.shape.columns, row, strict=True)
    }


# -- tracking set-up, status, doctor ---------------------------------------------


@dataclass(frozen=True)
class _Database:
    name: str
    snapshot_state: int  # 0 off, 1 on, 2 in transition to off, 3 in transition to on
    snapshot_desc: str
    tracking: bool  # CHANGE_TRACKING_CURRENT_VERSION() is not NULL
    retention: float | None  # seconds; None when sys.change_tracking_databases hides it
    retention_text: str
    auto_cleanup: bool | None


def _database(conn: Any) -> _Database:
    _execute(conn, sql.SET_READ_COMMITTED)
    row = _one(conn, sql.DATABASE_SETTINGS)
    name, state, desc, current, period, units, cleanup = row
    retention = None if period is None or units is None else sql.retention_seconds(int(period), int(units))
    text = "unknown" if retention is None else "{} {}".format(*sql.retention(retention))
    return _Database(
        str(name),
        int(state),
        str(desc),
        current is not None,
        retention,
        text,
        None if cleanup is None else bool(cleanup),
    )


def _enable(conn: Any, tables: Sequence[TableConfig], retention: float) -> list[str]:
    done: list[str] = []
    db = _database(conn)
    if db.snapshot_state in (0, 2):
        _execute(conn, sql.ENABLE_SNAPSHOT_ISOLATION)
        done.append(f"database {db.name}: ALLOW_SNAPSHOT_ISOLATION ON")
    amount, unit = sql.retention(retention)
    wanted = f"{amount} {unit}"
    if not db.tracking:
        _execute(conn, sql.enable_database_tracking(retention))
        done.append(
            f"database {db.name}: CHANGE_TRACKING = ON (CHANGE_RETENTION = {wanted}, AUTO_CLEANUP = ON)"
        )
    elif db.retention is not None and db.retention < sql.retention_seconds(amount, unit):
        _execute(conn, sql.set_retention(retention))
        done.append(f"database {db.name}: CHANGE_RETENTION {db.retention_text} -> {wanted}")
    else:
        done.append(f"database {db.name}: change tracking already on (retention {db.retention_text})")
    for table in tables:
        done.append(_enable_table(conn, table))
    return done


def _enable_table(conn: Any, table: TableConfig) -> str:
    tracking = _one(conn, sql.table_tracking(table.schema, table.name))
    if tracking is not None:
        if not tracking[0]:
            return (
                f"{table.table}: already tracked, with TRACK_COLUMNS_UPDATED = OFF (changed columns unknown; "
                "to turn it on, DISABLE and ENABLE CHANGE_TRACKING on the table, which discards its history "
                "and makes the sidecar re-snapshot it)"
            )
        return f"{table.table}: already tracked"
    try:
        _execute(conn, sql.enable_table_tracking(table.schema, table.name))
    except pyodbc.Error as exc:
        _, natives, text = error_parts(exc)
        if NO_PRIMARY_KEY in natives:
            raise SchemaError(
                f"{table.table}: change tracking needs a primary key and the table has none "
                f"(SQL Server error 4997): add one, then run `cdc tracking enable` again"
            ) from None
        if natives & {208, 1088, 4902, 15151}:
            raise SchemaError(
                f"{table.table}: no such table (or no permission to alter it): {text}"
            ) from None
        raise
    return f"{table.table}: change tracking enabled (TRACK_COLUMNS_UPDATED = ON)"


def _disable(conn: Any, tables: Sequence[TableConfig]) -> list[str]:
    _execute(conn, sql.SET_READ_COMMITTED)
    done: list[str] = []
    for table in tables:
        if _one(conn, sql.table_tracking(table.schema, table.name)) is None:
            done.append(f"{table.table}: not tracked")
            continue
        _execute(conn, sql.disable_table_tracking(table.schema, table.name))
        done.append(f"{table.table}: change tracking disabled")
    done.append(
        "database-level change tracking and snapshot isolation left as they are (other tables may use them)"
    )
    return done


def _status(conn: Any, tables: Sequence[TableConfig]) -> list[TrackingStatus]:
    db = _database(conn)
    current = _scalar(conn, sql.CURRENT_VERSION)
    out = []
    for table in tables:
        tracking = _one(conn, sql.table_tracking(table.schema, table.name))
        min_valid = _scalar(conn, sql.min_valid_version(table.schema, table.name))
        if not db.tracking:
            detail = f"change tracking is off for database {db.name}"
        elif tracking is None:
            detail = "change tracking is off for the table (or it does not exist)"
        else:
            columns = "ON" if tracking[0] else "OFF"
            detail = (
                f"TRACK_COLUMNS_UPDATED = {columns}; retention {db.retention_text}; "
                f"snapshot isolation {db.snapshot_desc}"
            )
        out.append(
            TrackingStatus(
                table=table.table,
                enabled=tracking is not None and db.tracking,
                min_valid_version=None if min_valid is None else int(min_valid),
                current_version=None if current is None else int(current),
                detail=detail,
            )
        )
    return out


def _database_findings(conn: Any, retention: float) -> list[Finding]:
    db = _database(conn)
    out: list[Finding] = []
    if db.snapshot_state == 1:
        out.append(Finding("ok", "snapshot isolation", f"ALLOW_SNAPSHOT_ISOLATION is ON in {db.name}"))
    else:
        out.append(
            Finding(
                "error",
                "snapshot isolation",
                f"ALLOW_SNAPSHOT_ISOLATION is {db.snapshot_desc} in {db.name}: polls cannot run in a SNAPSHOT "
                "transaction, so reads would not be consistent. Run `cdc tracking enable` "
                "(ALTER DATABASE CURRENT SET ALLOW_SNAPSHOT_ISOLATION ON)",
            )
        )
    if not db.tracking:
        out.append(
            Finding(
                "error", "change tracking", f"change tracking is off for {db.name}: run `cdc tracking enable`"
            )
        )
        return out
    if db.retention is None:
        out.append(
            Finding(
                "warning",
                "retention",
                "cannot read the retention: sys.change_tracking_databases shows it to the database owner "
                "or to logins with VIEW ANY DATABASE",
            )
        )
    elif db.retention < retention:
        out.append(
            Finding(
                "warning",
                "retention",
                f"CHANGE_RETENTION is {db.retention_text}, shorter than source.retention "
                f"({format_duration(retention)}): a sidecar down for longer must re-snapshot. "
                "`cdc tracking enable` lengthens it",
                {"retention_seconds": db.retention},
            )
        )
    else:
        out.append(Finding("ok", "retention", f"CHANGE_RETENTION is {db.retention_text}"))
    if db.auto_cleanup is False:
        out.append(
            Finding("warning", "retention", "AUTO_CLEANUP is OFF: change tracking data is never cleaned up")
        )
    return out


def _doctor(
    conn: Any, tables: Sequence[TableConfig], retention: float, known: dict[str, _Table]
) -> list[Finding]:
    findings = _database_findings(conn, retention)
    for table in tables:
        findings += _table_findings(conn, table, known.get(table.table.lower()))
    return findings


def _table_findings(conn: Any, table: TableConfig, known: _Table | None) -> list[Finding]:
    out: list[Finding] = []
    can_select, can_view = _one(conn, sql.table_permissions(table.schema, table.name))
    for permission, granted in (("SELECT", can_select), ("VIEW CHANGE TRACKING", can_view)):
        if granted is None:
            out.append(Finding("error", table.table, "the table does not exist, or the login cannot see it"))
            break
        if not granted:
            out.append(
                Finding(
                    "error",
                    table.table,
                    f"the login lacks the {permission} permission on it: "
                    f"GRANT {permission} ON {sql.qualified(table.schema, table.name)} TO <the sidecar's user>",
                )
            )
    try:
        described = _describe(conn, _Name(table.table, table.schema, table.name), table.columns)
    except (SchemaError, TrackingNotEnabled, UnsupportedType) as exc:
        out.append(Finding("error", table.table, str(exc)))
        return out
    if not described.tracked:
        out.append(Finding("error", table.table, _not_tracked(table.table, table.schema, table.name)))
        return out
    if known is not None and known.info != described.info:
        # ADD COLUMN, a type change, a new key: the tracker must describe the table again.
        out.append(
            Finding(
                "warning",
                table.table,
                "the table's columns changed since this sidecar described it: restart it (or re-snapshot the table)",
                {
                    "was": [c.type_name for c in known.info.columns],
                    "now": [c.type_name for c in described.info.columns],
                },
            )
        )
    if not described.track_columns_updated:
        out.append(
            Finding(
                "warning",
                table.table,
                "TRACK_COLUMNS_UPDATED is OFF: changed columns are unknown, so every update is published whole",
            )
        )
    columns = ", ".join(described.info.column_names)
    out.append(
        Finding("ok", table.table, f"tracked; primary key {', '.join(described.info.primary_key)}; {columns}")
    )
    return out
