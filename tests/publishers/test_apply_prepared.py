"""A batch made ready while Redis runs the one before it (``DataManager.prepare``,
used by the pipeline under a backlog: ``cdc.batching``) applies exactly as the
same batch unprepared, on one server and on a cluster; ``meanwhile`` runs once
per batch that sends a call. Real Redis throughout."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from cdc.config import RedisConfig
from publishers.manager import DataManager
from publishers.model import ApplyResult, Change

NOW = datetime(2026, 11, 24, 12, 0, 0, tzinfo=UTC)


def upsert(key: str, version: int, op: str = "U", partition: str = "p1", **values: Any) -> Change:
    row = {column: orjson.dumps(value) for column, value in values.items()}
    return Change("dbo.T", partition, "t", key, op, version, row)


def delete(key: str, version: int, partition: str = "p1") -> Change:
    return Change("dbo.T", partition, "t", key, "D", version, None)


def mixed_batch() -> list[Change]:
    """Inserts, updates and a delete over two partitions, a row refused
    before Redis (a reserved column name) and one Redis refuses (WRONGTYPE)."""
    return [
        upsert("1", 10, "I", Id=1, Price="1.00"),
        upsert("2", 11, "I", partition="p2", Id=2),
        upsert("1", 12, Id=1, Price="2.00", Note="n"),
        upsert("3", 13, "I", **{"Id": 3, "@x": 1}),
        upsert("bad", 14, "I", Id=4),
        upsert("5", 15, "I", Id=5),
        delete("2", 16, partition="p2"),
        upsert("6", 17, "I", partition="p2", Id=6),
    ]


@pytest.fixture
async def pair(redis_config: RedisConfig) -> AsyncIterator[tuple[DataManager, DataManager]]:
    """Two managers on one Redis, each in its own namespace; three changes a call."""
    managers = [
        await DataManager.connect(dataclasses.replace(redis_config, namespace=f"{redis_config.namespace}{n}"),
                                  max_changes_per_call=3)
        for n in ("a", "b")
    ]  # fmt: skip
    for manager in managers:
        await manager.client.set(manager.layout.document("p1", "t", "bad"), "not a hash")
    yield managers[0], managers[1]
    for manager in managers:
        await manager.close()


async def state(manager: DataManager, result: ApplyResult) -> dict[str, Any]:
    """What a user sees: documents, the messages (their ts aside), the dead letter."""
    found: dict[str, Any] = {"result": (result.applied, result.published, result.stale)}
    for partition in ("p1", "p2"):
        found[partition] = await manager.documents(partition, "t")
        entries = await manager.client.xrange(manager.layout.stream(partition))
        found[f"{partition} messages"] = [
            {k: v for k, v in orjson.loads(fields[b"m"]).items() if k != "ts"} for _, fields in entries
        ]
    letters = await manager.read_dead_letters(10)
    found["dead letter"] = sorted((letter["key"], letter["reason"]) for letter in letters)
    return found


async def test_a_prepared_batch_applies_as_the_same_batch_unprepared(
    pair: tuple[DataManager, DataManager],
) -> None:
    plain, ahead = pair
    batch = mixed_batch()
    prepared = ahead.prepare(batch)
    assert [c.key for c, _ in prepared.refused] == ["3"]  # refused before Redis, nothing sent yet
    assert await ahead.client.exists(ahead.layout.seq("p1")) == 0
    expected = await state(plain, await plain.apply(batch, now=NOW))
    got = await state(ahead, await ahead.apply(batch, prepared=prepared))
    assert got == expected
    assert got["p1"]["1"] == {"Id": 1, "Price": "2.00", "Note": "n"} and "2" not in got["p2"]
    assert [key for key, _ in got["dead letter"]] == ["3", "bad"]


async def test_a_batch_prepared_from_other_changes_is_not_used(pair: tuple[DataManager, DataManager]) -> None:
    _, manager = pair
    stale = manager.prepare([upsert("9", 1, "I", Id=9)])
    await manager.apply([upsert("7", 1, "I", Id=7)], prepared=stale)
    assert await manager.documents("p1", "t") == {"7": {"Id": 7}}


async def test_meanwhile_runs_once_per_batch_that_sends_a_call_while_its_calls_are_in_redis(
    pair: tuple[DataManager, DataManager], redis_config: RedisConfig
) -> None:
    _, manager = pair
    runs: list[bool] = []

    def meanwhile() -> None:  # on one server: the calls sent, their replies not read yet
        pool = getattr(manager.client, "connection_pool", None)
        runs.append(bool(pool is not None and pool._in_use_connections))

    batch = [upsert(str(n), n, "I", Id=n) for n in range(1, 8)]  # three calls in a row: three rounds
    result = await manager.apply(batch, meanwhile=meanwhile)
    assert result.applied == 7 and len(runs) == 1
    if not redis_config.cluster:  # (a cluster's calls go per node: it runs after them)
        assert runs == [True]
    refused = [upsert("r", 1, "I", **{"@r": 1})]  # nothing to send
    await manager.apply(refused, meanwhile=meanwhile)
    assert len(runs) == 1
