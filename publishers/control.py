"""Operational state in Redis beside the data: workers' heartbeats, snapshot
requests and progress (fields of the checkpoint hash), and what ``cdc
doctor`` checks on the Redis side.

Checkpoint hash fields besides DESIGN.md's ``version``/``updated_at``/``state``:
``snapshot_requested`` (set by ``cdc snapshot`` for the owning sidecar to act
on, or by a sidecar that saw a failover: ``FAILOVER_REQUEST``), ``snapshot_rows`` and ``snapshot_total`` (progress of a running snapshot).

Heartbeat fields read here (``ns:@worker:id``, written whole by the sidecar):
``heartbeat_at`` (its clock, seconds), ``tables``, and per table it runs
``state:<table>`` and, while the table is degraded, ``error:<table>``.

Every function maps redis-py errors onto ``publishers.errors`` (``RedisUnavailable``
for what may pass), like the data manager: the daemon calls them from loops
that retry ``TransientError`` and must not die of a raw ``ConnectionError``
while Redis restarts.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from publishers import redis_calls, redis_checks, scripts
from publishers.manager import DataManager
from publishers.model import Finding

REQUEST_FIELD = "snapshot_requested"

P = ParamSpec("P")
T = TypeVar("T")


def _translated(
    fn: Callable[Concatenate[DataManager, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[DataManager, P], Coroutine[Any, Any, T]]:
    """Run ``fn`` through ``redis_calls.call``: its driver errors mapped at this
    adapter boundary, and never abandoned half-way when cancelled (a tracker
    that loses its lease is cancelled wherever it is)."""

    @functools.wraps(fn)
    async def wrapper(manager: DataManager, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await redis_calls.call(fn(manager, *args, **kwargs), manager.config.url)

    return wrapper


# The worker registry ``ns:@workers`` (lua/register_worker.lua,
# lua/live_workers.lua): id -> when its heartbeat expires, in Redis's own clock.


@_translated
async def live_workers(manager: DataManager) -> set[str]:
    """The ids of the workers whose registration has not expired."""
    return await _live_ids(manager)


async def _live_ids(manager: DataManager) -> set[str]:
    live = await scripts.run(
        manager.client, scripts.LIVE_WORKERS, [manager.layout.workers()], [], manager.config.url
    )
    return {redis_calls.text(worker_id) for worker_id in live}


@_translated
async def workers(manager: DataManager) -> list[dict[str, str]]:
    """Every live worker's heartbeat, with its id and the heartbeat's age."""
    ids = sorted(await _live_ids(manager))
    if not ids:
        return []
    pipe = manager.client.pipeline(transaction=False)
    for worker_id in ids:
        pipe.hgetall(manager.layout.worker(worker_id))
    out = []
    for worker_id, heartbeat in zip(ids, await pipe.execute(), strict=True):
        fields = {redis_calls.text(k): redis_calls.text(v) for k, v in heartbeat.items()}
        if not fields:
            continue  # registered, but its heartbeat is gone (expired a moment ago)
        fields["id"] = worker_id
        beat = fields.get("heartbeat_at")
        fields["age"] = f"{time.time() - float(beat):.1f}" if beat else ""
        out.append(fields)
    return out


@_translated
async def remove_heartbeat(manager: DataManager, worker_id: str) -> None:
    """A worker that stops cleanly says so at once instead of letting its heartbeat expire."""
    await manager.client.delete(manager.layout.worker(worker_id))
    await _register(manager, worker_id, "0")


@_translated
async def keep_alive(manager: DataManager, worker_id: str, ttl: float) -> bool:
    """Give the worker's heartbeat and its registration ``ttl`` seconds more;
    False when the heartbeat is gone (expired, or Redis lost it): write a
    whole heartbeat then.

    Sidecars count each other by their registrations to share the tables. A
    sidecar refreshes its own at every lease renewal with the lease TTL, so a
    dead one stops being counted when its leases run out, not a heartbeat TTL
    later: until then the survivors' fair share would leave its tables unowned."""
    ttl_ms = max(1, round(ttl * 1000))
    # Side by side, one round trip as the pipeline of EVALs was (a cluster's
    # pipelines refuse EVALSHA); the two keys do not depend on each other.
    expire = manager.client.pexpire(manager.layout.worker(worker_id), ttl_ms)
    alive, _ = await asyncio.gather(expire, _register(manager, worker_id, str(ttl_ms)))
    return bool(alive)


async def _register(manager: DataManager, worker_id: str, ttl_ms: str) -> None:
    """Register the worker for ``ttl_ms`` more ms ("0": remove it)."""
    keys, args = [manager.layout.workers()], [worker_id, ttl_ms]
    await scripts.run(manager.client, scripts.REGISTER_WORKER, keys, args, manager.config.url)


@_translated
async def worker_alive(manager: DataManager, worker_id: str) -> bool:
    return bool(await manager.client.exists(manager.layout.worker(worker_id)))


@_translated
async def table_owners(manager: DataManager, tables: list[str]) -> dict[str, str]:
    """table -> id of the sidecar holding its lease (tables nobody holds are absent)."""
    holders = zip(tables, await _lease_holders(manager, tables), strict=True)
    return {table: holder for table, holder in holders if holder is not None}


@dataclass(frozen=True)
class Ownership:
    """Who holds a table's lease, and what that holder's heartbeat says of the
    table. ``alive`` is False when the holder has no heartbeat: a sidecar that
    died (its lease runs out soon) or a holder that is not a sidecar (``cdc
    snapshot``); ``state``, ``error`` and ``seen_ago`` are None then."""

    owner: str
    alive: bool
    seen_ago: float | None = None  # seconds since the holder's last heartbeat
    state: str | None = None  # the heartbeat's ``state:<table>``
    error: str | None = None  # the heartbeat's ``error:<table>`` (set while degraded)


@_translated
async def ownership(manager: DataManager, tables: Sequence[str]) -> dict[str, Ownership]:
    """table -> its lease holder and that holder's view of it (tables nobody
    holds are absent); two round trips whatever the number of tables."""
    holders = dict(zip(tables, await _lease_holders(manager, tables), strict=True))
    heartbeats = await _heartbeats(manager, sorted({h for h in holders.values() if h is not None}))
    out = {}
    for table, holder in holders.items():
        if holder is None:
            continue
        fields = heartbeats.get(holder, {})
        if not fields:
            out[table] = Ownership(holder, alive=False)
            continue
        beat = fields.get("heartbeat_at")
        out[table] = Ownership(
            holder,
            alive=True,
            seen_ago=max(0.0, time.time() - float(beat)) if beat else None,
            state=fields.get(f"state:{table}"),
            error=fields.get(f"error:{table}") or None,
        )
    return out


async def _lease_holders(manager: DataManager, tables: Sequence[str]) -> list[str | None]:
    if not tables:
        return []
    pipe = manager.client.pipeline(transaction=False)
    for table in tables:
        pipe.get(manager.layout.lease(table))
    return [None if holder is None else redis_calls.text(holder) for holder in await pipe.execute()]


async def _heartbeats(manager: DataManager, worker_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """worker id -> its heartbeat's fields (empty: no heartbeat)."""
    if not worker_ids:
        return {}
    pipe = manager.client.pipeline(transaction=False)
    for worker_id in worker_ids:
        pipe.hgetall(manager.layout.worker(worker_id))
    replies = await pipe.execute()
    return {
        worker_id: {redis_calls.text(k): redis_calls.text(v) for k, v in heartbeat.items()}
        for worker_id, heartbeat in zip(worker_ids, replies, strict=True)
    }


@_translated
async def epoch(manager: DataManager) -> str:
    """The id of this Redis data set (``ns:@epoch``), created when absent.

    A Redis that restarts empty (no persistence, a wiped replica promoted)
    loses it with everything else: a sidecar that finds a different epoch than
    the one it started with knows its documents and checkpoints are gone and
    re-snapshots its tables. Read first, written only when missing: this runs
    every lease round, and a Redis out of memory refuses every SET (NX or not)
    while the leases must still be renewed."""
    key = f"{manager.layout.namespace}:@epoch"
    current = await manager.client.get(key)
    if current is None:
        await manager.client.set(key, uuid.uuid4().hex, nx=True)
        current = await manager.client.get(key)
    return redis_calls.text(current)


@_translated
async def request_snapshot(manager: DataManager, table: str) -> None:
    """Ask the table's owner for a snapshot (``cdc snapshot``). A failover's
    request there stays: the whole snapshot it asks for, from the start,
    serves this one too, where this one (a key range, say) would not serve it."""
    key = manager.layout.checkpoint(table)
    current = await manager.client.hget(key, REQUEST_FIELD)
    if current is None or not redis_calls.text(current).startswith(FAILOVER_REQUEST):
        await manager.client.hset(key, REQUEST_FIELD, str(time.time()))


# A request written by a sidecar that saw Redis fail over without
# ``redis.durability`` (``FAILOVER_REQUEST`` and a time): whoever owns the table
# next snapshots it whole and starts over, even if it was not running it when
# the failover happened (its checkpoint may be ahead of documents the failover lost).
FAILOVER_REQUEST = "failover"


@_translated
async def request_failover_snapshots(manager: DataManager, tables: Sequence[str]) -> None:
    """Ask whoever owns each of ``tables`` for a failover's snapshot. One
    already there stays (two sidecars that see one failover ask once); a
    ``cdc snapshot`` request is replaced: the whole snapshot serves it too."""
    if not tables:
        return
    requests = await snapshot_requests(manager, tables)
    value = f"{FAILOVER_REQUEST} {time.time()}"
    for table in tables:
        if not requests.get(table, "").startswith(FAILOVER_REQUEST):
            await manager.client.hset(manager.layout.checkpoint(table), REQUEST_FIELD, value)


@_translated
async def snapshot_requested(manager: DataManager, table: str) -> bool:
    return bool(await manager.client.hexists(manager.layout.checkpoint(table), REQUEST_FIELD))


@_translated
async def snapshot_request(manager: DataManager, table: str) -> str | None:
    """The table's stored request (its text), or None."""
    raw = await manager.client.hget(manager.layout.checkpoint(table), REQUEST_FIELD)
    return None if raw is None else redis_calls.text(raw)


@_translated
async def snapshot_requests(manager: DataManager, tables: Sequence[str]) -> dict[str, str]:
    """The stored requests of those of ``tables`` that have one, in one round trip."""
    if not tables:
        return {}
    pipe = manager.client.pipeline(transaction=False)
    for table in tables:
        pipe.hget(manager.layout.checkpoint(table), REQUEST_FIELD)
    replies = await pipe.execute()
    return {
        table: redis_calls.text(raw) for table, raw in zip(tables, replies, strict=True) if raw is not None
    }


async def clear_snapshot_request(manager: DataManager, table: str, served: str | None = None) -> None:
    """Remove the table's request: the one ``served`` (its text) only, so
    that one made while that snapshot ran is not lost; any (None)."""
    await clear_field(manager, table, REQUEST_FIELD, served)


@_translated
async def clear_field(manager: DataManager, table: str, field: str, served: str | bytes | None) -> None:
    """Remove a field of the table's checkpoint hash; with ``served``, only
    while it still holds that value (``field_clear.lua``)."""
    key = manager.layout.checkpoint(table)
    if served is None:
        await manager.client.hdel(key, field)
    else:
        await scripts.run(manager.client, scripts.FIELD_CLEAR, [key], [field, served], manager.config.url)


@_translated
async def table_shape(manager: DataManager, table: str) -> str | None:
    """The shape (an opaque text the daemon compares) the table's documents
    were last written in; None when none was recorded."""
    raw = await manager.client.hget(manager.layout.checkpoint(table), "shape")
    return None if raw is None else redis_calls.text(raw)


@_translated
async def set_table_shape(manager: DataManager, table: str, shape: str) -> None:
    await manager.client.hset(manager.layout.checkpoint(table), "shape", shape)


@_translated
async def set_snapshot_progress(manager: DataManager, table: str, rows: int, total: int | None) -> None:
    mapping = {"snapshot_rows": str(rows), "snapshot_total": "" if total is None else str(total)}
    await manager.client.hset(manager.layout.checkpoint(table), mapping=mapping)  # type: ignore[arg-type]


@_translated
async def snapshot_progress(manager: DataManager, table: str) -> dict[str, str] | None:
    raw = await manager.client.hmget(
        manager.layout.checkpoint(table), ["state", "snapshot_rows", "snapshot_total"]
    )
    state, rows, total = (None if v is None else redis_calls.text(v) for v in raw)
    if state != "snapshotting" or rows is None:
        return None
    return {"rows": rows, "total": total or "?"}


@_translated
async def primary_problems(manager: DataManager) -> list[str]:
    """Each node the sidecar would write to that is a replica, in words (``redis_checks``)."""
    return await redis_checks.primary_problems(manager)


@_translated
async def durability_problems(manager: DataManager) -> list[str]:
    """Each primary with fewer replicas online than ``redis.durability`` waits for (``redis_checks``)."""
    return await redis_checks.durability_problems(manager)


@_translated
async def doctor(manager: DataManager) -> list[Finding]:
    """What will go wrong on the Redis side: a replica as the target, too few
    replicas for ``redis.durability``, commands the ACL user may not run
    (``redis_checks``), eviction, memory, version."""
    findings = []
    info = await manager.client.info("server")
    version = redis_calls.text(info.get("redis_version", "?")) if isinstance(info, dict) else "?"
    findings.append(Finding("ok", "redis", f"Redis {version} reachable"))
    findings += await redis_checks.primary_findings(manager)
    findings += await redis_checks.durability_findings(manager)
    findings += await redis_checks.acl_findings(manager)
    policy = await manager.client.config_get("maxmemory-policy")
    value = redis_calls.text(next(iter(policy.values()), "noeviction")) if policy else "noeviction"
    if value != "noeviction":
        findings.append(
            Finding(
                "warning",
                "redis maxmemory-policy",
                f"is {value}: Redis may evict documents, seq counters or checkpoints silently; "
                "set maxmemory-policy noeviction",
            )
        )
    else:
        findings.append(Finding("ok", "redis maxmemory-policy", "noeviction"))
    memory = await manager.client.info("memory")
    used, limit = int(memory.get("used_memory", 0)), int(memory.get("maxmemory", 0))
    if limit and used > 0.9 * limit:
        findings.append(Finding("warning", "redis memory", f"{used} of maxmemory {limit} bytes used (>90%)"))
    return findings
