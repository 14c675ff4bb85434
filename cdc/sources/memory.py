"""An in-memory source: the ChangeSource contract (DESIGN.md §2) without a database.

It passes the same contract suite as PostgreSQL and SQL Server
(``tests/contract``), so the tracker, the checkpoint line and the balancer
can have millisecond unit tests against it. Its model:

- one version counter for the whole database, stamped on a transaction at
  commit (as SQL Server does), so every commit that returned is at or below
  ``current_version()`` and nothing can later commit below it: a read's bound
  is simply the current version;
- per tracked table, a log of every change (version, operation, changed
  columns) and a minimum valid version. A net change relative to ``since``
  needs only the log above ``since``: the row existed at ``since`` unless its
  first later change is an insert. Each entry keeps the row as the change
  left it, so every page of a read sees the view of the read's bound. ``cleanup`` drops old entries and raises
  the minimum valid version over them; TRUNCATE is not logged and raises the
  minimum valid version to its own version;
- transactions (``begin``) buffer their writes, see their own writes, and
  apply them atomically at ``commit``: a test can hold one open across reads.

Tests write through ``create_table``, ``insert``/``update``/``delete``/
``truncate`` (each its own transaction), ``begin``, ``restore`` (the
version goes back), the DDL of ``cdc.sources.memory_db`` and ``available``
(False: every call raises ``SourceUnavailable``, as a source that went away).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from cdc.config import TableConfig
from cdc.errors import (
    MissingColumn,
    SchemaError,
    SourceUnavailable,
    TableChanged,
    TrackingExpired,
    TrackingNotEnabled,
    UnsupportedType,
)
from cdc.sources.base import (
    ChangePage,
    ChangeRow,
    CleanupScope,
    Column,
    Cursor,
    Finding,
    KeyedRows,
    SnapshotPage,
    TableInfo,
    TrackingStatus,
)
from cdc.sources.memory_db import Entry, Key, MemoryDatabase, MemoryTransaction, Row, Table
from cdc.templates import render_key_value

__all__ = ["MemoryDatabase", "MemorySource", "MemoryTransaction", "TYPES"]

# The column types the source publishes: Python values are stored as given.
TYPES = frozenset(
    {"int", "bigint", "text", "decimal", "float", "bool", "bytes", "uuid", "date", "datetime", "json"}
)


class MemorySource(MemoryDatabase):
    """A ChangeSource over tables held in memory (see the module docstring)."""

    kind = "memory"
    retention_seconds: float | None = None  # what ``retention()`` answers

    # -- the ChangeSource protocol ---------------------------------------------

    async def connect(self) -> None:
        self._check_available()

    async def close(self) -> None:
        pass

    async def describe(self, table_config: TableConfig) -> TableInfo:
        self._check_available()
        t = self.table(table_config.table)
        if not t.primary_key:
            raise SchemaError(f"{table_config.table}: the table has no primary key")
        published = [*t.primary_key, *(c for c in t.columns if c not in t.primary_key)]
        if table_config.columns is not None:
            missing = [c for c in table_config.columns if c not in t.columns]
            if missing:
                known = ", ".join(t.columns)
                message = f"{table_config.table}: no column {missing[0]!r} (the table has: {known})"
                raise MissingColumn(table_config.table, missing[0], message)
            published = [c for c in published if c in t.primary_key or c in table_config.columns]
        reserved_key = [c for c in t.primary_key if c.startswith("@")]
        if reserved_key:
            raise SchemaError(
                f"{table_config.table}: primary-key column {reserved_key[0]!r}: names starting with @ are reserved"
            )
        left_out = tuple(c for c in published if c.startswith("@"))
        published = [c for c in published if c not in left_out]
        for column in published:
            if t.columns[column] not in TYPES:
                raise UnsupportedType(
                    f"{table_config.table}.{column}: type {t.columns[column]} is not published"
                )
        columns = tuple(Column(c, t.columns[c], c not in t.primary_key) for c in published)
        return TableInfo(
            table_config.table,
            table_config.schema,
            table_config.name,
            t.primary_key,
            columns,
            identity=str(t.identity),
            fingerprint=_fingerprint(t),
            left_out=left_out,
        )

    async def fingerprints(self, tables: Sequence[TableConfig]) -> dict[str, str | None]:
        self._check_available()
        found = {tc.table: self._tables.get(tc.table.lower()) for tc in tables}
        return {table: None if t is None else _fingerprint(t) for table, t in found.items()}

    async def current_version(self) -> int:
        self._check_available()
        return self._version

    async def read_changes(
        self,
        info: TableInfo,
        since: int,
        *,
        limit: int,
        upto: int | None = None,
        after: Cursor | None = None,
    ) -> ChangePage:
        """The net changes in ``(since, upto]`` (``upto``: the first page's
        bound, the current version), ordered by (version, primary key)."""
        t = self._readable(info, since)
        bound = self._version if upto is None else upto
        rows = sorted(self._net_changes(t, info, since, bound), key=_order)
        if after is not None:
            rows = [r for r in rows if _order(r) > after]
        page = rows[:limit]
        more = len(rows) > limit
        return ChangePage(page, bound, more, _order(page[-1]) if more else None)

    def _readable(self, info: TableInfo, since: int) -> Table:
        t = self._described(info)
        if not t.tracked:
            raise TrackingNotEnabled(f"{info.table}: change tracking is not enabled")
        if since < t.min_valid_version:
            raise TrackingExpired(
                info.table, f"{since} is below the minimum valid version {t.min_valid_version}"
            )
        if since > self._version:
            raise TrackingExpired(info.table, f"the source version {self._version} is below {since}")
        return t

    def _described(self, info: TableInfo) -> Table:
        """The table ``info`` describes; SchemaError when it is another table
        object now, or lacks a column ``info`` publishes (as a database's
        query over the old columns would fail)."""
        self._check_available()
        t = self.table(info.table)
        gone = [c for c in info.column_names if c not in t.columns]
        if str(t.identity) != info.identity or gone:
            why = f"column {gone[0]!r} does not exist" if gone else "it was dropped and created again"
            raise TableChanged(
                f"{info.table}: the table changed while it was read ({why}): describing it again"
            )
        return t

    def _net_changes(self, t: Table, info: TableInfo, since: int, bound: int) -> list[ChangeRow]:
        """One row per key changed in ``(since, bound]``, as it was at the bound:
        every page of a read sees the same view, however late it is read (a key
        changed again above the bound is in this read and, again, in the next)."""
        changes = []
        for key, log in t.log.items():
            window = [e for e in log if since < e.version <= bound]
            if window:
                changes.append(_net_row(t, info, key, window))
        return changes

    async def snapshot(
        self,
        info: TableInfo,
        *,
        page_size: int,
        after: tuple[Any, ...] | None = None,
        encoded: bool = False,
        start: tuple[Any, ...] | None = None,
        until: tuple[Any, ...] | None = None,
    ) -> AsyncIterator[SnapshotPage]:
        """The rows as they are now (copied at once: one consistent view), paged
        by key, after the key ``after`` when given (values in key order), within
        ``start``..``until``; ``encoded`` is ignored: values come as values."""
        t = self._described(info)
        version = self._version
        keyed = sorted(t.rows.items())

        def within(row: dict[str, Any]) -> bool:
            key = tuple(row[c] for c in info.primary_key)
            return (
                (after is None or key > tuple(after))
                and (start is None or key >= tuple(start))
                and (until is None or key <= tuple(until))
            )

        keyed = [(k, r) for k, r in keyed if within(r)]
        rows = [_published(info, r) for _, r in keyed]
        for first in range(0, max(1, len(rows)), page_size):
            page = rows[first : first + page_size]
            last = tuple(page[-1][c] for c in info.primary_key) if page else None
            yield SnapshotPage(version, page, len(rows), last)

    async def read_rows(self, info: TableInfo, keys: Sequence[dict[str, Any]]) -> KeyedRows:
        """The rows of ``keys`` as they are now (one view: nothing runs in
        between); a key value matches as its text in a key (``render_key_value``)."""
        t = self._described(info)
        by_text = {tuple(render_key_value(v) for v in key): key for key in t.rows}
        found = [by_text.get(tuple(render_key_value(k[c]) for c in info.primary_key)) for k in keys]
        return KeyedRows(self._version, [None if k is None else _published(info, t.rows[k]) for k in found])

    async def wait_for_changes(self, timeout: float) -> set[str]:
        """Tables committed to since the last call, waiting up to ``timeout`` for one."""
        if self._notified:
            await asyncio.sleep(0)  # a wait is a suspension point, even when it need not wait
        else:
            self._notify.clear()
            try:
                await asyncio.wait_for(self._notify.wait(), timeout)
            except TimeoutError:
                return set()
        notified, self._notified = self._notified, set()
        return notified

    def quiet_for(self, info: TableInfo, since: int) -> float:
        return 0.0  # a read costs nothing here: never worth skipping

    async def tracking_enable(self, tables: Sequence[TableConfig]) -> list[str]:
        done = []
        for table_config in tables:
            t = self.table(table_config.table)
            if not t.primary_key:
                raise SchemaError(f"{table_config.table}: the table has no primary key")
            if not t.tracked:
                t.tracked, t.min_valid_version = True, self._version
                done.append(f"tracking enabled for {table_config.table}")
        return done

    async def grant_runtime(self, tables: Sequence[TableConfig], role: str) -> list[str]:
        return [f"{role}: an in-memory source has no privileges to grant"]

    async def check_grantee(self, role: str) -> None:
        """An in-memory source has no roles: any name goes."""

    async def tracking_disable(self, tables: Sequence[TableConfig]) -> list[str]:
        done = []
        for table_config in tables:
            t = self.table(table_config.table)
            if t.tracked:
                t.tracked = False
                t.log.clear()
                done.append(f"tracking disabled for {table_config.table}")
        return done

    async def tracking_status(self, tables: Sequence[TableConfig]) -> list[TrackingStatus]:
        statuses = []
        for table_config in tables:
            t = self.table(table_config.table)
            minimum = t.min_valid_version if t.tracked else None
            statuses.append(TrackingStatus(table_config.table, t.tracked, minimum, self._version))
        return statuses

    async def retention(self) -> float | None:
        """What a test sets in ``retention_seconds`` (None: nothing expires by itself)."""
        self._check_available()
        return self.retention_seconds

    async def cleanup(self, retention: float, scope: CleanupScope | None = None) -> int:
        """Drop entries older than ``retention`` seconds (of ``scope``'s tables
        only, when given: one deployment per memory database, so no claims);
        each table's minimum valid version rises over the highest version dropped."""
        cutoff = self._clock() - retention
        removed = 0
        for t in self._tables.values():
            if scope is not None and t.name not in scope.tables:
                continue
            expired = [e.version for log in t.log.values() for e in log if e.at <= cutoff]
            if expired:
                t.min_valid_version = max(t.min_valid_version, max(expired))
                removed += self._drop_below(t, t.min_valid_version)
        return removed

    @staticmethod
    def _drop_below(t: Table, version: int) -> int:
        """Drop the entries at or below ``version``; return how many."""
        removed = 0
        for key in list(t.log):
            kept = [e for e in t.log[key] if e.version > version]
            removed += len(t.log[key]) - len(kept)
            if kept:
                t.log[key] = kept
            else:
                del t.log[key]
        return removed

    async def doctor(self, tables: Sequence[TableConfig]) -> list[Finding]:
        return [Finding("ok", "memory", "an in-memory source: nothing can go wrong")]

    def _check_available(self) -> None:
        if not self.available:
            raise SourceUnavailable("the in-memory source is unavailable (available = False)")


def _fingerprint(t: Table) -> str:
    return repr((t.identity, t.ddl, t.tracked, t.primary_key, sorted(t.columns.items())))


def _order(row: ChangeRow) -> Cursor:
    return row.version, tuple(row.key.values())


def _published(info: TableInfo, row: Row) -> Row:
    return {c: row[c] for c in info.column_names}


def _net_row(t: Table, info: TableInfo, key: Key, window: list[Entry]) -> ChangeRow:
    """The net change of ``key`` over its entries in ``(since, bound]``: it
    existed at ``since`` unless the first of them is an insert."""
    existed = window[0].op != "I"
    current = window[-1].row
    key_values = dict(zip(t.primary_key, key, strict=True))
    version = window[-1].version
    if current is None:
        return ChangeRow("D", version, key_values, None)
    if not existed:
        return ChangeRow("I", version, key_values, _published(info, current))
    return ChangeRow("U", version, key_values, _published(info, current), _changed(info, window))


def _changed(info: TableInfo, window: list[Entry]) -> frozenset[str] | None:
    """The published columns updated after ``since``; None (unknown) if the
    row was deleted and inserted again meanwhile."""
    changed: set[str] = set()
    for entry in window:
        if entry.columns is None:
            return None
        changed |= entry.columns
    return frozenset(changed & set(info.column_names))
