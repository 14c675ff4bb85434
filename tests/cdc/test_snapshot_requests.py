"""A tracker's snapshot requests against a real Redis (``cdc.snapshot_requests``):
one asked for while a snapshot runs is another after it, the stored request
that snapshot serves is not, and a stored request made meanwhile outlives it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from cdc.config import RedisConfig
from cdc.errors import SourceUnavailable
from cdc.snapshot_requests import SnapshotRequests
from publishers import control
from publishers.manager import DataManager

TABLE = "s.t"


@pytest.fixture
async def manager(redis_url: str, namespace: str) -> AsyncIterator[DataManager]:
    client = aioredis.Redis.from_url(redis_url)
    yield DataManager(client, RedisConfig(url=redis_url, namespace=namespace))
    await client.aclose()


def requests_of(manager: DataManager) -> SnapshotRequests:
    return SnapshotRequests(manager, TABLE, wake=lambda: None)


async def cdc_snapshot_asked(manager: DataManager) -> tuple[SnapshotRequests, str]:
    """``cdc snapshot`` stored a request, and the balancer forwarded it: the
    tracker's requests, and the stored text."""
    await control.request_snapshot(manager, TABLE)
    stored = await control.snapshot_request(manager, TABLE)
    assert stored is not None
    requests = requests_of(manager)
    assert requests.ask("requested by cdc snapshot", stored=stored)
    return requests, stored


async def test_a_request_made_while_a_snapshot_runs_is_another_snapshot_after_it(
    manager: DataManager,
) -> None:
    requests = requests_of(manager)
    requests.ask("no checkpoint yet")
    reasons: list[str] = []

    async def snapshot(reason: str) -> None:
        reasons.append(reason)
        assert requests.ask("Redis failed over"), "a failover during the snapshot must be heard"

    await requests.serve(snapshot)
    assert reasons == ["no checkpoint yet"]
    assert requests.pending == "Redis failed over", (
        "the failover's snapshot was absorbed by one begun before it"
    )


async def test_the_stored_request_a_snapshot_serves_is_one_snapshot_and_is_removed(
    manager: DataManager,
) -> None:
    requests, stored = await cdc_snapshot_asked(manager)

    async def snapshot(reason: str) -> None:  # the balancer forwards it every round meanwhile
        assert not requests.ask("requested by cdc snapshot", stored=stored)

    await requests.serve(snapshot)
    assert requests.pending is None, "one cdc snapshot ran twice"
    assert await control.snapshot_request(manager, TABLE) is None


async def test_a_stored_request_made_while_a_snapshot_runs_outlives_it(manager: DataManager) -> None:
    requests, first = await cdc_snapshot_asked(manager)

    async def snapshot(reason: str) -> None:
        await asyncio.sleep(0.01)  # (time.time() moves: another text)
        await control.request_failover_snapshots(manager, [TABLE])

    await requests.serve(snapshot)
    after = await control.snapshot_request(manager, TABLE)
    assert after is not None and after.startswith(control.FAILOVER_REQUEST), after
    assert requests.ask("Redis failed over", stored=after), "the next round's forward must ask again"


async def test_a_snapshot_that_fails_keeps_its_request(manager: DataManager) -> None:
    requests, stored = await cdc_snapshot_asked(manager)

    async def snapshot(reason: str) -> None:
        raise SourceUnavailable("the database went away (test)")

    with pytest.raises(SourceUnavailable):
        await requests.serve(snapshot)
    assert requests.pending == "requested by cdc snapshot"
    assert await control.snapshot_request(manager, TABLE) == stored


async def test_a_failover_request_does_not_replace_one_already_there(manager: DataManager) -> None:
    await control.request_failover_snapshots(manager, [TABLE])
    first = await control.snapshot_request(manager, TABLE)
    await asyncio.sleep(0.01)
    await control.request_failover_snapshots(manager, [TABLE, "s.other"])
    assert await control.snapshot_request(manager, TABLE) == first, "two sidecars' requests: two snapshots"
    assert await control.snapshot_requests(manager, [TABLE, "s.other", "s.none"]) == {
        TABLE: first,
        "s.other": await control.snapshot_request(manager, "s.other"),
    }


async def test_a_cdc_snapshot_request_does_not_replace_a_failovers(manager: DataManager) -> None:
    """A key range asked for meanwhile would be served as a range only: the
    failover's whole snapshot, from the start, serves it too."""
    await control.request_failover_snapshots(manager, [TABLE])
    failover = await control.snapshot_request(manager, TABLE)
    await control.request_snapshot(manager, TABLE)
    assert await control.snapshot_request(manager, TABLE) == failover
