"""Tables change shape while the sidecar runs: one DDL step at a time on a
real PostgreSQL, with writers running on both tables throughout.

After each step, the writers pause and a user's checks must hold within 45 s:
the documents equal the rows (every column, untouched rows included; dropped
columns gone), every partition's seq is gap-free, and the one sidecar
process (a ``Daemon`` running as ``cdc run`` does) is still running. While
``items`` is broken (renamed away, dropped, tracking off), ``lines`` keeps
streaming, and ``items`` is named, with its reason, as degraded.

The same steps on the in-memory source, in seconds each, are in
``tests/cdc/test_table_failures.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import psycopg
import pytest
import redis.asyncio as aioredis
from psycopg.conninfo import make_conninfo

from cdc.config import Config
from cdc.daemon import Daemon
from cdc.sources import make_source
from cdc.sources.pg_tracking import trigger_names
from publishers.layout import Layout
from tests.e2e import (
    ITEMS_DDL,
    Writers,
    assert_mirrored,
    assert_seq_gap_free,
    create_tables,
    enable_tracking,
    make_config,
    wait_for,
)

FOLLOWED = 45.0  # seconds within which documents must equal rows again after a step


class Run:
    """The sidecar, the writers and the checks of one walk through the steps."""

    def __init__(self, dsn: str, schema: str, config: Config, client: aioredis.Redis, namespace: str) -> None:
        self.dsn, self.schema, self.config = dsn, schema, config
        self.client, self.namespace = client, namespace
        tolerate = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn)
        self.writers = Writers(dsn, schema, seed=81, tolerate=tolerate)
        self.daemon = Daemon(config)
        self.sidecar: asyncio.Task[None] | None = None
        self.write_task: asyncio.Task[None] | None = None
        self.marker = 1000
        self.since = time.monotonic()  # when the step's DDL began
        self.timings: dict[str, float] = {}  # step -> seconds from its DDL to documents equal to rows

    async def start(self) -> None:
        self.write_task = asyncio.create_task(self.writers.run(writers=2, long_transactions=1))
        self.sidecar = asyncio.create_task(self.daemon.run(), name="sidecar")
        await self.under_load()
        await self.settled("start-up (initial snapshot)")

    def begin(self) -> None:
        self.since = time.monotonic()

    async def sql(self, statement: str) -> None:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute(statement.format(s=self.schema))

    async def tracking(self, action: str) -> None:
        """``cdc tracking enable|disable --table <schema>.items``."""
        source = make_source(self.config.source)
        await source.connect()
        try:
            items = [self.config.table(f"{self.schema}.items")]
            await (source.tracking_enable if action == "enable" else source.tracking_disable)(items)
        finally:
            await source.close()

    async def under_load(self) -> None:
        """Let the writers commit a few more transactions under the new shape."""
        before = self.writers.transactions
        await wait_for(self._wrote_since(before, 20), 30, "20 writer transactions")

    def _wrote_since(self, before: int, count: int) -> Callable[[], Awaitable[bool]]:
        async def wrote() -> bool:
            return self.writers.transactions >= before + count

        return wrote

    async def settled(self, step: str) -> None:
        """Writers paused: documents equal rows within 45 s, seq gap-free, the sidecar alive."""
        self.writers.go.clear()
        try:
            await assert_mirrored(self.dsn, self.schema, self.client, self.namespace, timeout=FOLLOWED)
        except AssertionError as exc:
            raise AssertionError(f"after {step}: {exc}") from None
        self.timings[step] = time.monotonic() - self.since
        await assert_seq_gap_free(self.client, self.namespace, ("items", "lines"))
        self.alive(step)
        self.writers.go.set()

    def alive(self, step: str) -> None:
        assert self.sidecar is not None and not self.sidecar.done(), f"the sidecar stopped at {step}"

    async def degraded(self, step: str, because: str) -> None:
        """``items`` named degraded with ``because``; ``lines`` keeps streaming meanwhile."""
        items = f"{self.schema}.items"

        async def named() -> bool:
            tables = self.daemon.readyz()[1]["tables"]
            return isinstance(tables, dict) and because in str(tables.get(items, ""))

        await wait_for(named, 30, f"{items} degraded with {because!r} after {step}")
        assert self.daemon.healthz()[0], f"/healthz must stay 200 (liveness) after {step}"
        self.marker += 1
        await self.sql(f"insert into {{s}}.lines values ({self.marker}, 1, 'marker', 1)")
        key = Layout(self.namespace).document("orders", "lines", f"{self.marker}-1")

        async def arrived() -> bool:
            return bool(await self.client.exists(key))

        await wait_for(arrived, 15, f"lines to keep streaming after {step}")
        self.alive(step)

    async def stop_writers(self) -> None:
        self.writers.go.set()
        self.writers.stop.set()
        if self.write_task is not None:
            await self.write_task

    async def stop(self) -> None:
        await self.stop_writers()
        self.daemon.request_stop()
        if self.sidecar is not None:
            await asyncio.wait_for(self.sidecar, 60)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_every_ddl_step_under_load_ends_with_documents_equal_to_rows(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, redis_client: aioredis.Redis
) -> None:
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace, max_batch_size=200)
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    run = Run(postgres_dsn, pg_schema, config, redis_client, namespace)
    capture, _, _ = trigger_names(f"{pg_schema}_trk")
    await run.start()
    try:
        steps: list[tuple[str, list[str]]] = [
            ("add column", ["alter table {s}.items add column d integer"]),
            ("add column with a default", ["alter table {s}.items add column e text default 'dflt'"]),
            ("drop column", ["alter table {s}.items drop column d"]),
            ("rename column", ["alter table {s}.items rename column e to e2"]),
            ("retype column", ["alter table {s}.items alter column big type numeric(30, 0)"]),
            (
                "drop and add a column in one",
                ["alter table {s}.items drop column e2, add column e2 text default 'x'"],
            ),
            ("a reserved column name", ['alter table {s}.items add column "@flag" boolean default true']),
        ]
        for step, statements in steps:
            run.begin()
            for statement in statements:
                await run.sql(statement)
            await run.under_load()
            await run.settled(step)

        run.begin()
        await run.sql("alter table {s}.items rename to items_away")
        await run.degraded("rename table", "no such table")
        await run.sql("alter table {s}.items_away rename to items")
        await run.under_load()
        await run.settled("rename table and back")

        run.begin()
        await run.sql("drop table {s}.items")
        await run.degraded("drop table", "no such table")
        await run.sql(ITEMS_DDL)
        await run.sql("insert into {s}.items (id, name) values (9999, 'before tracking')")
        await run.degraded("create table again", "tracking")
        await run.tracking("enable")
        await run.under_load()
        await run.settled("drop table, create it again, tracking enable")

        run.begin()
        await run.tracking("disable")
        await run.degraded("tracking disable", "not enabled")
        await run.tracking("enable")
        await run.under_load()
        await run.settled("tracking disable, then enable")

        run.begin()
        await run.sql(f"alter table {{s}}.items disable trigger {capture}")
        await run.degraded("capture trigger disabled", capture)
        await run.tracking("enable")
        await run.under_load()
        await run.settled("capture trigger disabled, then tracking enable")

        run.begin()
        await run.stop_writers()
        await run.settled("the writers' last transactions")
    finally:
        await run.stop()
    # seconds from each step's DDL (writers running) to documents equal to rows
    # (writers paused meanwhile): `pytest -s` shows them
    print("\n".join(f"{seconds:6.1f} s  {step}" for step, seconds in run.timings.items()))


@pytest.mark.timeout(300)
async def test_a_revoked_permission_degrades_the_table_until_granted_again(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, redis_client: aioredis.Redis
) -> None:
    """The sidecar runs as a role with only what it needs to read; revoking its
    SELECT on one table degrades that table alone, naming the permission, and
    granting it back recovers it, with what was written meanwhile."""
    role = f"cdc_reader_{namespace}"
    admin = make_config(pg_schema, postgres_dsn, redis_url, namespace)
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(admin)
    grants = [
        f"create role {role} login",
        f"grant usage on schema {{s}}, {{s}}_trk to {role}",
        f"grant select on all tables in schema {{s}}, {{s}}_trk to {role}",
    ]
    reader = make_config(pg_schema, make_conninfo(postgres_dsn, user=role), redis_url, namespace)
    run = Run(postgres_dsn, pg_schema, reader, redis_client, namespace)
    for statement in grants:
        await run.sql(statement)
    try:
        await run.start()
        await run.sql(f"revoke select on {{s}}.items from {role}")
        await run.degraded("SELECT revoked", "permission denied")
        await run.sql(f"grant select on {{s}}.items to {role}")
        await run.under_load()
        await run.settled("SELECT granted again")
        await run.stop_writers()
        await run.settled("the writers' last transactions")
    finally:
        await run.stop()
        await run.sql(f"drop owned by {role}")
        await run.sql(f"drop role {role}")
