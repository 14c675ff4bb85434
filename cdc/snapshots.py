"""Loading a whole table into Redis, consistently, and sweeping what it lacks.

A snapshot reads every row in one consistent view (the source's), pages it
through the ``RowFeeder`` as ``S`` changes at the snapshot's version (they
replace the documents), waits until Redis holds them all, then deletes the
documents of rows the snapshot did not see (rows gone meanwhile) through
ordinary delete changes. Its progress is kept for ``cdc status`` and the
progress bar.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc.batching import Ticket
from cdc.checkpoint import CheckpointLine
from cdc.config import TableConfig
from cdc.feeder import RowFeeder
from cdc.metrics import Metrics
from cdc.sources.base import ChangeSource, TableInfo
from publishers import control
from publishers.manager import DataManager


@dataclass
class SnapshotProgress:
    rows: int = 0
    total: int | None = None
    version: int | None = None


class SnapshotLoader:
    def __init__(
        self,
        table_config: TableConfig,
        *,
        source: ChangeSource,
        manager: DataManager,
        line: CheckpointLine,
        metrics: Metrics,
        page_size: int,
    ) -> None:
        self.table_config = table_config
        self.table = table_config.table
        self.source, self.manager, self.line = source, manager, line
        self._rows_loaded = metrics.snapshot_rows.labels(self.table)
        self.page_size = page_size
        self.progress = SnapshotProgress()

    async def load(self, info: TableInfo, feeder: RowFeeder) -> int:
        """Load the table and sweep; return the version the documents are at."""
        self.progress = SnapshotProgress()
        version = await self._load(info, feeder)
        if "D" in self.table_config.operations:
            await self.line.wait_applied(await feeder.sweep(self.table_config.section, version))
        return version

    async def _load(self, info: TableInfo, feeder: RowFeeder) -> int:
        ticket = Ticket(version=0)
        version: int | None = None
        async for page in self.source.snapshot(info, page_size=self.page_size):
            version = ticket.version = page.version
            self.progress.version, self.progress.total = version, page.total
            await feeder.snapshot_rows(page.rows, ticket, page.version)
            self.progress.rows += len(page.rows)
            self._rows_loaded.inc(len(page.rows))
            await control.set_snapshot_progress(self.manager, self.table, self.progress.rows, page.total)
        if version is None:
            version = await self.source.current_version()
        ticket.seal()
        await self.line.wait_applied(ticket)
        return version
