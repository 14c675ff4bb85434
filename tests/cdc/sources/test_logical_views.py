"""A logical-capture view (a snapshot's, and dead-letter replay's ``read_rows``)
loses no transaction that was committing when its version was read.

The case a review found: a transaction whose commit record is written but
which is not visible yet, held by a synchronous standby that never answers
(``synchronous_standby_names = 'nobody'``, the writer's ``synchronous_commit
= on``). Its commit lies below the view's version, so the catch-up from that
version skips it: the view must show it, hence wait for it. The test releases
the commit by cancelling the wait (``pg_cancel_backend``: the transaction is
committed, the client gets a warning).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from cdc.daemon import Daemon
from cdc.devservers import PostgresServer
from cdc.sources import pg_logical
from tests.contract.harness import PostgresLogicalHarness, read_all
from tests.e2e import actual_documents, assert_mirrored, create_tables, enable_tracking, make_config, wait_for

ITEMS = {"id": "int", "n": "int", "note": "text"}


@asynccontextmanager
async def standby_that_never_answers(dsn: str) -> AsyncIterator[None]:
    """``synchronous_standby_names = 'nobody'`` on the server (sessions at the test
    server's ``synchronous_commit = off`` do not wait for it), restored after."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await _reload(admin, "alter system set synchronous_standby_names = 'nobody'", "nobody")
        try:
            yield
        finally:
            await _reload(admin, "alter system reset synchronous_standby_names", "")


async def _reload(admin: psycopg.AsyncConnection[Any], statement: str, expected: str) -> None:
    await admin.execute(statement)
    await admin.execute("select pg_reload_conf()")

    async def seen() -> bool:  # the postmaster applies it asynchronously; a new session shows it
        async with await psycopg.AsyncConnection.connect(admin.info.dsn, autocommit=True) as conn:
            row = await (await conn.execute("show synchronous_standby_names")).fetchone()
        return row is not None and row[0] == expected

    await wait_for(seen, 10, f"synchronous_standby_names = {expected!r}")


@asynccontextmanager
async def held_commit(dsn: str, statement: str) -> AsyncIterator[tuple[int, Callable[[], Awaitable[None]]]]:
    """A transaction running ``statement`` whose COMMIT waits for the standby
    (its commit record written, the transaction not visible yet); yields its
    backend's pid and the release (cancelling the wait commits it)."""
    conn = await psycopg.AsyncConnection.connect(dsn)
    pid = conn.info.backend_pid

    async def commit() -> None:
        await conn.execute("set local synchronous_commit = on")
        await conn.execute(statement)
        await conn.commit()

    task = asyncio.create_task(commit())
    released = False

    async def release() -> None:
        nonlocal released
        released = True
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
            await admin.execute("select pg_cancel_backend(%s)", [pid])
        await asyncio.wait_for(task, 10)

    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watcher:

            async def waiting() -> bool:
                cur = await watcher.execute("select wait_event from pg_stat_activity where pid = %s", [pid])
                row = await cur.fetchone()
                return row is not None and row[0] == "SyncRep"

            await wait_for(waiting, 10, "the commit to wait for the standby")
        yield pid, release
    finally:
        if not released:
            await release()
        await conn.close()


def _waiting_logged(caplog: pytest.LogCaptureFixture, pid: int) -> bool:
    """The view says it waits for the held transaction's backend."""
    return any(
        "may have been committing" in r.getMessage() and f"pid {pid} " in r.getMessage()
        for r in caplog.records
    )


async def test_read_rows_shows_a_commit_held_by_a_synchronous_standby(
    harness: PostgresLogicalHarness, caplog: pytest.LogCaptureFixture
) -> None:
    table_config = await harness.create_table("items", ITEMS, ["id"])
    info = await harness.pg_source.describe(table_config)
    await harness.admin.execute(f"insert into {table_config.table} values (1, 1, 'before')")
    start = await harness.pg_source.current_version()
    update = f"update {table_config.table} set n = 2, note = 'held' where id = 1"
    caplog.set_level(logging.INFO)
    async with standby_that_never_answers(harness.dsn), held_commit(harness.dsn, update) as (pid, release):
        read = asyncio.create_task(harness.pg_source.read_rows(info, [{"id": 1}]))

        async def waits_or_done() -> bool:
            return read.done() or _waiting_logged(caplog, pid)

        await wait_for(waits_or_done, 20, "read_rows to wait for the held commit (or to return)")
        assert _waiting_logged(caplog, pid), "read_rows returned while the update was committing"
        await release()
        found = await asyncio.wait_for(read, 30)
    changes, _ = await read_all(harness.pg_source, info, start)
    held = next(c.version for c in changes if c.values is not None and c.values["note"] == "held")
    # replay applies the changes after the view's version: the view must hold every one below it
    assert found.version < held or found.rows == [{"id": 1, "n": 2, "note": "held"}], (
        f"the view at {found.version} misses the update committed at {held}"
    )


async def test_a_snapshot_taken_while_a_commit_is_held_loses_nothing(
    postgres_dsn: str,
    redis_url: str,
    pg_schema: str,
    namespace: str,
    redis_client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """End to end: the sidecar's initial snapshot starts while an insert's commit
    is held; once it is released, Redis holds that row too."""
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace, capture="logical")
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        await conn.execute(f"insert into {pg_schema}.items (id, name, qty) values (1, 'first', 1)")
    insert = f"insert into {pg_schema}.items (id, name, qty) values (2, 'held', 2)"
    caplog.set_level(logging.INFO)
    daemon = Daemon(config)
    run: asyncio.Task[None] | None = None
    try:
        async with (
            standby_that_never_answers(postgres_dsn),
            held_commit(postgres_dsn, insert) as (pid, release),
        ):
            run = asyncio.create_task(daemon.run())

            async def waits_or_snapshotted() -> bool:
                return (
                    _waiting_logged(caplog, pid) or len(await actual_documents(redis_client, namespace)) > 0
                )

            await wait_for(waits_or_snapshotted, 30, "the snapshot to wait for the held commit (or to end)")
            assert await actual_documents(redis_client, namespace) == {}, "a snapshot ended during the commit"
            await release()
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace, timeout=30)
    finally:
        daemon.request_stop()
        if run is not None:
            await asyncio.wait_for(run, 30)


async def test_a_read_across_column_changes_decodes_every_shape(harness: PostgresLogicalHarness) -> None:
    """ADD and DROP COLUMN between the writes of one read: each change is
    decoded with the shape it was written with (the last shape of the read is
    the first one again, so only the middle one was unknown)."""
    table_config = await harness.create_table("items", ITEMS, ["id"])
    info = await harness.pg_source.describe(table_config)
    since = await harness.pg_source.current_version()
    name = table_config.table
    await harness.admin.execute(f"insert into {name} values (1, 1, 'a')")
    await harness.admin.execute(f"alter table {name} add column extra numeric")
    await harness.admin.execute(f"insert into {name} values (2, 2, 'b', 2.5)")
    await harness.admin.execute(f"alter table {name} drop column extra")
    await harness.admin.execute(f"insert into {name} values (3, 3, 'c')")
    await harness.settle()

    rows, _ = await read_all(harness.pg_source, info, since)

    assert [(r.op, r.values) for r in rows] == [
        ("I", {"id": 1, "n": 1, "note": "a"}),
        ("I", {"id": 2, "n": 2, "note": "b"}),
        ("I", {"id": 3, "n": 3, "note": "c"}),
    ]


async def test_a_views_version_is_flushed_before_it_is_used() -> None:
    """The version must be durable: a crash that lost the WAL tail below it
    would let commits after the restart reuse positions at or below it, which
    the catch-up from it skips (a review lost a row so: the WAL writer
    paused, asynchronous commits, a snapshot, an immediate stop). Here the WAL
    writer is paused while asynchronous commits leave the WAL unflushed: the
    view's start must flush it past its version itself."""
    server = PostgresServer(settings=("wal_level=logical",)).start()
    try:
        async with await psycopg.AsyncConnection.connect(server.dsn, autocommit=True) as conn:
            await conn.execute("create table filler (x text)")
            row = await (
                await conn.execute("select pid from pg_stat_activity where backend_type = 'walwriter'")
            ).fetchone()
            assert row is not None
            os.kill(row[0], signal.SIGSTOP)
            try:
                await conn.execute("set synchronous_commit = off")
                for _ in range(20):  # asynchronous commits: WAL inserted, not flushed
                    await conn.execute(
                        "insert into filler select repeat('y', 100) from generate_series(1, 10)"
                    )
                assert await _lsn(conn, "pg_current_wal_flush_lsn()") < await _lsn(
                    conn, "pg_current_wal_insert_lsn()"
                )
                start = await pg_logical.view_start(conn)
                assert await _lsn(conn, "pg_current_wal_flush_lsn()") >= start.position, (
                    "the version is not durable"
                )
            finally:
                os.kill(row[0], signal.SIGCONT)
    finally:
        server.cleanup()


async def _lsn(conn: psycopg.AsyncConnection[Any], function: str) -> int:
    row = await (await conn.execute(f"select ({function} - '0/0')::bigint")).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(row[0])
