"""pgoutput's binary messages, and the net changes of one table they make.

The built-in ``pgoutput`` plugin (protocol version 1) writes one message per
row of ``pg_logical_slot_peek_binary_changes``: Begin, Relation, Insert,
Update, Delete, Truncate, Commit (PostgreSQL docs, "Logical Replication
Message Formats"). A session of decoding sends a table's Relation message
before its first change, and again before the first change after the table's
shape changed (ALTER TABLE): each change is read with the Relation last seen.

Values arrive as their text (the type's output function), or ``u`` for an
unchanged TOASTed value that the WAL does not carry (``UNCHANGED``), or
``n`` for NULL. ``NetChanges`` folds a table's changes into one net change
per primary key, relative to the read's ``since``, as DESIGN.md §2 asks.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc.errors import TableChanged

_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")
_UINT32 = struct.Struct("!I")
_INT64 = struct.Struct("!q")


class _Unchanged:
    """An unchanged TOASTed value (``u``): the WAL does not carry it."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Any = _Unchanged()

Tuple = list[bytes | None | _Unchanged]  # a tuple's columns as sent: text, NULL, or UNCHANGED


@dataclass(frozen=True)
class Relation:
    relid: int
    schema: str
    name: str
    columns: tuple[str, ...]
    type_oids: tuple[int, ...]
    # pg_class.relreplident when the change was logged: d (primary key), f (whole
    # row), i (an index's columns), n (nothing); and the columns of that key
    identity: str = "d"
    key_columns: tuple[str, ...] = ()


@dataclass
class Change:
    """One row change of one transaction: ``kind`` is I, U, D or T (truncate)."""

    kind: str
    relation: Relation | None
    old: Tuple | None = None  # U with a changed key (K) or a full old row (O); D: the key
    new: Tuple | None = None
    truncated: tuple[int, ...] = ()  # T: the relations' oids


@dataclass
class Transaction:
    commit_lsn: int  # where its commit record starts: the version of its changes
    changes: list[Change] = field(default_factory=list)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> str:
        value = chr(self.data[self.at])
        self.at += 1
        return value

    def int16(self) -> int:
        (value,) = _INT16.unpack_from(self.data, self.at)
        self.at += 2
        return int(value)

    def int32(self, unsigned: bool = False) -> int:
        (value,) = (_UINT32 if unsigned else _INT32).unpack_from(self.data, self.at)
        self.at += 4
        return int(value)

    def int64(self) -> int:
        (value,) = _INT64.unpack_from(self.data, self.at)
        self.at += 8
        return int(value)

    def string(self) -> str:
        end = self.data.index(0, self.at)
        value = self.data[self.at : end].decode()
        self.at = end + 1
        return value

    def tuple(self) -> Tuple:
        values: Tuple = []
        for _ in range(self.int16()):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED)
            elif kind in ("t", "b"):
                size = self.int32()
                values.append(bytes(self.data[self.at : self.at + size]))
                self.at += size
            else:
                raise ValueError(f"pgoutput: unknown tuple column kind {kind!r}")
        return values


def transactions(messages: Iterator[bytes], relations: dict[int, Relation]) -> Iterator[Transaction]:
    """The decoded transactions, whole, in commit order; ``relations`` is
    updated by each Relation message (and keeps the last shapes seen)."""
    current: Transaction | None = None
    for data in messages:
        reader = _Reader(data)
        kind = reader.byte()
        if kind == "B":
            current = Transaction(commit_lsn=reader.int64())
        elif kind == "C":
            reader.byte()  # flags
            commit_lsn = reader.int64()
            if current is not None:
                current.commit_lsn = commit_lsn
                yield current
            current = None
        elif kind == "R":
            relation = _relation(reader)
            relations[relation.relid] = relation
        elif current is not None and kind in "IUDT":
            current.changes.append(_change(kind, reader, relations))
        # Origin (O), Type (Y), Message (M): nothing to do


def _relation(reader: _Reader) -> Relation:
    relid = reader.int32(unsigned=True)
    schema, name = reader.string(), reader.string()
    identity = reader.byte()
    names, oids, key = [], [], []
    for _ in range(reader.int16()):
        flags = ord(reader.byte())  # 1: part of the replica identity's key
        names.append(reader.string())
        oids.append(reader.int32(unsigned=True))
        reader.int32()  # typmod
        if flags & 1:
            key.append(names[-1])
    return Relation(relid, schema or "pg_catalog", name, tuple(names), tuple(oids), identity, tuple(key))


def foreign_keys(transactions: Iterable[Transaction], primary_key: Sequence[str]) -> set[str]:
    """The replica identities (``Relation.identity``) under which updates or
    deletes of ``transactions`` were logged with a key that is not
    ``primary_key`` (USING INDEX of another index): their old keys, or the
    lack of one when a key update left that index alone, say nothing of the
    documents. Inserts carry the whole row whatever the identity."""
    relations = {
        id(c.relation): c.relation for t in transactions for c in t.changes if c.kind in "UD" and c.relation
    }
    key = set(primary_key)
    return {r.identity for r in relations.values() if r.identity != "f" and set(r.key_columns) != key}


def _change(kind: str, reader: _Reader, relations: dict[int, Relation]) -> Change:
    if kind == "T":
        count = reader.int32()
        reader.byte()  # options: CASCADE, RESTART IDENTITY
        return Change("T", None, truncated=tuple(reader.int32(unsigned=True) for _ in range(count)))
    relation = relations.get(reader.int32(unsigned=True))
    change = Change(kind, relation)
    marker = reader.byte()
    if marker in ("K", "O"):
        change.old = reader.tuple()
        if kind == "D":
            return change
        marker = reader.byte()
    if marker != "N":
        raise ValueError(f"pgoutput: {kind} message with tuple marker {marker!r}")
    change.new = reader.tuple()
    return change


# -- net changes ----------------------------------------------------------------


Decode = Callable[[Relation, Tuple], dict[str, Any]]  # a tuple's columns by name, values loaded


@dataclass
class _Net:
    existed: bool  # the key existed at ``since``
    version: int = 0
    values: dict[str, Any] | None = None  # None: the row is gone


def _carried(values: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """``values`` with each UNCHANGED value taken from ``before`` (where it has one)."""
    return {c: before.get(c, v) if v is UNCHANGED else v for c, v in values.items()}


class NetChanges:
    """Per primary key, its last state within the read and whether it
    existed at ``since``: I (created after it), U, or D (gone)."""

    def __init__(self, key: tuple[str, ...], decode: Decode) -> None:
        self.key, self.decode = key, decode
        self.rows: dict[tuple[Any, ...], _Net] = {}

    def add(self, change: Change, version: int) -> None:
        relation = change.relation
        if relation is None:
            raise TableChanged("a change arrived before its table's Relation message: describing it again")
        if change.kind == "I":
            assert change.new is not None
            self._write(self.decode(relation, change.new), version, inserted=True)
            return
        old = None if change.old is None else self.decode(relation, change.old)
        if change.kind == "D":
            assert old is not None
            self._gone(self._key(old), version)
            return
        assert change.new is not None
        new = self.decode(relation, change.new)
        if old is not None and self._key(old) != self._key(new):  # a primary-key update: D + I
            before = self.rows.get(self._key(old))
            if before is not None and before.values is not None:  # unchanged values move with the row
                new = _carried(new, before.values)
            self._gone(self._key(old), version)
            self._write(new, version, inserted=True)
        else:
            self._write(new, version, inserted=False)

    def _key(self, values: dict[str, Any]) -> tuple[Any, ...]:
        try:
            return tuple(values[k] for k in self.key)
        except KeyError as missing:
            raise TableChanged(
                f"primary-key column {missing} is not in the decoded row: describing the table again"
            ) from None

    def _write(self, values: dict[str, Any], version: int, *, inserted: bool) -> None:
        key = self._key(values)
        net = self.rows.get(key)
        if net is None:
            net = self.rows[key] = _Net(existed=not inserted)
        elif net.values is not None:  # an unchanged TOASTed value is what this read held last
            values = _carried(values, net.values)
        net.version, net.values = version, values

    def _gone(self, key: tuple[Any, ...], version: int) -> None:
        net = self.rows.get(key)
        if net is None:
            net = self.rows[key] = _Net(existed=True)
        net.version, net.values = version, None

    def items(self) -> Iterator[tuple[tuple[Any, ...], str, int, dict[str, Any] | None]]:
        """(key, op, version, values) per key; a row created and gone within the read is a D."""
        for key, net in self.rows.items():
            op = "D" if net.values is None else ("U" if net.existed else "I")
            yield key, op, net.version, net.values
