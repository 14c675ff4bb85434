"""Logical-decoding capture (``source.capture: logical``) end to end, through
the command line and the sidecar, against real PostgreSQL (wal_level =
logical) and Redis.

What a user checks: ``cdc tracking enable`` makes a slot and a publication per
table and refuses, naming the fix, a server or role that cannot have them;
while writers insert, update, delete and move keys, and after a TRUNCATE, an
ALTER TABLE and a large value left alone by an UPDATE, the documents equal
the rows and every partition's seq is gap-free; a sidecar killed again and
again loses nothing; ``cdc tracking disable`` drops the slots (their WAL).
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis.asyncio as aioredis
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdc.daemon import Daemon
from cdc.devservers import PostgresServer, ServerUnavailable
from publishers.layout import Layout
from tests.e2e import (
    Writers,
    assert_mirrored,
    assert_seq_gap_free,
    cdc,
    create_tables,
    enable_tracking,
    make_config,
    wait_for,
    write_config,
)


def _config_path(
    tmp_path: Path, schema: str, dsn: str, redis_url: str, namespace: str, **worker: str
) -> Path:
    return write_config(
        tmp_path / "tables.yaml", schema, dsn, redis_url, namespace, capture="logical", **worker
    )


async def _slots(dsn: str, schema: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "select slot_name from pg_replication_slots where slot_name like %s order by 1",
            [f"cdc_{schema}%"],
        )
        return [row[0] for row in await cur.fetchall()]


async def _execute(dsn: str, *statements: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            await conn.execute(statement)


async def test_logical_capture_mirrors_writers_truncate_alter_and_toast(
    postgres_dsn: str,
    redis_url: str,
    pg_schema: str,
    namespace: str,
    redis_client: aioredis.Redis,
    tmp_path: Path,
) -> None:
    path = _config_path(tmp_path, pg_schema, postgres_dsn, redis_url, namespace)
    await create_tables(postgres_dsn, pg_schema)
    enabled = cdc("tracking", "enable", "-c", str(path))
    assert enabled.returncode == 0, enabled.stderr
    assert "replication slot" in enabled.stdout and "publication" in enabled.stdout
    assert len(await _slots(postgres_dsn, pg_schema)) == 2
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace, capture="logical", max_batch_size=200)
    writers = Writers(postgres_dsn, pg_schema, seed=5)
    write_task = asyncio.create_task(writers.run(writers=3, long_transactions=1))
    await asyncio.sleep(0.3)  # rows before the first snapshot
    daemon = Daemon(config)
    run_task = asyncio.create_task(daemon.run())
    try:
        await wait_for(lambda: _at_least(writers, 200), 60, "200 writer transactions")
        writers.stop.set()
        await write_task
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace, timeout=30)

        # a value stored out of line (TOAST), then an UPDATE that leaves it alone: pgoutput sends
        # it as "unchanged", and the document must keep it (not null)
        big = "".join(random.Random(1).choices("abcdefghijklmnopqrstuvwxyz0123456789", k=20_000))
        await _execute(
            postgres_dsn,
            f"insert into {pg_schema}.items (id, name, qty) values (9001, '{big}', 1)",
            f"update {pg_schema}.items set qty = 2 where id = 9001",
        )
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace, timeout=30)

        await _execute(postgres_dsn, f"truncate {pg_schema}.lines")  # the table is snapshotted again
        await _execute(postgres_dsn, f"insert into {pg_schema}.lines values (1, 1, 'after truncate', 1)")
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace, timeout=30)

        await _execute(
            postgres_dsn,
            f"alter table {pg_schema}.items add column color text default 'red'",
            f"update {pg_schema}.items set color = 'blue', qty = 3 where id = 9001",
        )
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace, timeout=30)
        await assert_seq_gap_free(redis_client, namespace, ("items", "lines"))
    finally:
        writers.stop.set()
        daemon.request_stop()
        await run_task
    disabled = cdc("tracking", "disable", "-c", str(path))
    assert disabled.returncode == 0, disabled.stderr
    assert await _slots(postgres_dsn, pg_schema) == [], "disable drops the slots: their WAL is freed"


async def _at_least(writers: Writers, n: int) -> bool:
    return writers.transactions >= n


@pytest.mark.slow
async def test_logical_capture_sidecar_killed_again_and_again_loses_nothing(
    postgres_dsn: str,
    redis_url: str,
    pg_schema: str,
    namespace: str,
    redis_client: aioredis.Redis,
    tmp_path: Path,
) -> None:
    path = _config_path(tmp_path, pg_schema, postgres_dsn, redis_url, namespace, lease_ttl="2s")
    await create_tables(postgres_dsn, pg_schema)
    assert cdc("tracking", "enable", "-c", str(path)).returncode == 0
    writers = Writers(postgres_dsn, pg_schema, seed=7)
    write_task = asyncio.create_task(writers.run(writers=3, long_transactions=1))
    rng = random.Random(4)
    try:
        for _ in range(4):
            proc = _start_sidecar(path)
            before = await _published(redis_client, namespace)
            await wait_for(lambda b=before: _published_more(redis_client, namespace, b), 60, "a publish")
            await asyncio.sleep(rng.uniform(0, 0.3))
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
    finally:
        writers.stop.set()
        await write_task
    final = _start_sidecar(path, once=True)
    _, stderr = final.communicate(timeout=120)
    assert final.returncode == 0, stderr.decode()[-2000:]
    await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace, timeout=5)
    await assert_seq_gap_free(redis_client, namespace, ("items", "lines"))
    assert cdc("tracking", "disable", "-c", str(path)).returncode == 0


async def _published(client: aioredis.Redis, namespace: str) -> int:
    layout = Layout(namespace)
    total = 0
    for section in ("items", "lines"):
        for partition in await client.smembers(layout.partitions(section)):
            total += int(await client.get(layout.seq(partition.decode())) or 0)
    return total


async def _published_more(client: aioredis.Redis, namespace: str, before: int) -> bool:
    return await _published(client, namespace) > before


def _start_sidecar(config_path: Path, once: bool = False) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "cdc.cli", "--json-logs", "run", "-c", str(config_path)]
    return subprocess.Popen(
        [*args, "--once"] if once else args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE if once else subprocess.DEVNULL,
    )


# -- what the server or the role must allow ----------------------------------------------


async def test_enable_refuses_a_role_without_replication(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path
) -> None:
    role = "r" + uuid.uuid4().hex[:10]
    await _execute(postgres_dsn, f"create role {role} login", f"grant all on schema {pg_schema} to {role}")
    try:
        dsn = make_conninfo(postgres_dsn, user=role)
        await create_tables(dsn, pg_schema)  # owned by the role
        path = _config_path(tmp_path, pg_schema, dsn, redis_url, namespace)

        refused = cdc("tracking", "enable", "-c", str(path))

        assert refused.returncode == 1, refused.stderr
        assert f"ALTER ROLE {role} REPLICATION" in refused.stderr
        assert "GRANT CREATE ON DATABASE" in refused.stderr
        assert await _slots(postgres_dsn, pg_schema) == []
    finally:
        await _execute(postgres_dsn, f"drop schema {pg_schema} cascade", f"create schema {pg_schema}")
        await _execute(postgres_dsn, f"revoke all on schema {pg_schema} from {role}", f"drop role {role}")


@pytest.fixture(scope="module")
def replica_wal_server() -> Iterator[PostgresServer]:
    """A server as PostgreSQL ships: wal_level = replica."""
    try:
        server = PostgresServer().start()
    except ServerUnavailable as exc:
        pytest.skip(str(exc))
    yield server
    server.cleanup()


async def test_enable_refuses_wal_level_replica(
    replica_wal_server: PostgresServer, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    dsn = replica_wal_server.dsn
    await _execute(dsn, "create schema if not exists walrep")
    await create_tables(dsn, "walrep")
    path = _config_path(tmp_path, "walrep", dsn, redis_url, namespace)

    refused = cdc("tracking", "enable", "-c", str(path))

    assert refused.returncode == 1, refused.stderr
    assert "wal_level is 'replica'" in refused.stderr and "wal_level = logical" in refused.stderr
    assert conninfo_to_dict(dsn)["dbname"] == "cdc"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        publications = await (await conn.execute("select count(*) from pg_publication")).fetchone()
    assert publications == (0,), "nothing is made when the server cannot decode"


async def test_column_changes_within_one_read_are_mirrored_with_the_sidecar_running(
    postgres_dsn: str,
    redis_url: str,
    pg_schema: str,
    namespace: str,
    redis_client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """ADD and DROP COLUMN between the writes of one transaction (so of one
    read): every change is decoded with its own shape, and the table is
    described again for the new one; never a read that fails on every retry."""
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace, capture="logical")
    await create_tables(postgres_dsn, pg_schema)
    await enable_tracking(config)
    items = f"{pg_schema}.items"
    await _execute(postgres_dsn, f"insert into {items} (id, name, qty) values (1, 'one', 1)")
    daemon = Daemon(config)
    run = asyncio.create_task(daemon.run())
    try:
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace)
        async with await psycopg.AsyncConnection.connect(postgres_dsn) as conn:
            await conn.execute(f"insert into {items} (id, name, qty) values (10, 'ten', 10)")
            await conn.execute(f"alter table {items} add column extra int")
            await conn.execute(f"insert into {items} (id, name, qty, extra) values (11, 'eleven', 11, 5)")
            await conn.execute(f"alter table {items} drop column extra")
            await conn.execute(f"update {items} set qty = 2 where id = 1")
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace, timeout=15)
        degraded = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert degraded == [], "a read of the transaction failed"
        await _execute(
            postgres_dsn,
            f"alter table {items} add column kept int default 7",
            f"insert into {items} (id, name, qty, kept) values (12, 'twelve', 12, 8)",
        )
        await assert_mirrored(postgres_dsn, pg_schema, redis_client, namespace)
    finally:
        daemon.request_stop()
        await asyncio.wait_for(run, 30)


async def test_slots_left_by_a_changed_namespace_are_listed_never_dropped(
    postgres_dsn: str, redis_url: str, pg_schema: str, tmp_path: Path
) -> None:
    """A slot's name hashes the deployment: after a change of redis.namespace,
    ``cdc tracking status`` and ``cdc doctor`` name the old slots, the WAL they
    hold and how to drop them; neither drops them."""
    await create_tables(postgres_dsn, pg_schema)
    (tmp_path / "old").mkdir()
    old = _config_path(tmp_path / "old", pg_schema, postgres_dsn, redis_url, "t" + uuid.uuid4().hex[:10])
    assert cdc("tracking", "enable", "-c", str(old)).returncode == 0
    left = await _slots(postgres_dsn, pg_schema)
    assert len(left) == 2
    new = _config_path(tmp_path, pg_schema, postgres_dsn, redis_url, "t" + uuid.uuid4().hex[:10])
    try:
        status = cdc("tracking", "status", "-c", str(new))
        doctor = cdc("doctor", "-c", str(new))

        assert status.returncode == 1, "the new deployment's tables are not tracked yet"
        for slot in left:
            [line] = [x for x in status.stdout.splitlines() if f"slot {slot} " in x]
            assert "MiB of WAL" in line and f"pg_drop_replication_slot('{slot}')" in line
            assert f"slot {slot}" in doctor.stdout
        assert await _slots(postgres_dsn, pg_schema) == left, "listed, never dropped"
        mine = cdc("tracking", "status", "-c", str(old))
        assert not any(f"slot {slot} " in mine.stdout for slot in left), (
            "a deployment's own slots are not listed"
        )
    finally:
        assert cdc("tracking", "disable", "-c", str(old)).returncode == 0


async def test_disable_drops_the_slot_of_a_table_dropped_and_taken_out_of_the_config(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path
) -> None:
    """DROP TABLE takes the table out of its publication, not its slot, which
    then holds WAL for good: ``tracking disable --table`` must still take it
    once the config no longer registers the table (docs/TABLES.md)."""
    await create_tables(postgres_dsn, pg_schema)
    path = _config_path(tmp_path, pg_schema, postgres_dsn, redis_url, namespace)
    assert cdc("tracking", "enable", "-c", str(path)).returncode == 0
    both = await _slots(postgres_dsn, pg_schema)
    try:
        await _execute(postgres_dsn, f"drop table {pg_schema}.lines")
        status = cdc("tracking", "status", "-c", str(path), "--table", f"{pg_schema}.lines")
        doctor = cdc("doctor", "-c", str(path))
        text = path.read_text(encoding="utf-8")
        path.write_text(text[: text.index(f"  - table: {pg_schema}.lines")], encoding="utf-8")

        done = cdc("tracking", "disable", "-c", str(path), "--table", f"{pg_schema}.lines")

        for said in (status.stdout, doctor.stdout):
            assert "the table is gone" in said and "tracking disable --table" in said, said
        assert done.returncode == 0, done.stderr
        assert len(both) == 2 and len(await _slots(postgres_dsn, pg_schema)) == 1
    finally:
        assert cdc("tracking", "disable", "-c", str(path)).returncode == 0


async def test_doctor_names_a_missing_select_and_grant_to_gives_it(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path
) -> None:
    """A runtime role with REPLICATION but no privilege on the schema or its
    tables: doctor names each with its GRANT (the sidecar would degrade the
    tables); ``--grant-to`` grants them and says nothing of REPLICATION,
    which the role has."""
    role = "r" + uuid.uuid4().hex[:10]
    await _execute(postgres_dsn, f"create role {role} login replication")
    await create_tables(postgres_dsn, pg_schema)
    admin = _config_path(tmp_path, pg_schema, postgres_dsn, redis_url, namespace)
    (tmp_path / "runtime").mkdir()
    runtime = _config_path(
        tmp_path / "runtime", pg_schema, make_conninfo(postgres_dsn, user=role), redis_url, namespace
    )
    try:
        assert cdc("tracking", "enable", "-c", str(admin)).returncode == 0

        before = cdc("doctor", "-c", str(runtime))
        granted = cdc("tracking", "enable", "-c", str(admin), "--grant-to", role)
        after = cdc("doctor", "-c", str(runtime))

        assert before.returncode == 1, before.stdout
        assert f"role {role} lacks SELECT on table {pg_schema}.items" in before.stdout
        assert f'GRANT SELECT ON TABLE "{pg_schema}"."items" TO "{role}"' in before.stdout
        assert granted.returncode == 0, granted.stderr
        assert "REPLICATION" not in granted.stdout + granted.stderr
        assert f"role {role} lacks USAGE on schema {pg_schema}" in before.stdout
        assert "lacks" not in after.stdout, after.stdout
    finally:
        assert cdc("tracking", "disable", "-c", str(admin)).returncode == 0
        await _execute(
            postgres_dsn,
            f"alter default privileges in schema {pg_schema} revoke select on tables from {role}",
            f"revoke usage on schema {pg_schema} from {role}",
            f"drop owned by {role}",
            f"drop role {role}",
        )


async def test_enable_lists_every_problem_at_once(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path
) -> None:
    """Tables the role does not own, its missing REPLICATION and CREATE, and a
    table's replica identity: one refusal names them all, nothing is made."""
    role = "r" + uuid.uuid4().hex[:10]
    await _execute(postgres_dsn, f"create role {role} login", f"grant usage on schema {pg_schema} to {role}")
    await create_tables(postgres_dsn, pg_schema)  # owned by the admin, not the role
    await _execute(postgres_dsn, f"alter table {pg_schema}.lines replica identity nothing")
    path = _config_path(tmp_path, pg_schema, make_conninfo(postgres_dsn, user=role), redis_url, namespace)
    try:
        refused = cdc("tracking", "enable", "-c", str(path))

        assert refused.returncode == 1, refused.stderr
        for problem in (
            "does not own 2 table(s)",
            "Adding a table to its publication",
            f"ALTER ROLE {role} REPLICATION",
            "GRANT CREATE ON DATABASE",
            f"{pg_schema}.lines: its REPLICA IDENTITY is NOTHING",
        ):
            assert problem in refused.stderr, (problem, refused.stderr)
        assert await _slots(postgres_dsn, pg_schema) == []
    finally:
        await _execute(postgres_dsn, f"drop owned by {role}", f"drop role {role}")


async def test_grant_to_an_unknown_role_is_refused_before_anything_is_made(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path
) -> None:
    await create_tables(postgres_dsn, pg_schema)
    path = _config_path(tmp_path, pg_schema, postgres_dsn, redis_url, namespace)

    refused = cdc("tracking", "enable", "-c", str(path), "--grant-to", "nosuchrole")

    assert refused.returncode == 2, refused.stderr
    assert "there is no role 'nosuchrole'" in refused.stderr
    assert await _slots(postgres_dsn, pg_schema) == [], "a slot made before the refusal would keep WAL"
