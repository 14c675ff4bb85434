"""The checkpoint line: which version of a table may be persisted now.

A tracker's reads run ahead of Redis: each read is registered here, in read
order, with its ``Ticket`` (the version the read reached, and whether every
change of it is applied). The line holds one rule:

    never move the checkpoint past an unfinished or refused read

so ``applied`` only advances over the finished reads at the head of the
line: a finished read behind an unfinished one waits for it, and a refused
read stays at the head, where nothing can pass it, and raises why: its
changes were FENCED (another sidecar owns the table): ``LeaseLost``; or a
key their partition shares cannot be written: ``ApplyBlocked`` (the tracker
then forgets its reads, ``forget_reads``, and reads again from ``applied``
later: the changes are fine, only the key has to be repaired).

When to write the checkpoint is the line's other rule: at most every
``CHECKPOINT_INTERVAL`` while changes are applied, every
``IDLE_CHECKPOINT_INTERVAL`` while reads find nothing. The line does no I/O:
the tracker asks ``persist_due`` and writes.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from cdc.batching import Ticket
from cdc.errors import ApplyBlocked, LeaseLost

CHECKPOINT_INTERVAL = 1.0  # seconds between checkpoint writes while changes are applied
# Seconds between checkpoint writes of a table whose reads find nothing: its
# version may move (other tables' transactions), but replaying an empty range
# after a crash costs nothing, and the checkpoint stays far inside retention.
IDLE_CHECKPOINT_INTERVAL = 30.0


def check_refused(table: str, ticket: Ticket) -> None:
    """A read with refused changes was not applied: stop before the
    checkpoint can pass it (whoever owns the table reads it again)."""
    refusal = ticket.refusal
    if refusal is None:
        return
    if refusal.fenced:
        raise LeaseLost(
            f"{table}: changes refused (FENCED): another sidecar owns the table now, "
            "or shares a partition with it"
        )
    raise ApplyBlocked(
        f"{table}: changes to partition {refusal.partition!r} not applied: {refusal.reason} "
        "(repair the key: docs/REDIS.md, 'A blocked partition'; the table retries by itself)"
    )


class CheckpointLine:
    """The reads of one table not yet known to be applied, in read order."""

    def __init__(self, table: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.table = table
        self._clock = clock  # injectable: tests move time without sleeping
        self._reads: deque[tuple[Ticket, float]] = deque()  # (ticket, when it was read)
        self.applied: int | None = None  # every change up to here is in Redis
        self.persisted: int | None = None  # what the stored checkpoint holds
        self.persisted_at = 0.0
        self.unpersisted_changes = 0  # changes applied since the checkpoint was last written
        # When the source was last read with every change up to then in Redis
        # (the mirror is known fresh up to then), for ``applied`` and for
        # ``persisted``; None: never (no checkpoint yet).
        self.fresh_at: float | None = None
        self.persisted_fresh_at: float | None = None
        self._since = self._clock()  # when the line started: the lag of a table never fresh

    def reset(self, version: int | None, *, fresh_at: float | None = None) -> None:
        """Forget every read: the table restarts from the stored ``version``,
        which was fresh at ``fresh_at`` (this line's clock; None: unknown)."""
        self._reads.clear()
        self.applied = self.persisted = version
        self.fresh_at = self.persisted_fresh_at = fresh_at
        self._since = self._clock()

    def forget_reads(self) -> None:
        """Forget every read in flight, keeping ``applied`` and ``persisted``:
        after a failed step (a blocked read, say, whose changes and every later
        read's were not applied) the tracker reads again from ``applied``."""
        self._reads.clear()

    def register(self, ticket: Ticket) -> None:
        """A read is complete (sealed, its version final): it joins the line."""
        self._reads.append((ticket, self._clock()))

    def advance(self) -> bool:
        """Move ``applied`` over the finished reads at the head of the line;
        return whether it moved. Raises ``LeaseLost`` or ``ApplyBlocked`` at a
        refused read (``check_refused``), which stays at the head."""
        advanced = False
        while self._reads and self._reads[0][0].done.is_set():
            self._pass_head()
            advanced = True
        return advanced

    async def drain(self) -> bool:
        """Wait for every read, in order, then advance over all of them
        (before a snapshot). Raises ``LeaseLost`` or ``ApplyBlocked`` at the
        first refused read."""
        advanced = False
        while self._reads:
            await self._reads[0][0].done.wait()
            self._pass_head()
            advanced = True
        return advanced

    def _pass_head(self) -> None:
        ticket, _ = self._reads[0]
        check_refused(self.table, ticket)  # and it stays at the head: nothing can pass it
        _, read_at = self._reads.popleft()
        self.applied = ticket.version
        self.unpersisted_changes += ticket.changes
        self.fresh_at = read_at

    def persist_due(self) -> bool:
        """Whether the checkpoint should be written now (given that it moved)."""
        interval = CHECKPOINT_INTERVAL if self.unpersisted_changes else IDLE_CHECKPOINT_INTERVAL
        return self._clock() - self.persisted_at >= interval

    def persisted_now(self) -> None:
        """The checkpoint at ``applied`` was written."""
        self.persisted = self.applied
        self.persisted_at = self._clock()
        self.persisted_fresh_at = self.fresh_at
        self.unpersisted_changes = 0

    def snapshotted(self, version: int, started_at: float) -> int:
        """A snapshot that started at ``started_at`` (this line's clock) put
        the whole table in Redis at ``version`` (returned)."""
        self.applied = version
        self.fresh_at = started_at
        return version

    def fresh_now(self) -> None:
        """Nothing waits to be applied and the source knows a read now would
        find nothing (``ChangeSource.quiet_for``): fresh as of now."""
        if not self._reads and self.applied is not None:
            self.fresh_at = self._clock()

    def now(self) -> float:
        return self._clock()

    @property
    def empty(self) -> bool:
        """No read waits to be applied."""
        return not self._reads

    async def wait_applied(self, ticket: Ticket) -> None:
        """Wait for a read outside the line (a snapshot's, a sweep's) to be
        applied; ``LeaseLost`` or ``ApplyBlocked`` if it was refused."""
        await ticket.done.wait()
        check_refused(self.table, ticket)

    @property
    def settled(self) -> bool:
        """Every read applied and its changes' checkpoint written: nothing left
        that a poll would still do, such as the checkpoint write or the
        ``caught_up`` of a burst's last batch."""
        return not self._reads and not self.unpersisted_changes

    def lag(self) -> float:
        """Seconds since the newest read whose changes are all applied: the
        mirror is known to hold every change made until then. It grows while
        nothing can be read (the source away) or applied (Redis away), and is
        about the poll interval while the table is idle. A table never fresh
        (its first snapshot runs): since the line started."""
        return self._clock() - (self._since if self.fresh_at is None else self.fresh_at)

    def persisted_age(self) -> float | None:
        """Seconds since the stored checkpoint was fresh (None: unknown)."""
        return None if self.persisted_fresh_at is None else self._clock() - self.persisted_fresh_at
