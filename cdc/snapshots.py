"""Loading a whole table into Redis, consistently, and sweeping what it lacks.

A snapshot reads every row in one consistent view (the source's, at version
``v``) and writes the documents in bulk (``publishers.bulk``): whole
documents and the section's index, page by page, without a stream entry or a
message per row; then ONE ``R`` message per partition of the section tells
subscribers to reload it (DESIGN.md §5). Then it deletes the documents of rows
the snapshot did not see (rows gone meanwhile) through ordinary delete changes.

Versions: a full snapshot writes over any ``@v`` (it is the truth at ``v``,
even over documents left by a source that went back in time). Nothing else
writes the table's documents meanwhile: the snapshot is a step of the table's
tracker, which polls only after it, and a sidecar that lost the table's lease
is refused by the fence that the bulk script checks like apply.lua.

Resumable (``cdc.snapshot_resume``): after each page the checkpoint hash
records the page's last key; a snapshot that stops (a crash at 80%) goes on
after it, in a later view ``v2``. The tracker then reads changes from the
first view's ``v1``: a row written at ``v1`` that changed before ``v2`` is
brought up to date by the change stream (a deletion is a change too), and a
change at or below ``v2`` of a row written at ``v2`` is dropped by the apply
rule. The sweep deletes, at ``v1``, the live documents neither part wrote,
told by key (the ``@seen`` sets, which outlive the crash and are dropped
only once the resume point is: resumed without them, a sweep would delete
every document), never by ``@v``:
two snapshots with nothing written at the source between them read at one
version. A row neither part saw was absent at ``v1`` (keys up to the resume
key) or at ``v2`` (the rest), and any change after ``v1`` still applies over
the delete.

Once done, the tracker records the table's shape before its checkpoint says
``streaming``: stopped between the two writes the other way round,
"streaming" without a shape read as a mirror of a cdc-sync before 0.2, and
the table was snapshotted again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from cdc.ahead import read_ahead
from cdc.checkpoint import CheckpointLine
from cdc.config import TableConfig
from cdc.feeder import RowFeeder
from cdc.metrics import Metrics
from cdc.snapshot_resume import ResumePoint, Resumes
from cdc.snapshot_writer import PageWriter
from cdc.sources.base import ChangeSource, SnapshotPage, TableInfo
from publishers import control
from publishers.bulk import BulkOutcome, BulkWriter
from publishers.manager import DataManager

log = logging.getLogger("cdc.tracker")


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
        self._applied = metrics.changes_applied.labels(self.table)  # as the S changes were
        self.page_size = page_size
        self.progress = SnapshotProgress()
        self.resumes = Resumes(manager, self.table)

    async def load(self, info: TableInfo, feeder: RowFeeder, shape: str = "") -> int:
        """Load the table and sweep; return the version changes are read from
        next (the first view's, when the snapshot was resumed)."""
        self.progress = SnapshotProgress()
        section = self.table_config.section
        resume = await self.resumes.take(shape, self.source, info)
        if resume is None:  # starting over: what an abandoned attempt wrote is no evidence
            await self.manager.forget_seen(section)
        sweep = (
            resume.sweep
            if resume
            else self.resumes.sweep_forced or bool(await self.manager.partitions(section))
        )
        views = await self._load(info, feeder, resume, shape, sweep)
        if sweep and "D" in self.table_config.operations:
            await self.line.wait_applied(await feeder.sweep(section, *views))
        # The resume point goes first: stopped between the two (a Redis blip, a
        # lease lost, a crash), a snapshot resumed without its @seen sets would
        # sweep every document it wrote; without a resume point it starts over.
        await self.resumes.clear()
        await self.manager.forget_seen(section)
        self.resumes.sweep_forced = False
        return min(views)

    async def _load(
        self, info: TableInfo, feeder: RowFeeder, resume: ResumePoint | None, shape: str, sweep: bool
    ) -> list[int]:
        views = list(resume.views) if resume else []
        earlier = len(views)  # views of the parts before this one
        self.progress.rows = resume.rows if resume else 0
        after = resume.after if resume else None
        writer = self._writer(feeder, reset=True, sweep=sweep)
        pages = self.source.snapshot(info, page_size=self.page_size, after=after, encoded=True)
        try:
            async for page in read_ahead(pages):
                if len(views) == earlier:  # this part's first page: its view
                    views.append(page.version)
                    await self.resumes.begin(views, shape, sweep)
                await writer.put(page)
            await writer.flush()
        finally:
            await writer.close()
        if len(views) == earlier:  # a source yields one page at least; be safe
            views.append(await self.source.current_version())
        await self._mark(writer.writer, views[-1], feeder)
        return views

    async def load_range(
        self, info: TableInfo, feeder: RowFeeder, start: tuple[Any, ...] | None, until: tuple[Any, ...] | None
    ) -> int:
        """Write the rows of a key range (``cdc.snapshot_range``); return how many."""
        self.progress = SnapshotProgress()
        writer = self._writer(feeder, reset=False)
        version = 0
        pages = self.source.snapshot(info, page_size=self.page_size, encoded=True, start=start, until=until)
        try:
            async for page in read_ahead(pages):
                version = page.version
                await writer.put(page)
            await writer.flush()
        finally:
            await writer.close()
        for partition in sorted(writer.partitions):
            await writer.writer.mark(
                self.table, self.table_config.section, partition, version=version, fence=feeder.mapper.fence
            )
        return self.progress.rows

    def _writer(self, feeder: RowFeeder, *, reset: bool, sweep: bool = False) -> PageWriter:
        async def settled(page: SnapshotPage, outcome: BulkOutcome) -> None:
            count = outcome.written + outcome.stale
            self._applied.inc(count)
            feeder.worker.stats.changes += count  # the heartbeat's "applied", as the S changes were
            self.progress.version, self.progress.total = page.version, page.total
            self.progress.rows += len(page)
            self._rows_loaded.inc(len(page))
            if reset:  # a whole snapshot: where a stopped one goes on from
                await self.resumes.page_done(page.last_key, self.progress.rows, page.total)

        writer = self.manager.bulk_writer()
        return PageWriter(self.table, self.table_config.section, writer, feeder, reset, settled, sweep)

    async def _mark(self, writer: BulkWriter, version: int, feeder: RowFeeder) -> None:
        """One ``R`` message in every partition the section has written."""
        section = self.table_config.section
        for partition in sorted(await self.manager.partitions(section)):
            await writer.mark(self.table, section, partition, version=version, fence=feeder.mapper.fence)


__all__ = ["SnapshotLoader", "SnapshotProgress", "control"]
