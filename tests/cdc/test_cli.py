"""The command line as a user runs it: real processes, real servers, exit codes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import psycopg
import pytest
import redis.asyncio as aioredis

from cdc.commands import snapshot
from cdc.config import load_config
from cdc.daemon import Daemon
from cdc.devservers import RedisServer, free_port
from publishers.leases import Leases
from publishers.manager import DataManager
from tests.e2e import assert_mirrored, cdc, create_tables, make_config, wait_for, write_config


@pytest.fixture
async def tracked(postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path) -> Path:
    """A config file for two tracked tables with a few rows."""
    await create_tables(postgres_dsn, pg_schema)
    path = write_config(tmp_path / "tables.yaml", pg_schema, postgres_dsn, redis_url, namespace)
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        await conn.execute(
            f"insert into {pg_schema}.items (id, name, qty) select i, 'n' || i, i from generate_series(1, 30) i"
        )
        await conn.execute(f"insert into {pg_schema}.lines values (1, 1, 'a', 1), (1, 2, 'b', 2)")
    assert cdc("tracking", "enable", "-c", str(path)).returncode == 0
    return path


def test_validate_reports_a_bad_file_with_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("source:\n  kind: postgres\n  dsn: x\ntables:\n  - table: dbo.T\n    max_batch: 3\n")
    result = cdc("validate", "-c", str(path))
    assert result.returncode == 2
    assert f"{path}:6: tables[0].max_batch: unknown key" in result.stderr


def test_validate_exits_3_when_the_source_cannot_be_reached(tmp_path: Path) -> None:
    port = free_port()
    path = tmp_path / "t.yaml"
    path.write_text(
        f"source:\n  kind: postgres\n  dsn: postgresql://u:s3cret@127.0.0.1:{port}/db\n  connect_timeout: 2s\n"
        "tables:\n  - table: public.t\n"
    )
    result = cdc("validate", "-c", str(path))
    assert result.returncode == 3, result.stderr
    assert "s3cret" not in result.stderr + result.stdout
    assert str(port) in result.stderr


async def test_validate_accepts_tracked_tables_and_rejects_a_table_without_a_key(
    tracked: Path, postgres_dsn: str, pg_schema: str
) -> None:
    ok = cdc("validate", "-c", str(tracked))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"{pg_schema}.items: key (id)" in ok.stdout
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        await conn.execute(f"create table {pg_schema}.nokey (a int, b text)")
    text = tracked.read_text() + f"  - table: {pg_schema}.nokey\n"
    tracked.write_text(text)
    bad = cdc("validate", "-c", str(tracked))
    assert bad.returncode == 2
    assert f"{pg_schema}.nokey" in bad.stdout and "primary key" in bad.stdout


async def test_run_once_status_and_snapshot(
    tracked: Path, postgres_dsn: str, pg_schema: str, redis_url: str, namespace: str
) -> None:
    run = cdc("run", "-c", str(tracked), "--once")
    assert run.returncode == 0, run.stderr
    client = aioredis.Redis.from_url(redis_url)
    try:
        await assert_mirrored(postgres_dsn, pg_schema, client, namespace, timeout=5)
        status = cdc("status", "-c", str(tracked), "--json")
        assert status.returncode == 0, status.stderr
        tables = {t["table"]: t for t in json.loads(status.stdout)["tables"]}
        assert tables[f"{pg_schema}.items"]["state"] == "streaming"
        assert tables[f"{pg_schema}.items"]["checkpoint"] <= tables[f"{pg_schema}.items"]["source_version"]
        # A row deleted behind the tracking's back (tracking off for a moment) is
        # removed by an on-demand re-snapshot, through an ordinary delete.
        async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
            await conn.execute(f"alter table {pg_schema}.items disable trigger user")
            await conn.execute(f"delete from {pg_schema}.items where id <= 5")
            await conn.execute(f"alter table {pg_schema}.items enable trigger user")
        snap = cdc("snapshot", "-c", str(tracked), "--table", f"{pg_schema}.items")
        assert snap.returncode == 0, snap.stderr
        await assert_mirrored(postgres_dsn, pg_schema, client, namespace, timeout=5)
    finally:
        await client.aclose()


async def test_subscribe_prints_json_lines_from_the_stream(tracked: Path, namespace: str) -> None:
    assert cdc("run", "-c", str(tracked), "--once").returncode == 0
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cdc.cli",
            "subscribe",
            "-c",
            str(tracked),
            "--partition",
            "orders",
            "--from-seq",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [json.loads(proc.stdout.readline())]
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    # the snapshot wrote the documents in bulk: one R message tells subscribers to reload
    assert [(m["seq"], m["op"], m["section"]) for m in lines] == [(1, "R", "lines")]


async def test_subscribe_says_nothing_is_lost_only_when_something_is(tracked: Path) -> None:
    """A snapshot while ``cdc subscribe`` follows: its ``R`` message makes the
    client load the partition again, but nothing is lost to this reader (the
    ``R`` is printed): no "reloaded" notice on stderr, which once said the
    stream no longer held the missed messages."""
    assert cdc("run", "-c", str(tracked), "--once").returncode == 0
    command = [sys.executable, "-m", "cdc.cli", "subscribe", "-c", str(tracked), "--partition", "orders"]
    proc = subprocess.Popen(
        [*command, "--from-seq", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["seq"] == 1  # following now
        assert cdc("snapshot", "-c", str(tracked)).returncode == 0
        again = json.loads(proc.stdout.readline())
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    assert (again["seq"], again["op"]) == (2, "R")
    assert "reloaded" not in stderr, stderr


async def test_subscribe_into_a_pipe_whose_reader_left_exits_0_without_a_traceback(
    tracked: Path, postgres_dsn: str, pg_schema: str
) -> None:
    """``cdc subscribe ... | head -n 1``: the next message it cannot print ends it quietly."""
    assert cdc("run", "-c", str(tracked), "--once").returncode == 0
    command = [sys.executable, "-m", "cdc.cli", "subscribe", "-c", str(tracked), "--partition", "orders"]
    proc = subprocess.Popen([*command, "--from-seq", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert json.loads(proc.stdout.readline())["seq"] == 1
        proc.stdout.close()  # as head -n 1 exits
        async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
            await conn.execute(
                f"insert into {pg_schema}.lines select 2, i, 'x', i from generate_series(1, 50) i"
            )
        assert cdc("run", "-c", str(tracked), "--once").returncode == 0  # messages it cannot print
        assert proc.wait(timeout=30) == 0
        stderr = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


async def test_subscribe_refuses_what_was_never_written_instead_of_waiting(tracked: Path) -> None:
    """A typo in --partition or --section, or a --from-seq past the next
    message, would print nothing forever: each is a usage error (exit 2)."""
    assert cdc("run", "-c", str(tracked), "--once").returncode == 0
    typo = cdc("subscribe", "-c", str(tracked), "--partition", "order")
    assert typo.returncode == 2 and typo.stdout == ""
    assert "--partition 'order': no section has written this partition in namespace" in typo.stderr
    assert "did you mean 'orders'?" in typo.stderr
    section = cdc("subscribe", "-c", str(tracked), "--partition", "orders", "--section", "line")
    assert section.returncode == 2
    assert "--section 'line': this section has never written partition 'orders'" in section.stderr
    assert "the sections that have: lines" in section.stderr
    ahead = cdc("subscribe", "-c", str(tracked), "--partition", "orders", "--from-seq", "3")
    assert ahead.returncode == 2
    assert "--from-seq 3: partition 'orders' is at seq 1, so its next message is seq 2" in ahead.stderr


async def test_doctor_warns_about_an_eviction_policy(tracked: Path, tmp_path: Path, redis_url: str) -> None:
    lru = RedisServer(extra=("--maxmemory", "100mb")).start()
    try:
        import redis

        redis.Redis(port=lru.port).config_set("maxmemory-policy", "allkeys-lru")
        text = tracked.read_text().replace(redis_url, lru.url)
        path = tmp_path / "lru.yaml"
        path.write_text(text)
        result = cdc("doctor", "-c", str(path))
        assert "allkeys-lru" in result.stdout and "warning" in result.stdout
    finally:
        lru.cleanup()


async def test_health_endpoints(postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str) -> None:
    await create_tables(postgres_dsn, pg_schema)
    port = free_port()
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace, health=f"127.0.0.1:{port}")
    daemon = Daemon(config)
    await daemon.source.connect()
    await daemon.source.tracking_enable(config.tables)
    task = asyncio.create_task(daemon.run())
    try:
        await wait_for(lambda: _status(port, "/readyz", 200), 30, "/readyz to turn 200")
        assert await _status(port, "/healthz", 200)
        metrics = await asyncio.to_thread(_get, port, "/metrics")
        assert b"cdc_changes_read_total" in metrics[1] and b"cdc_queue_depth" in metrics[1]
    finally:
        daemon.request_stop()
        await task


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


async def _status(port: int, path: str, expected: int) -> bool:
    status, _ = await asyncio.to_thread(_get, port, path)
    return status == expected


async def test_snapshot_is_done_by_the_running_sidecar_that_owns_the_table(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path
) -> None:
    await create_tables(postgres_dsn, pg_schema)
    path = write_config(tmp_path / "t.yaml", pg_schema, postgres_dsn, redis_url, namespace, heartbeat="500ms")
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace, heartbeat="500ms")
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        await conn.execute(
            f"insert into {pg_schema}.items (id, name) select i, 'n' || i from generate_series(1, 10) i"
        )
    assert cdc("tracking", "enable", "-c", str(path)).returncode == 0
    daemon = Daemon(config)
    task = asyncio.create_task(daemon.run())
    client = aioredis.Redis.from_url(redis_url)
    try:
        await daemon_ready(daemon)
        async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
            await conn.execute(f"alter table {pg_schema}.items disable trigger user")
            await conn.execute(f"update {pg_schema}.items set name = 'untracked' where id = 3")
            await conn.execute(f"alter table {pg_schema}.items enable trigger user")
        result = await asyncio.to_thread(cdc, "snapshot", "-c", str(path), "--table", f"{pg_schema}.items")
        assert result.returncode == 0, result.stderr
        assert f"asked worker {daemon.worker_id}" in result.stdout  # the owner did it, not the command
        await assert_mirrored(postgres_dsn, pg_schema, client, namespace, timeout=10)
    finally:
        daemon.request_stop()
        await task
        await client.aclose()


async def daemon_ready(daemon: Daemon) -> None:
    async def ready() -> bool:
        return daemon.readyz()[0] and bool(daemon.readyz()[1].get("catching_up") == [])

    await wait_for(ready, 30, "the sidecar to catch up")


async def test_snapshot_takes_over_every_table_whose_owner_died(
    tracked: Path,
    postgres_dsn: str,
    redis_url: str,
    pg_schema: str,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A sidecar owns both tables and dies while ``cdc snapshot`` waits for it:
    its heartbeat and its leases run out together. The command snapshots every
    one of its tables itself, not only the first it finds orphaned."""
    config = load_config(tracked)
    tables = [t.table for t in config.tables]
    client = aioredis.Redis.from_url(redis_url)
    manager = DataManager(client, config.redis)
    try:
        dead = Leases(manager, "dead-sidecar", ttl=1.0)
        for table in tables:
            assert await dead.acquire(table) is not None
        # written after the leases with the same TTL: once it is gone, so are they
        await manager.heartbeat("dead-sidecar", {"tables": ",".join(tables)}, ttl=1.0)
        assert await snapshot(config, None) == 0
        out = capsys.readouterr().out
        for table in tables:
            assert f"worker dead-sidecar is gone; snapshotting {table} here" in out
            assert f"snapshot of {table}: " in out
        await assert_mirrored(postgres_dsn, pg_schema, client, namespace, timeout=10)
    finally:
        await client.aclose()
