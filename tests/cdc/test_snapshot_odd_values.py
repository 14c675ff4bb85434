"""Dates, timestamps and doubles whose JSON text PostgreSQL writes in a
snapshot (``pg_snapshot``): for the edge values of each (years 1 and 9999,
BC, beyond 9999, infinity, fractions of every length, offsets with seconds,
NaN, infinities, negative zero, subnormals, the fixed-point bounds 1e-4 and
1e15 and the doubles beside them) and a seeded sweep of random ones, every
row's document is byte for byte what the change path writes for it, and a
row the change path cannot encode (a NaN) is refused with the same reason.
"""

from __future__ import annotations

import math
import random
from typing import Any

import psycopg
import pytest

from cdc.config import Config, parse_config
from cdc.errors import PoisonChange
from cdc.mapping import TableMapper
from cdc.snapshot_pages import map_page
from cdc.sources import make_source
from cdc.sources.base import ChangeSource, SnapshotPage, TableInfo
from tests.e2e import enable_tracking

DATES = [
    "0001-01-01", "0001-12-31 BC", "0044-03-15 BC", "4713-01-01 BC", "0999-12-31", "1000-01-01",
    "2024-02-29", "9999-12-31", "10000-01-01", "5874897-12-31", "infinity", "-infinity",
]  # fmt: skip
TIMES = [
    "0001-01-01 00:00:00", "0001-01-01 00:00:00.000001", "0001-12-31 23:59:59.999999 BC", "0044-03-15 10:00:00.5 BC",
    "2024-02-29 13:45:30", "2024-02-29 13:45:30.1", "2024-02-29 13:45:30.01", "2024-02-29 13:45:30.000100",
    "2024-02-29 13:45:30.123456", "2024-02-29 00:00:00.100000", "9999-12-31 23:59:59.999999",
    "10000-01-01 00:00:00", "294276-12-31 23:59:59.999999", "infinity", "-infinity",
]  # fmt: skip
OFFSETS = ["+00", "+02", "-01", "+00:19:32", "-09:30", "+14"]
DOUBLES = [
    "0", "-0", "1", "-1", "0.5", "100", "1e-4", "-1e-4", "1e15", "-1e15", "999999999999999", "999999999999999.9",
    "123456789012345.6", "1e16", "1e-5", "0.00012345", "1.5e-7", "5e-324", "2.2250738585072014e-308",
    "1.7976931348623157e308", "-1.7976931348623157e308", "0.1", "0.3", "2.5", "1e22", "9007199254740993",
    "NaN", "Infinity", "-Infinity",
]  # fmt: skip


def _neighbours(value: float) -> list[float]:
    return [math.nextafter(value, -math.inf), value, math.nextafter(value, math.inf)]


def double_texts(seed: int = 7, count: int = 3000) -> list[str]:
    """The edge doubles, the doubles beside the fixed-point bounds, and random
    doubles of every magnitude (random bits, NaN and infinities excepted)."""
    rng = random.Random(seed)
    edges = [repr(v) for bound in (1e-4, 1e15, 1e-5, 1e16) for v in _neighbours(bound) + _neighbours(-bound)]
    found: list[str] = []
    while len(found) < count:
        value = rng.choice(
            [
                lambda: rng.uniform(-1e6, 1e6),
                lambda: rng.uniform(-1, 1) * 10 ** rng.randint(-20, 20),
                lambda: float(rng.randint(-(10**15), 10**15)),
                lambda: float.fromhex(
                    f"{rng.choice('+-')}0x1.{rng.getrandbits(52):013x}p{rng.randint(-1074, 1023)}"
                ),
            ]
        )()
        if math.isfinite(value):
            found.append(repr(value))
    return DOUBLES + edges + found


def time_texts(seed: int = 11, count: int = 500) -> list[str]:
    rng = random.Random(seed)
    found = list(TIMES)
    for _ in range(count):
        year = rng.choice([rng.randint(1, 9999), rng.randint(1, 3000), rng.randint(1, 200)])
        fraction = rng.choice(["", f".{rng.randint(0, 999999):06d}", f".{rng.randint(0, 9)}", ".000000"])
        found.append(
            f"{year:04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}{fraction}"
        )
    return found


def rows() -> list[tuple[Any, ...]]:
    doubles, times = double_texts(), time_texts()
    out = []
    for i in range(max(len(doubles), len(times))):
        time = times[i % len(times)]
        offset = OFFSETS[i % len(OFFSETS)] if time[0].isdigit() else ""
        if time.startswith("294276"):  # the last timestamp: a negative offset would pass it
            offset = "+00"
        out.append((i, DATES[i % len(DATES)], time, time, f"{time}{offset}", doubles[i % len(doubles)]))
    return out


def odd_config(dsn: str, redis_url: str, namespace: str, schema: str) -> Config:
    text = (
        f"source:\n  kind: postgres\n  dsn: {dsn}\n  tracking_schema: {schema}_trk\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        f"worker:\n  health: null\n"
        f"tables:\n  - table: {schema}.odd\n    partition: odd\n    section: odd\n"
    )
    return parse_config(text, "<test>", {})


async def pages(source: ChangeSource, info: TableInfo, *, encoded: bool) -> list[SnapshotPage]:
    return [page async for page in source.snapshot(info, page_size=500, encoded=encoded)]


def by_change_path(mapper: TableMapper, slow: list[SnapshotPage]) -> dict[str, Any]:
    """Each row's documents as the change path encodes them, or its refusal."""
    out: dict[str, Any] = {}
    for page in slow:
        for row in page.rows:
            key = mapper.key_template.render(row)
            try:
                out[key] = mapper.encode(row, row)
            except PoisonChange as exc:
                out[key] = str(exc)
    return out


def by_server(mapper: TableMapper, fast: list[SnapshotPage]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for page in fast:
        mapped = map_page(page, mapper)
        for _, written in mapped.rows.by_partition.items():
            for key, values in written:
                out[key] = {
                    c: v.encode() if isinstance(v, str) else v
                    for c, v in zip(mapped.rows.columns, values, strict=True)
                }
        for primary_key, reason in mapped.poisoned:
            out[mapper.key_template.render(primary_key)] = reason
    return out


@pytest.mark.timeout(180)
async def test_server_written_dates_times_and_doubles_equal_the_change_paths(
    postgres_dsn: str, redis_url: str, namespace: str, pg_schema: str
) -> None:
    s = pg_schema
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        await conn.execute(
            f"create table {s}.odd (id int primary key, d date, ts timestamp, ts3 timestamp(3),"
            " tz timestamptz, f double precision)"
        )
        async with conn.cursor() as cursor:
            await cursor.executemany(
                f"insert into {s}.odd values (%s, %s::date, %s::timestamp, %s::timestamp(3), %s::timestamptz,"
                " %s::float8)",
                rows(),
            )
        await conn.execute(f"insert into {s}.odd (id) values (-1)")  # every column NULL
    config = odd_config(postgres_dsn, redis_url, namespace, s)
    await enable_tracking(config)
    source = make_source(config.source)
    await source.connect()
    try:
        info = await source.describe(config.tables[0])
        mapper = TableMapper(config.tables[0], info, 1 << 24)
        fast = await pages(source, info, encoded=True)
        assert set(fast[0].encoded_columns) >= {"d", "ts", "ts3", "tz", "f"}, "the server writes them"
        expected, found = (
            by_change_path(mapper, await pages(source, info, encoded=False)),
            by_server(mapper, fast),
        )
        assert found.keys() == expected.keys() and len(expected) > 3000
        differ = {key: (value, found[key]) for key, value in expected.items() if found[key] != value}
        assert differ == {}
        refused = [value for value in expected.values() if isinstance(value, str)]
        assert len(refused) >= 3 and all("cannot be represented in JSON" in reason for reason in refused)
    finally:
        await source.close()
