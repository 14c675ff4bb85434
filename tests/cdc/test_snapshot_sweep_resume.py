"""A whole snapshot that sweeps, stopped right after its sweep: between the
sweep and the end of the snapshot it forgets what it wrote (the ``@seen``
sets) and its resume point. Stopped between those two (a Redis blip, a lease
lost, a crash), the next try must not resume: resumed with the ``@seen`` sets
gone, its sweep took every live document for the row of a deleted one, and
deleted them at the first view's version, so a row unchanged since stayed
deleted for good (CI: the rows moved by a primary-key update, never written
again, missing after a Redis wipe and after a cluster failover)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from cdc.daemon import Daemon
from cdc.errors import RedisUnavailable
from publishers.layout import Layout
from publishers.manager import DataManager
from tests.cdc.test_snapshot_fast import sql
from tests.e2e import assert_mirrored, create_tables, enable_tracking, make_config


@pytest.mark.timeout(120)
async def test_a_snapshot_stopped_after_its_sweep_does_not_delete_the_documents_it_wrote(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = pg_schema
    await create_tables(postgres_dsn, s)
    await sql(
        postgres_dsn,
        s,
        "insert into {s}.items (id, name, qty, price) select g, 'n' || g, g, g / 100.0 from generate_series(1, 300) g",
    )
    config = make_config(s, postgres_dsn, redis_url, namespace, page_size=100)
    await enable_tracking(config)
    await asyncio.wait_for(Daemon(config).run(once=True), 60)  # the first snapshot: nothing to sweep
    client = aioredis.Redis.from_url(redis_url)
    try:
        await assert_mirrored(postgres_dsn, s, client, namespace)
        # its checkpoint gone, the table is snapshotted again: its documents
        # exist, so that snapshot records what it writes and sweeps the rest
        await client.delete(Layout(namespace).checkpoint(f"{s}.items"))
        await sql(postgres_dsn, s, "delete from {s}.items where id = 7")  # one row for the sweep to delete

        real = DataManager.forget_seen
        calls: list[str] = []

        async def blip_after_the_sweep(self: DataManager, section: str) -> Any:
            await real(self, section)
            calls.append(section)
            if calls.count("items") == 2:  # 1: before the snapshot (starting over); 2: after its sweep
                raise RedisUnavailable("Redis went away for a moment (test)")

        monkeypatch.setattr(DataManager, "forget_seen", blip_after_the_sweep)
        await asyncio.wait_for(Daemon(config).run(once=True), 60)
        assert calls.count("items") >= 2, calls
        await assert_mirrored(postgres_dsn, s, client, namespace)
    finally:
        await client.aclose()
