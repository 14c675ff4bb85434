"""Redis failover under write load: a primary with a replica and three
sentinels; the primary is SIGKILLed while the sidecar applies, a sentinel
promotes the replica, the sidecar reconnects to it, and the killed server
comes back (as an operator's restart would) and is made a replica of the new
primary. Run with and without ``redis.durability``.

Both end with the checks of every fault case (``tests.chaos``: documents
equal rows, a subscriber that followed across holds them, seq gap-free, no
version went backwards in the stream) and an empty dead letter. With
durability nothing is re-read and no sampled ``@v`` ever went down; without
it, the failover is noticed (the primary's replication id changed) and every
table snapshotted again, which is what makes the documents equal the rows
when the old primary took writes to its grave.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis
from redis import exceptions as rex
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from cdc.config import Config, parse_config
from cdc.devsentinel import SentinelGroup
from cdc.devservers import ServerUnavailable, free_port
from publishers.layout import Layout
from publishers.sentinel import sentinel_client
from publishers.settings import SentinelConfig
from tests.cdc.test_faults import Running
from tests.chaos import (
    TEST_CLIENT,
    Follower,
    VersionSampler,
    assert_nothing_lost,
    published,
    wait_published_more,
)
from tests.conftest import unavailable
from tests.e2e import Writers, config_text, create_tables, enable_tracking, wait_for


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    group = SentinelGroup()
    try:
        group.start()
    except ServerUnavailable as exc:
        unavailable(str(exc))
    yield group
    group.cleanup()


def client_of(group: SentinelGroup, *, retrying: bool) -> aioredis.Redis:
    """A client of whichever server the sentinels name the primary; the
    test's own retry on a lost connection (the subscriber under test gets none)."""
    options: dict[str, object] = {"client_name": TEST_CLIENT, "socket_timeout": 5}
    if retrying:
        options["retry"] = Retry(ExponentialBackoff(cap=0.5, base=0.05), 60)
        options["retry_on_error"] = [rex.ConnectionError, rex.TimeoutError, OSError]
    return sentinel_client("redis:///0", SentinelConfig(group.master, group.nodes), options)


@pytest.fixture
async def checking(group: SentinelGroup) -> AsyncIterator[aioredis.Redis]:
    client = client_of(group, retrying=True)
    yield client
    await client.aclose()


def sentinel_config(group: SentinelGroup, dsn: str, schema: str, namespace: str, durable: bool) -> Config:
    nodes = ", ".join(f"127.0.0.1:{port}" for _, port in group.nodes)
    durability = "{replicas: 1, timeout: 500ms}" if durable else "{replicas: 0}"
    health = f"127.0.0.1:{free_port()}"
    text = config_text(schema, dsn, "redis:///0", namespace, lease_ttl="2s", health=health).replace(
        "  url: redis:///0\n",
        f"  url: redis:///0\n  sentinel: {{master: {group.master}, nodes: [{nodes}]}}\n  durability: {durability}\n",
    )
    return parse_config(text, "<test>", {})


async def promoted(group: SentinelGroup, old: int) -> bool:
    port = await asyncio.to_thread(group.primary_port)
    return port != old


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("durable", [True, False], ids=["durable", "not-durable"])
async def test_a_sentinel_failover_under_write_load_loses_nothing(
    group: SentinelGroup,
    checking: aioredis.Redis,
    postgres_dsn: str,
    pg_schema: str,
    namespace: str,
    durable: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = sentinel_config(group, postgres_dsn, pg_schema, namespace, durable)
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    writers = Writers(postgres_dsn, pg_schema, seed=41)
    write_task = asyncio.create_task(writers.run(writers=3, long_transactions=1))
    plain = client_of(group, retrying=False)
    follower = Follower(plain, namespace)
    sampler = VersionSampler(checking, namespace).start()
    running = Running(config)
    try:
        with caplog.at_level(logging.INFO, logger="cdc"):
            await wait_published_more(checking, namespace, 0, 30)
            await wait_published_more(checking, namespace, await published(checking, namespace) + 100, 30)
            old = group.primary_port()
            group.node(old).kill()  # SIGKILL while the sidecar applies
            await wait_for(lambda: promoted(group, old), 30, "a sentinel to promote the replica")
            group.node(old).start()  # back as an operator would bring it: made a replica of the new one
            await wait_published_more(checking, namespace, await published(checking, namespace), 60)
            await wait_published_more(checking, namespace, await published(checking, namespace) + 100, 30)
            writers.stop.set()
            await write_task
            await assert_nothing_lost(
                postgres_dsn, pg_schema, checking, namespace, follower, sampler if durable else None
            )
            assert await checking.xlen(Layout(namespace).deadletter()) == 0
            repairs = [r for r in caplog.records if "re-snapshotting every table" in r.getMessage()]
            assert bool(repairs) != durable, "durable: nothing re-read; otherwise: a re-snapshot"
            running.alive()
            await running.stop()
    finally:
        writers.stop.set()
        await asyncio.gather(write_task, return_exceptions=True)
        await follower.close()
        await sampler.stop()
        if not running.task.done():
            await running.stop()
        await plain.aclose()
