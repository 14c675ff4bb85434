"""``cdc consume``: one consumer of a consumer group that prints each message
it handles (docs/CONSUMERS.md). Start it in several terminals with the same
``--group``: each message is printed by one of them, a document's messages
in seq order. SIGTERM or Ctrl-C stops it gracefully.

It is the example of ``publishers.consumer`` more than a tool: an
application puts its own handler where ``_Printer.print_delivery`` is.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cdc.config import Config
from cdc.consume_args import check_consumption
from cdc.errors import ConfigError
from cdc.pipes import stdout_to_devnull
from publishers.consumer import Consumer, ConsumerSettings, Delivery, Lost, StopConsuming
from publishers.errors import CdcError
from publishers.manager import DataManager


def dead_letter_name(namespace: str, group: str) -> str:
    """The default dead letter stream of a group (an application names its own)."""
    return f"{namespace}:@consumers:{group}:deadletter"


async def consume(
    config: Config,
    group: str,
    sections: Sequence[str],
    partitions: Sequence[str],
    *,
    consumer: str = "",
    dead_letter: str | None = None,
    max_in_flight: int = 64,
    max_deliveries: int = 5,
    claim_after: float = 30.0,
    start: str = "all",
) -> int:
    """Consume until SIGTERM/SIGINT; exit code 0, or the error's."""
    namespace = config.redis.namespace
    try:
        settings = ConsumerSettings(
            group=group,
            dead_letter=dead_letter or dead_letter_name(namespace, group),
            sections=tuple(sections),
            partitions=tuple(partitions) or None,
            consumer=consumer,
            max_in_flight=max_in_flight,
            max_deliveries=max_deliveries,
            claim_after=claim_after,
            start=start,
        ).checked()
    except CdcError as exc:
        raise ConfigError(str(exc)) from None
    manager = await DataManager.connect(config.redis)
    try:
        await check_consumption(config, manager, sections, partitions)
    finally:
        await manager.close()
    printer = _Printer()
    runner = Consumer(config.redis, settings, printer.print_delivery, on_lost=_lost)
    await runner.run(handle_signals=True)
    if printer.closed:
        stdout_to_devnull()
    return 0


class _Printer:
    """The handler. Once stdout is closed (``cdc consume | head``) it stops
    the consumer: the messages it could not print stay pending, for the
    group's other consumers, rather than being dead-lettered as failures."""

    def __init__(self) -> None:
        self.closed = False

    async def print_delivery(self, delivery: Delivery) -> None:
        """The message as the stream holds it, one JSON line (an ``R``
        message too: a bulk snapshot rewrote the section's documents)."""
        if self.closed:  # a handler of another document, after the pipe closed
            raise StopConsuming("stdout is closed")
        try:
            out = getattr(sys.stdout, "buffer", None)
            if out is None:
                print(delivery.text.decode("utf-8", "surrogateescape"), flush=True)
                return
            out.write(delivery.text + b"\n")
            out.flush()
        except BrokenPipeError:
            self.closed = True
            raise StopConsuming("stdout is closed (the reader of the pipe exited)") from None


def _lost(lost: Lost) -> None:
    """The consumer has logged the report (stderr: stdout stays JSON lines);
    taking it here is what keeps the consumer going."""
