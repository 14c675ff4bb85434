"""The sidecar's retention cleanup (PostgreSQL), run every ``source.cleanup_interval``.

Scoped to the deployment (``cdc.sources.pg_retention``): the tables of this
config only, each kept as long as the longest retention that a deployment
mirroring it claims. This job renews the deployment's claim at every run; the
claim lasts ``retention + 2 * cleanup_interval``, so one failed run does not
let it lapse.

A cleanup that fails (the source away; a source user that may not delete the
entries; a tracking schema from before 0.3) is a state, not a traceback per
interval: ``Pipeline.cleanup_error`` (shown by ``/readyz``) and
``cdc_cleanup_failing`` say so while it lasts, ``cdc_cleanup_last_success_timestamp_seconds``
says since when; the log has one line when it starts failing (why, and the
fix), a reminder every ``REMIND_EVERY`` while it goes on, and one line when it
works again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs, urlsplit

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from cdc.config import Config
from cdc.errors import CdcError
from cdc.pipeline import Pipeline
from cdc.sources.base import CleanupScope
from publishers.settings import RedisConfig

log = logging.getLogger("cdc.cleanup")

# Seconds between two reminders of a cleanup that goes on failing (it may run
# every minute: a line per run would bury the rest of the log).
REMIND_EVERY = 3600.0

# A failed run is tried again after 5 s, doubling, at most every 5 minutes (or
# the interval, if shorter): one failure at start-up (the database restarting,
# say) otherwise held /readyz at 503 for a whole cleanup_interval (30 minutes by
# default) after the database was back. A cleanup that fails for good (a
# missing grant) costs one statement per 5 minutes and notices the fix sooner.
RETRY_FIRST = 5.0
RETRY_MOST = 300.0
RETRY_JOB = "cleanup-retry"  # the scheduler's id of a failed cleanup's next try


def deployment_name(redis: RedisConfig) -> str:
    """Who claims a retention: the namespace and the Redis server it lives on
    (two configs writing one namespace of one Redis are one deployment). No
    user name nor password: it is stored in the source database."""
    parts = urlsplit(redis.url)
    if redis.sentinel is not None:  # the url names no host: the sentinels and the master name do
        nodes = ",".join(sorted(f"{host}:{port}" for host, port in redis.sentinel.nodes))
        where = f"sentinel {redis.sentinel.master}@{nodes}/{parts.path.strip('/') or '0'}"
    elif parts.scheme == "unix":  # the query may hold a password: only its database
        where = f"{parts.path}/{parse_qs(parts.query).get('db', ['0'])[0]}"
    else:
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
        where = f"{host}:{parts.port or 6379}/{parts.path.strip('/') or '0'}"
    return f"{redis.namespace} at {'cluster ' if redis.cluster else ''}{where}"


def cleanup_scope(config: Config) -> CleanupScope:
    """This config's tables and claim (see the module docstring)."""
    return CleanupScope(
        deployment=deployment_name(config.redis),
        tables=tuple(t.table for t in config.tables),
        claim_for=config.source.retention + 2 * config.source.cleanup_interval,
    )


class CleanupJob:
    """One deployment's cleanup runs and the state they leave (module docstring)."""

    def __init__(self, config: Config, pipeline: Pipeline) -> None:
        self.retention = config.source.retention
        self.interval = config.source.cleanup_interval
        self.scope = cleanup_scope(config)
        self.pipeline = pipeline
        self.failures = 0  # in a row
        self._reminded = 0.0  # time.monotonic() of the last line about the current failure

    async def run(self) -> None:
        try:
            deleted = await self.pipeline.source.cleanup(self.retention, self.scope)
        except CdcError as exc:
            self._failed(str(exc))
        except Exception as exc:  # a bug: a state too, told as loudly, without the scheduler's traceback
            self._failed(f"unexpected error (a bug: please report it): {exc!r}")
        else:
            self._succeeded(deleted)

    async def scheduled(
        self, scheduler: AsyncIOScheduler, job: Callable[[], Awaitable[None]], stopping: asyncio.Event
    ) -> None:
        """A run as the daemon's scheduler makes it (``job`` is that job): a
        failure is a state, never the scheduler's traceback, and is tried again
        soon (``retry_in``). It runs at start-up too, so a shutdown (``--once``)
        may cut it short: the scheduler's shutdown cancels it, its transaction
        rolls back, and that is no error to log."""
        try:
            await self.run()
        except asyncio.CancelledError:
            if not stopping.is_set():
                raise
            return
        delay = self.retry_in(self.interval)
        if delay is not None and not stopping.is_set():
            when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=delay)
            scheduler.add_job(job, "date", run_date=when, id=RETRY_JOB, replace_existing=True)

    def retry_in(self, interval: float) -> float | None:
        """Seconds until a failed cleanup is tried again (None: the last run worked)."""
        if not self.failures:
            return None
        return min(RETRY_FIRST * 2.0 ** min(self.failures - 1, 16), RETRY_MOST, interval)

    def _failed(self, reason: str) -> None:
        self.failures += 1
        self.pipeline.cleanup_error = reason
        self.pipeline.metrics.cleanup_failing.set(1)
        now = time.monotonic()
        if self.failures == 1:
            self._reminded = now
            log.error("tracking cleanup fails: nothing is removed until it runs", extra={"error": reason})
        elif now - self._reminded >= REMIND_EVERY:
            self._reminded = now
            log.warning(
                "tracking cleanup still fails", extra={"error": reason, "failures_in_a_row": self.failures}
            )

    def _succeeded(self, deleted: int) -> None:
        if self.failures:
            log.info("tracking cleanup works again", extra={"after_failures": self.failures})
        self.failures = 0
        self.pipeline.cleanup_error = None
        self.pipeline.metrics.cleanup_failing.set(0)
        self.pipeline.metrics.cleanup_last_success.set(time.time())
        log.info("tracking cleanup", extra={"deleted": deleted, "deployment": self.scope.deployment})
