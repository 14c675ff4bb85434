"""SQL Server: what ``cdc tracking enable --grant-to USER`` grants, and the
tables the login cannot enable.

The runtime reads each table's changes with the change tracking functions,
which need "SELECT permission on at least the primary key columns on the
change-tracked table" and "VIEW CHANGE TRACKING permission on the table"
("Manage change tracking (SQL Server)", learn.microsoft.com, Security): both
are granted on the table (SELECT on the table also covers the published
columns, and columns added later). Nothing ``cdc run`` sends needs VIEW
DATABASE STATE: it reads no dynamic management view (only ``tracking
enable`` does, to name the sessions that ``ALTER DATABASE`` waits for:
``mssql_isolation``), so it is neither checked nor granted.

Enabling a table's tracking is ``ALTER TABLE ... ENABLE CHANGE_TRACKING``,
which needs permission "to modify the table" ("Table Properties (Change
Tracking Page)", learn.microsoft.com): ALTER on it, checked for every table
at once with ``HAS_PERMS_BY_NAME(table, 'OBJECT', 'ALTER')`` before anything
is changed.

Names are bracket-quoted (``mssql_sql.quote``) where T-SQL takes no
parameter (a GRANT's securable and principal); everything else is a parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdc.config import TableConfig
from cdc.errors import ConfigError, SourceError
from cdc.sources import mssql_sql as sql
from cdc.sources.mssql_link import execute, fetch_all, fetch_scalar

# The database user this connection is (the GRANTs' principal).
CURRENT_USER = sql.Statement("SELECT USER_NAME() AS user_name")
RUNTIME_PERMISSIONS = ("SELECT", "VIEW CHANGE TRACKING")


def principal_exists(user: str) -> sql.Statement:
    """NULL when the database has no such user or role ("DATABASE_PRINCIPAL_ID", learn.microsoft.com)."""
    return sql.Statement("SELECT DATABASE_PRINCIPAL_ID(?) AS principal_id", (user,))


def grant(permission: str, schema: str, name: str, user: str) -> sql.Statement:
    """``GRANT <permission> ON [schema].[name] TO [user]``; granting what is held already changes nothing."""
    if permission not in RUNTIME_PERMISSIONS:
        raise ValueError(f"not a runtime permission: {permission!r}")
    return sql.Statement(f"GRANT {permission} ON {sql.qualified(schema, name)} TO {sql.quote(user)}")


def runtime_grants(tables: Sequence[TableConfig], user: str) -> list[sql.Statement]:
    return [grant(p, t.schema, t.name, user) for t in tables for p in RUNTIME_PERMISSIONS]


def check_user(conn: Any, user: str) -> None:
    """``--grant-to``'s user must exist in the database: else a ConfigError (exit 2)."""
    if fetch_scalar(conn, principal_exists(user)) is None:
        raise ConfigError(
            f"--grant-to: the database has no user {user!r} (CREATE USER {sql.quote(user)} FOR LOGIN ... first)"
        )


def grant_runtime(conn: Any, tables: Sequence[TableConfig], user: str) -> list[str]:
    """Grant ``user`` SELECT and VIEW CHANGE TRACKING on each table. An unknown
    user is a ConfigError (exit 2), nothing granted."""
    check_user(conn, user)
    for statement in runtime_grants(tables, user):
        execute(conn, statement)  # the link's connections are autocommit
    return [f"{user}: granted SELECT, VIEW CHANGE TRACKING on {t.table}" for t in tables]


# One row per table asked about, in order: (n, name, can_alter); NULL when no such table.
_CAN_ALTER = (
    "SELECT t.n, t.name, HAS_PERMS_BY_NAME(t.name, N'OBJECT', N'ALTER') AS can_alter "
    "FROM (VALUES {rows}) AS t(n, name) ORDER BY t.n"
)


def can_alter(tables: Sequence[TableConfig]) -> sql.Statement:
    if not 0 < len(tables) < sql.MAX_PARAMETERS:
        raise ValueError(f"ask about 1 to {sql.MAX_PARAMETERS - 1} tables, not {len(tables)}")
    rows = ", ".join(f"({n}, ?)" for n in range(len(tables)))  # n: a position, never a name
    return sql.Statement(_CAN_ALTER.format(rows=rows), tuple(sql.qualified(t.schema, t.name) for t in tables))


def not_alterable(conn: Any, tables: Sequence[TableConfig]) -> list[str]:
    """The tables (as the config writes them) the login may not ALTER; a table
    that does not exist is left to the enable's own message."""
    out: list[str] = []
    for start in range(0, len(tables), sql.MAX_PARAMETERS - 1):
        chunk = tables[start : start + sql.MAX_PARAMETERS - 1]
        rows = fetch_all(conn, can_alter(chunk))
        out += [chunk[int(n)].table for n, _, allowed in rows if allowed == 0]
    return out


def alter_error(user: str | None, tables: Sequence[str]) -> str:
    who = sql.quote(user) if user else "<the login's user>"
    grants = "; ".join(f"GRANT ALTER ON {sql.qualified(*t.split('.', 1))} TO {who}" for t in tables)
    return (
        f"cannot enable change tracking: the login{f' (user {user})' if user else ''} may not ALTER "
        f"{len(tables)} table(s): {', '.join(tables)}. Enabling a table's tracking is an ALTER TABLE. "
        f"Run cdc tracking enable as the tables' owner or a db_owner, or: {grants}; nothing was changed"
    )


def check_alterable(conn: Any, tables: Sequence[TableConfig]) -> None:
    """Raise naming every table the login may not ALTER (and the GRANTs that
    fix it) before ``tracking enable`` turns anything on: one error, not one
    per run."""
    refused = not_alterable(conn, tables) if tables else []
    if refused:
        user = fetch_scalar(conn, CURRENT_USER)
        raise SourceError(alter_error(None if user is None else str(user), refused))
