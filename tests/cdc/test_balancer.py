"""The table balancer against a real Redis, with stand-in trackers: leases
spread the tables fairly, a table beyond the fair share is given back, a dead
owner's tables are taken once its leases run out, and ``TakeAll`` finishes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from cdc.balancer import Balancer, TakeAll
from cdc.config import RedisConfig
from cdc.metrics import Metrics
from cdc.reachability import redis_component
from publishers import control
from publishers.leases import Leases
from publishers.manager import DataManager

TTL = 0.5  # seconds: short leases keep these tests fast


class StandInTracker:
    """What the balancer asks of a tracker, and nothing more."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.fence = 0
        self.stop_event = asyncio.Event()
        self.snapshot_requests: list[str] = []
        self.stored_requests: list[str] = []
        self.distrusted = False  # a request asked it to start over (a failover)

    async def start(self, fence: int = 0) -> None:
        self.fence = fence
        self.stop_event = asyncio.Event()

    async def run(self, until_caught_up: bool = False) -> None:
        if not until_caught_up:  # a stand-in is always caught up
            await self.stop_event.wait()

    def request_snapshot(self, reason: str, *, stored: str | None = None, distrust: bool = False) -> None:
        if stored is not None and stored in self.stored_requests:
            return  # (the real tracker: the stored request its snapshot serves)
        self.snapshot_requests.append(reason)
        self.stored_requests += [stored] if stored is not None else []
        self.distrusted = self.distrusted or distrust

    async def flush(self) -> None:
        pass


class StandInPipeline:
    def __init__(self, manager: DataManager, tables: list[str]) -> None:
        self.manager = manager
        self.trackers = [StandInTracker(table) for table in tables]
        self.redis = redis_component(Metrics())  # each round tells it whether Redis answers

    def tracker(self, table: str) -> StandInTracker:
        return next(t for t in self.trackers if t.table == table)


@pytest.fixture
async def manager(redis_url: str, namespace: str) -> AsyncIterator[DataManager]:
    client = aioredis.Redis.from_url(redis_url)
    yield DataManager(client, RedisConfig(url=redis_url, namespace=namespace))
    await client.aclose()


TABLES = [f"s.t{i}" for i in range(6)]


async def make_balancer(
    manager: DataManager, worker_id: str, tables: list[str] = TABLES, **kwargs: object
) -> Balancer:
    async def register() -> None:
        await manager.heartbeat(worker_id, {"tables": ""}, ttl=TTL)

    pipeline = StandInPipeline(manager, tables)
    balancer = Balancer(pipeline, worker_id, TTL, register=register, **kwargs)  # type: ignore[arg-type]
    await balancer.start()
    return balancer


async def holders(manager: DataManager, tables: list[str] = TABLES) -> dict[str, str]:
    return await control.table_owners(manager, tables)


async def until(condition, seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_three_balancers_share_six_tables_two_each(manager: DataManager) -> None:
    balancers = [await make_balancer(manager, f"w{i}") for i in range(3)]

    async def fair() -> bool:
        for balancer in balancers:
            await balancer.round()
        return all(len(b.running) == 2 for b in balancers)

    try:
        await until(fair, 5, "two tables each")
        running = [table for b in balancers for table in b.running]
        assert sorted(running) == TABLES, "a table runs twice, or not at all"
        owners = await holders(manager)
        assert {owners[table] for table in balancers[1].running} == {"w1"}
    finally:
        for balancer in balancers:
            await balancer.stop_trackers()


async def test_a_table_beyond_the_fair_share_is_given_back(manager: DataManager) -> None:
    first = await make_balancer(manager, "first")
    await first.round()  # alone: it takes everything
    assert sorted(first.running) == TABLES
    second = await make_balancer(manager, "second")
    try:
        await second.round()  # registers; every table is still held
        assert not second.running
        await first.round()  # two live sidecars now: it keeps three
        assert len(first.running) == 3
        given_back = [t for t in first.trackers if t.table not in first.running]
        assert all(t.stop_event.is_set() for t in given_back), "given back without stopping its tracker"
        assert set(await holders(manager)) == set(first.running), "a lease given back is still held"
        await second.round()
        assert sorted([*first.running, *second.running]) == TABLES
    finally:
        await first.stop_trackers()
        await second.stop_trackers()


async def test_a_dead_owners_tables_are_taken_once_its_leases_run_out(manager: DataManager) -> None:
    dead = await make_balancer(manager, "dead")
    await dead.round()
    await dead.stop_trackers()  # it dies: no release, no more renewals
    survivor = await make_balancer(manager, "survivor")
    died_at = time.monotonic()

    async def took_all() -> bool:
        await survivor.round()
        return sorted(survivor.running) == TABLES

    try:
        await until(took_all, 5, "the survivor to take every table")
        assert time.monotonic() - died_at <= TTL + 1.0
        assert set((await holders(manager)).values()) == {"survivor"}
    finally:
        await survivor.stop_trackers()


async def test_a_lease_lost_stops_its_tracker(manager: DataManager) -> None:
    balancer = await make_balancer(manager, "w", tables=["s.a"])
    try:
        await balancer.round()
        task = balancer.running["s.a"]
        await manager.client.delete(manager.layout.lease("s.a"))  # ran out while we were paused
        await Leases(manager, "other", ttl=60).acquire("s.a")
        await balancer.round()
        assert "s.a" not in balancer.running
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
    finally:
        await balancer.stop_trackers()


class SlowToStopTracker(StandInTracker):
    """A tracker whose cancelled run still has work to finish (a snapshot's
    page writer settling the page in flight), and that counts its runs."""

    def __init__(self, table: str) -> None:
        super().__init__(table)
        self.runs = 0
        self.most_runs = 0
        self.unwound = asyncio.Event()

    async def run(self, until_caught_up: bool = False) -> None:
        self.runs += 1
        self.most_runs = max(self.most_runs, self.runs)
        try:
            await self.stop_event.wait()
        finally:
            await self.unwound.wait()
            self.runs -= 1


async def test_a_table_whose_lease_was_lost_is_taken_again_only_once_its_tracker_stopped(
    manager: DataManager,
) -> None:
    """Redis restarted empty takes every lease with it: the balancer cancels
    its trackers and may take the tables again at once, but not while a
    cancelled run still unwinds: both runs would share one tracker's
    position, fence and snapshot state (a CI run lost four rows so)."""
    balancer = await make_balancer(manager, "w", tables=["s.a"])
    tracker = SlowToStopTracker("s.a")
    balancer.pipeline.trackers[:] = [tracker]  # type: ignore[index]
    try:
        await balancer.round()
        first = balancer.running["s.a"]
        await manager.client.delete(manager.layout.lease("s.a"))  # gone with the data
        await balancer.round()  # lost, cancelled: still unwinding
        await balancer.round()
        assert "s.a" not in balancer.running, "taken again while its cancelled run still unwinds"
        tracker.unwound.set()
        await asyncio.gather(first, return_exceptions=True)
        await balancer.round()
        assert "s.a" in balancer.running, "not taken again once its run ended"
        assert tracker.most_runs == 1, "two runs of one tracker at once"
    finally:
        tracker.unwound.set()
        await balancer.stop_trackers()


async def _done(balancer: Balancer, table: str) -> bool:
    await asyncio.sleep(0)
    return table not in balancer.stopping or balancer.stopping[table].done()


class StandInFailoverWatch:
    """A failover without redis.durability, seen at the next check (the real
    watches need Sentinel or a Cluster: tests/cdc/test_failover.py and
    test_cluster_failover.py)."""

    repair_needed = True

    def __init__(self) -> None:
        self.pending = True

    async def check(self) -> str | None:
        seen, self.pending = self.pending, False
        return "a new primary" if seen else None


async def test_a_failover_repairs_a_table_whose_lease_it_took(manager: DataManager) -> None:
    """The failover took the lease with the failed node: the tracker is
    cancelled and still unwinding when the failover is seen. It must be
    repaired too, or, taken again from its stored checkpoint (which may be
    ahead of the documents the failover lost), it would never be."""
    balancer = await make_balancer(manager, "w", tables=["s.a"])
    tracker = SlowToStopTracker("s.a")
    balancer.pipeline.trackers[:] = [tracker]  # type: ignore[index]
    try:
        await balancer.round()
        await manager.client.delete(manager.layout.lease("s.a"))  # lost with the failed node
        await balancer.round()
        assert "s.a" in balancer.stopping
        balancer._failover = StandInFailoverWatch()  # type: ignore[assignment]
        await balancer.round()
        tracker.unwound.set()
        await until(lambda: _done(balancer, "s.a"), 5, "the cancelled run to end")
        await balancer.round()  # taken again: the stored request reaches it
        assert "s.a" in balancer.running
        assert tracker.snapshot_requests == ["Redis failed over"] and tracker.distrusted
    finally:
        tracker.unwound.set()
        await balancer.stop_trackers()


async def test_a_failover_asks_for_a_snapshot_of_the_tables_other_sidecars_run(manager: DataManager) -> None:
    """A sidecar that sees the failover asks, through Redis, for a snapshot of
    every table: another sidecar's (which may not see this failover: its
    watch may have started after it) and one nobody runs, whose checkpoint
    may be ahead of documents the failover lost too."""
    seeing = await make_balancer(manager, "seeing", tables=["s.a", "s.b"])
    other = await make_balancer(manager, "other", tables=["s.a", "s.b"])
    try:
        await other.round()  # takes both tables: alone so far
        assert set(other.running) == {"s.a", "s.b"}
        seeing._failover = StandInFailoverWatch()  # type: ignore[assignment]
        for _ in range(3):  # "other" gives one table back to "seeing", which takes it
            await seeing.round()
            await other.round()
        assert set(other.running) | set(seeing.running) == {"s.a", "s.b"}
        for table in ("s.a", "s.b"):
            owner = other if table in other.running else seeing
            tracker = owner.pipeline.tracker(table)
            # forwarded every round until served: one snapshot
            assert tracker.snapshot_requests == ["Redis failed over"] and tracker.distrusted, table  # type: ignore[attr-defined]
        assert other.running, "the sidecar that did not see the failover runs a table"
    finally:
        await seeing.stop_trackers()
        await other.stop_trackers()


async def test_a_snapshot_request_reaches_the_owners_tracker(manager: DataManager) -> None:
    balancer = await make_balancer(manager, "w", tables=["s.a"])
    try:
        await balancer.round()
        await control.request_snapshot(manager, "s.a")
        await balancer.round()
        assert balancer.pipeline.tracker("s.a").snapshot_requests == ["requested by cdc snapshot"]  # type: ignore[attr-defined]
    finally:
        await balancer.stop_trackers()


async def test_take_all_finishes_and_skips_a_table_a_live_sidecar_keeps(manager: DataManager) -> None:
    await Leases(manager, "live", ttl=60).acquire("s.t0")
    balancer = await make_balancer(manager, "once", policy=TakeAll(patience=0.3))

    async def finished() -> bool:
        balancer.reap()
        if balancer.finished:
            return True
        await balancer.round()
        return False

    await until(finished, 5, "TakeAll to finish")
    assert balancer.done == set(TABLES) and not balancer.running
    assert balancer.pipeline.tracker("s.t0").fence == 0, "took a table a live sidecar holds"  # type: ignore[attr-defined]
    assert all(t.fence > 0 for t in balancer.trackers if t.table != "s.t0")
    await balancer.release_all()
    assert set(await holders(manager)) == {"s.t0"}, "finished tables' leases are released"
