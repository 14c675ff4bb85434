"""``cdc demo``: the embedded default, end to end on one machine.

1. starts a local PostgreSQL and redis-server on free loopback ports, their
   files under ``--dir`` (default ``.demo``)
2. creates two demo tables and writes ``<dir>/tables.yaml``, the config that
   registers them (read it, copy it: it is an ordinary config file)
3. enables change tracking (what ``cdc tracking enable`` does)
4. runs the sidecar, a writer that keeps inserting, updating and deleting rows,
   and a live view of the change messages and of a subscriber's replica

Ctrl-C (or ``--duration``) stops everything in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import sys
import time
from collections import deque
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

from cdc.config import Config, load_config
from cdc.daemon import Daemon
from cdc.devservers import PostgresServer, RedisServer, free_port
from cdc.sources import make_source

log = logging.getLogger("cdc.demo")

SCHEMA_SQL = """
create schema if not exists demo;
create table if not exists demo.forecasts (
    region_id  int not null,
    id         int not null,
    price      numeric(12, 2) not null,
    valid_from timestamptz not null,
    valid_to   timestamptz,
    status     text not null,
    primary key (region_id, id)
);
create table if not exists demo.stations (
    id      int primary key,
    name    text not null,
    active  boolean not null,
    load_kw double precision,
    meta    jsonb
);
"""

CONFIG_YAML = """\
# Written by `cdc demo`. An ordinary cdc-sync config file: copy it and adapt it.
source:
  kind: postgres
  dsn: ${{CDC_SOURCE_DSN:-{dsn}}}
  retention: 1d
redis:
  url: ${{CDC_REDIS_URL:-{redis_url}}}
  namespace: demo
worker:
  max_batch_size: 500
  max_wait: 50ms
  health: 127.0.0.1:{health_port}
tables:
  - table: demo.forecasts
    partition: "region-{{region_id}}"
    section: forecasts
    key: "{{id}}"
  - table: demo.stations
    partition: grid
    section: stations
    backoff: [[5, 50ms], [20, 200ms], [null, 1s]]
"""


async def run_demo(directory: str, *, rate: float = 20.0, duration: float | None = None) -> int:
    root = await asyncio.to_thread(_prepare, directory)
    pg = PostgresServer(directory=root / "pg", port=free_port())
    redis = RedisServer(directory=root / "redis", port=free_port())
    _say(f"starting PostgreSQL on 127.0.0.1:{pg.port} and Redis on 127.0.0.1:{redis.port} (files in {root})")
    await asyncio.to_thread(pg.start)
    await asyncio.to_thread(redis.start)
    try:
        return await _demo(root, pg, redis, rate, duration)
    finally:
        await asyncio.to_thread(redis.stop)
        await asyncio.to_thread(pg.stop)


def _prepare(directory: str) -> Path:
    root = Path(directory).resolve()
    for sub in ("pg", "redis"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    return root


async def _demo(
    root: Path, pg: PostgresServer, redis: RedisServer, rate: float, duration: float | None
) -> int:
    config_path = root / "tables.yaml"
    config_path.write_text(
        CONFIG_YAML.format(dsn=pg.dsn, redis_url=redis.url, health_port=free_port()), encoding="utf-8"
    )
    config = load_config(config_path)
    _say(f"config written to {config_path}")
    await _create_tables(pg.dsn)
    source = make_source(config.source)
    await source.connect()
    for line in await source.tracking_enable(config.tables):
        _say(line)
    await source.close()
    daemon = Daemon(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    health = config.worker.health
    _say(f"sidecar health on http://{health[0]}:{health[1]}/metrics" if health else "")
    _say("press Ctrl-C to stop")
    tasks = [
        asyncio.create_task(daemon.run()),
        asyncio.create_task(_writer(pg.dsn, rate, stop)),
        asyncio.create_task(_live_view(config, stop)),
    ]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), duration)
    stop.set()
    daemon.request_stop()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result
    _say("stopped")
    return 0


async def _create_tables(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(SCHEMA_SQL)
        await conn.execute(
            "insert into demo.stations select i, 'station ' || i, true, 10.0 * i, jsonb_build_object('zone', i % 3)"
            " from generate_series(1, 20) i on conflict do nothing"
        )


async def _writer(dsn: str, rate: float, stop: asyncio.Event) -> None:
    """Keeps changing rows: inserts, price updates, deletes, station toggles."""
    rng = random.Random(7)
    next_id = int(time.time()) % 100000 * 100
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            choice = rng.random()
            if choice < 0.4:
                next_id += 1
                await conn.execute(
                    "insert into demo.forecasts values (%s, %s, %s, now(), now() + interval '1 day', 'draft')",
                    (rng.randint(1, 3), next_id, Decimal(rng.randint(100, 9999)) / 100),
                )
            elif choice < 0.8:
                await conn.execute(
                    "update demo.forecasts set price = price + 0.25, status = 'published'"
                    " where (region_id, id) in (select region_id, id from demo.forecasts order by random() limit 1)"
                )
            elif choice < 0.9:
                await conn.execute(
                    "delete from demo.forecasts where (region_id, id) in"
                    " (select region_id, id from demo.forecasts order by random() limit 1)"
                )
            else:
                await conn.execute(
                    "update demo.stations set active = not active, load_kw = random() * 100 where id = %s",
                    (rng.randint(1, 20),),
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0 / rate)


async def _live_view(config: Config, stop: asyncio.Event) -> None:
    """Follows partition region-1 with a subscriber: its messages and replica."""
    from publishers.subscriber import Subscriber

    subscriber = Subscriber(config.redis, config.redis.namespace, "region-1")
    recent: deque[str] = deque(maxlen=12)

    async def follow() -> None:
        async for message in subscriber:
            line = _message_line(message)
            recent.append(line)
            _render(recent, subscriber, interactive=sys.stdout.isatty(), line=line)

    task = asyncio.create_task(follow())
    try:
        await stop.wait()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await subscriber.aclose()


def _message_line(message: dict[str, Any]) -> str:
    patch = ", ".join(f"{p['op']} {p['path'] or '/'}" for p in message.get("patch", []))[:70]
    return f"seq {message['seq']:>5}  {message['op']}  {message['section']}:{message['key']:<8} v{message['version']}  {patch}"


def _render(recent: deque[str], subscriber: Any, *, interactive: bool, line: str) -> None:
    if not interactive:
        _say(line)
        return
    replica = subscriber.replica
    docs = sum(len(section) for section in replica.values())
    sys.stdout.write("\x1b[H\x1b[2J")
    sys.stdout.write(f"cdc demo: partition region-1, replica holds {docs} document(s)  (Ctrl-C stops)\n\n")
    sys.stdout.write("\n".join(recent) + "\n")
    sys.stdout.flush()


def _say(text: str) -> None:
    if text:
        print(f"[demo] {text}", flush=True)
