"""ChangeTracker: follows one table from its checkpoint.

    run()          describe the table, snapshot if it has no checkpoint, then
                   poll until stopped: read -> enqueue -> (later) checkpoint
    poll()         one consistent read of the net changes since the read
                   position, paged; every change goes to the AutoBatchWorker
                   under one Ticket
    snapshot()     full consistent read (initial, on TrackingExpired, or on
                   demand), then a sweep that deletes the documents of rows
                   the snapshot did not see, through ordinary delete changes
    checkpoints    a read's version is persisted only once every change of
                   that read (and of every read before it) is applied: the
                   ``CheckpointLine`` (cdc.checkpoint) decides, the tracker writes
    RowFeeder      maps source rows to changes and queues them; a row that
                   cannot be encoded goes to the dead letter

Two positions are kept apart: ``position`` is where the next read starts
(reads run ahead of Redis, bounded by the worker's queue), ``applied`` is what
Redis holds and what the checkpoint stores. A crash between the two replays
changes, which the apply rule makes harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
)

from cdc.backoff import EmptyPollBackoff
from cdc.batching import AutoBatchWorker, Ticket
from cdc.checkpoint import CheckpointLine
from cdc.config import TableConfig
from cdc.errors import PoisonChange, TrackingExpired, TransientError
from cdc.mapping import TableMapper
from cdc.metrics import Metrics
from cdc.sources.base import ChangeRow, ChangeSource, TableInfo
from publishers import control
from publishers.manager import DataManager
from publishers.model import Change
from publishers.retrying import equal_jitter

log = logging.getLogger("cdc.tracker")

# Rows mapped and queued at a time: a page of 5,000 rows is 100+ ms of CPU,
# and the batch applier must get to send batches in between. Half a batch
# (within these bounds), so that the applier, back from Redis, finds its next
# batch queued and waits for at most half a batch's mapping before sending it.
SLICE = 256
MIN_SLICE = 32
MAX_RETRY_DELAY = 5.0  # a failing table retries at least this often: it resumes soon after an outage
# Between tries of a failing table: 0.25-0.5 s, 0.5-1 s, ... up to 2.5-5 s, so
# that after an outage the tables spread their retries (publishers.retrying).
RETRY_WAIT = equal_jitter(0.5, MAX_RETRY_DELAY)
State = Literal["starting", "snapshotting", "streaming", "degraded", "stopped"]
R = TypeVar("R")  # a source row: a ChangeRow, or a snapshot row (a dict)


@dataclass
class SnapshotProgress:
    rows: int = 0
    total: int | None = None
    version: int | None = None


class _StopEvent(asyncio.Event):
    """A tracker's stop request; setting it also wakes the tracker from its backoff."""

    def __init__(self, wake: asyncio.Event) -> None:
        super().__init__()
        self._wake = wake

    def set(self) -> None:
        super().set()
        self._wake.set()


class RowFeeder:
    """Turns a table's source rows into changes and queues them on the worker;
    a row that cannot be encoded goes to the dead letter instead."""

    def __init__(
        self,
        info: TableInfo,
        mapper: TableMapper,
        *,
        worker: AutoBatchWorker,
        manager: DataManager,
        metrics: Metrics,
    ) -> None:
        self.info, self.mapper = info, mapper
        self.worker, self.manager = worker, manager
        self._dead_lettered = metrics.dead_lettered.labels(info.table)
        self._slice = max(MIN_SLICE, min(SLICE, worker.max_batch_size // 2))

    async def changes(self, rows: list[ChangeRow], ticket: Ticket) -> None:
        await self._queue(rows, ticket, self.mapper.from_row, lambda row: (row.key, row.op, row.version))

    async def snapshot_rows(self, rows: list[dict[str, Any]], ticket: Ticket, version: int) -> None:
        await self._queue(
            rows,
            ticket,
            functools.partial(self.mapper.from_snapshot, version=version),
            functools.partial(self._snapshot_row_at, version=version),
        )

    async def sweep(self, section: str, version: int) -> Ticket:
        """Queue the deletes of the documents a snapshot at ``version`` did not
        write (rows gone meanwhile); return their sealed ticket."""
        ticket = Ticket(version=version)
        async for partition, key in self.manager.stale_keys(section, version):
            await self.worker.put(self.mapper.delete(partition, key, version), ticket)
        ticket.seal()
        return ticket

    def _snapshot_row_at(self, row: dict[str, Any], version: int) -> tuple[dict[str, Any], str, int]:
        """A snapshot row's primary key, op and version (for the dead letter)."""
        return {c: row.get(c) for c in self.info.primary_key}, "S", version

    async def _queue(
        self,
        rows: Sequence[R],
        ticket: Ticket,
        convert: Callable[[R], Change | None],
        where: Callable[[R], tuple[dict[str, Any], Any, int]],
    ) -> None:
        """Map ``rows`` with ``convert`` and queue their changes, ``_slice``
        rows at a time (the worker's applier runs between slices). A row that
        cannot be encoded goes to the dead letter at ``where(row)``: its
        (primary key, op, version)."""
        step = self._slice
        for start in range(0, len(rows), step):
            changes: list[Change] = []
            for row in rows[start : start + step]:
                try:
                    change = convert(row)
                except PoisonChange as exc:
                    key, op, version = where(row)
                    payload: dict[str, object] = {"key": {k: str(v) for k, v in key.items()}}
                    await self._dead_letter(str(exc), payload, self.mapper.address(key, op, version))
                    continue
                if change is not None:
                    changes.append(change)
            await self.worker.put_many(changes, ticket)

    async def _dead_letter(
        self, reason: str, payload: dict[str, object], address: Change | None = None
    ) -> None:
        """Record a row that cannot be applied: with its partition, section
        and key (``address``) when they are known, and ``payload``."""
        log.error("change dead-lettered", extra={"table": self.info.table, "reason": reason})
        self._dead_lettered.inc()
        await self.manager.dead_letter(address, reason, table=self.info.table, payload=payload)


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
    ) -> None:
        self.table_config = table_config
        self.table = table_config.table
        self.source = source
        self.manager = manager
        self.worker = worker
        self.metrics = metrics
        # this table's series, looked up once: an idle table updates them at every poll
        self._changes_read = metrics.changes_read.labels(self.table)
        self._backoff_step = metrics.backoff_step.labels(self.table)
        self._lag_seconds = metrics.lag_seconds.labels(self.table)
        self._lag_versions = metrics.lag_versions.labels(self.table)
        self.page_size = page_size
        self.max_row_bytes = max_row_bytes
        self.backoff = EmptyPollBackoff(table_config.backoff)
        self.wake = asyncio.Event()
        self.state: State = "starting"
        self.position: int | None = None  # next read starts after this version
        self.line = CheckpointLine(self.table)  # what ``applied`` is, and when to persist it
        self.source_version: int | None = None  # the bound of the latest read
        self.caught_up = asyncio.Event()  # set once a read found nothing new and all is applied
        self.progress = SnapshotProgress()
        self.error: str | None = None
        self._mapper: TableMapper | None = None
        self._feeder: RowFeeder | None = None
        self._info: TableInfo | None = None
        self._snapshot_request: str | None = None
        self.fence = 0  # fencing token of the lease this tracker works under
        self.stop_event: asyncio.Event = _StopEvent(self.wake)

    @property
    def _rows(self) -> RowFeeder:
        assert self._feeder is not None, "prepare() first"
        return self._feeder

    @property
    def applied(self) -> int | None:
        """Every change up to this version is in Redis."""
        return self.line.applied

    @applied.setter
    def applied(self, version: int | None) -> None:
        self.line.applied = version

    # -- lifecycle -------------------------------------------------------------

    async def prepare(self) -> None:
        """Resolve the table at the source (at start-up: a bad table fails fast)."""
        self._info = await self.source.describe(self.table_config)
        self._mapper = TableMapper(self.table_config, self._info, self.max_row_bytes)
        self._feeder = RowFeeder(
            self._info, self._mapper, worker=self.worker, manager=self.manager, metrics=self.metrics
        )

    async def start(self, fence: int = 0) -> None:
        """Take the table on, holding a lease with fencing token ``fence`` (0:
        unfenced), from its checkpoint as it is now in Redis: a previous owner
        may have advanced it."""
        assert self._mapper is not None, "prepare() first"
        self.fence = self._mapper.fence = fence
        self.stop_event = _StopEvent(self.wake)
        self.caught_up.clear()
        checkpoint = await self.manager.get_checkpoint(self.table)
        streaming = checkpoint is not None and checkpoint.state == "streaming"
        self.position = checkpoint.version if streaming and checkpoint is not None else None
        self.line.reset(self.position)

    def request_snapshot(self, reason: str) -> None:
        """Re-snapshot at the next poll (``cdc snapshot`` asks through Redis)."""
        if self._snapshot_request is None:
            self._snapshot_request = reason
            self.wake.set()

    async def run(self, once: bool = False) -> None:
        """Poll until ``stop_event`` is set (or, with ``once``, until caught up)."""
        stop = self.stop_event
        while not stop.is_set():
            try:
                found: bool | None = await _retrying(stop, self._degraded)(self._step, stop)
            except TrackingExpired as exc:
                log.warning("re-snapshotting", extra={"table": self.table, "reason": exc.reason})
                self.position = None
                continue
            if found is None:  # stopped while retrying
                break
            self.error = None
            if not found and await self._all_applied():
                self.caught_up.set()
                if once:
                    break
            await self._wait(stop)
        await self.flush()
        self.state = "stopped"

    async def _step(self, stop: asyncio.Event) -> bool | None:
        """A snapshot if one is due, then a poll: whether it found changes
        (None: ``stop`` was set meanwhile, say during a retry's wait)."""
        if stop.is_set():
            return None
        if self._snapshot_request is not None:
            await self.snapshot(self._snapshot_request)
            await control.clear_snapshot_request(self.manager, self.table)
            self._snapshot_request = None
        elif self.position is None:
            await self.snapshot("no checkpoint yet")
        return await self.poll()

    async def flush(self) -> None:
        """Persist the checkpoint of everything applied so far (shutdown)."""
        await self._complete_tickets(block=False)
        if self.applied is not None and self.applied != self.line.persisted:
            await self._persist("streaming")

    # -- polling ---------------------------------------------------------------

    async def poll(self) -> bool:
        """One consistent read of the changes since ``position``, paged.

        Returns whether any change was found."""
        assert self._info is not None and self.position is not None
        self.wake.clear()
        since = self.position
        ticket = Ticket(version=since)
        page = await self.source.read_changes(self._info, since, limit=self.page_size)
        rows = 0
        while True:
            rows += len(page.rows)
            await self._rows.changes(page.rows, ticket)
            if not page.more:
                break
            page = await self.source.read_changes(
                self._info, since, limit=self.page_size, upto=page.next_version, after=page.cursor
            )
        ticket.version = page.next_version
        ticket.seal()
        self.line.register(ticket)
        self.position = max(self.position, page.next_version)
        self.source_version = page.next_version
        self.state = "streaming"
        self.backoff.record(rows > 0)
        if rows:
            self._changes_read.inc(rows)
        await self._complete_tickets(block=False)
        return rows > 0

    async def _wait(self, stop: asyncio.Event) -> None:
        self._backoff_step.set(self.backoff.step)
        delay = self.backoff.delay
        if delay <= 0 or stop.is_set():
            return
        if self._info is not None and self.position is not None and self.line.settled:
            # a read known to find nothing is not worth a wake-up: the table's
            # notification sets ``wake`` (as do a stop and a snapshot request)
            delay = max(delay, self.source.quiet_for(self._info, self.position))
        # stop_event sets wake too (_StopEvent): one future and a timer, not two tasks
        # (an idle table waits ten times a second at first: the tasks cost more than the poll)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self.wake.wait()

    # -- snapshot --------------------------------------------------------------

    async def snapshot(self, reason: str) -> None:
        """Load the whole table consistently, then delete what it no longer has."""
        log.info("snapshot starting", extra={"table": self.table, "reason": reason})
        self.state = "snapshotting"
        self.caught_up.clear()
        await self._complete_tickets(block=True)
        await self.manager.set_checkpoint(self.table, self.applied or 0, "snapshotting", fence=self.fence)
        self.progress = SnapshotProgress()
        version = await self._load_snapshot()
        if "D" in self.table_config.operations:
            await self.line.wait_applied(await self._rows.sweep(self.table_config.section, version))
        self.position = self.applied = version
        await self._persist("streaming")
        log.info("snapshot done", extra={"table": self.table, "rows": self.progress.rows, "version": version})

    async def _load_snapshot(self) -> int:
        assert self._info is not None
        ticket = Ticket(version=0)
        version: int | None = None
        async for page in self.source.snapshot(self._info, page_size=self.page_size):
            version = ticket.version = page.version
            self.progress.version, self.progress.total = version, page.total
            await self._rows.snapshot_rows(page.rows, ticket, page.version)
            self.progress.rows += len(page.rows)
            self.metrics.snapshot_rows.labels(self.table).inc(len(page.rows))
            await control.set_snapshot_progress(self.manager, self.table, self.progress.rows, page.total)
        if version is None:
            version = await self.source.current_version()
        ticket.seal()
        await self.line.wait_applied(ticket)
        return version

    # -- checkpoints -----------------------------------------------------------

    async def _all_applied(self) -> bool:
        await self._complete_tickets(block=False)
        return self.line.empty

    async def _complete_tickets(self, block: bool) -> None:
        """Advance ``applied`` over the finished reads at the head of the line
        (``block``: wait for every read first), and write the checkpoint when due."""
        advanced = await self.line.drain() if block else self.line.advance()
        self._update_lag()
        if advanced and self.line.persist_due():
            await self._persist("streaming")

    async def _persist(self, state: Literal["snapshotting", "streaming"]) -> None:
        if self.applied is None:
            return
        await self.manager.set_checkpoint(self.table, self.applied, state, fence=self.fence)
        self.line.persisted_now()

    def refresh_metrics(self) -> None:
        self._update_lag()
        self.metrics.backoff_step.labels(self.table).set(self.backoff.step)

    def _update_lag(self) -> None:
        self._lag_seconds.set(self.line.oldest_read_age())
        if self.source_version is not None and self.applied is not None:
            self._lag_versions.set(max(0, self.source_version - self.applied))

    # -- errors ----------------------------------------------------------------

    def _degraded(self, retry_state: RetryCallState) -> None:
        """A transient error: the table is degraded until a step succeeds."""
        assert retry_state.outcome is not None
        exc = retry_state.outcome.exception()
        self.state = "degraded"
        self.error = str(exc)
        log.warning(
            "table degraded, retrying",
            extra={"table": self.table, "error": str(exc), "retry_in": round(retry_state.upcoming_sleep, 3)},
        )


def _retrying(stop: asyncio.Event, before_sleep: Callable[[RetryCallState], None]) -> AsyncRetrying:
    """Retry a step on ``TransientError`` until it succeeds, waiting between
    tries in a way ``stop`` cuts short (``RETRY_WAIT``)."""

    async def pause(seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)

    return AsyncRetrying(
        retry=retry_if_exception_type(TransientError),
        wait=RETRY_WAIT,
        sleep=pause,
        before_sleep=before_sleep,
        reraise=True,
    )
