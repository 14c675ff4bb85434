"""Running one consumer's messages: per-document queues, the handler's
retries with backoff and jitter, the dead letter, and the acknowledgement.

A document's messages run one at a time in seq order (its queue); different
documents run at once. Each run of the handler is one delivery in Redis (a
retry counts one more, ``consume_retry.lua``), so that a message that fails,
or kills its consumer, ``max_deliveries`` times goes to the dead letter with
the reason, whichever consumers ran it.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from publishers import redis_calls
from publishers.connection import RedisClient
from publishers.consumer_acks import Acks
from publishers.consumer_group import GroupGone, GroupPartition, backoff, persist
from publishers.messages import Message

log = logging.getLogger("publishers.consumer")


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message handed to the handler.

    ``deliveries`` is how many times it has been delivered, this one
    included (1 the first time): a handler that must not act twice keeps, per
    document, the highest ``seq`` (or the message's ``version``) it has acted
    on, since a message can be delivered again after a crash before its
    acknowledgement."""

    partition: str
    id: str  # the stream entry id, "<seq>-0"
    seq: int
    text: bytes  # the message's JSON text, UTF-8, byte for byte as the stream holds it
    message: Message
    deliveries: int
    consumer: str


Handler = Callable[[Delivery], Awaitable[None]]


class StopConsuming(Exception):
    """Raised by a handler that cannot go on for a reason that is not the
    message's (its output closed, e.g. ``cdc consume | head``): the consumer
    stops gracefully, and the message stays pending, unacknowledged, its
    delivery not counted as a failure, for the group's other consumers (or
    this one's next run)."""


@dataclass(frozen=True)
class Policy:
    """How a consumer runs messages (``ConsumerSettings`` fills it)."""

    consumer: str
    group: str
    dead_letter: str
    dead_letter_max_len: int
    max_deliveries: int
    retry_first: float
    retry_cap: float


@dataclass
class _Document:
    """A document's messages held by this consumer, in seq order."""

    waiting: list[Delivery] = field(default_factory=list)
    runner: asyncio.Task[None] | None = None


class Work:
    """The messages one consumer holds, and their handling."""

    def __init__(
        self,
        client: RedisClient,
        policy: Policy,
        handler: Handler,
        crashed: Callable[[asyncio.Task[None]], None],
        stop: Callable[[], None],
    ) -> None:
        self.client, self.policy, self.handler = client, policy, handler
        self._stop = stop  # the consumer's stop(): a handler raised StopConsuming
        self._crashed = crashed  # told of a runner that failed (a Redis refusal, not the handler)
        self.held = 0
        self.handled = 0
        self.dead_lettered = 0
        self.stopping = asyncio.Event()  # no new message starts; a retry's wait ends
        self.freed = asyncio.Event()  # a held message was finished
        self._docs: dict[tuple[str, Any], _Document] = {}
        self._ids: set[tuple[str, str]] = set()  # (partition, entry id) of every message held
        self._groups: dict[str, GroupPartition] = {}
        self._acks: dict[str, Acks] = {}

    def add(self, group: GroupPartition, delivery: Delivery) -> None:
        """Hold a message; it runs after the messages of its document held
        before it. One held already (taken again when a take's reply was lost)
        is not held twice."""
        if (delivery.partition, delivery.id) in self._ids:
            return
        self._ids.add((delivery.partition, delivery.id))
        self._groups[delivery.partition] = group
        message = delivery.message
        key = (
            delivery.partition,
            (message.get("section"), message.get("key")) if "key" in message else delivery.id,
        )
        doc = self._docs.setdefault(key, _Document())
        # in seq order, never before the one running (the first): a document's
        # entries reach its holder in seq order anyway (consume_take.lua)
        bisect.insort(doc.waiting, delivery, lo=1 if doc.runner else 0, key=lambda d: d.seq)
        self.held += 1
        if doc.runner is None:
            doc.runner = asyncio.create_task(self._run(key, doc))
            doc.runner.add_done_callback(self._crashed)

    def drop(self, partition: str) -> None:
        """Forget what this consumer held of ``partition``: it was presumed dead
        there and its entries went to other consumers. (A handler running
        now finishes; its acknowledgement is refused.)"""
        for (where, _), doc in self._docs.items():
            if where == partition:
                self.held -= len(doc.waiting)
                self._ids -= {(where, d.id) for d in doc.waiting}
                doc.waiting.clear()
        self.freed.set()

    async def settled(self) -> None:
        """Return once every acknowledgement queued has been sent."""
        for acks in list(self._acks.values()):
            await acks.idle()

    def runners(self) -> list[asyncio.Task[None]]:
        return [doc.runner for doc in self._docs.values() if doc.runner is not None]

    async def _run(self, key: tuple[str, Any], doc: _Document) -> None:
        """Run the document's messages one after the other; stop before the
        next one once stopping (it stays pending, for another consumer)."""
        try:
            while doc.waiting and not self.stopping.is_set():
                delivery = doc.waiting[0]
                try:
                    await self._handle(delivery)
                except StopConsuming as exc:
                    log.warning(
                        "the handler stops the consumer at %s seq %d, which stays pending: %s",
                        delivery.partition,
                        delivery.seq,
                        exc,
                    )
                    self.stopping.set()
                    self._stop()
                    return
                except GroupGone:  # its acknowledgement is moot: the reader reports it, creates it again
                    log.warning(
                        "%s seq %d: the group vanished with its stream", delivery.partition, delivery.seq
                    )
                if doc.waiting and doc.waiting[0] is delivery:
                    doc.waiting.pop(0)
                    self._ids.discard((delivery.partition, delivery.id))
                    self.held -= 1
                    self.freed.set()
        finally:
            doc.runner = None
            if not doc.waiting and self._docs.get(key) is doc:
                del self._docs[key]

    async def _handle(self, delivery: Delivery) -> None:
        """Run the handler until it succeeds (then acknowledge) or the message
        has been delivered ``max_deliveries`` times (then dead-letter it)."""
        group, policy = self._groups[delivery.partition], self.policy
        if not delivery.message:
            await self._dead_letter(group, delivery, "not a change message: its text is not a JSON object")
            return
        while True:
            n = delivery.deliveries
            if n > policy.max_deliveries:
                reason = (
                    f"delivered {n} times without an acknowledgement (its consumer stopped or died each time)"
                )
                await self._dead_letter(group, delivery, reason)
                return
            try:
                await self.handler(delivery)
            except StopConsuming:
                raise
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
                if n >= policy.max_deliveries:
                    await self._dead_letter(group, delivery, reason)
                    return
                log.warning(
                    "handler failed on %s seq %d (delivery %d): %s",
                    delivery.partition,
                    delivery.seq,
                    n,
                    reason,
                )
                if await self._stopped_within(backoff(n, policy.retry_first, policy.retry_cap)):
                    return  # left pending: another consumer runs it
                again = await persist(partial(group.retry, policy.consumer, delivery.id), "retry")
                if again < 0:
                    self._taken_over(delivery)
                    return
                delivery = replace(delivery, deliveries=again)
                continue
            if await self._ack(group, delivery):
                self.handled += 1
            return

    async def _dead_letter(self, group: GroupPartition, delivery: Delivery, reason: str) -> None:
        """The message, why, how often and by whom to the application's dead
        letter stream, then acknowledged. (Two calls: the dead letter may be in
        another slot. A crash between them dead-letters it again.)"""
        policy = self.policy
        fields: dict[Any, Any] = {
            "message": delivery.text,
            "reason": reason,
            "deliveries": delivery.deliveries,
            "consumer": policy.consumer,
            "group": policy.group,
            "partition": delivery.partition,
            "stream": group.stream,
            "id": delivery.id,
            "seq": delivery.seq,
            "ts": datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        }
        await persist(
            lambda: redis_calls.call(
                self.client.xadd(
                    policy.dead_letter, fields, maxlen=policy.dead_letter_max_len, approximate=True
                )
            ),
            "dead letter",
        )
        log.error(
            "dead-lettered %s seq %d after %d deliveries: %s",
            delivery.partition,
            delivery.seq,
            delivery.deliveries,
            reason,
        )
        self.dead_lettered += 1
        await self._ack(group, delivery)

    async def _stopped_within(self, seconds: float) -> bool:
        """Wait ``seconds``; True at once if the consumer stops meanwhile."""
        try:
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _ack(self, group: GroupPartition, delivery: Delivery) -> bool:
        """Acknowledge; False when another consumer holds the entry now, or
        has acknowledged it already (this one was presumed dead meanwhile)."""
        acks = self._acks.get(group.partition)
        if acks is None:
            acks = self._acks[group.partition] = Acks(group, self.policy.consumer)
        done = await acks.ack(delivery.id)
        if done != 1:
            self._taken_over(delivery)
        return done == 1

    def _taken_over(self, delivery: Delivery) -> None:
        log.warning(
            "%s seq %d went to another consumer (this one was presumed dead: no heartbeat within "
            "the claim timeout); it runs, or ran, there again",
            delivery.partition,
            delivery.seq,
        )
