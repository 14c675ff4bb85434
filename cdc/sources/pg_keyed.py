"""Reading rows by primary key, for ``cdc deadletter replay``: the current
rows of some keys, in one REPEATABLE READ transaction, with the version read
first, exactly as a snapshot's (``pg_reads.snapshot_version``): every change
at or below it is in the rows, and a change committed later gets a higher
version, so the apply rule never lets the replay hide one.

A key's values arrive as text (the key template's rendering, or the dead
letter's ``values``) or as values; psycopg sends text with no type (the
``unknown`` oid), and PostgreSQL reads it as the column's type, as it reads a
literal ("Constants of Other Types", postgresql.org/docs/current/sql-syntax-lexical.html).
bytea is the exception: a key renders it as hex without bytea's ``\\x``, so
it is decoded here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql

from cdc.sources import pg_reads
from cdc.sources.base import KeyedRows, TableInfo
from cdc.sources.pg_catalog import Connection


def rows_query(info: TableInfo, *, ordinary: bool) -> sql.Composed:
    """The row of one key: parameters, the primary-key values in order."""
    keys = sql.SQL(", ").join(map(sql.Identifier, info.primary_key))
    return sql.SQL("select {} from {} where ({}) = ({})").format(
        sql.SQL(", ").join(map(sql.Identifier, info.column_names)),
        pg_reads.source_relation(info, ordinary=ordinary),
        keys,
        sql.SQL(", ").join(sql.Placeholder() * len(info.primary_key)),
    )


async def read_rows(
    conn: Connection, schema: str, info: TableInfo, keys: Sequence[dict[str, Any]], *, ordinary: bool
) -> KeyedRows:
    """Inside the caller's transaction: the version first, then each key's row."""
    await pg_reads.lock_source(conn, info)
    version = await pg_reads.snapshot_version(conn, schema, info)
    query = rows_query(info, ordinary=ordinary)
    types = {c.name: c.type_name for c in info.columns}
    rows: list[dict[str, Any] | None] = []
    for key in keys:
        params = [key_parameter(key[c], types.get(c, "")) for c in info.primary_key]
        record = await (await conn.execute(query, params)).fetchone()
        rows.append(None if record is None else dict(zip(info.column_names, record, strict=True)))
    return KeyedRows(version, rows)


def key_parameter(value: Any, type_name: str) -> Any:
    """A key value as the query takes it: bytea's hex text decoded (``render_key_value``)."""
    if type_name == "bytea" and isinstance(value, str):
        return bytes.fromhex(value)
    return value
