"""``cdc doctor`` for SQL Server: what will go wrong, found before it does.

Snapshot isolation, database change tracking, retention against
``source.retention``, and per table: permissions, tracking, column tracking,
and columns changed since this sidecar described the table.

Permissions are what the reads need, no more: ``VIEW CHANGE TRACKING`` on the
table, and ``SELECT`` on the columns they name (the primary key, read from
CHANGETABLE, and the published columns, read from the table). SQL Server lets
SELECT be granted per column, and a login so granted has no SELECT on the
table as a whole, so the check is per column: ``HAS_PERMS_BY_NAME(table,
'OBJECT', 'SELECT', column, 'COLUMN')`` ("HAS_PERMS_BY_NAME (Transact-SQL)",
learn.microsoft.com: the sub-securable is the column's plain name, never
bracketed; 1 granted, 0 not, NULL when the check fails).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyodbc

from cdc.config import TableConfig
from cdc.durations import format_duration
from cdc.errors import SchemaError, TrackingNotEnabled, TransientError, UnsupportedType
from cdc.sources import mssql_sql as sql
from cdc.sources import mssql_sql_catalog as catalog_sql
from cdc.sources.base import Finding
from cdc.sources.mssql_catalog import DescribedTable, TableName, describe, not_tracked, shape_change
from cdc.sources.mssql_errors import map_error
from cdc.sources.mssql_grants import CURRENT_USER
from cdc.sources.mssql_link import fetch_all, fetch_one, fetch_scalar
from cdc.sources.mssql_tracking import database_settings


def _database_findings(conn: Any, retention: float) -> list[Finding]:
    db = database_settings(conn)
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


def doctor(
    conn: Any, tables: Sequence[TableConfig], retention: float, known: dict[str, DescribedTable]
) -> list[Finding]:
    findings = _database_findings(conn, retention)
    user = fetch_scalar(
        conn, CURRENT_USER
    )  # the GRANTs name it; None: the statements say "<the sidecar's user>"
    for table_config in tables:
        try:
            findings += _table_findings(
                conn, table_config, known.get(table_config.table.lower()), None if user is None else str(user)
            )
        except pyodbc.Error as exc:
            # a refusal (error 229, permission denied...) is a finding, not a crash; a lost link is raised
            error = map_error(exc, "", f"doctor {table_config.table}")
            if isinstance(error, TransientError):
                raise
            findings.append(Finding("error", table_config.table, f"cannot be checked: {error}"))
    return findings


# One row per column asked about, in the order asked: (n, column, can_select). The
# names are parameters in a VALUES list, the table's name too (OBJECT_ID's text).
_COLUMN_SELECT = (
    "SELECT c.n, c.name, HAS_PERMS_BY_NAME(?, N'OBJECT', N'SELECT', c.name, N'COLUMN') AS can_select "
    "FROM (VALUES {rows}) AS c(n, name) ORDER BY c.n"
)


def column_select(schema: str, name: str, columns: Sequence[str]) -> sql.Statement:
    """Whether the login may SELECT each of ``columns`` of the table."""
    if not 0 < len(columns) < sql.MAX_PARAMETERS:
        raise ValueError(f"ask about 1 to {sql.MAX_PARAMETERS - 1} columns, not {len(columns)}")
    rows = ", ".join(f"({n}, ?)" for n in range(len(columns)))  # n: a position, never a name
    return sql.Statement(_COLUMN_SELECT.format(rows=rows), (sql.qualified(schema, name), *columns))


def _grant(
    permission: str, schema: str, name: str, columns: Sequence[str] = (), user: str | None = None
) -> str:
    listed = f" ({', '.join(sql.quote(c) for c in columns)})" if columns else ""
    principal = sql.quote(user) if user else "<the sidecar's user>"
    return f"GRANT {permission} ON {sql.qualified(schema, name)}{listed} TO {principal}"


def view_tracking_findings(
    table_config: TableConfig, can_view: Any, user: str | None = None
) -> list[Finding]:
    """The VIEW CHANGE TRACKING check: without it CHANGE_TRACKING_MIN_VALID_VERSION is NULL."""
    if can_view is None:
        # SQL Server hides an object from a login with no permission on it ("Metadata
        # Visibility Configuration", learn.microsoft.com): OBJECT_ID is NULL either way
        grants = [
            _grant(p, table_config.schema, table_config.name, user=user)
            for p in ("SELECT", "VIEW CHANGE TRACKING")
        ]
        return [
            Finding(
                "error",
                table_config.table,
                "the table does not exist, or the login has no permission on it (SQL Server then hides it): "
                f"if it exists, {'; '.join(grants)}",
                {"grant": "; ".join(grants)},
            )
        ]
    if can_view:
        return []
    grant = _grant("VIEW CHANGE TRACKING", table_config.schema, table_config.name, user=user)
    return [
        Finding(
            "error",
            table_config.table,
            f"the login lacks the VIEW CHANGE TRACKING permission on it (CHANGE_TRACKING_MIN_VALID_VERSION "
            f"reads NULL, so no change can be read): {grant}",
            {"grant": grant},
        )
    ]


def column_findings(
    table_config: TableConfig,
    key: Sequence[str],
    columns: Sequence[str],
    rows: Sequence[Any],
    user: str | None = None,
) -> list[Finding]:
    """The SELECT check, from ``column_select``'s rows: each key or published
    column the login may not SELECT is named, with the GRANT that fixes it."""
    granted = {str(row[1]): row[2] for row in rows}
    needed = list(dict.fromkeys([*key, *columns]))
    denied = [c for c in needed if granted.get(c) == 0]
    unknown = [c for c in needed if granted.get(c) is None]
    out: list[Finding] = []
    if denied:
        keys = [c for c in denied if c in key]
        what = "primary-key column(s) " + ", ".join(keys) if keys else ""
        published = [c for c in denied if c not in key]
        if published:
            what += ("; " if what else "") + "published column(s) " + ", ".join(published)
        out.append(
            Finding(
                "error",
                table_config.table,
                f"the login lacks SELECT on {what}: the reads select every key and published column. "
                f"{_grant('SELECT', table_config.schema, table_config.name, denied, user)} (or SELECT on the table), "
                "or leave published columns out of `columns:`",
                {
                    "columns_without_select": denied,
                    "grant": _grant("SELECT", table_config.schema, table_config.name, denied, user),
                },
            )
        )
    if unknown:
        out.append(
            Finding(
                "warning",
                table_config.table,
                f"could not check SELECT on column(s) {', '.join(unknown)} (HAS_PERMS_BY_NAME gave no answer)",
            )
        )
    return out


def _table_findings(
    conn: Any, table_config: TableConfig, known: DescribedTable | None, user: str | None
) -> list[Finding]:
    # (table-level SELECT, VIEW CHANGE TRACKING): only the second is used; SELECT is checked per column
    _, can_view = fetch_one(conn, catalog_sql.table_permissions(table_config.schema, table_config.name))
    out = view_tracking_findings(table_config, can_view, user)
    try:
        described = describe(
            conn, TableName(table_config.table, table_config.schema, table_config.name), table_config.columns
        )
    except (SchemaError, TrackingNotEnabled, UnsupportedType) as exc:
        out.append(Finding("error", table_config.table, str(exc)))
        return out
    info = described.info
    rows = fetch_all(conn, column_select(table_config.schema, table_config.name, info.column_names))
    out += column_findings(table_config, info.primary_key, info.column_names, rows, user)
    if not described.tracked:
        out.append(
            Finding(
                "error",
                table_config.table,
                not_tracked(table_config.table, table_config.schema, table_config.name),
            )
        )
        return out
    if known is not None and known.info != described.info:
        # ADD COLUMN, a type change, a new key, the table created again: the tracker describes it again.
        out.append(
            Finding(
                "warning",
                table_config.table,
                f"the table changed since this sidecar described it ({shape_change(known.info, described.info)}): "
                "a running sidecar notices it within seconds, describes the table again and re-snapshots it",
                {
                    "was": [c.type_name for c in known.info.columns],
                    "now": [c.type_name for c in described.info.columns],
                },
            )
        )
    if described.info.left_out:
        out.append(
            Finding(
                "warning",
                table_config.table,
                f"columns left out of the documents: {', '.join(described.info.left_out)} (names starting with @ "
                "are reserved for the documents' own fields @v, @ts, @del): rename them, or list the columns "
                "to publish under `columns:`",
            )
        )
    if not described.track_columns_updated:
        out.append(
            Finding(
                "warning",
                table_config.table,
                "TRACK_COLUMNS_UPDATED is OFF: changed columns are unknown, so every update is published whole",
            )
        )
    columns = ", ".join(described.info.column_names)
    out.append(
        Finding(
            "ok",
            table_config.table,
            f"tracked; primary key {', '.join(described.info.primary_key)}; {columns}",
        )
    )
    return out
