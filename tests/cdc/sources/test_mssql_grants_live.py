"""``cdc doctor`` and ``cdc tracking enable --grant-to`` against a real SQL
Server, as a login that is not the administrator (skipped, with the reason,
where none is reachable: tests/conftest.py).

- a login granted nothing: doctor names the table's GRANTs with the user's name;
- ``grant_runtime`` (``--grant-to``) by the administrator: doctor is clean;
- enabling as that login (which may SELECT, not ALTER): one error naming the table.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cdc.config import SourceConfig, TableConfig
from cdc.errors import SourceError
from cdc.sources import mssql_sql as sql
from cdc.sources.mssql import MssqlSource
from tests.cdc.sources.test_mssql_live import admin, table
from tests.mssql_env import LeastPrivilegeLogin

pytestmark = pytest.mark.mssql
__all__ = ["admin", "table"]  # fixtures, imported to be found here


@pytest.fixture
def login(mssql_dsn: str, mssql_driver: str) -> Iterator[LeastPrivilegeLogin]:
    """A login and user granted nothing (a fresh one: the session's reader holds other tests' grants)."""
    created = LeastPrivilegeLogin.create(mssql_dsn, mssql_driver)
    yield created
    created.drop()


async def test_doctor_names_the_grants_and_grant_to_gives_them(
    admin: MssqlSource, table: TableConfig, login: LeastPrivilegeLogin
) -> None:
    await admin.tracking_enable([table])
    source = MssqlSource(SourceConfig(kind="mssql", dsn=login.dsn))
    await source.connect()
    try:
        refused = [f for f in await source.doctor([table]) if f.subject == table.table and f.level == "error"]
        assert refused, "a login granted nothing must get an error for the table"
        principal = sql.quote(login.name)
        assert any(f"TO {principal}" in f.message for f in refused), refused

        assert await admin.grant_runtime([table], login.name) == [
            f"{login.name}: granted SELECT, VIEW CHANGE TRACKING on {table.table}"
        ]
        findings = await source.doctor([table])
        assert [f for f in findings if f.level == "error"] == [], findings

        with pytest.raises(SourceError, match=f"may not ALTER 1 table\\(s\\): {table.table}"):
            await source.tracking_enable([table])
    finally:
        await source.close()
