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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc.errors import PoisonChange
from cdc.mapping import TableMapper
from cdc.sources.base import ENCODED_ODD, ENCODED_SEPARATOR, SnapshotPage
from cdc.templates import Template, render_key_value
from cdc.values import SHORTCUTS, encode_value
from publishers.bulk import PageRows

# Rows mapped between two turns of the event loop: ~8 ms of CPU at ~8 us a
# row, against the ~5 us a turn costs.
ROWS_PER_STEP = 1000

SEPARATOR = ENCODED_SEPARATOR.encode()
ODD = ENCODED_ODD.encode()


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
    JSON text of ``encoded`` (one string), then one value per ``plain`` column;
    ``loaders`` load an encoded column's ``ODD`` text (``SnapshotPage.loaders``)."""

    width: int
    encoded: tuple[str, ...]
    plain: Sequence[str]
    loaders: Sequence[tuple[int, str, Callable[[str], Any]]] = ()  # (index in encoded, column, loader)


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
        loaders = [(i, c, page.loaders[c]) for i, c in enumerate(page.encoded_columns) if c in page.loaders]
        layout = _Layout(len(keys), page.encoded_columns, page.plain_columns, loaders)
    return MappedPage(PageRows((*layout.encoded, *layout.plain))), records, layout


def _map_records(
    mapped: MappedPage, records: Sequence[Sequence[Any]], layout: _Layout, mapper: TableMapper
) -> None:
    keys, width, encoded, plain = mapper.info.primary_key, layout.width, layout.encoded, layout.plain
    render_partition = _renderer(mapper.config.partition, keys)
    render_key = _renderer(mapper.key_template, keys)
    limit, names_size = mapper.max_row_bytes, mapper.names_size
    add = mapped.rows.add
    for record in records:
        text = record[width].encode() if encoded else b""  # one encode a row: the bulk call sends bytes
        try:
            values: list[bytes] = text.split(SEPARATOR) if encoded else []
            size = names_size + len(text)
            if ODD in text:
                _load_odd(values, layout)
                size = limit + 1  # the loaded values' JSON text: measured below
            if plain:  # (none in a table whose every column the server writes: skip the slice and zip)
                for column, value in zip(plain, record[width + 1 :], strict=True):
                    encoded_value = _encode(value, column)
                    values.append(encoded_value)
                    size += len(encoded_value)
            if size > limit:  # the text's separators count too: measure the values alone
                _check_size(values, names_size, limit, mapper, record[:width])
            partition, data_key = render_partition(record), render_key(record)
        except PoisonChange as exc:
            mapped.poisoned.append((_key(keys, record), str(exc)))
            continue
        if not partition or not data_key:  # what the apply path refuses too (publishers.apply)
            reason = "empty partition value" if not partition else "empty data key"
            mapped.poisoned.append((_key(keys, record), reason))
            continue
        add(partition, data_key, values)


def _key(keys: Sequence[str], record: Sequence[Any]) -> dict[str, Any]:
    return dict(zip(keys, record[: len(keys)], strict=True))


def _renderer(template: Template, keys: Sequence[str]) -> Callable[[Sequence[Any]], str]:
    """``template.render`` of a record's key, without a dict per row where the
    template names at most one column (a dict and the render cost ~0.7 µs a
    row: the sidecar's snapshot CPU 8.7 -> 6.9 µs a row, py-spy, 300,000 rows).
    One column is never percent-encoded (``Template.encodes_values``)."""
    columns = template.columns
    if not columns:
        text = template.render({})
        return lambda record: text
    if len(columns) == 1:
        index = keys.index(columns[0])
        at = next(i for i, (is_column, _) in enumerate(template.parts) if is_column)
        before = "".join(text for _, text in template.parts[:at])
        after = "".join(text for _, text in template.parts[at + 1 :])
        return lambda record: before + render_key_value(record[index]) + after
    return lambda record: template.render(_key(keys, record))


def _load_odd(values: list[bytes], layout: _Layout) -> None:
    """Replace each ``ODD`` text of ``values`` by the JSON text of the value
    it loads to, as the plain path writes it (``PoisonChange`` included)."""
    for index, column, load in layout.loaders:
        text = values[index]
        if text.startswith(ODD):
            values[index] = _encode(load(text[1:].decode()), column)


def _encode(value: Any, column: str) -> bytes:
    shortcut = SHORTCUTS.get(type(value))
    text = None if shortcut is None else shortcut(value)
    return encode_value(value, column) if text is None else text


def _check_size(
    values: list[bytes], names_size: int, limit: int, mapper: TableMapper, key: Sequence[Any]
) -> None:
    size = names_size + sum(map(len, values))
    if size > limit:
        described = mapper.describe_key(_key(mapper.info.primary_key, key))
        raise PoisonChange(f"row {described} is {size} bytes encoded, over max_row_bytes={limit}")
