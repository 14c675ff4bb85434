"""DDL on one partition of a partitioned table, in both capture modes
(``cdc.sources.pg_shape``'s fingerprint holds the partitions)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
import redis.asyncio as aioredis

from cdc.daemon import Daemon
from tests.e2e import ITEMS_DDL, assert_mirrored, create_tables, enable_tracking, make_config


async def execute(dsn: str, *statements: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            await conn.execute(statement)


@pytest.mark.parametrize("capture", ["triggers", "logical"])
async def test_truncate_detach_drop_and_attach_of_one_partition_are_mirrored(
    capture: str,
    postgres_dsn: str,
    redis_url: str,
    pg_schema: str,
    namespace: str,
    redis_client: aioredis.Redis,
) -> None:
    """A TRUNCATE, DETACH or DROP of one partition, or an ATTACH's rows, fire
    no trigger of the partitioned table and pgoutput sends nothing for them:
    the table's fingerprint moves, and it is snapshotted again (the sidecar
    running)."""
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace, capture=capture)
    await create_tables(postgres_dsn, pg_schema)
    items = f"{pg_schema}.items"
    partitioned = ITEMS_DDL.format(s=pg_schema).strip() + " partition by range (id)"
    await execute(
        postgres_dsn,
        f"drop table {items}",
        partitioned,
        *(
            f"create table {items}_{n} partition of {items} for values from ({n}) to ({n + 100})"
            for n in (0, 100, 200)
        ),
        f"insert into {items} (id, name, qty) select i, 'r' || i, i from unnest(array[1, 2, 101, 102, 201]) i",
    )
    await enable_tracking(config)
    daemon = Daemon(config)
    run = asyncio.create_task(daemon.run())
    try:
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace)
        await execute(postgres_dsn, f"truncate {items}_100")
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace)
        await execute(postgres_dsn, f"alter table {items} detach partition {items}_200")
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace)
        await execute(
            postgres_dsn,
            f"insert into {items}_200 (id, name, qty) values (202, 'attached', 1)",
            f"alter table {items} attach partition {items}_200 for values from (200) to (300)",
        )
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace)
        await execute(postgres_dsn, f"drop table {items}_0")
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace)
    finally:
        daemon.request_stop()
        await asyncio.wait_for(run, 30)
