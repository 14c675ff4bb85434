"""``redis.durability``: an apply call returns only once N replicas hold its
writes; when fewer acknowledge in time the batch fails as transient (the
daemon retries it, its checkpoint held), and a retry that writes nothing
new still waits for the replicas to hold what the failed round wrote."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator

import orjson
import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as ClusterClient

from cdc.devservers import RedisCluster, RedisServer, ServerUnavailable, wait_until
from publishers.errors import RedisUnavailable
from publishers.manager import DataManager
from publishers.model import Change
from publishers.settings import Durability, RedisConfig
from tests.conftest import unavailable


def cli(port: int, *command: str) -> str:
    return subprocess.run(["redis-cli", "-p", str(port), *command], capture_output=True, text=True).stdout


@pytest.fixture
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A primary and its replica, synced."""
    servers: list[RedisServer] = []
    try:
        primary = RedisServer().start()
        servers.append(primary)
        replica = RedisServer(extra=("--replicaof", "127.0.0.1", str(primary.port))).start()
        servers.append(replica)
    except ServerUnavailable as exc:
        unavailable(str(exc))
    wait_until(lambda: "state=online" in cli(primary.port, "info", "replication"), 10, "the replica to sync")
    yield primary, replica
    for server in servers:
        if server.proc is not None:
            os.kill(server.proc.pid, signal.SIGCONT)
    # the replica first: a primary stopped before a lagging replica waits for
    # it up to shutdown-timeout (10 s: the teardown after a SIGSTOPped replica)
    for server in reversed(servers):
        server.cleanup()


@pytest.fixture
async def replica_client(pair: tuple[RedisServer, RedisServer]) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis(port=pair[1].port)
    yield client
    await client.aclose()


def config(primary: RedisServer, replicas: int = 1, timeout: float = 0.2) -> RedisConfig:
    """0.2 s: the tests that expect a WAIT to fall short wait that long for it."""
    return RedisConfig(
        url=primary.url, namespace="du", durability=Durability(replicas=replicas, timeout=timeout)
    )


def changes(first: int, count: int, version: int) -> list[Change]:
    values = lambda key: {"Id": orjson.dumps(key), "Name": orjson.dumps(f"n{key}")}  # noqa: E731
    return [
        Change("public.items", "p", "items", str(k), "U", version, values(k))
        for k in range(first, first + count)
    ]


async def test_an_apply_returns_once_the_replica_holds_its_writes(
    pair: tuple[RedisServer, RedisServer], replica_client: aioredis.Redis
) -> None:
    # A generous WAIT: on a loaded machine 0.2 s fell short once (2 cores, four test suites)
    async with await DataManager.connect(config(pair[0], timeout=10)) as manager:
        for round_ in range(20):
            result = await manager.apply(changes(round_ * 50, 50, 10))
            assert result.published == 50
            last = f"du:{{p}}:items:{round_ * 50 + 49}"
            assert await replica_client.hget(last, "@v") == b"10", f"round {round_}: not on the replica yet"


async def test_too_few_acknowledgements_fail_the_batch_until_the_replica_has_it(
    pair: tuple[RedisServer, RedisServer], replica_client: aioredis.Redis
) -> None:
    primary, replica = pair
    assert replica.proc is not None
    async with await DataManager.connect(config(primary)) as manager:
        os.kill(replica.proc.pid, signal.SIGSTOP)
        batch = changes(0, 100, 10)
        with pytest.raises(
            RedisUnavailable,
            match=r"0 of 1 replicas acknowledged the (partitions sets|apply calls) within 200 ms",
        ):
            await manager.apply(batch)
        # The partitions set is written on the primary and not confirmed: the
        # retry's SADD writes nothing and falls short the same way...
        with pytest.raises(RedisUnavailable, match="0 of 1 replicas"):
            await manager.apply(batch)
        os.kill(replica.proc.pid, signal.SIGCONT)
        # ...and the batch returns only once the replica holds it.
        result = await manager.apply(batch)
        assert (result.published, result.stale) == (100, 0)
        versions = [await replica_client.hget(f"du:{{p}}:items:{k}", "@v") for k in range(100)]
        assert versions == [b"10"] * 100


async def test_more_replicas_than_there_are_never_acknowledge(pair: tuple[RedisServer, RedisServer]) -> None:
    async with await DataManager.connect(config(pair[0], replicas=2)) as manager:
        with pytest.raises(RedisUnavailable, match="1 of 2 replicas"):
            await manager.apply(changes(0, 1, 10))


async def test_without_durability_no_wait_is_sent(pair: tuple[RedisServer, RedisServer]) -> None:
    primary, replica = pair
    assert replica.proc is not None
    async with await DataManager.connect(config(primary, replicas=0)) as manager:
        os.kill(replica.proc.pid, signal.SIGSTOP)
        assert (await manager.apply(changes(0, 10, 10))).published == 10  # returns: nothing waited for


def spread(count: int, version: int) -> list[Change]:
    """One change in each of ``count`` partitions: on a cluster, every node's slots."""
    values = {"Id": b"1", "Name": orjson.dumps(f"n{version}")}
    return [Change("public.items", f"p{k}", "items", "1", "U", version, values) for k in range(count)]


async def test_on_a_cluster_without_replicas_every_round_falls_short(redis_cluster_url: str) -> None:
    """The session cluster has no replicas: each node's WAIT counts 0, and the
    checkpoint's own WAIT too."""
    settings = RedisConfig(
        url=redis_cluster_url, cluster=True, namespace="dc", durability=Durability(replicas=1, timeout=0.05)
    )
    async with await DataManager.connect(settings) as manager:
        with pytest.raises(
            RedisUnavailable, match="0 of 1 replicas acknowledged the (partitions sets|apply calls)"
        ):
            await manager.apply(spread(30, 10))
        with pytest.raises(RedisUnavailable, match="0 of 1 replicas acknowledged the checkpoint"):
            await manager.set_checkpoint("public.items", 10, "streaming")


async def test_on_a_cluster_with_replicas_each_node_waits_for_its_own() -> None:
    """Partitions on all three primaries: the apply returns with every
    document on its primary's replica, and the checkpoint on its node's."""
    try:
        cluster = RedisCluster(replicas=1).start()
    except ServerUnavailable as exc:
        unavailable(str(exc))
    try:
        settings = RedisConfig(
            url=cluster.url, cluster=True, namespace="dc", durability=Durability(replicas=1, timeout=10)
        )
        async with await DataManager.connect(settings) as manager:
            for version in range(1, 6):
                assert (await manager.apply(spread(30, version))).published == 30
                await manager.set_checkpoint("public.items", version, "streaming")
                for k in range(30):
                    key = f"dc:{{p{k}}}:items:1"
                    assert await on_replica(cluster, key, "@v") == str(version), (version, key)
                assert await on_replica(cluster, "dc:@checkpoint:public.items", "version") == str(version)
    finally:
        cluster.cleanup()


async def on_replica(cluster: RedisCluster, key: str, field: str) -> str:
    """``field`` of hash ``key`` as the replica of the slot's primary has it."""
    client = ClusterClient.from_url(cluster.url)
    try:
        await client.initialize()
        primary = client.get_node_from_key(key)
        assert primary is not None
        replicas = [n for n in cluster.nodes if cli(n.port, "role").split()[2:3] == [str(primary.port)]]
        assert len(replicas) == 1, replicas
    finally:
        await client.aclose()
    replica = aioredis.Redis(port=replicas[0].port, single_connection_client=True)
    try:
        await replica.execute_command("READONLY")  # a cluster replica serves reads after it
        value = await replica.hget(key, field)
    finally:
        await replica.aclose()
    return "" if value is None else value.decode()
