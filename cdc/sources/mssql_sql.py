"""The T-SQL that the SQL Server source sends, built in one place.

Identifiers (schema, table, column names) come from the config, where they are
already restricted to ``[A-Za-z_][A-Za-z0-9_]*``; they are validated again here
and always quoted with brackets (``]`` doubled). Values (versions, keys, page
sizes, names handed to OBJECT_ID/COLUMNPROPERTY) are always ``?`` parameters:
a ``Statement`` carries its text and its parameters together, in the order
the placeholders appear. Every statement here is parsed by sqlglot's T-SQL
dialect in tests/cdc/sources/test_mssql_sql.py.

The statements of one poll, in one SNAPSHOT transaction (SQLSERVER.md)::

    SET TRANSACTION ISOLATION LEVEL SNAPSHOT
    BEGIN TRANSACTION
    SELECT CHANGE_TRACKING_MIN_VALID_VERSION(OBJECT_ID(?)),  -- NULL: error
           OBJECT_ID(?)                                   -- not the described table: error
    SELECT CHANGE_TRACKING_CURRENT_VERSION()                 -- NULL: error
    SELECT TOP (?) ct.SYS_CHANGE_VERSION, ... FROM CHANGETABLE(CHANGES [s].[t], ?) AS ct
      LEFT JOIN [s].[t] AS t ON <pk equality> WHERE ct.SYS_CHANGE_VERSION <= ? [AND (version, pk) > after]
      ORDER BY ct.SYS_CHANGE_VERSION, <pk>                   -- TOP (page + 1): more to come?
    [SELECT TOP (?) ... AND (version, pk) > after ...]       -- later pages, same transaction
    COMMIT TRANSACTION                                       -- with the last page
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cdc.sources import mssql_sql_identity as identity
from cdc.sources.mssql_select import column_select

MAX_PARAMETERS = 2100  # SQL Server's limit on parameters per request
_IDENTIFIER_MAX = 128
_SQL_TYPE = re.compile(r"^[a-z][a-z0-9]*(\((max|\d+)(,\d+)?\))?$")


@dataclass(frozen=True)
class Statement:
    sql: str
    params: tuple[Any, ...] = ()


@dataclass(frozen=True)
class TableShape:
    """What the builders need to know about a table."""

    schema: str
    name: str
    primary_key: tuple[str, ...]
    key_types: tuple[str, ...]  # declared SQL type of each key column, e.g. "nvarchar(50)"
    columns: tuple[str, ...]  # published columns, primary key first
    mask_columns: tuple[str, ...] = ()  # columns decoded from SYS_CHANGE_COLUMNS (empty: no column tracking)
    key_collations: tuple[str | None, ...] = ()  # sys.columns.collation_name of each key column (char types)
    # the system type of each of ``columns`` (under any alias type; empty: each read as it is), which
    # decides how it is selected (``column_select``)
    column_types: tuple[str, ...] = ()

    @property
    def exact_keys(self) -> tuple[str, ...]:
        """The key columns whose cursor value is the server's own text (``exact_text``)."""
        return tuple(c for c, t in zip(self.primary_key, self.key_types, strict=True) if is_exact_text(t))

    @property
    def qualified(self) -> str:
        return qualified(self.schema, self.name)

    def selected(self, prefix: str, columns: Sequence[str]) -> list[str]:
        """``columns`` (published ones) as ``column_select`` reads each, from table alias ``prefix``."""
        types = dict(zip(self.columns, self.column_types, strict=False))
        return [column_select(f"{prefix}.{quote(c)}", types.get(c)) for c in columns]


# -- identifiers -------------------------------------------------------------


def quote(identifier: str) -> str:
    """``identifier`` as a bracket-quoted T-SQL identifier: ``a]b`` -> ``[a]]b]``."""
    if not identifier or len(identifier) > _IDENTIFIER_MAX or "\x00" in identifier:
        raise ValueError(f"{identifier!r} is not a valid SQL Server identifier")
    return "[" + identifier.replace("]", "]]") + "]"


def qualified(schema: str, name: str) -> str:
    """``[schema].[name]``: also the text handed to OBJECT_ID() as a parameter."""
    return f"{quote(schema)}.{quote(name)}"


_COLLATION = re.compile(r"^[A-Za-z0-9_]{1,128}$")
# Date and time types whose values a Python datetime/time cannot hold exactly
# (100 ns; datetime's 1/300 s), and which pyodbc binds with less precision
# than the column has (a time parameter without its fraction): a keyset cursor
# on them holds the server's own text of the value instead, and compares with
# it converted back in the same style (CAST and CONVERT (Transact-SQL),
# learn.microsoft.com: style 121, "ODBC canonical (with milliseconds)",
# yyyy-mm-dd hh:mi:ss.mmm[mmmm] [+hh:mi], with every fractional digit of the
# column's scale; a style fixes the format whatever SET DATEFORMAT or
# LANGUAGE the session has, which a bare CAST of a string to datetime does not).
_EXACT_TEXT_TYPES = frozenset({"datetime2", "datetimeoffset", "time", "datetime", "smalldatetime"})
_CHAR_TYPES = frozenset({"char", "varchar"})


def is_exact_text(type_name: str) -> bool:
    return type_name.split("(", 1)[0].lower() in _EXACT_TEXT_TYPES


def exact_text(expression: str) -> str:
    """The server's exact text of a date/time value (see ``_EXACT_TEXT_TYPES``)."""
    return f"CONVERT(nvarchar(40), {expression}, 121)"


def _sql_type(type_name: str) -> str:
    if not _SQL_TYPE.match(type_name):
        raise ValueError(f"{type_name!r} is not a SQL Server type name")
    return type_name


# -- transactions ------------------------------------------------------------

SET_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL SNAPSHOT"
SET_READ_COMMITTED = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"
BEGIN = "BEGIN TRANSACTION"
COMMIT = "COMMIT TRANSACTION"
ROLLBACK = "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION"


# -- versions ------------------------------------------------------------------

CURRENT_VERSION = Statement("SELECT CHANGE_TRACKING_CURRENT_VERSION() AS current_version")
DATABASE_IDENTITY = Statement(identity.DATABASE_IDENTITY)  # (mssql_sql_identity says why)
WATCH_TICK = Statement(identity.WATCH_TICK)  # one tick of the version watcher (mssql_watcher)


def min_valid_version(schema: str, name: str) -> Statement:
    """The table's minimum valid version and its identity now (``mssql_sql_identity.TABLE_IDENTITY``:
    object_id and the version its tracking began at), in one round trip: the
    identity tells a read whether the table it described is the one it is
    reading (a table dropped and created again under the name has a new
    object_id, a truncated one a new begin_version; NULL: gone, or renamed)."""
    return Statement(
        "SELECT CHANGE_TRACKING_MIN_VALID_VERSION(OBJECT_ID(?)) AS min_valid_version, "
        f"{identity.TABLE_IDENTITY} AS table_identity",
        (qualified(schema, name),) * 4,
    )


# -- reading changes and rows ------------------------------------------------

_CT_COLUMNS = (
    "ct.SYS_CHANGE_VERSION",
    "ct.SYS_CHANGE_CREATION_VERSION",
    "ct.SYS_CHANGE_OPERATION",
    "ct.SYS_CHANGE_COLUMNS",
)


def changes(
    shape: TableShape,
    *,
    since: int,
    upto: int,
    limit: int,
    after: tuple[int, Sequence[Any]] | None = None,
) -> Statement:
    """Net changes after ``since`` up to ``upto``, one page of ``limit`` rows in
    (version, primary key) order, starting after the ``after`` cursor.

    The result columns are: the four SYS_CHANGE_* columns, ct.<pk...> (present
    for deletes too), t.<published columns...> (NULL when the row is gone),
    then one CHANGE_TRACKING_IS_COLUMN_IN_MASK flag per ``mask_columns``, then
    the exact text of each ``exact_keys`` column (for the cursor).
    ``SYS_CHANGE_VERSION <= upto`` keeps a row committed after the version
    read in this transaction out of this read: it comes in the next one.
    """
    table = shape.qualified
    params: list[Any] = [limit]
    select = [*_CT_COLUMNS]
    select += shape.selected("ct", shape.primary_key)
    select += shape.selected("t", shape.columns)
    for column in shape.mask_columns:
        # SYS_CHANGE_COLUMNS is opaque: decode it only with the documented function. Its
        # column id comes from COLUMNPROPERTY(..., 'ColumnId') (sys.columns.column_id), by
        # name, in this very statement: the function "does not perform any checks to validate
        # the column_id value" (CHANGE_TRACKING_IS_COLUMN_IN_MASK, learn.microsoft.com), and a
        # column dropped and added again under its name has a new id, so an id cached at
        # describe would silently decode another column's bit.
        select.append(
            "CHANGE_TRACKING_IS_COLUMN_IN_MASK(COLUMNPROPERTY(OBJECT_ID(?), ?, 'ColumnId'), ct.SYS_CHANGE_COLUMNS)"
        )
        params += [table, column]
    select += [exact_text(f"ct.{quote(c)}") for c in shape.exact_keys]
    join = " AND ".join(f"t.{quote(c)} = ct.{quote(c)}" for c in shape.primary_key)
    params += [since, upto]
    where = "ct.SYS_CHANGE_VERSION <= ?"
    if after is not None:
        version, key = after
        terms: list[Term] = [("ct.SYS_CHANGE_VERSION", None, None), *_key_terms("ct", shape)]
        keyset, keyset_params = _keyset_after(terms, [version, *key])
        where += f" AND {keyset}"
        params += keyset_params
    order = ", ".join(["ct.SYS_CHANGE_VERSION", *(f"ct.{quote(c)}" for c in shape.primary_key)])
    sql = (
        f"SELECT TOP (?) {', '.join(select)} "  # noqa: S608 - identifiers quoted, values are parameters
        f"FROM CHANGETABLE(CHANGES {table}, ?) AS ct "
        f"LEFT JOIN {table} AS t ON {join} "
        f"WHERE {where} ORDER BY {order}"
    )
    return _checked(Statement(sql, tuple(params)))


def snapshot_page(shape: TableShape, *, limit: int, after: Sequence[Any] | None = None) -> Statement:
    """One keyset page of the whole table, in primary-key order: the published
    columns, then the exact text of each ``exact_keys`` column (for the cursor)."""
    params: list[Any] = [limit]
    columns = ", ".join(
        shape.selected("t", shape.columns) + [exact_text(f"t.{quote(c)}") for c in shape.exact_keys]
    )
    where = ""
    if after is not None:
        keyset, keyset_params = _keyset_after(_key_terms("t", shape), list(after))
        where = f" WHERE {keyset}"
        params += keyset_params
    order = ", ".join(f"t.{quote(c)}" for c in shape.primary_key)
    sql = f"SELECT TOP (?) {columns} FROM {shape.qualified} AS t{where} ORDER BY {order}"  # noqa: S608
    return _checked(Statement(sql, tuple(params)))


Term = tuple[str, str | None, str | None]  # (expression, declared type, collation)


def _key_terms(prefix: str, shape: TableShape) -> list[Term]:
    collations = shape.key_collations or (None,) * len(shape.primary_key)
    return [
        (f"{prefix}.{quote(c)}", t, k)
        for c, t, k in zip(shape.primary_key, shape.key_types, collations, strict=True)
    ]


def _key_parameter(sql_type: str | None, collation: str | None) -> str:
    """A cursor's key value as the column's own type. Date and time values are
    the server's text (``exact_text``), converted back in its style; char and
    varchar values are converted to the column's code page (COLLATE on the
    nvarchar parameter, so that the conversion to varchar uses the column's
    collation, not the database's default code page: "Collation precedence",
    learn.microsoft.com) and compared in its collation; any other type is cast,
    so the comparison uses the column's ordering (the same as ORDER BY)."""
    if sql_type is None:
        return "?"
    declared = _sql_type(sql_type)
    base = declared.split("(", 1)[0]
    if base in _EXACT_TEXT_TYPES:
        return f"CONVERT({declared}, ?, 121)"
    if base in _CHAR_TYPES and collation is not None:
        if not _COLLATION.match(collation):
            raise ValueError(f"{collation!r} is not a SQL Server collation name")
        return f"CAST(? COLLATE {collation} AS {declared})"
    return f"CAST(? AS {declared})"


def _keyset_after(terms: Sequence[Term], values: Sequence[Any]) -> tuple[str, list[Any]]:
    """``(a, b, ...) > (va, vb, ...)`` spelled out for T-SQL, which has no row
    comparison: ``(a > ? OR (a = ? AND (b > ? OR ...)))``, each parameter as
    ``_key_parameter`` has it."""
    (expr, sql_type, collation), *rest = terms
    value, *more = values
    placeholder = _key_parameter(sql_type, collation)
    if not rest:
        return f"{expr} > {placeholder}", [value]
    inner, inner_params = _keyset_after(rest, more)
    return f"({expr} > {placeholder} OR ({expr} = {placeholder} AND {inner}))", [value, value, *inner_params]


def _checked(statement: Statement) -> Statement:
    if len(statement.params) > MAX_PARAMETERS:
        raise ValueError(
            f"the query needs {len(statement.params)} parameters, more than SQL Server's {MAX_PARAMETERS}: "
            "publish fewer columns"
        )
    return statement


# -- the catalog -------------------------------------------------------------

COLUMNS = (
    "SELECT c.column_id, c.name, ut.name AS type_name, bt.name AS base_type_name, "
    "ut.is_assembly_type, c.max_length, c.precision, c.scale, c.is_nullable, c.is_computed, c.collation_name "
    "FROM sys.columns AS c "
    "JOIN sys.types AS ut ON ut.user_type_id = c.user_type_id "
    "LEFT JOIN sys.types AS bt ON bt.user_type_id = c.system_type_id "
    "WHERE c.object_id = OBJECT_ID(?) "
    "ORDER BY c.column_id"
)
PRIMARY_KEY = (
    "SELECT c.name "
    "FROM sys.indexes AS i "
    "JOIN sys.index_columns AS ic ON ic.object_id = i.object_id AND ic.index_id = i.index_id "
    "JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id "
    "WHERE i.object_id = OBJECT_ID(?) AND i.is_primary_key = 1 AND ic.key_ordinal > 0 "
    "ORDER BY ic.key_ordinal"
)
TABLE_TRACKING = (
    "SELECT ctt.is_track_columns_updated_on, ctt.min_valid_version "
    "FROM sys.change_tracking_tables AS ctt WHERE ctt.object_id = OBJECT_ID(?)"
)
TABLE_PERMISSIONS = (
    "SELECT HAS_PERMS_BY_NAME(?, N'OBJECT', N'SELECT') AS can_select, "
    "HAS_PERMS_BY_NAME(?, N'OBJECT', N'VIEW CHANGE TRACKING') AS can_view_change_tracking"
)
ROW_ESTIMATE = (
    "SELECT SUM(p.rows) AS row_estimate FROM sys.partitions AS p "
    "WHERE p.object_id = OBJECT_ID(?) AND p.index_id IN (0, 1)"
)
# The current database is always visible in sys.databases; sys.change_tracking_databases
# may hide its row from a login that neither owns the database nor has VIEW ANY DATABASE,
# so "tracking on" is read from CHANGE_TRACKING_CURRENT_VERSION() (NULL when off).
DATABASE_SETTINGS = (
    "SELECT d.name, d.snapshot_isolation_state, d.snapshot_isolation_state_desc, "
    "CHANGE_TRACKING_CURRENT_VERSION() AS current_version, "
    "ctd.retention_period, ctd.retention_period_units, ctd.is_auto_cleanup_on "
    "FROM sys.databases AS d "
    "LEFT JOIN sys.change_tracking_databases AS ctd ON ctd.database_id = d.database_id "
    "WHERE d.database_id = DB_ID()"
)


# -- shape fingerprints and table states, many tables per statement -------------------------
#
# Relied on (learn.microsoft.com, SQL Server docs): "sys.change_tracking_tables"
# returns one row per table that has change tracking enabled;
# "CHANGE_TRACKING_MIN_VALID_VERSION" is NULL when tracking is off for the
# database, the object id is not valid, or permission is missing, and is set
# when tracking is enabled on the table; "COLUMNPROPERTY" ColumnId is
# sys.columns.column_id; "Manage change tracking" lists what DDL does to a
# tracked table (see docs/SQLSERVER.md, "When a table changes shape").
#
# One row per requested table, in request order (``r.n``), the names handed
# over as parameters ``(VALUES (0, ?), (1, ?), ...)``: the statement text
# depends only on how many tables are asked about, so every poll of the same
# tables sends the same text (SQL Server can reuse its plan). A name that is no
# table (dropped, renamed, a view, invisible to the login) comes back with a
# NULL object_id (FINGERPRINT: a NULL identity).

FINGERPRINT_BATCH = 2000  # tables per statement: one parameter each, under MAX_PARAMETERS
_PER_TABLE = (
    "FROM (VALUES {rows}) AS r(n, name) "
    "LEFT JOIN sys.tables AS o ON o.object_id = OBJECT_ID(r.name) "
    "LEFT JOIN sys.change_tracking_tables AS ctt ON ctt.object_id = o.object_id "
    "ORDER BY r.n"
)
# The shape as text. Every column in column_id order, with its column_id: the
# ids are what SYS_CHANGE_COLUMNS is made of (CHANGE_TRACKING_IS_COLUMN_IN_MASK
# takes COLUMNPROPERTY(..., 'ColumnId'), that is sys.columns.column_id), and a
# column dropped and added again under its name gets a new one. QUOTENAME keeps
# the text unambiguous whatever the names hold; the casts to nvarchar(max)
# keep STRING_AGG (SQL Server 2017+, any compatibility level) clear of its
# 8000-byte limit on wide tables. Tracking: whether sys.change_tracking_tables
# lists the table ("one row for each table ... that has change tracking
# enabled") and its is_track_columns_updated_on.
FINGERPRINT = (
    f"SELECT r.n, {identity.IDENTITY} AS table_identity, CONCAT({identity.IDENTITY}, N'; columns ', "  # noqa: S608 - constants
    "(SELECT STRING_AGG(CAST(CONCAT(c.column_id, N' ', QUOTENAME(c.name), N' ', c.system_type_id, N'/', "
    "c.user_type_id, N' ', c.max_length, N' ', c.precision, N' ', c.scale, N' ', c.is_nullable, "
    "c.is_computed) AS nvarchar(max)), N', ') WITHIN GROUP (ORDER BY c.column_id) "
    "FROM sys.columns AS c WHERE c.object_id = o.object_id), N'; key ', "
    "(SELECT STRING_AGG(CAST(QUOTENAME(c.name) AS nvarchar(max)), N', ') WITHIN GROUP (ORDER BY ic.key_ordinal) "
    "FROM sys.indexes AS i "
    "JOIN sys.index_columns AS ic ON ic.object_id = i.object_id AND ic.index_id = i.index_id "
    "JOIN sys.columns AS c ON c.object_id = ic.object_id AND c.column_id = ic.column_id "
    "WHERE i.object_id = o.object_id AND i.is_primary_key = 1 AND ic.key_ordinal > 0), N'; tracking ', "
    "CASE WHEN ctt.object_id IS NULL THEN N'off' WHEN ctt.is_track_columns_updated_on = 1 "
    "THEN N'on, columns updated on' ELSE N'on, columns updated off' END) AS fingerprint "
) + _PER_TABLE.replace("ORDER BY r.n", f"{identity.THIS_DATABASE} ORDER BY r.n")
# What `cdc tracking status` reports per table. The minimum valid version is
# read for tables sys.change_tracking_tables lists only: for any other table
# changes are not captured, whatever the function returns.
TABLE_STATES = (
    "SELECT r.n, o.object_id, ctt.object_id AS tracked_object_id, ctt.is_track_columns_updated_on, "
    "CASE WHEN ctt.object_id IS NULL THEN NULL ELSE CHANGE_TRACKING_MIN_VALID_VERSION(o.object_id) END "
    "AS min_valid_version "
) + _PER_TABLE


def fingerprints(names: Sequence[tuple[str, str]]) -> Statement:
    """Rows (n, identity, fingerprint) for the (schema, name) tables, in order
    (identity NULL: no such table)."""
    return _per_table(FINGERPRINT, names)


def table_states(names: Sequence[tuple[str, str]]) -> Statement:
    """Rows (n, object_id, tracked_object_id, is_track_columns_updated_on,
    min_valid_version) for the (schema, name) tables, in order."""
    return _per_table(TABLE_STATES, names)


def _per_table(template: str, names: Sequence[tuple[str, str]]) -> Statement:
    if not 0 < len(names) <= FINGERPRINT_BATCH:
        raise ValueError(f"ask about 1 to {FINGERPRINT_BATCH} tables per statement, not {len(names)}")
    rows = ", ".join(f"({n}, ?)" for n in range(len(names)))  # n: a position, never a name
    return Statement(template.format(rows=rows), tuple(qualified(schema, name) for schema, name in names))


def columns(schema: str, name: str) -> Statement:
    return Statement(COLUMNS, (qualified(schema, name),))


def primary_key(schema: str, name: str) -> Statement:
    return Statement(PRIMARY_KEY, (qualified(schema, name),))


def table_tracking(schema: str, name: str) -> Statement:
    return Statement(TABLE_TRACKING, (qualified(schema, name),))


def table_permissions(schema: str, name: str) -> Statement:
    return Statement(TABLE_PERMISSIONS, (qualified(schema, name),) * 2)


def row_estimate(schema: str, name: str) -> Statement:
    return Statement(ROW_ESTIMATE, (qualified(schema, name),))


# -- setting tracking up -------------------------------------------------------

ENABLE_SNAPSHOT_ISOLATION = Statement("ALTER DATABASE CURRENT SET ALLOW_SNAPSHOT_ISOLATION ON")
_UNIT_SECONDS = {"MINUTES": 60, "HOURS": 3600, "DAYS": 86400}
_UNIT_CODES = {1: "MINUTES", 2: "HOURS", 3: "DAYS"}  # sys.change_tracking_databases.retention_period_units


def retention(seconds: float) -> tuple[int, str]:
    """``seconds`` rounded up to whole minutes, spelled in the largest unit
    that keeps it exact: 2d -> (2, DAYS), 36h -> (36, HOURS), 90m -> (90,
    MINUTES), 10s -> (1, MINUTES) (SQL Server's minimum)."""
    minutes = max(1, math.ceil(seconds / 60 - 1e-9))
    if minutes % 1440 == 0:
        return minutes // 1440, "DAYS"
    if minutes % 60 == 0:
        return minutes // 60, "HOURS"
    return minutes, "MINUTES"


def retention_seconds(period: int, units: int | str) -> float:
    """A retention read from sys.change_tracking_databases, in seconds."""
    unit = _UNIT_CODES.get(units, "") if isinstance(units, int) else units.upper()
    if unit not in _UNIT_SECONDS:
        raise ValueError(f"unknown retention unit {units!r}")
    return float(period * _UNIT_SECONDS[unit])


def enable_database_tracking(seconds: float) -> Statement:
    amount, unit = retention(seconds)
    return Statement(
        f"ALTER DATABASE CURRENT SET CHANGE_TRACKING = ON (CHANGE_RETENTION = {amount} {unit}, AUTO_CLEANUP = ON)"
    )


def set_retention(seconds: float) -> Statement:
    """Lengthen the retention of a database that already tracks changes
    (AUTO_CLEANUP is left alone: turning it on again resets retention)."""
    amount, unit = retention(seconds)
    return Statement(f"ALTER DATABASE CURRENT SET CHANGE_TRACKING (CHANGE_RETENTION = {amount} {unit})")


def enable_table_tracking(schema: str, name: str) -> Statement:
    return Statement(
        f"ALTER TABLE {qualified(schema, name)} ENABLE CHANGE_TRACKING WITH (TRACK_COLUMNS_UPDATED = ON)"
    )


def disable_table_tracking(schema: str, name: str) -> Statement:
    return Statement(f"ALTER TABLE {qualified(schema, name)} DISABLE CHANGE_TRACKING")
