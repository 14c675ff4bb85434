"""Reading ahead: an async iterator's next items fetched while the caller
works on the current one.

A snapshot is a loop of read a page (the source), map it (the sidecar's CPU),
write it (Redis); one after the other, each side idles while the others work
(py-spy: 20% of the snapshot's samples in ``select``, waiting). Read ahead,
the source reads page N+1 while Redis writes page N.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")
_END = object()


async def read_ahead(items: AsyncIterator[T], depth: int = 1) -> AsyncIterator[T]:
    """``items``, with up to ``depth`` of them fetched before they are asked
    for. An error of ``items`` is raised where its item would have come; the
    iterator is closed (``aclose``) when the caller stops early."""
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=depth)

    async def pull() -> None:
        try:
            async for item in items:
                await queue.put(item)
        except Exception as exc:  # handed to the consumer, raised there
            await queue.put(exc)
            return
        await queue.put(_END)

    task = asyncio.create_task(pull())
    try:
        while True:
            item = await queue.get()
            if item is _END:
                return
            if isinstance(item, Exception):
                raise item
            yield item  # type: ignore[misc]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        close = getattr(items, "aclose", None)
        if close is not None:
            await close()
