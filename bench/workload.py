"""The benchmark tables and the writes that make their backlogs.

Every table has the same ten columns of mixed types (int, bigint, numeric,
text, timestamptz, boolean, double, jsonb, uuid, date), about 230 bytes of
JSON per row, and every value is a function of the row's id, so that rows are
written by ``generate_series`` in a few large statements.

A backlog of ``n`` changes per table is 60% updates (three columns change),
30% inserts and 10% deletes, each of a different row, so that the tracking's
net changes are exactly ``n`` per table:

    rows before the backlog   ids 1 .. 0.7n
    updates                   ids 1 .. 0.6n
    deletes                   ids 0.6n+1 .. 0.7n
    inserts                   ids 0.7n+1 .. n

It is written in ``rounds`` rounds (round r touches the ids with
``id % rounds = r``), each one transaction over every table, so that a
checkpoint at the version before the last round leaves exactly the last
round's changes to read: the smaller backlog of the memory benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.env import Env

SCHEMA = "bench"

COLUMNS_DDL = """
    id int primary key,
    big bigint not null,
    amount numeric(12, 2),
    name text,
    updated_at timestamptz,
    active boolean,
    ratio double precision,
    attrs jsonb,
    ref uuid,
    day date
"""

# The values of row g.
ROW_VALUES = """
    g,
    9007199254740993 + g::bigint * 1000003,
    ((g % 100000) / 100.0)::numeric(12, 2),
    'item ' || g || ' ' || md5(g::text),
    timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second',
    g % 3 = 0,
    g / 7.0,
    jsonb_build_object('k', g, 'tags', jsonb_build_array('red', 'green'), 'n', g % 10),
    md5(g::text)::uuid,
    date '2026-01-01' + (g % 365)
"""


def create_table(env: Env, name: str, rows: int) -> None:
    """A table with ``rows`` rows (ids 1..rows), written before tracking is on."""
    env.sql(
        f"create schema if not exists {SCHEMA}",
        f"drop table if exists {SCHEMA}.{name}",
        f"create table {SCHEMA}.{name} ({COLUMNS_DDL})",
        f"insert into {SCHEMA}.{name} select {ROW_VALUES} from generate_series(1, {rows}) as g",
    )


def table_entry(name: str, **extra: object) -> dict[str, object]:
    """The table's entry in a config file: one partition per table."""
    return {"table": f"{SCHEMA}.{name}", "partition": name, "section": name, **extra}


@dataclass(frozen=True)
class Backlog:
    """The shape of a backlog of ``per_table`` changes on each table."""

    tables: tuple[str, ...]
    per_table: int
    rounds: int = 4

    @property
    def total(self) -> int:
        return self.per_table * len(self.tables)

    @property
    def initial_rows(self) -> int:
        return self.per_table * 7 // 10

    @property
    def updates(self) -> int:
        return self.per_table * 6 // 10

    def create_tables(self, env: Env) -> None:
        for name in self.tables:
            create_table(env, name, self.initial_rows)

    def write_round(self, env: Env, r: int) -> None:
        """Round ``r``: its updates, deletes and inserts on every table, one transaction."""
        n, initial, updates, rounds = self.per_table, self.initial_rows, self.updates, self.rounds
        statements = []
        for name in self.tables:
            t = f"{SCHEMA}.{name}"
            statements += [
                f"update {t} set amount = amount + 1, updated_at = updated_at + interval '1 hour',"
                f" ratio = ratio * 1.5 where id <= {updates} and id % {rounds} = {r}",
                f"delete from {t} where id > {updates} and id <= {initial} and id % {rounds} = {r}",
                f"insert into {t} select {ROW_VALUES} from generate_series({initial + 1}, {n}) as g"
                f" where g % {rounds} = {r}",
            ]
        env.sql(*statements)
