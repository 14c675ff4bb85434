"""Which tables this sidecar runs: leases, fair share, rotation, give-back.

One ``round()`` (the daemon runs one every ``lease_ttl / 3``)::

    check the epoch        Redis restarted empty: re-snapshot what we own
    check for a failover   behind sentinels or on a cluster, a new primary: unless durable,
                           ask for a snapshot of every table through Redis
    stay registered        so that other sidecars count us in their fair share
    renew leases           a lease lost stops its tracker at once
    place tables           the policy takes free tables and gives some back
    forward requests       ``cdc snapshot`` (or a failover) asks the owner through Redis

``reap()`` collects trackers that ended: caught up (``TakeAll``), their lease
lost, or (``TakeAll`` only: ``cdc run --once`` fails fast) failed, raised so
that the sidecar exits with the error's code. Under ``FairShare`` a table's
failure never ends its tracker: it is degraded and retries. The policy is
chosen once:

    FairShare   ``cdc run``: hold ceil(tables / live sidecars) tables and
                give back the rest, so that sidecars spread the tables
    TakeAll     ``cdc run --once``: take every table (waiting for a dead
                owner's lease to run out, skipping one a live sidecar keeps)
                and finish when each has caught up
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Protocol

from cdc import snapshot_range
from cdc.errors import CdcError, LeaseLost, TransientError
from cdc.pipeline import Pipeline
from cdc.tracker import ChangeTracker
from publishers import control
from publishers.failover import FailoverWatch
from publishers.leases import Leases

log = logging.getLogger("cdc.balancer")

FAILED_OVER = "Redis failed over"  # the reason of the snapshots a failover asks for


class Policy(Protocol):
    until_caught_up: bool  # trackers stop once caught up, instead of following

    def finished(self, balancer: Balancer) -> bool: ...

    async def place(self, balancer: Balancer, free: list[ChangeTracker]) -> None: ...


class FairShare:
    """Hold a fair share of the tables; give back beyond it, take up to it."""

    until_caught_up = False

    def finished(self, balancer: Balancer) -> bool:
        return False

    async def place(self, balancer: Balancer, free: list[ChangeTracker]) -> None:
        fair = -(-len(balancer.trackers) // await balancer.live_sidecars())
        for table in list(balancer.running)[fair:]:
            await balancer.give_back(table)
        for tracker in free:
            if len(balancer.running) >= fair:
                break
            await balancer.take(tracker)


class TakeAll:
    """Take every table; finished when each has caught up or was skipped.

    A table still leased after ``patience`` seconds (a dead owner's lease runs
    out well before) is held by a live sidecar: skipped, with a warning."""

    until_caught_up = True

    def __init__(self, patience: float) -> None:
        self.give_up_at = time.monotonic() + patience

    def finished(self, balancer: Balancer) -> bool:
        return all(t.table in balancer.done for t in balancer.trackers)

    async def place(self, balancer: Balancer, free: list[ChangeTracker]) -> None:
        for tracker in free:
            if await balancer.take(tracker) or time.monotonic() <= self.give_up_at:
                continue
            owner = await balancer.leases.holder(tracker.table)
            log.warning(
                "table owned by a live sidecar: skipped", extra={"table": tracker.table, "owner": owner}
            )
            balancer.done.add(tracker.table)


class Balancer:
    def __init__(
        self,
        pipeline: Pipeline,
        worker_id: str,
        lease_ttl: float,
        *,
        register: Callable[[], Awaitable[None]],
        policy: Policy | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.worker_id = worker_id
        self.lease_ttl = lease_ttl
        self.policy: Policy = policy or FairShare()
        self._register = register  # writes this sidecar's heartbeat whole
        self.running: dict[str, asyncio.Task[None]] = {}  # table -> its tracker, while we hold its lease
        # table -> its tracker's task, cancelled on a lost lease and not ended yet
        self.stopping: dict[str, asyncio.Task[None]] = {}
        self.done: set[str] = set()  # tables finished (TakeAll) or skipped
        self.last_round = time.monotonic()  # when a round was last tried (liveness)
        self._leases: Leases | None = None
        self._epoch = ""
        self._leases_wiped = False  # Redis lost its data: our leases are to be taken again
        self._failover: FailoverWatch | None = None  # publishers.failover
        self._repair_due = False  # a failover's snapshot requests not written yet

    @property
    def leases(self) -> Leases:
        assert self._leases is not None, "start() creates the leases"
        return self._leases

    @property
    def trackers(self) -> list[ChangeTracker]:
        return self.pipeline.trackers

    @property
    def finished(self) -> bool:
        return self.policy.finished(self)

    def owned(self) -> list[ChangeTracker]:
        return [t for t in self.trackers if t.table in self.running]

    async def start(self) -> None:
        """The leases, and the epoch that tells a Redis restarted empty."""
        self._leases = Leases(self.pipeline.manager, self.worker_id, self.lease_ttl)
        self._epoch = await control.epoch(self.pipeline.manager)
        self._failover = FailoverWatch(self.pipeline.manager)
        await self._failover.start()

    # -- one round ----------------------------------------------------------------

    async def round(self) -> None:
        """(Every round is also what tells ``cdc_up{component="redis"}`` while the sidecar is idle.)"""
        self.last_round = time.monotonic()
        await self.pipeline.redis.observe(self._round())

    async def _round(self) -> None:
        await self._check_epoch()
        await self._retake_wiped_leases()
        await self._check_failover()
        await self._request_repair()
        await self._stay_registered()
        await self._renew()
        self._forget_stopped()
        busy = self.running.keys() | self.stopping.keys() | self.done
        free = [t for t in self._rotated() if t.table not in busy]
        await self.policy.place(self, free)
        await self._forward_snapshot_requests()  # to the tables just taken too

    async def _check_epoch(self) -> None:
        """Redis restarted empty: every document and checkpoint is gone, so
        every table this sidecar owns is snapshotted again."""
        current = await control.epoch(self.pipeline.manager)
        if current == self._epoch:
            return
        log.error("Redis lost its data (restarted empty?): re-snapshotting every table")
        self._epoch = current
        self.pipeline.manager.forget_registrations()
        for tracker in self.owned():
            tracker.request_snapshot("Redis lost its data")
        self._leases_wiped = True

    async def _retake_wiped_leases(self) -> None:
        """The wipe took the leases too: take them again at once, before
        ``_renew`` finds them gone and cancels the trackers in the middle of
        the snapshots just asked for. The trackers keep writing with their
        token: the counter restarted from the clock, so the new token is
        higher, and any later owner's is higher still (still fenced out)."""
        if not self._leases_wiped:
            return
        for table in list(self.running):
            if await self.leases.acquire(table) is None:
                log.warning(
                    "table taken by another sidecar after Redis lost its data", extra={"table": table}
                )
        self._leases_wiped = False  # only now: a round that failed above tries again

    async def _check_failover(self) -> None:
        """Behind sentinels or on a cluster, a new primary: re-read what it
        may lack (``publishers.failover``)."""
        watch = self._failover
        changed = None if watch is None else await watch.check()
        if watch is None or changed is None:
            return
        if not watch.repair_needed:
            log.warning(
                "Redis failed over to a new primary; redis.durability: every applied change was on the replicas",
                extra={"failover": changed},
            )
            return
        log.error(
            "Redis failed over to a new primary, which may lack the old one's last writes: "
            "re-snapshotting every table",
            extra={"failover": changed},
        )
        self.pipeline.manager.forget_registrations()
        self._repair_due = True  # written by _request_repair, next in the round

    async def _request_repair(self) -> None:
        """Ask, through Redis, for a snapshot of every table of the config:
        whoever owns each (this sidecar's forward below, this round; another
        sidecar's, which may not see this failover: its watch may have started
        after it; the next owner of a table nobody runs, or whose lease the
        failover took) snapshots it whole, from the start. Tried again each
        round until written."""
        if self._repair_due:
            await control.request_failover_snapshots(self.pipeline.manager, [t.table for t in self.trackers])
            self._repair_due = False

    async def _stay_registered(self) -> None:
        if not await control.keep_alive(self.pipeline.manager, self.worker_id, self.lease_ttl):
            await self._register()  # gone (first round, or Redis lost it): write it whole

    async def _forward_snapshot_requests(self) -> None:
        owned = self.owned()
        requested = await control.snapshot_requests(self.pipeline.manager, [t.table for t in owned])
        for tracker in owned:
            stored = requested.get(tracker.table)
            if stored is None:
                continue
            failover = stored.startswith(control.FAILOVER_REQUEST)
            reason = FAILED_OVER if failover else snapshot_range.REQUESTED
            tracker.request_snapshot(reason, stored=stored, distrust=failover)

    async def _renew(self) -> None:
        renewed = await self.leases.renew_all(list(self.running))
        for table, ours in renewed.items():
            if not ours and table in self.running:
                log.warning(
                    "lease lost: it ran out (Redis unreachable, process paused) or another sidecar took it",
                    extra={"table": table},
                )
                task = self.running.pop(table)
                task.cancel()
                self.stopping[table] = task

    def _forget_stopped(self) -> None:
        """A cancelled tracker's task unwinds at its next turn (its page
        writer settles the page in flight, say): until it has ended, the
        table is not taken again, or two runs of the one tracker would share
        its position, fence and snapshot state."""
        for table, task in list(self.stopping.items()):
            if task.done():
                del self.stopping[table]

    def _rotated(self) -> list[ChangeTracker]:
        """The tables in an order that differs per sidecar, so that sidecars
        starting together reach for different tables first."""
        start = zlib.crc32(self.worker_id.encode()) % max(1, len(self.trackers))
        return self.trackers[start:] + self.trackers[:start]

    async def live_sidecars(self) -> int:
        """Sidecars whose registration lives. Each one refreshes it with
        the lease TTL at every round, so a dead sidecar stops counting when
        its leases run out and the survivors' fair share covers its tables."""
        return len(await control.live_workers(self.pipeline.manager) | {self.worker_id})

    # -- taking and giving back -----------------------------------------------------

    async def take(self, tracker: ChangeTracker) -> bool:
        token = await self.leases.acquire(tracker.table)
        if token is None:
            return False
        await tracker.start(token)
        run = tracker.run(self.policy.until_caught_up)
        self.running[tracker.table] = asyncio.create_task(run, name=f"tracker {tracker.table}")
        log.info("table taken", extra={"table": tracker.table, "fence": token})
        return True

    async def give_back(self, table: str) -> None:
        """Stop the tracker cleanly (its checkpoint persisted), then release."""
        self.pipeline.tracker(table).stop_event.set()
        await asyncio.gather(self.running.pop(table), return_exceptions=True)
        await self.leases.release(table)
        log.info("table given back for balance", extra={"table": table})

    def reap(self) -> None:
        """Collect finished trackers: caught up (TakeAll), lease lost, or failed (TakeAll)."""
        for table, task in list(self.running.items()):
            if not task.done():
                continue
            del self.running[table]
            error = None if task.cancelled() else task.exception()
            if isinstance(error, LeaseLost):
                log.warning("lease lost while writing", extra={"table": table, "error": str(error)})
            elif error is not None:
                raise error
            else:
                self.done.add(table)

    # -- stopping (the daemon's ordered shutdown calls these in this order) ----------

    async def stop_trackers(self) -> None:
        """Stop polling; the tables stay ``running`` until flushed and released."""
        for task in self.running.values():
            task.cancel()
        await asyncio.gather(*self.running.values(), *self.stopping.values(), return_exceptions=True)
        self.stopping.clear()

    async def flush(self) -> None:
        """Persist the checkpoint of what was applied (after the applier's flush)."""
        for tracker in self.owned():
            try:
                await tracker.checkpoints.flush()  # everything applied so far
            except CdcError as exc:
                log.error("could not persist checkpoint", extra={"table": tracker.table, "error": str(exc)})

    async def release_all(self) -> None:
        if self._leases is None:
            return
        for table in list(self._leases.tokens):
            try:
                await self._leases.release(table)
            except TransientError:
                pass  # it runs out by itself
