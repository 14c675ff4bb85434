"""The data path, built once: source -> trackers -> AutoBatchWorker -> data manager.

    pipeline = Pipeline(config)      the pieces, not yet connected
    await pipeline.open()            connect source and Redis, describe every
                                     table, check its tracking, start the applier
    await pipeline.watch_shapes(ts)  trackers whose table changed describe it again
    pipeline.tracker("dbo.T")        one table's ChangeTracker
    await pipeline.close()           flush the applier, close the connections

The daemon runs it under leases; ``cdc snapshot`` and the tests drive its
trackers by hand.
It knows nothing of leases, health or housekeeping.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import cast

from tenacity import AsyncRetrying, retry_if_exception_type, wait_random

from cdc.batching import AutoBatchWorker
from cdc.config import Config, TableConfig
from cdc.errors import ConfigError, TransientError
from cdc.metrics import Metrics
from cdc.reachability import APPLY, ObservedSource, redis_component, source_component
from cdc.sources import make_source
from cdc.sources.base import ChangeSource
from cdc.tracker import ChangeTracker
from publishers import control
from publishers.manager import DataManager, Prepared
from publishers.model import ApplyResult, Change

log = logging.getLogger("cdc.pipeline")

LISTEN_WAIT = 1.0  # seconds one wait for a change notification lasts
# A lost notification connection is retried after about a second, jittered so
# that sidecars that lost their database together do not reconnect in lockstep.
LISTEN_RETRY = wait_random(0.5, 1.5)


class Pipeline:
    def __init__(
        self,
        config: Config,
        *,
        source: ChangeSource | None = None,
        manager: DataManager | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        # cdc_up{component}: every round trip to the source or Redis says whether it answered
        self.reachable_source = source_component(self.metrics)
        self.redis = redis_component(self.metrics)
        observed = ObservedSource(source or make_source(config.source), self.reachable_source)
        self.source: ChangeSource = cast(ChangeSource, observed)  # the source's own calls pass through
        self._manager = manager
        self.trackers: list[ChangeTracker] = []
        self.cleanup_error: str | None = None  # why the source's retention cleanup fails, while it does
        self.worker = AutoBatchWorker(
            self._apply,
            max_batch_size=config.worker.max_batch_size,
            max_wait=config.worker.max_wait,
            capacity=config.worker.queue_capacity,
            on_result=self._on_result,
            on_degraded=self._on_redis_degraded,
        )
        self._prepared: Prepared | None = None  # the next batch, made ready while Redis ran one

    @property
    def manager(self) -> DataManager:
        assert self._manager is not None, "connect() first"
        return self._manager

    @property
    def redis_error(self) -> str | None:
        """Why the last call to Redis could not reach it (None: it answered)."""
        return self.redis.error

    @property
    def has_redis(self) -> bool:
        return self._manager is not None

    # -- building ---------------------------------------------------------------

    async def open(self, *, strict: bool = True) -> None:
        """Connections, described tables (their tracking checked), the applier
        started. ``strict``: a table that cannot be followed (no such table,
        no primary key, tracking off...) raises, and nothing is written to
        Redis (``cdc run --once``, ``cdc snapshot``); otherwise it starts
        degraded and keeps trying, while the other tables run (``cdc run``:
        a table broken since the last start must not keep the sidecar down)."""
        await self.connect()
        self.trackers = [self._tracker(table_config) for table_config in self.config.tables]
        for tracker in self.trackers:
            await tracker.prepare(strict=strict)
        self.worker.start()

    async def connect(self) -> None:
        await self.source.connect()
        if self._manager is None:
            self._manager = await self.redis.observe(DataManager.connect(self.config.redis))
            await self._refuse_a_replica(self._manager)
        else:
            self.redis.answered()  # given connected (the tests, cdc snapshot's own)

    async def _refuse_a_replica(self, manager: DataManager) -> None:
        """A replica as ``redis.url`` refuses every write (READONLY), which
        would read as an outage, retried for ever, while the start-up cleanup
        claims the source's retention for a deployment that mirrors nothing:
        a config mistake, exit 2, as ``cdc validate`` says (DESIGN.md section 6)."""
        problems = await control.primary_problems(manager)
        if problems:
            raise ConfigError(f"redis.url ({self.config.path}): {'; '.join(problems)}")

    async def watch_shapes(self, trackers: Sequence[ChangeTracker]) -> None:
        """Tell ``trackers`` their table's fingerprint at the source now (one
        round trip): those whose table changed describe it again. A table
        whose column was added, or that was dropped and created again, gives
        no error to a read: this is how its tracker learns of it."""
        described = [t for t in trackers if t.info is not None]
        if not described:
            return
        fingerprints = await self.source.fingerprints([t.table_config for t in described])
        for tracker in described:
            tracker.notice_fingerprint(fingerprints.get(tracker.table))

    def tracker(self, table: str) -> ChangeTracker:
        return next(t for t in self.trackers if t.table.lower() == table.lower())

    def _tracker(self, table_config: TableConfig) -> ChangeTracker:
        tracker = ChangeTracker(
            table_config,
            source=self.source,
            manager=self.manager,
            worker=self.worker,
            metrics=self.metrics,
            page_size=self.config.worker.page_size,
            max_row_bytes=self.config.worker.max_row_bytes,
            redis=self.redis,
        )
        # a logical-decoding source moves the table's slot up to the checkpoint Redis holds
        tracker.checkpoints.on_stored = getattr(self.source, "checkpoint_stored", None)
        return tracker

    # -- running ----------------------------------------------------------------

    async def listen(self, stop: asyncio.Event) -> None:
        """Wake trackers as soon as the source says their table changed."""
        retrying = AsyncRetrying(retry=retry_if_exception_type(TransientError), wait=LISTEN_RETRY)
        async for attempt in retrying:
            with attempt:
                await self._wake_on_changes(stop)

    async def _wake_on_changes(self, stop: asyncio.Event) -> None:
        by_name = {t.table.lower(): t for t in self.trackers}
        while not stop.is_set():
            for table in await self.source.wait_for_changes(LISTEN_WAIT):
                tracker = by_name.get(table.lower())
                if tracker is not None:
                    tracker.wake.set()

    async def _apply(self, changes: Sequence[Change]) -> ApplyResult:
        """Apply a batch, preparing the next one while its calls are in Redis
        (under a backlog: ``AutoBatchWorker.take_ahead``), so that Redis does
        not wait for that work between batches."""
        prepared = self._prepared
        if prepared is not None and prepared.changes is changes:
            self._prepared = None  # used once: a retry makes its batch again (a new timestamp)
        try:
            return await self.manager.apply(changes, prepared=prepared, meanwhile=self._prepare_next)
        except BaseException:
            # the batch taken ahead is made again at its own turn, after this
            # one's retry: its timestamp must not be older than the retry's
            self._prepared = None
            raise

    def _prepare_next(self) -> None:
        changes = self.worker.take_ahead()
        if changes is None:
            return
        try:
            self._prepared = self.manager.prepare(changes)
        except Exception:  # not this batch's failure: the next one's own apply meets it again
            self._prepared = None

    def _on_result(self, changes: Sequence[Change], result: ApplyResult, latency: float) -> None:
        self.redis.answered(APPLY)
        now = time.time()
        refused = Counter(c.table for c in _refused(result))
        for table, count in Counter(change.table for change in changes).items():  # one label lookup per table
            self.metrics.changes_applied.labels(table).inc(count)
            if count > refused[table]:  # some of them are in Redis now
                self.metrics.last_applied.labels(table).set(now)
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
        # the applier retries only what may pass (TransientError): Redis away, loading, out of memory
        if error is None:
            self.redis.answered(APPLY)
        else:
            self.redis.failed(error, APPLY)

    def check_applier(self) -> None:
        """Raise the applier's crash, if it crashed (it must not die silently)."""
        task = self.worker.task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]

    # -- closing ----------------------------------------------------------------

    async def close(self) -> None:
        """Flush what is queued, then close the connections."""
        await self.worker.stop()
        await self.disconnect()

    async def disconnect(self) -> None:
        await self.source.close()
        if self._manager is not None:
            await self._manager.close()

    async def __aenter__(self) -> Pipeline:
        try:
            await self.open()
        except BaseException:
            await self.close()  # a table refused half-way: nothing stays open
            raise
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _refused(result: ApplyResult) -> Iterator[Change]:
    """The changes of a batch that are not in Redis: dead-lettered, fenced, blocked."""
    yield from (rejected.change for rejected in result.rejected)
    yield from result.fenced
    yield from (blocked.change for blocked in result.blocked)
