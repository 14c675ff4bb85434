"""Removing what one table left in Redis (``cdc purge``, docs/TABLES.md).

A table owns, in a namespace (``publishers.layout``):

- per partition its section wrote: the documents ``ns:{p}:section:key``, the
  section's index ``ns:{p}:@index:section``, its field in ``ns:{p}:@fence``;
  and, where no other section writes the partition, the partition's own
  ``ns:{p}:@seq``, ``ns:{p}:@stream`` and ``ns:{p}:@fence``;
- the section's set of partitions ``ns:@partitions:section``;
- its checkpoint ``ns:@checkpoint:table`` (with the stored shape), its lease
  ``ns:@lease:{table}`` and its entries in the dead letter ``ns:@deadletter``.

Two things of the table stay, for fencing: its token counter
``ns:@fence:{table}`` (a sidecar that takes the table again, re-added, gets a
token above every earlier one, the purge's included), and its field in the
``@fence`` of each partition another section keeps, raised to the purge's
token (a sidecar that lost the table before the purge stays fenced out of
those partitions). The purge leaves ``ns:@purged:{table}``, its token, so
that those fields no longer name the table as a writer of the other sections
(``writers_of``): a later ``cdc purge`` of the table must not take another
section for its own.

The documents go through the apply script as deletes (``D``), so that every
subscriber of the section is told the way it is told of any delete: one
message per document, in the partition's gap-free seq, and its replica
empties instead of going silently stale. They are written under the purge's
own lease token (the caller holds the table's lease), so a sidecar that lost
the table cannot write after them. Each partition is finished (documents,
then its keys, then its entry in the section's set) before the next one, so a
purge that stops half-way leaves a smaller table that a second run finishes.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from publishers import deadletters, redis_calls, scripts
from publishers.errors import CdcError, LeaseLost
from publishers.manager import DataManager
from publishers.model import ApplyResult, Change

PAGE = 500  # documents per SSCAN page and apply call: a bounded script run (REDIS.md)
SAMPLE = 3  # partitions of a section looked at to tell which tables wrote it
_SCAN_COUNT = 1000


@dataclass(frozen=True)
class PartitionPlan:
    """One partition of the table's section."""

    partition: str
    documents: int  # live documents of the section here (its index's size)
    shared_with: tuple[str, ...] = ()  # other sections writing here: @seq, @stream stay


@dataclass
class Plan:
    """What a purge of ``table`` removes (``section`` None: no documents found)."""

    table: str
    section: str | None
    partitions: list[PartitionPlan] = field(default_factory=list)
    checkpoint: dict[str, str] = field(default_factory=dict)  # its fields; empty: none
    lease: bool = False  # ns:@lease:{table} exists
    dead_letters: int = 0

    @property
    def documents(self) -> int:
        return sum(p.documents for p in self.partitions)

    @property
    def empty(self) -> bool:
        """Nothing of the table is left in Redis (but what a purge keeps for fencing)."""
        return not (self.partitions or self.checkpoint or self.lease or self.dead_letters)


# -- finding what the table left ----------------------------------------------


async def sections(manager: DataManager) -> list[str]:
    """Every section that has written a partition in the namespace (the
    ``ns:@partitions:*`` sets: on a cluster, scanned on every primary)."""
    prefix = manager.layout.partitions("")
    keys = await redis_calls.call(_scan(manager, manager.layout.partitions_pattern()), manager.config.url)
    return sorted(key[len(prefix) :] for key in keys)


async def _scan(manager: DataManager, pattern: str) -> list[str]:
    return [redis_calls.text(k) async for k in manager.client.scan_iter(match=pattern, count=_SCAN_COUNT)]


async def _members(manager: DataManager, key: str) -> list[str]:
    """A set's members, page by page (SSCAN: a section may have written millions of partitions)."""
    scan = manager.client.sscan_iter(key, count=_SCAN_COUNT)
    members = await redis_calls.call(_texts(scan), manager.config.url)
    return sorted(members)


async def _texts(scan: AsyncIterator[Any]) -> list[str]:
    return [redis_calls.text(m) async for m in scan]


async def _pipelined(
    manager: DataManager, keys: Sequence[str], command: Callable[[Any, str], object]
) -> list[Any]:
    """``command(pipe, key)`` for each key, ``_SCAN_COUNT`` per round trip (a
    cluster's pipeline sends each to its key's node)."""
    out: list[Any] = []
    for start in range(0, len(keys), _SCAN_COUNT):
        pipe = manager.client.pipeline(transaction=False)
        for key in keys[start : start + _SCAN_COUNT]:
            command(pipe, key)
        out += await redis_calls.execute(pipe, manager.config.url)
    return out


async def writers_of(manager: DataManager, section: str) -> set[str]:
    """The tables that wrote a few partitions of ``section`` (their fields in
    the partitions' ``@fence``): a sidecar writes every change under its
    table's lease token, so the table of a section is among these. A field a
    purge left (its token at or below the table's ``@purged``) is no write."""
    layout, url = manager.layout, manager.config.url
    members = await redis_calls.call(manager.client.srandmember(layout.partitions(section), SAMPLE), url)
    tokens: dict[str, int] = {}  # table -> the highest token seen in the sample
    for raw in members or ():
        fields = await redis_calls.call(manager.client.hgetall(layout.fence(redis_calls.text(raw))), url)
        for name, token in fields.items():
            table = _table_of(redis_calls.text(name))
            tokens[table] = max(tokens.get(table, 0), _int(token))
    return {table for table, token in tokens.items() if token > await purged_token(manager, table)}


def purged_key(manager: DataManager, table: str) -> str:
    """``ns:@purged:{table}``: the token of the table's last finished purge
    (hash tag: the slot of its lease and counter)."""
    return f"{manager.layout.namespace}:@purged:{{{table}}}"


async def purged_token(manager: DataManager, table: str) -> int:
    """The token of the table's last finished purge; 0: never purged."""
    raw = await redis_calls.call(manager.client.get(purged_key(manager, table)), manager.config.url)
    return _int(raw)


def _int(raw: object) -> int:
    text = redis_calls.text(raw) if raw is not None else ""
    return int(text) if text.isdecimal() else 0


def _fence_field(table: str) -> str:
    """The table's field in ``ns:{p}:@fence``: its name as the apply script
    gets it, a JSON string (quotes included)."""
    return orjson.dumps(table).decode()


def _table_of(fence_field: str) -> str:
    try:
        name = orjson.loads(fence_field)
    except orjson.JSONDecodeError:
        return fence_field
    return name if isinstance(name, str) else fence_field


async def candidate_sections(manager: DataManager, table: str, skip: Iterable[str] = ()) -> list[str]:
    """The sections ``table`` may have written (``writers_of`` names it),
    leaving out ``skip`` (sections another registered table writes)."""
    out = []
    skipped = set(skip)
    for section in await sections(manager):
        if section not in skipped and table in await writers_of(manager, section):
            out.append(section)
    return out


async def plan(
    manager: DataManager, table: str, section: str | None, keep: Mapping[str, str] | None = None
) -> Plan:
    """What purging ``table`` (writing ``section``) would remove now. A
    partition is shared when another section's set names it in Redis, or
    ``keep`` does (partition -> section: what another registered table writes
    literally, perhaps not yet)."""
    layout, client, url = manager.layout, manager.client, manager.config.url
    result = Plan(table, section)
    if section is not None:
        partitions = await _members(manager, layout.partitions(section))
        others = [s for s in await sections(manager) if s != section]
        counts = await _pipelined(manager, [layout.index(p, section) for p in partitions], _scard)
        sharing = await _sharing(manager, partitions, others, dict(keep or {}))
        result.partitions = [
            PartitionPlan(p, int(n), sharing.get(p, ())) for p, n in zip(partitions, counts, strict=True)
        ]
    raw = await redis_calls.call(client.hgetall(layout.checkpoint(table)), url)
    result.checkpoint = {redis_calls.text(k): redis_calls.text(v) for k, v in raw.items()}
    result.lease = bool(await redis_calls.call(client.exists(layout.lease(table)), url))
    result.dead_letters = (await deadletters.counts(manager)).get(table, 0)
    return result


async def _sharing(
    manager: DataManager, partitions: Sequence[str], others: Sequence[str], keep: dict[str, str]
) -> dict[str, tuple[str, ...]]:
    """partition -> the other sections that write it."""
    out: dict[str, set[str]] = {p: {keep[p]} for p in partitions if p in keep}
    layout = manager.layout
    for other in others:
        found = await _pipelined(manager, partitions, _is_member(layout.partitions(other)))
        for partition, member in zip(partitions, found, strict=True):
            if member:
                out.setdefault(partition, set()).add(other)
    return {p: tuple(sorted(s)) for p, s in out.items()}


def _is_member(key: str) -> Callable[[Any, str], object]:
    return lambda pipe, member: pipe.sismember(key, member)


def _scard(pipe: Any, key: str) -> object:
    return pipe.scard(key)


# -- removing it ---------------------------------------------------------------


@dataclass
class Deleter:
    """Deletes the documents of one table's section under the purge's lease
    ``token``; ``keep_lease`` is awaited between pages (it renews the lease
    and raises ``LeaseLost`` when it is not ours any more)."""

    manager: DataManager
    table: str
    section: str
    token: int
    keep_lease: Callable[[], Awaitable[None]]
    version: int = 0  # the checkpoint's: no delete message carries a lower one
    keep_fence: bool = False  # the table still writes elsewhere: its fields in @fence stay
    deleted: int = 0  # documents deleted so far (each told to subscribers)

    async def partition(self, part: PartitionPlan, progress: Callable[[], None]) -> None:
        """Delete the partition's documents, then its keys, then its entry in
        the section's set (so a second run finds what is left)."""
        index = self.manager.layout.index(part.partition, self.section)
        left = await self._card(index)
        while left:
            await self._pass(part.partition, index, progress)
            now = await self._card(index)
            if now >= left:  # each pass removes every member it saw: only a writer adds more
                raise CdcError(
                    f"{self.table}: {index} still holds {now} member(s) after the purge went through it "
                    f"(it held {left}): something still writes section {self.section!r}. Stop it, then "
                    "run cdc purge again"
                )
            left = now
        await self._drop_keys(part)

    async def _card(self, index: str) -> int:
        return int(await redis_calls.call(self.manager.client.scard(index), self.manager.config.url))

    async def _pass(self, partition: str, index: str, progress: Callable[[], None]) -> None:
        """One SSCAN of the index, a page at a time (SSCAN returns every
        member present from its start to its end at least once)."""
        cursor = 0
        while True:
            cursor, keys = await redis_calls.call(
                self.manager.client.sscan(index, cursor, count=PAGE), self.manager.config.url
            )
            # SSCAN's COUNT is a hint: a reply may hold a few more members (a whole
            # hash bucket each), so it is applied PAGE at a time (a CI run saw 501)
            found = [redis_calls.text(k) for k in keys]
            for first in range(0, len(found), PAGE):
                await self._page(partition, found[first : first + PAGE])
                progress()
            await self.keep_lease()
            if int(cursor) == 0:
                return

    async def _page(self, partition: str, keys: list[str]) -> None:
        """One page: a delete change per document, each carrying the highest of
        the document's ``@v`` and the checkpoint (reset: applied whatever
        ``@v`` holds), then the tombstones the deletes left, then every key of
        the page from the index. The apply removes from the index only the
        documents it deleted: a member whose document is absent (a manual DEL)
        or a tombstone (a damaged index) is told nothing (there is nothing
        to delete) and would otherwise stay in the index for ever."""
        layout, client = self.manager.layout, self.manager.client
        docs = [layout.document(partition, self.section, key) for key in keys]
        versions = await _pipelined(self.manager, docs, lambda pipe, doc: pipe.hget(doc, "@v"))
        changes = [
            Change(self.table, partition, self.section, key, "D", self._version(v), None, True, self.token)
            for key, v in zip(keys, versions, strict=True)
        ]
        result = await self.manager.apply(changes)
        self._check(partition, result)
        self.deleted += result.published
        # a tombstone guards a key against an older change replayed later; nobody writes this
        # table any more, and a rejected change (a key of another type) goes with the rest.
        # Every document of the page is gone now: so goes every key of the page from the index
        # (a purge killed between the two finds them again, absent: told nothing twice)
        await redis_calls.call(client.delete(*docs), self.manager.config.url)
        await redis_calls.call(
            client.srem(layout.index(partition, self.section), *keys), self.manager.config.url
        )

    def _version(self, stored: object) -> int:
        text = redis_calls.text(stored) if stored is not None else ""
        return max(self.version, int(text)) if text.isdecimal() else self.version

    def _check(self, partition: str, result: ApplyResult) -> None:
        if result.fenced:
            raise self._lost(partition)
        if result.blocked:
            raise CdcError(
                f"{self.table}: cannot delete the documents of partition {partition!r}: "
                f"{result.blocked[0].reason}. Repair the key (docs/REDIS.md), then run cdc purge again"
            )

    def _lost(self, partition: str) -> LeaseLost:
        return LeaseLost(
            f"{self.table}: another process took the table's lease during the purge "
            f"(partition {partition!r}): run cdc purge again once it has stopped"
        )

    async def _drop_keys(self, part: PartitionPlan) -> None:
        """The partition's ``@seq``, ``@stream`` and ``@fence`` when no other
        section writes it (one slot: one DEL); else the table's field in its
        ``@fence`` raised to the purge's token; then the partition leaves the
        section's set.

        The field stays (it was deleted once): with it gone, a sidecar that
        lost the table before the purge would find no token there and be let
        in. A partition that goes takes its ``@fence`` along: a zombie's write
        there is not fenced, but the counter survives, so whoever takes the
        table next fences the zombie out on its first write."""
        layout, client, url = self.manager.layout, self.manager.client, self.manager.config.url
        p = part.partition
        # what a whole snapshot of the section stopped part-way recorded as written
        await redis_calls.call(client.delete(layout.seen(p, self.section)), url)
        if not part.shared_with:
            await redis_calls.call(client.delete(layout.seq(p), layout.stream(p), layout.fence(p)), url)
        elif self.token and not self.keep_fence:
            await self._raise_fence(p)
        await redis_calls.call(client.srem(layout.partitions(self.section), p), url)

    async def _raise_fence(self, partition: str) -> None:
        keys, args = [self.manager.layout.fence(partition)], [_fence_field(self.table), str(self.token)]
        try:
            await scripts.run(self.manager.client, scripts.FENCE_RAISE, keys, args, self.manager.config.url)
        except LeaseLost:
            raise self._lost(partition) from None


async def drop_table_keys(manager: DataManager, table: str, token: int) -> int:
    """The table's dead letters (its checkpoint goes first, its lease last:
    the caller's), then ``@purged`` set to the purge's ``token``: every
    partition is done; how many dead letters went. The fencing counter
    stays (the module's docstring)."""
    removed = await deadletters.purge(manager, table)
    await redis_calls.call(manager.client.set(purged_key(manager, table), str(token)), manager.config.url)
    return removed


def purge_owner(host: str, pid: int) -> str:
    """The lease owner id of a purge: named so that a refusal elsewhere says what holds the table."""
    return f"cdc-purge-{host}-{pid}-{random.randrange(16**6):06x}"
