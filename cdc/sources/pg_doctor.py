"""``cdc doctor`` for PostgreSQL: what will go wrong, found before it does.

Transactions old enough to hold every table's changes back, commits shown
before they are durable, each privilege the role lacks (to read the tables
and their tracking, and to run the retention cleanup) with the GRANT that
gives it (``pg_grants``), and per table: tracking installed, triggers in
place.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from cdc.config import TableConfig
from cdc.sources import pg_grants, pg_status
from cdc.sources.base import Finding
from cdc.sources.pg_catalog import Connection
from cdc.sources.pg_grants import SHARED, Need
from cdc.sources.pg_reads import read_bound

_OLD_TRANSACTIONS = """
    select (select extract(epoch from max(now() - xact_start)) from pg_stat_activity
             where backend_xid is not null),
           (select count(*) from pg_prepared_xacts)
"""


async def doctor(
    conn: Connection, schema: str, tables: Sequence[TableConfig], *, cleanup: bool = True
) -> list[Finding]:
    """Every finding, read in the caller's transaction. ``cleanup``: whether
    this sidecar runs the retention cleanup (``source.cleanup_interval`` > 0).

    A privilege the role lacks is a finding, never an error that stops the
    rest: each is checked with ``has_*_privilege`` (``pg_grants``), and the
    tracking state of a table is only read where the role may read it (and
    then inside a savepoint: a "permission denied" is a finding too)."""
    findings = await _transaction_findings(conn) + await _durability_findings(conn)
    version = await read_bound(conn)
    role = await pg_grants.current_role(conn)
    reads = pg_grants.read_needs(schema, tables)
    functions = await pg_grants.cleanup_functions(conn, schema) if cleanup else []
    cleans = pg_grants.cleanup_needs(schema, tables, functions)
    lacking = await pg_grants.missing(conn, reads + cleans)
    findings += [_privilege_finding(role, schema, need) for need in lacking]
    findings += _cleanup_summary(schema, cleanup, functions, cleans, lacking)
    for table_config in tables:
        findings += await _table_findings(conn, schema, table_config, version, lacking)
    return findings


def _privilege_finding(role: str, schema: str, need: Need) -> Finding:
    grant = pg_grants.statement(need.grant(role))
    extra = {"grant": grant, "privilege": need.privilege, "object": need.target, "cleanup": need.cleanup}
    if need.cleanup:
        return Finding(
            "error",
            need.subject,
            f"the retention cleanup cannot run: role {role} lacks {need.privilege} on {need.target} "
            f"({need.why}), so the tracking tables grow without bound: {grant} (or set "
            f"source.cleanup_interval: 0 and run {schema}.cleanup(...) as the tables' owner)",
            extra,
        )
    return pg_grants.privilege_finding(role, need)


def _cleanup_summary(
    schema: str, cleanup: bool, functions: Sequence[object], needs: Sequence[Need], lacking: Sequence[Need]
) -> list[Finding]:
    if not cleanup:
        return [
            Finding(
                "ok",
                "retention cleanup",
                f"off (source.cleanup_interval: 0): run {schema}.cleanup(...) as the tables' owner, "
                "or the tracking tables grow without bound",
            )
        ]
    if not functions or any(n.cleanup for n in lacking):
        return []  # not installed (the tracking findings say so), or each lack is its own finding
    held = ", ".join(f"{n.privilege} on {n.target}" for n in needs)
    return [Finding("ok", "retention cleanup", f"can run: the role holds {held}")]


async def _table_findings(
    conn: Connection, schema: str, table_config: TableConfig, version: int, lacking: Sequence[Need]
) -> list[Finding]:
    """The table's tracking state, where the role may read it."""
    blocked = [
        n
        for n in lacking
        if not n.cleanup and (n.subject == SHARED or (n.kind == "schema" and n.schema == table_config.schema))
    ]
    if blocked:
        what = ", ".join(f"{n.privilege} on {n.target}" for n in blocked)
        return [
            Finding(
                "warning",
                table_config.table,
                f"its change tracking was not checked: that needs {what} (granted by the statements above)",
            )
        ]
    try:
        async with conn.transaction():  # a savepoint: a refusal leaves the doctor's transaction usable
            status = await pg_status.table_status(conn, schema, table_config, version)
    except psycopg.errors.InsufficientPrivilege as exc:
        detail = exc.diag.message_primary or str(exc).strip()
        return [Finding("error", table_config.table, f"its change tracking cannot be read: {detail}")]
    extra = {"min_valid_version": status.min_valid_version}
    return [Finding("ok" if status.enabled else "error", table_config.table, status.detail, extra)]


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
