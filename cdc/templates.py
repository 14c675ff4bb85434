"""Partition and key templates: a literal, or ``{Column}`` references to
primary-key columns, e.g. ``"{RegionId}"`` or ``"{OrderId}:{Line}"``.

A deleted row has nothing but its key, so templates may only use primary-key
columns; that is checked once the table's key is known (``check_columns``).
"""

from __future__ import annotations

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
            parts.append((True, name))
            pos = match.end()
        if pos < len(text):
            parts.append((False, _literal(text, text[pos:])))
        if not parts:
            raise ValueError("a template cannot be empty")
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

    def render(self, values: Mapping[str, object]) -> str:
        if len(self.parts) == 1:  # a literal or one column: the common cases, once per change
            is_column, text = self.parts[0]
            return render_key_value(values[text]) if is_column else text
        return "".join(
            render_key_value(values[text]) if is_column else text for is_column, text in self.parts
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
