"""``cdc doctor`` for SQL Server: what will go wrong, found before it does.

Snapshot isolation, database change tracking, retention against
``source.retention``, and per table: permissions, tracking, column tracking,
and columns changed since this sidecar described the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdc.config import TableConfig
from cdc.durations import format_duration
from cdc.errors import SchemaError, TrackingNotEnabled, UnsupportedType
from cdc.sources import mssql_sql as sql
from cdc.sources.base import Finding
from cdc.sources.mssql_catalog import DescribedTable, TableName, describe, not_tracked, shape_change
from cdc.sources.mssql_link import fetch_one
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
    for table_config in tables:
        findings += _table_findings(conn, table_config, known.get(table_config.table.lower()))
    return findings


def _table_findings(conn: Any, table_config: TableConfig, known: DescribedTable | None) -> list[Finding]:
    out: list[Finding] = []
    can_select, can_view = fetch_one(conn, sql.table_permissions(table_config.schema, table_config.name))
    for permission, granted in (("SELECT", can_select), ("VIEW CHANGE TRACKING", can_view)):
        if granted is None:
            out.append(
                Finding("error", table_config.table, "the table does not exist, or the login cannot see it")
            )
            break
        if not granted:
            out.append(
                Finding(
                    "error",
                    table_config.table,
                    f"the login lacks the {permission} permission on it: "
                    f"GRANT {permission} ON {sql.qualified(table_config.schema, table_config.name)} TO <the sidecar's user>",
                )
            )
    try:
        described = describe(
            conn, TableName(table_config.table, table_config.schema, table_config.name), table_config.columns
        )
    except (SchemaError, TrackingNotEnabled, UnsupportedType) as exc:
        out.append(Finding("error", table_config.table, str(exc)))
        return out
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
