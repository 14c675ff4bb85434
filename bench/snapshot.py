"""Benchmark 6: the initial snapshot of one large table.

A table of ``n`` rows of the ten mixed columns, tracked, one partition;
``cdc run --once`` against an empty Redis snapshots it (consistent, keyset
pages) and exits once caught up. The rate is rows over the snapshot's own
time (its "snapshot starting" to "snapshot done" log lines); the process's
whole life, start-up and the catch-up poll included, is reported beside it.

The reference, in the same run: the one-off loader a user would write
(``bench.loader``: a psycopg server-side cursor feeding redis-py pipelines of
HSET), run on the same table into the same (flushed) Redis, before and after
the sidecar; the ratio is the sidecar's rows/s over the loader's mean (target
>= 3.5, issue 17). CPU of each side (the process's own, Redis's, PostgreSQL's)
is reported beside the wall-clock figures: on a shared machine they are what
compares.
"""

from __future__ import annotations

import json
import subprocess
import sys
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
    loader_before = run_loader(env, f"{SCHEMA}.{TABLE}")
    env.flush_redis()
    cpu = ServerCpu(env).start()
    with sidecar(path, once=True, name="snapshot") as process:
        run = process.wait(timeout=3600)
    server = cpu.stop()
    loader_after = run_loader(env, f"{SCHEMA}.{TABLE}")
    begin = run.log_time("snapshot starting", table=f"{SCHEMA}.{TABLE}")
    end = run.log_time("snapshot done", table=f"{SCHEMA}.{TABLE}")
    if begin is None or end is None:
        raise RuntimeError("the sidecar did not log its snapshot (see bench/.work/snapshot.log)")
    seconds = end - begin
    cdc("tracking", "disable", "-c", str(path))
    env.sql(f"drop table {SCHEMA}.{TABLE}")
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
        "loader": [loader_before, loader_after],
    }
    loader_rate = sum(r["rows_per_second"] for r in figure["loader"]) / 2
    figure["loader_rows_per_second"] = round(loader_rate)
    figure["ratio_to_loader"] = round(figure["rows_per_second"] / loader_rate, 2)
    print(
        f"  snapshot: {rows:,} rows in {seconds:.1f}s = {figure['rows_per_second']:,} rows/s"
        f" (process {run.seconds:.1f}s), peak RSS {figure['peak_rss_mb']} MB;"
        f" one-off loader {figure['loader_rows_per_second']:,} rows/s: ratio {figure['ratio_to_loader']}",
        flush=True,
    )
    return figure


def run_loader(env: Any, table: str) -> dict[str, Any]:
    """``bench.loader`` in its own process on a flushed Redis: rows/s, its CPU and the servers'."""
    env.flush_redis()
    cpu = ServerCpu(env).start()
    done = subprocess.run(
        [sys.executable, "-m", "bench.loader", env.dsn, env.redis_url, table],
        check=True,
        capture_output=True,
        text=True,
    )
    server = cpu.stop()
    env.flush_redis()
    result = json.loads(done.stdout)
    return {
        "rows": result["rows"],
        "seconds": round(result["seconds"], 2),
        "rows_per_second": round(result["rows"] / result["seconds"]),
        "cpu_seconds": round(result["cpu"], 2),
        "server_cpu_seconds": server,
    }
