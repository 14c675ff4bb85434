"""A table's shape: its fingerprint, and the ``TableInfo`` that ``describe`` makes of it.

The sidecar polls ``fingerprints`` every couple of seconds for the tables it
owns and describes a table again when its text differs from the one
``describe`` saw (``TableInfo.fingerprint``). The text is built, in one
statement for all the tables, from what decides how a table is read and
whether its changes are captured:

- the table object: its oid and relkind (a table dropped and created again,
  or renamed away, changes it);
- every live column in attnum order: name, type oid, typmod, NOT NULL (a
  column added, dropped, renamed or retyped changes it);
- the primary key's columns;
- its entry in the tracking registry (``<tracking schema>.tracked_tables``)
  and the net table named there, "no entry" when there is none or no
  registry at all; not ``min_valid_version``, which moves with every cleanup
  and TRUNCATE without the shape changing;
- the state (``pg_trigger.tgenabled``, or missing) of this tracking schema's
  capture and truncate triggers on the table: without them changes are not
  captured.

The registry may not exist (tracking never enabled, or disabled for every
table), and a statement that names a missing table fails as a whole. So the
registry is read through ``query_to_xml``, PostgreSQL's built-in that runs a
query given as text, only when ``to_regclass`` finds the registry (a CASE
evaluates ``query_to_xml``, a volatile function, only in the branch taken):
one statement, no PL/pgSQL, whether tracking is installed or not.

Columns whose names start with ``@`` are reserved (documents carry ``@v``,
``@ts``, ``@del``): ``table_info`` leaves them out of the published columns
when the config lists none, and refuses a primary key that has one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from cdc.config import TableConfig
from cdc.errors import SchemaError
from cdc.sources.base import Column, TableInfo
from cdc.sources.pg_catalog import CatalogTable, Connection
from cdc.sources.pg_tracking import trigger_names
from cdc.sources.pg_types import check_supported

log = logging.getLogger("cdc.sources.postgres")

# Parameters: schemas, names (text arrays, one entry per table), the tracking
# schema, the trigger names. One row per table, in the order given; the
# fingerprint is NULL where there is no such table.
#
# A partitioned table's fingerprint holds its partitions (every level) with
# their relfilenode: a TRUNCATE, DETACH or DROP of one partition, or an
# ATTACH, fires no trigger of the table and pgoutput sends nothing for it, so
# the fingerprint moving (a TRUNCATE gives the partition a new relfilenode) is
# what re-snapshots the table. A VACUUM FULL or CLUSTER of a partition moves it
# too: one snapshot more. An ordinary table's fingerprint has no such part.
_FINGERPRINTS = """
with wanted as (
    select t.ord, c.oid, c.relkind, t.schema_name || '.' || t.table_name as qualified
      from unnest(%(schemas)s::text[], %(names)s::text[]) with ordinality as t(schema_name, table_name, ord)
      left join pg_namespace n on n.nspname = t.schema_name
      left join pg_class c on c.relnamespace = n.oid and c.relname = t.table_name and c.relkind in ('r', 'p')
)
select case when w.oid is not null then concat_ws(' | ',
    format('table %%s %%s', w.oid, w.relkind),
    'columns ' || (
        select string_agg(format('%%s %%I %%s %%s %%s', a.attnum, a.attname, a.atttypid, a.atttypmod,
                                 a.attnotnull), ', ' order by a.attnum)
          from pg_attribute a where a.attrelid = w.oid and a.attnum > 0 and not a.attisdropped),
    'key ' || coalesce((
        select string_agg(quote_ident(a.attname), ', ' order by k.ord)
          from pg_index i cross join lateral unnest(i.indkey) with ordinality as k(attnum, ord)
          join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.attnum
         where i.indrelid = w.oid and i.indisprimary), 'none'),
    'tracking ' || coalesce(case when to_regclass(format('%%I.tracked_tables', %(tracking)s::text)) is not null
        then substring(query_to_xml(format(
            'select (select net_table from %%I.tracked_tables where table_name = %%L) as net',
            %(tracking)s::text, w.qualified), false, true, '')::text from '<net>([^<]*)</net>') end, 'no entry'),
    'triggers ' || (
        select string_agg(format('%%I %%s', g.name, coalesce(tg.tgenabled::text, 'missing')), ', ' order by g.ord)
          from unnest(%(triggers)s::text[]) with ordinality as g(name, ord)
          left join pg_trigger tg on tg.tgrelid = w.oid and tg.tgname = g.name),
    (select 'partitions ' || string_agg(t.relid::oid::text || ' ' || c.relfilenode::text, ', ' order by t.relid::oid)
       from pg_partition_tree(w.oid) t join pg_class c on c.oid = t.relid where t.level > 0)
) end
from wanted w order by w.ord
"""


async def fingerprints(
    conn: Connection, tracking_schema: str, tables: Sequence[TableConfig]
) -> list[str | None]:
    """Each table's fingerprint (None: no such table), in ``tables``' order, in one statement."""
    if not tables:
        return []
    capture, truncate, _ = trigger_names(tracking_schema)
    params = {
        "schemas": [t.schema for t in tables],
        "names": [t.name for t in tables],
        "tracking": tracking_schema,
        "triggers": [capture, truncate],
    }
    rows = await (await conn.execute(_FINGERPRINTS, params)).fetchall()
    return [row[0] for row in rows]


def table_info(table_config: TableConfig, found: CatalogTable, fingerprint: str) -> TableInfo:
    """The published columns, primary key first, each checked for a JSON mapping;
    reserved (``@``) columns left out when the config lists no columns."""
    if not found.primary_key:
        raise SchemaError(f"{table_config.table}: the table has no primary key; cdc-sync needs one")
    reserved_key = [k for k in found.primary_key if k.startswith("@")]
    if reserved_key:
        raise SchemaError(
            f"{table_config.table}: primary-key column {reserved_key[0]!r} cannot be published: names "
            "starting with @ are reserved (documents carry @v, @ts, @del); rename the column"
        )
    left_out: tuple[str, ...] = ()
    if table_config.columns is not None:
        wanted = list(table_config.columns)  # the config loader refuses @ names here
    else:
        wanted = [c.name for c in found.columns]
        left_out = tuple(c for c in wanted if c.startswith("@"))
        wanted = [c for c in wanted if c not in left_out]
    for column in left_out:
        log.warning(
            "%s.%s: column left out of the documents: names starting with @ are reserved "
            "(rename it, or list the table's columns in the config to silence this)",
            table_config.table,
            column,
        )
    names = [*found.primary_key, *(c for c in wanted if c not in found.primary_key)]
    return TableInfo(
        table_config.table,
        found.schema,
        found.name,
        found.primary_key,
        tuple(_published(table_config, found, name) for name in names),
        identity=str(found.oid),
        fingerprint=fingerprint,
        left_out=left_out,
    )


def _published(table_config: TableConfig, found: CatalogTable, name: str) -> Column:
    column = found.column(name)
    if column is None:
        known = ", ".join(c.name for c in found.columns)
        where = ""
        if table_config.columns is not None and name in table_config.columns:
            line = dict(table_config.field_lines).get("columns", table_config.line)
            where = (
                f"; {table_config.file}:{line}: tables[{table_config.index}].columns lists it: "
                "remove it there, or add the column back"
            )
        raise SchemaError(f"{table_config.table}: no column {name!r} (the table has: {known}){where}")
    check_supported(table_config.table, column)
    return Column(name, column.type_name, not column.not_null)
