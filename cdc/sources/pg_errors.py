"""psycopg errors mapped onto ``cdc.errors``, at the adapter boundary.

Connection failures and timeouts are ``SourceUnavailable`` (retried), a
failing ``connect()`` is ``ConnectError`` (exit code 3), or ``ConfigError``
(exit code 2) when libpq cannot read the DSN or misreads it, other refusals
are ``SourceError``, but for the errors a read raises because its table changed
under it (``table_changed``), which are ``SchemaError``: the table is
described again. Messages never contain the DSN's password.
"""

from __future__ import annotations

import psycopg

from cdc.errors import (
    CdcError,
    ConfigError,
    ConnectError,
    SchemaError,
    SourceError,
    SourceUnavailable,
    TableChanged,
)
from cdc.sources.pg_dsn import dsn_problem, redact_dsn, scrub

# What a broken link raises: the connection may be gone with it. (OperationalError
# includes SQLSTATE class 55, ObjectInUse: a replication slot that another sidecar
# still reads during a lease hand-over, retried as SourceUnavailable.)
LINK_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, OSError)


# What a read or snapshot raises when ALTER TABLE, DROP TABLE or RENAME changed
# its table after the TableInfo it was given was described:
_CHANGED = frozenset(
    {
        "42703",  # undefined_column: a published column dropped or renamed
        "42P01",  # undefined_table: the table dropped or renamed
        "42804",  # datatype_mismatch: a row type no longer what the query expects
        "42883",  # undefined_function: a key retyped, its net entries no longer compare (no operator)
    }
)

# A prepared statement (psycopg prepares a query run five times) whose result
# columns changed type; psycopg keeps it, so every later run of the same text
# on that connection fails the same way: the connection must go.
STALE_PLAN = "cached plan must not change result type"


def is_stale_plan(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.errors.FeatureNotSupported) and STALE_PLAN in str(exc)


def table_changed(exc: BaseException, table: str) -> SchemaError | None:
    """The ``SchemaError`` for a read of ``table`` that failed because the table
    changed under it, or None when ``exc`` is something else."""
    if not isinstance(exc, psycopg.Error) or not (exc.sqlstate in _CHANGED or is_stale_plan(exc)):
        return None
    detail = exc.diag.message_primary or str(exc).strip()
    return TableChanged(f"{table}: the table changed while it was read ({detail}): describing it again")


def map_error(exc: psycopg.Error | OSError, dsn: str, what: str, table: str | None = None) -> CdcError:
    """A driver error raised while running ``what`` (on ``table``, when one), as a
    ``cdc.errors`` error."""
    changed = None if table is None else table_changed(exc, table)
    if changed is not None:
        return changed
    if isinstance(exc, LINK_ERRORS):
        return SourceUnavailable(f"PostgreSQL: {what}: {scrub(exc, dsn)}")
    return SourceError(f"PostgreSQL: {what}: {scrub(exc, dsn)}")


def connect_error(exc: psycopg.Error | OSError, dsn: str) -> CdcError:
    """A driver error raised while connecting at start-up: ``ConnectError``
    (exit code 3), or ``ConfigError`` (exit code 2) when the DSN itself is
    wrong. Then the driver's message is not shown: it may quote pieces of a
    password it misread as a host or a port."""
    problem = dsn_problem(dsn)
    if problem is not None:
        return ConfigError(f"source.dsn ({redact_dsn(dsn)}): {problem}")
    return ConnectError(f"cannot connect to PostgreSQL ({redact_dsn(dsn)}): {scrub(exc, dsn)}")
