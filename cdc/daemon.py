"""The sidecar's lifecycle, which reads like its table of contents::

    await daemon.startup()     bind the health address, open the pipeline
                               (source, Redis, every table described, the
                               batch worker), the leases, serve health, start
                               the housekeeping scheduler
    await daemon.main_loop()   balance the tables' leases and run their
                               trackers (and the wake-up listener) until asked
                               to stop, or, with ``once``, until every table
                               has caught up
    await daemon.shutdown()    ordered and bounded: stop polling, flush the
                               batch queue, persist checkpoints, close

The pieces: ``Pipeline`` (the data path), ``Balancer`` (which tables this
sidecar runs), ``Observer`` (health, readiness, metrics, heartbeat fields).
Signal handlers only set state (``request_stop``); a second SIGINT forces the
process out. SIGHUP is a graceful stop, logged, not a reload: adding and
removing tables in a running sidecar would go through the pipeline and the
balancer, and a restart by the supervisor does it already with the same
guarantees (leases released at the stop, taken again at the start).
Dependencies are injected so the tests run this very loop against real
servers: ``Daemon(config, source=..., manager=...)``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import signal
import socket
import uuid
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from tenacity import AsyncRetrying, RetryCallState, RetryError, retry_if_exception_type, wait_random

from cdc.balancer import Balancer, FairShare, Policy, TakeAll
from cdc.cleanup_job import CleanupJob
from cdc.config import Config
from cdc.errors import CdcError, ConfigError, TransientError
from cdc.health import HealthServer
from cdc.observers import SLOW_REFRESH, Observer
from cdc.pipeline import Pipeline
from cdc.sources.base import ChangeSource
from publishers import control, deadletters
from publishers.manager import DataManager

log = logging.getLogger("cdc.daemon")

SHUTDOWN_TIMEOUT = 30.0  # seconds the ordered shutdown may take before giving up
# Seconds between two checks of the owned tables' shapes at the source (one
# catalog query for all of them: ~1 ms on PostgreSQL): an added column, or a
# table dropped and created again, reaches the documents within seconds.
SHAPE_CHECK_INTERVAL = 2.0


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
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.pipeline = Pipeline(config, source=source, manager=manager)
        self.source = self.pipeline.source
        self.metrics = self.pipeline.metrics
        ttl = config.worker.lease_ttl
        self.balancer = Balancer(self.pipeline, self.worker_id, ttl, register=self._heartbeat)
        self.observer = Observer(self.pipeline, self.balancer)
        self.stop_event = asyncio.Event()
        self.health: HealthServer | None = None
        self.scheduler: AsyncIOScheduler | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._period = ttl / 3  # leases are renewed three times per TTL
        self._interrupts = 0
        self.cleanup_job = CleanupJob(config, self.pipeline)
        self.dead_letter_mark: str | None = None  # (--once) the dead letter's last id at the start

    @property
    def manager(self) -> DataManager:
        return self.pipeline.manager

    # -- table of contents -----------------------------------------------------

    async def run(self, once: bool = False) -> None:
        """startup(), main_loop(), shutdown(): what ``cdc run`` does."""
        try:
            await self.startup(strict=once)
            await self.main_loop(once=once)
        finally:
            await self.shutdown()

    async def startup(self, *, strict: bool = False) -> None:
        """``strict`` (``--once``): a table that cannot be followed fails the
        start-up; otherwise it starts degraded (``Pipeline.open``). The health
        address is bound first: a second sidecar given the same port stops
        there (exit 2), before it connects to anything or takes a lease."""
        await self._listen_health()
        await self.pipeline.open(strict=strict)  # cdc_up: every call to the source and Redis sets it
        if strict:
            self.dead_letter_mark = await deadletters.last_id(self.manager)
        await self.balancer.start()
        if self.health is not None:
            await self.health.start()
        self._start_scheduler()
        log.info("sidecar started", extra={"worker": self.worker_id, "tables": len(self.pipeline.trackers)})

    async def main_loop(self, once: bool = False) -> None:
        """Balance the leases every ``lease_ttl / 3`` and run the trackers of
        the tables held, until stopped or until the policy is finished.

        The lease round stays here rather than on the scheduler: it must wake
        as soon as a tracker ends (to take the table back or finish ``once``),
        and a tracker's failure must end the process, not a scheduler job."""
        self.balancer.policy = self._policy(once)
        if not self.balancer.policy.until_caught_up:
            self._tasks.append(
                asyncio.create_task(self.pipeline.listen(self.stop_event), name="wake-up listener")
            )
        while not self.stop_event.is_set():
            self.pipeline.check_applier()
            self.balancer.reap()
            if self.balancer.finished:
                return
            await self._lease_round()
            await self._pause(self._period)

    async def shutdown(self) -> None:
        """Stop polling, flush the queue, persist checkpoints, close. Bounded."""
        self.stop_event.set()
        try:
            await asyncio.wait_for(self._ordered_shutdown(), SHUTDOWN_TIMEOUT)
        except TimeoutError:
            log.error("shutdown timed out; unflushed changes will be re-read on restart")
        finally:
            await self.close()

    # -- signals ---------------------------------------------------------------

    def request_stop(self, signum: int | None = None) -> None:
        """Signal handler: first time, stop gracefully; a second SIGINT forces
        exit. SIGHUP stops gracefully too, saying that nothing is reloaded."""
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts > 1:
                log.error("second interrupt: exiting now")
                os._exit(130)
        if signum == signal.SIGHUP:
            log.warning(
                "SIGHUP: stopping gracefully; the config is not reloaded: restart the sidecar "
                "to apply a changed config (a supervisor that restarts it does)",
                extra={"signal": signum},
            )
        else:
            log.info("stop requested", extra={"signal": signum})
        self.stop_event.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(signum, self.request_stop, signum)

    # -- main loop's pieces ------------------------------------------------------

    def _policy(self, once: bool) -> Policy:
        # --once waits up to three TTLs for a dead owner's lease to run out
        return TakeAll(patience=3 * self.config.worker.lease_ttl) if once else FairShare()

    async def _lease_round(self) -> None:
        """One balancing round. Redis trouble is retried (jittered, a little
        sooner than the next round would come) until the round passes, or until
        the main loop has something else to do: a stop, a tracker that ended,
        the applier that died."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(TransientError),
            wait=wait_random(self._period / 2, self._period),
            stop=lambda _state: self._interrupted(),
            sleep=self._pause,
            before_sleep=_log_upkeep_failure,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    if not self._interrupted():
                        await self.balancer.round()
        except RetryError:
            pass  # interrupted while Redis was away: the main loop sees why

    def _interrupted(self) -> bool:
        worker = self.pipeline.worker.task
        return (
            self.stop_event.is_set()
            or any(task.done() for task in self.balancer.running.values())
            or (worker is not None and worker.done())
        )

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake for a stop request, a tracker that ended, or the applier's end."""
        stopper = asyncio.ensure_future(self.stop_event.wait())
        waiters: set[asyncio.Future[Any]] = {stopper, *self.balancer.running.values()}
        if self.pipeline.worker.task is not None:
            waiters.add(self.pipeline.worker.task)
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()

    # -- shutdown's pieces ---------------------------------------------------------

    async def _ordered_shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.balancer.stop_trackers()
        await self.pipeline.worker.stop()
        await self.balancer.flush()
        await self.balancer.release_all()
        await self._unregister()

    async def _unregister(self) -> None:
        try:
            if self.pipeline.has_redis:
                await control.remove_heartbeat(self.manager, self.worker_id)
        except TransientError:
            pass  # it expires by itself

    async def close(self) -> None:
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        if self.health is not None:
            await self.health.stop()
        await self.pipeline.disconnect()  # not the applier's flush: it may be what timed out

    # -- health ------------------------------------------------------------------

    def healthz(self) -> tuple[bool, dict[str, object]]:
        return self.observer.healthz()

    def readyz(self) -> tuple[bool, dict[str, object]]:
        return self.observer.readyz()

    async def _listen_health(self) -> None:
        """Bind ``worker.health``; a port in use, a host that does not resolve
        or is not this host's is the config's fault for this host: exit 2."""
        if self.config.worker.health is None:
            return
        host, port = self.config.worker.health
        observer = self.observer
        health = HealthServer(
            host, port, healthz=observer.healthz, readyz=observer.readyz, metrics=observer.render_metrics
        )
        try:
            await health.listen()
        except OSError as exc:
            raise ConfigError(f"{self.config.path}: worker.health: {health.listen_error(exc)}") from None
        self.health = health

    # -- housekeeping (every periodic job but the lease round is on the scheduler) --

    def _start_scheduler(self) -> None:
        # A run whose time came while the event loop was held up (CPU load) runs
        # late, once: apscheduler's default grace of 1 s skipped it with a
        # warning, and a skipped heartbeat could let the worker's key expire.
        self.scheduler = AsyncIOScheduler(job_defaults={"misfire_grace_time": None, "coalesce": True})
        now = dt.datetime.now(dt.UTC)
        self.scheduler.add_job(
            self._heartbeat, "interval", seconds=self.config.worker.heartbeat, next_run_time=now
        )
        self.scheduler.add_job(self.observer.refresh_metrics, "interval", seconds=1.0)
        self.scheduler.add_job(
            self.observer.refresh_slow_metrics, "interval", seconds=SLOW_REFRESH, next_run_time=now
        )
        self.scheduler.add_job(self._watch_shapes, "interval", seconds=SHAPE_CHECK_INTERVAL)
        interval = self.config.source.cleanup_interval
        if self.config.source.kind == "postgres" and interval > 0:
            # at once too: the deployment's retention claim protects its tables from the start
            self.scheduler.add_job(self._cleanup, "interval", seconds=interval, next_run_time=now)
        self.scheduler.start()

    async def _heartbeat(self) -> None:
        fields = self.observer.heartbeat_fields()
        try:
            await self.manager.heartbeat(self.worker_id, fields, ttl=self.config.worker.lease_ttl)
        except TransientError as exc:
            log.warning("heartbeat failed", extra={"error": str(exc)})

    async def _watch_shapes(self) -> None:
        try:
            await self.pipeline.watch_shapes(self.balancer.owned())
        except CdcError as exc:  # the next check comes soon; a broken table says why itself
            log.debug("shape check failed", extra={"error": str(exc)})

    async def _cleanup(self) -> None:
        """The source's retention cleanup, scoped to this config's tables (``cdc.cleanup_job``)."""
        assert self.scheduler is not None
        await self.cleanup_job.scheduled(self.scheduler, self._cleanup, self.stop_event)


def _log_upkeep_failure(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    log.warning("lease upkeep failed, retrying", extra={"error": str(error)})
