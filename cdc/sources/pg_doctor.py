"""``cdc doctor`` for PostgreSQL: what will go wrong, found before it does.

Transactions old enough to hold every table's changes back, commits shown
before they are durable, and per table: tracking installed, triggers in
place, and the privileges to read the table and its tracking.
"""

from __future__ import annotations

from collections.abc import Sequence

from cdc.config import TableConfig
from cdc.sources import pg_status, pg_tracking
from cdc.sources.base import Finding
from cdc.sources.pg_catalog import Connection
from cdc.sources.pg_reads import read_bound

# NULL when the relation does not exist (the status finding says so).
_CAN_SELECT = "select has_table_privilege(to_regclass(format('%%I.%%I', %s::text, %s::text)), 'SELECT')"

_OLD_TRANSACTIONS = """
    select (select extract(epoch from max(now() - xact_start)) from pg_stat_activity
             where backend_xid is not null),
           (select count(*) from pg_prepared_xacts)
"""


async def doctor(conn: Connection, schema: str, tables: Sequence[TableConfig]) -> list[Finding]:
    """Every finding, read in the caller's transaction."""
    findings = await _transaction_findings(conn) + await _durability_findings(conn)
    version = await read_bound(conn)
    for table_config in tables:
        findings += await _table_findings(conn, schema, table_config, version)
    return findings


async def _table_findings(
    conn: Connection, schema: str, table_config: TableConfig, version: int
) -> list[Finding]:
    status = await pg_status.table_status(conn, schema, table_config, version)
    extra = {"min_valid_version": status.min_valid_version}
    findings = [Finding("ok" if status.enabled else "error", table_config.table, status.detail, extra)]
    net = pg_tracking.net_table_name(table_config.schema, table_config.name)
    for relation_schema, name, what in (
        (table_config.schema, table_config.name, "the table"),
        (schema, net, "its tracking"),
    ):
        row = await (await conn.execute(_CAN_SELECT, [relation_schema, name])).fetchone()
        if row is not None and row[0] is False:
            findings.append(
                Finding("error", table_config.table, f"the source user cannot SELECT from {what}")
            )
    return findings


async def _durability_findings(conn: Connection) -> list[Finding]:
    """Commits PostgreSQL shows before they are durable: after a crash the
    database can have lost changes that cdc-sync already mirrored."""
    row = await (
        await conn.execute("select current_setting('synchronous_commit'), current_setting('fsync')")
    ).fetchone()
    synchronous_commit, fsync = row or ("on", "on")
    if synchronous_commit != "off" and fsync != "off":
        return [Finding("ok", "source durability", "synchronous_commit and fsync are on")]
    return [
        Finding(
            "warning",
            "source durability",
            f"synchronous_commit = {synchronous_commit}, fsync = {fsync}: a crash can lose commits that "
            "cdc-sync has already mirrored, leaving Redis ahead of the database; turn them on, or run "
            "cdc snapshot after a crash",
        )
    ]


async def _transaction_findings(conn: Connection) -> list[Finding]:
    """Transactions that hold every table's changes back while they run."""
    row = await (await conn.execute(_OLD_TRANSACTIONS)).fetchone()
    oldest, prepared = row or (None, 0)
    findings = []
    if oldest is not None and oldest > 300:
        findings.append(
            Finding(
                "warning",
                "source",
                f"a transaction has been running for {oldest:.0f}s: changes after it are delayed until it ends",
                {"oldest_transaction_seconds": float(oldest)},
            )
        )
    if prepared:
        findings.append(
            Finding(
                "warning", "source", f"{prepared} prepared transaction(s) hold changes back until resolved"
            )
        )
    return findings or [Finding("ok", "source", "no long-running transaction holds changes back")]
