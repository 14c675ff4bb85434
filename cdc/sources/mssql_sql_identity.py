"""The T-SQL of identities: a table's, a database's, and the version watcher's tick.

Kept apart from ``mssql_sql`` (which uses these fragments in its statements
and re-exports the statements) only for size; parsed by sqlglot's T-SQL
dialect in tests/cdc/sources/test_mssql_watcher.py like every other statement.
All of it is constant text: no identifier, no value is pasted in.
"""

from __future__ import annotations

# The table's identity as a read checks it, in its own SNAPSHOT transaction:
# which object the name is now, and when its change tracking began.
# sys.change_tracking_tables.begin_version is the "version of the database when
# change tracking began for the table ... reset if the table is truncated"
# (sys.change_tracking_tables (Transact-SQL), learn.microsoft.com), and a table
# whose tracking is disabled and enabled again gets a new row there: so a
# TRUNCATE, or tracking turned off and on, changes it even when no version check
# can tell (nothing committed since, or a caught-up poller). The view lists what
# the login has a permission on (metadata visibility), which SELECT on the table
# gives. NULL when the name is no table.
TABLE_IDENTITY = (
    "CASE WHEN OBJECT_ID(?) IS NULL THEN NULL ELSE CONCAT(N'object ', OBJECT_ID(?), N'; tracking since ', "
    "ISNULL((SELECT CAST(ctt.begin_version AS nvarchar(20)) FROM sys.change_tracking_tables AS ctt "
    "WHERE ctt.object_id = OBJECT_ID(?)), N'off')) END"
)


# The database's identity, as Microsoft recommends a synchronizing client check
# it with each sync ("Change Tracking and Data Restore", Work with change
# tracking, learn.microsoft.com: after a restore with data loss the version
# climbs back past the client's checkpoint, and "the data on the client and
# server are not synchronized"). sys.database_recovery_status: database_guid
# ("RESTORE always generates a new GUID when you restore a database that does
# not yet exist") and recovery_fork_guid ("the current recovery fork on which the
# database is currently active": recovering a database to a point other than
# the end of its log starts a new recovery path, "Recovery Paths",
# learn.microsoft.com). Its row of the current database is visible to the
# owner and to logins with VIEW ANY DATABASE, which public has by default ("VIEW
# ANY DATABASE Permission", learn.microsoft.com); hidden, both are NULL and
# only ``current < since`` tells a restore. Read at READ COMMITTED (the
# watcher, describe), never inside a read's SNAPSHOT transaction: one that
# touches a database which does not allow snapshot isolation fails (3952), and
# no page says whether this server-wide view counts as master's.
DATABASE_IDENTITY_TEXT = (
    "CONCAT(N'database ', ISNULL(CAST(drs.database_guid AS nvarchar(36)), N'hidden'), "
    "N'; fork ', ISNULL(CAST(drs.recovery_fork_guid AS nvarchar(36)), N'hidden'))"
)
THIS_DATABASE = "LEFT JOIN sys.database_recovery_status AS drs ON drs.database_id = DB_ID()"
DATABASE_IDENTITY = (
    f"SELECT {DATABASE_IDENTITY_TEXT} AS database_identity FROM (VALUES (1)) AS x(one) {THIS_DATABASE}"  # noqa: S608 - constants only
)
# One tick of the version watcher (``mssql_watcher``): the current version, the
# database's identity, and a summary of sys.change_tracking_tables (one row per
# tracked table the login may see: how many, the newest begin_version, a
# checksum of (object_id, begin_version)), which moves when a visible table's
# tracking is enabled, disabled or reset by TRUNCATE, or the table is dropped.
# One cheap statement, no transaction: a catalog view of at most a row per
# tracked table.
WATCH_TICK = (
    "SELECT CHANGE_TRACKING_CURRENT_VERSION() AS current_version, "  # noqa: S608 - constants only
    f"{DATABASE_IDENTITY_TEXT} AS database_identity, "
    "(SELECT CONCAT(COUNT_BIG(*), N' ', MAX(ctt.begin_version), N' ', "
    "CHECKSUM_AGG(CHECKSUM(ctt.object_id, ctt.begin_version))) FROM sys.change_tracking_tables AS ctt) "
    f"AS tracked_tables FROM (VALUES (1)) AS x(one) {THIS_DATABASE}"
)


# The identity of each table (``mssql_catalog``: TableInfo.identity): its
# object_id and the version its tracking began at (as ``TABLE_IDENTITY``),
# then the database's (``DATABASE_IDENTITY_TEXT``), so a restore or a failover to
# another copy changes every table's identity and fingerprint.
IDENTITY = (
    "CASE WHEN o.object_id IS NULL THEN NULL ELSE CONCAT(N'object ', o.object_id, N'; tracking since ', "
    f"ISNULL(CAST(ctt.begin_version AS nvarchar(20)), N'off'), N'; ', {DATABASE_IDENTITY_TEXT}) END"
)
