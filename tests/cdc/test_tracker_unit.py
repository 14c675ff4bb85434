"""ChangeTracker on the in-memory source and a real Redis: what a user checks
(the documents, the stored checkpoint, the tracker's state), milliseconds a test.

The batch worker applies through ``Applier``, which can hold every batch
back (a read not yet applied) or report a key's changes as refused (FENCED,
as when another sidecar took the table over)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from tenacity import RetryCallState

from cdc import tracker as tracker_module
from cdc.batching import AutoBatchWorker
from cdc.config import RedisConfig, TableConfig
from cdc.errors import LeaseLost, TrackingExpired
from cdc.metrics import Metrics
from cdc.sources.base import ChangePage, TableInfo
from cdc.sources.memory import MemorySource
from cdc.templates import Template
from cdc.tracker import MAX_RETRY_DELAY, RETRY_WAIT, ChangeTracker
from publishers.manager import DataManager
from publishers.model import ApplyResult, Change
from tests.e2e import wait_for

ITEMS = "mem.items"
OTHER = "mem.other"


def table_config(table: str) -> TableConfig:
    schema, name = table.split(".")
    return TableConfig(
        table=table,
        schema=schema,
        name=name,
        section=name,
        partition=Template.parse("p"),
        key=None,
        columns=None,
    )


class Applier:
    """The worker's apply function: the data manager's, with two faults on demand."""

    def __init__(self, manager: DataManager) -> None:
        self.manager = manager
        self.open = asyncio.Event()  # cleared: every batch waits (its read stays unfinished)
        self.open.set()
        self.refused_keys: set[str] = set()  # changes of these data keys come back FENCED

    async def __call__(self, changes: Sequence[Change]) -> ApplyResult:
        await self.open.wait()
        refused = [c for c in changes if c.key in self.refused_keys]
        result = await self.manager.apply([c for c in changes if c.key not in self.refused_keys])
        result.fenced.extend(refused)
        return result


class Rig:
    """A source with two tracked tables, a data manager, a started batch worker."""

    def __init__(self, source: MemorySource, manager: DataManager) -> None:
        self.source, self.manager = source, manager
        self.applier = Applier(manager)
        self.worker = AutoBatchWorker(self.applier, max_batch_size=50, max_wait=0.001)
        self.metrics = Metrics()

    async def tracker(self, table: str = ITEMS, worker: AutoBatchWorker | None = None) -> ChangeTracker:
        """A tracker started from the table's checkpoint in Redis (none: snapshot first)."""
        tracker = ChangeTracker(
            table_config(table),
            source=self.source,
            manager=self.manager,
            worker=worker or self.worker,
            metrics=self.metrics,
            page_size=7,
            max_row_bytes=1 << 20,
        )
        await tracker.prepare()
        await tracker.start()
        await tracker.resume()
        return tracker

    async def documents(self, table: str = ITEMS) -> dict[str, dict[str, Any]]:
        return await self.manager.documents("p", table.split(".")[1])

    async def checkpoint(self, table: str = ITEMS) -> int | None:
        checkpoint = await self.manager.get_checkpoint(table)
        return None if checkpoint is None else checkpoint.version


@pytest.fixture
async def rig(redis_url: str, namespace: str) -> AsyncIterator[Rig]:
    source = MemorySource()
    for table in (ITEMS, OTHER):
        source.create_table(table, {"id": "int", "n": "int", "note": "text"}, ["id"])
    await source.tracking_enable([table_config(ITEMS), table_config(OTHER)])
    manager = await DataManager.connect(RedisConfig(url=redis_url, namespace=namespace))
    rig = Rig(source, manager)
    rig.worker.start()
    try:
        yield rig
    finally:
        rig.applier.open.set()
        await rig.worker.stop()
        await manager.close()


def row(i: int, n: int = 0) -> dict[str, Any]:
    return {"id": i, "n": n, "note": f"row {i}"}


async def test_snapshot_then_changes_reach_redis_and_the_checkpoint(rig: Rig) -> None:
    for i in range(10):
        rig.source.insert(ITEMS, row(i))
    tracker = await rig.tracker()

    await tracker.run(once=True)

    assert set(await rig.documents()) == {str(i) for i in range(10)}
    assert await rig.checkpoint() == await rig.source.current_version()
    rig.source.update(ITEMS, {"id": 3}, {"n": 33})
    rig.source.delete(ITEMS, {"id": 4})
    await tracker.start()
    await tracker.run(once=True)
    documents = await rig.documents()
    assert documents["3"]["n"] == 33 and "4" not in documents
    assert await rig.checkpoint() == await rig.source.current_version()
    assert tracker.health.state == "stopped" and tracker.health.error is None


async def test_an_idle_table_checkpoint_follows_the_source(rig: Rig) -> None:
    tracker = await rig.tracker()
    await tracker.run(once=True)
    rig.source.insert(OTHER, row(1))  # another table's commit moves the version

    await tracker.start()
    await tracker.run(once=True)

    assert await rig.checkpoint() == await rig.source.current_version()
    assert await rig.documents() == {}


async def test_checkpoint_never_passes_an_unfinished_read(rig: Rig) -> None:
    tracker = await rig.tracker()
    await tracker.run(once=True)
    before = await rig.checkpoint()
    rig.applier.open.clear()  # Redis is slow: nothing read from now on is applied
    rig.source.insert(ITEMS, row(1))
    rig.source.insert(ITEMS, row(2))

    assert await tracker.poll() is True
    assert await tracker.poll() is False  # a later, empty read: it must wait its turn too
    await tracker.checkpoints.flush()

    assert (tracker.applied, await rig.checkpoint()) == (before, before)
    rig.applier.open.set()
    await wait_for(lambda: _applied(tracker), 5, "the reads applied")
    await tracker.checkpoints.flush()
    assert await rig.checkpoint() == await rig.source.current_version()
    assert set(await rig.documents()) == {"1", "2"}


async def _applied(tracker: ChangeTracker) -> bool:
    await tracker.checkpoints.flush()  # advances over what finished meanwhile
    return tracker.applied == tracker.position


async def test_checkpoint_never_passes_a_refused_read(rig: Rig) -> None:
    tracker = await rig.tracker()
    await tracker.run(once=True)
    before = await rig.checkpoint()
    rig.applier.refused_keys.add("2")  # another sidecar owns this partition now
    for i in (1, 2, 3):
        rig.source.insert(ITEMS, row(i))

    with pytest.raises(LeaseLost, match=ITEMS):
        await asyncio.wait_for(tracker.run(once=True), 5)

    assert await rig.checkpoint() == before
    assert "2" not in await rig.documents()


async def test_a_crash_between_read_and_apply_replays_the_read(rig: Rig) -> None:
    first = await rig.tracker()
    await first.run(once=True)
    before = await rig.checkpoint()
    rig.source.insert(ITEMS, row(1, n=1))
    stalled = AutoBatchWorker(rig.applier)  # never started: what it holds dies with the process
    crashed = await rig.tracker(worker=stalled)
    assert await crashed.poll() is True

    restarted = await rig.tracker()  # a new process, from the checkpoint in Redis
    assert restarted.position == before
    await restarted.run(once=True)

    assert (await rig.documents())["1"]["n"] == 1
    assert await rig.checkpoint() == await rig.source.current_version()


async def test_tracking_expired_resnapshots_that_table_alone(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    items, other = await rig.tracker(ITEMS), await rig.tracker(OTHER)
    rig.source.insert(ITEMS, row(1))
    rig.source.insert(OTHER, row(1))
    await items.run(once=True)
    await other.run(once=True)
    rig.source.truncate(ITEMS)  # not tracked: the checkpoint of items expires
    rig.source.insert(ITEMS, row(2))
    other_checkpoint = await rig.checkpoint(OTHER)

    for tracker in (items, other):
        await tracker.start()
        await tracker.run(once=True)

    assert set(await rig.documents(ITEMS)) == {"2"}  # row 1 swept: the snapshot did not see it
    assert await rig.checkpoint(ITEMS) == await rig.source.current_version()
    assert set(await rig.documents(OTHER)) == {"1"}
    assert await rig.checkpoint(OTHER) >= (other_checkpoint or 0)
    resnapshots = [r for r in caplog.records if r.getMessage() == "re-snapshotting"]
    assert [getattr(r, "table", None) for r in resnapshots] == [ITEMS]


async def test_a_source_gone_back_in_time_is_resnapshotted(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.source.insert(ITEMS, row(1))
    rig.source.insert(ITEMS, row(2))
    tracker = await rig.tracker()
    await tracker.run(once=True)
    rig.source.restore(1)  # a restore or failover: the version went back below the checkpoint

    await tracker.start()
    await tracker.run(once=True)
    rig.source.insert(ITEMS, row(3))  # at a version the tracker had passed before the restore
    await tracker.start()
    await tracker.run(once=True)

    assert [r.getMessage() for r in caplog.records].count("re-snapshotting") == 1
    assert set(await rig.documents()) == {"1", "2", "3"}
    assert await rig.checkpoint() == await rig.source.current_version() == 2


async def test_transient_source_errors_retry_and_recover(rig: Rig) -> None:
    tracker = await rig.tracker()
    await tracker.run(once=True)
    rig.source.available = False  # the source goes away
    rig.source.insert(ITEMS, row(1))
    running = asyncio.create_task(tracker.run())
    try:
        await wait_for(_is(tracker, "degraded"), 5, "the tracker degraded")
        assert tracker.health.error is not None and "unavailable" in tracker.health.error

        rig.source.available = True
        await wait_for(_has_document(rig, "1"), 5, "the change after the outage")
        assert (tracker.health.state, tracker.health.error) == ("streaming", None)
    finally:
        tracker.stop_event.set()
        await asyncio.wait_for(running, 5)
    assert tracker.health.state == "stopped"


async def test_a_stop_during_an_outage_ends_the_run(rig: Rig) -> None:
    tracker = await rig.tracker()
    await tracker.run(once=True)
    rig.source.available = False
    running = asyncio.create_task(tracker.run())
    await wait_for(_is(tracker, "degraded"), 5, "the tracker degraded")

    tracker.stop_event.set()

    await asyncio.wait_for(running, 1)  # the retry's wait is cut short
    assert tracker.health.state == "stopped"


def test_retry_waits_are_jittered_and_capped() -> None:
    def waits(attempt: int) -> list[float]:
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = attempt
        return [RETRY_WAIT(state) for _ in range(200)]

    first, late = waits(1), waits(20)

    assert all(0.25 <= w <= 0.5 for w in first)  # half of the first 0.5 s fixed, half random
    assert all(MAX_RETRY_DELAY / 2 <= w <= MAX_RETRY_DELAY for w in late)  # the cap holds
    assert max(late) - min(late) > 1.0  # tables retrying after one outage spread out


def _is(tracker: ChangeTracker, state: str) -> Any:
    async def check() -> bool:
        return tracker.health.state == state

    return check


def _has_document(rig: Rig, key: str) -> Any:
    async def check() -> bool:
        return key in await rig.documents()

    return check


class ExpiringSource(MemorySource):
    """A memory source whose next ``expiring`` reads of changes find their
    checkpoint expired: a cleanup or a TRUNCATE passing every snapshot's
    version at once."""

    expiring = 0

    async def read_changes(self, info: TableInfo, since: int, **kwargs: Any) -> ChangePage:
        if self.expiring > 0:
            self.expiring -= 1
            raise TrackingExpired(info.table, f"{since} is below the minimum valid version (simulated)")
        return await super().read_changes(info, since, **kwargs)


async def test_expiring_again_right_after_a_snapshot_backs_off_and_says_why(
    rig: Rig, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = ExpiringSource()
    source.create_table(ITEMS, {"id": "int", "n": "int", "note": "text"}, ["id"])
    await source.tracking_enable([table_config(ITEMS)])
    source.insert(ITEMS, row(1))
    rig.source = source
    waits: list[int] = []

    def broken_wait(state: RetryCallState) -> float:
        waits.append(state.attempt_number)
        return 0.01

    monkeypatch.setattr(tracker_module, "BROKEN_WAIT", broken_wait)
    caplog.set_level(logging.INFO, logger="cdc.tracker")
    tracker = await rig.tracker()
    await tracker.run(once=True)  # the first snapshot: no checkpoint yet
    source.expiring = 3
    await tracker.start()
    await tracker.run(once=True)

    assert waits == [1, 2], "the first expiry snapshots at once; each one after it waits longer"
    snapshots = [getattr(r, "reason", "") for r in caplog.records if r.getMessage() == "snapshot starting"]
    assert snapshots[0] == "no checkpoint yet"
    assert len(snapshots) == 4 and all(s.startswith("change tracking expired: ") for s in snapshots[1:])
    assert set(await rig.documents()) == {"1"}
