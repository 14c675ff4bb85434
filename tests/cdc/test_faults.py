"""Fault injection: the sidecar under load while its process, its servers and
its connections fail, against real PostgreSQL and Redis.

Every case ends with the same checks (``tests.chaos.assert_nothing_lost``):
the documents equal the rows, a subscriber that followed a partition across
the fault holds a replica equal to them, every partition's seq is gap-free,
and no document's version ever went backwards. The two outages last
``CDC_TEST_OUTAGE_SECONDS`` (default 30). Two sidecars racing for the tables
with one of them frozen past its lease is in ``tests/cdc/test_sidecars.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from cdc.config import Config
from cdc.daemon import Daemon
from cdc.devservers import PostgresServer, RedisServer, free_port
from publishers.layout import Layout
from publishers.manager import DataManager
from publishers.model import Change
from publishers.subscriber import Subscriber
from tests.chaos import (
    TEST_CLIENT,
    Follower,
    Sidecar,
    VersionSampler,
    assert_nothing_lost,
    checking_client,
    published,
    wait_health,
    wait_published_more,
)
from tests.e2e import Writers, create_tables, enable_tracking, make_config, wait_for, write_config

OUTAGE = float(os.environ.get("CDC_TEST_OUTAGE_SECONDS", "30"))
KILLS = int(os.environ.get("CDC_TEST_FAULT_KILLS", "20"))


async def prepared(dsn: str, schema: str, redis_url: str, namespace: str, **worker: Any) -> Config:
    config = make_config(schema, dsn, redis_url, namespace, **worker)
    await create_tables(dsn, schema)
    await enable_tracking(config)
    return config


class Running:
    """An in-process daemon with its health endpoint, for the faults that need
    to look at /healthz while they last."""

    def __init__(self, config: Config) -> None:
        self.daemon = Daemon(config)
        assert config.worker.health is not None
        self.port = config.worker.health[1]
        self.task = asyncio.create_task(self.daemon.run())

    def alive(self) -> None:
        if self.task.done():
            raise AssertionError(f"the daemon stopped: {self.task.exception()!r}")

    async def stop(self) -> None:
        self.daemon.request_stop()
        await asyncio.wait_for(self.task, 60)


def health_config(dsn: str, schema: str, redis_url: str, namespace: str, **worker: Any) -> Config:
    return make_config(schema, dsn, redis_url, namespace, health=f"127.0.0.1:{free_port()}", **worker)


# -- the sidecar process ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_sigkill_at_random_moments_under_load(
    postgres_dsn: str,
    redis_url: str,
    pg_schema: str,
    namespace: str,
    redis_client: aioredis.Redis,
    tmp_path: Path,
) -> None:
    """SIGKILL the sidecar 20 times at random moments (during start-up, the
    initial snapshot, reads, applies, checkpoint writes) while the writers
    run; each new one takes the tables over once the dead one's leases run
    out (1 s) and goes on from the checkpoints."""
    path = write_config(
        tmp_path / "tables.yaml", pg_schema, postgres_dsn, redis_url, namespace, lease_ttl="1s"
    )
    await prepared(postgres_dsn, pg_schema, redis_url, namespace)
    writers = Writers(postgres_dsn, pg_schema, seed=31)
    write_task = asyncio.create_task(writers.run(writers=3, long_transactions=1))
    follower = Follower(redis_client, namespace)
    sampler = VersionSampler(redis_client, namespace).start()
    rng = random.Random(KILLS)
    sidecar: Sidecar | None = None
    try:
        for i in range(KILLS):
            sidecar = Sidecar(path, tmp_path / f"sidecar{i}.log")
            if i % 2:  # half of them die at any moment of their life, start-up included
                await asyncio.sleep(rng.uniform(0.2, 2.5))
            else:  # the other half once they are applying, at a random moment after
                before = await published(redis_client, namespace)
                await wait_published_more(redis_client, namespace, before, 60)
                await asyncio.sleep(rng.uniform(0, 0.3))
            sidecar.kill()
        sidecar = Sidecar(path, tmp_path / "last.log")
        await wait_published_more(redis_client, namespace, await published(redis_client, namespace), 60)
        writers.stop.set()
        await write_task
        await assert_nothing_lost(postgres_dsn, pg_schema, redis_client, namespace, follower, sampler)
        assert await sidecar.stop() == 0, sidecar.log_text()[-3000:]
    finally:
        writers.stop.set()
        await asyncio.gather(write_task, return_exceptions=True)
        await follower.close()
        await sampler.stop()
        if sidecar is not None:
            sidecar.kill()


# -- Redis -----------------------------------------------------------------------


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own, with an append-only file fsynced at
    every write: it can be killed and restarted without losing a reply."""
    server = RedisServer(appendonly=True, extra=("--appendfsync", "always")).start()
    yield server
    server.cleanup()


@pytest.mark.slow
@pytest.mark.timeout(OUTAGE * 2 + 150)
async def test_redis_down_for_an_outage_then_back_with_its_aof(
    postgres_dsn: str, pg_schema: str, namespace: str, own_redis: RedisServer
) -> None:
    """redis-server is killed (SIGKILL) while the sidecar applies and stays
    down for the outage; the writers go on. The sidecar keeps retrying,
    reports degraded on /readyz meanwhile (while /healthz, the liveness
    probe, stays 200: a restart would not bring Redis back), and catches up
    once Redis is back with everything its AOF held."""
    client = checking_client(own_redis.url)
    plain = aioredis.Redis.from_url(own_redis.url)
    config = health_config(postgres_dsn, pg_schema, own_redis.url, namespace, lease_ttl="2s")
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    writers = Writers(postgres_dsn, pg_schema, seed=32)
    write_task = asyncio.create_task(writers.run(writers=2, long_transactions=1))
    running = Running(config)
    follower = Follower(plain, namespace)
    try:
        await wait_health(running.port, 200, 30)
        await wait_published_more(client, namespace, 0, 30)
        own_redis.kill()
        down_at = time.monotonic()
        body = await wait_health(running.port, 503, 30, contains="Redis is unavailable")
        assert body["ok"] is False
        await _live_but_not_ready(running, down_at, "Redis")
        own_redis.start()  # the same port and directory: the AOF is replayed
        await wait_health(running.port, 200, 60)
        before = await published(client, namespace)
        await wait_published_more(client, namespace, before, 30)
        writers.stop.set()
        await write_task
        await assert_nothing_lost(postgres_dsn, pg_schema, client, namespace, follower)
        assert follower.subscriber.reloads == 0, "the AOF kept the stream: no reload needed"
        running.alive()
        await running.stop()
    finally:
        writers.stop.set()
        await asyncio.gather(write_task, return_exceptions=True)
        await follower.close()
        if not running.task.done():
            await running.stop()
        await client.aclose()
        await plain.aclose()


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_redis_restarted_empty_is_detected_and_every_table_snapshotted_again(
    postgres_dsn: str, pg_schema: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """redis-server restarts without its data (no persistence): the sidecar
    notices (the epoch key is gone, its leases with it), snapshots every table
    again, and a subscriber following a partition reloads instead of applying
    the new data's messages to its old replica."""
    server = RedisServer().start()  # no AOF, no RDB: a restart is empty
    client = checking_client(server.url)
    plain = aioredis.Redis.from_url(server.url)
    config = health_config(postgres_dsn, pg_schema, server.url, namespace, lease_ttl="2s")
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    writers = Writers(postgres_dsn, pg_schema, seed=33)
    write_task = asyncio.create_task(writers.run(writers=2, long_transactions=1))
    running = Running(config)
    follower = Follower(plain, namespace)
    try:
        with caplog.at_level(logging.INFO, logger="cdc"):
            await wait_published_more(client, namespace, 0, 30)
            await wait_for(lambda: _above(follower, 50), 30, "the subscriber to follow some messages")
            server.kill()
            server.start()
            await wait_for(lambda: _logged(caplog, "Redis lost its data"), 30, "the wipe to be noticed")
            await wait_for(lambda: _reloaded(follower), 30, "the subscriber to reload")
            await wait_published_more(client, namespace, await published(client, namespace), 30)
            writers.stop.set()
            await write_task
            await assert_nothing_lost(postgres_dsn, pg_schema, client, namespace, follower)
            for table in config.tables:
                checkpoint = await client.hget(Layout(namespace).checkpoint(table.table), "state")
                assert checkpoint == b"streaming", f"{table.table} has no checkpoint again"
            snapshots = [r for r in caplog.records if r.getMessage() == "snapshot done"]
            assert {r.table for r in snapshots} == {t.table for t in config.tables}  # type: ignore[attr-defined]
            assert len(snapshots) >= 2 * len(config.tables), "not snapshotted again"
            running.alive()
            await running.stop()
    finally:
        writers.stop.set()
        await asyncio.gather(write_task, return_exceptions=True)
        await follower.close()
        if not running.task.done():
            await running.stop()
        await client.aclose()
        await plain.aclose()
        server.cleanup()


async def test_a_subscriber_reloads_when_its_partition_is_replaced(
    redis_url: str, namespace: str, redis_client: aioredis.Redis
) -> None:
    """The subscriber's side of a Redis that lost its data, step by step: the
    stream starts again from seq 1 and grows past the subscriber's position
    before it reads again. Reading on would apply the new messages to the old
    replica; it sees that the entry at its position is not the one it took,
    and loads the documents again."""
    config = make_config("s", "postgresql://x@127.0.0.1/x", redis_url, namespace)
    manager = DataManager(redis_client, config.redis)
    old = [_row("a", 1, "old"), _row("b", 2, "old"), _row("gone", 3, "old")]
    await manager.apply(old)
    subscriber = Subscriber(redis_client, namespace, "p", block=0.05)
    await subscriber.start()
    assert await subscriber.poll() == [] and subscriber.position == 3
    layout = Layout(namespace)
    async for key in redis_client.scan_iter(match=f"{namespace}:*"):
        await redis_client.delete(key)  # Redis restarted empty
    new = [_row(k, 10 + i, "new") for i, k in enumerate("abcde")]
    await manager.apply(new)  # seq 1..5: past the old position 3
    await subscriber.poll()
    assert subscriber.reloads == 1
    assert subscriber.replica == {"x": {k: {"k": k, "v": "new"} for k in "abcde"}}
    assert subscriber.position == subscriber.seq == 5
    await manager.apply([_row("a", 20, "newer")])
    [message] = await subscriber.poll()
    assert message["seq"] == 6 and subscriber.replica["x"]["a"] == {"k": "a", "v": "newer"}
    assert int(await redis_client.get(layout.seq("p")) or 0) == 6


def _row(key: str, version: int, value: str) -> Change:
    values = {"k": json.dumps(key).encode(), "v": json.dumps(value).encode()}
    return Change("s.t", "p", "x", key, "U", version, values)


# -- PostgreSQL ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(OUTAGE * 2 + 150)
async def test_postgres_down_for_an_outage_then_back(namespace: str, redis_url: str) -> None:
    """PostgreSQL (a server of this test's own) crashes (immediate shutdown)
    and stays down for the outage. The sidecar keeps retrying, reports the
    tables degraded on /readyz (/healthz stays 200), and streams on from its
    checkpoints once the server is back: what was written before the crash
    and after the restart all arrives."""
    # Durable commits: with synchronous_commit off (the dev servers' speed-up)
    # a crash loses commits PostgreSQL had acknowledged, and that the sidecar
    # may already have read and applied (docs/RELIABILITY.md, limits).
    server = PostgresServer(settings=("synchronous_commit=on",)).start()
    schema = "faults"
    client = aioredis.Redis.from_url(redis_url, client_name=TEST_CLIENT)
    async with await psycopg.AsyncConnection.connect(server.dsn, autocommit=True) as conn:
        await conn.execute(f"create schema {schema}")
    config = health_config(server.dsn, schema, redis_url, namespace, lease_ttl="2s")
    await create_tables(server.dsn, schema)
    await enable_tracking(config)
    writers = Writers(server.dsn, schema, seed=34)
    write_task = asyncio.create_task(writers.run(writers=2, long_transactions=1))
    running = Running(config)
    follower = Follower(client, namespace)
    try:
        await wait_health(running.port, 200, 30)
        await wait_published_more(client, namespace, 0, 30)
        writers.stop.set()  # the writers' connections die with the server too
        await write_task
        server.stop("immediate")
        down_at = time.monotonic()
        await wait_health(running.port, 503, 30, contains="PostgreSQL")
        await _live_but_not_ready(running, down_at, "PostgreSQL")
        server.start()
        await wait_health(running.port, 200, 60)
        writers = Writers(server.dsn, schema, seed=35)
        write_task = asyncio.create_task(writers.run(writers=2, long_transactions=1))
        await wait_published_more(client, namespace, await published(client, namespace), 30)
        writers.stop.set()
        await write_task
        await assert_nothing_lost(server.dsn, schema, client, namespace, follower)
        running.alive()
        await running.stop()
    finally:
        writers.stop.set()
        await asyncio.gather(write_task, return_exceptions=True)
        await follower.close()
        if not running.task.done():
            await running.stop()
        await client.aclose()
        server.cleanup()


# -- connections ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_connections_cut_mid_transaction(
    postgres_dsn: str,
    redis_url: str,
    pg_schema: str,
    namespace: str,
    redis_client: aioredis.Redis,
) -> None:
    """While the writers run: terminate the sidecar's PostgreSQL backends while
    they are inside a read transaction (pg_terminate_backend), and kill its
    Redis connections right after they sent apply calls (CLIENT KILL), eight
    times each. Reads are retried from the read position and replays are
    dropped by version: nothing lost, nothing twice."""
    config = health_config(postgres_dsn, pg_schema, redis_url, namespace, lease_ttl="2s")
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    writers = Writers(postgres_dsn, pg_schema, seed=36)
    write_task = asyncio.create_task(writers.run(writers=3, long_transactions=1))
    running = Running(config)
    follower = Follower(redis_client, namespace)
    sampler = VersionSampler(redis_client, namespace).start()
    terminated = killed = 0
    try:
        await wait_published_more(redis_client, namespace, 0, 30)
        for round_ in range(8):
            table = ("items", "lines")[round_ % 2]
            terminated += await _terminate_a_read(postgres_dsn, f"{pg_schema}.{table}")
            before = await published(redis_client, namespace)
            await wait_published_more(redis_client, namespace, before, 30)
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                killed += await _kill_applying_clients(redis_client)
                await asyncio.sleep(0.02)
            running.alive()
        await wait_health(running.port, 200, 60)
        await wait_published_more(redis_client, namespace, await published(redis_client, namespace), 30)
        writers.stop.set()
        await write_task
        await assert_nothing_lost(postgres_dsn, pg_schema, redis_client, namespace, follower, sampler)
        assert terminated >= 8 and killed >= 8, (terminated, killed)
        running.alive()
        await running.stop()
    finally:
        writers.stop.set()
        await asyncio.gather(write_task, return_exceptions=True)
        await follower.close()
        await sampler.stop()
        if not running.task.done():
            await running.stop()


async def _terminate_a_read(dsn: str, table: str) -> int:
    """Catch the sidecar inside a read: lock ``table`` for a moment, so that
    its next read of it waits on the lock within its transaction, and
    terminate the backends of the sidecar that are waiting so. Returns how
    many were terminated."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute(f"lock table {table} in access exclusive mode")  # in a transaction, until rollback
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
            waiting = (
                "select pid from pg_stat_activity where application_name = 'cdc-sync'"
                " and datname = current_database() and wait_event_type = 'Lock'"
            )
            pids: list[Any] = []

            async def reading() -> bool:
                nonlocal pids
                pids = await (await admin.execute(waiting)).fetchall()  # type: ignore[arg-type]
                return bool(pids)

            await wait_for(reading, 30, f"the sidecar to read {table}")
            for (pid,) in pids:
                await admin.execute("select pg_terminate_backend(%s)", [pid])
        await conn.rollback()
    return len(pids)


async def _kill_applying_clients(client: aioredis.Redis) -> int:
    """Every connection but the test's own whose last command was an apply
    call, or a checkpoint write (scripts): killed between the calls of a
    batch, or before their replies were read."""
    count = 0
    for entry in await client.client_list():
        if entry.get("name") != TEST_CLIENT and entry.get("cmd") in ("evalsha", "eval", "sadd"):
            count += await client.client_kill_filter(_id=entry["id"])
    return count


# -- change tracking -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_tracking_cleaned_up_past_the_checkpoint_is_snapshotted_again(
    postgres_dsn: str,
    redis_url: str,
    pg_schema: str,
    namespace: str,
    redis_client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sidecar is stopped; rows change and some are deleted; then the
    tracking cleanup runs with a tiny retention, past the checkpoints. On
    restart the checkpoints have expired (TrackingExpired): every table is
    snapshotted again, and the rows deleted meanwhile leave Redis through
    ordinary delete messages that the subscriber sees."""
    config = await prepared(postgres_dsn, pg_schema, redis_url, namespace, lease_ttl="2s")
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        await conn.execute(
            f"insert into {pg_schema}.items (id, name, qty) select i, 'n' || i, i from generate_series(1, 60) i"
        )
        await conn.execute(f"insert into {pg_schema}.lines select i, 1, 's', i from generate_series(1, 20) i")
    await Daemon(config).run(once=True)
    follower = Follower(redis_client, namespace)
    try:
        await wait_for(lambda: _above(follower, -1, loaded=20), 30, "the subscriber to load")
        async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
            await conn.execute(f"delete from {pg_schema}.lines where order_id <= 5")
            await conn.execute(f"delete from {pg_schema}.items where id <= 10")
            await conn.execute(f"update {pg_schema}.lines set qty = qty + 100 where order_id > 15")
            await conn.execute(f"update {pg_schema}.items set qty = -qty where id > 50")
            await conn.execute(f"insert into {pg_schema}.lines values (99, 1, 'new', 1)")
            # stopped for longer than its retention: the claim its start-up cleanup made has lapsed
            await conn.execute(
                f"update {pg_schema}_trk.retention_claims set expires_at = now() - interval '1s'"
            )
            cleaned = await (await conn.execute(f"select {pg_schema}_trk.cleanup('0 seconds')")).fetchone()
            assert cleaned is not None and cleaned[0] > 0
            expired = await (
                await conn.execute(
                    f"select table_name, min_valid_version from {pg_schema}_trk.tracked_tables"
                )
            ).fetchall()
        for table, min_valid in expired:
            checkpoint = await DataManager(redis_client, config.redis).get_checkpoint(table)
            assert checkpoint is not None and checkpoint.version < min_valid, "the cleanup did not pass it"
        with caplog.at_level(logging.INFO, logger="cdc"):
            await Daemon(config).run(once=True)
        reasons = [getattr(r, "reason", "") for r in caplog.records if r.getMessage() == "re-snapshotting"]
        assert len(reasons) == 2 and all("minimum valid version" in r for r in reasons), reasons
        await assert_nothing_lost(postgres_dsn, pg_schema, redis_client, namespace, follower)
        deletes = await _stream_ops(redis_client, namespace, "orders", "D")
        assert {f"{i}-1" for i in range(1, 6)} <= deletes
    finally:
        await follower.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_truncate_while_running(
    postgres_dsn: str,
    redis_url: str,
    pg_schema: str,
    namespace: str,
    redis_client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """TRUNCATE is not tracked row by row: it raises the table's minimum valid
    version, the tracker's checkpoint expires, the table is snapshotted again
    and the sweep deletes every document whose row went with the truncate,
    while the writers go on writing."""
    config = health_config(postgres_dsn, pg_schema, redis_url, namespace, lease_ttl="2s")
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    writers = Writers(postgres_dsn, pg_schema, seed=37)
    write_task = asyncio.create_task(writers.run(writers=3, long_transactions=1))
    follower = Follower(redis_client, namespace)
    sampler = VersionSampler(redis_client, namespace).start()
    with caplog.at_level(logging.INFO, logger="cdc"):
        running = Running(config)
        try:
            await wait_for(lambda: _above(follower, 100), 30, "some traffic")
            async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
                for table in ("lines", "items"):
                    await conn.execute(f"truncate {pg_schema}.{table}")
            await wait_for(lambda: _resnapshots(caplog, 2), 30, "both tables to be snapshotted again")
            await wait_published_more(redis_client, namespace, await published(redis_client, namespace), 30)
            writers.stop.set()
            await write_task
            await assert_nothing_lost(postgres_dsn, pg_schema, redis_client, namespace, follower, sampler)
            running.alive()
            await running.stop()
        finally:
            writers.stop.set()
            await asyncio.gather(write_task, return_exceptions=True)
            await follower.close()
            await sampler.stop()
            if not running.task.done():
                await running.stop()


# -- helpers -------------------------------------------------------------------------


async def _live_but_not_ready(running: Running, down_at: float, what: str) -> None:
    """Through the outage: the sidecar runs, /readyz says 503, /healthz
    (liveness: a restart would not bring ``what`` back) stays 200."""
    while time.monotonic() - down_at < OUTAGE:
        running.alive()
        assert (await _probe(running.port, "/readyz"))[0] == 503, f"ready while {what} is down"
        assert (await _probe(running.port, "/healthz"))[0] == 200, f"not live while {what} is down"
        await asyncio.sleep(0.5)


async def _probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    from tests.chaos import get

    return await asyncio.to_thread(get, port, path)


async def _above(follower: Follower, messages: int, loaded: int = 0) -> bool:
    docs = sum(len(d) for d in follower.subscriber.replica.values())
    return follower.messages > messages and docs >= loaded


async def _reloaded(follower: Follower) -> bool:
    return follower.subscriber.reloads > 0


async def _logged(caplog: pytest.LogCaptureFixture, message: str) -> bool:
    return any(r.getMessage() == message or message in r.getMessage() for r in caplog.records)


async def _resnapshots(caplog: pytest.LogCaptureFixture, count: int) -> bool:
    return sum(r.getMessage() == "re-snapshotting" for r in caplog.records) >= count


async def _stream_ops(client: aioredis.Redis, namespace: str, partition: str, op: str) -> set[str]:
    """Keys of the messages with ``op`` in a partition's stream."""
    out = set()
    for _, fields in await client.xrange(Layout(namespace).stream(partition)):
        message = json.loads(fields[b"m"])
        if message["op"] == op:
            out.add(message["key"])
    return out
