"""Describing a SQL Server table: its columns, primary key and tracking, from the catalog.

A described table (``DescribedTable``) carries what reads and snapshots need
beyond ``TableInfo``: the shape the T-SQL is generated from, each column's
converter, and whether Change Tracking tracks the table and its columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from cdc.errors import SchemaError
from cdc.sources import mssql_sql as sql
from cdc.sources.base import Column, TableInfo
from cdc.sources.mssql_link import execute, fetch_all, fetch_one
from cdc.sources.mssql_types import Converter, converter_for, format_type


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


def catalog_columns(conn: Any, schema: str, name: str) -> list[CatalogColumn]:
    out = []
    for row in fetch_all(conn, sql.columns(schema, name)):
        _, column, type_name, base_name, is_assembly, max_length, precision, scale, nullable, computed = row
        base = str(type_name if is_assembly or not base_name else base_name)
        declared = format_type(base, int(max_length), int(precision), int(scale))
        out.append(CatalogColumn(str(column), declared, base, bool(nullable), bool(computed)))
    return out


@dataclass(frozen=True)
class TableName:
    table: str  # "schema.name" as registered
    schema: str
    name: str


def describe(conn: Any, table_name: TableName, wanted: Sequence[str] | None) -> DescribedTable:
    """Read the catalog: columns, primary key in key order, tracking; raise
    SchemaError or UnsupportedType. A table that change tracking does not
    track yet is described all the same (``tracked`` False): reading its
    changes or snapshot raises TrackingNotEnabled, as the ChangeSource
    contract has it."""
    execute(conn, sql.SET_READ_COMMITTED)
    catalog = catalog_columns(conn, table_name.schema, table_name.name)
    if not catalog:
        raise SchemaError(
            f"{table_name.table}: no such table in this database (or the login cannot see it: it needs SELECT on it)"
        )
    by_name = {c.name.lower(): c for c in catalog}
    key = [
        by_name[str(r[0]).lower()]
        for r in fetch_all(conn, sql.primary_key(table_name.schema, table_name.name))
    ]
    if not key:
        raise SchemaError(f"{table_name.table}: the table has no primary key, which change tracking requires")
    published = list(key)
    for name in wanted if wanted is not None else [c.name for c in catalog]:
        column = by_name.get(name.lower())
        if column is None:
            known = ", ".join(c.name for c in catalog)
            raise SchemaError(f"{table_name.table}: no column {name} (columns: {known})")
        if column not in published:
            published.append(column)
    converters = {c.name: converter_for(table_name.table, c.name, c.base, c.declared) for c in published}
    tracking = fetch_one(conn, sql.table_tracking(table_name.schema, table_name.name))
    described = _build_table(
        table_name, key, published, converters, tracking is not None and bool(tracking[0])
    )
    return described if tracking is not None else replace(described, tracked=False)


def _build_table(
    table_name: TableName,
    key: list[CatalogColumn],
    published: list[CatalogColumn],
    converters: dict[str, Converter],
    track_columns_updated: bool,
) -> DescribedTable:
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
        columns=tuple(c.name for c in published),
        mask_columns=masked if track_columns_updated else (),
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
    )
    return DescribedTable(info, shape, converters, always, track_columns_updated)


def not_tracked(table: str, schema: str, name: str) -> str:
    return (
        f"{table}: change tracking is not enabled on the table: run `cdc tracking enable` "
        f"(ALTER TABLE {sql.qualified(schema, name)} ENABLE CHANGE_TRACKING WITH (TRACK_COLUMNS_UPDATED = ON))"
    )
