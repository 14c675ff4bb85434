"""The bulk snapshot's Redis half (publishers/bulk.py, lua/bulk_load.lua,
lua/bulk_marker.lua) against real Redis, and the subscriber's side of it:
documents and index written without a message per row, one R message per
partition and section that a subscriber reloads on (and that a client not
knowing R fails to apply, so it reloads too), the fence, @v, and a document
key of another type."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import jsonpatch
import jsonschema
import orjson
import pytest

from cdc.config import RedisConfig
from publishers.bulk import MARKER_PATCH, BulkWriter, PageRows
from publishers.errors import CdcError, LeaseLost, RedisUnavailable
from publishers.manager import DataManager
from publishers.messages import message_schema
from publishers.model import Change
from publishers.subscriber import Subscriber

P = "p{1}"  # a partition value that needs encoding inside keys
TABLE, SECTION = "s.items", "items"
VALIDATOR = jsonschema.Draft202012Validator(message_schema())


@pytest.fixture
async def manager(redis_config: RedisConfig) -> AsyncIterator[DataManager]:
    manager = await DataManager.connect(redis_config)
    yield manager
    await manager.close()


def page(*rows: tuple[str, int, str], partition: str = P) -> PageRows:
    """Rows of (key, qty, name) as JSON text, columns id, qty, name."""
    out = PageRows(("id", "qty", "name"))
    for key, qty, name in rows:
        out.add(partition, key, [key.encode(), b"%d" % qty, orjson.dumps(name)])
    return out


async def fields(manager: DataManager, key: str, partition: str = P) -> dict[str, str]:
    raw = await manager.client.hgetall(manager.layout.document(partition, SECTION, key))
    return {k.decode(): v.decode() for k, v in raw.items()}


async def test_a_page_writes_whole_documents_and_the_index_without_messages(manager: DataManager) -> None:
    writer = manager.bulk_writer()
    # a document with a column the rows no longer have, at an older version
    old = Change(TABLE, P, SECTION, "1", "I", 3, {"id": b"1", "qty": b"1", "gone": b"true"})
    await manager.apply([old])
    seq = int(await manager.client.get(manager.layout.seq(P)))

    outcome = await writer.write(
        TABLE, SECTION, page(("1", 10, "a"), ("2", 20, "b")), version=7, reset=True, fence=0
    )

    assert (outcome.written, outcome.stale, outcome.wrong_type) == (2, 0, [])
    one = await fields(manager, "1")
    assert {k: v for k, v in one.items() if k != "@ts"} == {"@v": "7", "id": "1", "qty": "10", "name": '"a"'}
    assert await manager.client.smembers(manager.layout.index(P, SECTION)) == {b"1", b"2"}
    assert P in await manager.partitions(SECTION)
    assert int(await manager.client.get(manager.layout.seq(P))) == seq  # no message per row
    assert await manager.client.xlen(manager.layout.stream(P)) == seq


async def test_a_partial_write_leaves_newer_documents_a_full_one_does_not(manager: DataManager) -> None:
    writer = manager.bulk_writer()
    await manager.apply(
        [Change(TABLE, P, SECTION, "1", "I", 9, {"id": b"1", "qty": b"99", "name": b'"new"'})]
    )

    partial = await writer.write(TABLE, SECTION, page(("1", 10, "old")), version=7, reset=False, fence=0)
    assert (partial.written, partial.stale) == (0, 1)
    assert (await fields(manager, "1"))["qty"] == "99"

    full = await writer.write(TABLE, SECTION, page(("1", 10, "old")), version=7, reset=True, fence=0)
    assert full.written == 1  # a full snapshot is the truth at its version (a restored source)
    assert (await fields(manager, "1"))["qty"] == "10"


async def test_a_fenced_off_writer_writes_nothing(manager: DataManager) -> None:
    writer = manager.bulk_writer()
    await writer.write(TABLE, SECTION, page(("1", 1, "new owner")), version=8, reset=True, fence=5)
    with pytest.raises(LeaseLost):
        await writer.write(
            TABLE, SECTION, page(("1", 2, "old"), ("2", 2, "old")), version=9, reset=True, fence=4
        )
    with pytest.raises(LeaseLost):
        await writer.mark(TABLE, SECTION, P, version=9, fence=4)
    assert (await fields(manager, "1"))["name"] == '"new owner"'
    assert await manager.client.exists(manager.layout.document(P, SECTION, "2")) == 0
    assert await manager.client.get(manager.layout.seq(P)) is None


async def test_the_bulk_writer_and_the_apply_fence_each_other(manager: DataManager) -> None:
    """One ``@fence`` field per table for both writers: a sidecar that lost the
    lease cannot bulk-write over what the new owner applied, nor apply over
    what the new owner bulk-wrote."""
    new = Change(TABLE, P, SECTION, "1", "I", 100, {"id": b"1", "qty": b"1", "name": b'"new owner"'}, fence=5)
    assert (await manager.apply([new])).applied
    writer = manager.bulk_writer()
    with pytest.raises(LeaseLost):
        await writer.write(TABLE, SECTION, page(("1", 50, "old owner")), version=50, reset=True, fence=4)
    with pytest.raises(LeaseLost):
        await writer.mark(TABLE, SECTION, P, version=50, fence=4)
    assert (await fields(manager, "1"))["@v"] == "100"

    await writer.write(TABLE, SECTION, page(("2", 200, "newer owner")), version=200, reset=True, fence=6)
    old = Change(
        TABLE, P, SECTION, "2", "U", 300, {"id": b"2", "qty": b"2", "name": b'"older owner"'}, fence=5
    )
    assert (await manager.apply([old])).fenced == [old]
    assert (await fields(manager, "2"))["name"] == '"newer owner"'
    assert await manager.client.hkeys(manager.layout.fence(P)) == [orjson.dumps(TABLE)]


@pytest.mark.parametrize("reset", [True, False], ids=["full", "partial"])
async def test_a_document_key_of_another_type_is_reported_and_the_rest_written(
    manager: DataManager, reset: bool
) -> None:
    await manager.client.set(manager.layout.document(P, SECTION, "2"), "someone else's")
    outcome = await manager.bulk_writer().write(
        TABLE, SECTION, page(("1", 1, "a"), ("2", 2, "b"), ("3", 3, "c")), version=7, reset=reset, fence=0
    )
    assert outcome.wrong_type == [(P, "2")] and outcome.written == 2
    assert await manager.client.get(manager.layout.document(P, SECTION, "2")) == b"someone else's"


async def test_values_of_every_length_are_written_byte_for_byte(manager: DataManager) -> None:
    """A call's rows travel as one MessagePack argument (publishers.mpack):
    every value, short or past 64 KiB, multi-byte UTF-8 too, is the
    document's field as the row had it."""
    lengths = [0, 1, 31, 32, 255, 256, 4095, 4096, 65535, 65536, 70000]
    rows = PageRows(("id", "text"))
    for n in lengths:
        text = orjson.dumps("é" * ((n - 2) // 2) + "x" * ((n - 2) % 2)) if n >= 2 else b"7"[:n]
        assert len(text) == n
        rows.add(P, str(n), [b"%d" % n, text])
    outcome = await manager.bulk_writer().write(TABLE, SECTION, rows, version=7, reset=True, fence=0)
    assert outcome.written == len(lengths)
    for n, (_, values) in zip(lengths, rows.by_partition[P], strict=True):
        stored = await manager.client.hmget(manager.layout.document(P, SECTION, str(n)), ["id", "text"])
        assert stored == values


@pytest.mark.parametrize("sweep", [True, False], ids=["sweeping", "first"])
async def test_a_full_write_over_documents_leaves_nothing_of_them(manager: DataManager, sweep: bool) -> None:
    """A document already there is written whole again, whatever it held:
    every field of the row's, none of its own that the row lacks; both for a
    snapshot that sweeps (which reads @v first) and for one with nothing to
    sweep (which writes first and finds the document after)."""
    writer = manager.bulk_writer()
    await writer.write(TABLE, SECTION, page(("1", 1, "a"), ("2", 2, "b")), version=5, reset=True, fence=0)
    document = manager.layout.document(P, SECTION, "2")
    await manager.client.hset(document, mapping={"stray": "x", "@ts": "then"})  # what nobody should keep
    second = PageRows(("id", "qty"))  # a column dropped since
    for key in ("1", "2", "3"):
        second.add(P, key, [key.encode(), b"9"])
    assert (
        await writer.write(TABLE, SECTION, second, version=6, reset=True, fence=0, sweep=sweep)
    ).written == 3
    for key in ("1", "2", "3"):
        assert {k: v for k, v in (await fields(manager, key)).items() if k != "@ts"} == {
            "@v": "6",
            "id": key,
            "qty": "9",
        }


async def test_rows_past_the_servers_argument_limit_are_written_in_several_calls(
    manager: DataManager,
) -> None:
    """A call's rows travel as one argument, which Redis refuses past
    proto-max-bulk-len by dropping the connection: a page of large rows is
    cut into calls within that limit (here lowered to 10 MB; 40 rows of
    500 KB, 20 MB in all), not retried for ever."""
    client: Any = manager.client
    nodes = {"target_nodes": "all"} if manager.config.cluster else {}
    one = {"target_nodes": "random"} if manager.config.cluster else {}
    before = (await client.config_get("proto-max-bulk-len", **one))["proto-max-bulk-len"]
    rows = PageRows(("id", "blob"))
    for key in range(40):
        rows.add(P, str(key), [b"%d" % key, b'"' + b"x" * 500_000 + b'"'])
    await client.config_set("proto-max-bulk-len", "10mb", **nodes)
    try:
        outcome = await asyncio.wait_for(
            manager.bulk_writer().write(TABLE, SECTION, rows, version=7, reset=True, fence=0), 30
        )
    finally:
        await client.config_set("proto-max-bulk-len", before, **nodes)
    assert outcome.written == 40
    assert await manager.client.scard(manager.layout.index(P, SECTION)) == 40
    assert await manager.client.hstrlen(manager.layout.document(P, SECTION, "39"), "blob") == 500_002


async def test_a_damaged_index_fails_the_page_before_anything_is_written(manager: DataManager) -> None:
    await manager.client.set(manager.layout.index(P, SECTION), "not a set")
    with pytest.raises(CdcError, match="Redis layout is damaged"):
        await manager.bulk_writer().write(TABLE, SECTION, page(("1", 1, "a")), version=7, reset=True, fence=0)
    assert await manager.client.exists(manager.layout.document(P, SECTION, "1")) == 0


async def test_a_subscriber_reloads_on_the_marker_and_its_replica_equals_redis(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    await manager.apply([Change(TABLE, P, SECTION, "9", "I", 2, {"id": b"9", "qty": b"9", "name": b'"x"'})])
    reloads: list[int] = []
    subscriber = Subscriber(manager.client, redis_config.namespace, P, on_reload=reloads.append)
    await subscriber.start()
    assert subscriber.replica == {SECTION: {"9": {"id": 9, "qty": 9, "name": "x"}}}

    writer = manager.bulk_writer()
    await writer.write(TABLE, SECTION, page(("1", 10, "a"), ("2", 20, "b")), version=7, reset=True, fence=0)
    seq = await writer.mark(TABLE, SECTION, P, version=7, fence=0)
    # a change after the marker, applied on top of the reloaded replica
    await manager.apply([Change(TABLE, P, SECTION, "2", "U", 8, {"id": b"2", "qty": b"21", "name": b'"b"'})])

    delivered: list[dict[str, Any]] = []
    async with asyncio.timeout(10):
        while subscriber.position < seq + 1:
            delivered += await subscriber.poll(block=0.2)
    for message in delivered:
        VALIDATOR.validate(message)
    marker = delivered[0]
    assert (marker["op"], marker["seq"], marker["section"], marker["version"], marker["table"]) == (
        "R",
        seq,
        SECTION,
        7,
        TABLE,
    )
    assert [m["op"] for m in delivered] == ["R", "U"]
    assert reloads == [seq + 1] or reloads == [seq]  # loaded at the marker (or after the change, too)
    assert (subscriber.snapshot_reloads, subscriber.reloads) == (1, 0)  # announced, not a gap
    assert subscriber.replica[SECTION] == {
        "9": {"id": 9, "qty": 9, "name": "x"},
        "1": {"id": 1, "qty": 10, "name": "a"},
        "2": {"id": 2, "qty": 21, "name": "b"},
    }
    assert subscriber.replica[SECTION] == await manager.documents(P, SECTION)


async def test_the_marker_seq_is_gap_free_and_its_patch_fails_every_document(manager: DataManager) -> None:
    writer = manager.bulk_writer()
    await manager.apply([Change(TABLE, P, SECTION, "1", "I", 2, {"id": b"1"})])
    assert await writer.mark(TABLE, SECTION, P, version=3, fence=0) == 2
    assert await writer.mark(TABLE, SECTION, P, version=4, fence=0) == 3
    ids = [entry_id for entry_id, _ in await manager.client.xrange(manager.layout.stream(P))]
    assert ids == [b"1-0", b"2-0", b"3-0"]
    # a client that does not know R applies the patch as RFC 6902 says: it
    # fails, for no document and for any document, so the client reloads
    for document in (None, {}, {"id": 1}, {"@reload": False}):
        with pytest.raises((jsonpatch.JsonPatchException, jsonpatch.JsonPointerException)):
            jsonpatch.apply_patch(document, orjson.loads(MARKER_PATCH))


async def test_a_page_spanning_partitions_writes_each_in_its_slot(manager: DataManager) -> None:
    rows = PageRows(("id",))
    for i in range(5):
        rows.add(f"q{i % 2}", str(i), [b"%d" % i])
    outcome = await BulkWriter(manager.client, manager.config, manager.layout).write(
        TABLE, SECTION, rows, version=7, reset=True, fence=0
    )
    assert outcome.written == 5
    assert await manager.client.smembers(manager.layout.index("q0", SECTION)) == {b"0", b"2", b"4"}
    assert await manager.client.smembers(manager.layout.index("q1", SECTION)) == {b"1", b"3"}


@pytest.mark.parametrize("before", [0, 1], ids=["marker first", "after a change"])
async def test_a_marker_reload_that_fails_is_done_at_the_next_poll(
    manager: DataManager, redis_config: RedisConfig, before: int
) -> None:
    """A Redis timeout while loading the documents a bulk snapshot wrote (a
    large load, right after a big snapshot) must not lose the reload: the
    next poll loads them, then delivers the marker, once."""
    await manager.apply([Change(TABLE, P, SECTION, "9", "I", 2, {"id": b"9", "qty": b"9", "name": b'"x"'})])
    subscriber = Subscriber(manager.client, redis_config.namespace, P)
    await subscriber.start()
    if before:
        await manager.apply(
            [Change(TABLE, P, SECTION, "9", "U", 3, {"id": b"9", "qty": b"8", "name": b'"x"'})]
        )
    writer = manager.bulk_writer()
    await writer.write(TABLE, SECTION, page(("1", 10, "a"), ("2", 20, "b")), version=7, reset=True, fence=0)
    seq = await writer.mark(TABLE, SECTION, P, version=7, fence=0)
    real_load, failed = subscriber._load, list[int]()

    async def load_failing_once() -> None:
        if not failed:
            failed.append(subscriber.seq)
            raise RedisUnavailable("Redis timed out during the load (injected)")
        await real_load()

    subscriber._load = load_failing_once  # type: ignore[method-assign]
    if before:  # what was taken before the marker is delivered, the error kept for later
        assert [m["op"] for m in await subscriber.poll(block=0.2)] == ["U"]
    else:
        with pytest.raises(RedisUnavailable):
            await subscriber.poll(block=0.2)
    assert failed and subscriber.snapshot_reloads == 0
    delivered = await subscriber.poll(block=0.2)
    assert [(m["op"], m["seq"]) for m in delivered] == [("R", seq)]
    assert (subscriber.snapshot_reloads, subscriber.reloads) == (1, 0)
    assert subscriber.replica[SECTION] == await manager.documents(P, SECTION)
    assert set(subscriber.replica[SECTION]) == {"1", "2", "9"}


async def test_the_seen_set_is_written_only_for_a_snapshot_that_sweeps(manager: DataManager) -> None:
    """The sweep needs the keys a whole snapshot wrote; a snapshot with
    nothing to sweep (the section had no partition before it) would only
    build a set of every key to delete it unread."""
    writer, seen = manager.bulk_writer(), manager.layout.seen(P, SECTION)
    await writer.write(TABLE, SECTION, page(("1", 1, "a")), version=7, reset=True, fence=0, sweep=False)
    assert not await manager.client.exists(seen)
    assert await fields(manager, "1") != {}  # written all the same

    await writer.write(TABLE, SECTION, page(("2", 2, "b")), version=7, reset=True, fence=0, sweep=True)
    assert await manager.client.smembers(seen) == {b"2"}
    await writer.write(TABLE, SECTION, page(("3", 3, "c")), version=7, reset=False, fence=0)
    assert await manager.client.smembers(seen) == {b"2"}  # a key range never records
