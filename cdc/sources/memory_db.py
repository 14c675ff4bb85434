"""The in-memory database behind ``MemorySource``: tables, rows, their change
logs, and what tests do to them (writes, transactions, DDL).

``MemorySource`` (cdc.sources.memory) reads it as a ChangeSource; this module
is the database side. DDL follows what PostgreSQL and SQL Server do to
tracking: ``add_column`` gives every row the default without logging a
change (as ``ALTER TABLE ... ADD COLUMN ... DEFAULT`` fires no trigger),
``drop_column``/``rename_column`` log nothing either, ``drop_table`` removes
the table with its tracking, and ``create_table`` under a used name makes a
new table object (a new ``identity``), untracked.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc.errors import SchemaError
from cdc.sources.base import Op

Key = tuple[Any, ...]
Row = dict[str, Any]

_identities = itertools.count(1)


@dataclass(frozen=True)
class Entry:
    """One tracked change of one row."""

    version: int
    op: Op
    columns: frozenset[str] | None  # an update's changed columns; None for I and D
    row: Row | None  # the row after the change (None: deleted): a read sees its bound's view
    at: float  # clock time of the commit, for retention


@dataclass
class Table:
    """A table's rows and, once tracked, its change log."""

    name: str  # "schema.name"
    columns: dict[str, str]  # column -> type, in table order
    primary_key: tuple[str, ...]
    identity: int = field(default_factory=lambda: next(_identities))  # a new table object, a new one
    ddl: int = 0  # ALTERs so far: a column dropped and added again is another column
    rows: dict[Key, Row] = field(default_factory=dict)
    tracked: bool = False
    min_valid_version: int = 0
    log: dict[Key, list[Entry]] = field(default_factory=dict)

    def key_of(self, values: Mapping[str, Any]) -> Key:
        return tuple(values[c] for c in self.primary_key)


class MemoryTransaction:
    """Writes buffered until ``commit``; reads inside it see them."""

    def __init__(self, source: MemoryDatabase) -> None:
        self._source = source
        self._writes: dict[str, dict[Key, Row | None]] = {}  # table -> key -> row (None: deleted)
        self.open = True

    def _view(self, table: Table, key: Key) -> Row | None:
        pending = self._writes.get(table.name, {})
        return pending[key] if key in pending else table.rows.get(key)

    def _write(self, table: Table, key: Key, row: Row | None) -> None:
        assert self.open, "the transaction has ended"
        self._writes.setdefault(table.name, {})[key] = row

    def insert(self, table: str, row: Mapping[str, Any]) -> None:
        t = self._source.table(table)
        key = t.key_of(row)
        if self._view(t, key) is not None:
            raise KeyError(f"{table}: duplicate primary key {key}")
        self._write(t, key, {c: row.get(c) for c in t.columns})

    def upsert(self, table: str, row: Mapping[str, Any]) -> None:
        """Insert the row, or update every given column where the key exists."""
        t = self._source.table(table)
        current = self._view(t, t.key_of(row))
        if current is None:
            self.insert(table, row)
        else:
            self._write(t, t.key_of(row), {**current, **row})

    def update(self, table: str, key: Mapping[str, Any], values: Mapping[str, Any]) -> None:
        """Update the row at ``key`` if it exists (a moved key: see ``move``)."""
        t = self._source.table(table)
        current = self._view(t, t.key_of(key))
        if current is not None:
            self._write(t, t.key_of(key), {**current, **values})

    def delete(self, table: str, key: Mapping[str, Any]) -> None:
        t = self._source.table(table)
        if self._view(t, t.key_of(key)) is not None:
            self._write(t, t.key_of(key), None)

    def move(self, table: str, key: Mapping[str, Any], new_key: Mapping[str, Any]) -> None:
        """Update the primary key of a row, if the row exists and the new key is free."""
        t = self._source.table(table)
        current = self._view(t, t.key_of(key))
        target = t.key_of({**key, **new_key})
        if current is None or self._view(t, target) is not None or target == t.key_of(key):
            return
        self._write(t, t.key_of(key), None)
        self._write(t, target, {**current, **new_key})

    def commit(self) -> int:
        """Apply every write at one new version; return it."""
        assert self.open, "the transaction has ended"
        self.open = False
        return self._source._commit(self._writes)

    def rollback(self) -> None:
        self.open = False
        self._writes.clear()


class MemoryDatabase:
    """Tables held in memory, and what tests do to them (see the module docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._tables: dict[str, Table] = {}
        self._version = 0
        self._notified: set[str] = set()
        self._notify = asyncio.Event()
        self.available = True  # False: every call raises SourceUnavailable

    def create_table(self, table: str, columns: Mapping[str, str], key: Sequence[str]) -> None:
        """Create ``table`` ("schema.name") with ``columns`` (name -> type) and primary ``key``."""
        self._tables[table.lower()] = Table(table, dict(columns), tuple(key))

    def table(self, table: str) -> Table:
        try:
            return self._tables[table.lower()]
        except KeyError:
            raise SchemaError(f"{table}: no such table") from None

    def begin(self) -> MemoryTransaction:
        return MemoryTransaction(self)

    def insert(self, table: str, row: Mapping[str, Any]) -> int:
        """Insert one row in a transaction of its own; return its version."""
        return self._autocommit(lambda tx: tx.insert(table, row))

    def update(self, table: str, key: Mapping[str, Any], values: Mapping[str, Any]) -> int:
        return self._autocommit(lambda tx: tx.update(table, key, values))

    def delete(self, table: str, key: Mapping[str, Any]) -> int:
        return self._autocommit(lambda tx: tx.delete(table, key))

    def truncate(self, table: str) -> int:
        """Empty the table. Not tracked: it invalidates every checkpoint below it."""
        t = self.table(table)
        self._version += 1
        t.rows.clear()
        t.log.clear()
        t.min_valid_version = self._version
        return self._version

    def restore(self, version: int) -> None:
        """The database goes back to ``version`` (a restore, a failover): the
        version counter does; checkpoints above it must expire."""
        self._version = version

    def rows(self, table: str) -> dict[Key, Row]:
        """The committed contents: primary key -> every column."""
        return {k: dict(v) for k, v in self.table(table).rows.items()}

    def _autocommit(self, write: Callable[[MemoryTransaction], None]) -> int:
        tx = self.begin()
        write(tx)
        return tx.commit()

    def _commit(self, writes: Mapping[str, Mapping[Key, Row | None]]) -> int:
        self._version += 1
        for name, rows in writes.items():
            t = self._tables[name.lower()]
            for key, row in rows.items():
                self._apply(t, key, row)
            if t.tracked and rows:
                self._notified.add(t.name)
                self._notify.set()
        return self._version

    def _apply(self, t: Table, key: Key, row: Row | None) -> None:
        before = t.rows.get(key)
        if row is None:
            t.rows.pop(key, None)
        else:
            t.rows[key] = dict(row)
        if not t.tracked or before == row:
            return
        if before is None or row is None:
            op: Op = "D" if row is None else "I"
            entry = Entry(self._version, op, None, None if row is None else dict(row), self._clock())
        else:
            changed = frozenset(c for c in row if row[c] != before.get(c))
            entry = Entry(self._version, "U", changed, dict(row), self._clock())
        t.log.setdefault(key, []).append(entry)

    # -- DDL -------------------------------------------------------------------

    def add_column(self, table: str, column: str, type_name: str, default: Any = None) -> None:
        """Every row gets ``default``; no change is logged (no trigger fires)."""
        t = self.table(table)
        t.ddl += 1
        t.columns[column] = type_name
        for row in t.rows.values():
            row[column] = default

    def drop_column(self, table: str, column: str) -> None:
        t = self.table(table)
        t.ddl += 1
        if column in t.primary_key:
            raise SchemaError(f"{table}: cannot drop primary-key column {column}")
        del t.columns[column]
        for row in t.rows.values():
            row.pop(column, None)

    def rename_column(self, table: str, column: str, new_name: str) -> None:
        t = self.table(table)
        t.ddl += 1
        t.columns = {new_name if c == column else c: kind for c, kind in t.columns.items()}
        t.primary_key = tuple(new_name if c == column else c for c in t.primary_key)
        for key, row in t.rows.items():
            t.rows[key] = {new_name if c == column else c: v for c, v in row.items()}

    def retype_column(self, table: str, column: str, type_name: str, convert: Callable[[Any], Any]) -> None:
        """``ALTER COLUMN ... TYPE ... USING convert(column)``: no change logged."""
        t = self.table(table)
        t.ddl += 1
        t.columns[column] = type_name
        for row in t.rows.values():
            row[column] = convert(row.get(column))

    def drop_table(self, table: str) -> None:
        """The table is gone, and its tracking with it."""
        self.table(table)
        del self._tables[table.lower()]

    def rename_table(self, table: str, new_name: str) -> None:
        """The same table object (its tracking too) under another name."""
        t = self._tables.pop(self.table(table).name.lower())
        t.name = new_name
        self._tables[new_name.lower()] = t
