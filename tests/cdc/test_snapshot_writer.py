"""The snapshot's page writer overlaps the sidecar's work with Redis's: page
N is being written (sent, and Redis at work on it) while page N+1 is mapped.
Without that, the two CPUs' times a row add up (bench/RESULTS.md, snapshot).
Real Redis; the order of events is the event loop's, not a timing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from cdc import snapshot_writer
from cdc.config import RedisConfig, TableConfig
from cdc.errors import RedisUnavailable
from cdc.mapping import TableMapper
from cdc.snapshot_writer import PageWriter
from cdc.sources.base import Column, SnapshotPage, TableInfo
from cdc.templates import Template
from publishers.bulk import BulkOutcome, BulkWriter, PageRows
from publishers.manager import DataManager

TABLE, SECTION = "s.t", "sec"
MAPPER = TableMapper(
    TableConfig(TABLE, "s", "t", SECTION, Template.parse("p"), None, None),
    TableInfo(TABLE, "s", "t", ("Id",), (Column("Id", "int"), Column("Name", "text"))),
    max_row_bytes=1 << 20,
)


class Feeder:
    """What the page writer asks of a RowFeeder: the mapper (no row here is poisoned)."""

    mapper = MAPPER

    async def dead_letter_row(self, *args: Any) -> None:
        raise AssertionError(f"nothing is dead-lettered here: {args}")

    async def dead_letter_document(self, *args: Any) -> None:
        raise AssertionError(f"nothing is dead-lettered here: {args}")


@pytest.fixture
async def manager(redis_config: RedisConfig) -> AsyncIterator[DataManager]:
    manager = await DataManager.connect(redis_config)
    yield manager
    await manager.close()


def pages(count: int, rows: int) -> list[SnapshotPage]:
    return [
        SnapshotPage(7, [{"Id": n * rows + i, "Name": f"row {i}"} for i in range(rows)]) for n in range(count)
    ]


async def test_a_page_is_written_while_the_next_one_is_mapped(
    manager: DataManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, int]] = []

    class Recording(BulkWriter):
        async def write(self, table: str, section: str, page: PageRows, **kw: Any) -> BulkOutcome:
            number = min(int(key) for rows in page.by_partition.values() for key, _ in rows) // 3000
            events.append(("write starts", number))
            return await super().write(table, section, page, **kw)

    mapping = snapshot_writer.map_page_in_steps

    async def recorded_map(page: SnapshotPage, mapper: TableMapper) -> Any:
        number = page.rows[0]["Id"] // 3000
        mapped = await mapping(page, mapper)
        events.append(("mapped", number))
        return mapped

    monkeypatch.setattr(snapshot_writer, "map_page_in_steps", recorded_map)
    settled: list[int] = []

    async def done(page: SnapshotPage, outcome: BulkOutcome) -> None:
        settled.append(outcome.written)

    writer = Recording(manager.client, manager.config, manager.layout)
    page_writer = PageWriter(TABLE, SECTION, writer, Feeder(), True, done)  # type: ignore[arg-type]
    for page in pages(4, 3000):
        await page_writer.put(page)
    await page_writer.flush()

    assert settled == [3000] * 4
    assert await manager.client.scard(manager.layout.index("p", SECTION)) == 12000
    for n in range(3):  # page n's write began before page n+1 was mapped
        assert events.index(("write starts", n)) < events.index(("mapped", n + 1)), events


async def test_pages_after_one_that_failed_are_never_recorded_as_written(manager: DataManager) -> None:
    """Two pages are in flight: when the older one fails, the newer may well
    be written, but the resume point must not pass the failed page."""

    class FailsPageOne(BulkWriter):
        async def write(self, table: str, section: str, page: PageRows, **kw: Any) -> BulkOutcome:
            number = min(int(key) for rows in page.by_partition.values() for key, _ in rows) // 100
            if number == 1:
                raise RedisUnavailable("Redis went away for a moment (test)")
            return await super().write(table, section, page, **kw)

    settled: list[int] = []

    async def done(page: SnapshotPage, outcome: BulkOutcome) -> None:
        settled.append(page.rows[0]["Id"] // 100)

    writer = FailsPageOne(manager.client, manager.config, manager.layout)
    page_writer = PageWriter(TABLE, SECTION, writer, Feeder(), True, done)  # type: ignore[arg-type]
    with pytest.raises(RedisUnavailable):
        for page in pages(3, 100):
            await page_writer.put(page)
        await page_writer.flush()
    await page_writer.close()
    assert settled == [0], "a page after the failed one was recorded as written"
