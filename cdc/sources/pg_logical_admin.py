"""``cdc tracking enable|disable|status`` and ``--grant-to`` for logical capture.

``enable`` checks what the server and the role must allow
(``pg_logical.prerequisite_problems``: wal_level, REPLICATION, CREATE on the
database, free slots), every table's primary key and replica identity, then
makes per table a publication (one transaction for all of them), then its
slot (each in autocommit: a slot is not made in a transaction that wrote, and
making one waits for the transactions running then to end, ours included).
``disable`` drops both: the slot's WAL is freed at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
        database = conn.info.dbname
        problems = await _enable_problems(conn, [slot(t.table, database) for t in tables], tables)
        if problems:
            raise SourceError("; ".join(problems))
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


async def _enable_problems(
    conn: Connection, slots: Sequence[str], tables: Sequence[TableConfig]
) -> list[str]:
    """Everything that stops the enable, all at once (nothing is changed then):
    tables this role does not own, the server's and role's prerequisites, and
    each table's replica identity."""
    problems = []
    refused = await pg_grants.not_owned(conn, tables)
    if refused:
        role = await pg_grants.current_role(conn)
        problems.append(pg_grants.ownership_error(role, refused, pg_grants.PUBLICATIONS_NEED))
    new = [name for name in slots if await pg_logical.slot_state(conn, name) is None]
    missing = await pg_logical.prerequisite_problems(conn, len(new))
    if missing:
        problems.append("source.capture is logical, but: " + "; ".join(missing))
    for table_config in tables:
        found = await pg_catalog.find_table(conn, table_config.schema, table_config.name)
        problem = (
            None
            if found is None
            else await pg_logical.replica_identity_problem(conn, table_config.table, found)
        )
        if problem is not None:
            problems.append(problem)
    return problems


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
                detail, remains = _untracked(t.table, found), found.slot is not None
                statuses.append(TrackingStatus(t.table, False, None, current, detail, remains))
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


def _untracked(table: str, found: pg_logical.Window) -> str:
    """Why a table's changes are not captured, and the fix. A slot left
    without its table (dropped) keeps WAL until ``tracking disable`` drops it;
    a table of that name again (created anew) is put back by ``enable``."""
    held = (
        "" if found.slot is None else f", but its replication slot holds {found.slot.retained} bytes of WAL"
    )
    if not found.table_exists:
        if found.slot is None:
            return "the table is gone (dropped or renamed)"
        return (
            f"the table is gone (dropped or renamed){held} until it is dropped: take the table out of the"
            f" config, then cdc tracking disable --table {table}"
        )
    detail = "no publication holds the table" if not found.published else "no replication slot"
    return f"{detail}{held}: cdc tracking enable --table {table}"


async def grant(sessions: Sessions, tables: Sequence[TableConfig], role: str) -> list[str]:
    """SELECT on the tables (snapshots, unchanged TOASTed values); a slot's
    functions need the role's REPLICATION attribute, which only a superuser
    (or, before PostgreSQL 16, a CREATEROLE role) gives: said, not granted."""
    async with sessions.administering(f"grant the runtime privileges to {role}") as conn:
        await pg_grants.check_role(conn, role)
        needs = pg_grants.table_needs(tables)
        for need in needs:
            await conn.execute(need.grant(role))
        lines = [f"{role}: granted {', '.join(f'{n.privilege} on {n.target}' for n in needs)}"]
        lines += await pg_grants.grant_later_tables(conn, tables, role)
        if not await pg_grants.has_replication(conn, role):
            lines.append(f"{role} also needs the REPLICATION attribute: ALTER ROLE {role} REPLICATION")
    return lines


async def doctor(sessions: Sessions, slot: SlotName, tables: Sequence[TableConfig]) -> list[Finding]:
    """The server's settings, then per table its publication and slot, with the
    WAL the slot holds: an abandoned slot keeps WAL until the disk is full."""
    findings = []
    async with sessions.reading("doctor", transaction=False) as conn:
        row = await (
            await conn.execute(
                "select current_setting('wal_level'), current_setting('max_slot_wal_keep_size'),"
                " r.rolreplication or r.rolsuper, current_user from pg_roles r where r.rolname = current_user"
            )
        ).fetchone()
        assert row is not None
        wal_level, keep, replication, role = row
        if wal_level != "logical":
            findings.append(
                Finding("error", "wal_level", f"is {wal_level!r}: logical capture needs 'logical'")
            )
        if not replication:
            findings.append(
                Finding(
                    "error", "role", f"{role} has no REPLICATION attribute: ALTER ROLE {role} REPLICATION"
                )
            )
        for need in await pg_grants.missing(conn, pg_grants.table_needs(tables)):
            findings.append(pg_grants.privilege_finding(role, need))
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
        kept = {"retained_wal_bytes": found.slot.retained} if found.slot is not None else {}
        return Finding("error", table, _untracked(table, found), kept)
    if found.slot.lost:
        return Finding("error", table, "its replication slot was invalidated: the table is snapshotted again")
    held = found.slot.retained
    return Finding(
        "ok", table, f"its replication slot holds {held / 2**20:.1f} MiB of WAL", {"retained_wal_bytes": held}
    )
