"""A snapshot page's rows as the bulk writer takes them (``publishers.bulk``):
per partition, the data key and every published column's JSON text.

The hot loop of a snapshot: no ``Change`` per row, and the JSON text the
source wrote (``SnapshotPage.encoded``) is split, not parsed. A row that
cannot be encoded (``PoisonChange``: a value with no JSON spelling, a row
over ``max_row_bytes``) is handed back for the dead letter, as the change
path does.
"""

from __future__ import annotations

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
    last_key: tuple[Any, ...] | None = None  # the page's last primary key, values in key order


def map_page(page: SnapshotPage, mapper: TableMapper) -> MappedPage:
    """Every row of ``page`` mapped; its columns in the order ``columns``
    gives: the source-encoded ones, then the others."""
    encoded = page.encoded_columns
    plain = tuple(c for c in mapper.columns if c not in encoded)
    mapped = MappedPage(PageRows((*encoded, *plain)))
    texts = page.encoded if page.encoded is not None and encoded else None
    keys = mapper.info.primary_key
    render_partition = mapper.config.partition.render
    render_key = mapper.key_template.render
    limit, names_size = mapper.max_row_bytes, mapper.names_size
    add = mapped.rows.add
    key: dict[str, Any] = {}
    for i, row in enumerate(page.rows):
        key = {c: row[c] for c in keys}
        try:
            values: list[Any] = texts[i].split(SEPARATOR) if texts is not None else []
            size = names_size + (len(texts[i]) if texts is not None else 0)
            for column in plain:
                text = _encode(row.get(column), column)
                values.append(text)
                size += len(text)
            if size > limit // 4:  # str lengths count characters: measure bytes when it may matter
                _check_size(values, names_size, limit, mapper, key)
        except PoisonChange as exc:
            mapped.poisoned.append((key, str(exc)))
            continue
        add(render_partition(key), render_key(key), values)
    if page.rows:
        mapped.last_key = tuple(key[c] for c in keys)
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
