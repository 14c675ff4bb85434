"""Benchmark 2: the apply ceiling and the naive baseline, on the drain's own changes.

The changes are the backlog's first ones, read through the product's own read
path (``PostgresSource.read_changes``) and encoded by ``TableMapper``, held in
memory, interleaved table by table in blocks of 250 (as trackers fill the
batch queue side by side). Redis starts from the same RDB file as every drain.

- ceiling: ``DataManager.apply`` over the pre-encoded changes in batches of
  100, 500 and 2000, back to back, each next batch prepared while Redis runs
  the one before (as the pipeline does under a backlog), nothing else in the
  process: how fast the apply path alone can go (``bench.apply_bench.apply_batches``);
- naive: what a hand-written mirror would do, per change an HSET of the row
  (DEL of a delete) and a PUBLISH of it, with redis-py's asyncio client: two
  round trips per change (the baseline of the targets), and the same two
  commands pipelined in one round trip (``bench.apply_bench.naive_apply``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.apply_bench import apply_batches, naive_apply
from bench.context import BacklogState, Context
from bench.drain import BATCH_SIZES, TABLES, config, prepare
from cdc.config import load_config
from cdc.mapping import TableMapper
from cdc.sources import make_source
from publishers.manager import DataManager
from publishers.model import Change

BLOCK = 250


async def read_backlog(ctx: Context, state: BacklogState, count: int) -> list[Change]:
    """The first ``count`` changes of the backlog (``count / 10`` per table), encoded."""
    cfg = load_config(config(ctx, "ceiling-read"))
    source = make_source(cfg.source)
    await source.connect()
    per_table: list[list[Change]] = []
    try:
        for table in cfg.tables:
            info = await source.describe(table)
            mapper = TableMapper(table, info, cfg.worker.max_row_bytes)
            wanted, since, found = count // len(TABLES), state.versions[0], []
            page = await source.read_changes(info, since, limit=cfg.worker.page_size)
            while True:
                found += [c for c in map(mapper.from_row, page.rows) if c is not None]
                if len(found) >= wanted or not page.more:
                    break
                page = await source.read_changes(
                    info, since, limit=cfg.worker.page_size, upto=page.next_version, after=page.cursor
                )
            per_table.append(found[:wanted])
    finally:
        await source.close()
    changes: list[Change] = []
    for start in range(0, max(map(len, per_table)), BLOCK):
        for found in per_table:
            changes += found[start : start + BLOCK]
    return changes


async def _timed(ctx: Context, work: str, changes: list[Change], batch_size: int = 0) -> float:
    manager = await DataManager.connect(ctx.redis_config)
    try:
        if work == "apply":
            return await apply_batches(manager, changes, batch_size)
        return await naive_apply(manager, changes, pipelined=work == "naive-pipelined")
    finally:
        await manager.close()


def run_ceiling(ctx: Context) -> dict[str, Any]:
    state = prepare(ctx)
    changes = asyncio.run(read_backlog(ctx, state, ctx.sizes.ceiling_changes))
    ops = {op: sum(1 for c in changes if c.op == op) for op in ("I", "U", "D")}
    ceiling = []
    for batch_size in BATCH_SIZES:
        ctx.env.restore_redis(state.rdb)
        seconds = asyncio.run(_timed(ctx, "apply", changes, batch_size))
        rate = round(len(changes) / seconds)
        print(f"  apply ceiling, batches of {batch_size:>4}: {rate:,}/s", flush=True)
        ceiling.append({"batch_size": batch_size, "changes": len(changes), "seconds": round(seconds, 2),
                        "changes_per_second": rate})  # fmt: skip
    naive = {}
    sample = changes[: ctx.sizes.naive_changes]
    for work in ("naive", "naive-pipelined"):
        ctx.env.restore_redis(state.rdb)
        seconds = asyncio.run(_timed(ctx, work, sample))
        rate = round(len(sample) / seconds)
        print(f"  {work}: {rate:,}/s", flush=True)
        naive[work] = {"changes": len(sample), "seconds": round(seconds, 2), "changes_per_second": rate}
    del changes, sample
    return {
        "ops": ops,
        "ceiling": ceiling,
        "naive": naive["naive"],
        "naive_pipelined": naive["naive-pipelined"],
    }
