"""Describing a SQL Server table: its columns, primary key and tracking, from the catalog.

A described table (``DescribedTable``) carries what reads and snapshots need
beyond ``TableInfo``: the shape the T-SQL is generated from, each column's
converter, and whether Change Tracking tracks the table and its columns.

``describe`` reads the table's shape fingerprint (``read_fingerprints``: the
text ``ChangeSource.fingerprints`` polls) *before* the catalog, so a change
made while it describes leaves a fingerprint that differs from the one the
sidecar polls next, and the table is described again. Column names starting
with ``@`` are reserved (documents carry ``@v``, ``@ts``, ``@del``): without
an explicit ``columns:`` list such columns are left out, with a warning; a
primary-key column so named is an error.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from cdc.errors import MissingColumn, SchemaError
from cdc.shapes import identity_change
from cdc.sources import mssql_sql as sql
from cdc.sources import mssql_sql_catalog as catalog_sql
from cdc.sources.base import Column, TableInfo
from cdc.sources.mssql_link import execute, fetch_all, fetch_one
from cdc.sources.mssql_types import Converter, converter_for, format_type

log = logging.getLogger("cdc.sources.mssql")
RESERVED = "@"  # the prefix of the documents' own fields (@v, @ts, @del)


@dataclass(frozen=True)
class DescribedTable:
    """A described table: what read_changes and snapshot need beyond TableInfo."""

    info: TableInfo
    shape: sql.TableShape
    converters: dict[str, Converter]  # every published column (key included)
    always_changed: frozenset[str]  # computed/rowversion columns: never in SYS_CHANGE_COLUMNS
    track_columns_updated: bool
    tracked: bool = True  # change tracking is enabled on the table (as of describe)


@dataclass(frozen=True)
class CatalogColumn:
    name: str
    declared: str  # e.g. "nvarchar(50)"
    base: str  # system type under any alias type
    nullable: bool
    computed: bool
    collation: str | None = None  # character columns' (keyset cursors compare in it)
    assembly: bool = False  # a CLR type (sys.types.is_assembly_type): base is its own name


def catalog_columns(conn: Any, schema: str, name: str) -> list[CatalogColumn]:
    out = []
    for row in fetch_all(conn, catalog_sql.columns(schema, name)):
        (
            _,
            column,
            type_name,
            base_name,
            is_assembly,
            max_length,
            precision,
            scale,
            nullable,
            computed,
            collation,
        ) = row
        base = str(type_name if is_assembly or not base_name else base_name)
        declared = format_type(base, int(max_length), int(precision), int(scale))
        out.append(
            CatalogColumn(
                str(column),
                declared,
                base,
                bool(nullable),
                bool(computed),
                collation and str(collation),
                bool(is_assembly),
            )
        )
    return out


@dataclass(frozen=True)
class TableName:
    table: str  # "schema.name" as registered
    schema: str
    name: str


@dataclass(frozen=True)
class Found:
    """A table as a fingerprint read found it: its identity
    (``mssql_sql.FINGERPRINT``: object, tracking start, database) and shape."""

    identity: str
    fingerprint: str


def read_fingerprints(conn: Any, names: Sequence[TableName]) -> list[Found | None]:
    """The shape fingerprint of each table now (None: no such table), in
    order: one statement (one round trip) per ``FINGERPRINT_BATCH`` tables."""
    out: list[Found | None] = []
    for start in range(0, len(names), catalog_sql.FINGERPRINT_BATCH):
        batch = [(n.schema, n.name) for n in names[start : start + catalog_sql.FINGERPRINT_BATCH]]
        for _, identity, fingerprint in fetch_all(conn, catalog_sql.fingerprints(batch)):
            out.append(None if identity is None else Found(str(identity), str(fingerprint)))
    return out


def describe(conn: Any, table_name: TableName, wanted: Sequence[str] | None) -> DescribedTable:
    """Read the fingerprint, then the catalog: columns, primary key in key
    order, tracking; raise SchemaError or UnsupportedType. A table that change
    tracking does not track yet is described all the same (``tracked``
    False): reading its changes or snapshot raises TrackingNotEnabled, as the
    ChangeSource contract has it."""
    execute(conn, sql.SET_READ_COMMITTED)
    [found] = read_fingerprints(conn, [table_name])
    catalog = [] if found is None else catalog_columns(conn, table_name.schema, table_name.name)
    if found is None or not catalog:
        raise SchemaError(
            f"{table_name.table}: no such table in this database (or the login cannot see it: it needs SELECT on it)"
        )
    key_names = [
        str(r[0]) for r in fetch_all(conn, catalog_sql.primary_key(table_name.schema, table_name.name))
    ]
    names, left_out = choose_columns(table_name.table, [c.name for c in catalog], key_names, wanted)
    for column in left_out:
        log.warning(
            "column left out of the documents: names starting with @ are reserved for the documents' own "
            "fields (@v, @ts, @del); rename it (sp_rename), or list the columns to publish under `columns:`",
            extra={"table": table_name.table, "column": column},
        )
    by_name = {c.name: c for c in catalog}
    published = [by_name[n] for n in names]
    converters = column_converters(table_name.table, published, len(key_names))
    tracking = fetch_one(conn, catalog_sql.table_tracking(table_name.schema, table_name.name))
    described = _build_table(table_name, found, published[: len(key_names)], published, converters, tracking)
    return replace(described, info=replace(described.info, left_out=left_out))


def column_converters(table: str, published: Sequence[CatalogColumn], n_key: int) -> dict[str, Converter]:
    """Each published column's converter (the first ``n_key`` are the primary
    key); UnsupportedType for the first column whose type cannot be mirrored."""
    return {
        c.name: converter_for(table, c.name, c.base, c.declared, key=i < n_key, assembly=c.assembly)
        for i, c in enumerate(published)
    }


def check_published(conn: Any, table_name: TableName, wanted: Sequence[str] | None) -> None:
    """UnsupportedType when a column the config publishes (or the primary
    key) has a type that cannot be mirrored: ``cdc tracking enable`` checks
    every table first, so that it installs nothing for a table the sidecar
    would refuse. A table that is missing, has no primary key or lacks a
    listed column is left to enabling and describing, which name it."""
    catalog = catalog_columns(conn, table_name.schema, table_name.name)
    key = [str(r[0]) for r in fetch_all(conn, catalog_sql.primary_key(table_name.schema, table_name.name))]
    if not catalog or not key:
        return
    by_lower = {c.name.lower(): c for c in catalog}
    listed = [
        n for n in (wanted if wanted is not None else [c.name for c in catalog]) if n.lower() in by_lower
    ]
    published = [by_lower[n.lower()] for n in [*key, *listed] if n.lower() in by_lower]
    column_converters(table_name.table, published, len(key))


def choose_columns(
    table: str, catalog: Sequence[str], key: Sequence[str], wanted: Sequence[str] | None
) -> tuple[list[str], tuple[str, ...]]:
    """(published columns, primary key first, in the catalog's spelling;
    columns left out because their names are reserved). ``wanted``: the
    config's ``columns:`` list, None for every column."""
    by_lower = {c.lower(): c for c in catalog}
    if not key:
        raise SchemaError(f"{table}: the table has no primary key, which change tracking requires")
    for column in key:
        if column.lower() not in by_lower:  # renamed between the two catalog reads
            raise SchemaError(
                f"{table}: the table changed while it was described (primary-key column {column} is not among "
                "its columns now): it will be described again"
            )
        if column.startswith(RESERVED):
            raise SchemaError(
                f"{table}: primary-key column {column} starts with @, which is reserved for the documents' own "
                "fields (@v, @ts, @del): rename the column (sp_rename) to publish this table"
            )
    published = [by_lower[c.lower()] for c in key]
    left_out: list[str] = []
    for name in wanted if wanted is not None else catalog:
        spelled = by_lower.get(name.lower())
        if spelled is None:  # the tracker names the config's `columns:` line
            raise MissingColumn(table, name, f"{table}: no column {name} (columns: {', '.join(catalog)})")
        if spelled in published:
            continue
        if wanted is None and spelled.startswith(RESERVED):
            left_out.append(spelled)
        else:
            published.append(spelled)
    return published, tuple(left_out)


def _build_table(
    table_name: TableName,
    found: Found,
    key: list[CatalogColumn],
    published: list[CatalogColumn],
    converters: dict[str, Converter],
    tracking: Any,  # its sys.change_tracking_tables row (is_track_columns_updated_on, ...), None: not tracked
) -> DescribedTable:
    track_columns_updated = tracking is not None and bool(tracking[0])
    key_names = tuple(c.name for c in key)
    # Computed columns never appear in SYS_CHANGE_COLUMNS, and a rowversion changes with
    # every update: when the mask is known, count them as (possibly) changed.
    always = frozenset(c.name for c in published if c.computed or c.base == "timestamp")
    masked = tuple(c.name for c in published if c.name not in key_names and c.name not in always)
    shape = sql.TableShape(
        schema=table_name.schema,
        name=table_name.name,
        primary_key=key_names,
        key_types=tuple(c.declared for c in key),
        key_collations=tuple(c.collation for c in key),
        columns=tuple(c.name for c in published),
        mask_columns=masked if track_columns_updated else (),
        column_types=tuple(c.declared.lower() for c in published),
    )
    try:
        sql.changes(shape, since=0, upto=0, limit=1, after=(0, [None] * len(key_names)))
    except ValueError as exc:
        raise SchemaError(f"{table_name.table}: {exc}") from None
    info = TableInfo(
        table=table_name.table,
        schema=table_name.schema,
        name=table_name.name,
        primary_key=key_names,
        columns=tuple(Column(c.name, c.declared, c.nullable) for c in published),
        identity=found.identity,
        fingerprint=found.fingerprint,
    )
    return DescribedTable(info, shape, converters, always, track_columns_updated, tracking is not None)


def shape_change(was: TableInfo, now: TableInfo) -> str:
    """What differs between two descriptions of a table, in words."""
    if was.identity != now.identity:
        return f"{identity_change(was.identity, now.identity)} (identity {was.identity}, now {now.identity})"
    changes = []
    if was.primary_key != now.primary_key:
        changes.append(f"primary key ({', '.join(was.primary_key)}) is now ({', '.join(now.primary_key)})")
    before = {c.name: c for c in was.columns}
    after = {c.name: c for c in now.columns}
    changes += [f"column {n} is gone" for n in before if n not in after]
    changes += [f"column {n} is new" for n in after if n not in before]
    changes += [
        f"column {n} was {before[n].type_name}{'' if before[n].nullable else ' not null'}, now "
        f"{after[n].type_name}{'' if after[n].nullable else ' not null'}"
        for n in before
        if n in after and before[n] != after[n]
    ]
    return "; ".join(changes) or "its columns changed"


def not_tracked(table: str, schema: str, name: str) -> str:
    return (
        f"{table}: change tracking is not enabled on the table (never enabled, turned off, or the table was "
        f"dropped and created again, which drops its tracking): run `cdc tracking enable --table {table}` "
        f"(ALTER TABLE {sql.qualified(schema, name)} ENABLE CHANGE_TRACKING WITH (TRACK_COLUMNS_UPDATED = ON))"
    )
