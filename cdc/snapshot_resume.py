"""Where a stopped snapshot goes on: fields of the table's checkpoint hash.

    snapshot_views   the versions of the snapshot's views so far, comma-separated
                     (the first view's, then one per resumption)
    snapshot_after   the last primary key of the last page written, JSON:
                     [[kind, text], ...] in key order (kind: int, str, bytes
                     (hex), text: the key value's text, read back by the
                     source as the column's type, as ``read_rows`` reads keys)
    snapshot_shape   the table's shape the pages were written in
    snapshot_sweep   "0" when the section had written no partition when the
                     snapshot began: nothing can be stale, no sweep (an
                     initial snapshot skips reading back every document)

A snapshot resumes only in the same shape (a column added meanwhile is in no
document of the first part), and only while the first view's version is
still valid: the tracker reads changes from it next, which must not have
expired (``cdc.snapshots`` says why that makes the documents right).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson

from cdc.errors import TrackingExpired
from cdc.sources.base import ChangeSource, TableInfo
from cdc.templates import render_key_value
from publishers import redis_calls
from publishers.manager import DataManager

log = logging.getLogger("cdc.tracker")

FIELDS = ("snapshot_views", "snapshot_after", "snapshot_shape", "snapshot_sweep")


@dataclass(frozen=True)
class ResumePoint:
    views: tuple[int, ...]
    after: tuple[Any, ...]
    rows: int  # rows written before it, for progress
    sweep: bool = True  # whether documents of rows gone may exist (``snapshot_sweep``)


class Resumes:
    """The resume point of one table's snapshot, in its checkpoint hash."""

    def __init__(self, manager: DataManager, table: str) -> None:
        self.manager, self.table = manager, table
        self.key = manager.layout.checkpoint(table)
        self._distrusted = False
        self.sweep_forced = False  # the next whole snapshot sweeps, whatever the partitions sets say

    def distrust(self) -> None:
        """The next ``take`` starts over, and that snapshot sweeps: Redis
        failed over without ``redis.durability``, so pages the stored point
        counts as written may be gone (on a cluster the point and the pages
        live on different nodes), and so may the partitions set that tells
        a snapshot there is something to sweep (left unswept: documents of
        deleted rows, 1 cluster run of 3)."""
        self._distrusted = True
        self.sweep_forced = True

    async def take(self, shape: str, source: ChangeSource, info: TableInfo) -> ResumePoint | None:
        """The point to go on from, or None (then any stale one is cleared)."""
        if self._distrusted:
            await self.clear()
            self._distrusted = False
            return None
        raw = await self._call(self.manager.client.hmget(self.key, [*FIELDS, "snapshot_rows"]))
        views, after, stored_shape, sweep, rows = (None if v is None else redis_calls.text(v) for v in raw)
        point = None
        if views and after and stored_shape == shape:
            versions = tuple(int(v) for v in views.split(","))
            point = ResumePoint(versions, decode_key(after), int(rows or 0), sweep != "0")
            if not await _still_valid(source, info, point.views[0]):
                point = None
        if point is None:
            await self.clear()
        else:
            log.info(
                "snapshot resuming",
                extra={"table": self.table, "after": after, "rows": point.rows, "views": views},
            )
        return point

    async def begin(self, views: list[int], shape: str, sweep: bool) -> None:
        mapping = {
            "snapshot_views": ",".join(map(str, views)),
            "snapshot_shape": shape,
            "snapshot_sweep": "1" if sweep else "0",
        }
        await self._call(self.manager.client.hset(self.key, mapping=mapping))  # type: ignore[arg-type]

    async def page_done(self, last_key: tuple[Any, ...] | None, rows: int, total: int | None) -> None:
        """Record a written page: its last key, and the progress ``cdc status`` shows."""
        mapping: dict[str, str] = {
            "snapshot_rows": str(rows),
            "snapshot_total": "" if total is None else str(total),
        }
        if last_key is not None:
            mapping["snapshot_after"] = encode_key(last_key)
        await self._call(self.manager.client.hset(self.key, mapping=mapping))  # type: ignore[arg-type]

    async def clear(self) -> None:
        await self._call(self.manager.client.hdel(self.key, *FIELDS))

    async def _call(self, awaitable: Any) -> Any:
        return await redis_calls.call(awaitable, self.manager.config.url)


def encode_key(values: tuple[Any, ...]) -> str:
    out = []
    for value in values:
        kind = "int" if type(value) is int else "str" if type(value) is str else "text"
        if isinstance(value, (bytes, bytearray, memoryview)):
            kind = "bytes"
        out.append([kind, render_key_value(value)])
    return orjson.dumps(out).decode()


def decode_key(text: str) -> tuple[Any, ...]:
    """The key values back: ints and strs as they were, bytes as bytes, any
    other value as its text (the source reads it as the column's type)."""
    values: list[Any] = []
    for kind, value in orjson.loads(text):
        values.append(int(value) if kind == "int" else bytes.fromhex(value) if kind == "bytes" else value)
    return tuple(values)


async def _still_valid(source: ChangeSource, info: TableInfo, version: int) -> bool:
    """Whether changes can still be read from ``version`` (else: start over)."""
    try:
        await source.read_changes(info, version, limit=1)
    except TrackingExpired as exc:
        log.info("snapshot starting over", extra={"table": info.table, "reason": exc.reason})
        return False
    return True
