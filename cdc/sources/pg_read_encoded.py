"""Change reads with PostgreSQL writing the JSON text of most columns, as a
snapshot's pages do (``pg_snapshot``): ``read_changes`` once the source's
``encoded_reads`` are on (the tracker's ``RowFeeder`` turns them on; a plain
read, the default and the contract tests', returns every column as a value).

Why: loading a changed row's ten values in psycopg and encoding them in
Python (``cdc.values``) cost the sidecar ~6 µs a change of the bench tables,
a quarter of its CPU in a drain (py-spy). The server writes the same text
(``pg_snapshot.json_expression``: byte for byte ``cdc.values``'s, odd values
left to the session's loaders); the row arrives as one text, which the mapper
splits (``TableMapper.from_row``). The other columns arrive as values.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

from cdc.sources.base import ENCODED_SEPARATOR, ChangeRow, EncodedColumns, TableInfo
from cdc.sources.pg_catalog import Connection
from cdc.sources.pg_reads import RowReader
from cdc.sources.pg_snapshot import json_expression, odd_loaders, utf8_database

ALIAS = "t"  # the source table's alias in ``pg_reads.changes_query``


@dataclass(frozen=True)
class EncodedRead:
    """What a read selects of the source row (``pg_reads.changes_query``'s
    columns: the joined JSON text, then the ``plain`` columns' values) and
    how its rows are told apart (``columns``)."""

    columns: EncodedColumns
    plain: tuple[str, ...]
    select: sql.Composable
    queries: dict[TableInfo, bytes] = field(default_factory=dict)  # pg_reads.whole_read's, composed once

    def reader(self, info: TableInfo, since: int) -> RowReader:
        return EncodedRowReader(info, since, self)


class EncodedRowReader(RowReader):
    """``RowReader`` of an encoded read: after the key, the JSON text, then the
    ``plain`` columns' values (``ChangeRow.text``)."""

    def __init__(self, info: TableInfo, since: int, encoded: EncodedRead) -> None:
        super().__init__(info, since)
        self.plain, self.columns = encoded.plain, encoded.columns

    def __call__(self, record: Sequence[Any]) -> ChangeRow:
        """``RowReader.__call__`` and ``row`` in one call: the hot path of a
        drain, one per changed row. A call and a dict of no plain columns
        fewer: 1.51 -> 1.10 µs a row of the drain bench's mix (60% U, 30% I,
        10% D; timeit, CPython 3.11)."""
        version, op, created, column_versions, found = record[:5]
        end = 5 + self.width
        key = {self.single: record[5]} if self.single is not None else self.composite_key(record, end)
        if not found:
            return ChangeRow("D", version, key, None)
        values = dict(zip(self.plain, record[end + 1 :], strict=True)) if self.plain else {}
        text, columns = record[end], self.columns
        if op == "D":  # as RowReader.row says
            return ChangeRow("U", version, key, values, None, text, columns)
        if created > self.since:
            return ChangeRow("I", version, key, values, None, text, columns)
        changed = functools.partial(self.changed, column_versions)
        return ChangeRow("U", version, key, values, changed, text, columns)


async def encoded_read(conn: Connection, info: TableInfo) -> EncodedRead:
    """The encoded read of ``info`` on ``conn``'s session settings."""
    utf8 = await utf8_database(conn)
    encoded: list[tuple[str, sql.Composable]] = []
    plain: list[str] = []
    for column in info.columns:
        expression = json_expression(column, utf8=utf8, table=ALIAS)
        if expression is None:
            plain.append(column.name)
        else:
            encoded.append((column.name, expression))
    joined = sql.SQL("concat_ws({}, {})").format(
        sql.Literal(ENCODED_SEPARATOR),
        sql.SQL(", ").join(e for _, e in encoded) if encoded else sql.SQL("''"),
    )
    select = sql.SQL(", ").join([joined, *(sql.Identifier(ALIAS, c) for c in plain)])
    names = tuple(c for c, _ in encoded)
    loaders = odd_loaders(conn, tuple(c for c in info.columns if c.name in names))
    return EncodedRead(EncodedColumns(names, loaders), tuple(plain), select)


class EncodedReads:
    """A source's encoded reads, once ``on`` (the tracker's feeder turns it on:
    ``cdc.feeder``): each table's layout, made once per description (every
    session of the source has the same settings: ``pg_types.prepare_session``)."""

    def __init__(self) -> None:
        self.on = False
        self._reads: dict[TableInfo, EncodedRead] = {}

    async def get(self, conn: Connection, info: TableInfo) -> EncodedRead | None:
        """The table's encoded read, or None when reads are plain."""
        if not self.on:
            return None
        found = self._reads.get(info)
        if found is None:
            found = self._reads[info] = await encoded_read(conn, info)
        return found

    def forget(self, info: TableInfo) -> None:
        """The table was described again: what was made for its other shapes goes."""
        self._reads = {i: r for i, r in self._reads.items() if i.table != info.table or i == info}
