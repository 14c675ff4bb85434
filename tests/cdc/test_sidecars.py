"""Several sidecars with the same config: leases spread the tables, a dead
owner's tables are taken over within the lease TTL, and an owner frozen past
its lease is fenced: its late writes are refused, never applied.

Real processes (``python -m cdc.cli run``), real PostgreSQL and Redis.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psycopg
import pytest
import redis.asyncio as aioredis

from cdc.config import Config, RedisConfig, parse_config
from cdc.errors import LeaseLost
from cdc.pipeline import Pipeline
from cdc.tracker import ChangeTracker
from publishers import control, scripts
from publishers.layout import Layout
from publishers.leases import Leases
from publishers.manager import DataManager
from tests.chaos import (
    Follower,
    Proxy,
    Sidecar,
    VersionSampler,
    assert_versions_never_decrease,
    lease_holders,
    published,
    wait_published_more,
)
from tests.e2e import (
    Writers,
    assert_mirrored,
    assert_seq_gap_free,
    create_tables,
    enable_tracking,
    make_config,
    wait_for,
    write_config,
)

APPLY_SHA = scripts.APPLY.sha.encode()
LEASE_TTL = 2.0  # seconds; renewed every LEASE_TTL / 3


async def worker_tables(client: aioredis.Redis, namespace: str) -> dict[str, set[str]]:
    """worker id -> the tables its heartbeat says it runs."""
    out = {}
    async for key in client.scan_iter(match=Layout(namespace).worker("*")):
        tables = await client.hget(key, "tables")
        if tables is not None:
            out[key.decode().rsplit(":", 1)[-1]] = set(filter(None, tables.decode().split(",")))
    return out


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_two_sidecars_spread_the_tables_and_take_over_a_killed_one(
    postgres_dsn: str,
    redis_url: str,
    pg_schema: str,
    namespace: str,
    redis_client: aioredis.Redis,
    tmp_path: Path,
) -> None:
    config_path = write_config(
        tmp_path / "tables.yaml", pg_schema, postgres_dsn, redis_url, namespace, lease_ttl=f"{LEASE_TTL}s"
    )
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace)
    tables = [t.table for t in config.tables]
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    writers = Writers(postgres_dsn, pg_schema, seed=21)
    write_task = asyncio.create_task(writers.run(writers=2, long_transactions=1))
    follower = Follower(redis_client, namespace)
    sidecars = [Sidecar(config_path, tmp_path / f"sidecar{i}.log") for i in range(2)]
    try:
        # Spread: each sidecar owns one of the two tables, and no table is ever
        # run by both (their heartbeats list what they run).
        async def spread() -> bool:
            holders = await lease_holders(redis_client, namespace, tables)
            owners = {next(s.pid for s in sidecars if s.is_worker(h)) for h in holders.values()}
            return len(holders) == len(tables) and len(owners) == 2

        await wait_for(spread, 30, "each sidecar to own one table")
        for _ in range(20):
            running = await worker_tables(redis_client, namespace)
            every = [table for tables_of in running.values() for table in tables_of]
            assert len(every) == len(set(every)), f"a table runs twice: {running}"
            await asyncio.sleep(0.05)

        # SIGKILL one owner: the other takes its table over within the lease TTL
        # plus one renewal period (its heartbeat goes with it, so the survivor's
        # fair share becomes both tables).
        holders = await lease_holders(redis_client, namespace, tables)
        victim = sidecars[0]
        orphaned = next(t for t, h in holders.items() if victim.is_worker(h))
        victim.kill()
        killed_at = time.monotonic()

        async def taken_over() -> bool:
            return sidecars[1].is_worker(
                (await lease_holders(redis_client, namespace, [orphaned])).get(orphaned)
            )

        await wait_for(taken_over, 30, f"{orphaned} to be taken over")
        took = time.monotonic() - killed_at
        assert took <= LEASE_TTL + LEASE_TTL / 3 + 1.0, f"takeover took {took:.1f}s"
        await wait_published_more(redis_client, namespace, await published(redis_client, namespace), 30)
        writers.stop.set()
        await write_task
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace, timeout=30)
        await assert_seq_gap_free(redis_client, namespace, ("items", "lines"))
        await assert_versions_never_decrease(redis_client, namespace)
        await follower.assert_replica_equals_documents(redis_client, namespace)
        assert await sidecars[1].stop() == 0, sidecars[1].log_text()[-3000:]
    finally:
        writers.stop.set()
        await asyncio.gather(write_task, return_exceptions=True)
        await follower.close()
        for sidecar in sidecars:
            sidecar.kill()


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_frozen_owner_is_fenced_when_it_wakes(
    postgres_dsn: str,
    redis_url: str,
    pg_schema: str,
    namespace: str,
    redis_client: aioredis.Redis,
    tmp_path: Path,
) -> None:
    """Two sidecars; the owner of the busy table is frozen (SIGSTOP) past its
    lease while the writers run, with a write of its own still on the way to
    Redis (its link held by a proxy, as a slow network would). The other takes
    the table over and writes; then the stale write arrives and the frozen one
    is resumed (SIGCONT). The stale write is refused (FENCED), the resumed
    sidecar stops the table without moving its checkpoint, no version goes
    backwards, and nothing is lost. Three rounds, ping-ponging the table."""
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace)
    tables = [t.table for t in config.tables]
    lines = f"{pg_schema}.lines"
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxies = [Proxy(redis_port) for _ in range(2)]
    sidecars = []
    for i, proxy in enumerate(proxies):
        url = f"redis://127.0.0.1:{await proxy.start()}/0"
        path = write_config(
            tmp_path / f"tables{i}.yaml", pg_schema, postgres_dsn, url, namespace, lease_ttl=f"{LEASE_TTL}s"
        )
        sidecars.append(Sidecar(path, tmp_path / f"sidecar{i}.log"))
    writers = Writers(postgres_dsn, pg_schema, seed=22)
    write_task = asyncio.create_task(writers.run(writers=3, long_transactions=1))
    follower = Follower(redis_client, namespace)
    sampler = VersionSampler(redis_client, namespace).start()

    def refusals(sidecar: Sidecar) -> int:
        return sum("changes refused (FENCED)" in e.get("msg", "") for e in sidecar.logs())

    def lease_losses(sidecar: Sidecar) -> int:
        return sum(e.get("msg", "").startswith("lease lost") for e in sidecar.logs())

    async def owned_by(owner: Sidecar, count: int) -> bool:
        holders = await lease_holders(redis_client, namespace, tables)
        return sum(owner.is_worker(h) for h in holders.values()) == count and len(holders) == 2

    try:
        await wait_for(lambda: owned_by(sidecars[0], 1), 30, "each sidecar to own one table")
        for _ in range(3):
            holders = await lease_holders(redis_client, namespace, tables)
            index = next(i for i, s in enumerate(sidecars) if s.is_worker(holders[lines]))
            frozen, other, link = sidecars[index], sidecars[1 - index], proxies[index]
            refused, lost = refusals(frozen), lease_losses(frozen)
            await wait_published_more(redis_client, namespace, await published(redis_client, namespace), 30)
            # Its next apply call (the apply script's SHA: lease renewals are
            # EVALSHA calls too), and all after it, is delayed...
            link.hold(at=APPLY_SHA)
            await wait_for(lambda p=link: _true(APPLY_SHA in p.delayed), 30, "an apply call on the way")
            frozen.freeze()  # ...and it is frozen with a batch on the way
            await wait_for(lambda o=other: owned_by(o, 2), 30, "the live sidecar to take every table")
            seq = int(await redis_client.get(Layout(namespace).seq("orders")) or 0)
            await wait_for(lambda s=seq: _seq_above(redis_client, namespace, s), 30, "the new owner to write")
            link.release()  # the stale writes arrive after the new owner's
            frozen.thaw()
            await wait_for(
                lambda f=frozen, n=refused: _true(refusals(f) > n), 30, "the stale writes to be refused"
            )
            await wait_for(lambda f=frozen, n=lost: _true(lease_losses(f) > n), 30, "the lease loss noticed")
            await wait_for(lambda: owned_by(sidecars[0], 1), 30, "the tables to be spread again")
        writers.stop.set()
        await write_task
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace, timeout=30)
        await assert_seq_gap_free(redis_client, namespace, ("items", "lines"))
        await assert_versions_never_decrease(redis_client, namespace)
        await follower.assert_replica_equals_documents(redis_client, namespace)
        await sampler.stop()
        assert not sampler.regressions, sampler.regressions[:5]
        assert await redis_client.xlen(Layout(namespace).deadletter()) == 0
        for sidecar in sidecars:
            assert await sidecar.stop() == 0, sidecar.log_text()[-3000:]
    finally:
        writers.stop.set()
        await asyncio.gather(write_task, return_exceptions=True)
        await follower.close()
        await sampler.stop()
        for sidecar in sidecars:
            sidecar.thaw()
            sidecar.kill()
        for proxy in proxies:
            proxy.release()
            await proxy.close()


async def _true(value: bool) -> bool:
    return value


async def _seq_above(client: aioredis.Redis, namespace: str, seq: int) -> bool:
    return int(await client.get(Layout(namespace).seq("orders")) or 0) > seq


# -- fencing, step by step ---------------------------------------------------------

SHARED_DDL = """
create table {s}.x (id int primary key, n int not null);
create table {s}.y (id int primary key, n int not null);
insert into {s}.x select i, 0 from generate_series(1, 5) i;
insert into {s}.y select i, 0 from generate_series(1, 5) i;
"""


def shared_partition_config(schema: str, postgres_dsn: str, redis_url: str, namespace: str) -> Config:
    """Two tables that write the same partition (one Lua call carries both)."""
    text = f"""
source: {{kind: postgres, dsn: "{postgres_dsn}", tracking_schema: {schema}_trk}}
redis: {{url: "{redis_url}", namespace: {namespace}}}
worker: {{health: null, max_wait: 10ms}}
tables:
  - {{table: {schema}.x, partition: shared, section: x}}
  - {{table: {schema}.y, partition: shared, section: y}}
"""
    return parse_config(text, "<test>", {})


class Owner:
    """One sidecar's pieces, driven by hand: its leases and its pipeline."""

    def __init__(self, name: str, config: Config, manager: DataManager) -> None:
        self.leases = Leases(manager, name, ttl=60)
        self.pipeline = Pipeline(config, manager=manager)
        self.worker = self.pipeline.worker

    async def take(self, table: str) -> ChangeTracker:
        token = await self.leases.acquire(table)
        assert token is not None
        tracker = self.pipeline.tracker(table)
        await tracker.start(token)
        await tracker.resume()
        return tracker


async def test_a_stale_owner_can_neither_write_nor_move_a_checkpoint_past_refused_changes(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, redis_client: aioredis.Redis
) -> None:
    """A owns x and y, which share a partition. A's lease on x runs out while
    A is paused and B takes x and writes. A wakes with changes of x and y in
    one batch: the apply script refuses the whole call (x's token is stale).
    The y changes in it were not applied, so y's checkpoint must not move past
    them: A's y tracker stops (LeaseLost) and whoever runs y next reads them
    again. Nothing is lost."""
    config = shared_partition_config(pg_schema, postgres_dsn, redis_url, namespace)
    x, y = f"{pg_schema}.x", f"{pg_schema}.y"
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        await conn.execute(SHARED_DDL.format(s=pg_schema))
    await enable_tracking(config)
    manager = DataManager(redis_client, config.redis)
    a, b = Owner("A", config, manager), Owner("B", config, manager)
    try:
        await a.pipeline.open()  # described tables, appliers running
        await b.pipeline.open()
        a_x, a_y = await a.take(x), await a.take(y)
        await a_x.snapshot("initial")
        await a_y.snapshot("initial")
        y_checkpoint = (await manager.get_checkpoint(y)).version  # type: ignore[union-attr]

        # A is paused; its lease on x runs out and B takes x over and writes.
        await redis_client.delete(Layout(namespace).lease(x))
        b_x = await b.take(x)
        await _write(postgres_dsn, f"update {pg_schema}.x set n = 1 where id = 1")
        await b_x.poll()
        await b_x.checkpoints.complete(block=True)

        # A wakes up holding changes of both tables: one batch, one call.
        await _write(postgres_dsn, f"update {pg_schema}.x set n = 2 where id = 2")
        await _write(postgres_dsn, f"update {pg_schema}.y set n = 2 where id = 2")
        await a.worker.stop()  # so that both polls land in one batch
        await a_x.poll()
        await a_y.poll()
        a.worker.start()
        with pytest.raises(LeaseLost):
            await a_y.checkpoints.complete(block=True)
        with pytest.raises(LeaseLost):
            await a_x.checkpoints.complete(block=True)
        layout = Layout(namespace)
        assert await redis_client.hget(layout.document("shared", "y", "2"), "n") == b"0", "applied?"
        checkpoint = await manager.get_checkpoint(y)
        assert checkpoint is not None and checkpoint.version == y_checkpoint, "y's checkpoint moved"

        # The next owner of y reads the refused change again from the checkpoint.
        await a.leases.release(y)
        b_y = await b.take(y)
        await b_y.poll()
        await b_y.checkpoints.complete(block=True)
        await b_x.poll()
        await b_x.checkpoints.complete(block=True)
        assert await redis_client.hget(layout.document("shared", "y", "2"), "n") == b"2"
        assert await redis_client.hget(layout.document("shared", "x", "2"), "n") == b"2"
        assert await redis_client.xlen(layout.deadletter()) == 0
    finally:
        await a.pipeline.close()
        await b.pipeline.close()


async def _write(dsn: str, statement: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(statement)  # type: ignore[arg-type]
    await asyncio.sleep(0)


async def test_leases_hand_out_growing_tokens_and_the_holder_is_told(
    redis_url: str, namespace: str, redis_client: aioredis.Redis
) -> None:
    config = make_config("s", "postgresql://x@127.0.0.1/x", redis_url, namespace)
    manager = DataManager(redis_client, config.redis)
    a, b = Leases(manager, "A", ttl=60), Leases(manager, "B", ttl=60)
    first = await a.acquire("s.t")
    assert first is not None and await b.acquire("s.t") is None
    assert await a.acquire("s.t") == first, "re-acquiring one's own lease keeps the token"
    assert await control.table_owners(manager, ["s.t"]) == {"s.t": "A"}
    await redis_client.delete(Layout(namespace).lease("s.t"))  # ran out
    assert not await a.renew("s.t")
    second = await b.acquire("s.t")
    assert second is not None and second > first


async def test_a_fencing_counter_a_failover_took_back_still_hands_out_a_higher_token(
    redis_url: str, namespace: str, redis_client: aioredis.Redis
) -> None:
    """Without redis.durability a failover can promote a replica that lacks
    the counter's last increments: the next token must still be above every
    token handed out before (a partition that recorded one would refuse the
    new owner's writes as FENCED: a cluster run lost a document so)."""
    config = make_config("s", "postgresql://x@127.0.0.1/x", redis_url, namespace)
    manager = DataManager(redis_client, config.redis)
    a, b = Leases(manager, "A", ttl=60), Leases(manager, "B", ttl=60)
    counter = Layout(namespace).lease_fence("s.t")
    first = await a.acquire("s.t")
    assert first is not None
    await redis_client.delete(Layout(namespace).lease("s.t"))  # lost with the failed node,
    await redis_client.set(counter, first - 5)  # and the counter's last increments
    await _clock_past(first)  # a failover takes seconds: the clock has passed any token
    second = await b.acquire("s.t")
    assert second is not None and second > first


async def _clock_past(milliseconds: int) -> None:
    """Until the clock in ms has passed ``milliseconds`` (a few ms at most)."""
    await asyncio.sleep(max(0.0, (milliseconds + 1) / 1000 - time.time()) + 0.001)


async def test_the_worker_registry_counts_live_sidecars_only(
    redis_url: str, namespace: str, redis_client: aioredis.Redis
) -> None:
    """Sidecars count each other in ``ns:@workers`` (not by a SCAN of the
    keyspace): an entry lives as long as its last renewal's TTL, a clean stop
    removes it, and expired entries are dropped."""
    manager = DataManager(redis_client, RedisConfig(url=redis_url, namespace=namespace))
    for worker_id, ttl in (("a", 0.3), ("b", 30.0)):
        await manager.heartbeat(worker_id, {"tables": worker_id}, ttl=ttl)
        assert await control.keep_alive(manager, worker_id, ttl)
    assert await control.live_workers(manager) == {"a", "b"}
    assert [(w["id"], w["tables"]) for w in await control.workers(manager)] == [("a", "a"), ("b", "b")]

    deadline = time.monotonic() + 5
    while await control.live_workers(manager) != {"b"}:
        assert time.monotonic() < deadline, "a's registration did not expire"
        await asyncio.sleep(0.05)
    assert not await control.keep_alive(manager, "a", 0.3)  # its heartbeat is gone: write it whole
    await control.remove_heartbeat(manager, "a")
    await control.remove_heartbeat(manager, "b")
    assert await control.live_workers(manager) == set() and await control.workers(manager) == []
    assert await redis_client.zcard(Layout(namespace).workers()) == 0
