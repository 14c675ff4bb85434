"""The sidecar end to end, against real PostgreSQL and Redis.

What a user checks: while writers run (long transactions, deletes, primary-key
updates, re-inserts) and after they stop, the documents in Redis equal the
rows in the database, a subscriber's replica equals them too, every
partition's seq is gap-free, and stopping or killing the sidecar loses nothing.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import redis.asyncio as aioredis
from psycopg import sql

from cdc.daemon import Daemon
from cdc.sources.pg_tracking import net_table_name
from publishers.layout import Layout
from publishers.manager import DataManager
from publishers.subscriber import Subscriber
from tests.e2e import (
    Writers,
    actual_documents,
    assert_mirrored,
    assert_seq_gap_free,
    create_tables,
    enable_tracking,
    make_config,
    wait_for,
    write_config,
)


async def test_mirrors_concurrent_writers(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, redis_client: aioredis.Redis
) -> None:
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace, max_batch_size=200)
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    writers = Writers(postgres_dsn, pg_schema, seed=11)
    write_task = asyncio.create_task(writers.run(writers=4, long_transactions=2))
    await asyncio.sleep(0.3)  # let some rows exist before the initial snapshot
    daemon = Daemon(config)
    run_task = asyncio.create_task(daemon.run())
    subscriber = Subscriber(redis_client, namespace, "orders")
    follow = asyncio.create_task(_drain(subscriber))
    await wait_for(lambda: _transactions_at_least(writers, 300), 60, "300 writer transactions")
    writers.stop.set()
    await write_task
    await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace, timeout=30)
    await assert_seq_gap_free(redis_client, namespace, ("items", "lines"))
    documents = await actual_documents(redis_client, namespace)
    orders = {key: doc for (p, s, key), doc in documents.items() if p == "orders"}
    await wait_for(lambda: _replica_equals(subscriber, "lines", orders), 15, "the subscriber's replica")
    daemon.request_stop()
    await run_task
    follow.cancel()


async def _drain(subscriber: Subscriber) -> None:
    async for _ in subscriber:
        pass


async def _transactions_at_least(writers: Writers, n: int) -> bool:
    return writers.transactions >= n


async def _replica_equals(subscriber: Subscriber, section: str, expected: dict[str, object]) -> bool:
    return subscriber.replica.get(section, {}) == expected


async def test_graceful_shutdown_persists_checkpoints(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, redis_client: aioredis.Redis
) -> None:
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace)
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    writers = Writers(postgres_dsn, pg_schema, seed=5)
    write_task = asyncio.create_task(writers.run(writers=2, long_transactions=0))
    daemon = Daemon(config)
    run_task = asyncio.create_task(daemon.run())
    await wait_for(lambda: _transactions_at_least(writers, 100), 60, "100 writer transactions")
    writers.stop.set()
    await write_task
    await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace)
    # mirrored is not finished: a loaded machine can start the first snapshot
    # after the writers stopped, and its documents are all written before its
    # last steps (the R markers, the checkpoint); a stop then leaves it
    # "snapshotting", to resume (CI: 1 run of 3)
    await wait_for(lambda: _all_caught_up(daemon), 30, "every table caught up")
    daemon.request_stop()
    await run_task
    manager = DataManager(redis_client, config.redis)
    for tracker in daemon.pipeline.trackers:
        checkpoint = await manager.get_checkpoint(tracker.table)
        assert checkpoint is not None and checkpoint.state == "streaming"
        assert checkpoint.version == tracker.applied, "checkpoint is not the last applied version"
    published = await assert_seq_gap_free(redis_client, namespace, ("items", "lines"))
    # A restart reads from the checkpoints: it finds nothing to publish again.
    again = Daemon(config)
    await again.run(once=True)
    assert await assert_seq_gap_free(redis_client, namespace, ("items", "lines")) == published


async def test_a_quiet_table_is_checkpointed_and_caught_up_soon_after_its_last_change(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, redis_client: aioredis.Redis
) -> None:
    """An idle table may wait for its notification instead of polling (the
    source knows a read would find nothing), but not before the last burst's
    checkpoint is written and the table reported caught up: a crash then
    replays nothing, and /readyz does not lag by the quiet wait (30 s)."""
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace)
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    daemon = Daemon(config)
    run_task = asyncio.create_task(daemon.run())
    await wait_for(lambda: _all_caught_up(daemon), 30, "the initial snapshots")
    for burst in range(3):
        writers = Writers(postgres_dsn, pg_schema, seed=20 + burst)
        write_task = asyncio.create_task(writers.run(writers=2, long_transactions=0))
        await wait_for(lambda w=writers: _transactions_at_least(w, 30), 30, "a burst of writes")  # type: ignore[misc]
        writers.stop.set()
        await write_task
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace)
        manager = DataManager(redis_client, config.redis)
        written = await _latest_versions(postgres_dsn, config)
        await wait_for(
            lambda m=manager, v=written: _checkpoints_cover(m, v),  # type: ignore[misc]
            5,
            "checkpoints at the burst's last change",
        )
        await wait_for(lambda: _all_caught_up(daemon), 5, "every table caught up")
        await asyncio.sleep(0.5)  # quiet: the trackers wait for notifications now
    daemon.request_stop()
    await run_task


async def _all_caught_up(daemon: Daemon) -> bool:
    return bool(daemon.pipeline.trackers) and all(t.caught_up.is_set() for t in daemon.pipeline.trackers)


async def _latest_versions(dsn: str, config) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """table -> the highest version in its tracking entries (its last change)."""
    out = {}
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for table in config.tables:
            net = sql.Identifier(config.source.tracking_schema, net_table_name(table.schema, table.name))
            row = await (await conn.execute(sql.SQL("select max(version) from {}").format(net))).fetchone()
            out[table.table] = int(row[0]) if row and row[0] is not None else 0
    return out


async def _checkpoints_cover(manager: DataManager, versions: dict[str, int]) -> bool:
    for table, version in versions.items():
        checkpoint = await manager.get_checkpoint(table)
        if checkpoint is None or checkpoint.version < version:
            return False
    return True


@pytest.mark.slow
async def test_sigkill_under_load_loses_nothing(
    postgres_dsn: str,
    redis_url: str,
    pg_schema: str,
    namespace: str,
    redis_client: aioredis.Redis,
    tmp_path: Path,
) -> None:
    # A short lease: a killed sidecar's tables are free again 2 s later.
    config_path = write_config(
        tmp_path / "tables.yaml", pg_schema, postgres_dsn, redis_url, namespace, lease_ttl="2s"
    )
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace, lease_ttl="2s")
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    writers = Writers(postgres_dsn, pg_schema, seed=3)
    write_task = asyncio.create_task(writers.run(writers=3, long_transactions=1))
    kills = int(os.environ.get("CDC_TEST_KILLS", "6"))
    rng = random.Random(kills)
    for _ in range(kills):
        proc = _start_sidecar(config_path)
        before = await _published(redis_client, namespace)
        # Kill only once this sidecar is applying, at a random moment after.
        await wait_for(
            lambda b=before: _published_more(redis_client, namespace, b), 60, "the sidecar to publish"
        )
        await asyncio.sleep(rng.uniform(0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    writers.stop.set()
    await write_task
    final = _start_sidecar(config_path, once=True)
    _, stderr = final.communicate(timeout=120)
    assert final.returncode == 0, stderr.decode()[-2000:]
    await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace, timeout=5)
    await assert_seq_gap_free(redis_client, namespace, ("items", "lines"))
    for table in config.tables:
        raw = await redis_client.hget(Layout(namespace).checkpoint(table.table), "state")
        assert raw == b"streaming"


async def _published(client: aioredis.Redis, namespace: str) -> int:
    layout = Layout(namespace)
    total = 0
    for section in ("items", "lines"):
        for partition in await client.smembers(layout.partitions(section)):
            total += int(await client.get(layout.seq(partition.decode())) or 0)
    return total


async def _published_more(client: aioredis.Redis, namespace: str, before: int) -> bool:
    return await _published(client, namespace) > before


def _start_sidecar(config_path: Path, once: bool = False) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "cdc.cli", "--json-logs", "run", "-c", str(config_path)]
    return subprocess.Popen(
        [*args, "--once"] if once else args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE if once else subprocess.DEVNULL,
    )
