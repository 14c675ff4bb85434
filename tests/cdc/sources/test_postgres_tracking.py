"""What only the PostgreSQL source has: the tracking it installs, transaction
ids as versions, LISTEN/NOTIFY wake-ups, and the mapping of driver errors.

The behaviour every source shares is proven in tests/contract/.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cdc.config import SourceConfig
from cdc.devservers import free_port
from cdc.errors import (
    ConnectError,
    SchemaError,
    SourceUnavailable,
    TrackingExpired,
    TrackingNotEnabled,
)
from cdc.sources import make_source
from cdc.sources.base import ChangeSource, TableInfo
from cdc.sources.pg_dsn import redact_dsn, scrub
from cdc.sources.pg_tracking import net_table_name, trigger_names
from cdc.sources.postgres import PostgresSource
from tests.cdc.sources.test_reader_lock import until_waiting
from tests.contract.harness import PostgresHarness, PostgresWriter, Replica, make_table_config, read_all

ITEMS = {"id": "int", "n": "int", "note": "text"}


@pytest.fixture
async def pg(request: pytest.FixtureRequest) -> AsyncIterator[PostgresHarness]:
    async with PostgresHarness.running(request) as harness:
        assert isinstance(harness, PostgresHarness)
        yield harness


async def scalar(pg: PostgresHarness, query: str | sql.Composable, *params: Any) -> Any:
    row = await (await pg.admin.execute(query, params or None)).fetchone()
    return row[0] if row else None


async def tracked(pg: PostgresHarness, name: str = "items") -> tuple[TableInfo, ChangeSource]:
    table = await pg.create_table(name, ITEMS, ["id"])
    return await pg.source.describe(table), pg.source


async def scalar_in(writer: PostgresWriter, query: str) -> Any:
    row = await (await writer.conn.execute(query)).fetchone()
    return row[0] if row else None


async def execute(pg: PostgresHarness, statement: str) -> None:
    """Run a statement of the test's own (``{s}`` is the test schema), settled."""
    await pg.admin.execute(statement.replace("{s}", f'"{pg.schema}"'))
    await pg.settle()


# -- what enable installs ------------------------------------------------------


async def test_enable_installs_registry_net_table_triggers_and_functions(pg: PostgresHarness) -> None:
    table = await pg.create_table(
        "orders", {"region": "text", "id": "uuid", "total": "decimal"}, ["region", "id"]
    )
    ts, net = pg.tracking_schema, net_table_name(pg.schema, "orders")

    columns = await (
        await pg.admin.execute(
            "select column_name, data_type from information_schema.columns"
            " where table_schema = %s and table_name = %s order by ordinal_position",
            [ts, net],
        )
    ).fetchall()
    assert columns == [
        ("region", "text"),
        ("id", "uuid"),
        ("op", "character"),
        ("version", "bigint"),
        ("creation_version", "bigint"),
        ("column_versions", "jsonb"),
        ("changed_at", "timestamp with time zone"),
    ]
    index = await scalar(
        pg, "select indexdef from pg_indexes where schemaname = %s and indexdef like %s", ts, "%(version%"
    )
    assert index is not None and "(version, region, id)" in index
    registered = await scalar(
        pg, sql.SQL("select min_valid_version from {}.tracked_tables").format(sql.Identifier(ts))
    )
    assert registered > 0
    states = await (
        await pg.admin.execute(
            "select tgname, tgenabled from pg_trigger where tgrelid = %s::regclass order by 1",
            [f'"{pg.schema}"."orders"'],
        )
    ).fetchall()
    assert sorted(states) == sorted((name, "A") for name in trigger_names(ts))
    definer = await scalar(
        pg,
        "select prosecdef from pg_proc where proname = %s and pronamespace = %s::regnamespace",
        f"{net}_capture",
        ts,
    )
    assert definer is True
    assert [s.enabled for s in await pg.source.tracking_status([table])] == [True]


async def test_enable_again_keeps_the_history(pg: PostgresHarness) -> None:
    info, source = await tracked(pg)
    since = await source.current_version()
    async with pg.writer() as w:
        await w.insert(make_table_config(pg.schema, "items"), {"id": 1, "n": 1, "note": "a"})
    before = (await source.tracking_status([make_table_config(pg.schema, "items")]))[0].min_valid_version

    messages = await source.tracking_enable([make_table_config(pg.schema, "items")])

    assert "already enabled" in messages[0]
    assert (await source.tracking_status([make_table_config(pg.schema, "items")]))[
        0
    ].min_valid_version == before
    rows, _ = await read_all(source, info, since)
    assert [(r.op, r.key) for r in rows] == [("I", {"id": 1})]


async def test_enable_after_a_primary_key_change_restarts_the_history(pg: PostgresHarness) -> None:
    info, source = await tracked(pg)
    since = await source.current_version()
    await execute(pg, "alter table {s}.items drop constraint items_pkey, add primary key (id, n)")

    await source.tracking_enable([make_table_config(pg.schema, "items")])
    await pg.settle()

    with pytest.raises(TrackingExpired):
        await source.read_changes(info, since, limit=10)
    info = await source.describe(make_table_config(pg.schema, "items"))
    assert info.primary_key == ("id", "n")
    replica = await Replica.from_snapshot(source, info)
    async with pg.writer() as w:
        await w.insert(make_table_config(pg.schema, "items"), {"id": 1, "n": 2, "note": "a"})
    assert [(r.op, r.key) for r in await replica.catch_up()] == [("I", {"id": 1, "n": 2})]


async def test_disable_removes_everything_and_the_schema_with_the_last_table(pg: PostgresHarness) -> None:
    await tracked(pg, "one")
    await tracked(pg, "two")
    ts = pg.tracking_schema

    assert await pg.source.tracking_disable([make_table_config(pg.schema, "one")]) == [
        f"{pg.schema}.one: change tracking disabled"
    ]
    assert (
        await scalar(pg, "select count(*) from pg_trigger where tgrelid = %s::regclass", f'"{pg.schema}".one')
        == 0
    )
    assert await scalar(pg, "select to_regclass(%s)", f'"{ts}"."{net_table_name(pg.schema, "one")}"') is None
    assert [s.enabled for s in await pg.source.tracking_status([make_table_config(pg.schema, "two")])] == [
        True
    ]

    messages = await pg.source.tracking_disable([make_table_config(pg.schema, "two")])

    assert messages[-1].startswith(f"schema {ts}: dropped")
    assert await scalar(pg, "select count(*) from pg_namespace where nspname = %s", ts) == 0
    await execute(pg, "insert into {s}.two values (1, 1, 'still writable')")


async def test_tables_that_cannot_be_tracked_are_refused(pg: PostgresHarness) -> None:
    versioned = await pg.create_table("versioned", {"version": "int", "n": "int"}, ["version"], track=False)
    with pytest.raises(SchemaError, match="version"):
        await pg.source.tracking_enable([versioned])
    await execute(pg, 'create table {s}."Orders" (id int primary key)')
    with pytest.raises(SchemaError, match="did you mean .*Orders"):
        await pg.source.describe(make_table_config(pg.schema, "orders"))
    with pytest.raises(SchemaError, match="no such table"):
        await pg.source.tracking_enable([make_table_config(pg.schema, "orders")])


# -- versions are transaction ids ----------------------------------------------


async def test_a_long_transaction_holds_the_bound_and_loses_nothing(pg: PostgresHarness) -> None:
    info, source = await tracked(pg)
    config = make_table_config(pg.schema, "items")
    replica = await Replica.from_snapshot(source, info)
    early = await pg.begin()
    assert isinstance(early, PostgresWriter)
    early_version = await scalar_in(early, "select pg_current_xact_id()::text::bigint")
    later = await pg.begin()  # not pg.writer(): that would wait for the early transaction
    await later.insert(config, {"id": 2, "n": 2, "note": "later id, commits first"})
    await later.commit()

    assert await replica.catch_up() == []
    assert replica.version < early_version
    await early.insert(config, {"id": 1, "n": 1, "note": "early id, commits last"})
    await early.commit()

    await pg.settle()
    rows = await replica.catch_up()
    assert [(r.op, r.key["id"]) for r in rows] == [("I", 1), ("I", 2)]
    assert rows[0].version == early_version < rows[1].version


async def test_cleanup_spares_entries_a_reader_may_not_have_passed(pg: PostgresHarness) -> None:
    info, source = await tracked(pg)
    config = make_table_config(pg.schema, "items")
    async with pg.writer() as w:
        await w.insert(config, {"id": 1, "n": 1, "note": "old"})
    old_checkpoint = await source.current_version()
    early = await pg.begin()
    await early.take_version()  # holds xmin: what commits after it stays
    later = await pg.begin()
    await later.insert(config, {"id": 2, "n": 2, "note": "after xmin"})
    await later.commit()
    net = sql.Identifier(pg.tracking_schema, net_table_name(pg.schema, "items"))
    await pg.admin.execute(sql.SQL("update {} set changed_at = now() - interval '1 day'").format(net))

    assert await source.cleanup(3600) == 1
    await early.rollback()
    await pg.settle()

    min_valid = (await source.tracking_status([config]))[0].min_valid_version
    assert min_valid is not None and min_valid <= old_checkpoint
    rows, _ = await read_all(source, info, old_checkpoint)
    assert [r.key["id"] for r in rows] == [2]
    with pytest.raises(TrackingExpired, match="retention cleanup"):
        await source.read_changes(info, min_valid - 1, limit=10)


async def test_cleanup_needs_tracking_installed(pg: PostgresHarness) -> None:
    with pytest.raises(TrackingNotEnabled):
        await pg.source.cleanup(60)


async def test_changed_columns_compare_values_as_text(pg: PostgresHarness) -> None:
    table = await pg.create_table("prices", {"id": "int", "p": "numeric", "q": "int"}, ["id"])
    info = await pg.source.describe(table)
    await pg.insert_literals(table, {"id": "1", "p": "1.0", "q": "1"})
    since = await pg.source.current_version()
    async with pg.writer() as w:
        await w.update(table, {"id": 1}, {"q": 1})  # the same value: nothing changed
    rows, checkpoint = await read_all(pg.source, info, since)
    assert [(r.op, r.changed_columns) for r in rows] == [("U", frozenset())]

    await execute(pg, "update {s}.prices set p = 1.00")  # equal as numbers, not as published text
    rows, _ = await read_all(pg.source, info, checkpoint)
    assert [(r.changed_columns, r.values) for r in rows] == [
        (frozenset({"p"}), {"id": 1, "p": Decimal("1.00"), "q": 1})
    ]


async def test_keys_swapped_by_one_statement_are_both_published(pg: PostgresHarness) -> None:
    """Under a DEFERRABLE primary key one UPDATE may swap two keys. The row
    trigger then records D 1, I 2 for the first row and D 2, I 1 for the second,
    leaving a D for key 2 although its row exists: the reader publishes the row."""
    await execute(pg, "create table {s}.swap (id int primary key deferrable, note text)")
    await pg.source.tracking_enable([make_table_config(pg.schema, "swap")])
    info = await pg.source.describe(make_table_config(pg.schema, "swap"))
    await execute(pg, "insert into {s}.swap values (1, 'one'), (2, 'two')")
    since = await pg.source.current_version()

    await execute(pg, "update {s}.swap set id = 3 - id")

    rows, _ = await read_all(pg.source, info, since)
    assert sorted((r.key["id"], r.op != "D", r.values) for r in rows) == [
        (1, True, {"id": 1, "note": "two"}),
        (2, True, {"id": 2, "note": "one"}),
    ]


# -- who writes ------------------------------------------------------------------


@pytest.fixture
def superuser(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn) as conn:
        row = conn.execute("select rolsuper from pg_roles where rolname = current_user").fetchone()
    if not (row and row[0]):
        pytest.skip("the test database user is not a superuser")


@pytest.fixture
def writer_role(postgres_dsn: str, superuser: None) -> Iterator[str]:
    """A login role with rights on the test tables only."""
    name = "w" + uuid.uuid4().hex[:10]
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("create role {} login").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("drop owned by {0}; drop role {0}").format(sql.Identifier(name)))


async def test_writers_need_no_privilege_on_the_tracking_schema(
    pg: PostgresHarness, writer_role: str
) -> None:
    info, source = await tracked(pg)
    role = sql.Identifier(writer_role)
    await pg.admin.execute(sql.SQL("grant usage on schema {} to {}").format(sql.Identifier(pg.schema), role))
    await pg.admin.execute(sql.SQL("grant all on {}.items to {}").format(sql.Identifier(pg.schema), role))
    since = await source.current_version()
    dsn = psycopg.conninfo.make_conninfo(pg.dsn, user=writer_role)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("insert into {}.items values (1, 1, 'x')").format(sql.Identifier(pg.schema))
        )
        await conn.execute(sql.SQL("truncate {}.items").format(sql.Identifier(pg.schema)))
    with pytest.raises(TrackingExpired):
        await read_all(source, info, since)


async def test_changes_applied_by_logical_replication_are_tracked(
    pg: PostgresHarness, superuser: None
) -> None:
    info, source = await tracked(pg)
    since = await source.current_version()
    async with await psycopg.AsyncConnection.connect(pg.dsn, autocommit=True) as conn:
        await conn.execute("set session_replication_role = replica")
        await conn.execute(
            sql.SQL("insert into {}.items values (1, 1, 'replicated')").format(sql.Identifier(pg.schema))
        )
    await pg.settle()
    rows, _ = await read_all(source, info, since)
    assert [(r.op, r.key) for r in rows] == [("I", {"id": 1})]


# -- notifications -------------------------------------------------------------


async def test_wait_for_changes_wakes_every_waiter_with_the_table(pg: PostgresHarness) -> None:
    info, source = await tracked(pg)
    assert await source.wait_for_changes(0.01) == set()  # listening from now on
    waiters = [asyncio.create_task(source.wait_for_changes(20)) for _ in range(3)]
    await asyncio.sleep(0)  # each waiter registers before its first real wait

    await execute(pg, "insert into {s}.items values (1, 1, 'wake')")

    async with asyncio.timeout(10):
        assert await asyncio.gather(*waiters) == [{info.table}] * 3


async def test_wait_for_changes_reconnects_after_losing_its_connection(pg: PostgresHarness) -> None:
    """A lost connection wakes the waiters with every described table (what
    changes while nobody listens is never notified: the trackers must poll),
    as does listening again; then notifications arrive as before."""
    info, source = await tracked(pg)
    await source.wait_for_changes(0.01)
    waiter = asyncio.create_task(source.wait_for_changes(20))
    await asyncio.sleep(0)
    await pg.admin.execute(
        "select pg_terminate_backend(pid) from pg_stat_activity where query ilike 'listen%%' and pid <> pg_backend_pid()"
    )
    async with asyncio.timeout(1):  # at once, not at the waiter's 20 s
        assert await waiter == {info.table}
    async with asyncio.timeout(10):
        assert await source.wait_for_changes(10) == {info.table}  # listening again

    woken: set[str] = set()
    async with asyncio.timeout(10):
        for key in itertools.count():
            await execute(pg, f"insert into {{s}}.items values ({key}, 1, 'again')")
            woken = await source.wait_for_changes(1)
            if info.table in woken:
                break


async def _quiet_read(source: PostgresSource, info: TableInfo, timeout: float = 10.0) -> int:
    """Read until the source answers a read without sending it; the bound it answers."""
    since = await source.current_version()
    async with asyncio.timeout(timeout):
        while True:
            skipped = source.reads_skipped
            page = await source.read_changes(info, since, limit=100)
            assert page.rows == []
            if source.reads_skipped > skipped:
                return page.next_version
            since = page.next_version
            await asyncio.sleep(0.01)  # another transaction held the bound back: a server-side condition


async def test_reads_that_cannot_find_anything_are_not_sent_until_a_notification(pg: PostgresHarness) -> None:
    """After an empty read that saw every committed transaction, and with the
    listener up throughout, a read from its bound is answered without a round
    trip; the table's notification makes the next read go to the server."""
    info, source = await tracked(pg)
    assert isinstance(source, PostgresSource)
    await source.wait_for_changes(0.01)  # listening from now on
    bound = await _quiet_read(source, info)
    skipped = source.reads_skipped
    assert (await source.read_changes(info, bound, limit=100)).rows == []
    assert source.reads_skipped == skipped + 1
    assert 20 < source.quiet_for(info, bound) <= 30  # the tracker may wait for the notification
    assert source.quiet_for(info, bound - 1) == 0  # another position: unknown

    await execute(pg, "insert into {s}.items values (1, 1, 'after the quiet read')")
    async with asyncio.timeout(10):
        while info.table not in await source.wait_for_changes(1):
            pass
    assert source.quiet_for(info, bound) == 0
    page = await source.read_changes(info, bound, limit=100)
    assert [(r.op, r.key) for r in page.rows] == [("I", {"id": 1})]
    assert source.reads_skipped == skipped + 1  # sent


async def test_a_change_committed_before_a_notification_arrives_is_read_once_it_arrives(
    pg: PostgresHarness,
) -> None:
    """Reads may be skipped while a notification is on its way; none is lost:
    a waiter of wait_for_changes learns of it, and then the read is sent."""
    info, source = await tracked(pg)
    assert isinstance(source, PostgresSource)
    await source.wait_for_changes(0.01)
    bound = await _quiet_read(source, info)
    await execute(pg, "insert into {s}.items values (2, 2, 'racing its notification')")
    found: list[Any] = []
    async with asyncio.timeout(10):
        while not found:
            await source.wait_for_changes(0.05)
            found = (await source.read_changes(info, bound, limit=100)).rows
    assert [(r.op, r.key) for r in found] == [("I", {"id": 2})]


async def test_a_commit_above_the_bound_keeps_the_next_read_sent(pg: PostgresHarness) -> None:
    """An older transaction in progress holds the bound back; a younger one
    commits above it, and its notification arrives before the reads: they see
    nothing (its entry is above their bound), and must keep being sent until
    the bound passes it."""
    info, source = await tracked(pg)
    assert isinstance(source, PostgresSource)
    await source.wait_for_changes(0.01)
    older = await pg.begin()
    assert isinstance(older, PostgresWriter)
    await older.take_version()  # holds the bound back
    since = await source.current_version()
    await pg.admin.execute(
        sql.SQL("insert into {} values (3, 3, 'younger')").format(sql.Identifier(pg.schema, "items"))
    )
    async with asyncio.timeout(10):
        while info.table not in await source.wait_for_changes(1):
            pass  # the notification is in before the reads start
    skipped = source.reads_skipped
    for _ in range(3):
        page = await source.read_changes(info, since, limit=100)
        assert page.rows == [] and page.next_version == since  # held back
    assert source.reads_skipped == skipped
    await older.rollback()
    await pg.settle()
    page = await source.read_changes(info, since, limit=100)
    assert [(r.op, r.key) for r in page.rows] == [("I", {"id": 3})]


async def _race_for_the_reader(pg: PostgresHarness, *, reader_lost: bool) -> list[tuple[str, list[int]]]:
    """A paged read of items under way, then, while the reader is busy, a new
    read of another table queued first and the next page of items second: the
    order they were served in, and the keys each read returned."""
    items, source = await tracked(pg)
    assert isinstance(source, PostgresSource)
    others = await source.describe(await pg.create_table("others", ITEMS, ["id"]))
    since = await source.current_version()
    await execute(pg, "insert into {s}.items select i, i, 'backlog' from generate_series(1, 30) as i")
    await execute(pg, "insert into {s}.others values (1, 1, 'new read')")
    first = await source.read_changes(items, since, limit=10)
    assert first.more and [r.key["id"] for r in first.rows] == list(range(1, 11))
    served: list[tuple[str, list[int]]] = []

    async def read(name: str, info: TableInfo, **kwargs: Any) -> None:
        page = await source.read_changes(info, since, limit=10, **kwargs)
        served.append((name, [r.key["id"] for r in page.rows]))

    if reader_lost:  # the held rest went with the reader's session: the next page is a new read
        await terminate_reader(pg)
        with pytest.raises(SourceUnavailable):
            await source.read_changes(others, since, limit=10)
    lock = source._sessions.lock
    async with lock:  # the reader is busy with another read
        new = asyncio.create_task(read("others", others))
        await until_waiting(lock, 1)
        page = asyncio.create_task(read("items", items, upto=first.next_version, after=first.cursor))
        await until_waiting(lock, 2)
    await asyncio.gather(new, page)
    return served


async def test_the_next_page_of_a_read_under_way_goes_before_new_reads(pg: PostgresHarness) -> None:
    """The reader serves one read at a time. The next page of a paged read is
    served before another table's new read that was waiting first: that new
    read may commit a WITH HOLD cursor over a large backlog (seconds), while
    the page is already materialized and is what the applier waits for."""
    served = await _race_for_the_reader(pg, reader_lost=False)
    assert served == [("items", list(range(11, 21))), ("others", [1])]


async def test_a_next_page_whose_held_rest_is_gone_waits_its_turn(pg: PostgresHarness) -> None:
    """The reader was lost since the first page: the rest is read anew (it may
    materialize again), so it does not go before reads that were waiting, and
    it still returns the next rows."""
    served = await _race_for_the_reader(pg, reader_lost=True)
    assert served == [("others", [1]), ("items", list(range(11, 21)))]


async def test_a_next_page_given_up_while_waiting_for_the_reader_keeps_the_held_rest(
    pg: PostgresHarness,
) -> None:
    """A caller cancelled while it waits for the reader (shutdown, a lease
    lost) leaves the read's held rest in place: the next call continues it,
    and no second WITH HOLD cursor is left open on the reader's session."""
    items, source = await tracked(pg)
    assert isinstance(source, PostgresSource)
    since = await source.current_version()
    await execute(pg, "insert into {s}.items select i, i, 'backlog' from generate_series(1, 30) as i")
    first = await source.read_changes(items, since, limit=10)
    more = {"upto": first.next_version, "after": first.cursor}
    lock = source._sessions.lock
    async with lock:
        given_up = asyncio.create_task(source.read_changes(items, since, limit=10, **more))
        await until_waiting(lock, 1)
        given_up.cancel()
        with pytest.raises(asyncio.CancelledError):
            await given_up
    page = await source.read_changes(items, since, limit=10, **more)
    assert [r.key["id"] for r in page.rows] == list(range(11, 21)) and page.more
    async with lock:
        assert source._sessions.reader is not None
        cursors = await source._sessions.reader.execute(
            "select name from pg_cursors where name like 'cdc_read_%'"
        )
        assert len(await cursors.fetchall()) == 1


async def test_reads_of_a_partitioned_table_are_always_sent(pg: PostgresHarness) -> None:
    """A write straight into a partition does not notify for its parent."""
    await pg.admin.execute(
        sql.SQL("create table {} (id int primary key, n int) partition by range (id)").format(
            sql.Identifier(pg.schema, "parted")
        )
    )
    await pg.admin.execute(
        sql.SQL("create table {} partition of {} for values from (0) to (100)").format(
            sql.Identifier(pg.schema, "parted_low"), sql.Identifier(pg.schema, "parted")
        )
    )
    config = make_table_config(pg.schema, "parted")
    source = pg.source
    assert isinstance(source, PostgresSource)
    await source.tracking_enable([config])
    await pg.settle()
    info = await source.describe(config)
    await source.wait_for_changes(0.01)
    since = await source.current_version()
    skipped = source.reads_skipped
    for _ in range(3):
        since = (await source.read_changes(info, since, limit=100)).next_version
    assert source.reads_skipped == skipped
    await execute(pg, "insert into {s}.parted_low values (5, 5)")
    page = await source.read_changes(info, since, limit=100)
    assert [(r.op, r.key) for r in page.rows] == [("I", {"id": 5})]


async def test_notify_false_listens_to_nothing(pg: PostgresHarness) -> None:
    """``notify: false``: no LISTEN connection; waits time out, trackers rely on their backoff."""
    info, _ = await tracked(pg)
    config = SourceConfig(kind="postgres", dsn=pg.dsn, tracking_schema=pg.tracking_schema, notify=False)
    source = make_source(config)
    await source.connect()
    try:
        since = await source.current_version()
        assert await source.wait_for_changes(0.01) == set()
        waiter = asyncio.create_task(source.wait_for_changes(0.5))
        await asyncio.sleep(0)
        await execute(pg, "insert into {s}.items values (1, 1, 'unheard')")
        assert await waiter == set()
        listening = await scalar(
            pg,
            "select count(*) from pg_stat_activity where query ilike 'listen%%' and datname = current_database()",
        )
        assert listening == 0
        rows, _ = await read_all(source, info, since)  # the change is there for the next poll
        assert [r.key for r in rows] == [{"id": 1}]
    finally:
        await source.close()


# -- errors ----------------------------------------------------------------------


async def test_connect_failure_is_connect_error_without_the_password() -> None:
    dsn = f"postgresql://someone:s3cretpass@127.0.0.1:{free_port()}/nothing"
    source = make_source(SourceConfig(kind="postgres", dsn=dsn, connect_timeout=2))
    with pytest.raises(ConnectError) as raised:
        await source.connect()
    assert raised.value.exit_code == 3
    assert "s3cretpass" not in str(raised.value) and "127.0.0.1" in str(raised.value)


async def test_a_lost_reader_is_source_unavailable_then_reconnects(pg: PostgresHarness) -> None:
    info, source = await tracked(pg)
    since = await source.current_version()
    await execute(pg, "insert into {s}.items select i, i, 'x' from generate_series(1, 30) i")
    first = await source.read_changes(info, since, limit=10)
    assert first.more and first.cursor is not None
    await terminate_reader(pg)

    with pytest.raises(SourceUnavailable):
        await source.read_changes(info, since, limit=10, upto=first.next_version, after=first.cursor)

    rows, page = list(first.rows), first
    while page.more:  # the held rest died with the session: the read goes on from the cursor
        assert page.cursor is not None
        page = await source.read_changes(info, since, limit=10, upto=page.next_version, after=page.cursor)
        rows += page.rows
    assert sorted(r.key["id"] for r in rows) == list(range(1, 31))


async def terminate_reader(pg: PostgresHarness) -> None:
    reader = pg.pg_source._sessions.reader
    assert reader is not None
    await pg.admin.execute("select pg_terminate_backend(%s)", [reader.info.backend_pid])


async def test_a_query_timeout_is_source_unavailable(pg: PostgresHarness) -> None:
    info, _ = await tracked(pg)
    ts = pg.tracking_schema
    source = PostgresSource(SourceConfig(kind="postgres", dsn=pg.dsn, tracking_schema=ts, query_timeout=0.2))
    await source.connect()
    try:
        since = await source.current_version()
        blocker = await pg.begin()
        assert isinstance(blocker, PostgresWriter)
        await blocker.conn.execute(sql.SQL("lock table {}.items").format(sql.Identifier(pg.schema)))
        with pytest.raises(SourceUnavailable, match="statement timeout"):
            await source.read_changes(info, since, limit=10)
        await blocker.rollback()
        assert (await source.read_changes(info, since, limit=10)).rows == []
    finally:
        await source.close()


# -- status, doctor, snapshot ----------------------------------------------------


async def test_status_and_doctor_report_a_disabled_trigger(pg: PostgresHarness) -> None:
    await tracked(pg)
    plain = await pg.create_table("plain", ITEMS, ["id"], track=False)
    capture = trigger_names(pg.tracking_schema)[0]
    await pg.admin.execute(
        sql.SQL("alter table {}.items disable trigger {}").format(
            sql.Identifier(pg.schema), sql.Identifier(capture)
        )
    )
    items = make_table_config(pg.schema, "items")

    status = (await pg.source.tracking_status([items]))[0]
    findings = await pg.source.doctor([items, plain])

    assert not status.enabled and f"trigger {capture} is disabled" in status.detail
    by_subject = {(f.subject, f.level) for f in findings}
    assert (items.table, "error") in by_subject and (plain.table, "error") in by_subject
    assert ("source", "ok") in by_subject


async def test_snapshot_of_an_empty_table_still_gives_its_version(pg: PostgresHarness) -> None:
    info, source = await tracked(pg)
    pages = [page async for page in source.snapshot(info, page_size=5)]
    assert [(p.rows, p.total) for p in pages] == [([], 0)]
    assert pages[0].version <= await source.current_version()


async def test_a_snapshot_below_the_start_of_tracking_waits_for_older_transactions(
    pg: PostgresHarness,
) -> None:
    table = await pg.create_table("fresh", ITEMS, ["id"], track=False)
    older = await pg.begin()
    await older.take_version()
    await pg.source.tracking_enable([table])  # tracked from a later transaction id
    info = await pg.source.describe(table)

    with pytest.raises(SourceUnavailable, match="waiting for older transactions"):
        [page async for page in pg.source.snapshot(info, page_size=10)]
    await older.rollback()
    await pg.settle()

    replica = await Replica.from_snapshot(pg.source, info)
    assert await replica.catch_up() == []


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        ("postgresql://u:pw-1@h/db", "auth failed for pw-1"),
        ("host=h password='pw 1' port=x", "bad conninfo host=h password='pw 1'"),
        ("postgresql://u:pw 1@h:port/db?x", "invalid URI postgresql://u:pw 1@h:port/db?x"),
    ],
)
def test_messages_never_carry_the_password(dsn: str, message: str) -> None:
    assert "pw" not in scrub(message, dsn)
    assert "pw" not in redact_dsn(dsn)


async def test_keys_of_types_with_operators_outside_pg_catalog(pg: PostgresHarness, superuser: None) -> None:
    """The capture trigger runs with search_path = pg_catalog: it must not need
    to look up the key type's operators by name (citext's live in its schema)."""
    await execute(pg, "create extension if not exists citext with schema {s}")
    table = await pg.create_table("tags", {"tag": f'"{pg.schema}".citext', "n": "int"}, ["tag"])
    info = await pg.source.describe(table)
    since = await pg.source.current_version()
    await execute(pg, "insert into {s}.tags values ('Red', 1), ('blue', 2)")
    await execute(pg, "update {s}.tags set n = 3 where tag = 'Red'")
    await execute(pg, "update {s}.tags set tag = 'green' where tag = 'blue'")

    rows, _ = await read_all(pg.source, info, since)

    assert sorted((r.op, r.key["tag"]) for r in rows) == [("D", "blue"), ("I", "Red"), ("I", "green")]


async def test_doctor_names_the_privileges_a_least_privileged_role_lacks(pg: PostgresHarness) -> None:
    """A role that may only connect gets findings, not an error: USAGE on the
    schemas among them; a role that may read but not clean up is told that the
    cleanup cannot run (tests/cdc/test_pg_roles.py has the whole lists)."""
    await tracked(pg)
    items = make_table_config(pg.schema, "items")
    role = f"doctor_{pg.schema}"
    await pg.admin.execute(sql.SQL("create role {} login").format(sql.Identifier(role)))
    config = SourceConfig(
        kind="postgres", dsn=make_conninfo(pg.dsn, user=role), tracking_schema=pg.tracking_schema
    )
    source = PostgresSource(config)
    await source.connect()
    try:
        findings = await source.doctor([items])
        usage = [f.message for f in findings if f.level == "error"]
        assert any(f"lacks USAGE on schema {pg.schema} " in m for m in usage), usage

        for statement in (
            "grant usage on schema {s}, {t} to {r}",
            "grant select on all tables in schema {s}, {t} to {r}",
        ):
            await pg.admin.execute(
                sql.SQL(statement).format(
                    s=sql.Identifier(pg.schema), t=sql.Identifier(pg.tracking_schema), r=sql.Identifier(role)
                )
            )
        findings = await source.doctor([items])
        refused = [f for f in findings if f.level == "error"]
        assert refused and all(f.message.startswith("the retention cleanup cannot run") for f in refused)
    finally:
        await source.close()
        await pg.admin.execute(sql.SQL("drop owned by {}").format(sql.Identifier(role)))
        await pg.admin.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))


# -- the capture trigger's changed columns (pg_capture) ------------------------


async def changed_by(pg: PostgresHarness, info: TableInfo, statement: str) -> list[Any]:
    """The changed columns a read reports for what ``statement`` (``{s}``: the test schema) changed."""
    since = await pg.source.current_version()
    await execute(pg, statement)
    rows, _ = await read_all(pg.source, info, since)
    return [(r.op, r.key, r.changed_columns) for r in rows]


async def test_changed_columns_of_columns_added_dropped_and_renamed_after_enable(pg: PostgresHarness) -> None:
    """The trigger names the columns the table had at enable; those added or
    renamed since are still compared, and a dropped one breaks no write."""
    info, _ = await tracked(pg)
    await execute(pg, "insert into {s}.items values (1, 1, 'a'), (2, 2, 'b')")
    await execute(pg, "alter table {s}.items add column d integer")
    info = await pg.source.describe(make_table_config(pg.schema, "items"))

    assert await changed_by(pg, info, "update {s}.items set d = 4 where id = 1") == [
        ("U", {"id": 1}, frozenset({"d"}))
    ]
    assert await changed_by(pg, info, "update {s}.items set n = 5 where id = 1") == [
        ("U", {"id": 1}, frozenset({"n"}))
    ]
    await execute(pg, "alter table {s}.items rename column note to remark")
    info = await pg.source.describe(make_table_config(pg.schema, "items"))
    assert await changed_by(pg, info, "update {s}.items set remark = 'c' where id = 2") == [
        ("U", {"id": 2}, frozenset({"remark"}))
    ]
    await execute(pg, "alter table {s}.items drop column n")
    info = await pg.source.describe(make_table_config(pg.schema, "items"))
    assert await changed_by(pg, info, "update {s}.items set d = 6 where id = 2") == [
        ("U", {"id": 2}, frozenset({"d"}))
    ]


async def test_changed_columns_compare_the_published_text(pg: PostgresHarness) -> None:
    """1.0 -> 1.00 is a change (it is published), a write of the same values changes no column,
    and column names an array literal would split (comma, quote, brace, space) are compared too."""
    columns = {"id": "int", "amount": "numeric", 'a,"b}': "text", "with space": "int"}
    table = await pg.create_table("odd", columns, ["id"])
    info = await pg.source.describe(table)
    await execute(pg, """insert into {s}.odd values (1, 1.0, 'x', 1)""")

    assert await changed_by(pg, info, "update {s}.odd set amount = 1.00") == [
        ("U", {"id": 1}, frozenset({"amount"}))
    ]
    assert await changed_by(pg, info, """update {s}.odd set "a,""b}" = 'y', "with space" = 2""") == [
        ("U", {"id": 1}, frozenset({'a,"b}', "with space"}))
    ]
    assert await changed_by(pg, info, "update {s}.odd set amount = amount") == [("U", {"id": 1}, frozenset())]


# What 0.3's `cdc tracking enable` installed as the row trigger's body (pg_tracking._CAPTURE).
CAPTURE_0_3 = """
declare
    _cdc_version bigint := pg_current_xact_id()::text::bigint;
    _cdc_changed jsonb;
begin
    if TG_OP = 'DELETE' or (TG_OP = 'UPDATE' and row(OLD.id)::text is distinct from row(NEW.id)::text) then
        insert into {net} as e (id, op, version, creation_version, column_versions, changed_at)
        values (OLD.id, 'D', _cdc_version, 0, '{{}}', now())
        on conflict (id) do update set op = 'D', version = _cdc_version, changed_at = now();
    end if;
    if TG_OP = 'INSERT' or (TG_OP = 'UPDATE' and row(OLD.id)::text is distinct from row(NEW.id)::text) then
        insert into {net} as e (id, op, version, creation_version, column_versions, changed_at)
        values (NEW.id, 'I', _cdc_version, _cdc_version, '{{}}', now())
        on conflict (id) do update set op = 'I', version = _cdc_version,
            creation_version = _cdc_version, column_versions = '{{}}', changed_at = now();
    elsif TG_OP = 'UPDATE' then
        select coalesce(jsonb_object_agg(n.key, _cdc_version), '{{}}') into _cdc_changed
          from jsonb_each_text(to_jsonb(NEW)) as n
         where n.value is distinct from to_jsonb(OLD) ->> n.key;
        insert into {net} as e (id, op, version, creation_version, column_versions, changed_at)
        values (NEW.id, 'U', _cdc_version, 0, _cdc_changed, now())
        on conflict (id) do update set op = 'U', version = _cdc_version,
            column_versions = e.column_versions || _cdc_changed, changed_at = now();
    end if;
    return null;
end"""


async def test_enable_upgrades_a_0_3_capture_trigger_and_keeps_its_pending_changes(
    pg: PostgresHarness,
) -> None:
    """A 0.3 installation, with changes not read yet: 0.4 reads them as they are,
    and `tracking enable` replaces the trigger's body, keeping the history (no
    snapshot), so the changes before and after the upgrade all arrive."""
    info, source = await tracked(pg)
    table = make_table_config(pg.schema, "items")
    ts, net = pg.tracking_schema, net_table_name(pg.schema, "items")
    function = sql.Identifier(ts, f"{net}_capture")
    old_body = sql.SQL(CAPTURE_0_3).format(net=sql.Identifier(ts, net)).as_string(pg.admin)
    await pg.admin.execute(sql.SQL("create or replace function {}() returns trigger language plpgsql"
                                   " security definer set search_path = pg_catalog, pg_temp as {}").format(
        function, sql.Literal(old_body)))  # fmt: skip
    await execute(pg, "insert into {s}.items values (1, 1, 'a'), (2, 2, 'b'), (3, 3, 'c')")
    since = await source.current_version()
    await execute(pg, "update {s}.items set n = 10 where id = 1")  # pending under 0.3
    await execute(pg, "delete from {s}.items where id = 2")
    await execute(pg, "update {s}.items set id = 30 where id = 3")
    minimum = await scalar(pg, sql.SQL("select min_valid_version from {}").format(
        sql.Identifier(ts, "tracked_tables")))  # fmt: skip

    message = (await source.tracking_enable([table]))[0]
    await execute(pg, "update {s}.items set note = 'z' where id = 1")  # under 0.4
    await execute(pg, "insert into {s}.items values (4, 4, 'd')")

    assert "already enabled" in message
    assert await scalar(pg, "select prosrc from pg_proc where oid = %s::regprocedure",
                        f"{ts}.{net}_capture()") != old_body  # fmt: skip
    assert await scalar(pg, sql.SQL("select min_valid_version from {}").format(
        sql.Identifier(ts, "tracked_tables"))) == minimum  # fmt: skip
    rows, _ = await read_all(source, info, since)
    assert sorted((r.op, r.key["id"], r.values, r.changed_columns) for r in rows) == [
        ("D", 2, None, None),
        ("D", 3, None, None),
        ("I", 4, {"id": 4, "n": 4, "note": "d"}, None),
        ("I", 30, {"id": 30, "n": 3, "note": "c"}, None),
        ("U", 1, {"id": 1, "n": 10, "note": "z"}, frozenset({"n", "note"})),
    ]
