"""A snapshot of part of a table: ``cdc snapshot --table T --from KEY --to KEY``.

A user backfills a key range (documents lost or damaged in Redis, say)
without touching the rest: the rows whose primary key is in the range, both
ends inclusive (either may be left out), are read in one consistent view at
version ``v`` and written in bulk (``publishers.bulk``) without writing over
a document whose ``@v`` is above ``v`` (the change stream passed it: the
table's tracker keeps streaming from its own checkpoint, which the range does
not move). Nothing is swept (a row deleted in the range is deleted by its
change), and one ``R`` message goes to each partition the range wrote.

A change at or below ``v`` of a row the range wrote is dropped by the apply
rule when the tracker reads it: the snapshot holds it. A row absent at ``v``
is not written, so its delete (above its document's ``@v``) still applies.

The request goes to the table's owner through the checkpoint hash
(``snapshot_range``: JSON ``{"from": text or null, "to": text or null}``,
beside ``snapshot_requested``); the key is its columns' values as text, in
primary-key order, separated by commas for a key of several columns (the
source reads each as its column's type).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from cdc.errors import CdcError
from cdc.feeder import RowFeeder
from cdc.snapshots import SnapshotLoader
from cdc.sources.base import TableInfo
from publishers import control, redis_calls
from publishers.manager import DataManager

log = logging.getLogger("cdc.tracker")

FIELD = "snapshot_range"


@dataclass(frozen=True)
class KeyRange:
    start: str | None  # as the user wrote it: values separated by commas
    until: str | None

    def bounds(self, info: TableInfo) -> tuple[tuple[Any, ...] | None, tuple[Any, ...] | None]:
        """(start, until) as key values in key order; raises for a key of the wrong width."""
        return _values(self.start, info, "--from"), _values(self.until, info, "--to")

    def describe(self) -> str:
        return f"[{self.start or 'first key'} .. {self.until or 'last key'}]"


def _values(text: str | None, info: TableInfo, option: str) -> tuple[Any, ...] | None:
    if text is None:
        return None
    width = len(info.primary_key)
    values = (text,) if width == 1 else tuple(text.split(","))
    if len(values) != width:
        raise CdcError(
            f"{info.table}: {option} {text!r} has {len(values)} value(s); the primary key"
            f" ({', '.join(info.primary_key)}) has {width}: give them in that order, separated by commas"
        )
    return values


async def request_range(manager: DataManager, table: str, key_range: KeyRange) -> None:
    """Store the range for the owner; ``publishers.control.request_snapshot`` asks it."""
    value = orjson.dumps({"from": key_range.start, "to": key_range.until})
    await redis_calls.call(
        manager.client.hset(manager.layout.checkpoint(table), FIELD, value), manager.config.url
    )


async def requested(manager: DataManager, table: str) -> tuple[KeyRange | None, bytes | str | None]:
    """The range requested for ``table`` (None: a whole snapshot), and its stored text."""
    key = manager.layout.checkpoint(table)
    raw = await redis_calls.call(manager.client.hget(key, FIELD), manager.config.url)
    if raw is None:
        return None, None
    found = orjson.loads(raw)
    return KeyRange(found.get("from"), found.get("to")), raw


async def forget(manager: DataManager, table: str, raw: bytes | str) -> None:
    """Remove the request once it is done, unless another one replaced it meanwhile."""
    await control.clear_field(manager, table, FIELD, raw)


class _Tracker(Protocol):
    """What of ``cdc.tracker.ChangeTracker`` a range snapshot uses."""

    table: str
    manager: DataManager
    loader: SnapshotLoader
    feeder: RowFeeder
    position: int | None

    @property
    def info(self) -> TableInfo | None: ...

    async def snapshot(self, reason: str) -> None: ...


REQUESTED = "requested by cdc snapshot"  # the reason of a snapshot ``cdc snapshot`` asks for


async def due(tracker: _Tracker, reason: str) -> None:
    """The snapshot a tracker owes: of the range ``cdc snapshot`` asked for,
    if it asked for one (and the table streams already), else of the table."""
    key_range, raw = await requested(tracker.manager, tracker.table)
    if key_range is not None and reason == REQUESTED and tracker.position is not None:
        await run_range(tracker, key_range)
    else:
        await tracker.snapshot(reason)
    # removed once done (a whole snapshot covers the range too): a failure or a crash
    # in between leaves the request, and the next try runs the range, not the whole table
    if raw is not None:
        await forget(tracker.manager, tracker.table, raw)


async def run_range(tracker: _Tracker, key_range: KeyRange) -> None:
    """Write the rows of ``key_range`` again; the tracker's checkpoint and read
    position stay where they are."""
    assert tracker.info is not None
    start, until = key_range.bounds(tracker.info)
    log.info(
        "snapshot of a key range starting", extra={"table": tracker.table, "range": key_range.describe()}
    )
    rows = await tracker.loader.load_range(tracker.info, tracker.feeder, start, until)
    log.info("snapshot of a key range done", extra={"table": tracker.table, "rows": rows})
