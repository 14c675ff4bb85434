"""The closing check: every row of PostgreSQL against the subscribers' replicas.

The comparison does not reuse the sidecar's encoder (that would compare the
product with itself): it reads the rows with psycopg and compares each value
with the replica's by meaning, the way docs/TYPES.md says the sidecar writes
them: ``numeric`` as a decimal string (``"12.50"``), ``timestamptz`` as an
ISO 8601 string, ``double precision`` and integers as numbers, ``jsonb`` as
nested JSON.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

Replicas = Mapping[str, Mapping[str, Mapping[str, dict[str, Any]]]]  # partition -> section -> key -> doc
Rows = Mapping[tuple[str, str], dict[str, Any]]  # (partition, key) -> column -> value (psycopg's)

SHOWN_DIFFERENCES = 5  # per table, in the closing lines


def same_value(expected: Any, actual: Any) -> bool:
    """Whether the replica's ``actual`` is PostgreSQL's ``expected`` value."""
    if isinstance(expected, bool) or expected is None:
        return actual is expected
    if isinstance(expected, Decimal):
        return isinstance(actual, str) and _decimal(actual) == expected
    if isinstance(expected, dt.datetime):
        return isinstance(actual, str) and _instant(actual) == expected
    if isinstance(expected, float):
        return (
            isinstance(actual, (int, float, Decimal))
            and not isinstance(actual, bool)
            and float(actual) == expected
        )
    return bool(expected == actual) and type(actual) is not bool


def _decimal(text: str) -> Decimal | None:
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


def _instant(text: str) -> dt.datetime | None:
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


@dataclass
class TableComparison:
    table: str
    rows: int = 0  # in PostgreSQL
    equal: int = 0  # of them, equal in the replica
    differences: list[str] = field(default_factory=list)  # one per key, naming it

    @property
    def same(self) -> bool:
        return not self.differences

    def line(self) -> str:
        if self.same:
            return f"replica == PostgreSQL: {self.equal}/{self.rows} rows of {self.table}"
        shown = "; ".join(self.differences[:SHOWN_DIFFERENCES])
        more = len(self.differences) - SHOWN_DIFFERENCES
        rest = f"; and {more} more" if more > 0 else ""
        return (
            f"replica != PostgreSQL for {self.table}: {self.equal}/{self.rows} rows equal,"
            f" {len(self.differences)} differ: {shown}{rest}"
        )


def compare_table(table: str, section: str, rows: Rows, replicas: Replicas) -> TableComparison:
    """``table``'s rows against the documents of ``section`` in every partition's replica."""
    result = TableComparison(table, rows=len(rows))
    for (partition, key), row in sorted(rows.items()):
        document = replicas.get(partition, {}).get(section, {}).get(key)
        problem = _row_problem(row, document)
        if problem is None:
            result.equal += 1
        else:
            result.differences.append(f"key {key} (partition {partition}): {problem}")
    for partition, sections in sorted(replicas.items()):
        for key in sorted(set(sections.get(section, {})) - {k for p, k in rows if p == partition}):
            result.differences.append(f"key {key} (partition {partition}): in the replica, not in PostgreSQL")
    return result


def _row_problem(row: dict[str, Any], document: dict[str, Any] | None) -> str | None:
    if document is None:
        return "in PostgreSQL, not in the replica"
    wrong = [
        name for name, value in row.items() if name not in document or not same_value(value, document[name])
    ]
    extra = sorted(set(document) - set(row))
    if not wrong and not extra:
        return None
    parts = [f"{n}: PostgreSQL {row[n]!r}, replica {document.get(n, '(absent)')!r}" for n in wrong]
    parts += [f"{n}: only in the replica" for n in extra]
    return ", ".join(parts)


def closing_lines(comparisons: Sequence[TableComparison]) -> list[str]:
    return [c.line() for c in comparisons]
