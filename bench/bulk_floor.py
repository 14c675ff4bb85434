"""Where Redis spends its CPU on a snapshot row: ``bulk_load.lua`` against
variants of itself that do less, on the same 1,000-row calls of the bench's
ten-column rows, interleaved (issue 17's snapshot-vs-loader target: Redis is
the snapshot's bound on two cores).

    python -m bench.bulk_floor [CALLS]   prints Redis CPU µs a row per variant

- ``arguments``: a script that returns at once: parsing the call and making
  its KEYS and ARGV (a Lua string an argument) is all it costs;
- ``loop``: the script's loop without a Redis command (the rows unpacked,
  each row's fields set);
- ``hset``: the loop and the HSET of each row, no index;
- ``bulk_load``: the script as shipped (the HSET, the index's SADD).

Redis's own figures (``INFO cpu``, user + system) around each variant's calls;
the median of five rounds.
"""

from __future__ import annotations

import statistics
import sys

import hiredis
import redis

from cdc.devservers import RedisServer
from publishers import mpack, scripts

COLUMNS = ["id", "big", "amount", "name", "updated_at", "active", "ratio", "attrs", "ref", "day"]
ROWS = 1000
BASE = ["b:{p}:@fence", "b:{p}:@index:s", "b:{p}:@seen:s"]
SHA_SLOT = b"S" * 40  # where each variant's SHA goes in the packed calls
HEAD = ['"bench.snap"', "0", "n", "100", "2026-01-01T00:00:00+00:00", str(len(COLUMNS)), *COLUMNS]


def values(g: int) -> list[bytes]:
    """Row ``g``'s JSON texts, as the snapshot sends them (bench.workload's values)."""
    return [
        b"%d" % g,
        b"%d" % (9007199254740993 + g * 1000003),
        b'"%d.%02d"' % (g % 100000 // 100, g % 100),
        b'"item %d 0123456789abcdef0123456789abcdef"' % g,
        b'"2026-01-01T00:00:00+00:00"',
        b"true" if g % 3 == 0 else b"false",
        repr(g / 7.0).encode(),
        b'{"k":%d,"n":3,"tags":["red","green"]}' % g,
        b'"0123456789abcdef0123456789abcdef"',
        b'"2026-03-01"',
    ]


def variants() -> dict[str, str]:
    shipped = scripts.BULK_LOAD.text.decode()
    no_index = shipped.replace("add_all(index, indexed)", "")
    loop = no_index.replace("pcall_redis('HSET', doc, unpack(fields))", "nfields")
    for text in (no_index, loop):
        assert text != shipped, "bulk_load.lua changed: update the variants"
    return {"arguments": "return 'ok'", "loop": loop, "hset": no_index, "bulk_load": shipped}


def calls(count: int) -> list[bytes]:
    """``count`` packed calls of ROWS fresh rows each (``SHA_SLOT`` for the SHA)."""
    packed = []
    for call in range(count):
        keys: list[str] = []
        rows: list[bytes] = []
        for g in range(call * ROWS, (call + 1) * ROWS):
            keys.append(f"b:{{p}}:s:{g}")
            rows += [str(g).encode(), *values(g)]
        args = (*BASE, *keys, *HEAD, mpack.strings(rows))
        packed.append(hiredis.pack_command(("EVALSHA", SHA_SLOT, len(BASE) + len(keys), *args)))  # type: ignore[arg-type]
    return packed


def measure(client: redis.Redis, sha: str, packed: list[bytes]) -> float:
    """Redis CPU µs a row for the calls, on a flushed server."""
    client.flushall()

    def cpu() -> float:
        return float(sum(client.info("cpu")[k] for k in ("used_cpu_user", "used_cpu_sys")))

    before = cpu()
    connection = client.connection_pool.get_connection()
    try:
        for call in packed:
            connection.send_packed_command([call.replace(SHA_SLOT, sha.encode(), 1)])  # type: ignore[no-untyped-call]
            connection.read_response()
    finally:
        client.connection_pool.release(connection)
    return (cpu() - before) * 1e6 / (len(packed) * ROWS)


def main(count: int) -> dict[str, float]:
    server = RedisServer().start()
    try:
        client = redis.Redis.from_url(server.url)
        shas = {name: client.script_load(text) for name, text in variants().items()}
        packed = calls(count)
        figures: dict[str, list[float]] = {name: [] for name in shas}
        for _ in range(5):
            for name, sha in shas.items():
                figures[name].append(measure(client, sha, packed))
        client.close()
    finally:
        server.cleanup()
    return {name: round(statistics.median(runs), 2) for name, runs in figures.items()}


if __name__ == "__main__":
    for name, usec in main(int(sys.argv[1]) if len(sys.argv) > 1 else 200).items():
        print(f"{name:10} {usec:5.2f} µs of Redis CPU a row")
