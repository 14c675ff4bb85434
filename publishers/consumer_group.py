"""A consumer group in one partition's stream: its keys and its Redis calls.

Every key of a group in a partition shares the partition's ``{p}`` hash tag,
so each call below is one atomic Lua script in the partition's slot (also on
a Redis Cluster)::

    ns:{p}:@stream                  the partition's stream; the group lives in it (XGROUP)
    ns:{p}:@group:g:holders         hash  document -> "<pending entries> <consumer>"
    ns:{p}:@group:g:docs            hash  pending entry id -> document
    ns:{p}:@group:g:inbox           zset  "<consumer>\\0<seq, 20 digits>": entries handed to their
                                          document's holder (lexical order = seq order)
    ns:{p}:@group:g:alive           hash  consumer -> when it is presumed dead (Redis TIME, ms)

A document is a section and a key (their JSON texts, as the message spells
them). The rule the scripts keep: all pending entries of a document are held
by one consumer, which runs them in seq order (docs/CONSUMERS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from publishers import redis_calls, scripts
from publishers.connection import RedisClient
from publishers.errors import CdcError, TransientError
from publishers.layout import Layout

log = logging.getLogger("publishers.consumer")

# A group or consumer name: it is part of key names and of the inbox's members.
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]*")


@dataclass(frozen=True, slots=True)
class Taken:
    """What one ``take`` brought: entries to run (id, message text, delivery
    count), what the stream lost (seq ranges ``"a-b"`` or entry ids), whether
    this consumer had been presumed dead (its entries went to others), and
    the group's last-delivered seq."""

    entries: list[tuple[str, bytes, int]]
    lost: list[str]
    reaped: bool
    last: int


class GroupGone(CdcError):
    """The group is missing from the partition's stream (the stream was
    deleted, or Redis lost its data)."""


def backoff(attempt: int, first: float, cap: float) -> float:
    """Equal jitter, as ``publishers.retrying.equal_jitter``: half of the
    doubling delay fixed, half random, so consumers that fail together do not
    retry in lockstep."""
    delay: float = min(cap, first * 2.0 ** (attempt - 1))
    return delay / 2 + random.uniform(0, delay / 2)


async def persist(call: Callable[[], Awaitable[Any]], what: str) -> Any:
    """``call()`` again across transient Redis errors (until cancelled): an
    acknowledgement or a dead letter must not be dropped by a failover."""
    attempt = 0
    while True:
        try:
            return await call()
        except TransientError as exc:
            attempt += 1
            log.warning("%s: %s (retrying)", what, exc)
            await asyncio.sleep(backoff(attempt, 0.1, 2.0))


def check_name(kind: str, name: str) -> str:
    if not NAME.fullmatch(name):
        raise CdcError(f"a {kind} name is letters, digits, _ . @ -, not starting with . @ or -: {name!r}")
    return name


class GroupPartition:
    """One group's calls in one partition."""

    def __init__(
        self, client: RedisClient, layout: Layout, group: str, partition: str, url: str = ""
    ) -> None:
        self.client, self.group, self.partition, self.url = client, group, partition, url
        base = f"{layout.prefix(partition)}@group:{group}:"
        self.stream = layout.stream(partition)
        self.seq = layout.seq(partition)
        self.holders, self.docs = base + "holders", base + "docs"
        self.inbox, self.alive = base + "inbox", base + "alive"

    async def create(self, start: str) -> bool:
        """Create the group (``start``: ``all`` the stream holds, or ``new``
        only); False if it existed."""
        keys = [self.stream, self.holders, self.docs, self.inbox]
        reply = await self._run(scripts.CONSUME_CREATE, keys, [self.group, start, 1])
        return bool(reply)

    async def create_again(self, stopped: asyncio.Event, every: float) -> None:
        """Create the group that vanished (``all``) once its stream has been
        written again (the sidecar writes it after a re-snapshot, its seqs
        going on), looking every ``every`` seconds until ``stopped``."""
        keys = [self.stream, self.holders, self.docs, self.inbox]
        while not stopped.is_set():
            reply = await persist(
                lambda: self._run(scripts.CONSUME_CREATE, keys, [self.group, "all", 0]),
                "creating the group again",
            )
            if int(reply) >= 0:  # created, or another consumer did
                log.info("created consumer group %s again in partition %s", self.group, self.partition)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), every)

    async def take(
        self, consumer: str, room: int, ttl_ms: int, registered: bool, sections: list[str], recover: bool
    ) -> Taken:
        """Take up to ``room`` entries (more when a dead consumer's are taken
        over: those come whole). ``registered``: this consumer has taken here
        before (so a missing liveness entry means it was presumed dead);
        ``recover``: take its own pending entries again (after a restart, or a
        take whose reply was lost). Raises ``GroupGone`` when the group is missing."""
        keys = [self.stream, self.holders, self.docs, self.inbox, self.alive, self.seq]
        wanted = "\n".join(orjson.dumps(s).decode() for s in sections)
        args = [self.group, consumer, room, ttl_ms, int(registered), wanted, int(recover)]
        out, lost, reaped, last = await self._run(scripts.CONSUME_TAKE, keys, args)
        entries = [
            (redis_calls.text(out[i]), bytes(out[i + 1]), int(out[i + 2])) for i in range(0, len(out), 3)
        ]
        return Taken(entries, [redis_calls.text(x) for x in lost], bool(reaped), int(last))

    async def ack(self, consumer: str, ids: list[str]) -> list[int]:
        """Acknowledge entries this consumer holds: per id 1 done, 0 not pending,
        -1 held by another consumer now."""
        reply = await self._run(
            scripts.CONSUME_ACK, [self.stream, self.holders, self.docs], [self.group, consumer, *ids]
        )
        return [int(x) for x in reply]

    async def retry(self, consumer: str, entry_id: str) -> int:
        """Count one more delivery of an entry this consumer holds; -1 if it does not."""
        return int(await self._run(scripts.CONSUME_RETRY, [self.stream], [self.group, consumer, entry_id]))

    async def beat(self, consumer: str, ttl_ms: int) -> bool:
        """Renew the consumer's liveness (``ttl_ms`` 0: it leaves); False if it
        had been presumed dead."""
        return bool(await self._run(scripts.CONSUME_BEAT, [self.alive, self.stream], [consumer, ttl_ms]))

    async def wait(self, after_seq: int, block_ms: int) -> None:
        """Return when the stream has an entry after ``after_seq``, or after ``block_ms``."""
        await redis_calls.call(
            self.client.xread({self.stream: f"{after_seq}-0"}, count=1, block=block_ms),
            self.url,
            grace=block_ms / 1000 + redis_calls.SOCKET_TIMEOUT,
        )

    async def _run(self, script: scripts.Script, keys: list[str], args: list[Any]) -> Any:
        try:
            return await scripts.run(self.client, script, keys, args, self.url)
        except CdcError as exc:
            if "NOGROUP" in str(exc):
                raise GroupGone(
                    f"consumer group {self.group} is missing from {self.stream}: the stream was deleted "
                    "or Redis lost its data"
                ) from None
            raise
