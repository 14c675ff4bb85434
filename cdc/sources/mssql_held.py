"""Paged reads held open between the caller's calls, and what ends them.

A read of more than one page keeps its SNAPSHOT transaction open on a reader
connection of its own until its last page (``mssql_reads``). An open SNAPSHOT
transaction keeps the row versions it may read in tempdb's version store,
which is shared by every database on the instance ("Row versioning-based
isolation levels in the Database Engine", learn.microsoft.com: versions are
kept "as long as" an active snapshot transaction may need them), so a held
read must never outlive its caller's interest in it. It is rolled back and
its reader given back when any of these happens first:

- the caller reads the table again without continuing it (``take``: the
  source rolls it back), or the source is closed (``take_all``);
- the task that started it ends: cancelled (shutdown, a lost lease), or
  failed while it fed the page to Redis;
- nobody continued it for ``HOLD_LIMIT`` seconds (the task is alive but went
  elsewhere, say a retry loop). A continuation that comes later still reads
  every change: it starts a new transaction from ``(upto, after)``
  (``MssqlSource.read_changes``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from cdc.sources.base import Cursor
from cdc.sources.mssql_link import Link

log = logging.getLogger("cdc.sources.mssql")

# Seconds a held read may wait for its next page. A caller feeds a page to
# Redis before it asks for the next: seconds at worst, unless Redis is away,
# and then the read is better started again than pinning tempdb meanwhile.
HOLD_LIMIT = 60.0


@dataclass
class HeldRead:
    """The open SNAPSHOT transaction of a paged read, on a reader of its own.

    Later pages of the read run in it, so they see what the first page saw:
    a row changed again between two pages is not skipped, nor classified
    relative to the bound instead of ``since``. It continues only the read it
    belongs to: same ``since``, ``upto`` equal to its bound, ``after`` equal to
    the cursor of the page last returned (its key values are the exact ones
    the server sent: ``mssql_reads.cursor_key``). Its second page fills the
    read's backlog in tempdb, which later pages read by row number
    (``mssql_paging``); a rollback drops the backlog with the rest."""

    link: Link
    conn: Any  # the connection holding the transaction (a replaced one has lost it)
    since: int
    bound: int
    after: Cursor
    column_ids: tuple[int | None, ...] = ()  # of the mask columns, read in the transaction
    backlog_row: int | None = None  # where the next page starts in the backlog; None: not filled

    def continues(self, since: int, upto: int | None, after: Cursor | None) -> bool:
        return (since, upto, after) == (self.since, self.bound, self.after)


@dataclass
class _Watch:
    held: HeldRead
    timer: asyncio.TimerHandle
    owner: asyncio.Task[Any] | None
    on_owner_done: Callable[[asyncio.Task[Any]], None]

    def disarm(self) -> None:
        self.timer.cancel()
        if self.owner is not None:
            self.owner.remove_done_callback(self.on_owner_done)


class HeldReads:
    """The held reads of one source, by table (lower case), each watched
    (see the module docstring); ``release`` rolls a reader's transaction back
    and returns it to the idle readers."""

    def __init__(self, release: Callable[[Link], Awaitable[None]], limit: float | None = None) -> None:
        self._release = release
        self._limit = HOLD_LIMIT if limit is None else limit
        self._watches: dict[str, _Watch] = {}
        self._releasing: set[asyncio.Task[None]] = set()

    def hold(self, table: str, held: HeldRead) -> None:
        """Keep ``held`` for its continuation, by the task running now."""
        loop = asyncio.get_running_loop()
        owner = asyncio.current_task()

        def on_owner_done(_: asyncio.Task[Any]) -> None:
            self._abandon(table, held, "the task reading it ended")

        timer = loop.call_later(
            self._limit, self._abandon, table, held, f"not continued within {self._limit:g}s"
        )
        if owner is not None:
            owner.add_done_callback(on_owner_done)
        stale = self._watches.pop(table, None)
        if stale is not None:  # (the source takes a table's read before it holds another)
            stale.disarm()
        self._watches[table] = _Watch(held, timer, owner, on_owner_done)

    def take(self, table: str) -> HeldRead | None:
        """The table's held read, no longer watched: the caller continues it or releases it."""
        watch = self._watches.pop(table, None)
        if watch is None:
            return None
        watch.disarm()
        return watch.held

    def take_all(self) -> list[HeldRead]:
        return [held for held in (self.take(t) for t in list(self._watches)) if held is not None]

    def __contains__(self, table: str) -> bool:
        return table in self._watches

    async def settled(self) -> None:
        """Wait for the releases under way (``close``, tests)."""
        while self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)

    def _abandon(self, table: str, held: HeldRead, why: str) -> None:
        watch = self._watches.get(table)
        if watch is None or watch.held is not held:
            return  # continued or released meanwhile
        self.take(table)
        log.info("paged read abandoned: rolled back", extra={"table": table, "reason": why})
        task = asyncio.get_running_loop().create_task(self._release_quietly(held.link, table))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release_quietly(self, link: Link, table: str) -> None:
        try:
            await self._release(link)
        except Exception as exc:  # the link is closed by then: so is its transaction
            log.warning("rolling back an abandoned read failed", extra={"table": table, "reason": str(exc)})
