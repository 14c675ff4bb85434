"""A snapshot page's rows as the bulk writer takes them (``publishers.bulk``):
per partition, the data key and every published column's JSON text.

The hot loop of a snapshot: no ``Change`` per row, and the JSON text the
source wrote (``SnapshotPage.records``) is split, not parsed. A row that
cannot be encoded (``PoisonChange``: a value with no JSON spelling, a row
over ``max_row_bytes``) is handed back for the dead letter, as the change
path does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc.errors import PoisonChange
from cdc.mapping import TableMapper
from cdc.sources.base import ENCODED_SEPARATOR as SEPARATOR
from cdc.sources.base import SnapshotPage
from cdc.values import SHORTCUTS, encode_value
from publishers.bulk import PageRows


@dataclass
class MappedPage:
    rows: PageRows
    poisoned: list[tuple[dict[str, Any], str]] = field(default_factory=list)  # (primary key, reason)


def map_page(page: SnapshotPage, mapper: TableMapper) -> MappedPage:
    """Every row of ``page`` mapped; its columns in the order ``rows.columns``
    gives: the source-encoded ones, then the others."""
    keys = mapper.info.primary_key
    encoded: tuple[str, ...]
    if page.records is None:  # rows as dicts: every column a value
        width, encoded, plain = len(keys), (), mapper.columns
        records: Sequence[Sequence[Any]] = [
            (*(row[c] for c in keys), "", *(row.get(c) for c in plain)) for row in page.rows
        ]
    else:
        width, encoded, plain, records = len(keys), page.encoded_columns, page.plain_columns, page.records
    mapped = MappedPage(PageRows((*encoded, *plain)))
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
    return mapped


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
