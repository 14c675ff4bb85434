"""The partitions sets: ``ns:@partitions:section``, every partition value a
section has written.

A pair (section, partition) is recorded *before* its first document is
written, so that a sweep or a subscriber that lists a section's partitions
never misses a written one. The applier remembers the pairs it registered, so
that a batch whose partitions are known costs no extra round trip.

A section's set is shared by every partition of the section: when it cannot
be written (someone stored another type there, or the ACL refuses it), the
changes of the pairs not registered yet are blocked (``register`` says why),
and the pairs already registered keep applying.
"""

from __future__ import annotations

from collections.abc import Iterable

from publishers import redis_calls
from publishers.connection import RedisClient
from publishers.layout import Layout

Pair = tuple[str, str]  # (section, partition)

_KNOWN_PAIRS_LIMIT = 100_000


class PartitionSets:
    """Registers (section, partition) pairs in one Redis, remembering them."""

    def __init__(self, client: RedisClient, layout: Layout, url: str) -> None:
        self.client, self.layout, self.url = client, layout, url
        self._known: set[Pair] = set()
        self._sections: set[str] = set()

    async def register(self, pairs: Iterable[Pair]) -> tuple[set[Pair], dict[Pair, str]]:
        """Record the pairs not known yet, one ``SADD`` per section in one
        round trip. Returns the pairs registered now, and the pairs whose
        section's set cannot be written with the reason (``redis_calls.
        blocked_reason``). Raises ``RedisUnavailable`` on transient failures."""
        missing: dict[str, set[str]] = {}
        for section, partition in pairs:
            if (section, partition) not in self._known:
                missing.setdefault(section, set()).add(partition)
        if not missing:
            return set(), {}
        pipe = self.client.pipeline(transaction=False)
        for section, partitions in missing.items():
            pipe.sadd(self.layout.partitions(section), *sorted(partitions))
        replies = await redis_calls.execute(pipe, self.url, raise_on_error=False)
        registered: set[Pair] = set()
        unwritable: dict[Pair, str] = {}
        for (section, partitions), reply in zip(missing.items(), replies, strict=True):
            now = {(section, partition) for partition in partitions}
            if isinstance(reply, BaseException):
                unwritable.update(dict.fromkeys(now, self._unwritable(section, reply)))
            else:
                registered |= now
        self._remember(registered)
        return registered, unwritable

    def _unwritable(self, section: str, error: BaseException) -> str:
        """Why the section's set cannot be written; raises what is not that
        (a transient failure: the batch is retried)."""
        reason = redis_calls.blocked_reason(error, shared_key=self.layout.partitions(section))
        if reason is None:
            raise redis_calls.translate(error, self.url)
        return reason

    def _remember(self, registered: set[Pair]) -> None:
        if len(self._known) > _KNOWN_PAIRS_LIMIT:
            self._known.clear()
        self._known |= registered
        self._sections |= {section for section, _ in registered}

    async def registrations_lost(self, pairs: set[Pair], registered: set[Pair]) -> None:
        """The partitions of ``pairs`` started their ``@seq`` from 0: they are
        new (``registered`` by this batch), or Redis lost its data (restarted
        empty, flushed) after they were registered. Then what is remembered
        about them is wrong: forget it and register ``pairs`` again now, or
        sweeps and subscribers would never find the documents written. (A set
        that cannot be written now is tried again by the next batch.)"""
        partitions = {partition for _, partition in pairs}
        stale = {(s, p) for s in self._sections for p in partitions} & self._known
        stale -= registered
        if stale:
            self._known -= stale
            await self.register(pairs)
