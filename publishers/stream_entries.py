"""A partition stream's entries as a reader takes them: ``(seq, text)`` pairs
out of ``XREAD``/``XRANGE`` replies, and ``Entry``, a delivered message.

Shared by the readers of the stream (``publishers.subscriber``, and any other
client of the change stream): decoding the message itself is
``publishers.messages.decode_message``, applying its patch
``publishers.messages.apply_patch``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from publishers.connection import RedisClient
from publishers.layout import Layout
from publishers.messages import Message, stream_seq

Call = Callable[[Awaitable[Any]], Awaitable[Any]]  # awaits a command, mapping its errors


@dataclass(frozen=True, slots=True)
class Entry:
    """One delivered message: its seq, its JSON text exactly as the stream
    holds it (UTF-8), and its decoded form."""

    seq: int
    text: bytes
    message: Message


def read_entries(reply: Any) -> list[tuple[int, bytes]]:
    """An ``XREAD`` reply for one stream as (seq, message text) pairs (RESP2 or RESP3)."""
    if not reply:
        return []
    items = next(iter(reply.values()))[0] if isinstance(reply, dict) else reply[0][1]  # RESP3 / RESP2
    return [(stream_seq(entry_id), message_text(fields)) for entry_id, fields in items]


def range_entries(reply: Any) -> list[tuple[int, bytes]]:
    """An ``XRANGE`` reply as (seq, message text) pairs."""
    return [(stream_seq(entry_id), message_text(fields)) for entry_id, fields in reply]


def message_text(fields: Any) -> bytes:
    """The message (field ``m``) of one stream entry's fields, as bytes."""
    value = fields.get(b"m") if b"m" in fields else fields.get("m")
    return value if isinstance(value, bytes) else str(value).encode()


class StreamReads:
    """The reads of one partition's stream that check what a reader took:
    entries between two seqs, and whether a taken entry is still there."""

    def __init__(self, client: Callable[[], RedisClient], layout: Layout, partition: str, call: Call) -> None:
        self._client, self._call = client, call
        self._stream, self._seq = layout.stream(partition), layout.seq(partition)

    async def fill(self, first: int, last: int) -> list[tuple[int, bytes]] | None:
        """The entries first..last, or None if any is gone (trimmed, or the data replaced)."""
        reply = await self._call(self._client().xrange(self._stream, f"{first}-0", f"{last}-0"))
        entries = range_entries(reply)
        return entries if [seq for seq, _ in entries] == list(range(first, last + 1)) else None

    async def holds(self, position: int, last: bytes | None) -> bool:
        """Whether the stream still holds, at ``position``, the message ``last``
        taken there. If the entry is gone it was trimmed (the gap is found when
        the next entries are read), unless ``@seq`` fell below the position:
        the partition's data was replaced."""
        if position == 0 or last is None:
            return True
        key = f"{position}-0"
        found = await self._call(self._client().xrange(self._stream, key, key))
        if found:
            return message_text(found[0][1]) == last
        return int(await self._call(self._client().get(self._seq)) or 0) >= position
