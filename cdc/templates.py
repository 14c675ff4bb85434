"""Partition and key templates: a literal, or ``{Column}`` references to
primary-key columns, e.g. ``"{RegionId}"`` or ``"{OrderId}:{Line}"``.

A deleted row has nothing but its key, so templates may only use primary-key
columns; that is checked once the table's key is known (``check_columns``).

Two rows must never render to the same text: the document key (with the
partition) is the row's identity in Redis, and two rows sharing it would
overwrite each other's document, a delete of one removing the other. With one
column reference the value is kept as it is (surrounding literal text cannot
make two values collide). With two or more, a value could hold the text
between them (``{a}:{b}`` renders ``('x:y', 'z')`` and ``('x', 'y:z')`` both
as ``x:y:z``), so in each value ``%`` and every character of the template's
literal text are percent-encoded (UTF-8, ``%3A`` for ``:``): the literal
text then marks where each value ends, and the rendering reads back to the
values. Two references with no text between them (``{a}{b}``) cannot be told
apart at all and are refused, and so is a literal ``%`` (it would read as
the start of an encoded character).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

_FIELD = re.compile(r"\{([^{}]*)\}")
_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Template:
    """A parsed template: literal text and column references, in order."""

    source: str
    parts: tuple[tuple[bool, str], ...]  # (is_column, text)

    @classmethod
    def parse(cls, text: str) -> Template:
        parts: list[tuple[bool, str]] = []
        pos = 0
        for match in _FIELD.finditer(text):
            if match.start() > pos:
                parts.append((False, _literal(text, text[pos : match.start()])))
            name = match.group(1)
            if not _COLUMN.fullmatch(name):
                raise ValueError(f"template {text!r}: {{{name}}} is not a column name")
            if parts and parts[-1][0]:
                raise ValueError(
                    f"template {text!r}: {{{parts[-1][1]}}} and {{{name}}} have no text between them, so two "
                    f"rows could render the same key; separate them, e.g. {{{parts[-1][1]}}}:{{{name}}}"
                )
            parts.append((True, name))
            pos = match.end()
        if pos < len(text):
            parts.append((False, _literal(text, text[pos:])))
        if not parts:
            raise ValueError("a template cannot be empty")
        if sum(is_column for is_column, _ in parts) > 1 and "%" in text:
            raise ValueError(
                f"template {text!r}: with several columns, '%' cannot be literal text (it starts the "
                "percent-encoding of a value that holds the template's text); use another separator, e.g. ':'"
            )
        return cls(text, tuple(parts))

    @classmethod
    def join(cls, columns: tuple[str, ...], separator: str = ":") -> Template:
        """The default key: the primary-key values joined by ``separator``."""
        parts: list[tuple[bool, str]] = []
        for i, column in enumerate(columns):
            if i:
                parts.append((False, separator))
            parts.append((True, column))
        return cls(separator.join(f"{{{c}}}" for c in columns), tuple(parts))

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(text for is_column, text in self.parts if is_column)

    @property
    def is_literal(self) -> bool:
        return not self.columns

    def check_columns(self, allowed: tuple[str, ...]) -> None:
        """Raise ValueError unless every referenced column is in ``allowed``."""
        for column in self.columns:
            if column not in allowed:
                raise ValueError(
                    f"template {self.source!r} uses {column!r}, which is not a "
                    f"primary-key column (primary key: {', '.join(allowed)})"
                )

    @property
    def encodes_values(self) -> bool:
        """Whether ``render`` percent-encodes its values: with two or more
        column references (module docstring)."""
        return len(self.columns) > 1

    @functools.cached_property
    def _escapes(self) -> dict[int, str] | None:
        """What ``render`` percent-encodes in each value; None when nothing."""
        if not self.encodes_values:
            return None
        reserved = {"%", *(char for is_column, text in self.parts if not is_column for char in text)}
        return {ord(char): "".join(f"%{byte:02X}" for byte in char.encode()) for char in reserved}

    def render(self, values: Mapping[str, object]) -> str:
        if len(self.parts) == 1:  # a literal or one column: the common cases, once per change
            is_column, text = self.parts[0]
            return render_key_value(values[text]) if is_column else text
        escapes = self._escapes
        if escapes is None:
            return "".join(
                render_key_value(values[text]) if is_column else text for is_column, text in self.parts
            )
        return "".join(
            render_key_value(values[text]).translate(escapes) if is_column else text
            for is_column, text in self.parts
        )


def _literal(text: str, part: str) -> str:
    if "{" in part or "}" in part:
        raise ValueError(f"template {text!r}: unbalanced braces")
    return part


_PLAIN = frozenset({int, str})  # exact types whose text in a key is str(value)


def render_key_value(value: object) -> str:
    """How a key column value reads inside a key: plain text, no JSON quotes."""
    if type(value) in _PLAIN:  # the common keys, once per change: no isinstance chain
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, bool):
        return "1" if value else "0"
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)
