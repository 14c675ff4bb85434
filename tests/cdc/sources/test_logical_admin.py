"""Logical capture's administration against a real PostgreSQL: ``enable``
puts a re-created table back in its publication, ``disable`` leaves no slot
behind a running sidecar, and a slot another session reads is a transient
error (a lease hand-over), not a table error."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from cdc.errors import SourceUnavailable, TrackingNotEnabled
from cdc.sources import pg_logical
from tests.contract.harness import PostgresLogicalHarness, Replica

ITEMS = {"id": "int", "n": "int", "note": "text"}


async def _slot_exists(harness: PostgresLogicalHarness, name: str) -> bool:
    cur = await harness.admin.execute("select 1 from pg_replication_slots where slot_name = %s", [name])
    return await cur.fetchone() is not None


async def test_enable_puts_a_re_created_table_back_in_its_publication(
    harness: PostgresLogicalHarness,
) -> None:
    table_config = await harness.create_table("items", ITEMS, ["id"])
    source = harness.pg_source
    await harness.admin.execute(f"drop table {table_config.table}")
    await harness.admin.execute(f"create table {table_config.table} (id int primary key, n int, note text)")

    done = await source.tracking_enable([table_config])

    assert "the table added to it" in done[0], done
    [status] = await source.tracking_status([table_config])
    assert status.enabled, status.detail
    info = await source.describe(table_config)
    replica = await Replica.from_snapshot(source, info)
    await harness.admin.execute(f"insert into {table_config.table} values (1, 1, 'new')")
    await harness.settle()
    assert [r.key for r in await replica.catch_up()] == [{"id": 1}], "the new table's changes are decoded"
    assert "in place" in (await source.tracking_enable([table_config]))[0]


async def test_disable_leaves_no_slot_when_a_snapshot_runs_between_its_drops(
    harness: PostgresLogicalHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running sidecar's snapshot makes the slot again while the publication
    is there: ``disable`` drops the publication first. The snapshot is run
    right after the first of the two drops, whichever that is."""
    table_config = await harness.create_table("items", ITEMS, ["id"])
    source = harness.pg_source
    info = await source.describe(table_config)
    name = source.slot(info.table, harness.admin.info.dbname)
    await harness.admin.execute(f"select pg_drop_replication_slot('{name}')")  # as after an invalidation
    snapshots: list[str] = []

    def then_snapshot(drop: Callable[..., Awaitable[bool]]) -> Callable[..., Awaitable[bool]]:
        async def dropping(*args: Any, **kwargs: Any) -> bool:
            dropped = await drop(*args, **kwargs)
            if not snapshots:
                try:
                    [p async for p in source.snapshot(info, page_size=10)]
                    snapshots.append("taken")
                except TrackingNotEnabled:
                    snapshots.append("not enabled")
            return dropped

        return dropping

    monkeypatch.setattr(pg_logical, "drop_slot", then_snapshot(pg_logical.drop_slot))
    monkeypatch.setattr(pg_logical, "drop_publication", then_snapshot(pg_logical.drop_publication))

    done = await source.tracking_disable([table_config])
    harness.tracked.remove(table_config)

    assert snapshots == ["not enabled"]
    assert done == [f"{info.table}: publication {name} dropped"]
    assert not await _slot_exists(harness, name), "an orphaned slot keeps WAL until the disk is full"


async def test_a_slot_another_session_reads_is_source_unavailable(harness: PostgresLogicalHarness) -> None:
    """During a lease hand-over the old holder may still be decoding the slot:
    the server says the slot is active for another pid (ObjectInUse)."""
    table_config = await harness.create_table("items", ITEMS, ["id"])
    source = harness.pg_source
    info = await source.describe(table_config)
    since = await source.current_version()
    name = source.slot(info.table, harness.admin.info.dbname)
    holder = psycopg.pq.PGconn.connect(make_conninfo(harness.dsn, replication="database").encode())
    try:
        assert holder.status == psycopg.pq.ConnStatus.OK, holder.get_error_message()
        holder.send_query(
            f"START_REPLICATION SLOT {name} LOGICAL 0/0 (proto_version '1', publication_names '{name}')".encode()
        )
        result = holder.get_result()
        assert result is not None and result.status == psycopg.pq.ExecStatus.COPY_BOTH, (
            holder.get_error_message()
        )

        with pytest.raises(SourceUnavailable, match="is active for PID"):
            await source.read_changes(info, since, limit=10)
    finally:
        holder.finish()
