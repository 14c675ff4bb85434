"""The one exception hierarchy of cdc-sync.

Driver errors (psycopg, pyodbc, redis-py) are mapped onto it at the adapter
boundary, so the rest of the code, and the retry policies, only ever see these.
The root and the Redis-side classes (marked *) live in ``publishers.errors``,
because ``publishers`` imports nothing from ``cdc``; they are re-exported here
as the very same classes::

    CdcError *                     base; ``exit_code`` is the command line's code
    ├── ConfigError                2  bad config file or usage (names file, line, field)
    ├── ConnectError *             3  cannot connect at start-up (source or Redis)
    ├── TransientError *           1  worth retrying: link failure, timeout, deadlock,
    │   ├── SourceUnavailable         the source went away mid-run
    │   └── RedisUnavailable *        Redis went away, is loading, or is out of memory
    ├── SourceError                1  the source cannot do what is asked
    │   ├── TrackingNotEnabled     2  tracking is off for a table (or NULL min version)
    │   ├── TrackingExpired           the checkpoint is no longer valid: re-snapshot
    │   └── SchemaError            2  no primary key, unknown column, changed schema
    │       ├── TableChanged       2  the table changed under a read: describe it again
    │       ├── MissingColumn      2  a column the config's ``columns:`` names is not there
    │       └── UnsupportedType    2  a column type with no JSON mapping
    ├── PoisonChange *             1  one change cannot be applied: dead letter it
    ├── ApplyBlocked               1  a table's changes were not applied: a key of their
    │                                 partition is damaged (the table is degraded)
    └── LeaseLost *                1  another sidecar owns the table now (fencing)

``TransientError`` is the only branch that the retry loops (tenacity) retry.
"""

from __future__ import annotations

from publishers.errors import (
    CdcError,
    ConnectError,
    LeaseLost,
    PoisonChange,
    RedisUnavailable,
    TransientError,
)

__all__ = [
    "ApplyBlocked",
    "CdcError",
    "ConfigError",
    "ConnectError",
    "LeaseLost",
    "MissingColumn",
    "PoisonChange",
    "RedisUnavailable",
    "SchemaError",
    "SourceError",
    "SourceUnavailable",
    "TableChanged",
    "TrackingExpired",
    "TrackingNotEnabled",
    "TransientError",
    "UnsupportedType",
]


class ConfigError(CdcError):
    """The config file or the command line is wrong. Exit code 2."""

    exit_code = 2


class SourceUnavailable(TransientError):
    """The source database is unreachable, restarting, or timed out."""


class SourceError(CdcError):
    """The source database refuses what is asked of it."""


class TrackingNotEnabled(SourceError):
    """Change tracking is not enabled (or not visible) for a table. The config
    registers a table the source does not track: exit code 2."""

    exit_code = 2


class TrackingExpired(SourceError):
    """A checkpoint is below the table's minimum valid version, or the source
    went back in time (restore, failover, truncate): the table must be
    re-snapshotted."""

    def __init__(self, table: str, reason: str) -> None:
        super().__init__(f"{table}: change tracking checkpoint expired: {reason}")
        self.table = table
        self.reason = reason


class SchemaError(SourceError):
    """A table has no primary key, lacks a configured column, or changed. The
    config and the database disagree: exit code 2."""

    exit_code = 2


class TableChanged(SchemaError):
    """The table changed under a read (a column dropped, renamed or retyped,
    the table dropped or created again): expected after DDL, and fixed by
    describing the table again, which the tracker does at once."""


class MissingColumn(SchemaError):
    """A column that the config's ``columns:`` list names is not in the table
    (never there, or dropped or renamed since): the tracker names the
    config's line."""

    def __init__(self, table: str, column: str, message: str) -> None:
        super().__init__(message)
        self.table = table
        self.column = column


class UnsupportedType(SchemaError):
    """A column type that cdc-sync cannot map to JSON."""


class ApplyBlocked(CdcError):
    """Changes of a table were not applied because a shared key of their
    partition is damaged (``CDCLAYOUT``) or not writable (``NOPERM``): the
    table is degraded, and reads its changes again from its checkpoint until
    the key is repaired. Nothing is dead-lettered: the changes are fine."""
