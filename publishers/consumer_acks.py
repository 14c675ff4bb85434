"""Acknowledgements sent together: one ``consume_ack.lua`` call a partition
for every message finished while the previous call was on its way.

A consumer runs up to ``max_in_flight`` handlers at once; one call (and one
pooled connection) per acknowledgement made the Redis client run out of
connections (redis-py's pool holds 100) with three consumers in a process,
and cost a round trip a message.
"""

from __future__ import annotations

import asyncio
from functools import partial

from publishers.consumer_group import GroupPartition, persist

BATCH = 1000  # ids per call: Redis serves nobody else while a script runs


class Acks:
    """The acknowledgements of one consumer in one partition."""

    def __init__(self, group: GroupPartition, consumer: str) -> None:
        self.group, self.consumer = group, consumer
        self._queue: list[tuple[str, asyncio.Future[int]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def ack(self, entry_id: str) -> int:
        """``consume_ack.lua``'s answer for the entry: 1 acknowledged, 0 not
        pending, -1 held by another consumer now. Transient Redis errors are
        retried (``persist``)."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append((entry_id, future))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send())
        return await future

    async def idle(self) -> None:
        """Return once every acknowledgement queued has been sent."""
        while self._sender is not None:
            await asyncio.shield(self._sender)

    async def _send(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:BATCH], self._queue[BATCH:]
                try:
                    replies = await persist(
                        partial(self.group.ack, self.consumer, [i for i, _ in batch]), "acknowledgement"
                    )
                except Exception as exc:  # a refusal: each waiting runner raises it
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), reply in zip(batch, replies, strict=True):
                    if not future.done():
                        future.set_result(reply)
        finally:
            self._sender = None
