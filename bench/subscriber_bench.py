"""Benchmark 8: how fast the subscriber client keeps its replica, from a
prepared stream, against ``jsonpatch`` in the same run.

One partition's stream is written by ``DataManager.apply``: an insert of each
of ``keys`` rows (the drain's ten columns, encoded by ``cdc.values``), an
update of three columns of each, then a delete of every tenth: the three
patch shapes the publisher emits. Then a ``Subscriber`` that had loaded the
partition before those writes (seq 0, no documents) reads the stream to its
end, applying every message to its replica: messages/s (wall) and CPU µs a
message (the process's, while it reads). The same is done by a subscriber
whose patches go through ``jsonpatch.apply_patch`` instead (the slow path
the fast one is measured against), interleaved: fast, jsonpatch, fast,
jsonpatch; and the fast one again in a process tuned as
``publishers.gc_tuning`` tells an application holding a replica. Each run's
replica is checked against the documents in Redis.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import time
import uuid
from decimal import Decimal
from typing import Any

import jsonpatch

from bench.context import Context
from cdc.config import RedisConfig
from cdc.values import RawJson, encode_value
from publishers.connection import close_client, connect
from publishers.gc_tuning import tune_gc
from publishers.manager import DataManager
from publishers.model import Change
from publishers.replica_load import Replica
from publishers.subscriber import Subscriber

NAMESPACE = "subbench"
PARTITION, SECTION, TABLE = "p1", "rows", "bench.rows"
ROUNDS = 2
DEFAULT_GC_THRESHOLDS = (700, 10, 10)  # CPython's, restored after a tuned run


def row(g: int, version: int) -> dict[str, bytes]:
    """The drain benchmark's ten columns (bench.workload.ROW_VALUES), encoded."""
    values: dict[str, Any] = {
        "id": g,
        "big": 9007199254740993 + g * 1000003,
        "amount": Decimal(g % 100000) / 100 + version,
        "name": f"item {g} {uuid.uuid5(uuid.NAMESPACE_OID, str(g)).hex}",
        "updated_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=g, hours=version),
        "active": g % 3 == 0,
        "ratio": g / 7.0 * 1.5**version,
        "attrs": RawJson(b'{"k": %d, "n": %d, "tags": ["red", "green"]}' % (g, g % 10)),
        "ref": uuid.uuid5(uuid.NAMESPACE_URL, str(g)),
        "day": dt.date(2026, 1, 1) + dt.timedelta(days=g % 365),
    }
    return {column: encode_value(value, column) for column, value in values.items()}


def changes(keys: int) -> list[Change]:
    """Inserts, updates of three columns, deletes of every tenth row."""
    out = [Change(TABLE, PARTITION, SECTION, str(g), "I", g, row(g, 0)) for g in range(1, keys + 1)]
    out += [Change(TABLE, PARTITION, SECTION, str(g), "U", keys + g, row(g, 1)) for g in range(1, keys + 1)]
    out += [
        Change(TABLE, PARTITION, SECTION, str(g), "D", 2 * keys + g, None) for g in range(10, keys + 1, 10)
    ]
    return out


class _FromStart(Subscriber):
    """A subscriber that loaded the partition before the stream was written:
    seq 0, no documents (what ``start`` would have found then)."""

    async def _load(self) -> None:
        self.seq, self._last, self.replica = 0, None, {}


class _Jsonpatch(_FromStart):
    """The same, with every patch applied by ``jsonpatch`` (in place, as the
    replica is)."""

    def _apply(self, section: str, key: str, patch: list[dict[str, Any]]) -> None:
        docs = self.replica.setdefault(section, {})
        document = jsonpatch.apply_patch(docs.get(key), patch, in_place=True)
        if document is None:
            docs.pop(key, None)
        else:
            docs[key] = document


async def _follow(
    config: RedisConfig, kind: type[_FromStart], last: int, *, tuned: bool = False
) -> tuple[float, float, Replica]:
    """Read the stream to seq ``last`` as an application does (``async for``
    over ``entries()``): (seconds, CPU seconds, the replica). ``tuned``: with
    ``publishers.gc_tuning.tune_gc()`` called after the start, as its
    docstring tells an application holding a replica (undone afterwards)."""
    client = await connect(config)
    try:
        subscriber = kind(client, NAMESPACE, PARTITION, count=1000)
        await subscriber.start()
        if tuned:
            tune_gc()
        started, cpu = time.perf_counter(), time.process_time()
        async for entry in subscriber.entries():
            if entry.seq >= last:
                break
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        if subscriber.reloads:
            raise RuntimeError(
                f"{kind.__name__} reloaded {subscriber.reloads} time(s): a patch did not apply"
            )
        return seconds, cpu, subscriber.replica
    finally:
        if tuned:
            gc.unfreeze()
            gc.set_threshold(*DEFAULT_GC_THRESHOLDS)
        await close_client(client)


async def _prepare(config: RedisConfig, keys: int) -> tuple[int, Replica]:
    """Write the stream; the partition's last seq and its documents."""
    manager = await DataManager.connect(config)
    try:
        await manager.client.flushall()
        written = changes(keys)
        for start in range(0, len(written), 1000):
            await manager.apply(written[start : start + 1000])
        last = int(await manager.client.get(manager.layout.seq(PARTITION)) or 0)
    finally:
        await manager.close()
    client = await connect(config)
    try:
        loaded = Subscriber(client, NAMESPACE, PARTITION)
        await loaded.start()
        return last, loaded.replica
    finally:
        await close_client(client)


def run_subscriber(ctx: Context) -> dict[str, Any]:
    keys = ctx.sizes.ceiling_changes // 4
    config = RedisConfig(url=ctx.env.redis_url, namespace=NAMESPACE, stream_max_len=10 * keys)
    last, expected = asyncio.run(_prepare(config, keys))
    variants = {
        "fast": (_FromStart, False),
        "jsonpatch": (_Jsonpatch, False),
        "fast_tuned_gc": (_FromStart, True),
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, (kind, tuned) in variants.items():
            seconds, cpu, replica = asyncio.run(_follow(config, kind, last, tuned=tuned))
            if replica != expected:
                raise RuntimeError(f"the {name} subscriber's replica differs from the documents in Redis")
            runs[name].append((seconds, cpu))
    figures = {
        name: {
            "messages_per_second": round(last * ROUNDS / sum(s for s, _ in found)),
            "cpu_usec_per_message": round(sum(c for _, c in found) * 1e6 / (last * ROUNDS), 1),
        }
        for name, found in runs.items()
    }
    fast, slow = figures["fast"]["messages_per_second"], figures["jsonpatch"]["messages_per_second"]
    tuned = figures["fast_tuned_gc"]["messages_per_second"]
    print(
        f"  subscriber: {fast:,} messages/s ({slow:,}/s with jsonpatch: {fast / slow:.2f}x;"
        f" {tuned:,}/s with tune_gc)",
        flush=True,
    )
    return {"messages": last, "keys": keys, **figures, "fast_vs_jsonpatch": round(fast / slow, 2)}
