"""The retention of the change tracking that ``cdc tracking enable`` installs
(``cdc.sources.pg_tracking`` installs these objects; this module says what
they do and runs the sidecar's cleanup).

One database may be mirrored by several deployments (configs with their own
namespace or Redis), each with its own ``source.retention``, all sharing the
tracking schema. A cleanup covering every tracked table with one retention
let the deployment with the shortest retention expire the others' checkpoints
(their tables were snapshotted again). So retention is claimed per table::

    <schema>.retention_claims    table_name, deployment, retention, claimed_at, expires_at
                                 one row per (tracked table, deployment mirroring it)

- A sidecar's cleanup (``cleanup(keep, deployment, tables, claim_for)``)
  first renews its deployment's claim on each table of its config (its
  retention, valid for ``claim_for``), drops the claims that expired, then
  deletes entries of ITS tables only, each below the longest retention that a
  live claim on that table asks for (its own included). A table another
  deployment also mirrors with a longer retention keeps what that one needs;
  a table no other deployment claims is cleaned at this one's retention.
- A claim lasts the claimant's retention plus two of its cleanup intervals
  (``cdc.cleanup_job``): a sidecar down for less than its retention resumes
  without a snapshot however short the others' retentions are (its claim was
  renewed at most one interval before it stopped; one more spares a failed
  run), and a deployment that was removed stops holding the tables back once
  its retention has passed, when its own cleanup would have removed the same
  entries anyway.
- ``cleanup(retention)``, the one-argument form of 0.2 (kept: an
  administrator's scheduled call, or a sidecar of 0.2), covers every tracked
  table, each also below its longest live claim, and claims nothing.
- What raised a table's minimum valid version last (a cleanup, with the
  retention it kept; a TRUNCATE; tracking enabled again) is written beside
  it in the registry (``expired_by``), so an expired checkpoint is told with
  its real cause (``pg_reads.check_window``).

Cleanups run at once (sidecars start together, and each cleans at start)
without deadlocking: each first upserts its claims in table order, then
deletes the lapsed claims SKIP LOCKED (never waiting: another cleanup is
renewing or deleting those), then locks its tables' registry rows in table
order FOR NO KEY UPDATE, which the claims' foreign-key checks (FOR KEY
SHARE) do not wait for. So a cleanup waits on another only while upserting
(on that one's upsert, in the same order, or on its delete, which waits for
nothing) or at a registry row (in the same order). The lapsed claims were
deleted before the upsert in 0.3: two sidecars of one deployment each
deleted part of them (SKIP LOCKED splits them), then each upserted the
claims the other had deleted and waited for the other's commit: a deadlock
(4 to 12 of 2,400 calls, eight at once with every claim lapsed, measured).

Only entries below the snapshot's ``xmin`` are deleted: their transactions
have ended, so a reader whose checkpoint is at or above the highest deleted
version has read them already, and any other reader is told its checkpoint
expired.

What the source user needs for the sidecar's cleanup (besides reading):
UPDATE on ``tracked_tables``, SELECT, INSERT, UPDATE, DELETE on ``retention_claims``
and DELETE on every net table (``cleanup_grants``).
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from cdc.errors import SourceError, TrackingNotEnabled
from cdc.sources.base import CleanupScope
from cdc.sources.pg_catalog import Connection

CLAIMS = "retention_claims"
# The sidecar's cleanup (installed beside the 0.2 one-argument form): its
# argument types, and its arguments as pg_get_function_identity_arguments prints them.
SCOPED_SIGNATURE = "interval, text, text[], interval"
SCOPED_ARGS = "keep interval, for_deployment text, only_tables text[], claim_for interval"

# What the scoped cleanup does as its caller (it is not SECURITY DEFINER), per
# object: the one list that ``cleanup_grants`` (the failing cleanup's message),
# ``cdc doctor`` and ``--grant-to`` (``pg_grants.cleanup_needs``) all read.
# SELECT on the claims: it reads them (max(retention), FOR UPDATE SKIP LOCKED).
REGISTRY_PRIVILEGES = ("UPDATE",)
CLAIMS_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
NET_TABLE_PRIVILEGES = ("DELETE",)

CLAIMS_TABLE = """
create table if not exists {claims} (
    table_name text not null references {registry} (table_name) on delete cascade,
    deployment text not null,  -- the namespace and Redis server of the config that claims it
    retention interval not null,
    claimed_at timestamptz not null,
    expires_at timestamptz not null,
    primary key (table_name, deployment)
)"""

# Registries installed before 0.3 gain the cause of the last raise of min_valid_version.
MIGRATE_REGISTRY = "alter table {registry} add column if not exists expired_by text"

# When it happened, in UTC, to the second: what an operator compares with the logs.
NOW_TEXT = """to_char(now() at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')"""

# Arguments: keep interval, for_deployment text, only_tables text[], claim_for interval.
# for_deployment NULL: claim nothing; only_tables NULL: every tracked table.
SCOPED_CLEANUP = """
declare
    _cdc_table record;
    _cdc_count bigint;
    _cdc_top bigint;
    _cdc_total bigint := 0;
    _cdc_horizon bigint := pg_snapshot_xmin(pg_current_snapshot())::text::bigint;
begin
    if for_deployment is not null then
        insert into {claims} (table_name, deployment, retention, claimed_at, expires_at)
        select r.table_name, for_deployment, keep, now(), now() + claim_for
          from {registry} r where r.table_name = any(only_tables) order by r.table_name
        on conflict (table_name, deployment) do update
           set retention = excluded.retention, claimed_at = excluded.claimed_at,
               expires_at = excluded.expires_at;
        delete from {claims} as c using (
            select table_name, deployment from {claims} where expires_at < now() for update skip locked
        ) as lapsed where c.table_name = lapsed.table_name and c.deployment = lapsed.deployment;
    end if;
    for _cdc_table in
        select r.table_name, r.net_table,
               greatest(keep, (select max(c.retention) from {claims} c
                                where c.table_name = r.table_name and c.expires_at >= now())) as kept
          from {registry} r
         where only_tables is null or r.table_name = any(only_tables)
         order by r.table_name
           for no key update of r
    loop
        execute format('with gone as (delete from %I.%I where changed_at < now() - $1 and version < $2'
                       ' returning version) select count(*), max(version) from gone',
                       {schema}, _cdc_table.net_table)
           into _cdc_count, _cdc_top using _cdc_table.kept, _cdc_horizon;
        if _cdc_count > 0 then
            update {registry}
               set expired_by = case when _cdc_top > min_valid_version then
                       format('the retention cleanup at %s removed its entries older than %s'
                              ' (the longest retention claimed for it)', {now}, {kept})
                       else expired_by end,
                   min_valid_version = greatest(min_valid_version, _cdc_top)
             where table_name = _cdc_table.table_name;
            _cdc_total := _cdc_total + _cdc_count;
        end if;
    end loop;
    return _cdc_total;
end"""

# The 0.2 form: an administrator's cleanup of every table, claiming nothing.
CLEANUP = """
begin
    return {scoped}(retention, null::text, null::text[], null::interval);
end"""


# An interval as the config file writes durations (2d, 1h30m, 1s), whatever the
# session's IntervalStyle: what an operator compares with source.retention.
DURATION_TEXT = """(select coalesce(nullif(concat(
        case when s >= 86400 then s / 86400 || 'd' end, case when s % 86400 >= 3600 then s % 86400 / 3600 || 'h' end,
        case when s % 3600 >= 60 then s % 3600 / 60 || 'm' end, case when s % 60 > 0 then s % 60 || 's' end), ''), '0s')
    from (select extract(epoch from {interval})::bigint as s) as seconds)"""


def scoped_body(schema: str) -> sql.Composed:
    return sql.SQL(SCOPED_CLEANUP).format(
        claims=sql.Identifier(schema, CLAIMS),
        registry=sql.Identifier(schema, "tracked_tables"),
        schema=sql.Literal(schema),
        now=sql.SQL(NOW_TEXT),
        kept=sql.SQL(DURATION_TEXT).format(interval=sql.SQL("_cdc_table.kept")),
    )


def unscoped_body(schema: str) -> sql.Composed:
    return sql.SQL(CLEANUP).format(scoped=sql.Identifier(schema, "cleanup"))


def cleanup_grants(schema: str, user: str) -> str:
    """The statements that let ``user`` run the sidecar's cleanup (an owner runs them)."""
    who = sql.Identifier(user).as_string()
    registry, claims = sql.Identifier(schema, "tracked_tables"), sql.Identifier(schema, CLAIMS)
    net_tables = f"all tables in schema {sql.Identifier(schema).as_string()}"
    granted = (
        (REGISTRY_PRIVILEGES, registry.as_string()),
        (CLAIMS_PRIVILEGES, claims.as_string()),
        (NET_TABLE_PRIVILEGES, net_tables),
    )
    return "; ".join(
        f"grant {', '.join(p.lower() for p in privileges)} on {on} to {who}" for privileges, on in granted
    )


async def _scoped_installed(conn: Connection, schema: str) -> bool:
    query = "select to_regprocedure(format('%%I.cleanup(%%s)', %s::text, %s::text)) is not null"
    row = await (await conn.execute(query, [schema, SCOPED_SIGNATURE])).fetchone()
    return bool(row and row[0])


async def _installed(conn: Connection, schema: str) -> bool:
    row = await (
        await conn.execute("select to_regclass(format('%%I.tracked_tables', %s::text)) is not null", [schema])
    ).fetchone()
    return bool(row and row[0])


async def cleanup(conn: Connection, schema: str, retention: float, scope: CleanupScope | None) -> int:
    """Run the retention cleanup (see the module docstring): scoped to a
    deployment's tables and claims, or, without ``scope``, the 0.2 form over
    every tracked table (still below each table's live claims). Returns how
    many entries were deleted."""
    if not await _installed(conn, schema):
        raise TrackingNotEnabled(f"change tracking is not installed (no schema {schema})")
    if scope is None:
        query = sql.SQL("select {}(make_interval(secs => %s))").format(sql.Identifier(schema, "cleanup"))
        params: list[object] = [retention]
    else:
        if not await _scoped_installed(conn, schema):
            raise SourceError(_older_schema(schema))
        query = sql.SQL(
            "select {}(make_interval(secs => %s), %s, %s::text[], make_interval(secs => %s))"
        ).format(sql.Identifier(schema, "cleanup"))
        params = [retention, scope.deployment, list(scope.tables), scope.claim_for]
    try:
        row = await (await conn.execute(query, params)).fetchone()
    except psycopg.errors.InsufficientPrivilege as exc:
        raise SourceError(_not_permitted(schema, conn.info.user, exc)) from exc
    return int(row[0]) if row else 0


def _older_schema(schema: str) -> str:
    return (
        f"the tracking schema {schema} was installed by a cdc-sync older than 0.3, whose cleanup covers every "
        "tracked table of the database, other deployments' too: nothing was removed. Run `cdc tracking "
        "enable -c FILE` once, as the tables' owner, to install the cleanup scoped to this config's tables "
        "(docs/UPGRADING.md); the tracking tables grow until then"
    )


def _not_permitted(schema: str, user: str, exc: psycopg.errors.InsufficientPrivilege) -> str:
    detail = exc.diag.message_primary or str(exc).strip()
    return (
        f"the source user {user} may not run the retention cleanup of {schema} ({detail}); the tracking "
        f"tables grow until it can. As the tables' owner: {cleanup_grants(schema, user)}; "
        "or set source.cleanup_interval to 0 and have the owner run "
        f"{schema}.cleanup('<retention>') on a schedule"
    )
