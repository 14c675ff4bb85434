"""Reading rows by primary key on SQL Server, for ``cdc deadletter replay``.

The pattern of a snapshot's first chunk (``mssql_snapshot.snapshot_begin``),
which is Microsoft's documented one for reading a consistent version with the
rows ("Work with change tracking", learn.microsoft.com: read
``CHANGE_TRACKING_CURRENT_VERSION()`` inside the SNAPSHOT transaction that
then reads the table): in one SNAPSHOT transaction, the current version first,
the table's minimum valid version and object id checked, then one SELECT per
key. Every change committed at or below the version is in the rows; a later
one gets a higher version, so the apply rule never lets the replay hide it.

Key values arrive as the text a key template renders (``cdc.templates``), or
as values. Each is compared as the column's declared type: ``CAST(? AS
type)``; a char or varchar key through COLLATE first, as a keyset cursor's
(``mssql_sql._key_parameter`` says why); a date or time key's text is ISO
8601 (``2024-02-29T13:45:30.1234567``, the documents' form), which SQL
Server reads the same whatever the session's DATEFORMAT or LANGUAGE ("SET
DATEFORMAT (Transact-SQL)", learn.microsoft.com: "Some character strings
formats, for example ISO 8601, are interpreted independently of the
DATEFORMAT setting"); a binary key renders as hex, decoded here into bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdc.sources import mssql_sql as sql
from cdc.sources.base import KeyedRows
from cdc.sources.mssql_catalog import DescribedTable
from cdc.sources.mssql_link import execute, fetch_all, rollback_quietly
from cdc.sources.mssql_reads import snapshot_row
from cdc.sources.mssql_snapshot import begin_at_current_version

_CHAR_TYPES = frozenset({"char", "varchar"})
_BINARY_TYPES = frozenset({"binary", "varbinary"})


def row_by_key(shape: sql.TableShape, key: Sequence[Any]) -> sql.Statement:
    """The published columns of the row whose primary key is ``key`` (in key order)."""
    collations = shape.key_collations or (None,) * len(shape.primary_key)
    terms, params = [], []
    for column, declared, collation, value in zip(
        shape.primary_key, shape.key_types, collations, key, strict=True
    ):
        placeholder, param = _key_parameter(declared, collation, value)
        terms.append(f"t.{sql.quote(column)} = {placeholder}")
        params.append(param)
    columns = ", ".join(shape.selected("t", shape.columns))
    text = f"SELECT {columns} FROM {shape.qualified} AS t WHERE {' AND '.join(terms)}"  # noqa: S608
    return sql.Statement(text, tuple(params))


def _key_parameter(declared_type: str, collation: str | None, value: Any) -> tuple[str, Any]:
    """The placeholder (the value cast to the column's type) and the parameter."""
    declared = sql.sql_type(declared_type)
    base = declared.split("(", 1)[0]
    if base in _BINARY_TYPES and isinstance(value, str):
        value = bytes.fromhex(value)
    if base in _CHAR_TYPES and collation is not None:
        return f"CAST(? COLLATE {sql.collation(collation)} AS {declared})", value
    return f"CAST(? AS {declared})", value


def read_rows(conn: Any, described: DescribedTable, keys: Sequence[dict[str, Any]]) -> KeyedRows:
    """On the link's thread: one SNAPSHOT transaction, the version first (the module docstring)."""
    info, shape = described.info, described.shape
    try:
        current, _ = begin_at_current_version(conn, info)
        rows: list[dict[str, Any] | None] = []
        for key in keys:
            raw = fetch_all(conn, row_by_key(shape, [key[c] for c in shape.primary_key]))
            rows.append(snapshot_row(described, raw[0]) if raw else None)
        execute(conn, sql.COMMIT)
    except BaseException:
        rollback_quietly(conn)
        raise
    return KeyedRows(int(current), rows)
