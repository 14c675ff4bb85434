"""Setting SQL Server Change Tracking up, taking it down, and reporting its state.

``cdc tracking enable`` turns on what SQLSERVER.md lists: snapshot isolation
and change tracking for the database (with a retention at least
``source.retention``), then tracking with ``TRACK_COLUMNS_UPDATED = ON`` per
table. ``disable`` turns tracking off per table only: other tables may use
the database-level settings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyodbc

from cdc.config import TableConfig
from cdc.errors import SchemaError
from cdc.sources import mssql_isolation as isolation
from cdc.sources import mssql_sql as sql
from cdc.sources import mssql_sql_catalog as catalog_sql
from cdc.sources.base import TrackingStatus
from cdc.sources.mssql_catalog import TableName, check_published
from cdc.sources.mssql_errors import NO_PRIMARY_KEY, error_parts
from cdc.sources.mssql_link import execute, fetch_all, fetch_one, fetch_scalar


@dataclass(frozen=True)
class DatabaseSettings:
    name: str
    snapshot_state: int  # 0 off, 1 on, 2 in transition to off, 3 in transition to on
    snapshot_desc: str
    tracking: bool  # CHANGE_TRACKING_CURRENT_VERSION() is not NULL
    retention: float | None  # seconds; None when sys.change_tracking_databases hides it
    retention_text: str
    auto_cleanup: bool | None


def database_settings(conn: Any) -> DatabaseSettings:
    execute(conn, sql.SET_READ_COMMITTED)
    row = fetch_one(conn, catalog_sql.DATABASE_SETTINGS)
    name, state, desc, current, period, units, cleanup = row
    retention = None if period is None or units is None else sql.retention_seconds(int(period), int(units))
    text = "unknown" if retention is None else "{} {}".format(*sql.retention(retention))
    return DatabaseSettings(
        str(name),
        int(state),
        str(desc),
        current is not None,
        retention,
        text,
        None if cleanup is None else bool(cleanup),
    )


def enable(
    conn: Any, tables: Sequence[TableConfig], retention: float, opener: Callable[[], Any] | None = None
) -> list[str]:
    """Turn on what is off. ``opener`` gives a new connection: turning snapshot
    isolation on waits for the database's open transactions, on a connection
    of its own (``mssql_isolation``); without one it runs on ``conn``, under
    its query timeout. A published column whose type cannot be mirrored:
    UnsupportedType before anything is turned on."""
    for table_config in tables:
        check_published(
            conn, TableName(table_config.table, table_config.schema, table_config.name), table_config.columns
        )
    done: list[str] = []
    db = database_settings(conn)
    if db.snapshot_state in (0, 2):  # OFF, or IN_TRANSITION_TO_OFF
        if opener is None:
            execute(conn, sql.ENABLE_SNAPSHOT_ISOLATION)
            done.append(f"database {db.name}: ALLOW_SNAPSHOT_ISOLATION ON")
        else:
            done.append(isolation.turn_on(conn, opener, db.name))
    elif db.snapshot_state == 3:  # IN_TRANSITION_TO_ON: another session's ALTER waits
        own = fetch_scalar(conn, isolation.SESSION_ID)
        writers = isolation.open_writers(conn, -1 if own is None else int(own))
        done.append(isolation.pending_message(db.name, writers))
    amount, unit = sql.retention(retention)
    wanted = f"{amount} {unit}"
    if not db.tracking:
        execute(conn, sql.enable_database_tracking(retention))
        done.append(
            f"database {db.name}: CHANGE_TRACKING = ON (CHANGE_RETENTION = {wanted}, AUTO_CLEANUP = ON)"
        )
    elif db.retention is not None and db.retention < sql.retention_seconds(amount, unit):
        # CHANGE_RETENTION alone: AUTO_CLEANUP is left as it is. Microsoft documents that
        # enabling Auto Clean-Up "resets any previous custom retention period to the default
        # retention period of 2 days" (Database Properties (ChangeTracking Page) and SMO's
        # Database.ChangeTrackingAutoCleanUp, learn.microsoft.com); the ALTER DATABASE SET
        # options page says nothing of it for T-SQL. Not sending AUTO_CLEANUP here leaves
        # the question moot.
        execute(conn, sql.set_retention(retention))
        done.append(f"database {db.name}: CHANGE_RETENTION {db.retention_text} -> {wanted}")
    else:
        done.append(f"database {db.name}: change tracking already on (retention {db.retention_text})")
    for table_config in tables:
        done.append(_enable_table(conn, table_config))
    return done


def _enable_table(conn: Any, table_config: TableConfig) -> str:
    tracking = fetch_one(conn, catalog_sql.table_tracking(table_config.schema, table_config.name))
    if tracking is not None:
        if not tracking[0]:
            return (
                f"{table_config.table}: already tracked, with TRACK_COLUMNS_UPDATED = OFF (changed columns unknown; "
                "to turn it on, DISABLE and ENABLE CHANGE_TRACKING on the table, which discards its history "
                "and makes the sidecar re-snapshot it)"
            )
        return f"{table_config.table}: already tracked"
    try:
        execute(conn, sql.enable_table_tracking(table_config.schema, table_config.name))
    except pyodbc.Error as exc:
        _, natives, text = error_parts(exc)
        if NO_PRIMARY_KEY in natives:
            raise SchemaError(
                f"{table_config.table}: change tracking needs a primary key and the table has none "
                f"(SQL Server error 4997): add one, then run `cdc tracking enable` again"
            ) from None
        if natives & {208, 1088, 4902, 15151}:
            raise SchemaError(
                f"{table_config.table}: no such table (or no permission to alter it): {text}"
            ) from None
        raise
    return f"{table_config.table}: change tracking enabled (TRACK_COLUMNS_UPDATED = ON)"


def disable(conn: Any, tables: Sequence[TableConfig]) -> list[str]:
    execute(conn, sql.SET_READ_COMMITTED)
    done: list[str] = []
    for table_config in tables:
        if fetch_one(conn, catalog_sql.table_tracking(table_config.schema, table_config.name)) is None:
            done.append(f"{table_config.table}: not tracked")
            continue
        execute(conn, sql.disable_table_tracking(table_config.schema, table_config.name))
        done.append(f"{table_config.table}: change tracking disabled")
    done.append(
        "database-level change tracking and snapshot isolation left as they are (other tables may use them)"
    )
    return done


def status(conn: Any, tables: Sequence[TableConfig]) -> list[TrackingStatus]:
    """Each table's tracking, from one statement for all of them (``TABLE_STATES``)."""
    db = database_settings(conn)
    current = fetch_scalar(conn, sql.CURRENT_VERSION)
    rows: list[Any] = []
    names = [(t.schema, t.name) for t in tables]
    for start in range(0, len(names), catalog_sql.FINGERPRINT_BATCH):
        rows += fetch_all(
            conn, catalog_sql.table_states(names[start : start + catalog_sql.FINGERPRINT_BATCH])
        )
    return [
        table_status(table_config.table, db, TableState.of(row), current)
        for table_config, row in zip(tables, rows, strict=True)
    ]


@dataclass(frozen=True)
class TableState:
    """A table as sys.tables and sys.change_tracking_tables show it."""

    exists: bool  # OBJECT_ID of the name is a user table (NULL: dropped, renamed, invisible)
    tracked: bool  # listed in sys.change_tracking_tables: change tracking is enabled on it
    track_columns_updated: bool
    min_valid_version: int | None

    @classmethod
    def of(cls, row: Any) -> TableState:
        _, object_id, tracked_object_id, columns_updated, min_valid = row
        return cls(
            object_id is not None,
            tracked_object_id is not None,
            bool(columns_updated),
            None if min_valid is None else int(min_valid),
        )


def table_status(table: str, db: DatabaseSettings, state: TableState, current: Any) -> TrackingStatus:
    """What ``tracking status`` reports. ``min_valid_version`` is None unless
    changes are captured: the database tracks changes and the table is in
    sys.change_tracking_tables. A table dropped (and maybe created again) has
    lost its tracking: DROP TABLE removes it ("Manage change tracking",
    learn.microsoft.com); created again, it is tracked from when tracking is
    enabled on it, CHANGE_TRACKING_MIN_VALID_VERSION being then the version of
    that moment."""
    captured = db.tracking and state.tracked and state.min_valid_version is not None
    enable = f"run `cdc tracking enable --table {table}`"
    if not db.tracking:
        detail = f"change tracking is off for database {db.name}: run `cdc tracking enable`"
    elif not state.exists:
        detail = "no such table (dropped, or renamed, or the login cannot see it)"
    elif not state.tracked:
        detail = (
            "change tracking is off for the table (never enabled, turned off, or the table was created "
            f"again): {enable}"
        )
    elif state.min_valid_version is None:  # NULL for a tracked table: "insufficient permission"
        detail = "tracked, but CHANGE_TRACKING_MIN_VALID_VERSION is NULL: the login lacks VIEW CHANGE TRACKING on it"
    else:
        columns = "ON" if state.track_columns_updated else "OFF"
        detail = (
            f"TRACK_COLUMNS_UPDATED = {columns}; retention {db.retention_text}; "
            f"snapshot isolation {db.snapshot_desc}"
        )
    return TrackingStatus(
        table=table,
        enabled=captured,
        min_valid_version=state.min_valid_version if captured else None,
        current_version=None if current is None else int(current),
        detail=detail,
    )
