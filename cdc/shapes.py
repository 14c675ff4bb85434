"""What changed between two descriptions of a table, as far as documents care.

The documents hold the published columns' values, encoded by type, under
keys built from the primary key: a change of any of these (a column added,
dropped, renamed or retyped, another primary key), or another table object
under the same name (dropped and created again), leaves documents that no
read of changes will correct (PostgreSQL fills a new column's DEFAULT without
firing a trigger, SQL Server's ADD COLUMN marks no row): the table is
snapshotted again. Nullability alone changes no value: it is not a change.

``TableInfo.identity`` is the source's own text. A source may spell it as
labelled parts, ``label value; label value``, and then the reason names which
part changed (``identity_parts``): SQL Server's is ``object 1234; tracking
since 57; database <guid>; fork <guid>`` (``cdc.sources.mssql_sql``): another
database or recovery fork is a restore or a failover, another tracking start
a TRUNCATE or tracking turned off and on, another object a table dropped and
created again. An unlabelled identity (PostgreSQL's oid) is the table object.
"""

from __future__ import annotations

from cdc.sources.base import TableInfo


def shape_change(old: TableInfo, new: TableInfo) -> str | None:
    """Why documents written under ``old`` need a snapshot under ``new``, or None."""
    if old.identity != new.identity:
        return identity_change(old.identity, new.identity)
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


def identity_parts(identity: str) -> dict[str, str]:
    """``object 1234; tracking since 57`` -> {"object": "1234", "tracking
    since": "57"}; an unlabelled identity (``1234``) -> {"": "1234"}."""
    parts: dict[str, str] = {}
    for part in identity.split("; "):
        label, _, value = part.rpartition(" ")
        parts[label] = value
    return parts


def identity_change(old: str, new: str) -> str:
    """Why a table's identity changed, in words (see the module docstring)."""
    was, now = identity_parts(old), identity_parts(new)

    def moved(*labels: str) -> list[str]:
        return [
            f"{label} {was.get(label)} -> {now.get(label)}"
            for label in labels
            if was.get(label) != now.get(label)
        ]

    database = moved("database", "fork")
    if database:
        return (
            "the database was restored from a backup, or failed over to another copy of it "
            f"({', '.join(database)}): changes may have been lost or rewritten"
        )
    same_object = was.get("object", was.get("")) == now.get("object", now.get(""))
    if same_object and moved("tracking since"):
        return (
            "the table was truncated, or its change tracking turned off and on again "
            f"(tracking since {was.get('tracking since')}, now {now.get('tracking since')})"
        )
    return "the table was dropped and created again"
