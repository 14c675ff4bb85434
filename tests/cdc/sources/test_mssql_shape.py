"""How the SQL Server source follows a table's shape, checked without a SQL Server.

The decisions only (the statement that fingerprints tables, parsed by
sqlglot's T-SQL grammar; which columns are published; what tracking status
reports; how a change is put into words): what SQL Server does at each DDL
step is tests/cdc/sources/test_mssql_live.py's to show.
"""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

from cdc.errors import SchemaError
from cdc.sources import mssql_sql as sql
from cdc.sources import mssql_sql_catalog as catalog_sql
from cdc.sources.base import Column, TableInfo
from cdc.sources.mssql_catalog import choose_columns, shape_change
from cdc.sources.mssql_tracking import DatabaseSettings, TableState, table_status

HOSTILE = ("we]ird", "x'); DROP TABLE t; --")

# -- the fingerprint statement ------------------------------------------------------------


def parsed(statement: sql.Statement) -> exp.Expression:
    tree = sqlglot.parse_one(statement.sql, read="tsql")
    assert len(list(tree.find_all(exp.Placeholder))) == len(statement.params)
    return tree


def test_the_fingerprint_statement_reads_every_part_of_the_shape() -> None:
    tree = parsed(catalog_sql.fingerprints([("dbo", "Forecasts")]))
    columns = {(c.table, c.name) for c in tree.find_all(exp.Column)}
    for part in (
        "column_id",
        "name",
        "system_type_id",
        "user_type_id",
        "max_length",
        "precision",
        "scale",
        "is_nullable",
        "is_computed",
    ):
        assert ("c", part) in columns, part
    assert ("ic", "key_ordinal") in columns and ("i", "is_primary_key") in columns
    assert ("ctt", "is_track_columns_updated_on") in columns and ("o", "object_id") in columns
    tables = {f"{t.db}.{t.name}" for t in tree.find_all(exp.Table) if t.name}
    assert {
        "sys.columns",
        "sys.indexes",
        "sys.index_columns",
        "sys.tables",
        "sys.change_tracking_tables",
    } <= tables
    # STRING_AGG ... WITHIN GROUP: columns in column_id order, the key in key order
    aggregates = [g.this for g in tree.find_all(exp.GroupConcat)]
    assert all(isinstance(a, exp.Order) for a in aggregates)
    assert [[o.sql("tsql") for o in a.expressions] for a in aggregates] == [
        ["c.column_id"],
        ["ic.key_ordinal"],
    ]


def test_fingerprinting_many_tables_is_one_statement_with_the_names_as_parameters() -> None:
    names = [("dbo", f"T{i}") for i in range(49)] + [HOSTILE]
    statement = catalog_sql.fingerprints(names)
    tree = parsed(statement)
    assert statement.params == (*(f"[dbo].[T{i}]" for i in range(49)), "[we]]ird].[x'); DROP TABLE t; --]")
    assert "DROP" not in statement.sql and "T48" not in statement.sql  # never pasted
    [values] = list(tree.find_all(exp.Values))
    assert [row.expressions[0].sql() for row in values.expressions] == [str(n) for n in range(50)]
    # the same number of tables gives the same text: every poll sends the same statement
    assert catalog_sql.fingerprints([("s", f"n{i}") for i in range(50)]).sql == statement.sql
    for wrong in ([], [("dbo", "T")] * (catalog_sql.FINGERPRINT_BATCH + 1)):
        with pytest.raises(ValueError):
            catalog_sql.fingerprints(wrong)


def test_the_table_states_statement_reads_the_minimum_version_of_tracked_tables_only() -> None:
    statement = catalog_sql.table_states([("dbo", "Forecasts"), HOSTILE])
    tree = parsed(statement)
    [case] = [c for c in tree.find_all(exp.Case) if "MIN_VALID_VERSION" in c.sql("tsql")]
    assert case.args["ifs"][0].this.sql("tsql") == "ctt.object_id IS NULL"
    assert case.args["ifs"][0].args["true"].sql() == "NULL"


def test_a_read_asks_for_the_object_id_with_the_minimum_valid_version() -> None:
    statement = sql.min_valid_version(*HOSTILE)
    tree = parsed(statement)
    assert [e.alias for e in tree.expressions] == ["min_valid_version", "table_identity"]
    assert statement.params == ("[we]]ird].[x'); DROP TABLE t; --]",) * 4


# -- which columns are published ----------------------------------------------------------

CATALOG = ["Id", "Price", "@flag", "Status"]


def test_every_column_but_the_reserved_ones_without_a_columns_list() -> None:
    assert choose_columns("dbo.T", CATALOG, ["Id"], None) == (["Id", "Price", "Status"], ("@flag",))


def test_a_columns_list_publishes_the_key_and_the_listed_columns_in_the_catalogs_spelling() -> None:
    assert choose_columns("dbo.T", CATALOG, ["Id"], ["status", "Id"]) == (["Id", "Status"], ())


@pytest.mark.parametrize(
    ("catalog", "key", "wanted", "words"),
    [
        (CATALOG, [], None, "dbo.T: the table has no primary key"),
        (["@id", "Price"], ["@id"], None, "dbo.T: primary-key column @id starts with @, which is reserved"),
        (["@id", "Price"], ["@id"], ["Price"], "dbo.T: primary-key column @id"),
        (CATALOG, ["Id"], ["Nope"], "dbo.T: no column Nope (columns: Id, Price, @flag, Status)"),
        (["Key2", "Price"], ["Key"], None, "dbo.T: the table changed while it was described"),
    ],
)
def test_refusals_name_the_table_and_the_column(
    catalog: list[str], key: list[str], wanted: list[str] | None, words: str
) -> None:
    with pytest.raises(SchemaError) as caught:
        choose_columns("dbo.T", catalog, key, wanted)
    assert words in str(caught.value)


# -- what tracking status reports ---------------------------------------------------------


def database(tracking: bool = True) -> DatabaseSettings:
    return DatabaseSettings("CdcDemo", 1, "ON", tracking, 172800.0, "2 DAYS", True)


@pytest.mark.parametrize(
    ("db", "state", "enabled", "minimum", "words"),
    [
        (database(), TableState(True, True, True, 7), True, 7, "TRACK_COLUMNS_UPDATED = ON"),
        (database(), TableState(True, True, False, 7), True, 7, "TRACK_COLUMNS_UPDATED = OFF"),
        # never enabled, turned off, or dropped and created again: not captured, whatever the function says
        (database(), TableState(True, False, False, 7), False, None, "`cdc tracking enable --table dbo.T`"),
        (database(), TableState(False, False, False, None), False, None, "no such table"),
        (database(False), TableState(True, True, True, 7), False, None, "off for database CdcDemo"),
        (database(), TableState(True, True, True, None), False, None, "VIEW CHANGE TRACKING"),
    ],
)
def test_tracking_status_has_a_minimum_valid_version_only_when_changes_are_captured(
    db: DatabaseSettings, state: TableState, enabled: bool, minimum: int | None, words: str
) -> None:
    status = table_status("dbo.T", db, state, 12)
    assert (status.table, status.enabled, status.min_valid_version, status.current_version) == (
        "dbo.T",
        enabled,
        minimum,
        12,
    )
    assert words in status.detail


# -- a change in words ----------------------------------------------------------------------


def info(*columns: Column, key: tuple[str, ...] = ("Id",), identity: str = "1000") -> TableInfo:
    return TableInfo("dbo.T", "dbo", "T", key, (Column("Id", "int", False), *columns), identity=identity)


def test_a_change_is_put_into_words() -> None:
    price = Column("Price", "decimal(12,2)")
    assert shape_change(info(price), info(price, identity="2000")) == (
        "the table was dropped and created again (identity 1000, now 2000)"
    )
    assert shape_change(info(price), info(Column("Cost", "decimal(12,2)"))) == (
        "column Price is gone; column Cost is new"
    )
    assert shape_change(info(price), info(Column("Price", "nvarchar(20)", False))) == (
        "column Price was decimal(12,2), now nvarchar(20) not null"
    )
    assert shape_change(info(price), info(price, key=("Id", "Price"))) == (
        "primary key (Id) is now (Id, Price)"
    )
