"""Helpers for end-to-end tests: configs, writers, and the checks a user makes
(the documents in Redis equal the rows in the database, seq has no gaps)."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import redis.asyncio as aioredis

from cdc.config import Config, parse_config
from cdc.sources import make_source
from cdc.values import encode_value
from publishers.layout import Layout

ITEMS_DDL = """
create table {s}.items (
    id int primary key,
    region int not null default 1,
    name text,
    qty int,
    price numeric(12, 2),
    big bigint,
    updated timestamptz default now(),
    tags jsonb
)
"""
LINES_DDL = """
create table {s}.lines (
    order_id int not null,
    line int not null,
    sku text not null,
    qty int not null,
    primary key (order_id, line)
)
"""


def config_text(
    schema: str,
    postgres_dsn: str,
    redis_url: str,
    namespace: str,
    *,
    capture: str = "triggers",
    **worker: Any,
) -> str:
    worker_lines = "\n".join(f"  {k}: {v}" for k, v in {"health": "null", **worker}.items())
    return f"""
source:
  kind: postgres
  dsn: {postgres_dsn}
  capture: {capture}
  tracking_schema: {schema}_trk
redis:
  url: {redis_url}
  namespace: {namespace}
  stream_max_len: 1000000
worker:
{worker_lines}
tables:
  - table: {schema}.items
    partition: "r{{id}}"
    section: items
    backoff: [[3, 10ms], [null, 50ms]]
  - table: {schema}.lines
    partition: orders
    section: lines
    key: "{{order_id}}-{{line}}"
    backoff: [[3, 10ms], [null, 50ms]]
"""


def make_config(
    schema: str,
    postgres_dsn: str,
    redis_url: str,
    namespace: str,
    *,
    capture: str = "triggers",
    **worker: Any,
) -> Config:
    text = config_text(schema, postgres_dsn, redis_url, namespace, capture=capture, **worker)
    return parse_config(text, "<test>", {})


def write_config(
    path: Path,
    schema: str,
    postgres_dsn: str,
    redis_url: str,
    namespace: str,
    *,
    capture: str = "triggers",
    **worker: Any,
) -> Path:
    text = config_text(schema, postgres_dsn, redis_url, namespace, capture=capture, **worker)
    path.write_text(text, encoding="utf-8")
    return path


async def enable_tracking(config: Config) -> None:
    """``cdc tracking enable`` for every table of ``config``."""
    source = make_source(config.source)
    await source.connect()
    try:
        await source.tracking_enable(config.tables)
    finally:
        await source.close()


async def create_tables(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(ITEMS_DDL.format(s=schema))
        await conn.execute(LINES_DDL.format(s=schema))


def item_partition(key: dict[str, Any]) -> str:
    return f"r{key['id']}"


async def expected_documents(dsn: str, schema: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(partition, section, key) -> document, as the rows are now."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(f"select * from {schema}.items")
        names = [d.name for d in cur.description or ()]
        for row in await cur.fetchall():
            doc = _document(names, row)
            out[(f"r{doc['id']}", "items", str(doc["id"]))] = doc
        cur = await conn.execute(f"select * from {schema}.lines")
        names = [d.name for d in cur.description or ()]
        for row in await cur.fetchall():
            doc = _document(names, row)
            out[("orders", "lines", f"{doc['order_id']}-{doc['line']}")] = doc
    return out


def _document(names: list[str], row: Any) -> dict[str, Any]:
    """A row as its document holds it: columns named @... are reserved, left out."""
    return {
        n: json.loads(encode_value(v, n)) for n, v in zip(names, row, strict=True) if not n.startswith("@")
    }


async def actual_documents(
    client: aioredis.Redis, namespace: str
) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every live document in Redis under ``namespace``, found through the indexes."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for section in ("items", "lines"):
        partitions = await client.smembers(Layout(namespace).partitions(section))
        for raw in partitions:
            partition = raw.decode() if isinstance(raw, bytes) else raw
            keys = await client.smembers(Layout(namespace).index(partition, section))
            for raw_key in keys:
                key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
                fields = await client.hgetall(Layout(namespace).document(partition, section, key))
                doc = {
                    (k.decode() if isinstance(k, bytes) else k): json.loads(v)
                    for k, v in fields.items()
                    if not (k.decode() if isinstance(k, bytes) else k).startswith("@")
                }
                out[(partition, section, key)] = doc
    return out


def cdc(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The command line as a user runs it: a process of its own, text logs."""
    return subprocess.run(
        [sys.executable, "-m", "cdc.cli", "--text-logs", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def wait_for(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def assert_mirrored(
    dsn: str, schema: str, client: aioredis.Redis, namespace: str, timeout: float = 30
) -> None:
    """Wait until the documents equal the rows; on timeout show the difference."""
    last: list[Any] = [None, None]

    async def equal() -> bool:
        last[0] = await expected_documents(dsn, schema)
        last[1] = await actual_documents(client, namespace)
        return bool(last[0] == last[1])

    try:
        await wait_for(equal, timeout, "Redis to mirror the tables")
    except AssertionError:
        expected, actual = last
        missing = sorted(set(expected) - set(actual))[:5]
        extra = sorted(set(actual) - set(expected))[:5]
        differ = [k for k in expected if k in actual and expected[k] != actual[k]][:3]
        details = [(k, expected[k], actual[k]) for k in differ]
        raise AssertionError(f"not mirrored: missing {missing}, extra {extra}, differing {details}") from None


async def assert_seq_gap_free(client: aioredis.Redis, namespace: str, sections: tuple[str, ...]) -> int:
    """Every partition's stream holds 1..@seq without a gap; returns the message count."""
    total = 0
    partitions: set[str] = set()
    for section in sections:
        for raw in await client.smembers(Layout(namespace).partitions(section)):
            partitions.add(raw.decode() if isinstance(raw, bytes) else raw)
    for partition in partitions:
        seq, entries = await _seq_and_stream(client, Layout(namespace), partition)
        ids = [int(_text(entry_id).split("-")[0]) for entry_id, _ in entries]
        assert ids == list(range(1, seq + 1)), f"partition {partition}: stream ids are not 1..{seq}"
        seqs = [json.loads(message)["seq"] for _, message in entries]
        assert seqs == ids, f"partition {partition}: message seq differs from stream id"
        total += seq
    return total


# @seq and the stream in one read: the apply script writes them together, and a
# sidecar still running (a snapshot's R marker after its documents) would
# otherwise add an entry between a GET and an XRANGE.
_SEQ_AND_STREAM = "return {redis.call('GET', KEYS[1]) or '0', redis.call('XRANGE', KEYS[2], '-', '+')}"


async def _seq_and_stream(client: Any, layout: Layout, partition: str) -> tuple[int, list[tuple[Any, Any]]]:
    raw_seq, raw_entries = await client.eval(
        _SEQ_AND_STREAM, 2, layout.seq(partition), layout.stream(partition)
    )
    entries = []
    for entry_id, fields in raw_entries:
        values = dict(zip(map(_text, fields[::2]), fields[1::2], strict=True))
        entries.append((entry_id, values["m"]))
    return int(_text(raw_seq)), entries


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Writers:
    """Concurrent writers: inserts, updates, deletes, primary-key updates,
    re-inserts, and long transactions that take an early xid and commit last."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        seed: int = 1,
        ids: int = 200,
        tolerate: tuple[type[psycopg.Error], ...] = (),
    ) -> None:
        self.dsn, self.schema, self.ids = dsn, schema, ids
        self.rng = random.Random(seed)
        self.stop = asyncio.Event()
        self.go = asyncio.Event()  # cleared: the writers pause between transactions
        self.go.set()
        self.tolerate = tolerate  # errors that are part of the load (a table renamed away, say)
        self.transactions = 0

    async def run(self, writers: int = 4, long_transactions: int = 1) -> None:
        tasks = [self._writer(i) for i in range(writers)] + [self._long(i) for i in range(long_transactions)]
        await asyncio.gather(*tasks)

    async def _writer(self, n: int) -> None:
        rng = random.Random(self.rng.random())
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                await self.go.wait()
                try:
                    async with conn.transaction():
                        for _ in range(rng.randint(1, 4)):
                            await self._one_write(conn, rng)
                    self.transactions += 1
                except self.tolerate:
                    await asyncio.sleep(0.01)
                except psycopg.ProgrammingError:
                    raise  # a broken statement must fail the test, not empty the load
                except psycopg.errors.Error:
                    pass  # conflicts (unique violations, deadlocks) are part of the load
                await asyncio.sleep(0)

    async def _one_write(self, conn: psycopg.AsyncConnection[Any], rng: random.Random) -> None:
        s, i = self.schema, rng.randint(1, self.ids)
        choice = rng.random()
        if choice < 0.3:
            await conn.execute(
                f"insert into {s}.items (id, name, qty, price, big, tags) values (%s, %s, %s, %s, %s, %s)"
                " on conflict (id) do update set qty = excluded.qty, name = excluded.name",
                (i, f"item {i}", rng.randint(0, 99), rng.randint(0, 99999) / 100, 2**62 + i, '{"a": [1, 2]}'),
            )
        elif choice < 0.6:
            await conn.execute(
                f"update {s}.items set qty = qty + 1, price = price + 0.01 where id = %s", (i,)
            )
        elif choice < 0.7:
            await conn.execute(f"delete from {s}.items where id = %s", (i,))
        elif choice < 0.75:
            await conn.execute(  # primary-key update: D of the old key, I of the new one
                f"update {s}.items set id = %s where id = %s and not exists (select 1 from {s}.items where id = %s)",
                (i + self.ids, i, i + self.ids),
            )
        elif choice < 0.9:
            await conn.execute(
                f"insert into {s}.lines values (%s, %s, %s, %s) on conflict (order_id, line) do update"
                f" set qty = {s}.lines.qty + 1",
                (i % 20, rng.randint(1, 5), f"sku-{i}", 1),
            )
        else:
            await conn.execute(f"delete from {s}.lines where order_id = %s", (i % 20,))

    async def _long(self, n: int) -> None:
        """Takes a transaction id early, writes, lingers, commits late; repeats."""
        rng = random.Random(self.rng.random())
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                await self.go.wait()
                try:
                    async with conn.transaction():
                        await conn.execute("select pg_current_xact_id()")
                        await self._one_write(conn, rng)
                        await asyncio.sleep(rng.uniform(0.2, 0.8))
                        await self._one_write(conn, rng)
                except self.tolerate:
                    await asyncio.sleep(0.01)
                except psycopg.ProgrammingError:
                    raise
                except psycopg.errors.Error:
                    pass
