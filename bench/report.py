"""bench/RESULTS.md and bench/results/results.json from one run's figures."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS_MD = BENCH / "RESULTS.md"
RESULTS_JSON = BENCH / "results" / "results.json"


@dataclass
class Target:
    name: str
    goal: str
    figure: str
    met: bool | None  # None: not measured in this run


def targets(results: dict[str, Any]) -> list[Target]:
    out: list[Target] = []
    drain, ceiling = results.get("drain"), results.get("ceiling")
    if drain and ceiling:
        naive = ceiling["naive"]["changes_per_second"]
        by_batch = {c["batch_size"]: c["changes_per_second"] for c in ceiling["ceiling"]}
        for run in drain["runs"]:
            rate, top = run["changes_per_second"], by_batch.get(run["batch_size"])
            out.append(Target(f"drain, max_batch_size {run['batch_size']}: vs naive", ">= 5x naive",
                              f"{rate:,}/s = {rate / naive:.1f}x naive ({naive:,}/s)", rate >= 5 * naive))  # fmt: skip
            if top:
                out.append(Target(f"drain, max_batch_size {run['batch_size']}: vs ceiling", ">= 40% of ceiling",
                                  f"{rate:,}/s = {100 * rate / top:.0f}% of {top:,}/s", rate >= 0.4 * top))  # fmt: skip
    latency = results.get("latency")
    if latency:
        for notify, limit in ((True, 50.0), (False, 150.0)):
            run = next(
                (r for r in latency["runs"] if r["offered_per_second"] == 1000 and r["notify"] == notify),
                None,
            )
            if run:
                what = "with wake-up" if notify else "without wake-up (backoff only)"
                out.append(Target(f"p99 commit to subscriber at 1,000/s, {what}", f"< {limit:.0f} ms",
                                  f"{run['p99_ms']} ms", run["p99_ms"] < limit))  # fmt: skip
    memory = results.get("memory")
    if memory:
        large, small = memory["large"], memory["small"]
        out.append(Target(f"peak RSS draining {large['changes']:,} changes", "< 250 MB",
                          f"{large['peak_rss_mb']} MB", large["peak_rss_mb"] < 250))  # fmt: skip
        out.append(Target("peak RSS flat (not growing with the backlog)", "ratio < 1.15",
                          f"{large['peak_rss_mb']} MB / {small['peak_rss_mb']} MB ({small['changes']:,} changes)"
                          f" = {memory['growth']}", memory["growth"] < 1.15))  # fmt: skip
    idle = results.get("idle")
    if idle:
        for window in ("after_catch_up", "steady"):
            if window in idle:
                figure = idle[window]
                label = "first window after catch-up" if window == "after_catch_up" else "steady state"
                out.append(Target(f"idle CPU, {idle['tables']} tables, {label} ({figure['seconds']:.0f}s)",
                                  "< 2% of one core", f"{figure['percent_of_one_core']}%",
                                  figure["percent_of_one_core"] < 2))  # fmt: skip
    out += _issue_17_targets(results)
    snapshot = results.get("snapshot")
    if snapshot:
        out.append(Target(f"snapshot of {snapshot['rows']:,} rows", ">= 50,000 rows/s",
                          f"{snapshot['rows_per_second']:,} rows/s", snapshot["rows_per_second"] >= 50_000))  # fmt: skip
        if "ratio_to_loader" in snapshot:
            out.append(Target("snapshot vs a one-off loader (psycopg cursor -> HSET pipelines), same run",
                              ">= 3.5x", f"{snapshot['ratio_to_loader']}x ({snapshot['loader_rows_per_second']:,} rows/s)",
                              snapshot["ratio_to_loader"] >= 3.5))  # fmt: skip
    out += _pgbench_targets(results.get("pgbench"))
    return out


def _issue_17_targets(results: dict[str, Any]) -> list[Target]:
    """The drain's CPU against the plain commands' Redis CPU, the drain against
    the ceiling at batch 2000, and the subscriber's rate (issue 17, points 2 and 4)."""
    out: list[Target] = []
    cpu, drain, ceiling = results.get("cpu"), results.get("drain"), results.get("ceiling")
    if cpu:
        plain = cpu["reference_redis_usec"]
        side, redis = cpu["drain"], cpu["redis"]
        out.append(Target("sidecar CPU per drained change vs the plain commands' Redis CPU (batch 2000)",
                          "<= 1.4x", f"{side['sidecar_usec_per_change']} µs = {cpu['sidecar_vs_reference']}x"
                          f" {plain} µs", cpu["sidecar_vs_reference"] <= 1.4))  # fmt: skip
        out.append(Target("Redis CPU of the apply vs the plain commands, same changes (batch 2000)",
                          "<= 2.1x", f"{redis['apply_redis_usec']} µs = {redis['apply_vs_plain']}x {plain} µs",
                          redis["apply_vs_plain"] <= 2.1))  # fmt: skip
    if drain and ceiling:
        run = next((r for r in drain["runs"] if r["batch_size"] == 2000), None)
        top = next((c["changes_per_second"] for c in ceiling["ceiling"] if c["batch_size"] == 2000), None)
        if run and top:
            rate = run["changes_per_second"]
            out.append(Target("drain, max_batch_size 2000: vs ceiling (issue 17)", ">= 60% of ceiling",
                              f"{rate:,}/s = {100 * rate / top:.0f}% of {top:,}/s", rate >= 0.6 * top))  # fmt: skip
    subscriber = results.get("subscriber")
    if subscriber:
        fast = subscriber["fast"]["messages_per_second"]
        out.append(Target("subscriber applying messages to its replica", ">= 50,000 messages/s",
                          f"{fast:,}/s ({subscriber['fast_vs_jsonpatch']}x jsonpatch's"
                          f" {subscriber['jsonpatch']['messages_per_second']:,}/s)", fast >= 50_000))  # fmt: skip
        if "fast_tuned_gc" in subscriber:  # the process tuned as publishers.gc_tuning tells applications
            tuned = subscriber["fast_tuned_gc"]["messages_per_second"]
            out.append(Target("subscriber applying messages, process tuned by gc_tuning.tune_gc()",
                              ">= 50,000 messages/s", f"{tuned:,}/s", tuned >= 50_000))  # fmt: skip
    return out


def _pgbench_targets(pgbench: dict[str, Any] | None) -> list[Target]:
    if not pgbench:
        return []
    tps = pgbench["median_tps"]
    return [Target(f"pgbench TPC-B (scale {pgbench['scale']}, {pgbench['clients']} clients) with tracking vs without,"
                   " same run", f">= {pgbench['target']:.2f}x",
                   f"{pgbench['median_ratio']:.2f}x, median of {len(pgbench['ratios'])} pairs"
                   f" ({tps['tracked']:,} vs {tps['untracked']:,} tps)",
                   pgbench["median_ratio"] >= pgbench["target"])] + _logical_target(pgbench)  # fmt: skip


def _logical_target(pgbench: dict[str, Any]) -> list[Target]:
    logical = pgbench.get("logical")
    if not logical:
        return []
    return [Target("pgbench TPC-B with logical capture (a sidecar draining) vs without, same run",
                   f">= {pgbench['target']:.2f}x",
                   f"{logical['median_ratio']:.2f}x, median of {len(logical['ratios'])} runs"
                   f" ({logical['median_tps']:,} vs {pgbench['median_tps']['untracked']:,} tps)",
                   logical["median_ratio"] >= pgbench["target"])] + _alone_target(pgbench)  # fmt: skip


def _alone_target(pgbench: dict[str, Any]) -> list[Target]:
    logical = pgbench["logical"]
    if logical.get("alone_median_ratio") is None:
        return []
    return [Target("pgbench TPC-B with logical capture, no sidecar during the run (as the trigger runs),"
                   " vs without, same run", f">= {pgbench['target']:.2f}x",
                   f"{logical['alone_median_ratio']:.2f}x, median of {len(logical['alone_ratios'])} runs"
                   f" ({logical['alone_median_tps']:,} vs {pgbench['median_tps']['untracked']:,} tps);"
                   f" decoding later: {logical['alone_median_drain_server_cpu_usec_per_transaction']} µs of"
                   " server CPU a transaction",
                   logical["alone_median_ratio"] >= pgbench["target"])]  # fmt: skip


def write(report: dict[str, Any], notes: str) -> None:
    RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
    report["targets"] = [t.__dict__ for t in targets(report["results"])]
    RESULTS_JSON.write_text(json.dumps(report, indent=2) + "\n")
    RESULTS_MD.write_text(markdown(report, notes))


def markdown(report: dict[str, Any], notes: str) -> str:
    m, v, results = report["machine"], report["versions"], report["results"]
    quiet = report["quiet"]
    lines = [
        "# cdc-sync benchmarks",
        "",
        f"`{report['command']}`, {report['date']}, {report['mode']} mode"
        + (" (smaller sizes: a smoke run, not the reference figures)" if report["mode"] == "quick" else "")
        + f", {report['seconds'] / 60:.1f} minutes.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB, {m['platform']}.",
        f"Python {v['python']}, PostgreSQL {v['postgresql']}, Redis {v['redis']}, redis-py {v['redis_py']}"
        f" (hiredis {v['hiredis']}), psycopg {v['psycopg']}, orjson {v['orjson']}, cdc-sync {v['cdc_sync']}.",
        "Servers: started by the run (`cdc.devservers`) on loopback; PostgreSQL with fsync, synchronous_commit",
        "and full_page_writes off (a benchmark of cdc-sync, not of the disk), Redis without persistence.",
        "",
        f"Quiet machine: {quiet['verdict']}. {quiet['detail']}",
        "",
        "## Targets",
        "",
        "| target | goal | this run | met |",
        "|---|---|---|---|",
    ]
    for t in report["targets"]:
        met = "yes" if t["met"] else ("no" if t["met"] is False else "n/a")
        lines.append(f"| {t['name']} | {t['goal']} | {t['figure']} | {met} |")
    lines += ["", *_sections(results), "", notes.strip(), "",
              "Every figure, with more detail: `bench/results/results.json`.", ""]  # fmt: skip
    return "\n".join(lines)


def _sections(results: dict[str, Any]) -> list[str]:
    out: list[str] = []
    drain, ceiling = results.get("drain"), results.get("ceiling")
    if drain:
        b = drain["backlog"]
        snap = drain["initial_snapshot"]
        out += [
            "## 1. End-to-end drain",
            "",
            f"{b['changes']:,} changes on {b['tables']} tables ({b['per_table']:,} each: 60% updates of 3 columns,"
            f" 30% inserts, 10% deletes, each of a different row; ten columns of int, bigint, numeric, text,"
            f" timestamptz, boolean, double, jsonb, uuid, date), committed in {b['write_seconds']}s by four"
            " `generate_series` transactions with the tracking triggers on. Before the backlog, the tables held"
            f" {b['rows_before']:,} rows, loaded into Redis by the sidecar's initial snapshot"
            f" ({snap['seconds']}s, {snap['rows_per_second']:,} rows/s for the ten tables together); that Redis"
            " state is saved, and every drain restarts redis-server on it: updates patch live documents, deletes"
            " delete live documents, inserts insert, and every change is published (checked: the partitions'"
            " `@seq` grow by exactly the backlog). Time: `cdc run --once` as a subprocess, spawn to exit"
            " (start-up included); one partition per table.",
            "",
            "| max_batch_size | changes | seconds | changes/s | sidecar CPU µs/change | Redis CPU s | PostgreSQL CPU s | peak RSS MB |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in drain["runs"]:
            s = r["server_cpu_seconds"]
            out.append(
                f"| {r['batch_size']} | {r['changes']:,} | {r['seconds']} | {r['changes_per_second']:,} |"
                f" {r['sidecar_cpu_usec_per_change']} | {s['redis']} | {s['postgres']} | {r['peak_rss_mb']} |"
            )
        out.append("")
    if ceiling:
        naive, pipelined = ceiling["naive"], ceiling["naive_pipelined"]
        ops = ceiling["ops"]
        out += [
            "## 2. Apply ceiling and naive baseline",
            "",
            f"The first {ceiling['ceiling'][0]['changes']:,} changes of the same backlog ({ops['U']:,} U,"
            f" {ops['I']:,} I, {ops['D']:,} D), read and encoded by the product's read path beforehand, then"
            " applied from memory to the same restored Redis. Ceiling: `DataManager.apply` in batches, back to"
            " back, each next batch prepared while Redis runs the one before (as the pipeline does under a"
            " backlog). Naive: per change HSET of the row (DEL for a delete) and PUBLISH, redis-py asyncio.",
            "",
            "| client | batch | changes | changes/s |",
            "|---|---:|---:|---:|",
        ]
        for c in ceiling["ceiling"]:
            out.append(
                f"| DataManager.apply (ceiling) | {c['batch_size']} | {c['changes']:,} | {c['changes_per_second']:,} |"
            )
        out.append(
            f"| naive: HSET, PUBLISH, a round trip each (baseline) | 1 | {naive['changes']:,} | {naive['changes_per_second']:,} |"
        )
        out.append(
            f"| naive, both pipelined in one round trip | 1 | {pipelined['changes']:,} | {pipelined['changes_per_second']:,} |"
        )
        out.append("")
    latency = results.get("latency")
    if latency:
        out += [
            "## 3. Latency, commit to subscriber",
            "",
            f"Inserts into one table, one transaction every {latency['tick_ms']:.0f} ms, each row stamped with"
            " `clock_timestamp()` just before COMMIT; receipt timed by a raw SUBSCRIBE in its own process; same"
            f" clock. {latency['seconds']:.0f}s per point, the first {latency['warmup']:.0f}s not counted."
            " Sidecar with default settings (max_batch_size 500, max_wait 100ms, default backoff).",
            "",
            "| offered/s | achieved/s | rows per commit | wake-up | received | p50 ms | p95 ms | p99 ms | max ms |",
            "|---:|---:|---:|---|---:|---:|---:|---:|---:|",
        ]
        for r in latency["runs"]:
            out.append(
                f"| {r['offered_per_second']:,} | {r['achieved_per_second']:,} | {r['rows_per_transaction']} |"
                f" {'NOTIFY' if r['notify'] else 'none (notify: false)'} | {r['received']:,} of {r['written']:,} |"
                f" {r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | {r['max_ms']} |"
            )
        out.append("")
    memory = results.get("memory")
    if memory:
        large, small = memory["large"], memory["small"]
        out += [
            "## 4. Memory",
            "",
            f"Peak RSS (`ru_maxrss` of the `cdc run --once` child) draining the whole backlog and its last"
            f" quarter, max_batch_size {memory['batch_size']}; RSS at 25/50/75/100% of each run from"
            " /proc samples.",
            "",
            "| backlog | peak RSS MB | RSS MB at 25/50/75/100% | seconds |",
            "|---:|---:|---|---:|",
            f"| {large['changes']:,} | {large['peak_rss_mb']} | {' / '.join(map(str, large['rss_mb_at_quarters']))} | {large['seconds']} |",
            f"| {small['changes']:,} | {small['peak_rss_mb']} | {' / '.join(map(str, small['rss_mb_at_quarters']))} | {small['seconds']} |",
            "",
        ]
    idle = results.get("idle")
    if idle:
        out += [
            "## 5. Idle cost",
            "",
            f"{idle['tables']} tracked tables of {idle['rows_per_table']} rows, `cdc run` with the default"
            " backoff `[[5, 50ms], [20, 200ms], [100, 1s], [null, 5s]]` and wake-up notifications on.",
            "",
            "| window | seconds | sidecar CPU s | % of one core | PostgreSQL xacts/s | Redis commands/s | RSS MB |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for window, label in (
            ("after_catch_up", "first after catch-up"),
            ("steady", "steady state (every backoff at 5 s)"),
        ):
            if window in idle:
                w = idle[window]
                out.append(
                    f"| {label} | {w['seconds']} | {w['cpu_seconds']} | {w['percent_of_one_core']} |"
                    f" {w['postgres_transactions_per_second']} | {w['redis_commands_per_second']} | {w['rss_mb']} |"
                )
        out.append("")
    snapshot = results.get("snapshot")
    if snapshot:
        out += [
            "## 6. Snapshot",
            "",
            f"One table of {snapshot['rows']:,} rows (the same ten columns, one partition), `cdc run --once` on an"
            " empty Redis. Rate over the snapshot's own log lines (starting to done); the whole process beside it.",
            "",
            "| rows | snapshot s | rows/s | process s | rows/s (process) | sidecar CPU µs/row | Redis CPU s | PostgreSQL CPU s | peak RSS MB |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {snapshot['rows']:,} | {snapshot['snapshot_seconds']} | {snapshot['rows_per_second']:,} |"
            f" {snapshot['process_seconds']} | {snapshot['rows_per_second_whole_process']:,} |"
            f" {snapshot['sidecar_cpu_usec_per_row']} | {snapshot['server_cpu_seconds']['redis']} |"
            f" {snapshot['server_cpu_seconds']['postgres']} | {snapshot['peak_rss_mb']} |",
            "",
        ]
    out += _issue_17_sections(results)
    return out


def _issue_17_sections(results: dict[str, Any]) -> list[str]:
    out: list[str] = []
    cpu = results.get("cpu")
    if cpu:
        side, redis = cpu["drain"], cpu["redis"]
        out += [
            "## 7. The drain's CPU against the plain commands",
            "",
            "Reference: the Redis CPU (`INFO cpu`) of the plain commands a change stands for, pipelined 2000"
            " changes at a time: HSET of its fields with `@v` and `@ts`, SADD of its index entry (a delete: its"
            " tombstone fields, SREM), INCR, XADD and PUBLISH of the message the apply published for it."
            f" Apply: `DataManager.apply` in batches of {cpu['batch_size']} over the same"
            f" {redis['changes']:,} changes of the backlog; the two interleaved, Redis restarted on the same RDB"
            " file before each. Sidecar: `cdc run --once` draining the whole backlog at max_batch_size 2000,"
            " less the same command with nothing left to drain (its fixed cost).",
            "",
            "| figure | µs/change | x reference |",
            "|---|---:|---:|",
            f"| Redis, plain commands (reference), per round | {' / '.join(map(str, redis['plain_redis_usec_per_change']))} | 1 |",
            f"| Redis, apply, per round | {' / '.join(map(str, redis['apply_redis_usec_per_change']))} | {redis['apply_vs_plain']} |",
            f"| Redis during the drain | {side['redis_usec_per_change']} | {cpu['drain_redis_vs_reference']} |",
            f"| sidecar, drain less its fixed cost ({side['fixed_cpu_seconds']} s) | {side['sidecar_usec_per_change']} | {cpu['sidecar_vs_reference']} |",
            f"| sidecar, whole process | {side['sidecar_usec_per_change_with_start']} | |",
            "",
        ]
    subscriber = results.get("subscriber")
    if subscriber:
        fast, slow = subscriber["fast"], subscriber["jsonpatch"]
        out += [
            "## 8. Subscriber",
            "",
            f"One partition's stream of {subscriber['messages']:,} messages ({subscriber['keys']:,} inserts of the"
            " drain's ten-column rows, an update of three columns of each, a delete of every tenth), read to its end"
            " by a `Subscriber` that started before it was written (`async for` over `entries()`), applying each"
            " to its replica; the same with"
            " every patch applied by `jsonpatch.apply_patch` instead; interleaved, each replica checked against"
            " Redis. CPU: the reading process's.",
            "",
            "| patches applied by | messages/s | CPU µs/message |",
            "|---|---:|---:|",
            f"| publishers.patching (fast path) | {fast['messages_per_second']:,} | {fast['cpu_usec_per_message']} |",
            f"| jsonpatch | {slow['messages_per_second']:,} | {slow['cpu_usec_per_message']} |",
        ]
        tuned = subscriber.get("fast_tuned_gc")
        if tuned:
            out.append(
                f"| publishers.patching, process tuned by `publishers.gc_tuning.tune_gc()` after the start"
                f" | {tuned['messages_per_second']:,} | {tuned['cpu_usec_per_message']} |"
            )
        out.append("")
    out += _pgbench_section(results.get("pgbench"))
    return out


def _pgbench_section(pgbench: dict[str, Any] | None) -> list[str]:
    if not pgbench:
        return []
    out = [
        "## 9. What tracking costs the source (pgbench)",
        "",
        f"pgbench's built-in TPC-B-like script, scale {pgbench['scale']}, {pgbench['clients']} clients,"
        f" {pgbench['threads']} threads, {pgbench['seconds_per_run']}s runs alternately with `cdc tracking enable`"
        f" on {', '.join(pgbench['tables'])} and without (pgbench_history has no primary key); no sidecar running."
        " Ratio: a tracked run's tps over the untracked run after it; the figure is the median pair."
        " Server CPU: the PostgreSQL process tree's, per transaction.",
        "",
        "| pair | tracked tps | untracked tps | ratio | server CPU µs/tx tracked | untracked |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    runs = pgbench["runs"]
    for number, (tracked, untracked, ratio) in enumerate(
        zip(runs[::2], runs[1::2], pgbench["ratios"], strict=True), 1
    ):
        out.append(f"| {number} | {tracked['tps']:,} | {untracked['tps']:,} | {ratio:.2f} |"
                   f" {tracked['server_cpu_usec_per_transaction']} | {untracked['server_cpu_usec_per_transaction']} |")  # fmt: skip
    cpu = pgbench["median_server_cpu_usec_per_transaction"]
    out += [
        f"| median | {pgbench['median_tps']['tracked']:,} | {pgbench['median_tps']['untracked']:,} |"
        f" {pgbench['median_ratio']:.2f} | {cpu['tracked']} | {cpu['untracked']} |",
        "",
    ]
    return out + _logical_section(pgbench)


def _logical_section(pgbench: dict[str, Any]) -> list[str]:
    logical = pgbench.get("logical")
    if not logical:
        return []
    out = [
        "Logical capture (`source.capture: logical`), run third in each triple on the same server"
        f" ({', '.join(logical['settings'])} for all three), a sidecar draining the slots during the run;"
        " ratio over the untracked run of its triple. Server CPU includes the decoding (the sidecar's backend);"
        " the sidecar's own CPU is beside it.",
        "",
        "| triple | logical tps | ratio | server CPU µs/tx | sidecar CPU µs/tx |",
        "|---:|---:|---:|---:|---:|",
    ]
    for number, (run, ratio) in enumerate(zip(logical["runs"], logical["ratios"], strict=True), 1):
        out.append(f"| {number} | {run['tps']:,} | {ratio:.2f} | {run['server_cpu_usec_per_transaction']} |"
                   f" {run['sidecar_cpu_usec_per_transaction']} |")  # fmt: skip
    out += [
        f"| median | {logical['median_tps']:,} | {logical['median_ratio']:.2f} |"
        f" {logical['median_server_cpu_usec_per_transaction']} | {logical['median_sidecar_cpu_usec_per_transaction']} |",
        "",
    ]
    return out + _alone_section(logical)


def _alone_section(logical: dict[str, Any]) -> list[str]:
    runs = [r["alone"] for r in logical["runs"] if "alone" in r]
    if not runs:
        return []
    out = [
        "The same slots, fourth in each group, with no sidecar during the run (as the trigger runs):"
        " what the writers pay. The WAL is decoded afterwards, when `cdc run --once` drains the slots;"
        " the server's and that sidecar's CPU during the drain, per transaction of the run, is the"
        " decoding's cost, which a server with a spare core pays beside the writers.",
        "",
        "| group | tps | ratio | server CPU µs/tx (run) | server CPU µs/tx (drain) | sidecar CPU µs/tx (drain) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for number, (run, ratio) in enumerate(zip(runs, logical["alone_ratios"], strict=True), 1):
        out.append(f"| {number} | {run['tps']:,} | {ratio:.2f} | {run['server_cpu_usec_per_transaction']} |"
                   f" {run['drain_server_cpu_usec_per_transaction']} | {run['drain_sidecar_cpu_usec_per_transaction']} |")  # fmt: skip
    out += [
        f"| median | {logical['alone_median_tps']:,} | {logical['alone_median_ratio']:.2f} | |"
        f" {logical['alone_median_drain_server_cpu_usec_per_transaction']} |"
        f" {logical['alone_median_drain_sidecar_cpu_usec_per_transaction']} |",
        "",
    ]
    return out
