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

from cdc.devservers import RedisServer, ServerUnavailable, wait_until
from publishers.errors import CdcError, RedisUnavailable
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
            RedisUnavailable, match=r"0 of 1 replicas acknowledged the apply calls within 200 ms"
        ):
            await manager.apply(batch)
        # Applied on the primary: the retry finds every change stale and writes nothing...
        with pytest.raises(RedisUnavailable, match="0 of 1 replicas"):
            await manager.apply(batch)
        os.kill(replica.proc.pid, signal.SIGCONT)
        # ...yet it returns only once the replica holds what the first try wrote.
        result = await manager.apply(batch)
        assert (result.published, result.stale) == (0, 100)
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


async def test_durability_on_a_cluster_is_refused(redis_cluster_url: str) -> None:
    settings = RedisConfig(url=redis_cluster_url, cluster=True, durability=Durability(replicas=1))
    with pytest.raises(CdcError, match="not supported on a Redis Cluster yet"):
        await DataManager.connect(settings)
