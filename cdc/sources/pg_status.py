"""What tracking is in place for one table, as ``cdc tracking status``,
``cdc doctor`` and the sidecar see it.

A table is followed only while its registry entry exists and both its
capture and truncate triggers fire for every session (``ENABLE ALWAYS``):
without the capture trigger no change is recorded, without the truncate
trigger a TRUNCATE goes unnoticed. Either one missing, disabled, or enabled
for replica sessions only (``ENABLE REPLICA`` fires only for changes that
logical replication applies: the applications' own writes go unrecorded)
means changes are not captured (``min_valid_version`` None); any other state
(enabled for origin sessions only, the notify trigger gone) is impaired, and
said so.
"""

from __future__ import annotations

from psycopg import sql

from cdc.config import TableConfig
from cdc.sources.base import TrackingStatus
from cdc.sources.pg_catalog import Connection, find_table
from cdc.sources.pg_tracking import (
    UNCAPTURED,
    installed,
    net_table_fits,
    registry_entry,
    trigger_names,
    trigger_states,
)


async def table_status(
    conn: Connection, schema: str, table_config: TableConfig, version: int
) -> TrackingStatus:
    """Whether the table is tracked, and its triggers in place, as of ``version``."""
    found = await find_table(conn, table_config.schema, table_config.name)
    if found is None:
        renamed = await renamed_to(conn, schema, table_config.table)
        detail = "no such table" + (f" (renamed to {renamed}?)" if renamed else "")
        return TrackingStatus(table_config.table, False, detail=detail)
    entry = await registry_entry(conn, schema, found.qualified)
    if entry is None:
        detail = f"change tracking is not enabled (run cdc tracking enable --table {table_config.table})"
        return TrackingStatus(table_config.table, False, current_version=version, detail=detail)
    triggers = await trigger_states(conn, schema, found.oid)
    capture, truncate, _ = trigger_names(schema)
    lost = [n for n in (capture, truncate) if triggers[n] in UNCAPTURED]
    problem = f"{_trigger_state(lost[0], triggers[lost[0]])}: changes are not captured" if lost else ""
    if not problem and not await net_table_fits(conn, schema, entry.net_table, found):
        problem = (
            "the primary key changed (columns or types) since tracking was enabled: the net table "
            f"{schema}.{entry.net_table} no longer fits it, writes to the table fail or are not tracked"
        )
    if problem:
        detail = f"{problem}; run cdc tracking enable --table {table_config.table}"
        return TrackingStatus(table_config.table, False, current_version=version, detail=detail)
    broken = [_trigger_state(n, s) for n, s in triggers.items() if s != "A"]
    detail = "; ".join(broken) or f"change tracking enabled (net table {schema}.{entry.net_table})"
    return TrackingStatus(table_config.table, not broken, entry.min_valid_version, version, detail)


def _trigger_state(name: str, state: str) -> str:
    """A trigger that is not ``ENABLE ALWAYS`` ('A'), in words."""
    described = {
        "": "missing",
        "D": "disabled",
        "O": "not ENABLE ALWAYS: it ignores changes applied by logical replication",
        "R": "ENABLE REPLICA: it fires only for changes applied by logical replication",
    }
    return f"trigger {name} is {described.get(state, repr(state))}"


async def renamed_to(conn: Connection, schema: str, table: str) -> str | None:
    """The name the table registered as ``table`` ("schema.name") has now, when
    that is another one: the table was renamed (ALTER TABLE ... RENAME)."""
    if not await installed(conn, schema):
        return None
    row = await (
        await conn.execute(
            sql.SQL(
                "select n.nspname || '.' || c.relname from {} r"
                " join pg_class c on c.oid = (to_jsonb(r) ->> 'table_oid')::oid"
                " join pg_namespace n on n.oid = c.relnamespace where r.table_name = %s"
            ).format(sql.Identifier(schema, "tracked_tables")),
            [table],
        )
    ).fetchone()
    return str(row[0]) if row is not None and row[0] != table else None
