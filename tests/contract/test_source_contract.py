"""The ChangeSource contract (DESIGN.md §2), proven against real databases.

Every test runs once per harness in ``HARNESSES``; nothing here knows the
dialect. The state a tracker would build (a snapshot, then net changes from
each checkpoint) is compared with the table's real contents, so a lost,
duplicated or misclassified change fails a test rather than hiding in a
count.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cdc.config import TableConfig
from cdc.errors import SchemaError, TrackingExpired, TrackingNotEnabled, UnsupportedType
from cdc.sources.base import ChangeSource, TableInfo
from cdc.values import encode_value

from .harness import HARNESSES, Replica, SourceHarness, Writer, make_table_config, read_all

ITEMS = {"id": "int", "n": "int", "note": "text"}


@pytest.fixture(params=sorted(HARNESSES))
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[SourceHarness]:
    async with HARNESSES[request.param](request) as running:
        yield running


async def items(harness: SourceHarness, name: str = "items") -> tuple[TableInfo, ChangeSource]:
    table_config = await harness.create_table(name, ITEMS, ["id"])
    return await harness.source.describe(table_config), harness.source


async def write(harness: SourceHarness, info: TableInfo, *steps: tuple[str, Any, Any]) -> None:
    """Each step in a transaction of its own: (insert, row, _), (update, key, values), (delete, key, _)."""
    table_config = make_table_config(info.schema, info.name)
    for action, first, second in steps:
        async with harness.writer() as writer:
            if action == "insert":
                await writer.insert(table_config, first)
            elif action == "update":
                await writer.update(table_config, first, second)
            elif action == "move":
                await writer.move(table_config, first, second)
            else:
                await writer.delete(table_config, first)


# -- net operations ----------------------------------------------------------


async def test_insert_then_update_after_since_is_one_insert(harness: SourceHarness) -> None:
    info, source = await items(harness)
    since = await source.current_version()
    await write(harness, info, ("insert", {"id": 1, "n": 1, "note": "a"}, None))
    await write(harness, info, ("update", {"id": 1}, {"n": 2}))

    rows, next_version = await read_all(source, info, since)

    assert [(r.op, r.key, r.values, r.changed_columns) for r in rows] == [
        ("I", {"id": 1}, {"id": 1, "n": 2, "note": "a"}, None)
    ]
    assert since < rows[0].version <= next_version


async def test_update_is_u_with_its_changed_columns(harness: SourceHarness) -> None:
    info, source = await items(harness)
    await write(harness, info, ("insert", {"id": 1, "n": 1, "note": "a"}, None))
    since = await source.current_version()
    await write(harness, info, ("update", {"id": 1}, {"n": 5}))

    rows, _ = await read_all(source, info, since)

    changed = frozenset({"n"}) if harness.knows_changed_columns else None
    assert [(r.op, r.values, r.changed_columns) for r in rows] == [
        ("U", {"id": 1, "n": 5, "note": "a"}, changed)
    ]


async def test_delete_is_d_with_only_the_key(harness: SourceHarness) -> None:
    info, source = await items(harness)
    await write(harness, info, ("insert", {"id": 7, "n": 1, "note": "a"}, None))
    since = await source.current_version()
    await write(harness, info, ("delete", {"id": 7}, None))

    rows, _ = await read_all(source, info, since)

    assert [(r.op, r.key, r.values, r.changed_columns) for r in rows] == [("D", {"id": 7}, None, None)]


async def test_insert_then_delete_after_since_leaves_no_live_row(harness: SourceHarness) -> None:
    info, source = await items(harness)
    since = await source.current_version()
    await write(harness, info, ("insert", {"id": 1, "n": 1, "note": "a"}, None), ("delete", {"id": 1}, None))

    rows, _ = await read_all(source, info, since)

    assert all(r.op == "D" and r.values is None for r in rows)  # a D of an absent row, or nothing


async def test_primary_key_update_is_d_of_the_old_key_and_i_of_the_new(harness: SourceHarness) -> None:
    info, source = await items(harness)
    await write(harness, info, ("insert", {"id": 1, "n": 1, "note": "a"}, None))
    since = await source.current_version()
    await write(harness, info, ("move", {"id": 1}, {"id": 100}))

    rows, _ = await read_all(source, info, since)

    assert sorted((r.op, r.key["id"], r.values) for r in rows) == [
        ("D", 1, None),
        ("I", 100, {"id": 100, "n": 1, "note": "a"}),
    ]


async def test_composite_primary_key(harness: SourceHarness) -> None:
    table_config = await harness.create_table(
        "lines", {"order_id": "int", "line": "int", "qty": "int"}, ["order_id", "line"]
    )
    info = await harness.source.describe(table_config)
    assert info.primary_key == ("order_id", "line")
    replica = await Replica.from_snapshot(harness.source, info)
    async with harness.writer() as w:
        for order, line in [(1, 1), (1, 2), (2, 1)]:
            await w.insert(table_config, {"order_id": order, "line": line, "qty": order * 10 + line})
    rows = await replica.catch_up()
    assert {(r.op, r.key["order_id"], r.key["line"]) for r in rows} == {("I", 1, 1), ("I", 1, 2), ("I", 2, 1)}

    async with harness.writer() as w:
        await w.update(table_config, {"order_id": 1, "line": 2}, {"qty": 99})
        await w.delete(table_config, {"order_id": 2, "line": 1})
        await w.move(table_config, {"order_id": 1, "line": 1}, {"order_id": 1, "line": 3})
    rows = await replica.catch_up()

    assert sorted((r.op, r.key["order_id"], r.key["line"]) for r in rows) == [
        ("D", 1, 1),
        ("D", 2, 1),
        ("I", 1, 3),
        ("U", 1, 2),
    ]
    assert replica.rows == await harness.rows(table_config)


async def test_changed_columns_are_those_changed_after_since(harness: SourceHarness) -> None:
    table_config = await harness.create_table(
        "wide", {"id": "int", "a": "int", "b": "text", "c": "decimal"}, ["id"]
    )
    info = await harness.source.describe(table_config)
    await write(harness, info, ("insert", {"id": 1, "a": 1, "b": "x", "c": 1}, None))
    first = await harness.source.current_version()
    await write(harness, info, ("update", {"id": 1}, {"a": 2}))
    second = await harness.source.current_version()
    await write(harness, info, ("update", {"id": 1}, {"b": "y", "c": 2}))

    from_first, _ = await read_all(harness.source, info, first)
    from_second, _ = await read_all(harness.source, info, second)

    if not harness.knows_changed_columns:  # unknown, not "nothing"
        assert [r.changed_columns for r in from_first + from_second] == [None, None]
        return
    assert [r.changed_columns for r in from_first] == [frozenset({"a", "b", "c"})]
    assert [r.changed_columns for r in from_second] == [frozenset({"b", "c"})]


async def test_published_columns_primary_key_first(harness: SourceHarness) -> None:
    table_config = await harness.create_table(
        "some", {"note": "text", "id": "int", "n": "int"}, ["id"], published=["n"]
    )
    info = await harness.source.describe(table_config)
    assert info.column_names == ("id", "n")
    since = await harness.source.current_version()
    await write(harness, info, ("insert", {"id": 1, "n": 2, "note": "hidden"}, None))

    rows, _ = await read_all(harness.source, info, since)
    snapshot = [row async for page in harness.source.snapshot(info, page_size=10) for row in page.rows]

    assert [r.values for r in rows] == [{"id": 1, "n": 2}]
    assert snapshot == [{"id": 1, "n": 2}]


async def test_every_type_and_null_round_trip_to_json(harness: SourceHarness) -> None:
    cases = harness.type_cases()
    table_config = await harness.create_table(
        "types", {"id": "int", **{c.column: c.column_type for c in cases}}, ["id"]
    )
    info = await harness.source.describe(table_config)
    since = await harness.source.current_version()
    await harness.insert_literals(table_config, {"id": "1", **{c.column: c.literal for c in cases}})
    await harness.insert_literals(table_config, {"id": "2"})

    rows, _ = await read_all(harness.source, info, since)
    snapshot = [row async for page in harness.source.snapshot(info, page_size=10) for row in page.rows]

    changed = {r.key["id"]: r.values for r in rows}
    for values in (changed[1], snapshot[0]):
        assert values is not None
        assert {c.column: encode_value(values[c.column], c.column) for c in cases} == {
            c.column: c.expected for c in cases
        }
    for values in (changed[2], snapshot[1]):
        assert values is not None
        assert {c.column: encode_value(values[c.column]) for c in cases} == {c.column: b"null" for c in cases}


async def test_idle_table_checkpoint_follows_the_source(harness: SourceHarness) -> None:
    idle, source = await items(harness, "idle")
    busy, _ = await items(harness, "busy")
    _, checkpoint = await read_all(source, idle, await source.current_version())
    since_busy = await source.current_version()
    await write(harness, busy, ("insert", {"id": 1, "n": 1, "note": "a"}, None))
    busy_rows, _ = await read_all(source, busy, since_busy)

    rows, next_version = await read_all(source, idle, checkpoint)

    assert rows == []
    assert next_version >= busy_rows[0].version > checkpoint


# -- describe ----------------------------------------------------------------


async def test_describe_refuses_what_it_cannot_publish(harness: SourceHarness) -> None:
    source = harness.source
    plain = await harness.create_table("plain", ITEMS, ["id"], track=False)
    keyless = await harness.create_table("keyless", ITEMS, [], track=False)

    with pytest.raises(SchemaError, match="nothere"):
        await source.describe(make_table_config(plain.schema, "nothere"))
    with pytest.raises(SchemaError, match="nosuchcolumn"):
        await source.describe(make_table_config(plain.schema, plain.name, ["n", "nosuchcolumn"]))
    with pytest.raises(SchemaError, match="keyless"):
        await source.describe(keyless)
    with pytest.raises(SchemaError, match="keyless"):
        await source.tracking_enable([keyless])
    if harness.unsupported_type is None:
        return
    odd = await harness.create_table(
        "odd", {"id": "int", "doc": harness.unsupported_type}, ["id"], track=False
    )
    with pytest.raises(UnsupportedType, match="doc"):
        await source.describe(odd)
    assert (await source.describe(make_table_config(odd.schema, odd.name, ["id"]))).column_names == ("id",)


async def test_untracked_table_is_tracking_not_enabled(harness: SourceHarness) -> None:
    await items(harness)  # tracking is installed for another table
    plain = await harness.create_table("plain", ITEMS, ["id"], track=False)
    info = await harness.source.describe(plain)

    with pytest.raises(TrackingNotEnabled):
        await harness.source.read_changes(info, await harness.source.current_version(), limit=10)
    assert [s.enabled for s in await harness.source.tracking_status([plain])] == [False]


# -- checkpoints that expire ---------------------------------------------------


async def test_retention_cleanup_expires_checkpoints_it_passed(harness: SourceHarness) -> None:
    info, source = await items(harness)
    before = await source.current_version()
    await write(harness, info, ("insert", {"id": 1, "n": 1, "note": "a"}, None))
    _, checkpoint = await read_all(source, info, before)
    await write(harness, info, ("update", {"id": 1}, {"n": 2}))

    await harness.expire_tracking(make_table_config(info.schema, info.name))

    for stale in (before, checkpoint):
        with pytest.raises(TrackingExpired) as raised:
            await source.read_changes(info, stale, limit=10)
        assert raised.value.table == info.table
    rows, _ = await read_all(source, info, await source.current_version())
    assert rows == []


async def test_truncate_expires_checkpoints_and_a_snapshot_recovers(harness: SourceHarness) -> None:
    info, source = await items(harness)
    before = await source.current_version()
    await write(harness, info, ("insert", {"id": 1, "n": 1, "note": "a"}, None))
    _, checkpoint = await read_all(source, info, before)

    await harness.truncate(make_table_config(info.schema, info.name))

    with pytest.raises(TrackingExpired):
        await source.read_changes(info, checkpoint, limit=10)
    replica = await Replica.from_snapshot(source, info)
    assert replica.rows == {}
    await write(harness, info, ("insert", {"id": 2, "n": 2, "note": "b"}, None))
    assert [(r.op, r.key) for r in await replica.catch_up()] == [("I", {"id": 2})]


async def test_source_behind_the_checkpoint_expires(harness: SourceHarness) -> None:
    info, source = await items(harness)
    restored_past = await source.current_version() + 1_000_000  # a checkpoint from the future: restore
    with pytest.raises(TrackingExpired):
        await source.read_changes(info, restored_past, limit=10)


# -- consistency ---------------------------------------------------------------


async def test_snapshot_is_one_consistent_view_while_writers_commit(harness: SourceHarness) -> None:
    info, source = await items(harness)
    table_config = make_table_config(info.schema, info.name)
    async with harness.writer() as w:
        for i in range(40):
            await w.insert(table_config, {"id": i, "n": i, "note": f"row {i}"})
    before = await harness.rows(table_config)
    rng = random.Random(7)
    seen: dict[Any, dict[str, Any]] = {}
    version = None
    async for page in source.snapshot(info, page_size=6):
        version = page.version
        seen.update({r["id"]: r for r in page.rows})
        async with harness.writer() as w:  # rows behind and ahead of the page change now
            await w.update(table_config, {"id": rng.randrange(40)}, {"n": -1})
            await w.delete(table_config, {"id": rng.randrange(40)})
            await w.insert(table_config, {"id": 1000 + len(seen), "n": 0, "note": "new"})
            await w.move(table_config, {"id": rng.randrange(40)}, {"id": 2000 + len(seen)})
    assert {(k,): v for k, v in seen.items()} == before

    assert version is not None
    replica = Replica(source, info, version)
    replica.rows = {(k,): v for k, v in seen.items()}
    await replica.catch_up(limit=5)
    assert replica.rows == await harness.rows(table_config)


async def test_paging_returns_every_row_exactly_once(harness: SourceHarness) -> None:
    info, source = await items(harness)
    table_config = make_table_config(info.schema, info.name)
    replica = await Replica.from_snapshot(source, info)
    for chunk in range(3):  # many rows share a version: paging must split inside one
        async with harness.writer() as w:
            for i in range(chunk * 20, chunk * 20 + 20):
                await w.insert(table_config, {"id": i, "n": i, "note": "x"})

    page = await source.read_changes(info, replica.version, limit=7)
    delivered = list(page.rows)
    while page.more:
        async with harness.writer() as w:  # move delivered and pending entries above the bound
            await w.update(table_config, {"id": delivered[-1].key["id"]}, {"n": -1})
            await w.update(table_config, {"id": 59 - len(delivered)}, {"n": -2})
            await w.insert(table_config, {"id": 100 + len(delivered), "n": 0, "note": "late"})
        assert page.cursor is not None
        page = await source.read_changes(
            info, replica.version, limit=7, upto=page.next_version, after=page.cursor
        )
        delivered += page.rows

    ids = [r.key["id"] for r in delivered]
    assert len(ids) == len(set(ids)) and set(ids) <= set(range(60)) and len(ids) > 40
    replica.apply(delivered)
    replica.version = page.next_version
    await replica.catch_up(limit=7)  # what moved above the bound comes now
    assert replica.rows == await harness.rows(table_config)


async def test_no_change_is_lost_under_concurrent_writers(harness: SourceHarness) -> None:
    """Writers commit in any order while a reader follows checkpoints; a long
    transaction starts first, writes early and late, and commits last."""
    info, source = await items(harness, "busy")
    table_config = make_table_config(info.schema, info.name)
    replica = await Replica.from_snapshot(source, info)
    long_writer = await harness.begin()
    await long_writer.take_version()
    await long_writer.insert(table_config, {"id": 10_000, "n": 0, "note": "early"})

    async def writer(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(15):
            w = await harness.begin()
            for key in sorted(rng.sample(range(40), rng.randint(1, 4))):  # sorted: no deadlock
                await _random_write(w, table_config, rng, key, spare=10_100 + seed * 100)
            await (w.commit() if rng.random() < 0.9 else w.rollback())

    writers = asyncio.gather(*(writer(seed) for seed in range(6)))
    checkpoints = []
    try:
        while not writers.done():
            await replica.catch_up(limit=13)
            checkpoints.append(replica.version)
            await source.wait_for_changes(0.02)
        await writers
    finally:
        writers.cancel()  # should an assertion fail while they run
    for key in range(0, 40, 3):  # the long transaction's late writes, then its commit
        await long_writer.upsert(table_config, {"id": key, "n": -key, "note": "late"})
    await long_writer.commit()

    await harness.settle()
    await replica.catch_up(limit=13)
    assert checkpoints == sorted(checkpoints) and len(checkpoints) > 1
    assert replica.rows == await harness.rows(table_config)
    assert replica.rows[(10_000,)]["note"] == "early"


async def _random_write(w: Writer, table_config: Any, rng: random.Random, key: int, spare: int) -> None:
    choice = rng.random()
    if choice < 0.6:
        await w.upsert(
            table_config, {"id": key, "n": rng.randrange(1000), "note": rng.choice(["a", "b", None])}
        )
    elif choice < 0.85:
        await w.delete(table_config, {"id": key})
    else:  # to a key of this writer's own: never locked by another
        await w.move(table_config, {"id": key}, {"id": spare + rng.randrange(100)})


# A schedule: steps of three interleaved transactions and a reader.
_STEP = st.one_of(
    st.tuples(st.sampled_from(["upsert", "delete"]), st.integers(0, 2), st.integers(0, 5), st.integers(0, 9)),
    st.tuples(st.just("move"), st.integers(0, 2), st.integers(0, 5), st.integers(0, 5)),
    st.tuples(st.sampled_from(["commit", "rollback", "read"]), st.integers(0, 2), st.just(0), st.just(0)),
)


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    phases=[Phase.generate],  # no shrinking: a schedule is short enough to read, and time stays bounded
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schedule=st.lists(_STEP, min_size=5, max_size=30))
async def test_interleaved_transactions_rebuild_the_table(
    harness: SourceHarness, schedule: list[tuple[str, int, int, int]]
) -> None:
    """Any interleaving of overlapping transactions (row locks respected, so the
    schedule never blocks) and reads: the rebuilt table equals the real one."""
    info, source = await items(harness, f"h{uuid.uuid4().hex[:12]}")
    table_config = make_table_config(info.schema, info.name)
    replica = await Replica.from_snapshot(source, info)
    open_: dict[int, Writer] = {}
    try:
        await _run_schedule(harness, table_config, replica, schedule, open_)
    finally:  # an example that fails must not leave transactions open for the next one
        for writer in open_.values():
            await writer.rollback()
    await harness.settle()
    await replica.catch_up(limit=3)
    assert replica.rows == await harness.rows(table_config)


async def _run_schedule(
    harness: SourceHarness,
    table_config: TableConfig,
    replica: Replica,
    schedule: list[tuple[str, int, int, int]],
    open_: dict[int, Writer],
) -> None:
    """Run the steps; row locks are respected, so the schedule never blocks."""
    locks: dict[int, int] = {}  # key -> transaction holding its row lock
    for action, tx, key, value in schedule:
        if action == "read":
            await replica.catch_up(limit=3)
        elif action in ("commit", "rollback"):
            if tx in open_:
                await getattr(open_.pop(tx), action)()
                locks = {k: t for k, t in locks.items() if t != tx}
        else:
            keys = {key, value} if action == "move" else {key}
            if any(locks.get(k, tx) != tx for k in keys):
                continue  # would wait for another open transaction of this schedule
            writer = open_.get(tx) or open_.setdefault(tx, await harness.begin())
            locks.update(dict.fromkeys(keys, tx))
            if action == "upsert":
                await writer.upsert(table_config, {"id": key, "n": value, "note": str(tx)})
            elif action == "delete":
                await writer.delete(table_config, {"id": key})
            else:
                await writer.move(table_config, {"id": key}, {"id": value})
    for tx in sorted(open_):
        await open_.pop(tx).commit()
