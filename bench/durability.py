"""What ``redis.durability`` costs: the apply path with and without WAIT.

Usage: ``python -m bench.durability [--quick]``. Starts a primary and one
replica (``cdc.devservers``, loopback, no persistence), then applies the
``bench.apply_bench`` changes in batches of 1, 100 and 1000 (16 partitions)
with ``replicas: 0`` (no WAIT) and ``replicas: 1``, interleaved, three runs
each; prints per setting and batch size the changes per second and the
median latency of one ``apply`` call. Writes nothing (the figures go to the
report that asked for them).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time

from bench.apply_bench import make_changes
from cdc.devservers import RedisServer, wait_until
from publishers.manager import DataManager
from publishers.model import Change
from publishers.settings import Durability, RedisConfig

BATCH_SIZES = (1, 100, 1000)
RUNS = 3


def _synced(primary: RedisServer) -> bool:
    out = subprocess.run(
        ["redis-cli", "-p", str(primary.port), "info", "replication"], capture_output=True, text=True
    ).stdout
    return "state=online" in out


async def _one(
    primary: RedisServer, replicas: int, changes: list[Change], batch: int, run: int
) -> tuple[float, float]:
    """(changes per second, median seconds per apply call) of one run."""
    config = RedisConfig(
        url=primary.url, namespace=f"b{replicas}x{batch}x{run}", durability=Durability(replicas, 1.0)
    )
    calls: list[float] = []
    async with await DataManager.connect(config) as manager:
        started = time.perf_counter()
        for start in range(0, len(changes), batch):
            began = time.perf_counter()
            await manager.apply(changes[start : start + batch])
            calls.append(time.perf_counter() - began)
        total = time.perf_counter() - started
    return len(changes) / total, statistics.median(calls)


async def run(quick: bool) -> None:
    primary = RedisServer().start()
    replica = RedisServer(extra=("--replicaof", "127.0.0.1", str(primary.port))).start()
    try:
        wait_until(lambda: _synced(primary), 20, "the replica to sync")
        for batch in BATCH_SIZES:
            count = (2_000 if batch == 1 else 20_000) // (4 if quick else 1)
            changes = make_changes(count, 16)
            figures: dict[int, list[tuple[float, float]]] = {0: [], 1: []}
            for run_ in range(RUNS):
                for replicas in (0, 1):  # interleaved: a drift of the machine hits both
                    figures[replicas].append(await _one(primary, replicas, changes, batch, run_))
            for replicas, runs in figures.items():
                rate = statistics.median(r for r, _ in runs)
                latency = statistics.median(c for _, c in runs)
                print(
                    f"batch {batch:>5}  replicas {replicas}: {rate:>9,.0f} changes/s, "
                    f"apply call median {latency * 1000:.3f} ms  ({RUNS} runs, {count} changes each)"
                )
    finally:
        replica.cleanup()
        primary.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a quarter of the changes")
    args = parser.parse_args(argv)
    asyncio.run(run(args.quick))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
