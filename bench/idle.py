"""Benchmark 5: what the sidecar costs while nothing changes.

Fifty small tracked tables, ``cdc run`` with the default settings (adaptive
backoff ``[[5, 50ms], [20, 200ms], [100, 1s], [null, 5s]]``, wake-up
notifications on). Once every table's initial snapshot is done, the
sidecar's CPU seconds (user + system, from /proc through psutil) are read at
the start and the end of each window:

- ``after_catch_up``: the first window after the last change, while the
  backoff climbs from 50 ms to 1 s (what a table costs in its first minute
  of quiet);
- ``steady``: (full mode) a window that starts once every backoff has reached
  its top step (100 empty polls: 83 s after the last change), the cost of a
  table that stays idle.

Beside the CPU: PostgreSQL transactions (``pg_stat_database.xact_commit``, one
per poll) and Redis commands (``total_commands_processed``) per second.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import redis

from bench.context import Context
from bench.env import NAMESPACE, ServerCpu, Sidecar, cdc, sidecar, write_config
from bench.workload import SCHEMA, create_table, table_entry
from publishers.layout import Layout

TABLES = tuple(f"idle{i:02d}" for i in range(1, 51))
ROWS = 100
TOP_STEP_AFTER = 5 * 0.05 + 15 * 0.2 + 80 * 1.0  # seconds of empty polls until the 5 s step


def _counters(ctx: Context) -> tuple[int, int]:
    with psycopg.connect(ctx.env.dsn, autocommit=True) as conn:
        conn.execute("select pg_stat_force_next_flush()")
        row = conn.execute(
            "select xact_commit from pg_stat_database where datname = current_database()"
        ).fetchone()
    client = redis.Redis.from_url(ctx.env.redis_url)
    try:
        commands = int(client.info("stats")["total_commands_processed"])
    finally:
        client.close()
    return (int(row[0]) if row else 0), commands


def _window(ctx: Context, process: Sidecar, seconds: float) -> dict[str, Any]:
    servers = ServerCpu(ctx.env).start()
    cpu_before, (xacts_before, commands_before) = process.cpu_seconds(), _counters(ctx)
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    cpu = process.cpu_seconds() - cpu_before
    xacts_after, commands_after = _counters(ctx)
    xacts, commands = xacts_after - xacts_before, commands_after - commands_before
    return {
        "seconds": round(elapsed, 1),
        "cpu_seconds": round(cpu, 3),
        "percent_of_one_core": round(100 * cpu / elapsed, 2),
        "server_cpu_seconds": servers.stop(),
        "postgres_transactions_per_second": round(xacts / elapsed, 1),
        "redis_commands_per_second": round(commands / elapsed, 1),
        "rss_mb": round(process.rss() / 2**20, 1),
    }


def _wait_streaming(ctx: Context, timeout: float = 120) -> None:
    client = redis.Redis.from_url(ctx.env.redis_url)
    layout = Layout(NAMESPACE)
    try:
        deadline = time.monotonic() + timeout
        while True:
            states = [client.hget(layout.checkpoint(f"{SCHEMA}.{t}"), "state") for t in TABLES]
            if all(s == b"streaming" for s in states):
                return
            if time.monotonic() > deadline:
                raise TimeoutError("the sidecar did not snapshot the idle tables")
            time.sleep(0.2)
    finally:
        client.close()


def run_idle(ctx: Context) -> dict[str, Any]:
    env, sizes = ctx.env, ctx.sizes
    for name in TABLES:
        create_table(env, name, ROWS)
    path = write_config(env, "idle", [table_entry(t) for t in TABLES])
    cdc("tracking", "enable", "-c", str(path))
    env.flush_redis()
    windows: dict[str, Any] = {}
    with sidecar(path, once=False, name="idle") as process:
        _wait_streaming(ctx)
        caught_up = time.monotonic()
        windows["after_catch_up"] = _window(ctx, process, sizes.idle_seconds)
        print(f"  idle, first {sizes.idle_seconds:.0f}s after catch-up: "
              f"{windows['after_catch_up']['percent_of_one_core']}% of one core", flush=True)  # fmt: skip
        if sizes.idle_steady_state:
            time.sleep(max(0.0, caught_up + TOP_STEP_AFTER + 5 - time.monotonic()))
            windows["steady"] = _window(ctx, process, sizes.idle_seconds)
            print(f"  idle, steady state ({sizes.idle_seconds:.0f}s, every backoff at 5s): "
                  f"{windows['steady']['percent_of_one_core']}% of one core", flush=True)  # fmt: skip
        process.stop()
    cdc("tracking", "disable", "-c", str(path))
    env.sql(*(f"drop table {SCHEMA}.{t}" for t in TABLES))
    env.flush_redis()
    return {"tables": len(TABLES), "rows_per_table": ROWS, **windows}
