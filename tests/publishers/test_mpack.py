"""``publishers.mpack``: a bulk snapshot call's rows travel as one MessagePack
array that ``bulk_load.lua`` unpacks with Redis's own ``cmsgpack``; Redis is
the judge that every value comes back byte for byte, at every head size
(fixstr, str 16, str 32)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from publishers import mpack

UNPACK = "return cmsgpack.unpack(ARGV[1])"
EDGES = [0, 1, 31, 32, 255, 256, 4095, 4096, 65535, 65536, 70000]


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_values_at_every_head_size_come_back_byte_for_byte(client: redis.Redis) -> None:
    values = [(bytes(range(256)) * (n // 256 + 1))[:n] for n in EDGES]
    values.append('"naïve \\u0000 é 漢字"'.encode())
    assert client.eval(UNPACK, 0, mpack.strings(values)) == values


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=300) | st.binary(min_size=4090, max_size=4100), max_size=40))
def test_any_list_of_values_comes_back_as_sent(client: redis.Redis, values: list[bytes]) -> None:
    assert client.eval(UNPACK, 0, mpack.strings(values)) == values
