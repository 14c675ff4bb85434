"""A MessagePack array of strings: the one argument that carries a bulk
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

import msgpack  # type: ignore[import-untyped]


def strings(values: list[bytes]) -> bytes:
    """An array of ``values``, each a string (their bytes as given: JSON text).

    ``use_bin_type=False``: bytes as the raw/str family (fixstr, str 16, str
    32), which cmsgpack reads; it refuses the bin family. msgpack's C packer:
    0.33 µs a row of the bench's ten columns, against 0.67 for the same bytes
    framed in Python (a len, a prebuilt head and a join a value; timeit,
    1,000-row calls)."""
    packed: bytes = msgpack.packb(values, use_bin_type=False)
    return packed
