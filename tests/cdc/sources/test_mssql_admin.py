"""`cdc tracking enable` and `cdc doctor` on SQL Server, checked without a SQL Server.

- Turning ALLOW_SNAPSHOT_ISOLATION on waits for the database's open
  transactions (mssql_isolation): it runs on a connection of its own with no
  query timeout, says what it waits for, and is cancelled after its limit with
  an error naming the sessions and the fix. The stand-in is
  test_mssql_sql.FakeOdbc with an ALTER that blocks the way SQL Server's does
  (until released; a query timeout ends it first when the connection has one).
- `doctor` checks SELECT per key and published column (HAS_PERMS_BY_NAME with a
  COLUMN sub-securable) and names exactly the columns that lack it.
- Every new statement parses with sqlglot's T-SQL dialect (test_mssql_sql.parse).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import threading
import time
from typing import Any

import pyodbc
import pytest

from cdc.errors import SourceError, SourceUnavailable
from cdc.sources import mssql_isolation as isolation
from cdc.sources import mssql_sql as sql
from cdc.sources.base import Finding
from cdc.sources.mssql import MssqlSource
from cdc.sources.mssql_doctor import column_findings, column_select, view_tracking_findings
from tests.cdc.sources.test_mssql_sql import (
    CONFIG,
    FakeConnection,
    FakeCursor,
    FakeOdbc,
    parse,
    placeholders,
    table_config,
)
from tests.e2e import wait_for

ALTER = sql.ENABLE_SNAPSHOT_ISOLATION.sql
WRITER = (57, "billing", "app-host-1", "invoicer", dt.datetime(2026, 11, 21, 23, 0, 5))


class BlockingOdbc(FakeOdbc):
    """FakeOdbc whose ALTER ... ALLOW_SNAPSHOT_ISOLATION ON blocks as SQL Server's
    does while a transaction is open: until ``released``, or until the
    connection's query timeout (HYT00), or until the statement is cancelled (HY008)."""

    def __init__(self) -> None:
        super().__init__()
        self.database = ("CdcDemo", 0, "OFF", 10, 2, 3, 1)
        self.released = threading.Event()
        self.cancelled = threading.Event()
        self.alter_timeouts: list[int] = []  # the query timeout of each connection the ALTER ran on
        self.writers: list[tuple[Any, ...]] = [WRITER]
        self.alter_started: float | None = None

    def connect(self) -> BlockingConnection:
        self.connections += 1
        return BlockingConnection(self, self.connections)

    def answer(self, text: str, params: tuple[Any, ...], conn: FakeConnection) -> list[tuple[Any, ...]]:
        if text == isolation.OPEN_WRITERS.sql:  # not the base's: it would run any SELECT TOP on sqlite
            self.log.append((text, params))
            parse(sql.Statement(text, params))
            return [row for row in self.writers if row[0] != params[1]][: params[0]]
        rows = super().answer(text, params, conn)
        if text == isolation.SESSION_ID.sql:
            return [(60 + conn.number,)]
        if text == isolation.SNAPSHOT_STATE.sql:
            return [("OFF",)]
        if text == ALTER:
            self.alter_timeouts.append(conn.timeout)
            self.alter_started = time.monotonic()
            self._block(conn.timeout)
        return rows

    def _block(self, timeout: int) -> None:
        deadline = threading.Event()
        timer = threading.Timer(timeout if timeout > 0 else 20.0, deadline.set)  # 20 s: a test's backstop
        timer.start()
        try:
            while not (self.released.is_set() or self.cancelled.is_set() or deadline.is_set()):
                self.released.wait(0.01)
        finally:
            timer.cancel()
        if self.cancelled.is_set():
            raise pyodbc.OperationalError("HY008", "[HY008] [FreeTDS][SQL Server]Operation canceled (0)")
        if not self.released.is_set():
            raise pyodbc.OperationalError("HYT00", "[HYT00] [FreeTDS][SQL Server]Query timeout expired (0)")


class BlockingConnection(FakeConnection):
    def cursor(self) -> BlockingCursor:
        return BlockingCursor(self.fake, self)


class BlockingCursor(FakeCursor):
    def cancel(self) -> None:  # pyodbc's Cursor.cancel (SQLCancel), called from another thread
        assert isinstance(self.fake, BlockingOdbc)
        self.fake.cancelled.set()


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress every 50 ms instead of 15 s."""
    monkeypatch.setattr(isolation, "PROGRESS_EVERY", 0.05)


# -- item 9: ALLOW_SNAPSHOT_ISOLATION ON waits for open transactions --------------


async def test_snapshot_isolation_waits_for_open_transactions_and_says_which(
    quick: None, caplog: pytest.LogCaptureFixture
) -> None:
    """On main the ALTER ran on the admin connection under the query timeout
    (1 s here, 60 s by default): it failed as "SQL Server is unavailable"."""
    fake = BlockingOdbc()
    fake.tracking = [(1, 0)]
    config = dataclasses.replace(CONFIG, query_timeout=1.0)
    source = MssqlSource(config, connector=fake.connect)
    caplog.set_level(logging.WARNING, logger="cdc.sources.mssql")
    enabling = asyncio.ensure_future(source.tracking_enable([table_config()]))

    def waiting() -> list[str]:
        return [r.getMessage() for r in caplog.records if "ON has waited" in r.getMessage()]

    async def said_so() -> bool:
        return bool(waiting())

    async def past_the_query_timeout() -> bool:  # 1 s, and a margin
        return fake.alter_started is not None and time.monotonic() - fake.alter_started > 1.5

    await wait_for(said_so, 10, "a message saying what the ALTER waits for")
    await wait_for(past_the_query_timeout, 10, "the ALTER to outlive the query timeout")
    assert not enabling.done()  # no query timeout on its connection
    fake.released.set()
    done = await enabling
    await source.close()
    assert "session 57 (billing, app-host-1, invoicer) open since 2026-11-21 23:00:05" in waiting()[0]
    assert "database CdcDemo" in waiting()[0] and "has ended" in waiting()[0]
    assert fake.alter_timeouts == [0]
    assert done[0].startswith("database CdcDemo: ALLOW_SNAPSHOT_ISOLATION ON (after waiting")
    assert "dbo.Forecasts: already tracked" in done


async def test_snapshot_isolation_is_cancelled_after_its_limit_naming_the_sessions(
    quick: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(isolation, "WAIT_LIMIT", 0.3)
    fake = BlockingOdbc()
    source = MssqlSource(CONFIG, connector=fake.connect)
    with pytest.raises(SourceError) as raised:
        await source.tracking_enable([table_config()])
    await source.close()
    assert not isinstance(raised.value, SourceUnavailable)
    message = str(raised.value)
    assert fake.cancelled.is_set()
    assert "was cancelled after waiting" in message and "session 57 (billing" in message
    assert "Commit or roll those transactions back (or end the sessions with KILL)" in message
    assert "run `cdc tracking enable` again" in message and "snapshot isolation is now OFF" in message
    assert "Secret-1" not in message


async def test_snapshot_isolation_without_open_transactions_is_one_statement() -> None:
    fake = BlockingOdbc()
    fake.released.set()
    source = MssqlSource(CONFIG, connector=fake.connect)
    done = await source.tracking_enable([table_config()])
    await source.close()
    assert done[0] == "database CdcDemo: ALLOW_SNAPSHOT_ISOLATION ON"
    assert [text for text, _ in fake.log if text.startswith("ALTER DATABASE")] == [ALTER]


async def test_snapshot_isolation_already_pending_is_reported_with_what_it_waits_for() -> None:
    fake = BlockingOdbc()
    fake.database = ("CdcDemo", 3, "IN_TRANSITION_TO_ON", 10, 2, 3, 1)
    source = MssqlSource(CONFIG, connector=fake.connect)
    done = await source.tracking_enable([table_config()])
    await source.close()
    assert fake.alter_timeouts == []
    assert done[0].startswith("database CdcDemo: ALLOW_SNAPSHOT_ISOLATION is IN_TRANSITION_TO_ON")
    assert "session 57" in done[0] and "3956" in done[0]


def test_the_waiting_messages_when_the_login_cannot_list_transactions() -> None:
    text = isolation.waiting_message("CdcDemo", None, 30.0, 900.0)
    assert "VIEW SERVER STATE" in text and "30 s" in text and "900 s" in text
    many = [isolation.OpenTransaction(50 + n, None, None, None, None) for n in range(isolation.SHOWN + 1)]
    assert "and 1 more" in isolation.timeout_message("CdcDemo", many, 900.0, "OFF")
    assert "session 60" not in isolation.timeout_message("CdcDemo", many, 900.0, "OFF")


# -- item 12: doctor checks SELECT per column ---------------------------------------


def finding_texts(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.level, f.message) for f in findings]


def test_column_level_select_on_every_needed_column_is_enough() -> None:
    rows = [(0, "Id", 1), (1, "Price", 1), (2, "Status", 1)]
    assert column_findings(table_config(), ("Id",), ("Id", "Price", "Status"), rows) == []


def test_a_column_without_select_is_named_with_its_grant() -> None:
    rows = [(0, "Id", 1), (1, "Price", 0), (2, "Status", 1)]
    [finding] = column_findings(table_config(), ("Id",), ("Id", "Price", "Status"), rows)
    assert finding.level == "error" and finding.subject == "dbo.Forecasts"
    assert "published column(s) Price" in finding.message and "Status" not in finding.message
    assert "GRANT SELECT ON [dbo].[Forecasts] ([Price]) TO <the sidecar's user>" in finding.message
    assert finding.extra["columns_without_select"] == ["Price"]


def test_a_key_column_without_select_is_named_as_a_key_column() -> None:
    rows = [(0, "Id", 0), (1, "Price", 0)]
    [finding] = column_findings(table_config(), ("Id",), ("Id", "Price"), rows)
    assert "primary-key column(s) Id; published column(s) Price" in finding.message
    assert "([Id], [Price])" in finding.message


def test_an_unanswered_column_check_is_a_warning() -> None:
    [finding] = column_findings(table_config(), ("Id",), ("Id", "Price"), [(0, "Id", 1), (1, "Price", None)])
    assert finding.level == "warning" and "Price" in finding.message


def test_view_change_tracking() -> None:
    assert view_tracking_findings(table_config(), 1) == []
    [missing] = view_tracking_findings(table_config(), 0)
    assert "GRANT VIEW CHANGE TRACKING ON [dbo].[Forecasts] TO" in missing.message
    [gone] = view_tracking_findings(table_config(), None)
    assert "does not exist" in gone.message


class ColumnGrants(FakeOdbc):
    """FakeOdbc answering the per-column SELECT check from ``grants``."""

    def __init__(self, grants: dict[str, int]) -> None:
        super().__init__()
        self.grants = grants

    def answer(self, text: str, params: tuple[Any, ...], conn: FakeConnection) -> list[tuple[Any, ...]]:
        rows = super().answer(text, params, conn)
        if "HAS_PERMS_BY_NAME(?, N'OBJECT', N'SELECT', c.name, N'COLUMN')" in text:
            return [(n, column, self.grants.get(column, 0)) for n, column in enumerate(params[1:])]
        return rows


async def test_doctor_accepts_column_level_select_without_table_level_select() -> None:
    """The defect of main: a login granted SELECT on the columns only (the
    table-level check says 0) was reported as lacking SELECT."""
    fake = ColumnGrants({"Id": 1, "Price": 1, "Status": 1, "Doubled": 1})
    fake.permissions = (0, 1)  # no SELECT on the table as a whole; VIEW CHANGE TRACKING granted
    source = MssqlSource(CONFIG, connector=fake.connect)
    findings = await source.doctor([table_config()])
    await source.close()
    assert [f for f in findings if f.level == "error"] == [], finding_texts(findings)


async def test_doctor_names_the_one_column_without_select() -> None:
    fake = ColumnGrants({"Id": 1, "Price": 1, "Status": 0, "Doubled": 1})
    fake.permissions = (1, 1)
    source = MssqlSource(CONFIG, connector=fake.connect)
    findings = await source.doctor([table_config()])
    await source.close()
    [error] = [f for f in findings if f.level == "error"]
    assert "published column(s) Status" in error.message and "([Status])" in error.message


# -- the statements parse ----------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        isolation.SESSION_ID,
        isolation.SNAPSHOT_STATE,
        sql.Statement(isolation.OPEN_WRITERS.sql, (11, 61)),
        column_select("dbo", "Forecasts", ["Id", "Price"]),
        column_select("we]ird", "Or[ders] x", ["a]b", "x'); DROP TABLE t; --"]),
    ],
    ids=["session", "state", "open-writers", "columns", "hostile-columns"],
)
def test_new_statements_parse_and_take_their_parameters(statement: sql.Statement) -> None:
    assert placeholders(parse(statement)) == len(statement.params)


def test_column_names_are_parameters_never_text() -> None:
    statement = column_select("dbo", "Forecasts", ["x'); DROP TABLE t; --"])
    assert "DROP" not in statement.sql and statement.params == ("[dbo].[Forecasts]", "x'); DROP TABLE t; --")
