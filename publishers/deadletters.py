"""Reading and pruning the dead letter ``ns:@deadletter`` (docs/REDIS.md): the
changes that could not be applied, each with its table, key and reason.

The stream is one key for the namespace, so every call here is a one-key
command (``XRANGE``, ``XDEL``, ``XTRIM``) that a Redis Cluster serves from the
key's slot like a single server. What an operator asks is per table, so the
readers page through the stream (``XRANGE ... COUNT``) and keep one table's.

Entry ids are the stream's own (``<ms>-<n>``): they only grow (``XTRIM`` to
empty keeps the stream's last id, unlike ``DEL``), so an id read before a run
marks what the run added (``after``)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from publishers import redis_calls
from publishers.manager import DataManager

# Entries per XRANGE page: one round trip per this many (an entry is ~0.5 KB).
PAGE = 1000
# Ids per XDEL: one round trip per this many, each call short (Redis serves no one else meanwhile).
DELETE_CHUNK = 1000
ENTRY_ID = re.compile(r"\d{1,20}-\d{1,20}")
FIELDS = ("table", "partition", "section", "key", "op", "version", "reason", "values", "ts")


@dataclass(frozen=True)
class DeadLetter:
    """One entry of the dead letter: what ``DataManager.dead_letter`` wrote."""

    id: str
    table: str
    partition: str
    section: str
    key: str
    op: str
    version: str
    reason: str
    values: str  # a JSON object (the encoded columns, or {"key": {...}}), or "null"
    ts: str

    @classmethod
    def from_entry(cls, entry_id: Any, fields: dict[Any, Any]) -> DeadLetter:
        text = {redis_calls.text(k): redis_calls.text(v) for k, v in fields.items()}
        return cls(redis_calls.text(entry_id), *(text.get(name, "") for name in FIELDS))

    def decoded_values(self) -> Any:
        """The ``values`` field parsed (None when absent or not JSON)."""
        try:
            return orjson.loads(self.values) if self.values else None
        except orjson.JSONDecodeError:
            return None

    def as_json(self) -> dict[str, Any]:
        """For ``--json``: every field, ``values`` as the JSON it holds."""
        out: dict[str, Any] = {"id": self.id, **{name: getattr(self, name) for name in FIELDS}}
        out["values"] = self.decoded_values()
        return out


@dataclass(frozen=True)
class Page:
    entries: list[DeadLetter]
    next: str | None  # the id to pass as ``after`` for the next page; None: nothing after


def check_id(entry_id: str) -> str:
    """``entry_id`` if it is a stream entry id, else ValueError saying what one is."""
    if not ENTRY_ID.fullmatch(entry_id):
        raise ValueError(
            f"{entry_id!r} is not a dead letter id (ids look like 1718000000000-0: cdc deadletter list)"
        )
    return entry_id


async def counts(manager: DataManager) -> dict[str, int]:
    """Entries waiting in the dead letter, per table (tables with none left out)."""
    per_table: Counter[str] = Counter()
    async for letter in scan(manager):
        per_table[letter.table] += 1
    return dict(per_table)


async def scan(manager: DataManager, *, after: str | None = None) -> AsyncIterator[DeadLetter]:
    """Every entry after the id ``after`` (all when None), oldest first, a page per round trip."""
    key = manager.layout.deadletter()
    start = "-" if after is None else "(" + after
    while True:
        page: Any = await redis_calls.call(
            manager.client.xrange(key, min=start, max="+", count=PAGE), manager.config.url
        )
        for entry_id, fields in page:
            yield DeadLetter.from_entry(entry_id, fields)
        if len(page) < PAGE:
            return
        start = "(" + redis_calls.text(page[-1][0])


async def entries(
    manager: DataManager, *, table: str | None = None, after: str | None = None, limit: int = 100
) -> Page:
    """Up to ``limit`` entries after the id ``after``, oldest first, only
    ``table``'s when given (compared as the config writes names: case aside)."""
    found: list[DeadLetter] = []
    async for letter in scan(manager, after=after):
        if table is None or letter.table.lower() == table.lower():
            if len(found) == limit:
                return Page(found, found[-1].id)
            found.append(letter)
    return Page(found, None)


async def entry(manager: DataManager, entry_id: str) -> DeadLetter | None:
    """The entry with this id, or None."""
    check_id(entry_id)
    key = manager.layout.deadletter()
    found: Any = await redis_calls.call(
        manager.client.xrange(key, min=entry_id, max=entry_id), manager.config.url
    )
    return DeadLetter.from_entry(found[0][0], found[0][1]) if found else None


async def delete(manager: DataManager, ids: Sequence[str]) -> int:
    """Remove these entries; how many were there."""
    key = manager.layout.deadletter()
    removed = 0
    for start in range(0, len(ids), DELETE_CHUNK):
        chunk = [check_id(i) for i in ids[start : start + DELETE_CHUNK]]
        removed += int(await redis_calls.call(manager.client.xdel(key, *chunk), manager.config.url))
    return removed


async def purge(manager: DataManager, table: str | None = None) -> int:
    """Remove every entry (``table``'s only, when given); how many were removed.
    All of them: ``XTRIM MAXLEN 0``, which keeps the stream's last id (so ids
    keep growing) and removes nothing added after it ran."""
    if table is not None:
        ids = [letter.id async for letter in scan(manager) if letter.table.lower() == table.lower()]
        return await delete(manager, ids)
    key = manager.layout.deadletter()
    trim = manager.client.xtrim(key, maxlen=0, approximate=False)
    return int(await redis_calls.call(trim, manager.config.url))


async def last_id(manager: DataManager) -> str:
    """The id of the newest entry ("0-0" when empty): entries added later have higher ids."""
    key = manager.layout.deadletter()
    newest = await redis_calls.call(manager.client.xrevrange(key, count=1), manager.config.url)
    return redis_calls.text(newest[0][0]) if newest else "0-0"
