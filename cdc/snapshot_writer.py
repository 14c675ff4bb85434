"""A snapshot's pages written one behind the other: page N+1 is mapped (the
sidecar's CPU) and sent while Redis writes page N (Redis's CPU), and the
source reads page N+2 meanwhile (``cdc.ahead``). One after the other, each
waited for the others: the sidecar's and Redis's time a row added up instead
of overlapping.

Each page's outcome is settled in page order: its dead letters, the progress
and the resume point (which must never pass a page not yet written).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from cdc.feeder import RowFeeder
from cdc.snapshot_pages import MappedPage, map_page_in_steps
from cdc.sources.base import SnapshotPage
from publishers.bulk import BulkOutcome, BulkWriter

WRONG_TYPE = "the document key holds another type than a hash (WRONGTYPE): delete it to mirror the row"

Settled = Callable[[SnapshotPage, BulkOutcome], Awaitable[None]]


# Pages being written at once: the next page is sent as soon as it is mapped,
# while Redis still works on the one before, so Redis never waits for the
# sidecar's settling and packing between two pages. 1,000,000 rows
# (``python -m bench --only snapshot``, same machine, one after the other):
# 1 page in flight 83,188 rows/s; 2: 119,804 and 127,828 (Redis 95% busy:
# now the bound); 3: 125,360, 10 MB more.
IN_FLIGHT = 2


@dataclass
class PageWriter:
    """Writes pages of ``table``'s ``section`` through ``writer``; ``settled``
    hears each page once written, in page order."""

    table: str
    section: str
    writer: BulkWriter
    feeder: RowFeeder
    reset: bool
    settled: Settled
    sweep: bool = False  # a whole snapshot that sweeps: record the written keys in @seen
    partitions: set[str] = field(default_factory=set)  # every partition written
    _pending: deque[tuple[SnapshotPage, MappedPage, asyncio.Task[BulkOutcome]]] = field(default_factory=deque)

    async def put(self, page: SnapshotPage) -> None:
        """Map ``page`` (while the pages before are written), then start writing it."""
        mapped = await map_page_in_steps(page, self.feeder.mapper)
        while len(self._pending) >= IN_FLIGHT:
            await self._settle()
        write = self.writer.write(
            self.table,
            self.section,
            mapped.rows,
            version=page.version,
            reset=self.reset,
            fence=self.feeder.mapper.fence,
            sweep=self.sweep,
        )
        self._pending.append((page, mapped, asyncio.create_task(write)))
        # The write's first turn now (pack and start sending), not after the
        # next page is mapped: the next page comes from a queue that does not
        # suspend when it holds one, so without this turn Redis only started
        # once that mapping was done, and the two never overlapped.
        await asyncio.sleep(0)

    async def flush(self) -> None:
        """Wait for every page in flight, in order."""
        while self._pending:
            await self._settle()

    async def close(self) -> None:
        """After a failure elsewhere (the source's read of the next page): let
        the pages being written finish and record them in order, up to the
        first that failed (a resumed snapshot goes on after the last one
        recorded, never after one not written); their own failure is the
        caller's to tell (the failure being raised is the one that stopped
        the snapshot)."""
        try:
            with contextlib.suppress(Exception):
                await self.flush()
        finally:
            for _, _, task in self._pending:  # after a failed page: written or not, not recorded
                with contextlib.suppress(BaseException):
                    await task
            self._pending.clear()

    async def _settle(self) -> None:
        page, mapped, task = self._pending[0]
        outcome = await task
        self._pending.popleft()
        for primary_key, reason in mapped.poisoned:
            await self.feeder.dead_letter_row(primary_key, page.version, reason)
        for partition, key in outcome.wrong_type:
            await self.feeder.dead_letter_document(partition, key, page.version, WRONG_TYPE)
        self.partitions |= mapped.rows.by_partition.keys()
        await self.settled(page, outcome)
