"""Property: replaying is harmless. Applying batches in order, with any batch
(or any slice of one, as a retry after a partial failure) replayed any number
of times at any later point, leaves documents, index, seq, stream, channels'
inputs and the partitions sets exactly as applying each batch once."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc.config import RedisConfig
from publishers.connection import RedisClient, close_client, connect
from publishers.manager import DataManager
from publishers.model import Change

TABLES = [("dbo.A", "alpha"), ("dbo.B", "beta")]
PARTITIONS = ["p1", "p{2}:x"]
KEYS = ["1", "2", "3"]
T0 = datetime(2026, 1, 1, tzinfo=UTC)

values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63),
    st.sampled_from([9007199254740993, 2**62 + 1, 0]),
    st.text(max_size=4),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(0, 3), max_size=2),
)
rows = st.dictionaries(st.sampled_from(["x", "y", "z", "a/b"]), values, min_size=1, max_size=4)
specs = st.tuples(
    st.sampled_from(["I", "U", "D", "S"]),
    st.sampled_from(PARTITIONS),
    st.sampled_from(TABLES),
    st.sampled_from(KEYS),
    rows,
    st.integers(1, 3),  # version step: versions only grow
)
batches_st = st.lists(st.lists(specs, min_size=1, max_size=8), min_size=1, max_size=5)
# (after which batch, which earlier batch, slice start, slice end), all taken modulo
replays_st = st.lists(st.tuples(*(st.integers(0, 1000),) * 4), max_size=8)


def build(batches: list[list[Any]]) -> list[list[Change]]:
    version = 2**53  # beyond a double's exact integers, as real sources reach
    out = []
    for batch in batches:
        changes = []
        for op, partition, (table, section), key, row, step in batch:
            version += step
            encoded = None if op == "D" else {c: orjson.dumps(v) for c, v in row.items()}
            changes.append(Change(table, partition, section, key, op, version, encoded))
        out.append(changes)
    return out


async def dump(client: RedisClient, namespace: str) -> dict[str, Any]:
    """Every key of the namespace: type, contents, and whether it has a TTL."""
    state: dict[str, Any] = {}
    async for raw in client.scan_iter(match=f"{namespace}:*", count=1000):
        key = raw.decode()
        kind = (await client.type(key)).decode()
        if kind == "hash":
            value: Any = await client.hgetall(key)
        elif kind == "set":
            value = sorted(await client.smembers(key))
        elif kind == "stream":
            value = await client.xrange(key)
        else:
            value = await client.get(key)
        state[key.removeprefix(namespace)] = (kind, value, await client.pttl(key) > 0)
    return state


@pytest.fixture
async def client(redis_config: RedisConfig) -> AsyncIterator[RedisClient]:
    client = await connect(redis_config)
    yield client
    await close_client(client)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=batches_st, replays=replays_st)
async def test_replays_leave_the_state_as_applying_once(
    client: RedisClient, redis_config: RedisConfig, batches: list[list[Any]], replays: list[Any]
) -> None:
    plan = build(batches)
    once = DataManager(client, _config(redis_config))
    for i, batch in enumerate(plan):
        await once.apply(batch, now=T0 + timedelta(seconds=i))

    replayed = DataManager(client, _config(redis_config), max_changes_per_call=3)
    for i, batch in enumerate(plan):
        await replayed.apply(batch, now=T0 + timedelta(seconds=i))
        for after, which, start, end in replays:
            if after % len(plan) == i:
                earlier = plan[which % (i + 1)]
                lo, hi = sorted((start % (len(earlier) + 1), end % (len(earlier) + 1)))
                result = await replayed.apply(earlier[lo:hi] or earlier, now=T0 + timedelta(days=1))
                assert result.applied == result.published == 0  # everything in it is stale now

    expected = await dump(client, once.config.namespace)
    assert expected  # the plan wrote something
    assert await dump(client, replayed.config.namespace) == expected


def _config(base: RedisConfig) -> RedisConfig:
    return RedisConfig(url=base.url, cluster=base.cluster, namespace="h" + uuid.uuid4().hex[:12])
