"""How fast a consumer group handles a prepared stream (docs/CONSUMERS.md).

    python -m bench.consumer_bench [--messages 20000] [--docs 1000] [--consumers 1 3]

A redis-server of its own; one partition's stream holds ``messages`` changes
of ``docs`` documents (written by ``DataManager.apply``, round-robin over the
documents). Then ``n`` consumers in this process, with a handler that does
nothing, handle the stream to its end: messages/s (wall), and Redis's CPU µs
a message (``INFO cpu``, the server's user + system time over the run). Each
run is a new group over the same stream. Not part of ``python -m bench``
(the suite's results table); a figure to size consumers by.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import orjson

from cdc.devservers import RedisServer
from publishers.consumer import Consumer, ConsumerSettings, Delivery
from publishers.manager import DataManager
from publishers.model import Change
from publishers.settings import RedisConfig

PARTITION, SECTION = "p1", "rows"


async def _publish(manager: DataManager, messages: int, docs: int) -> None:
    batch: list[Change] = []
    for i in range(messages):
        values = {"n": orjson.dumps(i), "name": b'"a name of some length"'}
        batch.append(Change("bench.rows", PARTITION, SECTION, f"k{i % docs}", "U", i + 1, values))
        if len(batch) == 1000:
            await manager.apply(batch)
            batch = []
    if batch:
        await manager.apply(batch)


async def _redis_cpu(manager: DataManager) -> float:
    info = await manager.client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _run(manager: DataManager, config: RedisConfig, group: str, consumers: int, messages: int) -> str:
    handled = 0
    done = asyncio.Event()

    async def handler(delivery: Delivery) -> None:
        nonlocal handled
        handled += 1
        if handled == messages:
            done.set()

    settings = [
        ConsumerSettings(group=group, dead_letter="bench:dead", partitions=[PARTITION], consumer=f"c{i}")
        for i in range(consumers)
    ]
    cpu = await _redis_cpu(manager)
    start = time.perf_counter()
    running = [Consumer(manager.client, s, handler, namespace=config.namespace) for s in settings]
    tasks = [asyncio.create_task(c.run()) for c in running]
    await asyncio.wait_for(done.wait(), 600)
    wall = time.perf_counter() - start
    redis_us = (await _redis_cpu(manager) - cpu) / messages * 1e6
    for c in running:
        c.stop()
    await asyncio.gather(*tasks)
    return (
        f"{consumers} consumer(s): {messages / wall:,.0f} messages/s, Redis CPU {redis_us:.1f} us a message"
    )


async def main(messages: int, docs: int, counts: list[int]) -> None:
    server = RedisServer().start()
    try:
        config = RedisConfig(url=server.url, namespace="consumerbench", stream_max_len=messages * 2)
        manager = await DataManager.connect(config)
        try:
            await _publish(manager, messages, docs)
            for n in counts:
                print(await _run(manager, config, f"g{n}", n, messages))
        finally:
            await manager.close()
    finally:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 3])
    args = parser.parse_args()
    asyncio.run(main(args.messages, args.docs, args.consumers))
