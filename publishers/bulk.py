"""The bulk snapshot's Redis half: whole documents written page by page
without a message per row (``lua/bulk_load.lua``), then ONE ``R`` message per
partition and section (``lua/bulk_marker.lua``) telling subscribers to reload
the section's documents (DESIGN.md §5, docs/REDIS.md "The bulk snapshot").

Why: a snapshot row through ``apply.lua`` costs Redis an HMGET, an HSET, an
SADD, an XADD, an INCR and a PUBLISH of the whole document (~44 µs a row,
bench/RESULTS.md); a subscriber that receives a million ``S`` messages ends
where one reload of the section would have put it. Here a row is an HSET and
a member of an SADD (a partial snapshot reads its ``@v`` first), and a call's
rows travel as one MessagePack argument (``publishers.mpack``).

A page's rows are grouped by partition (keys of one partition share a slot:
a page may span partitions) and sent in calls of at most ``ROWS_PER_CALL``
rows, one round trip for the page (pipelined; concurrent calls on a cluster).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import orjson

from publishers import cluster_wait, mpack, redis_calls, scripts
from publishers.connection import RedisClient
from publishers.durability import Acknowledgements
from publishers.errors import CdcError
from publishers.layout import Layout
from publishers.model import timestamp
from publishers.partition_sets import PartitionSets
from publishers.settings import RedisConfig

# Rows per script call: Redis serves nobody else while a script runs; a call
# of 1,000 rows of ten columns runs ~5 ms.
ROWS_PER_CALL = 1000
# Values per call, in bytes: a call's rows are ONE argument, which Redis
# refuses past proto-max-bulk-len (512 MB by default) by dropping the
# connection; 1,000 rows of up to max_row_bytes (64 MiB) could pass it. A row
# larger than this goes alone. 8 MiB also bounds the time Redis is busy, as
# the apply's calls are bounded (publishers.apply.MAX_CALL_BYTES).
MAX_CALL_BYTES = 8 << 20

# The marker's patch: an RFC 6902 "test" that no document passes (no document
# has an "@reload" member: names starting with @ are reserved), so a client
# that does not know the "R" op fails to apply it and reloads, as it does for
# any patch that does not fit its replica.
MARKER_PATCH = b'[{"op":"test","path":"/@reload","value":true}]'
MARKER_KEY = "@reload"


Row = tuple[str, list[bytes]]  # a data key and its values (JSON text), in the page's column order


@dataclass
class PageRows:
    """A page's rows of one section, by partition: data key and the values
    (JSON text) in the order of ``columns``."""

    columns: Sequence[str]
    by_partition: dict[str, list[Row]] = field(default_factory=dict)

    def add(self, partition: str, key: str, values: list[bytes]) -> None:
        rows = self.by_partition.get(partition)
        if rows is None:
            rows = self.by_partition[partition] = []
        rows.append((key, values))


@dataclass
class BulkOutcome:
    """What a page's write left out: rows whose document key holds another
    type (the caller dead-letters them), and rows left because their document
    holds a newer ``@v`` (a partial snapshot only)."""

    wrong_type: list[tuple[str, str]] = field(default_factory=list)  # (partition, key)
    stale: int = 0
    written: int = 0


class BulkWriter:
    """Writes one table's snapshot pages and markers into ``client``."""

    def __init__(self, client: RedisClient, config: RedisConfig, layout: Layout) -> None:
        self.client, self.config, self.layout = client, config, layout
        self._acks = Acknowledgements(config.durability, layout)  # redis.durability: confirm each write
        self._sets = PartitionSets(client, layout, config.url, self._acks)
        self._publish = "SPUBLISH" if config.cluster else "PUBLISH"

    async def write(
        self,
        table: str,
        section: str,
        page: PageRows,
        *,
        version: int,
        reset: bool,
        fence: int,
        sweep: bool = True,
    ) -> BulkOutcome:
        """Write a page's documents at ``version`` (``reset``: over any ``@v``;
        with ``sweep``, the keys are recorded in ``@seen`` for the sweep).
        Raises ``LeaseLost`` (FENCED), ``RedisUnavailable``, or ``CdcError``
        for a damaged index or fence (CDCLAYOUT) and a refused partitions set."""
        if not page.by_partition:
            return BulkOutcome()
        _, unwritable = await self._sets.register((section, p) for p in page.by_partition)
        if unwritable:
            (_, partition), reason = next(iter(unwritable.items()))
            raise CdcError(f"{table}: cannot snapshot into partition {partition!r}: {reason}")
        head = [
            fence_field(table),
            str(fence),
            _reset_mode(reset, sweep),
            str(version),
            timestamp(),
            str(len(page.columns)),
        ]
        head += page.columns
        calls: list[tuple[list[str], list[object]]] = []
        order: list[tuple[str, list[Row]]] = []
        for partition, rows in page.by_partition.items():
            prefix = self.layout.document_prefix(partition, section)
            base = [
                self.layout.fence(partition),
                self.layout.index(partition, section),
                self.layout.seen(partition, section),
            ]
            for chunk, packed in _packed_calls(rows):
                calls.append((base + [prefix + key for key, _ in chunk], [*head, packed]))
                order.append((partition, chunk))
        replies = await scripts.run_many(self.client, scripts.BULK_LOAD, calls, self.config.url)
        outcome = _outcome(replies, order, self.config.url)
        await self._confirm([self.layout.fence(p) for p in page.by_partition], "the snapshot page")
        return outcome

    async def mark(self, table: str, section: str, partition: str, *, version: int, fence: int) -> int:
        """Publish the section's ``R`` message in ``partition``; return its seq."""
        body = (
            b'"partition":%b,"section":%b,"key":%b,"op":"R","version":%d,"table":%b,"ts":"%b","patch":%b}'
            % (
                orjson.dumps(partition),
                orjson.dumps(section),
                orjson.dumps(MARKER_KEY),
                version,
                orjson.dumps(table),
                timestamp().encode(),
                MARKER_PATCH,
            )
        )
        keys = [self.layout.seq(partition), self.layout.stream(partition), self.layout.fence(partition)]
        args = [
            fence_field(table),
            str(fence),
            body,
            self.layout.channel(partition, section),
            self._publish,
            str(self.config.stream_max_len),
        ]
        reply = await scripts.run(self.client, scripts.BULK_MARKER, keys, args, self.config.url)
        await self._confirm([keys[0]], "the snapshot's R message")
        return int(reply)

    async def _confirm(self, keys: list[str], what: str) -> None:
        """``redis.durability``: WAIT for what was just written (``cluster_wait.confirm``)."""
        await cluster_wait.confirm(self.client, keys, self._acks, self.config.url, what=what)


def _packed_calls(rows: list[Row]) -> Iterator[tuple[list[Row], bytes]]:
    """``rows`` cut into calls of at most ``ROWS_PER_CALL`` rows, each with
    its rows packed as bulk_load.lua's last argument (data key, values, data
    key, ...), halved until that is within ``MAX_CALL_BYTES`` or one row.
    Packed first and measured after: the common call is packed once."""
    for start in range(0, len(rows), ROWS_PER_CALL):
        yield from _within_budget(rows[start : start + ROWS_PER_CALL])


def _within_budget(chunk: list[Row]) -> Iterator[tuple[list[Row], bytes]]:
    flat: list[bytes] = []
    for key, values in chunk:
        flat.append(key.encode())
        flat += values
    packed = mpack.strings(flat)
    if len(packed) <= MAX_CALL_BYTES or len(chunk) == 1:
        yield chunk, packed
        return
    half = len(chunk) // 2
    yield from _within_budget(chunk[:half])
    yield from _within_budget(chunk[half:])


def _reset_mode(reset: bool, sweep: bool) -> str:
    """bulk_load.lua's ARGV[3]. Without a sweep the ``@seen`` set is not
    written: it would be deleted unread, after costing Redis an SADD a row
    and, for a first snapshot of a million rows, ~70 MB until the end."""
    if not reset:
        return "0"
    return "1" if sweep else "n"


def fence_field(table: str) -> str:
    """The table's field in a partition's ``@fence`` hash: its name as JSON text,
    as apply.lua and the purge write it (docs/REDIS.md). The same field, so that
    a token an apply wrote fences a bulk writer with a lower one, and back."""
    return orjson.dumps(table).decode()


def _outcome(replies: list[object], order: list[tuple[str, list[Row]]], url: str) -> BulkOutcome:
    outcome = BulkOutcome()
    for reply, (partition, chunk) in zip(replies, order, strict=True):
        if isinstance(reply, BaseException):
            raise redis_calls.translate(reply, url)
        statuses = redis_calls.text(reply)
        outcome.written += statuses.count("w")
        outcome.stale += statuses.count("s")
        if "x" in statuses:
            outcome.wrong_type += [(partition, chunk[i][0]) for i, s in enumerate(statuses) if s == "x"]
    return outcome
