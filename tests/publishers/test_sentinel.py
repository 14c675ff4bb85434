"""Redis Sentinel as a target: the sidecar's client finds the primary through
the sentinels, with an ACL user and password on both, follows a failover to
the promoted replica, and never shows a password when something is wrong."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import orjson
import pytest

from cdc.devsentinel import SentinelGroup
from cdc.devservers import ServerUnavailable, wait_until
from publishers.errors import ConnectError, RedisUnavailable
from publishers.manager import DataManager
from publishers.model import Change
from publishers.settings import RedisConfig, SentinelConfig
from tests.conftest import unavailable

PASSWORD = "Kp4qX7310vZ"
SENTINEL_PASSWORD = "Wd2yJ5518hQ"


def started() -> Iterator[SentinelGroup]:
    group = SentinelGroup(password=PASSWORD, sentinel_password=SENTINEL_PASSWORD)
    try:
        group.start()
    except ServerUnavailable as exc:
        unavailable(str(exc))
    yield group
    group.cleanup()


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    """Shared by the tests that leave the primary alone (a group takes ~7 s to start)."""
    yield from started()


@pytest.fixture
def doomed() -> Iterator[SentinelGroup]:
    """A group of its own, for a test that kills its primary."""
    yield from started()


def config(
    group: SentinelGroup, *, password: str = PASSWORD, sentinel_password: str = SENTINEL_PASSWORD
) -> RedisConfig:
    sentinel = SentinelConfig(group.master, group.nodes, f"redis://cdc:{sentinel_password}@")
    return RedisConfig(url=f"redis://cdc:{password}@/0", sentinel=sentinel, namespace="st")


@pytest.fixture
async def manager(group: SentinelGroup) -> AsyncIterator[DataManager]:
    manager = await DataManager.connect(config(group))
    yield manager
    await manager.close()


def change(key: int, version: int) -> Change:
    values = {"Id": orjson.dumps(key), "Name": orjson.dumps(f"n{key}")}
    return Change("public.items", "p", "items", str(key), "U", version, values)


async def test_the_primary_is_reached_through_the_sentinels_with_an_acl_user_on_both(
    group: SentinelGroup, manager: DataManager
) -> None:
    result = await manager.apply([change(1, 10)])
    assert result.published in (0, 1)  # 0: another test of the module wrote it first
    assert await manager.document("p", "items", "1") is not None
    replica = group.data[1].port
    wait_until(
        lambda: group.cli(replica, "--user", "cdc", "hget", "st:{p}:items:1", "@v").strip() == "10",
        10,
        "the replica to hold the document",
    )


async def test_after_the_primary_is_killed_the_promoted_replica_takes_the_writes(
    doomed: SentinelGroup,
) -> None:
    group = doomed
    manager = await DataManager.connect(config(group))
    try:
        await promoted_and_written(group, manager)
    finally:
        await manager.close()


async def promoted_and_written(group: SentinelGroup, manager: DataManager) -> None:
    await manager.apply([change(1, 10)])
    old = group.primary_port()
    group.node(old).kill()
    deadline = time.monotonic() + 30
    while True:  # what the daemon does: a batch that fails on a transient error is retried
        try:
            result = await manager.apply([change(2, 20)])
            break
        except RedisUnavailable:
            assert time.monotonic() < deadline, "no primary took the writes within 30 s"
    assert result.published == 1
    assert group.primary_port() != old
    assert await manager.document("p", "items", "1") is not None  # replicated before the kill
    assert await manager.document("p", "items", "2") is not None


@pytest.mark.parametrize("wrong", ["sentinel", "primary"])
async def test_a_wrong_password_is_a_connect_error_that_never_shows_one(
    group: SentinelGroup, wrong: str
) -> None:
    bad = "Zz9mT4404uB"
    settings = config(group, sentinel_password=bad) if wrong == "sentinel" else config(group, password=bad)
    with pytest.raises(ConnectError) as raised:
        await DataManager.connect(settings)
    message = str(raised.value)
    assert raised.value.exit_code == 3
    for secret in (bad, PASSWORD, SENTINEL_PASSWORD):
        assert secret not in message
    assert f"master '{group.master}' through the sentinels at 127.0.0.1:{group.watchers[0].port}" in message
    assert ("No master found" if wrong == "sentinel" else "invalid username-password pair") in message


@pytest.fixture(scope="module")
def tls_group() -> Iterator[SentinelGroup]:
    group = SentinelGroup(password=PASSWORD, sentinel_password=SENTINEL_PASSWORD, tls=True)
    try:
        group.start()
    except ServerUnavailable as exc:
        unavailable(str(exc))
    yield group
    group.cleanup()


async def test_tls_and_acl_on_both_the_sentinels_and_the_primary(tls_group: SentinelGroup) -> None:
    """Every server listens on TLS only; the URLs carry the CA as redis-py's ``ssl_ca_certs``."""
    ca = f"ssl_ca_certs={tls_group.ca}"
    sentinel = SentinelConfig(tls_group.master, tls_group.nodes, f"rediss://cdc:{SENTINEL_PASSWORD}@?{ca}")
    settings = RedisConfig(url=f"rediss://cdc:{PASSWORD}@/0?{ca}", sentinel=sentinel, namespace="tls")
    async with await DataManager.connect(settings) as manager:
        assert (await manager.apply([change(1, 10)])).published == 1
        assert await manager.document("p", "items", "1") is not None
    plain = SentinelConfig(tls_group.master, tls_group.nodes, f"redis://cdc:{SENTINEL_PASSWORD}@")
    with pytest.raises(ConnectError) as raised:  # a plain connection to a TLS sentinel
        await DataManager.connect(RedisConfig(url=f"rediss://cdc:{PASSWORD}@/0?{ca}", sentinel=plain))
    assert PASSWORD not in str(raised.value) and SENTINEL_PASSWORD not in str(raised.value)
