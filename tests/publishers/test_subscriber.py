"""The subscriber client against real Redis (one server and a cluster): late
start, history from a seq, gaps filled from the stream, falling off a trimmed
stream, patches that do not fit, a concurrent writer, the blocking wrapper.
Each ends with the replica equal to the documents in Redis."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import jsonpatch
import jsonschema
import orjson
import pytest
from redis.asyncio.cluster import RedisCluster

from cdc.config import RedisConfig
from publishers.connection import close_client, connect
from publishers.errors import CdcError, RedisUnavailable
from publishers.manager import DataManager
from publishers.messages import message_schema
from publishers.model import Change
from publishers.subscriber import BlockingSubscriber, Subscriber

P = "app{1}"  # a partition value that needs encoding inside keys
VALIDATOR = jsonschema.Draft202012Validator(message_schema())


def change(section: str, key: str, version: int, op: str = "U", **values: Any) -> Change:
    encoded = None if op == "D" else {c: orjson.dumps(v) for c, v in values.items()}
    return Change(f"dbo.{section}", P, section, key, op, version, encoded)  # type: ignore[arg-type]


def batch(version: int, size: int = 5, section: str = "alpha") -> list[Change]:
    """Inserts, updates and deletes over a small key space, all at ``version``+i."""
    out = []
    for i in range(size):
        key = str((version + i) % 7)
        if (version + i) % 5 == 0:
            out.append(change(section, key, version + i, "D"))
        else:
            out.append(change(section, key, version + i, Price=f"{version + i}.00", Big=2**60 + version))
    return out


@pytest.fixture
async def manager(redis_config: RedisConfig) -> AsyncIterator[DataManager]:
    manager = await DataManager.connect(redis_config)
    yield manager
    await manager.close()


async def in_redis(manager: DataManager) -> dict[str, dict[str, Any]]:
    sections = await _sections(manager)
    found = {s: await manager.documents(P, s) for s in sections}
    return {s: docs for s, docs in found.items() if docs}


async def _sections(manager: DataManager) -> list[str]:
    return [s for s in ("alpha", "beta") if P in await manager.partitions(s)]


def replica(subscriber: Subscriber) -> dict[str, dict[str, Any]]:
    return {s: docs for s, docs in subscriber.replica.items() if docs}


async def catch_up(subscriber: Subscriber, manager: DataManager, timeout: float = 10) -> list[dict[str, Any]]:
    """Poll until the subscriber has read up to the partition's seq; the messages it delivered."""
    target = int(await manager.client.get(manager.layout.seq(P)) or 0)
    delivered: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while subscriber.position < target:
            delivered += await subscriber.poll(block=0.2)
    for message in delivered:
        VALIDATOR.validate(message)
    return delivered


async def test_a_late_subscriber_loads_then_follows(manager: DataManager, redis_config: RedisConfig) -> None:
    for v in (10, 20, 30):
        await manager.apply(batch(v) + batch(v, section="beta"))
    subscriber = Subscriber(manager.client, redis_config.namespace, P)
    await subscriber.start()
    loaded = subscriber.seq
    assert loaded > 0 and replica(subscriber) == await in_redis(manager)
    for v in (40, 50):
        await manager.apply(batch(v) + batch(v, section="beta"))
    delivered = await catch_up(subscriber, manager)
    assert [m["seq"] for m in delivered] == list(range(loaded + 1, subscriber.seq + 1))
    assert replica(subscriber) == await in_redis(manager)


async def test_from_seq_replays_history_without_applying_it_twice(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    for v in (10, 20, 30):
        await manager.apply(batch(v))
    subscriber = Subscriber(manager.client, redis_config.namespace, P, from_seq=2)
    await subscriber.start()
    await manager.apply(batch(40))
    delivered = await catch_up(subscriber, manager)
    assert [m["seq"] for m in delivered] == list(range(2, subscriber.seq + 1))
    assert subscriber.reloads == 0
    assert replica(subscriber) == await in_redis(manager)


async def test_after_replaced_data_every_message_is_delivered_whatever_from_seq_was(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    """from_seq places the start only: once Redis restarted empty, the new
    data's seq starts again from 1, and holding back every message below the
    old from_seq would hide the new data's changes for as long as that takes."""
    for v in (10, 20, 30):
        await manager.apply(batch(v))
    current = int(await manager.client.get(manager.layout.seq(P)))
    subscriber = Subscriber(manager.client, redis_config.namespace, P, from_seq=current)
    await subscriber.start()
    assert [m["seq"] for m in await catch_up(subscriber, manager)] == [current]
    async for key in manager.client.scan_iter(match=f"{redis_config.namespace}:*"):
        await manager.client.delete(key)  # Redis restarted empty
    await manager.apply(batch(40))
    async with asyncio.timeout(10):  # reloads on the replaced data
        while subscriber.reloads == 0:
            await subscriber.poll(block=0.2)
    reloaded_at = subscriber.seq
    await manager.apply(batch(50))
    delivered = await catch_up(subscriber, manager)
    assert subscriber.seq < current  # the new data's seqs are all below the old from_seq
    assert [m["seq"] for m in delivered] == list(range(reloaded_at + 1, subscriber.seq + 1))
    assert delivered  # (the old code delivered none of them)
    assert replica(subscriber) == await in_redis(manager)


async def test_a_from_seq_past_the_next_message_is_refused_at_start(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    await manager.apply(batch(10))
    current = int(await manager.client.get(manager.layout.seq(P)))
    waiting = Subscriber(manager.client, redis_config.namespace, P, from_seq=current + 1)
    await waiting.start()  # the next message's seq: it waits for it
    await manager.apply(batch(20))
    assert [m["seq"] for m in await catch_up(waiting, manager)][0] == current + 1
    ahead = Subscriber(manager.client, redis_config.namespace, P, from_seq=current + 100)
    with pytest.raises(CdcError, match=f"is at seq {current + 5}, so its next message is seq {current + 6}"):
        await ahead.start()


async def test_falling_off_a_trimmed_stream_reloads(manager: DataManager, redis_config: RedisConfig) -> None:
    await manager.apply(batch(10))
    reloaded: list[int] = []
    subscriber = Subscriber(manager.client, redis_config.namespace, P, on_reload=reloaded.append)
    await subscriber.start()
    for v in (20, 30, 40):
        await manager.apply(batch(v))
    await manager.client.xtrim(manager.layout.stream(P), maxlen=2, approximate=False)
    delivered = await catch_up(subscriber, manager)
    assert subscriber.reloads == 1 and reloaded == [subscriber.seq]
    assert [m["seq"] for m in delivered] == []  # the lost ones cannot be delivered; the reload says so
    assert replica(subscriber) == await in_redis(manager)
    await manager.apply(batch(50))
    assert len(await catch_up(subscriber, manager)) > 0
    assert replica(subscriber) == await in_redis(manager)


async def test_entries_missing_from_the_stream_reload(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    subscriber = Subscriber(manager.client, redis_config.namespace, P)
    await subscriber.start()
    for v in (10, 20):
        await manager.apply(batch(v))
    await manager.client.xdel(manager.layout.stream(P), "3-0", "4-0")
    delivered = await catch_up(subscriber, manager)
    assert [m["seq"] for m in delivered] == [1, 2]  # what came before the hole is still delivered
    assert subscriber.reloads == 1
    assert replica(subscriber) == await in_redis(manager)


async def test_a_gap_in_what_was_read_is_filled_from_the_stream(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    client = await connect(redis_config)
    try:
        real_xread = client.xread

        async def lossy_xread(*args: Any, **kwargs: Any) -> Any:
            """Drops the 2nd entry of every reply, as a lossy transport would."""
            reply = await real_xread(*args, **kwargs)
            for item in reply or []:
                entries = item[1] if isinstance(item, list) else item
                if len(entries) > 2:
                    del entries[1]
            return reply

        client.xread = lossy_xread  # type: ignore[method-assign]
        subscriber = Subscriber(client, redis_config.namespace, P)
        await subscriber.start()
        for v in (10, 20):
            await manager.apply(batch(v))
        delivered = await catch_up(subscriber, manager)
        assert [m["seq"] for m in delivered] == list(range(1, subscriber.seq + 1))
        assert subscriber.reloads == 0
        assert replica(subscriber) == await in_redis(manager)
    finally:
        await close_client(client)


async def test_losing_the_position_never_applies_a_message_twice(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    subscriber = Subscriber(manager.client, redis_config.namespace, P)
    await subscriber.start()
    for v in (10, 20):
        await manager.apply(batch(v))
    await catch_up(subscriber, manager)
    subscriber.position = 0  # as if it forgot where it was: it re-reads everything
    await manager.apply(batch(30))
    delivered = await catch_up(subscriber, manager)
    assert [m["seq"] for m in delivered] == list(range(1, subscriber.seq + 1))
    assert replica(subscriber) == await in_redis(manager)


async def test_a_patch_that_does_not_fit_reloads(manager: DataManager, redis_config: RedisConfig) -> None:
    await manager.apply([change("alpha", "1", 1, "I", Price="1")])
    subscriber = Subscriber(manager.client, redis_config.namespace, P)
    await subscriber.start()
    del subscriber.replica["alpha"]["1"]  # the replica lost a document somehow
    await manager.apply([change("alpha", "1", 2, "U", Price="2")])
    await catch_up(subscriber, manager)
    assert subscriber.reloads == 1
    assert replica(subscriber) == await in_redis(manager) == {"alpha": {"1": {"Price": "2"}}}


async def test_one_section_only(manager: DataManager, redis_config: RedisConfig) -> None:
    await manager.apply(batch(10) + batch(10, section="beta"))
    subscriber = Subscriber(manager.client, redis_config.namespace, P, section="beta")
    await subscriber.start()
    await manager.apply(batch(20) + batch(20, section="beta"))
    delivered = await catch_up(subscriber, manager)
    assert delivered and {m["section"] for m in delivered} == {"beta"}
    assert replica(subscriber) == {"beta": (await in_redis(manager))["beta"]}


async def test_sections_written_later_are_followed(manager: DataManager, redis_config: RedisConfig) -> None:
    await manager.apply(batch(10))
    subscriber = Subscriber(manager.client, redis_config.namespace, P)
    await subscriber.start()
    assert set(subscriber.replica) == {"alpha"}
    await manager.apply(batch(20, section="beta"))
    await catch_up(subscriber, manager)
    assert replica(subscriber) == await in_redis(manager)
    assert "beta" in replica(subscriber)


async def test_following_a_concurrent_writer(manager: DataManager, redis_config: RedisConfig) -> None:
    await manager.apply(batch(1))
    subscriber = Subscriber(manager.client, redis_config.namespace, P, block=0.2)
    delivered: list[dict[str, Any]] = []
    target = [float("inf")]
    reached = asyncio.Event()

    async def follow() -> None:
        async for message in subscriber:
            delivered.append(message)
            if subscriber.position >= target[0]:
                reached.set()

    task = asyncio.create_task(follow())
    try:
        for v in range(10, 400, 15):
            await manager.apply(batch(v, size=8) + batch(v, size=3, section="beta"))
        target[0] = int(await manager.client.get(manager.layout.seq(P)) or 0)
        if subscriber.position < target[0]:
            await asyncio.wait_for(reached.wait(), 10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    seqs = [m["seq"] for m in delivered]
    assert seqs == list(range(seqs[0], int(target[0]) + 1))
    assert replica(subscriber) == await in_redis(manager)


async def test_a_subscriber_made_from_a_config_owns_its_client(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    await manager.apply(batch(10))
    async with Subscriber(redis_config, redis_config.namespace, P) as subscriber:
        assert replica(subscriber) == await in_redis(manager)
    assert subscriber._client is None


def test_the_blocking_wrapper(redis_url: str, namespace: str) -> None:
    config = RedisConfig(url=redis_url, namespace=namespace)

    async def write(*versions: int) -> None:
        manager = await DataManager.connect(config)
        try:
            for v in versions:
                await manager.apply(batch(v))
        finally:
            await manager.close()

    asyncio.run(write(10))
    with BlockingSubscriber(config, P, block=0.2) as subscriber:
        start = subscriber.subscriber.seq
        assert subscriber.get(timeout=0.3) is None  # nothing yet: its read goes on, and brings the first
        asyncio.run(write(20, 30))
        received = []
        while len(received) < 10:
            message = subscriber.get(timeout=10)
            assert message is not None, "no message within 10 s"
            received.append(message)
        assert [m["seq"] for m in received] == list(range(start + 1, start + 11))
        copy = subscriber.replica

    async def documents() -> dict[str, Any]:
        manager = await DataManager.connect(config)
        try:
            return await manager.documents(P, "alpha")
        finally:
            await manager.close()

    assert copy["alpha"] == asyncio.run(documents())


async def test_an_update_of_a_member_the_replica_lacks_reloads(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    """The fast path's replace of a top-level member (publishers.patching)
    raises as jsonpatch does when the member is missing, so the replica is
    reloaded, not silently given the member."""
    await manager.apply([change("alpha", "1", 1, "I", Price="1", Qty="3")])
    subscriber = Subscriber(manager.client, redis_config.namespace, P)
    await subscriber.start()
    del subscriber.replica["alpha"]["1"]["Price"]  # the replica lost a column somehow
    subscriber.replica["alpha"]["1"]["Stale"] = 1
    await manager.apply([change("alpha", "1", 2, "U", Price="2", Qty="3")])
    await catch_up(subscriber, manager)
    assert subscriber.reloads == 1
    assert replica(subscriber) == await in_redis(manager) == {"alpha": {"1": {"Price": "2", "Qty": "3"}}}


def fail_the_next_load(subscriber: Subscriber) -> list[int]:
    """Make the subscriber's next load raise as a Redis timeout would (once);
    the list records the seq the replica was at when it failed."""
    real_load = subscriber._load
    failed: list[int] = []

    async def load_failing_once() -> None:
        if not failed:
            failed.append(subscriber.seq)
            raise RedisUnavailable("Redis timed out during the load (injected)")
        await real_load()

    subscriber._load = load_failing_once  # type: ignore[method-assign]
    return failed


async def test_a_misfit_reload_that_fails_is_done_at_the_next_poll(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    await manager.apply([change("alpha", "1", 1, "I", Price="1")])
    subscriber = Subscriber(manager.client, redis_config.namespace, P)
    await subscriber.start()
    del subscriber.replica["alpha"]["1"]  # the replica lost a document somehow
    await manager.apply([change("alpha", "1", 2, "U", Price="2")])
    failed = fail_the_next_load(subscriber)
    with pytest.raises(RedisUnavailable):
        await subscriber.poll(block=0.2)
    assert failed and subscriber.reloads == 0
    delivered = await subscriber.poll(block=0.2)
    assert [m["seq"] for m in delivered] == [2]  # the message that did not fit, once, after the reload
    assert subscriber.reloads == 1
    assert replica(subscriber) == await in_redis(manager) == {"alpha": {"1": {"Price": "2"}}}


async def test_a_gap_reload_that_fails_is_done_at_the_next_poll(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    await manager.apply(batch(10))
    subscriber = Subscriber(manager.client, redis_config.namespace, P)
    await subscriber.start()
    for v in (20, 30, 40):
        await manager.apply(batch(v))
    await manager.client.xtrim(manager.layout.stream(P), maxlen=2, approximate=False)
    failed = fail_the_next_load(subscriber)
    with pytest.raises(RedisUnavailable):
        await subscriber.poll(block=0.2)
    assert failed and subscriber.reloads == 0
    await catch_up(subscriber, manager)
    assert subscriber.reloads == 1
    assert replica(subscriber) == await in_redis(manager)


async def test_a_replaced_partition_reload_that_fails_is_done_at_the_next_poll(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    """The reload is not left to being detected again: by the next poll the new
    data's stream may have been trimmed past the old position, and reading on
    from there would apply the new data's patches to the old replica."""
    await manager.apply([change("alpha", "old only", 1, "I", Price="1"), *batch(10)])
    subscriber = Subscriber(manager.client, redis_config.namespace, P)
    await subscriber.start()
    position = subscriber.position
    async for key in manager.client.scan_iter(match=f"{redis_config.namespace}:*"):
        await manager.client.delete(key)  # Redis restarted empty
    await manager.apply(batch(30) + batch(40))  # seq 1..10: past the old position
    failed = fail_the_next_load(subscriber)
    with pytest.raises(RedisUnavailable):
        await subscriber.poll(block=0.2)
    assert failed and subscriber.reloads == 0
    await manager.client.xtrim(manager.layout.stream(P), minid=f"{position + 1}-0", approximate=False)
    await subscriber.poll(block=0.2)
    assert subscriber.reloads == 1
    assert replica(subscriber) == await in_redis(manager)


async def test_a_start_from_history_that_fails_starts_again(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    for v in (10, 20):
        await manager.apply(batch(v))
    subscriber = Subscriber(manager.client, redis_config.namespace, P, from_seq=2)
    real_start_from_history = subscriber._start_from_history
    failed: list[int] = []

    async def start_from_history_failing_once(from_seq: int) -> None:
        if not failed:
            failed.append(from_seq)
            raise RedisUnavailable("Redis timed out reading the history (injected)")
        await real_start_from_history(from_seq)

    subscriber._start_from_history = start_from_history_failing_once  # type: ignore[method-assign]
    with pytest.raises(RedisUnavailable):
        await subscriber.start()
    delivered = await subscriber.poll(block=0.2)  # starts again, from the history
    delivered += await catch_up(subscriber, manager)
    assert failed == [2] and [m["seq"] for m in delivered] == list(range(2, subscriber.seq + 1))
    assert replica(subscriber) == await in_redis(manager)


def steps(count: int) -> list[Change]:
    """``count`` changes over three keys: each inserts or updates its key's
    ``Step`` to its own number (more than a read's 1,000 entries)."""
    return [change("alpha", str(i % 3), i, "I" if i < 3 else "U", Step=i) for i in range(count)]


async def test_the_replica_is_the_state_of_the_message_being_handled(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    """While the application handles message N (``async for``), the replica
    holds exactly messages 1..N: not the rest of the read (up to 1,000)."""
    subscriber = Subscriber(manager.client, redis_config.namespace, P)
    await subscriber.start()  # loaded before the writes: it follows all of them
    await manager.apply(steps(2500))
    expected: dict[str, Any] = {}
    async with asyncio.timeout(30):
        async for message in subscriber:
            expected[message["key"]] = jsonpatch.apply_patch(expected.get(message["key"]), message["patch"])
            assert subscriber.replica == {"alpha": expected}, f"while handling seq {message['seq']}"
            if message["seq"] == 2500:
                break
    assert replica(subscriber) == await in_redis(manager)


def test_the_blocking_replica_is_the_state_of_the_message_being_handled(
    redis_url: str, namespace: str
) -> None:
    config = RedisConfig(url=redis_url, namespace=namespace)

    async def write() -> None:
        manager = await DataManager.connect(config)
        try:
            await manager.apply(steps(1200))
        finally:
            await manager.close()

    with BlockingSubscriber(config, P, block=0.2) as subscriber:
        asyncio.run(write())
        expected: dict[str, Any] = {}
        while len(expected) < 3 or expected["2"]["Step"] != 1199:
            message = subscriber.get(timeout=10)
            assert message is not None, "no message within 10 s"
            expected[message["key"]] = jsonpatch.apply_patch(expected.get(message["key"]), message["patch"])
            assert subscriber.replica == {"alpha": expected}, f"while handling seq {message['seq']}"
        with pytest.warns(DeprecationWarning, match="is an attribute since cdc-sync 0.5"):
            called = subscriber.replica()  # 0.4's spelling, kept for one release
        assert called == {"alpha": expected}


async def scans(manager: DataManager) -> int:
    """How many SCAN commands the server (every node of a cluster) has run."""
    if isinstance(manager.client, RedisCluster):
        nodes = await manager.client.info("commandstats", target_nodes=RedisCluster.ALL_NODES)
        return sum(int(stats.get("cmdstat_scan", {}).get("calls", 0)) for stats in nodes.values())
    stats = await manager.client.info("commandstats")
    return int(stats.get("cmdstat_scan", {}).get("calls", 0))


async def test_a_subscriber_finds_the_sections_without_scanning_the_keyspace(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    await manager.apply(batch(10) + batch(20, section="beta"))
    before = await scans(manager)
    subscriber = Subscriber(manager.client, redis_config.namespace, P)
    await subscriber.start()
    assert await scans(manager) == before
    assert replica(subscriber) == await in_redis(manager)
    assert set(subscriber.replica) == {"alpha", "beta"}
    assert await manager.client.smembers(manager.layout.sections()) == {b"alpha", b"beta"}


async def test_a_redis_written_before_the_sections_registry_is_followed_then_filled(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    """Sidecars before 0.5 wrote no ``ns:@sections``: a subscriber scans, as
    0.4's did, and the first sidecar of 0.5 fills the registry with every
    section, those it does not write too."""
    await manager.apply(batch(10) + batch(20, section="beta"))
    await manager.client.delete(manager.layout.sections())  # as 0.4 left it
    old = Subscriber(manager.client, redis_config.namespace, P)
    await old.start()
    assert set(old.replica) == {"alpha", "beta"}

    upgraded = await DataManager.connect(redis_config)  # a new sidecar process
    try:
        await upgraded.apply([change("alpha", "new", 99, "I", Price="1")])  # only alpha is written
    finally:
        await upgraded.close()
    assert await manager.client.smembers(manager.layout.sections()) == {b"alpha", b"beta"}
    before = await scans(manager)
    subscriber = Subscriber(manager.client, redis_config.namespace, P)
    await subscriber.start()
    assert await scans(manager) == before
    assert replica(subscriber) == await in_redis(manager)
    assert set(subscriber.replica) == {"alpha", "beta"}
