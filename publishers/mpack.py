"""A MessagePack array of strings (the ``str`` family), framed in C-level
passes (``publishers.framing``): the one argument that carries a bulk
snapshot call's rows to ``bulk_load.lua``, which reads it with Redis's
``cmsgpack.unpack`` (lua-cmsgpack, part of every Redis this project supports:
7.0 and later, docs/REDIS.md).

Why one argument and not one a value: Redis parses every argument of a
command (RESP, an object allocated and freed) before making it a Lua string;
``cmsgpack.unpack`` makes the same strings from one argument for less. Redis
CPU a row of the bench's ten columns: 6.35 -> 6.04 µs, the script taking each
row as 11 arguments against this one (measured as ``python -m bench.bulk_floor``
measures: 200 calls of 1,000 rows, interleaved, median of 5). Receiving alone
is 1.73 -> 0.54 µs a row; unpacking gives most of that back.
"""

from __future__ import annotations

from collections.abc import Sequence

from publishers import framing


def _head(length: int) -> bytes:
    """A str's head: fixstr, str 8, str 16 or str 32 (MessagePack spec)."""
    if length < 32:
        return bytes((0xA0 | length,))
    if length < 1 << 8:
        return b"\xd9" + length.to_bytes(1, "big")
    if length < 1 << 16:
        return b"\xda" + length.to_bytes(2, "big")
    return b"\xdb" + length.to_bytes(4, "big")


_HEADS = framing.heads_table(_head)


def strings(values: Sequence[bytes]) -> bytes:
    """An array 32 of ``values``, each a str (their bytes as given: JSON text)."""
    return b"\xdd" + len(values).to_bytes(4, "big") + b"".join(framing.interleaved(values, _HEADS, _head))
