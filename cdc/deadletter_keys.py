"""Which row a dead letter entry is about: its primary key, recovered from
what the entry holds (``DataManager.dead_letter``, ``cdc.feeder``).

In order of trust:

1. its ``partition`` and ``key`` fields, read back with the table's templates:
   they are the document's address, rendered from the row's key values
   (``cdc.templates``: a one-column template keeps the value as it is, and
   with two or more columns each value has the template's literal text
   percent-encoded, so the rendering reads back to the values);
2. its ``values``: ``{"key": {column: text}}`` for a row that could not be
   encoded (``cdc.feeder``), or the encoded columns of a change Redis
   refused (the primary key among them), unless they were over
   ``max_row_bytes`` (then ``null``).

None when neither gives every primary-key column (an entry written by a
config whose templates differ, say): the replay reports the entry and leaves
it in place.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from cdc.templates import Template
from publishers.deadletters import DeadLetter


def recover_key(
    letter: DeadLetter, partition: Template, key: Template, primary_key: tuple[str, ...]
) -> dict[str, Any] | None:
    """The entry's primary key, column -> value (text or JSON value); None when it cannot be told."""
    found: dict[str, Any] = {}
    if letter.key:
        for template, text in ((partition, letter.partition), (key, letter.key)):
            read = read_template(template, text)
            if read is None or any(found.get(c, v) != v for c, v in read.items()):
                found = {}
                break
            found.update(read)
    if all(column in found for column in primary_key):
        return {column: found[column] for column in primary_key}
    return _from_values(letter.decoded_values(), primary_key)


def read_template(template: Template, text: str) -> dict[str, str] | None:
    """The column values ``template`` rendered ``text`` from, or None when it did not."""
    if template.is_literal:
        return {} if text == template.source else None
    pattern = "".join("(.*?)" if is_column else re.escape(part) for is_column, part in template.parts)
    match = re.fullmatch(pattern, text, re.DOTALL)
    if match is None:
        return None
    values = match.groups()
    if template.encodes_values:
        values = tuple(urllib.parse.unquote(v, errors="strict") for v in values)
    read: dict[str, str] = {}
    for column, value in zip(template.columns, values, strict=True):
        if read.get(column, value) != value:
            return None
        read[column] = value
    return read


def _from_values(values: Any, primary_key: tuple[str, ...]) -> dict[str, Any] | None:
    if not isinstance(values, dict):
        return None
    nested = values.get("key")
    if isinstance(nested, dict) and all(c in nested for c in primary_key):
        values = nested
    if not all(c in values and _scalar(values[c]) for c in primary_key):
        return None
    return {c: values[c] for c in primary_key}


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)
