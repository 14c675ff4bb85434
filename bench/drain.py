"""Benchmarks 1 and 4: draining a backlog, end to end, and the sidecar's memory.

The backlog is written once (``prepare``): ten tables of ``0.7 n`` rows are
created, change tracking is enabled, and ``cdc run --once`` loads them into
an empty Redis (the initial snapshot); that Redis state is kept as an RDB
file. Then ``n`` changes per table are committed (60% updates, 30% inserts,
10% deletes; see ``bench.workload``) in four rounds.

Each drain restarts redis-server on the kept RDB file, so every run starts
from the same state: the documents as of the version before the backlog,
with the checkpoints the initial snapshot left. Updates therefore update live
documents (a patch of the three changed columns), deletes delete live
documents, and inserts insert: Redis does the work it does in production.
``cdc run --once`` (a subprocess, as in production) then reads every change
since the checkpoint, applies it and exits once every table is caught up; the
drain time is its whole life, from spawn to exit, start-up included.

The memory benchmark drains the last round alone (a quarter of the backlog:
the checkpoints are moved to the version before that round) and compares the
peak RSS with the full drain's.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from bench.context import BacklogState, Context
from bench.env import NAMESPACE, ServerCpu, SidecarRun, cdc, sidecar, write_config
from bench.workload import Backlog, table_entry
from publishers.layout import Layout

TABLES = tuple(f"t{i:02d}" for i in range(1, 11))
BATCH_SIZES = (100, 500, 2000)
DEFAULT_BATCH = 500


def config(ctx: Context, name: str, batch_size: int = DEFAULT_BATCH) -> Any:
    return write_config(
        ctx.env, name, [table_entry(t) for t in TABLES], worker={"max_batch_size": batch_size}
    )


def prepare(ctx: Context) -> BacklogState:
    """Tables, tracking, the initial snapshot (kept as an RDB file), then the backlog."""
    if ctx.backlog is not None:
        return ctx.backlog
    env = ctx.env
    backlog = Backlog(TABLES, ctx.sizes.backlog_per_table)
    print(f"  creating 10 tables of {backlog.initial_rows:,} rows", flush=True)
    backlog.create_tables(env)
    path = config(ctx, "drain-preload")
    cdc("tracking", "enable", "-c", str(path))
    env.vacuum_analyze()
    env.flush_redis()
    cpu = ServerCpu(env).start()
    with sidecar(path, once=True, name="drain-preload") as process:
        run = process.wait(timeout=1800)
    rows = backlog.initial_rows * len(TABLES)
    preload = {
        "rows": rows,
        "tables": len(TABLES),
        "seconds": round(run.seconds, 2),
        "rows_per_second": round(rows / run.seconds),
        "peak_rss_mb": mb(run.peak_rss),
        "server_cpu_seconds": cpu.stop(),
    }
    print(f"  initial snapshot of {rows:,} rows: {run.seconds:.1f}s", flush=True)
    rdb = env.save_redis("drain-start")
    versions = []
    started = time.monotonic()
    for r in range(backlog.rounds):
        versions.append(env.version_bound())
        backlog.write_round(env, r)
    versions.append(env.version_bound())
    seconds = time.monotonic() - started
    print(f"  wrote a backlog of {backlog.total:,} changes in {seconds:.1f}s", flush=True)
    env.vacuum_analyze()
    ctx.backlog = BacklogState(backlog, rdb, versions, seconds, preload)
    return ctx.backlog


def drain(ctx: Context, state: BacklogState, batch_size: int, first_round: int = 0) -> dict[str, Any]:
    """Restore Redis, drain the backlog from round ``first_round`` on; the figures."""
    env, backlog = ctx.env, state.backlog
    env.restore_redis(state.rdb)
    if first_round:
        ctx.set_checkpoints(TABLES, state.versions[first_round])
    changes = backlog.per_table * (backlog.rounds - first_round) // backlog.rounds * len(TABLES)
    seq_before = total_seq(env.redis_url)
    name = f"drain-{batch_size}-from-{first_round}"
    cpu = ServerCpu(env).start()
    with sidecar(config(ctx, name, batch_size), once=True, name=name) as process:
        run = process.wait(timeout=3600)
    published = total_seq(env.redis_url) - seq_before
    if published != changes:
        raise RuntimeError(f"{name}: {published} messages published for {changes} changes")
    return {
        "batch_size": batch_size,
        "changes": changes,
        "seconds": round(run.seconds, 2),
        "changes_per_second": round(changes / run.seconds),
        "sidecar_cpu_seconds": round(run.cpu, 2),
        "sidecar_cpu_usec_per_change": round(run.cpu * 1e6 / changes, 1),
        "server_cpu_seconds": cpu.stop(),
        "peak_rss_mb": mb(run.peak_rss),
        "rss_mb_at_quarters": quarters(run),
        "published": published,
    }


def total_seq(url: str) -> int:
    """Sum of every partition's @seq: the messages published so far."""
    client = redis.Redis.from_url(url)
    try:
        layout = Layout(NAMESPACE)
        values = client.mget([layout.seq(t) for t in TABLES])
        return sum(int(v) for v in values if v is not None)
    finally:
        client.close()


def quarters(run: SidecarRun) -> list[float]:
    """RSS at 25, 50, 75 and 100% of the run: flat or growing?"""
    if not run.samples:
        return []
    out = []
    for fraction in (0.25, 0.5, 0.75, 1.0):
        moment = run.seconds * fraction
        before = [rss for t, rss in run.samples if t <= moment]
        out.append(mb(before[-1] if before else run.samples[0][1]))
    return out


def mb(value: int) -> float:
    return round(value / 2**20, 1)


def run_drain(ctx: Context) -> dict[str, Any]:
    state = prepare(ctx)
    runs = []
    for batch_size in BATCH_SIZES:
        figure = drain(ctx, state, batch_size)
        print(
            f"  drain, max_batch_size {batch_size:>4}: {figure['changes']:,} changes in {figure['seconds']}s"
            f" = {figure['changes_per_second']:,}/s, peak RSS {figure['peak_rss_mb']} MB",
            flush=True,
        )
        runs.append(figure)
    return {
        "backlog": {
            "tables": len(TABLES),
            "changes": state.backlog.total,
            "per_table": state.backlog.per_table,
            "rows_before": state.backlog.initial_rows * len(TABLES),
            "mix": {"updates": 0.6, "inserts": 0.3, "deletes": 0.1},
            "write_seconds": round(state.write_seconds, 1),
        },
        "initial_snapshot": state.preload,
        "runs": runs,
    }


def run_memory(ctx: Context) -> dict[str, Any]:
    """Peak RSS draining the whole backlog and its last quarter, at the default batch size."""
    state = prepare(ctx)
    full = next(
        (r for r in ctx.results.get("drain", {}).get("runs", []) if r["batch_size"] == DEFAULT_BATCH), None
    )
    if full is None:
        full = drain(ctx, state, DEFAULT_BATCH)
    small = drain(ctx, state, DEFAULT_BATCH, first_round=state.backlog.rounds - 1)
    print(
        f"  peak RSS: {full['peak_rss_mb']} MB for {full['changes']:,} changes,"
        f" {small['peak_rss_mb']} MB for {small['changes']:,}",
        flush=True,
    )
    return {
        "batch_size": DEFAULT_BATCH,
        "large": {k: full[k] for k in ("changes", "peak_rss_mb", "rss_mb_at_quarters", "seconds")},
        "small": {k: small[k] for k in ("changes", "peak_rss_mb", "rss_mb_at_quarters", "seconds")},
        "growth": round(full["peak_rss_mb"] / small["peak_rss_mb"], 3),
    }
