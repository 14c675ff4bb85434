"""What the demo's screen shows, as plain data: one ``View`` per redraw.

``cdc.demo.watch`` fills it from the running demo; ``cdc.demo.screen``
renders it, as a pure function of it, so the rendering has unit tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Header:
    """Start-up information, kept on screen for the whole run."""

    config_path: str  # as the user types it from where the demo was started
    dsn: str  # password masked
    redis_url: str  # password masked
    cdc: str  # the command that runs this cdc (e.g. .venv/bin/cdc)
    psql: str  # the psql to try an update with
    featured: str  # the row the writer keeps updating, e.g. "demo.stations id=7"
    update_sql: str  # an update of it the user can run


@dataclass(frozen=True)
class SidecarView:
    name: str  # A, B, C...
    pid: int | None
    alive: bool
    health_url: str  # http://127.0.0.1:PORT
    ready: int | None = None  # /readyz status code, None while unreachable
    tables: tuple[str, ...] = ()  # the tables whose lease it holds


@dataclass(frozen=True)
class TableView:
    table: str
    state: (
        str  # the lease holder's state:<table> (heartbeat); starting, orphaned, no owner (watch.holding_of)
    )
    rate: float  # changes/s published, as the subscribers received them (last 5 s)
    lag_seconds: float | None  # the owner's cdc_lag_seconds
    snapshot: str  # "12/250" while a snapshot runs, "done" once streaming, "-" before
    pg_rows: int | None
    redis_docs: int | None
    replica_docs: int


@dataclass(frozen=True)
class PartitionView:
    partition: str
    seq: int  # the replica's seq
    docs: int  # documents in the replica
    reloads: int  # how often the subscriber had to reload (0: every message arrived in order)


@dataclass(frozen=True)
class MessageView:
    seq: int
    partition: str
    section: str
    key: str
    op: str  # I U D S
    patch: list[dict[str, Any]]


@dataclass(frozen=True)
class RowView:
    """The featured row in the three places it lives."""

    postgres: dict[str, Any] | None  # column -> value, as psycopg reads it
    redis: dict[str, str] | None  # HGETALL: field -> JSON text (with @v, @ts)
    replica: dict[str, Any] | None  # the subscriber's document


@dataclass(frozen=True)
class View:
    header: Header
    sidecars: list[SidecarView] = field(default_factory=list)
    tables: list[TableView] = field(default_factory=list)
    partitions: list[PartitionView] = field(default_factory=list)
    messages: list[MessageView] = field(default_factory=list)  # oldest first
    row: RowView | None = None
    events: list[str] = field(default_factory=list)  # oldest first: kills, take-overs
    elapsed: float = 0.0
    keys: bool = True  # whether keys are read (a terminal): the footer offers them
