"""A subscriber's consistent read of a partition: its ``@seq``, the message at
that seq, and the documents of its sections, in one atomic Lua call
(``lua/load_partition.lua``), so the replica is exactly the state at that seq.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from publishers import redis_calls, scripts
from publishers.connection import RedisClient
from publishers.documents import decode_document
from publishers.layout import Layout
from publishers.messages import Document
from publishers.partition_sets import sections_of

Replica = dict[str, dict[str, Document]]
Call = Callable[[Awaitable[Any]], Awaitable[Any]]  # awaits a command, mapping its errors


class PartitionLoad:
    """Loads of one ``partition`` through ``client``; ``call`` awaits each command."""

    def __init__(self, client: RedisClient, layout: Layout, partition: str, call: Call, url: str) -> None:
        self.client, self.layout, self.partition = client, layout, partition
        self._call, self._url = call, url

    async def load(self, fixed_sections: Sequence[str] | None) -> tuple[int, bytes | None, Replica]:
        """Seq, the message at seq, and documents, in one atomic read. Without a
        fixed section list the sections are those whose ``ns:@partitions:section``
        names this partition; that set only grows and is written before any
        document, so when it is the same after the load, no section was missed;
        they are found through the registry ``ns:@sections``, not a SCAN."""
        sections = fixed_sections or await self.sections()
        for _ in range(10):
            seq, last, replica = await self._load_sections(sections)
            if fixed_sections:
                break
            latest = await self.sections()
            if set(latest) <= set(sections):
                break
            sections = latest
        return seq, last, replica

    async def _load_sections(self, sections: Sequence[str]) -> tuple[int, bytes | None, Replica]:
        p = self.partition
        keys = [self.layout.seq(p), self.layout.stream(p), *(self.layout.index(p, s) for s in sections)]
        args = [self.layout.document_prefix(p, s) for s in sections]
        reply = await self._call(scripts.run(self.client, scripts.LOAD_PARTITION, keys, args, self._url))
        replica: Replica = {}
        for section, flat in zip(sections, reply[2:], strict=True):
            docs = replica.setdefault(section, {})
            for i in range(0, len(flat), 2):
                document = decode_document(_pairs(flat[i + 1]))
                if document is not None:
                    docs[redis_calls.text(flat[i])] = document
        last = reply[1]
        return (
            int(reply[0]),
            (last if isinstance(last, bytes) or last is None else str(last).encode()),
            replica,
        )

    async def sections(self) -> list[str]:
        """Sections that have written this partition (the sections registry:
        ``partition_sets.sections_of``)."""
        found: list[str] = await self._call(sections_of(self.client, self.layout, self.partition))
        return found


def _pairs(flat: Any) -> dict[Any, Any]:
    return dict(zip(flat[::2], flat[1::2], strict=True)) if isinstance(flat, list) else dict(flat)
