"""The apply path's Python half, beside ``lua/apply.lua``: admitting, chunking,
building the calls, sending them in pipelined rounds, bisecting poison changes.

``DataManager.apply`` groups a batch by partition (keeping each partition's
order), splits every partition into calls of at most ``max_changes_per_call``
changes (Redis serves nobody else while a script runs), and sends one
``apply.lua`` call per chunk: every first chunk of every partition in one
pipelined round trip (a cluster pipeline fans out to the nodes concurrently),
then every second chunk, and so on, so a partition's chunks run in order.

Failures are sorted three ways:

- transient (link down, loading, failover, OOM): ``RedisUnavailable`` is raised
  and the daemon retries the whole batch; replays are harmless by the apply
  rule (a change at or below a document's ``@v`` is dropped);
- a damaged shared key (``CDCLAYOUT`` from the script, ``NOPERM``): ``CdcError``,
  retrying cannot help;
- anything else is a content failure (e.g. ``WRONGTYPE``: someone wrote a
  string at a document key): the chunk is bisected, in order, until the
  poison change(s) are isolated; each goes to the dead letter with the Redis
  error as its reason, and the rest of the chunk is applied.

Changes that cannot be sent at all (oversized rows, reserved column names,
empty partition values, negative versions) go to the dead letter without a
Redis call.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Any

import orjson
from redis import exceptions as rex
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import ConnectionPool

from publishers import redis_calls, scripts
from publishers.connection import RedisClient
from publishers.layout import Layout
from publishers.model import ApplyResult, Change, timestamp
from publishers.settings import RedisConfig

# What the applier does with a change it cannot apply: the dead letter, with the reason.
Reject = Callable[[Change, str, ApplyResult], Awaitable[None]]


MAX_CHANGES_PER_CALL = 1000
MAX_CALL_BYTES = 8 << 20  # values per script call: bounds the time Redis is busy
MAX_ROW_BYTES = 1 << 20
_KNOWN_PAIRS_LIMIT = 100_000

Reply = Any  # a decoded Redis reply, or the exception a pipeline slot raised


def apply_script() -> bytes:
    """The text of ``lua/apply.lua``, shipped as package data."""
    return scripts.APPLY.text


@lru_cache(maxsize=4096)
def _column_args(column: str) -> tuple[bytes, bytes, bytes]:
    """Hash field, JSON name and JSON RFC 6901 path of a column, so that the
    script never escapes JSON or JSON Pointer itself."""
    pointer = "/" + column.replace("~", "~0").replace("/", "~1")
    return column.encode(), orjson.dumps(column), orjson.dumps(pointer)


@lru_cache(maxsize=1024)
def _names_check(names: tuple[str, ...]) -> tuple[str | None, int]:
    """(problem with a row's column names or None, their size in bytes)."""
    reserved = [name for name in names if name.startswith("@")]
    problem = f"reserved column name(s): {', '.join(reserved)}" if reserved else None
    return problem, sum(len(name) for name in names)


@dataclass
class _Call:
    """One ``apply.lua`` call: a chunk of one partition's changes. Its KEYS
    and ARGV are built on first use, so that a call can be built while Redis
    runs the one sent before it."""

    layout: Layout
    header: tuple[Any, ...]
    partition: str
    changes: list[Change]

    @cached_property
    def command(self) -> tuple[list[Any], list[Any]]:
        builder = _CallBuilder(self.layout, self.partition)
        for change in self.changes:
            builder.add(change)
        return builder.keys_and_args(self.header)


class _CallBuilder:
    """KEYS and ARGV of one call, laid out as apply.lua's header describes.

    Columns are sent once per call and rows refer to a *shape* (their column
    list), so a row costs one argument per value plus six, not three per column.
    """

    def __init__(self, layout: Layout, partition: str) -> None:
        self.layout, self.partition = layout, partition
        self.prefix = layout.prefix(partition)
        self.groups: dict[tuple[str, str], int] = {}
        self.doc_prefixes: dict[int, str] = {}
        self.group_args: list[Any] = []
        self.index_keys: list[str] = []
        self.columns: dict[str, int] = {}
        self.column_args: list[Any] = []
        self.shapes: dict[tuple[str, ...], int] = {}
        self.shape_args: list[Any] = []
        self.doc_keys: list[str] = []
        self.change_args: list[Any] = []

    def add(self, change: Change) -> None:
        """Append one change (the hot path: a few dict lookups and one extend)."""
        group = self.groups.get((change.section, change.table)) or self._group(change)
        self.doc_keys.append(self.doc_prefixes[group] + change.key)
        values = change.values
        reset = b"1" if change.reset else b"0"
        if change.op == "D" or values is None:
            self.change_args += (group, orjson.dumps(change.key), "D", str(change.version), reset, 0)
            return
        names = tuple(values)
        shape = self.shapes.get(names) or self._shape(names)
        self.change_args += (group, orjson.dumps(change.key), change.op, str(change.version), reset, shape)
        self.change_args += values.values()

    def _group(self, change: Change) -> int:
        doc_prefix = f"{self.prefix}{change.section}:"
        group = self.groups[(change.section, change.table)] = len(self.groups) + 1
        self.doc_prefixes[group] = doc_prefix
        self.index_keys.append(self.layout.index(self.partition, change.section))
        self.group_args += (orjson.dumps(change.section), orjson.dumps(change.table))
        self.group_args += (self.layout.channel(self.partition, change.section), len(doc_prefix.encode()))
        self.group_args.append(str(change.fence))
        return group

    def _shape(self, names: tuple[str, ...]) -> int:
        indexes = []
        for name in names:
            if name not in self.columns:
                self.columns[name] = len(self.columns) + 1
                self.column_args.extend(_column_args(name))
            indexes.append(self.columns[name])
        self.shapes[names] = len(self.shapes) + 1
        self.shape_args += (len(indexes), *indexes)
        return len(self.shapes)

    def keys_and_args(self, header: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        keys = [
            self.layout.seq(self.partition),
            self.layout.stream(self.partition),
            self.layout.fence(self.partition),
        ]
        keys += self.index_keys + self.doc_keys
        args = [orjson.dumps(self.partition), *header, len(self.groups), len(self.columns), len(self.shapes)]
        args += self.group_args + self.column_args + self.shape_args + self.change_args
        return keys, args


class Applier:
    """Applies batches to one Redis (``client``, its ``config`` and key
    ``layout``), sending what cannot be applied to ``reject`` (the dead
    letter); keeps the script's SHA and the (section, partition) pairs
    already registered."""

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
        self.max_row_bytes = max_row_bytes
        self.max_changes_per_call = max(1, max_changes_per_call)
        self.script = scripts.APPLY.text
        self.sha = scripts.APPLY.sha
        self._known_pairs: set[tuple[str, str]] = set()
        self._known_sections: set[str] = set()
        self._header = (
            str(config.stream_max_len),
            str(max(1, round(config.tombstone_ttl * 1000))),
            "SPUBLISH" if config.cluster else "PUBLISH",
        )

    async def apply(self, changes: Sequence[Change], *, now: datetime | None = None) -> ApplyResult:
        """Apply a batch: per partition in order, atomically per call.

        Raises ``RedisUnavailable`` on transient failures (retry the batch).
        """
        result = ApplyResult()
        by_partition: dict[str, list[tuple[Change, int]]] = {}
        for change in changes:
            problem, size = self._admit(change)
            if problem is not None:
                await self._reject(change, problem, result)
            else:
                by_partition.setdefault(change.partition, []).append((change, size))
        if not by_partition:
            return result
        registered = await self._register_partitions(by_partition)
        header: tuple[Any, ...] = (timestamp(now), *self._header)
        chunked = [self._chunks(partition, sized) for partition, sized in by_partition.items()]
        for round_ in itertools.zip_longest(*chunked):
            calls = [_Call(self.layout, header, *chunk) for chunk in round_ if chunk is not None]
            await self._run_round(calls, header, result, registered)
        return result

    def _admit(self, change: Change) -> tuple[str | None, int]:
        """Why ``change`` cannot be sent to Redis at all (or None), and its size
        in bytes. Checks that only depend on the column names are cached per
        column list, so a row costs one C-level pass over its values."""
        if not change.partition:
            return "empty partition value", 0
        if not change.key:
            return "empty data key", 0
        if change.version < 0:
            return f"negative version {change.version}", 0
        values = change.values
        if change.op == "D" or values is None:
            return (None if change.op == "D" else f"op {change.op} without values"), 0
        problem, names_size = _names_check(tuple(values))
        size = names_size + sum(map(len, values.values()))
        if problem is None and size > self.max_row_bytes:
            problem = f"row of {size} bytes exceeds max_row_bytes ({self.max_row_bytes})"
        return problem, size

    def _chunks(self, partition: str, sized: list[tuple[Change, int]]) -> list[tuple[str, list[Change]]]:
        """Split one partition's changes into calls bounded by count and bytes."""
        chunks: list[tuple[str, list[Change]]] = []
        current: list[Change] = []
        total = 0
        for change, size in sized:
            if current and (len(current) >= self.max_changes_per_call or total + size > MAX_CALL_BYTES):
                chunks.append((partition, current))
                current, total = [], 0
            current.append(change)
            total += size
        chunks.append((partition, current))
        return chunks

    async def _register_partitions(
        self, by_partition: Mapping[str, list[tuple[Change, int]]]
    ) -> set[tuple[str, str]]:
        """Record every (section, partition) pair in ``ns:@partitions:section``
        *before* the documents are written, so that a sweep or a subscriber
        that lists a section's partitions never misses a written one. Returns
        the pairs registered now (the others were known already)."""
        missing: dict[str, set[str]] = {}
        for partition, sized in by_partition.items():
            for change, _ in sized:
                if (change.section, partition) not in self._known_pairs:
                    missing.setdefault(change.section, set()).add(partition)
        if not missing:
            return set()
        pipe = self.client.pipeline(transaction=False)
        for section, partitions in missing.items():
            pipe.sadd(self.layout.partitions(section), *sorted(partitions))
        await redis_calls.execute(pipe, self.config.url)
        if len(self._known_pairs) > _KNOWN_PAIRS_LIMIT:
            self._known_pairs.clear()
        registered = {(s, p) for s, ps in missing.items() for p in ps}
        self._known_pairs |= registered
        self._known_sections |= missing.keys()
        return registered

    async def _run_round(
        self, calls: list[_Call], header: Sequence[Any], result: ApplyResult, registered: set[tuple[str, str]]
    ) -> None:
        replies = await self._evalsha(calls)
        failed: list[tuple[_Call, BaseException]] = []
        first: list[_Call] = []  # calls that wrote their partition's first message
        for call, reply in zip(calls, replies, strict=True):
            if redis_calls.is_fenced(reply):
                result.fenced.extend(call.changes)  # nothing written: another sidecar owns the table
            elif isinstance(reply, BaseException):
                failed.append((call, reply))
            elif self._count(call, reply, result):
                first.append(call)
        if first:
            await self._registrations_lost(first, registered)
        for call, error in failed:
            await self._isolate(call.partition, call.changes, header, result, error)

    async def _registrations_lost(self, calls: list[_Call], registered: set[tuple[str, str]]) -> None:
        """These calls started their partition's ``@seq`` from 0: the partition
        is new (registered by this batch), or Redis lost its data (restarted
        empty, flushed) after this manager registered it. Then what the cache
        says about the partition is wrong: forget it and register again now,
        or sweeps and subscribers would never find the documents written."""
        partitions = {call.partition for call in calls}
        stale = {(s, p) for s in self._known_sections for p in partitions} & self._known_pairs
        stale -= registered
        if stale:
            self._known_pairs -= stale
            await self._register_partitions({c.partition: [(x, 0) for x in c.changes] for c in calls})

    async def _isolate(
        self,
        partition: str,
        changes: list[Change],
        header: Sequence[Any],
        result: ApplyResult,
        error: BaseException,
    ) -> None:
        """Bisect a failed chunk, halves in order, down to the poison change(s).

        Changes before the poison may have been applied by the failed call;
        re-sending them is harmless (they are stale now), but they are then
        counted as stale rather than applied.
        """
        if len(changes) == 1:
            await self._reject(changes[0], redis_calls.redis_message(error), result)
            return
        middle = len(changes) // 2
        for half in (changes[:middle], changes[middle:]):
            call = _Call(self.layout, tuple(header), partition, half)
            reply = (await self._evalsha([call]))[0]
            if redis_calls.is_fenced(reply):
                result.fenced.extend(half)
            elif isinstance(reply, BaseException):
                await self._isolate(partition, half, header, result, reply)
            else:
                self._count(call, reply, result)

    @staticmethod
    def _count(call: _Call, reply: Reply, result: ApplyResult) -> bool:
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

    async def _evalsha(self, calls: list[_Call]) -> list[Reply]:
        """Send the calls in one round trip; a NOSCRIPT (a restarted or
        failed-over server) is handled by ``scripts.run_many``. Raises on every failure that is
        not a content failure; returns those in the call's slot."""
        url = self.config.url
        replies = await scripts.run_many(
            self.client, scripts.APPLY, calls, url, send=self._send, keys_of=_keys
        )
        for reply in replies:
            if isinstance(reply, BaseException) and not redis_calls.is_content_error(reply):
                raise redis_calls.translate(reply, self.config.url)
        return replies

    async def _send(self, calls: list[_Call]) -> list[Reply]:
        """One round trip. On a single server the calls go down one connection,
        each sent as soon as it is built (Redis runs one while the next is
        built); a cluster (whose pipelines refuse EVALSHA) gets concurrent
        calls, each routed to its node."""
        if isinstance(self.client, RedisCluster):
            return await scripts.gathered([self._send_one(call) for call in calls])
        streamed: list[Reply] = await redis_calls.call(
            self._stream(self.client.connection_pool, calls), self.config.url
        )
        return streamed

    async def _stream(self, pool: ConnectionPool, calls: list[_Call]) -> list[Reply]:
        """Pipeline the calls on one pooled connection; error replies come back
        in their slot (a connection failure discards the connection)."""
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            for call in calls:
                keys, args = call.command
                await conn.send_command("EVALSHA", self.sha, len(keys), *keys, *args)
            replies: list[Reply] = []
            for _ in calls:
                try:
                    replies.append(await conn.read_response())
                except rex.ResponseError as exc:
                    replies.append(exc)
            return replies
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)

    async def _send_one(self, call: _Call) -> Reply:
        """The reply, or the ResponseError a content failure raised."""
        keys, args = call.command
        command = self.client.evalsha(self.sha, len(keys), *keys, *args)
        return await redis_calls.reply_or_error(command, self.config.url)

    async def load_script(self) -> None:
        """SCRIPT LOAD (on every primary of a cluster), checking its SHA-1."""
        await scripts.load(self.client, scripts.APPLY, self.config.url)


def _keys(call: _Call) -> list[Any]:
    """KEYS of a call: its first one names the cluster node to load the script on."""
    return call.command[0]
