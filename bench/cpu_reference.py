"""Benchmark 7: what a drained change costs in CPU, against the plain Redis
commands it stands for, measured on the same server in the same run.

The reference is the Redis CPU of the commands a hand-written mirror would
send for each change, pipelined (``plain_commands``): HSET of the row's fields
(with ``@v`` and ``@ts``; a delete's tombstone fields), SADD (SREM) of its
index entry, INCR of ``@seq``, XADD and PUBLISH of the very message the apply
published for it. Three figures are set against it (issue 17):

- the sidecar's CPU per change: ``cdc run --once`` draining the backlog at
  max_batch_size 2000 (rusage of the child), less the same command run once
  more with nothing left to drain (start-up, describing the tables, the
  leases: a fixed cost that a larger backlog would dilute);
- Redis's CPU per change during that drain (``INFO cpu``: used_cpu_sys +
  used_cpu_user of the server, before and after);
- Redis's CPU per change of ``DataManager.apply`` alone over the backlog's
  first changes, in batches of 2000, against the plain commands over the
  same changes: the two interleaved (apply, plain, apply, plain), Redis
  restarted on the same RDB file before each, so both do the same work on
  the same data.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.apply_bench import apply_batches
from bench.ceiling import read_backlog
from bench.context import BacklogState, Context
from bench.drain import TABLES, config, drain, prepare
from bench.env import Env, sidecar
from publishers.manager import DataManager
from publishers.model import Change, timestamp

BATCH = 2000
ROUNDS = 2  # interleaved apply / plain pairs


def redis_cpu(env: Env) -> float:
    """The server's CPU seconds so far (user + system), from INFO."""
    client = env.redis_client()
    try:
        info = client.info("cpu")
    finally:
        client.close()
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def published_messages(manager: DataManager, changes: list[Change]) -> list[bytes]:
    """The message each change published, read back from the partitions'
    streams (each partition's messages are its changes', in order)."""
    by_partition: dict[str, list[int]] = {}
    for i, change in enumerate(changes):
        by_partition.setdefault(change.partition, []).append(i)
    out: list[bytes] = [b""] * len(changes)
    for partition, indexes in by_partition.items():
        entries = await manager.client.xrange(manager.layout.stream(partition))
        texts = [fields[b"m"] for _, fields in entries][-len(indexes) :]
        if len(texts) != len(indexes):
            raise RuntimeError(f"partition {partition}: {len(texts)} messages for {len(indexes)} changes")
        for i, text in zip(indexes, texts, strict=True):
            out[i] = text
    return out


async def plain_commands(manager: DataManager, changes: list[Change], messages: list[bytes]) -> float:
    """The reference: per change HSET, SADD (SREM), INCR, XADD, PUBLISH, in
    pipelines of ``BATCH`` changes. Seconds taken."""
    layout, ts = manager.layout, timestamp()
    started = time.perf_counter()
    for start in range(0, len(changes), BATCH):
        pipe = manager.client.pipeline(transaction=False)
        for change, message in zip(
            changes[start : start + BATCH], messages[start : start + BATCH], strict=True
        ):
            doc = layout.document(change.partition, change.section, change.key)
            index = layout.index(change.partition, change.section)
            seq = layout.seq(change.partition)
            if change.values is None:
                pipe.hset(doc, mapping={"@v": change.version, "@del": 1})
                pipe.srem(index, change.key)
            else:
                pipe.hset(doc, mapping={**change.values, "@v": change.version, "@ts": ts})  # type: ignore[arg-type]
                pipe.sadd(index, change.key)
            pipe.incr(seq)
            pipe.xadd(layout.stream(change.partition), {"m": message}, maxlen=100_000, approximate=True)
            pipe.publish(layout.channel(change.partition, change.section), message)
        await pipe.execute()
    return time.perf_counter() - started


async def _with_manager(ctx: Context, work: Callable[[DataManager], Awaitable[Any]]) -> Any:
    manager = await DataManager.connect(ctx.redis_config)
    try:
        return await work(manager)
    finally:
        await manager.close()


def _redis_usec(
    ctx: Context, state: BacklogState, work: Callable[[DataManager], Awaitable[Any]], count: int
) -> tuple[float, Any]:
    """Restart Redis on the backlog's RDB file, run ``work``; (Redis CPU µs per change, its result)."""
    ctx.env.restore_redis(state.rdb)
    before = redis_cpu(ctx.env)
    result = asyncio.run(_with_manager(ctx, work))
    return (redis_cpu(ctx.env) - before) * 1e6 / count, result


def apply_vs_plain(ctx: Context, state: BacklogState) -> dict[str, Any]:
    """Redis CPU per change of the apply and of the plain commands, interleaved."""
    changes = asyncio.run(read_backlog(ctx, state, ctx.sizes.ceiling_changes))
    apply_usec: list[float] = []
    plain_usec: list[float] = []
    messages: list[bytes] = []

    async def apply(manager: DataManager) -> list[bytes]:
        await apply_batches(manager, changes, BATCH)
        return await published_messages(manager, changes)

    for _ in range(ROUNDS):
        usec, messages = _redis_usec(ctx, state, apply, len(changes))
        apply_usec.append(usec)
        plain = functools.partial(plain_commands, changes=changes, messages=messages)
        usec, _ = _redis_usec(ctx, state, plain, len(changes))
        plain_usec.append(usec)
    apply_mean, plain_mean = sum(apply_usec) / ROUNDS, sum(plain_usec) / ROUNDS
    return {
        "changes": len(changes),
        "apply_redis_usec_per_change": [round(u, 1) for u in apply_usec],
        "plain_redis_usec_per_change": [round(u, 1) for u in plain_usec],
        "apply_redis_usec": round(apply_mean, 1),
        "plain_redis_usec": round(plain_mean, 1),
        "apply_vs_plain": round(apply_mean / plain_mean, 2),
    }


def sidecar_cpu(ctx: Context, state: BacklogState) -> dict[str, Any]:
    """The drain at ``BATCH`` (sidecar and Redis CPU), then the same command
    with nothing to drain: its fixed cost."""
    before = redis_cpu(ctx.env)
    figure = drain(ctx, state, BATCH)
    redis_usec = (redis_cpu(ctx.env) - before) * 1e6 / figure["changes"]
    with sidecar(config(ctx, "cpu-caught-up", BATCH), once=True, name="cpu-caught-up") as process:
        idle = process.wait(timeout=600)
    net = max(0.0, figure["sidecar_cpu_seconds"] - idle.cpu)
    return {
        "changes": figure["changes"],
        "seconds": figure["seconds"],
        "changes_per_second": figure["changes_per_second"],
        "sidecar_cpu_seconds": figure["sidecar_cpu_seconds"],
        "fixed_cpu_seconds": round(idle.cpu, 2),
        "sidecar_usec_per_change": round(net * 1e6 / figure["changes"], 1),
        "sidecar_usec_per_change_with_start": figure["sidecar_cpu_usec_per_change"],
        "redis_usec_per_change": round(redis_usec, 1),
    }


def run_cpu_reference(ctx: Context) -> dict[str, Any]:
    state = prepare(ctx)
    redis = apply_vs_plain(ctx, state)
    side = sidecar_cpu(ctx, state)
    plain = redis["plain_redis_usec"]
    result = {
        "batch_size": BATCH,
        "tables": len(TABLES),
        "reference_redis_usec": plain,
        "redis": redis,
        "drain": side,
        "sidecar_vs_reference": round(side["sidecar_usec_per_change"] / plain, 2),
        "drain_redis_vs_reference": round(side["redis_usec_per_change"] / plain, 2),
    }
    print(
        f"  reference (plain commands) {plain} µs/change of Redis CPU; apply {redis['apply_redis_usec']}"
        f" ({redis['apply_vs_plain']}x); sidecar {side['sidecar_usec_per_change']} µs/change"
        f" ({result['sidecar_vs_reference']}x), Redis during the drain {side['redis_usec_per_change']}"
        f" ({result['drain_redis_vs_reference']}x)",
        flush=True,
    )
    return result
