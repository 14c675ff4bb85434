"""The consumer-group client: several processes share a section's (or a
partition's) changes, each message handled by one of them (docs/CONSUMERS.md).

- *Taking* (``consume_take.lua``, one atomic call in the partition's slot):
  a consumer takes new entries of the partition's stream (XREADGROUP) when it
  has room (``max_in_flight`` held at most); an entry whose document another
  live consumer holds is handed to that holder, so a document's messages run
  one at a time, in seq order, while different documents run at once.
- *Liveness*: each consumer renews its expiry in every partition every third
  of ``claim_after``; a consumer past it is presumed dead and the next take of
  another consumer claims all its pending entries (and documents).
- *Running* (``consumer_work``): the handler's failures are retried with
  backoff and jitter, each run one delivery; after ``max_deliveries`` the
  message goes to the application's dead letter stream with the reason; it
  is acknowledged only once handled or dead-lettered (at-least-once).
- *Losses*: entries trimmed from the stream before they were handled are
  reported (``on_lost``, the log; without ``on_lost`` the consumer stops with
  ``MessagesLost``), never skipped silently.
- *Stopping* (``stop()``, SIGTERM with ``handle_signals``): no more taking,
  running handlers finish within ``shutdown_timeout``, the rest stays pending
  and the consumer leaves, so that the others claim it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from publishers import connection, redis_calls
from publishers.connection import RedisClient
from publishers.consumer_group import GroupGone, GroupPartition, backoff, check_name
from publishers.consumer_work import Delivery, Handler, Policy, StopConsuming, Work
from publishers.errors import CdcError, TransientError
from publishers.layout import Layout
from publishers.messages import decode_message, stream_seq
from publishers.settings import RedisConfig

log = logging.getLogger("publishers.consumer")

TAKES_AT_ONCE = 16
WAITS_AT_ONCE = 16

__all__ = [
    "BlockingConsumer",
    "Consumer",
    "ConsumerSettings",
    "Delivery",
    "Lost",
    "MessagesLost",
    "StopConsuming",
]


@dataclass(frozen=True)
class ConsumerSettings:
    """A consumer's part of a group. ``sections``: the sections whose
    messages the group handles (their partitions are found in
    ``ns:@partitions:section`` and followed as they appear); ``partitions``:
    only these partitions (all their sections unless ``sections`` is given).
    ``dead_letter``: the application's stream for messages that failed
    ``max_deliveries`` times."""

    group: str
    dead_letter: str
    sections: Sequence[str] = ()
    partitions: Sequence[str] | None = None
    consumer: str = ""  # default: host-pid-random, unique per process
    max_in_flight: int = 64
    max_deliveries: int = 5
    claim_after: float = 30.0  # seconds without a heartbeat before its entries are claimed
    retry_first: float = 0.5
    retry_cap: float = 30.0
    start: str = "all"  # a new group starts with "all" the stream holds, or "new" entries only
    block: float = 1.0  # the longest wait for new entries before looking again (inbox, dead consumers)
    discover_every: float = 10.0
    shutdown_timeout: float = 30.0
    dead_letter_max_len: int = 100_000

    def checked(self) -> ConsumerSettings:
        check_name("group", self.group)
        if self.consumer:
            check_name("consumer", self.consumer)
        if not self.sections and not self.partitions:
            raise CdcError("a consumer needs sections or partitions to read")
        if self.start not in ("all", "new"):
            raise CdcError(f"start is 'all' or 'new', not {self.start!r}")
        if self.max_in_flight < 1 or self.max_deliveries < 1 or self.claim_after <= 0:
            raise CdcError("max_in_flight and max_deliveries are at least 1, claim_after above 0")
        if not self.dead_letter:
            raise CdcError("a consumer needs a dead letter stream")
        return self

    def policy(self, consumer: str) -> Policy:
        """What running messages needs of these settings."""
        return Policy(
            consumer,
            self.group,
            self.dead_letter,
            self.dead_letter_max_len,
            self.max_deliveries,
            self.retry_first,
            self.retry_cap,
        )


@dataclass(frozen=True, slots=True)
class Lost:
    """Messages the stream no longer held when the group came to them:
    ``what`` is a seq range ``a-b`` or an entry id."""

    partition: str
    what: str
    reason: str


class MessagesLost(CdcError):
    """The stream was trimmed past messages the group had not handled."""


def _namespace_of(source: RedisClient | RedisConfig) -> str:
    if isinstance(source, RedisConfig):
        return source.namespace
    raise CdcError("a consumer given a Redis client needs namespace= (a RedisConfig has its own)")


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Consumer:
    """One consumer of a group. ``await consumer.run()`` until ``stop()``.
    The namespace is the ``RedisConfig``'s unless ``namespace`` is given (it
    must be, with a client of the application's own)."""

    def __init__(
        self,
        source: RedisClient | RedisConfig,
        settings: ConsumerSettings,
        handler: Handler,
        *,
        namespace: str | None = None,
        on_lost: Callable[[Lost], None] | None = None,
    ) -> None:
        self.settings = settings.checked()
        self.name = settings.consumer or default_name()
        self._config = source if isinstance(source, RedisConfig) else None
        self._client = None if isinstance(source, RedisConfig) else source
        self.layout = Layout(namespace if namespace is not None else _namespace_of(source))
        self.handler = handler
        self.on_lost = on_lost
        self.lost: list[Lost] = []
        self.work: Work | None = None
        self._groups: dict[str, GroupPartition] = {}
        self._registered: set[str] = set()  # partitions this consumer has taken from
        self._recover: set[str] = set()  # partitions where its own pending entries are to be taken again
        self._readers: list[asyncio.Task[None]] = []
        self._heart: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        # pooled connections are few (redis-py's pool: 100) and a section may
        # have hundreds of partitions: bounded takes at once, and blocking
        # waits (one connection each for up to ``block``); a partition that
        # finds every wait slot taken sleeps instead
        self._takes = asyncio.Semaphore(TAKES_AT_ONCE)
        self._waits = asyncio.Semaphore(WAITS_AT_ONCE)
        self._failure: CdcError | None = None

    @property
    def url(self) -> str:
        return self._config.url if self._config is not None else ""

    def stop(self) -> None:
        """Stop taking messages and shut down (``run()`` returns)."""
        self._stop.set()

    async def run(self, *, handle_signals: bool = False) -> None:
        """Consume until ``stop()`` (or SIGTERM/SIGINT with ``handle_signals``),
        then shut down gracefully. Raises ``MessagesLost`` if messages were
        lost and no ``on_lost`` took the report."""
        loop = asyncio.get_running_loop()
        client = self._client or await connection.connect(self._config)  # type: ignore[arg-type]
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        s = self.settings
        self.work = Work(client, s.policy(self.name), self.handler, self._crashed, self.stop)
        try:
            await self._discover(client)
            self._heart.append(self._spawn(self._heartbeat()))
            if s.partitions is None:
                self._readers.append(self._spawn(self._rediscover(client)))
            await self._stop.wait()
        finally:
            await self._shutdown(self.work)
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            if self._config is not None:
                await connection.close_client(client)
        if self._failure is not None:
            raise self._failure

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        task.add_done_callback(self._crashed)
        return task

    def _crashed(self, task: asyncio.Task[None]) -> None:
        """A task that ended with an error that is not transient (a refused
        command, a damaged key): the consumer stops with it, loudly."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error("consumer %s stops: %s", self.name, exc, exc_info=exc)
        if self._failure is None:
            self._failure = exc if isinstance(exc, CdcError) else CdcError(f"consumer failed: {exc!r}")
        self.stop()

    # -- partitions ------------------------------------------------------------

    async def _discover(self, client: RedisClient) -> None:
        """Follow every partition of the sections (``ns:@partitions:section``:
        written before a partition's first document, so none is missed), or
        the partitions given; create the group where it is missing."""
        wanted = set(self.settings.partitions or ())
        if self.settings.partitions is None:
            for section in self.settings.sections:
                members = await redis_calls.call(client.smembers(self.layout.partitions(section)), self.url)
                wanted |= {redis_calls.text(m) for m in members}
        for partition in sorted(wanted - set(self._groups)):
            group = GroupPartition(client, self.layout, self.settings.group, partition, self.url)
            if await group.create(self.settings.start):
                log.info("created consumer group %s in partition %s", self.settings.group, partition)
            self._groups[partition] = group
            self._readers.append(self._spawn(self._read(group)))

    async def _rediscover(self, client: RedisClient) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(self.settings.discover_every)
            try:
                await self._discover(client)
            except TransientError as exc:
                log.warning("finding the sections' partitions: %s (retrying)", exc)

    # -- taking ----------------------------------------------------------------

    async def _read(self, group: GroupPartition) -> None:
        """Take the partition's entries while there is room; wait for new ones."""
        work, s, failures = self.work, self.settings, 0
        assert work is not None
        ttl = round(s.claim_after * 1000)
        block_ms = max(1, round(s.block * 1000))
        while not self._stop.is_set():
            room = s.max_in_flight - work.held
            if room <= 0:
                work.freed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(work.freed.wait(), s.block)
                continue
            try:
                partition = group.partition
                known, recover = (
                    partition in self._registered,
                    partition not in self._registered or partition in self._recover,
                )
                self._recover.add(partition)  # until the reply is here: lost, it may have taken entries
                async with self._takes:
                    taken = await group.take(self.name, room, ttl, known, list(s.sections), recover)
                self._recover.discard(partition)
                self._registered.add(partition)
                self._took(group, taken.entries, taken.lost, taken.reaped)
                if not taken.entries:
                    await self._wait(group, taken.last, block_ms)
                failures = 0
            except GroupGone as exc:
                self._report(Lost(group.partition, "all", str(exc)))
                work.drop(group.partition)  # a stream written again reuses its entry ids
                self._registered.discard(group.partition)
                await group.create_again(self._stop, s.block)
            except TransientError as exc:
                failures += 1
                log.warning("reading %s: %s (retrying)", group.stream, exc)
                await asyncio.sleep(backoff(failures, 0.1, 2.0))

    async def _wait(self, group: GroupPartition, last: int, block_ms: int) -> None:
        """Until the partition's stream has an entry after ``last``, at most ``block``."""
        if self._waits.locked():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), block_ms / 1000)
            return
        async with self._waits:
            await group.wait(last, block_ms)

    def _took(
        self, group: GroupPartition, entries: list[tuple[str, bytes, int]], lost: list[str], reaped: bool
    ) -> None:
        work = self.work
        assert work is not None
        if reaped:
            log.warning(
                "consumer %s was presumed dead in %s (no heartbeat within %.1fs): its messages went to others",
                self.name,
                group.partition,
                self.settings.claim_after,
            )
            work.drop(group.partition)
        for what in lost:
            self._report(Lost(group.partition, what, "trimmed from the stream before the group handled it"))
        for entry_id, text, deliveries in entries:
            try:
                message = decode_message(text)
            except ValueError:  # not JSON: written by something else; dead-lettered as it is
                message = {}
            if not isinstance(message, dict):
                message = {}
            seq = stream_seq(entry_id)
            work.add(group, Delivery(group.partition, entry_id, seq, text, message, deliveries, self.name))

    def _report(self, lost: Lost) -> None:
        """Never silent: the log, then ``on_lost``, or stop with ``MessagesLost``."""
        log.error(
            "consumer group %s lost messages in partition %s (%s): %s",
            self.settings.group,
            lost.partition,
            lost.what,
            lost.reason,
        )
        self.lost.append(lost)
        if self.on_lost is not None:
            self.on_lost(lost)
        elif self._failure is None:
            self._failure = MessagesLost(
                f"consumer group {self.settings.group} lost messages in partition {lost.partition} "
                f"({lost.what}): {lost.reason}"
            )
            self.stop()

    # -- liveness and stopping -------------------------------------------------

    async def _heartbeat(self) -> None:
        ttl = round(self.settings.claim_after * 1000)
        while True:
            await asyncio.sleep(self.settings.claim_after / 3)
            for partition, group in list(self._groups.items()):
                try:
                    alive = await group.beat(self.name, ttl)
                except TransientError as exc:
                    log.warning("heartbeat in %s: %s", partition, exc)
                    continue
                if not alive and partition in self._registered and self.work is not None:
                    log.warning(
                        "consumer %s was presumed dead in %s: its messages went to others",
                        self.name,
                        partition,
                    )
                    self.work.drop(partition)

    async def _shutdown(self, work: Work) -> None:
        """Stop taking; let running handlers finish within the timeout (the
        heartbeat goes on meanwhile, so nobody claims their messages); then
        leave every partition: what is still pending goes to the others."""
        work.stopping.set()
        await _cancel(self._readers)
        running = work.runners()
        if running:
            _, late = await asyncio.wait(running, timeout=self.settings.shutdown_timeout)
            if late:
                log.warning(
                    "%d handlers did not finish within the shutdown timeout: their messages stay pending",
                    len(late),
                )
            await _cancel(list(late))
        await work.settled()
        await _cancel(self._heart)
        for group in self._groups.values():
            with contextlib.suppress(CdcError):
                await group.beat(self.name, 0)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


class BlockingConsumer:
    """The consumer for code without asyncio: ``run()`` blocks until
    ``stop()`` (from any thread) or SIGTERM/SIGINT; the handler is a plain
    function, called in a worker thread (``asyncio.to_thread``) so that the
    event loop, and with it the heartbeat, goes on while it works."""

    def __init__(
        self,
        config: RedisConfig,
        settings: ConsumerSettings,
        handler: Callable[[Delivery], None],
        *,
        namespace: str | None = None,
        on_lost: Callable[[Lost], None] | None = None,
    ) -> None:
        self._handler = handler
        self.consumer = Consumer(config, settings, self._call, namespace=namespace, on_lost=on_lost)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _call(self, delivery: Delivery) -> None:
        await asyncio.to_thread(self._handler, delivery)

    def run(self, *, handle_signals: bool = True) -> None:
        """Consume (signals can only be handled in the main thread)."""
        asyncio.run(self._main(handle_signals))

    async def _main(self, handle_signals: bool) -> None:
        self._loop = asyncio.get_running_loop()
        await self.consumer.run(handle_signals=handle_signals)

    def stop(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            self.consumer.stop()
        else:
            loop.call_soon_threadsafe(self.consumer.stop)
