"""Logical capture's own rules, beyond the shared contract (tests/contract runs
that against it as ``postgres-logical``): the slot moves only up to the
checkpoint Redis holds; a read whose slot trails its ``since`` by more than a
slice of decoding still goes on (a sidecar restarted after a backlog); an
unchanged TOASTed value is never null; a slot dropped by hand, or advanced
past a checkpoint, is TrackingExpired and a snapshot makes it again; and the
pgoutput parser itself on hand-made messages.
"""

from __future__ import annotations

import random
import struct

import pytest

from cdc.config import TableConfig
from cdc.errors import SourceError, TableChanged, TrackingExpired, TrackingNotEnabled
from cdc.sources import postgres_logical
from cdc.sources.base import TableInfo
from cdc.sources.pg_pgoutput import UNCHANGED, NetChanges, Relation, transactions
from tests.contract.harness import PostgresLogicalHarness, Replica, read_all

ITEMS = {"id": "int", "n": "int", "note": "text"}


async def _confirmed(harness: PostgresLogicalHarness, table: str) -> int:
    slot = harness.pg_source.slot(table, harness.admin.info.dbname)
    row = await (
        await harness.admin.execute(
            "select (confirmed_flush_lsn - '0/0')::bigint from pg_replication_slots where slot_name = %s",
            [slot],
        )
    ).fetchone()
    assert row is not None
    return int(row[0])


async def test_the_slot_moves_up_to_the_stored_checkpoint_never_past_it(
    harness: PostgresLogicalHarness,
) -> None:
    table_config = await harness.create_table("items", ITEMS, ["id"])
    source = harness.pg_source
    info = await source.describe(table_config)
    start = await source.current_version()
    for i in range(3):
        async with harness.writer() as w:
            await w.insert(table_config, {"id": i, "n": i, "note": "x"})
    rows, ahead = await read_all(source, info, start)
    assert len(rows) == 3
    stored = rows[0].version  # Redis holds the first change only

    source.checkpoint_stored(info.table, stored)
    await read_all(source, info, ahead)  # a read that ran ahead of the checkpoint

    assert await _confirmed(harness, info.table) == stored
    again, _ = await read_all(source, info, stored)  # a restart from the stored checkpoint loses nothing
    assert [r.key["id"] for r in again] == [1, 2]


async def test_a_slot_trailing_since_by_more_than_a_slice_still_reads_on(
    harness: PostgresLogicalHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_logical, "DECODE_CHANGES", 12)  # a slice: a transaction or three
    table_config = await harness.create_table("items", ITEMS, ["id"])
    info = await harness.pg_source.describe(table_config)
    replica = await Replica.from_snapshot(harness.pg_source, info)
    for i in range(40):
        async with harness.writer() as w:
            await w.insert(table_config, {"id": i, "n": i, "note": "x"})
    reads = 0
    while True:  # never advanced: every read's slice starts at the slot, far behind its since
        found = await replica.catch_up(limit=7)
        reads += 1
        if not found:
            break
    assert reads > 3, "read in slices"
    assert replica.rows == await harness.rows(table_config)


async def test_an_unchanged_toasted_value_keeps_its_value(harness: PostgresLogicalHarness) -> None:
    table_config = await harness.create_table("docs", {"id": "int", "n": "int", "body": "text"}, ["id"])
    info = await harness.pg_source.describe(table_config)
    big = "".join(random.Random(2).choices("abcdefghijklmnopqrstuvwxyz", k=30_000))  # stored out of line
    async with harness.writer() as w:
        await w.insert(table_config, {"id": 1, "n": 1, "body": big})
        await w.insert(table_config, {"id": 2, "n": 1, "body": big})
    since = await harness.pg_source.current_version()
    async with harness.writer() as w:
        await w.update(table_config, {"id": 1}, {"n": 2})  # pgoutput sends body as "unchanged"
        await w.update(table_config, {"id": 2}, {"n": 2})
    async with harness.writer() as w:
        await w.delete(table_config, {"id": 2})  # gone when the read looks it up: its D follows

    rows, _ = await read_all(harness.pg_source, info, since)

    assert [(r.op, r.key["id"], r.values) for r in rows] == [
        ("U", 1, {"id": 1, "n": 2, "body": big}),
        ("D", 2, None),
    ]


async def _generated_table(harness: PostgresLogicalHarness, name: str) -> tuple[TableConfig, TableInfo, int]:
    """A table with a stored generated column (g = v * 10), and the version
    before its rows 1 and 2 were inserted."""
    columns = {"id": "int", "v": "int", "g": "int generated always as (v * 10) stored"}
    table_config = await harness.create_table(name, columns, ["id"])
    info = await harness.pg_source.describe(table_config)
    since = await harness.pg_source.current_version()
    async with harness.writer() as w:
        await w.insert(table_config, {"id": 1, "v": 1})
        await w.insert(table_config, {"id": 2, "v": 2})
    return table_config, info, since


async def test_a_generated_column_is_read_from_the_table(harness: PostgresLogicalHarness) -> None:
    # pgoutput never sends a stored generated column: its value is the row's, read by key
    table_config, info, since = await _generated_table(harness, "gen")
    async with harness.writer() as w:
        await w.update(table_config, {"id": 2}, {"v": 5})

    rows, _ = await read_all(harness.pg_source, info, since)

    assert [(r.op, r.values) for r in rows] == [
        ("I", {"id": 1, "v": 1, "g": 10}),
        ("I", {"id": 2, "v": 5, "g": 50}),
    ]


async def test_a_generated_column_dropped_after_a_read_is_table_changed(
    harness: PostgresLogicalHarness,
) -> None:
    # the rows are looked up in one pipeline: a lookup's own error still names the change
    table_config, info, since = await _generated_table(harness, "gendrop")
    rows, _ = await read_all(harness.pg_source, info, since)
    assert [r.values for r in rows] == [{"id": 1, "v": 1, "g": 10}, {"id": 2, "v": 2, "g": 20}]
    await harness.admin.execute(f"alter table {table_config.table} drop column g")

    with pytest.raises(TableChanged, match='column "g" does not exist'):
        await harness.pg_source.read_changes(info, since, limit=10)


async def test_a_column_dropped_within_a_read_is_never_carried_over(harness: PostgresLogicalHarness) -> None:
    # the row's change before the drop holds the column; the one after must not take it from there
    table_config = await harness.create_table("drops", {"id": "int", "v": "int", "c": "text"}, ["id"])
    info = await harness.pg_source.describe(table_config)
    async with harness.writer() as w:
        await w.insert(table_config, {"id": 1, "v": 1, "c": "x"})
    since = await harness.pg_source.current_version()
    async with harness.writer() as w:
        await w.update(table_config, {"id": 1}, {"c": "y"})
    await harness.admin.execute(f"alter table {table_config.table} drop column c")
    async with harness.writer() as w:
        await w.update(table_config, {"id": 1}, {"v": 2})

    with pytest.raises(TableChanged):
        await harness.pg_source.read_changes(info, since, limit=10)


async def test_a_replica_identity_changed_after_enable_fails_the_read_until_set_back(
    harness: PostgresLogicalHarness,
) -> None:
    columns = {"id": "int", "code": "text not null", "v": "int"}
    table_config = await harness.create_table("ident", columns, ["id"])
    name = f"{table_config.schema}.ident"
    await harness.admin.execute(f"create unique index ident_code on {name} (code)")
    source = harness.pg_source
    info = await source.describe(table_config)
    async with harness.writer() as w:
        await w.insert(table_config, {"id": 1, "code": "a", "v": 1})
    since = await source.current_version()
    await harness.admin.execute(f"alter table {name} replica identity using index ident_code")
    async with harness.writer() as w:
        await w.insert(table_config, {"id": 2, "code": "b", "v": 2})
    rows, _ = await read_all(source, info, since)  # an insert carries its whole row: nothing to fix
    assert [(r.op, r.key) for r in rows] == [("I", {"id": 2})]
    async with harness.writer() as w:
        await w.delete(table_config, {"id": 1})  # its WAL key is code, not id

    with pytest.raises(SourceError, match="REPLICA IDENTITY is USING INDEX.*REPLICA IDENTITY DEFAULT"):
        await source.read_changes(info, since, limit=10)
    await harness.admin.execute(f"alter table {name} replica identity default")
    with pytest.raises(TrackingExpired, match="logged under REPLICA IDENTITY USING INDEX"):
        await source.read_changes(info, since, limit=10)  # the delete is lost: a snapshot puts it right


async def test_a_dropped_slot_expires_the_checkpoint_and_a_snapshot_makes_it_again(
    harness: PostgresLogicalHarness,
) -> None:
    table_config = await harness.create_table("items", ITEMS, ["id"])
    source = harness.pg_source
    info = await source.describe(table_config)
    since = await source.current_version()
    slot = source.slot(info.table, harness.admin.info.dbname)
    await harness.admin.execute("select pg_drop_replication_slot(%s)", [slot])

    with pytest.raises(TrackingExpired, match="slot is gone"):
        await source.read_changes(info, since, limit=10)
    replica = await Replica.from_snapshot(source, info)
    async with harness.writer() as w:
        await w.insert(table_config, {"id": 7, "n": 7, "note": "after"})
    assert [(r.op, r.key) for r in await replica.catch_up()] == [("I", {"id": 7})]


async def test_disable_drops_the_slot_and_reads_then_say_not_enabled(harness: PostgresLogicalHarness) -> None:
    table_config = await harness.create_table("items", ITEMS, ["id"])
    source = harness.pg_source
    info = await source.describe(table_config)
    since = await source.current_version()

    done = await source.tracking_disable([table_config])

    assert "publication and replication slot" in done[0]
    with pytest.raises(TrackingNotEnabled):
        await source.read_changes(info, since, limit=10)
    with pytest.raises(TrackingNotEnabled):
        [p async for p in source.snapshot(info, page_size=10)]
    assert [s.enabled for s in await source.tracking_status([table_config])] == [False]
    harness.tracked.remove(table_config)


async def test_status_and_doctor_show_the_wal_a_slot_holds(harness: PostgresLogicalHarness) -> None:
    table_config = await harness.create_table("items", ITEMS, ["id"])
    [status] = await harness.pg_source.tracking_status([table_config])
    assert status.enabled and "bytes of WAL" in status.detail
    info = await harness.pg_source.describe(table_config)
    await harness.pg_source.read_changes(info, await harness.pg_source.current_version(), limit=10)
    assert harness.pg_source.retained_wal[info.table] > 0  # cdc_slot_retained_wal_bytes
    findings = {f.subject: f for f in await harness.pg_source.doctor([table_config])}
    assert "retained_wal_bytes" in findings[table_config.table].extra
    assert findings["max_slot_wal_keep_size"].level == "warning"  # the test server keeps it unlimited


# -- pgoutput, on hand-made messages ------------------------------------------------------


def _string(text: str) -> bytes:
    return text.encode() + b"\0"


def _tuple(*values: bytes | None | object) -> bytes:
    out = struct.pack("!h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value is UNCHANGED:
            out += b"u"
        else:
            assert isinstance(value, bytes)
            out += b"t" + struct.pack("!i", len(value)) + value
    return out


RELATION = (
    b"R" + struct.pack("!I", 16400) + _string("s") + _string("t") + b"d" + struct.pack("!h", 2)
    + b"\x01" + _string("id") + struct.pack("!Ii", 23, -1)
    + b"\x00" + _string("body") + struct.pack("!Ii", 25, -1)
)  # fmt: skip


def _begin(lsn: int) -> bytes:
    return b"B" + struct.pack("!qqi", lsn, 0, 1)


def _commit(lsn: int) -> bytes:
    return b"C" + b"\0" + struct.pack("!qqq", lsn, lsn + 8, 0)


def test_pgoutput_key_update_is_a_delete_and_an_insert_and_unchanged_values_carry_over() -> None:
    insert = b"I" + struct.pack("!I", 16400) + b"N" + _tuple(b"1", b"big")
    update = b"U" + struct.pack("!I", 16400) + b"N" + _tuple(b"1", UNCHANGED)
    moved = b"U" + struct.pack("!I", 16400) + b"K" + _tuple(b"1", None) + b"N" + _tuple(b"2", UNCHANGED)
    messages = [_begin(100), RELATION, insert, _commit(100), _begin(200), update, moved, _commit(200)]
    relations: dict[int, Relation] = {}

    decoded = list(transactions(iter(messages), relations))

    assert [t.commit_lsn for t in decoded] == [100, 200]
    net = NetChanges(("id",), lambda relation, values: dict(zip(relation.columns, values, strict=True)))
    for transaction in decoded:
        for change in transaction.changes:
            net.add(change, transaction.commit_lsn)
    assert sorted(net.items()) == [
        ((b"1",), "D", 200, None),
        ((b"2",), "I", 200, {"id": b"2", "body": b"big"}),
    ]


def test_pgoutput_truncate_names_its_relations() -> None:
    truncate = b"T" + struct.pack("!ib", 2, 0) + struct.pack("!II", 16400, 16500)
    [transaction] = transactions(iter([_begin(5), truncate, _commit(5)]), {})
    assert transaction.changes[0].kind == "T" and transaction.changes[0].truncated == (16400, 16500)
