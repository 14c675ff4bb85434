"""The apply path's Python half, beside ``lua/apply.lua``: admitting, chunking,
building the calls, sending them in pipelined rounds, bisecting poison changes.

``DataManager.apply`` groups a batch by partition (keeping each partition's
order), splits every partition into calls of at most ``max_changes_per_call``
changes (Redis serves nobody else while a script runs), and sends one
``apply.lua`` call per chunk: every first chunk of every partition in one
pipelined round trip (a cluster pipeline fans out to the nodes concurrently),
then every second chunk, and so on, so a partition's chunks run in order.

Failures are sorted four ways:

- transient (link down, loading, failover, OOM): ``RedisUnavailable`` is raised
  and the daemon retries the whole batch; replays are harmless by the apply
  rule (a change at or below a document's ``@v`` is dropped);
- FENCED (another sidecar owns the table): ``ApplyResult.fenced``;
- a key that the whole partition shares cannot be written (``CDCLAYOUT`` from
  the script: ``@seq`` not an integer, a shared key of the wrong type, a
  stream ahead of ``@seq``; ``NOPERM`` from the ACL): the call wrote nothing,
  and it and the partition's later calls of the batch are reported in
  ``ApplyResult.blocked``, not dead-lettered (the changes are fine, the key is
  not): their reader reads them again once the key is repaired. The other
  partitions apply. So do the changes whose section's partitions set
  (``publishers.partition_sets``) or the dead letter cannot be written;
- anything else is a content failure (e.g. ``WRONGTYPE``: someone wrote a
  string at a document key): the chunk is bisected, in order, until the
  poison change(s) are isolated; each goes to the dead letter with the Redis
  error as its reason, and the rest of the chunk is applied.

Changes that cannot be sent at all (oversized rows, reserved column names,
empty partition values, negative versions) go to the dead letter without a
Redis call.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from redis import exceptions as rex
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import ConnectionPool

from publishers import cluster_wait, redis_calls, scripts
from publishers.apply_calls import Call, CallPlan, Prepared
from publishers.connection import RedisClient
from publishers.durability import Acknowledgements
from publishers.layout import Layout
from publishers.model import ApplyResult, Blocked, Change, timestamp
from publishers.partition_sets import Pair, PartitionSets
from publishers.settings import RedisConfig

# What the applier does with a change it cannot apply: the dead letter, with the reason.
Reject = Callable[[Change, str, ApplyResult], Awaitable[None]]


MAX_CHANGES_PER_CALL = 1000
MAX_ROW_BYTES = 1 << 20

Reply = Any  # a decoded Redis reply, or the exception a pipeline slot raised


def apply_script() -> bytes:
    """The text of ``lua/apply.lua``, shipped as package data."""
    return scripts.APPLY.text


class Applier:
    """Applies batches to one Redis (``client``, its ``config`` and key
    ``layout``), sending what cannot be applied to ``reject`` (the dead
    letter); keeps the script's SHA and the partitions sets' registrations."""

    def __init__(
        self,
        client: RedisClient,
        config: RedisConfig,
        layout: Layout,
        *,
        reject: Reject,
        max_row_bytes: int,
        max_changes_per_call: int,
    ) -> None:
        self.client, self.config, self.layout = client, config, layout
        self._reject = reject
        self._plan = CallPlan(layout, max_row_bytes, max(1, max_changes_per_call))  # admission, calls
        self.script = scripts.APPLY.text
        self.sha = scripts.APPLY.sha
        self._sha = self.sha.encode()
        self._acks = Acknowledgements(config.durability, layout)
        self._partition_sets = PartitionSets(client, layout, config.url, self._acks)
        self._header = (
            b"%d" % config.stream_max_len,
            b"%d" % max(1, round(config.tombstone_ttl * 1000)),
            b"SPUBLISH" if config.cluster else b"PUBLISH",
        )

    def forget_registrations(self) -> None:
        """Register every partition again from the next batch on (``PartitionSets.forget``)."""
        self._partition_sets.forget()

    def prepare(self, changes: Sequence[Change], *, now: datetime | None = None) -> Prepared:
        """What ``apply`` does before it needs Redis (``CallPlan.prepare``),
        the calls packed too (on a single server). CPU only: the worker
        prepares a batch while Redis runs the one before it (``cdc.batching``)."""
        prepared = self._plan.prepare(changes, (timestamp(now).encode(), *self._header))
        single = not isinstance(self.client, RedisCluster)
        for call in itertools.chain.from_iterable(prepared.rounds):
            if single:
                call.packed(self._sha)
            else:
                _ = call.command  # a cached property: built now
        return prepared

    async def apply(
        self,
        changes: Sequence[Change],
        *,
        now: datetime | None = None,
        prepared: Prepared | None = None,
        meanwhile: Callable[[], None] | None = None,
    ) -> ApplyResult:
        """Apply a batch: per partition in order, atomically per call.
        ``prepared``: ``prepare(changes)``, made earlier (else made now);
        ``meanwhile`` runs once, while the first calls are in Redis.

        Raises ``RedisUnavailable`` on transient failures (retry the batch).
        """
        if prepared is None or prepared.changes is not changes:
            prepared = self.prepare(changes, now=now)
        result = ApplyResult()
        for change, problem in prepared.refused:
            await self._reject(change, problem, result)
        by_partition, rounds = prepared.by_partition, prepared.rounds
        if not by_partition:
            return result
        pairs = {
            (change.section, partition) for partition, sized in by_partition.items() for change, _ in sized
        }
        registered, unwritable = await self._partition_sets.register(pairs)
        batch = _Batch(prepared.header, result, registered, meanwhile=meanwhile)
        if unwritable:
            by_partition = _hold_unregistered(by_partition, unwritable, result)
            rounds = self._plan.rounds(by_partition, batch.header)
        for calls in rounds:
            await self._run_round(calls, batch)
        batch.run_meanwhile()  # (no call was sent)
        return result

    async def _run_round(self, calls: list[Call], batch: _Batch) -> None:
        """One call per partition in one round trip; a partition found
        blocked by an earlier round is not sent again (its later chunks are
        blocked with it, so that nothing of it passes what was not applied)."""
        for call in [call for call in calls if call.partition in batch.blocked]:
            batch.block(call.partition, call.changes, batch.blocked[call.partition])
        calls = [call for call in calls if call.partition not in batch.blocked]
        if not calls:
            return
        replies = await self._evalsha(calls, batch.run_meanwhile)
        failed = [
            (call, reply)
            for call, reply in zip(calls, replies, strict=True)
            if not self._settle(call, reply, batch)
        ]
        for call, error in failed:
            await self._isolate(call.partition, call.changes, batch, error)
        if batch.first:
            pairs = {(change.section, call.partition) for call in batch.first for change in call.changes}
            batch.first.clear()
            await self._partition_sets.registrations_lost(pairs, batch.registered)

    def _settle(self, call: Call, reply: Reply, batch: _Batch) -> bool:
        """Record a call's outcome unless it failed on the content of its
        changes (then return False: bisect it). A FENCED or blocked call wrote
        nothing (but the changes before a section whose channel the ACL
        refuses: their replays are stale); a call that published its
        partition's first message (``@seq`` was 0 before it) joins ``batch.first``."""
        if redis_calls.is_fenced(reply):
            batch.result.fenced.extend(call.changes)  # another sidecar owns the table
            return True
        if isinstance(reply, BaseException):
            reason = redis_calls.blocked_reason(reply)
            if reason is None:
                return False
            batch.block(call.partition, call.changes, reason)
            return True
        if self._count(call, reply, batch.result):
            batch.first.append(call)
        return True

    async def _isolate(
        self, partition: str, changes: list[Change], batch: _Batch, error: BaseException
    ) -> None:
        """Bisect a failed chunk, halves in order, down to the poison change(s).

        Changes before the poison may have been applied by the failed call;
        re-sending them is harmless (they are stale now), but they are then
        counted as stale rather than applied. A half that finds the partition
        blocked blocks the rest of the chunk with it.
        """
        if len(changes) == 1:
            await self._reject(changes[0], redis_calls.redis_message(error), batch.result)
            return
        middle = len(changes) // 2
        for half in (changes[:middle], changes[middle:]):
            if partition in batch.blocked:
                batch.block(partition, half, batch.blocked[partition])
                continue
            call = Call(self.layout, batch.header, partition, half)
            reply = (await self._evalsha([call]))[0]
            if not self._settle(call, reply, batch):
                await self._isolate(partition, half, batch, reply)

    @staticmethod
    def _count(call: Call, reply: Reply, result: ApplyResult) -> bool:
        """Add the call's outcome to ``result``; whether it published the
        partition's first message (``@seq`` was 0 before it)."""
        statuses, seq = reply
        statuses = statuses.encode() if isinstance(statuses, str) else bytes(statuses)
        published, applied = statuses.count(b"p"), statuses.count(b"a")
        result.published += published
        result.applied += published + applied
        result.stale += statuses.count(b"s")
        result.seqs[call.partition] = int(seq)
        return published > 0 and int(seq) == published

    async def _evalsha(self, calls: list[Call], meanwhile: Callable[[], None] | None = None) -> list[Reply]:
        """Send the calls in one round trip; a NOSCRIPT (a restarted or
        failed-over server) is handled by ``scripts.run_many``. Raises on every failure that is
        not a content failure; returns those in the call's slot."""
        url = self.config.url
        send = functools.partial(self._send, meanwhile=meanwhile)
        replies = await scripts.run_many(self.client, scripts.APPLY, calls, url, send=send, keys_of=_keys)
        for reply in replies:
            if isinstance(reply, BaseException) and not _answered(reply):
                raise redis_calls.translate(reply, self.config.url)
        return replies

    async def _send(self, calls: list[Call], meanwhile: Callable[[], None] | None = None) -> list[Reply]:
        """One round trip. On a single server the calls go down one connection,
        each sent as soon as it is built (Redis runs one while the next is
        built); on a cluster (whose pipelines refuse EVALSHA) the calls are
        pipelined per node on one of its connections, with ``redis.durability``
        followed by its WAIT (``publishers.cluster_wait``)."""
        if isinstance(self.client, RedisCluster):
            commands = [
                (
                    ("EVALSHA", self.sha, len(_keys(call)), *_keys(call), *call.command[1]),
                    self.layout.wait_marker(call.partition),
                )
                for call in calls
            ]
            return await cluster_wait.send_waited(self.client, commands, self._acks, self.config.url)
        streamed: list[Reply] = await redis_calls.call(
            self._stream(self.client.connection_pool, calls, meanwhile), self.config.url
        )
        return streamed

    async def _stream(
        self, pool: ConnectionPool, calls: list[Call], meanwhile: Callable[[], None] | None = None
    ) -> list[Reply]:
        """Pipeline the calls on one pooled connection; error replies come back
        in their slot (a connection failure discards the connection). With
        ``redis.durability`` the round ends with WAIT on the same connection
        (``publishers.durability``): too few replicas raise ``RedisUnavailable``."""
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            for call in calls:
                await conn.send_packed_command(call.packed(self._sha))
            after = self._acks.commands(calls[0].partition) if self._acks.on else []
            for command in after:
                await conn.send_command(*command)
            if meanwhile is not None:
                meanwhile()  # CPU work of the caller's, while Redis runs the calls
            replies: list[Reply] = []
            for _ in range(len(calls) + len(after)):
                try:
                    replies.append(await conn.read_response())
                except rex.ResponseError as exc:
                    replies.append(exc)
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)
        if after:
            self._acks.settle(replies[len(calls) :])
        return replies[: len(calls)]

    async def load_script(self) -> None:
        """SCRIPT LOAD (on every primary of a cluster), checking its SHA-1."""
        await scripts.load(self.client, scripts.APPLY, self.config.url)


@dataclass
class _Batch:
    """What the calls of one ``apply`` share, and what they found."""

    header: tuple[Any, ...]
    result: ApplyResult
    registered: set[Pair]  # (section, partition) pairs this batch registered: new partitions
    blocked: dict[str, str] = field(default_factory=dict)  # partition -> why its keys cannot be written
    first: list[Call] = field(default_factory=list)  # calls that published a partition's first message
    meanwhile: Callable[[], None] | None = None  # run once, while the first calls are in Redis

    def run_meanwhile(self) -> None:
        hook, self.meanwhile = self.meanwhile, None
        if hook is not None:
            hook()

    def block(self, partition: str, changes: list[Change], reason: str) -> None:
        """Nothing of ``changes`` is written, nor anything of their partition after them."""
        self.blocked.setdefault(partition, reason)
        self.result.blocked.extend(Blocked(change, reason) for change in changes)


def _hold_unregistered(
    by_partition: dict[str, list[tuple[Change, int]]], unwritable: dict[Pair, str], result: ApplyResult
) -> dict[str, list[tuple[Change, int]]]:
    """Block the changes whose section's partitions set could not record
    their partition (a document must never be written before its partition is
    registered); the rest of the batch applies."""
    kept: dict[str, list[tuple[Change, int]]] = {}
    for partition, sized in by_partition.items():
        for change, size in sized:
            reason = unwritable.get((change.section, partition))
            if reason is None:
                kept.setdefault(partition, []).append((change, size))
            else:
                result.blocked.append(Blocked(change, reason))
    return kept


def _answered(reply: BaseException) -> bool:
    """An error reply the apply path settles itself: a content failure (bisected),
    FENCED, or a blocked partition; any other failure is raised."""
    return redis_calls.is_content_error(reply) or redis_calls.blocked_reason(reply) is not None


def _keys(call: Call) -> list[Any]:
    """KEYS of a call: its first one names the cluster node to load the script on."""
    return call.command[0]
