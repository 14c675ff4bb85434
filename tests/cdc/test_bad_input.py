"""Bad input: each gets a clear error, the exit code of DESIGN.md §6, and loses
nothing. Config errors exit 2 naming the file, line and field (or the table
and column); values that cannot be mirrored go to the dead letter with their
table, key and reason while the rest keeps flowing; a Redis out of memory is
waited out. Config-file cases already in tests/cdc/test_config.py and
tests/cdc/test_cli.py are not repeated here.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from cdc.config import parse_config
from cdc.daemon import Daemon
from cdc.devservers import RedisServer, free_port
from cdc.values import encode_value
from publishers.layout import Layout
from publishers.manager import DataManager
from tests.chaos import (
    Follower,
    VersionSampler,
    assert_nothing_lost,
    checking_client,
    published,
    wait_health,
    wait_published_more,
)
from tests.e2e import Writers, create_tables, make_config, wait_for


def cdc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdc.cli", "--text-logs", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def config_text(dsn: str, redis_url: str, namespace: str, schema: str, tables: str, worker: str = "") -> str:
    return (
        f"source:\n  kind: postgres\n  dsn: {dsn}\n  tracking_schema: {schema}_trk\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        f"worker:\n  health: null\n{worker}"
        f"tables:\n{tables}"
    )


async def sql(dsn: str, *statements: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            await conn.execute(statement)  # type: ignore[arg-type]


async def no_keys(redis_url: str, namespace: str) -> bool:
    client = aioredis.Redis.from_url(redis_url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{namespace}:*")]
        return not [k for k in keys if not k.endswith(b":@epoch")]
    finally:
        await client.aclose()


@pytest.fixture
async def tracked_table(postgres_dsn: str, pg_schema: str) -> str:
    await sql(
        postgres_dsn,
        f"create table {pg_schema}.t (id int primary key, region int not null, v text)",
        f"insert into {pg_schema}.t values (1, 1, 'a'), (2, 2, 'b')",
    )
    return f"{pg_schema}.t"


# -- the config and the tables: exit 2, nothing written -------------------------------


@pytest.mark.parametrize("command", [["validate"], ["run", "--once"]])
async def test_a_template_over_a_non_key_column(
    command: list[str],
    tracked_table: str,
    postgres_dsn: str,
    redis_url: str,
    namespace: str,
    pg_schema: str,
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.yaml"
    tables = f"  - table: {tracked_table}\n    section: t\n    partition: '{{region}}'\n"
    path.write_text(config_text(postgres_dsn, redis_url, namespace, pg_schema, tables))
    result = cdc(*command, "-c", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        f"{path}:13: tables[0].partition: template '{{region}}' uses 'region', which is not a "
        "primary-key column (primary key: id)"
    ) in result.stdout + result.stderr
    assert await no_keys(redis_url, namespace)


async def test_identifiers_carrying_injections_are_refused_before_any_sql(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str, tracked_table: str, tmp_path: Path
) -> None:
    path = tmp_path / "t.yaml"
    injected = f'"{tracked_table}; drop table {tracked_table}; --"'
    path.write_text(config_text(postgres_dsn, redis_url, namespace, pg_schema, f"  - table: {injected}\n"))
    result = cdc("validate", "-c", str(path))
    assert result.returncode == 2
    assert f"{path}:11: tables[0].table: " in result.stderr and "is not valid here" in result.stderr
    async with await psycopg.AsyncConnection.connect(postgres_dsn) as conn:
        count = await (await conn.execute(f"select count(*) from {tracked_table}")).fetchone()  # type: ignore[arg-type]
    assert count == (2,), "the table must still be there"


@pytest.mark.parametrize("command", [["validate"], ["run"]])
async def test_a_missing_environment_variable(
    command: list[str], redis_url: str, namespace: str, pg_schema: str, tmp_path: Path
) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(config_text("${CDC_TEST_UNSET_DSN}", redis_url, namespace, pg_schema, "  - table: s.t\n"))
    env = {k: v for k, v in os.environ.items() if k != "CDC_TEST_UNSET_DSN"}
    result = cdc(*command, "-c", str(path), env=env)
    assert result.returncode == 2
    assert f"{path}:3: source.dsn: environment variable CDC_TEST_UNSET_DSN is not set" in result.stderr


@pytest.mark.parametrize("command", [["validate"], ["run", "--once"]])
async def test_a_table_without_a_primary_key_or_without_tracking(
    command: list[str],
    tracked_table: str,
    postgres_dsn: str,
    redis_url: str,
    namespace: str,
    pg_schema: str,
    tmp_path: Path,
) -> None:
    """Refused at start-up, naming the table: nothing is snapshotted into
    Redis for a table whose changes could not be followed."""
    await sql(postgres_dsn, f"create table {pg_schema}.nokey (a int, b text)")
    for table, message in (
        (f"{pg_schema}.nokey", "the table has no primary key"),
        (
            tracked_table,
            "change tracking is not enabled",
        ),  # the schema is installed, the table is not tracked
    ):
        path = tmp_path / "t.yaml"
        path.write_text(config_text(postgres_dsn, redis_url, namespace, pg_schema, f"  - table: {table}\n"))
        if table == tracked_table:
            await sql(postgres_dsn, f"create table {pg_schema}.other (id int primary key)")
            other = path.with_name("other.yaml")
            other.write_text(
                config_text(postgres_dsn, redis_url, namespace, pg_schema, f"  - table: {pg_schema}.other\n")
            )
            assert cdc("tracking", "enable", "-c", str(other)).returncode == 0
        result = cdc(*command, "-c", str(path))
        assert result.returncode == 2, result.stdout + result.stderr
        assert f"{table}" in result.stdout + result.stderr and message in result.stdout + result.stderr
        assert await no_keys(redis_url, namespace), "nothing may be written for a table refused"


@pytest.mark.parametrize("command", [["validate"], ["run", "--once"]])
async def test_an_unsupported_column_type(
    command: list[str], postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str, tmp_path: Path
) -> None:
    # nearly every type is mirrored (docs/TYPES.md); a reg* value is a name that goes stale
    await sql(postgres_dsn, f"create table {pg_schema}.geo (id int primary key, at regclass, name text)")
    path = tmp_path / "t.yaml"
    path.write_text(
        config_text(postgres_dsn, redis_url, namespace, pg_schema, f"  - table: {pg_schema}.geo\n")
    )
    result = cdc(*command, "-c", str(path))
    assert result.returncode == 2
    assert f"{pg_schema}.geo.at: type regclass cannot be mirrored" in result.stdout + result.stderr
    assert await no_keys(redis_url, namespace)


async def test_a_reserved_column_name_is_left_out_with_a_warning(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str, tmp_path: Path
) -> None:
    """A column named ``@flag`` (documents keep their own fields under @...)
    is left out, said by ``cdc validate``; the table's changes then flow,
    without it, and nothing goes to the dead letter."""
    await sql(postgres_dsn, f'create table {pg_schema}.flags (id int primary key, "@flag" bool, n int)')
    path = tmp_path / "t.yaml"
    path.write_text(
        config_text(postgres_dsn, redis_url, namespace, pg_schema, f"  - table: {pg_schema}.flags\n")
    )
    assert cdc("tracking", "enable", "-c", str(path)).returncode == 0
    await sql(postgres_dsn, f"insert into {pg_schema}.flags values (1, true, 10)")

    checked = cdc("validate", "-c", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert (
        f"warn  {pg_schema}.flags: left out of the documents" in checked.stdout and "@flag" in checked.stdout
    )

    ran = cdc("run", "--once", "-c", str(path))
    assert ran.returncode == 0, ran.stderr
    client = aioredis.Redis.from_url(redis_url)
    try:
        layout = Layout(namespace)
        partition = (await client.smembers(layout.partitions("flags"))).pop().decode()
        document = await client.hgetall(layout.document(partition, "flags", "1"))
        assert document[b"n"] == b"10" and b"@flag" not in document
        assert await client.xlen(layout.deadletter()) == 0
    finally:
        await client.aclose()


# -- values that cannot be mirrored: the dead letter, and the rest flows -------------------

ODD_DDL = "create table {s}.odd (id int primary key, d float8, note text, blob bytea)"


@pytest.mark.timeout(120)
async def test_values_json_cannot_hold_and_oversized_rows_go_to_the_dead_letter(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str
) -> None:
    """A NaN or infinite double has no JSON number; a row above
    ``worker.max_row_bytes`` is refused. Each goes to ``ns:@deadletter`` with
    its table, key and reason, while the other rows keep flowing and the
    sidecar keeps running; once the row is fixed at the source, it flows too.

    Text that is not valid UTF-8 cannot be produced: a PostgreSQL UTF8
    database refuses it (and NUL) on input, so no such value can reach the
    sidecar. Arbitrary bytes live in bytea, which is published as base64."""
    s = pg_schema
    await sql(
        postgres_dsn,
        ODD_DDL.format(s=s),
        f"insert into {s}.odd (id, d, note) select i, i, 'n' from generate_series(1, 20) i",
    )
    text = config_text(
        postgres_dsn,
        redis_url,
        namespace,
        pg_schema,
        f"  - table: {s}.odd\n    partition: odd\n    section: odd\n    backoff: [[3, 10ms], [null, 50ms]]\n",
        worker="  max_row_bytes: 2000\n",
    )
    config = parse_config(text, "<test>", {})
    daemon = Daemon(config)
    await daemon.source.connect()
    await daemon.source.tracking_enable(config.tables)
    task = asyncio.create_task(daemon.run())
    client = aioredis.Redis.from_url(redis_url)
    try:
        await wait_for(lambda: _mirrored(client, postgres_dsn, config), 30, "the table to be mirrored")
        with pytest.raises(psycopg.errors.CharacterNotInRepertoire):
            await sql(
                postgres_dsn,
                f"insert into {s}.odd (id, note) values (99, convert_from('\\xff'::bytea, 'UTF8'))",
            )
        await sql(
            postgres_dsn,
            f"insert into {s}.odd (id, d) values (21, 'NaN')",
            f"insert into {s}.odd (id, note) values (22, repeat('x', 5000))",
            f"insert into {s}.odd (id, blob) values (23, '\\xfffe00c328'::bytea)",  # not UTF-8: bytea, base64
            f"update {s}.odd set d = 'Infinity' where id = 5",
            f"insert into {s}.odd (id, d) select i, i from generate_series(24, 30) i",
        )
        layout = Layout(namespace)
        await wait_for(lambda: _dead_letters(client, layout, 3), 30, "three dead letters")
        letters = {entry["key"]: entry for entry in await _read_dead_letters(client, layout)}
        assert set(letters) == {"21", "22", "5"}
        for key, reason in (("21", "nan cannot be represented"), ("5", "inf cannot be represented")):
            assert letters[key]["table"] == f"{s}.odd" and letters[key]["partition"] == "odd"
            assert "column d" in letters[key]["reason"] and reason in letters[key]["reason"].lower()
        assert "over max_row_bytes=2000" in letters["22"]["reason"]
        # the rest flowed: the later rows are there, the bytea as base64
        manager = DataManager(client, config.redis)

        async def later_rows() -> bool:
            return {str(i) for i in range(23, 31)} <= set(await manager.documents("odd", "odd"))

        await wait_for(later_rows, 30, "the rows written after the bad ones")
        documents = await manager.documents("odd", "odd")
        assert documents["23"]["blob"] == base64.b64encode(bytes.fromhex("fffe00c328")).decode()
        assert "21" not in documents and "22" not in documents
        assert documents["5"]["d"] == 5.0, "the document keeps its last good state"
        assert daemon.healthz()[0] and not task.done()
        # fixed at the source, the rows flow like any other
        await sql(
            postgres_dsn,
            f"update {s}.odd set d = 21.5 where id = 21",
            f"update {s}.odd set note = 'short' where id = 22",
            f"update {s}.odd set d = -5 where id = 5",
        )
        await wait_for(lambda: _mirrored(client, postgres_dsn, config), 30, "the fixed rows to flow")
        assert await client.xlen(layout.deadletter()) == 3
    finally:
        daemon.request_stop()
        await asyncio.wait_for(task, 60)
        await client.aclose()


@pytest.mark.timeout(60)
async def test_a_row_the_snapshot_cannot_encode_goes_to_the_dead_letter(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str
) -> None:
    """The initial snapshot dead-letters a row it cannot encode, with its
    table, key and reason, and loads the others."""
    s = pg_schema
    await sql(
        postgres_dsn,
        ODD_DDL.format(s=s),
        f"insert into {s}.odd (id, d) select i, i from generate_series(1, 600) i",  # several slices
        f"update {s}.odd set d = 'NaN' where id = 300",
    )
    text = config_text(
        postgres_dsn,
        redis_url,
        namespace,
        pg_schema,
        f"  - table: {s}.odd\n    partition: odd\n    section: odd\n",
    )
    config = parse_config(text, "<test>", {})
    daemon = Daemon(config)
    await daemon.source.connect()
    await daemon.source.tracking_enable(config.tables)
    client = aioredis.Redis.from_url(redis_url)
    try:
        await asyncio.wait_for(daemon.run(once=True), 45)
        [letter] = await _read_dead_letters(client, Layout(namespace))
        assert (letter["table"], letter["partition"], letter["key"]) == (f"{s}.odd", "odd", "300")
        assert "column d" in letter["reason"] and "nan cannot be represented" in letter["reason"].lower()
        documents = await DataManager(client, config.redis).documents("odd", "odd")
        assert set(documents) == {str(i) for i in range(1, 601)} - {"300"}
    finally:
        await client.aclose()


async def _mirrored(client: aioredis.Redis, dsn: str, config: Any) -> bool:
    table = config.tables[0]
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(f"select * from {table.table}")  # type: ignore[arg-type]
        names = [d.name for d in cur.description or ()]
        rows = await cur.fetchall()
    expected = {}
    for row in rows:
        try:
            doc = {n: json.loads(encode_value(v, n)) for n, v in zip(names, row, strict=True)}
        except Exception:
            return False
        expected[str(doc["id"])] = doc
    return await DataManager(client, config.redis).documents("odd", "odd") == expected


async def _read_dead_letters(client: aioredis.Redis, layout: Layout) -> list[dict[str, str]]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in await client.xrange(layout.deadletter())
    ]


async def _dead_letters(client: aioredis.Redis, layout: Layout, count: int) -> bool:
    return bool(await client.xlen(layout.deadletter()) >= count)


# -- Redis out of memory ---------------------------------------------------------------------


@pytest.fixture
def small_redis() -> Any:
    server = RedisServer().start()  # noeviction, as REDIS.md requires
    yield server
    server.cleanup()


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_redis_out_of_memory_is_waited_out(
    postgres_dsn: str, pg_schema: str, namespace: str, small_redis: RedisServer
) -> None:
    """maxmemory is reached (noeviction): every write gets OOM. The sidecar
    treats it as Redis being unavailable: it retries, reports degraded on
    /healthz, keeps its leases, loses nothing, and resumes once memory is
    freed (CONFIG SET maxmemory 0)."""
    client = checking_client(small_redis.url)
    port = free_port()
    config = make_config(
        pg_schema, postgres_dsn, small_redis.url, namespace, health=f"127.0.0.1:{port}", lease_ttl="2s"
    )
    await create_tables(postgres_dsn, pg_schema)
    daemon = Daemon(config)
    await daemon.source.connect()
    await daemon.source.tracking_enable(config.tables)
    writers = Writers(postgres_dsn, pg_schema, seed=41)
    write_task = asyncio.create_task(writers.run(writers=2, long_transactions=1))
    task = asyncio.create_task(daemon.run())
    plain = aioredis.Redis.from_url(small_redis.url)  # the subscriber's: no retries of its own
    follower = Follower(plain, namespace)
    sampler = VersionSampler(client, namespace).start()
    try:
        await wait_health(port, 200, 30)
        await wait_published_more(client, namespace, 0, 30)
        used = int((await client.info("memory"))["used_memory"])
        await client.config_set("maxmemory", str(used + 256 * 1024))
        body = await wait_health(port, 503, 60, contains="maxmemory")
        assert "OutOfMemory" in body["redis"], body
        stuck = await published(client, namespace)
        leases = {t.table: await client.get(Layout(namespace).lease(t.table)) for t in config.tables}
        await asyncio.sleep(3)  # out of memory for longer than a lease: the leases are kept
        assert not task.done()
        assert {t.table: await client.get(Layout(namespace).lease(t.table)) for t in config.tables} == leases
        await client.config_set("maxmemory", "0")
        await wait_health(port, 200, 60)
        await wait_published_more(client, namespace, stuck, 30)
        writers.stop.set()
        await write_task
        await assert_nothing_lost(postgres_dsn, pg_schema, client, namespace, follower, sampler)
        assert await client.xlen(Layout(namespace).deadletter()) == 0, "an OOM is not a poison change"
    finally:
        writers.stop.set()
        await asyncio.gather(write_task, return_exceptions=True)
        await follower.close()
        await sampler.stop()
        daemon.request_stop()
        await asyncio.wait_for(task, 60)
        await client.aclose()
        await plain.aclose()


# -- the environment -------------------------------------------------------------------------


async def test_doctor_warns_when_postgres_may_lose_commits_already_mirrored(
    tracked_table: str, postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str, tmp_path: Path
) -> None:
    """The test servers run with synchronous_commit and fsync off (for speed):
    a crash of such a server can lose commits the sidecar already mirrored
    (docs/RELIABILITY.md, limits), which cdc doctor says."""
    path = tmp_path / "t.yaml"
    path.write_text(
        config_text(postgres_dsn, redis_url, namespace, pg_schema, f"  - table: {tracked_table}\n")
    )
    result = cdc("doctor", "-c", str(path), "--json")
    findings = {f["subject"]: f for f in json.loads(result.stdout)}
    durability = findings["source durability"]
    assert durability["level"] == "warning" and "synchronous_commit = off" in durability["message"]
