"""The demo's tables, their config file, and reading them back.

Two tables: ``demo.forecasts``, partitioned by region (``region-1`` ..
``region-3``), and ``demo.stations`` in one partition (``grid``). The writer
keeps changing both; station ``FEATURED_ID`` changes every second, so the
screen has one row that always moves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

SCHEMA_SQL = """
create schema if not exists demo;
create table if not exists demo.forecasts (
    region_id  int not null,
    id         int not null,
    price      numeric(12, 2) not null,
    valid_from timestamptz not null,
    valid_to   timestamptz,
    status     text not null,
    primary key (region_id, id)
);
create table if not exists demo.stations (
    id      int primary key,
    name    text not null,
    active  boolean not null,
    load_kw double precision,
    meta    jsonb
);
"""

SEED_FORECASTS = 250  # rows the first snapshot loads
SEED_STATIONS = 20
REGIONS = 3
FEATURED_ID = 7  # the station the screen shows in PostgreSQL, Redis and the replica
LEASE_TTL = "3s"  # a killed sidecar's tables are taken over after it (production: 10s)

# The servers are written literally, never as ${CDC_SOURCE_DSN:-...}: an
# operator's shell may export the variables for a real database and Redis, and
# the demo (its sidecars, and the footer's `cdc status -c` run in that shell)
# must not write its rows there. ``health`` takes ${CDC_HEALTH}: each sidecar
# of the demo sets its own port (two sidecars on one host cannot share one).
CONFIG_YAML = """\
# Written by `cdc demo`. An ordinary cdc-sync config file: copy it and adapt it.
source:
  kind: postgres
  dsn: {dsn}
  retention: 1d
redis:
  url: {redis_url}
  namespace: demo
worker:
  max_batch_size: 500
  max_wait: 50ms
  lease_ttl: {lease_ttl}
  heartbeat: 1s
  health: ${{CDC_HEALTH:-127.0.0.1:{health_port}}}
tables:
  - table: demo.forecasts
    partition: "region-{{region_id}}"
    section: forecasts
    key: "{{id}}"
  - table: demo.stations
    partition: grid
    section: stations
    backoff: [[5, 50ms], [20, 200ms], [null, 1s]]
"""


@dataclass(frozen=True)
class DemoTable:
    """How a table of the demo maps to documents (as the config above says)."""

    table: str
    section: str
    order: str  # the primary key, for reading the rows in a stable order

    def identity(self, row: dict[str, Any]) -> tuple[str, str]:
        """(partition, key) of a row, by the config's templates."""
        if self.section == "forecasts":
            return f"region-{row['region_id']}", str(row["id"])
        return "grid", str(row["id"])


TABLES = (
    DemoTable("demo.forecasts", "forecasts", "region_id, id"),
    DemoTable("demo.stations", "stations", "id"),
)
SECTIONS = tuple(t.section for t in TABLES)
FEATURED_TABLE = TABLES[1]
FEATURED = f"{FEATURED_TABLE.table} id={FEATURED_ID} (partition grid, key {FEATURED_ID})"
UPDATE_SQL = f"update demo.stations set name = 'renamed by me' where id = {FEATURED_ID}"  # noqa: S608 - a constant


def write_config(path: Path, dsn: str, redis_url: str, health_port: int) -> None:
    text = CONFIG_YAML.format(dsn=dsn, redis_url=redis_url, health_port=health_port, lease_ttl=LEASE_TTL)
    path.write_text(text, encoding="utf-8")


async def create_tables(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(SCHEMA_SQL)
        await conn.execute(
            "insert into demo.stations select i, 'station ' || i, true, 10.0 * i, jsonb_build_object('zone', i %% 3)"
            " from generate_series(1, %s) i on conflict do nothing",
            (SEED_STATIONS,),
        )
        await conn.execute(
            "insert into demo.forecasts select 1 + i %% %s, i, (i * 7 %% 9000 + 100) / 100.0,"
            " now(), now() + interval '1 day', 'draft' from generate_series(1, %s) i on conflict do nothing",
            (REGIONS, SEED_FORECASTS),
        )


class Reader:
    """One connection that reads the demo's tables for the screen and the closing check."""

    def __init__(self, conn: psycopg.AsyncConnection[dict[str, Any]]) -> None:
        self.conn = conn

    @classmethod
    async def connect(cls, dsn: str) -> Reader:
        return cls(await psycopg.AsyncConnection.connect(dsn, autocommit=True, row_factory=dict_row))

    async def close(self) -> None:
        await self.conn.close()

    async def counts(self) -> dict[str, int]:
        out = {}
        for table in TABLES:
            cursor = await self.conn.execute(f"select count(*) as n from {table.table}")  # noqa: S608 - our names
            row = await cursor.fetchone()
            out[table.table] = int(row["n"]) if row else 0
        return out

    async def featured(self) -> dict[str, Any] | None:
        cursor = await self.conn.execute("select * from demo.stations where id = %s", (FEATURED_ID,))
        return await cursor.fetchone()

    async def rows(self, table: DemoTable) -> dict[tuple[str, str], dict[str, Any]]:
        """Every row of ``table`` by (partition, key), in one consistent read."""
        cursor = await self.conn.execute(f"select * from {table.table} order by {table.order}")  # noqa: S608
        return {table.identity(row): row for row in await cursor.fetchall()}
