"""The balancer inside two whole sidecars (``Daemon``) sharing one in-memory
source and a real Redis: the tables are spread, every row reaches Redis, and
when one sidecar stops the other takes its tables over and keeps mirroring.
Seconds, not minutes: no database server, short leases."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cdc.config import Config, parse_config
from cdc.daemon import Daemon
from cdc.sources.memory import MemorySource
from publishers import control
from publishers.manager import DataManager
from tests.e2e import wait_for

TABLES = [f"mem.t{i}" for i in range(4)]
LEASE_TTL = 0.6  # seconds: a stopped sidecar's tables are free again at once (it releases them)


def config(redis_url: str, namespace: str) -> Config:
    tables = "".join(
        f"  - table: {t}\n    partition: p\n    section: {t.split('.')[1]}\n    backoff: [[null, 10ms]]\n"
        for t in TABLES
    )
    text = (
        f"source:\n  kind: postgres\n  dsn: unused\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        f"worker:\n  health: null\n  lease_ttl: {LEASE_TTL}s\n  heartbeat: 1s\n"
        f"tables:\n{tables}"
    )
    return parse_config(text, "<test>", {})


@pytest.fixture
async def source() -> MemorySource:
    shared = MemorySource()
    for table in TABLES:
        shared.create_table(table, {"id": "int", "n": "int"}, ["id"])
    return shared


@pytest.fixture
async def manager(redis_url: str, namespace: str) -> AsyncIterator[DataManager]:
    async with await DataManager.connect(config(redis_url, namespace).redis) as connected:
        yield connected


async def start(cfg: Config, source: MemorySource, worker_id: str) -> tuple[Daemon, asyncio.Task[None]]:
    daemon = Daemon(cfg, source=source, worker_id=worker_id)
    return daemon, asyncio.create_task(daemon.run(), name=worker_id)


async def owners(manager: DataManager) -> dict[str, str]:
    return await control.table_owners(manager, TABLES)


async def mirrored(manager: DataManager, source: MemorySource) -> bool:
    for table in TABLES:
        documents = await manager.documents("p", table.split(".")[1])
        rows = {str(key[0]): row for key, row in source.rows(table).items()}
        if {key: _values(document) for key, document in documents.items()} != rows:
            return False
    return True


def _values(document: dict[str, Any]) -> dict[str, Any]:
    return {column: value for column, value in document.items() if not column.startswith("@")}


def write(source: MemorySource, start: int, count: int) -> None:
    for i in range(start, start + count):
        for table in TABLES:
            source.insert(table, {"id": i, "n": i * 10})


async def test_two_sidecars_share_the_tables_and_one_takes_over_when_the_other_stops(
    redis_url: str, namespace: str, source: MemorySource, manager: DataManager
) -> None:
    cfg = config(redis_url, namespace)
    await source.tracking_enable(cfg.tables)
    write(source, 0, 20)
    first, first_run = await start(cfg, source, "one")
    running = [(first, first_run)]
    try:

        async def alone() -> bool:
            return list((await owners(manager)).values()) == ["one"] * len(TABLES)

        await wait_for(alone, 10, "the first sidecar to take every table")
        running.append(await start(cfg, source, "two"))  # fair share: two each, so "one" gives back two

        async def spread() -> bool:
            held = list((await owners(manager)).values())
            return sorted(held) == ["one", "one", "two", "two"]

        await wait_for(spread, 10, "two tables each")
        write(source, 20, 20)
        await wait_for(lambda: mirrored(manager, source), 10, "every row in Redis")

        first.request_stop()
        await asyncio.wait_for(first_run, 10)

        async def taken_over() -> bool:
            return list((await owners(manager)).values()) == ["two"] * len(TABLES)

        await wait_for(taken_over, 10, "the remaining sidecar to take every table")
        write(source, 40, 20)
        source.delete(TABLES[0], {"id": 0})
        await wait_for(lambda: mirrored(manager, source), 10, "the later rows (and a delete) in Redis")
    finally:
        for daemon, run in running:
            daemon.request_stop()
            await asyncio.wait_for(asyncio.gather(run, return_exceptions=True), 10)
