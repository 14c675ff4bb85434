"""Decoded tuples as values: psycopg's loaders, by the type each column reads as.

pgoutput sends each value as its type's text output, with the column's own
type oid (a domain's, say). A SELECT of the same column arrives with the
domain's base type's oid, and the trigger mode loads it with the loader
registered for that oid on the connection (``pg_types.prepare_session``).
So a column is loaded here with the loader of its base type, from the same
connection's adapters: the values are the trigger mode's, and encode to the
same JSON (docs/TYPES.md; the shared contract tests check every type).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from psycopg.pq import Format

from cdc.errors import TableChanged
from cdc.sources import pg_types
from cdc.sources.base import TableInfo
from cdc.sources.pg_catalog import Connection
from cdc.sources.pg_pgoutput import UNCHANGED, Relation, Tuple

# Each type oid, its base type (through domains), whether that is an array, and
# the name of the base type or, for an array, of its element (pg_types.ensure_loaders).
_BASES = """
with recursive bases(oid, base) as (
    select t.oid, t.oid from pg_type t where t.oid = any(%s::oid[])
    union all
    select b.oid, t.typbasetype from bases b join pg_type t on t.oid = b.base where t.typtype = 'd'
)
select b.oid, b.base, t.typcategory = 'A', coalesce(e.typname, t.typname)
  from bases b join pg_type t on t.oid = b.base left join pg_type e on e.oid = t.typelem
 where t.typtype <> 'd'
"""


# The table's generated columns: pgoutput never sends them (PostgreSQL 12-17;
# 18 only with the publication's publish_generated_columns, which is not set).
_GENERATED = """
select a.attname from pg_attribute a
  join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace
 where n.nspname = %s and c.relname = %s and a.attgenerated <> '' and not a.attisdropped
"""


class TupleLoaders:
    """Per relation shape, one load function a column (made once per shape);
    per description of a table, its generated columns."""

    def __init__(self) -> None:
        self._loaders: dict[tuple[int, tuple[int, ...]], list[Callable[[Any], Any]]] = {}
        self._generated: dict[TableInfo, frozenset[str]] = {}

    async def generated(self, conn: Connection, info: TableInfo) -> frozenset[str]:
        """``info``'s generated columns, read once per description."""
        found = self._generated.get(info)
        if found is None:
            if len(self._generated) > 1000:  # descriptions of tables changed many times
                self._generated.clear()
            rows = await (await conn.execute(_GENERATED, [info.schema, info.name])).fetchall()
            found = self._generated[info] = frozenset(str(row[0]) for row in rows)
        return found

    async def prepare(self, conn: Connection, relations: Iterable[Relation]) -> None:
        for relation in relations:
            shape = (relation.relid, relation.type_oids)
            if shape in self._loaders:
                continue
            rows = await (await conn.execute(_BASES, [sorted(set(relation.type_oids))])).fetchall()
            bases = {int(oid): (int(base), bool(is_array), str(name)) for oid, base, is_array, name in rows}
            await pg_types.ensure_loaders(conn, list(bases.values()))
            loaders: list[Callable[[Any], Any]] = []
            for oid in relation.type_oids:
                base = bases.get(oid, (oid, False, ""))[0]
                adapters = conn.adapters
                loader = adapters.get_loader(base, Format.TEXT) or adapters.get_loader(0, Format.TEXT)
                assert loader is not None  # psycopg has a text loader for oid 0
                loaders.append(loader(base, conn).load)
            self._loaders[shape] = loaders

    def decoder(
        self, info: TableInfo, generated: frozenset[str] = frozenset()
    ) -> Callable[[Relation, Tuple], dict[str, Any]]:
        """A tuple of ``info``'s table as its published columns and key (by name),
        values loaded; a table renamed, or without a published column, raises
        ``TableChanged`` (it is described again, as after a trigger-mode read).

        A ``generated`` column (``generated``: pgoutput never sends one) is
        ``UNCHANGED``: read from the table by key, as an unchanged TOASTed
        value is. Any other column missing (dropped after the read was
        described) is ``TableChanged``: never a value carried over from an
        earlier change of the row in the same read."""
        keys = set(info.primary_key)
        wanted = set(info.column_names) | keys
        fillable = wanted & generated

        def decode(relation: Relation, values: Tuple) -> dict[str, Any]:
            if relation.schema != info.schema or relation.name != info.name:
                raise TableChanged(
                    f"{info.table}: the table was renamed while it was read: describing it again"
                )
            if not keys.issubset(relation.columns):
                raise TableChanged(f"{info.table}: the table changed while it was read: describing it again")
            loaders = self._loaders.get((relation.relid, relation.type_oids))
            if loaders is None:  # not prepared for this read: never a KeyError on every retry
                raise TableChanged(f"{info.table}: the table changed while it was read: describing it again")
            row: dict[str, Any] = {}
            for column, load, value in zip(relation.columns, loaders, values, strict=True):
                if column in wanted:
                    row[column] = value if value is None or value is UNCHANGED else load(value)
            if len(row) < len(wanted):
                missing = wanted.difference(row)
                if not missing <= fillable:
                    raise TableChanged(
                        f"{info.table}: the table changed while it was read: describing it again"
                    )
                row.update(dict.fromkeys(missing, UNCHANGED))
            return row

        return decode
