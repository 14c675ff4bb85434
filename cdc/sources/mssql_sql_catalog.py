"""The T-SQL that describes tables: their columns, primary key, tracking and
permissions, and the shape fingerprints and tracking states of many tables
per statement (``mssql_catalog``, ``mssql_tracking``, ``mssql_doctor``).
Split from ``mssql_sql`` (the statements of reads), whose rules it follows:
names quoted or passed as parameters, every statement parsed by sqlglot's
T-SQL dialect in tests/cdc/sources/test_mssql_sql.py."""

from __future__ import annotations

from collections.abc import Sequence

from cdc.sources import mssql_sql_identity as identity
from cdc.sources.mssql_sql import Statement, qualified

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
