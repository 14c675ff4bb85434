"""pgbench with logical capture (``source.capture: logical``), beside the
trigger mode's runs of ``bench.pgbench``.

Each run: ``cdc tracking enable`` in logical mode (a publication and a slot
per table), a sidecar started and its snapshots done (every table's
checkpoint streaming), then pgbench, with the sidecar draining the slots the
whole time: decoding runs in the server (in the sidecar's backend, a child
of the postmaster, so it counts in the server's CPU per transaction), and a
slot no one reads would only pile WAL up, which costs the writers nothing
until the disk fills. The sidecar's own CPU is measured too: on a small
machine it competes with pgbench for the cores, which a sidecar on another
host would not. Then the sidecar stops, ``cdc tracking disable`` drops the
slots, and the run's Redis keys go.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis

from bench.context import Context
from bench.env import Env, Sidecar, cdc, tree_cpu, write_config
from publishers.layout import Layout

# The settings logical capture needs (max_replication_slots: one slot a table).
SETTINGS = ("wal_level=logical", "max_replication_slots=20", "max_wal_senders=20")


@contextlib.contextmanager
def wal_level_logical(env: Env) -> Iterator[None]:
    """The run's PostgreSQL restarted with ``SETTINGS``, and back afterwards."""
    server = env.postgres
    before = server.settings
    server.stop()
    server.settings = (*before, *SETTINGS)
    server.start()
    try:
        yield
    finally:
        server.stop()
        server.settings = before
        server.start()


Run = Callable[[Context, int, bool], dict[str, Any]]


def run(
    ctx: Context, tables: list[dict[str, Any]], seconds: int, number: int, dsn: str, measure: Run
) -> dict[str, Any]:
    namespace = f"pgbench{number}"
    path = write_config(
        ctx.env,
        f"pgbench-logical-{number}",
        tables,
        source={"dsn": dsn, "capture": "logical"},
        redis={"namespace": namespace},
    )
    cdc("tracking", "enable", "-c", str(path))
    sidecar = Sidecar(path, once=False, name=f"pgbench-logical-{number}").start()
    try:
        _wait_streaming(ctx.env.redis_url, namespace, [t["table"] for t in tables])
        cpu_before = sidecar.cpu_seconds()
        result = measure(ctx, seconds, True)
        sidecar_cpu = sidecar.cpu_seconds() - cpu_before
        sidecar.stop()
        result["alone"] = _writers_alone(ctx, path, seconds, number, measure)
    finally:
        sidecar.kill()
        cdc("tracking", "disable", "-c", str(path), "--force")
        _forget(ctx.env.redis_url, namespace)
    result["capture"] = "logical"
    result["sidecar_draining"] = True
    result["sidecar_cpu_usec_per_transaction"] = round(sidecar_cpu / max(1, result["transactions"]) * 1e6)
    return result


def _writers_alone(ctx: Context, path: Any, seconds: int, number: int, measure: Run) -> dict[str, Any]:
    """What the writers pay with the slots in place and no sidecar reading
    them meanwhile (the trigger mode's runs have no sidecar either): the
    WAL is decoded later, when a sidecar (``cdc run --once`` here) drains the
    slots; the server's CPU during that drain, per transaction, is the
    decoding's cost, paid by the server but not by the writers' transactions."""
    result = measure(ctx, seconds, True)
    pid = ctx.env.postgres.proc.pid if ctx.env.postgres.proc else 0
    before = tree_cpu(pid)
    drain = Sidecar(path, once=True, name=f"pgbench-logical-drain-{number}").start().wait(timeout=600)
    time.sleep(0.2)  # the sidecar's backends exit, and the postmaster reaps them (their CPU)
    transactions = max(1, result["transactions"])
    result["drain_server_cpu_usec_per_transaction"] = round((tree_cpu(pid) - before) / transactions * 1e6)
    result["drain_sidecar_cpu_usec_per_transaction"] = round(drain.cpu / transactions * 1e6)
    return result


def _wait_streaming(url: str, namespace: str, tables: list[str], timeout: float = 300) -> None:
    """Until every table's snapshot is done (its checkpoint streaming)."""
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            states = [client.hget(Layout(namespace).checkpoint(t), "state") for t in tables]
            if all(state == b"streaming" for state in states):
                return
            time.sleep(0.1)  # the sidecar's progress, in another process: polled
        raise TimeoutError(f"the sidecar did not finish its snapshots of {tables} within {timeout:.0f}s")
    finally:
        client.close()


def _forget(url: str, namespace: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=f"{namespace}:*", count=10_000):
            client.unlink(key)
    finally:
        client.close()


def summary(runs: list[dict[str, Any]], untracked: list[dict[str, Any]]) -> dict[str, Any]:
    """Each logical run over the untracked run of its triple, and the medians."""
    ratios = [r["tps"] / max(1, u["tps"]) for r, u in zip(runs, untracked, strict=True)]
    alone = [r["alone"] for r in runs if "alone" in r]
    alone_ratios = [a["tps"] / max(1, u["tps"]) for a, u in zip(alone, untracked, strict=False)]
    return {
        "alone_ratios": [round(r, 3) for r in alone_ratios],
        "alone_median_ratio": round(statistics.median(alone_ratios), 3) if alone_ratios else None,
        "alone_median_tps": round(statistics.median(a["tps"] for a in alone)) if alone else None,
        "alone_median_drain_server_cpu_usec_per_transaction": _median(
            alone, "drain_server_cpu_usec_per_transaction"
        ),
        "alone_median_drain_sidecar_cpu_usec_per_transaction": _median(
            alone, "drain_sidecar_cpu_usec_per_transaction"
        ),
        "settings": list(SETTINGS),
        "sidecar_draining": True,
        "runs": runs,
        "ratios": [round(r, 3) for r in ratios],
        "median_ratio": round(statistics.median(ratios), 3),
        "median_tps": round(statistics.median(r["tps"] for r in runs)),
        "median_server_cpu_usec_per_transaction": round(
            statistics.median(r["server_cpu_usec_per_transaction"] for r in runs)
        ),
        "median_sidecar_cpu_usec_per_transaction": round(
            statistics.median(r["sidecar_cpu_usec_per_transaction"] for r in runs)
        ),
    }


def _median(runs: list[dict[str, Any]], field: str) -> int | None:
    return round(statistics.median(r[field] for r in runs)) if runs else None
