"""Benchmark 3: latency from commit to a subscriber's receipt.

A writer inserts rows into one tracked table at a fixed offered load (100,
1,000 and 10,000 changes/s): every 10 ms one transaction of ``rate / 100``
rows, each row stamped with ``clock_timestamp()`` (the database's wall clock
while the statement runs, just before COMMIT) in its ``stamp`` column. The
sidecar (``cdc run``, a subprocess, default settings) publishes each insert;
a subscriber in its own process (a raw SUBSCRIBE on the section's channel,
parsed with hiredis) takes the receipt time with ``time.time()`` the moment
the bytes arrive, and reads the stamp out of the message's patch. Both
clocks are this machine's CLOCK_REALTIME.

Measured twice per load: with the source's wake-up notification (the
default: tracking triggers NOTIFY, the sidecar LISTENs and polls at once) and
without it (``source.notify: false``: the trackers rely on their adaptive
backoff alone). The first ``warmup`` seconds of each run are not counted.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import urlsplit

import hiredis
import orjson
import psycopg

from bench.context import Context
from bench.env import NAMESPACE, cdc, sidecar, write_config
from bench.workload import COLUMNS_DDL, ROW_VALUES, SCHEMA, table_entry
from publishers.layout import Layout

TABLE = "lat"
RATES = (100, 1_000, 10_000)
TICK = 0.01  # seconds between the writer's transactions


def _subscribe(url: str, channel: str, pipe: Connection) -> None:
    """The subscriber process: (stamp, receipt) pairs until told to stop."""

    async def main() -> list[tuple[float, float]]:
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        name = channel.encode()
        writer.write(b"*2\r\n$9\r\nSUBSCRIBE\r\n$%d\r\n%s\r\n" % (len(name), name))
        await writer.drain()
        parser = hiredis.Reader()
        pairs: list[tuple[float, float]] = []
        pipe.send("ready")
        loop = asyncio.get_running_loop()
        stop = loop.create_future()

        def stopping() -> None:
            if not stop.done():
                stop.set_result(None)

        loop.add_reader(pipe.fileno(), stopping)
        while not stop.done():
            read = asyncio.ensure_future(reader.read(1 << 16))
            await asyncio.wait([read, stop], return_when=asyncio.FIRST_COMPLETED)
            if not read.done():
                read.cancel()
                break
            data = read.result()
            received = time.time()
            parser.feed(data)
            while (reply := parser.gets()) is not False:
                if isinstance(reply, list) and reply[0] == b"message":
                    message = orjson.loads(reply[2])
                    if message["op"] == "I":
                        pairs.append((float(message["patch"][0]["value"]["stamp"]), received))
        writer.close()
        return pairs

    pipe.send(asyncio.run(main()))


async def _write(dsn: str, rate: int, seconds: float, first_id: int) -> tuple[int, float]:
    """Insert ``rate`` rows/s for ``seconds``; the rows written and the achieved rate."""
    per_tick = max(1, round(rate * TICK))
    insert = (
        f"insert into {SCHEMA}.{TABLE} select {ROW_VALUES.replace('%', '%%')}, extract(epoch from clock_timestamp())"
        " from generate_series(%s::int, %s::int) as g"
    )
    written = 0
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        started = time.monotonic()
        tick = 0
        while (now := time.monotonic()) - started < seconds:
            due = started + tick * TICK
            if due > now:
                await asyncio.sleep(due - now)
            first = first_id + written
            await conn.execute(insert.encode(), [first, first + per_tick - 1])
            written += per_tick
            tick += 1
        elapsed = time.monotonic() - started
    return written, written / elapsed


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def measure(ctx: Context, rate: int, notify: bool, first_id: int) -> dict[str, Any]:
    env, sizes = ctx.env, ctx.sizes
    env.sql(f"truncate {SCHEMA}.{TABLE}")  # the sidecar's initial snapshot finds nothing to load
    env.flush_redis()
    path = write_config(env, f"latency-{rate}-{notify}", [table_entry(TABLE)], source={"notify": notify})
    channel = Layout(NAMESPACE).channel(TABLE, TABLE)
    mp = multiprocessing.get_context("spawn")
    ours, theirs = mp.Pipe()
    subscriber = mp.Process(target=_subscribe, args=(env.redis_url, channel, theirs), daemon=True)
    with sidecar(path, once=False, name=f"latency-{rate}-{'notify' if notify else 'poll'}") as process:
        wait_streaming(ctx)
        subscriber.start()
        if not ours.poll(30):
            raise RuntimeError("the subscriber did not start")
        ours.recv()
        started = time.time()
        written, achieved = asyncio.run(_write(env.dsn, rate, sizes.latency_seconds, first_id))
        ended = time.time()
        wait_published(ctx, written)  # every change, late ones too: none is left out of the figures
        time.sleep(0.5)
        ours.send("stop")
        pairs: list[tuple[float, float]] = ours.recv()
        subscriber.join(10)
        process.stop()
    counted = [
        (received - stamp) * 1000
        for stamp, received in pairs
        if started + sizes.latency_warmup <= stamp <= ended
    ]
    expected = sum(1 for stamp, _ in pairs if stamp >= started)
    if not counted:
        raise RuntimeError(f"no change reached the subscriber at {rate}/s")
    return {
        "offered_per_second": rate,
        "achieved_per_second": round(achieved),
        "notify": notify,
        "rows_per_transaction": max(1, round(rate * TICK)),
        "written": written,
        "received": expected,
        "counted": len(counted),
        "p50_ms": round(percentile(counted, 50), 1),
        "p95_ms": round(percentile(counted, 95), 1),
        "p99_ms": round(percentile(counted, 99), 1),
        "max_ms": round(max(counted), 1),
    }


def wait_published(ctx: Context, count: int, timeout: float = 300) -> None:
    """Until the partition's @seq says ``count`` messages were published."""
    import redis

    client = redis.Redis.from_url(ctx.env.redis_url)
    key = Layout(NAMESPACE).seq(TABLE)
    try:
        deadline = time.monotonic() + timeout
        while int(client.get(key) or 0) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {client.get(key)!r} of {count} changes were published")
            time.sleep(0.05)
    finally:
        client.close()


def wait_streaming(ctx: Context, timeout: float = 60) -> None:
    """Until the table's checkpoint says streaming (the initial snapshot is done)."""
    import redis

    client = redis.Redis.from_url(ctx.env.redis_url)
    key = Layout(NAMESPACE).checkpoint(f"{SCHEMA}.{TABLE}")
    try:
        deadline = time.monotonic() + timeout
        while client.hget(key, "state") != b"streaming":
            if time.monotonic() > deadline:
                raise TimeoutError("the sidecar did not start streaming")
            time.sleep(0.05)
        time.sleep(0.5)
    finally:
        client.close()


def run_latency(ctx: Context) -> dict[str, Any]:
    env = ctx.env
    env.sql(
        f"create schema if not exists {SCHEMA}",
        f"drop table if exists {SCHEMA}.{TABLE}",
        f"create table {SCHEMA}.{TABLE} ({COLUMNS_DDL}, stamp double precision)",
    )
    path = write_config(env, "latency", [table_entry(TABLE)])
    cdc("tracking", "enable", "-c", str(path))
    runs = []
    next_id = 1
    for notify in (True, False):
        for rate in RATES:
            figure = measure(ctx, rate, notify, next_id)
            next_id += figure["written"]
            print(
                f"  latency at {rate:>6,}/s, {'wake-up' if notify else 'backoff only'}:"
                f" p50 {figure['p50_ms']} ms, p95 {figure['p95_ms']}, p99 {figure['p99_ms']},"
                f" max {figure['max_ms']} (achieved {figure['achieved_per_second']:,}/s)",
                flush=True,
            )
            runs.append(figure)
    cdc("tracking", "disable", "-c", str(path))
    env.sql(f"drop table {SCHEMA}.{TABLE}")
    return {"tick_ms": TICK * 1000, "seconds": ctx.sizes.latency_seconds, "warmup": ctx.sizes.latency_warmup,
            "runs": runs}  # fmt: skip
