"""The change tracking that ``cdc tracking enable`` installs in PostgreSQL.

PostgreSQL has no built-in change tracking (DESIGN.md §2), so cdc-sync brings
its own, in one schema (``cdc_tracking`` unless configured otherwise)::

    <schema>.tracked_tables      registry: "schema.name" -> net table, min_valid_version,
                                 table_oid (the table object tracking was enabled for)
    <schema>.<net table>         per tracked table, one row per changed primary key:
                                 op (I/U/D), version, creation_version,
                                 column_versions {column: version}, changed_at
    <schema>.<net>_capture()     row trigger: upserts the key's net row (``pg_capture``)
    <schema>.on_truncate()       TRUNCATE: forgets the table's entries and raises
                                 its min_valid_version (a truncate is not tracked)
    <schema>.notify()            statement trigger: pg_notify('<schema>', 'schema.name')
    <schema>.retention_claims    per tracked table and deployment: the retention it needs
    <schema>.cleanup(...)        retention: deletes old entries, raises min_valid_version
                                 (``cdc.sources.pg_retention``: scoped to a deployment)

A version is the writing transaction's id (``pg_current_xact_id()``). Readers
only take entries below their snapshot's ``xmin``, where every transaction has
ended, so an entry can never appear later below a version a reader passed.
The capture functions are ``SECURITY DEFINER`` (with a fixed search_path): the
applications that write the tables need no privilege on the tracking schema.
Their triggers are ``ENABLE ALWAYS`` so that changes applied by logical
replication (``session_replication_role = replica``) are tracked too.

Every name goes through ``psycopg.sql.Identifier`` and every value through a
literal or a parameter; function bodies are composed the same way, then passed
to ``CREATE FUNCTION`` as one string literal.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from psycopg import sql

from cdc.errors import SchemaError
from cdc.sources import pg_capture, pg_retention
from cdc.sources.pg_catalog import CatalogTable, Connection, find_table

# Columns of a net table besides the primary key: a source key column cannot share a name.
META_COLUMNS = ("op", "version", "creation_version", "column_versions", "changed_at")
# pg_trigger.tgenabled of a trigger that does not fire for the applications'
# own writes: missing, disabled, or ENABLE REPLICA (fires only for what
# logical replication applies).
UNCAPTURED = ("", "D", "R")
_MAX_NAME = 63  # PostgreSQL's NAMEDATALEN - 1, in bytes


def _clip(name: str, size: int) -> str:
    return name.encode()[:size].decode(errors="ignore")


def net_table_name(schema: str, name: str) -> str:
    """Readable, unique and short enough: the table's name and a hash of "schema.name"."""
    digest = hashlib.sha1(f"{schema}.{name}".encode()).hexdigest()[:8]
    return f"{_clip(name, 40)}_{digest}"


def trigger_names(tracking_schema: str) -> tuple[str, str, str]:
    """Row capture, truncate and notify triggers; named after the tracking schema so
    that two tracking schemas never replace each other's triggers."""
    base = _clip(tracking_schema, _MAX_NAME - 9)
    return f"{base}_capture", f"{base}_truncate", f"{base}_notify"


# -- schema-wide objects -----------------------------------------------------

_REGISTRY = """
create table if not exists {registry} (
    table_name text primary key,  -- "schema.name"
    net_table text not null unique,
    min_valid_version bigint not null,
    enabled_at timestamptz not null default now(),
    table_oid oid,  -- NULL: enabled by a version that did not record it
    expired_by text  -- what raised min_valid_version last (pg_retention)
)"""

# Registries installed before table_oid existed gain it (NULL: not known).
_MIGRATE_REGISTRY = "alter table {registry} add column if not exists table_oid oid"

_NOTIFY = """
begin
    perform pg_notify({channel}, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    return null;
end"""

_ON_TRUNCATE = """
declare
    _cdc_net text;
begin
    for _cdc_net in
        update {registry}
           set min_valid_version = greatest(min_valid_version, pg_current_xact_id()::text::bigint),
               expired_by = format('a TRUNCATE at %s removed every entry', {now})
         where table_oid = TG_RELID or (table_oid is null and table_name = TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME)
        returning net_table
    loop
        execute format('delete from %I.%I', {schema}, _cdc_net);
    end loop;
    return null;
end"""


def _function(
    conn: Connection, name: sql.Identifier, args: str, returns: str, body: sql.Composable, definer: bool
) -> sql.Composed:
    """CREATE OR REPLACE FUNCTION with a composed plpgsql body passed as a literal."""
    security = "security definer set search_path = pg_catalog, pg_temp" if definer else ""
    return sql.SQL("create or replace function {}({}) returns {} language plpgsql {} as {}").format(
        name, sql.SQL(args), sql.SQL(returns), sql.SQL(security), sql.Literal(body.as_string(conn))
    )


async def install_schema(conn: Connection, schema: str) -> None:
    """The schema, the registry and the shared functions (idempotent)."""
    ident, registry = sql.Identifier(schema), sql.Identifier(schema, "tracked_tables")
    literal = sql.Literal(schema)
    await conn.execute(sql.SQL("create schema if not exists {}").format(ident))
    await conn.execute(sql.SQL(_REGISTRY).format(registry=registry))
    await conn.execute(sql.SQL(_MIGRATE_REGISTRY).format(registry=registry))
    await conn.execute(sql.SQL(pg_retention.MIGRATE_REGISTRY).format(registry=registry))
    claims = sql.Identifier(schema, pg_retention.CLAIMS)
    await conn.execute(sql.SQL(pg_retention.CLAIMS_TABLE).format(claims=claims, registry=registry))
    now = sql.SQL(pg_retention.NOW_TEXT)
    bodies = {
        "notify": (sql.SQL(_NOTIFY).format(channel=literal), False),
        "on_truncate": (sql.SQL(_ON_TRUNCATE).format(registry=registry, schema=literal, now=now), True),
    }
    for name, (body, definer) in bodies.items():
        await conn.execute(_function(conn, sql.Identifier(schema, name), "", "trigger", body, definer))
    await _install_cleanup(conn, schema)


async def _install_cleanup(conn: Connection, schema: str) -> None:
    """The sidecar's scoped cleanup and the 0.2 one-argument form, which calls it
    (``pg_retention``). Run with the caller's rights: a source user that may not
    delete the entries cannot make another role do it."""
    fn = sql.Identifier(schema, "cleanup")
    scoped = pg_retention.scoped_body(schema)
    await conn.execute(_function(conn, fn, pg_retention.SCOPED_ARGS, "bigint", scoped, False))
    unscoped = pg_retention.unscoped_body(schema)
    await conn.execute(_function(conn, fn, "retention interval", "bigint", unscoped, False))


async def lock_schema(conn: Connection, schema: str) -> None:
    """Serialize enable/disable across sidecars for the transaction's duration."""
    await conn.execute("select pg_advisory_xact_lock(hashtext(%s))", [f"cdc-sync tracking {schema}"])


# -- per-table objects -------------------------------------------------------


def check_trackable(table: CatalogTable) -> None:
    """A net table needs the source's primary key, under names free for its own columns."""
    if not table.primary_key:
        raise SchemaError(f"{table.qualified}: the table has no primary key; change tracking needs one")
    taken = [k for k in table.primary_key if k in META_COLUMNS or k.startswith("_cdc_")]
    if taken:
        raise SchemaError(
            f"{table.qualified}: primary-key column {taken[0]!r} clashes with a change-tracking column "
            f"({', '.join(META_COLUMNS)})"
        )


async def net_table_fits(conn: Connection, schema: str, net: str, table: CatalogTable) -> bool:
    """The existing net table (if any) has the source's primary key, same names and types."""
    existing = await find_table(conn, schema, net)
    if existing is None:
        return False

    def signature(t: CatalogTable) -> list[tuple[str, str | None]]:
        return [(k, c.type_name if (c := t.column(k)) else None) for k in t.primary_key]

    return signature(existing) == signature(table)


async def _create_net_table(conn: Connection, schema: str, net: str, table: CatalogTable) -> None:
    """Key columns copied from the source (types, typmods, collations), plus the metadata."""
    target = sql.Identifier(schema, net)
    keys = sql.SQL(", ").join(map(sql.Identifier, table.primary_key))
    source = sql.Identifier(table.schema, table.name)
    await conn.execute(sql.SQL("drop table if exists {}").format(target))
    await conn.execute(
        sql.SQL("create table {} as select {} from {} with no data").format(target, keys, source)
    )
    await conn.execute(
        sql.SQL(
            "alter table {} add column op char(1) not null, add column version bigint not null,"
            " add column creation_version bigint not null,"
            " add column column_versions jsonb not null default '{{}}',"
            " add column changed_at timestamptz not null, add primary key ({})"
        ).format(target, keys)
    )
    await conn.execute(sql.SQL("create index on {} (version, {})").format(target, keys))


async def _register(conn: Connection, schema: str, table: CatalogTable, net: str) -> None:
    """(Re)start the table's history: checkpoints from before this transaction are invalid."""
    await conn.execute(
        sql.SQL(
            "insert into {} (table_name, net_table, min_valid_version, table_oid, expired_by)"
            " values (%s, %s, pg_current_xact_id()::text::bigint, %s,"
            " format('change tracking was (re-)enabled at %%s: its history starts there', {}))"
            " on conflict (table_name) do update set net_table = excluded.net_table,"
            " min_valid_version = excluded.min_valid_version, enabled_at = now(), table_oid = excluded.table_oid,"
            " expired_by = excluded.expired_by"
        ).format(sql.Identifier(schema, "tracked_tables"), sql.SQL(pg_retention.NOW_TEXT)),
        [table.qualified, net, table.oid],
    )


async def _record_oid(conn: Connection, schema: str, table: CatalogTable) -> None:
    """Remember which table object an entry from before ``table_oid`` tracks (history kept)."""
    await conn.execute(
        sql.SQL("update {} set table_oid = %s where table_name = %s").format(
            sql.Identifier(schema, "tracked_tables")
        ),
        [table.oid, table.qualified],
    )


async def _create_triggers(conn: Connection, schema: str, net: str, table: CatalogTable) -> None:
    capture, truncate, notify = trigger_names(schema)
    function = sql.Identifier(schema, f"{net}_capture")
    body = pg_capture.capture_body(schema, net, table.primary_key, tuple(c.name for c in table.columns))
    await conn.execute(_function(conn, function, "", "trigger", body, True))
    source = sql.Identifier(table.schema, table.name)
    triggers = (
        (capture, "insert or update or delete", "row", function),
        (truncate, "truncate", "statement", sql.Identifier(schema, "on_truncate")),
        (notify, "insert or update or delete or truncate", "statement", sql.Identifier(schema, "notify")),
    )
    for name, events, level, fn in triggers:
        trigger = sql.Identifier(name)
        await conn.execute(sql.SQL("drop trigger if exists {} on {}").format(trigger, source))
        await conn.execute(
            sql.SQL("create trigger {} after {} on {} for each {} execute function {}()").format(
                trigger, sql.SQL(events), source, sql.SQL(level), fn
            )
        )
        await conn.execute(sql.SQL("alter table {} enable always trigger {}").format(source, trigger))


async def enable_table(conn: Connection, schema: str, table: CatalogTable) -> str:
    """Track ``table`` (idempotent). The history is kept when the registry entry is
    this very table object, its triggers were in place and its net table still
    fits the primary key; else it restarts (``_restart_reason``): checkpoints
    expire and the sidecar snapshots the table again."""
    check_trackable(table)
    net = net_table_name(table.schema, table.name)
    entry = await registry_entry(conn, schema, table.qualified)
    restart = await _restart_reason(conn, schema, table, net, entry)
    if restart is not None:
        await _create_net_table(conn, schema, net, table)
        await _register(conn, schema, table, net)
    elif entry is not None and entry.table_oid is None:
        await _record_oid(conn, schema, table)
    released = ""
    if entry is not None and entry.table_oid not in (None, table.oid):
        released = await _release_old_table(conn, schema, entry.table_oid)
    await _create_triggers(conn, schema, net, table)
    state = restart or "already enabled, triggers refreshed"
    return f"{table.qualified}: change tracking {state} (net table {schema}.{net}){released}"


async def _restart_reason(
    conn: Connection, schema: str, table: CatalogTable, net: str, entry: RegistryEntry | None
) -> str | None:
    """Why the table's history must start (again), or None to keep it."""
    if entry is None:
        return "enabled"
    if entry.table_oid not in (None, table.oid):
        return "enabled again: the table was re-created since tracking was enabled: history restarted"
    if await _changes_missed(conn, schema, table):
        return "enabled again: its capture or truncate trigger was missing or disabled: history restarted"
    if entry.net_table != net or not await net_table_fits(conn, schema, net, table):
        return "enabled again: the primary key no longer fits the net table: history restarted"
    return None


async def _changes_missed(conn: Connection, schema: str, table: CatalogTable) -> bool:
    """Whether the table's capture or truncate trigger is missing or disabled: changes
    may have gone unrecorded, so no checkpoint can be trusted any more."""
    capture, truncate, _ = trigger_names(schema)
    states = await trigger_states(conn, schema, table.oid)
    return states[capture] in UNCAPTURED or states[truncate] in UNCAPTURED


async def _release_old_table(conn: Connection, schema: str, old_oid: int) -> str:
    """The table object tracking was enabled for, when it still exists under another
    name (renamed away, then a new table took its name): its triggers would go on
    writing its changes into the net table that is now the new table's. Dropped,
    unless that object is tracked under its new name (its triggers are its own)."""
    row = await (
        await conn.execute(
            sql.SQL(
                "select n.nspname, c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace"
                " where c.oid = %s and not exists (select from {} r where r.table_name = n.nspname || '.' || c.relname)"
            ).format(sql.Identifier(schema, "tracked_tables")),
            [old_oid],
        )
    ).fetchone()
    if row is None:
        return ""
    for name in trigger_names(schema):
        await conn.execute(
            sql.SQL("drop trigger if exists {} on {}").format(sql.Identifier(name), sql.Identifier(*row))
        )
    return f"; the table it replaced, now {row[0]}.{row[1]}, is no longer tracked"


async def disable_table(conn: Connection, schema: str, table_schema: str, table_name: str) -> str:
    """Drop the table's triggers, capture function, net table and registry entry."""
    qualified = f"{table_schema}.{table_name}"
    source = await find_table(conn, table_schema, table_name)
    if source is not None:
        for name in trigger_names(schema):
            await conn.execute(
                sql.SQL("drop trigger if exists {} on {}").format(
                    sql.Identifier(name), sql.Identifier(table_schema, table_name)
                )
            )
    entry = await registry_entry(conn, schema, qualified)
    if entry is None:
        return f"{qualified}: change tracking was not enabled"
    await conn.execute(sql.SQL("drop table if exists {}").format(sql.Identifier(schema, entry.net_table)))
    function = sql.Identifier(schema, f"{entry.net_table}_capture")
    await conn.execute(sql.SQL("drop function if exists {}()").format(function))
    await conn.execute(
        sql.SQL("delete from {} where table_name = %s").format(sql.Identifier(schema, "tracked_tables")),
        [qualified],
    )
    return f"{qualified}: change tracking disabled"


async def drop_schema_if_unused(conn: Connection, schema: str) -> bool:
    """Drop the tracking schema once no table is tracked any more."""
    if not await installed(conn, schema):
        return False
    registry = sql.Identifier(schema, "tracked_tables")
    row = await (await conn.execute(sql.SQL("select count(*) from {}").format(registry))).fetchone()
    if row is None or row[0] > 0:
        return False
    await conn.execute(sql.SQL("drop schema {} cascade").format(sql.Identifier(schema)))
    return True


# -- what is installed -------------------------------------------------------


@dataclass(frozen=True)
class RegistryEntry:
    table: str
    net_table: str
    min_valid_version: int
    table_oid: int | None = None  # None: not recorded (enabled before table_oid existed)


async def installed(conn: Connection, schema: str) -> bool:
    row = await (
        await conn.execute("select to_regclass(format('%%I.tracked_tables', %s::text)) is not null", [schema])
    ).fetchone()
    return bool(row and row[0])


async def registry_entry(conn: Connection, schema: str, table: str) -> RegistryEntry | None:
    if not await installed(conn, schema):
        return None
    # table_oid through to_jsonb: a registry not migrated yet (enable not run since
    # the upgrade) has no such column, and must still be readable
    query = sql.SQL(
        "select table_name, net_table, min_valid_version, (to_jsonb(r) ->> 'table_oid')::oid"
        " from {} as r where table_name = %s"
    )
    row = await (
        await conn.execute(query.format(sql.Identifier(schema, "tracked_tables")), [table])
    ).fetchone()
    return RegistryEntry(*row) if row else None


async def trigger_states(conn: Connection, schema: str, table_oid: int) -> dict[str, str]:
    """Each of this schema's triggers on the table -> pg_trigger.tgenabled ('' when missing)."""
    names = list(trigger_names(schema))
    rows = await (
        await conn.execute(
            "select tgname, tgenabled from pg_trigger where tgrelid = %s and tgname = any(%s)",
            [table_oid, names],
        )
    ).fetchall()
    found = {name: str(enabled) for name, enabled in rows}
    return {name: found.get(name, "") for name in names}
