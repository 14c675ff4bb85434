"""The Lua script registry (publishers.scripts): every ``.lua`` file is
registered, documented and loadable, on a single server and on a cluster, and
a script cache flushed between calls is survived (NOSCRIPT -> load -> retry)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib import resources

import pytest
from redis.asyncio.cluster import RedisCluster

from cdc.config import RedisConfig
from publishers import connection, scripts
from publishers.connection import RedisClient
from publishers.layout import Layout


@pytest.fixture
async def client(redis_config: RedisConfig) -> AsyncIterator[RedisClient]:
    client = await connection.connect(redis_config)
    yield client
    await connection.close_client(client)


async def _flush(client: RedisClient) -> None:
    await client.execute_command("SCRIPT FLUSH")  # every primary of a cluster


async def _known_everywhere(client: RedisClient, sha: str) -> bool:
    if isinstance(client, RedisCluster):
        nodes = client.get_primaries()
        replies = [await client.execute_command("SCRIPT EXISTS", sha, target_nodes=n) for n in nodes]
        return all(reply == [1] for reply in replies)
    return bool((await client.script_exists(sha))[0])


def test_every_lua_file_is_registered_and_documented() -> None:
    folder = resources.files("publishers").joinpath("lua")
    files = {entry.name.removesuffix(".lua") for entry in folder.iterdir() if entry.name.endswith(".lua")}
    assert files == set(scripts.REGISTRY)
    for script in scripts.REGISTRY.values():
        text = script.text.decode()
        body = text.split("\n", 1)[1] if text.startswith("#!") else text  # a shebang must stay first
        assert body.startswith(("--", "--[[")), script.name
        assert "KEYS[1]" in text or "KEYS " in text, script.name
        assert "Returns" in text and "atomic" in text.lower(), script.name  # what, and why a script


async def test_every_registered_script_loads(client: RedisClient) -> None:
    await _flush(client)
    for script in scripts.REGISTRY.values():
        await scripts.load(client, script)
        assert await _known_everywhere(client, script.sha), script.name


async def test_a_flushed_script_is_loaded_again(client: RedisClient, namespace: str) -> None:
    workers = Layout(namespace).workers()
    await scripts.run(client, scripts.REGISTER_WORKER, [workers], ["w1", "60000"])
    await _flush(client)
    assert not await _known_everywhere(client, scripts.LIVE_WORKERS.sha)
    assert await scripts.run(client, scripts.LIVE_WORKERS, [workers], []) == [b"w1"]
    await _flush(client)
    assert await scripts.run(client, scripts.REGISTER_WORKER, [workers], ["w1", "0"]) == 1


async def test_a_pipelined_round_survives_a_flush(client: RedisClient, namespace: str) -> None:
    """Lease renewals go out together (one pipeline, or one call per key on a
    cluster, where the keys span the masters); only the refused ones are retried."""
    layout = Layout(namespace)
    tables = [f"s.t{i}" for i in range(12)]
    for table in tables:
        keys = [layout.lease(table), layout.lease_fence(table)]
        assert await scripts.run(client, scripts.LEASE_ACQUIRE, keys, ["w1", "60000", "1"]) is not None
    await _flush(client)
    calls = [([layout.lease(table)], ["w1", "60000"]) for table in tables]
    assert await scripts.run_many(client, scripts.LEASE_RENEW, calls) == [1] * len(tables)
    assert await scripts.run_many(client, scripts.LEASE_RELEASE, calls) == [1] * len(tables)
