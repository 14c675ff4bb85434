"""``cdc tracking enable|disable|status --table`` and ``--force``, and what
``cdc status`` says of each table's owner: the commands as a user runs them
(subprocesses), against real PostgreSQL and Redis, with a real sidecar."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from cdc.devservers import free_port
from cdc.status_cmd import short_error
from publishers import control
from publishers.layout import Layout
from publishers.leases import Leases
from publishers.manager import DataManager
from publishers.settings import RedisConfig
from tests.chaos import Sidecar, lease_holders
from tests.e2e import create_tables, wait_for, write_config


def cdc(*args: str) -> subprocess.CompletedProcess[str]:
    """The command line, wide enough that rich does not wrap the tables."""
    return subprocess.run(
        [sys.executable, "-m", "cdc.cli", "--text-logs", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "250"},
    )


def tracking_enabled(config: Path) -> dict[str, bool]:
    """table -> whether its change tracking is enabled, as ``cdc tracking status --json`` says."""
    result = cdc("tracking", "status", "-c", str(config), "--json")
    assert result.returncode in (0, 1), result.stderr
    return {s["table"]: s["enabled"] for s in json.loads(result.stdout)}


def status_tables(config: Path) -> dict[str, dict[str, Any]]:
    result = cdc("status", "-c", str(config), "--json")
    assert result.returncode == 0, result.stderr
    return {t["table"]: t for t in json.loads(result.stdout)["tables"]}


@pytest.fixture
async def config(postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path) -> Path:
    """A config file for the two e2e tables, both created, neither tracked yet."""
    await create_tables(postgres_dsn, pg_schema)
    return write_config(
        tmp_path / "tables.yaml", pg_schema, postgres_dsn, redis_url, namespace, heartbeat="500ms"
    )


async def test_table_option_enables_and_disables_only_that_table(config: Path, pg_schema: str) -> None:
    items, lines = f"{pg_schema}.items", f"{pg_schema}.lines"
    enabled = cdc("tracking", "enable", "-c", str(config), "--table", items)
    assert enabled.returncode == 0, enabled.stderr
    assert items in enabled.stdout and lines not in enabled.stdout
    assert tracking_enabled(config) == {items: True, lines: False}
    # status of one table answers for that table alone (exit 0: it is enabled)
    one = cdc("tracking", "status", "-c", str(config), "--table", items)
    assert one.returncode == 0 and items in one.stdout and lines not in one.stdout

    assert cdc("tracking", "enable", "-c", str(config)).returncode == 0
    disabled = cdc("tracking", "disable", "-c", str(config), "--table", lines)
    assert disabled.returncode == 0, disabled.stderr
    assert tracking_enabled(config) == {items: True, lines: False}


def test_an_unknown_table_is_a_usage_error_naming_the_registered_ones(config: Path, pg_schema: str) -> None:
    for action in ("enable", "disable", "status"):
        result = cdc("tracking", action, "-c", str(config), "--table", f"{pg_schema}.nope")
        assert result.returncode == 2, (action, result.stderr)
        assert f"'{pg_schema}.nope'" in result.stderr and str(config) in result.stderr
        assert f"{pg_schema}.items, {pg_schema}.lines" in result.stderr


def test_force_is_for_disable_only(config: Path) -> None:
    result = cdc("tracking", "enable", "-c", str(config), "--force")
    assert result.returncode == 2 and "--force is for disable only" in result.stderr


async def test_disable_is_refused_while_a_live_sidecar_streams_the_table(
    config: Path, pg_schema: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """Refused naming the table and the sidecar; --force disables it; once the
    sidecar has stopped, disable needs no --force."""
    items, lines = f"{pg_schema}.items", f"{pg_schema}.lines"
    assert cdc("tracking", "enable", "-c", str(config)).returncode == 0
    sidecar = Sidecar(config, tmp_path / "sidecar.log")
    client = aioredis.Redis.from_url(redis_url)
    try:
        await wait_for(
            lambda: _streams(client, namespace, sidecar, [items, lines]), 30, "the sidecar to stream"
        )
        worker = (await lease_holders(client, namespace, [items]))[items]

        shown = status_tables(config)
        assert (shown[items]["owner"], shown[items]["worker_state"], shown[items]["error"]) == (
            worker,
            "streaming",
            None,
        )

        refused = cdc("tracking", "disable", "-c", str(config), "--table", items)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"{items} is streamed by sidecar {worker}" in refused.stderr
        assert "heartbeat" in refused.stderr and "s ago" in refused.stderr and "--force" in refused.stderr
        every = cdc("tracking", "disable", "-c", str(config))  # every table: both named, none disabled
        assert every.returncode == 1
        assert f"{items} is streamed by sidecar {worker}" in every.stderr
        assert f"{lines} is streamed by sidecar {worker}" in every.stderr
        assert tracking_enabled(config) == {items: True, lines: True}

        forced = cdc("tracking", "disable", "-c", str(config), "--table", items, "--force")
        assert forced.returncode == 0, forced.stderr
        assert f"warning: {items} is streamed by sidecar {worker}" in forced.stderr
        assert tracking_enabled(config) == {items: False, lines: True}

        async def degraded() -> bool:  # the sidecar notices (its shape check), and says so
            shown = status_tables(config)
            return shown[items]["worker_state"] == "degraded" and "not enabled" in (
                shown[items]["error"] or ""
            )

        await wait_for(degraded, 30, f"cdc status to show {items} degraded")
        assert status_tables(config)[lines]["worker_state"] == "streaming" and sidecar.proc.poll() is None
    finally:
        await sidecar.stop()
        await client.aclose()

    after = cdc("tracking", "disable", "-c", str(config), "--table", lines)
    assert after.returncode == 0, after.stderr
    assert "warning" not in after.stderr
    assert tracking_enabled(config) == {items: False, lines: False}


async def _streams(client: aioredis.Redis, namespace: str, sidecar: Sidecar, tables: list[str]) -> bool:
    """Whether ``sidecar`` holds every table's lease and its heartbeat says it streams them."""
    holders = await lease_holders(client, namespace, tables)
    if len(holders) < len(tables) or not all(sidecar.is_worker(h) for h in holders.values()):
        return False
    worker = Layout(namespace).worker(holders[tables[0]])
    states = await client.hmget(worker, [f"state:{t}" for t in tables])
    return all(state == b"streaming" for state in states)


async def test_a_lease_whose_holder_has_no_heartbeat_does_not_block_disable(
    config: Path, pg_schema: str, redis_url: str, namespace: str
) -> None:
    """A sidecar that died leaves its lease until the TTL runs out; its
    heartbeat is what says whether it lives. A live heartbeat refuses."""
    items = f"{pg_schema}.items"
    assert cdc("tracking", "enable", "-c", str(config)).returncode == 0
    client = aioredis.Redis.from_url(redis_url)
    manager = DataManager(client, RedisConfig(url=redis_url, namespace=namespace))
    try:
        assert await Leases(manager, "alive-sidecar", ttl=60).acquire(items) is not None
        await client.hset(
            Layout(namespace).worker("alive-sidecar"),
            mapping={"heartbeat_at": f"{time.time() - 3:.3f}", f"state:{items}": "streaming"},
        )
        await client.pexpire(Layout(namespace).worker("alive-sidecar"), 60_000)
        refused = cdc("tracking", "disable", "-c", str(config), "--table", items)
        assert refused.returncode == 1
        said = re.search(
            rf"{re.escape(items)} is streamed by sidecar alive-sidecar \(state streaming, heartbeat ([0-9.]+)s ago\)",
            refused.stderr,
        )
        assert said is not None, refused.stderr
        assert 3 <= float(said[1]) < 60  # written 3 s before the command started

        await client.delete(Layout(namespace).worker("alive-sidecar"))  # it died; its lease lingers
        assert await client.get(Layout(namespace).lease(items)) == b"alive-sidecar"
        done = cdc("tracking", "disable", "-c", str(config), "--table", items)
        assert done.returncode == 0, done.stderr
        assert tracking_enabled(config)[items] is False
    finally:
        await client.aclose()


async def test_disable_without_redis_is_refused_unless_forced(
    postgres_dsn: str, redis_url: str, pg_schema: str, namespace: str, tmp_path: Path
) -> None:
    """Without Redis nobody can tell whether a sidecar streams the table."""
    await create_tables(postgres_dsn, pg_schema)
    port = free_port()
    path = write_config(
        tmp_path / "t.yaml", pg_schema, postgres_dsn, f"redis://127.0.0.1:{port}/0", namespace
    )
    items = f"{pg_schema}.items"
    enabled = cdc("tracking", "enable", "-c", str(path))  # needs no Redis
    assert enabled.returncode == 0, enabled.stderr

    refused = cdc("tracking", "disable", "-c", str(path), "--table", items)
    assert refused.returncode == 3, refused.stderr
    assert f"cannot tell whether a sidecar streams {items}" in refused.stderr and str(port) in refused.stderr
    assert "--force" in refused.stderr
    assert tracking_enabled(path)[items] is True

    forced = cdc("tracking", "disable", "-c", str(path), "--table", items, "--force")
    assert forced.returncode == 0, forced.stderr
    assert "warning: cannot tell whether a sidecar streams" in forced.stderr
    assert tracking_enabled(path)[items] is False


async def test_status_shows_the_error_of_a_degraded_table_from_its_owners_heartbeat(
    config: Path, pg_schema: str, redis_url: str, namespace: str
) -> None:
    """A heartbeat written by hand, as a sidecar whose table is degraded writes it."""
    items, lines = f"{pg_schema}.items", f"{pg_schema}.lines"
    assert cdc("tracking", "enable", "-c", str(config)).returncode == 0
    words = " ".join(f"w{i}" for i in range(100))  # 389 characters
    error = (
        f"{items}: column [b] named by columns: no longer exists (postgresql://app:s3cret@db/x); {words}"
        "\nLINE 1: select a, b from items"
    )
    client = aioredis.Redis.from_url(redis_url)
    manager = DataManager(client, RedisConfig(url=redis_url, namespace=namespace))
    heartbeat = Layout(namespace).worker("sick-sidecar")
    try:
        assert await Leases(manager, "sick-sidecar", ttl=60).acquire(items) is not None
        fields = {"heartbeat_at": f"{time.time():.3f}", f"state:{items}": "degraded", f"error:{items}": error}
        await client.hset(heartbeat, mapping=fields)
        await client.pexpire(heartbeat, 60_000)

        shown = status_tables(config)
        assert shown[items]["owner"] == "sick-sidecar"
        assert shown[items]["worker_state"] == "degraded"
        assert shown[items]["error"] == error.replace("app:s3cret@", "app:***@")  # whole, but no password
        assert (shown[lines]["owner"], shown[lines]["worker_state"], shown[lines]["error"]) == (
            None,
            None,
            None,
        )
        assert shown[items]["state"] == "no checkpoint"  # the existing fields keep their meaning

        view = cdc("status", "-c", str(config))
        assert view.returncode == 0, view.stderr
        assert "degraded tables" in view.stdout
        assert f"{items}: column [b] named by columns: no longer exists" in view.stdout  # not eaten as markup
        assert "w10 w11 w12" in view.stdout and "…" in view.stdout  # shortened...
        assert "w99" not in view.stdout and "LINE 1" not in view.stdout  # ...to its first line's start
        assert "s3cret" not in view.stdout

        # a heartbeat whose table is not degraded has no error field: nothing shown
        await client.hdel(heartbeat, f"error:{items}")
        await client.hset(heartbeat, f"state:{items}", "streaming")
        assert status_tables(config)[items]["error"] is None
        assert "degraded tables" not in cdc("status", "-c", str(config)).stdout
    finally:
        await client.aclose()


def test_short_error_keeps_the_first_line_within_the_limit() -> None:
    assert short_error("\n  relation t does not exist  \nLINE 1: select") == "relation t does not exist"
    shortened = short_error("y" * 500, limit=40)
    assert len(shortened) == 40 and shortened.endswith("…")
    assert short_error("z" * 40, limit=40) == "z" * 40


@pytest.mark.cluster
async def test_ownership_reads_span_a_clusters_slots(redis_cluster_url: str, namespace: str) -> None:
    """``cdc status`` and ``cdc tracking disable`` read every table's lease and
    its holders' heartbeats in pipelines whose keys live on several masters."""
    manager = await DataManager.connect(RedisConfig(url=redis_cluster_url, cluster=True, namespace=namespace))
    try:
        tables = [f"s.t{i}" for i in range(12)]
        for i, table in enumerate(tables[:8]):
            assert await Leases(manager, f"w{i % 2}", ttl=30).acquire(table) is not None
        await manager.heartbeat(
            "w0",
            {"heartbeat_at": f"{time.time():.3f}", "state:s.t0": "degraded", "error:s.t0": "gone"},
            ttl=30,
        )
        owned = await control.ownership(manager, tables)
        assert sorted(owned) == tables[:8]
        t0 = owned["s.t0"]
        assert (t0.owner, t0.alive, t0.state, t0.error) == ("w0", True, "degraded", "gone")
        assert t0.seen_ago is not None and 0 <= t0.seen_ago < 10
        assert owned["s.t1"] == control.Ownership("w1", alive=False)
        assert await control.table_owners(manager, tables) == {t: o.owner for t, o in owned.items()}
    finally:
        await manager.close()
