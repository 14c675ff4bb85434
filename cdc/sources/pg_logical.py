"""Logical decoding (``source.capture: logical``): what it needs on the server.

Per tracked table and deployment, a publication of that table alone and a
logical replication slot with the built-in ``pgoutput`` plugin, both named
``slot_name`` (a deployment is the config's namespace and Redis server:
``cdc.cleanup_job.deployment_name``; several may share one database, each
with its own slots, so that none advances a slot past another's
checkpoint). One slot per table, not per deployment: each table's slot moves
with that table's checkpoint alone, as the trigger mode's per-table
checkpoints do, with no reader shared between trackers. The price: every
slot decodes the whole database's WAL, and ``max_replication_slots``
(default 10) bounds the tables a server can follow (docs/POSTGRES.md §6).

A slot keeps every WAL segment from its ``restart_lsn`` on: an abandoned one
(the sidecar gone for good, its tracking not disabled) fills the disk.
``cdc tracking disable`` drops it; ``max_slot_wal_keep_size`` caps what a
slot may hold (the server then invalidates it, and the table is snapshotted
again).

Versions are LSNs as integers: a change's version is where its
transaction's commit record starts (``Transaction.commit_lsn``).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from cdc.errors import SourceError, TableChanged, TrackingExpired, TrackingNotEnabled
from cdc.sources.pg_catalog import CatalogTable, Connection, find_table


def slot_name(deployment: str, database: str, table: str) -> str:
    """``cdc_<table>_<hash>``: at most 63 characters of [a-z0-9_] (a slot's
    rule), unique per deployment, database (slots are the cluster's) and table."""
    digest = hashlib.sha256(f"{deployment}\0{database}\0{table}".encode()).hexdigest()[:16]
    readable = re.sub(r"[^a-z0-9_]", "_", table.lower())[:40]
    return f"cdc_{readable}_{digest}"


# -- prerequisites -----------------------------------------------------------------


_PREREQUISITES = """
select current_setting('wal_level'), r.rolreplication or r.rolsuper, current_user,
       has_database_privilege(current_database(), 'CREATE'),
       current_setting('max_replication_slots')::int,
       (select count(*) from pg_replication_slots)::int
  from pg_roles r where r.rolname = current_user
"""


async def prerequisite_problems(conn: Connection, new_slots: int) -> list[str]:
    """Every prerequisite the server or role misses, each with its fix."""
    row = await (await conn.execute(_PREREQUISITES)).fetchone()
    assert row is not None
    wal_level, replication, role, create, max_slots, slots = row
    missing = []
    if wal_level != "logical":
        missing.append(
            f"wal_level is {wal_level!r}, logical decoding needs 'logical': ALTER SYSTEM SET wal_level = "
            "logical, then restart PostgreSQL (managed services: their logical replication setting)"
        )
    if not replication:
        missing.append(
            f"role {role} has no REPLICATION attribute (slots need it): ALTER ROLE {role} REPLICATION"
        )
    if not create:
        missing.append(
            f"role {role} cannot create publications in this database: GRANT CREATE ON DATABASE "
            f"{conn.info.dbname} TO {role}"
        )
    if slots + new_slots > max_slots:
        missing.append(
            f"max_replication_slots is {max_slots} and {slots} slots exist: {new_slots} more are needed "
            "(one per table): raise it, then restart PostgreSQL"
        )
    return missing


async def check_replica_identity(conn: Connection, table: str, found: CatalogTable) -> None:
    """Raise ``replica_identity_problem`` as a ``SourceError``."""
    problem = await replica_identity_problem(conn, table, found)
    if problem is not None:
        raise SourceError(problem)


async def replica_identity_problem(conn: Connection, table: str, found: CatalogTable) -> str | None:
    """The primary key (REPLICA IDENTITY DEFAULT) or the whole row (FULL) in
    the WAL of an UPDATE or DELETE: with NOTHING, a published table refuses
    them; with USING INDEX, the old key would be another index's columns."""
    row = await (
        await conn.execute("select relreplident from pg_class where oid = %s", [found.oid])
    ).fetchone()
    if row is None or row[0] in ("d", "f"):
        return None
    return (
        f"{table}: its REPLICA IDENTITY is {'NOTHING' if row[0] == 'n' else 'USING INDEX'}; logical "
        f"capture needs the primary key in the WAL: ALTER TABLE {found.qualified} REPLICA IDENTITY DEFAULT"
    )


async def check_logged_identity(
    conn: Connection, table: str, schema: str, name: str, logged: set[str]
) -> None:
    """``logged``: the replica identities under which a read's updates or
    deletes were logged with a key that is not the primary key
    (``pg_pgoutput.foreign_keys``): set after tracking was enabled (which
    refuses them), so a delete logged another index's columns as its key, and
    a key update may have logged no old key at all: those changes cannot be
    mapped to documents. The table fails with the fix while its identity is
    still wrong, and is snapshotted again (``TrackingExpired``) once it is right."""
    if not logged:
        return
    found = await find_table(conn, schema, name)
    if found is None:
        raise TableChanged(f"{table}: the table is gone: describing it again")
    problem = await replica_identity_problem(conn, table, found)
    if problem is not None:
        raise SourceError(
            f"{problem}. It was changed after tracking was enabled: its deletes and key updates since cannot"
            " be mapped to documents, and the table is snapshotted again once its identity is DEFAULT or FULL"
        )
    then = "NOTHING" if "n" in logged else "USING INDEX"
    raise TrackingExpired(
        table, f"changes in its WAL were logged under REPLICA IDENTITY {then}, not its primary key"
    )


# -- enable and disable --------------------------------------------------------------


async def ensure_publication(conn: Connection, name: str, table: CatalogTable) -> str:
    """The table's publication (its changes as the partitioned root's, for a
    partitioned table); what was done: ``created``, ``in place``, or the table
    added to it. A table dropped and created again under its name leaves the
    publication (which holds tables, not names): its changes would no longer
    be decoded, so it is added again (changes before that are not published:
    the new table is snapshotted)."""
    found = await (
        await conn.execute(
            "select p.pubviaroot, exists (select from pg_publication_rel r"
            " where r.prpubid = p.oid and r.prrelid = %s) from pg_publication p where p.pubname = %s",
            [table.oid, name],
        )
    ).fetchone()
    if found is None:
        options = sql.SQL(" with (publish_via_partition_root = true)") if table.partitioned else sql.SQL("")
        await conn.execute(
            sql.SQL("create publication {} for table {}{}").format(
                sql.Identifier(name), sql.Identifier(table.schema, table.name), options
            )
        )
        return "created"
    via_root, holds = found
    done = []
    if bool(via_root) != table.partitioned:  # the table was made again, partitioned or not
        await conn.execute(
            sql.SQL("alter publication {} set (publish_via_partition_root = {})").format(
                sql.Identifier(name), sql.Literal(table.partitioned)
            )
        )
        done.append(f"publish_via_partition_root set to {str(table.partitioned).lower()}")
    if not holds:
        await conn.execute(
            sql.SQL("alter publication {} add table {}").format(
                sql.Identifier(name), sql.Identifier(table.schema, table.name)
            )
        )
        done.append("the table added to it (it was not in it: dropped and created again?)")
    return "in place" if not done else "in place, " + " and ".join(done)


async def ensure_slot(conn: Connection, name: str) -> bool:
    """The slot (autocommit: a slot is not created inside a transaction that
    wrote); whether it was created. Creating one waits for the transactions
    running then to end (its consistent point)."""
    state = await slot_state(conn, name)
    if state is not None and not state.lost:
        return False
    if state is not None:
        await drop_slot(conn, name)
    try:
        await conn.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", [name])
    except psycopg.errors.DuplicateObject:
        return False  # another sidecar made it meanwhile
    return True


async def drop_slot(conn: Connection, name: str, attempts: int = 50) -> bool:
    """Drop the slot if it exists; a slot in use by a read (a peek lasts
    milliseconds) is tried again for a while. Whether one was dropped."""
    for _ in range(attempts):
        try:
            row = await (
                await conn.execute(
                    "select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = %s",
                    [name],
                )
            ).fetchone()
            return row is not None
        except psycopg.errors.ObjectInUse:
            await asyncio.sleep(0.1)
    raise SourceError(f"replication slot {name} stays in use: stop the sidecar that reads it, then retry")


async def drop_publication(conn: Connection, name: str) -> bool:
    found = await (await conn.execute("select 1 from pg_publication where pubname = %s", [name])).fetchone()
    if found is None:
        return False
    await conn.execute(sql.SQL("drop publication {}").format(sql.Identifier(name)))
    return True


@dataclass(frozen=True)
class OtherSlot:
    """A cdc replication slot of this database that no table of a config uses."""

    name: str
    retained: int  # bytes of WAL it holds
    active: bool  # a session reads it now
    tables: str  # what its publication holds ("" when it has none)


_OTHER_SLOTS = r"""
select s.slot_name, coalesce(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), s.restart_lsn), 0)::bigint, s.active,
       coalesce((select string_agg(quote_ident(t.schemaname) || '.' || quote_ident(t.tablename), ', ')
                   from pg_publication_tables t where t.pubname = s.slot_name), '')
  from pg_replication_slots s
 where s.database = current_database() and s.plugin = 'pgoutput' and s.slot_name like 'cdc\_%%'
   and not s.slot_name = any(%s::text[])
 order by 2 desc, 1
"""


async def other_slots(conn: Connection, ours: Sequence[str]) -> list[OtherSlot]:
    """The cdc slots (``slot_name``'s shape, pgoutput) of this database but ``ours``."""
    rows = await (await conn.execute(_OTHER_SLOTS, [list(ours)])).fetchall()
    return [OtherSlot(str(n), int(r), bool(a), str(t)) for n, r, a, t in rows]


# -- a read's window ---------------------------------------------------------------


@dataclass(frozen=True)
class SlotState:
    confirmed: int  # confirmed_flush_lsn: decoding skips commits that start below it
    retained: int  # bytes of WAL the slot holds (from its restart_lsn to the insert position)
    lost: bool  # invalidated (max_slot_wal_keep_size), or its WAL removed


async def slot_state(conn: Connection, name: str) -> SlotState | None:
    row = await (
        await conn.execute(
            "select (confirmed_flush_lsn - '0/0')::bigint, pg_wal_lsn_diff(pg_current_wal_insert_lsn(),"
            " restart_lsn)::bigint, coalesce(wal_status = 'lost', false) or restart_lsn is null"
            " from pg_replication_slots where slot_name = %s",
            [name],
        )
    ).fetchone()
    return None if row is None else SlotState(int(row[0] or 0), int(row[1] or 0), bool(row[2]))


@dataclass(frozen=True)
class Window:
    """What a read checks before it decodes (``window``)."""

    flush: int  # pg_current_wal_flush_lsn(): every commit starting below it is decodable
    insert: int  # pg_current_wal_insert_lsn(): no commit ever starts below it later
    published: bool  # the publication exists and holds the table
    slot: SlotState | None
    table_exists: bool = True  # a table of that name is there (not dropped, not renamed)


_WINDOW = """
select (pg_current_wal_flush_lsn() - '0/0')::bigint, (pg_current_wal_insert_lsn() - '0/0')::bigint,
       exists (select from pg_publication_tables p where p.pubname = %(name)s
                and p.schemaname = %(schema)s and p.tablename = %(table)s),
       (s.confirmed_flush_lsn - '0/0')::bigint,
       pg_wal_lsn_diff(pg_current_wal_insert_lsn(), s.restart_lsn)::bigint,
       coalesce(s.wal_status = 'lost', false) or s.restart_lsn is null, s.slot_name is not null,
       exists (select from pg_class c join pg_namespace n on n.oid = c.relnamespace
                where n.nspname = %(schema)s and c.relname = %(table)s and c.relkind in ('r', 'p'))
  from (select 1) as one left join pg_replication_slots s on s.slot_name = %(name)s
"""


async def window(conn: Connection, name: str, schema: str, table: str) -> Window:
    row = await (await conn.execute(_WINDOW, {"name": name, "schema": schema, "table": table})).fetchone()
    assert row is not None
    flush, insert, published, confirmed, retained, lost, exists, table_exists = row
    slot = SlotState(int(confirmed or 0), int(retained or 0), bool(lost)) if exists else None
    return Window(int(flush), int(insert), bool(published), slot, bool(table_exists))


def check_window(table: str, since: int, found: Window) -> None:
    """Raise when the table's changes are not captured for this deployment,
    or a read from ``since`` could miss some."""
    if not found.published and not found.table_exists:
        raise TableChanged(f"{table}: the table is gone (dropped or renamed): describing it again")
    if not found.published:
        raise TrackingNotEnabled(
            f"{table}: change tracking (logical decoding) is not enabled: no publication holds the table "
            f"(cdc tracking enable --table {table})"
        )
    if found.slot is None:
        raise TrackingExpired(table, "its replication slot is gone (dropped by hand?): snapshotting again")
    if found.slot.lost:
        raise TrackingExpired(
            table,
            "its replication slot was invalidated (max_slot_wal_keep_size: the sidecar fell too far behind)",
        )
    if since >= found.insert:
        raise TrackingExpired(
            table, f"the source's WAL position {found.insert} is not above the checkpoint {since}: restored?"
        )
    # decoding skips commits starting below confirmed; the read needs every one above since
    if found.slot.confirmed > since + 1:
        raise TrackingExpired(
            table, f"its replication slot was advanced to {found.slot.confirmed}, past the checkpoint {since}"
        )


async def advance(conn: Connection, name: str, to: int) -> None:
    await conn.execute("select pg_replication_slot_advance(%s, %s::text::pg_lsn)", [name, lsn_text(to)])


def lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


async def peek(conn: Connection, name: str, upto_lsn: int, upto_changes: int | None) -> list[bytes]:
    """The slot's pgoutput messages of the transactions committing up to
    ``upto_lsn`` (whole transactions: a transaction's rows are written at
    its commit, and the count is checked between WAL records)."""
    cursor = await conn.execute(
        "select data from pg_logical_slot_peek_binary_changes(%s, %s::text::pg_lsn, %s,"
        " 'proto_version', '1', 'publication_names', %s)",
        [name, lsn_text(upto_lsn), upto_changes, name],
        binary=True,
    )
    return [bytes(row[0]) for row in await cursor.fetchall()]


# -- a view's version ---------------------------------------------------------------


@dataclass(frozen=True)
class ViewStart:
    """What a view's version rests on: ``position`` (P), the WAL insert
    position, then ``xid_bound`` (N), a transaction id assigned after it."""

    position: int
    xid_bound: int


@dataclass(frozen=True)
class Committing:
    """A transaction a view waits for (``still_committing``)."""

    xid: int
    pid: int | None  # its backend; None for a prepared transaction
    gid: str | None  # a prepared transaction's name

    def __str__(self) -> str:
        return (
            f"prepared transaction {self.gid!r} (xid {self.xid})"
            if self.gid
            else f"pid {self.pid} (xid {self.xid})"
        )


async def view_start(conn: Connection) -> ViewStart:
    """P, then N (autocommit: N's transaction ends before the view's snapshot
    is taken, so that snapshot's xmax is above N).

    N's transaction also makes P durable: it writes a transactional logical
    message (no table, no privilege; pgoutput passes messages only to a reader
    that asks for them, which ours does not) and commits with
    ``synchronous_commit = local``, so its commit waits for the WAL to be
    flushed up to its commit record, past P (a transaction that only takes an
    xid writes no WAL before its commit, and such a commit never waits). A P
    not flushed yet is no version: a crash that lost the WAL tail below it
    rewinds the WAL, commits after the restart reuse positions at or below
    ``v``, and the catch-up from ``v`` would skip them (a review reproduced it
    with the WAL writer paused and an immediate stop). ``local``: a flush of
    this server only, never a wait for a synchronous standby."""
    position = await (await conn.execute("select (pg_current_wal_insert_lsn() - '0/0')::bigint")).fetchone()
    async with conn.transaction():
        await conn.execute("set local synchronous_commit = local")
        await conn.execute("select pg_logical_emit_message(true, 'cdc-sync', 'view')")
        bound = await (await conn.execute("select pg_current_xact_id()::text::bigint")).fetchone()
    assert position is not None and bound is not None
    return ViewStart(int(position[0]), int(bound[0]))


# The transactions below N still running in this statement's snapshot (the
# view's, when it is its transaction's first), but for those idle inside a
# transaction block (their commit record is not written yet). backend_xid and
# pg_prepared_xacts.transaction are 32-bit xids, pg_snapshot_xip's 64-bit.
_STILL_COMMITTING = """
select x.xid::text::bigint, a.pid, p.gid
  from pg_snapshot_xip(pg_current_snapshot()) as x(xid)
  left join pg_stat_activity a on a.backend_xid::text = (x.xid::text::bigint %% 4294967296)::text
  left join pg_prepared_xacts p on p.transaction::text = (x.xid::text::bigint %% 4294967296)::text
 where x.xid::text::bigint < %s
   and a.state is distinct from 'idle in transaction' and a.state is distinct from 'idle in transaction (aborted)'
 order by 1
"""


async def still_committing(conn: Connection, start: ViewStart) -> list[Committing]:
    """Inside the view's transaction (this statement fixes its snapshot when it
    is the first): the transactions that may have written their commit record
    below P and are not visible in the snapshot. None: every commit that starts
    at or below the view's version ``v = P - 1`` is in the view.

    Why. A commit record below P was written before P was read, so its
    transaction had an xid then, below N (xids are assigned in order). N's
    transaction ended before the snapshot, so the snapshot's xmax is above N,
    and a transaction below N is either visible in it or in its running set
    (``pg_snapshot_xip``: top-level xids, which are the ones that commit). So
    once no transaction below N runs in the snapshot, but for sessions idle
    inside a transaction block (read after P: their commit comes later, above
    P), every commit below P is visible. A later commit starts at or above P,
    and the catch-up from ``v`` applies it (again, if the view had it already:
    with a higher version, harmless).

    The old check (0.5.0) waited only for the running set of a snapshot
    taken after P, whose xmax can be below a committing transaction's xid (no
    later xid had completed yet): such a transaction, held between its commit
    record and its end (a WAL flush, a synchronous standby), was neither waited
    for nor visible, and lost (tests/cdc/sources/test_logical_views.py).
    ``v`` is not the slot's confirmed position: that one may lie before a
    TRUNCATE the snapshot follows, which the catch-up would meet again."""
    rows = await (await conn.execute(_STILL_COMMITTING, [start.xid_bound])).fetchall()
    return [Committing(int(xid), pid, gid) for xid, pid, gid in rows]
