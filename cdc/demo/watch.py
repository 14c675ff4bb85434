"""What the demo watches: a subscriber per partition (its replica and its
messages), what ``cdc status`` reads from Redis, each sidecar's ``/readyz``
and ``/metrics``, and PostgreSQL; ``view()`` puts them in one ``View``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from cdc import status_cmd
from cdc.config import Config
from cdc.demo.database import FEATURED_ID, FEATURED_TABLE, SECTIONS, TABLES, Reader
from cdc.demo.sidecars import Sidecars, worker_pid
from cdc.demo.view import Header, MessageView, PartitionView, RowView, SidecarView, TableView, View
from cdc.sources import make_source
from publishers.manager import DataManager
from publishers.subscriber import Subscriber

RATE_WINDOW = 5.0  # seconds over which changes/s is counted
KEPT_MESSAGES = 200
HTTP_TIMEOUT = 1.0


class Watcher:
    """Follows every partition of the demo and reads everything the screen shows."""

    def __init__(self, config: Config, header: Header, sidecars: Sidecars, reader: Reader) -> None:
        self.config, self.header, self.sidecars, self.reader = config, header, sidecars, reader
        self.subscribers: dict[str, Subscriber] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.messages: deque[MessageView] = deque(maxlen=KEPT_MESSAGES)
        self._arrivals: dict[str, deque[float]] = {t.table: deque() for t in TABLES}
        self.events: list[str] = []
        self._owners: dict[str, str | None] = {}  # table -> the name of the sidecar last seen streaming it
        self.killed_at: dict[str, float] = {}  # sidecar name -> when the demo killed it (monotonic)
        self.manager: DataManager | None = None
        self.source = make_source(config.source)
        self.started = time.monotonic()

    async def start(self) -> None:
        self.manager = await DataManager.connect(self.config.redis)
        await self.source.connect()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for subscriber in self.subscribers.values():
            await subscriber.aclose()
        await self.source.close()
        if self.manager is not None:
            await self.manager.close()

    def owner_of(self, table: str) -> str | None:
        """The name of the sidecar last seen streaming ``table``."""
        return self._owners.get(table)

    def event(self, text: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {text}")

    # -- subscribers ---------------------------------------------------------------

    async def follow_new_partitions(self) -> None:
        """A subscriber for each partition not followed yet (``ns:@partitions:section``)."""
        for partition in sorted(await self._partitions() - set(self.subscribers)):
            subscriber = Subscriber(self.config.redis, self.config.redis.namespace, partition)
            await subscriber.start()  # the replica is loaded before the first message is read
            self.subscribers[partition] = subscriber
            self._tasks.append(asyncio.create_task(self._follow(subscriber)))

    async def _partitions(self) -> set[str]:
        client = self._manager().client
        found: set[str] = set()
        for section in SECTIONS:
            members = await client.smembers(self._manager().layout.partitions(section))
            found |= {m.decode() if isinstance(m, bytes) else str(m) for m in members}
        return found

    async def _follow(self, subscriber: Subscriber) -> None:
        async for message in subscriber:
            self.messages.append(
                MessageView(
                    seq=message["seq"],
                    partition=message["partition"],
                    section=message["section"],
                    key=message["key"],
                    op=message["op"],
                    patch=message.get("patch", []),
                )
            )
            arrivals = self._arrivals.setdefault(message.get("table", ""), deque())
            arrivals.append(time.monotonic())

    async def caught_up(self) -> bool:
        """Whether every subscriber has read its partition's ``@seq``."""
        client = self._manager().client
        for partition, subscriber in self.subscribers.items():
            seq = await client.get(self._manager().layout.seq(partition))
            if subscriber.seq < int(seq or 0):
                return False
        return True

    def replicas(self) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
        return {partition: s.replica for partition, s in self.subscribers.items()}

    # -- the view ------------------------------------------------------------------

    async def view(self, *, keys: bool) -> View:
        row = await self._row()  # first: a change in flight shows PostgreSQL ahead, never behind
        status = await self._status()
        # One read of the leases decides the table's state, the sidecar that
        # owns it and the "moved" event alike: the screen never says a table
        # moved to C while C is listed as standby and the table as orphaned.
        holdings = {entry["table"]: self._holding(entry) for entry in status["tables"]}
        self._note_owners(holdings)
        sidecars, lags = await self._sidecars(holdings)
        return View(
            header=self.header,
            sidecars=sidecars,
            tables=await self._tables(status, holdings, lags),
            partitions=self._partition_views(),
            messages=list(self.messages),
            row=row,
            events=list(self.events),
            elapsed=time.monotonic() - self.started,
            keys=keys,
        )

    async def _status(self) -> dict[str, Any]:
        """What ``cdc status --json`` prints (``cdc.status_cmd.gather``)."""
        try:
            version: int | None = await self.source.current_version()
        except Exception:  # the screen says "?" (status_cmd's source column); the demo goes on
            version = None
        source = status_cmd.SourceView(self.config.source.kind, version, None)
        return await status_cmd.gather(self.config, self._manager(), source)

    async def _sidecars(self, holdings: dict[str, Holding]) -> tuple[list[SidecarView], dict[str, float]]:
        """Each sidecar with its readiness and tables; the owners' lag per table."""
        views, lags = [], {}
        for sidecar in self.sidecars.all:
            tables = tuple(table for table, holding in holdings.items() if holding.owner == sidecar.name)
            ready = None
            if sidecar.alive:
                ready, _ = await http_get(sidecar.port, "/readyz")
                lags.update({t: v for t, v in (await self._lags(sidecar.port)).items() if t in tables})
            views.append(
                SidecarView(sidecar.name, sidecar.pid, sidecar.alive, sidecar.health_url, ready, tables)
            )
        return views, lags

    def _note_owners(self, holdings: dict[str, Holding]) -> None:
        """An event each time a table changes hands."""
        for table, holding in holdings.items():
            before = self._owners.get(table)
            if holding.owner is not None and before is not None and holding.owner != before:
                killed = self.killed_at.get(before)
                since = f", {time.monotonic() - killed:.1f}s after {before} was killed" if killed else ""
                self.event(f"{table} moved from sidecar {before} to {holding.owner}{since}")
            if holding.owner is not None:
                self._owners[table] = holding.owner

    def _holding(self, entry: dict[str, Any]) -> Holding:
        """Who holds the table's lease (``cdc status``'s ``owner``) and its state."""
        pid = worker_pid(entry["owner"]) if entry["owner"] else None
        sidecar = self.sidecars.by_pid(pid) if pid is not None else None
        ours = (sidecar.name, sidecar.alive) if sidecar is not None else None
        return holding_of(entry["owner"], entry["worker_state"], ours)

    async def _lags(self, port: int) -> dict[str, float]:
        code, body = await http_get(port, "/metrics")
        if code != 200:
            return {}
        lags = {}
        for family in text_string_to_metric_families(body.decode("utf-8", "replace")):
            if family.name == "cdc_lag_seconds":
                lags.update({s.labels["table"]: float(s.value) for s in family.samples})
        return lags

    async def _tables(
        self, status: dict[str, Any], holdings: dict[str, Holding], lags: dict[str, float]
    ) -> list[TableView]:
        counts = await self.reader.counts()
        docs = await self._redis_documents()
        now = time.monotonic()
        views = []
        for table, entry in zip(TABLES, status["tables"], strict=True):
            arrivals = self._arrivals[table.table]
            while arrivals and arrivals[0] < now - RATE_WINDOW:
                arrivals.popleft()
            window = min(RATE_WINDOW, max(now - self.started, 0.001))
            replica = sum(len(s.replica.get(table.section, {})) for s in self.subscribers.values())
            views.append(
                TableView(
                    table=table.table,
                    state=holdings[table.table].state,
                    rate=len(arrivals) / window,
                    lag_seconds=lags.get(table.table),
                    snapshot=snapshot_text(entry),
                    pg_rows=counts.get(table.table),
                    redis_docs=docs.get(table.section),
                    replica_docs=replica,
                )
            )
        return views

    async def _redis_documents(self) -> dict[str, int]:
        """Documents per section: the sizes of its partitions' indexes."""
        manager = self._manager()
        out = {}
        for section in SECTIONS:
            members = await manager.client.smembers(manager.layout.partitions(section))
            total = 0
            for member in members:
                partition = member.decode() if isinstance(member, bytes) else str(member)
                total += int(await manager.client.scard(manager.layout.index(partition, section)))
            out[section] = total
        return out

    def _partition_views(self) -> list[PartitionView]:
        return [
            PartitionView(p, s.seq, sum(len(d) for d in s.replica.values()), s.reloads)
            for p, s in sorted(self.subscribers.items())
        ]

    async def _row(self) -> RowView:
        """The featured row: the replica first, then Redis, then PostgreSQL, so
        that a change in flight is seen where it has arrived and ahead of that."""
        subscriber = self.subscribers.get("grid")
        replica = (
            subscriber.replica.get(FEATURED_TABLE.section, {}).get(str(FEATURED_ID)) if subscriber else None
        )
        manager = self._manager()
        key = manager.layout.document("grid", FEATURED_TABLE.section, str(FEATURED_ID))
        raw = await manager.client.hgetall(key)
        redis = {_text(k): _text(v) for k, v in raw.items()} or None
        return RowView(
            postgres=await self.reader.featured(), redis=redis, replica=dict(replica) if replica else None
        )

    def _manager(self) -> DataManager:
        if self.manager is None:
            raise RuntimeError("the watcher is not started")
        return self.manager


@dataclass(frozen=True)
class Holding:
    """A table's owner on the screen and its state, from one read of its lease."""

    owner: str | None  # the demo's live sidecar holding the lease; None: none of them
    state: str


STARTING = "starting"  # the owner's own word (cdc.table_gauges) for a table it has not reported yet


def holding_of(holder: str | None, worker_state: str | None, ours: tuple[str, bool] | None) -> Holding:
    """The screen's owner and state of a table, from its lease ``holder`` (a
    worker id), that holder's heartbeat ``worker_state`` for it, and
    ``ours``: (name, alive) when the holder is one of the demo's sidecars.

    A live sidecar of ours that holds the lease owns the table from that
    moment, the moment the "moved" event names it: its heartbeat (every
    ``heartbeat``) reports the table a little later, and until it does the
    table is ``starting``. A dead one's lease is ``orphaned`` until it runs
    out (its heartbeat may outlive it by up to lease_ttl: the demo knows whom
    it killed). A holder that is not ours (a sidecar the user started with
    the demo's config) is shown by its heartbeat."""
    if holder is None:
        return Holding(None, "no owner")
    if ours is None:
        return Holding(None, worker_state or "orphaned")
    name, alive = ours
    if not alive:
        return Holding(None, "orphaned")
    return Holding(name, worker_state or STARTING)


def snapshot_text(entry: dict[str, Any]) -> str:
    snapshot = entry.get("snapshot")
    if snapshot:
        total = snapshot.get("total")
        return f"{snapshot['rows']}/{total if total is not None else '?'}"
    return "done" if entry.get("state") == "streaming" else "-"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


async def http_get(port: int, path: str) -> tuple[int | None, bytes]:
    """GET ``path`` from the health server on 127.0.0.1:``port``: (status, body); (None, b"") if unreachable."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), HTTP_TIMEOUT)
    except (OSError, TimeoutError):
        return None, b""
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), HTTP_TIMEOUT)
    except (OSError, TimeoutError):
        return None, b""
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    return (int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None), body
