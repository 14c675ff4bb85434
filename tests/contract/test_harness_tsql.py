"""The contract harness's own T-SQL, parsed by sqlglot's T-SQL dialect.

No SQL Server is reachable where most of this suite runs (the SQL Server
harness is skipped there), so the statements its key-type tests send are at
least checked to parse here, as the source's own are in
tests/cdc/sources/test_mssql_sql.py.
"""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

from .harness import (
    _MSSQL_TYPES,
    MSSQL_OPEN_TRANSACTIONS,
    make_table_config,
    mssql_ids_in_key_order,
    mssql_insert_literal_rows,
)
from .key_values import MSSQL_KEYS

TABLE = make_table_config("c0123456789", "key_composite")


def parse(statement: str) -> exp.Expr:
    return sqlglot.parse_one(statement, read="tsql")


def test_the_open_transactions_query_parses_with_one_parameter() -> None:
    tree = parse(MSSQL_OPEN_TRANSACTIONS)
    assert len(list(tree.find_all(exp.Placeholder))) == 1
    assert {t.name for t in tree.find_all(exp.Table)} == {
        "dm_exec_sessions",
        "dm_tran_active_snapshot_database_transactions",
    }


@pytest.mark.parametrize("kind", sorted(MSSQL_KEYS))
def test_inserting_every_key_value_parses_as_one_statement(kind: str) -> None:
    values = MSSQL_KEYS[kind]
    rows = [{"k": literal, "n": str(n)} for n, literal in enumerate(values.literals)]
    tree = parse(mssql_insert_literal_rows(TABLE, rows))
    assert isinstance(tree, exp.Insert)
    assert len(tree.expression.expressions) == len(values.literals)  # one VALUES row per value


def test_the_key_order_query_parses() -> None:
    tree = parse(mssql_ids_in_key_order(TABLE, "n", ["grp", "name"]))
    assert [o.this.name for o in tree.args["order"].expressions] == ["grp", "name"]


@pytest.mark.parametrize("kind", ["timestamp", "timestamptz", "uuid", "ctext", "cvarchar"])
def test_the_key_column_types_parse(kind: str) -> None:
    tree = parse(
        f"CREATE TABLE [c0].[t] ([k] {_MSSQL_TYPES[kind]} NOT NULL, [n] int NOT NULL, PRIMARY KEY ([k], [n]))"
    )
    collations = [c.this.name for c in tree.find_all(exp.CollateColumnConstraint)]
    assert collations == (
        [_MSSQL_TYPES[kind].split("COLLATE ")[1]] if "COLLATE" in _MSSQL_TYPES[kind] else []
    )
