"""The retention cleanup is scoped to the deployment that runs it (issue 15,
point 5): two configs mirror one PostgreSQL database into two namespaces, with
an overlapping table set and retentions of 1 s and 1 h. Real PostgreSQL and
Redis; each deployment runs its cleanup through the daemon's job
(``cdc.cleanup_job``), and its sidecar (``cdc run --once``) shows what the
cleanup did to its mirror: whether it re-snapshots, and why."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis
from psycopg import sql

from cdc.cleanup_job import CleanupJob, cleanup_scope, deployment_name
from cdc.config import Config, parse_config
from cdc.daemon import Daemon
from cdc.pipeline import Pipeline
from cdc.sources import pg_retention
from cdc.sources.base import CleanupScope
from cdc.sources.pg_tracking import net_table_name
from publishers.layout import Layout
from publishers.manager import DataManager
from tests.e2e import config_text, create_tables, enable_tracking

SOLO_DDL = "create table {s}.solo (id int primary key, note text)"
SOLO_ENTRY = """  - table: {s}.solo
    partition: solo
    section: solo
    backoff: [[3, 10ms], [null, 50ms]]
"""


def deployment(
    schema: str, dsn: str, redis_url: str, namespace: str, retention: float, tables: tuple[str, ...]
) -> Config:
    """A config of ``tables`` (items, lines, solo), keeping entries ``retention`` seconds
    (below the file's 1 m minimum: set after loading, as the test's clock is short)."""
    text = config_text(schema, dsn, redis_url, namespace) + SOLO_ENTRY.format(s=schema)
    config = parse_config(text, "<test>", {})
    chosen = tuple(t for t in config.tables if t.name in tables)
    return replace(config, source=replace(config.source, retention=retention), tables=chosen)


async def execute(dsn: str, *statements: str) -> list[Any]:
    """Run each statement; the first column of each one's first row (None when none)."""
    found = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            cursor = await conn.execute(statement)
            row = await cursor.fetchone() if cursor.description else None
            found.append(row[0] if row else None)
    return found


async def entries(dsn: str, schema: str, table: str) -> int:
    net = sql.Identifier(f"{schema}_trk", net_table_name(schema, table)).as_string()
    (count,) = await execute(dsn, f"select count(*) from {net}")
    return int(count)


async def age_entries(dsn: str, schema: str, *tables: str) -> None:
    """The tables' tracking entries were written ten minutes ago: past 1 s, within 1 h."""
    for table in tables:
        net = sql.Identifier(f"{schema}_trk", net_table_name(schema, table)).as_string()
        await execute(dsn, f"update {net} set changed_at = now() - interval '10 minutes'")


async def run_job(config: Config) -> CleanupJob:
    job = CleanupJob(config, Pipeline(config))
    await job.run()
    assert job.pipeline.cleanup_error is None, job.pipeline.cleanup_error
    return job


def snapshot_reasons(caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    return {
        str(getattr(r, "table", "")): str(getattr(r, "reason", ""))
        for r in caplog.records
        if r.getMessage() == "snapshot starting"
    }


async def document(client: aioredis.Redis, namespace: str, partition: str, key: str) -> dict[str, str]:
    raw = await client.hgetall(Layout(namespace).document(partition, "items", key))
    return {k.decode(): v.decode() for k, v in raw.items()}


async def test_a_short_retention_cleans_its_own_tables_and_never_expires_a_longer_one(
    postgres_dsn: str,
    pg_schema: str,
    redis_url: str,
    redis_client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``long`` (1 h) mirrors items; ``short`` (1 s) mirrors items and lines;
    solo is tracked but in neither config. After both cleanups, with every
    entry ten minutes old: items keeps its entries (the longer claim) and
    ``long`` catches up without a snapshot; lines, only ``short``'s, is cleaned,
    and ``short`` re-snapshots it saying which cleanup removed what; solo is
    untouched. Once ``long``'s claim expires, ``short`` cleans items too."""
    await create_tables(postgres_dsn, pg_schema)
    await execute(postgres_dsn, SOLO_DDL.format(s=pg_schema))
    long = deployment(pg_schema, postgres_dsn, redis_url, "long", 3600.0, ("items",))
    short = deployment(pg_schema, postgres_dsn, redis_url, "short", 1.0, ("items", "lines"))
    await enable_tracking(
        deployment(pg_schema, postgres_dsn, redis_url, "x", 1.0, ("items", "lines", "solo"))
    )
    await Daemon(long).run(once=True)
    await Daemon(short).run(once=True)
    await execute(
        postgres_dsn,
        f"insert into {pg_schema}.items (id, name) values (1, 'one'), (2, 'two')",
        f"insert into {pg_schema}.lines values (1, 1, 'a', 1)",
        f"insert into {pg_schema}.solo values (1, 'x')",
    )
    await age_entries(postgres_dsn, pg_schema, "items", "lines", "solo")

    await run_job(long)  # claims items for an hour, removes nothing younger
    job = await run_job(short)

    assert await entries(postgres_dsn, pg_schema, "items") == 2
    assert await entries(postgres_dsn, pg_schema, "lines") == 0
    assert await entries(postgres_dsn, pg_schema, "solo") == 1
    assert job.pipeline.metrics.cleanup_failing._value.get() == 0
    assert job.pipeline.metrics.cleanup_last_success._value.get() > 0

    caplog.set_level(logging.INFO, logger="cdc")
    await Daemon(long).run(once=True)
    assert snapshot_reasons(caplog) == {}, "the long deployment's checkpoint expired"
    assert (await document(redis_client, "long", "r2", "2")).get("name") == '"two"'
    caplog.clear()
    await Daemon(short).run(once=True)
    reasons = snapshot_reasons(caplog)
    assert set(reasons) == {f"{pg_schema}.lines"}, reasons
    assert reasons[f"{pg_schema}.lines"].startswith("change tracking expired: the checkpoint ")
    assert "the retention cleanup at " in reasons[f"{pg_schema}.lines"]
    assert (
        "removed its entries older than 1s (the longest retention claimed for it)"
        in reasons[f"{pg_schema}.lines"]
    )

    # long is gone: its claim is not renewed, and once it lapses short keeps items 1 s
    await execute(
        postgres_dsn, f"update {pg_schema}_trk.retention_claims set expires_at = now() - interval '1 s'"
    )
    await age_entries(postgres_dsn, pg_schema, "items")
    await run_job(short)
    assert await entries(postgres_dsn, pg_schema, "items") == 0
    claims = await execute(
        postgres_dsn, f"select string_agg(distinct deployment, ',') from {pg_schema}_trk.retention_claims"
    )
    assert claims == [deployment_name(short.redis)], "the lapsed claim was not dropped"


async def test_an_administrators_cleanup_of_every_table_keeps_the_claims(
    postgres_dsn: str, pg_schema: str, redis_url: str
) -> None:
    """The one-argument cleanup of 0.2 (an owner's cron, or a 0.2 sidecar) still
    covers every table, but never below a deployment's live claim."""
    await create_tables(postgres_dsn, pg_schema)
    long = deployment(pg_schema, postgres_dsn, redis_url, "long", 3600.0, ("items",))
    await enable_tracking(deployment(pg_schema, postgres_dsn, redis_url, "x", 1.0, ("items", "lines")))
    await run_job(long)
    await execute(
        postgres_dsn,
        f"insert into {pg_schema}.items (id, name) values (1, 'one')",
        f"insert into {pg_schema}.lines values (1, 1, 'a', 1)",
    )
    await age_entries(postgres_dsn, pg_schema, "items", "lines")
    (deleted,) = await execute(postgres_dsn, f"select {pg_schema}_trk.cleanup('1 second')")
    assert deleted == 1
    assert await entries(postgres_dsn, pg_schema, "items") == 1
    assert await entries(postgres_dsn, pg_schema, "lines") == 0


async def test_a_tracking_schema_of_0_2_is_told_to_be_upgraded_and_enable_keeps_the_history(
    postgres_dsn: str, pg_schema: str, redis_url: str
) -> None:
    """A schema installed by 0.2 (no claims, no scoped cleanup, no expired_by):
    the sidecar reads as before; its cleanup removes nothing (0.2's would cover
    other deployments' tables) and says to run ``cdc tracking enable`` once,
    after which it works and no table's history restarted."""
    await create_tables(postgres_dsn, pg_schema)
    config = deployment(pg_schema, postgres_dsn, redis_url, "old", 1.0, ("items", "lines"))
    await enable_tracking(config)
    trk = f"{pg_schema}_trk"
    await execute(
        postgres_dsn,
        f"drop function {trk}.cleanup(interval, text, text[], interval)",
        f"drop table {trk}.retention_claims",
        f"alter table {trk}.tracked_tables drop column expired_by",
        f"insert into {pg_schema}.items (id, name) values (1, 'one')",
    )
    await age_entries(postgres_dsn, pg_schema, "items")
    job = CleanupJob(config, Pipeline(config))
    await job.run()
    assert job.pipeline.cleanup_error is not None
    assert "installed by a cdc-sync older than 0.3" in job.pipeline.cleanup_error
    assert "cdc tracking enable -c FILE" in job.pipeline.cleanup_error
    assert job.pipeline.metrics.cleanup_failing._value.get() == 1
    assert await entries(postgres_dsn, pg_schema, "items") == 1
    await Daemon(config).run(once=True)  # reads a registry without expired_by

    (before,) = await execute(postgres_dsn, f"select sum(min_valid_version) from {trk}.tracked_tables")
    await enable_tracking(config)
    (after,) = await execute(postgres_dsn, f"select sum(min_valid_version) from {trk}.tracked_tables")
    assert after == before, "enable restarted a table's history"
    await job.run()
    assert job.pipeline.cleanup_error is None and job.pipeline.metrics.cleanup_failing._value.get() == 0
    assert await entries(postgres_dsn, pg_schema, "items") == 0


async def test_a_snapshot_cut_short_says_so_when_it_starts_again(
    postgres_dsn: str,
    pg_schema: str,
    redis_url: str,
    redis_client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A table whose checkpoint says "snapshotting" (the sidecar stopped during
    its snapshot) is snapshotted again, and the log says why: not "no checkpoint yet"."""
    await create_tables(postgres_dsn, pg_schema)
    config = deployment(pg_schema, postgres_dsn, redis_url, "cut", 3600.0, ("items",))
    await enable_tracking(config)
    await Daemon(config).run(once=True)
    await DataManager(redis_client, config.redis).set_checkpoint(f"{pg_schema}.items", 1, "snapshotting")
    caplog.set_level(logging.INFO, logger="cdc")
    await Daemon(config).run(once=True)
    reason = snapshot_reasons(caplog)[f"{pg_schema}.items"]
    assert reason.startswith("its last snapshot did not finish (checkpoint state 'snapshotting')"), reason


def test_the_scope_is_the_configs_tables_and_its_claim_outlives_a_run_missed() -> None:
    config = parse_config(
        config_text("s", "postgresql://u:secret@db/x", "redis://u:pw@r:6380/3", "ns"), "t", {}
    )
    scope = cleanup_scope(config)
    assert scope.deployment == "ns at r:6380/3"
    assert scope.tables == ("s.items", "s.lines")
    assert scope.claim_for == config.source.retention + 2 * config.source.cleanup_interval


async def test_cleanups_running_at_once_never_deadlock(
    postgres_dsn: str, pg_schema: str, redis_url: str
) -> None:
    """Sidecars start together and each runs its cleanup at start: two
    deployments sharing tables, two sidecars each, all at once, several times."""
    await create_tables(postgres_dsn, pg_schema)
    await execute(postgres_dsn, SOLO_DDL.format(s=pg_schema))
    everything = ("items", "lines", "solo")
    await enable_tracking(deployment(pg_schema, postgres_dsn, redis_url, "x", 1.0, everything))
    configs = [
        deployment(pg_schema, postgres_dsn, redis_url, "one", 3600.0, everything),
        deployment(pg_schema, postgres_dsn, redis_url, "two", 1.0, everything[::-1]),
    ]
    jobs = [CleanupJob(config, Pipeline(config)) for config in configs * 2]
    for _ in range(5):
        await execute(
            postgres_dsn, f"update {pg_schema}_trk.retention_claims set expires_at = now() - interval '1 s'"
        )
        await asyncio.gather(*(job.run() for job in jobs))
        assert [job.pipeline.cleanup_error for job in jobs] == [None] * len(jobs)


async def test_cleanups_of_one_deployment_with_every_claim_lapsed_never_deadlock(
    postgres_dsn: str, pg_schema: str, redis_url: str
) -> None:
    """The cleanup function called by eight connections at once, every claim
    lapsed before each round, 300 rounds: the most overlap, which the jobs
    above (a connection each to open first) seldom reach. 0.3's cleanup
    deleted the lapsed claims before renewing its own: two sidecars of one
    deployment each deleted part of them (SKIP LOCKED) and then waited on
    each other to renew the rest (4 to 12 of 2,400 calls deadlocked, measured)."""
    await create_tables(postgres_dsn, pg_schema)
    await execute(postgres_dsn, SOLO_DDL.format(s=pg_schema))
    everything = ("items", "lines", "solo")
    await enable_tracking(deployment(pg_schema, postgres_dsn, redis_url, "x", 1.0, everything))
    tables = tuple(f"{pg_schema}.{name}" for name in everything)
    scopes = [
        CleanupScope("one", tables, 5.0) if i % 2 else CleanupScope("two", tables[::-1], 5.0)
        for i in range(8)
    ]
    connections = [await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) for _ in scopes]
    failures: list[str] = []

    async def clean(conn: psycopg.AsyncConnection[Any], scope: CleanupScope) -> None:
        try:
            await pg_retention.cleanup(conn, f"{pg_schema}_trk", 1.0, scope)
        except psycopg.Error as exc:
            failures.append(f"{scope.deployment}: {exc}")

    try:
        for _ in range(300):
            await execute(
                postgres_dsn,
                f"update {pg_schema}_trk.retention_claims set expires_at = now() - interval '1 s'",
            )
            await asyncio.gather(
                *(clean(conn, scope) for conn, scope in zip(connections, scopes, strict=True))
            )
    finally:
        for conn in connections:
            await conn.close()
    assert failures == []
    [claims] = await execute(
        postgres_dsn,
        f"select array_agg(table_name || ' ' || deployment order by table_name, deployment) from {pg_schema}_trk.retention_claims",
    )
    assert claims == sorted(f"{table} {who}" for table in tables for who in ("one", "two"))
