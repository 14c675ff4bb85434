"""The PostgreSQL change source (psycopg 3, asyncio).

Changes come from the tracking that ``cdc tracking enable`` installs
(``cdc.sources.pg_tracking``): per table a net-change table kept by triggers,
whose versions are the writing transactions' ids. A read runs in one
REPEATABLE READ, READ ONLY transaction, whose snapshot bounds it:

    bound = pg_snapshot_xmin(snapshot) - 1

Every transaction below ``xmin`` has ended, so every entry with a version at
or below the bound is final and visible, and no transaction can still commit
one there: the bound is the consistent ``next_version`` of DESIGN.md §2. A
long-running transaction holds ``xmin`` back, which delays changes but never
loses one. The net entries are joined to the source table in the same
snapshot, so the values are those of the entry's version.

Connections, each with its own job:

- the reader, shared by all reads (an ``asyncio.Lock`` keeps one transaction
  at a time on it), reconnected when it breaks; its session also keeps the
  rest of a paged read (``cdc.sources.pg_reads.HeldRead``);
- one per snapshot, holding the snapshot's transaction open across pages;
- one short-lived per administrative call (enable, disable, cleanup);
- one LISTEN connection for wake-ups (``cdc.sources.pg_listen``), unless
  the source's ``notify`` is false.

A read that cannot find anything is not sent. After an empty read whose
snapshot had ``xmin = xmax`` (``xmax`` is one past the newest completed
transaction, so every transaction that had committed is at or below the
bound ``xmin - 1``), any later change to the table is made by a transaction
that commits after that snapshot, and its notify trigger's notification
arrives after the read began. So while the LISTEN connection has been up
throughout and no notification for the table has arrived, the next read from
that bound would find nothing: ``read_changes`` answers it without a round
trip, and ``quiet_for`` tells the tracker that it may wait for the
notification instead of polling on its backoff. Only for ordinary tables (a
write straight into a partition does not fire its partitioned parent's
statement triggers), and never for longer than ``QUIET_READ_LIMIT`` after
the last read sent: a backstop should a table's notify trigger be disabled.
This is what lets fifty idle tables cost next to nothing in their first
minutes of quiet, while their backoff still polls every 50 ms to 1 s.

Driver errors are mapped here: connection failures and timeouts to
``SourceUnavailable`` (retried), a failing ``connect()`` to ``ConnectError``,
other refusals to ``SourceError``. Messages never contain the DSN's password.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdc.config import SourceConfig, TableConfig
from cdc.errors import (
    ConnectError,
    SchemaError,
    SourceError,
    SourceUnavailable,
    TrackingExpired,
    TrackingNotEnabled,
)
from cdc.sources import pg_catalog, pg_reads, pg_tracking
from cdc.sources.base import (
    ChangePage,
    Column,
    Cursor,
    Finding,
    SnapshotPage,
    TableInfo,
    TrackingStatus,
)
from cdc.sources.pg_catalog import CatalogTable, Connection
from cdc.sources.pg_listen import NotificationListener
from cdc.sources.pg_reads import HeldRead
from cdc.sources.pg_types import check_supported, prepare_session

MIN_SERVER_VERSION = 130000  # pg_current_xact_id() and pg_current_snapshot()
# A read tries one statement first (``_whole_read``) and takes this many rows
# at most that way; a larger read pays for them twice, so they are few.
WHOLE_READ_ROWS = 500
# Seconds after the last read sent during which a read that cannot find
# anything may be answered without a round trip (see the module docstring).
QUIET_READ_LIMIT = 30.0


@dataclass(frozen=True)
class _Quiet:
    """An empty read that saw every committed transaction, and the listener's
    mark when it started: reads from ``bound`` find nothing while the listener
    stays quiet about the table."""

    bound: int
    mark: tuple[int, int]
    at: float  # time.monotonic() of the read


def redact_dsn(dsn: str) -> str:
    """The DSN without its password, for messages."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "<unparseable DSN>"
    params.pop("password", None)
    return make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


_PASSWORDS = re.compile(r"(://[^:/@\s]*:)[^@]*@|(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def _scrub(message: object, dsn: str) -> str:
    """A driver message with the DSN's password (should it appear) blanked out:
    the password itself where the DSN parses, any password-looking part else."""
    text = str(message).strip()
    try:
        password = conninfo_to_dict(dsn).get("password")
    except psycopg.Error:
        return _PASSWORDS.sub(lambda m: f"{m[1]}***@" if m[1] else f"{m[2]}***", text)
    return text.replace(str(password), "***") if password else text


class PostgresSource:
    """``ChangeSource`` for PostgreSQL; see the module docstring."""

    kind = "postgres"

    def __init__(self, config: SourceConfig) -> None:
        self._config = config
        self._schema = config.tracking_schema
        self._reader: Connection | None = None
        self._lock = asyncio.Lock()
        self._held: dict[str, HeldRead] = {}  # table -> the rest of a paged read
        self._paged: set[str] = set()  # tables whose last read took more than one page
        self._whole_reads: dict[TableInfo, bytes] = {}  # whole_read_query, composed once per table
        self._listener = NotificationListener(self._open, channel=config.tracking_schema)
        self._notifying: dict[str, str] = {}  # ordinary tables: name -> their notifications' payload
        self._quiet: dict[str, _Quiet] = {}  # table -> its last read, when it allows skipping the next
        self.reads_skipped = 0  # reads answered without a round trip (see the module docstring)

    # -- connections -------------------------------------------------------

    async def connect(self) -> None:
        """Open the reader; failing here is ``ConnectError`` (exit code 3)."""
        if self._reader is not None and not self._reader.closed:
            return
        try:
            self._reader = await self._open(reader=True)
        except (psycopg.Error, OSError) as exc:
            where = redact_dsn(self._config.dsn)
            raise ConnectError(
                f"cannot connect to PostgreSQL ({where}): {_scrub(exc, self._config.dsn)}"
            ) from None
        version = self._reader.info.server_version
        if version < MIN_SERVER_VERSION:
            await self.close()
            raise ConnectError(
                f"PostgreSQL {version // 10000} is not supported: version 13 or later is needed"
            )

    async def close(self) -> None:
        await self._listener.close()
        self._quiet.clear()
        self._held.clear()  # held cursors live in the reader's session
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.close()

    async def _open(self, reader: bool = False) -> Connection:
        """A new autocommit connection with the session settings; a reader's
        transactions are REPEATABLE READ, READ ONLY."""
        conn = await psycopg.AsyncConnection.connect(
            self._config.dsn,
            autocommit=True,
            connect_timeout=max(1, round(self._config.connect_timeout)),
            fallback_application_name="cdc-sync",
        )
        try:
            await prepare_session(conn, self._config.query_timeout)
            if reader:
                await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
                await conn.set_read_only(True)
        except BaseException:
            await conn.close()
            raise
        return conn

    @asynccontextmanager
    async def _guard(self, what: str) -> AsyncIterator[None]:
        """Map driver errors onto cdc.errors, dropping a reader that broke."""
        try:
            yield
        except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as exc:
            if self._reader is not None and (self._reader.broken or self._reader.closed):
                self._reader = None
            raise SourceUnavailable(f"PostgreSQL: {what}: {_scrub(exc, self._config.dsn)}") from exc
        except psycopg.Error as exc:
            raise SourceError(f"PostgreSQL: {what}: {_scrub(exc, self._config.dsn)}") from exc

    @asynccontextmanager
    async def _reading(self, what: str, transaction: bool = True) -> AsyncIterator[Connection]:
        """The reader, alone, inside a REPEATABLE READ READ ONLY transaction."""
        async with self._lock, self._guard(what):
            if self._reader is None or self._reader.closed or self._reader.broken:
                self._reader = await self._open(reader=True)
            if not transaction:
                yield self._reader
                return
            async with self._reader.transaction():
                yield self._reader

    @asynccontextmanager
    async def _administering(self, what: str) -> AsyncIterator[Connection]:
        """A short-lived connection inside a read-write transaction."""
        async with self._guard(what):
            conn = await self._open()
            try:
                async with conn.transaction():
                    yield conn
            finally:
                await conn.close()

    # -- tables --------------------------------------------------------------

    async def describe(self, table: TableConfig) -> TableInfo:
        async with self._reading(f"describe {table.table}") as conn:
            found = await pg_catalog.find_table(conn, table.schema, table.name)
            if found is None:
                raise await self._missing_table(conn, table.schema, table.name)
        info = _table_info(table, found)
        self._quiet.pop(table.table, None)
        if found.partitioned:
            self._notifying.pop(table.table, None)
        else:
            self._notifying[table.table] = found.qualified  # what the notify trigger sends
        return info

    async def _missing_table(self, conn: Connection, schema: str, name: str) -> SchemaError:
        similar = await pg_catalog.similar_tables(conn, schema, name)
        hint = f" (names are case-sensitive: did you mean {similar[0]}?)" if similar else ""
        return SchemaError(f"{schema}.{name}: no such table{hint}")

    async def current_version(self) -> int:
        async with self._reading("read the current version", transaction=False) as conn:
            row = await (
                await conn.execute("select pg_snapshot_xmin(pg_current_snapshot())::text::bigint - 1")
            ).fetchone()
        assert row is not None
        return int(row[0])

    # -- changes -------------------------------------------------------------

    async def read_changes(
        self,
        table: TableInfo,
        since: int,
        *,
        limit: int,
        upto: int | None = None,
        after: Cursor | None = None,
    ) -> ChangePage:
        """Net changes after ``since``, at most ``limit`` rows, in (version, key) order.

        The pages of one read come from one snapshot (``pg_reads.HeldRead``).
        Should the held rest be gone (the reader reconnected), the read goes on
        from ``(upto, after)`` in a new transaction: still complete, since no
        entry can enter ``(since, upto]`` any more, but a row changed again
        after ``upto`` in between then arrives with the next read, relative to
        ``upto``. Cleanup and TRUNCATE are caught by every transaction's check."""
        quiet = self._quiet.get(table.table)
        if upto is None and after is None and quiet is not None and self._still_quiet(table, since, quiet):
            self.reads_skipped += 1
            return ChangePage([], quiet.bound)
        self._quiet.pop(table.table, None)  # a read is sent: only its outcome may allow skipping again
        payload = self._notifying.get(table.table)
        mark = None if payload is None else self._listener.mark()
        started = time.monotonic()
        held = self._held.pop(table.table, None)
        async with self._reading(f"read changes of {table.table}", transaction=False) as conn:
            if held is not None and held.continues(conn, since, upto, after):
                page = await held.next_page(table, limit)
            else:
                if held is not None:
                    await held.close()  # the caller gave up that read
                whole = None
                if upto is None and after is None and table.table not in self._paged:
                    whole = await self._whole_read(conn, table, since, limit)
                if whole is not None:
                    (page, complete), held = whole, None
                    if complete and mark is not None and not page.rows:
                        self._quiet[table.table] = _Quiet(page.next_version, mark, started)
                else:
                    page, held = await self._first_page(conn, table, since, limit, upto, after)
                    (self._paged.add if page.more else self._paged.discard)(table.table)
            if held is not None and page.more:
                self._held[table.table] = held
            elif held is not None:
                await held.close()  # the read is complete
        return page

    def quiet_for(self, table: TableInfo, since: int) -> float:
        """How long a read from ``since`` is known to find nothing unless the
        table's notification arrives (the rest of ``QUIET_READ_LIMIT``), or 0."""
        quiet = self._quiet.get(table.table)
        if quiet is None or not self._still_quiet(table, since, quiet):
            return 0.0
        return max(0.0, quiet.at + QUIET_READ_LIMIT - time.monotonic())

    def _still_quiet(self, table: TableInfo, since: int, quiet: _Quiet) -> bool:
        """Whether a read from ``since`` would find nothing, known without sending it."""
        payload = self._notifying.get(table.table)
        return (
            since == quiet.bound
            and payload is not None
            and time.monotonic() - quiet.at < QUIET_READ_LIMIT
            and self._listener.quiet_since(quiet.mark, payload)
        )

    async def _whole_read(
        self, conn: Connection, table: TableInfo, since: int, limit: int
    ) -> tuple[ChangePage, bool] | None:
        """A read that fits one page, in one statement (``pg_reads.whole_read_query``),
        and whether its bound covers every transaction that had committed
        (``xmin = xmax``); None when it does not fit (or anything
        is unusual): the caller then reads in a transaction, which pages, and
        which raises the precise errors."""
        qualified = f"{table.schema}.{table.name}"
        net = pg_tracking.net_table_name(table.schema, table.name)
        query = self._whole_reads.get(table)
        if query is None:
            query = pg_reads.whole_read_query(self._schema, net, table).as_bytes(conn)
            self._whole_reads[table] = query
        probe = min(limit, WHOLE_READ_ROWS)
        try:
            records = await (await conn.execute(query, [qualified, since, probe + 1])).fetchall()
        except psycopg.errors.UndefinedTable:
            return None  # tracking is not installed, or the net table is gone
        bound, xmax, registered, min_valid = records[0][:4]
        self._check_window(table, since, xmax, registered, min_valid)
        if registered != net or len(records) > probe:
            return None
        rows = [record[4:] for record in records if record[4] is not None]
        page = pg_reads.change_page(table, since, max(since, int(bound)), rows, limit)
        return page, int(bound) + 1 >= int(xmax)

    async def _first_page(
        self,
        conn: Connection,
        table: TableInfo,
        since: int,
        limit: int,
        upto: int | None,
        after: Cursor | None,
    ) -> tuple[ChangePage, HeldRead | None]:
        """One transaction: check ``since``, fix the bound, read a page and hold the rest."""
        async with conn.transaction():
            bound, net = await self._window(conn, table, since)
            bound = max(since, bound if upto is None else min(upto, bound))
            query = pg_reads.changes_query(self._schema, net, table, after=after is not None, limit=True)
            cursor = [] if after is None else [after[0], *after[1]]
            result = await conn.execute(query, [since, bound, *cursor, limit + 1])
            page, _ = await pg_reads.load_page(result, table, since, bound, limit, [])
            if page.cursor is None:
                return page, None
            rest = pg_reads.changes_query(self._schema, net, table, after=True, limit=False)
            params = [since, bound, page.cursor[0], *page.cursor[1]]
            held = await HeldRead.declare(conn, rest, params, since, bound)
            held.after = page.cursor
            return page, held

    async def _window(self, conn: Connection, table: TableInfo, since: int) -> tuple[int, str]:
        """This snapshot's bound and the table's net table; raises when ``since`` is not valid."""
        qualified = f"{table.schema}.{table.name}"
        try:
            row = await (await conn.execute(pg_reads.window_query(self._schema), [qualified])).fetchone()
        except psycopg.errors.UndefinedTable:
            raise TrackingNotEnabled(
                f"{table.table}: change tracking is not installed (cdc tracking enable)"
            ) from None
        assert row is not None
        bound, xmax, net, min_valid = row
        self._check_window(table, since, xmax, net, min_valid)
        return int(bound), str(net)

    @staticmethod
    def _check_window(
        table: TableInfo, since: int, xmax: int, net: str | None, min_valid: int | None
    ) -> None:
        if net is None or min_valid is None:
            raise TrackingNotEnabled(f"{table.table}: change tracking is not enabled (cdc tracking enable)")
        if since >= xmax:
            reason = f"the source's next transaction id {xmax} is not above the checkpoint {since}: restored?"
            raise TrackingExpired(table.table, reason)
        if since < min_valid:
            reason = (
                f"the checkpoint {since} is below the minimum valid version {min_valid}: "
                "entries were removed by retention cleanup or a TRUNCATE, or tracking was re-enabled"
            )
            raise TrackingExpired(table.table, reason)

    # -- snapshots -----------------------------------------------------------

    async def snapshot(self, table: TableInfo, *, page_size: int) -> AsyncIterator[SnapshotPage]:
        """The whole table in one REPEATABLE READ transaction, keyset-paged on
        the primary key; the first page is yielded even when the table is empty,
        so that the caller always learns the version."""
        async with self._guard(f"snapshot {table.table}"):
            conn = await self._open(reader=True)
        try:
            async with self._guard(f"snapshot {table.table}"), conn.transaction():
                version = await self._snapshot_version(conn, table)
                total = await _estimated_rows(conn, table)
                last: tuple[Any, ...] | None = None
                while True:
                    query = pg_reads.snapshot_query(table, after=last is not None)
                    records = await pg_reads.fetch_all(await conn.execute(query, [*(last or ()), page_size]))
                    if records or last is None:
                        rows = [dict(zip(table.column_names, r, strict=True)) for r in records]
                        yield SnapshotPage(version, rows, total)
                    if len(records) < page_size:
                        return
                    last = tuple(records[-1][: len(table.primary_key)])
        finally:
            await conn.close()

    async def _snapshot_version(self, conn: Connection, table: TableInfo) -> int:
        """The version the snapshot is consistent with (its first statement fixes
        the snapshot). Below the table's minimum valid version (tracking was just
        enabled, or the table truncated, while an older transaction still runs)
        no read could follow it: that is a wait, not a reason to snapshot again."""
        version = await _bound(conn)
        entry = await pg_tracking.registry_entry(conn, self._schema, f"{table.schema}.{table.name}")
        if entry is not None and version < entry.min_valid_version:
            raise SourceUnavailable(
                f"{table.table}: a snapshot now would be at version {version}, below the minimum valid "
                f"version {entry.min_valid_version}: waiting for older transactions to end"
            )
        return version

    # -- notifications and upkeep --------------------------------------------

    async def wait_for_changes(self, timeout: float) -> set[str]:
        """Tables notified within ``timeout``; with ``notify: false`` nothing is
        listened to: sleep, report nothing, and the trackers poll on their backoff."""
        if not self._config.notify:
            if timeout > 0:
                await asyncio.sleep(timeout)
            return set()
        return await self._listener.wait(timeout)

    async def cleanup(self, retention: float) -> int:
        """Delete tracking entries older than ``retention`` seconds that every reader
        could have read; checkpoints before them expire."""
        query = sql.SQL("select {}(make_interval(secs => %s))").format(
            sql.Identifier(self._schema, "cleanup")
        )
        async with self._administering("cleanup") as conn:
            if not await pg_tracking.installed(conn, self._schema):
                raise TrackingNotEnabled(f"change tracking is not installed (no schema {self._schema})")
            row = await (await conn.execute(query, [retention])).fetchone()
        return int(row[0]) if row else 0

    # -- tracking administration ---------------------------------------------

    async def tracking_enable(self, tables: Sequence[TableConfig]) -> list[str]:
        async with self._administering("enable change tracking") as conn:
            await pg_tracking.lock_schema(conn, self._schema)
            await pg_tracking.install_schema(conn, self._schema)
            done = []
            for table in tables:
                found = await pg_catalog.find_table(conn, table.schema, table.name)
                if found is None:
                    raise await self._missing_table(conn, table.schema, table.name)
                done.append(await pg_tracking.enable_table(conn, self._schema, found))
        return done

    async def tracking_disable(self, tables: Sequence[TableConfig]) -> list[str]:
        async with self._administering("disable change tracking") as conn:
            await pg_tracking.lock_schema(conn, self._schema)
            done = [await pg_tracking.disable_table(conn, self._schema, t.schema, t.name) for t in tables]
            if await pg_tracking.drop_schema_if_unused(conn, self._schema):
                done.append(f"schema {self._schema}: dropped (no table is tracked any more)")
        return done

    async def tracking_status(self, tables: Sequence[TableConfig]) -> list[TrackingStatus]:
        async with self._reading("read tracking status") as conn:
            version = await _bound(conn)
            return [await self._status(conn, table, version) for table in tables]

    async def _status(self, conn: Connection, table: TableConfig, version: int) -> TrackingStatus:
        found = await pg_catalog.find_table(conn, table.schema, table.name)
        if found is None:
            return TrackingStatus(table.table, False, detail="no such table")
        entry = await pg_tracking.registry_entry(conn, self._schema, found.qualified)
        if entry is None:
            detail = "change tracking is not enabled (run cdc tracking enable)"
            return TrackingStatus(table.table, False, current_version=version, detail=detail)
        triggers = await pg_tracking.trigger_states(conn, self._schema, found.oid)
        broken = [
            f"trigger {n} is {'missing' if not s else 'disabled'}" for n, s in triggers.items() if s != "A"
        ]
        detail = "; ".join(broken) or f"change tracking enabled (net table {self._schema}.{entry.net_table})"
        return TrackingStatus(table.table, not broken, entry.min_valid_version, version, detail)

    async def doctor(self, tables: Sequence[TableConfig]) -> list[Finding]:
        """What the source can see: tracking installed, triggers in place, privileges,
        and transactions old enough to hold every table's changes back."""
        async with self._reading("doctor") as conn:
            findings = await _transaction_findings(conn) + await _durability_findings(conn)
            version = await _bound(conn)
            for table in tables:
                findings += await self._table_findings(conn, table, version)
        return findings

    async def _table_findings(self, conn: Connection, table: TableConfig, version: int) -> list[Finding]:
        status = await self._status(conn, table, version)
        extra = {"min_valid_version": status.min_valid_version}
        findings = [Finding("ok" if status.enabled else "error", table.table, status.detail, extra)]
        net = pg_tracking.net_table_name(table.schema, table.name)
        for schema, name, what in (
            (table.schema, table.name, "the table"),
            (self._schema, net, "its tracking"),
        ):
            row = await (await conn.execute(_CAN_SELECT, [schema, name])).fetchone()
            if row is not None and row[0] is False:
                findings.append(Finding("error", table.table, f"the source user cannot SELECT from {what}"))
        return findings


# -- describe ----------------------------------------------------------------


def _table_info(config: TableConfig, table: CatalogTable) -> TableInfo:
    """The published columns, primary key first, each checked for a JSON mapping."""
    if not table.primary_key:
        raise SchemaError(f"{config.table}: the table has no primary key; cdc-sync needs one")
    wanted = list(config.columns) if config.columns is not None else [c.name for c in table.columns]
    names = [*table.primary_key, *(c for c in wanted if c not in table.primary_key)]
    columns = []
    for name in names:
        column = table.column(name)
        if column is None:
            known = ", ".join(c.name for c in table.columns)
            raise SchemaError(f"{config.table}: no column {name!r} (the table has: {known})")
        check_supported(config.table, column)
        columns.append(Column(name, column.type_name, not column.not_null))
    return TableInfo(config.table, table.schema, table.name, table.primary_key, tuple(columns))


async def _bound(conn: Connection) -> int:
    row = await (
        await conn.execute("select pg_snapshot_xmin(pg_current_snapshot())::text::bigint - 1")
    ).fetchone()
    assert row is not None
    return int(row[0])


async def _estimated_rows(conn: Connection, table: TableInfo) -> int | None:
    """For progress: the planner's estimate, or a count when there is none yet."""
    row = await (
        await conn.execute(
            "select c.reltuples::bigint from pg_class c join pg_namespace n on n.oid = c.relnamespace"
            " where n.nspname = %s and c.relname = %s",
            [table.schema, table.name],
        )
    ).fetchone()
    if row is not None and row[0] >= 0:
        return int(row[0])
    count = sql.SQL("select count(*) from {}").format(sql.Identifier(table.schema, table.name))
    counted = await (await conn.execute(count)).fetchone()
    return int(counted[0]) if counted else None


# -- doctor ------------------------------------------------------------------

# NULL when the relation does not exist (the status finding says so).
_CAN_SELECT = "select has_table_privilege(to_regclass(format('%%I.%%I', %s::text, %s::text)), 'SELECT')"

_OLD_TRANSACTIONS = """
    select (select extract(epoch from max(now() - xact_start)) from pg_stat_activity
             where backend_xid is not null),
           (select count(*) from pg_prepared_xacts)
"""


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
