"""psycopg errors mapped onto ``cdc.errors``, at the adapter boundary.

Connection failures and timeouts are ``SourceUnavailable`` (retried), a
failing ``connect()`` is ``ConnectError`` (exit code 3), other refusals are
``SourceError``. Messages never contain the DSN's password.
"""

from __future__ import annotations

import psycopg

from cdc.errors import CdcError, ConnectError, SourceError, SourceUnavailable
from cdc.sources.pg_dsn import redact_dsn, scrub

# What a broken link raises: the connection may be gone with it.
LINK_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, OSError)


def map_error(exc: psycopg.Error | OSError, dsn: str, what: str) -> CdcError:
    """A driver error raised while running ``what``, as a ``cdc.errors`` error."""
    if isinstance(exc, LINK_ERRORS):
        return SourceUnavailable(f"PostgreSQL: {what}: {scrub(exc, dsn)}")
    return SourceError(f"PostgreSQL: {what}: {scrub(exc, dsn)}")


def connect_error(exc: psycopg.Error | OSError, dsn: str) -> ConnectError:
    """A driver error raised while connecting at start-up (exit code 3)."""
    return ConnectError(f"cannot connect to PostgreSQL ({redact_dsn(dsn)}): {scrub(exc, dsn)}")
