"""pyodbc errors mapped onto ``cdc.errors``, at the adapter boundary.

Link failures, timeouts and deadlocks are ``SourceUnavailable`` (retried)
while running and ``ConnectError`` (exit code 3) at start-up; missing
permissions are ``SourceError`` naming the permission. Messages never carry
the password.
"""

from __future__ import annotations

import re
from typing import Any

import pyodbc

from cdc.errors import (
    CdcError,
    ConnectError,
    SchemaError,
    SourceError,
    SourceUnavailable,
    TableChanged,
    TrackingNotEnabled,
)
from cdc.sources.mssql_dsn import describe_dsn, scrub

# SQLSTATEs worth retrying: the link, a timeout, a deadlock or serialization failure.
TRANSIENT_STATES = frozenset({"08001", "08003", "08004", "08007", "08S01", "HYT00", "HYT01", "40001"})
# SQL Server (and FreeTDS) error numbers worth retrying whatever the SQLSTATE.
TRANSIENT_ERRORS = frozenset(
    {
        233,  # no process on the other end of the pipe
        1205,  # chosen as deadlock victim
        1222,  # lock request time out
        3960,  # snapshot update conflict
        3961,  # snapshot: the object was changed by DDL since the transaction started
        3956,  # snapshot isolation is in transition (pending on/off): retry later
        3958,  # transaction aborted: a needed row version was removed from tempdb's version store
        3966,  # transaction aborted: a needed row version was marked for removal (version store full)
        3967,  # the version store was forced to shrink: transaction aborted
        976,  # availability group: the database is not accessible on this replica (yet)
        978,  # availability group: the readable secondary needs ApplicationIntent=ReadOnly
        983,  # availability group: the replica's role is changing (resolving): not accessible now
        10053,  # transport-level error
        10054,  # connection reset
        10060,  # network timeout
        20003,  # FreeTDS: server connection timed out
        20004,  # FreeTDS: read from the server failed
        20006,  # FreeTDS: write to the server failed
        20009,  # FreeTDS: unable to connect
        20047,  # FreeTDS: connection dead
        40197,  # Azure: service error, retry
        40501,  # Azure: service busy
        40613,  # Azure: database unavailable
        49918,  # Azure: not enough resources
        49919,
        49920,
    }
)
PERMISSION_ERRORS = frozenset({229, 230, 262, 297, 300, 916, 5011, 15247})
SNAPSHOT_NOT_ALLOWED = 3952
NO_PRIMARY_KEY = 4997
# "Change tracking is not enabled on table '%.*ls'." (sys.messages): 22105 from
# CHANGETABLE(CHANGES ...), whose table "must" have change tracking enabled
# (CHANGETABLE, learn.microsoft.com), 4998 from ALTER TABLE ... DISABLE
# CHANGE_TRACKING. Raised when tracking was turned off, or the table dropped
# and created again (DROP TABLE removes its tracking), since it was described.
TRACKING_OFF_ON_TABLE = frozenset({22105, 4998})
# The table changed under a read (DDL committed before the read's statement
# ran; one committed after its SNAPSHOT transaction began is 3961, transient):
INVALID_COLUMN = 207  # "Invalid column name": a column read was dropped or renamed
# "Invalid object name" (208); "Cannot find the object ... because it does not
# exist or you do not have permissions" (4902): dropped, or renamed (sp_rename)
TABLE_GONE = frozenset({208, 4902})
_NATIVE = re.compile(r"\((-?\d+)\)\s*(?=\(SQL\w*\)|;|$)")
_PERMISSION = re.compile(r"(?:The )?([A-Z][A-Z ]*[A-Z]) permission (?:was )?denied")
_DRIVER_TAGS = re.compile(
    r"\[(?:[0-9A-Z]{5}|Microsoft|unixODBC|FreeTDS|Driver Manager|ODBC[^\]'\"]*|[^\]'\"]*SQL Server)\]\s*"
)


def error_parts(exc: BaseException) -> tuple[str, set[int], str]:
    """(SQLSTATE, native error numbers, cleaned message) of a pyodbc error."""
    args: tuple[Any, ...] = tuple(getattr(exc, "args", ()))
    state = args[0] if len(args) >= 2 and isinstance(args[0], str) else ""
    message = str(args[-1]) if args else str(exc)
    natives = {int(n) for n in _NATIVE.findall(message)}
    text = _DRIVER_TAGS.sub("", message)
    text = _NATIVE.sub("", text)
    text = re.sub(r"\s*\(SQL\w*\)", "", text).strip(" ;")
    if natives:
        text += f" (error {', '.join(str(n) for n in sorted(natives))})"
    return state, natives, text


def map_error(exc: BaseException, dsn: str, context: str = "") -> CdcError:
    """A pyodbc error raised while running, as a ``cdc.errors`` error."""
    state, natives, text = error_parts(exc)
    text = scrub(text, dsn)
    where = f"{context}: " if context else ""
    if state in TRANSIENT_STATES or natives & TRANSIENT_ERRORS:
        return SourceUnavailable(f"{where}SQL Server is unavailable ({describe_dsn(dsn)}): [{state}] {text}")
    if SNAPSHOT_NOT_ALLOWED in natives:
        return SourceError(
            f"{where}snapshot isolation is not allowed in this database: run `cdc tracking enable` "
            f"or ALTER DATABASE CURRENT SET ALLOW_SNAPSHOT_ISOLATION ON ({text})"
        )
    if natives & TRACKING_OFF_ON_TABLE:
        enable = f"`cdc tracking enable --table {context}`" if context else "`cdc tracking enable`"
        return TrackingNotEnabled(
            f"{where}change tracking is not enabled on the table: it was turned off, or the table dropped and "
            f"created again, while it was read; it will be described again. Run {enable} to follow it ({text})"
        )
    if INVALID_COLUMN in natives:
        return TableChanged(
            f"{where}the table changed while it was read (a column it reads was dropped or renamed): "
            f"it will be described again ({text})"
        )
    if natives & TABLE_GONE:
        return TableChanged(
            f"{where}the table changed while it was read (dropped, or renamed): "
            f"it will be described again ({text})"
        )
    if natives & PERMISSION_ERRORS or "permission" in text.lower() and "denied" in text.lower():
        match = _PERMISSION.search(text)
        missing = f"the {match.group(1)} permission" if match else "a permission"
        return SourceError(f"{where}the login lacks {missing}: {text}")
    if NO_PRIMARY_KEY in natives:
        return SchemaError(f"{where}change tracking needs a primary key: {text}")
    return SourceError(f"{where}SQL Server error [{state}]: {text}")


def connect_error(exc: BaseException, dsn: str, at_startup: bool) -> CdcError:
    """A pyodbc error raised while opening a connection: ConnectError (exit
    code 3) at start-up, SourceUnavailable (retried) when reconnecting."""
    state, natives, text = error_parts(exc)
    text = scrub(text, dsn)
    hint = _connect_hint(state, natives, text)
    message = f"cannot connect to SQL Server ({describe_dsn(dsn)}): [{state}] {text}{hint}"
    return ConnectError(message) if at_startup else SourceUnavailable(message)


def _connect_hint(state: str, natives: set[int], text: str) -> str:
    lowered = text.lower()
    if state == "IM002" or "can't open lib" in lowered or "data source name not found" in lowered:
        installed = ", ".join(pyodbc.drivers()) or "none"
        return (
            f". The ODBC driver named in the DSN is not installed (installed: {installed}); "
            "see docs/SQLSERVER.md for the Microsoft ODBC Driver 18 and FreeTDS DSNs"
        )
    if state == "28000" or 18456 in natives:
        return ". Login failed: check UID and PWD, and that the login maps to a user in the database"
    if "certificate" in lowered or "ssl" in lowered or "tls" in lowered:
        return (
            ". TLS failed: ODBC Driver 18 encrypts by default; trust the server's certificate "
            "(or, for a test server only, add TrustServerCertificate=yes)"
        )
    if state.startswith("08") or state.startswith("HYT") or natives & TRANSIENT_ERRORS:
        return ". Is the server up, and are the host and port right?"
    return ""
