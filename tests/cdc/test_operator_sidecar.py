"""What an operator does to running sidecars: a second one on the same health
port, an IPv6 health address, SIGHUP, a role that may not delete the tracking
entries. Real sidecar processes (tests.chaos.Sidecar) against real servers."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
import redis.asyncio as aioredis
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdc.cleanup_job import RETRY_JOB
from cdc.config import load_config
from cdc.daemon import Daemon
from cdc.devservers import free_port
from publishers.layout import Layout
from tests.chaos import Sidecar, lease_holders
from tests.e2e import create_tables, enable_tracking, make_config, wait_for, write_config


@pytest.fixture
async def tracked(postgres_dsn: str, pg_schema: str) -> list[str]:
    """Two tracked tables (their names)."""
    await create_tables(postgres_dsn, pg_schema)
    return [f"{pg_schema}.items", f"{pg_schema}.lines"]


async def holds_every_lease(
    client: aioredis.Redis, namespace: str, sidecar: Sidecar, tables: list[str]
) -> bool:
    holders = await lease_holders(client, namespace, tables)
    return len(holders) == len(tables) and all(sidecar.is_worker(h) for h in holders.values())


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


async def answers(url: str) -> bool:
    return await asyncio.to_thread(http_status, url) in (200, 503)


async def test_a_second_sidecar_on_the_same_health_port_exits_2_and_takes_nothing(
    tracked: list[str], postgres_dsn: str, pg_schema: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    port = free_port()
    path = write_config(
        tmp_path / "t.yaml", pg_schema, postgres_dsn, redis_url, namespace, health=f"127.0.0.1:{port}"
    )
    await enable_tracking(load_config(path))
    first = Sidecar(path, tmp_path / "first.log")
    client = aioredis.Redis.from_url(redis_url)
    try:
        await wait_for(
            lambda: holds_every_lease(client, namespace, first, tracked), 30, "the first sidecar's leases"
        )
        await wait_for(
            lambda: answers(f"http://127.0.0.1:{port}/healthz"), 10, "the first sidecar's /healthz"
        )
        second = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "cdc.cli", "--text-logs", "run", "-c", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2, second.stderr
        assert "Traceback" not in second.stdout + second.stderr
        assert (
            f"error: {path}: worker.health: 127.0.0.1:{port} is already in use, by another sidecar on this host "
            "or another program: give each sidecar its own port" in second.stderr
        )
        # it stopped before taking anything: the first still holds every table and answers
        assert await holds_every_lease(client, namespace, first, tracked)
        assert await answers(f"http://127.0.0.1:{port}/healthz")
        assert len(await client.zrange(Layout(namespace).workers(), 0, -1)) == 1
    finally:
        assert await first.stop() == 0
        await client.aclose()
    assert "Traceback" not in first.log_text()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this host")
async def test_the_health_server_listens_on_an_ipv6_address(
    tracked: list[str], postgres_dsn: str, pg_schema: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    port = free_port()
    path = write_config(
        tmp_path / "t.yaml", pg_schema, postgres_dsn, redis_url, namespace, health=f"'[::1]:{port}'"
    )
    await enable_tracking(load_config(path))
    sidecar = Sidecar(path, tmp_path / "sidecar.log")
    try:
        await wait_for(lambda: answers(f"http://[::1]:{port}/healthz"), 30, "/healthz on [::1]")
        assert any(entry.get("address") == f"[::1]:{port}" for entry in sidecar.logs())
    finally:
        assert await sidecar.stop() == 0
    assert "Traceback" not in sidecar.log_text()


async def test_sighup_stops_gracefully_releasing_leases_and_registration(
    tracked: list[str], postgres_dsn: str, pg_schema: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """SIGHUP killed the sidecar at once, leaving its leases and its
    registration to expire. Now: a log line saying so, then what SIGTERM does."""
    path = write_config(tmp_path / "t.yaml", pg_schema, postgres_dsn, redis_url, namespace)
    await enable_tracking(load_config(path))
    sidecar = Sidecar(path, tmp_path / "sidecar.log")
    client = aioredis.Redis.from_url(redis_url)
    layout = Layout(namespace)
    try:
        await wait_for(
            lambda: holds_every_lease(client, namespace, sidecar, tracked), 30, "the sidecar's leases"
        )
        (worker,) = [w.decode() for w in await client.zrange(layout.workers(), 0, -1)]
        assert sidecar.is_worker(worker) and await client.exists(layout.worker(worker))
        sidecar.proc.send_signal(signal.SIGHUP)
        assert await asyncio.to_thread(sidecar.proc.wait, 40) == 0
        # released at once, not after lease_ttl
        assert await lease_holders(client, namespace, tracked) == {}
        assert await client.zrange(layout.workers(), 0, -1) == []
        assert not await client.exists(layout.worker(worker))
    finally:
        sidecar.kill()
        await client.aclose()
    messages = [entry.get("msg", "") for entry in sidecar.logs()]
    assert any(m.startswith("SIGHUP: stopping gracefully; the config is not reloaded") for m in messages)
    assert "Traceback" not in sidecar.log_text()


def reader_role(postgres_dsn: str, pg_schema: str) -> str:
    """A DSN of a new role that may read the tables and their tracking
    (a sidecar streams with it) but delete nothing."""
    role = "r" + uuid.uuid4().hex[:10]
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"create role {role} login")
        for schema in (pg_schema, f"{pg_schema}_trk"):
            conn.execute(f"grant usage on schema {schema} to {role}")
            conn.execute(f"grant select on all tables in schema {schema} to {role}")
    return make_conninfo(postgres_dsn, user=role)


async def test_a_cleanup_the_role_may_not_do_is_a_state_until_granted_never_a_traceback(
    tracked: list[str],
    postgres_dsn: str,
    pg_schema: str,
    redis_url: str,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sidecar streams with a role that may not delete the tracking
    entries. Its scheduler runs the cleanup job at start, then (now rather than
    after cleanup_interval) twice more: the pipeline's cleanup_error says why
    and how to grant it, cdc_cleanup_failing is 1, and the log has one line,
    not one per run; the scheduler logs nothing. Granted what the message
    says, the next run works: the state clears, the metric is 0, the last
    success is set, and the log says so once."""
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace)
    await enable_tracking(config)
    reader_dsn = reader_role(postgres_dsn, pg_schema)
    reader = replace(config, source=replace(config.source, dsn=reader_dsn))
    caplog.set_level(logging.INFO, logger="cdc")
    daemon = Daemon(reader)
    metrics = daemon.pipeline.metrics
    task = asyncio.create_task(daemon.run())
    try:
        await wait_for(_scheduler_running(daemon), 30, "the sidecar's scheduler")
        await wait_for(_cleanup_failed(daemon, 1), 30, "the first cleanup to fail")
        assert daemon.scheduler is not None
        (job,) = [
            job for job in daemon.scheduler.get_jobs() if job.id != RETRY_JOB and job.func == daemon._cleanup
        ]
        for run in range(2, 4):
            job.modify(next_run_time=datetime.now(UTC))
            await wait_for(_cleanup_failed(daemon, run), 30, f"cleanup run {run} to fail")
        error = daemon.pipeline.cleanup_error
        assert (
            error is not None
            and "permission denied" in error
            and "may not run the retention cleanup" in error
        )
        assert metrics.cleanup_failing._value.get() == 1
        assert metrics.cleanup_last_success._value.get() == 0
        role = conninfo_to_dict(reader_dsn)["user"]
        grants = error.split("As the tables' owner: ")[1].split("; or set")[0]
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            for statement in grants.split("; "):
                assert f'to "{role}"' in statement, statement
                conn.execute(statement.encode())
        job.modify(next_run_time=datetime.now(UTC))
        await wait_for(_cleanup_works(daemon), 30, "the cleanup to work once granted")
    finally:
        daemon.request_stop()
        await task
    assert metrics.cleanup_failing._value.get() == 0
    assert metrics.cleanup_last_success._value.get() > 0
    messages = [r.getMessage() for r in caplog.records if r.name == "cdc.cleanup"]
    assert messages.count("tracking cleanup fails: nothing is removed until it runs") == 1, messages
    assert messages.count("tracking cleanup works again") == 1, messages
    assert not [r for r in caplog.records if r.exc_info or r.name.startswith("apscheduler")]


async def test_a_failed_cleanup_is_tried_again_soon_not_a_cleanup_interval_later(
    tracked: list[str],
    postgres_dsn: str,
    pg_schema: str,
    redis_url: str,
    namespace: str,
) -> None:
    """The start-up cleanup fails (here: a missing grant; in CI: the database
    restarting under it), and the cleanup interval is an hour: once the
    cause is gone, the retry (5 s after the first failure) clears /readyz's
    cleanup state well within the hour."""
    config = make_config(pg_schema, postgres_dsn, redis_url, namespace)
    await enable_tracking(config)
    reader_dsn = reader_role(postgres_dsn, pg_schema)
    reader = replace(config, source=replace(config.source, dsn=reader_dsn, cleanup_interval=3600.0))
    daemon = Daemon(reader)
    task = asyncio.create_task(daemon.run())
    try:
        await wait_for(_cleanup_failed(daemon, 1), 30, "the start-up cleanup to fail")
        error = daemon.pipeline.cleanup_error
        assert error is not None and "As the tables' owner: " in error
        grants = error.split("As the tables' owner: ")[1].split("; or set")[0]
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            for statement in grants.split("; "):
                conn.execute(statement.encode())
        await wait_for(_cleanup_works(daemon), 30, "the retried cleanup to work, without its hourly run")
    finally:
        daemon.request_stop()
        await task


def _scheduler_running(daemon: Daemon) -> Callable[[], Awaitable[bool]]:
    async def running() -> bool:
        return daemon.scheduler is not None and daemon.scheduler.running

    return running


def _cleanup_failed(daemon: Daemon, times: int) -> Callable[[], Awaitable[bool]]:
    async def failed() -> bool:
        return daemon.cleanup_job.failures >= times

    return failed


def _cleanup_works(daemon: Daemon) -> Callable[[], Awaitable[bool]]:
    async def works() -> bool:
        return daemon.cleanup_job.failures == 0 and daemon.pipeline.cleanup_error is None

    return works
