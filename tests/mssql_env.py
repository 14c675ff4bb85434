"""Where the SQL Server tests find a server, which ODBC drivers they use, and
the least-privileged login the source under test connects with.

- ``CDC_TEST_MSSQL_DSN``: an ODBC connection string of a database the tests
  may alter (tracking, tables, logins): the administrator's. Without it, a
  SQL Server 2022 container when a Docker engine answers (tests/conftest.py).
- ``CDC_TEST_MSSQL_REQUIRED=1`` (set by ``make test-mssql``): no server is a
  failure, not a skip.
- The drivers: every one of ``DRIVERS`` that unixODBC has installed
  (``pyodbc.drivers()``), or those named in ``CDC_TEST_MSSQL_DRIVERS``
  (comma-separated); the tests run once per driver, the DSN rewritten for it.
"""

from __future__ import annotations

import os
import secrets
import string
import uuid
from dataclasses import dataclass, field
from typing import Any

from cdc.sources import mssql_sql as sql
from cdc.sources.mssql_dsn import parse_dsn

FREETDS = "FreeTDS"
MSODBC18 = "ODBC Driver 18 for SQL Server"
DRIVERS = (FREETDS, MSODBC18)
DRIVER_IDS = {FREETDS: "freetds", MSODBC18: "msodbc18"}
REQUIRED = os.environ.get("CDC_TEST_MSSQL_REQUIRED", "") in ("1", "true", "yes")


def installed_drivers() -> list[str]:
    """The drivers to run the SQL Server tests with, in ``DRIVERS`` order."""
    try:
        import pyodbc

        present = set(pyodbc.drivers())
    except ImportError:  # pragma: no cover - pyodbc is a dependency
        present = set()
    wanted = [d.strip() for d in os.environ.get("CDC_TEST_MSSQL_DRIVERS", "").split(",") if d.strip()]
    return [d for d in (wanted or list(DRIVERS)) if d in present]


def _brace(value: str) -> str:
    """An ODBC attribute value, braced when it holds ; { } or spaces at its ends."""
    if any(c in value for c in ";{}") or value != value.strip():
        return "{" + value.replace("}", "}}") + "}"
    return value


@dataclass(frozen=True)
class Endpoint:
    """A SQL Server database and a login on it, independent of the driver."""

    host: str
    port: int
    database: str
    user: str
    password: str
    trust_certificate: bool = True  # test servers have self-signed certificates

    @classmethod
    def from_dsn(cls, dsn: str) -> Endpoint:
        fields = parse_dsn(dsn)
        server = fields.get("SERVER", "127.0.0.1").removeprefix("tcp:")
        host, _, port = server.partition(",")
        return cls(
            host=host,
            port=int(port or fields.get("PORT") or 1433),
            database=fields.get("DATABASE", "master"),
            user=fields.get("UID", ""),
            password=fields.get("PWD", ""),
            trust_certificate=fields.get("TRUSTSERVERCERTIFICATE", "yes").lower() in ("yes", "true", "1"),
        )

    def dsn(
        self, driver: str, *, database: str | None = None, user: str | None = None, password: str = ""
    ) -> str:
        """The DSN for ``driver``: FreeTDS takes SERVER and PORT and TDS 7.4;
        Driver 18 takes SERVER=host,port and encrypts by default (SQLSERVER.md §5)."""
        parts = [f"DRIVER={{{driver}}}"]
        if driver == FREETDS:
            parts += [f"SERVER={self.host}", f"PORT={self.port}", "TDS_Version=7.4", "ClientCharset=UTF-8"]
        else:
            parts += [f"SERVER={self.host},{self.port}", "Encrypt=yes"]
            if self.trust_certificate:
                parts.append("TrustServerCertificate=yes")
        parts += [
            f"DATABASE={_brace(database or self.database)}",
            f"UID={_brace(user or self.user)}",
            f"PWD={_brace(password if user else self.password)}",
        ]
        return ";".join(parts)


def dsn_for(admin_dsn: str, driver: str) -> str:
    """``admin_dsn`` as given when it names ``driver``, else rewritten for it."""
    if parse_dsn(admin_dsn).get("DRIVER", "").strip("{}") == driver:
        return admin_dsn
    return Endpoint.from_dsn(admin_dsn).dsn(driver)


def _password() -> str:
    """A password SQL Server's policy accepts: upper, lower, digit and symbol, 24 characters."""
    body = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(20))
    return f"Aa1-{body}"


@dataclass
class LeastPrivilegeLogin:
    """A login and user created by the administrator's DSN, granted only what
    SQLSERVER.md §2 lists: SELECT and VIEW CHANGE TRACKING on each table the
    test hands to ``grant`` (or SELECT on some columns, ``grant_columns``)."""

    admin_dsn: str
    dsn: str
    name: str
    password: str = field(repr=False)

    @classmethod
    def create(cls, admin_dsn: str, driver: str) -> LeastPrivilegeLogin:
        name = "cdc_reader_" + uuid.uuid4().hex[:8]
        password = _password()
        run(
            admin_dsn,
            f"CREATE LOGIN {sql.quote(name)} WITH PASSWORD = N'{password}', CHECK_POLICY = ON",
            f"CREATE USER {sql.quote(name)} FOR LOGIN {sql.quote(name)}",
        )
        dsn = Endpoint.from_dsn(admin_dsn).dsn(driver, user=name, password=password)
        return cls(admin_dsn, dsn, name, password)

    def grant(self, table: str) -> None:
        schema, name = table.split(".", 1)
        target = f"{sql.qualified(schema, name)} TO {sql.quote(self.name)}"
        run(self.admin_dsn, f"GRANT SELECT ON {target}", f"GRANT VIEW CHANGE TRACKING ON {target}")

    def grant_columns(self, table: str, columns: list[str]) -> None:
        """SELECT on ``columns`` only, and VIEW CHANGE TRACKING on the table."""
        schema, name = table.split(".", 1)
        listed = ", ".join(sql.quote(c) for c in columns)
        principal = sql.quote(self.name)
        run(
            self.admin_dsn,
            f"GRANT SELECT ON {sql.qualified(schema, name)} ({listed}) TO {principal}",
            f"GRANT VIEW CHANGE TRACKING ON {sql.qualified(schema, name)} TO {principal}",
        )

    def drop(self) -> None:
        """The user and the login; a login with a session still open is left, named, for the server to keep."""
        run(self.admin_dsn, f"DROP USER IF EXISTS {sql.quote(self.name)}")
        run(self.admin_dsn, f"IF SUSER_ID(N'{self.name}') IS NOT NULL DROP LOGIN {sql.quote(self.name)}")


def run(dsn: str, *statements: str, params: tuple[Any, ...] = ()) -> None:
    import pyodbc

    conn = pyodbc.connect(dsn, autocommit=True, timeout=30)
    try:
        for statement in statements:
            conn.execute(statement, *params)
    finally:
        conn.close()
