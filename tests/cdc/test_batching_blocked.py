"""The AutoBatchWorker on a real Redis (one server and a cluster) when a key
of one partition is damaged: the batch applies the other partitions, the read
with blocked changes completes refused with the Redis reason, one error line
per blocked partition says so, the applier keeps running, and the checkpoint
line raises ``ApplyBlocked`` at that read; once the key is repaired the same
changes apply."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import orjson
import pytest

from cdc.batching import AutoBatchWorker, Refusal, Ticket
from cdc.checkpoint import CheckpointLine
from cdc.config import RedisConfig
from cdc.errors import ApplyBlocked
from publishers.manager import DataManager
from publishers.model import Change


def upsert(key: str, version: int, partition: str) -> Change:
    return Change("public.items", partition, "items", key, "U", version, {"id": orjson.dumps(int(key))})


@pytest.fixture
async def manager(redis_config: RedisConfig) -> AsyncIterator[DataManager]:
    manager = await DataManager.connect(redis_config)
    yield manager
    await manager.close()


async def queue(worker: AutoBatchWorker, version: int, changes: list[Change]) -> Ticket:
    ticket = Ticket(version=version)
    await worker.put_many(changes, ticket)
    ticket.seal()
    return ticket


async def test_a_blocked_read_completes_refused_and_the_worker_keeps_running(
    manager: DataManager, caplog: pytest.LogCaptureFixture
) -> None:
    seq = manager.layout.seq("p1")
    await manager.client.set(seq, "x")
    worker = AutoBatchWorker(manager.apply, max_batch_size=100, max_wait=0.01, capacity=100)
    mixed = await queue(worker, 10, [upsert("1", 10, "p1"), upsert("2", 10, "p2"), upsert("3", 10, "p1")])
    clean = await queue(worker, 20, [upsert("4", 20, "p2")])  # queued before the start: one batch
    worker.start()
    with caplog.at_level(logging.ERROR, logger="cdc.batching"):
        await asyncio.wait_for(worker.drain(), 10)

    reason = f"Redis layout is damaged: {seq} does not hold an integer"
    assert mixed.done.is_set() and mixed.refusal == Refusal("blocked", "p1", reason)
    assert clean.done.is_set() and clean.refusal is None
    assert set(await manager.documents("p2", "items")) == {"2", "4"}
    assert await manager.documents("p1", "items") == {}
    (line,) = [r for r in caplog.records if r.name == "cdc.batching"]  # one per partition, not per change
    fields = tuple(vars(line)[name] for name in ("tables", "partition", "changes", "reason"))
    assert fields == (["public.items"], "p1", 2, reason)
    assert worker.task is not None and not worker.task.done()

    checkpoints = CheckpointLine("public.items")
    checkpoints.reset(5)
    checkpoints.register(mixed)
    with pytest.raises(ApplyBlocked) as raised:
        checkpoints.advance()
    assert str(raised.value).startswith(f"public.items: changes to partition 'p1' not applied: {reason}")
    assert checkpoints.applied == 5

    await manager.client.delete(seq)  # repaired (p1 never published: its @seq was 0)
    again = await queue(worker, 10, [upsert("1", 10, "p1"), upsert("2", 10, "p2"), upsert("3", 10, "p1")])
    await asyncio.wait_for(again.done.wait(), 10)
    await worker.stop()
    assert again.refusal is None
    assert set(await manager.documents("p1", "items")) == {"1", "3"}
