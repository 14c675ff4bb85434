"""The apply path against real Redis, on one server and on a 3-master cluster:
patches, op derivation, exact bigints and versions, fencing, tombstones,
seq without gaps, poison isolation, checkpoints, dead letter, connection
errors without passwords. (A damaged partition: test_apply_blocked.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import jsonschema
import orjson
import pytest
from redis import exceptions as rex
from redis.asyncio.cluster import RedisCluster

from cdc.config import RedisConfig
from cdc.devservers import RedisServer
from cdc.errors import ConnectError, RedisUnavailable
from publishers.connection import HiredisConnection
from publishers.layout import Layout, decode_partition, encode_partition
from publishers.manager import DataManager
from publishers.messages import message_schema
from publishers.model import Change

VALIDATOR = jsonschema.Draft202012Validator(message_schema())
NOW = datetime(2026, 11, 21, 23, 0, 0, 123456, tzinfo=UTC)


def row(**values: Any) -> dict[str, bytes]:
    return {column: orjson.dumps(value) for column, value in values.items()}


def upsert(key: str, version: int, op: str = "U", partition: str = "app1", **values: Any) -> Change:
    return Change("dbo.Forecasts", partition, "forecasts", key, op, version, row(**values))  # type: ignore[arg-type]


def delete(key: str, version: int, partition: str = "app1") -> Change:
    return Change("dbo.Forecasts", partition, "forecasts", key, "D", version, None)


@pytest.fixture
async def manager(redis_config: RedisConfig) -> AsyncIterator[DataManager]:
    manager = await DataManager.connect(redis_config)
    yield manager
    await manager.close()


async def messages(manager: DataManager, partition: str = "app1") -> list[dict[str, Any]]:
    """Every message in the partition's stream, checked against the schema and its entry id."""
    out = []
    for entry_id, fields in await manager.client.xrange(manager.layout.stream(partition)):
        message = orjson.loads(fields[b"m"])
        VALIDATOR.validate(message)
        assert entry_id == f"{message['seq']}-0".encode()
        out.append(message)
    return out


def fold(found: list[dict[str, Any]]) -> dict[str, Any]:
    """Documents rebuilt by applying every patch to the previous document (None at first)."""
    docs: dict[str, Any] = {}
    for message in found:
        docs[message["key"]] = jsonpatch.apply_patch(docs.get(message["key"]), message["patch"])
    return {key: doc for key, doc in docs.items() if doc is not None}


# -- patches and ops -----------------------------------------------------------


async def test_patches_rebuild_every_document(manager: DataManager) -> None:
    batches = [
        [upsert("1", 10, "I", Id=1, Price="12.50"), upsert("2", 11, "I", Id=2, Price="1.00")],
        [upsert("1", 12, Id=1, Price="13.00", Note="new")],  # replace + add
        [upsert("1", 13, Id=1, Note="new"), delete("2", 14)],  # remove; delete of a live doc
        [upsert("2", 15, "I", Id=2, Price="2.00")],  # insert over a tombstone
        [upsert("3", 16, "S", Id=3), upsert("1", 17, "S", Id=1, Note="snap")],  # snapshot rows
        [delete("9", 18)],  # delete of an absent doc publishes nothing
    ]
    for batch in batches:
        await manager.apply(batch, now=NOW)
    found = await messages(manager)
    assert [m["op"] for m in found] == ["I", "I", "U", "U", "D", "I", "S", "S"]
    assert [m["seq"] for m in found] == list(range(1, 9))
    assert fold(found) == await manager.documents("app1", "forecasts")
    assert fold(found) == {
        "1": {"Id": 1, "Note": "snap"},
        "2": {"Id": 2, "Price": "2.00"},
        "3": {"Id": 3},
    }
    assert found[2]["patch"] == [
        {"op": "replace", "path": "/Price", "value": "13.00"},
        {"op": "add", "path": "/Note", "value": "new"},
    ]
    assert found[3]["patch"] == [{"op": "remove", "path": "/Price"}]
    assert found[4]["patch"] == [{"op": "replace", "path": "", "value": None}]
    assert found[0]["ts"] == "2026-11-21T23:00:00.123456Z"


async def test_op_is_relative_to_the_stored_document(manager: DataManager) -> None:
    """The source says U (relative to its checkpoint); Redis had no document: I."""
    await manager.apply([upsert("1", 5, "U", Id=1)])
    await manager.apply([upsert("1", 6, "I", Id=1, X=2)])
    assert [m["op"] for m in await messages(manager)] == ["I", "U"]


async def test_column_names_needing_escapes(manager: DataManager) -> None:
    odd = {"a/b": 1, "t~n": 2, 'q"uote': 3, "ünï": 4, "back\\slash": 5}
    await manager.apply([Change("dbo.F", "app1", "forecasts", "k", "I", 1, row(**odd))])
    await manager.apply([Change("dbo.F", "app1", "forecasts", "k", "U", 2, row(**{"a/b": 9}))])
    found = await messages(manager)
    assert {op["path"] for op in found[1]["patch"]} == {"/a~1b", "/t~0n", '/q"uote', "/ünï", "/back\\slash"}
    assert fold(found) == {"k": {"a/b": 9}} == await manager.documents("app1", "forecasts")


async def test_bigints_and_versions_above_2_53_survive(manager: DataManager) -> None:
    big = 2**62 + 1
    await manager.apply([upsert("1", big, "I", Id=9007199254740993, Neg=-9007199254740993)])
    # 2**62+2 and 2**62+1 are the same double: a tonumber() would drop this change
    await manager.apply([upsert("1", big + 1, Id=9007199254740993, Neg=-9007199254740995)])
    found = await messages(manager)
    assert [m["version"] for m in found] == [big, big + 1]
    raw = await manager.client.hgetall(manager.layout.document("app1", "forecasts", "1"))
    assert raw[b"@v"] == str(big + 1).encode()
    assert raw[b"Id"] == b"9007199254740993"
    assert await manager.document("app1", "forecasts", "1") == {
        "Id": 9007199254740993,
        "Neg": -9007199254740995,
    }
    assert (
        b'"version":4611686018427387906'
        in (await manager.client.xrange(manager.layout.stream("app1")))[-1][1][b"m"]
    )


async def test_versions_compare_as_decimal_strings(manager: DataManager) -> None:
    """9 < 10 < 99 < 100: by length first, then bytes."""
    result = await manager.apply([upsert("1", 9, Id=1), upsert("1", 10, Id=2), upsert("1", 99, Id=3)])
    assert (result.applied, result.stale) == (3, 0)
    result = await manager.apply([upsert("1", 100, Id=4), upsert("1", 11, Id=5)])
    assert (result.applied, result.stale) == (1, 1)
    assert await manager.document("app1", "forecasts", "1") == {"Id": 4}


# -- the apply rule ----------------------------------------------------------------


async def test_unchanged_rows_publish_nothing_but_raise_the_version(manager: DataManager) -> None:
    await manager.apply([upsert("1", 1, Id=1, Price="1")])
    result = await manager.apply([upsert("1", 2, Id=1, Price="1")])
    assert (result.applied, result.published, result.seqs) == (1, 0, {"app1": 1})
    assert len(await messages(manager)) == 1
    assert await manager.client.hget(manager.layout.document("app1", "forecasts", "1"), "@v") == b"2"


async def test_stale_versions_are_dropped_and_reset_overrides(manager: DataManager) -> None:
    await manager.apply([upsert("1", 5, Id=1, Price="5")])
    result = await manager.apply([upsert("1", 5, Id=1, Price="x"), upsert("1", 3, Id=1, Price="y")])
    assert (result.applied, result.stale, result.published) == (0, 2, 0)
    assert await manager.document("app1", "forecasts", "1") == {"Id": 1, "Price": "5"}
    reset = Change("dbo.Forecasts", "app1", "forecasts", "1", "S", 2, row(Id=1, Price="r"), reset=True)
    assert (await manager.apply([reset])).published == 1
    assert await manager.document("app1", "forecasts", "1") == {"Id": 1, "Price": "r"}
    assert await manager.client.hget(manager.layout.document("app1", "forecasts", "1"), "@v") == b"2"


async def test_tombstones_keep_the_version_and_expire(manager: DataManager) -> None:
    layout = manager.layout
    await manager.apply([upsert("1", 1, Id=1), upsert("2", 1, Id=2)])
    assert await manager.client.smembers(layout.index("app1", "forecasts")) == {b"1", b"2"}
    result = await manager.apply([delete("1", 2), delete("7", 2)])
    assert (result.applied, result.published) == (2, 1)
    key = layout.document("app1", "forecasts", "1")
    assert await manager.client.hgetall(key) == {b"@v": b"2", b"@del": b"1"}
    ttl = await manager.client.pttl(key)
    assert 0 < ttl <= manager.config.tombstone_ttl * 1000
    assert 0 < await manager.client.pttl(layout.document("app1", "forecasts", "7"))
    assert await manager.client.smembers(layout.index("app1", "forecasts")) == {b"2"}
    assert await manager.document("app1", "forecasts", "1") is None
    # fencing: an older insert stays out; a newer one revives the document without a TTL
    assert (await manager.apply([upsert("1", 1, "I", Id=1)])).stale == 1
    assert (await manager.apply([delete("1", 3)])).published == 0  # delete of a tombstone
    await manager.apply([upsert("1", 4, "I", Id=1)])
    assert await manager.client.pttl(key) == -1
    assert await manager.client.hget(key, "@del") is None


async def test_seq_has_no_gaps_across_chunks_and_partitions(redis_config: RedisConfig) -> None:
    manager = await DataManager.connect(redis_config, max_changes_per_call=7)
    try:
        partitions = ["p0", "p1", "p2"]
        changes = [upsert(str(i % 11), 10 + i, partition=partitions[i % 3], Id=i) for i in range(100)]
        result = await manager.apply(changes)
        assert result.published == 100
        for partition in partitions:
            found = await messages(manager, partition)
            assert [m["seq"] for m in found] == list(range(1, len(found) + 1))
            assert result.seqs[partition] == len(found)
            versions = [m["version"] for m in found]
            assert versions == sorted(versions)  # each partition's chunks ran in order
        assert await manager.partitions("forecasts") == set(partitions)
    finally:
        await manager.close()


async def test_partition_values_are_encoded_inside_keys(manager: DataManager) -> None:
    odd = "a{b}:c%d"
    assert decode_partition(encode_partition(odd)) == odd
    assert Layout("ns").seq(odd) == "ns:{a%7Bb%7D%3Ac%25d}:@seq"
    await manager.apply([upsert("1", 1, partition=odd, Id=1)])
    found = await messages(manager, odd)
    assert found[0]["partition"] == odd
    assert await manager.documents(odd, "forecasts") == {"1": {"Id": 1}}
    assert await manager.partitions("forecasts") == {odd}


async def test_script_is_reloaded_after_a_flush(manager: DataManager) -> None:
    await manager.apply([upsert("1", 1, Id=1)])
    await manager.client.script_flush()
    assert (
        await manager.apply([upsert("1", 2, Id=2), upsert("2", 2, partition="other", Id=2)])
    ).published == 2


async def test_published_on_the_section_channel(manager: DataManager) -> None:
    channel = manager.layout.channel("app1", "forecasts")
    pubsub = manager.client.pubsub()
    if manager.config.cluster:
        await pubsub.ssubscribe(channel)
    else:
        await pubsub.subscribe(channel)
    try:
        await manager.apply([upsert("1", 1, Id=1)])
        received = await _next_message(pubsub, sharded=manager.config.cluster)
        assert received == (await manager.client.xrange(manager.layout.stream("app1")))[0][1][b"m"]
    finally:
        await pubsub.aclose()


async def _next_message(pubsub: Any, *, sharded: bool) -> bytes:
    """The first data message, waiting at most 10 s."""
    receive = pubsub.get_sharded_message if sharded else pubsub.get_message
    async with asyncio.timeout(10):
        while True:
            message = await receive(ignore_subscribe_messages=True, timeout=1.0)
            if message is not None and message["type"] in ("message", "smessage"):
                data: bytes = message["data"]
                return data


# -- content failures ----------------------------------------------------------------


async def test_poison_change_is_isolated_to_the_dead_letter(manager: DataManager) -> None:
    await manager.client.set(manager.layout.document("app1", "forecasts", "bad"), "not a hash")
    changes = [upsert(str(i), i + 1, Id=i) for i in range(20)]
    changes[13] = upsert("bad", 14, Id=13)
    result = await manager.apply(changes)
    assert [r.change for r in result.rejected] == [changes[13]]
    assert "WRONGTYPE" in result.rejected[0].reason
    found = await messages(manager)
    assert sorted(m["key"] for m in found) == sorted(str(i) for i in range(20) if i != 13)
    assert [m["seq"] for m in found] == list(range(1, 20))
    letters = await manager.read_dead_letters(10)
    assert len(letters) == 1
    assert letters[0]["key"] == "bad" and letters[0]["version"] == "14"
    assert "WRONGTYPE" in letters[0]["reason"]
    assert orjson.loads(letters[0]["values"]) == {"Id": 13}


async def test_rows_that_cannot_be_sent_never_reach_the_script(redis_config: RedisConfig) -> None:
    manager = await DataManager.connect(redis_config, max_row_bytes=100)
    try:
        changes = [
            upsert("big", 1, Id=1, Blob="x" * 200),
            upsert("meta", 1, **{"@v": 1}),
            upsert("ok", 1, Id=1),
            Change("dbo.Forecasts", "", "forecasts", "k", "I", 1, row(Id=1)),
            Change("dbo.Forecasts", "app1", "forecasts", "neg", "I", -1, row(Id=1)),
        ]
        result = await manager.apply(changes)
        assert [r.change.key for r in result.rejected] == ["big", "meta", "k", "neg"]
        assert "max_row_bytes" in result.rejected[0].reason
        assert result.published == 1
        assert len(await manager.read_dead_letters(10)) == 4
    finally:
        await manager.close()


# -- checkpoints, dead letter, heartbeats, sweeping ---------------------------


async def test_checkpoints_round_trip(manager: DataManager) -> None:
    assert await manager.get_checkpoint("dbo.Forecasts") is None
    await manager.set_checkpoint("dbo.Forecasts", 2**63 - 1, "streaming", now=NOW)
    checkpoint = await manager.get_checkpoint("dbo.Forecasts")
    assert checkpoint is not None
    assert (checkpoint.version, checkpoint.state) == (2**63 - 1, "streaming")
    assert checkpoint.updated_at == "2026-11-21T23:00:00.123456Z"
    raw = await manager.client.hgetall(manager.layout.checkpoint("dbo.Forecasts"))
    assert raw[b"version"] == b"9223372036854775807"


async def test_dead_letter_without_a_change(manager: DataManager) -> None:
    await manager.dead_letter(None, "column Price: NaN", table="dbo.Forecasts", payload={"Id": 7})
    (letter,) = await manager.read_dead_letters(5)
    assert letter["table"] == "dbo.Forecasts" and letter["reason"] == "column Price: NaN"
    assert orjson.loads(letter["values"]) == {"Id": 7}
    assert set(letter) >= {"partition", "section", "key", "op", "version", "ts", "id"}


async def test_heartbeat_replaces_fields_and_expires(manager: DataManager) -> None:
    key = manager.layout.worker("w1")
    await manager.heartbeat("w1", {"tables": "dbo.A,dbo.B", "lag": 3, "old": "x"}, ttl=30)
    await manager.heartbeat("w1", {"tables": "dbo.A", "lag": 0}, ttl=30)
    assert await manager.client.hgetall(key) == {b"tables": b"dbo.A", b"lag": b"0"}
    assert 0 < await manager.client.pttl(key) <= 30_000


async def test_stale_keys_lists_documents_the_snapshot_did_not_write(manager: DataManager) -> None:
    """By key (the snapshot's @seen sets), not by version: documents written at
    the snapshot's own version before it are stale too when it did not write them."""
    await manager.apply([upsert(str(i), 9, partition=f"p{i % 4}", Id=i) for i in range(40)])
    for i in range(0, 40, 3):  # what the snapshot wrote
        await manager.client.sadd(manager.layout.seen(f"p{i % 4}", "forecasts"), str(i))
    await manager.apply([delete("1", 10, partition="p1")])  # tombstones are not live
    found = sorted([item async for item in manager.stale_keys("forecasts")])
    expected = sorted((f"p{i % 4}", str(i)) for i in range(40) if i % 3 and i != 1)
    assert found == expected
    await manager.forget_seen("forecasts")
    assert not await manager.client.exists(*(manager.layout.seen(f"p{i}", "forecasts") for i in range(4)))


# -- connection and secrets ----------------------------------------------------


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    """A server of its own: an ACL user, a default password, and room to fail."""
    acl = ("--user", "alice", "on", ">Al1ce-secret", "~*", "&*", "+@all")
    server = RedisServer(extra=("--requirepass", "Def4ult-pw", *acl)).start()
    yield server
    server.cleanup()


async def test_acl_user_in_the_url_works(acl_server: RedisServer, namespace: str) -> None:
    url = f"redis://alice:Al1ce-secret@127.0.0.1:{acl_server.port}/0"
    manager = await DataManager.connect(RedisConfig(url=url, namespace=namespace))
    try:
        assert (await manager.apply([upsert("1", 1, Id=1)])).published == 1
    finally:
        await manager.close()


@pytest.mark.parametrize("user", ["alice", ""])
async def test_passwords_never_appear_in_errors(acl_server: RedisServer, namespace: str, user: str) -> None:
    url = f"redis://{user}:Wrong-pw-123@127.0.0.1:{acl_server.port}/0"
    with pytest.raises(ConnectError) as raised:
        await DataManager.connect(RedisConfig(url=url, namespace=namespace))
    assert raised.value.exit_code == 3
    assert "Wrong-pw-123" not in str(raised.value) and "***" in str(raised.value)
    closed = RedisServer()  # a port nobody listens on
    url = f"redis://{user}:Wrong-pw-123@127.0.0.1:{closed.port}/0"
    with pytest.raises(ConnectError) as raised:
        await DataManager.connect(RedisConfig(url=url, namespace=namespace))
    assert "Wrong-pw-123" not in str(raised.value)


async def test_transient_failures_become_redis_unavailable(namespace: str) -> None:
    server = RedisServer(extra=("--requirepass", "S3cret-pw")).start()
    url = f"redis://:S3cret-pw@127.0.0.1:{server.port}/0"
    manager = await DataManager.connect(RedisConfig(url=url, namespace=namespace))
    try:
        await manager.apply([upsert("1", 1, Id=1)])
        await manager.client.config_set("maxmemory", "1")
        with pytest.raises(RedisUnavailable, match="OOM|memory") as raised:
            await manager.apply([upsert("1", 2, Id=2)])  # refused by the script call itself
        assert "S3cret-pw" not in str(raised.value)
        await manager.client.config_set("maxmemory", "0")
        server.stop()
        with pytest.raises(RedisUnavailable) as raised:
            await manager.apply([upsert("1", 3, Id=1)])
        assert "S3cret-pw" not in str(raised.value)
        with pytest.raises(RedisUnavailable):
            await manager.get_checkpoint("dbo.Forecasts")
    finally:
        await manager.close()
        server.cleanup()


async def test_commands_are_packed_by_hiredis(manager: DataManager) -> None:
    """redis-py's asyncio packer is pure Python; ours hands EVALSHA to hiredis."""
    client = manager.client
    if isinstance(client, RedisCluster):
        classes = {node.connection_class for node in client.get_nodes()}
    else:
        classes = {client.connection_pool.connection_class}
    assert classes == {HiredisConnection}
    packed = HiredisConnection(host="h").pack_command("SCRIPT LOAD", b"x", 1)
    assert packed == [b"*4\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n$1\r\nx\r\n$1\r\n1\r\n"]


def test_redis_errors_map_onto_the_hierarchy() -> None:
    from publishers.redis_calls import is_transient

    assert is_transient(rex.ResponseError("OOM command not allowed when used memory > 'maxmemory'"))
    assert is_transient(rex.BusyLoadingError("Redis is loading"))
    assert is_transient(rex.ReadOnlyError("You can't write against a read only replica."))
    assert is_transient(rex.ClusterDownError("The cluster is down"))
    assert is_transient(rex.TryAgainError("Multiple keys request during rehashing of slot"))
    assert not is_transient(rex.ResponseError("WRONGTYPE Operation against a key"))
    assert not is_transient(rex.NoScriptError("No matching script"))


async def test_after_a_failover_a_partition_written_again_is_registered_again(manager: DataManager) -> None:
    """A failover without durability can take the last registrations with it
    (the new primary's partitions set lacks them) while the applier remembers
    them as done: a document written there later would stay out of the set,
    invisible to sweeps and to readers that list the section's partitions.
    The balancer tells the manager to forget (a failover, a wipe)."""
    partitions = manager.layout.partitions("forecasts")
    await manager.apply([upsert("1", 1, partition="p1", Price=1)])
    assert await manager.client.smembers(partitions) == {b"p1"}
    await manager.client.delete(partitions)  # what the promoted replica lacked
    await manager.apply([upsert("1", 2, partition="p1", Price=2)])
    assert await manager.client.smembers(partitions) == set(), "remembered: no round trip (as designed)"
    manager.forget_registrations()
    await manager.apply([upsert("1", 3, partition="p1", Price=3)])
    assert await manager.client.smembers(partitions) == {b"p1"}
