"""A batch made into ``apply.lua`` calls, before any Redis call (``CallPlan``,
``Prepared``: what ``Applier.prepare`` makes while Redis runs the batch
before): each change admitted or refused with its reason, the rest grouped by
partition and cut into calls; each call's KEYS and ARGV laid out as the
script's header describes (``lua/apply.lua``), and its EVALSHA as RESP.

Columns are sent once per call and rows refer to a *shape* (their column
list), so a row costs one argument per value plus six, not three per column.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import orjson

from publishers import resp
from publishers.layout import Layout
from publishers.model import Change

MAX_CALL_BYTES = 8 << 20  # values per script call: bounds the time Redis is busy


@lru_cache(maxsize=1024)
def _names_check(names: tuple[str, ...]) -> tuple[str | None, int]:
    """(problem with a row's column names or None, their size in bytes)."""
    reserved = [name for name in names if name.startswith("@")]
    problem = f"reserved column name(s): {', '.join(reserved)}" if reserved else None
    return problem, sum(len(name) for name in names)


@dataclass
class Prepared:
    """A batch made ready for Redis (``Applier.prepare``): the changes it was
    made of, the calls' header (with the apply's timestamp), the changes
    refused before Redis (for the dead letter) and the calls, in rounds."""

    changes: Sequence[Change]
    header: tuple[Any, ...]
    refused: list[tuple[Change, str]] = field(default_factory=list)
    by_partition: dict[str, list[tuple[Change, int]]] = field(default_factory=dict)
    rounds: list[list[Call]] = field(default_factory=list)


@dataclass(frozen=True)
class CallPlan:
    """A batch cut into calls: each change admitted (or refused, with the
    reason, before any Redis call), the admitted ones grouped by partition in
    order, each partition cut into calls bounded by count and bytes."""

    layout: Layout
    max_row_bytes: int
    max_changes_per_call: int

    def prepare(self, changes: Sequence[Change], header: tuple[Any, ...]) -> Prepared:
        prepared = Prepared(changes, header)
        for change in changes:
            problem, size = self._admit(change)
            if problem is not None:
                prepared.refused.append((change, problem))
            else:
                prepared.by_partition.setdefault(change.partition, []).append((change, size))
        prepared.rounds = self.rounds(prepared.by_partition, header)
        return prepared

    def rounds(
        self, by_partition: dict[str, list[tuple[Change, int]]], header: tuple[Any, ...]
    ) -> list[list[Call]]:
        """The calls in rounds: every partition's first chunk, then every
        second chunk... (a partition's chunks run in order, one per round)."""
        chunked = [self._chunks(partition, sized) for partition, sized in by_partition.items()]
        return [
            [Call(self.layout, header, *chunk) for chunk in round_ if chunk is not None]
            for round_ in itertools.zip_longest(*chunked)
        ]

    def _admit(self, change: Change) -> tuple[str | None, int]:
        """Why ``change`` cannot be sent to Redis at all (or None), and its size
        in bytes. Checks that only depend on the column names are cached per
        column list, so a row costs one C-level pass over its values."""
        if not change.partition:
            return "empty partition value", 0
        if not change.key:
            return "empty data key", 0
        if change.version < 0:
            return f"negative version {change.version}", 0
        values = change.values
        if change.op == "D" or values is None:
            return (None if change.op == "D" else f"op {change.op} without values"), 0
        problem, names_size = _names_check(tuple(values))
        size = names_size + sum(map(len, values.values()))
        if problem is None and size > self.max_row_bytes:
            problem = f"row of {size} bytes exceeds max_row_bytes ({self.max_row_bytes})"
        return problem, size

    def _chunks(self, partition: str, sized: list[tuple[Change, int]]) -> list[tuple[str, list[Change]]]:
        """Split one partition's changes into calls bounded by count and bytes."""
        chunks: list[tuple[str, list[Change]]] = []
        current: list[Change] = []
        total = 0
        for change, size in sized:
            if current and (len(current) >= self.max_changes_per_call or total + size > MAX_CALL_BYTES):
                chunks.append((partition, current))
                current, total = [], 0
            current.append(change)
            total += size
        chunks.append((partition, current))
        return chunks


@lru_cache(maxsize=4096)
def _column_args(column: str) -> tuple[bytes, bytes, bytes]:
    """Hash field, JSON name and JSON RFC 6901 path of a column, so that the
    script never escapes JSON or JSON Pointer itself."""
    pointer = "/" + column.replace("~", "~0").replace("/", "~1")
    return column.encode(), json_string(column), json_string(pointer)


def json_text(value: Any) -> bytes:
    """``orjson.dumps(value)`` in bytes of its own size: orjson (3.12+) returns
    its text in a buffer of at least 4 KiB (``cdc.values._trim``)."""
    return b"%b" % orjson.dumps(value)


def json_string(text: str) -> bytes:
    """``json_text(text)``, quoted as is when nothing in it is escaped (no
    quote, backslash or character Python does not print): what orjson writes
    then, byte for byte. A call's 2,000 keys: 0.25 µs a key against 1.1 for
    orjson.dumps, whose 4 KiB buffers a call kept (8 MB; timeit, orjson 3.13)."""
    if text.isprintable() and '"' not in text and "\\" not in text:
        return b'"%b"' % text.encode()
    return json_text(text)


@dataclass
class Call:
    """One ``apply.lua`` call: a chunk of one partition's changes. Its KEYS
    and ARGV are built on first use, so that a call can be built while Redis
    runs the one sent before it, or with its batch while Redis runs the batch
    before (``Applier.prepare``); its RESP is kept once packed."""

    layout: Layout
    header: tuple[Any, ...]
    partition: str
    changes: list[Change]
    _packed: tuple[bytes, bytes] | None = field(default=None, init=False, repr=False)  # (sha, RESP)

    @cached_property
    def command(self) -> tuple[list[bytes], list[bytes]]:
        builder = CallBuilder(self.layout, self.partition)
        for change in self.changes:
            builder.add(change)
        return builder.keys_and_args(self.header)

    def packed(self, sha: bytes) -> bytes:
        """The call's EVALSHA as RESP (``publishers.resp``: every argument is bytes)."""
        if self._packed is None or self._packed[0] != sha:
            keys, args = self.command
            self._packed = (sha, resp.command([b"EVALSHA", sha, b"%d" % len(keys), *keys, *args]))
        return self._packed[1]


class CallBuilder:
    """KEYS and ARGV of one call, laid out as apply.lua's header describes.

    Columns are sent once per call and rows refer to a *shape* (their column
    list), so a row costs one argument per value plus six, not three per column.
    """

    def __init__(self, layout: Layout, partition: str) -> None:
        self.layout, self.partition = layout, partition
        self.prefix = layout.prefix(partition)
        self.groups: dict[tuple[str, str], tuple[bytes, str]] = {}  # -> (group number, document key prefix)
        self.group_args: list[bytes] = []
        self.index_keys: list[str] = []
        self.columns: dict[str, int] = {}
        self.column_args: list[bytes] = []
        self.shapes: dict[tuple[str, ...], bytes] = {}
        self.shape_args: list[bytes] = []
        self.doc_keys: list[str] = []
        self.change_args: list[bytes] = []

    def add(self, change: Change) -> None:
        """Append one change (the hot path: a few dict lookups and one extend;
        every argument bytes, for ``publishers.resp``)."""
        group, doc_prefix = self.groups.get((change.section, change.table)) or self._group(change)
        key = change.key
        self.doc_keys.append(doc_prefix + key)
        key_json = json_string(key)
        values = change.values
        reset = b"1" if change.reset else b"0"
        version = b"%d" % change.version
        if change.op == "D" or values is None:
            self.change_args += (group, key_json, b"D", version, reset, b"0")
            return
        names = tuple(values)
        shape = self.shapes.get(names) or self._shape(names)
        self.change_args += (group, key_json, change.op.encode(), version, reset, shape)
        self.change_args += values.values()

    def _group(self, change: Change) -> tuple[bytes, str]:
        doc_prefix = f"{self.prefix}{change.section}:"
        group = self.groups[(change.section, change.table)] = (b"%d" % (len(self.groups) + 1), doc_prefix)
        self.index_keys.append(self.layout.index(self.partition, change.section))
        self.group_args += (json_string(change.section), json_string(change.table))
        channel = self.layout.channel(self.partition, change.section)
        self.group_args += (channel.encode(), b"%d" % len(doc_prefix.encode()), b"%d" % change.fence)
        return group

    def _shape(self, names: tuple[str, ...]) -> bytes:
        indexes = []
        for name in names:
            if name not in self.columns:
                self.columns[name] = len(self.columns) + 1
                self.column_args.extend(_column_args(name))
            indexes.append(self.columns[name])
        shape = self.shapes[names] = b"%d" % (len(self.shapes) + 1)
        self.shape_args += (b"%d" % len(indexes), *(b"%d" % i for i in indexes))
        return shape

    def keys_and_args(self, header: Sequence[bytes]) -> tuple[list[bytes], list[bytes]]:
        keys = [
            self.layout.seq(self.partition),
            self.layout.stream(self.partition),
            self.layout.fence(self.partition),
        ]
        keys += self.index_keys + self.doc_keys
        counts = (len(self.groups), len(self.columns), len(self.shapes))
        args = [json_string(self.partition), *header, *(b"%d" % n for n in counts)]
        args += self.group_args + self.column_args + self.shape_args + self.change_args
        return list(map(str.encode, keys)), args
