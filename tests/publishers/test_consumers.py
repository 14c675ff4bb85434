"""The consumer-group client against real Redis (one server and a cluster),
in one process: messages shared by consumers, each handled once and
acknowledged, documents in seq order, retries and the dead letter, a
consumer presumed dead, trimming reported, a graceful stop. The test with
processes and a SIGKILL is test_consumers_processes.py."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from cdc.config import RedisConfig
from publishers.consumer import (
    BlockingConsumer,
    Consumer,
    ConsumerSettings,
    Delivery,
    Lost,
    MessagesLost,
    StopConsuming,
)
from publishers.errors import CdcError
from publishers.manager import DataManager
from publishers.model import Change

P = "app{1}"  # a partition value that needs encoding inside keys
GROUP = "indexer"


def change(section: str, key: str, version: int) -> Change:
    values = {"n": orjson.dumps(version)}
    return Change(f"dbo.{section}", P, section, key, "U", version, values)  # type: ignore[arg-type]


async def publish(
    manager: DataManager, docs: int, rounds: int, first: int = 1, section: str = "alpha"
) -> None:
    """``rounds`` changes of each of ``docs`` documents, interleaved."""
    for r in range(rounds):
        await manager.apply([change(section, f"d{d}", first + r * docs + d) for d in range(docs)])


@pytest.fixture
async def manager(redis_config: RedisConfig) -> AsyncIterator[DataManager]:
    manager = await DataManager.connect(redis_config)
    yield manager
    await manager.close()


def settings(**overrides: Any) -> ConsumerSettings:
    base: dict[str, Any] = {
        "group": GROUP,
        "dead_letter": "app:consumer-dead",
        "sections": ["alpha"],
        "claim_after": 1.0,
        "retry_first": 0.01,
        "retry_cap": 0.05,
        "block": 0.2,
        "discover_every": 0.2,  # consumers start before the partition exists
        "max_deliveries": 3,
        "max_in_flight": 8,
    }
    return ConsumerSettings(**{**base, **overrides})


class Record:
    """What handlers saw: (document, seq, deliveries, consumer) in the order they ran."""

    def __init__(self, poison: str = "") -> None:
        self.runs: list[tuple[str, int, int, str]] = []
        self.done: list[tuple[str, int]] = []
        self.poison = poison
        self.running: set[str] = set()
        self.overlaps = 0

    async def handler(self, delivery: Delivery) -> None:
        key = delivery.message["key"]
        self.runs.append((key, delivery.seq, delivery.deliveries, delivery.consumer))
        if key in self.running:
            self.overlaps += 1
        self.running.add(key)
        try:
            await asyncio.sleep(random.uniform(0, 0.003))
            if key == self.poison:
                raise ValueError(f"cannot index {key}")
        finally:
            self.running.discard(key)
        self.done.append((key, delivery.seq))


async def letters_of(manager: DataManager) -> list[dict[bytes, bytes]]:
    """This test's entries of the dead letter stream (which all tests share)."""
    stream = manager.layout.stream(P).encode()
    return [f for _, f in await manager.client.xrange("app:consumer-dead") if f[b"stream"] == stream]


async def seq_of(manager: DataManager) -> int:
    return int(await manager.client.get(manager.layout.seq(P)) or 0)


async def until(condition: Callable[[], Awaitable[bool]], timeout: float = 20) -> None:
    """Wait for ``condition`` (polling Redis: no event to wait on), failing after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def pending(manager: DataManager) -> int:
    info = await manager.client.xpending(manager.layout.stream(P), GROUP)
    return int(info["pending"])


def in_order(record: Record) -> None:
    by_doc: dict[str, list[int]] = {}
    for key, seq in record.done:
        by_doc.setdefault(key, []).append(seq)
    for key, seqs in by_doc.items():
        assert seqs == sorted(seqs), f"{key} handled out of order: {seqs}"


async def test_two_consumers_share_the_work_once_each_in_document_order(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    record = Record(poison="d3")
    consumers = [
        Consumer(
            manager.client,
            settings(consumer=f"c{i}", max_in_flight=2),
            record.handler,
            namespace=redis_config.namespace,
        )
        for i in range(2)
    ]
    runs = [asyncio.create_task(c.run()) for c in consumers]
    await publish(manager, docs=6, rounds=10)
    total = await seq_of(manager)

    async def finished() -> bool:
        handled = len(record.done) + len(await letters_of(manager))
        return handled >= total and await pending(manager) == 0

    await until(finished)
    for c in consumers:
        c.stop()
    await asyncio.gather(*runs)
    assert sorted(seq for _, seq in record.done) == [s for s in range(1, total + 1) if (s - 1) % 6 != 3]
    in_order(record)
    assert record.overlaps == 0
    letters = await letters_of(manager)
    assert len(letters) == 10
    for fields in letters:
        assert fields[b"reason"] == b"ValueError: cannot index d3"
        assert fields[b"deliveries"] == b"3" and fields[b"group"] == GROUP.encode()
        assert orjson.loads(fields[b"message"])["key"] == "d3"
    assert [d for k, _, d, _ in record.runs if k == "d3"] == [1, 2, 3] * 10


async def test_a_dead_consumers_messages_are_claimed_in_order(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    """A consumer that stops heart-beating with messages taken: another one
    claims them after ``claim_after`` and runs them, documents in order."""
    record = Record()
    stuck = asyncio.Event()

    async def hangs(delivery: Delivery) -> None:
        await stuck.wait()

    doomed = Consumer(manager.client, settings(consumer="doomed"), hangs, namespace=redis_config.namespace)
    task = asyncio.create_task(doomed.run())
    await publish(manager, docs=3, rounds=4)
    await until(lambda: _true(doomed.work is not None and doomed.work.held == 8))
    for frozen in doomed._heart + doomed._readers:  # frozen: no heartbeat, no reading, no leaving
        frozen.cancel()
    heir = Consumer(
        manager.client, settings(consumer="heir"), record.handler, namespace=redis_config.namespace
    )
    run = asyncio.create_task(heir.run())
    total = await seq_of(manager)
    await until(lambda: _true(len(record.done) >= total))
    await until(lambda: _equal(pending(manager), 0))
    heir.stop()
    await run
    assert sorted(seq for _, seq in record.done) == list(range(1, total + 1))
    in_order(record)
    claimed = [d for _, seq, d, _ in record.runs if seq <= 8]
    assert claimed == [2] * 8  # delivered to the dead one, then to the heir
    stuck.set()  # the frozen one wakes up: its acknowledgements are refused (the heir holds them)
    doomed.stop()
    await task
    assert doomed.work is not None and doomed.work.handled == 0
    assert await pending(manager) == 0


async def test_a_stream_trimmed_past_the_group_is_reported(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    """Entries trimmed before the group read them are reported (``on_lost``),
    exactly; without ``on_lost`` the consumer stops with ``MessagesLost``."""
    record = Record()
    await publish(manager, docs=2, rounds=1)  # seqs 1-2, before the group: not its to lose

    async def run_once(group: str, on_lost: Callable[[Lost], None] | None) -> Consumer:
        consumer = Consumer(
            manager.client,
            settings(group=group, start="new"),
            record.handler,
            namespace=redis_config.namespace,
            on_lost=on_lost,
        )
        run = asyncio.create_task(consumer.run())
        await until(lambda: _true(len(consumer._registered) == 1))
        consumer.stop()
        await run
        return consumer

    for group in ("reported", "silent"):
        await run_once(group, None)  # the group starts after seq 2
    await publish(manager, docs=2, rounds=5, first=10)  # seqs 3-12
    await manager.client.xtrim(manager.layout.stream(P), maxlen=2, approximate=False)

    lost: list[Lost] = []
    consumer = Consumer(
        manager.client,
        settings(group="reported"),
        record.handler,
        namespace=redis_config.namespace,
        on_lost=lost.append,
    )
    run = asyncio.create_task(consumer.run())
    await until(lambda: _true(len(record.done) == 2))
    consumer.stop()
    await run
    assert lost == [Lost(P, "3-10", "trimmed from the stream before the group handled it")]
    assert sorted(seq for _, seq in record.done) == [11, 12]

    silent = Consumer(
        manager.client, settings(group="silent"), record.handler, namespace=redis_config.namespace
    )
    with pytest.raises(MessagesLost, match="3-10"):
        async with asyncio.timeout(10):
            await silent.run()


async def test_stop_finishes_running_handlers_and_leaves_the_rest_to_others(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    finished: list[int] = []

    async def slow(delivery: Delivery) -> None:
        started.set()
        await release.wait()
        finished.append(delivery.seq)

    first = Consumer(
        manager.client, settings(consumer="first", max_in_flight=4), slow, namespace=redis_config.namespace
    )
    run = asyncio.create_task(first.run())
    await publish(manager, docs=1, rounds=6)
    await started.wait()
    first.stop()
    await asyncio.sleep(0.1)
    assert not run.done()  # waits for the running handler
    release.set()
    await run
    assert finished == [1]  # the running one finished and was acknowledged; the others stay pending
    assert await pending(manager) == 3
    record = Record()
    second = Consumer(
        manager.client, settings(consumer="second"), record.handler, namespace=redis_config.namespace
    )
    run = asyncio.create_task(second.run())
    await until(lambda: _true(len(record.done) == 5), timeout=5)  # claimed at once: the first one left
    second.stop()
    await run
    assert [seq for _, seq in record.done] == [2, 3, 4, 5, 6]


async def _true(value: bool) -> bool:
    return value


async def _equal(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def test_the_example_in_consumers_md_runs_as_written(redis_url: str, namespace: str) -> None:
    """The documented example, with this test's Redis and namespace and its
    index functions recording: it handles inserts, updates and deletes, and
    stops gracefully on SIGTERM."""
    text = Path(__file__).parents[2].joinpath("docs", "CONSUMERS.md").read_text(encoding="utf-8")
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    example = example.replace("redis://127.0.0.1:6379/0", redis_url).replace('"cdc"', f'"{namespace}"')
    assert "asyncio.run(main())" in example
    assert example.count(f'"{namespace}"') == 1  # said once: the consumer takes the RedisConfig's
    scope: dict[str, Any] = {}
    exec(compile(example.replace("asyncio.run(main())", ""), "CONSUMERS.md", "exec"), scope)
    seen: list[tuple[str, str]] = []

    async def index(section: str, key: str, patch: list[Any], version: int) -> None:
        seen.append(("index", key))

    async def delete_from_index(section: str, key: str, version: int) -> None:
        seen.append(("delete", key))

    scope.update(index=index, delete_from_index=delete_from_index)
    manager = await DataManager.connect(RedisConfig(url=redis_url, namespace=namespace))
    try:
        await manager.apply([change("forecasts", "a", 1), change("forecasts", "a", 2)])
        await manager.apply([Change("dbo.forecasts", P, "forecasts", "a", "D", 3, None)])
        run = asyncio.create_task(scope["main"]())
        await until(lambda: _true(len(seen) == 3))
        os.kill(os.getpid(), signal.SIGTERM)  # the example's consumer handles it: a graceful stop
        await asyncio.wait_for(run, 10)
    finally:
        await manager.close()
    assert seen == [("index", "a"), ("index", "a"), ("delete", "a")]


async def test_a_consumer_restarted_under_its_name_runs_its_pending_messages_first(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    """A process that died and came back (same ``consumer`` name, e.g. a pod's)
    before ``claim_after``: nobody claims its messages, so it takes them again
    itself, and its documents stay in order."""
    stuck = asyncio.Event()

    async def hangs(delivery: Delivery) -> None:
        await stuck.wait()

    first = Consumer(
        manager.client, settings(consumer="pod-0", claim_after=60), hangs, namespace=redis_config.namespace
    )
    task = asyncio.create_task(first.run())
    await publish(manager, docs=3, rounds=4)
    await until(lambda: _true(first.work is not None and first.work.held == 8))
    for frozen in first._heart + first._readers:  # the process is gone
        frozen.cancel()
    record = Record()
    again = Consumer(
        manager.client,
        settings(consumer="pod-0", claim_after=60),
        record.handler,
        namespace=redis_config.namespace,
    )
    run = asyncio.create_task(again.run())
    await until(lambda: _true(len(record.done) == 12), timeout=10)  # well before claim_after
    await until(lambda: _equal(pending(manager), 0))
    again.stop()
    await run
    in_order(record)
    assert sorted(seq for _, seq in record.done) == list(range(1, 13))
    assert [d for _, seq, d, _ in record.runs if seq <= 8] == [2] * 8
    stuck.set()
    first.stop()
    await task


async def test_a_group_that_vanished_is_reported_and_created_again(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    """The stream deleted (as when Redis restarts empty): the group goes with
    it. The consumer reports it and goes on in a new group."""
    record, lost = Record(), []
    consumer = Consumer(
        manager.client, settings(), record.handler, namespace=redis_config.namespace, on_lost=lost.append
    )
    run = asyncio.create_task(consumer.run())
    await publish(manager, docs=2, rounds=2)
    await until(lambda: _true(len(record.done) == 4))
    await manager.client.delete(manager.layout.stream(P))
    await publish(manager, docs=2, rounds=2, first=10)
    await until(lambda: _true(len(record.done) == 8))
    consumer.stop()
    await run
    assert [(item.partition, item.what) for item in lost] == [(P, "all")]
    assert "missing" in lost[0].reason
    assert sorted(seq for _, seq in record.done[4:]) == [5, 6, 7, 8]
    assert await pending(manager) == 0


async def test_a_stream_missing_for_a_while_is_reported_once_and_waited_for(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    """The stream deleted and not written again at once (Redis restarted
    empty: the sidecar re-snapshots first): the consumer reports it once,
    writes nothing into the missing partition, and creates the group again
    when the stream is back."""
    record, lost = Record(), []
    consumer = Consumer(
        manager.client, settings(), record.handler, namespace=redis_config.namespace, on_lost=lost.append
    )
    run = asyncio.create_task(consumer.run())
    await publish(manager, docs=2, rounds=2)
    await until(lambda: _true(len(record.done) == 4))
    prefix = manager.layout.prefix(P)
    await manager.client.delete(manager.layout.stream(P), f"{prefix}@group:{GROUP}:alive")
    await until(lambda: _true(len(lost) == 1))
    await asyncio.sleep(1.0)  # 5 `block`s, 3 heartbeats without the stream: no crash, report, key
    assert not run.done()
    assert [(item.partition, item.what) for item in lost] == [(P, "all")]
    assert not await manager.client.exists(manager.layout.stream(P), f"{prefix}@group:{GROUP}:alive")
    await publish(manager, docs=2, rounds=2, first=10)
    await until(lambda: _true(len(record.done) == 8))
    consumer.stop()
    await run
    assert len(lost) == 1
    assert sorted(seq for _, seq in record.done[4:]) == [5, 6, 7, 8]
    assert await pending(manager) == 0


async def test_a_handler_raising_stop_consuming_stops_it_and_leaves_the_message_pending(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    """``StopConsuming`` is no failure of the message: ``run()`` returns, the
    message stays pending with its one delivery, nothing is dead-lettered."""
    done: list[int] = []

    async def handler(delivery: Delivery) -> None:
        if delivery.seq == 3:
            raise StopConsuming("the output is gone")
        done.append(delivery.seq)

    consumer = Consumer(manager.client, settings(max_in_flight=1), handler, namespace=redis_config.namespace)
    run = asyncio.create_task(consumer.run())
    await publish(manager, docs=1, rounds=5)
    await asyncio.wait_for(run, 20)  # it stops by itself
    stream = manager.layout.stream(P)
    left = await manager.client.xpending_range(stream, GROUP, "-", "+", 10)
    assert done == [1, 2]
    assert [(p["message_id"], p["times_delivered"]) for p in left] == [(b"3-0", 1)]
    assert await letters_of(manager) == []


async def test_a_consumer_of_a_client_needs_the_namespace(manager: DataManager) -> None:
    with pytest.raises(CdcError, match="namespace="):
        Consumer(manager.client, settings(), Record().handler)


def test_a_blocking_consumer_runs_a_plain_function_in_a_thread(redis_url: str, namespace: str) -> None:
    """``BlockingConsumer``: no asyncio in the caller, a handler that blocks
    (``time.sleep``, in a worker thread), ``stop()`` from another thread."""
    config = RedisConfig(url=redis_url, namespace=namespace)

    async def write() -> None:
        manager = await DataManager.connect(config)
        try:
            await publish(manager, docs=4, rounds=3)
        finally:
            await manager.close()

    asyncio.run(write())
    handled: list[tuple[str, int]] = []

    def handler(delivery: Delivery) -> None:
        time.sleep(0.05)  # blocks its worker thread, not the loop
        handled.append((delivery.message["key"], delivery.seq))

    consumer = BlockingConsumer(config, settings(), handler)
    thread = threading.Thread(target=consumer.run, kwargs={"handle_signals": False})
    thread.start()
    deadline = time.monotonic() + 20
    while len(handled) < 12:
        assert time.monotonic() < deadline, handled
        time.sleep(0.02)
    consumer.stop()
    thread.join(10)
    assert not thread.is_alive()
    record = Record()
    record.done = handled
    in_order(record)
    assert sorted(seq for _, seq in handled) == list(range(1, 13))


async def test_other_sections_are_skipped_and_reload_messages_delivered_as_they_are(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    """A group of section alpha reading a partition that also holds beta:
    beta's messages are acknowledged without the handler; alpha's ``R``
    message (a bulk snapshot) reaches the handler as it is."""
    record = Record()
    await publish(manager, docs=2, rounds=1)  # alpha seqs 1-2
    await publish(manager, docs=2, rounds=1, first=10, section="beta")  # 3-4
    await manager.bulk_writer().mark("dbo.alpha", "alpha", P, version=50, fence=0)  # 5
    await publish(manager, docs=2, rounds=1, first=60)  # 6-7
    consumer = Consumer(
        manager.client,
        settings(sections=["alpha"], partitions=[P]),
        record.handler,
        namespace=redis_config.namespace,
    )
    run = asyncio.create_task(consumer.run())
    await until(lambda: _true(len(record.done) == 5))
    await until(lambda: _equal(pending(manager), 0))
    consumer.stop()
    await run
    assert sorted(record.done) == [("@reload", 5), ("d0", 1), ("d0", 6), ("d1", 2), ("d1", 7)]


async def test_a_dead_consumers_messages_trimmed_away_are_reported(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    """The stream was trimmed past messages a dead consumer held: claiming
    them finds them gone (XCLAIM drops deleted entries), and says so by id."""
    stuck = asyncio.Event()

    async def hangs(delivery: Delivery) -> None:
        await stuck.wait()

    doomed = Consumer(manager.client, settings(consumer="doomed"), hangs, namespace=redis_config.namespace)
    task = asyncio.create_task(doomed.run())
    await publish(manager, docs=2, rounds=2)
    await until(lambda: _true(doomed.work is not None and doomed.work.held == 4))
    for frozen in doomed._heart + doomed._readers:
        frozen.cancel()
    await manager.client.xtrim(manager.layout.stream(P), maxlen=0, approximate=False)
    lost: list[Lost] = []
    record = Record()
    heir = Consumer(
        manager.client,
        settings(consumer="heir"),
        record.handler,
        namespace=redis_config.namespace,
        on_lost=lost.append,
    )
    run = asyncio.create_task(heir.run())
    await until(lambda: _true(len(lost) == 4))
    heir.stop()
    await run
    assert sorted(item.what for item in lost) == ["1-0", "2-0", "3-0", "4-0"]
    assert record.done == [] and await pending(manager) == 0
    prefix = f"{manager.layout.prefix(P)}@group:{GROUP}:"
    assert [await manager.client.hlen(prefix + name) for name in ("holders", "docs")] == [0, 0]
    stuck.set()
    doomed.stop()
    await task


async def test_an_entry_that_is_no_change_message_goes_to_the_dead_letter(
    manager: DataManager, redis_config: RedisConfig
) -> None:
    """Something else wrote to the stream: that entry is dead-lettered at once
    (no handler call), and the messages around it are handled."""
    record = Record()
    await publish(manager, docs=1, rounds=1)
    stream, seq_key = manager.layout.stream(P), manager.layout.seq(P)
    await manager.client.xadd(stream, {"m": b"[1, 2]"}, id="2-0")
    await manager.client.set(seq_key, 2)
    await publish(manager, docs=1, rounds=1, first=5)
    consumer = Consumer(manager.client, settings(), record.handler, namespace=redis_config.namespace)
    run = asyncio.create_task(consumer.run())
    await until(lambda: _true(len(record.done) == 2))
    await until(lambda: _equal(pending(manager), 0))
    consumer.stop()
    await run
    assert record.done == [("d0", 1), ("d0", 3)]
    letters = await letters_of(manager)
    assert [(f[b"seq"], f[b"reason"]) for f in letters] == [
        (b"2", b"not a change message: its text is not a JSON object")
    ]
