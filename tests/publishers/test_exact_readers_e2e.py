"""The Python readers are as exact as the mirror, end to end: PostgreSQL ->
sidecar -> Redis -> a ``Subscriber``'s replica, and -> ``cdc subscribe``'s
output, for JSON numbers a float64 rounds or cannot hold and for nesting far
deeper than orjson, ``json`` or ``jsonpatch`` go. And ``cdc subscribe`` says
on stderr when it reloads.

Each value is compared with the database's own text of it, read by the
standard library with ``parse_float=Decimal`` (so ``3.14159...279`` must come
back a Decimal with every digit, not a float that equals it only roughly).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from cdc.config import RedisConfig, parse_config
from cdc.daemon import Daemon
from publishers.layout import Layout
from publishers.manager import DataManager
from publishers.model import Change
from publishers.subscriber import Subscriber
from tests.e2e import wait_for

PI = "3.141592653589793238462643383279"
NUMBERS = f'{{"pi": {PI}, "d": 12345678901234567.89, "e": 1e400}}'
BIG = 2**53 + 1  # a bigint JavaScript's JSON.parse and any float64 reader round
DEEP = 10_000  # json nests this deep at PostgreSQL 15's default max_stack_depth (13,099 objects)
NEST = '{"a": '  # how each level opens, as PostgreSQL writes it

TABLE = """create table {s}.vals (
    id int primary key, j jsonb, t json, big bigint, d300 jsonb, d1000 jsonb, deep json
)"""
COLUMNS = ("j", "t", "big", "d300", "d1000", "deep")


def nested(levels: int, leaf: str) -> str:
    return NEST * levels + leaf + "}" * levels


def row(key: int, big: int, leaf: str) -> str:
    values = [NUMBERS, NUMBERS, str(big), nested(300, PI), nested(1000, leaf), nested(DEEP, leaf)]
    quoted = ", ".join("'" + v + "'" for v in values)
    return f"insert into {{s}}.vals (id, {', '.join(COLUMNS)}) values ({key}, {quoted})"


def config_text(dsn: str, redis_url: str, namespace: str, schema: str) -> str:
    return (
        f"source:\n  kind: postgres\n  dsn: {dsn}\n  tracking_schema: {schema}_trk\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        "worker:\n  health: null\n"
        f"tables:\n  - table: {schema}.vals\n    partition: vals\n    section: vals\n"
        "    backoff: [[3, 10ms], [null, 50ms]]\n"
    )


async def sql(dsn: str, schema: str, *statements: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            await conn.execute(statement.replace("{s}", schema))


async def database_texts(dsn: str, schema: str) -> dict[str, dict[str, str]]:
    """key -> column -> the database's own text of the value."""
    casts = ", ".join(f"{c}::text" for c in COLUMNS)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(f"select id::text, {casts} from {schema}.vals")
        return {key: dict(zip(COLUMNS, texts, strict=True)) for key, *texts in await cursor.fetchall()}


def as_the_database_says(text: str) -> tuple[int, Any]:
    """(levels of ``{"a": ...}`` around the value, the innermost value), read by
    the standard library exactly: peeled off as text, as no stdlib parser goes
    10,000 levels deep."""
    levels = 0
    while text.startswith(NEST, levels * len(NEST)):
        levels += 1
    leaf = text[levels * len(NEST) : len(text) - levels]
    return levels, json.loads(leaf, parse_float=Decimal)


def innermost(value: Any, levels: int) -> Any:
    for _ in range(levels):
        value = value["a"]
    return value


def differences(replica: dict[str, dict[str, Any]], texts: dict[str, dict[str, str]]) -> list[str]:
    """Where the replica's values are not the database's, exactly (type included:
    Decimal("3.14...") == 3.141592653589793 is False, as it should be)."""
    out = []
    for key, columns in texts.items():
        document = replica.get(key)
        if document is None:
            out.append(f"{key}: missing")
            continue
        for column, text in columns.items():
            levels, expected = as_the_database_says(text)
            found = innermost(document[column], levels)
            if found != expected or type(found) is not type(expected):
                out.append(f"{key}.{column}: {found!r:.80} is not {expected!r:.80}")
    return out


@contextlib.asynccontextmanager
async def running(config_text_: str) -> AsyncIterator[Daemon]:
    daemon = Daemon(parse_config(config_text_, "<test>", {}))
    await daemon.source.connect()
    await daemon.source.tracking_enable(daemon.config.tables)
    task = asyncio.create_task(daemon.run())
    try:
        yield daemon
    finally:
        daemon.request_stop()
        await asyncio.wait_for(task, 60)


async def follow(subscriber: Subscriber) -> None:
    async for _ in subscriber:
        pass


@pytest.mark.timeout(180)
async def test_a_subscriber_and_cdc_subscribe_keep_every_digit_and_every_level(
    postgres_dsn: str,
    redis_url: str,
    redis_client: aioredis.Redis,
    namespace: str,
    pg_schema: str,
    tmp_path: Path,
) -> None:
    await sql(postgres_dsn, pg_schema, TABLE, row(1, BIG, PI))  # read by the snapshot
    text = config_text(postgres_dsn, redis_url, namespace, pg_schema)
    layout = Layout(namespace)
    subscriber = Subscriber(redis_client, namespace, "vals", from_seq=1)
    async with running(text):
        await wait_for(lambda: _indexed(redis_client, layout, "1"), 60, "the snapshot of row 1")
        following = asyncio.create_task(follow(subscriber))
        try:
            await sql(
                postgres_dsn,
                pg_schema,
                row(2, -BIG, "[12345678901234567.89]"),  # an insert: a root replace
                # an update: replaces of nested values, 1000 and 10,000 levels deep
                f"update {{s}}.vals set big = {BIG + 2}, d1000 = '{nested(1000, '1e400')}',"
                f" deep = '{nested(DEEP, '[1e400, 2e-400]')}' where id = 1",
            )
            texts = await database_texts(postgres_dsn, pg_schema)
            await wait_for(
                lambda: _true(not differences(replica(subscriber), texts)),
                60,
                "the replica to equal the rows",
            )
            assert not following.done()
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
    documents = replica(subscriber)
    assert documents["1"]["big"] == BIG + 2 and documents["2"]["big"] == -BIG
    assert documents["1"]["j"]["pi"] == Decimal(PI)

    entries: Any = await redis_client.xrange(layout.stream("vals"))
    stored = [fields[b"m"] for _, fields in entries]
    assert len(stored) == 3  # the snapshot row, the insert, the update
    config = tmp_path / "vals.yaml"
    config.write_text(text, encoding="utf-8")
    printed = await subscribe_lines(config, "vals", len(stored))
    assert printed == stored  # byte for byte: never decoded and encoded again
    for column, value in texts["2"].items():  # the insert carries the database's text as it is
        assert b'"' + column.encode() + b'":' + value.encode() in printed[1]
    assert b'"path":"/big","value":' + str(BIG + 2).encode() + b"}" in printed[2]


def replica(subscriber: Subscriber) -> dict[str, Any]:
    return subscriber.replica.get("vals", {})


async def _indexed(client: aioredis.Redis, layout: Layout, key: str) -> bool:
    return bool(await client.sismember(layout.index("vals", "vals"), key))


async def _true(value: bool) -> bool:
    return value


async def subscribe_lines(config: Path, partition: str, count: int, *more: str) -> list[bytes]:
    """The first ``count`` lines ``cdc subscribe --from-seq 1`` prints (without
    the newline); the process is stopped afterwards."""
    proc = await start_subscribe(config, partition, *more)
    try:
        assert proc.stdout is not None
        return [(await asyncio.wait_for(proc.stdout.readline(), 30)).rstrip(b"\n") for _ in range(count)]
    finally:
        proc.terminate()
        await proc.wait()


async def start_subscribe(config: Path, partition: str, *more: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "cdc.cli", "subscribe", "-c", str(config), "--partition", partition),
        *("--from-seq", "1", *more),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=2**24,  # a line holds 10,000 levels twice: far beyond the default 64 KiB
    )


# -- the reload notice ----------------------------------------------------------------


def change(key: str, version: int) -> Change:
    return Change("dbo.t", "p", "s", key, "U", version, {"n": str(version).encode()})


@pytest.mark.timeout(60)
async def test_cdc_subscribe_says_on_stderr_when_it_reloads(
    redis_url: str, redis_client: aioredis.Redis, namespace: str, postgres_dsn: str, tmp_path: Path
) -> None:
    """``--from-seq 1`` after the stream was trimmed past seq 1: the messages
    before the current seq are lost to this reader, and it says so on stderr
    (stdout stays JSON lines) and goes on with the next message."""
    manager = await DataManager.connect(RedisConfig(url=redis_url, namespace=namespace))
    try:
        await manager.apply([change(str(i), i) for i in range(1, 6)])
        stream = Layout(namespace).stream("p")
        await redis_client.xtrim(stream, maxlen=2, approximate=False)  # as stream_max_len does
        config = tmp_path / "p.yaml"
        config.write_text(
            config_text(postgres_dsn, redis_url, namespace, "public").replace("vals", "t"), encoding="utf-8"
        )
        proc = await start_subscribe(config, "p")
        try:
            assert proc.stderr is not None and proc.stdout is not None
            notice = await asyncio.wait_for(proc.stderr.readline(), 30)
            assert notice.decode() == (
                "cdc subscribe: reloaded at seq 5: the partition's stream no longer holds the messages this "
                "subscriber missed (trimmed, or Redis lost its data); messages go on from there\n"
            )
            await manager.apply([change("6", 6)])
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert json.loads(line)["seq"] == 6 and json.loads(line)["key"] == "6"
        finally:
            proc.terminate()
            await proc.wait()
    finally:
        await manager.close()
