"""The pipeline's applier under a backlog: the next batch is taken and
prepared while one is in Redis (``Pipeline._apply``, ``AutoBatchWorker.take_ahead``,
``DataManager.prepare``). Real Redis; a transient failure injected mid-batch,
after the next batch was prepared."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from cdc.batching import Ticket
from cdc.config import parse_config
from cdc.errors import RedisUnavailable
from cdc.pipeline import Pipeline
from publishers.manager import DataManager
from publishers.model import Change


def config_text(redis_url: str, namespace: str) -> str:
    return f"""
source: {{kind: postgres, dsn: "postgresql://nobody@127.0.0.1:1/none"}}
redis: {{url: "{redis_url}", namespace: {namespace}}}
worker: {{health: null, max_batch_size: 5, queue_capacity: 20}}
tables:
  - {{table: s.t, partition: p, section: t}}
"""


def change(n: int) -> Change:
    return Change("s.t", "p", "t", str(n % 7), "U" if n > 7 else "I", n, {"n": b"%d" % n})


async def test_a_retried_batch_keeps_the_order_and_the_time_order_of_the_batches_taken_ahead(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = parse_config(config_text(redis_url, namespace), "<test>", {})
    manager = await DataManager.connect(config.redis, max_changes_per_call=1)  # a round per change
    pipeline = Pipeline(config, manager=manager)
    applier: Any = manager._applier
    real_round, rounds = applier._run_round, [0]

    async def flaky_round(calls: Any, batch: Any) -> None:
        rounds[0] += 1
        if rounds[0] == 2:  # the first batch's second round: the next batch is prepared by now
            raise RedisUnavailable("connection reset")
        await real_round(calls, batch)

    monkeypatch.setattr(applier, "_run_round", flaky_round)
    taken_ahead: list[int] = []
    real_prepare = manager.prepare

    def counted_prepare(changes: Any) -> Any:  # the pipeline's look-ahead (apply itself calls the applier's)
        taken_ahead.append(len(changes))
        return real_prepare(changes)

    monkeypatch.setattr(manager, "prepare", counted_prepare)
    worker = pipeline.worker
    ticket = Ticket(version=30)
    await worker.put_many([change(n) for n in range(1, 21)], ticket)  # a backlog: the queue full
    worker.start()
    await asyncio.wait_for(worker.put_many([change(n) for n in range(21, 31)], ticket), 10)
    ticket.seal()
    try:
        await asyncio.wait_for(ticket.done.wait(), 20)
        await worker.stop()
        assert worker.stats.retries == 1
        assert taken_ahead and set(taken_ahead) == {5}  # whole batches, taken ahead under the backlog
        entries = await manager.client.xrange(manager.layout.stream("p"))
        messages = [orjson.loads(fields[b"m"]) for _, fields in entries]
        assert [m["version"] for m in messages] == list(range(1, 31))  # each once, in order
        stamps = [m["ts"] for m in messages]
        assert stamps == sorted(stamps), "a batch prepared before a retry kept its older timestamp"
        assert await manager.documents("p", "t") == {str(n % 7): {"n": n} for n in range(24, 31)}
    finally:
        await worker.stop()
        await manager.close()
