"""Redis failover under write load: a primary with a replica and three
sentinels; the replica is stopped (SIGSTOP) until the primary holds writes
it has not replicated, the primary is SIGKILLed while the sidecar applies
and the replica resumes, a sentinel promotes the replica (which lacks those
writes), the sidecar reconnects to it, and the killed server
comes back (as an operator's restart would) and is made a replica of the new
primary. Run with and without ``redis.durability``.

Both end with the checks of every fault case (``tests.chaos``: documents
equal rows, a subscriber that followed across holds them, seq gap-free, no
version went backwards in the stream) and an empty dead letter. With
durability nothing is re-read: what the old primary took with it was never
acknowledged, and the retried batches write it again. Without it, the
failover is noticed (the primary's replication id changed) and every table
snapshotted again; with that repair disabled every run ended with documents
missing and documents of deleted rows left (3 runs of 3).

Not asserted: that no reader ever saw a document's ``@v`` go down. Both
ways, a reader of the old primary can see writes that the failover then
loses (WAIT holds the writer, not the readers); ``VersionSampler`` saw it in
the durable case (``@v 729 after 1044``) until the retried batch wrote 1044
again. The lease is the default 10 s, longer than the failover: the tracker
goes on from its position in memory, the case that loses changes (a 2 s
lease ran out during the failover, and the table was re-read from its
checkpoint: nothing was lost even without the repair).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis
from redis import exceptions as rex
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from cdc.config import Config, parse_config
from cdc.devsentinel import SentinelGroup
from cdc.devservers import RedisServer, ServerUnavailable, free_port
from publishers.layout import Layout
from publishers.sentinel import sentinel_client
from publishers.settings import SentinelConfig
from tests.cdc.test_faults import Running
from tests.chaos import (
    TEST_CLIENT,
    Follower,
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
    for node in group.data:  # a test that failed with its replica stopped
        if node.proc is not None:
            node.proc.send_signal(signal.SIGCONT)
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
    text = config_text(schema, dsn, "redis:///0", namespace, lease_ttl="10s", health=health).replace(
        "  url: redis:///0\n",
        f"  url: redis:///0\n  sentinel: {{master: {group.master}, nodes: [{nodes}]}}\n  durability: {durability}\n",
    )
    return parse_config(text, "<test>", {})


def replica_of(group: SentinelGroup, primary: int) -> RedisServer:
    return next(node for node in group.data if node.port != primary)


async def lagging_replica(
    group: SentinelGroup,
    primary: int,
    client: aioredis.Redis,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
    durable: bool,
) -> None:
    """Stop the replica (SIGSTOP) and cut its link until the primary holds
    writes it has not sent: 200 more messages, or, with durability, until a batch failed for
    want of the replica's acknowledgement. Well under the sentinels'
    down-after (1 s), or they would not promote it."""
    node = replica_of(group, primary)
    assert node.proc is not None
    before = len(caplog.records)
    node.proc.send_signal(signal.SIGSTOP)
    # Cut its link too: what the replica's socket had already received it
    # would still read once resumed (on loopback that was every write: no
    # run lost anything with the stop alone), so the writes from here on
    # stay on the primary alone.
    await asyncio.to_thread(group.cli, primary, "client", "kill", "type", "replica")
    if durable:
        await wait_for(
            # any write's WAIT (apply calls, a checkpoint, a partitions set...): the primary holds it alone
            lambda: logged(caplog, "replicas acknowledged", since=before),
            5,
            "a WAIT to fall short",
        )
    else:
        await wait_published_more(client, namespace, await published(client, namespace) + 200, 5)


def thaw(group: SentinelGroup, primary: int) -> None:
    node = replica_of(group, primary)
    assert node.proc is not None
    node.proc.send_signal(signal.SIGCONT)


async def logged(caplog: pytest.LogCaptureFixture, text: str, since: int = 0) -> bool:
    return any(
        text in record.getMessage() or text in str(getattr(record, "error", ""))
        for record in caplog.records[since:]
    )


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
    running = Running(config)
    try:
        with caplog.at_level(logging.INFO, logger="cdc"):
            await wait_published_more(checking, namespace, 0, 30)
            await wait_published_more(checking, namespace, await published(checking, namespace) + 100, 30)
            old = group.primary_port()
            await lagging_replica(group, old, checking, namespace, caplog, durable)
            group.node(old).kill()  # SIGKILL while the sidecar applies and the replica lags
            thaw(group, old)
            await wait_for(lambda: promoted(group, old), 30, "a sentinel to promote the replica")
            group.node(old).start()  # back as an operator would bring it: made a replica of the new one
            await wait_published_more(checking, namespace, await published(checking, namespace), 60)
            await wait_published_more(checking, namespace, await published(checking, namespace) + 100, 30)
            writers.stop.set()
            await write_task
            await assert_nothing_lost(postgres_dsn, pg_schema, checking, namespace, follower)
            assert await checking.xlen(Layout(namespace).deadletter()) == 0
            repairs = [r for r in caplog.records if "re-snapshotting every table" in r.getMessage()]
            assert bool(repairs) != durable, "durable: nothing re-read; otherwise: a re-snapshot"
            running.alive()
            await running.stop()
    finally:
        writers.stop.set()
        await asyncio.gather(write_task, return_exceptions=True)
        await follower.close()
        if not running.task.done():
            await running.stop()
        await plain.aclose()
