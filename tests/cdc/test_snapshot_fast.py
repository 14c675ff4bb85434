"""The fast snapshot against real PostgreSQL and Redis:

- the JSON text PostgreSQL writes for a page (``pg_snapshot``) is, for every
  column of the type zoo and for the edge values of the types it writes
  (control characters, quotes, non-ASCII text, numeric's NaN and infinities,
  NULLs), byte for byte what the change path writes for the same row;
- a snapshot that stops part-way (a failed read at 60% of the table) goes on
  after the last key it wrote, in a later view, and rows changed, deleted
  and inserted in between (before and after that key) still end right: the
  documents equal the table, and seq has no gap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from cdc.config import Config, parse_config
from cdc.daemon import Daemon
from cdc.errors import SourceUnavailable
from cdc.mapping import TableMapper
from cdc.snapshot_pages import map_page
from cdc.sources import make_source
from cdc.sources.base import ChangeSource, Column, SnapshotPage, TableInfo
from cdc.sources.pg_snapshot import json_expression
from tests.cdc.pg_type_zoo import SETUP, ZOO, quoted
from tests.e2e import assert_mirrored, assert_seq_gap_free, create_tables, enable_tracking, make_config

TEXTS = [
    "".join(chr(c) for c in range(1, 32)) + '"\\/',
    "é ü 中文 🎉 \u2028 \u2029 \x7f",
    "",
]
NUMERICS = ["'NaN'", "'Infinity'", "'-Infinity'", "0.00000001", "-12.50", "123456789012345678901234567890.5"]


async def sql(dsn: str, schema: str, *statements: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            await conn.execute(quoted(statement, schema).encode())


def zoo_config(dsn: str, redis_url: str, namespace: str, schema: str) -> Config:
    text = (
        f"source:\n  kind: postgres\n  dsn: {dsn}\n  tracking_schema: {schema}_trk\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        f"worker:\n  health: null\n"
        f"tables:\n  - table: {schema}.zoo\n    partition: zoo\n    section: zoo\n"
        f"  - table: {schema}.edges\n    partition: edges\n    section: edges\n"
    )
    return parse_config(text, "<test>", {})


async def pages(source: ChangeSource, info: TableInfo, *, encoded: bool) -> list[SnapshotPage]:
    return [page async for page in source.snapshot(info, page_size=3, encoded=encoded)]


@pytest.mark.timeout(120)
async def test_the_server_written_json_equals_the_change_paths_for_every_zoo_column(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str
) -> None:
    s = pg_schema
    zoo_columns = ", ".join(f'"{c}" {case.type}' for c, case in ZOO.items())
    zoo_values = ", ".join(case.literal for case in ZOO.values())
    zoo_names = ", ".join(f'"{c}"' for c in ZOO)
    await sql(
        postgres_dsn,
        s,
        *SETUP,
        f"create table {{s}}.zoo (id int primary key, {zoo_columns})",
        f"insert into {{s}}.zoo (id, {zoo_names}) values (1, {zoo_values})",
        "insert into {s}.zoo (id) values (2)",  # every column NULL
        "create table {s}.edges (id int primary key, t text, v varchar(200), n numeric, u uuid, j jsonb)",
        *_literal_edges(),
    )
    config = zoo_config(postgres_dsn, redis_url, namespace, s)
    await enable_tracking(config)
    source = make_source(config.source)
    await source.connect()
    try:
        for table_config in config.tables:
            info = await source.describe(table_config)
            mapper = TableMapper(table_config, info, 1 << 24)
            fast = await pages(source, info, encoded=True)
            assert fast[0].encoded_columns, "the server writes some columns"
            slow = await pages(source, info, encoded=False)
            by_path = {
                mapper.key_template.render({c: row[c] for c in info.primary_key}): mapper.encode(row, row)
                for page in slow
                for row in page.rows
            }
            by_server = {}
            for page in fast:
                mapped = map_page(page, mapper)
                for key, values in mapped.rows.by_partition[table_config.partition.source]:
                    by_server[key] = {
                        c: v.encode() if isinstance(v, str) else v
                        for c, v in zip(mapped.rows.columns, values, strict=True)
                    }
            assert by_server.keys() == by_path.keys() and len(by_path) >= 2
            for key, expected in by_path.items():
                differ = {
                    c: (v, by_server[key].get(c)) for c, v in expected.items() if by_server[key].get(c) != v
                }
                assert differ == {}, f"{table_config.table} row {key}"
    finally:
        await source.close()


def _literal_edges() -> list[str]:
    out = []
    for i, text in enumerate(TEXTS + TEXTS):
        literal = (
            "E'"
            + "".join(
                f"\\x{ord(ch):02x}" if ord(ch) < 32 else ch.replace("'", "''").replace("\\", "\\\\")
                for ch in text
            )
            + "'"
        )
        numeric = NUMERICS[i % len(NUMERICS)]
        out.append(
            f"insert into {{s}}.edges values ({i}, {literal}, {literal}, {numeric}, gen_random_uuid(),"
            f" jsonb_build_object('t', {literal}))"
        )
    out.append("insert into {s}.edges (id) values (100)")
    return out


class StopsOnce:
    """A source whose first snapshot of ``table`` fails after ``pages`` pages,
    having run ``meanwhile`` (writes) first; records each snapshot's ``after``."""

    def __init__(self, inner: ChangeSource, table: str, pages: int, meanwhile: Any) -> None:
        self.inner, self.table, self.pages, self.meanwhile = inner, table, pages, meanwhile
        self.afters: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def snapshot(self, info: TableInfo, **options: Any) -> AsyncIterator[SnapshotPage]:
        if info.table != self.table:
            async for page in self.inner.snapshot(info, **options):
                yield page
            return
        self.afters.append(options.get("after"))
        count = 0
        async for page in self.inner.snapshot(info, **options):
            if len(self.afters) == 1 and count == self.pages:
                await self.meanwhile()
                raise SourceUnavailable("the source went away (test)")
            count += 1
            yield page


@pytest.mark.timeout(120)
async def test_a_snapshot_that_stops_part_way_goes_on_after_its_last_key_and_ends_right(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    s = pg_schema
    await create_tables(postgres_dsn, s)
    await sql(
        postgres_dsn,
        s,
        "insert into {s}.items (id, name, qty, price) select g, 'n' || g, g, g / 100.0 from generate_series(1, 1000) g",
        "insert into {s}.lines select g, 1, 's', 1 from generate_series(1, 10) g",
    )
    config = make_config(s, postgres_dsn, redis_url, namespace, page_size=100)
    await enable_tracking(config)

    async def meanwhile() -> None:  # between the two views: both sides of the resume key (600)
        await sql(
            postgres_dsn,
            s,
            "update {s}.items set qty = -1 where id in (5, 700)",
            "delete from {s}.items where id in (6, 800)",
            "insert into {s}.items (id, name, qty) values (5000, 'late', 1), (0, 'first', 1)",
        )

    source = make_source(config.source)
    stopping = StopsOnce(source, f"{s}.items", pages=6, meanwhile=meanwhile)
    daemon = Daemon(config, source=stopping)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="cdc.tracker")
    task = asyncio.create_task(daemon.run(once=True))
    client = aioredis.Redis.from_url(redis_url)
    try:
        await asyncio.wait_for(task, 90)
        assert stopping.afters[:2] == [None, (600,)]  # went on after the last key written
        assert any(r.getMessage() == "snapshot resuming" for r in caplog.records)
        await assert_mirrored(postgres_dsn, s, client, namespace)
        await assert_seq_gap_free(client, namespace, ("items", "lines"))
        fields = await client.hgetall(f"{namespace}:@checkpoint:{s}.items")
        assert b"snapshot_after" not in fields and fields[b"state"] == b"streaming"
    finally:
        if not task.done():
            daemon.request_stop()
            await asyncio.wait_for(task, 30)
        await client.aclose()


@pytest.mark.timeout(60)
async def test_a_row_whose_partition_renders_empty_goes_to_the_dead_letter_and_the_rest_loads(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str
) -> None:
    s = pg_schema
    await sql(
        postgres_dsn,
        s,
        "create table {s}.codes (k text primary key, v int)",
        "insert into {s}.codes values ('a', 1), ('', 2)",
    )
    text = (
        f"source:\n  kind: postgres\n  dsn: {postgres_dsn}\n  tracking_schema: {s}_trk\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        f"worker:\n  health: null\n"
        f'tables:\n  - table: {s}.codes\n    partition: "{{k}}"\n    section: codes\n'
    )
    config = parse_config(text, "<test>", {})
    await enable_tracking(config)
    await asyncio.wait_for(Daemon(config).run(once=True), 60)
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await client.hget(f"{namespace}:{{a}}:codes:a", "v") == b"1"
        letters = await client.xrange(f"{namespace}:@deadletter")
        assert [(e[b"table"], e[b"reason"]) for _, e in letters] == [
            (f"{s}.codes".encode(), b"empty partition value")
        ]
    finally:
        await client.aclose()


def test_only_a_utf8_database_writes_text_and_jsonb_as_json_itself() -> None:
    """A SQL_ASCII database may hold bytes that are no UTF-8 in a text or a jsonb
    string: the whole row's text would be unreadable, so those columns are left to
    the Python path, which dead-letters that one row naming the column."""
    for type_name in ("jsonb", "text", "character varying(20)"):
        assert json_expression(Column("c", type_name), utf8=False) is None
        assert json_expression(Column("c", type_name), utf8=True) is not None
    assert json_expression(Column("c", "bigint"), utf8=False) is not None
