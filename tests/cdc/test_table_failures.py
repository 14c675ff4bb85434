"""One table's shape changes and failures, inside a whole sidecar (``Daemon``)
on the in-memory source and a real Redis: the table follows its new shape
(documents equal rows again, untouched rows included), or is ``degraded``,
named with its reason, and recovers by itself once fixed; the other table
keeps streaming throughout, and the sidecar never stops. Seconds a test.

The same steps on a real PostgreSQL, under concurrent writers, are in
``tests/cdc/test_ddl_e2e.py``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis

from cdc import daemon as daemon_module
from cdc import tracker as tracker_module
from cdc.config import Config, parse_config
from cdc.daemon import Daemon
from cdc.sources.memory import MemorySource
from publishers import control
from publishers.layout import Layout
from publishers.manager import DataManager
from publishers.retrying import equal_jitter
from tests.e2e import wait_for

ITEMS, OTHER = "mem.items", "mem.other"
PARTITION = {ITEMS: "p", OTHER: "q"}  # a partition each: a damaged one is one table's
DEADLINE = 10.0  # seconds; each step takes well under one


def config(redis_url: str, namespace: str, columns: str = "") -> Config:
    tables = "".join(
        f"  - table: {t}\n    partition: {PARTITION[t]}\n    section: {t.split('.')[1]}\n"
        "    backoff: [[null, 10ms]]\n"
        for t in (ITEMS, OTHER)
    )
    if columns:
        tables = tables.replace("    section: items\n", f"    section: items\n    columns: [{columns}]\n")
    text = (
        f"source:\n  kind: postgres\n  dsn: unused\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        f"worker:\n  health: null\n  lease_ttl: 2s\n  heartbeat: 1s\n"
        f"tables:\n{tables}"
    )
    return parse_config(text, "sidecar.yaml", {})


@dataclass
class Sidecar:
    source: MemorySource
    daemon: Daemon
    task: asyncio.Task[None]
    manager: DataManager
    next_id: int = 1000

    async def documents(self, table: str) -> dict[str, dict[str, Any]]:
        documents = await self.manager.documents(PARTITION[table], table.split(".")[1])
        return {
            key: {c: v for c, v in doc.items() if not c.startswith("@")} for key, doc in documents.items()
        }

    def rows(self, table: str, drop: Callable[[str], bool] = lambda c: False) -> dict[str, dict[str, Any]]:
        return {
            str(key[0]): {c: v for c, v in row.items() if not drop(c)}
            for key, row in self.source.rows(table).items()
        }

    async def mirrored(self, table: str, drop: Callable[[str], bool] = lambda c: False) -> bool:
        return await self.documents(table) == self.rows(table, drop)

    async def streaming(self, table: str) -> bool:
        checkpoint = self.manager.layout.checkpoint(table)
        return bool(await self.manager.client.hget(checkpoint, "state") == b"streaming")

    def write(self, table: str = OTHER) -> int:
        """A new row in ``table``; its id."""
        self.next_id += 1
        self.source.insert(table, {"id": self.next_id, "n": self.next_id})
        return self.next_id

    async def streams(self, table: str = OTHER) -> None:
        """A row written now reaches its document (the table is not stalled)."""
        written = str(self.write(table))
        await wait_for(lambda: self._has(table, written), DEADLINE, f"{table} to keep streaming")

    async def _has(self, table: str, key: str) -> bool:
        return key in await self.documents(table)

    def degraded(self, table: str) -> str | None:
        """The reason /readyz gives for ``table``, or None."""
        tables = self.daemon.readyz()[1]["tables"]
        return tables.get(table) if isinstance(tables, dict) else None

    async def is_degraded(self, table: str, because: str = "") -> bool:
        reason = self.degraded(table)
        return reason is not None and because in reason

    async def ready(self) -> bool:
        return self.daemon.readyz()[0]

    async def recovered(self, table: str) -> bool:
        return self.degraded(table) is None

    def state_metric(self, table: str, state: str) -> float | None:
        return self.daemon.metrics.registry.get_sample_value(
            "cdc_table_state", {"table": table, "state": state}
        )


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shape check and a broken table's retries, in tenths of seconds."""
    monkeypatch.setattr(daemon_module, "SHAPE_CHECK_INTERVAL", 0.1)
    monkeypatch.setattr(tracker_module, "BROKEN_WAIT", equal_jitter(0.05, 0.2))


@pytest.fixture
def source() -> MemorySource:
    shared = MemorySource()
    for table in (ITEMS, OTHER):
        shared.create_table(table, {"id": "int", "n": "int"}, ["id"])
        for i in range(20):
            shared.insert(table, {"id": i, "n": i})
    return shared


@contextlib.asynccontextmanager
async def running_sidecar(source: MemorySource, cfg: Config) -> AsyncIterator[Sidecar]:
    """A sidecar as it comes up (nothing waited for); still running at the end, then stopped."""
    daemon = Daemon(cfg, source=source, worker_id="w1")
    task = asyncio.create_task(daemon.run(), name="sidecar")
    async with await DataManager.connect(cfg.redis) as manager:
        try:
            yield Sidecar(source, daemon, task, manager)
            assert not task.done(), "the sidecar must never stop for a table"
        finally:
            daemon.request_stop()
            await asyncio.wait_for(task, 30)


@contextlib.asynccontextmanager
async def start_sidecar(source: MemorySource, cfg: Config) -> AsyncIterator[Sidecar]:
    """Both tables tracked, and a sidecar that has mirrored them and streams."""
    await source.tracking_enable(list(cfg.tables))
    async with running_sidecar(source, cfg) as sidecar:
        for table in (ITEMS, OTHER):
            await wait_for(lambda t=table: sidecar.mirrored(t), DEADLINE, f"{table} to be mirrored")
            # and its snapshot done (documents equal the rows before the snapshot records it)
            await wait_for(lambda t=table: sidecar.streaming(t), DEADLINE, f"{table} to stream")
        yield sidecar


@pytest.fixture
async def sidecar(source: MemorySource, redis_url: str, namespace: str) -> AsyncIterator[Sidecar]:
    async with start_sidecar(source, config(redis_url, namespace)) as running:
        yield running


async def test_an_added_column_reaches_every_document_even_untouched_ones(sidecar: Sidecar) -> None:
    sidecar.source.add_column(ITEMS, "flag", "text", default="dflt")  # no change is logged

    await wait_for(lambda: sidecar.mirrored(ITEMS), DEADLINE, "the new column in every document")
    assert all(doc["flag"] == "dflt" for doc in (await sidecar.documents(ITEMS)).values())
    await sidecar.streams()


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.drop_column(ITEMS, "n"),
        lambda s: s.rename_column(ITEMS, "n", "m"),
        lambda s: s.retype_column(ITEMS, "n", "text", lambda v: f"#{v}"),
    ],
    ids=["drop column", "rename column", "retype column"],
)
async def test_documents_follow_a_changed_column(
    sidecar: Sidecar, change: Callable[[MemorySource], None]
) -> None:
    change(sidecar.source)
    sidecar.source.insert(ITEMS, {"id": 500})  # a write under the new shape

    await wait_for(lambda: sidecar.mirrored(ITEMS), DEADLINE, "documents equal to rows again")
    await sidecar.streams()


async def test_a_dropped_table_is_degraded_until_created_and_enabled_again(sidecar: Sidecar) -> None:
    sidecar.source.drop_table(ITEMS)

    await wait_for(lambda: sidecar.is_degraded(ITEMS, "no such table"), DEADLINE, "items degraded")
    assert sidecar.daemon.healthz()[0], "/healthz is liveness: a dropped table is no reason to restart"
    assert not sidecar.daemon.readyz()[0]
    assert sidecar.state_metric(ITEMS, "degraded") == 1 and sidecar.state_metric(OTHER, "streaming") == 1
    assert "error:mem.items" in sidecar.daemon.observer.heartbeat_fields()
    await sidecar.streams()

    sidecar.source.create_table(ITEMS, {"id": "int", "n": "int"}, ["id"])
    sidecar.source.insert(ITEMS, {"id": 7, "n": 70})  # before tracking: no trigger would see it
    await wait_for(lambda: sidecar.is_degraded(ITEMS, "not enabled"), DEADLINE, "items degraded: not tracked")
    await sidecar.source.tracking_enable([sidecar.daemon.config.tables[0]])
    sidecar.source.insert(ITEMS, {"id": 8, "n": 80})

    await wait_for(
        lambda: sidecar.mirrored(ITEMS), DEADLINE, "the new table's rows, the old ones' documents gone"
    )
    await wait_for(lambda: sidecar.ready(), DEADLINE, "/readyz 200 again")
    assert set(await sidecar.documents(ITEMS)) == {"7", "8"}


async def test_a_renamed_table_is_degraded_and_loses_nothing_when_renamed_back(sidecar: Sidecar) -> None:
    sidecar.source.rename_table(ITEMS, "mem.items_old")
    await wait_for(lambda: sidecar.is_degraded(ITEMS), DEADLINE, "items degraded")
    sidecar.source.insert("mem.items_old", {"id": 300, "n": 3})  # tracked under its new name
    await sidecar.streams()

    sidecar.source.rename_table("mem.items_old", ITEMS)

    await wait_for(lambda: sidecar.mirrored(ITEMS), DEADLINE, "the write made meanwhile")
    await wait_for(lambda: sidecar.recovered(ITEMS), DEADLINE, "items recovered")


async def test_tracking_disabled_then_enabled_again_snapshots_what_went_uncaptured(sidecar: Sidecar) -> None:
    table_config = sidecar.daemon.config.tables[0]
    await sidecar.source.tracking_disable([table_config])
    sidecar.source.delete(ITEMS, {"id": 3})  # not captured
    sidecar.source.update(ITEMS, {"id": 4}, {"n": 44})
    await wait_for(lambda: sidecar.is_degraded(ITEMS, "not enabled"), DEADLINE, "items degraded")
    await sidecar.streams()

    await sidecar.source.tracking_enable([table_config])

    await wait_for(lambda: sidecar.mirrored(ITEMS), DEADLINE, "what went uncaptured")
    await wait_for(lambda: sidecar.recovered(ITEMS), DEADLINE, "items recovered")


async def test_a_reserved_column_is_left_out_not_dead_lettered(sidecar: Sidecar) -> None:
    sidecar.source.add_column(ITEMS, "@flag", "bool", default=True)
    sidecar.source.update(ITEMS, {"id": 5}, {"n": 55, "@flag": False})

    await wait_for(
        lambda: sidecar.mirrored(ITEMS, drop=lambda c: c.startswith("@")),
        DEADLINE,
        "the update, without @flag",
    )
    assert sidecar.daemon.metrics.registry.get_sample_value(
        "cdc_changes_dead_lettered_total", {"table": ITEMS}
    ) in (
        None,
        0.0,
    )


async def test_a_dropped_column_the_config_names_degrades_the_table_naming_the_line(
    source: MemorySource, redis_url: str, namespace: str
) -> None:
    source.add_column(ITEMS, "note", "text", default="x")
    async with start_sidecar(source, config(redis_url, namespace, columns="n, note")) as sidecar:
        source.drop_column(ITEMS, "note")

        # (a read with the old columns may fail first: the next try, describing, names the line)
        await wait_for(lambda: sidecar.is_degraded(ITEMS, "tables[0].columns"), DEADLINE, "items degraded")
        reason = sidecar.degraded(ITEMS) or ""
        assert "sidecar.yaml:" in reason and "tables[0].columns" in reason and "'note'" in reason, reason
        await sidecar.streams()

        source.add_column(ITEMS, "note", "text", default="back")
        await wait_for(lambda: sidecar.mirrored(ITEMS), DEADLINE, "items back")


async def test_a_table_missing_at_start_up_does_not_keep_the_others_down(
    source: MemorySource, redis_url: str, namespace: str
) -> None:
    cfg = config(redis_url, namespace)
    await source.tracking_enable([cfg.tables[1]])
    source.drop_table(ITEMS)
    async with running_sidecar(source, cfg) as sidecar:
        await wait_for(lambda: sidecar.mirrored(OTHER), DEADLINE, "the other table mirrored")
        await wait_for(lambda: sidecar.is_degraded(ITEMS), DEADLINE, "items degraded")

        source.create_table(ITEMS, {"id": "int", "n": "int"}, ["id"])
        source.insert(ITEMS, {"id": 1, "n": 1})
        await source.tracking_enable([cfg.tables[0]])
        await wait_for(lambda: sidecar.mirrored(ITEMS), DEADLINE, "items mirrored once it exists")


async def test_a_damaged_partition_degrades_its_table_until_repaired(
    sidecar: Sidecar, redis_client: aioredis.Redis, namespace: str
) -> None:
    seq = Layout(namespace).seq(PARTITION[ITEMS])
    good = await redis_client.get(seq)
    await redis_client.set(seq, "x")
    sidecar.source.update(ITEMS, {"id": 1}, {"n": 111})
    sidecar.source.insert(ITEMS, {"id": 400, "n": 4})

    await wait_for(lambda: sidecar.is_degraded(ITEMS, "does not hold an integer"), DEADLINE, "items degraded")
    await sidecar.streams()
    assert await redis_client.xlen(Layout(namespace).deadletter()) == 0, (
        "the changes are fine: no dead letter"
    )

    await redis_client.set(seq, good)
    await wait_for(lambda: sidecar.mirrored(ITEMS), DEADLINE, "the blocked changes, once repaired")
    await wait_for(lambda: sidecar.recovered(ITEMS), DEADLINE, "items recovered")


async def test_a_damaged_checkpoint_degrades_its_table_until_deleted(
    source: MemorySource, redis_url: str, namespace: str
) -> None:
    """The checkpoint is read when the table is taken: a damaged one once
    ended the whole sidecar there (a failover's request written where the
    new primary lacked the checkpoint read as one)."""
    cfg = config(redis_url, namespace)
    async with await DataManager.connect(cfg.redis) as manager:
        key = manager.layout.checkpoint(ITEMS)
        await manager.client.hset(key, mapping={"version": "x", "state": "streaming"})
    await source.tracking_enable(list(cfg.tables))
    async with running_sidecar(source, cfg) as sidecar:
        await wait_for(lambda: sidecar.mirrored(OTHER), DEADLINE, "the other table mirrored")
        await wait_for(
            lambda: sidecar.is_degraded(ITEMS, f"{key} field version holds 'x'"), DEADLINE, "items degraded"
        )
        await sidecar.streams()
        assert not sidecar.task.done()

        await sidecar.manager.client.delete(key)  # what the error says to do
        await wait_for(lambda: sidecar.mirrored(ITEMS), DEADLINE, "items snapshotted once the key is gone")
        await wait_for(lambda: sidecar.recovered(ITEMS), DEADLINE, "items recovered")


async def test_a_checkpoint_holding_only_a_failovers_request_is_snapshotted(
    source: MemorySource, redis_url: str, namespace: str
) -> None:
    cfg = config(redis_url, namespace)
    async with await DataManager.connect(cfg.redis) as manager:
        await manager.client.hset(manager.layout.checkpoint(ITEMS), "snapshot_requested", "failover 1.5")
        async with start_sidecar(source, cfg) as sidecar:  # (it waits for both tables mirrored, streaming)

            async def served() -> bool:
                return await control.snapshot_request(manager, ITEMS) is None

            await wait_for(served, DEADLINE, "the request served")
            await sidecar.streams(ITEMS)


async def test_a_change_made_while_no_sidecar_ran_is_followed_at_start_up(
    source: MemorySource, redis_url: str, namespace: str
) -> None:
    """DDL during a deploy (the sidecar stopped), and ``columns:`` narrowed
    between two runs: the documents were written in another shape, which the
    checkpoint records; the next sidecar notices and snapshots the table."""
    async with start_sidecar(source, config(redis_url, namespace)):
        pass
    source.add_column(ITEMS, "flag", "text", default="dflt")

    async with start_sidecar(source, config(redis_url, namespace)) as sidecar:
        await wait_for(lambda: sidecar.mirrored(ITEMS), DEADLINE, "the column added while stopped")

    async with start_sidecar(source, config(redis_url, namespace, columns="n")) as sidecar:
        await wait_for(
            lambda: sidecar.mirrored(ITEMS, drop=lambda c: c == "flag"),
            DEADLINE,
            "the column no longer listed gone",
        )


async def test_documents_of_a_cdc_sync_that_recorded_no_shape_are_snapshotted_once(
    source: MemorySource, redis_url: str, namespace: str, redis_client: aioredis.Redis
) -> None:
    """Mirrors written before 0.2 have a checkpoint but no shape, and their keys
    may be encoded otherwise (UPGRADING.md): snapshotted once, whose sweep
    removes a document no row has, then the shape is recorded."""
    cfg = config(redis_url, namespace)
    async with start_sidecar(source, cfg):
        pass
    layout = Layout(namespace)
    assert await redis_client.hdel(layout.checkpoint(ITEMS), "shape") == 1  # as a 0.1 sidecar left it

    async with start_sidecar(source, cfg) as sidecar:
        await wait_for(
            lambda: _shape_recorded(redis_client, layout), DEADLINE, "the shape recorded by the snapshot"
        )
        rows = sidecar.daemon.metrics.registry.get_sample_value("cdc_snapshot_rows_total", {"table": ITEMS})
        assert rows == len(source.rows(ITEMS)), "items was snapshotted again"
        other = sidecar.daemon.metrics.registry.get_sample_value("cdc_snapshot_rows_total", {"table": OTHER})
        assert not other, "a table whose shape was recorded is not"


async def _shape_recorded(redis_client: aioredis.Redis, layout: Layout) -> bool:
    return bool(await redis_client.hexists(layout.checkpoint(ITEMS), "shape"))
