"""One consumer process for test_consumers_processes.py.

    python consumer_process.py URL CLUSTER(0|1) NAMESPACE NAME LOG POISON

Consumes section ``alpha`` in group ``g``; the handler appends a line to LOG
(opened O_APPEND, one write a line, so the lines of all processes are in the
order they happened) when it is ready (SIGTERM stops it gracefully from
then on), and when a handler starts, ends (done) or fails (the document
POISON). SIGTERM stops it gracefully.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys

import orjson

from publishers.consumer import Consumer, ConsumerSettings, Delivery
from publishers.settings import RedisConfig


async def main(url: str, cluster: bool, namespace: str, name: str, log_path: str, poison: str) -> None:
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def note(event: str, delivery: Delivery) -> None:
        line = [event, name, delivery.partition, delivery.message["key"], delivery.seq, delivery.deliveries]
        os.write(log, orjson.dumps(line) + b"\n")

    async def handler(delivery: Delivery) -> None:
        note("start", delivery)
        await asyncio.sleep(random.uniform(0.001, 0.008))
        if delivery.message["key"] == poison:
            note("fail", delivery)
            raise ValueError(f"poison {delivery.message['key']}")
        note("done", delivery)

    settings = ConsumerSettings(
        group="g",
        dead_letter=f"{namespace}:dead",
        sections=["alpha"],
        consumer=name,
        max_in_flight=8,
        max_deliveries=3,
        claim_after=1.0,
        retry_first=0.02,
        retry_cap=0.1,
        block=0.2,
        discover_every=0.5,
        shutdown_timeout=5.0,
    )
    config = RedisConfig(url=url, cluster=cluster, namespace=namespace)
    consumer = Consumer(config, settings, handler)
    running = asyncio.create_task(consumer.run(handle_signals=True))
    while consumer.work is None:  # its SIGTERM handler is set before its work
        if running.done():
            break  # it failed: awaited below
        await asyncio.sleep(0.01)
    os.write(log, orjson.dumps(["ready", name, "", "", 0, 0]) + b"\n")
    await running


if __name__ == "__main__":
    url, cluster, namespace, name, log_path, poison = sys.argv[1:]
    asyncio.run(main(url, cluster == "1", namespace, name, log_path, poison))
