"""Reading SQL Server changes and snapshots, each in one SNAPSHOT transaction.

It follows Microsoft's documented pattern and the checklist in SQLSERVER.md:

- every poll is one ``SET TRANSACTION ISOLATION LEVEL SNAPSHOT`` transaction
  that reads ``CHANGE_TRACKING_MIN_VALID_VERSION(OBJECT_ID(...))`` (NULL is
  an error, never a pass), then ``CHANGE_TRACKING_CURRENT_VERSION()``, checks
  ``since < min_valid`` and ``current < since`` (both ``TrackingExpired``),
  then reads ``CHANGETABLE(CHANGES ...) LEFT JOIN`` the table in
  (version, primary key) order, and commits; ``next_version`` is the current
  version read in that transaction, even when no row came back;
- a read of more than one page keeps every page in that one SNAPSHOT
  transaction, held open on a reader connection of its own between the
  caller's calls and committed with the last page (``HeldRead``): pages read
  in separate transactions would see a row changed in between only in the
  next read, relative to the bound, so as a ``U`` the caller never had the
  ``I`` of, and without the columns changed before the bound;
- the snapshot reads the current version first, then the whole table in
  keyset pages on the primary key, in chunks of SNAPSHOT transactions on a
  connection of its own, resumed after the last key when one fails
  (``mssql_snapshot``).

The paging itself (the first page, the backlog of the later ones) is in
``mssql_paging``.

Each unit of work here is a function of a connection, run on a ``Link``.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import InvalidOperation
from typing import Any

from cdc.errors import SchemaError, SourceUnavailable, TrackingExpired, TrackingNotEnabled
from cdc.shapes import identity_change, identity_parts
from cdc.sources import mssql_sql as sql
from cdc.sources.base import ChangeRow, Cursor, Op, TableInfo
from cdc.sources.mssql_catalog import DescribedTable
from cdc.sources.mssql_types import convert
from cdc.values import Unreadable

# -- the table read is the table described ---------------------------------------


def check_identity(info: TableInfo, identity: Any) -> None:
    """``identity``: the table's identity now, read in the read's own
    transaction (``mssql_sql.min_valid_version``: its object_id and the
    version its tracking began at). A table dropped and created again under
    its name is another object, whose tracking starts afresh (DROP TABLE
    removes all of a table's change tracking information: "Manage change
    tracking", learn.microsoft.com): reading it with what was described of the
    old one would pass its changes off as the old table's. A table truncated,
    or whose tracking was turned off and on, has a new begin_version: rows
    removed or written meanwhile are in no change, so it is described again
    and snapshotted (``cdc.shapes.identity_change``), even by a poller whose
    checkpoint no version check can fault. The database's part of the
    identity is checked apart from the transaction (``mssql_watcher``)."""
    if identity is None:
        raise SchemaError(
            f"{info.table}: the table is gone (dropped, or renamed, or the login can no longer see it) "
            "while it was read: it will be described again"
        )
    if not info.identity:
        return
    now = identity_parts(str(identity))
    was = {label: value for label, value in identity_parts(info.identity).items() if label in now}
    if was != now:
        change = identity_change(
            "; ".join(f"{label} {value}".strip() for label, value in was.items()), str(identity)
        )
        described = "; ".join(f"{label or 'object_id'} {value}" for label, value in was.items())
        raise SchemaError(
            f"{info.table}: {change} since it was described "
            f"({described}, now {identity}): it will be described again"
        )


def converted(described: DescribedTable, names: Sequence[str], raw: Sequence[Any]) -> dict[str, Any]:
    """``names`` (primary-key columns) -> their values converted for their
    described types. A key value that its described type cannot read means
    the column was retyped since the describe (ALTER COLUMN): a SchemaError
    naming it, never a crash (a row cannot be addressed without its key)."""
    values = read_values(described, names, raw)
    problem = unreadable_in(described.info.table, values)
    if problem is not None:
        raise SchemaError(problem)
    return values


def read_values(described: DescribedTable, names: Sequence[str], raw: Sequence[Any]) -> dict[str, Any]:
    """``names`` -> their values converted for their described types; a value
    that its converter cannot read (it raised: converters are pure functions of
    the value, so it is about the value) is a ``cdc.values.Unreadable`` naming
    the value, its type and why. Encoding it raises PoisonChange naming the
    column: the mapper sends the row to the dead letter with its table and key
    (``cdc.feeder.RowFeeder``), and the read goes on with the next row. Whether
    it is poison at all is decided first (``unreadable_in``, ``MssqlSource``):
    unless the table's shape is still the one described, the column was
    retyped and the table is described again instead."""
    table = described.info.table
    if len(names) != len(raw):
        raise SchemaError(
            f"{table}: a row came back with {len(raw)} columns, not {len(names)}: "
            "the table changed while it was read; it will be described again"
        )
    converters = described.converters
    try:  # the hot path: a dict comprehension, per column only once a converter raised
        return {name: convert(converters[name], v) for name, v in zip(names, raw, strict=True)}
    except Exception:
        pass
    types = {c.name: c.type_name for c in described.info.columns}
    values: dict[str, Any] = {}
    for name, value in zip(names, raw, strict=True):
        try:
            values[name] = convert(converters[name], value)
        except Exception as error:
            values[name] = unreadable(types.get(name, "?"), value, error)
    return values


def unreadable(type_name: str, value: Any, error: Exception) -> Unreadable:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    why = "not a number" if isinstance(error, InvalidOperation) else str(error) or type(error).__name__
    return Unreadable(f"{type_name} value {shown} cannot be read as its described type ({why})")


def unreadable_in(table: str, *rows: dict[str, Any] | None) -> str | None:
    """What to say when the first value of ``rows`` that could not be read
    comes from a table whose shape changed since it was described (None: every
    value was read): the column was retyped (ALTER COLUMN), so the table is
    described again, not its rows dead-lettered."""
    for row in rows:
        if row is None or Unreadable not in map(type, row.values()):  # (a loop in C: once per row read)
            continue
        column, value = next((c, v) for c, v in row.items() if type(v) is Unreadable)
        return (
            f"{table}: column {column}: {value.reason}: the table changed while it was read; "
            "it will be described again (ALTER COLUMN?)"
        )
    return None


# -- changes -------------------------------------------------------------------


def check_versions(table: str, since: int, min_valid: Any, current: Any, upto: int | None) -> int:
    """The checks of SQLSERVER.md, in order; return the read's upper bound."""
    if min_valid is None:
        raise TrackingNotEnabled(min_valid_is_null(table))
    if current is None:
        raise TrackingNotEnabled(
            f"{table}: CHANGE_TRACKING_CURRENT_VERSION() is NULL: change tracking is off"
        )
    if since < min_valid:
        raise TrackingExpired(
            table,
            f"checkpoint {since} is below the minimum valid version {min_valid} "
            "(cleanup ran past it, or the table was truncated)",
        )
    if current < since:
        raise TrackingExpired(
            table,
            f"the database's current version {current} is below the checkpoint {since} "
            "(restored from a backup, or failed over to a copy that is behind)",
        )
    if upto is None:
        return int(current)
    if current < upto:
        raise TrackingExpired(
            table, f"the database's current version {current} went below {upto} between pages"
        )
    return upto


def check_snapshot_versions(table: str, min_valid: int, current: int) -> None:
    """A snapshot's version must be a valid checkpoint at once: were the
    table's minimum valid version above the current version (tracking reset by
    a TRUNCATE or enabled again, nothing committed since), the first read from
    it would expire and the table be snapshotted again, and again, with no
    delay between. TransientError: the tracker tries again after its retry
    wait, by when a commit has moved the current version past it."""
    if current < min_valid:
        raise SourceUnavailable(
            f"{table}: the table's change tracking starts at version {min_valid}, after the database's current "
            f"version {current} (truncated, or tracking enabled again, and nothing committed since): a snapshot "
            "now would expire at once; it is tried again shortly"
        )


def min_valid_is_null(table: str) -> str:
    return (
        f"{table}: CHANGE_TRACKING_MIN_VALID_VERSION is NULL: change tracking is off for the table (turned off, "
        "or the table was dropped and created again), or the login lacks VIEW CHANGE TRACKING on it: run "
        f"`cdc tracking enable --table {table}` (or GRANT VIEW CHANGE TRACKING on the table)"
    )


def decode_change(described: DescribedTable, since: int, row: Sequence[Any]) -> ChangeRow:
    """One CHANGETABLE row (the layout of ``mssql_sql.changes``) as a ChangeRow."""
    version, operation, mask = row[0], row[2], row[3]  # row[1]: SYS_CHANGE_CREATION_VERSION, unused
    shape = described.shape
    n_key, n_columns = len(shape.primary_key), len(shape.columns)
    key_raw = row[4 : 4 + n_key]
    values_raw = row[4 + n_key : 4 + n_key + n_columns]
    flags = row[4 + n_key + n_columns : 4 + n_key + n_columns + len(shape.mask_columns)]
    key = converted(described, shape.primary_key, key_raw)
    # t.<first key column> is NULL only when the LEFT JOIN found no row: the row is gone.
    # A D stays a D, even one whose row was created after `since` (inserted and deleted
    # in between): deleting a document that does not exist is harmless, while dropping
    # the D could lose the delete of a key that was deleted, re-inserted and deleted again.
    if values_raw[0] is None:
        return ChangeRow(op="D", version=int(version), key=key, values=None, changed_columns=None)
    values = read_values(described, shape.columns, values_raw)
    if str(operation).strip().upper() == "D":
        # D while the row is in the same view (keys swapped by one UPDATE: CT tracks a
        # key's update as a delete and an insert): the row is what the document must
        # hold, as on PostgreSQL; every column compared.
        return ChangeRow(op="U", version=int(version), key=key, values=values, changed_columns=None)
    op = net_operation(operation)
    changed: frozenset[str] | None = None
    if op == "U" and described.track_columns_updated and mask is not None:
        # NULL SYS_CHANGE_COLUMNS means "unknown" (every column changed, or no column tracking).
        changed = (
            frozenset(n for n, f in zip(shape.mask_columns, flags, strict=True) if f)
            | described.always_changed
        )
    return ChangeRow(op=op, version=int(version), key=key, values=values, changed_columns=changed)


def net_operation(operation: Any) -> Op:
    """I or U as SQL Server reports it in SYS_CHANGE_OPERATION ("U = Update,
    I = Insert, D = Delete": CHANGETABLE (Transact-SQL), learn.microsoft.com,
    /sql/relational-databases/system-functions/changetable-transact-sql), never
    derived from SYS_CHANGE_CREATION_VERSION: a key deleted and inserted again
    after ``since`` has a creation version above it, yet SQL Server reports
    it as U (it existed at ``since``; SQLSERVER.md, "Reading the rows")."""
    text = str(operation).strip().upper()
    if text == "I":
        return "I"
    if text == "U":
        return "U"
    raise ValueError(f"SYS_CHANGE_OPERATION {operation!r} is none of I, U, D")


def change_cursor(shape: sql.TableShape, row: Sequence[Any]) -> Cursor:
    """Where the page after CHANGETABLE row ``row`` starts: its version and its
    key as the server sent it (``cursor_key``)."""
    n_key, n_columns = len(shape.primary_key), len(shape.columns)
    exact = row[4 + n_key + n_columns + len(shape.mask_columns) :]
    return int(row[0]), cursor_key(shape, row[4 : 4 + n_key], exact)


def snapshot_cursor(shape: sql.TableShape, row: Sequence[Any]) -> tuple[Any, ...]:
    """Where the snapshot page after table row ``row`` starts (``cursor_key``)."""
    return cursor_key(shape, row[: len(shape.primary_key)], row[len(shape.columns) :])


def cursor_key(shape: sql.TableShape, raw_key: Sequence[Any], exact: Sequence[Any]) -> tuple[Any, ...]:
    """A keyset cursor's key: the values as the driver returned them, never as
    converted for the documents, and the server's own text for date and time
    keys (``mssql_sql.exact_text``): a datetime2(7) key cut to microseconds
    would make a page of rows sharing a microsecond repeat forever."""
    texts = iter(exact)
    return tuple(
        next(texts) if sql.is_exact_text(t) else value
        for value, t in zip(raw_key, shape.key_types, strict=True)
    )


# -- snapshots -------------------------------------------------------------------


def snapshot_row(described: DescribedTable, row: Sequence[Any]) -> dict[str, Any]:
    """A snapshot row (its primary key readable, else SchemaError; any other
    column perhaps not: an ``Unreadable`` in its place)."""
    n_key = len(described.shape.primary_key)
    key = converted(described, described.shape.primary_key, row[:n_key])
    rest = read_values(described, described.shape.columns[n_key:], row[n_key : len(described.shape.columns)])
    return {**key, **rest}
