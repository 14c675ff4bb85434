"""The sidecar's lifecycle, which reads like its table of contents::

    await daemon.startup()     connect source and Redis, describe every table,
                               start the batch worker, the health server and
                               the housekeeping scheduler
    await daemon.main_loop()   run one ChangeTracker per table (and the
                               wake-up listener) until asked to stop, or, with
                               ``once``, until every table has caught up
    await daemon.shutdown()    ordered and bounded: stop polling, flush the
                               batch queue, persist checkpoints, close

Signal handlers only set state (``request_stop``); a second SIGINT forces the
process out. Dependencies are injected so the tests run this very loop against
real servers: ``Daemon(config, source=..., manager=...)``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from cdc.batching import AutoBatchWorker
from cdc.config import Config
from cdc.errors import CdcError, LeaseLost, TrackingNotEnabled, TransientError
from cdc.health import HealthServer
from cdc.metrics import Metrics
from cdc.sources import make_source
from cdc.sources.base import ChangeSource
from cdc.tracker import ChangeTracker
from publishers import control
from publishers.leases import Leases
from publishers.manager import DataManager
from publishers.model import ApplyResult, Change

log = logging.getLogger("cdc.daemon")

SHUTDOWN_TIMEOUT = 30.0  # seconds the ordered shutdown may take before giving up


class Daemon:
    def __init__(
        self,
        config: Config,
        *,
        source: ChangeSource | None = None,
        manager: DataManager | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.config = config
        self.source = source or make_source(config.source)
        self._manager = manager
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.metrics = Metrics()
        self.stop_event = asyncio.Event()
        self.trackers: list[ChangeTracker] = []
        self.worker = AutoBatchWorker(
            self._apply,
            max_batch_size=config.worker.max_batch_size,
            max_wait=config.worker.max_wait,
            capacity=config.worker.queue_capacity,
            on_result=self._on_result,
            on_degraded=self._on_redis_degraded,
        )
        self.redis_error: str | None = None
        self.health: HealthServer | None = None
        self.scheduler: AsyncIOScheduler | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._running: dict[str, asyncio.Task[None]] = {}  # table -> its tracker, while we hold its lease
        self._done: set[str] = set()  # tables finished (--once) or skipped
        self.leases: Leases | None = None
        self._epoch = ""
        self._started = time.time()
        self._interrupts = 0

    @property
    def _leases(self) -> Leases:
        assert self.leases is not None, "startup() creates the leases"
        return self.leases

    @property
    def manager(self) -> DataManager:
        assert self._manager is not None, "startup() connects the data manager"
        return self._manager

    # -- table of contents -----------------------------------------------------

    async def run(self, once: bool = False) -> None:
        """startup(), main_loop(), shutdown(): what ``cdc run`` does."""
        try:
            await self.startup()
            await self.main_loop(once=once)
        finally:
            await self.shutdown()

    async def startup(self) -> None:
        await self.startup_for_tools()
        self.metrics.up.labels("source").set(1)
        self.metrics.up.labels("redis").set(1)
        self.leases = Leases(self.manager, self.worker_id, self.config.worker.lease_ttl)
        self._epoch = await control.epoch(self.manager)
        await self._start_health()
        self._start_scheduler()
        log.info("sidecar started", extra={"worker": self.worker_id, "tables": len(self.trackers)})

    async def startup_for_tools(self) -> None:
        """Connections, described tables and the applier, without leases, health
        or housekeeping: for commands that drive trackers themselves."""
        await self.source.connect()
        if self._manager is None:
            self._manager = await DataManager.connect(self.config.redis)
        self.trackers = [self._tracker(table) for table in self.config.tables]
        for tracker in self.trackers:
            await tracker.prepare()
        await self._check_tracking()
        self.worker.start()

    async def _check_tracking(self) -> None:
        """A table whose changes are not tracked at all cannot be followed:
        refuse to start (exit 2, the table named) rather than snapshot it into
        Redis and fail at its first read. Tracking that is set up but impaired
        (PostgreSQL: a capture trigger not ENABLE ALWAYS) is logged, as
        ``cdc doctor`` reports it."""
        for status in await self.source.tracking_status(self.config.tables):
            if status.enabled:
                continue
            if status.min_valid_version is None:
                raise TrackingNotEnabled(f"{status.table}: {status.detail}")
            log.error("change tracking is impaired", extra={"table": status.table, "detail": status.detail})

    async def main_loop(self, once: bool = False) -> None:
        """Hold leases on a fair share of the tables and run their trackers.

        Every ``lease_ttl / 3``: renew the leases held (a lost one stops its
        tracker), give back tables beyond the fair share (tables / live
        sidecars) so that other sidecars can take them, and take free ones up
        to it. With ``once``: take every table (waiting for a dead owner's
        lease to run out) and return when each has caught up."""
        if not once:
            self._tasks.append(asyncio.create_task(self._listen_for_changes(), name="wake-up listener"))
        give_up_at = time.monotonic() + 3 * self.config.worker.lease_ttl
        while not self.stop_event.is_set():
            self._check_applier()
            self._reap()
            if once and all(t.table in self._done for t in self.trackers):
                return
            try:
                await self._balance(once, give_up_at)
            except TransientError as exc:
                log.warning("lease upkeep failed, retrying", extra={"error": str(exc)})
            await self._pause(self.config.worker.lease_ttl / 3)

    async def _balance(self, once: bool, give_up_at: float) -> None:
        await self._check_epoch()
        if not await control.keep_alive(self.manager, self.worker_id, self.config.worker.lease_ttl):
            await self._heartbeat()  # gone (first round, or Redis lost it): write it whole
        running = [t for t in self.trackers if t.table in self._running]
        requested = await control.snapshot_requests(self.manager, [t.table for t in running])
        for tracker in running:
            if tracker.table in requested:
                tracker.request_snapshot("requested by cdc snapshot")
        renewed = await self._leases.renew_all(list(self._running))
        for table, ours in renewed.items():
            if not ours and table in self._running:
                log.warning(
                    "lease lost: it ran out (Redis unreachable, process paused) or another sidecar took it",
                    extra={"table": table},
                )
                self._running.pop(table).cancel()
        free = [t for t in self._rotated() if t.table not in self._running and t.table not in self._done]
        if once:
            for tracker in free:
                if not await self._take(tracker, once) and time.monotonic() > give_up_at:
                    owner = await self._leases.holder(tracker.table)
                    log.warning(
                        "table owned by a live sidecar: skipped",
                        extra={"table": tracker.table, "owner": owner},
                    )
                    self._done.add(tracker.table)
            return
        fair = -(-len(self.trackers) // await self._live_sidecars())
        for table in list(self._running)[fair:]:
            await self._give_back(table)
        for tracker in free:
            if len(self._running) >= fair:
                break
            await self._take(tracker, once)

    async def _take(self, tracker: ChangeTracker, once: bool) -> bool:
        token = await self._leases.acquire(tracker.table)
        if token is None:
            return False
        await tracker.start(token)
        self._running[tracker.table] = asyncio.create_task(tracker.run(once), name=f"tracker {tracker.table}")
        log.info("table taken", extra={"table": tracker.table, "fence": token})
        return True

    async def _give_back(self, table: str) -> None:
        """Stop the tracker cleanly (its checkpoint persisted), then release."""
        tracker = next(t for t in self.trackers if t.table == table)
        tracker.stop_event.set()
        await asyncio.gather(self._running.pop(table), return_exceptions=True)
        await self._leases.release(table)
        log.info("table given back for balance", extra={"table": table})

    def _reap(self) -> None:
        """Collect finished trackers: caught up (once), or failed for good."""
        for table, task in list(self._running.items()):
            if not task.done():
                continue
            del self._running[table]
            error = None if task.cancelled() else task.exception()
            if isinstance(error, LeaseLost):
                log.warning("lease lost while writing", extra={"table": table, "error": str(error)})
            elif error is not None:
                raise error
            else:
                self._done.add(table)

    def _check_applier(self) -> None:
        task = self.worker.task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake for a stop request or a tracker that finished."""
        stopper = asyncio.ensure_future(self.stop_event.wait())
        waiters: set[asyncio.Future[Any]] = {stopper, *self._running.values()}
        if self.worker.task is not None:
            waiters.add(self.worker.task)
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()

    def _rotated(self) -> list[ChangeTracker]:
        """The tables in an order that differs per sidecar, so that sidecars
        starting together reach for different tables first."""
        start = zlib.crc32(self.worker_id.encode()) % max(1, len(self.trackers))
        return self.trackers[start:] + self.trackers[:start]

    async def _live_sidecars(self) -> int:
        """Sidecars whose registration lives. Each one refreshes it with
        the lease TTL at every round, so a dead sidecar stops counting when
        its leases run out and the survivors' fair share covers its tables."""
        return len(await control.live_workers(self.manager) | {self.worker_id})

    async def shutdown(self) -> None:
        """Stop polling, flush the queue, persist checkpoints, close. Bounded."""
        self.stop_event.set()
        try:
            await asyncio.wait_for(self._ordered_shutdown(), SHUTDOWN_TIMEOUT)
        except TimeoutError:
            log.error("shutdown timed out; unflushed changes will be re-read on restart")
        finally:
            await self.close()

    # -- pieces ----------------------------------------------------------------

    def request_stop(self, signum: int | None = None) -> None:
        """Signal handler: first time, stop gracefully; a second SIGINT forces exit."""
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts > 1:
                log.error("second interrupt: exiting now")
                os._exit(130)
        log.info("stop requested", extra={"signal": signum})
        self.stop_event.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.request_stop, signum)

    def _tracker(self, table: Any) -> ChangeTracker:
        return ChangeTracker(
            table,
            source=self.source,
            manager=self.manager,
            worker=self.worker,
            metrics=self.metrics,
            page_size=self.config.worker.page_size,
            max_row_bytes=self.config.worker.max_row_bytes,
        )

    async def _ordered_shutdown(self) -> None:
        tasks = [*self._tasks, *self._running.values()]
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.worker.stop()
        for table in list(self._running):
            tracker = next(t for t in self.trackers if t.table == table)
            try:
                await tracker.flush()
            except CdcError as exc:
                log.error("could not persist checkpoint", extra={"table": table, "error": str(exc)})
        if self.leases is not None:
            for table in list(self.leases.tokens):
                try:
                    await self.leases.release(table)
                except TransientError:
                    pass  # it runs out by itself
        if self._manager is not None:
            try:
                await control.remove_heartbeat(self.manager, self.worker_id)
            except TransientError:
                pass  # it expires by itself

    async def close(self) -> None:
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        if self.health is not None:
            await self.health.stop()
        await self.source.close()
        if self._manager is not None:
            await self._manager.close()

    async def _apply(self, changes: Sequence[Change]) -> ApplyResult:
        return await self.manager.apply(changes)

    def _on_result(self, changes: Sequence[Change], result: ApplyResult, latency: float) -> None:
        for table, count in Counter(change.table for change in changes).items():  # one label lookup per table
            self.metrics.changes_applied.labels(table).inc(count)
        for rejected in result.rejected:
            self.metrics.dead_lettered.labels(rejected.change.table).inc()
        if result.fenced:  # their trackers stop at their next checkpoint (LeaseLost)
            log.warning(
                "changes refused (FENCED): another sidecar owns their table now",
                extra={"tables": sorted({c.table for c in result.fenced}), "changes": len(result.fenced)},
            )
        self.metrics.changes_published.inc(result.published)
        self.metrics.batch_size.observe(len(changes))
        self.metrics.apply_latency.observe(latency)
        self.metrics.queue_depth.set(self.worker.depth)

    def _on_redis_degraded(self, error: BaseException | None) -> None:
        self.redis_error = None if error is None else str(error)
        self.metrics.up.labels("redis").set(0 if error else 1)

    async def _listen_for_changes(self) -> None:
        """Wake trackers as soon as the source says their table changed."""
        by_name = {t.table.lower(): t for t in self.trackers}
        while not self.stop_event.is_set():
            try:
                tables = await self.source.wait_for_changes(1.0)
            except TransientError:
                await asyncio.sleep(1.0)
                continue
            for name in tables:
                tracker = by_name.get(name.lower())
                if tracker is not None:
                    tracker.wake.set()

    # -- health and housekeeping ---------------------------------------------

    def healthz(self) -> tuple[bool, dict[str, object]]:
        degraded = {t.table: t.error for t in self.trackers if t.error}
        ok = self.redis_error is None and not degraded
        return ok, {"redis": self.redis_error or "ok", "tables": degraded or "ok"}

    def readyz(self) -> tuple[bool, dict[str, object]]:
        owned = [t for t in self.trackers if t.table in self._running]
        waiting = [t.table for t in owned if not t.caught_up.is_set()]
        healthy, detail = self.healthz()
        return healthy and not waiting, {**detail, "catching_up": waiting}

    async def _start_health(self) -> None:
        if self.config.worker.health is None:
            return
        host, port = self.config.worker.health
        self.health = HealthServer(
            host, port, healthz=self.healthz, readyz=self.readyz, metrics=self._render_metrics
        )
        await self.health.start()

    def _render_metrics(self) -> bytes:
        self.metrics.queue_depth.set(self.worker.depth)
        return self.metrics.render()

    def _start_scheduler(self) -> None:
        self.scheduler = AsyncIOScheduler()
        self.scheduler.add_job(
            self._heartbeat, "interval", seconds=self.config.worker.heartbeat, next_run_time=_now()
        )
        self.scheduler.add_job(self._refresh_metrics, "interval", seconds=1.0)
        interval = self.config.source.cleanup_interval
        if self.config.source.kind == "postgres" and interval > 0:
            self.scheduler.add_job(self._cleanup, "interval", seconds=interval)
        self.scheduler.start()

    async def _heartbeat(self) -> None:
        fields: dict[str, str] = {
            "tables": ",".join(self._running),
            "started_at": str(int(self._started)),
            "heartbeat_at": f"{time.time():.3f}",
            "queue_depth": str(self.worker.depth),
            "applied": str(self.worker.stats.changes),
            "batches": str(self.worker.stats.batches),
        }
        for tracker in (t for t in self.trackers if t.table in self._running):
            fields[f"state:{tracker.table}"] = tracker.state
            fields[f"applied:{tracker.table}"] = str(tracker.applied)
        try:
            await self.manager.heartbeat(self.worker_id, fields, ttl=self.config.worker.lease_ttl)
        except TransientError as exc:
            log.warning("heartbeat failed", extra={"error": str(exc)})

    async def _refresh_metrics(self) -> None:
        """Gauges that nothing else moves while a table is idle or stuck."""
        self.metrics.queue_depth.set(self.worker.depth)
        for tracker in self.trackers:
            if tracker.table in self._running:
                tracker.refresh_metrics()

    async def _check_epoch(self) -> None:
        """Redis restarted empty: every document and checkpoint is gone, so
        every table this sidecar owns is snapshotted again."""
        current = await control.epoch(self.manager)
        if current == self._epoch:
            return
        log.error("Redis lost its data (restarted empty?): re-snapshotting every table")
        self._epoch = current
        for tracker in self.trackers:
            if tracker.table in self._running:
                tracker.request_snapshot("Redis lost its data")

    async def _cleanup(self) -> None:
        try:
            deleted = await self.source.cleanup(self.config.source.retention)
            log.info("tracking cleanup", extra={"deleted": deleted})
        except TransientError as exc:
            log.warning("tracking cleanup failed", extra={"error": str(exc)})


def _now() -> Any:
    import datetime as dt

    return dt.datetime.now(dt.UTC)
