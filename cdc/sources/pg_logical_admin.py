"""``cdc tracking enable|disable|status`` and ``--grant-to`` for logical capture.

``enable`` checks what the server and the role must allow
(``pg_logical.check_prerequisites``: wal_level, REPLICATION, CREATE on the
database, free slots), every table's primary key and replica identity, then
makes per table a publication (one transaction for all of them), then its
slot (each in autocommit: a slot is not made in a transaction that wrote, and
making one waits for the transactions running then to end, ours included).
``disable`` drops both: the slot's WAL is freed at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from psycopg import sql

from cdc.config import TableConfig
from cdc.errors import SourceError
from cdc.sources import pg_catalog, pg_grants, pg_logical, pg_shape
from cdc.sources.base import Finding, TrackingStatus
from cdc.sources.pg_catalog import Connection
from cdc.sources.pg_sessions import Sessions

SlotName = Callable[[str, str], str]  # (table, database) -> the slot's and publication's name


async def enable(sessions: Sessions, slot: SlotName, tables: Sequence[TableConfig]) -> list[str]:
    done = []
    async with sessions.administering("enable change tracking (logical decoding)") as conn:
        refused = await pg_grants.not_owned(conn, tables)
        if refused:
            raise SourceError(pg_grants.ownership_error(await pg_grants.current_role(conn), refused))
        database = conn.info.dbname
        new = [t for t in tables if await pg_logical.slot_state(conn, slot(t.table, database)) is None]
        await pg_logical.check_prerequisites(conn, len(new))
        for table_config in tables:
            done.append(await _publish(conn, slot(table_config.table, database), table_config))
    conn = await sessions.open()
    try:
        async with sessions.guard("create replication slots"):
            for table_config in tables:
                name = slot(table_config.table, database)
                made = await pg_logical.ensure_slot(conn, name)
                done.append(
                    f"{table_config.table}: replication slot {name} {'created' if made else 'in place'}"
                )
    finally:
        await conn.close()
    return done


async def _publish(conn: Connection, name: str, table_config: TableConfig) -> str:
    found = await pg_catalog.find_table(conn, table_config.schema, table_config.name)
    if found is None:
        raise await pg_catalog.missing_table(conn, table_config.schema, table_config.name)
    pg_shape.table_info(table_config, found, "")  # a primary key, and columns that can be published
    await pg_logical.check_replica_identity(conn, table_config.table, found)
    return (
        f"{table_config.table}: publication {name} {await pg_logical.ensure_publication(conn, name, found)}"
    )


async def disable(sessions: Sessions, slot: SlotName, tables: Sequence[TableConfig]) -> list[str]:
    done = []
    conn = await sessions.open()
    try:
        async with sessions.guard("disable change tracking (logical decoding)"):
            for table_config in tables:
                name = slot(table_config.table, conn.info.dbname)
                dropped = [
                    what
                    for what, did in (
                        # The publication first: a running sidecar recreates a
                        # dropped slot while its publication still exists.
                        ("publication", await pg_logical.drop_publication(conn, name)),
                        ("replication slot", await pg_logical.drop_slot(conn, name)),
                    )
                    if did
                ]
                done.append(
                    f"{table_config.table}: {' and '.join(dropped)} {name} dropped"
                    if dropped
                    else f"{table_config.table}: not tracked (no slot nor publication {name})"
                )
    finally:
        await conn.close()
    return done


async def status(sessions: Sessions, slot: SlotName, tables: Sequence[TableConfig]) -> list[TrackingStatus]:
    """Enabled: published and the slot valid; ``min_valid_version`` is the
    slot's confirmed position (a checkpoint below it has expired); ``detail``
    says how much WAL the slot holds."""
    statuses = []
    async with sessions.reading("read tracking status", transaction=False) as conn:
        for t in tables:
            found = await pg_logical.window(conn, slot(t.table, conn.info.dbname), t.schema, t.name)
            current = found.flush - 1
            if not found.published or found.slot is None:
                detail = "no publication" if not found.published else "no replication slot"
                statuses.append(TrackingStatus(t.table, False, None, current, detail))
                continue
            detail = f"its replication slot holds {found.slot.retained} bytes of WAL"
            if found.slot.lost:
                detail = (
                    "replication slot invalidated (max_slot_wal_keep_size): the table is snapshotted again"
                )
            statuses.append(
                TrackingStatus(t.table, not found.slot.lost, found.slot.confirmed, current, detail)
            )
    return statuses


async def grant(sessions: Sessions, tables: Sequence[TableConfig], role: str) -> list[str]:
    """SELECT on the tables (snapshots, unchanged TOASTed values); a slot's
    functions need the role's REPLICATION attribute, which only a superuser
    (or, before PostgreSQL 16, a CREATEROLE role) gives: said, not granted."""
    async with sessions.administering(f"grant the runtime privileges to {role}") as conn:
        for t in tables:
            await conn.execute(
                sql.SQL("grant select on {} to {}").format(
                    sql.Identifier(t.schema, t.name), sql.Identifier(role)
                )
            )
    lines = [f"{t.table}: SELECT granted to {role}" for t in tables]
    return [*lines, f"{role} also needs the REPLICATION attribute: ALTER ROLE {role} REPLICATION"]


async def doctor(sessions: Sessions, slot: SlotName, tables: Sequence[TableConfig]) -> list[Finding]:
    """The server's settings, then per table its publication and slot, with the
    WAL the slot holds: an abandoned slot keeps WAL until the disk is full."""
    findings = []
    async with sessions.reading("doctor", transaction=False) as conn:
        row = await (
            await conn.execute(
                "select current_setting('wal_level'), current_setting('max_slot_wal_keep_size'),"
                " r.rolreplication or r.rolsuper from pg_roles r where r.rolname = current_user"
            )
        ).fetchone()
        assert row is not None
        wal_level, keep, replication = row
        if wal_level != "logical":
            findings.append(
                Finding("error", "wal_level", f"is {wal_level!r}: logical capture needs 'logical'")
            )
        if not replication:
            findings.append(
                Finding("error", "role", "has no REPLICATION attribute: ALTER ROLE ... REPLICATION")
            )
        if keep == "-1":
            findings.append(
                Finding(
                    "warning",
                    "max_slot_wal_keep_size",
                    "is -1 (unlimited): a slot whose sidecar is gone keeps WAL until the disk is full; "
                    "set it (e.g. ALTER SYSTEM SET max_slot_wal_keep_size = '50GB') so the server drops "
                    "such a slot's WAL instead (that table is then snapshotted again)",
                )
            )
        for t in tables:
            found = await pg_logical.window(conn, slot(t.table, conn.info.dbname), t.schema, t.name)
            findings.append(_table_finding(t.table, found))
        for other in await pg_logical.other_slots(conn, [slot(t.table, conn.info.dbname) for t in tables]):
            findings.append(
                Finding(
                    "warning",
                    f"slot {other.name}",
                    other_slot_text(other),
                    {"retained_wal_bytes": other.retained},
                )
            )
    return findings


async def other_slots(sessions: Sessions, slot: SlotName, tables: Sequence[TableConfig]) -> list[str]:
    """``cdc tracking status``'s lines for the cdc slots of this database that no
    table of ``tables`` (the whole config) uses in this deployment."""
    async with sessions.reading("list replication slots", transaction=False) as conn:
        found = await pg_logical.other_slots(conn, [slot(t.table, conn.info.dbname) for t in tables])
    return [f"OTHER    slot {o.name}  {other_slot_text(o)}" for o in found]


def other_slot_text(other: pg_logical.OtherSlot) -> str:
    """Never dropped here: the slot may be another deployment's (another
    namespace or Redis server sharing the database), live. A slot name hashes
    the deployment, so one changed (redis.url, redis.namespace) leaves the
    old slots behind, each keeping WAL."""
    published = f"publishes {other.tables}" if other.tables else "has no publication"
    reading = "a session reads it now" if other.active else "no session reads it"
    return (
        f"belongs to no table of this config in this deployment (redis.url and redis.namespace); it {published},"
        f" {reading}, and holds {other.retained / 2**20:.1f} MiB of WAL. Left behind by a changed redis.url or"
        " namespace, or a table removed without cdc tracking disable? If no other deployment uses it, drop it:"
        f" SELECT pg_drop_replication_slot('{other.name}'); DROP PUBLICATION IF EXISTS {other.name};"
    )


def _table_finding(table: str, found: pg_logical.Window) -> Finding:
    if not found.published or found.slot is None:
        what = "publication" if not found.published else "replication slot"
        return Finding("error", table, f"no {what}: run cdc tracking enable --table {table}")
    if found.slot.lost:
        return Finding("error", table, "its replication slot was invalidated: the table is snapshotted again")
    held = found.slot.retained
    return Finding(
        "ok", table, f"its replication slot holds {held / 2**20:.1f} MiB of WAL", {"retained_wal_bytes": held}
    )
