"""The demo's writer: inserts, updates and deletes forecasts, toggles
stations, and changes the featured station every second."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from decimal import Decimal
from typing import Any

import psycopg

from cdc.demo.database import FEATURED_ID, REGIONS, SEED_FORECASTS, SEED_STATIONS

FEATURED_EVERY = 1.0  # seconds between changes of the featured row


async def write(dsn: str, rate: float, stop: asyncio.Event) -> None:
    """About ``rate`` transactions a second until ``stop`` is set."""
    rng = random.Random(7)
    featured_due = time.monotonic()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        next_id = await _highest_id(conn)  # a second run of the demo finds the first's rows
        while not stop.is_set():
            if time.monotonic() >= featured_due:
                featured_due += FEATURED_EVERY
                await _change_featured(conn)
            else:
                next_id = await _one_change(conn, rng, next_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0 / rate)


async def _highest_id(conn: psycopg.AsyncConnection[Any]) -> int:
    cursor = await conn.execute("select coalesce(max(id), 0) from demo.forecasts")
    row = await cursor.fetchone()
    return max(SEED_FORECASTS, int(row[0]) if row else 0)


async def _change_featured(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(
        "update demo.stations set load_kw = round((random() * 100)::numeric, 1),"
        " meta = jsonb_set(meta, '{beat}', to_jsonb(coalesce((meta->>'beat')::int, 0) + 1)) where id = %s",
        (FEATURED_ID,),
    )


async def _one_change(conn: psycopg.AsyncConnection[Any], rng: random.Random, next_id: int) -> int:
    choice = rng.random()
    if choice < 0.4:
        next_id += 1
        await conn.execute(
            "insert into demo.forecasts values (%s, %s, %s, now(), now() + interval '1 day', 'draft')",
            (rng.randint(1, REGIONS), next_id, Decimal(rng.randint(100, 9999)) / 100),
        )
    elif choice < 0.8:
        await conn.execute(
            "update demo.forecasts set price = price + 0.25, status = 'published'"
            " where (region_id, id) in (select region_id, id from demo.forecasts order by random() limit 1)"
        )
    elif choice < 0.9:
        await conn.execute(
            "delete from demo.forecasts where (region_id, id) in"
            " (select region_id, id from demo.forecasts order by random() limit 1)"
        )
    else:
        await conn.execute(
            "update demo.stations set active = not active, load_kw = round((random() * 100)::numeric, 1)"
            " where id = %s and id <> %s",
            (rng.randint(1, SEED_STATIONS), FEATURED_ID),
        )
    return next_id
