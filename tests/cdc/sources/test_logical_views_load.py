"""Snapshots in logical capture under write load, on a server of their own
that flushes its WAL for real (``fsync = on``, ``synchronous_commit = on``;
the suite's server runs with both off): each commit then spends a while
between its commit record and its end, the window in which the snapshot
check of 0.5.0 missed transactions (6 to 25 snapshots of 100 here).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest

from cdc.devservers import PostgresServer, ServerUnavailable
from tests.contract.harness import PostgresLogicalHarness, read_all

ITEMS = {"id": "int", "n": "int", "note": "text"}


@pytest.fixture(scope="module")
def postgres_dsn() -> Iterator[str]:
    """This module's server (overrides the session's: the harness uses it)."""
    try:
        server = PostgresServer(settings=("wal_level=logical", "fsync=on", "synchronous_commit=on")).start()
    except ServerUnavailable as exc:
        pytest.skip(str(exc))
    yield server.dsn
    server.cleanup()


SNAPSHOTS_UNDER_LOAD = 100


@pytest.mark.slow
async def test_snapshots_taken_under_write_load_miss_no_insert(harness: PostgresLogicalHarness) -> None:
    """Many snapshots while writers commit (synchronously: each commit waits for
    its WAL flush, between its commit record and its end): each snapshot holds
    every insert whose commit lies at or below its version (the catch-up from
    there skips them). Inserts of new keys: nothing later carries a lost row."""
    table_config = await harness.create_table("items", ITEMS, ["id"])
    source = harness.pg_source
    info = await source.describe(table_config)
    start = await source.current_version()
    stop = asyncio.Event()
    ids = iter(range(1_000_000))

    async def write() -> None:
        async with await psycopg.AsyncConnection.connect(harness.dsn, autocommit=True) as conn:
            while not stop.is_set():
                await conn.execute(f"insert into {table_config.table} values (%s, 0, 'x')", [next(ids)])

    writers = [asyncio.create_task(write()) for _ in range(4)]
    snapshots: list[tuple[int, set[int]]] = []
    try:
        for _ in range(SNAPSHOTS_UNDER_LOAD):
            pages = [p async for p in source.snapshot(info, page_size=10_000)]
            snapshots.append((pages[0].version, {r["id"] for p in pages for r in p.rows}))
    finally:
        stop.set()
        await asyncio.gather(*writers)
    await harness.settle()
    # reads from checkpoint to checkpoint until the last snapshot's version:
    # one read decodes at most DECODE_CHANGES messages (~6,700 inserts)
    committed: dict[int, int] = {}
    position, last = start, max(version for version, _ in snapshots)
    while position < last:
        changes, position = await read_all(source, info, position, 100_000)
        committed.update((c.key["id"], c.version) for c in changes)
    missed = [
        (version, sorted(i for i, at in committed.items() if at <= version and i not in seen)[:3])
        for version, seen in snapshots
    ]
    missed = [m for m in missed if m[1]]
    assert missed == [], (
        f"{len(missed)} of {len(snapshots)} snapshots missed inserts below their version: {missed[:3]}"
    )
