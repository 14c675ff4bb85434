"""Every cdc-sync benchmark, against baselines measured in the same run.

    python -m bench              the reference run (about 20 minutes on 2 cores)
    python -m bench --quick      smaller sizes, under 3 minutes (a smoke run)
    python -m bench --only drain,latency
    python -m bench --render     rewrite RESULTS.md from results.json (notes edited)

Starts its own PostgreSQL and redis-server (``cdc.devservers``), runs the
benchmarks, and writes bench/RESULTS.md and bench/results/results.json:

    snapshot   6. initial snapshot of one large table, rows/s
    drain      1. end-to-end drain of a backlog of changes, for 3 batch sizes
    memory     4. peak RSS draining the backlog and a quarter of it
    ceiling    2. the apply path alone, and a naive client, on the same changes
    latency    3. commit to subscriber, at 3 offered loads, with and without wake-up
    idle       5. CPU of the sidecar with 50 idle tables
    cpu        7. the drain's CPU (sidecar, Redis) against the plain commands a change stands for
    subscriber 8. the subscriber client's messages/s, against jsonpatch
    pgbench    9. pgbench TPC-B with and without tracking, interleaved: what the triggers cost

Scratch files (configs, the sidecars' logs, RDB copies) go to bench/.work/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

from bench import report
from bench.ceiling import run_ceiling
from bench.context import Context, Sizes
from bench.cpu_reference import run_cpu_reference
from bench.drain import run_drain, run_memory
from bench.env import WORK, Env, LoadWatch, machine, other_load, versions
from bench.idle import run_idle
from bench.latency import run_latency
from bench.notes import NOTES
from bench.pgbench import run_pgbench
from bench.snapshot import run_snapshot
from bench.subscriber_bench import run_subscriber

BENCHMARKS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "snapshot": run_snapshot,
    "drain": run_drain,
    "memory": run_memory,
    "ceiling": run_ceiling,
    "latency": run_latency,
    "idle": run_idle,
    "cpu": run_cpu_reference,
    "subscriber": run_subscriber,
    "pgbench": run_pgbench,
}
QUIET_PERCENT = 20.0  # CPU % of one core that other processes may use for the machine to count as quiet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes: a smoke run in under 3 minutes")
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    parser.add_argument(
        "--render",
        action="store_true",
        help="rewrite RESULTS.md from results.json with the current notes; no run",
    )
    args = parser.parse_args(argv)
    if args.render:
        saved = json.loads(report.RESULTS_JSON.read_text())
        report.write(saved, NOTES)
        print(f"wrote {report.RESULTS_MD} from {report.RESULTS_JSON}")
        return 0
    chosen = [name.strip() for name in args.only.split(",") if name.strip()] or list(BENCHMARKS)
    unknown = [name for name in chosen if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)} (known: {', '.join(BENCHMARKS)})")
    command = (
        "python -m bench" + (" --quick" if args.quick else "") + (f" --only {args.only}" if args.only else "")
    )
    sizes = Sizes.quick() if args.quick else Sizes.full()
    print(f"{command}: {'QUICK mode, smaller sizes' if args.quick else 'full mode'}: {sizes}", flush=True)
    shutil.rmtree(WORK, ignore_errors=True)
    before = other_load()
    watch = LoadWatch().start()
    started = time.monotonic()
    env = Env().start()
    ctx = Context(env, args.quick, sizes)
    try:
        facts = {"machine": machine(), "versions": versions(env)}
        for name in chosen:
            print(f"[{name}]", flush=True)
            begun = time.monotonic()
            ctx.results[name] = BENCHMARKS[name](ctx)
            print(f"  ({time.monotonic() - begun:.0f}s)", flush=True)
    finally:
        env.stop()
    during = watch.stop()
    after = other_load()
    seconds = time.monotonic() - started
    report.write(
        {
            "command": command,
            "mode": "quick" if args.quick else "full",
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "seconds": round(seconds, 1),
            "quiet": _quiet(before, during, after),
            "sizes": sizes.__dict__,
            **facts,
            "results": ctx.results,
        },
        NOTES,
    )
    for target in report.targets(ctx.results):
        print(f"  {'MET   ' if target.met else 'MISSED'} {target.name}: {target.figure} ({target.goal})")
    print(f"wrote {report.RESULTS_MD} and {report.RESULTS_JSON} ({seconds / 60:.1f} minutes)")
    return 0


def _quiet(before: float, during: dict[str, float], after: float) -> dict[str, Any]:
    load = os.getloadavg()
    quiet = max(before, during["mean"], after) < QUIET_PERCENT
    return {
        "verdict": "yes"
        if quiet
        else "NO: other processes used the CPU during the run, so figures are lower",
        "detail": f"Other processes (not the servers and sidecars of the run) used {before:.0f}% of one core"
        f" just before the run, {during['mean']:.0f}% on average (at most {during['max']:.0f}%) in"
        f" {during['samples']} samples during it, and {after:.0f}% just after it; load average at the end"
        f" {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}.",
        "other_cpu_percent": {"before": round(before, 1), "during": during, "after": round(after, 1)},
    }


if __name__ == "__main__":
    sys.exit(main())
