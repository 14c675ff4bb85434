"""Values of the primary-key types the contract suite pages over, per dialect.

Each logical key type (``timestamp``, ``timestamptz``, ``uuid``, ``ctext``,
``cvarchar``) has a set of distinct values that a keyset cursor can get
wrong: neighbours closer than the driver's Python value can tell apart
(SQL Server's datetime2(7) holds 100 ns, Python microseconds), values Python
cannot hold at all (PostgreSQL's ``infinity``, years BC and after 9999),
instants written with different offsets, uniqueidentifiers (SQL Server sorts
them by byte groups, the last group first: not as their text, "Comparing
GUID and uniqueidentifier Values", learn.microsoft.com), and text whose order
under a collation is not its code-point order (case, accents, Swedish å ä ö
after z, Cyrillic in a varchar of another code page).

A value is a SQL expression of the dialect (``literals``) and what a source
reads it as (``read_as``, same position). Where two values could read the
same, the tests tell the rows apart by another key column as well.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KeyValues:
    kind: str  # the logical type, for ``SourceHarness.create_table``
    literals: tuple[str, ...]  # distinct values, as SQL expressions of the dialect
    read_as: tuple[Any, ...]  # each as the source reads it (ChangeRow.key, snapshot rows)
    # positions of neighbours a lossy cursor would confuse: the tests give them many rows each
    crowded: tuple[int, ...] = (0, 1)
    # a premise the tests check: the database sorts these values otherwise than
    # their text does (so a cursor compared as text would skip or repeat rows)
    not_text_order: bool = False


def _aware(
    year: int, month: int, day: int, hour: int, minute: int, second: int, micro: int = 0, *, hours: int = 0
) -> dt.datetime:
    """A datetime at a UTC offset of ``hours``."""
    return dt.datetime(year, month, day, hour, minute, second, micro, dt.timezone(dt.timedelta(hours=hours)))


# Chosen so that SQL Server's order differs from the text's: values that differ
# only in the first groups sort by their last group first.
UUIDS = (
    "00000000-0000-0000-0000-000000000002",
    "00000000-0000-0000-0000-000000000001",
    "01000000-0000-0000-0000-000000000000",
    "00000000-0000-0000-0100-000000000000",
    "00000000-0000-0100-0000-000000000000",
    "00000000-0100-0000-0000-000000000000",
    "ffffffff-ffff-ffff-ffff-000000000000",
    "00000000-0000-0000-0000-ff0000000000",
    "00000000-0000-0000-0000-0000000000ff",
    "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A12",  # upper case: read in lower case
    "10000000-0000-0000-0000-000000000001",
)
# Case and accents: under a linguistic collation "a" < "A" < "B", in code points "B" < "a".
CASED = ("a", "A", "b", "B", "e", "E", "é", "É", "f", "z", "Z", "ä", "ab", "aB", "Ab")
# Swedish: å ä ö sort after z (and aa is not å); in code points ä (e4) < å (e5).
SWEDISH = ("a", "o", "z", "Z", "å", "ä", "ö", "Ä", "aa")
# Cyrillic and Latin letters, in a varchar whose code page (1251) is not the database's default.
CYRILLIC = ("а", "А", "б", "Б", "е", "ё", "я", "Я", "a", "b", "B")


def _quoted(values: tuple[str, ...], prefix: str = "") -> tuple[str, ...]:
    assert not any("'" in v for v in values)
    return tuple(f"{prefix}'{v}'" for v in values)


PG_KEYS = {
    "timestamp": KeyValues(
        "timestamp",
        (
            "'-infinity'",
            "'0044-03-15 10:00:00 BC'",
            "'2024-02-29 13:45:30.123456'",
            "'2024-02-29 13:45:30.123457'",
            "'2024-02-29 13:45:31'",
            "'10000-01-01 00:00:00'",
            "'infinity'",
        ),
        (
            "-infinity",
            "-0043-03-15T10:00:00",
            dt.datetime(2024, 2, 29, 13, 45, 30, 123456),
            dt.datetime(2024, 2, 29, 13, 45, 30, 123457),
            dt.datetime(2024, 2, 29, 13, 45, 31),
            "+10000-01-01T00:00:00",
            "infinity",
        ),
        crowded=(2, 3),
    ),
    "timestamptz": KeyValues(
        "timestamptz",
        (
            "'-infinity'",
            "'2024-02-29 13:00:00.123456+05'",
            "'2024-02-29 10:00:00.123456+00'",
            "'2024-02-29 10:00:00.123457+00'",
            "'2024-02-29 09:00:00-02'",
            "'infinity'",
        ),
        (
            "-infinity",
            _aware(2024, 2, 29, 8, 0, 0, 123456),
            _aware(2024, 2, 29, 10, 0, 0, 123456),
            _aware(2024, 2, 29, 10, 0, 0, 123457),
            _aware(2024, 2, 29, 11, 0, 0),
            "infinity",
        ),
        crowded=(2, 3),
    ),
    "uuid": KeyValues("uuid", _quoted(UUIDS), tuple(uuid.UUID(u) for u in UUIDS)),
    "ctext": KeyValues("ctext", _quoted(CASED), CASED, not_text_order=True),
    "cvarchar": KeyValues("cvarchar", _quoted(SWEDISH), SWEDISH, not_text_order=True),
}

# datetime2(7) and datetimeoffset(7) hold 100 ns, and the source reads them as
# the server's own text, every digit kept (docs/TYPES.md, cdc.sources.mssql_types:
# no fraction when it is 0, six digits, a seventh only when it is not 0), so
# neighbours that differ in the 7th digit are distinct keys; a cursor cut to
# microseconds would repeat or skip them (crowded).
MSSQL_KEYS = {
    "timestamp": KeyValues(
        "timestamp",
        (
            "'0001-01-01T00:00:00.0000000'",
            "'2024-02-29T13:45:30.1234567'",
            "'2024-02-29T13:45:30.1234568'",
            "'2024-02-29T13:45:30.1234569'",
            "'2024-02-29T13:45:30.1234560'",
            "'9999-12-31T23:59:59.9999999'",
        ),
        (
            "0001-01-01T00:00:00",
            "2024-02-29T13:45:30.1234567",
            "2024-02-29T13:45:30.1234568",
            "2024-02-29T13:45:30.1234569",
            "2024-02-29T13:45:30.123456",
            "9999-12-31T23:59:59.9999999",
        ),
        crowded=(1, 2),
    ),
    "timestamptz": KeyValues(
        "timestamptz",
        (
            "'2024-02-29T13:00:00.1234567+05:00'",
            "'2024-02-29T10:00:00.1234567+00:00'",
            "'2024-02-29T10:00:00.1234568+00:00'",
            "'2024-02-29T09:00:00.0000000-02:00'",
        ),
        (
            "2024-02-29T13:00:00.1234567+05:00",
            "2024-02-29T10:00:00.1234567+00:00",
            "2024-02-29T10:00:00.1234568+00:00",
            "2024-02-29T09:00:00-02:00",
        ),
        crowded=(1, 2),
    ),
    "uuid": KeyValues("uuid", _quoted(UUIDS), tuple(u.lower() for u in UUIDS), not_text_order=True),
    "ctext": KeyValues("ctext", _quoted(CASED, "N"), CASED, not_text_order=True),
    "cvarchar": KeyValues("cvarchar", _quoted(CYRILLIC, "N"), CYRILLIC, not_text_order=True),
}

MEMORY_KEYS = {
    "timestamp": KeyValues(
        "timestamp",
        (
            "dt.datetime(1, 1, 1)",
            "dt.datetime(2024, 2, 29, 13, 45, 30, 123456)",
            "dt.datetime(2024, 2, 29, 13, 45, 30, 123457)",
            "dt.datetime(9999, 12, 31, 23, 59, 59, 999999)",
        ),
        (
            dt.datetime(1, 1, 1),
            dt.datetime(2024, 2, 29, 13, 45, 30, 123456),
            dt.datetime(2024, 2, 29, 13, 45, 30, 123457),
            dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        ),
        crowded=(1, 2),
    ),
    "timestamptz": KeyValues(
        "timestamptz",
        (
            "dt.datetime(2024, 2, 29, 13, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=5)))",
            "dt.datetime(2024, 2, 29, 10, 0, 0, 123456, tzinfo=dt.timezone.utc)",
            "dt.datetime(2024, 2, 29, 10, 0, 0, 123457, tzinfo=dt.timezone.utc)",
        ),
        (
            _aware(2024, 2, 29, 13, 0, 0, 123456, hours=5),
            _aware(2024, 2, 29, 10, 0, 0, 123456),
            _aware(2024, 2, 29, 10, 0, 0, 123457),
        ),
        crowded=(1, 2),
    ),
    "uuid": KeyValues("uuid", tuple(f"UUID('{u}')" for u in UUIDS), tuple(uuid.UUID(u) for u in UUIDS)),
}
# The memory source stores Python values: it has no collations, so the kinds
# under one (ctext, cvarchar) are not its to test (tests/contract/test_key_types.py).
COLLATED_KINDS = ("ctext", "cvarchar")
WITHOUT_COLLATIONS = frozenset({"memory"})
