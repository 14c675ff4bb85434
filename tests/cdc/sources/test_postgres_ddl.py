"""The PostgreSQL source while its tables change shape (issue 12), one DDL step
per test, with real writes from an application session kept open across the
DDL (PL/pgSQL caches the capture trigger's plans per session).

For each step: ``fingerprints`` changes (and only then), ``describe`` gives the
new ``TableInfo``, reads with the old one raise ``SchemaError`` where its
columns no longer fit, reads with the new one work and bring the changes of
the new columns, and tracking status / enable say what happened.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow

from cdc.config import TableConfig
from cdc.errors import SchemaError, TrackingExpired, TrackingNotEnabled
from cdc.sources.base import TableInfo
from cdc.sources.pg_tracking import trigger_names
from tests.contract.harness import PostgresHarness, Replica, make_table_config, read_all
from tests.e2e import wait_for

ITEMS = {"id": "int", "n": "int", "note": "text"}
App = psycopg.AsyncConnection[TupleRow]


@pytest.fixture
async def pg(request: pytest.FixtureRequest) -> AsyncIterator[PostgresHarness]:
    async with PostgresHarness.running(request) as harness:
        assert isinstance(harness, PostgresHarness)
        yield harness


@pytest.fixture
async def app(pg: PostgresHarness) -> AsyncIterator[App]:
    """An application's session, writing before and after each DDL step."""
    conn = await psycopg.AsyncConnection.connect(pg.dsn, autocommit=True)
    yield conn
    await conn.close()


async def run(pg: PostgresHarness, conn: App, statement: str, *params: Any) -> None:
    """A statement of the test's own (``{s}`` is the test schema) on ``conn``, settled."""
    await conn.execute(statement.replace("{s}", f'"{pg.schema}"'), params or None)
    await pg.settle()


async def ddl(pg: PostgresHarness, statement: str) -> None:
    await run(pg, pg.admin, statement)


async def items(pg: PostgresHarness, app: App) -> tuple[TableConfig, TableInfo, Replica]:
    """A tracked table with three rows, written by the application (so its session
    has run the capture trigger), described, and a replica of it."""
    table = await pg.create_table("items", ITEMS, ["id"])
    await run(pg, app, "insert into {s}.items select i, i, 'n' || i from generate_series(1, 3) as i")
    info = await pg.source.describe(table)
    return table, info, await Replica.from_snapshot(pg.source, info)


async def fingerprint(pg: PostgresHarness, table: TableConfig) -> str | None:
    return (await pg.source.fingerprints([table]))[table.table]


async def contents(pg: PostgresHarness, table: TableConfig, info: TableInfo) -> dict[Any, dict[str, Any]]:
    """The table's rows as documents of ``info`` would hold them."""
    return {k: {c: row[c] for c in info.column_names} for k, row in (await pg.rows(table)).items()}


async def mirrors(pg: PostgresHarness, table: TableConfig, info: TableInfo) -> Replica:
    """A snapshot with ``info``, the application's next writes read after it: equal to the table."""
    replica = await Replica.from_snapshot(pg.source, info)
    await run(pg, pg.admin, "update {s}.items set n = n + 100 where id = 1")
    await run(pg, pg.admin, "delete from {s}.items where id = 3")
    await replica.catch_up()
    assert replica.rows == await contents(pg, table, info)
    return replica


async def status(pg: PostgresHarness, table: TableConfig) -> tuple[bool, int | None, str]:
    found = (await pg.source.tracking_status([table]))[0]
    return found.enabled, found.min_valid_version, found.detail


def reread(match: str) -> Any:
    return pytest.raises(SchemaError, match=rf"items: the table changed while it was read \({match}")


# -- the fingerprint -------------------------------------------------------------


async def test_fingerprints_follow_the_shape_not_writes_cleanup_or_truncate(
    pg: PostgresHarness, app: App
) -> None:
    table, info, _ = await items(pg, app)
    plain = await pg.create_table("plain", ITEMS, ["id"], track=False)
    missing = make_table_config(pg.schema, "missing")
    before = await pg.source.fingerprints([table, plain, missing])
    minimum = (await status(pg, table))[1]

    await run(pg, app, "update {s}.items set n = 7 where id = 1")
    await run(pg, app, "delete from {s}.items where id = 2")
    await pg.expire_tracking(table)
    await pg.truncate(table)
    await pg.settle()

    assert await pg.source.fingerprints([table, plain, missing]) == before
    assert before[table.table] == info.fingerprint and info.fingerprint.startswith(f"table {info.identity} r")
    assert before[missing.table] is None
    assert "tracking no entry" in (before[plain.table] or "")
    after = (await status(pg, table))[1]
    assert minimum is not None and after is not None and after > minimum  # cleanup and truncate moved it


async def test_fingerprints_and_describe_without_a_tracking_schema(pg: PostgresHarness) -> None:
    table = await pg.create_table("plain", ITEMS, ["id"], track=False)
    row = await (await pg.admin.execute("select to_regnamespace(%s)", [pg.tracking_schema])).fetchone()
    assert row == (None,)

    untracked = await fingerprint(pg, table)
    info = await pg.source.describe(table)
    await pg.source.tracking_enable([table])

    assert untracked is not None and "tracking no entry" in untracked and "_capture missing" in untracked
    assert info.fingerprint == untracked
    assert await fingerprint(pg, table) != untracked


# -- columns ---------------------------------------------------------------------


async def test_add_column_keeps_old_reads_and_the_new_info_brings_it(pg: PostgresHarness, app: App) -> None:
    table, info, replica = await items(pg, app)
    checkpoint = replica.version
    assert await pg.source.wait_for_changes(0.01) == set()  # listening from now on

    await ddl(pg, "alter table {s}.items add column d integer")
    await run(pg, app, "insert into {s}.items values (4, 4, 'four', 40)")
    await run(pg, app, "update {s}.items set d = 20 where id = 2")

    assert await fingerprint(pg, table) != info.fingerprint
    assert table.table in await pg.source.wait_for_changes(5)  # the notify trigger still fires
    await replica.catch_up()  # every column of the old info is still there
    assert replica.rows == await contents(pg, table, info)
    new = await pg.source.describe(table)
    assert new.column_names == ("id", "n", "note", "d") and new.identity == info.identity
    assert new.fingerprint == await fingerprint(pg, table)
    rows, _ = await read_all(pg.source, new, checkpoint)
    assert {r.key["id"]: (r.op, r.values and r.values["d"]) for r in rows} == {4: ("I", 40), 2: ("U", 20)}
    await mirrors(pg, table, new)


async def test_add_column_with_a_default_fills_rows_without_tracked_changes(
    pg: PostgresHarness, app: App
) -> None:
    table, info, replica = await items(pg, app)

    await ddl(pg, "alter table {s}.items add column e text default 'dflt'")

    new = await pg.source.describe(table)
    assert new.column_names == ("id", "n", "note", "e") and new != info
    assert (await read_all(pg.source, new, replica.version))[0] == []  # no trigger fired: a snapshot must
    rebuilt = await mirrors(pg, table, new)
    assert {row["e"] for row in rebuilt.rows.values()} == {"dflt"}


async def test_drop_column_fails_old_reads_and_snapshots_and_the_new_info_reads(
    pg: PostgresHarness, app: App
) -> None:
    table, info, replica = await items(pg, app)
    checkpoint = replica.version

    await ddl(pg, "alter table {s}.items drop column note")
    await run(pg, app, "update {s}.items set n = 70 where id = 1")

    assert await fingerprint(pg, table) != info.fingerprint
    with reread("column t.note does not exist"):
        await pg.source.read_changes(info, checkpoint, limit=100)  # one statement
    with reread("column t.note does not exist"):  # a paged read, in a transaction
        await pg.source.read_changes(info, checkpoint, limit=100, upto=await pg.source.current_version())
    with reread('column "note" does not exist'):
        [page async for page in pg.source.snapshot(info, page_size=10)]
    new = await pg.source.describe(table)
    assert new.column_names == ("id", "n")
    rows, _ = await read_all(pg.source, new, checkpoint)
    assert [(r.op, r.values) for r in rows] == [("U", {"id": 1, "n": 70})]
    await mirrors(pg, table, new)


async def test_rename_column_fails_old_reads_and_the_new_name_is_published(
    pg: PostgresHarness, app: App
) -> None:
    table, info, replica = await items(pg, app)
    checkpoint = replica.version

    await ddl(pg, "alter table {s}.items rename column note to remark")
    await run(pg, app, "update {s}.items set remark = 'renamed' where id = 2")

    assert await fingerprint(pg, table) != info.fingerprint
    with reread("column t.note does not exist"):
        await pg.source.read_changes(info, checkpoint, limit=100)
    new = await pg.source.describe(table)
    assert new.column_names == ("id", "n", "remark")
    rows, _ = await read_all(pg.source, new, checkpoint)
    assert [(r.op, r.values, r.changed_columns) for r in rows] == [
        ("U", {"id": 2, "n": 2, "remark": "renamed"}, frozenset({"remark"}))
    ]
    await mirrors(pg, table, new)


async def test_retyped_column_after_prepared_reads(pg: PostgresHarness, app: App) -> None:
    """psycopg prepares a query run five times; the retyped column changes its
    result type while its text stays the same."""
    table, info, replica = await items(pg, app)
    for _ in range(6):
        await replica.catch_up()

    await ddl(pg, "alter table {s}.items alter column n type bigint")
    await run(pg, app, "update {s}.items set n = 5000000000 where id = 1")

    assert await fingerprint(pg, table) != info.fingerprint
    new = await pg.source.describe(table)
    assert [c.type_name for c in new.columns] == ["integer", "bigint", "text"]
    replica.info = new
    for _ in range(6):  # described again: the statements prepared for the old shape are gone
        await replica.catch_up()
    assert replica.rows[(1,)]["n"] == 5000000000

    await ddl(pg, "alter table {s}.items alter column n type numeric(20,0)")
    with reread("cached plan must not change result type"):
        await replica.catch_up()
    assert pg.pg_source._sessions.reader is None  # dropped with its prepared statements
    replica.info = await pg.source.describe(table)
    await replica.catch_up()
    assert replica.rows == await contents(pg, table, replica.info)


async def test_capture_follows_every_column_change_in_a_session_that_wrote_before(
    pg: PostgresHarness, app: App
) -> None:
    table, _, replica = await items(pg, app)
    steps = (
        "alter table {s}.items add column d integer",
        "alter table {s}.items add column e text default 'dflt'",
        "alter table {s}.items drop column d",
        "alter table {s}.items rename column note to remark",
        "alter table {s}.items alter column remark type varchar(40)",
        "alter table {s}.items alter column n type bigint",
    )
    for number, step in enumerate(steps, start=10):
        await ddl(pg, step)
        await run(pg, app, "insert into {s}.items (id, n) values (%s, %s)", number, number)
        await run(pg, app, "update {s}.items set n = n + 1 where id in (1, %s)", number)
        await run(pg, app, "delete from {s}.items where id = %s", number - 8)  # 2, 3, then nothing

        replica.info = await pg.source.describe(table)
        assert (await status(pg, table))[0], step
        await replica.catch_up()
        rows = await pg.rows(table)
        assert {k: r["n"] for k, r in replica.rows.items()} == {k: r["n"] for k, r in rows.items()}, step


@pytest.mark.parametrize("reader", ["one statement", "paged", "snapshot"])
async def test_a_table_rewrite_committing_under_a_read_loses_no_row(
    pg: PostgresHarness, app: App, reader: str
) -> None:
    """ALTER COLUMN ... TYPE rewrites the table, which is not MVCC-safe: a read
    whose snapshot was taken before the rewrite committed would see the table
    empty (every changed row deleted, a snapshot of nothing)."""
    table, info, replica = await items(pg, app)
    await run(pg, app, "update {s}.items set note = 'changed'")
    alter = await psycopg.AsyncConnection.connect(pg.dsn)
    try:
        await alter.execute(
            sql.SQL("alter table {}.items alter column n type bigint").format(sql.Identifier(pg.schema))
        )
        if reader == "snapshot":
            read = asyncio.create_task(_snapshot_rows(pg, info))
        else:
            upto = await pg.source.current_version() if reader == "paged" else None
            read = asyncio.create_task(_read_rows(pg, info, replica.version, upto))
        await wait_for(lambda: _waits_for_a_lock(pg), 5, "the read to wait for the ALTER's lock")
        await alter.commit()
        rows = await asyncio.wait_for(read, 5)
    finally:
        await alter.close()

    assert sorted(rows) == [(1, "changed"), (2, "changed"), (3, "changed")]


async def _read_rows(
    pg: PostgresHarness, info: TableInfo, since: int, upto: int | None
) -> list[tuple[Any, Any]]:
    page = await pg.source.read_changes(info, since, limit=100, upto=upto)
    return [(r.key["id"], r.values and r.values["note"]) for r in page.rows]


async def _snapshot_rows(pg: PostgresHarness, info: TableInfo) -> list[tuple[Any, Any]]:
    return [(r["id"], r["note"]) async for page in pg.source.snapshot(info, page_size=10) for r in page.rows]


async def _waits_for_a_lock(pg: PostgresHarness) -> bool:
    row = await (
        await pg.admin.execute(
            "select count(*) from pg_locks where not granted and relation = to_regclass(%s)",
            [f'"{pg.schema}".items'],
        )
    ).fetchone()
    return bool(row and row[0])


# -- the primary key -------------------------------------------------------------


async def test_a_retyped_primary_key_breaks_writes_until_tracking_is_enabled_again(
    pg: PostgresHarness, app: App
) -> None:
    """The net table's key column keeps the old type. PL/pgSQL's plans for the
    capture function, cached in every session that fired it, no longer fit the
    new key type: those sessions cannot write the table until the function is
    created again (``cdc tracking enable``), which also restarts the history."""
    table, info, replica = await items(pg, app)

    await ddl(pg, "alter table {s}.items alter column id type bigint")

    with pytest.raises(psycopg.errors.DatatypeMismatch, match="does not match that when preparing the plan"):
        await run(pg, app, "update {s}.items set n = 9 where id = 1")
    enabled, minimum, detail = await status(pg, table)
    assert (enabled, minimum) == (False, None)
    assert "primary key changed" in detail and f"cdc tracking enable --table {table.table}" in detail
    assert await fingerprint(pg, table) != info.fingerprint

    message = (await pg.source.tracking_enable([table]))[0]
    await pg.settle()

    assert "the primary key no longer fits the net table: history restarted" in message
    await run(pg, app, "update {s}.items set n = 9 where id = 1")
    new = await pg.source.describe(table)
    assert new.columns[0].type_name == "bigint"
    with pytest.raises(TrackingExpired):
        await pg.source.read_changes(new, replica.version, limit=10)
    assert (await status(pg, table))[0]
    await mirrors(pg, table, new)


# -- the table -------------------------------------------------------------------


async def test_rename_table_and_back(pg: PostgresHarness, app: App) -> None:
    table, info, replica = await items(pg, app)

    await ddl(pg, "alter table {s}.items rename to items2")
    await run(pg, app, "update {s}.items2 set n = 50 where id = 1")  # captured all the same

    assert await fingerprint(pg, table) is None
    with pytest.raises(
        SchemaError, match=rf"no such table \(renamed to {pg.schema}\.items2\? update the config"
    ):
        await pg.source.describe(table)
    with reread(f'relation "{pg.schema}.items" does not exist'):
        await pg.source.read_changes(info, replica.version, limit=10)
    assert await status(pg, table) == (False, None, f"no such table (renamed to {pg.schema}.items2?)")

    await ddl(pg, "alter table {s}.items2 rename to items")

    assert await fingerprint(pg, table) == info.fingerprint
    assert await pg.source.describe(table) == info
    assert [(r.key, r.op) for r in await replica.catch_up()] == [({"id": 1}, "U")]
    assert replica.rows == await contents(pg, table, info)


async def test_a_truncate_while_renamed_expires_checkpoints(pg: PostgresHarness, app: App) -> None:
    table, info, replica = await items(pg, app)

    await ddl(pg, "alter table {s}.items rename to items2")
    await run(pg, app, "truncate {s}.items2")
    await ddl(pg, "alter table {s}.items2 rename to items")

    with pytest.raises(TrackingExpired):
        await replica.catch_up()
    await mirrors(pg, table, info)


async def test_drop_table(pg: PostgresHarness, app: App) -> None:
    table, info, replica = await items(pg, app)

    await ddl(pg, "drop table {s}.items")

    assert await fingerprint(pg, table) is None
    with pytest.raises(SchemaError, match=rf"{pg.schema}\.items: no such table$"):
        await pg.source.describe(table)
    with reread(f'relation "{pg.schema}.items" does not exist'):
        await pg.source.read_changes(info, replica.version, limit=10)
    with reread(f'relation "{pg.schema}.items" does not exist'):
        [page async for page in pg.source.snapshot(info, page_size=10)]
    assert await status(pg, table) == (False, None, "no such table")


async def test_drop_create_and_enable_restarts_the_history(pg: PostgresHarness, app: App) -> None:
    table, info, replica = await items(pg, app)
    minimum = (await status(pg, table))[1]
    capture = trigger_names(pg.tracking_schema)[0]

    await ddl(pg, "drop table {s}.items")
    await ddl(pg, "create table {s}.items (id int primary key, n int, note text)")
    await run(pg, app, "insert into {s}.items values (1, 1, 'new'), (5, 5, 'new')")

    assert await fingerprint(pg, table) not in (None, info.fingerprint)
    new = await pg.source.describe(table)
    assert new.column_names == info.column_names and new.identity != info.identity and new != info
    with reread("it was dropped and created again"):
        await pg.source.read_changes(info, replica.version, limit=10)
    with reread("it was dropped and created again"):
        [page async for page in pg.source.snapshot(info, page_size=10)]
    with pytest.raises(
        TrackingNotEnabled, match=f"created again .* cdc tracking enable --table {table.table}"
    ):
        await pg.source.read_changes(new, replica.version, limit=10)
    assert await status(pg, table) == (
        False,
        None,
        f"trigger {capture} is missing: changes are not captured; run cdc tracking enable --table {table.table}",
    )

    message = (await pg.source.tracking_enable([table]))[0]
    await pg.settle()

    assert "re-created since tracking was enabled: history restarted" in message
    enabled, restarted, _ = await status(pg, table)
    assert enabled and restarted is not None and minimum is not None and restarted > minimum
    with pytest.raises(TrackingExpired):
        await pg.source.read_changes(new, replica.version, limit=10)
    assert (await read_all(pg.source, new, restarted))[0] == []  # the old table's entries are gone
    assert await fingerprint(pg, table) == (await pg.source.describe(table)).fingerprint
    await mirrors(pg, table, new)


async def test_a_table_renamed_away_and_replaced_stops_feeding_the_new_ones_changes(
    pg: PostgresHarness, app: App
) -> None:
    table, info, replica = await items(pg, app)

    await ddl(pg, "alter table {s}.items rename to items_old")
    await ddl(pg, "create table {s}.items (id int primary key, n int, note text)")
    message = (await pg.source.tracking_enable([table]))[0]
    await pg.settle()
    await run(pg, app, "update {s}.items_old set n = 99")
    await run(pg, app, "insert into {s}.items values (8, 8, 'new')")

    assert "history restarted" in message and f"now {pg.schema}.items_old, is no longer tracked" in message
    new = await pg.source.describe(table)
    minimum = (await status(pg, table))[1]
    assert minimum is not None
    rows, _ = await read_all(pg.source, new, minimum)
    assert [r.key for r in rows] == [{"id": 8}]


async def test_tracking_disable_and_enable(pg: PostgresHarness, app: App) -> None:
    table, info, replica = await items(pg, app)

    await pg.source.tracking_disable([table])
    await run(pg, app, "update {s}.items set n = 11 where id = 1")

    disabled = await fingerprint(pg, table)
    assert disabled is not None and disabled != info.fingerprint and "tracking no entry" in disabled
    assert (await status(pg, table))[:2] == (False, None)
    with pytest.raises(TrackingNotEnabled):
        await replica.catch_up()

    await pg.source.tracking_enable([table])
    await pg.settle()

    assert await fingerprint(pg, table) == info.fingerprint  # the same shape, the same tracking
    with pytest.raises(TrackingExpired):  # but a new history
        await replica.catch_up()
    await mirrors(pg, table, info)


@pytest.mark.parametrize("trigger", [0, 1], ids=["capture", "truncate"])
@pytest.mark.parametrize("how", ["disable", "drop", "enable replica"])
async def test_a_capture_trigger_disabled_or_dropped(
    pg: PostgresHarness, app: App, trigger: int, how: str
) -> None:
    table, info, replica = await items(pg, app)
    name = trigger_names(pg.tracking_schema)[trigger]
    statement = (
        "drop trigger {t} on {s}.items" if how == "drop" else f"alter table {{s}}.items {how} trigger {{t}}"
    )

    await ddl(pg, statement.replace("{t}", f'"{name}"'))
    await run(pg, app, "update {s}.items set n = 12 where id = 1")

    assert await fingerprint(pg, table) != info.fingerprint
    enabled, minimum, detail = await status(pg, table)
    state = {"disable": "disabled", "drop": "missing"}.get(
        how, "ENABLE REPLICA: it fires only for changes applied by logical replication"
    )
    assert (enabled, minimum) == (False, None)
    assert detail == (
        f"trigger {name} is {state}: changes are not captured; run cdc tracking enable --table {table.table}"
    )

    message = (await pg.source.tracking_enable([table]))[0]
    await pg.settle()

    assert "trigger was missing or disabled: history restarted" in message
    assert await fingerprint(pg, table) == info.fingerprint
    assert (await status(pg, table))[0]
    with pytest.raises(TrackingExpired):  # what happened meanwhile may be lost: snapshot again
        await replica.catch_up()
    await mirrors(pg, table, info)


@pytest.mark.parametrize(("how", "state"), [("enable", "not ENABLE ALWAYS")])
async def test_a_capture_trigger_not_always_enabled_is_impaired(
    pg: PostgresHarness, app: App, how: str, state: str
) -> None:
    table, info, _ = await items(pg, app)
    name = trigger_names(pg.tracking_schema)[0]
    minimum = (await status(pg, table))[1]

    await ddl(pg, f'alter table {{s}}.items {how} trigger "{name}"')

    assert await fingerprint(pg, table) != info.fingerprint
    enabled, still, detail = await status(pg, table)
    assert (enabled, still) == (False, minimum) and detail.startswith(f"trigger {name} is {state}")


# -- what describe publishes ---------------------------------------------------------


async def test_reserved_columns_are_left_out_with_a_warning(
    pg: PostgresHarness, app: App, caplog: pytest.LogCaptureFixture
) -> None:
    table = await pg.create_table("flags", {"id": "int", "@flag": "bool", "n": "int"}, ["id"])
    listed = make_table_config(pg.schema, "flags", ["n"])

    with caplog.at_level(logging.WARNING, logger="cdc.sources.postgres"):
        info = await pg.source.describe(table)
    explicit = await pg.source.describe(listed)

    assert info.column_names == ("id", "n") and info.left_out == ("@flag",)
    assert [r.getMessage() for r in caplog.records if "@flag" in r.getMessage()] == [
        f"{table.table}.@flag: column left out of the documents: names starting with @ are reserved "
        "(rename it, or list the table's columns in the config to silence this)"
    ]
    assert explicit.column_names == ("id", "n") and explicit.left_out == ()
    since = await pg.source.current_version()
    await run(pg, app, 'insert into {s}.flags (id, "@flag", n) values (1, true, 1)')
    rows, _ = await read_all(pg.source, info, since)
    assert [r.values for r in rows] == [{"id": 1, "n": 1}]


async def test_a_reserved_primary_key_column_is_refused(pg: PostgresHarness) -> None:
    table = await pg.create_table("odd", {"@id": "int", "n": "int"}, ["@id"], track=False)
    with pytest.raises(SchemaError, match="primary-key column '@id'.*names starting with @ are reserved"):
        await pg.source.describe(table)


async def test_a_dropped_column_the_config_lists_names_the_config_line(pg: PostgresHarness) -> None:
    await pg.create_table("items", ITEMS, ["id"])
    listed = make_table_config(pg.schema, "items", ["note"])
    await pg.source.describe(listed)

    await ddl(pg, "alter table {s}.items drop column note")

    with pytest.raises(SchemaError, match=r"no column 'note' .*; <config>:0: tables\[0\]\.columns lists it"):
        await pg.source.describe(listed)


async def test_queries_composed_for_old_shapes_are_let_go(pg: PostgresHarness, app: App) -> None:
    table, _, replica = await items(pg, app)
    for column in ("a", "b", "c"):
        await ddl(pg, f"alter table {{s}}.items add column {column} int")
        replica.info = await pg.source.describe(table)
        await replica.catch_up()
    assert [i.column_names for i in pg.pg_source._whole_reads if i.table == table.table] == [
        ("id", "n", "note", "a", "b", "c")
    ]


# -- registries from before table_oid ------------------------------------------------


async def test_a_registry_without_table_oid_keeps_working_and_is_migrated(
    pg: PostgresHarness, app: App
) -> None:
    """As installed before table_oid existed: reads, snapshots, status and
    fingerprints go on; ``tracking enable`` adds the column and records the
    table, keeping the history."""
    table, info, replica = await items(pg, app)
    registry = sql.Identifier(pg.tracking_schema, "tracked_tables")
    await pg.admin.execute(sql.SQL("alter table {} drop column table_oid").format(registry))
    minimum = (await status(pg, table))[1]

    await run(pg, app, "update {s}.items set n = 13 where id = 1")
    await replica.catch_up()
    assert replica.rows == await contents(pg, table, info)
    assert await fingerprint(pg, table) == info.fingerprint
    replica = await mirrors(pg, table, info)

    message = (await pg.source.tracking_enable([table]))[0]

    assert "already enabled" in message
    recorded = await (
        await pg.admin.execute(sql.SQL("select table_oid::text from {}").format(registry))
    ).fetchone()
    assert recorded == (info.identity,)
    assert (await status(pg, table))[1] == minimum
    await run(pg, app, "update {s}.items set n = 14 where id = 2")
    assert [r.key for r in await replica.catch_up()] == [{"id": 2}]
