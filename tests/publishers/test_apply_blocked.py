"""A partition whose shared keys cannot be written is blocked, not fatal: on
one server and on a 3-master cluster, its changes come back in
``ApplyResult.blocked`` with the Redis reason, nothing is written to it and
nothing is dead-lettered, the other partitions of the batch apply, and once
the key is repaired the same changes apply. The ACL cases (NOPERM) run on a
server of their own."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import orjson
import pytest
from redis import exceptions as rex

from cdc.config import RedisConfig
from cdc.devservers import RedisServer
from cdc.errors import CdcError
from publishers import redis_calls
from publishers.layout import Layout
from publishers.manager import DataManager
from publishers.model import ApplyResult, Change

SECTION = "forecasts"


def upsert(
    key: str, version: int, partition: str, section: str = SECTION, fence: int = 0, **values: Any
) -> Change:
    encoded = {column: orjson.dumps(value) for column, value in values.items()}
    return Change(f"dbo.{section}", partition, section, key, "U", version, encoded, fence=fence)


@pytest.fixture
async def manager(redis_config: RedisConfig) -> AsyncIterator[DataManager]:
    manager = await DataManager.connect(redis_config)
    yield manager
    await manager.close()


async def partition_keys(manager: DataManager, partition: str, keys: list[str]) -> dict[str, Any]:
    """What Redis holds at the partition's shared keys and the given documents."""
    layout = manager.layout
    shared = [
        layout.seq(partition),
        layout.stream(partition),
        layout.fence(partition),
        layout.index(partition, SECTION),
    ]
    return {key: await manager.client.dump(key) for key in [*shared, *keys]}


async def seqs_of_stream(manager: DataManager, partition: str) -> list[int]:
    entries = await manager.client.xrange(manager.layout.stream(partition))
    return [orjson.loads(fields[b"m"])["seq"] for _, fields in entries]


def blocked_keys(result: ApplyResult) -> list[str]:
    return [blocked.change.key for blocked in result.blocked]


Damage = Callable[[DataManager, str], Awaitable[None]]


async def seq_not_an_integer(manager: DataManager, partition: str) -> None:
    await manager.client.set(manager.layout.seq(partition), "x")


async def seq_lost(manager: DataManager, partition: str) -> None:
    await manager.client.delete(manager.layout.seq(partition))  # the stream now runs ahead of @seq


async def seq_repaired(manager: DataManager, partition: str) -> None:
    await manager.client.set(manager.layout.seq(partition), "2")  # what the stream holds


async def stream_of_another_type(manager: DataManager, partition: str) -> None:
    await manager.client.delete(manager.layout.stream(partition))
    await manager.client.set(manager.layout.stream(partition), "x")


async def stream_repaired(manager: DataManager, partition: str) -> None:
    await manager.client.delete(manager.layout.stream(partition))


DAMAGES: dict[str, tuple[Damage, Damage, str]] = {
    "seq-not-an-integer": (seq_not_an_integer, seq_repaired, r"@seq does not hold an integer$"),
    "seq-lost": (seq_lost, seq_repaired, r"@stream is ahead of .*@seq \(last id 2-0, @seq 0\)$"),
    "stream-of-another-type": (
        stream_of_another_type,
        stream_repaired,
        r"@stream holds a string, expected a stream$",
    ),
}


@pytest.mark.parametrize("damage", DAMAGES)
async def test_a_damaged_partition_is_blocked_and_the_others_apply(manager: DataManager, damage: str) -> None:
    harm, repair, reason = DAMAGES[damage]
    await manager.apply([upsert(k, 1, "p1", Id=int(k)) for k in ("1", "2")])  # p1: seq 2, stream 1..2
    await harm(manager, "p1")
    docs = [manager.layout.document("p1", SECTION, k) for k in ("1", "2", "3")]
    before = await partition_keys(manager, "p1", docs)

    batch = [
        upsert("1", 5, "p1", fence=7, Id=1, V="new"),  # a fenced write: even @fence stays untouched
        upsert("9", 5, "p2", Id=9),
        upsert("3", 6, "p1", Id=3),
        upsert("8", 6, "p2", Id=8),
    ]
    result = await manager.apply(batch)

    assert blocked_keys(result) == ["1", "3"]
    assert {blocked.reason for blocked in result.blocked} == {result.blocked[0].reason}
    assert result.blocked[0].reason.startswith("Redis layout is damaged: ")
    assert manager.layout.prefix("p1") in result.blocked[0].reason
    assert re.search(reason, result.blocked[0].reason), result.blocked[0].reason
    assert await partition_keys(manager, "p1", docs) == before  # nothing written to p1
    assert await manager.documents("p2", SECTION) == {"9": {"Id": 9}, "8": {"Id": 8}}
    assert (result.applied, result.published, result.rejected, result.fenced) == (2, 2, [], [])
    assert await manager.read_dead_letters(10) == []

    await repair(manager, "p1")
    again = await manager.apply(batch)
    assert again.blocked == [] and again.published == 2  # p2's are stale replays now
    assert await manager.documents("p1", SECTION) == {
        "1": {"Id": 1, "V": "new"},
        "2": {"Id": 2},
        "3": {"Id": 3},
    }
    assert (await seqs_of_stream(manager, "p1"))[-2:] == [3, 4]


async def test_every_later_chunk_of_a_blocked_partition_is_blocked_too(redis_config: RedisConfig) -> None:
    manager = await DataManager.connect(redis_config, max_changes_per_call=2)
    try:
        await manager.client.set(manager.layout.seq("p1"), "x")
        batch = [upsert(str(k), 10 + k, "p1" if k % 2 else "p2", Id=k) for k in range(10)]
        result = await manager.apply(batch)
        assert blocked_keys(result) == ["1", "3", "5", "7", "9"]  # 3 calls of p1, in order
        assert result.published == 5
        assert await manager.client.exists(manager.layout.stream("p1")) == 0
    finally:
        await manager.close()


async def test_a_damaged_document_beside_a_damaged_partition(manager: DataManager) -> None:
    """A document of another type is the content of one change (dead letter);
    a damaged @seq is the partition's (blocked): each goes its own way."""
    await manager.client.set(manager.layout.document("p2", SECTION, "bad"), "not a hash")
    await manager.client.set(manager.layout.seq("p1"), "x")
    result = await manager.apply(
        [upsert("1", 1, "p1", Id=1), upsert("bad", 1, "p2", Id=2), upsert("2", 1, "p2", Id=3)]
    )
    assert blocked_keys(result) == ["1"]
    assert [r.change.key for r in result.rejected] == ["bad"]
    assert await manager.documents("p2", SECTION) == {"2": {"Id": 3}}
    assert [letter["key"] for letter in await manager.read_dead_letters(10)] == ["bad"]


async def test_a_damaged_partitions_set_blocks_only_its_sections_new_partitions(manager: DataManager) -> None:
    """``ns:@partitions:section`` is shared by the section's partitions: a
    document is never written before its partition is registered there."""
    await manager.apply([upsert("1", 1, "known", Id=1)])
    partitions_key = manager.layout.partitions(SECTION)
    await manager.client.delete(partitions_key)
    await manager.client.set(partitions_key, "x")
    batch = [
        upsert("2", 2, "known", Id=2),  # registered before: applies
        upsert("1", 2, "new", Id=1),  # cannot be registered: blocked
        upsert("1", 2, "new", section="other", Id=1),  # another section, same partition: applies
    ]
    result = await manager.apply(batch)
    assert [(b.change.partition, b.change.section) for b in result.blocked] == [("new", SECTION)]
    assert result.blocked[0].reason == (
        f"Redis layout is damaged: {partitions_key} cannot be written "
        "(WRONGTYPE Operation against a key holding the wrong kind of value)"
    )
    assert await manager.client.exists(manager.layout.document("new", SECTION, "1")) == 0
    assert set(await manager.documents("known", SECTION)) == {"1", "2"}
    assert await manager.documents("new", "other") == {"1": {"Id": 1}}

    await manager.client.delete(partitions_key)
    again = await manager.apply(batch)
    assert again.blocked == []
    assert await manager.documents("new", SECTION) == {"1": {"Id": 1}}
    assert await manager.partitions(SECTION) == {"new"}  # "known" was registered into the damaged key


async def test_a_damaged_dead_letter_blocks_the_change_it_would_hold(manager: DataManager) -> None:
    deadletter = manager.layout.deadletter()
    await manager.client.set(deadletter, "x")
    poison = upsert("m", 1, "p1", **{"@v": 1})  # a reserved column name: dead-lettered without a call
    result = await manager.apply([poison, upsert("1", 1, "p1", Id=1)])
    assert result.rejected == [] and blocked_keys(result) == ["m"]
    assert result.blocked[0].reason.startswith(
        f"Redis layout is damaged: {deadletter} cannot be written (WRONGTYPE"
    )
    assert result.blocked[0].reason.endswith("; the change would go there: reserved column name(s): @v")
    assert result.published == 1

    await manager.client.delete(deadletter)
    again = await manager.apply([poison])
    assert again.blocked == [] and [r.change for r in again.rejected] == [poison]
    assert len(await manager.read_dead_letters(10)) == 1


async def test_a_damaged_checkpoint_names_its_key(manager: DataManager) -> None:
    key = manager.layout.checkpoint("dbo.items")
    await manager.client.hset(key, mapping={"version": "x", "state": "streaming"})
    with pytest.raises(CdcError, match=rf"dbo.items: Redis layout is damaged: {key} field version holds 'x'"):
        await manager.get_checkpoint("dbo.items")


async def test_a_checkpoint_hash_without_a_version_is_no_checkpoint(manager: DataManager) -> None:
    """A failover without durability took the checkpoint with the old primary,
    and the sidecar that saw it asked for a snapshot there: no checkpoint (the
    table is snapshotted), not a damaged one."""
    key = manager.layout.checkpoint("dbo.items")
    await manager.client.hset(key, "snapshot_requested", "failover 1795489329.5")
    assert await manager.get_checkpoint("dbo.items") is None
    await manager.client.hset(key, "version", "")
    with pytest.raises(CdcError, match=rf"{key} field version holds ''"):
        await manager.get_checkpoint("dbo.items")


def test_which_errors_block_a_partition() -> None:
    layout_error = rex.ResponseError("CDCLAYOUT ns:{p}:@seq does not hold an integer")
    assert (
        redis_calls.blocked_reason(layout_error)
        == "Redis layout is damaged: ns:{p}:@seq does not hold an integer"
    )
    denied = rex.NoPermissionError("this user has no permissions to access one of the keys used as arguments")
    assert redis_calls.blocked_reason(denied) == (
        "Redis denied access (NOPERM): this user has no permissions to access one of the keys used as arguments"
    )
    wrongtype = rex.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    assert redis_calls.blocked_reason(wrongtype) is None  # at a document: the change's content
    assert redis_calls.is_content_error(wrongtype)
    assert redis_calls.blocked_reason(wrongtype, shared_key="ns:@deadletter") is not None
    for other in (rex.ResponseError("OOM command not allowed"), rex.NoScriptError("No matching script")):
        assert redis_calls.blocked_reason(other, shared_key="ns:@deadletter") is None
    for blocked in (layout_error, denied):
        assert not redis_calls.is_content_error(blocked)


# -- the ACL (NOPERM) ----------------------------------------------------------


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture
async def as_bob(acl_server: RedisServer, namespace: str) -> AsyncIterator[tuple[DataManager, DataManager]]:
    """A manager that logs in as ``bob`` (rights set by the test) and one
    that logs in as the default user, to set them and to look."""
    admin = await DataManager.connect(RedisConfig(url=acl_server.url, namespace=namespace))
    await admin.client.execute_command("ACL", "SETUSER", "bob", "reset", "on", ">b0b-pw", "~*", "&*", "+@all")
    bob = await DataManager.connect(
        RedisConfig(url=f"redis://bob:b0b-pw@127.0.0.1:{acl_server.port}/0", namespace=namespace)
    )
    yield bob, admin
    await bob.close()
    await admin.client.execute_command("ACL", "DELUSER", "bob")
    await admin.close()


async def grant(admin: DataManager, *rules: str) -> None:
    await admin.client.execute_command("ACL", "SETUSER", "bob", "resetkeys", "resetchannels", "+@all", *rules)


async def test_a_partition_the_acl_refuses_is_blocked(
    as_bob: tuple[DataManager, DataManager], namespace: str
) -> None:
    bob, admin = as_bob
    await grant(admin, f"~{namespace}:{{p2}}:*", f"~{namespace}:@*", "&*")
    batch = [upsert("1", 1, "p1", Id=1), upsert("2", 1, "p2", Id=2)]
    result = await bob.apply(batch)
    assert blocked_keys(result) == ["1"]
    assert result.blocked[0].reason.startswith("Redis denied access (NOPERM): ")
    assert await admin.documents("p2", SECTION) == {"2": {"Id": 2}}
    assert await admin.read_dead_letters(10) == []

    await grant(admin, "~*", "&*")
    assert (await bob.apply(batch)).published == 1
    assert await admin.documents("p1", SECTION) == {"1": {"Id": 1}}


async def test_a_channel_the_acl_refuses_blocks_before_anything_is_written(
    as_bob: tuple[DataManager, DataManager], namespace: str
) -> None:
    """Redis checks a script's keys before it runs, but its channels only at
    PUBLISH: the script publishes first, so a refusal writes nothing."""
    bob, admin = as_bob
    await grant(admin, "~*", f"&{namespace}:{{p2}}:*")
    result = await bob.apply([upsert("1", 1, "p1", Id=1), upsert("2", 1, "p2", Id=2)])
    assert blocked_keys(result) == ["1"]
    channel = Layout(namespace).channel("p1", SECTION)
    assert result.blocked[0].reason.startswith(f"Redis denied access (NOPERM): cannot publish on {channel}: ")
    for key in (admin.layout.seq("p1"), admin.layout.stream("p1"), admin.layout.document("p1", SECTION, "1")):
        assert await admin.client.exists(key) == 0, key
    assert await admin.documents("p2", SECTION) == {"2": {"Id": 2}}

    await grant(admin, "~*", "&*")
    assert (await bob.apply([upsert("1", 1, "p1", Id=1)])).published == 1
    assert await seqs_of_stream(admin, "p1") == [1]


async def test_a_damaged_sections_registry_blocks_only_new_registrations(manager: DataManager) -> None:
    """``ns:@sections`` names every section with a partitions set: a
    partition is not written before its section is named there."""
    await manager.apply([upsert("1", 1, "known", Id=1)])
    registry = manager.layout.sections()
    await manager.client.delete(registry)
    await manager.client.set(registry, "x")
    result = await manager.apply([upsert("2", 2, "known", Id=2), upsert("1", 2, "new", Id=1)])
    assert [(b.change.partition, b.change.section) for b in result.blocked] == [("new", SECTION)]
    assert result.blocked[0].reason.startswith(
        f"Redis layout is damaged: {registry} cannot be written (WRONGTYPE"
    )
    assert set(await manager.documents("known", SECTION)) == {"1", "2"}
    assert await manager.documents("new", SECTION) == {}
