"""The dead letter's readers and pruning (``publishers.deadletters``), on a
single server and on a Redis Cluster (``redis_config``)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from publishers import deadletters
from publishers import manager as manager_module
from publishers.manager import DataManager
from publishers.model import Change
from publishers.settings import RedisConfig


@pytest.fixture
async def manager(redis_config: RedisConfig) -> AsyncIterator[DataManager]:
    manager = await DataManager.connect(redis_config)
    yield manager
    await manager.close()


def change(table: str, key: str) -> Change:
    return Change(table, "p1", "s", key, "U", 7, {"id": key.encode(), "v": b'"x"'})


async def test_list_show_delete_and_purge(manager: DataManager) -> None:
    assert await deadletters.last_id(manager) == "0-0"
    for i in range(5):
        await manager.dead_letter(
            change("a.t" if i % 2 == 0 else "b.t", str(i)),
            f"reason {i}",
            table="a.t" if i % 2 == 0 else "b.t",
        )
    assert await deadletters.counts(manager) == {"a.t": 3, "b.t": 2}
    page = await deadletters.entries(manager, table="A.T", limit=2)
    assert [e.key for e in page.entries] == ["0", "2"] and page.next == page.entries[-1].id
    rest = await deadletters.entries(manager, table="a.t", after=page.next)
    assert [e.key for e in rest.entries] == ["4"] and rest.next is None
    first = page.entries[0]
    shown = await deadletters.entry(manager, first.id)
    assert shown == first and shown.reason == "reason 0" and shown.decoded_values() == {"id": 0, "v": "x"}
    assert shown.as_json()["values"] == {"id": 0, "v": "x"} and shown.as_json()["version"] == "7"
    assert await deadletters.entry(manager, "1-1") is None
    with pytest.raises(ValueError, match="not a dead letter id"):
        await deadletters.entry(manager, "x")
    mark = await deadletters.last_id(manager)
    assert await deadletters.delete(manager, [first.id, "1-1"]) == 1
    assert await deadletters.purge(manager, "b.t") == 2
    assert await deadletters.counts(manager) == {"a.t": 2}
    assert await deadletters.purge(manager) == 2 and await deadletters.counts(manager) == {}
    await manager.dead_letter(change("a.t", "9"), "later", table="a.t")
    assert [e.key async for e in deadletters.scan(manager, after=mark)] == ["9"], (
        "ids keep growing after a purge"
    )


async def test_entries_page_through_more_than_one_xrange_page(
    manager: DataManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deadletters, "PAGE", 3)
    for i in range(8):
        await manager.dead_letter(change("a.t", str(i)), "r", table="a.t" if i != 6 else "b.t")
    assert await deadletters.counts(manager) == {"a.t": 7, "b.t": 1}
    page = await deadletters.entries(manager, table="a.t", limit=5)
    assert [e.key for e in page.entries] == ["0", "1", "2", "3", "4"]
    assert [e.key for e in (await deadletters.entries(manager, table="a.t", after=page.next)).entries] == [
        "5",
        "7",
    ]


async def test_a_full_dead_letter_is_said(
    manager: DataManager, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The cap trims the oldest entries (a poison storm must not fill Redis): never silently."""
    monkeypatch.setattr(manager_module, "DEAD_LETTER_MAX_LEN", 3)
    with caplog.at_level(logging.ERROR, logger="publishers.deadletter"):
        for i in range(2):
            await manager.dead_letter(change("a.t", str(i)), "r", table="a.t")
        assert not caplog.records
        manager._cap._next_check = 0.0  # (read at most once a second: not wait for it here)
        await manager.dead_letter(change("a.t", "2"), "r", table="a.t")
    [record] = caplog.records
    assert (
        "holds 3 entries, its cap (3)" in record.getMessage() and "cdc deadletter list" in record.getMessage()
    )
