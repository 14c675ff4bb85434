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
rule. The sweep deletes, at ``v1``, the live documents whose ``@v`` is
neither ``v1`` nor ``v2``: a row neither part saw was absent at ``v1`` (keys
up to the resume key) or at ``v2`` (the rest), and any change after ``v1``
still applies over the delete.
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
from cdc.snapshot_pages import map_page
from cdc.snapshot_resume import ResumePoint, Resumes
from cdc.sources.base import ChangeSource, SnapshotPage, TableInfo
from publishers import control
from publishers.bulk import BulkWriter
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
        resume = await self.resumes.take(shape, self.source, info)
        sweep = resume.sweep if resume else bool(await self.manager.partitions(self.table_config.section))
        views = await self._load(info, feeder, resume, shape, sweep)
        if sweep and "D" in self.table_config.operations:
            await self.line.wait_applied(await feeder.sweep(self.table_config.section, *views))
        await self.resumes.clear()
        return min(views)

    async def _load(
        self, info: TableInfo, feeder: RowFeeder, resume: ResumePoint | None, shape: str, sweep: bool
    ) -> list[int]:
        writer = self.manager.bulk_writer()
        views = list(resume.views) if resume else []
        self.progress.rows = resume.rows if resume else 0
        after = resume.after if resume else None
        version: int | None = None
        pages = self.source.snapshot(info, page_size=self.page_size, after=after, encoded=True)
        async for page in read_ahead(pages):
            if version is None:
                version = page.version
                views.append(version)
                await self.resumes.begin(views, shape, sweep)
            await self._page(page, feeder, writer)
        if version is None:  # a source yields one page at least; be safe
            views.append(await self.source.current_version())
        await self._mark(writer, views[-1], feeder)
        return views

    async def _page(
        self, page: SnapshotPage, feeder: RowFeeder, writer: BulkWriter, *, reset: bool = True
    ) -> set[str]:
        """Write a page; return the partitions it wrote."""
        mapped = map_page(page, feeder.mapper)
        for primary_key, reason in mapped.poisoned:
            await feeder.dead_letter_row(primary_key, page.version, reason)
        outcome = await writer.write(
            self.table,
            self.table_config.section,
            mapped.rows,
            version=page.version,
            reset=reset,
            fence=feeder.mapper.fence,
        )
        settled = outcome.written + outcome.stale
        self._applied.inc(settled)
        feeder.worker.stats.changes += settled  # the heartbeat's "applied", as the S changes were
        for partition, key in outcome.wrong_type:
            reason = (
                "the document key holds another type than a hash (WRONGTYPE): delete it to mirror the row"
            )
            await feeder.dead_letter_document(partition, key, page.version, reason)
        self.progress.version, self.progress.total = page.version, page.total
        self.progress.rows += len(page)
        self._rows_loaded.inc(len(page))
        if reset:  # a whole snapshot: where to go on from
            await self.resumes.page_done(page.last_key, self.progress.rows, page.total)
        return set(mapped.rows.by_partition)

    async def load_range(
        self, info: TableInfo, feeder: RowFeeder, start: tuple[Any, ...] | None, until: tuple[Any, ...] | None
    ) -> int:
        """Write the rows of a key range (``cdc.snapshot_range``); return how many."""
        self.progress = SnapshotProgress()
        writer = self.manager.bulk_writer()
        section = self.table_config.section
        partitions: set[str] = set()
        version: int | None = None
        pages = self.source.snapshot(info, page_size=self.page_size, encoded=True, start=start, until=until)
        async for page in read_ahead(pages):
            version = page.version
            partitions |= await self._page(page, feeder, writer, reset=False)
        for partition in sorted(partitions):
            await writer.mark(self.table, section, partition, version=version or 0, fence=feeder.mapper.fence)
        return self.progress.rows

    async def _mark(self, writer: BulkWriter, version: int, feeder: RowFeeder) -> None:
        """One ``R`` message in every partition the section has written."""
        section = self.table_config.section
        for partition in sorted(await self.manager.partitions(section)):
            await writer.mark(self.table, section, partition, version=version, fence=feeder.mapper.fence)


__all__ = ["SnapshotLoader", "SnapshotProgress", "control"]
