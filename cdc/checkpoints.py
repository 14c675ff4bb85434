"""A table's stored checkpoint: moved over the finished reads at the head of
its ``CheckpointLine``, written to Redis when the line says it is due (under
the table's lease's fencing token), and what it implies for the outside: the
lag (``cdc_lag_seconds``, ``cdc_lag_versions``) and how long the stored
checkpoint stays inside the source's retention (``cdc_retention_headroom_seconds``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Literal

from prometheus_client import Gauge

from cdc.checkpoint import CheckpointLine
from cdc.errors import CdcError
from cdc.metrics import Metrics
from cdc.reachability import Component
from publishers.manager import DataManager
from publishers.model import Checkpoint

log = logging.getLogger("cdc.tracker")


class CheckpointKeeper:
    def __init__(
        self, table: str, line: CheckpointLine, manager: DataManager, metrics: Metrics, redis: Component
    ) -> None:
        self.table, self.line, self.manager = table, line, manager
        self.metrics = metrics
        self.redis = redis  # each checkpoint write tells whether Redis answers
        self.fence = 0  # fencing token of the lease the table is held under
        self.source_version: int | None = None  # the bound of the latest read
        # told each streaming checkpoint Redis now holds (a logical-decoding source
        # moves the table's replication slot up to it: cdc.sources.postgres_logical)
        self.on_stored: Callable[[str, int], None] | None = None

    async def load(self) -> Checkpoint | None:
        """Read the table's checkpoint as Redis holds it now (a previous owner
        may have advanced it) and go on from it if it is a streaming one;
        return what was read (None: none)."""
        checkpoint = await self.redis.observe(self.manager.get_checkpoint(self.table))
        self.reset(checkpoint if checkpoint is not None and checkpoint.state == "streaming" else None)
        return checkpoint

    def reset(self, stored: Checkpoint | None) -> None:
        """Go on from ``stored``, the streaming checkpoint Redis holds (None: none)."""
        position = None if stored is None else stored.version
        self.line.reset(position, fresh_at=stored_freshness(stored, self.line))
        if position is not None and self.on_stored is not None:
            self.on_stored(self.table, position)

    async def complete(self, *, block: bool) -> None:
        """Advance ``applied`` over the finished reads at the head of the line
        (``block``: wait for every read first), and write the checkpoint when due."""
        advanced = await self.line.drain() if block else self.line.advance()
        self.update_lag()
        if advanced and self.line.persist_due():
            await self.persist("streaming")

    async def all_applied(self) -> bool:
        await self.complete(block=False)
        return self.line.empty

    async def persist(self, state: Literal["snapshotting", "streaming"]) -> None:
        applied = self.line.applied
        if applied is None:
            return
        await self.redis.observe(self.manager.set_checkpoint(self.table, applied, state, fence=self.fence))
        self.line.persisted_now()
        if state == "streaming" and self.on_stored is not None:
            self.on_stored(self.table, applied)

    async def flush(self, *, quietly: bool = False) -> None:
        """Persist the checkpoint of everything applied so far (shutdown).
        ``quietly``: a failure is logged, and the checkpoint stays where it
        is (what was applied since is read again: harmless)."""
        try:
            await self.complete(block=False)
            if self.line.applied is not None and self.line.applied != self.line.persisted:
                await self.persist("streaming")
        except CdcError as exc:
            if not quietly:
                raise
            log.warning("checkpoint not persisted", extra={"table": self.table, "error": str(exc)})

    def update_lag(self) -> None:
        self.metrics.lag_seconds.labels(self.table).set(self.lag())
        applied = self.line.applied
        if self.source_version is not None and applied is not None:
            self.metrics.lag_versions.labels(self.table).set(max(0, self.source_version - applied))

    def lag(self) -> float:
        """The line's lag; while Redis cannot be reached, at least since it
        last answered: an empty read "applied" then proves nothing about the mirror."""
        lag = self.line.lag()
        if self.redis.up:
            return lag
        return max(lag, time.monotonic() - self.redis.answered_at)

    def update_headroom(self, retention: float | None) -> None:
        """``retention``: seconds the source keeps changes (None: unknown, or
        kept for ever). The stored checkpoint falls out of it ``retention``
        after it was fresh; the series is left out while either is unknown."""
        age = self.line.persisted_age()
        if retention is None or age is None:
            _remove(self.metrics.retention_headroom, self.table)
        else:
            self.metrics.retention_headroom.labels(self.table).set(retention - age)

    def forget_metrics(self) -> None:
        """The table is not run here (given back, or another sidecar's): its
        series go, so that only the sidecar that runs it reports them."""
        for gauge in (self.metrics.lag_seconds, self.metrics.lag_versions, self.metrics.retention_headroom):
            _remove(gauge, self.table)


def stored_freshness(checkpoint: Checkpoint | None, line: CheckpointLine) -> float | None:
    """When (on ``line``'s clock) the stored checkpoint was known fresh: when
    it was written, which is at most a batch's apply after its read."""
    if checkpoint is None:
        return None
    try:
        written = datetime.fromisoformat(checkpoint.updated_at).timestamp()
    except ValueError:
        return None
    return line.now() - max(0.0, time.time() - written)


def _remove(gauge: Gauge, *labels: str) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        pass  # not there
