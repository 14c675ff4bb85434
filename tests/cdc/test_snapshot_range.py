"""A snapshot of a key range (``cdc snapshot --table T --from KEY --to KEY``)
against real PostgreSQL and Redis, as a user runs it: the documents of the
range are written again, a document a newer change wrote is left, nothing
outside the range is touched (no sweep), the checkpoint does not move, and
each partition written gets one R message. Its T-SQL twin parses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis
import sqlglot

from cdc.config import RedisConfig, parse_config
from cdc.errors import SourceUnavailable
from cdc.snapshot_range import REQUESTED, KeyRange, due, request_range, requested
from cdc.sources import mssql_sql as sql
from cdc.sources.base import Column, TableInfo
from publishers.layout import Layout
from publishers.manager import DataManager
from tests.e2e import cdc, config_text, create_tables, enable_tracking


async def write(dsn: str, *statements: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            await conn.execute(statement.encode())


@pytest.mark.timeout(120)
async def test_a_key_range_is_written_again_and_nothing_else_is_touched(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str, tmp_path: Path
) -> None:
    s = pg_schema
    await create_tables(postgres_dsn, s)
    await write(
        postgres_dsn,
        f"insert into {s}.items (id, name, qty) select g, 'n' || g, g from generate_series(1, 40) g",
    )
    path = tmp_path / "cdc.yaml"
    path.write_text(config_text(s, postgres_dsn, redis_url, namespace), encoding="utf-8")
    await enable_tracking(parse_config(path.read_text(), str(path), {}))
    assert cdc("run", "-c", str(path), "--once").returncode == 0
    layout = Layout(namespace)
    client = aioredis.Redis.from_url(redis_url)
    try:
        checkpoint = await client.hget(layout.checkpoint(f"{s}.items"), "version")
        # damage: documents of the range and outside it lost, one of the range changed
        for key in (10, 11, 20, 30):
            await client.delete(layout.document(f"r{key}", "items", str(key)))
            await client.srem(layout.index(f"r{key}", "items"), str(key))
        await client.hset(layout.document("r12", "items", "12"), "name", '"damaged"')
        # a document a newer change wrote (its @v above any version of the range)
        await client.hset(
            layout.document("r15", "items", "15"), mapping={"@v": "99999999999", "name": '"newer"'}
        )
        # a row changed after the checkpoint, outside the range: left to the change stream
        await write(postgres_dsn, f"update {s}.items set name = 'later' where id = 25")

        before = {key: await client.xlen(layout.stream(f"r{key}")) for key in (10, 20, 25, 30)}
        result = cdc("snapshot", "-c", str(path), "--table", f"{s}.items", "--from", "10", "--to", "20")
        assert result.returncode == 0, result.stderr

        async def name(key: int) -> bytes | None:
            value: bytes | None = await client.hget(layout.document(f"r{key}", "items", str(key)), "name")
            return value

        for key in (10, 11, 12, 20):
            assert await name(key) == f'"n{key}"'.encode(), key
            assert await client.sismember(layout.index(f"r{key}", "items"), str(key))
        assert await name(15) == b'"newer"'  # newer than the range's view: left
        assert await name(30) is None  # outside the range: untouched
        assert await name(25) == b'"n25"'  # outside the range: the change stream's, later
        assert await client.hget(layout.checkpoint(f"{s}.items"), "version") == checkpoint
        # one R message in each partition written, none elsewhere
        for key in (10, 20):
            entries = await client.xrange(layout.stream(f"r{key}"))
            assert len(entries) == before[key] + 1 and json.loads(entries[-1][1][b"m"])["op"] == "R"
        for key in (25, 30):
            assert await client.xlen(layout.stream(f"r{key}")) == before[key]
    finally:
        await client.aclose()


def test_a_range_without_a_table_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "cdc.yaml"
    path.write_text("source: {kind: postgres, dsn: x}\nredis: {url: redis://127.0.0.1:1/0}\ntables: []\n")
    result = cdc("snapshot", "-c", str(path), "--from", "10")
    assert result.returncode == 2 and "--from and --to need --table" in result.stderr


def test_the_t_sql_page_of_a_range_parses_and_bounds_both_ends() -> None:
    shape = sql.TableShape(
        schema="dbo",
        name="Lines",
        primary_key=("Order", "Line"),
        key_types=("int", "int"),
        columns=("Order", "Line", "Sku"),
    )
    first = sql.snapshot_page(shape, limit=100, start=["5", "1"], until=["9", "3"])
    later = sql.snapshot_page(shape, limit=100, after=[6, 2], until=["9", "3"])
    for statement in (first, later):
        tree = sqlglot.parse_one(statement.sql, read="tsql")
        assert len(list(tree.find_all(sqlglot.exp.Placeholder))) == len(statement.params)
    assert "t.[Line] >= CAST(? AS int)" in first.sql and "t.[Line] <= CAST(? AS int)" in first.sql
    assert "(t.[Order] > CAST(? AS int) OR (t.[Order] = CAST(? AS int) AND" in first.sql
    assert "(t.[Order] < CAST(? AS int) OR (t.[Order] = CAST(? AS int) AND" in first.sql
    assert first.params == (100, "5", "5", "1", "9", "9", "3")
    assert "t.[Line] > CAST(? AS int)" in later.sql and ">=" not in later.sql


class _FailingRangeTracker:
    """A tracker whose range snapshot fails part-way (the source lost, a crash)."""

    def __init__(self, manager: DataManager, table: str) -> None:
        self.manager, self.table, self.position = manager, table, 1
        self.loader = self
        self.feeder: Any = None
        self.whole: list[str] = []

    @property
    def info(self) -> TableInfo:
        schema, name = self.table.split(".")
        return TableInfo(self.table, schema, name, ("id",), (Column("id", "integer"),))

    async def load_range(self, *args: Any) -> int:
        raise SourceUnavailable("the source went away")

    async def snapshot(self, reason: str) -> None:
        self.whole.append(reason)


async def test_a_range_that_fails_is_still_requested_and_runs_as_a_range_next_time(
    redis_config: RedisConfig,
) -> None:
    manager = await DataManager.connect(redis_config)
    try:
        tracker = _FailingRangeTracker(manager, "shop.orders")
        await request_range(manager, tracker.table, KeyRange("10", "20"))
        with pytest.raises(SourceUnavailable):
            await due(tracker, REQUESTED)  # type: ignore[arg-type]
        assert (await requested(manager, tracker.table))[0] == KeyRange("10", "20")
        assert tracker.whole == []  # never turned into a whole snapshot

        tracker.loader = _Done()  # type: ignore[assignment]
        await due(tracker, REQUESTED)  # type: ignore[arg-type]
        assert await requested(manager, tracker.table) == (None, None)
    finally:
        await manager.close()


class _Done:
    async def load_range(self, *args: Any) -> int:
        return 0
