"""ReaderLock: one statement or transaction at a time on the reader, with the
next page of a read under way served before the first page of a new one.

Why: the first page of a read larger than a page declares a ``WITH HOLD``
cursor over the rest (``pg_reads.first_page``), which PostgreSQL
materializes at COMMIT: ~0.45 s for 95,000 changes of the drain bench's
tables, during which the reader serves nobody. With the waiters in one line
(``asyncio.Lock``), a drain of ten tables started with ten such commits
back to back, each table's second page waiting behind the others' first:
the applier, its queue empty, waited ~0.37 s of every ~0.5 s for the first
5 s of the bench's 27 s drain. Pages of reads under way are quick (the rows
are already materialized), and they are what the applier is waiting for.

A new read does not wait forever behind reads under way: once it has waited
``max_wait`` seconds, it goes next (checked as the lock is handed on: after
the holder of the moment, and after older new reads that are overdue too).
"""

from __future__ import annotations

import asyncio
import collections
from types import TracebackType

# A new read waits this long at most behind pages of reads under way: what a
# quiet table's changes may be delayed by while the reader is saturated by
# another table's backlog.
MAX_WAIT = 5.0


class ReaderLock:
    """An ``asyncio.Lock`` whose waiters form two lines: pages of reads under
    way (``acquire(continuing=True)``), then everything else, each in order;
    the head of the second line goes first once it waited ``max_wait``."""

    def __init__(self, max_wait: float = MAX_WAIT) -> None:
        self.max_wait = max_wait
        self._locked = False
        self._continuing: collections.deque[asyncio.Future[None]] = collections.deque()
        self._others: collections.deque[tuple[asyncio.Future[None], float]] = collections.deque()

    def locked(self) -> bool:
        return self._locked

    def waiting(self) -> int:
        """How many wait for the lock (cancelled waiters are counted until they leave)."""
        return len(self._continuing) + len(self._others)

    async def acquire(self, *, continuing: bool = False) -> None:
        if not self._locked and not self._continuing and not self._others:
            self._locked = True
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        if continuing:
            self._continuing.append(waiter)
        else:
            self._others.append((waiter, loop.time()))
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed the lock, then cancelled before it ran: pass it on
            else:
                self._forget(waiter)
            raise

    def release(self) -> None:
        """Hand the lock to the next waiter (it stays locked), or unlock."""
        if not self._locked:
            raise RuntimeError("ReaderLock is not acquired")
        waiter = self._next()
        if waiter is None:
            self._locked = False
        else:
            waiter.set_result(None)

    def _next(self) -> asyncio.Future[None] | None:
        while self._continuing or self._others:
            overdue = bool(self._others) and (
                not self._continuing
                or self._others[0][0].get_loop().time() - self._others[0][1] >= self.max_wait
            )
            waiter = self._others.popleft()[0] if overdue else self._continuing.popleft()
            if not waiter.done():
                return waiter
        return None

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        if waiter in self._continuing:
            self._continuing.remove(waiter)
        self._others = collections.deque(entry for entry in self._others if entry[0] is not waiter)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def continuing(self) -> _Continuing:
        """``async with lock.continuing():`` for the next page of a read under way."""
        return _Continuing(self)


class _Continuing:
    def __init__(self, lock: ReaderLock) -> None:
        self.lock = lock

    async def __aenter__(self) -> None:
        await self.lock.acquire(continuing=True)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.lock.release()
