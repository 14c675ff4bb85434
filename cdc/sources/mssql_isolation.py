"""Turning ``ALLOW_SNAPSHOT_ISOLATION`` on: a statement that waits for other sessions.

"If there are active modification transactions, SQL Server sets the state of
the option to PENDING_ON. After all of the modification transactions
complete, the state of the option is changed to ON", and the database stays
in transition "until all update transactions that were active when ALTER
DATABASE was run can be completed" ("Enabling Row Versioning-Based Isolation
Levels", learn.microsoft.com/previous-versions/sql/sql-server-2008-r2/ms175095;
the DatabaseSnapshotIsolationState enumeration). The ``ALTER DATABASE``
returns only then: run under the source's query timeout (60 s), a single
transaction left open anywhere in the database made ``cdc tracking enable``
fail with a timeout that read as "SQL Server is unavailable".

So the statement runs on a connection of its own, without a query timeout,
while the caller's connection says every ``PROGRESS_EVERY`` seconds which
transactions it waits for (``OPEN_WRITERS``). Only transactions already open
when the statement ran are waited for: transactions that start later are
versioned, so a busy database is not a reason to wait forever. After
``WAIT_LIMIT`` the statement is cancelled and the error names the sessions
and the fix.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyodbc

from cdc.errors import SourceError
from cdc.sources import mssql_sql as sql
from cdc.sources.mssql_link import fetch_all, fetch_one, fetch_scalar

log = logging.getLogger("cdc.sources.mssql")

WAIT_LIMIT = 900.0  # seconds the ALTER may wait for open transactions before it is cancelled
PROGRESS_EVERY = 15.0  # seconds between two "still waiting for ..." messages
CANCEL_GRACE = 30.0  # seconds for a cancelled ALTER to give its connection back
SHOWN = 10  # open transactions named in a message; more are counted

SESSION_ID = sql.Statement("SELECT @@SPID AS session_id")
SNAPSHOT_STATE = sql.Statement(
    "SELECT d.snapshot_isolation_state_desc FROM sys.databases AS d WHERE d.database_id = DB_ID()"
)
# The transactions that have modified data in this database and are still open:
# database_transaction_begin_time is "the time of the first log record in the
# database for the transaction" (sys.dm_tran_database_transactions,
# learn.microsoft.com), NULL for one that wrote nothing here. Seeing other
# sessions needs VIEW SERVER STATE (VIEW SERVER PERFORMANCE STATE on SQL
# Server 2022); without it the view shows none, and the message says so.
OPEN_WRITERS = sql.Statement(
    "SELECT TOP (?) st.session_id, s.login_name, s.host_name, s.program_name, "
    "dt.database_transaction_begin_time "
    "FROM sys.dm_tran_database_transactions AS dt "
    "JOIN sys.dm_tran_session_transactions AS st ON st.transaction_id = dt.transaction_id "
    "LEFT JOIN sys.dm_exec_sessions AS s ON s.session_id = st.session_id "
    "WHERE dt.database_id = DB_ID() AND dt.database_transaction_begin_time IS NOT NULL "
    "AND st.session_id <> ? "
    "ORDER BY dt.database_transaction_begin_time",
)


@dataclass(frozen=True)
class OpenTransaction:
    """A session whose transaction has written to the database and is still open."""

    session_id: int
    login: str | None
    host: str | None
    program: str | None
    since: dt.datetime | None

    @classmethod
    def of(cls, row: Sequence[Any]) -> OpenTransaction:
        session_id, login, host, program, since = row
        return cls(int(session_id), login, host, program, since)

    def __str__(self) -> str:
        who = ", ".join(part for part in (self.login, self.host, self.program) if part)
        since = f" open since {self.since:%Y-%m-%d %H:%M:%S}" if self.since else ""
        return f"session {self.session_id}" + (f" ({who})" if who else "") + since


def open_writers(conn: Any, alter_session: int) -> list[OpenTransaction] | None:
    """Up to ``SHOWN + 1`` open transactions that wrote to the database, other
    than the ALTER's own; None when the login may not see them."""
    statement = sql.Statement(OPEN_WRITERS.sql, (SHOWN + 1, alter_session))
    try:
        return [OpenTransaction.of(row) for row in fetch_all(conn, statement)]
    except pyodbc.Error:
        return None  # VIEW SERVER STATE denied: the wait goes on, unexplained


def _named(transactions: Sequence[OpenTransaction] | None) -> str:
    if transactions is None:
        return (
            "the open transactions that modified it (this login cannot list them: listing them needs "
            "VIEW SERVER STATE, or VIEW SERVER PERFORMANCE STATE on SQL Server 2022)"
        )
    if not transactions:
        return "the transactions that were open when it ran (they are finishing)"
    shown = "; ".join(str(t) for t in transactions[:SHOWN])
    more = f"; and {len(transactions) - SHOWN} more" if len(transactions) > SHOWN else ""
    return f"{len(transactions[:SHOWN])} open transaction(s) that modified it: {shown}{more}"


def waiting_message(
    database: str, transactions: Sequence[OpenTransaction] | None, waited: float, limit: float
) -> str:
    return (
        f"database {database}: ALTER DATABASE ... SET ALLOW_SNAPSHOT_ISOLATION ON has waited {waited:.0f} s "
        f"for {_named(transactions)}. SQL Server turns snapshot isolation on only when every transaction "
        f"that was writing to the database when the statement ran has ended; cdc-sync gives up after "
        f"{limit:.0f} s"
    )


def timeout_message(
    database: str, transactions: Sequence[OpenTransaction] | None, waited: float, state: str | None
) -> str:
    now = f" (snapshot isolation is now {state})" if state else ""
    return (
        f"database {database}: ALTER DATABASE ... SET ALLOW_SNAPSHOT_ISOLATION ON was cancelled after waiting "
        f"{waited:.0f} s for {_named(transactions)}{now}. Commit or roll those transactions back (or end the "
        "sessions with KILL), then run `cdc tracking enable` again"
    )


class _Alter:
    """The ALTER DATABASE on a connection of its own, run by a thread of its own,
    with no query timeout; ``cancel`` stops it from another thread (SQLCancel)."""

    def __init__(self, opener: Callable[[], Any]) -> None:
        self.conn = opener()
        self.conn.timeout = 0  # no query timeout: the wait is bounded by WAIT_LIMIT instead
        session = fetch_scalar(self.conn, SESSION_ID)
        self.session_id = -1 if session is None else int(session)  # excluded from OPEN_WRITERS
        self.cursor = self.conn.cursor()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="cdc-mssql-isolation", daemon=True)

    def _run(self) -> None:
        try:
            self.cursor.execute(sql.ENABLE_SNAPSHOT_ISOLATION.sql)
        except BaseException as exc:  # handed to the waiting thread by ``result``
            self.error = exc

    def start(self) -> None:
        self.thread.start()

    def wait(self, seconds: float) -> bool:
        """True once the statement has ended (either way)."""
        self.thread.join(seconds)
        return not self.thread.is_alive()

    def cancel(self) -> None:
        try:
            self.cursor.cancel()
        except pyodbc.Error:
            pass  # it ended meanwhile
        self.thread.join(CANCEL_GRACE)

    def result(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        for closable in (self.cursor, self.conn):
            try:
                closable.close()
            except pyodbc.Error:
                pass


def turn_on(
    conn: Any,
    opener: Callable[[], Any],
    database: str,
    *,
    limit: float | None = None,
    every: float | None = None,
) -> str:
    """Run ``ALTER DATABASE CURRENT SET ALLOW_SNAPSHOT_ISOLATION ON`` on a new
    connection from ``opener``, reporting on ``conn`` what it waits for; the
    line that ``cdc tracking enable`` prints, or SourceError after ``limit``
    (default ``WAIT_LIMIT``; progress every ``PROGRESS_EVERY`` seconds)."""
    limit = WAIT_LIMIT if limit is None else limit
    every = PROGRESS_EVERY if every is None else every
    alter = _Alter(opener)
    started = time.monotonic()
    try:
        alter.start()
        while not alter.wait(max(0.0, min(every, started + limit - time.monotonic()))):
            waited = time.monotonic() - started
            transactions = open_writers(conn, alter.session_id)
            if waited >= limit:
                alter.cancel()
                if alter.error is None and not alter.thread.is_alive():
                    break  # it ended just before the cancel reached it
                state = fetch_one(conn, SNAPSHOT_STATE)
                raise SourceError(timeout_message(database, transactions, waited, state and str(state[0])))
            log.warning(waiting_message(database, transactions, waited, limit), extra={"database": database})
        alter.result()
    finally:
        alter.close()
    waited = time.monotonic() - started
    after = f" (after waiting {waited:.0f} s for open transactions)" if waited >= every else ""
    return f"database {database}: ALLOW_SNAPSHOT_ISOLATION ON{after}"


def pending_message(database: str, transactions: Sequence[OpenTransaction] | None) -> str:
    """What ``cdc tracking enable`` says when snapshot isolation is already
    IN_TRANSITION_TO_ON: another session's ALTER DATABASE is waiting."""
    return (
        f"database {database}: ALLOW_SNAPSHOT_ISOLATION is IN_TRANSITION_TO_ON: another session's ALTER "
        f"DATABASE waits for {_named(transactions)}. Until it is ON, polls fail with error 3956 and are retried"
    )
