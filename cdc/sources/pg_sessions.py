"""The PostgreSQL source's connections, and the errors that leave them.

- the reader, shared by all reads: a ``ReaderLock`` keeps one transaction
  at a time on it; it is opened again when it broke, and dropped on purpose
  when its prepared statements may no longer fit a table (``drop_reader``);
  its session also keeps the rest of paged reads (``held``);
- a connection per snapshot, and a short-lived one per administrative call.

Every driver error leaves through ``guard`` as a ``cdc.errors`` error
(``pg_errors.map_error``); given the table being read, the errors of a table
that changed under the read are ``SchemaError``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg

from cdc.config import SourceConfig
from cdc.errors import ConnectError
from cdc.sources.pg_catalog import Connection
from cdc.sources.pg_errors import LINK_ERRORS, connect_error, is_stale_plan, map_error
from cdc.sources.pg_reads import HeldRead
from cdc.sources.pg_types import prepare_session
from cdc.sources.reader_lock import ReaderLock

MIN_SERVER_VERSION = 130000  # pg_current_xact_id() and pg_current_snapshot()


class Sessions:
    """The reader, and the connections opened per snapshot and per administrative call."""

    def __init__(self, config: SourceConfig) -> None:
        self.config = config
        self.reader: Connection | None = None
        self.lock = ReaderLock()
        self.held: dict[str, HeldRead] = {}  # table -> the rest of a paged read, on the reader

    async def connect(self) -> None:
        """Open the reader; failing here is ``ConnectError`` (exit code 3)."""
        if self.reader is not None and not self.reader.closed:
            return
        try:
            self.reader = await self.open(reader=True)
        except (psycopg.Error, OSError) as exc:
            raise connect_error(exc, self.config.dsn) from None
        version = self.reader.info.server_version
        if version < MIN_SERVER_VERSION:
            await self.drop_reader()
            raise ConnectError(
                f"PostgreSQL {version // 10000} is not supported: version 13 or later is needed"
            )

    async def open(self, reader: bool = False) -> Connection:
        """A new autocommit connection with the session settings; a reader's
        transactions are REPEATABLE READ, READ ONLY."""
        conn = await psycopg.AsyncConnection.connect(
            self.config.dsn,
            autocommit=True,
            connect_timeout=max(1, round(self.config.connect_timeout)),
            fallback_application_name="cdc-sync",
        )
        try:
            await prepare_session(conn, self.config.query_timeout)
            if reader:
                await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
                await conn.set_read_only(True)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def drop_reader(self) -> None:
        """Close the reader (a new one opens for the next read), with its prepared
        statements and held cursors. Call it holding ``lock``, or at the end."""
        self.held.clear()  # held cursors live in the reader's session
        reader, self.reader = self.reader, None
        if reader is not None:
            await reader.close()

    @asynccontextmanager
    async def guard(self, what: str, table: str | None = None) -> AsyncIterator[None]:
        """Map driver errors onto cdc.errors (those of a ``table`` that changed under
        the read: SchemaError), dropping a reader that broke or holds a stale plan."""
        try:
            yield
        except (psycopg.Error, OSError) as exc:
            reader = self.reader
            if isinstance(exc, LINK_ERRORS) and reader is not None and (reader.broken or reader.closed):
                self.reader = None
            if is_stale_plan(exc):
                await self.drop_reader()
            raise map_error(exc, self.config.dsn, what, table) from exc

    @asynccontextmanager
    async def reading(
        self, what: str, transaction: bool = True, table: str | None = None, *, continuing: bool = False
    ) -> AsyncIterator[Connection]:
        """The reader, alone, inside a REPEATABLE READ READ ONLY transaction
        (or none: each statement its own). ``continuing``: the next page of a
        read under way, which goes before new reads (``ReaderLock``)."""
        async with self.lock.continuing() if continuing else self.lock, self.guard(what, table):
            if self.reader is None or self.reader.closed or self.reader.broken:
                self.reader = await self.open(reader=True)
            if not transaction:
                yield self.reader
                return
            async with self.reader.transaction():
                yield self.reader

    @asynccontextmanager
    async def administering(self, what: str) -> AsyncIterator[Connection]:
        """A short-lived connection inside a read-write transaction."""
        async with self.guard(what):
            conn = await self.open()
            try:
                async with conn.transaction():
                    yield conn
            finally:
                await conn.close()
