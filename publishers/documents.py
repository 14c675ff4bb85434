"""Reading documents back: one, a section's, the partitions a section has
written, and the stale ones a re-snapshot sweeps (DESIGN.md §4's hashes).

Reads are kept apart from the apply path's writes: applications and tools
use them, the daemon only for the re-snapshot sweep.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from publishers import exact_json, redis_calls, scripts
from publishers.connection import RedisClient
from publishers.layout import Layout

_SCAN_COUNT = 1000
Reply = Any


class Documents:
    """The document reads of one Redis (``client``, key ``layout``; ``url`` for messages)."""

    def __init__(self, client: RedisClient, layout: Layout, url: str) -> None:
        self.client, self.layout, self.url = client, layout, url

    async def _call(self, awaitable: Any) -> Any:
        return await redis_calls.call(awaitable, self.url)

    async def document(self, partition: str, section: str, key: str) -> dict[str, Any] | None:
        """A live document, values decoded; None when absent or deleted."""
        raw = await self._call(self.client.hgetall(self.layout.document(partition, section, key)))
        return decode_document(raw)

    async def documents(self, partition: str, section: str) -> dict[str, dict[str, Any]]:
        """Every live document of a section in a partition (not atomic: for
        tests and tools; the subscriber loads consistently)."""
        out: dict[str, dict[str, Any]] = {}
        async for keys in self._index_batches(partition, section):
            prefix = self.layout.document_prefix(partition, section)
            replies = await self._pipelined("hgetall", [prefix + k for k in keys])
            for key, raw in zip(keys, replies, strict=True):
                doc = decode_document(raw)
                if doc is not None:
                    out[key] = doc
        return out

    async def partitions(self, section: str) -> set[str]:
        """The partition values ``section`` has written."""
        members = await self._call(self.client.smembers(self.layout.partitions(section)))
        return {redis_calls.text(m) for m in members}

    async def stale_keys(self, section: str) -> AsyncIterator[tuple[str, str]]:
        """(partition, key) of the section's live documents the whole snapshot
        running now did not write (its ``@seen`` sets): those rows are gone
        from the source and the daemon deletes them."""
        for partition in sorted(await self.partitions(section)):
            prefix = self.layout.document_prefix(partition, section)
            seen = self.layout.seen(partition, section)
            async for keys in self._index_batches(partition, section):
                documents = [seen] + [prefix + key for key in keys]  # one partition: one slot on a cluster
                script = scripts.run(self.client, scripts.STALE_KEYS, documents, keys)
                stale = await self._call(script)
                for position in stale:
                    yield partition, keys[int(position) - 1]

    async def forget_seen(self, section: str) -> list[str]:
        """Drop the ``@seen`` sets of the section's partitions: before a whole
        snapshot that starts over, and once its sweep is done. Returns their keys."""
        keys = [self.layout.seen(partition, section) for partition in sorted(await self.partitions(section))]
        for key in keys:  # DEL, not delete(): a cluster client sends delete() as a pipeline
            await self._call(self.client.execute_command("DEL", key))
        return keys

    async def _index_batches(self, partition: str, section: str) -> AsyncIterator[list[str]]:
        """The section's index, SSCAN page by page (never one huge SMEMBERS)."""
        index = self.layout.index(partition, section)
        cursor: int = 0
        while True:
            cursor, members = await self._call(self.client.sscan(index, cursor, count=_SCAN_COUNT))
            if members:
                yield [redis_calls.text(m) for m in members]
            if int(cursor) == 0:
                return

    async def _pipelined(self, method: str, keys: Iterable[str], *args: Any) -> list[Reply]:
        """``method(key, *args)`` for every key, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            getattr(pipe, method)(key, *args)
        return await redis_calls.execute(pipe, self.url)


def decode_document(raw: Mapping[Any, Any] | None) -> dict[str, Any] | None:
    """Column values of a stored hash, JSON-decoded exactly (``exact_json.loads``);
    None for none or a tombstone."""
    if not raw:
        return None
    fields = {redis_calls.text(k): v for k, v in raw.items()}
    if "@del" in fields:
        return None
    return {name: exact_json.loads(value) for name, value in fields.items() if not name.startswith("@")}
