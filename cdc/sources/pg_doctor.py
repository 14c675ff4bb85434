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

# NULL when the schema does not exist. Asked before anything in the schema is
# looked up: without USAGE, any lookup there fails ("permission denied for schema").
_SCHEMA_USAGE = "select has_schema_privilege(oid, 'USAGE') from pg_namespace where nspname = %s"
# NULL when the relation does not exist (the status finding says so).
_CAN = "select has_table_privilege(to_regclass(format('%%I.%%I', %s::text, %s::text)), %s)"

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
    missing = [name for name in dict.fromkeys((table_config.schema, schema)) if await _no_usage(conn, name)]
    if missing:
        grant = f"grant usage on schema {', '.join(missing)} to <the source user>"
        return [
            Finding(
                "error", table_config.table, f"the source user has no USAGE on schema {missing[0]}: {grant}"
            )
        ]
    status = await pg_status.table_status(conn, schema, table_config, version)
    extra = {"min_valid_version": status.min_valid_version}
    findings = [Finding("ok" if status.enabled else "error", table_config.table, status.detail, extra)]
    net = pg_tracking.net_table_name(table_config.schema, table_config.name)
    for relation_schema, name, what in (
        (table_config.schema, table_config.name, "the table"),
        (schema, net, "its tracking"),
    ):
        if await _lacks(conn, relation_schema, name, "SELECT"):
            findings.append(
                Finding("error", table_config.table, f"the source user cannot SELECT from {what}")
            )
    if await _lacks(conn, schema, net, "DELETE") or await _lacks(conn, schema, "tracked_tables", "UPDATE"):
        findings.append(
            Finding(
                "warning",
                table_config.table,
                f"the retention cleanup will fail: the source user may not remove old entries of "
                f"{schema}.{net} nor change {schema}.tracked_tables (grant it the DELETE privilege on the "
                f"one and UPDATE on the other), or make source.cleanup_interval 0 and run "
                f"{schema}.cleanup(...) as the tables' owner: else the tracking tables grow without bound",
            )
        )
    return findings


async def _no_usage(conn: Connection, schema: str) -> bool:
    row = await (await conn.execute(_SCHEMA_USAGE, [schema])).fetchone()
    return row is not None and row[0] is False


async def _lacks(conn: Connection, schema: str, name: str, privilege: str) -> bool:
    row = await (await conn.execute(_CAN, [schema, name, privilege])).fetchone()
    return row is not None and row[0] is False


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
