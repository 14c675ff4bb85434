"""A table's stored checkpoint: moved over the finished reads at the head of
its ``CheckpointLine``, written to Redis when the line says it is due (under
the table's lease's fencing token), and the lag it implies."""

from __future__ import annotations

import logging
from typing import Literal

from cdc.checkpoint import CheckpointLine
from cdc.errors import CdcError
from cdc.metrics import Metrics
from publishers.manager import DataManager

log = logging.getLogger("cdc.tracker")


class CheckpointKeeper:
    def __init__(self, table: str, line: CheckpointLine, manager: DataManager, metrics: Metrics) -> None:
        self.table, self.line, self.manager = table, line, manager
        self._lag_seconds = metrics.lag_seconds.labels(table)
        self._lag_versions = metrics.lag_versions.labels(table)
        self.fence = 0  # fencing token of the lease the table is held under
        self.source_version: int | None = None  # the bound of the latest read

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
        await self.manager.set_checkpoint(self.table, applied, state, fence=self.fence)
        self.line.persisted_now()

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
        self._lag_seconds.set(self.line.oldest_read_age())
        applied = self.line.applied
        if self.source_version is not None and applied is not None:
            self._lag_versions.set(max(0, self.source_version - applied))
