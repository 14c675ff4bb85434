"""Reading the dead letter ``ns:@deadletter`` (docs/REDIS.md): the changes
that could not be applied, each with its table, key and reason.

The stream is one for the namespace; what an operator asks is per table, so
the readers here page through it (``XRANGE ... COUNT``) and sort by table."""

from __future__ import annotations

from collections import Counter
from typing import Any

from publishers import redis_calls
from publishers.manager import DataManager

# Entries per XRANGE page: one round trip per this many (an entry is ~0.5 KB).
PAGE = 1000


async def counts(manager: DataManager) -> dict[str, int]:
    """Entries waiting in the dead letter, per table (tables with none left out)."""
    return await redis_calls.call(_counts(manager), manager.config.url)


async def _counts(manager: DataManager) -> dict[str, int]:
    key = manager.layout.deadletter()
    per_table: Counter[str] = Counter()
    start = "-"
    while True:
        page: list[tuple[Any, dict[Any, Any]]] = await manager.client.xrange(
            key, min=start, max="+", count=PAGE
        )  # type: ignore[assignment]
        for _, fields in page:
            per_table[redis_calls.text(fields.get(b"table", b""))] += 1
        if len(page) < PAGE:
            return dict(per_table)
        start = "(" + redis_calls.text(page[-1][0])
