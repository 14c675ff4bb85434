"""What the sidecar's PostgreSQL role needs, as checks and as GRANTs: one list,
read by ``cdc doctor`` (which of them the connected role lacks, with the
statement that grants each) and by ``cdc tracking enable --grant-to ROLE``
(which grants them all). docs/POSTGRES.md explains each.

The runtime (``cdc run``) reads, per registered table:

- USAGE on the table's schema and on the tracking schema;
- SELECT on the table, at the table level: the snapshot takes ``LOCK TABLE
  ... IN ACCESS SHARE MODE``, which needs "a table-level privilege" (the LOCK
  page of the PostgreSQL manual), so column grants are not enough;
- SELECT on the tracking registry ``<schema>.tracked_tables`` and on the
  table's net table ``<schema>.<net>``.

The retention cleanup (every ``source.cleanup_interval``; 0: never) calls
``<schema>.cleanup(...)``: EXECUTE on it, and, unless the function is
``SECURITY DEFINER`` (then it runs with its owner's privileges), what its body
does as the caller: ``SELECT ... FOR UPDATE`` and ``UPDATE`` on the registry,
``DELETE`` from each net table, and SELECT, INSERT, UPDATE, DELETE on the
deployments' retention claims (``pg_retention``). Whether it is a
definer, and its argument list, are read from ``pg_proc``, so the check
follows the function that is installed. These are privilege checks
(``has_*_privilege``), not a cleanup run: the function is never called, and
nothing is locked or deleted by asking.

Checks take catalog oids, never names parsed by ``to_regclass``: parsing a
name in a schema the role has no USAGE on raises "permission denied for
schema" instead of answering. An object that does not exist answers NULL, and
is left to the tracking findings (not enabled, no such table).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from cdc.config import TableConfig
from cdc.errors import ConfigError
from cdc.sources import pg_retention
from cdc.sources.base import Finding
from cdc.sources.pg_catalog import Connection
from cdc.sources.pg_tracking import net_table_name

REGISTRY = "tracked_tables"
CLEANUP = "cleanup"
SHARED = "source privileges"  # the subject of what every table needs alike


@dataclass(frozen=True)
class Need:
    """One privilege on one object. ``name`` is empty for a schema; ``args``
    is a function's identity argument list (``pg_get_function_identity_arguments``)."""

    subject: str  # the table it is needed for, or SHARED
    privilege: str  # USAGE, SELECT, UPDATE, DELETE, EXECUTE
    kind: str  # schema, table, function
    schema: str
    name: str
    why: str
    args: str = ""
    cleanup: bool = False  # needed by the retention cleanup only

    @property
    def target(self) -> str:
        """The object as a reader would write it: ``schema s``, ``table s.t``, ``function s.f(interval)``."""
        if self.kind == "schema":
            return f"schema {self.schema}"
        suffix = f"({self.args})" if self.kind == "function" else ""
        return f"{self.kind} {self.schema}.{self.name}{suffix}"

    def grant(self, role: str) -> sql.Composed:
        """The GRANT that gives ``role`` this privilege."""
        if self.kind == "schema":
            target: sql.Composable = sql.Identifier(self.schema)
        elif self.kind == "function":
            # identity arguments are type names as the server printed them: SQL, never user input
            target = sql.SQL("{}({})").format(sql.Identifier(self.schema, self.name), sql.SQL(self.args))
        else:
            target = sql.Identifier(self.schema, self.name)
        return sql.SQL("GRANT {} ON {} {} TO {}").format(
            sql.SQL(self.privilege), sql.SQL(self.kind.upper()), target, sql.Identifier(role)
        )


@dataclass(frozen=True)
class CleanupFunction:
    args: str  # identity arguments, e.g. "retention interval"
    definer: bool  # SECURITY DEFINER: runs with its owner's privileges


def read_needs(tracking: str, tables: Sequence[TableConfig]) -> list[Need]:
    """What reading the tables' changes and snapshots needs."""
    needs = [
        Need(SHARED, "USAGE", "schema", tracking, "", "every read looks its changes up there"),
        Need(
            SHARED,
            "SELECT",
            "table",
            tracking,
            REGISTRY,
            "every read checks the table's minimum valid version",
        ),
    ]
    for table_config in tables:
        needs += table_needs([table_config])
        needs.append(
            Need(
                table_config.table,
                "SELECT",
                "table",
                tracking,
                net_table_name(table_config.schema, table_config.name),
                "its net changes",
            )
        )
    return _unique(needs)


def table_needs(tables: Sequence[TableConfig]) -> list[Need]:
    """What reading the tables' own rows needs (snapshots, changed rows; with
    logical capture, a value the WAL does not carry)."""
    needs = []
    for table_config in tables:
        needs += [
            Need(table_config.table, "USAGE", "schema", table_config.schema, "", "to reach the table"),
            Need(
                table_config.table,
                "SELECT",
                "table",
                table_config.schema,
                table_config.name,
                "reads its rows; the snapshot's LOCK TABLE ... IN ACCESS SHARE MODE needs it on the "
                "table, column grants are not enough",
            ),
        ]
    return _unique(needs)


def cleanup_needs(
    tracking: str, tables: Sequence[TableConfig], functions: Sequence[CleanupFunction]
) -> list[Need]:
    """What the sidecar's retention cleanup needs: the scoped ``cleanup`` it
    calls (``pg_retention``), or, on a schema installed before it, the
    one-argument form, whichever is installed."""
    scoped = [f for f in functions if f.args == pg_retention.SCOPED_ARGS]
    needs: list[Need] = []
    for function in scoped or functions:
        needs.append(
            Need(
                SHARED, "EXECUTE", "function", tracking, CLEANUP, "the retention cleanup", function.args, True
            )
        )
        if function.definer:
            continue  # runs as its owner: EXECUTE is all the caller needs
        why = "cleanup raises minimum valid versions"
        needs += [
            Need(SHARED, privilege, "table", tracking, REGISTRY, why, cleanup=True)
            for privilege in pg_retention.REGISTRY_PRIVILEGES
        ]
        if function in scoped:
            why = "cleanup renews this deployment's retention claims and drops lapsed ones"
            needs += [
                Need(SHARED, privilege, "table", tracking, pg_retention.CLAIMS, why, cleanup=True)
                for privilege in pg_retention.CLAIMS_PRIVILEGES
            ]
        for table_config in tables:
            net = net_table_name(table_config.schema, table_config.name)
            needs += [
                Need(
                    table_config.table,
                    privilege,
                    "table",
                    tracking,
                    net,
                    "cleanup deletes old entries",
                    cleanup=True,
                )
                for privilege in pg_retention.NET_TABLE_PRIVILEGES
            ]
    return _unique(needs)


def _unique(needs: list[Need]) -> list[Need]:
    """First of each (privilege, object): two tables of one schema need its USAGE once."""
    seen: dict[tuple[str, str, str, str, str], Need] = {}
    for need in needs:
        seen.setdefault((need.privilege, need.kind, need.schema, need.name, need.args), need)
    return list(seen.values())


_CLEANUP_FUNCTIONS = """
    select pg_get_function_identity_arguments(p.oid), p.prosecdef
    from pg_proc p join pg_namespace n on n.oid = p.pronamespace
    where n.nspname = %s and p.proname = %s order by 1
"""


async def cleanup_functions(conn: Connection, tracking: str) -> list[CleanupFunction]:
    """The installed ``<tracking>.cleanup`` functions (none before ``tracking enable``)."""
    rows = await (await conn.execute(_CLEANUP_FUNCTIONS, [tracking, CLEANUP])).fetchall()
    return [CleanupFunction(str(args), bool(definer)) for args, definer in rows]


# One row per need, in order: true, false, or NULL when the object does not exist.
_CHECK = """
    select case r.kind
        when 'schema' then (select has_schema_privilege(n.oid, r.privilege) from pg_namespace n
                            where n.nspname = r.schema)
        when 'table' then (select has_table_privilege(c.oid, r.privilege) from pg_class c
                           join pg_namespace n on n.oid = c.relnamespace
                           where n.nspname = r.schema and c.relname = r.name)
        when 'function' then (select has_function_privilege(p.oid, r.privilege) from pg_proc p
                              join pg_namespace n on n.oid = p.pronamespace
                              where n.nspname = r.schema and p.proname = r.name
                                and pg_get_function_identity_arguments(p.oid) = r.args)
    end
    from unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[])
         with ordinality as r(kind, privilege, schema, name, args, n)
    order by r.n
"""


async def missing(conn: Connection, needs: Sequence[Need]) -> list[Need]:
    """The needs the connected role (``current_user``, its inherited roles
    included) lacks, in one round trip; objects that do not exist are skipped."""
    if not needs:
        return []
    columns = [[getattr(n, a) for n in needs] for a in ("kind", "privilege", "schema", "name", "args")]
    rows = await (await conn.execute(_CHECK, columns)).fetchall()
    return [need for need, (held,) in zip(needs, rows, strict=True) if held is False]


def privilege_finding(role: str, need: Need) -> Finding:
    """``cdc doctor``'s error for a privilege ``role`` lacks, with its GRANT."""
    grant = statement(need.grant(role))
    extra = {"grant": grant, "privilege": need.privilege, "object": need.target, "cleanup": need.cleanup}
    return Finding(
        "error",
        need.subject,
        f"role {role} lacks {need.privilege} on {need.target} ({need.why}): {grant}",
        extra,
    )


async def current_role(conn: Connection) -> str:
    row = await (await conn.execute("select current_user")).fetchone()
    return str(row[0]) if row else ""


# -- cdc tracking enable --grant-to ROLE ----------------------------------------


async def grant_runtime(
    conn: Connection, tracking: str, tables: Sequence[TableConfig], role: str
) -> list[str]:
    """Grant ``role`` what the runtime needs on ``tables`` now (each GRANT is
    idempotent), and on what is created later:

    - in the tracking schema, the net tables a later ``tracking enable`` makes
      (``ALTER DEFAULT PRIVILEGES IN SCHEMA``, for objects this role creates);
    - in each source schema, the tables their owner creates later (``FOR ROLE
      <owner>``): a table added to the config and enabled is readable at once.

    Runs in the enable's transaction, after the tables are enabled (their net
    tables exist). An unknown role is a ConfigError (exit 2), nothing granted."""
    await check_role(conn, role)
    functions = await cleanup_functions(conn, tracking)
    needs = read_needs(tracking, tables) + cleanup_needs(tracking, tables, functions)
    for need in needs:
        await conn.execute(need.grant(role))
    done = [f"{role}: granted {', '.join(f'{n.privilege} on {n.target}' for n in needs)}"]
    ident = sql.Identifier(role)
    await conn.execute(
        sql.SQL("alter default privileges in schema {} grant select, delete on tables to {}").format(
            sql.Identifier(tracking), ident
        )
    )
    done.append(f"{role}: SELECT, DELETE on the net tables created later in schema {tracking}")
    return done + await grant_later_tables(conn, tables, role)


async def grant_later_tables(conn: Connection, tables: Sequence[TableConfig], role: str) -> list[str]:
    """SELECT for ``role`` on the tables that each source schema's table owners
    create later (``ALTER DEFAULT PRIVILEGES FOR ROLE <owner>``): a table added
    to the config and enabled, or dropped and created again, is readable at once."""
    done = []
    for schema, owner in await _owners(conn, tables):
        await conn.execute(
            sql.SQL("alter default privileges for role {} in schema {} grant select on tables to {}").format(
                sql.Identifier(owner), sql.Identifier(schema), sql.Identifier(role)
            )
        )
        done.append(f"{role}: SELECT on tables {owner} creates later in schema {schema}")
    return done


async def has_replication(conn: Connection, role: str) -> bool:
    """The REPLICATION attribute (or superuser) a logical slot's functions need."""
    row = await (
        await conn.execute("select rolreplication or rolsuper from pg_roles where rolname = %s", [role])
    ).fetchone()
    return bool(row and row[0])


async def check_role(conn: Connection, role: str) -> None:
    """``--grant-to``'s role must exist: else a ConfigError (exit 2), nothing granted."""
    row = await (await conn.execute("select 1 from pg_roles where rolname = %s", [role])).fetchone()
    if row is None:
        raise ConfigError(f"--grant-to: there is no role {role!r} (CREATE ROLE {role} LOGIN first)")


async def _owners(conn: Connection, tables: Sequence[TableConfig]) -> list[tuple[str, str]]:
    """(schema, owner) of the tables, each pair once."""
    rows = await (
        await conn.execute(
            "select distinct n.nspname, pg_get_userbyid(c.relowner) from pg_class c"
            " join pg_namespace n on n.oid = c.relnamespace"
            " join unnest(%s::text[], %s::text[]) as t(schema, name) on n.nspname = t.schema and c.relname = t.name"
            " order by 1, 2",
            [[t.schema for t in tables], [t.name for t in tables]],
        )
    ).fetchall()
    return [(str(schema), str(owner)) for schema, owner in rows]


# -- cdc tracking enable: the tables this role cannot enable ----------------------

# ALTER TABLE (the triggers' ENABLE ALWAYS) needs the privileges of the table's
# owner: being it, or a member of it that inherits them (pg_has_role ... 'USAGE').
_NOT_OWNED = """
    select t.schema || '.' || t.name, pg_get_userbyid(c.relowner)
    from unnest(%s::text[], %s::text[]) with ordinality as t(schema, name, n)
    join pg_namespace n on n.nspname = t.schema
    join pg_class c on c.relnamespace = n.oid and c.relname = t.name
    where not pg_has_role(c.relowner, 'USAGE')
    order by t.n
"""


async def not_owned(conn: Connection, tables: Sequence[TableConfig]) -> list[tuple[str, str]]:
    """(table, owner) of each table the connected role does not own."""
    rows = await (
        await conn.execute(_NOT_OWNED, [[t.schema for t in tables], [t.name for t in tables]])
    ).fetchall()
    return [(str(table), str(owner)) for table, owner in rows]


TRIGGERS_NEED = "Creating and enabling the tracking triggers needs the privileges of each table's owner."
PUBLICATIONS_NEED = "Adding a table to its publication needs the privileges of the table's owner."


def ownership_error(role: str, refused: Sequence[tuple[str, str]], needs: str = TRIGGERS_NEED) -> str:
    """All the tables at once, each with its owner, and the two ways out."""
    listed = "; ".join(f"{table} (owned by {owner})" for table, owner in refused)
    owners = ", ".join(sorted({quoted(owner) for _, owner in refused}))
    return (
        f"cannot enable change tracking: role {role} does not own {len(refused)} table(s): {listed}. "
        f"{needs} Run cdc tracking enable as the owner, or make this role a member of it (GRANT {owners} TO "
        f"{quoted(role)}); nothing was changed"
    )


def quoted(name: str) -> str:
    """``name`` as an identifier in a statement (always double-quoted)."""
    return sql.Identifier(name).as_string(None)


def statement(composed: sql.Composable) -> str:
    """A statement as text to print (identifiers quoted, no connection needed)."""
    return composed.as_string(None) + ";"
