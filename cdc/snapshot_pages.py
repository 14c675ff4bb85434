"""A snapshot page's rows as the bulk writer takes them (``publishers.bulk``):
per partition, the data key and every published column's JSON text.

The hot loop of a snapshot: no ``Change`` per row, and the JSON text the
source wrote (``SnapshotPage.records``) is split, not parsed. A row that
cannot be encoded (``PoisonChange``: a value with no JSON spelling, a row
over ``max_row_bytes``) is handed back for the dead letter, as the change
path does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc.errors import PoisonChange
from cdc.mapping import TableMapper
from cdc.sources.base import ENCODED_SEPARATOR as SEPARATOR
from cdc.sources.base import SnapshotPage
from cdc.values import SHORTCUTS, encode_value
from publishers.bulk import PageRows

# Rows mapped between two turns of the event loop: ~8 ms of CPU at ~8 us a
# row, against the ~5 us a turn costs.
ROWS_PER_STEP = 1000


@dataclass
class MappedPage:
    rows: PageRows
    poisoned: list[tuple[dict[str, Any], str]] = field(default_factory=list)  # (primary key, reason)


def map_page(page: SnapshotPage, mapper: TableMapper) -> MappedPage:
    """Every row of ``page`` mapped; its columns in the order ``rows.columns``
    gives: the source-encoded ones, then the others."""
    mapped, records, layout = _start(page, mapper)
    _map_records(mapped, records, layout, mapper)
    return mapped


async def map_page_in_steps(page: SnapshotPage, mapper: TableMapper) -> MappedPage:
    """``map_page``, giving the event loop a turn every ``ROWS_PER_STEP`` rows:
    meanwhile the page before goes on being sent to Redis (a page is ~1 MB,
    more than the socket takes at once: the rest leaves only when the loop
    runs) and its replies are read, so Redis writes while this maps."""
    mapped, records, layout = _start(page, mapper)
    for first in range(0, len(records), ROWS_PER_STEP):
        _map_records(mapped, records[first : first + ROWS_PER_STEP], layout, mapper)
        await asyncio.sleep(0)
    return mapped


@dataclass(frozen=True)
class _Layout:
    """Where a record's parts are: ``width`` key values, then the source's
    JSON text of ``encoded`` (one string), then one value per ``plain`` column."""

    width: int
    encoded: tuple[str, ...]
    plain: Sequence[str]


def _start(page: SnapshotPage, mapper: TableMapper) -> tuple[MappedPage, Sequence[Sequence[Any]], _Layout]:
    keys = mapper.info.primary_key
    if page.records is None:  # rows as dicts: every column a value
        plain = mapper.columns
        records: Sequence[Sequence[Any]] = [
            (*(row[c] for c in keys), "", *(row.get(c) for c in plain)) for row in page.rows
        ]
        layout = _Layout(len(keys), (), plain)
    else:
        records = page.records
        layout = _Layout(len(keys), page.encoded_columns, page.plain_columns)
    return MappedPage(PageRows((*layout.encoded, *layout.plain))), records, layout


def _map_records(
    mapped: MappedPage, records: Sequence[Sequence[Any]], layout: _Layout, mapper: TableMapper
) -> None:
    keys, width, encoded, plain = mapper.info.primary_key, layout.width, layout.encoded, layout.plain
    render_partition = mapper.config.partition.render
    render_key = mapper.key_template.render
    limit, names_size = mapper.max_row_bytes, mapper.names_size
    add = mapped.rows.add
    key: dict[str, Any] = {}
    for record in records:
        key = dict(zip(keys, record[:width], strict=True))
        text = record[width]
        try:
            values: list[Any] = text.split(SEPARATOR) if encoded else []
            size = names_size + len(text)
            for column, value in zip(plain, record[width + 1 :], strict=True):
                encoded_value = _encode(value, column)
                values.append(encoded_value)
                size += len(encoded_value)
            if size > limit // 4:  # str lengths count characters: measure bytes when it may matter
                _check_size(values, names_size, limit, mapper, key)
        except PoisonChange as exc:
            mapped.poisoned.append((key, str(exc)))
            continue
        partition, data_key = render_partition(key), render_key(key)
        if not partition or not data_key:  # what the apply path refuses too (publishers.apply)
            mapped.poisoned.append((key, "empty partition value" if not partition else "empty data key"))
            continue
        add(partition, data_key, values)


def _encode(value: Any, column: str) -> bytes:
    shortcut = SHORTCUTS.get(type(value))
    text = None if shortcut is None else shortcut(value)
    return encode_value(value, column) if text is None else text


def _check_size(
    values: list[Any], names_size: int, limit: int, mapper: TableMapper, key: dict[str, Any]
) -> None:
    size = names_size + sum(len(v.encode()) if isinstance(v, str) else len(v) for v in values)
    if size > limit:
        raise PoisonChange(
            f"row {mapper.describe_key(key)} is {size} bytes encoded, over max_row_bytes={limit}"
        )
