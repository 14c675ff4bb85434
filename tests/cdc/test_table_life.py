"""A table's life in a running deployment (docs/TABLES.md), as a user lives it:
added (only it is snapshotted), its key template or section changed, removed
(tracking disabled for a table the config no longer registers, then purged),
and sidecars of 0.2.0 and of this version sharing one config and Redis.

Real PostgreSQL and Redis; the command line as a user runs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis

from cdc.config import load_config
from cdc.daemon import Daemon
from publishers.layout import Layout
from publishers.subscriber import Subscriber
from tests.e2e import ITEMS_DDL, LINES_DDL, Writers, assert_mirrored, assert_seq_gap_free, cdc, wait_for

ROOT = Path(__file__).resolve().parents[2]
ITEMS = '  - table: {s}.items\n    partition: "r{{id}}"\n    section: items\n    backoff: [[3, 10ms], [null, 50ms]]\n'
LINES = (
    '  - table: {s}.lines\n    partition: orders\n    section: {section}\n    key: "{key}"\n'
    "    backoff: [[3, 10ms], [null, 50ms]]\n"
)


def write_config(
    path: Path,
    schema: str,
    dsn: str,
    redis_url: str,
    namespace: str,
    *,
    items: bool = True,
    lines: bool = True,
    section: str = "lines",
    key: str = "{{order_id}}-{{line}}",
    cleanup_interval: str | None = None,
    **worker: str,
) -> Path:
    worker_lines = "".join(f"  {k}: {v}\n" for k, v in {"health": "null", **worker}.items())
    tables = (ITEMS.format(s=schema) if items else "") + (
        LINES.format(s=schema, section=section, key=key.replace("{{", "{").replace("}}", "}"))
        if lines
        else ""
    )
    path.write_text(
        f"source:\n  kind: postgres\n  dsn: {dsn}\n  tracking_schema: {schema}_trk\n"
        + (f"  cleanup_interval: {cleanup_interval}\n" if cleanup_interval else "")
        + f"redis:\n  url: {redis_url}\n  namespace: {namespace}\nworker:\n{worker_lines}tables:\n{tables}",
        encoding="utf-8",
    )
    return path


async def execute(dsn: str, *statements: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            await conn.execute(statement)


async def messages(client: aioredis.Redis, namespace: str, partition: str) -> list[dict[str, Any]]:
    return [json.loads(f[b"m"]) for _, f in await client.xrange(Layout(namespace).stream(partition))]


async def item_messages(client: aioredis.Redis, namespace: str) -> dict[int, list[tuple[int, str]]]:
    """items' id -> (seq, op) of each message of its partition (one per row: r<id>)."""
    out = {}
    for i in range(1, 21):
        out[i] = [(m["seq"], m["op"]) for m in await messages(client, namespace, f"r{i}")]
    return out


async def run_until_mirrored(
    config_path: Path, dsn: str, schema: str, client: aioredis.Redis, namespace: str
) -> None:
    """A sidecar (in this process) until the mirror equals the tables and
    every table streams (as ``cdc status`` shows it: a sidecar stopped
    during a snapshot's last sweep snapshots the table again), then stopped
    gracefully."""
    config = load_config(config_path)
    daemon = Daemon(config)
    task = asyncio.create_task(daemon.run())

    async def streaming() -> bool:
        states = [await client.hget(Layout(namespace).checkpoint(t.table), "state") for t in config.tables]
        return all(state == b"streaming" for state in states)

    try:
        await assert_mirrored(dsn, schema, client, namespace, timeout=60)
        await wait_for(streaming, 60, "every table to stream")
    finally:
        daemon.request_stop()
        await task


async def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cdc, *args)


@pytest.fixture
async def tables(postgres_dsn: str, pg_schema: str) -> str:
    await execute(postgres_dsn, ITEMS_DDL.format(s=pg_schema), LINES_DDL.format(s=pg_schema))
    await execute(
        postgres_dsn,
        f"insert into {pg_schema}.items (id, name, qty) select g, 'item ' || g, g from generate_series(1, 20) g",
        f"insert into {pg_schema}.lines select g, 1, 'sku' || g, g from generate_series(1, 10) g",
    )
    return pg_schema


async def test_a_table_added_to_a_running_deployment_is_the_only_one_snapshotted(
    postgres_dsn: str,
    redis_url: str,
    tables: str,
    namespace: str,
    redis_client: aioredis.Redis,
    tmp_path: Path,
) -> None:
    """items is mirrored; lines is added to the config, its tracking enabled,
    the sidecar restarted: lines is snapshotted, items streams on from its
    checkpoint (its partitions' seq continues, no snapshot message, only the
    one change made meanwhile)."""
    schema, path = tables, tmp_path / "cdc.yaml"
    write_config(path, schema, postgres_dsn, redis_url, namespace, lines=False)
    assert (await cli("tracking", "enable", "-c", str(path))).returncode == 0
    await execute(postgres_dsn, f"delete from {schema}.lines")  # no lines yet: mirrored = items only
    await run_until_mirrored(path, postgres_dsn, schema, redis_client, namespace)
    # a snapshot writes the documents and tells each partition to reload once (op R)
    assert await item_messages(redis_client, namespace) == {i: [(1, "R")] for i in range(1, 21)}

    write_config(path, schema, postgres_dsn, redis_url, namespace)  # lines added
    enabled = await cli("tracking", "enable", "-c", str(path), "--table", f"{schema}.lines")
    assert enabled.returncode == 0, enabled.stderr
    await execute(
        postgres_dsn,
        f"insert into {schema}.lines select g, 1, 'sku' || g, g from generate_series(1, 10) g",
        f"update {schema}.items set qty = 99 where id = 7",  # while no sidecar runs
    )
    await run_until_mirrored(path, postgres_dsn, schema, redis_client, namespace)
    expected = {i: [(1, "R")] for i in range(1, 21)} | {7: [(1, "R"), (2, "U")]}
    assert await item_messages(redis_client, namespace) == expected
    assert [m["op"] for m in await messages(redis_client, namespace, "orders")] == ["R"]
    await assert_seq_gap_free(redis_client, namespace, ("items", "lines"))


async def test_tracking_disable_takes_a_table_the_config_no_longer_registers(
    postgres_dsn: str, redis_url: str, tables: str, namespace: str, tmp_path: Path
) -> None:
    """Removing lines: out of the config first, then its tracking. Only lines'
    triggers and tracking rows go; items stays tracked, the schema stays.
    (Before: exit 2, 'no table ... is registered'.)"""
    schema = tables
    both = write_config(tmp_path / "both.yaml", schema, postgres_dsn, redis_url, namespace)
    assert (await cli("tracking", "enable", "-c", str(both))).returncode == 0
    items_only = write_config(
        tmp_path / "items.yaml", schema, postgres_dsn, redis_url, namespace, lines=False
    )

    disabled = await cli("tracking", "disable", "-c", str(items_only), "--table", f"{schema}.lines")
    assert disabled.returncode == 0, disabled.stderr
    assert f"{schema}.lines: change tracking disabled" in disabled.stdout
    status = await cli("tracking", "status", "-c", str(both))
    assert f"DISABLED {schema}.lines" in status.stdout and f"enabled  {schema}.items" in status.stdout
    async with await psycopg.AsyncConnection.connect(postgres_dsn) as conn:
        triggers = await (
            await conn.execute(
                "select c.relname, count(*) from pg_trigger t join pg_class c on c.oid = t.tgrelid "
                "join pg_namespace n on n.oid = c.relnamespace where n.nspname = %s and not t.tgisinternal "
                "group by c.relname order by 1",
                [schema],
            )
        ).fetchall()
        registry = await (
            await conn.execute(f"select table_name from {schema}_trk.tracked_tables")
        ).fetchall()
    assert triggers == [("items", 3)] and registry == [(f"{schema}.items",)]
    bad = await cli("tracking", "disable", "-c", str(items_only), "--table", "lines; drop")
    assert bad.returncode == 2 and "not a table name" in bad.stderr


@pytest.mark.parametrize("cleanup_interval", [None, "0s"])
async def test_a_changed_key_template_resnapshots_and_sweeps_the_old_keys(
    postgres_dsn: str,
    redis_url: str,
    tables: str,
    namespace: str,
    redis_client: aioredis.Redis,
    tmp_path: Path,
    cleanup_interval: str | None,
) -> None:
    """With the cleanup off nothing is written at the source between the two
    snapshots, so the second one reads at the first one's version: the old
    keys' documents are told from the new ones by key, not by version."""
    schema, path = tables, tmp_path / "cdc.yaml"
    write_config(path, schema, postgres_dsn, redis_url, namespace, cleanup_interval=cleanup_interval)
    assert (await cli("tracking", "enable", "-c", str(path))).returncode == 0
    await run_until_mirrored(path, postgres_dsn, schema, redis_client, namespace)
    seq = int(await redis_client.get(Layout(namespace).seq("orders")))
    write_config(
        path,
        schema,
        postgres_dsn,
        redis_url,
        namespace,
        key="{{order_id}}/{{line}}",
        cleanup_interval=cleanup_interval,
    )

    daemon = Daemon(load_config(path))
    task = asyncio.create_task(daemon.run())
    try:

        async def new_keys() -> bool:
            members = await redis_client.smembers(Layout(namespace).index("orders", "lines"))
            return sorted(members) == sorted(f"{i}/1".encode() for i in range(1, 11))

        await wait_for(new_keys, 60, "the documents under the new keys only")
    finally:
        daemon.request_stop()
        await task
    told = [(m["op"], m["key"]) for m in (await messages(redis_client, namespace, "orders"))[seq:]]
    assert sorted(told) == sorted([("R", "@reload")] + [("D", f"{i}-1") for i in range(1, 11)])
    await assert_seq_gap_free(redis_client, namespace, ("items", "lines"))


async def test_a_renamed_section_leaves_the_old_one_until_it_is_purged(
    postgres_dsn: str,
    redis_url: str,
    tables: str,
    namespace: str,
    redis_client: aioredis.Redis,
    tmp_path: Path,
) -> None:
    """The new section is snapshotted; the old one is nobody's any more and
    stays until ``cdc purge --table T --section OLD``, which needs no stop
    (no sidecar writes it) and tells the old section's subscribers."""
    schema, path = tables, tmp_path / "cdc.yaml"
    write_config(path, schema, postgres_dsn, redis_url, namespace)
    assert (await cli("tracking", "enable", "-c", str(path))).returncode == 0
    await run_until_mirrored(path, postgres_dsn, schema, redis_client, namespace)
    old = Subscriber(redis_client, namespace, "orders", section="lines")
    await old.start()
    write_config(path, schema, postgres_dsn, redis_url, namespace, section="order_lines")
    daemon = Daemon(load_config(path))
    task = asyncio.create_task(daemon.run())
    try:

        async def both_sections() -> bool:
            layout = Layout(namespace)
            return await redis_client.scard(layout.index("orders", "order_lines")) == 10

        await wait_for(both_sections, 60, "the new section's snapshot")
        assert await redis_client.scard(Layout(namespace).index("orders", "lines")) == 10  # left behind
        table = f"{schema}.lines"
        purged = await cli("purge", "-c", str(path), "--table", table, "--section", "lines")
        assert purged.returncode == 0, purged.stderr
        assert f"purged section lines of {table}: 10 document(s) deleted" in purged.stdout
    finally:
        daemon.request_stop()
        await task
    layout = Layout(namespace)
    assert not await redis_client.exists(layout.index("orders", "lines"), layout.partitions("lines"))
    assert await redis_client.scard(layout.index("orders", "order_lines")) == 10
    assert await redis_client.exists(layout.checkpoint(f"{schema}.lines"))  # the table's own keys stay
    await old.poll(block=0.1)
    assert old.replica.get("lines", {}) == {}
    await assert_seq_gap_free(redis_client, namespace, ("items", "lines", "order_lines"))


# -- mixed versions ---------------------------------------------------------------

# The commit that made version 0.2.0 (git log -S'version = "0.2.0"' pyproject.toml):
# what 0.2.0 users run. (The commits after it, up to 0.3.0, carried the 0.2.0
# number but were 0.3's code.)
V020 = "1a2d36b"


def extract_v020(into: Path) -> Path:
    """0.2.0's packages from this clone's history, or skip with the reason."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", V020, "cdc", "publishers", "schemas"], capture_output=True
    )
    if archive.returncode != 0:
        pytest.skip(f"0.2.0 ({V020}) is not in this checkout's git history: {archive.stderr.decode()[:200]}")
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


class Version:
    """``python -m cdc.cli`` of one version: this checkout, or an extracted tree."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree

    def command(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self._args(*args), capture_output=True, text=True, timeout=60, **self._where())

    def sidecar(self, config: Path, log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                self._args("run", "-c", str(config)), stdout=out, stderr=out, **self._where()
            )

    def _args(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "cdc.cli", "--json-logs", *args]

    def _where(self) -> dict[str, Any]:
        # cwd: the tree itself, so that its packages come first on sys.path
        return {"cwd": str(self.tree), "env": dict(os.environ, PYTHONPATH=str(self.tree))}


def snapshots(log: Path) -> list[tuple[str, str]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("msg") == "snapshot starting":
            out.append((entry["table"], entry.get("reason", "")))
    return out


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(40)


async def holders(client: aioredis.Redis, namespace: str, tables: list[str]) -> dict[str, str]:
    out = {}
    for table in tables:
        holder = await client.get(Layout(namespace).lease(table))
        if holder is not None:
            out[table] = holder.decode()
    return out


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_sidecars_of_020_and_this_version_share_one_config(
    postgres_dsn: str,
    redis_url: str,
    tables: str,
    namespace: str,
    redis_client: aioredis.Redis,
    tmp_path: Path,
) -> None:
    """A 0.2.0 deployment rolled to this version one sidecar at a time, under
    writers, and back: the leases hand each table over, no table is snapshotted again after the first snapshot
    (same stored shape in both versions), the mirror equals the tables and
    every partition's seq is gap-free."""
    schema = tables
    old, new = Version(extract_v020(tmp_path / "v020")), Version(ROOT)
    path = write_config(tmp_path / "cdc.yaml", schema, postgres_dsn, redis_url, namespace, lease_ttl="2s")
    names = [f"{schema}.items", f"{schema}.lines"]
    assert old.command("tracking", "enable", "-c", str(path)).returncode == 0
    writers = Writers(postgres_dsn, schema, seed=5, ids=100)
    writing = asyncio.create_task(writers.run(writers=2, long_transactions=0))
    logs = [tmp_path / f"{n}.log" for n in ("old1", "new", "old2")]
    first = old.sidecar(path, logs[0])
    second = None
    try:
        await wait_for(
            lambda: _owned_by(redis_client, namespace, names, first.pid), 60, "0.2.0 to take both tables"
        )
        upgraded = await asyncio.to_thread(new.command, "tracking", "enable", "-c", str(path))
        assert upgraded.returncode == 0, upgraded.stderr  # the 0.3 schema, 0.2.0 still running
        second = new.sidecar(path, logs[1])
        assert stop(first) == 0
        await wait_for(lambda: _owned_by(redis_client, namespace, names, second.pid), 60, "0.3 to take both")
        first = old.sidecar(path, logs[2])  # and back: a rollback
        assert stop(second) == 0
        await wait_for(lambda: _owned_by(redis_client, namespace, names, first.pid), 60, "0.2.0 to take both")
        writers.stop.set()
        await writing
        await assert_mirrored(postgres_dsn, schema, redis_client, namespace, timeout=60)
    finally:
        writers.stop.set()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                stop(proc)
    await assert_seq_gap_free(redis_client, namespace, ("items", "lines"))
    assert sorted(t for log in logs for t, _ in snapshots(log)) == sorted(names)  # the first snapshot only


async def _owned_by(client: aioredis.Redis, namespace: str, tables: list[str], pid: int) -> bool:
    owners = await holders(client, namespace, tables)
    return len(owners) == len(tables) and all(f"-{pid}-" in owner for owner in owners.values())
