"""Benchmark 6: the initial snapshot of one large table.

A table of ``n`` rows of the ten mixed columns, tracked, one partition;
``cdc run --once`` against an empty Redis snapshots it (consistent, keyset
pages) and exits once caught up. The rate is rows over the snapshot's own
time (its "snapshot starting" to "snapshot done" log lines); the process's
whole life, start-up and the catch-up poll included, is reported beside it.
"""

from __future__ import annotations

import time
from typing import Any

from bench.context import Context
from bench.drain import mb
from bench.env import ServerCpu, cdc, sidecar, write_config
from bench.workload import SCHEMA, create_table, table_entry

TABLE = "snap"


def run_snapshot(ctx: Context) -> dict[str, Any]:
    env, rows = ctx.env, ctx.sizes.snapshot_rows
    started = time.monotonic()
    create_table(env, TABLE, rows)
    path = write_config(env, "snapshot", [table_entry(TABLE)])
    cdc("tracking", "enable", "-c", str(path))
    env.vacuum_analyze()
    print(f"  table of {rows:,} rows written in {time.monotonic() - started:.1f}s", flush=True)
    env.flush_redis()
    cpu = ServerCpu(env).start()
    with sidecar(path, once=True, name="snapshot") as process:
        run = process.wait(timeout=3600)
    server = cpu.stop()
    begin = run.log_time("snapshot starting", table=f"{SCHEMA}.{TABLE}")
    end = run.log_time("snapshot done", table=f"{SCHEMA}.{TABLE}")
    if begin is None or end is None:
        raise RuntimeError("the sidecar did not log its snapshot (see bench/.work/snapshot.log)")
    seconds = end - begin
    cdc("tracking", "disable", "-c", str(path))
    env.sql(f"drop table {SCHEMA}.{TABLE}")
    env.flush_redis()
    figure = {
        "rows": rows,
        "snapshot_seconds": round(seconds, 2),
        "rows_per_second": round(rows / seconds),
        "process_seconds": round(run.seconds, 2),
        "rows_per_second_whole_process": round(rows / run.seconds),
        "sidecar_cpu_seconds": round(run.cpu, 2),
        "sidecar_cpu_usec_per_row": round(run.cpu * 1e6 / rows, 1),
        "server_cpu_seconds": server,
        "peak_rss_mb": mb(run.peak_rss),
    }
    print(
        f"  snapshot: {rows:,} rows in {seconds:.1f}s = {figure['rows_per_second']:,} rows/s"
        f" (process {run.seconds:.1f}s), peak RSS {figure['peak_rss_mb']} MB",
        flush=True,
    )
    return figure
