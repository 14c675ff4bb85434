"""RowFeeder: a table's source rows, mapped to changes and queued on the
AutoBatchWorker; a row that cannot be encoded goes to the dead letter.

Rows are mapped and queued a slice at a time (``SLICE``), so that the batch
applier gets to send batches in between.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from cdc.batching import AutoBatchWorker, Ticket
from cdc.describer import Describer
from cdc.errors import PoisonChange
from cdc.mapping import TableMapper
from cdc.metrics import Metrics
from cdc.sources.base import ChangeRow, TableInfo
from publishers.manager import DataManager
from publishers.model import Change

log = logging.getLogger("cdc.tracker")

# Rows mapped and queued at a time: a page of 5,000 rows is 100+ ms of CPU,
# and the batch applier must get to send batches in between. Half a batch
# (within these bounds), so that the applier, back from Redis, finds its next
# batch queued and waits for at most half a batch's mapping before sending it.
SLICE = 256
MIN_SLICE = 32
R = TypeVar("R")  # a source row: a ChangeRow, or a snapshot row (a dict)


class RowFeeder:
    """Turns a table's source rows into changes and queues them on the worker;
    a row that cannot be encoded goes to the dead letter instead."""

    def __init__(
        self, describer: Describer, *, worker: AutoBatchWorker, manager: DataManager, metrics: Metrics
    ) -> None:
        self.describer = describer  # the table as last described: its columns and mapper
        self.worker, self.manager = worker, manager
        self._dead_lettered = metrics.dead_lettered.labels(describer.table)
        self._slice = max(MIN_SLICE, min(SLICE, worker.max_batch_size // 2))
        # Rows whose JSON text the source writes, where it can (PostgreSQL's trigger
        # capture: cdc.sources.pg_read_encoded), which only TableMapper.from_row reads.
        encoded_reads = getattr(describer.source, "encoded_reads", None)
        if encoded_reads is not None:
            encoded_reads.on = True

    @property
    def info(self) -> TableInfo:
        assert self.describer.info is not None, "describe the table first"
        return self.describer.info

    @property
    def mapper(self) -> TableMapper:
        assert self.describer.mapper is not None, "describe the table first"
        return self.describer.mapper

    async def changes(self, rows: list[ChangeRow], ticket: Ticket) -> None:
        await self._queue(rows, ticket, self.mapper.from_row, lambda row: (row.key, row.op, row.version))

    async def sweep(self, section: str, version: int, *also: int) -> Ticket:
        """Queue the deletes of the live documents the whole snapshot at
        ``version`` (and, resumed, at the earlier ``also``) did not write (rows
        gone meanwhile; told by key, its ``@seen`` sets), at the oldest of
        those versions, so that any change after it still applies; return
        their sealed ticket."""
        oldest = min((version, *also))
        ticket = Ticket(version=oldest)
        async for partition, key in self.manager.stale_keys(section):
            await self.worker.put(self.mapper.delete(partition, key, oldest), ticket)
        ticket.seal()
        return ticket

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

    async def dead_letter_row(self, key: dict[str, Any], version: int, reason: str) -> None:
        """A snapshot row that cannot be written (``cdc.snapshot_pages``)."""
        payload: dict[str, object] = {"key": {k: str(v) for k, v in key.items()}}
        await self._dead_letter(reason, payload, self.mapper.address(key, "S", version))

    async def dead_letter_document(self, partition: str, key: str, version: int, reason: str) -> None:
        """A snapshot row whose document key Redis refused (another type there)."""
        section = self.describer.table_config.section
        address = Change(self.info.table, partition, section, key, "S", version, None)
        await self._dead_letter(reason, {"key": key}, address)

    async def _dead_letter(
        self, reason: str, payload: dict[str, object], address: Change | None = None
    ) -> None:
        """Record a row that cannot be applied: with its partition, section
        and key (``address``) when they are known, and ``payload``."""
        key = payload.get("key")
        log.error("change dead-lettered", extra={"table": self.info.table, "key": key, "reason": reason})
        self._dead_lettered.inc()
        await self.manager.dead_letter(address, reason, table=self.info.table, payload=payload)
