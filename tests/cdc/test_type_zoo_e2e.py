"""The PostgreSQL type zoo (tests/cdc/pg_type_zoo.py) mirrored by a running
sidecar, against real PostgreSQL and Redis: what a user reads in Redis.

- each document field holds the JSON text docs/TYPES.md gives for the value,
  byte for byte, whether the row came by the snapshot or as a change; JSON
  columns hold the server's own JSON text, and the change message nests it;
- a row with a value JSON cannot spell goes to the dead letter with its
  table, key, column and reason, and the rows after it flow;
- ``cdc validate`` and ``cdc tracking enable`` refuse a column that cannot
  be mirrored (exit 2, naming the table, column, type and the fix) before
  anything is installed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from cdc.config import Config, parse_config
from cdc.daemon import Daemon
from publishers.layout import Layout
from tests.cdc.pg_type_zoo import DEAD, DEEP, PI, SETUP, ZOO, quoted
from tests.e2e import cdc, wait_for


def config_text(dsn: str, redis_url: str, namespace: str, schema: str, tables: Mapping[str, str]) -> str:
    entries = "".join(
        f"  - table: {schema}.{name}\n    partition: {name}\n    section: {name}\n"
        f"    backoff: [[3, 10ms], [null, 50ms]]\n{extra}"
        for name, extra in tables.items()
    )
    return (
        f"source:\n  kind: postgres\n  dsn: {dsn}\n  tracking_schema: {schema}_trk\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        f"worker:\n  health: null\n"
        f"tables:\n{entries}"
    )


async def sql(dsn: str, schema: str, *statements: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            await conn.execute(quoted(statement, schema))


def insert(table: str, row: Mapping[str, str]) -> str:
    columns = ", ".join(f'"{c}"' for c in row)
    return f"insert into {{s}}.{table} ({columns}) values ({', '.join(row.values())})"


def zoo_row(key: int) -> dict[str, str]:
    return {"id": str(key), **{column: case.literal for column, case in ZOO.items()}}


def dead_rows(first: int) -> list[dict[str, str]]:
    return [{"id": str(first + i), name: case.literal} for i, (name, case) in enumerate(DEAD.items())]


async def fields(client: aioredis.Redis, layout: Layout, table: str, key: str) -> dict[str, bytes]:
    found = await client.hgetall(layout.document(table, table, key))
    return {name.decode(): value for name, value in found.items() if not name.startswith(b"@")}


async def dead_letters(client: aioredis.Redis, layout: Layout) -> list[dict[str, str]]:
    entries = await client.xrange(layout.deadletter())
    return [{k.decode(): v.decode() for k, v in entry.items()} for _, entry in entries]


@pytest.mark.timeout(120)
async def test_a_running_sidecar_mirrors_the_type_zoo_exactly_and_dead_letters_the_rest(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str
) -> None:
    s = pg_schema
    zoo_columns = ", ".join(f'"{c}" {case.type}' for c, case in ZOO.items())
    dead_columns = ", ".join(f'"{name}" {case.type}' for name, case in DEAD.items())
    await sql(
        postgres_dsn,
        s,
        *SETUP,
        f"create table {{s}}.zoo (id int primary key, {zoo_columns})",
        f"create table {{s}}.dead (id int primary key, ok text, {dead_columns})",
        insert("zoo", zoo_row(1)),  # read by the snapshot
        insert("dead", {"id": "0", "ok": "'first'"}),
        *(insert("dead", row) for row in dead_rows(1)),
    )
    text = config_text(postgres_dsn, redis_url, namespace, s, {"zoo": "", "dead": ""})
    config: Config = parse_config(text, "<test>", {})
    daemon = Daemon(config)
    await daemon.source.connect()
    await daemon.source.tracking_enable(config.tables)
    task = asyncio.create_task(daemon.run())
    client = aioredis.Redis.from_url(redis_url)
    layout = Layout(namespace)
    try:
        await wait_for(lambda: _has(client, layout, "zoo", "1"), 30, "the snapshot of the zoo")
        await sql(
            postgres_dsn,
            s,
            insert("zoo", zoo_row(2)),  # read as changes
            insert("zoo", {"id": "3"}),
            *(insert("dead", row) for row in dead_rows(101)),
            insert("dead", {"id": "999", "ok": "'last'"}),
        )
        await wait_for(lambda: _has(client, layout, "dead", "999"), 30, "the row after the bad ones")
        await wait_for(lambda: _has(client, layout, "zoo", "3"), 30, "the zoo's changes")

        for key in ("1", "2"):
            assert _differences(await fields(client, layout, "zoo", key)) == {}
        assert await fields(client, layout, "zoo", "3") == {"id": b"3", **dict.fromkeys(ZOO, b"null")}
        await _the_message_nests_the_json_text(client, layout)

        await wait_for(lambda: _count(client, layout, 2 * len(DEAD)), 30, "every bad row dead-lettered")
        letters = {letter["key"]: letter for letter in await dead_letters(client, layout)}
        for first in (1, 101):  # by the snapshot, then as changes
            for i, (name, case) in enumerate(DEAD.items()):
                letter = letters[str(first + i)]
                assert (letter["table"], letter["partition"], letter["section"]) == (
                    f"{s}.dead",
                    "dead",
                    "dead",
                )
                assert letter["reason"].startswith(f"column {name}: ") and case.reason in letter["reason"]
        assert set(await client.smembers(layout.index("dead", "dead"))) == {b"0", b"999"}
        assert daemon.healthz()[0] and not task.done()
    finally:
        daemon.request_stop()
        await asyncio.wait_for(task, 60)
        await client.aclose()


def _differences(found: Mapping[str, bytes]) -> dict[str, tuple[bytes, bytes | None]]:
    """column -> (documented, in Redis) for each field that is not as documented."""
    return {c: (case.json, found.get(c)) for c, case in ZOO.items() if found.get(c) != case.json}


async def _the_message_nests_the_json_text(client: aioredis.Redis, layout: Layout) -> None:
    """The insert's patch carries the JSON column as a nested value, the server's own text
    (read as text: no parser keeps 1e400 and every digit, or goes 1000 levels deep)."""
    messages = [entry[b"m"] for _, entry in await client.xrange(layout.stream("zoo"))]
    [insert_2] = [m for m in messages if b'"key":"2"' in m]
    assert b'"op":"replace","path":"","value":{' in insert_2
    assert b'"c_json":' + PI + b"," in insert_2
    assert b'"c_json_deep":' + b"[" * DEEP + b"]" * DEEP in insert_2
    assert b'"c_date_bc":"-0043-03-15"' in insert_2


async def _has(client: aioredis.Redis, layout: Layout, table: str, key: str) -> bool:
    return bool(await client.sismember(layout.index(table, table), key))


async def _count(client: aioredis.Redis, layout: Layout, count: int) -> bool:
    return bool(await client.xlen(layout.deadletter()) >= count)


# -- refused before anything is installed ------------------------------------------------------


@pytest.mark.timeout(60)
async def test_validate_and_tracking_enable_refuse_a_column_that_cannot_be_mirrored(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str, tmp_path: Path
) -> None:
    s = pg_schema
    await sql(postgres_dsn, s, "create table {s}.refs (id int primary key, owner regclass, note text)")
    path = tmp_path / "cdc.yaml"
    path.write_text(config_text(postgres_dsn, redis_url, namespace, s, {"refs": ""}), encoding="utf-8")

    enabled = cdc("tracking", "enable", "-c", str(path))
    validated = cdc("validate", "-c", str(path))

    for result in (enabled, validated):
        output = result.stdout + result.stderr  # validate reports on stdout, enable's error is on stderr
        assert result.returncode == 2, output
        assert f"{s}.refs.owner: type regclass cannot be mirrored" in output
        assert "columns: [id, note]" in output
        assert "Traceback" not in output
    assert not await _installed(postgres_dsn, f"{s}_trk")
    path.write_text(
        config_text(postgres_dsn, redis_url, namespace, s, {"refs": "    columns: [note]\n"}),
        encoding="utf-8",
    )
    assert cdc("tracking", "enable", "-c", str(path)).returncode == 0
    assert await _installed(postgres_dsn, f"{s}_trk")


async def _installed(dsn: str, tracking_schema: str) -> Any:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        row = await (
            await conn.execute("select to_regnamespace(%s) is not null", [tracking_schema])
        ).fetchone()
    return row is not None and row[0]
