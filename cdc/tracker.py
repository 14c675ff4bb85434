"""ChangeTracker: follows one table from its checkpoint.

    run()          describe the table, snapshot if it has no checkpoint, then
                   poll until stopped: read -> enqueue -> (later) checkpoint
    poll()         one consistent read of the net changes since the read
                   position, paged; every change goes to the AutoBatchWorker
                   under one Ticket (``cdc.feeder.RowFeeder`` maps and queues)
    snapshot()     full consistent read (initial, on TrackingExpired, when the
                   table changed shape, or on demand), then a sweep that
                   deletes the documents of rows the snapshot did not see,
                   through ordinary delete changes
    checkpoints    a read's version is persisted only once every change of
                   that read (and of every read before it) is applied: the
                   ``CheckpointLine`` (cdc.checkpoint) decides, the tracker writes

A table's failure is the table's own: whatever a step raises (the table
dropped or renamed, a column gone, tracking off, a permission revoked, a
damaged key in Redis, a bug) makes it ``degraded`` (``cdc.table_health``), and
the step is tried again after a jittered backoff, the table described again
first (``cdc.describer``). Only a lease lost ends a tracker; with ``once``
(``cdc run --once``) a failure that is not transient ends it too, raised.

Two positions are kept apart: ``position`` is where the next read starts
(reads run ahead of Redis, bounded by the worker's queue), ``applied`` is what
Redis holds and what the checkpoint stores. A crash between the two replays
changes, which the apply rule makes harmless; so does a failed step, after
which reading starts again from ``applied``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

from tenacity import AsyncRetrying, RetryCallState

from cdc import snapshot_range
from cdc.backoff import EmptyPollBackoff
from cdc.batching import AutoBatchWorker, Ticket
from cdc.checkpoint import CheckpointLine
from cdc.checkpoints import CheckpointKeeper
from cdc.config import TableConfig
from cdc.describer import Describer
from cdc.errors import (
    CdcError,
    LeaseLost,
    RedisUnavailable,
    TrackingExpired,
    TrackingNotEnabled,
    TransientError,
)
from cdc.feeder import RowFeeder
from cdc.metrics import Metrics
from cdc.reachability import Component, redis_component
from cdc.snapshot_requests import SnapshotRequests
from cdc.snapshots import SnapshotLoader, SnapshotProgress
from cdc.sources.base import ChangeSource, TableInfo
from cdc.table_gauges import TableGauges
from cdc.table_health import TableHealth
from publishers import control
from publishers.manager import DataManager
from publishers.model import Checkpoint
from publishers.retrying import equal_jitter

log = logging.getLogger("cdc.tracker")

MAX_RETRY_DELAY = 5.0  # a failing table retries at least this often: it resumes soon after an outage
# Between tries of a table whose source or Redis is away: 0.25-0.5 s, 0.5-1 s,
# ... up to 2.5-5 s, so that after an outage the tables spread their retries
# (publishers.retrying).
RETRY_WAIT = equal_jitter(0.5, MAX_RETRY_DELAY)
# Between tries of a table that is itself broken (dropped, a column gone,
# tracking off): the first retry is quick, since a table that changed shape
# under a read is usually fine once described again; then up to 7.5-15 s, so a
# table re-created and enabled again resumes well within 45 s, and a table
# gone for good costs a few catalog queries a minute.
BROKEN_WAIT = equal_jitter(0.5, 15.0)


class _StopEvent(asyncio.Event):
    """A tracker's stop request; setting it also wakes the tracker from its backoff."""

    def __init__(self, wake: asyncio.Event) -> None:
        super().__init__()
        self._wake = wake

    def set(self) -> None:
        super().set()
        self._wake.set()


class ChangeTracker:
    def __init__(
        self,
        table_config: TableConfig,
        *,
        source: ChangeSource,
        manager: DataManager,
        worker: AutoBatchWorker,
        metrics: Metrics,
        page_size: int,
        max_row_bytes: int,
        redis: Component | None = None,
    ) -> None:
        self.table_config = table_config
        self.table = table_config.table
        self.source = source
        self.manager = manager
        self.worker = worker
        self.metrics = metrics
        # this table's series, looked up once: an idle table updates them at every poll
        self._changes_read = metrics.changes_read.labels(self.table)
        self.redis = redis or redis_component(metrics)  # whether Redis answers (the pipeline's)
        self.page_size = page_size
        self.backoff = EmptyPollBackoff(table_config.backoff)
        self.wake = asyncio.Event()
        self.health = TableHealth(self.table, metrics)
        self.position: int | None = None  # next read starts after this version
        self.line = CheckpointLine(self.table)  # what ``applied`` is, and when to persist it
        self.checkpoints = CheckpointKeeper(self.table, self.line, manager, metrics, self.redis)
        self.gauges = TableGauges(self.checkpoints, self.health, self.backoff, source)
        self.caught_up = asyncio.Event()  # set once a read found nothing new and all is applied
        self.loader = SnapshotLoader(
            table_config, source=source, manager=manager, line=self.line, metrics=metrics, page_size=page_size
        )
        self.describer = Describer(table_config, source, max_row_bytes)
        self.feeder = RowFeeder(self.describer, worker=worker, manager=manager, metrics=metrics)
        self._describe_request: str | None = "not described yet"
        self._shape_checked = False  # the stored shape compared with the described one
        self._checkpoint_read = False  # since taken (``start``)
        self.requests = SnapshotRequests(manager, self.table, self.wake.set)  # the snapshot owed
        self._expired = 0  # TrackingExpired in a row, no step succeeding in between
        self.stop_event: asyncio.Event = _StopEvent(self.wake)

    @property
    def info(self) -> TableInfo | None:
        """The table as last described."""
        return self.describer.info

    @property
    def applied(self) -> int | None:
        """Every change up to this version is in Redis."""
        return self.line.applied

    # -- lifecycle -------------------------------------------------------------

    async def prepare(self, *, strict: bool = True) -> None:
        """Describe the table at the source. ``strict`` (``cdc run --once``,
        ``cdc snapshot``): a table that cannot be followed raises. Otherwise it
        starts degraded, and its tracker keeps trying once it runs."""
        try:
            await self._describe()
        except CdcError as exc:
            if strict:
                raise
            self.health.failed(exc, retry_in=0.0)

    async def start(self, fence: int = 0) -> None:
        """Take the table on, holding a lease with fencing token ``fence`` (0:
        unfenced). Its checkpoint (a previous owner may have advanced it) is read
        at the first step (``resume``): a damaged one degrades the table, not the sidecar."""
        self.checkpoints.fence = fence
        if self.describer.mapper is not None:
            self.describer.mapper.fence = fence
        self.stop_event = _StopEvent(self.wake)
        self.caught_up.clear()
        self._shape_checked = False  # another owner may have written the documents meanwhile
        self.checkpoints.reset(None)
        self.position, self._checkpoint_read = None, False
        self.gauges.running()

    async def resume(self) -> None:
        """Go on from the checkpoint as Redis holds it now: the first step after ``start``."""
        checkpoint = await self.checkpoints.load()
        self.position, self._checkpoint_read = self.applied, True
        self.requests.pending = self.requests.pending or _unfinished_snapshot(checkpoint)

    def request_snapshot(self, reason: str, *, stored: str | None = None, distrust: bool = False) -> None:
        """Re-snapshot at the next step (``cdc.snapshot_requests``: ``stored``
        is the stored request's text). ``distrust``: that snapshot starts over
        and sweeps (``Resumes.distrust``: a failover may have lost its pages)."""
        if self.requests.ask(reason, stored=stored) and distrust:
            self.loader.resumes.distrust()

    def notice_fingerprint(self, fingerprint: str | None) -> None:
        """The source's fingerprint of the table now: describe it again at
        the next step if it changed (``Pipeline.watch_shapes``)."""
        if self._describe_request is None and self.describer.stale(fingerprint):
            self._describe_request = "the table's shape changed"
            self.wake.set()

    async def run(self, once: bool = False) -> None:
        """Poll until ``stop_event`` is set (or, with ``once``, until caught up)."""
        stop = self.stop_event
        retrying = _retrying(stop, self._failed, fail_fast=once)
        while not stop.is_set():
            try:
                caught_up: bool | None = await retrying(self._step, stop)
            except TrackingExpired as exc:
                self._expired += 1
                log.warning("re-snapshotting", extra={"table": self.table, "reason": exc.reason})
                self.position = None
                self.requests.pending = self.requests.pending or f"change tracking expired: {exc.reason}"
                await _pause_after_expiries(self._expired, stop)
                continue
            if caught_up is None:  # stopped while retrying
                break
            self._expired = 0
            self.health.recovered()
            if caught_up:
                self.caught_up.set()
                if once:
                    break
            await self._wait(stop)
        await self.checkpoints.flush(quietly=True)
        self.health.state = "stopped"

    async def _step(self, stop: asyncio.Event) -> bool | None:
        """What is due (a description, a snapshot), then a poll: whether the
        table is caught up (None: ``stop`` was set meanwhile, say during a
        retry's wait)."""
        if stop.is_set():
            return None
        if not self._checkpoint_read:
            await self.resume()
        if self._describe_request is not None:
            await self._describe()
        if not self._shape_checked:
            reason = await self.describer.stored_shape_differs(self.manager, self.position is not None)
            self.requests.pending = self.requests.pending or reason
            self._shape_checked = True
        if self.requests.pending is not None:
            await self.requests.serve(functools.partial(snapshot_range.due, self))
        elif self.position is None:
            await self.snapshot("no checkpoint yet")
        found = await self.poll()
        return not found and await self.checkpoints.all_applied()

    async def _describe(self) -> None:
        """Describe the table (again); snapshot it at this step if its documents no longer fit it."""
        reason = await self.describer.describe()
        self._describe_request = None
        assert self.describer.info is not None and self.describer.mapper is not None
        self.describer.mapper.fence = self.checkpoints.fence
        if reason is not None and self.position is not None:
            self.requests.pending = self.requests.pending or reason
        self._shape_checked = False

    # -- polling ---------------------------------------------------------------

    async def poll(self) -> bool:
        """One consistent read of the changes since ``position``, paged.

        Returns whether any change was found."""
        info = self.describer.info
        assert info is not None and self.position is not None
        self.wake.clear()
        since = self.position
        ticket = Ticket(version=since)
        page = await self.source.read_changes(info, since, limit=self.page_size)
        rows = 0
        while True:
            rows += len(page.rows)
            await self.feeder.changes(page.rows, ticket)
            if not page.more:
                break
            page = await self.source.read_changes(
                info, since, limit=self.page_size, upto=page.next_version, after=page.cursor
            )
        ticket.version = page.next_version
        ticket.seal()
        self.line.register(ticket)
        self.position = max(self.position, page.next_version)
        self.checkpoints.source_version = page.next_version
        self.health.state = "streaming"
        self.backoff.record(rows > 0)
        if rows:
            self._changes_read.inc(rows)
        await self.checkpoints.complete(block=False)
        return rows > 0

    async def _wait(self, stop: asyncio.Event) -> None:
        self.gauges.backoff_step()
        delay = self.backoff.delay
        if delay <= 0 or stop.is_set():
            return
        info = self.describer.info
        if info is not None and self.position is not None and self.line.settled:
            # a read known to find nothing is not worth a wake-up: the table's
            # notification sets ``wake`` (as do a stop and a snapshot request)
            delay = max(delay, self.source.quiet_for(info, self.position))
        # stop_event sets wake too (_StopEvent): one future and a timer, not two tasks
        # (an idle table waits ten times a second at first: the tasks cost more than the poll)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self.wake.wait()

    # -- snapshot --------------------------------------------------------------

    async def snapshot(self, reason: str) -> None:
        """Load the whole table consistently, then delete what it no longer has."""
        log.info("snapshot starting", extra={"table": self.table, "reason": reason})
        self.health.state = "snapshotting"
        self.caught_up.clear()
        await self.checkpoints.complete(block=True)
        await self.manager.set_checkpoint(
            self.table, self.applied or 0, "snapshotting", fence=self.checkpoints.fence
        )
        self.health.recovered()  # described, and Redis answers: an earlier failure is over
        assert self.info is not None
        shape = self.describer.shape
        started = self.line.now()
        version = await self.loader.load(self.info, self.feeder, shape)
        self.position = self.line.snapshotted(version, started)
        await control.set_table_shape(self.manager, self.table, shape)  # before "streaming": see snapshots.py
        await self.checkpoints.persist("streaming")
        log.info("snapshot done", extra={"table": self.table, "rows": self.progress.rows, "version": version})

    @property
    def progress(self) -> SnapshotProgress:
        return self.loader.progress

    # -- failures --------------------------------------------------------------

    def _failed(self, retry_state: RetryCallState) -> None:
        """A step failed: the table is degraded until one succeeds. Unless the source or
        Redis is merely away, describe the table again first, and read again from what
        Redis holds (the reads that ran ahead may never be applied: a damaged key refused them)."""
        assert retry_state.outcome is not None
        error = retry_state.outcome.exception()
        assert error is not None
        self.health.failed(error, retry_state.upcoming_sleep)
        if isinstance(error, RedisUnavailable):
            self.redis.failed(error)  # (the source's own calls tell it themselves: ObservedSource)
        if isinstance(error, TransientError):
            return
        if isinstance(error, TrackingNotEnabled):
            self.describer.uncaptured = True
        self._describe_request = self._describe_request or "a step failed"
        self.line.forget_reads()
        self.position = self.applied


def _unfinished_snapshot(checkpoint: Checkpoint | None) -> str | None:
    """Why a table taken on is snapshotted although it has a checkpoint (None: it is
    streaming, or has none: "no checkpoint yet")."""
    if checkpoint is None or checkpoint.state == "streaming":
        return None
    return f"its last snapshot did not finish (checkpoint state {checkpoint.state!r}): the sidecar stopped or lost the table"


async def _pause_after_expiries(in_a_row: int, stop: asyncio.Event) -> None:
    """Expired again before any step succeeded (a snapshot whose version a
    cleanup or a TRUNCATE passed at once): wait ``BROKEN_WAIT``, as for a
    broken table, rather than snapshot the table again and again at once."""
    if in_a_row < 2:
        return
    attempt = RetryCallState(cast(Any, None), None, (), {})  # what a wait reads: attempt_number
    attempt.attempt_number = in_a_row - 1
    await _pause(stop, BROKEN_WAIT(attempt))


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds``, or less should ``stop`` be set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def _retrying(
    stop: asyncio.Event, before_sleep: Callable[[RetryCallState], None], *, fail_fast: bool
) -> Callable[..., Awaitable[bool | None]]:
    """Retry a step until it succeeds, waiting between tries in a way ``stop``
    cuts short: ``RETRY_WAIT`` after a ``TransientError``, ``BROKEN_WAIT``
    after any other. Never retried: ``TrackingExpired`` (the caller
    snapshots), ``LeaseLost`` (the table is someone else's), and with
    ``fail_fast`` anything but a ``TransientError``."""

    def retry(state: RetryCallState) -> bool:
        error = state.outcome.exception() if state.outcome is not None else None
        if error is None or isinstance(error, TrackingExpired | LeaseLost):
            return False
        return isinstance(error, TransientError) or (isinstance(error, Exception) and not fail_fast)

    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        return (RETRY_WAIT if isinstance(error, TransientError) else BROKEN_WAIT)(state)

    return AsyncRetrying(
        retry=retry, wait=wait, sleep=functools.partial(_pause, stop), before_sleep=before_sleep, reraise=True
    )
