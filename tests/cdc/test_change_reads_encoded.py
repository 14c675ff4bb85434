"""Change reads whose JSON text PostgreSQL writes (``pg_read_encoded``, what
the tracker reads): for every column of the type zoo and the date, time and
double edge values, after inserts, updates and deletes, the changes the
mapper makes of them (``TableMapper.from_row``) are byte for byte, column
order included, those of a plain read of the same changes; a row the plain
path refuses (a NaN) is refused with the same reason; and paging (a held
read) gives the same rows as one page.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from cdc.config import Config, parse_config
from cdc.errors import PoisonChange
from cdc.mapping import TableMapper
from cdc.sources import make_source
from cdc.sources.base import ChangeSource, TableInfo
from cdc.sources.postgres import PostgresSource
from tests.cdc.pg_type_zoo import SETUP, ZOO, quoted
from tests.cdc.test_snapshot_odd_values import rows as odd_rows
from tests.e2e import enable_tracking


def config(dsn: str, redis_url: str, namespace: str, schema: str) -> Config:
    text = (
        f"source:\n  kind: postgres\n  dsn: {dsn}\n  tracking_schema: {schema}_trk\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        f"worker:\n  health: null\n"
        f"tables:\n  - table: {schema}.zoo\n    partition: zoo\n    section: zoo\n"
        f"  - table: {schema}.odd\n    partition: odd\n    section: odd\n"
    )
    return parse_config(text, "<test>", {})


async def read_all(source: ChangeSource, info: TableInfo, since: int, limit: int) -> list[Any]:
    page = await source.read_changes(info, since, limit=limit)
    rows = list(page.rows)
    while page.more:
        page = await source.read_changes(info, since, limit=limit, upto=page.next_version, after=page.cursor)
        rows += page.rows
    return rows


def mapped(mapper: TableMapper, rows: list[Any]) -> list[Any]:
    """Each row's change as (key, op, version, values in column order), or its refusal."""
    out: list[Any] = []
    for row in rows:
        try:
            change = mapper.from_row(row)
        except PoisonChange as exc:
            out.append((row.key, str(exc)))
            continue
        assert change is not None
        values = None if change.values is None else list(change.values.items())
        out.append((change.partition, change.key, change.op, change.version, values))
    return out


async def write(dsn: str, schema: str) -> None:
    zoo_columns = ", ".join(f'"{c}" {case.type}' for c, case in ZOO.items())
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in (
            *SETUP,
            f"create table {{s}}.zoo (id int primary key, {zoo_columns})",
            "create table {s}.odd (id int primary key, d date, ts timestamp, ts3 timestamp(3),"
            " tz timestamptz, f double precision)",
        ):
            await conn.execute(quoted(statement, schema).encode())


async def change(dsn: str, schema: str) -> None:
    zoo_values = ", ".join(case.literal for case in ZOO.values())
    zoo_names = ", ".join(f'"{c}"' for c in ZOO)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in (
            f"insert into {{s}}.zoo (id, {zoo_names}) values (1, {zoo_values})",
            f"insert into {{s}}.zoo (id, {zoo_names}) values (3, {zoo_values})",
            "insert into {s}.zoo (id) values (2)",  # every column NULL
            "update {s}.zoo set c_int4 = 7 where id = 3",
            "delete from {s}.zoo where id = 2",
        ):
            await conn.execute(quoted(statement, schema).encode())
        async with conn.cursor() as cursor:
            await cursor.executemany(
                f"insert into {schema}.odd values (%s, %s::date, %s::timestamp, %s::timestamp(3),"
                " %s::timestamptz, %s::float8)",
                odd_rows(),
            )
        await conn.execute(f"update {schema}.odd set f = -f where id % 3 = 0")
        await conn.execute(f"delete from {schema}.odd where id % 7 = 0")


@pytest.mark.timeout(240)
async def test_encoded_change_reads_map_to_the_plain_reads_changes(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str
) -> None:
    await write(postgres_dsn, pg_schema)
    cfg = config(postgres_dsn, redis_url, namespace, pg_schema)
    await enable_tracking(cfg)
    plain, encoded = make_source(cfg.source), make_source(cfg.source)
    assert isinstance(encoded, PostgresSource)
    encoded.encoded_reads.on = True  # as the tracker's feeder does
    await plain.connect()
    await encoded.connect()
    try:
        since = await plain.current_version()
        await change(postgres_dsn, pg_schema)
        for table_config in cfg.tables:
            info = await plain.describe(table_config)
            assert await encoded.describe(table_config) == info
            mapper = TableMapper(table_config, info, 1 << 24)
            expected = mapped(mapper, await read_all(plain, info, since, 1000))
            assert len(expected) >= 3
            for limit in (1000, 37):  # one statement; pages of a held read
                rows = await read_all(encoded, info, since, limit)
                assert any(row.text is not None for row in rows), "the server wrote the text"
                found = mapped(mapper, rows)
                differ = [(e, f) for e, f in zip(expected, found, strict=True) if e != f]
                assert differ == [] and len(found) == len(expected), f"{table_config.table}, pages of {limit}"
        refused = [item for item in expected if len(item) == 2]
        assert refused and all("cannot be represented in JSON" in reason for _, reason in refused)
    finally:
        await plain.close()
        await encoded.close()
