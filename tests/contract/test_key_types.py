"""Primary keys beyond int, paged through the ChangeSource API on every source.

A keyset cursor (``read_changes``'s ``upto``/``after``, a snapshot's pages)
must compare a key exactly as the database sorts it. Each test writes rows
whose keys a lossy cursor gets wrong (``key_values``: timestamps closer than
the driver's Python value, values Python cannot hold, uniqueidentifiers,
text under collations whose order is not the text's code-point order), with
many rows sharing the leading key value, and reads them in pages of
``PAGE``: every row must arrive exactly once, in the database's own order,
with its exact key values. Changes are read twice: as one read held across
pages, and resumed on another source after every page (as after a
reconnect), which sends the cursor back as query parameters.

Each row carries an ``n`` column of its own, so rows are told apart even
where two keys read the same (datetime2(7) cut to microseconds), and the
database's order is asked of the database (``ids_in_key_order``), never
assumed.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cdc.config import TableConfig
from cdc.sources.base import ChangeRow, ChangeSource, TableInfo
from tests.e2e import wait_for

from .harness import HARNESSES, Key, SourceHarness, key_of, read_all
from .key_values import COLLATED_KINDS, WITHOUT_COLLATIONS

PAGE = 4
CROWD = 30  # rows sharing one crowded key value: several pages of them
FEW = 2  # rows sharing each other value

Rows = dict[int, tuple[dict[str, str], Key]]  # n -> (the row as literals, the key it must read as)


@pytest.fixture(params=sorted(HARNESSES))
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[SourceHarness]:
    async with HARNESSES[request.param](request) as running:
        yield running


KINDS = ("timestamp", "timestamptz", "uuid", *COLLATED_KINDS)
# Each source with each kind of key it has: a source without collations has no collated keys to test.
SOURCE_KINDS = [
    (source, kind)
    for source in sorted(HARNESSES)
    for kind in KINDS
    if not (source in WITHOUT_COLLATIONS and kind in COLLATED_KINDS)
]
COLLATED_SOURCES = [source for source in sorted(HARNESSES) if source not in WITHOUT_COLLATIONS]


@pytest.mark.parametrize(("harness", "kind"), SOURCE_KINDS, indirect=["harness"])
async def test_pages_over_a_key_type_deliver_every_row_once_in_order(
    harness: SourceHarness, kind: str
) -> None:
    """Key (k, n): crowded values of k have more rows than a page holds."""
    values = await harness.key_values(kind)
    table_config = await harness.create_table(f"key_{kind}", {"k": kind, "n": "int"}, ["k", "n"])
    rows: Rows = {}
    for i, (literal, read_as) in enumerate(zip(values.literals, values.read_as, strict=True)):
        for j in range(CROWD if i in values.crowded else FEW):
            n = i * 100 + j
            rows[n] = ({"k": literal, "n": str(n)}, (read_as, n))

    in_key_order = await check_pages(harness, table_config, rows)

    if values.not_text_order:  # the premise: a cursor compared as text would go wrong here
        leading = list(dict.fromkeys(rows[n][1][0] for n in in_key_order))
        assert leading != sorted(leading, key=str), f"{kind}: the database sorts these values as text"


@pytest.mark.parametrize("harness", COLLATED_SOURCES, indirect=True)
async def test_composite_text_keys_under_collations_deliver_every_row_once_in_order(
    harness: SourceHarness,
) -> None:
    """Key (grp, name), each under a collation of its own: every grp has more rows than a page."""
    groups, names = await harness.key_values("ctext"), await harness.key_values("cvarchar")
    table_config = await harness.create_table(
        "key_composite", {"grp": "ctext", "name": "cvarchar", "n": "int"}, ["grp", "name"]
    )
    rows: Rows = {}
    for i, (group, group_read_as) in enumerate(zip(groups.literals[:4], groups.read_as[:4], strict=True)):
        for j, (name, name_read_as) in enumerate(zip(names.literals, names.read_as, strict=True)):
            n = i * 100 + j
            rows[n] = ({"grp": group, "name": name, "n": str(n)}, (group_read_as, name_read_as))

    in_key_order = await check_pages(harness, table_config, rows)

    keys = [rows[n][1] for n in in_key_order]
    assert keys != sorted(keys), "the database sorts these keys in code-point order: no collation at work"


async def check_pages(harness: SourceHarness, table_config: TableConfig, rows: Rows) -> list[int]:
    """Insert ``rows`` in two transactions (shuffled, so neither the insert order
    nor the transaction gives the key order away), then read them in pages as
    changes (held, and resumed on another source) and as a snapshot. Returns
    the ``n`` of every row in the database's key order."""
    source = harness.source
    info = await source.describe(table_config)
    since = await source.current_version()
    ids = list(rows)
    random.Random(14).shuffle(ids)
    transactions = (ids[::2], ids[1::2])
    for part in transactions:
        await harness.insert_literal_rows(table_config, [rows[n][0] for n in part])
    in_key_order = await harness.ids_in_key_order(table_config, "n")
    assert sorted(in_key_order) == sorted(rows)
    # a read of changes is ordered by (version, key): the first transaction's rows, then the second's
    first = set(transactions[0])
    change_order = [n for n in in_key_order if n in first] + [n for n in in_key_order if n not in first]

    held = await paged_changes(source, source, info, since, len(rows))
    if not harness.orders_changes_by_database_key:  # its own order of a version's keys, the same each time
        change_order = [c.values["n"] for c in held if c.values]
        assert sorted(change_order[: len(first)]) == sorted(first)
    check_changes(info, rows, held, change_order, len(first))
    async with harness.another_source() as other:
        resumed = await paged_changes(source, other, info, since, len(rows))
    check_changes(info, rows, resumed, change_order, len(first))

    pages = [page.rows async for page in source.snapshot(info, page_size=PAGE)]
    assert all(len(page) == PAGE for page in pages[:-1]) and 0 < len(pages[-1]) <= PAGE
    snapshot = [row for page in pages for row in page]
    assert [row["n"] for row in snapshot] == in_key_order, "every row once, in the database's key order"
    assert [key_of(info, row) for row in snapshot] == [rows[n][1] for n in in_key_order]
    return in_key_order


async def paged_changes(
    first: ChangeSource, other: ChangeSource, info: TableInfo, since: int, expected: int
) -> list[ChangeRow]:
    """A read of ``expected`` changes in pages, alternating between ``first`` and
    ``other`` (the same source: one read held across pages). A cursor that
    repeats rows would page forever: the pages are bounded."""
    sources = itertools.cycle((first, other))
    page = await next(sources).read_changes(info, since, limit=PAGE)
    changes = list(page.rows)
    for _ in range(expected // PAGE + 2):
        if not page.more:
            return changes
        assert page.cursor is not None and len(page.rows) == PAGE
        page = await next(sources).read_changes(
            info, since, limit=PAGE, upto=page.next_version, after=page.cursor
        )
        changes += page.rows
    raise AssertionError(
        f"{len(changes)} changes of {expected} and more pages still: the cursor repeats rows"
    )


def check_changes(
    info: TableInfo, rows: Rows, changes: list[ChangeRow], order: list[int], first_transaction: int
) -> None:
    assert [c.values["n"] for c in changes if c.values] == order, "every row once, in (version, key) order"
    assert [c.op for c in changes] == ["I"] * len(rows)
    assert [key_of(info, c.key) for c in changes] == [rows[n][1] for n in order], "the exact key values"
    assert all(c.values and {k: c.values[k] for k in info.primary_key} == c.key for c in changes)
    first, second = changes[:first_transaction], changes[first_transaction:]
    assert len({c.version for c in first}) == len({c.version for c in second}) == 1
    assert first[0].version < second[0].version


# -- a read cancelled between pages ------------------------------------------------


@pytest.mark.parametrize("read", ["changes", "snapshot"])
async def test_a_read_cancelled_between_pages_leaves_no_transaction_and_loses_nothing(
    harness: SourceHarness, read: str
) -> None:
    """The task reading is cancelled after its first page, while it would feed
    the page to Redis (as a lost lease cancels it): no session of the source
    may keep a transaction open (PostgreSQL: the xmin horizon; SQL Server: the
    version store in tempdb), and the next read still returns every row."""
    source = harness.source
    table_config = await harness.create_table("cancelled", {"id": "int", "note": "text"}, ["id"])
    info = await source.describe(table_config)
    since = await source.current_version()
    await harness.insert_literal_rows(table_config, [{"id": str(i), "note": "'x'"} for i in range(5 * PAGE)])
    first_page = asyncio.Event()

    async def feed_forever() -> None:
        first_page.set()
        await asyncio.Event().wait()

    async def reader() -> None:
        if read == "changes":
            page = await source.read_changes(info, since, limit=PAGE)
            assert page.more
            await feed_forever()
        async for _ in source.snapshot(info, page_size=PAGE):
            await feed_forever()

    task = asyncio.create_task(reader())
    await asyncio.wait_for(first_page.wait(), 30)
    if read == "snapshot":  # the premise: the check sees the transaction a snapshot holds
        held = await harness.open_transactions()
        assert held is None or held >= 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async def no_transaction() -> bool:
        return (await harness.open_transactions()) in (None, 0)

    await wait_for(no_transaction, 10, f"the cancelled {read} read's transaction to end")
    rows, _ = await read_all(source, info, since, limit=PAGE)
    assert sorted(r.key["id"] for r in rows) == list(range(5 * PAGE))
    snapshot: list[Any] = [
        row["id"] async for page in source.snapshot(info, page_size=PAGE) for row in page.rows
    ]
    assert snapshot == list(range(5 * PAGE))
