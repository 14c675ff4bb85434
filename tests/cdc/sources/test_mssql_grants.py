"""SQL Server's ``tracking enable --grant-to`` and its ALTER check, without a
SQL Server: every statement parses with sqlglot's T-SQL dialect and takes its
parameters; names are bracket-quoted where T-SQL takes no parameter; the
decisions are made on FakeOdbc's scripted answers (a live server proves the
rest: tests/cdc/sources/test_mssql_grants_live.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cdc.errors import ConfigError, SourceError
from cdc.sources import mssql_grants
from cdc.sources import mssql_sql as sql
from cdc.sources.mssql import MssqlSource
from tests.cdc.sources.test_mssql_sql import (
    CONFIG,
    FakeConnection,
    FakeOdbc,
    parse,
    placeholders,
    table_config,
)


@pytest.mark.parametrize(
    "statement",
    [
        mssql_grants.CURRENT_USER,
        mssql_grants.principal_exists("cdc_sidecar"),
        mssql_grants.grant("SELECT", "dbo", "Forecasts", "cdc_sidecar"),
        mssql_grants.grant("VIEW CHANGE TRACKING", "we]ird", "Or[ders] x", "sidecar]; DROP USER x; --"),
        mssql_grants.can_alter(
            [table_config(), dataclasses.replace(table_config(), schema="s]", name="t x")]
        ),
    ],
    ids=["current-user", "principal", "grant-select", "grant-hostile-names", "can-alter"],
)
def test_statements_parse_and_take_their_parameters(statement: sql.Statement) -> None:
    assert placeholders(parse(statement)) == len(statement.params)


def test_grants_quote_every_name() -> None:
    statement = mssql_grants.grant(
        "VIEW CHANGE TRACKING", "we]ird", "Or[ders] x", "sidecar]; DROP USER x; --"
    )
    assert (
        statement.sql
        == "GRANT VIEW CHANGE TRACKING ON [we]]ird].[Or[ders]] x] TO [sidecar]]; DROP USER x; --]"
    )
    assert parse(statement).key == "grant"
    with pytest.raises(ValueError, match="not a runtime permission"):
        mssql_grants.grant("CONTROL", "dbo", "Forecasts", "u")


class Principals(FakeOdbc):
    """FakeOdbc that knows the user ``cdc_sidecar`` and which tables the login may ALTER."""

    def __init__(self, alterable: dict[str, int]) -> None:
        super().__init__()
        self.alterable = alterable

    def answer(self, text: str, params: tuple[Any, ...], conn: FakeConnection) -> list[tuple[Any, ...]]:
        if text.startswith("SELECT DATABASE_PRINCIPAL_ID"):
            return [(5 if params[0] == "cdc_sidecar" else None,)]
        if text == mssql_grants.CURRENT_USER.sql:
            return [("app_admin",)]
        if "HAS_PERMS_BY_NAME(t.name, N'OBJECT', N'ALTER')" in text:
            return [(n, name, self.alterable.get(name, 1)) for n, name in enumerate(params)]
        return super().answer(text, params, conn)


async def test_grant_to_sends_select_and_view_change_tracking_per_table() -> None:
    fake = Principals({})
    source = MssqlSource(CONFIG, connector=fake.connect)
    lines = await source.grant_runtime([table_config()], "cdc_sidecar")
    await source.close()
    sent = [text for text, _ in fake.log if text.startswith("GRANT")]
    assert sent == [
        "GRANT SELECT ON [dbo].[Forecasts] TO [cdc_sidecar]",
        "GRANT VIEW CHANGE TRACKING ON [dbo].[Forecasts] TO [cdc_sidecar]",
    ]
    assert lines == ["cdc_sidecar: granted SELECT, VIEW CHANGE TRACKING on dbo.Forecasts"]


async def test_grant_to_an_unknown_user_grants_nothing() -> None:
    fake = Principals({})
    source = MssqlSource(CONFIG, connector=fake.connect)
    with pytest.raises(ConfigError, match="no user 'nobody'"):
        await source.grant_runtime([table_config()], "nobody")
    await source.close()
    assert not [text for text, _ in fake.log if text.startswith("GRANT")]


async def test_enable_names_every_table_the_login_may_not_alter_and_changes_nothing() -> None:
    other = dataclasses.replace(table_config(), table="sales.Orders", schema="sales", name="Orders")
    fake = Principals({"[dbo].[Forecasts]": 0, "[sales].[Orders]": 0})
    source = MssqlSource(CONFIG, connector=fake.connect)
    with pytest.raises(SourceError) as raised:
        await source.tracking_enable([table_config(), other])
    await source.close()
    message = str(raised.value)
    assert "may not ALTER 2 table(s): dbo.Forecasts, sales.Orders" in message
    assert (
        "GRANT ALTER ON [dbo].[Forecasts] TO [app_admin]; GRANT ALTER ON [sales].[Orders] TO [app_admin]"
        in message
    )
    assert not [text for text, _ in fake.log if text.startswith("ALTER")]
