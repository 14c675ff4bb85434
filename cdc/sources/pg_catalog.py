"""Catalog look-ups shared by ``describe``, tracking and ``doctor``.

Tables are found by their exact names, passed as query parameters: names in
the config are case-sensitive identifiers, the same as when they are quoted
in SQL (``public.Orders`` is not ``public.orders``). The primary key comes in
key order, the columns in table order, each with the base type its values
are loaded as (domains and array elements resolved), which is what decides
whether the column can be published: nearly every type can (docs/TYPES.md);
the ``reg*`` types cannot (``REFERENCE_TYPES``), and such a column carries the
reason and the fix in ``refused``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import psycopg
from psycopg.rows import TupleRow

from cdc.errors import SchemaError
from cdc.sources import pg_types

Connection = psycopg.AsyncConnection[TupleRow]


@dataclass(frozen=True)
class CatalogColumn:
    name: str
    type_name: str  # format_type(), e.g. "numeric(12,2)", "text[]"
    not_null: bool
    base_type: str  # pg_type.typname after resolving a domain and an array's element
    is_enum: bool
    refused: str = ""  # why the column cannot be published, and the fix; empty when it can
    deterministic: bool = True  # its collation's (pg_collation.collisdeterministic); True without one


@dataclass(frozen=True)
class CatalogTable:
    oid: int
    schema: str
    name: str
    primary_key: tuple[str, ...]
    columns: tuple[CatalogColumn, ...]
    partitioned: bool = False  # a partitioned table (relkind 'p'), not an ordinary one

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    def column(self, name: str) -> CatalogColumn | None:
        return next((c for c in self.columns if c.name == name), None)


_FIND_TABLE = """
    select c.oid, c.relkind = 'p' from pg_class c join pg_namespace n on n.oid = c.relnamespace
    where n.nspname = %s and c.relname = %s and c.relkind in ('r', 'p')
"""

_PRIMARY_KEY = """
    select a.attname
    from pg_index i
    cross join lateral unnest(i.indkey) with ordinality as k(attnum, ord)
    join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.attnum
    where i.indrelid = %s and i.indisprimary
    order by k.ord
"""

# Resolve, in order: a domain to its base type (results carry the base type's
# oid), an array to its element, and a domain element to its base type.
# Then the oid values arrive with (a domain's base type's), and whether it is an array.
_COLUMNS = """
    select a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, b.typname, b.typtype = 'e',
           d.oid, d.typoutput = 'array_out'::regproc, coalesce(co.collisdeterministic, true)
    from pg_attribute a
    left join pg_collation co on co.oid = a.attcollation
    join pg_type t on t.oid = a.atttypid
    join pg_type d on d.oid = case when t.typtype = 'd' then t.typbasetype else t.oid end
    join pg_type e on e.oid = case when d.typcategory = 'A' then d.typelem else d.oid end
    join pg_type b on b.oid = case when e.typtype = 'd' then e.typbasetype else e.oid end
    where a.attrelid = %s and a.attnum > 0 and not a.attisdropped
    order by a.attnum
"""


async def find_table(conn: Connection, schema: str, name: str) -> CatalogTable | None:
    """The table ``schema.name`` with its key and columns, or None when there is none."""
    found = await (await conn.execute(_FIND_TABLE, [schema, name])).fetchone()
    if found is None:
        return None
    oid, partitioned = found
    key = await (await conn.execute(_PRIMARY_KEY, [oid])).fetchall()
    columns = await (await conn.execute(_COLUMNS, [oid])).fetchall()
    await pg_types.ensure_loaders(conn, [(row[5], row[6], row[3]) for row in columns])
    return CatalogTable(
        oid=oid,
        schema=schema,
        name=name,
        primary_key=tuple(row[0] for row in key),
        columns=checked([_column(row) for row in columns], tuple(row[0] for row in key)),
        partitioned=bool(partitioned),
    )


def _column(row: TupleRow) -> CatalogColumn:
    name, type_name, not_null, base_type, is_enum, _oid, _is_array, deterministic = row
    return CatalogColumn(name, type_name, not_null, base_type, is_enum, deterministic=deterministic)


# A value of these types reads as the current name of the catalog object it
# refers to (a table, a type, a function...). A rename or a drop changes that
# name without changing the row: nothing would carry the new text to the
# mirror, which would go stale without anyone knowing.
REFERENCE_TYPES = frozenset(
    {
        "regclass", "regcollation", "regconfig", "regdictionary", "regnamespace", "regoper",
        "regoperator", "regproc", "regprocedure", "regrole", "regtype",
    }
)  # fmt: skip


def checked(columns: Sequence[CatalogColumn], primary_key: Sequence[str] = ()) -> tuple[CatalogColumn, ...]:
    """The columns, those that cannot be published with the reason and the fix
    (``refused``), which lists the table's columns that can."""
    publishable = [c.name for c in columns if c.base_type not in REFERENCE_TYPES]
    return tuple(
        replace(c, refused=reason) if (reason := _refusal(c, publishable, primary_key)) else c
        for c in columns
    )


# A primary key compared under a nondeterministic collation (case- or
# accent-insensitive ICU) treats 'abc' and 'ABC' as one key: an update from one
# to the other is no key change to the capture trigger, whose net row keeps the
# old spelling while the row holds the new one, so streaming writes the document
# 'abc' where a snapshot writes 'ABC' (found by tests/contract/test_key_types.py's
# author; no document key can follow an equality that is not equality of text).
_NONDETERMINISTIC_KEY = (
    "a primary-key column under a nondeterministic collation cannot be mirrored: keys that the "
    "collation calls equal ('abc', 'ABC') are one row to the database but two documents, and an "
    "update from one spelling to the other would leave the document under the old one. Give the "
    'column a deterministic collation (ALTER TABLE ... ALTER COLUMN ... TYPE text COLLATE "C", or '
    "the database default), or key the table on another column"
)


def _refusal(column: CatalogColumn, publishable: Sequence[str], primary_key: Sequence[str]) -> str:
    """Why ``column`` cannot be published, with the fix; empty when it can."""
    if column.name in primary_key and not column.deterministic:
        return _NONDETERMINISTIC_KEY
    if column.base_type not in REFERENCE_TYPES:
        return ""
    return (
        f"type {column.type_name} cannot be mirrored: a {column.base_type} value reads as the current "
        "name of the object it refers to, which a rename or a drop changes without changing the row, "
        "so the mirror would go stale. Leave the column out: list the table's other columns in the "
        f"config's columns: [{', '.join(publishable)}]; or store the object's oid (type oid) or its "
        "name (type text) instead"
    )


async def similar_tables(conn: Connection, schema: str, name: str) -> list[str]:
    """Tables whose names match ``schema.name`` but for case: the likely typo."""
    rows = await (
        await conn.execute(
            "select n.nspname || '.' || c.relname from pg_class c join pg_namespace n"
            " on n.oid = c.relnamespace where lower(n.nspname) = lower(%s) and lower(c.relname) = lower(%s)"
            " and c.relkind in ('r', 'p') order by 1",
            [schema, name],
        )
    ).fetchall()
    return [row[0] for row in rows]


async def missing_table(conn: Connection, schema: str, name: str, renamed: str | None = None) -> SchemaError:
    """The error for a table that is not there, naming one it may have meant, or
    the name it has now when the tracking registry knows it was ``renamed``."""
    if renamed is not None:
        hint = f" (renamed to {renamed}? update the config, or rename it back)"
    else:
        similar = await similar_tables(conn, schema, name)
        hint = f" (names are case-sensitive: did you mean {similar[0]}?)" if similar else ""
    return SchemaError(f"{schema}.{name}: no such table{hint}")
