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
    SELECT c.name, c.column_id FROM sys.columns ...          -- the mask columns' ids, once
    SELECT TOP (?) ct.SYS_CHANGE_VERSION, ... FROM CHANGETABLE(CHANGES [s].[t], ?) AS ct
      LEFT JOIN [s].[t] AS t ON <pk equality> WHERE ct.SYS_CHANGE_VERSION <= ? [AND (version, pk) > after]
      ORDER BY ct.SYS_CHANGE_VERSION, <pk>                   -- TOP (page + 1): more to come?
    [CREATE TABLE #cdc_changes ...; INSERT INTO #cdc_changes SELECT ROW_NUMBER() ...
      FROM CHANGETABLE(...) WHERE ... AND (version, pk) > after]  -- the second page: the backlog
    [SELECT TOP (?) ... FROM #cdc_changes AS p LEFT JOIN [s].[t] ... WHERE p.[@rn] > ?]  -- later pages
    COMMIT TRANSACTION                                       -- with the last page
    [DROP TABLE IF EXISTS #cdc_changes]                      -- (mssql_backlog_sql)
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cdc.sources import mssql_sql_identity as identity
from cdc.sources.mssql_select import DATE_TIME_TEXT, column_select, exact_text

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
    column_types: tuple[str, ...] = ()  # declared SQL type of each published column (mssql_select)

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
_EXACT_TEXT_TYPES = DATE_TIME_TEXT  # the types mssql_select reads as their text too
_CHAR_TYPES = frozenset({"char", "varchar"})


def is_exact_text(type_name: str) -> bool:
    return type_name.split("(", 1)[0].lower() in _EXACT_TEXT_TYPES


def sql_type(type_name: str) -> str:
    """``type_name``, checked to be a type's spelling and nothing else."""
    if not _SQL_TYPE.match(type_name):
        raise ValueError(f"{type_name!r} is not a SQL Server type name")
    return type_name


def collation(name: str) -> str:
    """``name``, checked to be a collation's name and nothing else."""
    if not _COLLATION.match(name):
        raise ValueError(f"{name!r} is not a SQL Server collation name")
    return name


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
    column_ids: Sequence[int | None] | None = None,
) -> Statement:
    """Net changes after ``since`` up to ``upto``, one page of ``limit`` rows in
    (version, primary key) order, starting after the ``after`` cursor.

    The result columns are ``change_columns``'s. ``column_ids``: the id of each
    ``mask_columns`` column, read in the read's own transaction
    (``column_ids_of``). ``SYS_CHANGE_VERSION <= upto`` keeps a row committed
    after the version read in this transaction out of this read: it comes in
    the next one.
    """
    table = shape.qualified
    select, params = change_columns("ct", shape, _CT_COLUMNS, column_ids)
    join = " AND ".join(f"t.{quote(c)} = ct.{quote(c)}" for c in shape.primary_key)
    where, where_params = changes_after(shape, upto=upto, after=after)
    order = ", ".join(["ct.SYS_CHANGE_VERSION", *(f"ct.{quote(c)}" for c in shape.primary_key)])
    sql = (
        f"SELECT TOP (?) {', '.join(select)} "  # noqa: S608 - identifiers quoted, values are parameters
        f"FROM CHANGETABLE(CHANGES {table}, ?) AS ct "
        f"LEFT JOIN {table} AS t ON {join} "
        f"WHERE {where} ORDER BY {order}"
    )
    return _checked(Statement(sql, (limit, *params, since, *where_params)))


def change_columns(
    source: str, shape: TableShape, change: Sequence[str], column_ids: Sequence[int | None] | None
) -> tuple[list[str], list[Any]]:
    """The select list of a page of changes, and its parameters: the four
    SYS_CHANGE_* columns (``change``, as ``source`` holds them), ``source``.<pk...>
    (present for deletes too), t.<published columns...> (NULL when the row is
    gone), then one CHANGE_TRACKING_IS_COLUMN_IN_MASK flag per ``mask_columns``,
    then the exact text of each ``exact_keys`` column (for the cursor)."""
    select = [*change]
    select += shape.selected(source, shape.primary_key)
    select += shape.selected("t", shape.columns)
    # SYS_CHANGE_COLUMNS is opaque: decode it only with the documented function, whose
    # column ids are parameters here, read by ``column_ids_of`` in the read's own transaction.
    select += [f"CHANGE_TRACKING_IS_COLUMN_IN_MASK(?, {change[3]})" for _ in shape.mask_columns]
    ids = list(column_ids) if column_ids is not None else [None] * len(shape.mask_columns)
    if len(ids) != len(shape.mask_columns):
        raise ValueError(f"{len(ids)} column ids for {len(shape.mask_columns)} mask columns")
    select += [exact_text(f"{source}.{quote(c)}") for c in shape.exact_keys]
    return select, ids


def changes_after(
    shape: TableShape, *, upto: int, after: tuple[int, Sequence[Any]] | None
) -> tuple[str, list[Any]]:
    """The WHERE clause of CHANGETABLE rows (``ct``) up to ``upto`` and after the ``after`` cursor."""
    where, params = "ct.SYS_CHANGE_VERSION <= ?", [upto]
    if after is not None:
        version, key = after
        terms: list[Term] = [("ct.SYS_CHANGE_VERSION", None, None), *_key_terms("ct", shape)]
        keyset, keyset_params = _keyset_after(terms, [version, *key])
        where += f" AND {keyset}"
        params += keyset_params
    return where, params


# The column ids that decode SYS_CHANGE_COLUMNS, by name, read once per read in the read's own
# transaction (not per row and column, as a COLUMNPROPERTY inside the page's select list would
# be), with the table's name as the one parameter, however wide the table. Never an id cached
# at describe: CHANGE_TRACKING_IS_COLUMN_IN_MASK "does not perform any checks to validate the
# column_id value" (CHANGE_TRACKING_IS_COLUMN_IN_MASK, learn.microsoft.com), and a column
# dropped and added again under its name has a new id, so a cached id would silently decode
# another column's bit. The function takes sys.columns.column_id ("COLUMNPROPERTY",
# learn.microsoft.com: ColumnId is the column_id of sys.columns).
COLUMN_IDS = "SELECT c.name, c.column_id FROM sys.columns AS c WHERE c.object_id = OBJECT_ID(?)"


def column_ids_of(shape: TableShape) -> Statement:
    """Rows (name, column_id) of every column of the table now (``COLUMN_IDS``)."""
    return Statement(COLUMN_IDS, (shape.qualified,))


def snapshot_page(
    shape: TableShape,
    *,
    limit: int,
    after: Sequence[Any] | None = None,
    start: Sequence[Any] | None = None,
    until: Sequence[Any] | None = None,
) -> Statement:
    """One keyset page of the table, in primary-key order: the published
    columns, then the exact text of each ``exact_keys`` column (for the cursor).
    Keys above ``after``, or at or above ``start`` (the first page of a range),
    and at or below ``until``."""
    params: list[Any] = [limit]
    columns = ", ".join(
        shape.selected("t", shape.columns) + [exact_text(f"t.{quote(c)}") for c in shape.exact_keys]
    )
    bounds: list[str] = []
    for values, strict, last in ((after, ">", ">"), (start, ">", ">="), (until, "<", "<=")):
        if values is not None:
            keyset, keyset_params = _keyset(_key_terms("t", shape), list(values), strict, last)
            bounds.append(keyset)
            params += keyset_params
    where = f" WHERE {' AND '.join(bounds)}" if bounds else ""
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


def _key_parameter(declared_type: str | None, key_collation: str | None) -> str:
    """A cursor's key value as the column's own type. Date and time values are
    the server's text (``exact_text``), converted back in its style; char and
    varchar values are converted to the column's code page (COLLATE on the
    nvarchar parameter, so that the conversion to varchar uses the column's
    collation, not the database's default code page: "Collation precedence",
    learn.microsoft.com; "CAST and CONVERT (Transact-SQL)", Output Collation:
    a character input's collation and label carry to the output, so the cast
    value is labelled with the column's collation. Which code page the
    conversion itself uses no page says in so many words: the key-type
    contract test over a Cyrillic varchar settles it on a server) and compared
    in its collation; any other type is cast,
    so the comparison uses the column's ordering (the same as ORDER BY)."""
    if declared_type is None:
        return "?"
    declared = sql_type(declared_type)
    base = declared.split("(", 1)[0]
    if base in _EXACT_TEXT_TYPES:
        return f"CONVERT({declared}, ?, 121)"
    if base in _CHAR_TYPES and key_collation is not None:
        return f"CAST(? COLLATE {collation(key_collation)} AS {declared})"
    return f"CAST(? AS {declared})"


def _keyset_after(terms: Sequence[Term], values: Sequence[Any]) -> tuple[str, list[Any]]:
    """``(a, b, ...) > (va, vb, ...)`` spelled out for T-SQL, which has no row
    comparison: ``(a > ? OR (a = ? AND (b > ? OR ...)))``, each parameter as
    ``_key_parameter`` has it."""
    return _keyset(terms, values, ">", ">")


def _keyset(terms: Sequence[Term], values: Sequence[Any], strict: str, last: str) -> tuple[str, list[Any]]:
    """A row comparison in key order: ``strict`` (``>`` or ``<``) on every
    column but the last, which takes ``last`` (the same, or with ``=``: a
    range's inclusive bound)."""
    (expr, declared_type, key_collation), *rest = terms
    value, *more = values
    placeholder = _key_parameter(declared_type, key_collation)
    if not rest:
        return f"{expr} {last} {placeholder}", [value]
    inner, inner_params = _keyset(rest, more, strict, last)
    return (
        f"({expr} {strict} {placeholder} OR ({expr} = {placeholder} AND {inner}))",
        [value, value, *inner_params],
    )


def _checked(statement: Statement) -> Statement:
    if len(statement.params) > MAX_PARAMETERS:
        raise ValueError(
            f"the query needs {len(statement.params)} parameters, more than SQL Server's {MAX_PARAMETERS}: "
            "publish fewer columns"
        )
    return statement


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
