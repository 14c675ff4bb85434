"""The ChangeSource protocol: what every source database offers the tracker.

The semantics are those of DESIGN.md §2. In short:

- ``read_changes(table, since, ...)`` returns *net* changes after ``since``:
  one row per changed primary key, its operation relative to ``since``
  (``I`` created after it, ``D`` gone, ``U`` otherwise), the version of its
  last change, the changed columns where known (``None`` = unknown), and
  the row's current values read in the same consistent view. The read is
  *consistent*: ``next_version`` is a bound such that every change committed
  at or below it is in this read (or an earlier one from a lower ``since``)
  and nothing can commit later at or below it. Large reads are paged by
  ``(version, primary key)``: pass ``upto=page.next_version`` and
  ``after=page.cursor`` while ``page.more``; only once a read is complete may
  ``next_version`` become the checkpoint.
- ``snapshot(table)`` pages through the whole table (keyset on the primary
  key), every page carrying the version ``v`` read before any row: every
  change committed at or below ``v`` is in the rows, and a read of changes
  from ``v`` brings what changed while the snapshot ran (PostgreSQL reads it
  in one consistent view; SQL Server in resumable chunks, so later rows may
  be newer than ``v``: DESIGN.md §2).
- ``since`` below the table's minimum valid version, or a source whose
  current version is below ``since`` (restore, failover), raises
  ``TrackingExpired``.

Values are native Python (Decimal, datetime, bytes, UUID, dict...);
``cdc.values`` turns them into JSON text.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from cdc.config import TableConfig
from publishers.model import Finding as Finding  # re-exported: publishers.control reports findings too

Op = Literal["I", "U", "D"]
# Between the JSON texts of a row's columns in ``SnapshotPage.encoded``: JSON
# text never holds U+0001 raw (a string escapes every control character).
ENCODED_SEPARATOR = "\x01"
ENCODED_ODD = "\x02"  # starts an encoded column's text that is the source's text of a value to load
Cursor = tuple[int, tuple[Any, ...]]  # (version, primary-key values) of the last row read


@dataclass(frozen=True)
class Column:
    name: str
    type_name: str  # the database's own type name, e.g. "numeric(12,2)", "datetime2"
    nullable: bool = True


@dataclass(frozen=True)
class EncodedColumns:
    """Columns whose JSON text a source wrote itself (a read of changes
    with ``pg_read_encoded``): a row's ``text`` is their texts joined by
    ``ENCODED_SEPARATOR``, in the order of ``names``; a text that starts with
    ``ENCODED_ODD`` is instead the source's text of a value, which
    ``loaders[column]`` loads into the value the row would hold. The row's
    ``values`` then hold only the other published columns."""

    names: tuple[str, ...]
    loaders: Mapping[str, Callable[[str], Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class TableInfo:
    """A registered table as the source sees it, resolved by ``describe``."""

    table: str  # "schema.name" as registered
    schema: str
    name: str
    primary_key: tuple[str, ...]
    columns: tuple[Column, ...]  # the published columns, primary key first
    # The table object's id at the source (PostgreSQL oid, SQL Server
    # object_id): a table dropped and created again under the same name gets
    # a new one, and its documents must be snapshotted again.
    identity: str = ""
    # The table's shape as ``describe`` saw it, read before the catalog (see
    # ``ChangeSource.fingerprints``): not part of equality.
    fingerprint: str = field(default="", compare=False)
    # Columns left out of the documents, with why (names starting with @ are
    # reserved): ``describe`` logs them, ``cdc validate`` prints them.
    left_out: tuple[str, ...] = field(default=(), compare=False)

    @functools.cached_property
    def column_names(self) -> tuple[str, ...]:
        """(Computed once: reads look it up per row.)"""
        return tuple(c.name for c in self.columns)


class ChangeRow:
    """One net change of one row.

    - ``key``: primary-key column -> value (always present, deletes too)
    - ``values``: published column -> value; None when the row is gone
    - ``text`` and ``encoded`` (a read whose JSON text the source wrote): the JSON text
      of the ``encoded`` columns as the source wrote it (``EncodedColumns``);
      ``values`` then holds the other columns
    - ``changed_columns``: for an update, the published columns changed after
      the read's ``since``; None: unknown (not "nothing"). A source may pass a
      function that computes them: nothing downstream of the source needs
      them, so a read does not pay for them (a set per update) unless asked.

    A plain class with slots, not a frozen dataclass: a read builds one per
    changed row, and a frozen dataclass's ``__init__`` costs twice as much."""

    __slots__ = ("op", "version", "key", "values", "_changed", "text", "encoded")

    def __init__(
        self,
        op: Op,
        version: int,
        key: dict[str, Any],
        values: dict[str, Any] | None,
        changed_columns: frozenset[str] | Callable[[], frozenset[str] | None] | None = None,
        text: str | None = None,
        encoded: EncodedColumns | None = None,
    ) -> None:
        self.op = op
        self.version = version
        self.key = key
        self.values = values
        self._changed = changed_columns
        self.text = text
        self.encoded = encoded

    @property
    def changed_columns(self) -> frozenset[str] | None:
        changed = self._changed
        if callable(changed):
            changed = self._changed = changed()
        return changed

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChangeRow):
            return NotImplemented
        return (self.op, self.version, self.key, self.values, self.changed_columns, self.text) == (
            other.op,
            other.version,
            other.key,
            other.values,
            other.changed_columns,
            other.text,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable dicts inside

    def __repr__(self) -> str:
        return (
            f"ChangeRow(op={self.op!r}, version={self.version!r}, key={self.key!r},"
            f" values={self.values!r}, changed_columns={self.changed_columns!r}"
            + ("" if self.text is None else f", text={self.text!r}")
            + ")"
        )


@dataclass(frozen=True)
class ChangePage:
    rows: list[ChangeRow]
    next_version: int  # the consistent bound of this read
    more: bool = False  # another page follows: call again with upto/after
    cursor: Cursor | None = None  # where the next page starts


@dataclass(frozen=True)
class SnapshotPage:
    version: int  # every change at or below it is in the rows (see the module docstring)
    rows: list[dict[str, Any]]  # published column -> value, primary key included
    total: int | None = None  # estimated rows in the table, for progress
    # (``snapshot(..., encoded=True)``, where the source can) the JSON text of
    # ``encoded_columns`` comes from the source, and ``rows`` is empty:
    # ``records[i]`` is row i as a tuple: the primary key's values, the texts
    # of ``encoded_columns`` joined by U+0001 (``cdc.sources.pg_snapshot``),
    # then the values of ``plain_columns``. (Tuples: a dict per row cost the
    # sidecar a tenth of its snapshot CPU, py-spy.)
    # The page's last primary key as the source pages by it (``snapshot(after=...)``
    # goes on after it; SQL Server: date and time keys as the server's text);
    # None for an empty page.
    last_key: tuple[Any, ...] | None = None
    encoded_columns: tuple[str, ...] = ()
    plain_columns: tuple[str, ...] = ()
    records: list[tuple[Any, ...]] | None = None
    # An encoded column's text may instead be ``ENCODED_ODD`` and the source's
    # text of the value (one the server does not spell as ``cdc.values`` does):
    # ``loaders[column]`` loads that text into the value a row would hold.
    loaders: Mapping[str, Callable[[str], Any]] = field(default_factory=dict)

    def __len__(self) -> int:
        """The page's rows."""
        return len(self.records) if self.records is not None else len(self.rows)


@dataclass(frozen=True)
class KeyedRows:
    """The current rows of some primary keys (``ChangeSource.read_rows``)."""

    version: int  # read before the rows: every change at or below it is in them
    rows: list[
        dict[str, Any] | None
    ]  # one per key asked, in order: published column -> value; None: no such row


@dataclass(frozen=True)
class TrackingStatus:
    """A table's change tracking. ``min_valid_version`` is None when changes
    are not captured at all (not enabled, the table gone, PostgreSQL: its
    capture trigger dropped or disabled): the table cannot be followed.
    ``enabled`` False with a ``min_valid_version``: set up, but impaired
    (``detail`` says how); changes are still captured."""

    table: str
    enabled: bool
    min_valid_version: int | None = None
    current_version: int | None = None
    detail: str = ""
    # Not enabled, yet something of its tracking is left at the source that
    # ``tracking disable`` removes (a dropped table's replication slot, which
    # holds WAL until it is dropped)
    remains: bool = False


@dataclass(frozen=True)
class CleanupScope:
    """Whose retention cleanup it is (PostgreSQL; see ``cdc.sources.pg_retention``):
    the deployment (its namespace and Redis server), the tables its config
    mirrors (the only ones it cleans), and for how many seconds its claim on
    their retention holds unless renewed."""

    deployment: str
    tables: tuple[str, ...]
    claim_for: float


@runtime_checkable
class ChangeSource(Protocol):
    kind: str

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    async def describe(self, table_config: TableConfig) -> TableInfo:
        """Resolve the table: primary key, published columns and their types.

        Raises SchemaError (no primary key, unknown column), UnsupportedType,
        TrackingNotEnabled."""
        ...

    async def fingerprints(self, tables: Sequence[TableConfig]) -> dict[str, str | None]:
        """Each table's shape now, as an opaque text, in one round trip:
        ``table_config.table`` -> fingerprint, None when there is no such
        table. It changes whenever the table is dropped and created again
        or renamed, a column is added, dropped, renamed or retyped, the
        primary key changes, or its change tracking is turned off or on (or,
        PostgreSQL, its capture triggers are dropped or disabled). The tracker
        compares it with ``TableInfo.fingerprint`` and describes the table
        again when they differ."""
        ...

    async def current_version(self) -> int:
        """The source's current consistent bound (what a read now would return)."""
        ...

    async def read_changes(
        self,
        info: TableInfo,
        since: int,
        *,
        limit: int,
        upto: int | None = None,
        after: Cursor | None = None,
    ) -> ChangePage: ...

    def snapshot(
        self,
        info: TableInfo,
        *,
        page_size: int,
        after: tuple[Any, ...] | None = None,
        encoded: bool = False,
        start: tuple[Any, ...] | None = None,
        until: tuple[Any, ...] | None = None,
    ) -> AsyncIterator[SnapshotPage]:
        """The table's keyset pages (the module docstring); ``after``: only the
        rows whose primary key (values in key order) is above it, to resume a
        snapshot that stopped there; ``start``/``until``: only the keys in that
        range, both inclusive (``cdc snapshot --from/--to``); ``encoded``: the
        source may write the JSON text of columns itself (``SnapshotPage.records``).
        A key's values may be given as their text (as ``read_rows`` takes them)."""
        ...

    async def read_rows(self, info: TableInfo, keys: Sequence[dict[str, Any]]) -> KeyedRows:
        """The current rows of ``keys`` (primary-key column -> value, each the
        value or its text as a key template renders it: ``cdc.templates``),
        in one consistent view, with a version read before any of them, as a
        snapshot's: every change at or below it is in the rows, and a later
        change comes with a higher version (``cdc deadletter replay``)."""
        ...

    async def wait_for_changes(self, timeout: float) -> set[str]:
        """Block up to ``timeout`` seconds for a change notification; return
        the notified tables ("schema.name"), empty on timeout. Sources with
        no notification simply sleep and return an empty set."""
        ...

    def quiet_for(self, info: TableInfo, since: int) -> float:
        """Seconds during which a read of ``info`` from ``since`` is known to
        find nothing unless ``wait_for_changes`` reports the table first; 0
        when that is not known. A tracker whose backoff would poll sooner
        waits for the notification instead (PostgreSQL; see its module)."""
        ...

    async def tracking_enable(self, tables: Sequence[TableConfig]) -> list[str]: ...

    async def grant_runtime(self, tables: Sequence[TableConfig], role: str) -> list[str]:
        """Grant the database role (SQL Server: user) ``role`` what ``cdc run``
        needs to read ``tables`` (``cdc tracking enable --grant-to``), idempotently;
        lines saying what was granted."""
        ...

    async def check_grantee(self, role: str) -> None:
        """``ConfigError`` (exit 2) when there is no such role (SQL Server:
        user): ``--grant-to`` checks it before enabling anything."""
        ...

    async def tracking_disable(self, tables: Sequence[TableConfig]) -> list[str]: ...

    async def tracking_status(self, tables: Sequence[TableConfig]) -> list[TrackingStatus]: ...

    async def retention(self) -> float | None:
        """Seconds the source keeps the changes of a table after they were
        made (its minimum valid version passes them then); None when unknown
        or when nothing is ever removed. ``cdc_retention_headroom_seconds``
        is this minus the age of a table's stored checkpoint."""
        ...

    async def cleanup(self, retention: float, scope: CleanupScope | None = None) -> int:
        """Delete tracking entries older than ``retention`` seconds (where the
        source owns its tracking): of ``scope``'s tables only, when given,
        never below what another deployment's live claim keeps; return how
        many were deleted."""
        ...

    async def doctor(self, tables: Sequence[TableConfig]) -> list[Finding]: ...
