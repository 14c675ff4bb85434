"""The one-thread pyodbc link, and the statements run on it.

pyodbc blocks: each connection has one thread of its own and every call on
it runs there (``Link``), never on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pyodbc

from cdc.config import SourceConfig
from cdc.errors import TransientError
from cdc.sources import mssql_sql as sql
from cdc.sources.mssql_dsn import parse_dsn
from cdc.sources.mssql_errors import connect_error, map_error
from cdc.sources.mssql_types import register_converters

T = TypeVar("T")


class Link:
    """One pyodbc connection and the single thread allowed to touch it.

    pyodbc connections are not safe for concurrent use and every call blocks,
    so each runs on this link's own one-thread executor; a unit of work (a
    whole transaction) is one submitted function, so units never interleave.
    The connection is opened lazily and dropped after a transient error, so
    the next call reconnects.
    """

    def __init__(self, open_connection: Callable[[], Any], dsn: str, name: str) -> None:
        self._open_connection = open_connection
        self._dsn = dsn
        self._conn: Any = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def open(self) -> None:
        await self._submit(self._connect, True)

    async def run(self, work: Callable[[Any], T], context: str = "") -> T:
        return await self._submit(self._call, work, context)

    async def close(self) -> None:
        try:
            await self._submit(self._disconnect)
        finally:
            self._executor.shutdown(wait=False)

    async def _submit(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def _connect(self, at_startup: bool) -> None:
        if self._conn is not None:
            return
        try:
            self._conn = self._open_connection()
        except pyodbc.Error as exc:
            raise connect_error(exc, self._dsn, at_startup) from None

    def _call(self, work: Callable[[Any], T], context: str) -> T:
        self._connect(False)
        try:
            return work(self._conn)
        except pyodbc.Error as exc:
            error = map_error(exc, self._dsn, context)
            if isinstance(error, TransientError):
                self._disconnect()
            raise error from exc

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            rollback_quietly(conn)  # a snapshot abandoned half-way still holds its transaction
            try:
                conn.close()
            except pyodbc.Error:
                pass


# -- statements on a connection ------------------------------------------------


def execute(conn: Any, statement: sql.Statement | str) -> None:
    """Run a statement that returns no rows (each statement has its own cursor,
    closed at once: without MARS a connection serves one result at a time)."""
    fetch_all(conn, statement, fetch=False)


def fetch_all(conn: Any, statement: sql.Statement | str, *, fetch: bool = True) -> list[Any]:
    cursor = conn.cursor()
    try:
        if isinstance(statement, str):
            cursor.execute(statement)
        else:
            cursor.execute(statement.sql, *statement.params)
        return list(cursor.fetchall()) if fetch else []
    finally:
        cursor.close()


def fetch_one(conn: Any, statement: sql.Statement | str) -> Any:
    rows = fetch_all(conn, statement)
    return rows[0] if rows else None


def fetch_scalar(conn: Any, statement: sql.Statement | str) -> Any:
    row = fetch_one(conn, statement)
    return None if row is None else row[0]


def rollback_quietly(conn: Any) -> None:
    try:
        execute(conn, sql.ROLLBACK)
    except pyodbc.Error:
        pass  # the link is gone: so is the transaction


def open_connection(config: SourceConfig) -> Any:
    """A new pyodbc connection for ``config``: autocommit, named cdc-sync, with
    its query timeout and converters set."""
    dsn = config.dsn
    if "APP" not in parse_dsn(dsn):
        dsn = dsn.rstrip("; ") + ";APP=cdc-sync"
    conn = pyodbc.connect(dsn, autocommit=True, timeout=max(1, math.ceil(config.connect_timeout)))
    return prepare_connection(conn, config)


def prepare_connection(conn: Any, config: SourceConfig) -> Any:
    conn.timeout = max(0, math.ceil(config.query_timeout))  # HYT00 when a query runs longer
    register_converters(conn)  # datetimeoffset (SQL type -155) arrives as bytes otherwise
    return conn
