"""What changed between two descriptions of a table, as far as documents care.

The documents hold the published columns' values, encoded by type, under
keys built from the primary key: a change of any of these (a column added,
dropped, renamed or retyped, another primary key), or another table object
under the same name (dropped and created again), leaves documents that no
read of changes will correct (PostgreSQL fills a new column's DEFAULT without
firing a trigger, SQL Server's ADD COLUMN marks no row): the table is
snapshotted again. Nullability alone changes no value: it is not a change.
"""

from __future__ import annotations

from cdc.sources.base import TableInfo


def shape_change(old: TableInfo, new: TableInfo) -> str | None:
    """Why documents written under ``old`` need a snapshot under ``new``, or None."""
    if old.identity != new.identity:
        return "the table was dropped and created again"
    reasons = []
    if old.primary_key != new.primary_key:
        reasons.append(f"primary key ({', '.join(old.primary_key)}) -> ({', '.join(new.primary_key)})")
    before = {c.name: c.type_name for c in old.columns}
    after = {c.name: c.type_name for c in new.columns}
    added = [name for name in after if name not in before]
    dropped = [name for name in before if name not in after]
    retyped = [
        f"{name} {before[name]} -> {after[name]}"
        for name in after
        if before.get(name, after[name]) != after[name]
    ]
    for what, names in (("added", added), ("dropped", dropped), ("retyped", retyped)):
        if names:
            reasons.append(f"columns {what}: {', '.join(names)}")
    return "; ".join(reasons) or None
