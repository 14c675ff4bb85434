"""The AutoBatchWorker: a bounded queue of changes, applied in batches.

- Producers (the trackers) ``await put_many(changes, ticket)`` (or ``put``);
  when ``capacity`` changes are queued they wait: backpressure instead of
  unbounded memory. The queue is a deque of (change, ticket) pairs, not an
  ``asyncio.Queue``: a read queues hundreds of changes at once, and the
  queue's per-item bookkeeping (a coroutine per put, ``task_done`` per
  change) was a tenth of the sidecar's CPU per change.
- The applier takes whatever is queued, up to ``max_batch_size``, and applies
  it at once: a change alone in the queue is never held back waiting for a
  full batch; while one batch is in flight the next one fills up, so batches
  grow with the load by themselves. ``max_wait`` is only an upper bound: a
  batch is closed after it even if producers keep trickling changes in.
- One applier, in queue order: each table's changes reach Redis in the order
  they were read, which keeps per-partition version order. Under a backlog
  (a whole batch already queued) the apply function may take the next batch
  while its calls are in Redis (``take_ahead``) to prepare it meanwhile; that
  batch is the next one applied, and still counts against ``capacity``.
- A batch that fails on a transient Redis error is retried, whole, with
  exponential backoff and equal jitter, for as long as the outage lasts (replays are
  harmless under the apply rule). Content failures are isolated by the data
  manager, which dead-letters the poison change and applies the rest.
- Every change belongs to a ``Ticket``: the set of changes one read produced.
  A ticket completes when all its changes are applied; only then may the
  tracker advance its checkpoint past that read. A change the data manager
  did not apply completes its ticket with a ``Refusal`` saying why: FENCED
  (its lease was taken over) or blocked (a key its partition shares is
  damaged, or the ACL refuses it); the tracker must not move past it. A
  blocked change never stops the applier: the other changes of its batch
  apply, one error line per blocked partition and batch says why.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Literal

from tenacity import AsyncRetrying, retry_if_exception_type

from cdc.errors import TransientError
from publishers.model import ApplyResult, Blocked, Change
from publishers.retrying import equal_jitter

log = logging.getLogger("cdc.batching")

# Between tries of a failed batch: 0.05-0.1 s, 0.1-0.2 s, ... up to 2.5-5 s.
RETRY_WAIT = equal_jitter(0.1, 5.0)

ApplyFn = Callable[[Sequence[Change]], Awaitable[ApplyResult]]
Queued = tuple[Change, "Ticket"]
# Producers yield to the event loop after this many single puts (and after
# every ``put_many``), so that the applier sends the next batch as soon as
# Redis answers the last one, instead of waiting until the queue is full again
# (Redis would sit idle meanwhile).
YIELD_EVERY = 64


@dataclass(frozen=True)
class Refusal:
    """Why changes of a read were not applied (so the read is not all in Redis)."""

    kind: Literal["fenced", "blocked"]  # lease taken over | a key of the partition cannot be written
    partition: str
    reason: str  # "FENCED", or the Redis reason (ApplyResult.blocked)

    @property
    def fenced(self) -> bool:
        return self.kind == "fenced"


@dataclass(eq=False)
class Ticket:
    """Changes of one read; ``done`` once every one of them is settled:
    applied, dead-lettered, or not applied (``refusal`` says why)."""

    version: int
    pending: int = 0
    changes: int = 0  # every change ever added
    sealed: bool = False
    # the first reason a change was not applied; FENCED outranks blocked
    # (the table is no longer ours: nothing to retry)
    refusal: Refusal | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, count: int = 1) -> None:
        self.pending += count
        self.changes += count

    def seal(self) -> None:
        """No more changes will be added: complete now if nothing is pending."""
        self.sealed = True
        if self.pending == 0:
            self.done.set()

    def applied(self, count: int = 1, *, refusal: Refusal | None = None) -> None:
        """``count`` changes are settled; with ``refusal``, some were not applied."""
        if refusal is not None and (self.refusal is None or refusal.fenced and not self.refusal.fenced):
            self.refusal = refusal
        self.pending -= count
        if self.pending == 0 and self.sealed:
            self.done.set()


@dataclass
class BatchStats:
    batches: int = 0
    changes: int = 0
    retries: int = 0
    last_batch_size: int = 0
    last_latency: float = 0.0


class AutoBatchWorker:
    def __init__(
        self,
        apply: ApplyFn,
        *,
        max_batch_size: int = 500,
        max_wait: float = 0.1,
        capacity: int = 10_000,
        on_result: Callable[[Sequence[Change], ApplyResult, float], None] | None = None,
        on_degraded: Callable[[BaseException | None], None] | None = None,
    ) -> None:
        self._apply = apply
        self._ahead: tuple[list[Queued], list[Change]] | None = None  # taken by ``take_ahead``
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait
        self.capacity = max(1, capacity)
        self._items: deque[Queued] = deque()
        self._unfinished = 0  # queued or being applied
        self._not_empty = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._all_done = asyncio.Event()
        self._all_done.set()
        self._on_result = on_result
        self._on_degraded = on_degraded
        self.stats = BatchStats()
        self._task: asyncio.Task[None] | None = None
        self._puts = 0

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The applier; the daemon watches it so that a crash of it is not silent."""
        return self._task

    @property
    def depth(self) -> int:
        """Changes queued, the batch taken ahead included (they take room)."""
        return len(self._items) + (len(self._ahead[0]) if self._ahead else 0)

    async def put(self, change: Change, ticket: Ticket) -> None:
        """Queue one change; waits while the queue is full."""
        await self._put((change,), ticket)
        self._puts += 1
        if not self._puts % YIELD_EVERY:
            await asyncio.sleep(0)  # a put that finds room never yields; let the applier in

    async def put_many(self, changes: Sequence[Change], ticket: Ticket) -> None:
        """Queue ``changes``, in order, under ``ticket``: as many as there is
        room for at a time, waiting while the queue is full; then yields once,
        so that the applier can send them."""
        await self._put(changes, ticket)
        await asyncio.sleep(0)

    async def _put(self, changes: Sequence[Change], ticket: Ticket) -> None:
        start, end = 0, len(changes)
        while start < end:
            room = self.capacity - self.depth
            if room <= 0:
                self._room.clear()
                await self._room.wait()
                continue
            part = changes[start : start + room]
            ticket.add(len(part))
            self._items.extend(zip(part, itertools.repeat(ticket)))
            self._unfinished += len(part)
            self._all_done.clear()
            self._not_empty.set()
            start += len(part)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="auto-batch-worker")

    async def drain(self) -> None:
        """Wait until every queued change is applied (the final flush)."""
        await self._all_done.wait()

    async def stop(self) -> None:
        """Flush what is queued, then stop the applier."""
        if self._task is None:
            return
        if not self._task.done():
            await self.drain()
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        self._task = None

    def take_ahead(self) -> list[Change] | None:
        """The next batch, taken now, while the apply function's calls are in
        Redis, so that it can be prepared meanwhile: only when a whole batch is
        queued already (a backlog; under a lighter load the next batch goes on
        filling while this one is in flight). It is the next batch applied (by
        this applier, or by the next one started should this one crash)."""
        if self._ahead is not None or len(self._items) < self.max_batch_size:
            return None
        self._ahead = self._take()
        return self._ahead[1]

    async def _run(self) -> None:
        while True:
            ahead = self._ahead
            if ahead is not None:
                batch, changes = ahead
                self._ahead = None
                self._room.set()
            else:
                batch, changes = await self._next_batch()
            try:
                result = await self._apply_with_retry(changes)
            finally:
                self._unfinished -= len(batch)
                if not self._unfinished:
                    self._all_done.set()
            _complete(batch, _refusals(result))

    async def _next_batch(self) -> tuple[list[Queued], list[Change]]:
        """What is queued, up to ``max_batch_size``: taken at once, so a batch
        never waits for more (``max_wait`` bounds it trivially)."""
        while not self._items:
            self._not_empty.clear()
            await self._not_empty.wait()
        batch = self._take()
        self._room.set()
        return batch

    def _take(self) -> tuple[list[Queued], list[Change]]:
        items = self._items
        batch = [items.popleft() for _ in range(min(self.max_batch_size, len(items)))]
        return batch, [change for change, _ in batch]

    async def _apply_with_retry(self, changes: list[Change]) -> ApplyResult:
        started = time.monotonic()
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(TransientError),
            wait=RETRY_WAIT,
            before_sleep=self._before_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                result = await self._apply(changes)
        if self.stats.retries and self._on_degraded is not None:
            self._on_degraded(None)
        latency = time.monotonic() - started
        self.stats.batches += 1
        self.stats.changes += len(changes)
        self.stats.last_batch_size = len(changes)
        self.stats.last_latency = latency
        if self._on_result is not None:
            self._on_result(changes, result, latency)
        if result.blocked:
            _log_blocked(result.blocked)
        return result

    def _before_retry(self, state: object) -> None:
        self.stats.retries += 1
        outcome = getattr(state, "outcome", None)
        error = outcome.exception() if outcome is not None else None
        log.warning("applying a batch failed, retrying", extra={"error": str(error)})
        if self._on_degraded is not None:
            self._on_degraded(error)


def _refusals(result: ApplyResult) -> dict[int, Refusal]:
    """id(change) -> why it was not applied, for the changes of ``result``
    that were not (FENCED outranks blocked)."""
    refusals = {
        id(blocked.change): Refusal("blocked", blocked.change.partition, blocked.reason)
        for blocked in result.blocked
    }
    for change in result.fenced:
        refusals[id(change)] = Refusal("fenced", change.partition, "FENCED")
    return refusals


def _complete(batch: list[tuple[Change, Ticket]], refusals: dict[int, Refusal]) -> None:
    """Settle every change of an applied batch on its ticket."""
    # a batch holds runs of one ticket's changes (a read queues them together)
    for ticket, run in itertools.groupby(batch, key=itemgetter(1)):
        if not refusals:
            ticket.applied(sum(1 for _ in run))
            continue
        changes = [change for change, _ in run]
        found = [refusal for change in changes if (refusal := refusals.get(id(change))) is not None]
        fenced = next((refusal for refusal in found if refusal.fenced), None)
        ticket.applied(len(changes), refusal=fenced or next(iter(found), None))


def _log_blocked(blocked: Sequence[Blocked]) -> None:
    """One error line per blocked partition (not per change), naming its
    tables and the reason."""
    by_partition: dict[str, list[Blocked]] = {}
    for item in blocked:
        by_partition.setdefault(item.change.partition, []).append(item)
    for partition, items in by_partition.items():
        tables = sorted({item.change.table for item in items})
        reason = items[0].reason
        log.error(
            "changes not applied: a key their partition shares cannot be written",
            extra={"tables": tables, "partition": partition, "changes": len(items), "reason": reason},
        )
