"""``publishers.resp``: the apply path's own RESP framing must be byte for
byte what hiredis (redis-py's packer) sends, and Redis must read it."""

from __future__ import annotations

import hiredis
from hypothesis import given
from hypothesis import strategies as st
from redis import asyncio as aioredis

from publishers import resp

# lengths around the prebuilt headers' edge (4096) as well as short ones
arguments = st.one_of(st.binary(max_size=64), st.binary(min_size=4090, max_size=4200))


@given(st.lists(arguments, min_size=1, max_size=12))
def test_a_command_is_framed_as_hiredis_frames_it(args: list[bytes]) -> None:
    assert resp.command(args) == hiredis.pack_command(tuple(args))  # type: ignore[arg-type]


async def test_redis_reads_a_framed_command_back(redis_client: aioredis.Redis) -> None:
    values = [b"", b"\r\n", b"x" * 5000, bytes(range(256))]
    connection = await redis_client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        await connection.send_packed_command(resp.command([b"RPUSH", b"resp-test", *values]))
        assert await connection.read_response() == len(values)
    finally:
        await redis_client.connection_pool.release(connection)
    assert await redis_client.lrange("resp-test", 0, -1) == values
    await redis_client.delete("resp-test")
