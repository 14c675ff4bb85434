"""The partitions sets: ``ns:@partitions:section``, every partition value a
section has written.

A pair (section, partition) is recorded *before* its first document is
written, so that a sweep or a subscriber that lists a section's partitions
never misses a written one. The applier remembers the pairs it registered, so
that a batch whose partitions are known costs no extra round trip.

Each section with a set is named in the registry ``ns:@sections``, written
just before the set, so that a reader finds a partition's sections without a
SCAN of the keyspace (``sections_of``). Sidecars before 0.5 wrote no
registry: the first register of a process fills it once, when it is absent,
from a SCAN of the sets (``_backfill``), and until then readers scan as 0.4 did.

A section's set (and the registry) is shared by every partition of the
section: when it cannot be written (someone stored another type there, or
the ACL refuses it), the changes of the pairs not registered yet are blocked
(``register`` says why), and the pairs already registered keep applying.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from publishers import cluster_wait, redis_calls
from publishers.connection import RedisClient
from publishers.durability import Acknowledgements
from publishers.errors import CdcError, TransientError
from publishers.layout import Layout

Pair = tuple[str, str]  # (section, partition)

_KNOWN_PAIRS_LIMIT = 100_000
_SCAN_COUNT = 10_000
log = logging.getLogger("publishers.partition_sets")


class PartitionSets:
    """Registers (section, partition) pairs in one Redis, remembering them."""

    def __init__(
        self, client: RedisClient, layout: Layout, url: str, acks: Acknowledgements | None = None
    ) -> None:
        self.client, self.layout, self.url = client, layout, url
        self._acks = acks  # redis.durability: a pair counts as registered once the replicas have it
        self._known: set[Pair] = set()
        self._sections: set[str] = set()
        self._backfilled = False

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
        await self._backfill()
        pipe = self.client.pipeline(transaction=False)
        for section, partitions in missing.items():
            pipe.sadd(self.layout.sections(), section)
            pipe.sadd(self.layout.partitions(section), *sorted(partitions))
        replies = await redis_calls.execute(pipe, self.url, raise_on_error=False)
        registered: set[Pair] = set()
        unwritable: dict[Pair, str] = {}
        for i, (section, partitions) in enumerate(missing.items()):
            now = {(section, partition) for partition in partitions}
            failed = self._failure(section, replies[2 * i], replies[2 * i + 1])
            if failed is not None:
                unwritable.update(dict.fromkeys(now, failed))
            else:
                registered |= now
        await self._confirm({section for section, _ in registered})
        self._remember(registered)
        return registered, unwritable

    def _failure(self, section: str, registry: object, partitions: object) -> str | None:
        """Why the registry or the section's set cannot be written, or None;
        raises what is not that (a transient failure: the batch is retried)."""
        for key, reply in ((self.layout.sections(), registry), (self.layout.partitions(section), partitions)):
            if isinstance(reply, BaseException):
                reason = redis_calls.blocked_reason(reply, shared_key=key)
                if reason is None:
                    raise redis_calls.translate(reply, self.url)
                return reason
        return None

    async def _confirm(self, sections: set[str]) -> None:
        """With ``redis.durability``, WAIT for the sets just written (a no-op
        SADD may stand on an earlier, unconfirmed one): a failover must not
        take back a registration whose documents a sweep would then miss."""
        if self._acks is None or not sections:
            return
        keys = [self.layout.sections(), *(self.layout.partitions(s) for s in sorted(sections))]
        what = "the partitions sets"
        await cluster_wait.confirm(self.client, keys, self._acks, self.url, what=what)

    async def _backfill(self) -> None:
        """Once a process: when the registry is absent (Redis written by
        sidecars before 0.5, or empty), name in it every section that has a
        partitions set, found by one SCAN; then no reader needs one. (An ACL
        that refuses SCAN leaves it to the sections written from now on.)"""
        if self._backfilled:
            return
        registry = self.layout.sections()
        if not await redis_calls.call(self.client.exists(registry), self.url):
            try:
                found = await redis_calls.call(scanned_sections(self.client, self.layout), self.url)
            except TransientError:
                raise
            except CdcError as exc:  # NOPERM for SCAN, say
                log.warning("cannot fill %s from the partitions sets: %s", registry, exc)
                found = []
            if found:
                await redis_calls.call(self.client.sadd(registry, *found), self.url)
        self._backfilled = True

    def _remember(self, registered: set[Pair]) -> None:
        if len(self._known) > _KNOWN_PAIRS_LIMIT:
            self._known.clear()
        self._known |= registered
        self._sections |= {section for section, _ in registered}

    def forget(self) -> None:
        """Forget every pair registered: Redis failed over to a replica that
        may lack the last registrations, or lost its data. The next batches
        register their pairs again (one round trip each until known), or a
        partition registered before and written again after would stay out
        of its set for good: its documents invisible to sweeps and to the
        readers that list a section's partitions (CI: a not-durable cluster
        failover, rows deleted before the repair snapshot and inserted after)."""
        self._known.clear()
        self._sections.clear()

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


async def sections_of(client: RedisClient, layout: Layout, partition: str) -> list[str]:
    """The sections that have written ``partition``, sorted: the registry's
    sections whose partitions set names it (a SCAN while the registry is
    absent: Redis written by sidecars before 0.5 only)."""
    sections = sorted(redis_calls.text(s) for s in await client.smembers(layout.sections()))
    if not sections:
        sections = await scanned_sections(client, layout)
    if not sections:
        return []
    pipe = client.pipeline(transaction=False)
    for section in sections:
        pipe.sismember(layout.partitions(section), partition)
    members = await pipe.execute()
    return [section for section, member in zip(sections, members, strict=True) if member]


async def scanned_sections(client: RedisClient, layout: Layout) -> list[str]:
    """Every section that has a partitions set, found by SCAN (the whole keyspace)."""
    prefix = layout.partitions("")
    found = client.scan_iter(match=layout.partitions_pattern(), count=_SCAN_COUNT)
    return sorted([redis_calls.text(key)[len(prefix) :] async for key in found])
